#!/usr/bin/env bash
# Device call 3 of session 3 (issue 3): sweep the backward launches of add_rmsnorm / layernorm / add_layernorm and
# cross-entropy's forward+backward variants at the Llama-7B shapes; every config verified before it is timed.
#   bash benchmarks/session3_h200_b.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step sweep 400 python benchmarks/sweep_tiles.py --out "$R/tiles" --only add_rmsnorm_bwd,layernorm_bwd,add_layernorm_bwd,cross_entropy
step gpu_tests 120 python -m pytest -q -p no:cacheprovider tests/kernel_library/test_cross_entropy.py -k "gpu or compile"
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "BEST|adopt|TUNING" "$R/sweep.log" | tail -20
tail -3 "$R/gpu_tests.log"
