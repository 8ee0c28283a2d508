"""Host time per call of a whole model under torch.compile and under reduce-overhead, against the eager add probe.

The whole-model route predictions (``fusion_advisor.report.views.predicted_model_routes``) price a compiled model
as its fused kernels and a reduce-overhead one as their device time, with no per-call cost of dynamo's guards,
Inductor's wrapper or the CUDA-graph tree's replay (a fresh user: three integer ops predicted 41.1 us eager, 2.4
us under CUDA graphs). This measures that cost where the GPU work is negligible: chains of 1, 4 and 16 tiny
elementwise ops and a 4-layer MLP of width 64 (batch 8), each called back to back (one synchronize per loop,
``--calls`` calls, median of ``--loops`` loops) eagerly, compiled (default mode) and compiled with
``mode="reduce-overhead"``, beside the profile's dispatch probe (``torch.add(x, 1.0)`` on 1024 floats). Writes
compiled_call_probe.json to --out: microseconds per call and in probe units.

    python benchmarks/host/compiled_call_probe.py --out DIR [--calls 200 --loops 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch


def per_call_us(fn: Callable[[], Any], calls: int, loops: int) -> float:
    """Median over ``loops`` of the wall time (us) per call of ``calls`` back-to-back calls, one sync per loop,
    after one warm-up loop."""
    times = []
    for i in range(loops + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        if i:
            times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def chain(n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        for i in range(n):
            x = x * 1.0001 + 0.001 * i
        return x
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--loops", type=int, default=7)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    x = torch.randn(1024, device="cuda")
    probe = per_call_us(lambda: torch.add(x, 1.0), args.calls, args.loops)
    mlp = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]).cuda().eval()
    xm = torch.randn(8, 64, device="cuda")
    models: dict[str, tuple[Callable[..., Any], tuple[Any, ...], int]] = {
        f"chain{n}": (chain(n), (x,), 2 * n) for n in (1, 4, 16)}
    models["mlp4"] = (mlp, (xm,), 8)
    rows = []
    with torch.no_grad():
        for name, (fn, inputs, eager_ops) in models.items():
            row: dict[str, Any] = {"model": name, "eager_aten_ops": eager_ops}
            for mode in ("eager", "default", "reduce-overhead"):
                torch._dynamo.reset()
                call = fn if mode == "eager" else torch.compile(fn, mode=None if mode == "default" else mode)
                start = time.perf_counter()
                for _ in range(3):  # compile, record, warm
                    call(*inputs)
                torch.cuda.synchronize()
                row[f"{mode}_first_calls_s"] = round(time.perf_counter() - start, 2)
                us = per_call_us(lambda call=call, inputs=inputs: call(*inputs), args.calls, args.loops)
                row[f"{mode}_us"] = round(us, 2)
                row[f"{mode}_probes"] = round(us / probe, 2)
            rows.append(row)
            print(row, flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "probe_us": round(probe, 3),
           "calls": args.calls, "loops": args.loops, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compiled_call_probe.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"probe {probe:.2f} us per add")


if __name__ == "__main__":
    main()
