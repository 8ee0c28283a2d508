"""Whole-model benchmarks of apply: plans against eager, torch.compile and CUDA graphs on models nobody here wrote."""
