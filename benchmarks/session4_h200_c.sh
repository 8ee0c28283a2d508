#!/usr/bin/env bash
# Session 4, device call 3: where a library op's backward spends host time (autograd_probe), the norm rows of the
# 7B table after the one-kernel parameter-gradient finalisation, and the kernel library's GPU-only tests.
#   bash benchmarks/session4_h200_c.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step probe 60 python benchmarks/autograd_probe.py --out "$R/probe"
step kernels 120 python benchmarks/kernels.py --out "$R/kernels" --max-shapes 1 \
    --kernels rmsnorm,add_rmsnorm,layernorm,add_layernorm
step gpu_tests 330 python -m pytest -q -p no:cacheprovider -m gpu tests/kernel_library
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "passed|failed|FAILED|ERROR" "$R/gpu_tests.log" | tail -8
grep -E "gpu-kernel time|triton kernels|  (fwd|fwd\+bwd) +triton" "$R/kernels/kernels.log" | cut -c1-400
cat "$R/probe.log"
