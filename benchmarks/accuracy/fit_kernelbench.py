"""Learn the cost model from profiles of models nobody here wrote, and test it on others: KernelBench on a GPU.

1. A seeded subset of KernelBench files (``--level1 N --level2 N --level3 N --seed S``, sorted names sampled with
   ``random.Random(seed)``; the chosen names are in the result) is analysed and profiled as a user would:
   ``analyze(FILE, device="cuda", gpu=SPEC, profile=True)`` and ``write_report`` (what ``fusion-advisor analyze
   FILE --device cuda --profile --gpu SPEC`` runs), each file in a process of its own, as a user's command runs it
   (forked from a worker that imported torch and fusion_advisor and never touched the GPU: a process that has
   profiled once dispatches 1.3-2x slower for the rest of its life, benchmarks/results/h200/host/
   process_state_host.json); a file that runs past ``--timeout-s`` is killed with its worker and a new worker takes
   the rest; new files start only inside ``--budget-s``.
2. The profiled reports are split: every third (in the seeded order) is the test set, the rest the fit set.
   ``fusion-advisor calibrate --from-profile FIT... --test TEST... --out fitted.yaml`` fits the per-op-class eager
   times and prints the accuracy before and after, on both sets.
3. ``DIR/result.json`` (GPU, versions, date, files with their exit status and wall time, the split, the
   calibrate output); ``fitted.yaml`` with its residual CSVs; ``reports.tar.gz`` (every report.json, so the fit
   can be re-run anywhere with ``calibrate --from-profile``).

Usage (GPU): ``python benchmarks/accuracy/fit_kernelbench.py --kernelbench .kb --out DIR``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the worker imports fusion_advisor from this tree, installed or not


def choose(kernelbench: Path, counts: dict[str, int], seed: int, exclude: frozenset[str] = frozenset()
           ) -> list[Path]:
    """``counts[level]`` files of each ``kernelbench/<level>`` (sorted, less the ``level/name.py`` in ``exclude``,
    then ``random.Random(seed).sample``), in the order sampled, levels interleaved so that a budget cut leaves every
    level represented."""
    rng = random.Random(seed)
    per_level = []
    for level, n in counts.items():
        files = [f for f in sorted((kernelbench / level).glob("*.py")) if f"{level}/{f.name}" not in exclude]
        per_level.append(rng.sample(files, min(n, len(files))))
    out = []
    for i in range(max((len(f) for f in per_level), default=0)):
        out.extend(f[i] for f in per_level if i < len(f))
    return out


def run_file(f: Path, work: Path, device: str, gpu: str, baselines: int = 0, skip_profile: bool = False) -> str:
    """Analyse and profile one file into ``work/<level>_<stem>/report.json`` (what ``fusion-advisor analyze FILE
    --device DEVICE --profile --gpu GPU`` writes); with ``baselines`` (rounds), also time the model as written,
    ``torch.compile(model)`` and its reduce-overhead mode (``benchmarks/apply/apply_models.py``'s ``evaluate``, no
    plan) into ``baselines.json`` beside it: the measured best whole-model route that ``route_prediction.py``
    compares the predicted one with (``skip_profile``: that alone). Returns ``"ok"`` or the failure in one line."""
    import torch

    from benchmarks.apply.apply_models import evaluate
    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.report.write import write_report

    try:
        folder = work / f"{f.parent.name}_{f.stem}"
        if not skip_profile:
            write_report(analyze(f, device=device, gpu=gpu, profile=True), folder)
        if baselines:
            folder.mkdir(parents=True, exist_ok=True)
            torch._dynamo.reset()
            (folder / "baselines.json").write_text(json.dumps(evaluate(str(f), "", False, baselines, device)))
        return "ok"
    except BaseException as e:  # noqa: BLE001 - one file's failure is a result; the next file still runs
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def worker(listing: Path, progress: Path, work: Path, device: str, gpu: str, baselines: int = 0,
           skip_profile: bool = False) -> None:
    """:func:`run_file` for each file of ``listing`` (one path per line), each in a child forked from this process,
    appending ``{"file", "status", "wall_s"}`` to ``progress`` (JSON lines) after each. This process imports torch,
    dynamo and fusion_advisor once (a fresh interpreter per file spent ~8 of its ~13 s on them) and never touches
    the GPU, so every child starts CUDA as a fresh process does."""
    import torch._dynamo  # noqa: F401 - imported once here, inherited by every child

    import benchmarks.apply.apply_models  # noqa: F401
    import fusion_advisor.analyze.pipeline  # noqa: F401
    import fusion_advisor.report.write  # noqa: F401

    for line in listing.read_text().splitlines():
        f = Path(line)
        t0 = time.perf_counter()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one file, its status through the pipe
            os.close(read)
            status = run_file(f, work, device, gpu, baselines, skip_profile)
            os.write(write, status.encode())
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read().decode()
        _, code = os.waitpid(pid, 0)
        status = said or f"child exit {os.waitstatus_to_exitcode(code)}"
        with progress.open("a") as fh:
            fh.write(json.dumps({"file": str(f), "status": status, "wall_s": round(time.perf_counter() - t0, 1)})
                     + "\n")


def profile_all(files: list[Path], work: Path, args: argparse.Namespace, start: float) -> list[dict]:
    """Run :func:`worker` over ``files`` in a child process; a file that runs past ``args.timeout_s`` is killed
    with its worker and the worker's children (status ``timeout``) and a new worker takes the rest; no file starts
    after ``args.budget_s``."""
    runs: list[dict] = []
    left = list(files)
    while left:
        if time.perf_counter() - start > args.budget_s:
            runs += [{"file": f"{f.parent.name}/{f.name}", "status": "not run (budget)"} for f in left]
            break
        listing, progress = work / "listing.txt", work / "progress.jsonl"
        listing.write_text("\n".join(str(f) for f in left))
        progress.write_text("")
        child = subprocess.Popen([sys.executable, __file__, "--worker", str(listing), "--progress", str(progress),
                                  "--work", str(work), "--device", args.device, "--gpu", args.gpu,
                                  "--baselines", str(args.baselines), *(["--baselines-only"] if args.baselines_only
                                                                        else []),
                                  "--kernelbench", str(args.kernelbench), "--out", str(args.out)], cwd=ROOT,
                                 start_new_session=True)  # its own process group: a timeout kills the file's child
        seen, last = 0, time.perf_counter()
        while True:
            exited = child.poll() is not None  # before reading: the lines a finished worker wrote are all there
            lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
            for rec in lines[seen:]:
                f = Path(rec["file"])
                name = f"{f.parent.name}_{f.stem}"
                ok = (work / name / ("baselines.json" if args.baselines_only else "report.json")).is_file()
                runs.append({"file": f"{f.parent.name}/{f.name}", "report": name if ok else None,
                             "status": rec["status"], "wall_s": rec["wall_s"]})
                print(f"{name}: {rec['status']}, {rec['wall_s']} s", flush=True)
                left.pop(0)
                last = time.perf_counter()
            seen = len(lines)
            if exited:
                if left and child.returncode != 0:
                    f = left.pop(0)  # the worker died inside this file
                    runs.append({"file": f"{f.parent.name}/{f.name}", "status": f"worker exit {child.returncode}"})
                break
            if time.perf_counter() - last > args.timeout_s or time.perf_counter() - start > args.budget_s + \
                    args.timeout_s:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                f = left.pop(0)
                runs.append({"file": f"{f.parent.name}/{f.name}", "status": f"timeout {args.timeout_s:.0f} s"})
                break
            time.sleep(0.5)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", type=Path, required=True, help="Folder with level1/ level2/ level3/.")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--level1", type=int, default=14)
    ap.add_argument("--level2", type=int, default=14)
    ap.add_argument("--level3", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu", default="h200", help="Device spec the analyses price with (the fit's base).")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to try the pipeline without a GPU.")
    ap.add_argument("--work", type=Path, default=None, help="Where the report folders go (default: a temporary "
                    "folder; only report.json of each is kept, in reports.tar.gz).")
    ap.add_argument("--timeout-s", type=float, default=90)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--exclude", type=Path, nargs="*", default=[], help="result.json files of earlier runs: their "
                    "files are left out before sampling (a fresh set the fit never saw).")
    ap.add_argument("--skip", type=Path, nargs="*", default=[], help="result.json files of earlier runs of this "
                    "set: their files with status ok are not run again (a second call continuing the first).")
    ap.add_argument("--baselines", type=int, default=0, help="Also time eager / torch.compile / reduce-overhead per "
                    "file in this many interleaved rounds (0: not); written as baselines.json (apply_models format).")
    ap.add_argument("--baselines-only", action="store_true", help="Time the baselines, no profile (with "
                    "--baselines; a second pass over files profiled before).")
    ap.add_argument("--no-fit", action="store_true", help="Profile only (fit elsewhere with calibrate --from-profile).")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--progress", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.progress, args.work, args.device, args.gpu, args.baselines, args.baselines_only)
        return 0

    import torch
    import triton

    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="fit_kernelbench_"))
    work.mkdir(parents=True, exist_ok=True)
    counts = {"level1": args.level1, "level2": args.level2, "level3": args.level3}
    exclude = frozenset(r["file"] for p in args.exclude for r in json.loads(p.read_text())["runs"])
    files = choose(args.kernelbench, counts, args.seed, exclude)
    done_before = {r["file"] for p in args.skip for r in json.loads(p.read_text())["runs"] if r["status"] == "ok"}
    files = [f for f in files if f"{f.parent.name}/{f.name}" not in done_before]
    runs = profile_all(files, work, args, start)
    done = [r["report"] for r in runs if r.get("report")]
    test = done[2::3]
    fit = [d for d in done if d not in test]
    cal = {}
    if fit and test and not args.no_fit:
        cmd = [sys.executable, "-m", "fusion_advisor.cli", "calibrate",
               *sum((["--from-profile", str(work / d)] for d in fit), []),
               *sum((["--test", str(work / d)] for d in test), []),
               "--out", str(args.out / "fitted.yaml")]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        cal = {"exit": p.returncode, "output": (p.stdout + p.stderr)[-6000:]}
        print(cal["output"])
    with tarfile.open(args.out / "reports.tar.gz", "w:gz") as tar:
        for d in done:
            if (work / d / "report.json").is_file():
                tar.add(work / d / "report.json", arcname=f"{d}/report.json")
    timed = [d for d in done if (work / d / "baselines.json").is_file()]
    if timed:  # the apply_models results format, for route_prediction.py --results
        level = {d: d.split("_", 1)[0] for d in timed}
        recs = [{"file": f"{level[d]}/{d.split('_', 1)[1]}.py", "name": d.split("_", 1)[1], "level": level[d],
                 "eval": json.loads((work / d / "baselines.json").read_text())} for d in timed]
        (args.out / "baselines.json").write_text(json.dumps(
            {"meta": {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                      "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                      "rounds": args.baselines, "what": "forward under torch.no_grad(), baselines only"},
             "results": recs}, indent=1))
    result = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "torch": torch.__version__, "triton": triton.__version__, "date": datetime.date.today().isoformat(),
              "seed": args.seed, "counts": counts, "excluded": sorted(exclude), "spec": args.gpu, "runs": runs,
              "fit_set": fit, "test_set": test,
              "calibrate": cal, "wall_s": round(time.perf_counter() - start, 1)}
    (args.out / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
