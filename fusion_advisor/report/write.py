"""Stage 6: write what ``analyze`` found as report.html, chains.csv, ops.csv and report.json; one report per model
folder, with ``apply``'s results in it when apply ran into the same folder.

Every ``est_*`` number is an *estimate* from the roofline model of :mod:`fusion_advisor.analyze.roofline`; ``measured_*``
columns (and the Profile section) hold measurements of ``analyze --profile`` (:mod:`fusion_advisor.analyze.profile`),
placed next to the roofline's eager estimate they are compared with. The report says how each number was computed
(:data:`CHAIN_COLUMNS`, :data:`OP_COLUMNS`).

How analyze and apply share the report: the analysis lives in report.json, apply's decisions in plan.yaml
(:data:`APPLY_FILE_NAMES`). report.html is rendered from both whoever writes last: :func:`write_report`
(analyze) reads the folder's plan.yaml when apply wrote one; apply (:func:`fusion_advisor.apply.outputs.write_outputs`)
renders it from the folder's report.json when that is the same analysis (:func:`load_report`), else from its own.
What the page shows first is computed in :mod:`fusion_advisor.report.views`, its pictures in
:mod:`fusion_advisor.report.charts`.

Public API:

* :func:`write_report` writes the four files into a folder, each atomically (temp file in the same folder, then
  ``os.replace``), and returns their paths; :func:`render_files` renders any of them in memory.
* :func:`load_report` reads a folder's report.json back into an :class:`~fusion_advisor.analyze.records.Analysis`;
  :func:`read_plan` its plan.yaml.
* :func:`check_files` / :func:`check_out_dir`: the one output guard: never overwrite a file fusion-advisor did not
  write (:func:`file_is_ours`).
* :func:`chains_frame` / :func:`ops_frame`: one row per chain / per op, columns exactly :data:`CHAIN_COLUMNS` /
  :data:`OP_COLUMNS` (the CSVs are these frames).
* :func:`summary_rows`: totals by route and by bound class for the terminal summary (keys :data:`SUMMARY_COLUMNS`).

The HTML page is self-contained: inline CSS and one small inline script (sorting, filters, repeated-layer groups;
templates/table.js.j2), charts as base64 PNGs, no external references; it opens offline and reads without the
script. Every user string in it is HTML-escaped by jinja2's autoescape.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import jinja2
import pandas as pd

import fusion_advisor
from fusion_advisor.analyze.records import (  # route names and bound classes, in the order the report lists them
    BOUNDS, ROUTES, Analysis, Chain, ChainMeasurement, Decision, Estimate, OpInfo, SourceLoc, TensorMeta,
)
from fusion_advisor.analyze.model_call import after_route_us
from fusion_advisor.analyze.op_classes import launches
from fusion_advisor.analyze.roofline import op_device_us, op_host_us, price_source
from fusion_advisor.errors import UserError
from fusion_advisor.files import atomic_write_bytes, check_folder, same_model_file
from fusion_advisor.report.spec import first, flatten, scalar_text, spec_view
from fusion_advisor.units import fmt_bytes, fmt_float, fmt_flops, fmt_int, fmt_speedup, fmt_us, is_num  # noqa: F401

#: File names written by :func:`write_report`, by the key of its result.
FILE_NAMES = {
    "html": "report.html",
    "chains_csv": "chains.csv",
    "ops_csv": "ops.csv",
    "json": "report.json",
}

#: Files ``apply`` writes beside the report (fusion_advisor/apply/outputs.py); report.html shows their content when
#: they are in its folder.
APPLY_FILE_NAMES = {
    "plan": "plan.yaml",
    "variants_csv": "variants.csv",
    "swaps_csv": "swaps.csv",
}

# Column name -> documentation (unit and how it is computed). The CSVs use exactly these columns, in this order,
# and the HTML report's "Columns" glossary is rendered from these dicts.
CHAIN_COLUMNS: dict[str, str] = {
    "chain_id": "Chain id, 'c<index>' in topological order of the captured graphs.",
    "kind": "'fusible' (pointwise/reduction/normalization/softmax ops one fused kernel can run), 'heavy' (a "
    "library op: matmul, conv, attention, embedding) or 'other' (an op no fused kernel takes).",
    "pattern": "Recognised pattern ('rmsnorm', 'softmax', ...), else a generic name ('pointwise', 'matmul', ...).",
    "route": "Where the chain goes: 'skip' (leave eager), 'torch.compile', 'triton' (a library kernel) or "
             "'cudagraphs' (replay it from a CUDA graph: launch-bound work).",
    "kernel": "Library kernel name for 'triton' routes, else empty.",
    "rule_id": "Id of the routing rule that decided (first match wins).",
    "rules_file": "The rules file that rule came from (a user's --rules file or the shipped rules/default.yaml).",
    "route_fixed": "True where the route stays as its rule decided: a rule of the user's own or one on the measured "
                   "bound class (the model-call weighing and apply's regions leave it as the rule says).",
    "bound": "Bound class after routing: 'compute', 'memory' or 'launch' (the roofline's class unless a rule "
    "overrides it).",
    "reason": "The deciding rule's reason, rendered with the chain's numbers.",
    "note": "Extra remark from the router, e.g. a fallback because the named kernel is not in the library.",
    "n_ops": "Member ops, views included (count).",
    "eager_kernels": "Kernels launched when the chain runs op by op (views launch none) (count).",
    "eager_bytes": "Bytes moved op by op: sum over member ops of bytes read + bytes written (bytes).",
    "fused_bytes": "Bytes moved by one fused kernel: chain inputs read once + chain outputs written once (bytes).",
    "bytes_saved": "eager_bytes - fused_bytes, never negative (bytes).",
    "flops": "Floating-point operations of all member ops, multiply and add counted separately, from fake-tensor "
    "shapes (FLOP).",
    "arithmetic_intensity_flop_per_byte": "flops / fused_bytes, 0 when the chain moves no bytes (FLOP/byte).",
    "ridge_point_flop_per_byte": "Arithmetic intensity where the device's compute and memory ceilings meet for "
    "the chain's dtype and unit: peak FLOP/s / bandwidth (FLOP/byte).",
    "est_eager_us": "Estimated eager time: per op max(device time, host time per call) summed (us). Device "
    "time: max(compute, memory) on the roofline, or for convolutions and matmuls a roofline fitted through the "
    "spec's measured ones of their class (conv_rates, matmul_rates), then the spec's fitted curve of the "
    "op's class (op_time_fits) where it has one; host time: the spec's launch overhead, or its measured cost per "
    "call of the op's class (launch_overhead_by_class). So it can exceed compute_us, memory_fused_us and "
    "launch_eager_us. An estimate, not a measurement.",
    "est_fused_us": "Estimated time as one fused kernel: max(flops / peak, fused_bytes / bandwidth, launch "
    "overhead) (us). An estimate, not a measurement.",
    "est_saving_us": "est_eager_us - est_fused_us as the cost model reports it (0 for heavy and single-kernel "
    "items) (us): what one fused kernel at the roofline would save. The totals, 'The advice' and analyze's top "
    "chains count the saving of the chosen route instead (est_route_saving_us), so their sums differ from this "
    "column's.",
    "est_compile_us": "Estimated time under torch.compile: the fused kernel at the share of the roofline Inductor's "
    "code reaches on this kind of chain (the device spec's measured route_efficiency) (us); est_eager_us when "
    "there is nothing to fuse, except a convolution with a bias on a GPU, which Inductor calls without it (the "
    "bias added in the kernel that reads the output next, or in one of its own).",
    "est_triton_us": "The same for the library kernel's measured share (us); meaningful for chains a kernel replaces. "
    "The fp32 GEMM kernel (3xTF32): its measured share of the compute roofline, never under the eager GEMM's time "
    "over its best measured speed-up (1.56x): an upper bound on its gain.",
    "est_cudagraphs_us": "Estimated time replayed from a CUDA graph with Inductor's code: est_compile_us without the "
    "launch floor, each kernel still at least its fixed device time (the spec's elementwise_overhead_us, else "
    "2.3 us) (us); for a cuDNN recurrent layer, its steps' device time (apply's torch.cuda.graph of the whole "
    "model; torch.compile's reduce-overhead runs the layer as written).",
    "est_after_route_us": "Estimated time after routing (us): the fused kernel at the share of the roofline the "
    "route's code reaches on this kind of chain (the device spec's measured route_efficiency; the roofline "
    "where unmeasured) for 'torch.compile' and 'triton' (a library kernel predicted slower than torch.compile or "
    "eager at the faster of est_compile_us and est_eager_us: apply keeps a swap only where it measures faster, "
    "else the faster whole-model variant; est_triton_us is the kernel's own), the same without the launch floor for "
    "'cudagraphs', est_eager_us for 'skip'.",
    "est_route_saving_us": "est_eager_us - est_after_route_us (us): what the chosen route saves on this chain, the "
    "figure analyze's 'Top chains by estimated saving on their route' ranks by and the totals and 'The advice' "
    "sum (a GEMM routed to a faster kernel saves here without fusing anything, where est_saving_us is 0).",
    "compute_us": "flops / the peak FLOP/s that serves the chain (tensor cores for matmuls, else vector units) (us).",
    "memory_fused_us": "fused_bytes / peak memory bandwidth (us).",
    "launch_eager_us": "host time of issuing the chain's kernels eagerly: per kernel the spec's launch overhead, or "
    "its measured cost per call of the op's class (launch_overhead_by_class) (us).",
    "numel": "Elements of the chain's largest tensor (count).",
    "row_elems": "Row width of the chain's reductions, 0 when it has none (elements).",
    "dtype": "Dominant dtype of the chain's data.",
    "source": "file:line of the first member op that launches a kernel; paths under site-packages are shortened "
    "to the part after 'site-packages/'.",
    "code": "The Python code on that source line.",
    "module_path": "Dotted path of the nn.Module that issued that op, empty at top level.",
    "epilogue_of": "Id of the heavy chain whose output this chain alone consumes (an epilogue candidate), else empty.",
    "prologue_of": "Id of the pooling item that alone reads this pointwise chain's output, else empty: Inductor "
    "reads the pool's input through the chain, so under torch.compile it costs no memory pass of its own.",
    "op_ids": "Ids of the member ops ('g<graph>:<node>'), space separated, topological order.",
    "graph_index": "Index of the captured graph the chain lives in.",
    "inductor_code": "With analyze --inductor-code: the file (relative to the report folder) holding the code "
    "Inductor generates for the chain, or why there is none; empty when not asked for or not selected.",
    # measured (analyze --profile); empty / NaN without a profile
    "measured_us": "Measured time of the chain run unfused (eager), per run: its kernels' durations plus the "
    "device idle time charged to them (GPU), or its aten ops' wall time (CPU) (us). Empty without --profile.",
    "measured_busy_us": "Of measured_us, the time its kernels ran (GPU), or its aten ops' profiled durations "
    "less that of an op doing no work, measured in the same run (CPU) (us).",
    "measured_idle_us": "Of measured_us, device idle time waiting for its launches (GPU), or the plain host cost "
    "of one eager op (measured, not the spec's) per aten op (CPU) (us).",
    "measured_host_us": "GPU: host time issuing its ops in the plain stamped runs (each op's time since the previous "
    "op that launched kernels, views between included, scaled as the idle time is), per run (us): set it against "
    "measured_busy_us to see which side bounds the chain; empty where not measured (CPU, or a report without it).",
    "measured_kernels": "Device kernels (GPU) or top-level aten ops (CPU) it ran per run (count).",
    "measured_kernel_names": "GPU: the distinct device kernels the chain ran (profiler names, each op's longest "
    "first), '; '-separated; empty on a CPU.",
    "measured_bound": "Bound class from the measurement: 'launch' when measured_idle_us > measured_busy_us (that "
    "part measured), else 'compute' or 'memory' by which of the spec's ceilings its FLOPs and eager bytes come "
    "closer to over its busy time: the busy time cancels out, so that split is derived from the chain's FLOPs, "
    "bytes and the spec, not measured (no hardware counters are read).",
    "est_in_model_us": "With --profile: the roofline's EAGER time of the chain inside the model: its ops' roofline "
    "device time plus the GPU's predicted wait for their launches, the host issuing one op per launch overhead "
    "and running ahead of the GPU where it can (us). Unlike est_eager_us (the chain priced alone), short ops "
    "behind a long kernel wait for no launch. For a graph that runs k times per model call (a graph break inside "
    "a loop), k times one call's estimate, as measured_us sums the k calls (the profile's notes name such graphs).",
    "predicted_vs_measured": "est_in_model_us / measured_us (1 = exact; above 1 the model predicts too slow).",
    "flag_2x": "True when prediction and measurement differ by more than 2x (predicted_vs_measured > 2 or < 0.5).",
    "achieved_gbps": "eager_bytes / measured_us (GB/s, 1e9 bytes/s).",
    "achieved_tflops": "flops / measured_us (TFLOP/s).",
    "pct_of_roofline": "Roofline device time of the chain run op by op, no launch term, / measured_us, in percent. "
    "Each op's roofline uses its own ceilings: max(flops / peak, bytes / the op's bandwidth (the spec's strided, "
    "broadcast or scan rate where the op reads that way, else copy bandwidth) + the spec's fixed device time per "
    "eager elementwise kernel), plus a pool's window reads and a concatenation's input sweeps. 100 = at that "
    "roofline; above 100 where an op reads from L2 what its producer left there.",
}

OP_COLUMNS: dict[str, str] = {
    "op_id": "Op id, 'g<graph>:<node name>'.",
    "graph_index": "Index of the captured graph the op belongs to.",
    "target": "aten overload, e.g. 'aten.mm.default'.",
    "category": "Op category (pointwise, reduction, matmul, view, ...).",
    "chain_id": "Id of the chain that holds the op, empty when no chain does.",
    "input_shapes": "Shapes of the tensor inputs in argument order, '; ' separated, e.g. '[2048, 4096]; [4096]'.",
    "output_shapes": "Shapes of the tensor outputs, '; ' separated.",
    "dtype": "dtype of the first output (of the first input when there is no tensor output).",
    "flops": "Floating-point operations, multiply and add counted separately, from fake-tensor shapes (FLOP).",
    "bytes_read": "Bytes read if the op runs as its own kernel, views 0 (bytes).",
    "bytes_written": "Bytes written if the op runs as its own kernel, views 0 (bytes).",
    "module_path": "Dotted path of the nn.Module that issued the op, empty at top level.",
    "source": "file:line that issued the op; site-packages paths shortened to the part after 'site-packages/'.",
    "code": "The Python code on that source line.",
    "est_device_us": "Predicted eager device time of the op on the report's device spec (us): what the chain's "
                     "est_eager_us sums with the host time below (a view or an op on empty tensors: 0).",
    "est_host_us": "Predicted host time of issuing the op eagerly (us): the spec's host cost of its class (a view, "
                   "or an op on empty tensors, which launches nothing: 0 here; views are charged to the op after "
                   "them in the chain's in-model time).",
    "priced_by": "How est_device_us was priced: 'matmul table', 'conv table', 'reduction table' (the spec's "
                 "measured rates), 'recurrent steps' or 'roofline', then 'x fit <class>' where a curve fitted from "
                 "profiles (calibrate --from-profile) applies; a native composite (an encoder layer's fast "
                 "path) lists its parts' ('parts: ...').",
    "measured_busy_us": "With --profile, per model run (us; a graph run k times per call holds its k calls, "
                        "est_device_us one): on a GPU the op's kernels' summed device time; on a CPU the aten op's "
                        "duration less the dispatch probe. Empty without --profile.",
    "measured_idle_us": "With --profile, per model run (us): on a GPU the time the GPU waited before the op's "
                        "kernels; on a CPU the dispatch probe's host cost, the same for every op. Empty without.",
}

#: Keys of each :func:`summary_rows` dict -> documentation.
SUMMARY_COLUMNS: dict[str, str] = {
    "group": "'route', 'bound' or 'total'.",
    "key": "The route or bound class ('all' for the total row).",
    "chains": "Number of chains (count).",
    "eager_us": "Sum of est_eager_us (us).",
    "after_route_us": "Sum of est_after_route_us (us).",
    "saving_us": "eager_us - after_route_us (us).",
}

HOW_COMPUTED = (
    "FLOPs and bytes come from fake-tensor shapes propagated through the captured aten graphs: no data is run. "
    "FLOPs count multiply and add separately (as torch.utils.flop_counter does); an op's bytes are the bytes its "
    "tensors occupy when it runs as its own kernel (views move none).",
    "Eager bytes of a chain are the sum over its ops of bytes read + written. Fused bytes assume one kernel: the "
    "chain's inputs are read once and its outputs written once; intermediates stay on chip.",
    "Times follow the roofline: a kernel keeps the GPU busy t = max(flops / peak FLOP/s, bytes / bandwidth), where "
    "the spec measured them from its tables (convolutions, matmuls, reductions, op-class fits) and with each op's "
    "own ceilings (strided and broadcast reads, a kernel's fixed device time); the host issues each op at its "
    "class's measured host time, overlapping with the GPU, so alone each op costs max(t, host time). Eager time "
    "sums this over the chain's ops; fused time applies it once to the whole chain (one launch, the chain's fused "
    "bytes). The peak is the tensor-core peak for matmul-like ops and the vector peak otherwise, for the chain's "
    "dtype.",
    "The bound class is the chain's as it runs inside the model: the host issuing every op in order and running "
    "ahead of the GPU where it can (while a long GEMM runs it issues the next ops), a chain is launch-bound when "
    "the GPU waits for its launches longer than it computes; otherwise compute-bound when its arithmetic intensity "
    "is above the ridge point, else memory-bound. Routing rules may override the class.",
    "Time after routing is the chain's time on its route: the fused kernel at the share of the roofline the "
    "route's code reaches on that kind of chain (the device spec's measured route_efficiency: Inductor's for "
    "torch.compile, the library kernel's for a Triton kernel), the same without the launch floor for CUDA graphs, "
    "and the eager estimate for skipped chains. Savings are eager minus after-routing.",
    "What torch.compile(model) would take is predicted as every fusible chain fused into one kernel at Inductor's "
    "measured share of the roofline and every library op (GEMM, attention, convolution) and unfusible op left as "
    "it runs eagerly; apply measures the whole model.",
    "All est. times are estimates from peak numbers of the device spec, NOT measurements: real kernels reach a "
    "fraction of peak, and torch.compile may fuse differently. Verify and benchmark before trusting a saving.",
    "With --profile, measured_* columns come from running the captured graphs under torch.profiler after warm-up, "
    "their aten ops matched to the graphs' nodes; every GPU kernel is attributed by correlation id to the op that "
    "launched it (on a CPU, each op's aten wall time), and the GPU's idle time comes from replaying those kernels on "
    "the host timeline of plain, unprofiled runs. They are compared with the EAGER estimate inside the model "
    "(predicted_vs_measured), since the profiled model runs unfused. A run with a calibrated spec (fusion-advisor "
    "calibrate) compares against ceilings measured on the same device.",
)


# --- small helpers ------------------------------------------------------------------------------------------


def short_path(file: str) -> str:
    """``file`` with everything up to and including ``site-packages/`` (or ``dist-packages/``) removed."""
    path = str(file).replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        idx = path.rfind(marker)
        if idx >= 0:
            return path[idx + len(marker):]
    return path


def _source_str(loc: SourceLoc) -> str:
    """``file:line`` with the file shortened, ``""`` when the location is unknown."""
    if not loc.file:
        return ""
    return f"{short_path(loc.file)}:{loc.line}"


def _shapes(metas: tuple[TensorMeta, ...]) -> str:
    """``"[2048, 4096]; [4096]"``; a 0-d tensor is ``"[]"``."""
    return "; ".join("[" + ", ".join(str(int(s)) for s in m.shape) + "]" for m in metas)


def _nan() -> float:
    return float("nan")


def _ordered(present: list[str], canonical: tuple[str, ...]) -> list[str]:
    """Canonical names first (always), then any other names present, sorted."""
    extra = sorted({p for p in present if p not in canonical})
    return list(canonical) + extra


def jsonable(obj: Any) -> Any:
    """``obj`` made ``json.dumps``-able: dataclasses -> dicts, tuples/sets -> lists, NaN/inf -> None, Path -> str,
    anything else unknown -> ``str(obj)``."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        try:
            return jsonable(obj.item())
        except (TypeError, ValueError):
            pass
    return str(obj)


# --- frames -------------------------------------------------------------------------------------------------


def _inductor_cell(rec: Any) -> str:
    """The chains.csv ``inductor_code`` cell: the file for generated code, else the status and reason."""
    if rec is None:
        return ""
    return rec.path if rec.status == "generated" else (rec.reason or rec.status)


def _measured_cells(m: ChainMeasurement | None) -> dict[str, Any]:
    if m is None or m.time_us <= 0:
        return {"measured_us": _nan(), "measured_busy_us": _nan(), "measured_idle_us": _nan(),
                "measured_host_us": _nan(), "measured_kernels": _nan(), "measured_bound": "",
                "predicted_vs_measured": _nan(),
                "flag_2x": None if m is None else False, "achieved_gbps": _nan(), "achieved_tflops": _nan(),
                "pct_of_roofline": _nan(), "measured_kernel_names": "", "est_in_model_us": _nan()}
    return {"measured_us": m.time_us, "measured_busy_us": m.busy_us, "measured_idle_us": m.idle_us,
            "measured_host_us": m.host_us if m.host_us > 0 else _nan(), "measured_kernels": m.kernels,
            "measured_bound": m.bound, "predicted_vs_measured": m.ratio,
            "flag_2x": m.flagged, "achieved_gbps": m.achieved_gbps, "achieved_tflops": m.achieved_tflops,
            "pct_of_roofline": m.pct_of_roofline, "measured_kernel_names": "; ".join(m.kernel_names),
            "est_in_model_us": m.predicted_us}


def _chain_row(chain: Chain, est: Estimate | None, dec: Decision | None, inductor: Any = None,
               measured: ChainMeasurement | None = None) -> dict[str, Any]:
    route = dec.route if dec else ""
    return {
        "chain_id": chain.id,
        "kind": chain.kind,
        "pattern": chain.pattern,
        "route": route,
        "kernel": dec.kernel if dec else "",
        "rule_id": dec.rule_id if dec else "",
        "rules_file": dec.rules_file if dec else "",
        "route_fixed": bool(dec.fixed) if dec else False,
        "bound": dec.bound if dec else (est.bound if est else ""),
        "reason": dec.reason if dec else "",
        "note": dec.note if dec else "",
        "n_ops": len(chain.op_ids),
        "eager_kernels": chain.eager_kernels,
        "eager_bytes": chain.eager_bytes,
        "fused_bytes": chain.fused_bytes,
        "bytes_saved": chain.bytes_saved,
        "flops": chain.flops,
        "arithmetic_intensity_flop_per_byte": chain.arithmetic_intensity,
        "ridge_point_flop_per_byte": est.ridge_point if est else _nan(),
        "est_eager_us": est.eager_us if est else _nan(),
        "est_fused_us": est.fused_us if est else _nan(),
        "est_saving_us": est.saving_us if est else _nan(),
        "est_compile_us": est.route_us("torch.compile") if est else _nan(),
        "est_triton_us": est.route_us("triton") if est else _nan(),
        "est_cudagraphs_us": est.route_us("cudagraphs") if est else _nan(),
        "est_after_route_us": after_route_us(route, est),
        "est_route_saving_us": (est.eager_us - after_route_us(route, est)) if est else _nan(),
        "compute_us": est.compute_us if est else _nan(),
        "memory_fused_us": est.memory_fused_us if est else _nan(),
        "launch_eager_us": est.launch_eager_us if est else _nan(),
        "numel": chain.numel,
        "row_elems": chain.row_elems,
        "dtype": chain.dtype,
        "source": _source_str(chain.source),
        "code": chain.source.code,
        "module_path": chain.module_path,
        "epilogue_of": chain.epilogue_of,
        "prologue_of": chain.prologue_of,
        "op_ids": " ".join(chain.op_ids),
        "graph_index": chain.graph_index,
        "inductor_code": _inductor_cell(inductor),
        **_measured_cells(measured),
    }


def chains_frame(analysis: Analysis) -> pd.DataFrame:
    """One row per chain, in chain order, columns exactly :data:`CHAIN_COLUMNS`.

    Chains without an estimate get NaN times; chains without a decision get empty route/rule strings.
    """
    measured = analysis.profile.chains if analysis.profile is not None else {}
    rows = [
        _chain_row(c, analysis.estimates.get(c.id), analysis.decisions.get(c.id), analysis.inductor_code.get(c.id),
                   measured.get(c.id))
        for c in analysis.chains
    ]
    return pd.DataFrame(rows, columns=list(CHAIN_COLUMNS))


def ops_frame(analysis: Analysis) -> pd.DataFrame:
    """One row per op, in op order, columns exactly :data:`OP_COLUMNS`."""
    chain_of: dict[str, str] = {}
    for chain in analysis.chains:
        for op_id in chain.op_ids:
            chain_of.setdefault(op_id, chain.id)
    spec = _spec_of(analysis)
    nodes = analysis.profile.nodes if analysis.profile is not None else {}
    rows = [_op_row(op, chain_of.get(op.id, ""), spec, nodes.get(op.id)) for op in analysis.ops]
    return pd.DataFrame(rows, columns=list(OP_COLUMNS))


def _spec_of(analysis: Analysis) -> Any:
    """The analysis' device spec as a :class:`~fusion_advisor.devices.DeviceSpec`, or None where it does not parse
    (a report written by another version): the per-op prices are then left empty."""
    from fusion_advisor.devices import parse_spec, spec_fields

    try:
        return parse_spec(spec_fields(analysis.device_spec or {}), "report.json: device_spec")
    except Exception:  # noqa: BLE001 - the prices are an aid, the rest of the row stands
        return None


def _op_row(op: OpInfo, chain_id: str, spec: Any = None, measured: Any = None) -> dict[str, Any]:
    runs = spec is not None and not op.is_view and launches(op)  # as the chain estimates charge it
    return {
        "op_id": op.id,
        "graph_index": op.graph_index,
        "target": op.target,
        "category": op.category,
        "chain_id": chain_id,
        "input_shapes": _shapes(op.inputs),
        "output_shapes": _shapes(op.outputs),
        "dtype": op.dtype,
        "flops": op.flops,
        "bytes_read": op.bytes_read,
        "bytes_written": op.bytes_written,
        "module_path": op.module_path,
        "source": _source_str(op.source),
        "code": op.source.code,
        "est_device_us": op_device_us(op, spec) if spec is not None else _nan(),
        "est_host_us": op_host_us(op, spec) if runs else (0.0 if spec is not None else _nan()),
        "priced_by": price_source(op, spec) if spec is not None else "",
        "measured_busy_us": measured.busy_us if measured is not None else _nan(),
        "measured_idle_us": measured.idle_us if measured is not None else _nan(),
    }


# --- summary ------------------------------------------------------------------------------------------------


def summary_rows(analysis: Analysis) -> list[dict[str, Any]]:
    """Totals for the terminal summary: one row per route, one per bound class, then one total row.

    Keys are :data:`SUMMARY_COLUMNS`. Canonical routes (:data:`ROUTES`) and bound classes (:data:`BOUNDS`) are
    always listed, with zeros when no chain has them; a chain without a decision counts under route ``""``
    (listed only when present). Chains without an estimate are counted but add no time.
    """
    frame = chains_frame(analysis)
    rows: list[dict[str, Any]] = []
    for group, canonical in (("route", ROUTES), ("bound", BOUNDS)):
        for key in _ordered(frame[group].tolist(), canonical):
            rows.append(_summary_row(group, key, frame[frame[group] == key]))
    rows.append(_summary_row("total", "all", frame))
    return rows


def _summary_row(group: str, key: str, sub: pd.DataFrame) -> dict[str, Any]:
    eager_us = float(sub["est_eager_us"].sum(skipna=True)) if len(sub) else 0.0
    after_us = float(sub["est_after_route_us"].sum(skipna=True)) if len(sub) else 0.0
    return {
        "group": group,
        "key": key,
        "chains": int(len(sub)),
        "eager_us": eager_us,
        "after_route_us": after_us,
        "saving_us": eager_us - after_us,
    }


# --- pictures -----------------------------------------------------------------------------------------------


def roofline_png(analysis: Analysis, frame: pd.DataFrame | None = None) -> tuple[bytes, list[str]]:
    """The roofline chart as PNG bytes and its notes (:func:`fusion_advisor.report.charts.roofline_png`, one point per
    group of repeated chains)."""
    from fusion_advisor.report import charts
    from fusion_advisor.report.views import chain_groups

    frame = chains_frame(analysis) if frame is None else frame
    return charts.roofline_png(analysis, frame, chain_groups(frame))


# --- HTML ---------------------------------------------------------------------------------------------------


def _template(name: str = "report.html.j2") -> jinja2.Template:
    """A page template of fusion_advisor/templates (package data); they include style.css.j2 and table.js.j2."""
    def load(template: str) -> str:
        return resources.files("fusion_advisor.templates").joinpath(template).read_text(encoding="utf-8")

    env = jinja2.Environment(loader=jinja2.FunctionLoader(load), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(int=fmt_int, num=fmt_float, bytes=fmt_bytes, us=fmt_us, x=fmt_speedup, pct=_fmt_pct,
                       flops=fmt_flops, basename=lambda p: Path(str(p)).name)
    return env.get_template(name)


def _fmt_pct(value: Any) -> str:
    """A fraction as a percentage: ``0.094`` -> ``"9.4%"``."""
    return f"{100.0 * value:.1f}%" if is_num(value) else "–"


def _sorted_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups by the total estimated saving of their route (``saving_after_route_us``, as the largest opportunities
    rank them; the terminal's top chains by each chain's ``est_route_saving_us``), then total estimated eager time
    (descending, missing last). Ranked by the saving of fusing, a 3xTF32 GEMM saving 159 us sat below a 21 us chain
    with "0.0" beside it (a fresh user)."""
    def key(g: dict[str, Any]) -> tuple[float, float]:  # the opportunities' number (views.chain_groups)
        s, e = g["saving_after_route_us"], g["totals"]["est_eager_us"]
        return (-(s if is_num(s) else -math.inf), -(e if is_num(e) else -math.inf))

    return sorted(groups, key=key)


#: What the library kernels measured over Inductor, quoted beside the predictions (the roofline cannot see it).
LIBRARY_EDGE = ("1.0-2.3x torch.compile's device time per kernel on the H200, "
                "benchmarks/results/h200/kernels/kernels_7b.md")


def render_html(analysis: Analysis, generated_at: str, plan: dict[str, Any] | None = None,
                out_dir: Path | None = None, plan_note: str = "") -> str:
    """The self-contained HTML report as a string.

    Args:
        analysis: what analyze found.
        generated_at: ISO time shown in the header.
        plan: apply's plan document (plan.yaml) for the same folder, or ``None``: its variants, swaps, regions
            and measured whole-model times are shown beside the analysis (:func:`report_views.apply_view`).
        out_dir: the report's folder, named in the apply command of the first screen.
        plan_note: why a plan.yaml in the folder was not shown, if it was not.
    """
    from fusion_advisor.report import charts, views

    frame = chains_frame(analysis)
    groups = views.chain_groups(frame)
    plan_view = views.apply_view(plan, analysis) if plan is not None else None
    verdict = views.verdict(analysis, frame, groups, plan_view, out_dir)
    png, chart_notes = charts.roofline_png(analysis, frame, groups, [g["gid"] for g in verdict["opportunities"]])
    what = (plan_view or {}).get("measured", {}) or {}
    # the verdict's totals: a call's host part where it outlasts the chains
    beyond = views.call_host_beyond_chains({"compiled": verdict["pred_compile_us"],
                                            "advised": verdict["pred_advised_us"]}, frame)
    breakdown = charts.breakdown_png(frame, views.predicted_compile_series(frame),
                                     (plan_view or {}).get("variants") or None,
                                     what=str(what.get("what", "forward")) if plan_view else "forward",
                                     call_host_us={charts.COMPILE_BAR: beyond["compiled"],
                                                   charts.ADVISED_BAR: beyond["advised"]})
    missing_est = [c.id for c in analysis.chains if c.id not in analysis.estimates]
    missing_dec = [c.id for c in analysis.chains if c.id not in analysis.decisions]
    report_notes = []
    if missing_est:
        report_notes.append(f"{len(missing_est)} chain(s) have no estimate: {' '.join(missing_est[:20])}"
                            + (" ..." if len(missing_est) > 20 else ""))
    if missing_dec:
        report_notes.append(f"{len(missing_dec)} chain(s) have no routing decision: {' '.join(missing_dec[:20])}"
                            + (" ..." if len(missing_dec) > 20 else ""))
    summary = summary_rows(analysis)
    profile = profile_view(analysis, frame)
    ordered = _sorted_groups(groups)
    present_routes = {g["first"]["route"] for g in groups}
    filters = {
        "route": _ordered(sorted(present_routes), tuple(r for r in ROUTES if r in present_routes)),
        "bound": [b for b in _ordered(sorted({g["first"]["bound"] for g in groups}), BOUNDS)
                  if any(g["first"]["bound"] == b for g in groups)],
        "kernel": sorted({g["first"]["kernel"] for g in groups if g["first"]["kernel"]}),
        "file": sorted({g["file"] for g in groups}),
    }
    return _template().render(
        a=analysis,
        tool_version=fusion_advisor.__version__,
        generated_at=generated_at,
        spec=spec_view(analysis),
        rules_files=[_rules_file_view(r) for r in analysis.rules_files],
        summary_route=[r for r in summary if r["group"] == "route"],
        summary_bound=[r for r in summary if r["group"] == "bound"],
        summary_total=[r for r in summary if r["group"] == "total"][0],
        chart_png_b64=base64.b64encode(png).decode("ascii"),
        breakdown_png_b64=base64.b64encode(breakdown).decode("ascii"),
        chart_notes=chart_notes,
        groups=ordered,
        n_chains=len(analysis.chains),
        filters=filters,
        verdict=verdict,
        plan=plan_view,
        plan_notes=[n for n in [plan_note] if n],
        library_edge=LIBRARY_EDGE,
        group_title=views.group_title,
        route_class=views.route_class,
        n_ops=len(analysis.ops),
        graph_breaks=[{"reason": b.reason, "source": _source_str(b.source), "code": b.source.code,
                       "graph_index": b.graph_index} for b in analysis.graph_breaks],
        warnings=list(analysis.warnings),
        report_notes=report_notes,
        chain_columns=CHAIN_COLUMNS,
        op_columns=OP_COLUMNS,
        apply_columns=dict((plan or {}).get("columns") or {}),  # variants.csv, swaps.csv: what apply documents
        how_computed=HOW_COMPUTED,
        file_names={**FILE_NAMES, **APPLY_FILE_NAMES},
        n_graphs=len({op.graph_index for op in analysis.ops} | {c.graph_index for c in analysis.chains}),
        inductor=list(analysis.inductor_code.values()),
        short_path=short_path,
        profile=profile,
    )


def profile_view(analysis: Analysis, frame: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """What the report shows of a profile: totals, the predicted-vs-measured bound table, the ratio spread and the
    chains flagged (prediction off by more than 2x). ``None`` without a profile."""
    p = analysis.profile
    if p is None:
        return None
    frame = chains_frame(analysis) if frame is None else frame
    measured = frame[frame["measured_us"].notna()]
    predicted = [analysis.estimates[c].bound if c in analysis.estimates else "" for c in measured["chain_id"]]
    confusion = {pb: {mb: 0 for mb in BOUNDS} for pb in BOUNDS}
    for pb, mb in zip(predicted, measured["measured_bound"]):
        if pb in confusion and mb in confusion[pb]:
            confusion[pb][mb] += 1
    agree = sum(confusion[b][b] for b in BOUNDS)
    ratios = measured["predicted_vs_measured"].astype(float)
    within = int(((ratios - 1.0).abs() <= 0.3).sum())  # |predicted - measured| <= 30% of measured
    flagged = measured[measured["flag_2x"] == True].sort_values("measured_us", ascending=False)  # noqa: E712
    return {
        "p": p,
        "attributed_pct": 100.0 * p.attributed_us / p.total_us if p.total_us > 0 else float("nan"),
        # the model's measured eager time: its plain wall time (what the accuracy studies compare with), not the
        # profiled total, which holds the profiler's own cost (3-20x a small model's time on a CPU)
        "eager_us": p.model_eager_us,
        "eager_is_wall": p.plain_wall_us is not None,
        "n_measured": int(len(measured)),
        "n_chains": int(len(frame)),
        "confusion": confusion,
        "bounds": BOUNDS,
        "bound_agree": agree,
        "within_30": within,
        "median_ratio": float(ratios.median()) if len(ratios) else float("nan"),
        "flagged": flagged.to_dict("records"),
    }


def _rules_file_view(entry: Any) -> dict[str, str]:
    """A rules-file entry as ``{"path", "version", "extra"}`` whatever keys it has."""
    if not isinstance(entry, dict):
        return {"path": str(entry), "version": "", "extra": ""}
    path = first(entry, ("path", "file", "rules_file", "name")) or ""
    version = first(entry, ("version", "rules_version")) or ""
    extra = "; ".join(f"{k}={scalar_text(v)}" for k, v in flatten(entry)
                      if k not in ("path", "file", "rules_file", "name", "version", "rules_version"))
    return {"path": str(path), "version": str(version), "extra": extra}


# --- JSON ---------------------------------------------------------------------------------------------------


def render_json(analysis: Analysis, generated_at: str) -> str:
    """``analysis.to_dict()`` plus column docs, summary, generation time and tool version, as strict JSON."""
    doc = analysis.to_dict()
    doc["columns"] = {"chains": CHAIN_COLUMNS, "ops": OP_COLUMNS, "summary": SUMMARY_COLUMNS}
    doc["summary"] = summary_rows(analysis)
    doc["generated_at"] = generated_at
    doc["tool_version"] = fusion_advisor.__version__
    # allow_nan=False: any NaN that jsonable() missed fails here rather than writing invalid JSON.
    return json.dumps(jsonable(doc), indent=1, allow_nan=False, ensure_ascii=False) + "\n"


# --- writing ------------------------------------------------------------------------------------------------


def earlier_report(out_dir: Path) -> bool:
    """True when ``out_dir`` holds a report.json written by fusion-advisor."""
    return earlier_model(out_dir) is not None


def earlier_model(out_dir: Path) -> str | None:
    """The model file of the report.json fusion-advisor wrote in ``out_dir`` (``""`` when it names none), or None
    when there is no such report."""
    try:
        doc = json.loads((out_dir / FILE_NAMES["json"]).read_text())
    except (OSError, ValueError, TypeError):
        return None
    return str(doc.get("model_file") or "") if isinstance(doc, dict) and "tool_version" in doc else None


def replaced_note(before: str | None, now: str) -> str:
    """What the folder's earlier report was, as the summary line's tail: ``""`` without one; the model file it
    analysed when another (a relative path is compared by name: it was typed from another folder, perhaps)."""
    if before is None:
        return ""
    if not before:
        return "; it replaces the analysis written there before"
    return ("; it replaces this model's earlier analysis there" if same_model_file(before, now) else
            f"; it replaces the analysis of {before} written there before (another --out keeps both)")


def check_out_dir(out_dir: Path, names: tuple[str, ...] | None = None,
                  written_by_us: Callable[[Path], bool] | None = None) -> None:
    """Refuse an output directory the tool must not write into, before any work is done.

    Args:
        out_dir: the directory files will be written to.
        names: the file names that will be written (default: the report's, :data:`FILE_NAMES`).
        written_by_us: whether existing files of those names come from an earlier fusion-advisor run (one
            answer for the folder); default: asked file by file (:func:`file_is_ours`, via :func:`check_files`).

    Raises:
        UserError: ``out_dir`` is a file; it is not writable; or it already holds a file of one of ``names``
            that fusion-advisor did not write (the tool never overwrites files it did not write).
    """
    if written_by_us is None:
        check_files(Path(out_dir), tuple(names or FILE_NAMES.values()))
        return
    answer: list[bool] = []  # one answer for the folder, asked once and only when a file of ``names`` is there

    def ours(_name: str) -> bool:
        if not answer:
            answer.append(written_by_us(Path(out_dir)))
        return answer[0]

    check_folder(Path(out_dir), tuple(names or FILE_NAMES.values()), ours)


def _marker_in_html(path: Path) -> bool:
    """True when ``path`` is a report.html fusion-advisor wrote (its generator meta tag)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return '<meta name="generator" content="fusion-advisor' in head


def file_is_ours(out_dir: Path, name: str) -> bool:
    """Whether the file ``name`` in ``out_dir`` is one fusion-advisor wrote: report.json carries its
    ``tool_version``; report.html and diff.html their generator tag (report.html: or it sits beside our
    report.json); the CSVs sit beside our report.json (chains.csv, ops.csv), our plan.yaml (variants.csv,
    swaps.csv, and an old apply's swaps.html) or our diff.html (diff.csv); plan.yaml starts with the plan header.
    Used by the guard that never overwrites a file the tool did not write."""
    out_dir = Path(out_dir)
    ours_json = earlier_report(out_dir)
    ours_plan = earlier_plan(out_dir)
    if name == FILE_NAMES["json"]:
        return ours_json
    if name == FILE_NAMES["html"]:
        return _marker_in_html(out_dir / name) or ours_json
    if name in (FILE_NAMES["chains_csv"], FILE_NAMES["ops_csv"]):
        return ours_json
    if name == APPLY_FILE_NAMES["plan"]:
        return ours_plan
    if name == "diff.html":
        return _marker_in_html(out_dir / name)
    if name == "diff.csv":
        return _marker_in_html(out_dir / "diff.html")
    return ours_plan


def earlier_plan(out_dir: Path) -> bool:
    """True when ``out_dir`` holds a plan.yaml written by ``fusion-advisor apply``."""
    try:
        with open(Path(out_dir) / APPLY_FILE_NAMES["plan"], encoding="utf-8", errors="replace") as fh:
            return fh.read(64).startswith("# fusion-advisor plan")
    except OSError:
        return False


def check_files(out_dir: Path, names: tuple[str, ...], flag: str = "--out") -> None:
    """Refuse to write ``names`` into ``out_dir`` where one of them exists and fusion-advisor did not write it
    (:func:`file_is_ours`), or where ``out_dir`` is a file or not writable.

    Raises:
        UserError: naming the folder and the files.
    """
    check_folder(out_dir, names, lambda name: file_is_ours(Path(out_dir), name), flag)


def load_report(out_dir: Path) -> Analysis:
    """The analysis in ``out_dir``/report.json (written by :func:`write_report`).

    Raises:
        UserError: no report.json, one fusion-advisor did not write, or one that does not parse.
    """
    path = Path(out_dir) / FILE_NAMES["json"]
    if not path.is_file():
        raise UserError(f"{out_dir}: no {FILE_NAMES['json']} (a folder written by `fusion-advisor analyze` or "
                        "`apply` holds one)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{path}: cannot be read as JSON ({type(e).__name__}: {e})") from e
    if not isinstance(doc, dict) or "tool_version" not in doc:
        raise UserError(f"{path}: not a report written by fusion-advisor")
    try:
        analysis = Analysis.from_dict(doc)
    except ValueError as e:
        raise UserError(f"{path}: {e} (written by fusion-advisor {doc.get('tool_version')}; analyze again)") from e
    # Inductor's code is kept in files beside the report, not in report.json: read it back for the page
    for cid, rec in list(analysis.inductor_code.items()):
        code = library = ""
        if rec.path:
            try:
                code = (Path(out_dir) / rec.path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                code = f"({rec.path} is no longer in {out_dir})"
        if rec.library_source:
            try:
                library = Path(rec.library_source).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                library = ""
        analysis.inductor_code[cid] = dataclasses.replace(rec, code=code, library_code=library)
    return analysis


def read_plan(out_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """apply's plan document in ``out_dir`` (plan.yaml) for the report, and why it is not shown when it is not
    (:func:`fusion_advisor.report.views.read_plan_document`)."""
    from fusion_advisor.report.views import read_plan_document

    return read_plan_document(Path(out_dir) / APPLY_FILE_NAMES["plan"])


def render_files(analysis: Analysis, out_dir: Path, plan: dict[str, Any] | None = None, plan_note: str = "",
                 keys: tuple[str, ...] = tuple(FILE_NAMES)) -> dict[str, bytes]:
    """The report files ``keys`` (of :data:`FILE_NAMES`) rendered in memory, report.html with ``plan``."""
    generated_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    renderers: dict[str, Callable[[], str]] = {
        "chains_csv": lambda: chains_frame(analysis).to_csv(index=False, lineterminator="\n"),
        "ops_csv": lambda: ops_frame(analysis).to_csv(index=False, lineterminator="\n"),
        "json": lambda: render_json(analysis, generated_at),
        "html": lambda: render_html(analysis, generated_at, plan=plan, out_dir=Path(out_dir), plan_note=plan_note),
    }
    return {key: renderers[key]().encode("utf-8") for key in keys}


def write_report(analysis: Analysis, out_dir: Path) -> dict[str, Path]:
    """Write report.html, chains.csv, ops.csv and report.json into ``out_dir`` (created if missing).

    When ``out_dir`` holds apply's plan.yaml (``fusion-advisor apply`` ran into the same folder), report.html shows
    its variants, swaps, measured whole-model times and plan beside the analysis: one report per model folder.
    All four are rendered in memory first (a rendering error writes nothing), then each is written atomically
    (:func:`atomic_write_bytes`). Returns ``{"html", "chains_csv", "ops_csv", "json"}`` -> path.

    Raises:
        UserError: the folder cannot be made or a file written there (an OSError the permission bits did not
            foretell: ``/proc``, ``/sys``, a full disk).
    """
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a folder the permission bits call writable that is not (/proc, /sys, a full disk)
        raise UserError(f"--out {out_dir}: cannot write the report there: {e.strerror or e}") from e
    plan, note = read_plan(out_dir)
    contents = render_files(analysis, out_dir, plan, note)
    paths: dict[str, Path] = {}
    for key in ("chains_csv", "ops_csv", "json", "html"):
        path = out_dir / FILE_NAMES[key]
        try:
            atomic_write_bytes(path, contents[key])
        except OSError as e:
            raise UserError(f"--out {out_dir}: cannot write {path.name} there: {e.strerror or e}") from e
        paths[key] = path
    return {key: paths[key] for key in FILE_NAMES}
