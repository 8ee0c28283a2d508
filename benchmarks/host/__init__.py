"""Host-cost benchmarks: microseconds of CPU time per library-op call, per launch layer, per autograd node (GPU)."""
