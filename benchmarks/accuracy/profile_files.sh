#!/usr/bin/env bash
# analyze --profile of named KernelBench files on the GPU at hand, each in a process of its own, as a user runs it;
# the report.json of each packed into $OUT/reports.tar.gz (a folder per file, named <level>_<stem> as
# fit_kernelbench.py names them, so benchmarks/accuracy/judge_reports.py reads them), the log beside it.
#   OUT=... bash benchmarks/accuracy/profile_files.sh SPEC TIMEOUT_S FILE...   (FILE: e.g. .kb/level3/30_X.py)
set -u
SPEC=$1; TMO=$2; shift 2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/profile_files.log"
for f in "$@"; do
  name="$(basename "$(dirname "$f")")_$(basename "$f" .py)"
  t0=$SECONDS
  timeout "$TMO" python -m fusion_advisor.cli analyze "$f" --device cuda --profile --gpu "$SPEC" --out "$W/$name" \
    > "$W/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/profile_files.log"
  find "$W/$name" -type f ! -name report.json -delete 2>/dev/null
done
(cd "$W" && tar czf "$OUT/reports.tar.gz" --exclude='*.log' .)
