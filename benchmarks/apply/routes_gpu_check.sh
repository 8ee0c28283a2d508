#!/usr/bin/env bash
# One device call: the routes and findings a change added, carried out on a GPU. The library softmax on its own
# (verify), apply on KernelBench files those routes touch (a lone wide-row softmax and log-softmax routed to the
# library kernel; nn.MultiheadAttention's discarded, head-averaged weights found as unused work), then
# analyze --profile of the attention model and of a chain the bias_gelu pattern no longer names.
#   OUT=DIR bash benchmarks/apply/routes_gpu_check.sh      (KernelBench files carried in .kb/)
# Writes into $OUT: verify_softmax.log, apply.log, apply.tgz (apply_models.py's results and per-file reports),
# profiles.tgz and a log per profiled file.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
SPEC=$(echo "$G" | grep -q H200 && echo h200 || echo h100)
echo "$G ($SPEC spec)"
python -m fusion_advisor.cli verify softmax > "$OUT/verify_softmax.log" 2>&1
echo "verify softmax: exit $?"
timeout 420 python benchmarks/apply/apply_models.py --kernelbench .kb --files .kb/level1/23_Softmax.py \
  .kb/level1/24_LogSoftmax.py .kb/level3/31_VisionAttention.py --budget-s 30 --deadline-s 300 \
  --out "$OUT/apply" > "$OUT/apply.log" 2>&1
echo "apply: exit $?"; tail -14 "$OUT/apply.log"
mkdir -p "$OUT/prof"
for f in level3/31_VisionAttention level2/93_ConvTranspose2d_Add_Min_GELU_Multiply; do
  n=$(basename $f)
  timeout 150 python -m fusion_advisor.cli analyze .kb/$f.py --device cuda --profile --gpu $SPEC \
    --out "$OUT/prof/$n" > "$OUT/prof_$n.log" 2>&1
  echo "profile $n: exit $?"
done
(cd "$OUT" && tar czf apply.tgz apply && rm -rf apply && tar czf profiles.tgz prof && rm -rf prof)
