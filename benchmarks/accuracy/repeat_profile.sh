#!/usr/bin/env bash
# analyze --profile of one file N times, each in a fresh process, one after another on the GPU at hand: how much
# a profile (its host-speed probe above all) moves between runs of the same file. The reports land in
# $OUT/repeat_<stem>.tar.gz as folders run1 ... runN, each holding <level>_<stem>/report.json (the layout
# judge_reports.py reads), with profile_files.sh's logs.
#   OUT=... bash benchmarks/accuracy/repeat_profile.sh SPEC TIMEOUT_S N FILE   (FILE: e.g. .kb/level3/34_X.py)
set -u
: "${OUT:?set OUT to the folder the results go to}"
SPEC=$1; TMO=$2; N=$3; FILE=$4
W=$(mktemp -d)
for i in $(seq 1 "$N"); do
  mkdir -p "$W/run$i/out"
  OUT="$W/run$i/out" bash "$(dirname "$0")/profile_files.sh" "$SPEC" "$TMO" "$FILE" | tail -1
  tar xzf "$W/run$i/out/reports.tar.gz" -C "$W/run$i" && mv "$W/run$i/out/profile_files.log" "$W/run$i/" \
    && rm -rf "$W/run$i/out"
done
tar czf "$OUT/repeat_$(basename "$FILE" .py).tar.gz" -C "$W" . && rm -rf "$W"
