#!/usr/bin/env bash
# Recurrent layers on the H200 in one device call: calibrate's time per cell step (measure_recurrent_steps), then
# `analyze --profile` of KernelBench's cuDNN RNN files (carried in .kb/), each report in its own folder.
#   bash benchmarks/accuracy/recurrent_h200.sh FILE...      (everything lands in $OUT/recurrent.tgz)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/recurrent; mkdir -p $R
python3 - <<'PY' | tee $R/steps.json
import json, torch
from fusion_advisor.devices.calibrate import kernel_timer
from fusion_advisor.devices.rate_sampling import RECURRENT_PROBE, measure_recurrent_steps
steps, failed = measure_recurrent_steps("cuda", False, kernel_timer)
print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "probe": RECURRENT_PROBE,
                  "recurrent_step_us": steps, "failed": failed}))
PY
for f in "$@"; do
  name=$(basename "$f" .py)
  timeout 150 python3 -m fusion_advisor.cli analyze "$f" --device cuda --profile --gpu h200 --out "$R/rep/level3_$name" \
    > "$R/$name.log" 2>&1
  echo "$name: exit $?"; grep -i "profil\|measured" "$R/$name.log" | tail -2
done
tar czf "$OUT/recurrent.tgz" -C "$R" .
