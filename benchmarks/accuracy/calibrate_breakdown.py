"""Where the full ``calibrate``'s minute goes: ``calibrate.measure()`` run as the CLI runs it, each of its
``measure_*`` functions and its timers wrapped to record their wall time (issue 13: "the full calibrate under 60 s").

Every ``measure_*`` name in ``fusion_advisor.devices.calibrate``'s namespace is wrapped (wall seconds, calls), as
are the timers the tables and grids call per point (``calibrate.kernel_timer``; ``attention_rates.time_cuda``, the
SDPA grid's), so a step's time splits into the timed calls and what happens around them (tensor set-up, the first
call of a library's kernel). Writes JSON: the GPU, versions, the step seconds calibrate records itself, and per
wrapped function its calls and seconds; for the attention grid, seconds per backend and dtype.

    python benchmarks/accuracy/calibrate_breakdown.py --out breakdown.json
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from fusion_advisor.devices import attention_rates, calibrate  # noqa: E402

SECONDS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
ACTIVE: list[str] = []  # the wrapped measure_* functions running, outermost first


def timed(name: str, fn: Callable[..., Any], inner: bool = False) -> Callable[..., Any]:
    """``fn`` recording its wall seconds and calls under ``name`` (an ``inner`` timer: under ``name`` in the
    innermost wrapped ``measure_*`` running)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = f"{name} in {ACTIVE[-1] if ACTIVE else '-'}" if inner else name
        if not inner:
            ACTIVE.append(name)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[key] += time.perf_counter() - start
            CALLS[key] += 1
            if not inner:
                ACTIVE.pop()

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--quick", action="store_true", help="calibrate --quick's sizes")
    args = ap.parse_args()
    for name in dir(calibrate):
        if name.startswith("measure_") and name != "measure" and callable(getattr(calibrate, name)):
            setattr(calibrate, name, timed(name, getattr(calibrate, name)))
    calibrate.kernel_timer = timed("kernel_timer", calibrate.kernel_timer, inner=True)
    sdpa_point = attention_rates.time_cuda

    def attention_point(fn: Callable[[], Any], **kw: Any) -> Any:
        return timed("time_cuda", sdpa_point, inner=True)(fn, **kw)

    attention_rates.time_cuda = attention_point
    start = time.perf_counter()
    cal = calibrate.measure(args.device, quick=args.quick)
    total = time.perf_counter() - start
    doc = {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "measure_s": round(total, 2),
           "steps_s": cal.step_seconds,
           "wrapped": {k: {"calls": CALLS[k], "s": round(v, 2)} for k, v in sorted(SECONDS.items(),
                                                                                 key=lambda kv: -kv[1])}}
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
