#!/usr/bin/env bash
# Device call 5 of session 3: profile accuracy (issue 5) with the fused attention's token-major output, masked cuDNN
# rates and the eager elementwise kernel overhead measured by calibrate; the new calibrate GPU tests.
#   bash benchmarks/session3_h200_d.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step profile 360 python benchmarks/profile_accuracy.py --out "$R/profile" --budget-s 350
step gpu_tests 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_calibrate.py tests/test_chains.py tests/test_profile.py
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "bound class equal|time within" "$R/profile/profile_accuracy.md"
grep -E "elementwise_overhead_us|^launch_overhead_us" "$R/profile/calibrated_spec.yaml"
tail -2 "$R/gpu_tests.log"
