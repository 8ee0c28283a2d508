"""Accuracy of a device spec on profiled report folders, as the cost-model issue counts it, with per-model lines.

For every ``analyze --profile`` report under DIR: each chain's in-model eager prediction on SPEC (at the profile's
host speed, ``fit_profiles.residuals``) against its measured time, and the model's total. Prints the share of
chains within ±30%, of models within ±25%, of chains whose bound class equals the measured one and the median
|log2 error| of chains; ``-v`` adds one line per model (worst under-prediction first), ``-vv`` its chains off by
more than 30%.

    python benchmarks/accuracy/judge_reports.py DIR SPEC [-v | -vv]
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.devices import load_spec  # noqa: E402
from fusion_advisor.devices.fit_profiles import read_report, report_folders, residuals  # noqa: E402


def within(pred: float, measured: float, band: float) -> bool:
    return measured > 0 and abs(pred / measured - 1) <= band


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    folder, spec = Path(sys.argv[1]), load_spec(sys.argv[2])
    chains, models = [], []
    for f in report_folders([folder]):
        rows, model = residuals(read_report(f), "test", spec, spec)
        chains += rows
        models.append((model, rows))
    bounds = [r for r in chains if r.measured_bound]
    print(f"chains {len(chains)} within30 {sum(within(r.after_us, r.measured_us, .3) for r in chains) / len(chains):.1%}"
          f"  models {len(models)} within25 "
          f"{sum(within(m.after_us, m.measured_us, .25) for m, _ in models) / len(models):.1%}"
          f"  bound {sum(r.after_bound == r.measured_bound for r in bounds) / len(bounds):.1%}"
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
