"""A second, independently seeded convolution and matmul table, timed as calibrate times its own (issue 13).

calibrate's tables (``conv_rates``, ``matmul_rates``) are what the fitted time models
(:class:`fusion_advisor.devices.op_rates.ConvTimeModel`) are fitted through; choosing a model's form on the same
table it is fitted on rewards overfitting. This script measures the same plans (:func:`~fusion_advisor.devices.
rate_sampling.sample_plan`, :func:`~fusion_advisor.devices.rate_sampling.matmul_plan`) at another seed with calibrate's GPU
timer (:func:`fusion_advisor.devices.calibrate.kernel_timer`: the summed kernel durations of profiled calls, L2
warm) and writes them as spec entries, so a form fitted on calibrate's table can be judged on unseen geometries.

    python benchmarks/accuracy/table_probe.py --out FILE.json [--seed 1] [--conv-fp32 300] [--mm-fp32 60]
        [--budget-s 200]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from fusion_advisor.devices.calibrate import kernel_timer
from fusion_advisor.devices.rate_sampling import (GPU_MATMUL_FLOP_RANGE, GPU_MAX_ELEMS, matmul_plan, measure_conv_rates,
                                                  measure_matmul_rates, sample_plan)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conv-fp32", type=int, default=300)
    ap.add_argument("--mm-fp32", type=int, default=60)
    ap.add_argument("--budget-s", type=float, default=200.0)
    args = ap.parse_args()
    start = time.perf_counter()
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = True, False
    mm, mm_skipped = measure_matmul_rates(
        "cuda", matmul_plan({"fp32": args.mm_fp32}, seed=args.seed, max_elems=GPU_MAX_ELEMS,
                            flop_range=GPU_MATMUL_FLOP_RANGE), kernel_timer, args.budget_s / 4, DTYPES)
    conv, conv_skipped = measure_conv_rates(
        "cuda", sample_plan({"fp32": args.conv_fp32}, seed=args.seed, max_elems=GPU_MAX_ELEMS), kernel_timer,
        args.budget_s - (time.perf_counter() - start), DTYPES)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seed": args.seed, "timer": "calibrate.kernel_timer",
            "wall_s": round(time.perf_counter() - start, 1), "skipped": {**mm_skipped, **conv_skipped}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "conv_rates": [asdict(r.rounded()) for r in conv],
                                    "matmul_rates": [asdict(r.rounded()) for r in mm]}, indent=0))
    print(json.dumps(meta), len(conv), "convolutions,", len(mm), "matmuls")


if __name__ == "__main__":
    main()
