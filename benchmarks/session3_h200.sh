#!/usr/bin/env bash
# Device calls 1-2 of session 3: profile accuracy (issue 5) after the profiler stopped tagging every op (one range
# per graph run, ops matched by name and order) and, in call 2, GPU idle replayed on stamped plain runs; 8 models.
#   bash benchmarks/session3_h200.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
step profile 420 python benchmarks/profile_accuracy.py --out "$R/profile" --budget-s 400
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "bound class equal|time within" "$R/profile/profile_accuracy.md"
