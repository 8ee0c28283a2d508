"""The analysis itself: wall time and memory of a 7B-sized static analysis; analyze over every KernelBench file."""
