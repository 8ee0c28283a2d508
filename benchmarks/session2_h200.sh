#!/usr/bin/env bash
# One device call that batches this session's remaining H200 measurements (each step under its own time limit,
# so one that overruns cannot starve the rest), then packs everything into $OUT/results.tgz (the device returns
# at most 8 files):
#   1. apply on transformers' Llama (4 layers, hidden 4096, seq 2048, bf16), forward+backward   (issue 4)
#   2. calibrate + analyze --profile accuracy over the benchmark models                         (issue 5)
#   3. the kernel table row for rope after its retune                                            (issue 3)
#   4. bench --sweep of softmax and cross_entropy over sizes                                     (issues 3, 6)
#   5. doctor, and the GPU-marked tests of the new modules                                       (issue 6)
#
#   bash benchmarks/session2_h200.sh        # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/gpu.txt" 2>&1
. benchmarks/steps.sh
step apply 265 python benchmarks/apply_llama.py --out "$R/apply" --budget-s 250 --only hf-llama-fwdbwd
step profile 170 python benchmarks/profile_accuracy.py --out "$R/profile" --budget-s 160
step kernels 35 python benchmarks/kernels.py --out "$R/kernels" --max-shapes 1 --kernels rope
step sweep 35 python benchmarks/sweep_kernels.py --out "$R/sweep" --kernels softmax,cross_entropy --budget-s 25
step doctor 25 python -c "from fusion_advisor.cli import main; main()" doctor --json-out "$R/doctor.json"
step pytest_gpu 45 python -m pytest -q -p no:cacheprovider -m gpu tests/test_doctor.py tests/test_recompile.py \
    tests/test_profile.py tests/test_calibrate.py tests/test_inductor_code.py tests/test_sweep.py --tb=short
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
tail -5 "$R/pytest_gpu.log"
