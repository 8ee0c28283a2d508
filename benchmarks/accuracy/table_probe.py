"""A second, independently seeded convolution and matmul table, timed as calibrate times its own (issue 13).

calibrate's tables (``conv_rates``, ``matmul_rates``) are what the fitted time models
(:class:`fusion_advisor.devices.op_rates.ConvTimeModel`) are fitted through; choosing a model's form on the same
table it is fitted on rewards overfitting. This script measures the same plans (:func:`~fusion_advisor.devices.
rate_sampling.sample_plan`, :func:`~fusion_advisor.devices.rate_sampling.matmul_plan`) at another seed with calibrate's GPU
timer (:func:`fusion_advisor.devices.calibrate.kernel_timer`: the summed kernel durations of profiled calls, L2
warm) and writes them as spec entries, so a form fitted on calibrate's table can be judged on unseen geometries.

The same for the normalization, softmax and reduction table (``reduction_rates``,
:func:`fusion_advisor.devices.reduction_rates.reduction_plan`): ``--reductions K`` measures K times calibrate's
sample of each class at this seed.

    python benchmarks/accuracy/table_probe.py --out FILE.json [--seed 1] [--conv-fp32 300] [--mm-fp32 60]
        [--reductions 0] [--budget-s 200]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from fusion_advisor.devices.calibrate import kernel_timer
from fusion_advisor.devices.reduction_rates import (GPU_MAX_ELEMS as REDUCTION_MAX_ELEMS, REDUCTION_SAMPLES,
                                                    measure_reduction_rates, reduction_plan)
from fusion_advisor.devices.rate_sampling import (GPU_MATMUL_FLOP_RANGE, GPU_MAX_ELEMS, matmul_plan, measure_conv_rates,
                                                  measure_matmul_rates, sample_plan)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conv-fp32", type=int, default=300)
    ap.add_argument("--mm-fp32", type=int, default=60)
    ap.add_argument("--reductions", type=int, default=0, help="times calibrate's sample per reduction class")
    ap.add_argument("--budget-s", type=float, default=200.0)
    args = ap.parse_args()
    start = time.perf_counter()
    red, red_skipped = [], {}
    if args.reductions > 0:
        per_class = {op: n * args.reductions for op, n in REDUCTION_SAMPLES["cuda"][0].items()}
        red, red_skipped = measure_reduction_rates(
            "cuda", reduction_plan(per_class, REDUCTION_MAX_ELEMS, seed=args.seed), kernel_timer, args.budget_s / 4,
            DTYPES)
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = True, False
    mm, mm_skipped = [], {}
    if args.mm_fp32 > 0:
        mm, mm_skipped = measure_matmul_rates(
            "cuda", matmul_plan({"fp32": args.mm_fp32}, seed=args.seed, max_elems=GPU_MAX_ELEMS,
                                flop_range=GPU_MATMUL_FLOP_RANGE), kernel_timer, args.budget_s / 4, DTYPES)
    conv, conv_skipped = [], {}
    if args.conv_fp32 > 0:
        conv, conv_skipped = measure_conv_rates(
            "cuda", sample_plan({"fp32": args.conv_fp32}, seed=args.seed, max_elems=GPU_MAX_ELEMS), kernel_timer,
            args.budget_s - (time.perf_counter() - start), DTYPES)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seed": args.seed, "timer": "calibrate.kernel_timer",
            "wall_s": round(time.perf_counter() - start, 1), "skipped": {**mm_skipped, **conv_skipped, **red_skipped}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "conv_rates": [asdict(r.rounded()) for r in conv],
                                    "matmul_rates": [asdict(r.rounded()) for r in mm],
                                    "reduction_rates": [r.entry() for r in red]}, indent=0))
    print(json.dumps(meta), len(conv), "convolutions,", len(mm), "matmuls,", len(red), "reductions")


if __name__ == "__main__":
    main()
