#!/usr/bin/env bash
# Second device call of the session: the profile-accuracy run with the budget the large models need (the first
# call's 160 s skipped the default model and transformers' Llama), and the size sweep of softmax/cross_entropy.
#   bash benchmarks/session2_h200_b.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step profile 300 python benchmarks/profile_accuracy.py --out "$R/profile" --budget-s 290
step sweep 70 python benchmarks/sweep_kernels.py --out "$R/sweep" --kernels softmax,cross_entropy --budget-s 60
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
