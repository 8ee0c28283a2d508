#!/usr/bin/env bash
# Host costs in one device call (from the repository root, $OUT set; Liger-Kernel's wheel carried in .whl/ for
# host_paths.py):
#   bash benchmarks/host/host_costs_h200.sh
# 1. the full `fusion-advisor calibrate` (its wall time is the cost-model issue's "under 60 s"), spec and log in
#    $OUT/calibrate/; 2. the GPU tests of the library's direct Triton launch (kernel_library/_launch.py);
# 3. benchmarks/host/host_paths.py (ours, ours with every launch through the JIT, Liger) in $OUT/host_paths/.
set -u
: "${OUT:?set OUT to the folder the results go to}"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/liger_install.log" 2>&1 || echo "liger wheel not installed (see liger_install.log)"
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p "$OUT/calibrate" "$OUT/host_paths"
t0=$SECONDS
timeout 240 python3 -m fusion_advisor.cli calibrate --device cuda --out "$OUT/calibrate/calibrated.yaml" \
  > "$OUT/calibrate/calibrate.log" 2>&1
echo "calibrate: exit $? after $((SECONDS - t0)) s wall" | tee -a "$OUT/calibrate/calibrate.log"
tail -4 "$OUT/calibrate/calibrate.log"
t0=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernel_library/test_launch.py > "$OUT/launch_tests.log" 2>&1
echo "launch tests: exit $? after $((SECONDS - t0)) s"; tail -3 "$OUT/launch_tests.log"
t0=$SECONDS
timeout 300 python3 benchmarks/host/host_paths.py --out "$OUT/host_paths" > "$OUT/host_paths.log" 2>&1
echo "host_paths: exit $? after $((SECONDS - t0)) s"; tail -2 "$OUT/host_paths.log"
