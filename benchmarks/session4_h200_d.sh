#!/usr/bin/env bash
# Session 4, device call 4: cProfile of a library op's forward + backward on the calling thread (autograd_probe),
# and the LayerNorm forward's num_warps (plain LayerNorm forward was 87% of copy, the residual one 95%).
#   bash benchmarks/session4_h200_d.sh      # from the repository root, with $OUT set
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r
mkdir -p "$R"
. benchmarks/steps.sh
step probe 90 python benchmarks/autograd_probe.py --out "$R/probe"
step ln_fwd 90 python benchmarks/sweep_tiles.py --out "$R/tiles" --only layernorm_fwd
tar czf "$OUT/results.tgz" -C "$OUT" r
cat "$R/steps.txt"
cat "$R/ln_fwd.log"
cat "$R/probe.log"
