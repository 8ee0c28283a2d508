"""Probe for the convolution rate table (issue 13): a large seeded sample of convolutions, each timed two ways.

- ``flushed_ms``: calibrate's table timer (``triton.testing.do_bench`` median, L2 flushed before each call,
  :data:`fusion_advisor.devices.rate_sampling.TABLE_WARMUP_MS` / ``TABLE_REP_MS``);
- ``warm_ms``: device time per call of a CUDA graph replaying the call back to back (inputs resident in L2 where
  they fit, as a convolution reading the output of the op before it inside a model; no host time).

One row per problem (its :class:`~fusion_advisor.devices.rate_sampling.ConvProblem`, geometry and both times), written
as JSON, so that tables can be built and judged offline against ``analyze --profile`` reports: which sample, which
timer and which surface predict in-model convolution times best.

- ``kernel_ms`` / ``kernel_bias_ms`` (``--kernels``): the summed durations of the kernels of one call under
  ``torch.profiler`` (warm, no flush, no gaps between kernels), without and with a bias: what ``analyze --profile``
  measures as an op's busy time inside a model.

    python benchmarks/accuracy/conv_rate_probe.py --out DIR [--fp32 300] [--bf16 60] [--budget-s 300] [--kernels]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fusion_advisor.devices.op_rates import ConvGeometry
from fusion_advisor.devices.rate_sampling import GPU_MAX_ELEMS, TABLE_REP_MS, TABLE_WARMUP_MS, sample_plan
from fusion_advisor.kernel_tools.bench import device_time_by_kernel, time_cuda

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def warm_ms(call, estimate_ms: float, out_bytes: int) -> float:
    """Device time per call (ms) of ``call`` replayed back to back from one CUDA graph (median of 5 replays)."""
    n = int(min(max(1.0 / max(estimate_ms, 1e-3), 1), 50, max((4 << 30) // max(out_bytes, 1), 1)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
        call()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            call()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / n)
    del g
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fp32", type=int, default=300)
    ap.add_argument("--bf16", type=int, default=60)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", action="store_true", help="also time each by its kernels under torch.profiler")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = True, False
    plan = sample_plan({"fp32": args.fp32, "bf16": args.bf16}, seed=args.seed, max_elems=GPU_MAX_ELEMS,
                       flop_range=(1e7, 2e11))
    rows, start = [], time.perf_counter()
    for i, p in enumerate(plan):
        if time.perf_counter() - start > args.budget_s:
            print(f"budget: {len(plan) - i} of {len(plan)} left out")
            break
        d = len(p.spatial)
        dt = DTYPES[p.dtype]
        row = {"problem": dataclasses.asdict(p)}
        b = None
        try:
            x = torch.randn(p.batch, p.c_in, *p.spatial, device="cuda", dtype=dt)
            if p.transposed:
                w = torch.randn(p.c_in, p.c_out // p.groups, *p.kernel, device="cuda", dtype=dt)
                fn = getattr(F, f"conv_transpose{d}d")
            else:
                w = torch.randn(p.c_out, p.c_in // p.groups, *p.kernel, device="cuda", dtype=dt)
                fn = getattr(F, f"conv{d}d")

            def call(x=x, w=w, fn=fn, p=p):
                return fn(x, w, stride=p.stride, padding=p.padding, groups=p.groups)

            y = call()
            geom = ConvGeometry.from_shapes(tuple(x.shape), tuple(w.shape), tuple(y.shape))
            row.update(x=list(x.shape), w=list(w.shape), y=list(y.shape), detail=geom.detail if geom else "",
                       gflop=geom.flops / 1e9 if geom else 0.0)
            out_bytes = y.numel() * y.element_size()
            del y
            t0 = time.perf_counter()
            row["flushed_ms"] = time_cuda(call, warmup_ms=TABLE_WARMUP_MS, rep_ms=TABLE_REP_MS).median_ms
            row["flushed_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            row["warm_ms"] = warm_ms(call, row["flushed_ms"], out_bytes)
            row["warm_s"] = time.perf_counter() - t0
            if args.kernels:  # summed kernel durations per call (torch.profiler), as analyze --profile measures
                t0 = time.perf_counter()
                by_kernel = device_time_by_kernel(call, iters=3)
                row["kernel_ms"], row["kernels"] = sum(by_kernel.values()), len(by_kernel)
                b = torch.randn(p.c_out, device="cuda", dtype=dt)
                row["kernel_bias_ms"] = sum(device_time_by_kernel(
                    lambda fn=fn, x=x, w=w, b=b, p=p: fn(x, w, b, stride=p.stride, padding=p.padding, groups=p.groups),
                    iters=3).values())
                row["kernel_s"] = time.perf_counter() - t0
        except (RuntimeError, ValueError) as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        finally:
            x = w = b = None
            torch.cuda.empty_cache()
        rows.append(row)
        if i % 50 == 0:
            print(i, row.get("detail"), row.get("gflop"), row.get("flushed_ms"), row.get("warm_ms"), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seed": args.seed, "planned": len(plan),
            "measured": len(rows), "wall_s": time.perf_counter() - start}
    (args.out / "conv_probe.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
