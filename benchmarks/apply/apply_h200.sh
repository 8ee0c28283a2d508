#!/usr/bin/env bash
# apply on the H200 in one device call: install the tree, the GPU-only tests of apply, then
# benchmarks/apply/apply_models.py on a seeded KernelBench subset (files carried in .kb/, a git-ignored copy of
# ../shared/kernelbench) and any extra model files. Everything lands in $OUT (results.json / results.md).
#   bash benchmarks/apply/apply_h200.sh L2 L3 SEED SLICE TESTS DEADLINE_S [extra model files...]
# e.g. bash benchmarks/apply/apply_h200.sh 8 6 0 0:7 1 300  (the seed-0 subset of 8 + 6 files, its first 7, with the
# tests, no new file started after 300 s); APPLY_TIMEOUT=S (default 400) stops one file's apply after S s;
# BUDGET_S=S is apply's --budget-s (default 45; the CLI's own default is 120). apply's --time-limit-s (240 s by
# default) bounds its own run: keep APPLY_TIMEOUT above it plus the model's load. BACKWARD=1 times forward+backward
# (apply --backward); RUN=NAME names the output folder and tarball ($OUT/NAME, default models), so one call can run
# this script twice, e.g. the transformers Llama forward then forward+backward:
#   RUN=fwd BUDGET_S=120 bash benchmarks/apply/apply_h200.sh 0 0 0 "" 0 60 tests/data/models/hf_llama.py
#   RUN=bwd BACKWARD=1 BUDGET_S=120 bash benchmarks/apply/apply_h200.sh 0 0 0 "" 0 60 builtin tests/data/models/hf_llama_loss.py
set -u
L2=${1:-4} L3=${2:-2} SEED=${3:-0} SLICE=${4:-} TESTS=${5:-1} DEADLINE=${6:-400}
shift 6 2>/dev/null || shift $#
export PYTHONUNBUFFERED=1
RUN=${RUN:-models}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "$TESTS" = 1 ]; then
  timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_apply.py tests/test_plan.py \
    tests/test_variants.py > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -12
fi
python benchmarks/apply/apply_models.py --kernelbench .kb --level2 "$L2" --level3 "$L3" --seed "$SEED" \
  --slice "$SLICE" --deadline-s "$DEADLINE" --apply-timeout "${APPLY_TIMEOUT:-400}" --budget-s "${BUDGET_S:-45}" ${BACKWARD:+--backward} --files "$@" --out "$OUT/$RUN" > "$OUT/$RUN.log" 2>&1
tail -40 "$OUT/$RUN.log"
# the tarball alone comes back: the device returns at most 8 files, and the folder holds 10 per model
tar czf "$OUT/$RUN.tgz" -C "$OUT" "$RUN" && rm -rf "${OUT:?}/$RUN"
