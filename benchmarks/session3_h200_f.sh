#!/usr/bin/env bash
# Last device call of session 3: every GPU-only test of the suite (pytest -m gpu) on the final tree.
#   bash benchmarks/session3_h200_f.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step gpu_tests 270 python -m pytest -q -p no:cacheprovider -m gpu tests
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "passed|failed|FAILED|ERROR" "$R/gpu_tests.log" | tail -15
