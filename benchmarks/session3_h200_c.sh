#!/usr/bin/env bash
# Device call 4 of session 3: which SDPA backend runs for each attention configuration and at what rate; the
# profile accuracy (issue 5) with the per-backend attention rates, permuted-read bandwidth and unaligned-GEMM rate
# that calibrate now measures; the GPU tests of the kernels whose launches changed (torch.compile included).
#   bash benchmarks/session3_h200_c.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step sdpa 110 python benchmarks/sdpa_backends.py --out "$R/sdpa"
step profile 330 python benchmarks/profile_accuracy.py --out "$R/profile" --budget-s 320
step gpu_tests 110 python -m pytest -q -p no:cacheprovider tests/kernel_library/test_cross_entropy.py \
    tests/kernel_library/test_layernorm.py tests/kernel_library/test_add_rmsnorm.py tests/kernel_library/test_rmsnorm.py \
    -k "gpu or compile" -x
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "bound class equal|time within" "$R/profile/profile_accuracy.md"
tail -2 "$R/gpu_tests.log"
