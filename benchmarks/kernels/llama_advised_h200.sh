#!/usr/bin/env bash
# Issue 16's advised Llama-3-8B-width step on the H200, in one device call (STEP=both, the default: apply, then the
# step with the plan it wrote, ~8 minutes) or two:
#   STEP=apply bash benchmarks/kernels/llama_advised_h200.sh
#       fusion-advisor apply on benchmarks/kernels/llama3_8b_width_loss.py (--backward, bf16, every swap tried):
#       the report and plan.yaml come back in $OUT/apply.tgz and $OUT/plan.yaml
#   STEP=step PLAN=path/to/plan.yaml bash benchmarks/kernels/llama_advised_h200.sh
#       lce_liger.py --parts llama --plan PLAN: eager / torch.compile / ours-lce / ours-lce+compile / advised /
#       Liger's patch, one run, with peak memory ($OUT/lce_liger.json, .md)
#   STEP=diff PLAN=... [PLAN_VARIANTS="swaps+eager ..."] bash benchmarks/kernels/llama_advised_h200.sh
#       llama_kernel_diff.py (the kernels of eager / aot_eager / inductor steps), then STEP=step; PLAN_VARIANTS adds
#       rows for other variants of the plan (a '_' in a name stands for a space)
# Liger-Kernel travels as a wheel in .whl/ (carry it). BUDGET_S / LIMIT_S: apply's --budget-s / --time-limit-s;
# APPLY_TIMEOUT stops apply; PROVIDERS: lce_liger.py's --llama-providers (default all).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
STEP=${STEP:-both}
if [ "$STEP" = apply ] || [ "$STEP" = both ]; then
    timeout "${APPLY_TIMEOUT:-470}" fusion-advisor apply benchmarks/kernels/llama3_8b_width_loss.py --verify --backward --device cuda \
      --dtype bf16 --gpu h200 --candidates all --budget-s "${BUDGET_S:-200}" --time-limit-s "${LIMIT_S:-420}" \
      --seeds 1 --out "$OUT/apply" > "$OUT/apply.log" 2>&1
    echo "apply: exit $?"
    tail -60 "$OUT/apply.log"
    cp "$OUT/apply/plan.yaml" "$OUT/plan.yaml" 2>/dev/null
    tar czf "$OUT/apply.tgz" -C "$OUT" apply && rm -rf "${OUT:?}/apply"
    PLAN=${PLAN:-$OUT/plan.yaml}
fi
if [ "$STEP" = diff ]; then
    python benchmarks/kernels/llama_kernel_diff.py --out "$OUT" > "$OUT/llama_kernel_diff.log" 2>&1
    echo "llama_kernel_diff: exit $?"; cat "$OUT/llama_kernel_diff.log" | grep -v Warning | tail -70
    STEP=step
fi
if [ "$STEP" = step ] || [ "$STEP" = both ]; then
    variants=()
    for v in ${PLAN_VARIANTS:-}; do variants+=(--plan-variant "${v//_/ }"); done
    python benchmarks/kernels/lce_liger.py --parts llama --plan "${PLAN:?PLAN=plan.yaml}" "${variants[@]}" \
      ${PROVIDERS:+--llama-providers "$PROVIDERS"} --out "$OUT" > "$OUT/lce_liger.log" 2>&1
    echo "lce_liger: exit $?"
    tail -40 "$OUT/lce_liger.log"
fi
