"""apply's outputs: plan.yaml (every decision), variants.csv, swaps.csv and swaps.html, written atomically.

Everything is rendered in memory first; each file is then written atomically
(:func:`fusion_advisor.report.atomic_write_bytes`) with Ctrl-C held back until all are in place, so an interrupt
leaves either the previous files or the new ones, never a half-written set.
"""

from __future__ import annotations

import contextlib
import html
import io
import math
from pathlib import Path
from typing import Any, Iterator, Sequence

from fusion_advisor.apply.plan import PLAN_VERSION, now_iso, render_plan
from fusion_advisor.apply.records import (
    CHOSEN, FAILED, KEPT, NOT_MEASURED_NOTE, REJECTED, WRONG, ApplyResult, NearMiss, SwapOutcome, SwapSite,
)

#: variants.csv columns and what each holds.
VARIANT_COLUMNS: dict[str, str] = {
    "variant": "Variant name (baselines: eager, torch.compile, torch.compile reduce-overhead).",
    "status": "chosen / correct (checked and timed) / wrong (failed the float64 check) / failed (raised) / "
              "skipped (budget) / not timed.",
    "ms": "Steady-state time of one step (forward, or forward+backward), ms: median of the timing rounds.",
    "spread": "(max - min) / median of the rounds: the measurement's noise.",
    "vs_eager": "Speed-up over the model as written, same run.",
    "vs_compile": "Speed-up over torch.compile(model), same run.",
    "first_call_s": "First step, s: compilation and CUDA-graph capture included.",
    "peak_mb": "Peak allocated GPU memory over three steps, MiB.",
    "device_ms": "Summed GPU kernel time of one step, ms (torch.profiler).",
    "error_vs_fp64": "Worst tensor's norm-wise error against the float64 reference (eager's own in brackets).",
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
        err = ""
        if c is not None and c.norm_err is not None:
            err = f"{c.norm_err:.3g}" + (f" ({c.eager_norm_err:.3g})" if c.eager_norm_err is not None else "")
        rows.append({
            "variant": v.spec.name, "status": v.status, "ms": _num(ms),
            "spread": _num(t.spread) if t is not None else "",
            "vs_eager": _num(eager.ms / ms) if ms and eager is not None and eager.ms and eager.correct else "",
            "vs_compile": _num(comp.ms / ms) if ms and comp is not None and comp.ms and comp.correct else "",
            "first_call_s": _num(t.first_call_s) if t is not None else "",
            "peak_mb": _num(t.peak_mb) if t is not None else "",
            "device_ms": _num(t.device_ms) if t is not None else "",
            "error_vs_fp64": err, "how": v.spec.describe(),
            "reason": "; ".join([x for x in (v.spec.why, v.reason) if x] + v.problems[:3]),
            "timer": t.timer if t is not None else "",
        })
    return rows


def render_variants_csv(rows: list[dict[str, Any]]) -> str:
    import csv

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(VARIANT_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


#: swaps.csv columns and what each holds.
SWAP_COLUMNS: dict[str, str] = {
    "swap": "Swap id 's<index>' (in the order matches were found).",
    "chain": "Analysis chain(s) holding the matched ops (';'-separated), ids of apply's own capture.",
    "kernel": "Library kernel whose pattern matched.",
    "verified": "True/False after verification; empty when not verified (not a candidate, or no --verify).",
    "max_abs_err": "Largest forward |kernel - float64 reference| over the verification cases.",
    "max_rel_err": "Largest forward relative difference over the verification cases.",
    "grad_max_abs_err": "Largest input-gradient |kernel - float64 reference| (empty without backward).",
    "eager_ms": "Original ops, eager, ms (median); empty when not measured.",
    "compile_ms": "Original ops under torch.compile, ms (median, compile time apart); empty when not measured.",
    "kernel_ms": "The kernel, ms (median); empty when not measured.",
    "eager_gpu_ms": "Original ops, eager: device time, summed GPU kernel time of one call, ms (torch.profiler).",
    "compile_gpu_ms": "Original ops under torch.compile: device time of one call, ms.",
    "kernel_gpu_ms": "The kernel: device time of one call, ms. Decides when measured (see 'reason').",
    "compile_time_ms": "torch.compile's first call on the original ops (compilation), ms.",
    "timer": "How times were taken ('do_bench median (cuda)' or 'not measured').",
    "decision": "kept / rejected / not kept / not tried / not verified.",
    "reason": "Why, with the numbers.",
    "route": "The analysis route of the chain (skip / torch.compile / triton) and the rule that decided.",
    "source": "file:line of the pattern's last op.",
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


def render_swaps_csv(rows: list[dict[str, Any]]) -> str:
    import csv

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(SWAP_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


_CSS = ("body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}"
        "td{max-width:28em;overflow-wrap:anywhere}td:nth-child(5){min-width:24em}th{background:#f3f3f3}"
        ".kept{background:#e6f4ea}.rejected{background:#fce8e6}.muted{color:#777}code{font-size:12px}")


def render_swaps_html(title: str, header: list[tuple[str, str]], rows: list[dict[str, Any]],
                      near_misses: list[dict[str, Any]], variants: list[dict[str, Any]], notes: list[str]) -> str:
    """A small self-contained HTML page: the chosen variant, every variant, swaps, near-misses (every string
    escaped)."""
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>"
           f"</head><body><h1>{e(title)}</h1><table>"]
    out += [f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in header]
    out.append("</table>")
    for n in notes:
        out.append(f"<p class='muted'>{e(n)}</p>")
    out.append(f"<h2>Whole-model variants ({len(variants)})</h2>")
    if variants:
        vcols = list(VARIANT_COLUMNS)
        out.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in vcols) + "</tr>")
        for r in variants:
            cls = "kept" if r["status"] == CHOSEN else "rejected" if r["status"] in (WRONG, FAILED) else ""
            out.append(f"<tr class='{cls}'>" + "".join(f"<td>{e(_fmt(r.get(c, '')))}</td>" for c in vcols) + "</tr>")
        out.append("</table>")
    else:
        out.append("<p class='muted'>No variant was tried (dry run: add --verify).</p>")
    cols = ["swap", "kernel", "chain", "decision", "reason", "verified", "max_abs_err", "max_rel_err",
            "eager_ms", "compile_ms", "kernel_ms", "eager_gpu_ms", "compile_gpu_ms", "kernel_gpu_ms", "route", "source",
            "module_path"]  # the long signature (shapes, constants) is in swaps.csv
    out.append(f"<h2>Swaps ({len(rows)})</h2><table><tr>" + "".join(f"<th>{e(c)}</th>" for c in cols) + "</tr>")
    for r in rows:
        cls = "kept" if r["decision"] == KEPT else "rejected" if r["decision"] == REJECTED else ""
        cells = "".join(f"<td>{e(_fmt(r.get(c, '')))}</td>" for c in cols)
        out.append(f"<tr class='{cls}'>{cells}</tr>")
    out.append("</table>")
    out.append(f"<h2>Near-misses ({len(near_misses)})</h2>")
    if near_misses:
        ncols = ["kernel", "kind", "reason", "chains", "source", "module_path"]
        out.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in ncols) + "</tr>")
        for r in near_misses:
            out.append("<tr>" + "".join(f"<td>{e(_fmt(r.get(c, '')))}</td>" for c in ncols) + "</tr>")
        out.append("</table>")
    cdoc = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in {**VARIANT_COLUMNS, **SWAP_COLUMNS}.items())
    out.append(f"<h2>Columns</h2><table>{cdoc}</table></body></html>\n")
    return "".join(out)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "; ".join(str(x) for x in v)
    return "" if v is None else str(v)





def plan_document(result: ApplyResult) -> dict[str, Any]:
    """The plan.yaml document: every decision of ``result`` (see :mod:`fusion_advisor.apply.plan`)."""
    import fusion_advisor
    from fusion_advisor.report import jsonable
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
                  "device": result.device, "dtype": result.dtype},
        "options": {**result.options.to_dict(), "backward": result.backward},
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


#: Files written by :func:`write_outputs`, by key.
OUTPUT_FILES = {"swaps_csv": "swaps.csv", "variants_csv": "variants.csv", "swaps_html": "swaps.html",
                "plan": "plan.yaml"}


def write_outputs(result: ApplyResult, out_dir: str | Path) -> dict[str, Path]:
    """Write swaps.csv, variants.csv, swaps.html and plan.yaml into ``out_dir`` (see the module docstring).

    Raises:
        UserError: ``out_dir`` is a file, or one of the files would overwrite the model file.
    """
    from fusion_advisor.errors import UserError
    from fusion_advisor.report import atomic_write_bytes

    out_dir = Path(out_dir)
    rows = swaps_rows(result.sites, result.outcomes)
    vrows = variant_rows(result)
    doc = plan_document(result)
    near_rows = [{"kernel": n["kernel"], "kind": n["kind"], "reason": n["reason"], "chains": n["chains"],
                  "source": n["source"], "module_path": n["module_path"]} for n in doc["near_misses"]]
    chosen = result.chosen
    header = [("model", f"{result.model_name} ({result.model_file})"), ("device", result.device),
              ("dtype", result.dtype or "as the file makes it"),
              ("measured", "forward+backward" if result.backward else "forward"),
              ("chosen", f"{chosen.spec.name}: {chosen.spec.describe()}" if chosen is not None else "nothing"),
              ("why", result.chosen_reason or "dry run (add --verify)"),
              ("speed-up", ", ".join(f"{v:.2f}x vs {k}" for k, v in result.speedups.items()) or "not measured"),
              ("options", ", ".join(f"{k}={v}" for k, v in result.options.to_dict().items())),
              ("versions", ", ".join(f"{k} {v}" for k, v in result.versions.items())),
              ("summary", ", ".join(f"{k}: {v}" for k, v in doc["summary"].items()))]
    notes = []
    if result.sites and not any(o.timing and o.timing.kernel_ms is not None for o in result.outcomes.values()):
        notes.append("No swap was timed: " + NOT_MEASURED_NOTE + ".")
    notes += [f"kernel {k}: {v}" for k, v in result.library_problems.items()]
    notes += [f"warning: {w}" for w in result.warnings]
    contents = {
        "swaps_csv": render_swaps_csv(rows).encode("utf-8"),
        "variants_csv": render_variants_csv(vrows).encode("utf-8"),
        "swaps_html": render_swaps_html(f"fusion-advisor apply: {result.model_name}", header, rows, near_rows,
                                        vrows, notes).encode("utf-8"),
        "plan": render_plan(doc).encode("utf-8"),
    }
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: exists and is not a directory")
    model_file = Path(result.model_file).resolve() if not result.model_file.startswith("<") else None
    paths = {k: out_dir / name for k, name in OUTPUT_FILES.items()}
    if model_file is not None and any(p.resolve() == model_file for p in paths.values()):
        raise UserError(f"--out {out_dir}: would overwrite the model file {model_file}")
    out_dir.mkdir(parents=True, exist_ok=True)
    with _sigint_deferred():
        for key, path in paths.items():
            atomic_write_bytes(path, contents[key])
    return paths


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

