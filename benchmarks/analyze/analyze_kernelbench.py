"""``fusion-advisor analyze`` on every KernelBench file, on the default device (meta without a GPU), as a user runs it.

For each file: the analysis and its report (report.html, chains.csv, ...) in a fresh process (``python -m
fusion_advisor.cli analyze FILE --out DIR``, a time limit per file), its exit code, wall time, capture method, device
and the first error line. Writes ``results.json`` and ``results.md`` into ``--out``.

    python benchmarks/analyze/analyze_kernelbench.py --kernelbench ../shared/kernelbench --out /tmp/kb_analyze
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernelbench", type=Path, required=True, help="folder with level1/ level2/ level3/")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per file")
    ap.add_argument("--levels", nargs="*", default=["level1", "level2", "level3"])
    ap.add_argument("--only", nargs="*", default=[], help="rerun these files (level/name.py) and update the "
                    "results.json already in --out")
    args = ap.parse_args()
    files = [f for level in args.levels for f in sorted((args.kernelbench / level).glob("*.py"))]
    args.out.mkdir(parents=True, exist_ok=True)
    previous: list[dict] = []
    if args.only:
        previous = json.loads((args.out / "results.json").read_text())["files"]
        files = [f for f in files if f"{f.parent.name}/{f.name}" in set(args.only)]
    rows = []
    for i, f in enumerate(files):
        out = args.out / f.parent.name / f.stem
        start = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-m", "fusion_advisor.cli", "analyze", str(f), "--out", str(out)],
                               capture_output=True, text=True, timeout=args.timeout)
            code, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            code, text = "timeout", ""
        seconds = time.perf_counter() - start
        report = (out / "report.json").is_file()
        meta = {}
        if report:
            doc = json.loads((out / "report.json").read_text())
            head = doc.get("analysis", doc)
            meta = {"capture": head.get("capture_method"), "device": head.get("device"),
                    "chains": len(head.get("chains", [])),
                    "notes": [w[:160] for w in head.get("warnings", [])][:3]}
        error = next((line for line in text.splitlines() if line.startswith(("error:", "internal error:"))), "")
        rows.append({"file": f"{f.parent.name}/{f.name}", "exit": code, "report": report, "seconds": seconds,
                     "error": error[:300], "traceback": "Traceback" in text, **meta})
        print(f"[{i + 1}/{len(files)}] {f.parent.name}/{f.name}: exit {code}, {seconds:.1f} s, "
              f"{'report' if report else 'NO REPORT'} {error[:120]}", flush=True)
    if previous:  # the reruns replace their rows, in the original order
        redone = {r["file"]: r for r in rows}
        rows = [redone.get(r["file"], r) for r in previous]
    ok = sum(r["report"] for r in rows)
    summary = {"files": len(rows), "with_report": ok, "tracebacks": sum(r["traceback"] for r in rows),
               "median_s": sorted(r["seconds"] for r in rows)[len(rows) // 2] if rows else None,
               "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "python": platform.python_version(), "machine": f"{platform.machine()}, no GPU"}
    try:
        import torch

        summary["torch"] = torch.__version__
    except ImportError:
        pass
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "files": rows}, indent=1))
    lines = [f"# analyze on {len(rows)} KernelBench files ({summary['date']}, torch {summary.get('torch')}, "
             f"{summary['machine']})", "", f"{ok} of {len(rows)} wrote a report; {summary['tracebacks']} tracebacks; "
             f"median {summary['median_s']:.1f} s per file (a fresh process each, import included).", "",
             "| file | exit | s | capture | device | chains | error |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['file']} | {r['exit']} | {r['seconds']:.1f} | {r.get('capture', '')} | {r.get('device', '')} | "
              f"{r.get('chains', '')} | {r['error'][:100]} |" for r in rows]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:3]))


if __name__ == "__main__":
    main()
