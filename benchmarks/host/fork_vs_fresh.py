"""Does a profile in a child forked by fit_kernelbench.py's worker measure what a user's own ``fusion-advisor analyze
FILE --device cuda --profile`` measures? Each file profiled, in alternating rounds, by the CLI in a fresh interpreter
and by :func:`benchmarks.accuracy.fit_kernelbench.worker` (a child forked per file from a process that imported
torch and fusion_advisor); each report's plain eager wall time, summed kernel time and dispatch probe side by side.

Why: the seed-1 accuracy set profiled through forked children (2026-12-03) measured VanillaRNNHidden's eager wall at
28.0 ms with a 9.0 us dispatch probe, where a fresh CLI run in session 17 measured 15.5 ms.

    python benchmarks/host/fork_vs_fresh.py --out DIR --rounds 2 FILE.py...   # writes DIR/fork_vs_fresh.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _read(report: Path) -> dict:
    p = json.loads(report.read_text()).get("profile") or {}
    return {k: round(p[k], 2) for k in ("eager_wall_us", "total_us", "dispatch_us", "instrumented_dispatch_us")
            if k in p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fork_vs_fresh_"))
    rows = []
    for r in range(args.rounds):
        for f in args.files:
            out = work / f"fresh{r}" / f.stem
            subprocess.run([sys.executable, "-m", "fusion_advisor.cli", "analyze", str(f), "--device", "cuda",
                            "--profile", "--gpu", "h200", "--out", str(out)], cwd=ROOT, capture_output=True)
            rows.append({"file": f.name, "round": r, "how": "fresh CLI",
                         **(_read(out / "report.json") if (out / "report.json").is_file() else {"failed": True})})
        listing, progress = work / "listing.txt", work / f"progress{r}.jsonl"
        listing.write_text("\n".join(str(f.resolve()) for f in args.files))
        subprocess.run([sys.executable, str(ROOT / "benchmarks/accuracy/fit_kernelbench.py"), "--worker",
                        str(listing), "--progress", str(progress), "--work", str(work / f"fork{r}"),
                        "--device", "cuda", "--gpu", "h200", "--kernelbench", ".", "--out", str(work)], cwd=ROOT)
        for f in args.files:
            rep = work / f"fork{r}" / f"{f.parent.name}_{f.stem}" / "report.json"
            rows.append({"file": f.name, "round": r, "how": "forked worker child",
                         **(_read(rep) if rep.is_file() else {"failed": True})})
        for row in rows[-2 * len(args.files):]:
            print(row, flush=True)
    import torch
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fork_vs_fresh.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
         "what": __doc__.split("\n\n")[0], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
