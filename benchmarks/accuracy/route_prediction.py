"""Is the whole-model route the analysis predicts the one that measures fastest? Static analysis vs apply_models.

For every model that ``benchmarks/apply/apply_models.py`` timed on a GPU (its results JSON: eager,
``torch.compile(model)`` and ``mode="reduce-overhead"``, each checked against the model as written), this runs
``analyze`` statically as a user would on a machine without a GPU (default device, the shipped spec named by
``--gpu``) and compares the route :func:`fusion_advisor.report.views.predicted_model_routes` predicts with the
measured times. A prediction counts as right when the predicted route's measured time is within ``--margin``
(3%, apply's never-slower margin) of the fastest correct measured route: between two routes inside the noise the
choice costs nothing.

Usage (CPU is enough): ``python benchmarks/accuracy/route_prediction.py --kernelbench .kb --results
benchmarks/results/h200/apply_models/kernelbench_seed0.json --out DIR``; writes ``route_prediction.{json,md}``.
``builtin`` in a results file is the built-in default model.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fusion_advisor.analyze.pipeline import analyze  # noqa: E402
from fusion_advisor.report.views import MODEL_ROUTES, analysis_model_routes  # noqa: E402
from fusion_advisor.report.write import chains_frame  # noqa: E402


def measured(rec: dict) -> dict[str, float]:
    """Measured ms per route of one apply_models record, correct routes only."""
    v = rec["eval"]["variants"]
    return {r: v[r]["ms"] for r in MODEL_ROUTES if r in v and v[r].get("correct_at_1e-2") and v[r].get("ms")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", type=Path, required=True, help="Folder with level2/ level3/ (the files timed).")
    ap.add_argument("--results", type=Path, nargs="+", required=True, help="apply_models results JSON files.")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--margin", type=float, default=0.03)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows, seen, gpus = [], set(), set()
    for res in args.results:
        data = json.loads(res.read_text())
        gpus.add((data.get("meta") or {}).get("gpu") or "unknown GPU")
        for rec in data["results"]:
            if not rec.get("eval") or rec["name"] in seen:
                continue
            seen.add(rec["name"])
            path = None if rec["name"] == "builtin" else args.kernelbench / rec["level"] / f"{rec['name']}.py"
            a = analyze(path, gpu=args.gpu)
            pred = analysis_model_routes(a, chains_frame(a))
            meas = measured(rec)
            best = min(meas, key=meas.get)
            got = meas.get(pred["best"], float("inf"))
            rows.append({"model": rec["name"], "level": rec["level"], "results": res.name,
                         "predicted_us": {r: round(pred[r], 1) for r in MODEL_ROUTES}, "predicted_best": pred["best"],
                         "measured_ms": meas, "measured_best": best,
                         "right": got <= meas[best] * (1 + args.margin),
                         "predicted_route_vs_best": round(meas[best] / got, 4) if got < float("inf") else None})
            print(f"{rec['name']}: predicted {pred['best']}, measured best {best}, right={rows[-1]['right']}",
                  flush=True)
    right = sum(r["right"] for r in rows)
    timed_on = " / ".join(sorted(gpus))
    result = {"date": datetime.date.today().isoformat(), "spec": args.gpu, "margin": args.margin,
              "how": f"static analyze (default device) on this machine vs the {timed_on} timings of the results files",
              "models": len(rows), "right": right, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "route_prediction.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Predicted vs measured best whole-model route ({args.gpu} spec, {result['date']})\n",
             f"{right} of {len(rows)} right (the predicted route measures within {args.margin:.0%} of the fastest "
             "correct one). Predicted: static analysis; measured: the apply_models runs named per row "
             f"({timed_on}).\n",
             "| model | predicted us (eager / compile / CUDA graphs) | predicted | measured ms (eager / compile / "
             "CUDA graphs) | measured best | right |", "|---|---|---|---|---|---|"]
    for r in rows:
        p, m = r["predicted_us"], r["measured_ms"]
        lines.append(f"| {r['model']} | {p['eager']:.0f} / {p['torch.compile']:.0f} / {p['reduce-overhead']:.0f} | "
                     f"{r['predicted_best']} | " + " / ".join(f"{m.get(k, float('nan')):.4g}" for k in MODEL_ROUTES)
                     + f" | {r['measured_best']} | {'yes' if r['right'] else 'no'} |")
    (args.out / "route_prediction.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
