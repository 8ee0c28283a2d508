"""Model files for the GPU benchmarks (``FA_BENCH_SMOKE=1`` shrinks each to CPU-test size)."""
