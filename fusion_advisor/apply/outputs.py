"""apply's outputs: plan.yaml (every decision), variants.csv, swaps.csv, and the folder's report.html, written
atomically.

One report per model folder: report.html shows the analysis and apply's results together
(:func:`fusion_advisor.report.write.render_html` with the plan document). The analysis is the folder's own report.json
when an earlier ``analyze`` wrote one for the same model, chains and device spec (so its profile and Inductor code
stay in the report); otherwise apply's analysis, written as report.json, chains.csv and ops.csv too.

Everything is rendered in memory first; each file is then written atomically
(:func:`fusion_advisor.report.write.atomic_write_bytes`) with Ctrl-C held back until all are in place, so an interrupt
leaves either the previous files or the new ones, never a half-written set.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Iterator, Sequence

from fusion_advisor.apply.plan import PLAN_VERSION, model_signature, now_iso, render_plan
from fusion_advisor.apply.records import NOISY_SPREAD, ApplyResult, NearMiss, SwapOutcome, SwapSite
from fusion_advisor.files import csv_text, same_model_file
from fusion_advisor.host import BUSY_CPU_MARK

#: variants.csv columns and what each holds.
VARIANT_COLUMNS: dict[str, str] = {
    "variant": "Variant name (baselines: eager, torch.compile, torch.compile reduce-overhead).",
    "status": "chosen / correct (checked and timed) / wrong (failed the float64 check) / failed (raised) / "
              "skipped (budget) / not timed.",
    "ms": "Steady-state time of one step (forward, or forward+backward), ms: median of the timing rounds.",
    "spread": "(max - min) / median of the rounds, a fraction (0.02 = 2%): the measurement's noise. Rounds "
              f"that spread over {NOISY_SPREAD:.0%} were timed once more and the quieter set kept (the faster where "
              f"the two sets' medians differ by more than that): then the larger "
              "of its spread and the two sets' medians' disagreement ((high - low) / low).",
    "vs_eager": "Speed-up over the model as written, same run.",
    "vs_compile": "Speed-up over torch.compile(model), same run.",
    "first_call_s": ("First step, s: compilation and CUDA-graph capture included, in apply's process: the first "
                     "compiled variant pays Inductor's start-up, later ones find its caches warm (a fresh process "
                     "compiles slower)."),
    "peak_mb": "Peak allocated GPU memory over three steps, MiB.",
    "peak_reserved_mb": "Peak reserved GPU memory over the same steps, MiB: holds CUDA graphs' private pools, which "
                        "peak_mb does not count once captured, and the caching allocator's slack.",
    "device_ms": "Summed GPU kernel time of one step, ms (torch.profiler).",
    "error_vs_fp64": "Worst tensor's norm-wise relative error against the float64 reference.",
    "eager_error_vs_fp64": "The model as written's norm-wise relative error on that tensor (the scale the policy "
                           "judges error_vs_fp64 against).",
    "how": "What the variant runs (the torch.compile call where it is stock code).",
    "reason": "Why it is a candidate, and what happened.",
    "timer": "How it was timed.",
}


def variant_rows(result: ApplyResult) -> list[dict[str, Any]]:
    """One row per variant, keys :data:`VARIANT_COLUMNS`."""
    eager = result.variant("eager")
    comp = result.variant("torch.compile")
    rows = []
    for v in result.variants:
        t, c = v.timing, v.check
        ms = t.ms if t is not None else None
        rows.append({
            "variant": v.spec.name, "status": v.status, "ms": _num(ms),
            "spread": _num(t.spread) if t is not None else "",
            "vs_eager": _num(eager.ms / ms) if ms and eager is not None and eager.ms and eager.correct else "",
            "vs_compile": _num(comp.ms / ms) if ms and comp is not None and comp.ms and comp.correct else "",
            "first_call_s": _num(t.first_call_s) if t is not None else "",
            "peak_mb": _num(t.peak_mb) if t is not None else "",
            "peak_reserved_mb": _num(t.peak_reserved_mb) if t is not None else "",
            "device_ms": _num(t.device_ms) if t is not None else "",
            "error_vs_fp64": _num(c.norm_err) if c is not None and c.norm_err is not None else "",
            "eager_error_vs_fp64": _num(c.eager_norm_err) if c is not None and c.eager_norm_err is not None else "",
            "how": v.spec.describe(),
            "reason": "; ".join([x for x in (v.spec.why, v.reason) if x] + v.problems[:3]),
            "timer": t.timer if t is not None else "",
        })
    return rows


#: swaps.csv columns and what each holds.
SWAP_COLUMNS: dict[str, str] = {
    "swap": "Swap id 's<index>' (in the order matches were found).",
    "chain": "Analysis chain(s) holding the matched ops (';'-separated, most ops first): the chain ids of "
             "`fusion-advisor analyze` on the same model (chains.csv).",
    "kernel": "Library kernel whose pattern matched.",
    "verified": "True/False after verification; empty when not verified (not a candidate, or no --verify).",
    "max_abs_err": "Largest forward |kernel - float64 reference| over the verification cases.",
    "max_rel_err": ("Largest forward |kernel - reference| / |reference| over the finite nonzero reference "
                    "elements of the verification cases: a diagnostic; the verdict ('verified') is norm-wise, "
                    "against the float64 reference and eager's own error (fusion_advisor/verification/policy.py)."),
    "grad_max_abs_err": "Largest input-gradient |kernel - float64 reference| (empty without backward).",
    "eager_ms": "Original ops, eager, ms (median); empty when not measured.",
    "compile_ms": "Original ops under torch.compile, ms (median, compile time apart); empty when not measured.",
    "kernel_ms": "The kernel, ms (median); empty when not measured.",
    "eager_gpu_ms": "Original ops, eager: device time, summed GPU kernel time of one call, ms (torch.profiler).",
    "compile_gpu_ms": "Original ops under torch.compile: device time of one call, ms.",
    "kernel_gpu_ms": "The kernel: device time of one call, ms. Decides when measured (see 'reason').",
    "compile_time_ms": "torch.compile's first call on the original ops (compilation), ms.",
    "timer": "How times were taken ('do_bench median (cuda)' or 'not measured').",
    "decision": "kept / kept for an eager rest (beat eager alone, not torch.compile) / rejected / not kept / "
                "not tried / not verified.",
    "reason": "Why, with the numbers.",
    "route": ("The analysis route of the chain (skip / torch.compile / triton / cudagraphs, with the kernel after "
              "a '/' for triton) and, in parentheses, the rule that decided."),
    "source": "file:line where the swap's chain starts (the source column of chains.csv).",
    "module_path": "nn.Module that issued it.",
    "signature": "Kernel with input shapes/dtypes and captured constants.",
    "ops": "Matched op ids (apply's capture), ';'-separated.",
}


def swaps_rows(sites: Sequence[Any], outcomes: dict[str, SwapOutcome]) -> list[dict[str, Any]]:
    """One row per swap site, keys :data:`SWAP_COLUMNS`."""
    rows = []
    for s in sites:
        o = outcomes.get(s.id)
        v = o.verification if o else None
        t = o.timing if o else None
        rows.append({
            "swap": s.id,
            "chain": ";".join(s.chain_ids),
            "kernel": s.kernel,
            "verified": "" if v is None else bool(v.verified),
            "max_abs_err": _num(v.max_abs_err if v else None),
            "max_rel_err": _num(v.max_rel_err if v else None),
            "grad_max_abs_err": _num(v.grad_max_abs_err if v else None),
            "eager_ms": _num(t.eager_ms if t else None),
            "compile_ms": _num(t.compile_ms if t else None),
            "kernel_ms": _num(t.kernel_ms if t else None),
            "eager_gpu_ms": _num(t.eager_gpu_ms if t else None),
            "compile_gpu_ms": _num(t.compile_gpu_ms if t else None),
            "kernel_gpu_ms": _num(t.kernel_gpu_ms if t else None),
            "compile_time_ms": _num(t.compile_time_ms if t else None),
            "timer": t.timer if t else "",
            "decision": o.decision if o else "",
            "reason": o.reason if o else "",
            "route": f"{s.route}{' (' + s.route_rule + ')' if s.route_rule else ''}",
            "source": f"{s.source.file}:{s.source.line}" if s.source.file else "",
            "module_path": s.module_path,
            "signature": s.signature,
            "ops": ";".join(s.op_ids),
        })
    return rows


def _num(x: float | None) -> float | str:
    return "" if x is None or not math.isfinite(x) else float(x)


def speedup_line(result: ApplyResult) -> str:
    """The chosen variant's speed-ups as a headline quotes them: ``"1.70x vs eager, 1.02x vs torch.compile"``; the
    confirmation's figure first where one ran and won; a ratio resting on noisy rounds
    (:attr:`ApplyResult.noisy_speedups`) says so beside it, and every ratio is marked :data:`BUSY_CPU_MARK` when
    other processes held the CPU as the timing began (:attr:`ApplyResult.busy_cpu`: on a shared 2-core machine a
    fresh user's eager step read 7.55 ms for 0.025 ms idle, with 0.9% spread, and the plan "205x vs eager").
    ``""`` without a timed choice."""
    noisy = result.noisy_speedups
    gains = ", ".join(f"{x:.2f}x vs {k}" + (f" (noisy: rounds spread {noisy[k]:.0%})" if k in noisy else "")
                      for k, x in result.speedups.items())
    if result.confirmed and gains:  # the confirmation's interleaved rounds are the figure to quote
        gains = f"confirmed {result.confirmed[1]:.2f}x vs {result.confirmed[0]}; in the search {gains}"
    return f"{gains} ({BUSY_CPU_MARK})" if gains and result.busy_cpu else gains


def plan_document(result: ApplyResult) -> dict[str, Any]:
    """The plan.yaml document: every decision of ``result`` (see :mod:`fusion_advisor.apply.plan`)."""
    import fusion_advisor
    from fusion_advisor.report.write import jsonable
    from kernel_library.registry import KERNELS

    def swap_doc(s: SwapSite) -> dict[str, Any]:
        o = result.outcomes[s.id]
        v, t = o.verification, o.timing
        entry = KERNELS.get(s.kernel)
        return {
            "id": s.id, "kernel": s.kernel, "kernel_module": getattr(entry, "module", ""),
            "op": getattr(entry, "op", ""), "pattern": s.pattern, "key": s.key.to_dict(), "signature": s.signature,
            "graph": s.graph_index, "chains": list(s.chain_ids), "ops": list(s.op_ids),
            "source": f"{s.source.file}:{s.source.line}" if s.source.file else "", "code": s.source.code,
            "module_path": s.module_path,
            "inputs": [{"name": n, "shape": list(m.shape), "dtype": m.dtype} for n, m in s.inputs],
            "scalars": dict(s.scalars),
            "route": {"route": s.route, "kernel": s.route_kernel, "rule": s.route_rule},
            "candidate": s.candidate,
            "verified": None if v is None else bool(v.verified),
            "verification": None if v is None else {
                "cases": v.cases, "reference": v.reference, "max_abs_err": v.max_abs_err, "max_rel_err": v.max_rel_err,
                "backward_checked": v.backward_checked, "grad_max_abs_err": v.grad_max_abs_err,
                "grad_max_rel_err": v.grad_max_rel_err, "failure": v.reason or None},
            "timing": None if t is None else {
                "timer": t.timer, "what": t.what, "eager_ms": t.eager_ms, "compile_ms": t.compile_ms,
                "kernel_ms": t.kernel_ms, "compile_time_ms": t.compile_time_ms, "eager_gpu_ms": t.eager_gpu_ms,
                "compile_gpu_ms": t.compile_gpu_ms, "kernel_gpu_ms": t.kernel_gpu_ms, "note": t.note or None,
                "steady_state_recompiles": t.steady_state_recompiles},
            "decision": o.decision, "reason": o.reason, "kept": o.kept,
        }

    def near_doc(n: NearMiss) -> dict[str, Any]:
        return {"kernel": n.kernel, "pattern": n.pattern, "kind": n.kind, "reason": n.reason, "graph": n.graph_index,
                "chains": list(n.chain_ids), "ops": list(n.op_ids),
                "source": f"{n.source.file}:{n.source.line}" if n.source.file else "", "module_path": n.module_path}

    chosen = result.chosen
    speedups = result.speedups
    doc = {
        "fusion_advisor_plan": PLAN_VERSION,
        "tool_version": fusion_advisor.__version__,
        "created_at": now_iso(),
        "model": {"name": result.model_name, "file": result.model_file, "convention": result.convention,
                  "device": result.device, "dtype": result.dtype,
                  **({"signature": model_signature(result.loaded.model)} if result.loaded is not None else {}),
                  **({"source_sha256": result.source_sha256} if result.source_sha256 else {})},
        "options": {**result.options.to_dict(), "backward": result.backward},
        "flags": result.options.flags(),
        "versions": dict(result.versions),
        "device_spec": result.analysis.device_spec.get("name", ""),
        "rules_files": result.analysis.rules_files,
        "summary": {
            "matches": len(result.sites), "candidates": sum(s.candidate for s in result.sites),
            "verified": sum(1 for o in result.outcomes.values() if o.verification and o.verification.verified),
            "swaps_in_plan": len(chosen.spec.swaps) if chosen is not None else 0,
            "near_misses": len(result.near_misses), "regions": len(result.regions),
            "variants_tried": sum(1 for v in result.variants if v.status != "skipped"),
            "chosen": chosen.spec.name if chosen is not None else None,
            "best_baseline": result.baseline or None,
            "what": "forward+backward" if result.backward else "forward",
            "chosen_ms": chosen.ms if chosen is not None else None,
            **{f"speedup_vs_{k.replace(' ', '_').replace('.', '_')}": v for k, v in speedups.items()},
            **({"confirmed_against": result.confirmed[0], "confirmed_speedup": result.confirmed[1]}
               if result.confirmed else {}),
            # baseline -> the larger rounds' spread behind its speed-up, where over NOISY_SPREAD: not to be quoted
            **({"noisy_speedups": result.noisy_speedups} if result.noisy_speedups else {}),
            # other processes held the CPU's cores as the timing began: no measured ratio is to be quoted
            **({"busy_cpu": True} if result.busy_cpu else {}),
            **({"confirmation_spread": result.confirmation_spread} if result.confirmation_spread is not None else {}),
        },
        "chosen": None if chosen is None else {
            "name": chosen.spec.name, "spec": chosen.spec.to_dict(), "reason": result.chosen_reason,
            "ms": chosen.ms, "spread": chosen.timing.spread if chosen.timing else None},
        "chosen_reason": result.chosen_reason,
        "variants": [v.to_dict() for v in result.variants],
        "regions": [{"key": str(r.key), "depth": r.depth, "ops": r.n_ops, "chains": list(r.chain_ids),
                     "routes": dict(r.routes), "routed_executor": r.routed_executor,
                     "predicted_fusion_gain_us": r.compile_gain_us, "predicted_launch_us": r.launch_us,
                     "source": f"{r.source.file}:{r.source.line}" if r.source.file else ""}
                    for r in result.regions],
        "library_problems": dict(result.library_problems),
        "swaps": [swap_doc(s) for s in result.sites],
        "near_misses": [near_doc(n) for n in result.near_misses],
        "graph_breaks": [{"reason": b.reason, "source": str(b.source), "graph": b.graph_index}
                         for b in result.graph_breaks],
        "warnings": list(result.warnings),
        "timings_s": dict(result.timings_s),
        "columns": {"variants.csv": dict(VARIANT_COLUMNS), "swaps.csv": dict(SWAP_COLUMNS)},  # the report's glossary
    }
    return _plain(jsonable(doc))


def _plain(obj: Any) -> Any:
    """Subclasses of str/int/float (``torch.__version__`` is a ``TorchVersion``) as the plain types YAML writes."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None:
        return obj
    for t in (str, int, float):
        if isinstance(obj, t) and type(obj) is not t:
            return t(obj)
    return obj


#: Files :func:`write_outputs` always writes, by key (it also writes report.json, chains.csv and ops.csv when the
#: folder has no analysis of this model yet: :data:`fusion_advisor.report.write.FILE_NAMES`).
OUTPUT_FILES = {"swaps_csv": "swaps.csv", "variants_csv": "variants.csv", "plan": "plan.yaml", "html": "report.html"}


def every_output_name() -> tuple[str, ...]:
    """Every file name apply may write (the guard checks them all before a run)."""
    from fusion_advisor.report.write import FILE_NAMES

    return tuple(dict.fromkeys([*OUTPUT_FILES.values(), *FILE_NAMES.values()]))


def same_analysis(old: Any, new: Any) -> bool:
    """Whether the analysis ``old`` (the folder's report.json) describes what apply analysed as ``new``: the same
    model file, dtype and device spec, and the same chains (ids, kinds, patterns), so its chain ids are the ones
    apply's swaps name."""
    def where(f: str) -> str:  # "model.py" and "/home/u/model.py" are one file; "<builtin:...>" is a name
        return f if f.startswith("<") else str(Path(f).resolve())

    if where(old.model_file) != where(new.model_file) or old.dtype != new.dtype:
        return False
    if (old.device_spec or {}).get("name") != (new.device_spec or {}).get("name"):
        return False
    return [(c.id, c.kind, c.pattern) for c in old.chains] == [(c.id, c.kind, c.pattern) for c in new.chains]


def _report_analysis(result: ApplyResult, out_dir: Path) -> tuple[Any, tuple[str, ...], str]:
    """The analysis report.html shows, the report files (keys of ``report.FILE_NAMES``) to write, and a note."""
    from fusion_advisor.errors import UserError
    from fusion_advisor.report.write import earlier_report, load_report

    if earlier_report(out_dir):
        try:
            old = load_report(out_dir)
        except UserError:
            old = None
        if old is not None and same_analysis(old, result.analysis):
            return old, ("html",), ""
        note = ("apply replaced the analysis in this folder with its own (the earlier report.json described another "
                "model, device spec or set of chains)")
        return result.analysis, ("html", "json", "chains_csv", "ops_csv"), note
    return result.analysis, ("html", "json", "chains_csv", "ops_csv"), ""


def _replaced_plan(result: ApplyResult, out_dir: Path) -> str:
    """A warning when ``out_dir`` holds a plan.yaml apply made for another model file (this run replaces it), else
    ``""`` (a fresh user's apply of one model into another's folder replaced its plan without a word)."""
    from fusion_advisor.report.views import read_plan_document

    old, _ = read_plan_document(out_dir / OUTPUT_FILES["plan"])
    model = (old or {}).get("model")
    before = str(model.get("file", "")) if isinstance(model, dict) else ""
    if not before or same_model_file(before, result.model_file):
        return ""
    return (f"{out_dir / OUTPUT_FILES['plan']} held the plan of {before}: replaced with this run's of "
            f"{result.model_file}")


def write_outputs(result: ApplyResult, out_dir: str | Path) -> dict[str, Path]:
    """Write swaps.csv, variants.csv, plan.yaml and report.html into ``out_dir`` (and report.json, chains.csv,
    ops.csv when the folder holds no analysis of this model: see the module docstring).

    Returns:
        key -> path of every file written (``swaps_csv``, ``variants_csv``, ``plan``, ``html``, and ``json``,
        ``chains_csv``, ``ops_csv`` when written).

    Raises:
        UserError: ``out_dir`` is a file, one of the files would overwrite the model file, or a file cannot be
            written there.
    """
    from fusion_advisor.errors import UserError
    from fusion_advisor.report.write import FILE_NAMES, atomic_write_bytes, render_files

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: exists and is not a directory")
    analysis, report_keys, note = _report_analysis(result, out_dir)
    replaced = [n for n in (_replaced_plan(result, out_dir), note) if n and n not in result.warnings]
    result.warnings += replaced  # before plan.yaml is written: the plan says what it replaced
    rows = swaps_rows(result.sites, result.outcomes)
    vrows = variant_rows(result)
    doc = plan_document(result)
    try:
        report_files = render_files(analysis, out_dir, plan=doc, plan_note=note, keys=report_keys)
    except Exception as e:  # noqa: BLE001 - a report that fails to render must not cost the run its plan
        report_keys, report_files = (), {}
        result.warnings.append(f"report.html could not be rendered ({type(e).__name__}: {e}); plan.yaml, "
                               "variants.csv and swaps.csv were written")
    contents = {
        "swaps_csv": csv_text(rows, SWAP_COLUMNS).encode("utf-8"),
        "variants_csv": csv_text(vrows, VARIANT_COLUMNS).encode("utf-8"),
        "plan": render_plan(doc).encode("utf-8"),
        **report_files,
    }
    names = {**{k: v for k, v in OUTPUT_FILES.items()}, **{k: FILE_NAMES[k] for k in report_keys}}
    model_file = Path(result.model_file).resolve() if not result.model_file.startswith("<") else None
    paths = {k: out_dir / name for k, name in names.items()}
    if model_file is not None and any(p.resolve() == model_file for p in paths.values()):
        raise UserError(f"--out {out_dir}: would overwrite the model file {model_file}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with _sigint_deferred():
            # report.html last (it links the others); none when it could not be rendered
            for key in ("swaps_csv", "variants_csv", "plan", *[k for k in report_keys if k != "html"],
                        *[k for k in report_keys if k == "html"]):
                atomic_write_bytes(paths[key], contents[key])
    except OSError as e:  # a refusal the up-front check could not foretell (a full disk, a folder gone since)
        raise UserError(f"--out {out_dir}: cannot write apply's files there: {e.strerror or e}") from e
    return {k: p for k, p in paths.items() if k in contents}


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) until the block ends, then raise KeyboardInterrupt if one came."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda *a: received.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt

