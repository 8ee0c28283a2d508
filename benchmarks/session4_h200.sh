#!/usr/bin/env bash
# Session 4, device call 1: the GPU tests left unrun in session 3 (plan's GPU case, calibrate), the kernel table rows
# of the entries session 3 mislabelled (layernorm / add_layernorm, softmax / masked_softmax) plus cross-entropy with a
# per-kernel breakdown, host time per call of every op, and the cross-entropy count/reduce block A/B.
#   bash benchmarks/session4_h200.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step gpu_tests 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_plan.py tests/test_calibrate.py
step kernels 200 python benchmarks/kernels.py --out "$R/kernels" --max-shapes 1 \
    --kernels layernorm,add_layernorm,softmax,masked_softmax,cross_entropy
step ce_ab 60 python benchmarks/ce_reduce_ab.py --out "$R/ce_ab"
step host 150 python benchmarks/host_overhead.py --out "$R/host" --shapes 1
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
grep -E "passed|failed|FAILED|ERROR" "$R/gpu_tests.log" | tail -5
grep -E "gpu-kernel time|triton kernels" "$R/kernels.log" "$R/kernels/kernels.log" 2>/dev/null | tail -30
cat "$R/host/host_overhead.md" 2>/dev/null | head -40
python - <<'PY'
import json, os
p = os.path.join(os.environ["OUT"], "r/ce_ab/ce_reduce_ab.json")
if os.path.exists(p):
    for r in json.load(open(p))["rows"]:
        print(r["round"], r["block"], r["warps"], round(r["gpu_ms"], 4), round(r["do_bench_ms"], 4),
              {k[:30]: round(v, 4) for k, v in r["by_kernel_ms"].items()})
PY
