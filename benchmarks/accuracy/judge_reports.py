"""Accuracy of a device spec on profiled report folders, as the cost-model issue counts it, with per-model lines.

For every ``analyze --profile`` report under DIR: each chain's in-model eager prediction on SPEC (at the profile's
host speed, ``fit_profiles.residuals``) against its measured time, and the model's total. Prints the share of
chains within ±30%, of models within ±25%, of chains whose bound class equals the measured one and the median
|log2 error| of chains; ``-v`` adds one line per model (worst under-prediction first), ``-vv`` its chains off by
more than 30%. ``--measured-busy`` judges the host model alone: each op's predicted device time is replaced by its
measured busy time (per call of its graph), so a chain's prediction is its measured busy time plus the idle time the
host model predicts around it (for profiles taken on another GPU than SPEC's, or to compare idle-time sources).
The bound class's launch-or-not part is measured (idle over busy time); where neither side is launch-bound, the
compute-or-memory split is derived from the chain's FLOPs, bytes and SPEC's ceilings on both sides (the busy time
cancels out), so "launch or not" is the share that tests the model alone.

    python benchmarks/accuracy/judge_reports.py DIR SPEC [-v | -vv] [--measured-busy]
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.devices import load_spec  # noqa: E402
from fusion_advisor.analyze.roofline import estimate_all, in_model_times  # noqa: E402
from fusion_advisor.devices.fit_profiles import (ChainResidual, ModelResidual, measured_bounds,  # noqa: E402
                                                 model_eager_us, other_gpu_notes, profiled_host, read_report,
                                                 report_folders, residuals)


def busy_residuals(rep, spec):
    """:func:`residuals`' rows with each chain predicted as its measured busy time plus the host model's idle time
    around it, and its bound class from those times (:func:`estimate_all`), the ops' device times set to their
    measured busy times (per call of their graph)."""
    a, prof = rep.analysis, rep.analysis.profile
    host = profiled_host(a, spec)
    calls = rep.graph_calls
    busy = {o.id: prof.nodes[o.id].busy_us / max(calls.get(o.graph_index, 1.0), 1.0)
            for o in a.ops if o.id in prof.nodes}
    times = in_model_times(a.chains, a.ops, host, device_us=busy)
    bounds = estimate_all(a.chains, a.ops, host, device_us=busy)
    measured = measured_bounds(rep, spec)
    rows = []
    for c in a.chains:
        m = prof.chains.get(c.id)
        if m is None or m.time_us <= 0:
            continue
        t = sum(times[c.id]) * calls.get(c.graph_index, 1.0)
        rows.append(ChainResidual(rep.name, "test", c.id, c.pattern, m.time_us, t, t, measured[c.id],
                                  bounds[c.id].bound, bounds[c.id].bound))
    total = sum(r.after_us for r in rows)
    return rows, ModelResidual(rep.name, "test", model_eager_us(prof), total, total)


def within(pred: float, measured: float, band: float) -> bool:
    return measured > 0 and abs(pred / measured - 1) <= band


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    if len(args) < 2:
        sys.exit(__doc__)
    folder, spec = Path(args[0]), load_spec(args[1])
    chains, models = [], []
    reports = [read_report(f) for f in report_folders([folder])]
    for rep in reports:
        rows, model = (busy_residuals(rep, spec) if "--measured-busy" in sys.argv
                       else residuals(rep, "test", spec, spec))
        chains += rows
        models.append((model, rows))
    for note in other_gpu_notes(reports, spec):
        print(f"note: {note}")
    bounds = [r for r in chains if r.measured_bound]
    print(f"chains {len(chains)} within30 {sum(within(r.after_us, r.measured_us, .3) for r in chains) / len(chains):.1%}"
          f"  models {len(models)} within25 "
          f"{sum(within(m.after_us, m.measured_us, .25) for m, _ in models) / len(models):.1%}"
          f"  bound {sum(r.after_bound == r.measured_bound for r in bounds) / len(bounds):.1%}"
          f" (launch or not {sum((r.after_bound == 'launch') == (r.measured_bound == 'launch') for r in bounds) / len(bounds):.1%})"
          f"  median|log2| "
          f"{statistics.median(abs(math.log2(max(r.after_us, 1e-9) / r.measured_us)) for r in chains):.2f}")
    if "-v" not in sys.argv and "-vv" not in sys.argv:
        return
    for m, rows in sorted(models, key=lambda t: t[0].after_us / max(t[0].measured_us, 1e-9)):
        off = [r for r in rows if not within(r.after_us, r.measured_us, .3)]
        print(f"  {m.after_us / m.measured_us:6.2f}x {m.measured_us:10.1f} us  {len(off)}/{len(rows)} chains off  "
              f"{m.report}")
        if "-vv" in sys.argv:
            for r in off:
                print(f"        {r.after_us / r.measured_us:6.2f}x {r.measured_us:9.1f} us {r.pattern[:90]}")


if __name__ == "__main__":
    main()
