#!/usr/bin/env bash
# Device call 6 of session 3: the kernel table rows whose kernels changed this session (issue 3: tuned norm
# backwards, every constexpr passed at launch, softmax/cross-entropy's shared online log-sum-exp), and the profile
# accuracy (issue 5) with cumsum/index counted as two kernels.
#   bash benchmarks/session3_h200_e.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step kernels 240 python benchmarks/kernels.py --out "$R/kernels" --max-shapes 1 \
    --kernels add_rmsnorm,add_layernorm,rmsnorm,cross_entropy,masked_softmax
step profile 300 python benchmarks/profile_accuracy.py --out "$R/profile" --budget-s 290
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "bound class equal|time within" "$R/profile/profile_accuracy.md"
grep -E "^\| (add_rmsnorm|add_layernorm|rmsnorm|cross_entropy|masked_softmax) " "$R/kernels/kernels.md" | head -30
