"""The bandwidth of eager kernels that broadcast an input or read a permuted one, from ``analyze --profile`` reports.

Every roofline-priced op (pointwise, or a copy that is not a concatenation) of one kernel and at least
``MIN_BUSY_US`` of measured device time (bandwidth-bound, past the launch floor) in the report folders given: its
bytes (``roofline.op_bytes``) over its measured busy time per call, by how it reads its inputs: ``permuted``
(``OpInfo.reads_permuted``: ``x.transpose(1, 2).contiguous()``, a pointwise op on a permuted view), ``broadcast``
(a pointwise op with ``OpInfo.reads_broadcast``: ``x + bias[:, None, None]``, a 0-dim tensor, a ``[1, 1, T, T]``
mask) or ``contiguous``. The medians per folder and over the ``--fit`` folders (the spec's
``strided_bandwidth_gbps`` and ``broadcast_bandwidth_gbps`` where no calibrate measured them); every op as a row.

    python benchmarks/accuracy/memory_rates_from_profiles.py --fit DIR... --test DIR... --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.analyze.roofline import memory_read_kinds, op_bytes  # noqa: E402
from fusion_advisor.devices.fit_profiles import read_report, report_folders  # noqa: E402

#: Least measured device time (us) of an op counted: shorter kernels are dominated by their fixed cost.
MIN_BUSY_US = 30.0
#: How an op reads its inputs: the first of its ``roofline.memory_read_kinds``, else contiguously.
READS = ("permuted", "broadcast", "contiguous")


def reads(op) -> str | None:
    """``permuted``, ``broadcast`` or ``contiguous`` (the rate ``roofline.op_bandwidth_gbps`` prices it at, where
    the spec has all three) for a pointwise op or a copy that is not a concatenation; None for others."""
    if op.category not in ("copy", "pointwise") or op.name in ("cat", "stack"):
        return None
    return next(iter(memory_read_kinds(op)), "contiguous")


def rows_of(folder: Path) -> list[dict]:
    """One row per bandwidth-bound op of the reports under ``folder``."""
    out = []
    for path in report_folders([folder]):
        rep = read_report(path)
        nodes = rep.analysis.profile.nodes
        for op in rep.analysis.ops:
            m, how = nodes.get(op.id), reads(op)
            if how is None or not op.outputs or m is None or m.kernels != 1:
                continue
            busy = m.busy_us / rep.graph_calls.get(op.graph_index, 1.0)
            if busy < MIN_BUSY_US:
                continue
            out.append({"report": rep.name, "op": op.target, "inputs": [list(t.shape) for t in op.inputs],
                        "reads": how, "bytes": op_bytes(op), "busy_us": round(busy, 2),
                        "gbps": round(op_bytes(op) / busy / 1e3, 1)})
    return out


def median_gbps(rows: list[dict], how: str) -> float | None:
    rates = [r["gbps"] for r in rows if r["reads"] == how]
    return round(statistics.median(rates), 1) if rates else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", type=Path, nargs="+", required=True)
    ap.add_argument("--test", type=Path, nargs="*", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sets = {str(d): ("fit", rows_of(d)) for d in args.fit} | {str(d): ("test", rows_of(d)) for d in args.test}
    summary = {d: {"split": split, **{f"{how}_ops": sum(r["reads"] == how for r in rows) for how in READS},
                   **{f"{how}_gbps": median_gbps(rows, how) for how in READS}} for d, (split, rows) in sets.items()}
    fit_rows = [r for split, rows in sets.values() if split == "fit" for r in rows]
    doc = {"method": __doc__.split("\n\n")[1].replace("\n", " "), "min_busy_us": MIN_BUSY_US,
           **{f"fit_{how}_gbps": median_gbps(fit_rows, how) for how in READS},
           "folders": summary, "rows": {d: rows for d, (_, rows) in sets.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for d, s in summary.items():
        print(d, s)
    print("fit set:", ", ".join(f"{how} {doc[f'fit_{how}_gbps']} GB/s" for how in READS))


if __name__ == "__main__":
    main()
