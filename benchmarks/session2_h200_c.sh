#!/usr/bin/env bash
# Third device call of the session: the profile-accuracy run after calibrate learned the fused-attention rate and
# the profiler's idle cap changed, and the RMSNorm backward sweep of rows per step x programs per SM x warps x
# num_stages (issue 3's backward at ~60% of copy).
#   bash benchmarks/session2_h200_c.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step norm_bwd 45 python benchmarks/sweep_tiles.py --out "$R/tiles" --only rmsnorm_bwd --norm-budget-s 28
step profile 118 python benchmarks/profile_accuracy.py --out "$R/profile" --budget-s 110 --only default_llama --only hf_llama --only hf_gpt2 --only hf_bert
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "bound class equal|time within" "$R/profile/profile_accuracy.md"
