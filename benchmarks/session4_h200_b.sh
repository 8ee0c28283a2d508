#!/usr/bin/env bash
# Session 4, device call 2: host time per call with eager calls skipping the dispatcher (kernel_library._op) vs
# through the registered op; the whole Llama-7B kernel table (every registry entry on its own first shape, the
# cross-entropy reduce change included); the kernel library's GPU-only tests (torch.compile of every op, the direct
# path on CUDA).
#   bash benchmarks/session4_h200_b.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step host 150 python benchmarks/host_overhead.py --out "$R/host" --shapes 1
step kernels 270 python benchmarks/kernels.py --out "$R/kernels" --max-shapes 1
step gpu_tests 150 python -m pytest -q -p no:cacheprovider -m gpu tests/kernel_library
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "passed|failed|FAILED|ERROR" "$R/gpu_tests.log" | tail -8
grep -E "gpu-kernel time|  (fwd|fwd\+bwd) +triton" "$R/kernels/kernels.log" | tail -40
head -32 "$R/host/host_overhead.md"
