#!/usr/bin/env bash
# Grouped transposed convolutions as a rate class of their own (issue 13), in one device call: the full
# `fusion-advisor calibrate` (its tables now sample conv2d_transpose_grouped and conv3d_transpose_grouped; its wall
# time is the issue's "under 60 s"), then `analyze --profile` of KernelBench's three grouped transposed convolution
# files (level1_72, level1_73, level1_75), each in a process of its own, to judge the class against.
#   OUT=... bash benchmarks/accuracy/grouped_transpose_h200.sh      (KernelBench files carried in .kb/)
# Lands in $OUT: gpu.txt; calibrate/ (calibrated.yaml, calibrate.log); profiles/<file stem>/ (report.json ...).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton, datetime; print('torch', torch.__version__, 'triton', triton.__version__, datetime.date.today())"
} | tee "$OUT/gpu.txt"
mkdir -p "$OUT/calibrate"
t0=$SECONDS
timeout 200 python -m fusion_advisor.cli calibrate --device cuda --out "$OUT/calibrate/calibrated.yaml" \
  > "$OUT/calibrate/calibrate.log" 2>&1
echo "calibrate: exit $? after $((SECONDS - t0)) s wall" | tee -a "$OUT/calibrate/calibrate.log"
for f in .kb/level1/72_*.py .kb/level1/73_*.py .kb/level1/75_*.py; do
  name=level1_$(basename "$f" .py)
  t0=$SECONDS
  timeout 150 python -m fusion_advisor.cli analyze "$f" --device cuda --profile --gpu h200 \
    --out "$OUT/profiles/$name" > "$OUT/profiles_$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s"
done
