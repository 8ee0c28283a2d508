#!/usr/bin/env bash
# nn.Linear's layout as a matmul table of its own (issue 13), in one device call: the full `fusion-advisor calibrate`
# (its matmul table now samples B transposed as nn.Linear passes its weight, layout nt, beside B contiguous, nn) and
# two more seeded matmul tables at calibrate's sampling (benchmarks/accuracy/table_probe.py, seeds 1 and 2), then
# `analyze --profile` of KernelBench's grouped transposed convolution files (level1_72, 73, 75) against the new
# calibration's conv classes. Profiles are taken against the shipped spec of the GPU found.
#   OUT=... bash benchmarks/accuracy/matmul_layouts.sh      (KernelBench files carried in .kb/)
# Lands in $OUT: gpu.txt; calibrate/ (calibrated.yaml, calibrate.log); table_probe_mm_seed{1,2}.json;
# profiles.tar.gz (profiles/<file stem>/report.json and analyze.log): six files (a device call returns eight at most).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton, datetime; print('torch', torch.__version__, 'triton', triton.__version__, datetime.date.today())"
} | tee "$OUT/gpu.txt"
gpu=h200; grep -q H100 "$OUT/gpu.txt" && gpu=h100
mkdir -p "$OUT/calibrate"
t0=$SECONDS
timeout 200 python -m fusion_advisor.cli calibrate --device cuda --out "$OUT/calibrate/calibrated.yaml" \
  > "$OUT/calibrate/calibrate.log" 2>&1
echo "calibrate: exit $? after $((SECONDS - t0)) s wall" | tee -a "$OUT/calibrate/calibrate.log"
for seed in 1 2; do
  timeout 120 python benchmarks/accuracy/table_probe.py --out "$OUT/table_probe_mm_seed$seed.json" --seed $seed \
    --conv-fp32 0 --mm-fp32 200 --budget-s 100 2>&1 | tail -2
done
for f in .kb/level1/72_*.py .kb/level1/73_*.py .kb/level1/75_*.py; do
  name=level1_$(basename "$f" .py)
  t0=$SECONDS
  timeout 150 python -m fusion_advisor.cli analyze "$f" --device cuda --profile --gpu $gpu \
    --out "$OUT/profiles/$name" > "$OUT/analyze_$name.log" 2>&1
  rc=$?
  mv "$OUT/analyze_$name.log" "$OUT/profiles/$name/analyze.log" 2>/dev/null
  echo "$name: exit $rc after $((SECONDS - t0)) s"
done
cd "$OUT" && tar -czf profiles.tar.gz profiles/*/report.json profiles/*/analyze.log && rm -rf profiles analyze_*.log
