"""Benchmark: wall time and peak RSS of a static (--device meta) analysis of a Llama-2-7B-shaped model.

32 layers, hidden 4096, intermediate 11008, 32 heads, vocab 32000, seq 4096, bf16 — the built-in decoder
with those sizes. Runs the whole analyze pipeline and the report writer in a fresh process, as the CLI would.
Writes ``analyze_7b_<host>.json`` into ``--out`` (default ``benchmarks/results/cpu/``: the analysis runs on the host
whatever GPU it has) and prints it.

    python benchmarks/analyze/analyze_7b.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the result file (default: %(default)s)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    import torch  # noqa: F401 - the import time of torch is part of what is measured

    from fusion_advisor.analyze.pipeline import analyze, versions
    from fusion_advisor.report.write import write_report
    import fusion_advisor.models.llama as llama

    t_import = time.perf_counter() - t0
    cfg = llama.LlamaConfig(num_layers=32, seq_len=4096)
    llama.default_config = lambda: cfg  # the built-in model's sizes for this run
    t1 = time.perf_counter()
    analysis = analyze(None, device="meta")
    t_analyze = time.perf_counter() - t1
    with tempfile.TemporaryDirectory() as out:
        t2 = time.perf_counter()
        write_report(analysis, Path(out))
        t_report = time.perf_counter() - t2
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {
        "benchmark": "static analysis of a Llama-2-7B-shaped model (--device meta)",
        "model": {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size,
                  "heads": cfg.num_heads, "vocab": cfg.vocab_size, "seq": cfg.seq_len, "dtype": "bf16"},
        "ops": len(analysis.ops),
        "chains": len(analysis.chains),
        "wall_s": {"imports": round(t_import, 2), "analyze": round(t_analyze, 2), "report": round(t_report, 2),
                   "total": round(time.perf_counter() - t0, 2), "stages": {k: round(v, 2) for k, v in analysis.timings_s.items()}},
        "peak_rss_mb": round(peak_rss_mb, 1),
        "targets": {"wall_s": 20, "peak_rss_mb": 2048},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": versions(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"analyze_7b_{platform.node() or 'host'}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
