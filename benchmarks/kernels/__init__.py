"""Kernel benchmarks: library kernels vs eager and torch.compile, launch-config sweeps, A/B runs (GPU)."""
