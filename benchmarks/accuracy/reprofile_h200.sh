#!/usr/bin/env bash
# The cost model's accuracy sets profiled again with the current analysis, in one device call: calibrate's pooling
# probe (fusion_advisor.devices.calibrate.measure_pool_window_rate: the window-read rate the h200 spec ships), then
# `analyze --profile` of the seed-0 fit set (the files of benchmarks/results/h200/accuracy/fit_kernelbench) and of
# the seed-1 test set (the cost-model issue's, the seed-0 files excluded). KernelBench files carried in .kb/.
#   bash benchmarks/accuracy/reprofile_h200.sh [BUDGET_S_PER_SET]
# Everything lands in $OUT: pool_probe.json; seed0/ and seed1/ (fit_kernelbench.py's result.json and
# reports.tar.gz of every report.json) with their logs.
set -u
BUDGET=${1:-150}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python - "$OUT/pool_probe.json" <<'PY'
import json, sys, datetime, torch
from fusion_advisor.devices import calibrate as c
sizes = c.Sizes.for_device("cuda", l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size)
copy = c.measure_copy_gbps("cuda", sizes, c._timer("cuda", sizes))
rate, rows = c.measure_pool_window_rate("cuda", copy, False, c.kernel_timer)
doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": datetime.datetime.now(
    datetime.timezone.utc).isoformat(timespec="seconds"), "copy_gbps": round(copy, 1), "pool_window_gelem_s": rate,
    "probes": rows}
json.dump(doc, open(sys.argv[1], "w"), indent=1)
print(json.dumps({k: v for k, v in doc.items() if k != "probes"}))
for r in rows: print(r)
PY
python benchmarks/accuracy/fit_kernelbench.py --kernelbench .kb --level1 16 --level2 14 --level3 10 --seed 0 \
  --no-fit --timeout-s 90 --budget-s "$BUDGET" --out "$OUT/seed0" > "$OUT/seed0.log" 2>&1
echo "seed0: exit $?"; tail -3 "$OUT/seed0.log"
python benchmarks/accuracy/fit_kernelbench.py --kernelbench .kb --level1 12 --level2 12 --level3 9 --seed 1 \
  --no-fit --timeout-s 90 --budget-s "$BUDGET" --out "$OUT/seed1" \
  --exclude benchmarks/results/h200/accuracy/fit_kernelbench/result.json > "$OUT/seed1.log" 2>&1
echo "seed1: exit $?"; tail -3 "$OUT/seed1.log"
