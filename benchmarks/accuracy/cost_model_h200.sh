#!/usr/bin/env bash
# The cost-model issue on the H200 in one device call: the full `fusion-advisor calibrate` (wall time taken), then
# `analyze --profile` of a fresh seeded KernelBench set the fit never saw (fit_kernelbench.py --exclude the seed-0
# fit run's files), then the whole-model baselines (eager, torch.compile, reduce-overhead) of as many of those files
# as the budget allows. Files carried in .kb/ (a git-ignored copy of ../shared/kernelbench).
#   bash benchmarks/accuracy/cost_model_h200.sh PROFILE_BUDGET_S BASELINE_BUDGET_S [SEED] [SKIP_JSON]
# PROFILE_BUDGET_S 0 skips calibrate and the profile (a second call that only continues the baselines, SKIP_JSON
# being the first call's baselines/result.json). Everything lands in $OUT/cost.tgz.
set -u
PROFILE_BUDGET=${1:-200} BASELINE_BUDGET=${2:-200} SEED=${3:-1} SKIP=${4:-}
export PYTHONUNBUFFERED=1
R=/tmp/cost; mkdir -p $R
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SET="--kernelbench .kb --level1 12 --level2 12 --level3 9 --seed $SEED --no-fit --timeout-s 90
     --exclude benchmarks/results/h200/accuracy/fit_kernelbench/result.json"
if [ "$PROFILE_BUDGET" != 0 ]; then
  START=$SECONDS
  fusion-advisor calibrate --device cuda --out "$R/calibrated.yaml" > "$R/calibrate.log" 2>&1
  echo "calibrate: exit $?, $((SECONDS - START)) s wall" | tee -a "$R/calibrate.log"
  tail -3 "$R/calibrate.log"
  python benchmarks/accuracy/fit_kernelbench.py $SET --out "$R/profile" --budget-s "$PROFILE_BUDGET" \
    > "$R/profile.log" 2>&1
  echo "profile: exit $?"; grep -c ": ok" "$R/profile.log"; grep -v ": ok" "$R/profile.log" | tail -5
fi
python benchmarks/accuracy/fit_kernelbench.py $SET --out "$R/baselines" --budget-s "$BASELINE_BUDGET" \
  --baselines 3 --baselines-only ${SKIP:+--skip "$SKIP"} > "$R/baselines.log" 2>&1
echo "baselines: exit $?"; tail -40 "$R/baselines.log"
tar czf "$OUT/cost.tgz" -C "$R" .
