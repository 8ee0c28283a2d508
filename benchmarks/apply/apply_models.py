"""apply on models nobody here wrote, measured independently of apply's own numbers (GPU).

For each model file: ``fusion-advisor apply FILE --verify --device cuda`` runs as a user would run it (a
subprocess, its wall time recorded); then, in a fresh process per file, the model as written, ``torch.compile(model)``,
``torch.compile(model, mode="reduce-overhead")`` and the model ``load_plan`` rebuilds from apply's plan.yaml are
each run once (first-call time apart), checked on fresh inputs (the outputs, and with ``--backward`` every
parameter's gradient) and timed in interleaved
rounds after an untimed one (``triton.testing.do_bench`` median per round, L2 flushed, at least 100 ms and apply's
``MIN_TIMED_CALLS`` calls per round; the median of the rounds is reported with their spread). Forward under
``torch.no_grad()`` (the model in eval mode, as apply loads it), or forward+backward with ``--backward``. A plan
with ``cudnn.benchmark`` runs it in this process's thread, as a user's would: the baselines timed after it may take
the algorithms it found (cuDNN's plan cache is per thread and ignores the flag), which can only make them faster.

The check (:func:`correct`): an fp32/fp64 tensor must be allclose to the model as written at KernelBench's ``atol =
rtol = 1e-2``. An fp16/bf16 tensor is judged as Inductor's own benchmark suites judge a compiled model
(``torch._dynamo.utils.same(eager, variant, fp64_ref, tol=1e-2)``: allclose at 1e-2, else an RMSE from a float64
copy of the model at most 3x eager's + 1e-3). Element-wise 1e-2 alone is 2.5 bf16 ulps: a compiled bf16 Llama
that rounds in another order fails it on logits of magnitude ~10 although it is as close to float64 as eager.

Files: ``--kernelbench DIR`` with ``--level2 N --level3 M --seed S`` draws a fixed, seeded subset of each level
(sorted file names, ``random.Random(seed).sample``); ``--files`` adds any model files. The results name every file.

    python benchmarks/apply/apply_models.py --kernelbench .kb --level2 6 --level3 4 --seed 0 --out $OUT/kb
    python benchmarks/apply/apply_models.py --files tests/data/models/tiny_pointwise.py --out /tmp/smoke  # one file

Writes ``results.json`` (every number, GPU and versions, date) and ``results.md`` (the table) into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KB_ATOL = KB_RTOL = 1e-2
BASELINES = ("eager", "torch.compile", "reduce-overhead")
VARIANTS = (*BASELINES, "plan")


# --- one file, in its own process ---------------------------------------------------------------------------


def evaluate(model_file: str, plan: str, backward: bool, rounds: int, device: str = "cuda") -> dict[str, Any]:
    """Time and check eager / torch.compile / reduce-overhead / the plan's model for one file (this process);
    ``plan`` ``""``: the three baselines only."""
    import torch

    import fusion_advisor
    from fusion_advisor.apply.measure import MIN_TIMED_CALLS, ModelHarness
    from fusion_advisor.analyze.load import load_model

    loaded = load_model(None if model_file == "builtin" else model_file, device=device)
    model = loaded.module
    harness = ModelHarness(loaded, backward=backward, fresh_sets=0)
    fresh = list(loaded.make_inputs(4321)) if loaded.make_inputs else list(loaded.inputs)
    makers = {
        "eager": lambda: model,
        "torch.compile": lambda: torch.compile(model),
        "reduce-overhead": (lambda: torch.compile(model, mode="reduce-overhead")) if device == "cuda" else None,
        "plan": (lambda: fusion_advisor.load_plan(model, plan)) if plan else None,
    }
    out: dict[str, Any] = {"variants": {}}

    def outputs(fn: Any) -> list[torch.Tensor]:
        """The outputs of one call on the fresh inputs (seeded), and with ``backward`` every parameter gradient."""
        return [t for _, t in harness.run(fn, fresh).tensors]

    reference = outputs(model)
    fp64 = fp64_outputs(harness, fresh) if any(r.dtype in (torch.float16, torch.bfloat16)
                                                    for r in reference) else None
    if fp64 is not None and isinstance(fp64, str):
        out["fp64_note"], fp64 = fp64, None
    built: dict[str, Any] = {}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for name, make in makers.items():
        if make is None:  # CUDA graphs: nothing to replay on a CPU; no plan: baselines only
            if name != "plan":
                out["variants"][name] = {"skipped": "CUDA graphs need a CUDA device"}
            continue
        rec: dict[str, Any] = {}
        out["variants"][name] = rec
        try:
            fn = make()
            sync()
            start = time.perf_counter()
            harness.step(fn)()
            sync()
            rec["first_call_s"] = time.perf_counter() - start
            got = outputs(fn)
            rec["correct_at_1e-2"] = len(got) == len(reference) and all(
                correct(g, r, fp64[i] if fp64 else None) for i, (g, r) in enumerate(zip(got, reference)))
            rec["max_abs_diff"] = max((float((g.float() - r.float()).abs().max()) for g, r in zip(got, reference)
                                       if g.shape == r.shape and g.numel()), default=0.0)
            built[name] = fn
            if name == "plan":
                rec["plan_variant"] = fn.spec.name
                rec["plan_problems"] = fn.problems()
        except Exception as e:  # a variant that fails is reported, the others still run
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    rep_ms: dict[str, float] = {}
    for name, fn in built.items():  # an untimed round: warm-up, and the estimate that sizes the timed rounds
        out["variants"][name]["rounds_ms"] = []
        try:
            rep_ms[name] = max(100.0, MIN_TIMED_CALLS * harness.time_round(fn, warmup_ms=25, rep_ms=100))
        except Exception as e:
            rep_ms[name] = 100.0
            out["variants"][name]["error"] = f"timing: {type(e).__name__}: {str(e).splitlines()[0]}"[:300]
    for _ in range(rounds):  # interleaved: each round times every variant once
        for name, fn in built.items():
            try:
                out["variants"][name]["rounds_ms"].append(harness.time_round(fn, warmup_ms=25, rep_ms=rep_ms[name]))
            except Exception as e:
                out["variants"][name]["error"] = f"timing: {type(e).__name__}: {str(e).splitlines()[0]}"[:300]
    for rec in out["variants"].values():
        r = rec.get("rounds_ms") or []
        if r:
            rec["ms"] = statistics.median(r)
            rec["spread"] = (max(r) - min(r)) / rec["ms"]
    return out


def fp64_outputs(harness: Any, xs: list[Any]) -> list[Any] | str:
    """The tensors of :meth:`ModelHarness.run` (outputs, then gradients) from the float64 copy of the model on
    float64 copies of ``xs``, as apply's own check builds it (float64 throughout, else as written where the model's
    casts need it), or the line saying why there are none."""
    harness.sets = [("fresh", list(xs))]
    ref = harness.reference()
    if ref is None:
        return harness.reference_note or "no float64 reference"
    return [t for _, t in ref["fresh"].tensors]


def correct(got: Any, ref: Any, ref64: Any = None) -> bool:
    """Whether one tensor of a variant passes (the module docstring): ``ref`` from the model as written, ``ref64``
    from its float64 copy (used for fp16/bf16 tensors only; without it they are held to allclose at 1e-2)."""
    import torch
    from torch._dynamo.utils import same

    if got.shape != ref.shape:
        return False
    if ref.dtype in (torch.float16, torch.bfloat16) and ref64 is not None and got.dtype == ref.dtype:
        return bool(same(ref, got, fp64_ref=ref64, tol=KB_RTOL, log_error=lambda *a, **k: None))
    return bool(torch.allclose(got.float(), ref.float(), atol=KB_ATOL, rtol=KB_RTOL))


# --- the driver -------------------------------------------------------------------------------------------------


def select(kb: Path, level2: int, level3: int, seed: int) -> list[Path]:
    """The seeded subset: ``level2`` files of level 2 and ``level3`` of level 3, sampled from sorted names."""
    files: list[Path] = []
    for level, n in (("level2", level2), ("level3", level3)):
        pool = sorted((kb / level).glob("*.py"))
        files += sorted(random.Random(seed).sample(pool, min(n, len(pool))))
    return files


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def run_file(path: str, out_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    name = "builtin" if path == "builtin" else Path(path).stem
    rec: dict[str, Any] = {"file": path, "name": name, "level": Path(path).parent.name if path != "builtin" else ""}
    apply_dir = out_dir / name
    cmd = [sys.executable, "-m", "fusion_advisor.cli", "apply"] + ([] if path == "builtin" else [path]) + [
        "--verify", "--device", args.device, "--out", str(apply_dir), "--budget-s", str(args.budget_s),
        "--time-rounds", str(args.time_rounds)] + (["--backward"] if args.backward else [])
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.apply_timeout)
        rec["apply_exit"] = p.returncode
        rec["apply_tail"] = (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rec["apply_exit"] = "timeout"
    rec["apply_s"] = time.perf_counter() - start
    plan = apply_dir / "plan.yaml"
    if not plan.is_file():
        rec["error"] = "apply wrote no plan"
        return rec
    import yaml

    doc = yaml.safe_load(plan.read_text())
    rec["apply_chosen"] = (doc.get("chosen") or {}).get("name")
    rec["apply_summary"] = doc.get("summary")
    rec["apply_variants"] = [{"name": v["name"], "status": v["status"],
                              "ms": (v.get("timing") or {}).get("ms"),
                              "first_call_s": (v.get("timing") or {}).get("first_call_s"),
                              "reason": v["reason"][:200]} for v in doc.get("variants", [])]
    rec["apply_stage_s"] = doc.get("timings_s")
    ev_json = apply_dir / "eval.json"
    ev_cmd = [sys.executable, __file__, "--evaluate", path, "--plan", str(plan), "--json", str(ev_json),
              "--rounds", str(args.rounds), "--device", args.device] + (["--backward"] if args.backward else [])
    try:
        p = subprocess.run(ev_cmd, capture_output=True, text=True, timeout=args.eval_timeout)
        if p.returncode != 0:
            rec["eval_error"] = (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rec["eval_error"] = "timeout"
    if ev_json.is_file():
        rec["eval"] = json.loads(ev_json.read_text())
    return rec


def _best_baseline(variants: dict[str, Any]) -> dict[str, Any] | None:
    """The fastest correct baseline's record of one file's evaluation, or ``None``."""
    correct = [variants[n] for n in BASELINES if variants.get(n, {}).get("ms") and variants[n].get("correct_at_1e-2")]
    return min(correct, key=lambda x: x["ms"]) if correct else None


def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per level: geomeans over files of each variant's speed-up over eager, and of the plan over the best correct
    baseline; wrong plans; plans slower than that baseline by more than 3%, apart where the difference is within the
    spread of the two variants' rounds (listed as within noise)."""
    out: dict[str, Any] = {}
    levels = sorted({r["level"] for r in recs})
    for level in levels + ["all"]:
        rows = [r for r in recs if (level == "all" or r["level"] == level) and "eval" in r]
        vs_eager: dict[str, list[float]] = {v: [] for v in VARIANTS}
        vs_best, wrong, slower, within_noise = [], 0, [], []
        for r in rows:
            v = r["eval"]["variants"]
            eager = v.get("eager", {}).get("ms")
            for name in VARIANTS:
                ms = v.get(name, {}).get("ms")
                if eager and ms and v[name].get("correct_at_1e-2"):
                    vs_eager[name].append(eager / ms)
            best = _best_baseline(v)
            plan = v.get("plan", {})
            if plan.get("correct_at_1e-2") is False:
                wrong += 1
            if best and plan.get("ms"):
                ratio = best["ms"] / plan["ms"]
                vs_best.append(ratio)
                noise = max(plan.get("spread", 0.0), best.get("spread", 0.0))
                if ratio < 1 / 1.03:
                    (slower if 1 / ratio - 1 > noise else within_noise).append(r["name"])
        out[level] = {"files": len(rows), "wrong_plans": wrong, "slower_than_best_baseline_by_3pct": slower,
                      "slower_by_3pct_within_the_rounds_spread": within_noise,
                      "plan_vs_best_baseline_geomean": _geomean(vs_best),
                      **{f"{n}_vs_eager_geomean": _geomean(x) for n, x in vs_eager.items()}}
    return out


def markdown(recs: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [f"# apply on models nobody here wrote ({meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, "
             f"{meta['date']})", "",
             f"{meta['what']}; times are medians of {meta['rounds']} interleaved do_bench rounds (ms), measured in "
             f"a fresh process per file, after apply (`--budget-s {meta['budget_s']}`) wrote its plan; correct "
             f"(on fresh inputs{' (outputs and every parameter gradient)' if 'backward' in meta['what'] else ''}): fp32 "
             f"allclose to the model as written at atol = rtol = 1e-2 (KernelBench's check), fp16/bf16 by Inductor's "
             f"accuracy check (`torch._dynamo.utils.same`, float64 reference, tol 1e-2).", "",
             "| file | eager | torch.compile | reduce-overhead | plan (variant) | plan vs best baseline | apply s |",
             "|---|---|---|---|---|---|---|"]
    for r in recs:
        v = (r.get("eval") or {}).get("variants", {})

        def cell(n: str) -> str:
            x = v.get(n, {})
            if "skipped" in x:
                return "n/a"
            if "ms" not in x:
                return f"error: {x.get('error', r.get('eval_error', r.get('error', '?')))[:60]}"
            flag = "" if x.get("correct_at_1e-2") else " WRONG"
            return f"{x['ms']:.4g}{flag}"

        best = _best_baseline(v)
        plan = v.get("plan", {})
        ratio = f"{best['ms'] / plan['ms']:.3f}x" if best and plan.get("ms") else "-"
        lines.append(f"| {r['name']} | {cell('eager')} | {cell('torch.compile')} | {cell('reduce-overhead')} | "
                     f"{cell('plan')} ({plan.get('plan_variant', r.get('apply_chosen', '-'))}) | {ratio} | "
                     f"{r.get('apply_s', 0):.0f} |")
    lines += ["", "| set | files | plan vs best baseline (geomean) | eager | torch.compile | reduce-overhead | plan | "
              "wrong plans | slower than best by >3% |", "|---|---|---|---|---|---|---|---|---|"]
    for level, s in summary.items():
        def g(k: str) -> str:
            return f"{s[k]:.3f}x" if s.get(k) else "-"

        lines.append(f"| {level} | {s['files']} | {g('plan_vs_best_baseline_geomean')} | {g('eager_vs_eager_geomean')} "
                     f"| {g('torch.compile_vs_eager_geomean')} | {g('reduce-overhead_vs_eager_geomean')} | "
                     f"{g('plan_vs_eager_geomean')} | {s['wrong_plans']} | "
                     f"{', '.join(s['slower_than_best_baseline_by_3pct']) or 'none'}"
                     + (f" (within the rounds' spread: {', '.join(s['slower_by_3pct_within_the_rounds_spread'])})"
                        if s.get('slower_by_3pct_within_the_rounds_spread') else "") + " |")
    return "\n".join(lines) + "\n"


def _meta(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import triton

    return {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "rounds": args.rounds,
            "budget_s": args.budget_s, "seed": args.seed,
            "what": "forward+backward" if args.backward else "forward under torch.no_grad()"}


def write_results(out: Path, meta: dict[str, Any], files: list[str], recs: list[dict[str, Any]],
                  **extra: Any) -> None:
    """``results.json`` (meta, files, summary, records and ``extra``) and ``results.md`` into ``out``."""
    summary = summarize(recs)
    (out / "results.json").write_text(json.dumps({"meta": meta, "files": files, "summary": summary, "results": recs,
                                                  **extra}, indent=1, default=str))
    (out / "results.md").write_text(markdown(recs, summary, meta))


def _budgets(metas: Any) -> set[str]:
    """The ``--budget-s`` values of runs' metas, as text; a combined run's (``"120 / 45"``) counts each of its own."""
    out: set[str] = set()
    for m in metas:
        b = m["budget_s"]
        out |= set(b.split(" / ")) if isinstance(b, str) else {f"{b:g}"}
    return out


def combine(sources: list[str], out: Path) -> None:
    """Merge the ``results.json`` of several runs into one (``--combine LABEL=PATH ...``): for each model file the
    record of the last source that ran it, tagged with its source's label as ``device_call`` (a record that already
    carries one keeps it); the records it replaces, and those its sources had replaced, are kept under
    ``superseded``. Writes ``results.json`` and ``results.md`` into ``out``.

    Raises:
        SystemExit: a source that is not ``LABEL=PATH`` of an existing file.
    """
    by_file: dict[str, dict[str, Any]] = {}
    superseded: list[dict[str, Any]] = []
    metas: dict[str, Any] = {}
    for source in sources:
        label, sep, path = source.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"--combine takes LABEL=PATH of an existing results.json, not {source!r}")
        doc = json.loads(Path(path).read_text())
        metas[label] = doc["meta"]
        superseded += doc.get("superseded", [])
        for rec in doc["results"]:
            rec = {**rec, "device_call": rec.get("device_call", label)}
            if rec["file"] in by_file:
                superseded.append(by_file[rec["file"]])
            by_file[rec["file"]] = rec
    recs = sorted(by_file.values(), key=lambda r: (r["level"], r["name"]))
    meta = {**metas[next(reversed(metas))], "combined_from": metas,
            "budget_s": " / ".join(sorted(_budgets(metas.values())))}
    out.mkdir(parents=True, exist_ok=True)
    write_results(out, meta, [r["file"] for r in recs], recs, superseded=superseded)
    print((out / "results.md").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernelbench", type=Path, help="KernelBench folder with level2/ and level3/")
    ap.add_argument("--level2", type=int, default=0)
    ap.add_argument("--level3", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--files", nargs="*", default=[], help="more model files ('builtin': the default model)")
    ap.add_argument("--slice", default="", help="run files[a:b] of the seeded subset, e.g. 0:3,8:10 (split a subset across calls)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=45.0)
    ap.add_argument("--time-rounds", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved timing rounds per variant (the median is reported)")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test this script")
    ap.add_argument("--deadline-s", type=float, default=0.0, help="start no new file after this many seconds")
    ap.add_argument("--apply-timeout", type=float, default=400.0)
    ap.add_argument("--eval-timeout", type=float, default=300.0)
    ap.add_argument("--combine", nargs="+", metavar="LABEL=PATH",
                    help="merge runs' results.json (the last run of a file wins) into --out; runs nothing")
    ap.add_argument("--evaluate", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.combine:
        combine(args.combine, args.out)
        return
    if args.evaluate:
        result = evaluate(args.evaluate, args.plan, args.backward, args.rounds, args.device)
        args.json.write_text(json.dumps(result, indent=1))
        return
    files = [str(f) for f in select(args.kernelbench, args.level2, args.level3, args.seed)] if args.kernelbench else []
    if args.slice:  # "a:b" or several, comma-separated
        picked = []
        for part in args.slice.split(","):
            a, _, b = part.partition(":")
            picked += files[int(a or 0):int(b) if b else None]
        files = picked
    files += list(args.files)
    args.out.mkdir(parents=True, exist_ok=True)
    recs = []
    t0 = time.perf_counter()
    for i, f in enumerate(files):
        if args.deadline_s and time.perf_counter() - t0 > args.deadline_s:
            print(f"deadline of {args.deadline_s:g} s reached: {len(files) - i} file(s) not run: {files[i:]}")
            break
        print(f"[{i + 1}/{len(files)}] {f}", flush=True)
        recs.append(run_file(f, args.out, args))
        r = recs[-1]
        v = (r.get("eval") or {}).get("variants", {})
        print("   apply %.0f s, chosen %s; " % (r.get("apply_s", 0), r.get("apply_chosen"))
              + ", ".join(f"{n} {v[n].get('ms', float('nan')):.4g}" for n in VARIANTS if n in v), flush=True)
        write_results(args.out, _meta(args), files, recs)
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
