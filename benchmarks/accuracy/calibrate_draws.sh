#!/usr/bin/env bash
# A device spec's measured tables for a GPU the project has no calibrated spec for, in one device call: the full
# `fusion-advisor calibrate` twice (two random draws of its convolution and matmul tables, which
# spec_from_calibration.py --merge-tables merges: one draw moved single models by up to 0.3x on the H200), then a
# normalization/softmax/reduction table probe (table_probe.py --reductions 2) that --reductions merges.
#   OUT=... bash benchmarks/accuracy/calibrate_draws.sh [PROBE_BUDGET_S [DRAWS]]   (PROBE_BUDGET_S 0: no probe;
#   DRAWS: default "a b")
# Lands in $OUT: gpu.txt; calibrate_a/ and calibrate_b/ (calibrated.yaml, calibrate.log);
# table_probe_reductions_seed1.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
PROBE_BUDGET_S=${1:-120}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton, datetime; print('torch', torch.__version__, 'triton', triton.__version__, datetime.date.today())"
} | tee "$OUT/gpu.txt"
for draw in ${2:-a b}; do
  mkdir -p "$OUT/calibrate_$draw"
  t0=$SECONDS
  timeout 200 python -m fusion_advisor.cli calibrate --device cuda --out "$OUT/calibrate_$draw/calibrated.yaml" \
    > "$OUT/calibrate_$draw/calibrate.log" 2>&1
  echo "calibrate $draw: exit $? after $((SECONDS - t0)) s wall" | tee -a "$OUT/calibrate_$draw/calibrate.log"
  tail -3 "$OUT/calibrate_$draw/calibrate.log"
done
[ "$PROBE_BUDGET_S" = 0 ] && exit 0
timeout 200 python benchmarks/accuracy/table_probe.py --out "$OUT/table_probe_reductions_seed1.json" \
  --seed 1 --conv-fp32 0 --mm-fp32 0 --reductions 2 --budget-s "$PROBE_BUDGET_S"
echo "probe: exit $?"
