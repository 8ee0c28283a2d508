#!/usr/bin/env bash
# The full calibrate of an older commit and of this tree, alternated on one device host (old, new, old, new): a
# same-host ratio of their wall times. OLD_TREE: the older commit's package, e.g.
#   git archive db0ee27 fusion_advisor rules kernel_library | tar -x -C .scratch/old_tree
# carried to the device (run's carry: [".scratch/old_tree"]). Each calibrate runs from its own tree's root, so
# `python -m` imports that tree's fusion_advisor (printed per run).
#   OUT=... OLD_TREE=.scratch/old_tree bash benchmarks/accuracy/calibrate_ab.sh
# Lands in $OUT: cal_{old,new}_{1,2}.yaml and cal_logs.tar.gz; prints each run's wall seconds.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
ROOT=$PWD
for round in 1 2; do
  for v in old new; do
    if [ $v = old ]; then D=$ROOT/$OLD_TREE; else D=$ROOT; fi
    W=$(cd $D && PYTHONPATH=$D python -c "import fusion_advisor; print(fusion_advisor.__file__)")
    t0=$(date +%s.%N)
    (cd $D && PYTHONPATH=$D timeout 200 python -m fusion_advisor.cli calibrate --device cuda --out "$OUT/cal_${v}_$round.yaml") > "$OUT/cal_${v}_$round.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    echo "round $round $v: exit $rc after $(python -c "print(round($t1-$t0,1))") s; $W; $(grep -o 'launch [0-9.]* us per eager op' $OUT/cal_${v}_$round.log)"
  done
done
cd $OUT && tar -czf cal_logs.tar.gz cal_*.log && rm cal_*.log
