"""The bandwidth of eager pointwise kernels that broadcast an input, read from ``analyze --profile`` reports.

Every pointwise op of one kernel and at least ``MIN_BUSY_US`` of measured device time (bandwidth-bound, past the
launch floor) in the report folders given: its bytes (``roofline.op_bytes``) over its measured busy time per call,
split by whether it broadcasts an input (``OpInfo.reads_broadcast``: ``x + bias[:, None, None]``, a 0-dim tensor, a
``[1, 1, T, T]`` mask). The medians per folder and over the ``--fit`` folders (the spec's
``broadcast_bandwidth_gbps`` where no calibrate measured it); every op as a row of the JSON.

    python benchmarks/accuracy/broadcast_from_profiles.py --fit DIR... --test DIR... --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.analyze.roofline import op_bytes  # noqa: E402
from fusion_advisor.devices.fit_profiles import read_report, report_folders  # noqa: E402

#: Least measured device time (us) of an op counted: shorter kernels are dominated by their fixed cost.
MIN_BUSY_US = 30.0


def rows_of(folder: Path) -> list[dict]:
    """One row per bandwidth-bound pointwise op of the reports under ``folder``."""
    out = []
    for path in report_folders([folder]):
        rep = read_report(path)
        nodes = rep.analysis.profile.nodes
        for op in rep.analysis.ops:
            m = nodes.get(op.id)
            if op.category != "pointwise" or not op.outputs or m is None or m.kernels != 1:
                continue
            busy = m.busy_us / rep.graph_calls.get(op.graph_index, 1.0)
            if busy < MIN_BUSY_US:
                continue
            out.append({"report": rep.name, "op": op.target, "inputs": [list(t.shape) for t in op.inputs],
                        "broadcast": op.reads_broadcast, "bytes": op_bytes(op), "busy_us": round(busy, 2),
                        "gbps": round(op_bytes(op) / busy / 1e3, 1)})
    return out


def median_gbps(rows: list[dict], broadcast: bool) -> float | None:
    rates = [r["gbps"] for r in rows if r["broadcast"] == broadcast]
    return round(statistics.median(rates), 1) if rates else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", type=Path, nargs="+", required=True)
    ap.add_argument("--test", type=Path, nargs="*", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sets = {str(d): ("fit", rows_of(d)) for d in args.fit} | {str(d): ("test", rows_of(d)) for d in args.test}
    summary = {d: {"split": split, "broadcast_ops": sum(r["broadcast"] for r in rows),
                   "broadcast_gbps": median_gbps(rows, True), "contiguous_ops": sum(not r["broadcast"] for r in rows),
                   "contiguous_gbps": median_gbps(rows, False)} for d, (split, rows) in sets.items()}
    fit_rows = [r for split, rows in sets.values() if split == "fit" for r in rows]
    doc = {"method": __doc__.split("\n\n")[1].replace("\n", " "), "min_busy_us": MIN_BUSY_US,
           "fit_broadcast_gbps": median_gbps(fit_rows, True), "fit_contiguous_gbps": median_gbps(fit_rows, False),
           "folders": summary, "rows": {d: rows for d, (_, rows) in sets.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for d, s in summary.items():
        print(d, s)
    print("fit set: broadcast", doc["fit_broadcast_gbps"], "GB/s, contiguous", doc["fit_contiguous_gbps"], "GB/s")


if __name__ == "__main__":
    main()
