"""GPU launch-config sweep of the rmsnorm, softmax and cross-entropy library kernels (``bench --sweep``'s engine).

For each kernel in ``kernel_library.sweeps.SWEEPS`` (sizes and candidate configs there: softmax over a reduced grid
of widths 512 .. 262144 by rows 1 .. 65536 plus the reference rows), :func:`fusion_advisor.sweep.run_sweep` verifies
every config against ``reference_fn`` (float64, poisoned allocations), times the forward with do_bench (median,
L2 flushed) and reports GB/s from the sweep's bytes-moved formula and % of the H200 spec's copy bandwidth; first
calls (JIT compile + one run) are timed apart. The config the library's own heuristic picks at each size is
marked, so the table says whether the heuristic is the best config there and what it leaves on the table.

Writes ``sweep_kernels.json`` (setup + every row) and ``sweep_kernels.md`` to ``--out``.

    python benchmarks/kernels/sweep_kernels.py --out $OUT [--kernels softmax] [--warmup-ms 10 --rep-ms 40]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.kernel_tools.sweep import config_label, load_hooks, run_sweep  # noqa: E402
from fusion_advisor.kernel_tools.verify import load_contract  # noqa: E402


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(results: list[dict], meta: dict) -> str:
    """One table per kernel: per size the best config, the heuristic's, their times and % of roofline."""
    lines = [f"# Launch-config sweep on {meta['gpu']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; forward only; do_bench median "
             f"(warm-up {meta['warmup_ms']} ms, rep {meta['rep_ms']} ms, L2 flushed); % of roofline against the "
             f"`{meta['spec']}` spec's copy bandwidth; every timed config verified first; wall "
             f"{meta.get('wall_s', 0):.0f} s." + (f" Skipped (over budget): {', '.join(meta['skipped'])}."
                                                 if meta.get("skipped") else ""), ""]
    for res in results:
        lines += [f"## {res['sweep']}", "",
                  "| size | best config | best ms | best GB/s | best % roofline | heuristic config | heuristic ms | "
                  "heuristic / best | rejected | max first call ms |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in res["sizes"]:
            rows = [r for r in res["rows"] if r["size"] == s["size"]]
            best = next((r for r in rows if r["best"]), None)
            heur = next((r for r in rows if r["config"] == s.get("heuristic")), None)
            ratio = (heur["time_ms"] / best["time_ms"]) if heur and best and heur["time_ms"] and best["time_ms"] \
                else None
            first = max((r["first_call_ms"] or 0 for r in rows), default=None)
            lines.append(
                f"| {s['size']} | {s['best_config'] or '-'} | {_fmt(best and best['time_ms'], '.4f')} | "
                f"{_fmt(best and best['gbps'], ',.0f')} | {_fmt(best and best['pct_roofline'], '.0f')} | "
                f"{s.get('heuristic', '-')}{'' if heur else ' (not swept)'} | "
                f"{_fmt(heur and heur['time_ms'], '.4f')} | {_fmt(ratio, '.2f')} | {s['rejected']} | "
                f"{_fmt(first, ',.0f')} |")
        rejected = [r for r in res["rows"] if r["status"] == "rejected"]
        if rejected:
            lines += ["", "Rejected configs:", ""] + [f"- {r['size']} `{r['config']}`: {r['reason']}"
                                                      for r in rejected]
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kernels", default="rmsnorm,softmax,cross_entropy")
    ap.add_argument("--warmup-ms", type=float, default=10.0)
    ap.add_argument("--rep-ms", type=float, default=40.0)
    ap.add_argument("--gpu", default=None, help="device spec for %% of roofline (default: the present GPU's)")
    ap.add_argument("--budget-s", type=float, default=210.0,
                    help="kernels not started within this many seconds are skipped (and listed as skipped)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sweep_kernels.py needs a CUDA GPU (bench --sweep runs on the CPU interpreter instead)")
    args.out.mkdir(parents=True, exist_ok=True)
    from kernel_library.sweeps import SWEEPS

    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "cuda": torch.version.cuda,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
            "setup": "fusion_advisor.sweep.run_sweep over kernel_library.sweeps hooks; forward launch only"}
    results = []
    start = time.perf_counter()
    meta["skipped"] = []
    for name in args.kernels.split(","):
        if time.perf_counter() - start > args.budget_s:
            meta["skipped"].append(name)
            print(f"{name}: skipped, over the --budget-s of {args.budget_s:g} s", flush=True)
            continue
        t0 = time.perf_counter()
        hooks = load_hooks(load_contract(name))
        result = run_sweep(hooks, spec_name=args.gpu, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                           progress=lambda line: print(line, flush=True))
        doc = result.to_dict()
        for s, size in zip(doc["sizes"], hooks.sizes):
            s["heuristic"] = config_label(SWEEPS[name].heuristic(size))
        doc["wall_s"] = time.perf_counter() - t0
        meta["spec"] = result.spec
        results.append(doc)
        print(f"{name}: {len(doc['rows'])} configs in {doc['wall_s']:.1f} s", flush=True)
        torch.cuda.empty_cache()
        meta["wall_s"] = time.perf_counter() - start
        _write(args.out, meta, results)  # after each kernel: a run cut short keeps what it measured
    meta["wall_s"] = time.perf_counter() - start
    _write(args.out, meta, results)
    print(markdown(results, meta))


def _write(out: Path, meta: dict, results: list[dict]) -> None:
    (out / "sweep_kernels.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    (out / "sweep_kernels.md").write_text(markdown(results, meta))


if __name__ == "__main__":
    main()
