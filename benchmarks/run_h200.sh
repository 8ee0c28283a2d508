#!/usr/bin/env bash
# One purpose's GPU benchmarks in one device call, each entry point under its own time limit (from the repository
# root, $OUT set to an empty folder):
#   bash benchmarks/run_h200.sh kernels|sweeps|host|llm|accuracy|tests|verify
# Each step writes its files to $OUT/<step>/, its output to $OUT/<step>.log and appends "<step>: exit N after S s
# (limit L s)" to $OUT/steps.txt; a step that fails or times out does not stop the next. The limits leave room in
# a 10-minute call (the H200 times are in benchmarks/README.md). apply needs KernelBench files:
# benchmarks/apply/apply_h200.sh.
set -u
GROUP=${1:?usage: bash benchmarks/run_h200.sh kernels|sweeps|host|llm|accuracy|tests|verify}
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

step() {  # step NAME LIMIT_S CMD...: CMD under `timeout LIMIT_S`, its output in $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - t0)) s (limit $limit s)" | tee -a "$OUT/steps.txt"
}

case "$GROUP" in
  kernels)
    step kernels 240 python benchmarks/kernels/compare.py --out "$OUT/kernels" --max-shapes 1
    step ce_ab 60 python benchmarks/kernels/ce_reduce_ab.py --out "$OUT/ce_ab"
    step recompile 120 python benchmarks/kernels/recompile_probe.py --out "$OUT/recompile"
    ;;
  sweeps)
    step sweep_rows 120 python benchmarks/kernels/sweep_rows.py --out "$OUT/sweep_rows"
    step sweep_kernels 90 python benchmarks/kernels/sweep_kernels.py --out "$OUT/sweep_kernels" --budget-s 60
    step sweep_tiles 330 python benchmarks/kernels/sweep_tiles.py --out "$OUT/sweep_tiles" --norm-budget-s 30
    ;;
  host)
    step host 180 python benchmarks/host/host_overhead.py --out "$OUT/host" --shapes 1
    step launch 90 python benchmarks/host/launch_overhead.py --out "$OUT/launch"
    step probe 90 python benchmarks/host/autograd_probe.py --out "$OUT/probe"
    ;;
  llm)  # issue 16's kernel table and host time per call vs Liger-Kernel (a wheel in .whl/: carry it), the softmax's
        # host time layer by layer, and the library's GPU tests
    if ls .whl/*.whl > /dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site
    fi
    step gpu_tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/kernel_library
    grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -6
    step softmax_layers 90 python benchmarks/host/softmax_layers.py --out "$OUT/softmax_layers"
    step lce_liger 330 python benchmarks/kernels/lce_liger.py --parts kernels --out "$OUT/lce_liger"
    ;;
  accuracy)
    step profile 360 python benchmarks/accuracy/profile_accuracy.py --out "$OUT/profile" --budget-s 340
    step sdpa 120 python benchmarks/accuracy/sdpa_backends.py --out "$OUT/sdpa"
    ;;
  verify)  # every library kernel (or those KERNELS names) through `fusion-advisor verify` as a user runs it,
           # compiled on the GPU (the interpreter is CI's path), each under VERIFY_S seconds (default 90; bmm ran
           # past 60 on an H100), then `bench` of the kernels BENCH names ("softmax rope"; none by default: ~20 s
           # each with torch.compile's, so every kernel would not fit one call): verify/<kernel>.json and
           # bench/<kernel>.json, exit status in steps.txt
    mkdir -p "$OUT/verify" "$OUT/bench"
    all=${KERNELS:-$(python -c "from kernel_library.registry import load_all; print(' '.join(sorted(load_all())))")}
    [ -n "$all" ] || { echo "verify: the kernel registry did not load" | tee -a "$OUT/steps.txt"; exit 1; }
    for k in $all; do
      step "verify_$k" "${VERIFY_S:-90}" sh -c "python -m fusion_advisor.cli verify $k > '$OUT/verify/$k.json'"
    done
    for k in ${BENCH:-}; do
      step "bench_$k" 120 sh -c "python -m fusion_advisor.cli bench $k > '$OUT/bench/$k.json'"
    done
    ;;
  tests)
    step gpu_tests 420 python -m pytest -q -p no:cacheprovider -m gpu tests
    grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.log" | tail -12
    ;;
  *)
    echo "unknown group '$GROUP': kernels, sweeps, host, llm, accuracy, tests or verify" >&2
    exit 2
    ;;
esac
archive=$(mktemp) && tar czf "$archive" -C "$OUT" --exclude ./results.tgz . && mv "$archive" "$OUT/results.tgz"
cat "$OUT/steps.txt"
