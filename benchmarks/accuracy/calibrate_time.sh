#!/usr/bin/env bash
# The full calibrate's wall time and where it goes (issue 13: "the full calibrate under 60 s"), in one device call:
# `fusion-advisor calibrate` as a user runs it (timed with its process start), then in a fresh process
# benchmarks/accuracy/calibrate_breakdown.py (calibrate.measure() with each measure_* function and per-point timer
# wrapped).
#   OUT=... bash benchmarks/accuracy/calibrate_time.sh
# Lands in $OUT: gpu.txt; calibrate.log and calibrated.yaml; breakdown.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton, datetime; print('torch', torch.__version__, 'triton', triton.__version__, datetime.date.today())"
} | tee "$OUT/gpu.txt"
t0=$SECONDS
timeout 200 python -m fusion_advisor.cli calibrate --device cuda --out "$OUT/calibrated.yaml" > "$OUT/calibrate.log" 2>&1
echo "calibrate: exit $? after $((SECONDS - t0)) s wall" | tee -a "$OUT/calibrate.log"
t0=$SECONDS
timeout 200 python benchmarks/accuracy/calibrate_breakdown.py --out "$OUT/breakdown.json" > /dev/null 2>"$OUT/breakdown.err"
echo "breakdown: exit $? after $((SECONDS - t0)) s wall" | tee -a "$OUT/calibrate.log"
tail -5 "$OUT/breakdown.err"
