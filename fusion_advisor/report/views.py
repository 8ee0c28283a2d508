"""What report.html shows, computed from the analysis and (when apply ran into the same folder) apply's plan.

The page answers one question first: *what do I do, and what does it buy?* This module turns the chains frame
(:func:`fusion_advisor.report.write.chains_frame`) and the plan document (plan.yaml, :func:`read_plan_document`) into
plain dicts the template renders:

* :func:`chain_groups`: chains that repeat layer by layer (same pattern, route, kernel, bound class, source line
  and numbers; module paths equal up to layer indices) as one group, "x32 layers", members one click away;
* :func:`verdict`: the first screen: the command that applies the advice, what it buys against eager and
  against ``torch.compile(model)`` (predicted from the roofline; measured when there is a profile or an apply
  run), the three largest opportunities with their source lines, and what was left alone and why;
* :func:`apply_view`: apply's whole-model variants, swaps, regions and the plan, linked to the report's chains.

Predicted times are sums of per-chain roofline estimates (us), or the host's part of a call where longer
(:class:`HostCalls`); what ``torch.compile(model)`` would take is predicted as every fusible chain fused into one
kernel (Inductor fuses pointwise and reduction chains) and every library op (GEMM, attention, convolution) and
unfusible op called as written, a convolution on a GPU without its bias pass (:func:`predicted_compile_us`); fused
chains are priced at the share of the roofline each route's code reaches (the device spec's measured
``route_efficiency``: Inductor's for torch.compile, the library kernel's for a Triton route).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from fusion_advisor.analyze import model_call
from fusion_advisor.analyze.model_call import HostCalls
from fusion_advisor.analyze.records import PARTIAL_COVERAGE, ROUTES, Analysis
from fusion_advisor.host import BUSY_CPU_REASON
from fusion_advisor.units import fmt_speedup, fmt_us, is_num

#: Chains shown as the first screen's opportunities.
TOP_OPPORTUNITIES = 3

_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def layer_pattern(module_path: str) -> str:
    """``"layers.3.mlp"`` -> ``"layers.*.mlp"``: the module path with every integer component (an index into an
    ``nn.ModuleList`` / ``nn.Sequential``) replaced by ``*``."""
    return _LAYER_INDEX.sub("*", module_path or "")


def layer_index(module_path: str) -> str:
    """The integer components of a module path, joined: ``"layers.3.mlp"`` -> ``"3"``; ``""`` when none."""
    return ".".join(p for p in (module_path or "").split(".") if p.isdigit())


def _round(x: Any) -> Any:
    """A number rounded to 4 significant digits for grouping (NaN stays NaN, so it groups with itself)."""
    if not is_num(x):
        return "nan"
    return float(f"{float(x):.4g}")


#: Columns whose values must agree for chains to form one group (besides the layer-free module path).
GROUP_BY = ("graph_index", "kind", "pattern", "route", "kernel", "bound", "rule_id", "dtype", "source",
            "eager_kernels", "est_eager_us", "est_after_route_us", "eager_bytes", "fused_bytes", "flops")

#: Columns summed over a group's members (the group row shows the total).
GROUP_SUMS = ("est_eager_us", "est_fused_us", "est_saving_us", "est_after_route_us", "est_route_saving_us",
              "eager_bytes", "fused_bytes", "bytes_saved", "flops", "measured_us", "eager_kernels", "n_ops")


def chain_groups(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The chains of ``frame`` grouped by repeated layer, in the frame's order of first member.

    Each group: ``gid`` (``"g<first chain id>"``), ``count``, ``ids`` (member chain ids), ``first`` (the first
    member's row), ``members`` (every member's row), ``totals`` (the :data:`GROUP_SUMS` columns summed, NaN
    where every member lacks the value), ``module_pattern`` (``layers.*.mlp``), ``layers`` (the members' layer
    indices, e.g. ``"0-31"``), ``saving_after_route_us`` (``est_eager_us - est_after_route_us``, each member's at
    least 0, summed: what the advised route buys; the opportunities and the chain table rank by it) and ``file``
    (the source file's name, for the file filter).
    """
    groups: dict[tuple, dict[str, Any]] = {}
    order: list[tuple] = []
    for row in frame.to_dict("records"):
        key = tuple(_round(row[c]) if isinstance(row[c], float) else row[c] for c in GROUP_BY) + (
            layer_pattern(str(row["module_path"] or "")),)
        if key not in groups:
            groups[key] = {"members": []}
            order.append(key)
        groups[key]["members"].append(row)
    out = []
    for key in order:
        members = groups[key]["members"]
        first = members[0]
        totals = {}
        for col in GROUP_SUMS:
            vals = [m[col] for m in members if is_num(m[col])]
            totals[col] = float(sum(vals)) if vals else float("nan")
        layers = [layer_index(str(m["module_path"] or "")) for m in members]
        one_per_layer = all(layers) and len(set(layers)) == len(layers)
        saving = sum(max(m["est_eager_us"] - m["est_after_route_us"], 0.0) for m in members
                     if is_num(m["est_eager_us"]) and is_num(m["est_after_route_us"]))
        src = str(first["source"] or "")
        out.append({
            "gid": f"g{first['chain_id']}",
            "count": len(members),
            "ids": [m["chain_id"] for m in members],
            "first": first,
            "members": members,
            "totals": totals,
            "module_pattern": layer_pattern(str(first["module_path"] or "")),
            "layers": _span(layers),
            "one_per_layer": one_per_layer,
            "saving_after_route_us": saving,
            "file": src.rsplit(":", 1)[0].replace("\\", "/").rsplit("/", 1)[-1] if src else "",
            "line": src.rsplit(":", 1)[1] if ":" in src else "",
        })
    return out


def _span(indices: list[str]) -> str:
    """``["0", "1", "2", "5"]`` -> ``"0-2, 5"``; non-numeric (nested) indices listed as they are."""
    if not any(indices):
        return ""
    if not all(i.isdigit() for i in indices):
        return ", ".join(i for i in indices if i)
    nums = sorted({int(i) for i in indices})
    runs, start, prev = [], nums[0], nums[0]
    for n in nums[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(runs)


def group_title(g: dict[str, Any]) -> str:
    """``"add_rmsnorm x2 layers (layers.*)"`` or just the pattern for a single chain."""
    pattern = g["first"]["pattern"]
    if g["count"] == 1:
        return pattern
    where = f" ({g['module_pattern']})" if g["module_pattern"] else ""
    # "x2 layers" only where each member sits in a layer of its own (two copies on one line of one block: "x2 times")
    unit = "layers" if g["one_per_layer"] else "times"
    return f"{pattern} x{g['count']} {unit}{where}"


# --- predictions ----------------------------------------------------------------------------------------------


def matmul_peak_text(analysis: Analysis) -> str:
    """``", fp32 matmul 67 TFLOP/s"``: the spec's tensor-core ceiling for the dtype doing most of the model's FLOPs
    (the compute roofline its GEMMs are classified against), ``""`` where the spec has none for it."""
    flops: dict[str, int] = {}
    for op in analysis.ops:
        flops[op.dtype] = flops.get(op.dtype, 0) + op.flops
    dtype = max(flops, key=flops.get) if flops else ""
    peak = (analysis.device_spec.get("tensor_tflops") or {}).get(dtype)
    return f", {dtype} matmul {peak:.3g} TFLOP/s" if is_num(peak) else ""


def predicted_compile_series(frame: pd.DataFrame) -> pd.Series:
    """Per chain, the predicted time under ``torch.compile(model)`` (us): the faster of ``est_eager_us`` and
    ``est_compile_us``, the roofline's price of Inductor's code for it (a fusible chain as one fused kernel at the
    share of the roofline Inductor's code reaches on its kind; a heavy item as it runs eagerly, Inductor calling
    cuBLAS / cuDNN / SDPA for it, less what Inductor takes out of the call: a convolution's bias pass; a scan as
    Inductor's own kernel). A report without ``est_compile_us``: a fusible chain at ``est_fused_us``, the rest as
    written. NaN without an estimate."""
    eager = frame["est_eager_us"].astype(float)
    if "est_compile_us" in frame:
        compiled = frame["est_compile_us"].astype(float)
        return eager.where(compiled.isna(), pd.concat([eager, compiled], axis=1).min(axis=1))
    fused = frame["est_fused_us"].astype(float)
    fusible = (frame["kind"] == "fusible") & fused.notna()
    return eager.where(~fusible, pd.concat([eager, fused], axis=1).min(axis=1))


def predicted_compile_us(frame: pd.DataFrame) -> float:
    """Predicted time of ``torch.compile(model)`` over the chains (us), the sum of
    :func:`predicted_compile_series`."""
    return float(predicted_compile_series(frame).sum(skipna=True)) if len(frame) else 0.0


#: A faster whole-model route is predicted only when it beats the simpler one by more than this share: the margin
#: apply's never-slower rule allows, and about the spread of its timings (the simpler route: eager, then
#: torch.compile, then CUDA graphs).
ROUTE_MARGIN = model_call.WHOLE_MARGIN

#: The whole-model routes :func:`predicted_model_routes` prices, simplest first.
MODEL_ROUTES = ("eager", "torch.compile", "reduce-overhead")


def predicted_model_routes(frame: pd.DataFrame, gpu: bool = True, unused_us: float = 0.0,
                           calls: HostCalls | None = None) -> dict[str, Any]:
    """The predicted time (us) of the whole model as written (``eager``: sum of ``est_eager_us`` plus
    ``unused_us``, the work no output uses that eager runs and dynamo drops, :attr:`Analysis.unused_us`), under
    ``torch.compile(model)`` and under ``torch.compile(model, mode="reduce-overhead")`` (GPU specs only), and
    ``best``: the route predicted fastest, where a route counts as faster than a simpler one only beyond
    :data:`ROUTE_MARGIN`. Returns ``{"eager": us, "torch.compile": us, "reduce-overhead": us or NaN, "best": name}``.

    torch.compile: the chains' times (:func:`predicted_compile_us`), or the host's part of a call where that is
    longer: ``calls.compiled_call_us`` per captured graph plus one launch per chain Inductor runs as a kernel of
    its own and the eager host time of the rest (heavy items included: cuDNN and cuBLAS are called as eagerly).
    reduce-overhead: Inductor's code replayed from CUDA graphs (every chain at ``est_cudagraphs_us``, the launch
    floor gone, but a recurrent layer and what follows it in its graph as written: dynamo stops there) plus
    ``calls.input_copy_us`` (the inputs copied into the graphs' static buffers), or ``calls.graph_replay_us`` per
    captured graph where that is longer. A call's fixed host cost hides under device work that outlasts it (the
    host issues the next call while the GPU runs this one): on H100 hosts a compiled call of a tiny chain cost
    3.7-4 eager adds of host time and a reduce-overhead call 6.7-8 whatever the chain's length
    (benchmarks/results/h100/host/compiled_call_probe.json, benchmarks/results/h100/accuracy/
    calibrate_compiled_call/), while on the H200's level-2 apply runs (0.5-41 ms)
    reduce-overhead ran a median 34 us behind torch.compile (benchmarks/results/h200/apply_models), far less than
    its replay's host time."""
    calls = calls or HostCalls()
    # torch.compile stops at an nn.LSTM / GRU / RNN (dynamo's allow_rnn is off by default; the analysis captures
    # with it on): the layer and every chain after it in its graph run as written, and a graph that begins with one
    # is no compiled call at all (model_call.eager_tail; torch 2.13 compiled a Linear + sin before an LSTM and
    # nothing after it)
    tail = _eager_tail(frame)
    compiled = predicted_compile_series(frame) if len(frame) else pd.Series(dtype=float)
    if len(frame):
        compiled = compiled.where(~tail, frame["est_eager_us"].astype(float))
    calls = dataclasses.replace(calls, graphs=max(calls.graphs - _graphs_compiling_nothing(frame, tail), 0))
    # one launch where Inductor runs the chain as a kernel of its own; a heavy item is called as eagerly (cuDNN,
    # cuBLAS: their host time), whatever Inductor takes out of it (a convolution's bias): model_call prices the
    # advised routes' calls alike
    own_kernel = compiled < frame["est_eager_us"].astype(float) if len(frame) else pd.Series(dtype=bool)
    routes = own_kernel.map({True: "torch.compile", False: "skip"})
    _, compile_host = model_call.call_parts(_chain_calls(frame, routes, compiled), calls, every_graph_compiled=True)
    times = {"eager": _sum(frame, "est_eager_us") + unused_us,
             "torch.compile": max(float(compiled.sum(skipna=True)), compile_host)}
    graphed = frame["est_cudagraphs_us"] if "est_cudagraphs_us" in frame else None
    tail_host = 0.0
    if graphed is not None and len(frame):
        # the eager tail runs as written under reduce-overhead too, its host-bound steps included (measured on the
        # H200: 37_LSTMCn 45.9 ms eager, 46.0 under reduce-overhead), its host time beside the replays'; only a
        # whole-model torch.cuda.graph (apply's) replays a recurrent layer
        graphed = graphed.where(~tail, frame["est_eager_us"])
        if "launch_eager_us" in frame:
            tail_host = float(frame["launch_eager_us"].where(tail, 0.0).astype(float).sum(skipna=True))
    times["reduce-overhead"] = (max(float(pd.concat([graphed.astype(float), compiled], axis=1).min(axis=1)
                                          .sum(skipna=True)) + calls.input_copy_us,
                                    calls.graphs * calls.graph_replay_us + tail_host)
                                if gpu and graphed is not None and len(frame) else float("nan"))
    best = "eager"
    for route in MODEL_ROUTES[1:]:
        t = times[route]
        if is_num(t) and t < times[best] * (1.0 - ROUTE_MARGIN):
            best = route
    return {**times, "best": best}


def _eager_tail(frame: pd.DataFrame) -> pd.Series:
    """Per chain of ``frame`` (in execution order): whether it runs as written under torch.compile(model)
    (:func:`fusion_advisor.analyze.model_call.eager_tail`)."""
    if not len(frame) or "pattern" not in frame:
        return pd.Series(False, index=frame.index, dtype=bool)
    graph = frame["graph_index"] if "graph_index" in frame else pd.Series(0, index=frame.index)
    return pd.Series(model_call.eager_tail(list(zip(graph, frame["pattern"], strict=True))), index=frame.index,
                     dtype=bool)


def _graphs_compiling_nothing(frame: pd.DataFrame, tail: pd.Series) -> int:
    """Captured graphs of ``frame`` whose every chain runs as written (``tail``): no compiled call of their own."""
    if not len(frame) or not tail.any():
        return 0
    graph = frame["graph_index"] if "graph_index" in frame else pd.Series(0, index=frame.index)
    return int(tail.groupby(graph).all().sum())


def predicted_advised_us(frame: pd.DataFrame, calls: HostCalls | None = None) -> float:
    """The predicted time (us) of the model with the advice carried out, over the chains
    (:func:`fusion_advisor.analyze.model_call.advised_us` of the frame's ``route``, ``est_after_route_us`` and
    ``launch_eager_us``): the host's part of a call priced as :func:`predicted_model_routes` prices
    ``torch.compile(model)``'s, so that the two compare like for like (a fresh user's six tiny ops read 20x faster
    than torch.compile(model) when only the latter paid its call)."""
    if not len(frame):
        return 0.0
    routes = frame["route"] if "route" in frame else pd.Series("skip", index=frame.index)
    return model_call.advised_us(_chain_calls(frame, routes, frame["est_after_route_us"]), calls or HostCalls())


def _chain_calls(frame: pd.DataFrame, routes: pd.Series, after_us: pd.Series) -> list[model_call.ChainCall]:
    """The frame's chains as :class:`~fusion_advisor.analyze.model_call.ChainCall` records on ``routes`` at
    ``after_us`` (a frame without host times, graph indices or fixed routes: none, graph 0, none fixed)."""
    host = frame["launch_eager_us"] if "launch_eager_us" in frame else pd.Series(0.0, index=frame.index)
    heavy = frame["kind"] == "heavy" if "kind" in frame else pd.Series(False, index=frame.index)
    graph = frame["graph_index"] if "graph_index" in frame else pd.Series(0, index=frame.index)
    fixed = frame["route_fixed"] if "route_fixed" in frame else pd.Series(False, index=frame.index)
    return [model_call.ChainCall(r, a, h, bool(k), int(g) if g == g else 0, f is True or f == 1)
            for r, a, h, k, g, f in zip(routes, after_us, host, heavy, graph, fixed, strict=True)]


def analysis_model_routes(analysis: Analysis, frame: pd.DataFrame, calls: HostCalls | None = None) -> dict[str, Any]:
    """:func:`predicted_model_routes` of an analysis (``frame``: its :func:`chains_frame`): CUDA graphs on a GPU
    spec only, the unused work's eager time, the spec's host costs per call and the input copy of a replayed
    call (``calls``, by default :meth:`HostCalls.of` the analysis); plus ``breaks``, the capture's graph breaks,
    which the whole-model predictions do not otherwise price (:func:`whole_model_note`)."""
    routes = predicted_model_routes(frame, gpu=(analysis.device_spec or {}).get("kind", "gpu") == "gpu",
                                    unused_us=analysis.unused_us, calls=calls or HostCalls.of(analysis))
    return {**routes, "breaks": len(analysis.graph_breaks)}


def predicted_totals(analysis: Analysis, frame: pd.DataFrame) -> dict[str, Any]:
    """What the console's predicted line and report.html's first screen both say (us): ``eager`` (the chains'
    eager sum), ``advised`` (:func:`predicted_advised_us`), ``compiled`` (``torch.compile(model)``,
    :func:`predicted_model_routes`) and ``routes`` (:func:`analysis_model_routes`)."""
    calls = HostCalls.of(analysis)
    routes = analysis_model_routes(analysis, frame, calls)
    return {"eager": _sum(frame, "est_eager_us"), "advised": predicted_advised_us(frame, calls),
            "compiled": routes["torch.compile"], "routes": routes}


def call_host_beyond_chains(totals: dict[str, Any], frame: pd.DataFrame) -> dict[str, float]:
    """The host time (us) a call costs beyond its chains' device time, of ``torch.compile(model)`` (``compiled``)
    and of the advised routes (``advised``), from :func:`predicted_totals`'s ``totals``: 0 where device work
    outlasts the call's host part (the breakdown chart draws the rest)."""
    if not len(frame):
        return {"compiled": 0.0, "advised": 0.0}
    chains = {"compiled": float(predicted_compile_series(frame).sum(skipna=True)),
              "advised": _sum(frame, "est_after_route_us")}
    return {k: max(float(totals[k]) - v, 0.0) for k, v in chains.items()}


def whole_model_note(model_routes: dict[str, Any], advised_us: float) -> str:
    """A clause for the predicted speed-up line when the whole model on its predicted best route
    (:func:`predicted_model_routes`) beats the advised per-chain routes beyond :data:`ROUTE_MARGIN`:
    ``"; faster still, the whole model with CUDA graphs (reduce-overhead): 6.08x vs eager"``, else ``""`` (apply
    times both: which to act on is its measurement's call). Per-chain routes never
    graph a lone launch-bound kernel; the whole model replayed from one CUDA graph removes every launch, and a new
    user read "1.00x vs eager" above a whole-model line predicting 6x."""
    best = model_routes.get("best", "eager")
    t, eager = model_routes.get(best), model_routes.get("eager")
    if best == "eager" or not is_num(t) or not is_num(eager) or t <= 0 or not advised_us > 0:
        return ""
    if t >= advised_us * (1.0 - ROUTE_MARGIN):
        return ""
    what = {"torch.compile": "torch.compile(model)",
            "reduce-overhead": "the whole model with CUDA graphs (reduce-overhead)"}.get(best, best)
    caveat = breaks_caveat(model_routes)
    return f"; faster still, {what}: {eager / t:.2f}x vs eager" + (f" ({caveat})" if caveat else "")


def recurrent_graph_note(frame: pd.DataFrame) -> str:
    """Where the advice replays a recurrent layer from a CUDA graph, why the whole-model line's reduce-overhead does
    not (a fresh user read "predicted best route: eager" beside advice 3.60x faster than eager on an nn.LSTM model,
    and would have tried reduce-overhead): dynamo breaks its graph at nn.LSTM / GRU / RNN, so only apply's capture of
    the whole model in one ``torch.cuda.graph`` replays the layer's host-issued steps. ``""`` elsewhere."""
    if "pattern" not in frame or "route" not in frame:
        return ""
    layers = frame[(frame["pattern"] == "recurrent") & (frame["route"] == "cudagraphs")]
    if not len(layers):
        return ""
    return (f"the advice replays {len(layers)} recurrent layer(s) (nn.LSTM / GRU / RNN) from one CUDA graph of the "
            f"whole model (apply's torch.cuda.graph capture); reduce-overhead does not, since torch.compile breaks "
            f"its graph at the layer and runs it as written")


def breaks_caveat(model_routes: dict[str, Any]) -> str:
    """``"not pricing its N graph break(s) ..."`` where the capture broke its graph, else ``""`` (the console's
    predicted line and the report's whole-model line both say it): the whole-model predictions price each captured
    graph's call (:class:`HostCalls`), but a break on a value (``.item()``, ``.nonzero()``, a branch on a tensor)
    also makes the host wait for the GPU there; a fresh user's model with a branch on a mean and a nonzero read
    6.68x under reduce-overhead without a word on them."""
    n = int(model_routes.get("breaks") or 0)
    return (f"not pricing its {n} graph break(s) beyond each graph's call: one on a tensor's value also makes the "
            f"host wait for the GPU") if n > 0 else ""


def _sum(frame: pd.DataFrame, col: str) -> float:
    return float(frame[col].astype(float).sum(skipna=True)) if len(frame) else 0.0


def apply_elsewhere(analysis: Analysis) -> bool:
    """Whether apply, run on this machine, runs the model on its CPU while the analysis priced a GPU: its report
    must then go to a folder of its own (:func:`cpu_folder`): in the analysis' folder it would replace the GPU
    analysis (a fresh user ran the suggested command and lost the H200 routes they had just read)."""
    import torch

    return (analysis.device_spec or {}).get("kind", "gpu") != "cpu" and not torch.cuda.is_available()


def cpu_folder(out_dir: Path) -> Path:
    """``<out_dir>-cpu`` beside ``out_dir`` (``reports/x`` -> ``reports/x-cpu``; ``.`` or ``..`` by their resolved
    name)."""
    if out_dir.name and out_dir.name not in (".", ".."):
        return out_dir.with_name(out_dir.name + "-cpu")
    full = out_dir.resolve()
    return full.parent / f"{full.name or 'report'}-cpu"


def apply_command(analysis: Analysis, out_dir: Path | None, flags: list[str] | None = None) -> str:
    """The shell command that carries the advice out on the analysed model: ``fusion-advisor apply ... --verify``
    with the analysis' model file and dtype, writing into the report's folder (so the results join this report;
    :func:`cpu_folder` of it where :func:`apply_elsewhere`).

    ``flags``: the flags of the apply run whose plan the report shows (plan.yaml's ``flags``): the command then
    reruns that search as it was asked for (its --candidates, --budget-s, --keep-unmeasured, ...), with --verify
    where that run was a dry one. Without them,
    the analysis' device spec is named (its file, where ``--gpu`` gave one) unless it is one apply takes by itself (the default ``h200``; ``cpu``, what
    apply on a machine without a GPU measures and prices that machine with, and which on a GPU would send every
    kernel route to torch.compile), and its user rules."""
    from fusion_advisor.devices import available_specs

    parts = ["fusion-advisor", "apply"]
    if analysis.model_file and not analysis.model_file.startswith("<"):
        parts.append(analysis.model_file)
    if flags is None:
        parts.append("--verify")
    if analysis.dtype:
        parts += ["--dtype", analysis.dtype]
    if flags is not None:
        parts += flags if "--verify" in flags else ["--verify", *flags]
    else:
        spec = str((analysis.device_spec or {}).get("name", ""))
        try:
            shipped = set(available_specs())
        except Exception:  # noqa: BLE001 - a command without --gpu is still a command
            shipped = set()
        if analysis.device_spec_file:  # a spec file of the user's, whatever its name field says
            parts += ["--gpu", analysis.device_spec_file]
        elif spec in shipped and spec not in ("h200", "cpu"):
            parts += ["--gpu", spec]
        for r in analysis.rules_files:
            path = str(r.get("file", "") if isinstance(r, dict) else r)
            if path and Path(path).name != "default.yaml":
                parts += ["--rules", path]
    if out_dir is not None:
        parts += ["--out", str(cpu_folder(out_dir) if flags is None and apply_elsewhere(analysis) else out_dir)]
    return " ".join(shlex.quote(p) for p in parts)


def opportunities(groups: list[dict[str, Any]], n: int = TOP_OPPORTUNITIES) -> list[dict[str, Any]]:
    """The ``n`` groups whose advised route saves the most (predicted ``est_eager_us - est_after_route_us``),
    skipped groups excluded."""
    routed = [g for g in groups if g["first"]["route"] not in ("skip", "") and g["saving_after_route_us"] > 0]
    routed.sort(key=lambda g: -g["saving_after_route_us"])
    return routed[:n]


def left_alone(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Skipped chains by the rule that skipped them: ``{rule_id, chains, eager_us, reason, example}``, the most
    eager time first; ``reason`` is the largest member's."""
    by_rule: dict[str, dict[str, Any]] = {}
    for g in groups:
        first = g["first"]
        if first["route"] != "skip":
            continue
        e = by_rule.setdefault(first["rule_id"] or "(no rule)", {"rule_id": first["rule_id"] or "(no rule)",
                                                                   "chains": 0, "eager_us": 0.0, "best": -1.0,
                                                                   "reason": "", "patterns": {}})
        e["chains"] += g["count"]
        t = g["totals"]["est_eager_us"]
        if is_num(t):
            e["eager_us"] += t
        e["patterns"][first["pattern"]] = e["patterns"].get(first["pattern"], 0) + g["count"]
        own = first["est_eager_us"] if is_num(first["est_eager_us"]) else 0.0
        if own > e["best"]:
            e["best"], e["reason"], e["example"] = own, first["reason"], first["chain_id"]
    out = sorted(by_rule.values(), key=lambda e: -e["eager_us"])
    for e in out:
        e["what"] = ", ".join(f"{p} x{n}" if n > 1 else p for p, n in
                              sorted(e["patterns"].items(), key=lambda kv: -kv[1]))
    return out


def advice(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The advice route by route (skip excluded): ``{route, chains, what, saved_us, note}``, ``what`` naming the
    patterns (``"add_rmsnorm x4, rmsnorm"``), ``saved_us`` the predicted saving of the route and ``note`` how many
    of a triton route's chains are counted at another route's time, predicted faster than their kernel."""
    out: dict[str, dict[str, Any]] = {}
    for g in groups:
        route = g["first"]["route"]
        if route in ("skip", ""):
            continue
        e = out.setdefault(route, {"route": route, "chains": 0, "saved_us": 0.0, "patterns": {}, "elsewhere": 0})
        e["chains"] += g["count"]
        e["saved_us"] += g["saving_after_route_us"]
        # a library kernel the prediction doubts is counted at the faster route's time (roofline.estimate): say so
        # (a fresh user read "triton add_layernorm 33.5 us" where the kernel's own estimate saved 21.4)
        e["elsewhere"] += sum(1 for m in g["members"] if route == "triton" and is_num(m.get("est_triton_us"))
                              and is_num(m.get("est_after_route_us"))
                              and m["est_after_route_us"] < m["est_triton_us"] * (1.0 - 1e-9))
        name = g["first"]["kernel"] or g["first"]["pattern"]
        e["patterns"][name] = e["patterns"].get(name, 0) + g["count"]
    rows = [out[r] for r in ROUTES if r in out] + [v for k, v in out.items() if k not in ROUTES]
    for e in rows:
        e["what"] = ", ".join(f"{p} x{n}" if n > 1 else p for p, n in
                              sorted(e["patterns"].items(), key=lambda kv: -kv[1]))
        e["note"] = (f"{e['elsewhere']} of them counted at torch.compile's or eager's time, predicted faster than "
                     f"the kernel: apply measures both" if e["elsewhere"] else "")
    return rows


def _no_noise(diff_us: float, of_us: float) -> float:
    """``diff_us``, or 0 where it is rounding noise of summing ``of_us`` two ways (under a billionth of it): a
    fresh user's model whose every chain was left as written read "-1.1e-13 us saved"."""
    return 0.0 if is_num(diff_us) and is_num(of_us) and abs(diff_us) <= 1e-9 * abs(of_us) else diff_us


def verdict(analysis: Analysis, frame: pd.DataFrame, groups: list[dict[str, Any]], plan: dict[str, Any] | None,
            out_dir: Path | None) -> dict[str, Any]:
    """The first screen (see the module docstring). Times in us; speed-ups as ratios (old / new time)."""
    totals = predicted_totals(analysis, frame)
    model_routes = totals["routes"]
    # the advice's gain is over the chains: the unused work (in model_routes' eager) only torch.compile(model) or a
    # dynamo-based apply variant drops, never a chain's route
    eager, compiled, advised = totals["eager"], totals["compiled"], totals["advised"]
    routed = frame[frame["route"].isin([r for r in ROUTES if r != "skip"])]
    by_route = advice(groups)
    out: dict[str, Any] = {
        "model_routes": model_routes,
        "breaks_caveat": breaks_caveat(model_routes),
        "recurrent_note": recurrent_graph_note(frame),
        "command": apply_command(analysis, out_dir, (plan or {}).get("flags")),
        "apply_elsewhere": plan is None and apply_elsewhere(analysis),
        "pred_eager_us": eager, "pred_advised_us": advised, "pred_compile_us": compiled,
        "pred_vs_eager": eager / advised if advised > 0 else float("nan"),
        "pred_vs_compile": compiled / advised if advised > 0 else float("nan"),
        "pred_saved_us": _no_noise(eager - advised, eager),
        "pred_saved_vs_compile_us": _no_noise(compiled - advised, compiled),
        "pred_unused_us": analysis.unused_us,
        "n_routed": int(len(routed)), "n_chains": int(len(frame)),
        "partial": next((w for w in analysis.warnings if w.startswith(PARTIAL_COVERAGE)), ""),
        "opportunities": opportunities(groups),
        "advice": by_route,
        "advice_saved_us": sum(e["saved_us"] for e in by_route),
        "left_alone": left_alone(groups),
        "measured": [],
    }
    prof = analysis.profile
    if prof is not None and prof.total_us > 0:
        wall = prof.plain_wall_us
        # what the cost model is judged on: the chains as they run inside the model, at this host's measured speed
        # (ChainMeasurement.predicted_us), not the first screen's chains each priced alone at the spec's host speed
        # (KernelBench's ResNet-101 on the H200's shipped profile: 8.82 ms alone at the h200 spec's 12 us per
        # launch, 6.41 in the model at the 7.7 us the profile's probe measured, 6.58 measured)
        # both with the work no output uses, which the model as written runs (fit_profiles.residuals' model total)
        unused = analysis.unused_us
        in_model = sum(m.predicted_us for m in prof.chains.values()) + unused
        measured = prof.model_eager_us
        speed = "at this host's measured speed" if prof.device == "cuda" else "at the spec's host speed"
        out["measured"].append({
            "what": f"eager, profiled on {prof.device_name}",
            "text": (f"{fmt_us(wall)} per run, the plain model's wall time; the profiled run " if wall else "")
                    + f"{fmt_us(prof.total_us)} per run ({fmt_us(prof.attributed_us)} attributed to chains); "
                    f"predicted {fmt_us(in_model)}"
                    + (f" ({in_model / measured:.2f}x the measured)" if measured > 0 else "")
                    + f" with each chain priced inside the model {speed}, {fmt_us(eager + unused)} with each "
                    f"priced alone at the spec's host speed, as the routes above are",
            "source": "analyze --profile"})
    if plan is not None and plan.get("measured") and plan["measured"]["timed"]:
        m = plan["measured"]
        parts = []
        for key, label in (("vs_eager", "eager"), ("vs_compile", "torch.compile(model)")):
            if is_num(m.get(key)):
                parts.append(f"{fmt_speedup(m[key])} vs {label}{m['noisy'].get(key, '')}")
        if m.get("confirmed_against") and is_num(m.get("confirmed_speedup")):
            parts.insert(0, f"confirmed {fmt_speedup(m['confirmed_speedup'])} vs {m['confirmed_against']} in "
                            f"interleaved rounds; in the search")
        out["measured"].append({
            "what": f"the plan ({m['chosen']}), measured by apply on {m['device']}",
            "text": f"{m['chosen_ms']:.4g} ms per step" + (f": {', '.join(parts)}" if parts else "")
                    + f" ({m['timer']})",
            "source": "apply --verify"})
    return out


# --- apply's results -------------------------------------------------------------------------------------------


def _noisy_notes(summary: dict) -> dict[str, str]:
    """``{"vs_eager": " (noisy: rounds spread 847%)", ...}`` for the measured ratios a plan's summary marks as
    resting on noisy rounds (``noisy_speedups``: baseline name -> spread), or every ratio where the plan was timed
    on a busy CPU (``busy_cpu``); absent keys are clean."""
    noisy = _dict(summary.get("noisy_speedups"))
    keys = {"eager": "vs_eager", "torch.compile": "vs_compile"}
    if summary.get("busy_cpu") is True:  # other processes held the CPU's cores: every ratio
        return {key: f" ({BUSY_CPU_REASON})" for key in keys.values()}
    return {keys[k]: f" (noisy: rounds spread {v:.0%})" for k, v in noisy.items() if k in keys and is_num(v)}


def read_plan_document(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The plan.yaml document at ``path`` when fusion-advisor wrote it, else ``None``, with a note saying why
    it was not read (``""`` when there is no file)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        return None, ""
    try:
        text = path.read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return None, f"{path.name} could not be read ({type(e).__name__}); apply's results are not shown"
    if not text.startswith("# fusion-advisor plan") or not isinstance(doc, dict) or "fusion_advisor_plan" not in doc:
        return None, f"{path.name} was not written by fusion-advisor apply; not shown"
    if "variants" not in doc or "swaps" not in doc:
        return None, (f"{path.name} is an older plan format (version {doc.get('fusion_advisor_plan')}); run apply "
                      "again to see its results here")
    return doc, ""


def _dict(x: Any) -> dict[str, Any]:
    return dict(x) if isinstance(x, dict) else {}


def _list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, list) else []


def _ratio(a: Any, b: Any) -> float:
    return a / b if is_num(a) and is_num(b) and b > 0 else float("nan")


def plan_mismatches(doc: dict[str, Any], analysis: Analysis | None, spec: bool = True) -> list[str]:
    """Why apply's plan document and this analysis may not describe the same thing (one line each): the plan was
    made for another model file, or (with ``spec``) with another device spec. The report shows both; analyze
    prints the first (apply on a CPU machine analyses with the CPU's spec, analyze with a GPU's, as a rule)."""
    if analysis is None:
        return []
    out = []
    model = _dict(doc.get("model"))
    if model.get("file") and str(model.get("file")) != analysis.model_file:
        out.append(f"plan.yaml was made for {model.get('file')}, this analysis for {analysis.model_file}: the two "
                   "may not describe the same model")
    spec_name = (analysis.device_spec or {}).get("name")
    if spec and doc.get("device_spec") and doc.get("device_spec") != spec_name:
        out.append(f"apply analysed with the device spec {doc.get('device_spec')}, this report with {spec_name}: "
                   "chain routes may differ")
    return out


def apply_view(doc: dict[str, Any], analysis: Analysis | None) -> dict[str, Any]:
    """apply's results from a plan document (plan.yaml, or :func:`fusion_advisor.apply.outputs.plan_document`):
    variant rows with speed-ups over the run's own eager and torch.compile timings, swap rows linked to the
    report's chains, regions, near-misses, and notes when the plan describes another model file or analysis.

    Never raises on a malformed document: missing keys read as empty.
    """
    doc = doc if isinstance(doc, dict) else {}
    variants = [v for v in _list(doc.get("variants")) if isinstance(v, dict)]

    def ms_of(v: dict[str, Any]) -> float:
        t = _dict(v.get("timing"))
        return t.get("ms") if is_num(t.get("ms")) else float("nan")

    def correct(v: dict[str, Any]) -> bool:
        c = _dict(v.get("check"))
        return bool(c.get("passed")) and v.get("status") not in ("wrong", "failed")

    base = {v.get("name"): v for v in variants}
    eager = base.get("eager")
    comp = base.get("torch.compile")
    eager_ms = ms_of(eager) if eager is not None and correct(eager) else float("nan")
    comp_ms = ms_of(comp) if comp is not None and correct(comp) else float("nan")
    rows = []
    for v in variants:
        t, c = _dict(v.get("timing")), _dict(v.get("check"))
        ms = ms_of(v)
        err = c.get("norm_err")
        rows.append({
            "name": str(v.get("name", "")), "status": str(v.get("status", "")), "ms": ms,
            "spread": t.get("spread"), "vs_eager": _ratio(eager_ms, ms), "vs_compile": _ratio(comp_ms, ms),
            "first_call_s": t.get("first_call_s"), "peak_mb": t.get("peak_mb"),
            "peak_reserved_mb": t.get("peak_reserved_mb"), "device_ms": t.get("device_ms"),
            "err": err, "eager_err": c.get("eager_norm_err"),
            "how": str(_dict(v.get("spec")).get("describe", "")), "reason": str(v.get("reason", "")),
            "problems": [str(p) for p in _list(v.get("problems"))][:3], "timer": str(t.get("timer", "") or ""),
        })
    chosen = _dict(doc.get("chosen"))
    if chosen and not isinstance(chosen.get("spec"), dict):
        chosen["spec"] = {}
    summary = _dict(doc.get("summary"))
    model = _dict(doc.get("model"))
    chain_ids = {c.id for c in analysis.chains} if analysis is not None else set()
    swaps = []
    for s in _list(doc.get("swaps")):
        if not isinstance(s, dict):
            continue
        v, t = _dict(s.get("verification")), _dict(s.get("timing"))
        swaps.append({
            "id": str(s.get("id", "")), "kernel": str(s.get("kernel", "")), "pattern": str(s.get("pattern", "")),
            "chains": [str(c) for c in _list(s.get("chains"))],
            "linked": [str(c) for c in _list(s.get("chains")) if str(c) in chain_ids],
            "decision": str(s.get("decision", "")), "reason": str(s.get("reason", "")),
            "verified": s.get("verified"), "max_abs_err": v.get("max_abs_err"),
            "grad_max_abs_err": v.get("grad_max_abs_err"),
            "eager_ms": t.get("eager_ms"), "compile_ms": t.get("compile_ms"), "kernel_ms": t.get("kernel_ms"),
            "kernel_gpu_ms": t.get("kernel_gpu_ms"), "compile_gpu_ms": t.get("compile_gpu_ms"),
            "timer": str(t.get("timer", "")), "source": str(s.get("source", "")), "code": str(s.get("code", "")),
            "module_path": str(s.get("module_path", "")),
            "route": "{route}{k} ({rule})".format(route=_dict(s.get("route")).get("route", ""),
                                                  k="/" + str(_dict(s.get("route")).get("kernel", ""))
                                                  if _dict(s.get("route")).get("kernel") else "",
                                                  rule=_dict(s.get("route")).get("rule", "")),
        })
    notes = plan_mismatches(doc, analysis)
    if analysis is not None and swaps and not any(s["linked"] for s in swaps) and chain_ids:
        notes.append("no swap links to a chain of this analysis (another model, or an analysis made before chain "
                     "ids were shared between analyze and apply): run analyze again")
    raw_swaps = [s for s in _list(doc.get("swaps")) if isinstance(s, dict)]
    untimed = [(_dict(s.get("timing")).get("note") or "") for s in raw_swaps
               if s.get("verified") and not is_num(_dict(s.get("timing")).get("kernel_ms"))]
    if untimed and len(untimed) == sum(1 for s in raw_swaps if s.get("verified")):
        notes.append("No swap was timed" + (f": {untimed[0]}" if untimed[0] else "") + ".")
    measured = None
    chosen_ms = chosen.get("ms")
    if is_num(chosen_ms) or is_num(eager_ms) or is_num(comp_ms):
        device = str(model.get("device", ""))
        gpu = _dict(doc.get("versions")).get("gpu")
        timed = is_num(chosen_ms)
        measured = {"chosen": str(chosen.get("name", "")), "chosen_ms": float(chosen_ms) if timed else float("nan"),
                    "timed": timed, "eager_ms": eager_ms, "compile_ms": comp_ms,
                    "vs_eager": _ratio(eager_ms, chosen_ms), "vs_compile": _ratio(comp_ms, chosen_ms),
                    "confirmed_against": str(summary.get("confirmed_against") or ""),
                    "confirmed_speedup": summary.get("confirmed_speedup"),
                    "noisy": _noisy_notes(summary),
                    "device": f"{gpu} ({device})" if gpu else device,
                    "timer": next((r["timer"] for r in rows if r["timer"]), ""),
                    "what": str(summary.get("what", "forward")),
                    "why_untimed": "" if timed else next((r["reason"] for r in rows
                                                          if r["name"] == chosen.get("name")), "")}
    return {
        "created_at": str(doc.get("created_at", "")), "tool_version": str(doc.get("tool_version", "")),
        "model": model, "options": _dict(doc.get("options")), "versions": _dict(doc.get("versions")),
        "flags": [str(f) for f in _list(doc.get("flags"))] if "flags" in doc else None,
        "summary": summary, "chosen": chosen, "chosen_reason": str(doc.get("chosen_reason", "") or ""),
        "variants": rows, "swaps": swaps, "regions": [r for r in _list(doc.get("regions")) if isinstance(r, dict)],
        "near_misses": [n for n in _list(doc.get("near_misses")) if isinstance(n, dict)],
        "library_problems": _dict(doc.get("library_problems")),
        "warnings": [str(w) for w in _list(doc.get("warnings"))],
        "timings_s": {k: v for k, v in _dict(doc.get("timings_s")).items() if is_num(v)}, "notes": notes,
        "measured": measured,
        "dry_run": not variants,
    }


def route_class(route: str) -> str:
    """CSS-safe class of a route: ``"torch.compile"`` -> ``"r-torch-compile"``."""
    return "r-" + re.sub(r"[^a-z0-9]+", "-", (route or "none").lower()).strip("-")
