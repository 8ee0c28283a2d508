#!/usr/bin/env bash
# Session 4, device call 5: host time per call after the direct path's autograd.Function stopped binding default
# arguments per call (host_overhead, autograd_probe), the whole Llama-7B kernel table from one run of the final kernels
# (kernels_h200_7b.md), and the kernel library's GPU-only tests on the final tree.
#   bash benchmarks/session4_h200_e.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step host 150 python benchmarks/host_overhead.py --out "$R/host" --shapes 1
step probe 60 python benchmarks/autograd_probe.py --out "$R/probe"
step kernels 150 python benchmarks/kernels.py --out "$R/kernels" --max-shapes 1
step gpu_tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests/kernel_library
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "passed|failed|FAILED|ERROR" "$R/gpu_tests.log" | tail -8
grep -E "gpu-kernel time|  (fwd|fwd\+bwd) +triton" "$R/kernels/kernels.log"
grep -v "^ " "$R/probe.log" | head -20
head -32 "$R/host/host_overhead.md"
