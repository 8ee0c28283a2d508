#!/usr/bin/env bash
# One device call that does what the GPU at hand serves best (the call may land on an H100 or an H200):
#   H200: three fresh analyze --profile runs of a host-bound RNN (its chains weigh most in the H200 test set;
#         accuracy/repeat_profile.sh), then apply on KernelBench files whose routes changed;
#   H100: apply on those files alone (apply compares within one run, on any GPU).
# Everything lands in $OUT.
#   OUT=... bash benchmarks/gpu_session.sh [APPLY_DEADLINE_S]
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $GPU"
DEADLINE=${1:-250}
if [[ "$GPU" == *H200* ]]; then
  timeout 170 bash benchmarks/accuracy/repeat_profile.sh h200 60 3 .kb/level3/34_VanillaRNNHidden.py
  DEADLINE=$(( DEADLINE > 210 ? DEADLINE - 150 : 60 ))  # the profiles' time, leaving apply at least 60 s
fi
APPLY_TIMEOUT=150 BUDGET_S=45 timeout $((DEADLINE + 160)) bash benchmarks/apply/apply_h200.sh 0 0 0 "" 0 "$DEADLINE" \
  .kb/level2/45_Gemm_Sigmoid_LogSumExp.py .kb/level2/35_Conv2d_Subtract_HardSwish_MaxPool_Mish.py \
  .kb/level2/63_Gemm_ReLU_Divide.py .kb/level2/24_Conv3d_Min_Softmax.py .kb/level2/56_Matmul_Sigmoid_Sum.py
ls -la "$OUT"
