"""Stage 5b (``analyze --profile``): run the model under ``torch.profiler`` and put a measured time on every chain.

How (one mechanism for CPU and GPU):

1. **Instrument.** The model is captured again exactly as :mod:`fusion_advisor.analyze.capture` captured it (dynamo +
   AOTAutograd, ``dynamic=False``, attention kept opaque), so graph ``i`` node ``n`` is op-graph node
   ``"g<i>:<n>"``. Each run of graph ``i`` is wrapped in one ``torch.profiler.record_function("fa-graph:<i>")``
   range, and nothing else: the graphs run the real aten ops on the real inputs, unfused, at the host speed of the
   plain captured graph (a range per op would cost the host several us per op and show as GPU idle time). Where
   the graph records an op below the one eager code calls (BatchNorm), the node is pointed back at eager's entry
   point (:mod:`fusion_advisor.analyze.eager_entry`), so the profile times the kernels the model runs. A
   ``symbolic_trace`` capture, whose nodes call torch functions with other profiler names, is tagged per op
   instead (``fa:<op id>`` ranges); an ``export`` capture is refused.
2. **Warm up, then profile** ``runs`` calls, each inside a ``record_function("fa-run")``. The trace is exported as
   a chrome trace (the ``--trace`` file, or a temporary one) and read back: its event list is stable across
   torch versions, unlike the profiler's Python objects.
3. **Attribute** (:func:`attribute`). Inside each ``fa-graph:<i>`` range the top-level op events (``aten::mm``)
   are aligned in order with the graph's nodes (:func:`aten_schedule`, :func:`match_schedule`), so each host
   interval has an owner node. GPU: each device activity (kernel, memcpy, memset) is matched to its CUDA runtime
   launch call by correlation id, and the launch to the op event that contains it: the op's **busy** time.
   Its **idle** time (the GPU waiting for the op to be issued) cannot be read off the profiled run: the profiler
   costs the host ~10 us per op, more than a plain op's whole dispatch. So the graphs also run ``REPLAY_RUNS``
   times back to back without the profiler, stamped (``time.perf_counter_ns``, ~0.3 us) after every op, before
   the profiler first runs (after it the process's host is slower), and each op's profiled kernels are replayed
   on that host timeline (:func:`fusion_advisor.analyze.host_stamps.replay_stamps`): they start when the op was
   issued or when the GPU finished the previous op, whichever is later; a wait is charged to the op, capped by
   the host time spent issuing it (time outside the graphs is nobody's); each op's time is the median over the
   runs. In tagged mode (no stamps) the idle time is
   the device gap before each kernel less the profiler's host cost per op, capped by the host time issuing it.
   The same timeline gives each op's **host** time (since the previous op that launched kernels; a chain's is
   chains.csv's ``measured_host_us``), to set against the spec's host prices. Where busy + idle exceeds the
   plain model's wall time (the stamped graphs' host is slower than the module's), every op's idle and host time
   is scaled down to fit it (:func:`idle_scale`).
   CPU: an op's busy time is the duration of its top-level aten op less the profiled duration of an op that does
   no work, and its idle time the plain per-op dispatch cost.

   The profiler's cost is measured by a **probe** in the same process: the host time per tiny op (``torch.add``
   on 1024 elements) plain, and under the profiler (tagged like the ops, in tagged mode); the difference is what
   profiling adds per op.
4. **Per chain** (:func:`measure_chains`): time = sum over its ops; achieved GB/s and TFLOP/s from the op
   graph's eager bytes and FLOPs; % of the roofline bound; a measured bound class — launch-bound when idle time
   exceeds busy time (the roofline's own criterion, :mod:`fusion_advisor.analyze.roofline`, applied to measured times),
   else compute- or memory-bound by which ceiling the busy time comes closer to. The measurement is compared
   with the roofline's **eager** time of the chain inside the model (:func:`fusion_advisor.analyze.roofline.eager_in_model_us`,
   the same replay on predicted times): the profiled model runs unfused.

The profile records the plain model's wall time next to the profiled one; the replay assumes one stream (kernels in
issue order) and leaves out kernels launched outside the graphs' ops (they are reported as unattributed).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

import torch

from fusion_advisor.kernel_tools.bench import sync_device
from fusion_advisor.host import busy_cpu_note
from fusion_advisor.units import fmt_some
from fusion_advisor.analyze.capture import Capture, DynamoBackend, aten_hook
from fusion_advisor.analyze.eager_entry import OP_ID_META, call_eager_entries
from fusion_advisor.analyze.host_stamps import HostStamps, insert_stamps, replay_stamps
from fusion_advisor.devices import DeviceSpec
from fusion_advisor.errors import ProfileError
from fusion_advisor.analyze.load import LoadedModel
from fusion_advisor.analyze.records import (NOT_THE_MODELS_TIMES, Chain, ChainMeasurement, Estimate,
                                            NodeMeasurement, OpInfo, Profile)
from fusion_advisor.analyze.roofline import eager_in_model_us, measured_bound, roofline_busy_us

#: Prefix of the profiler range around each op (``"fa:g0:mm_3"``) and the name of the range around each run.
TAG_PREFIX = "fa:"
RUN_TAG = "fa-run"
#: Range around each run of captured graph ``i`` (``"fa-graph:0"``); its aten ops are matched to the graph's nodes.
GRAPH_TAG_PREFIX = "fa-graph:"
#: Range around each tiny op of the probe that measures the instrumentation's own cost (see :func:`profile_model`).
PROBE_TAG = "fa-probe"
#: Largest ratio of the slowest to the fastest dispatch probe of one profile a GPU profile takes without a note: on
#: the H200, fresh processes on one machine read 7.2-13.6 us per tiny op, bimodal (near 8 or near 12), and
#: 34_VanillaRNNHidden's ops ran at 0.83x the price its probe of 12.45 us set (session 40's check of the shipped
#: profiles, benchmarks/results/h200/accuracy/reprofile/seed1).
PROBE_SPREAD_NOTE = 1.25
#: Share of a CPU profile's total outside every op of the graphs above which a note says what that time is.
CPU_GLUE_NOTE_SHARE = 0.25
#: A CPU profile's attributed op time over the plain model's wall time above which a note says its per-op times are
#: not the model's (a fresh user's busy 2-core machine: 38,832 us attributed for a 284 us model).
CPU_PROFILED_OVER_WALL = 3.0
#: Tiny ops per probe loop.
PROBE_OPS = 300
#: Runs made before profiling (the first compiles the instrumented graphs) and runs profiled.
DEFAULT_WARMUP_RUNS = 3
DEFAULT_RUNS = 3
#: Plain runs stamped for the idle-time replay (at least; ``runs`` when larger).
REPLAY_RUNS = 5
#: A chain whose prediction and measurement differ by more than this factor is flagged in the report.
FLAG_FACTOR = 2.0
#: Chrome-trace categories of device activities (kernels and copies/sets on the GPU).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: Marker key added to trace files we write, so a later run may replace them (and never a user's file).
TRACE_MARKER = "fusionAdvisor"

COMPARED = ("the roofline's eager time in the model (each op its own kernel, the host issuing one op per launch "
            "overhead, ahead of the GPU where it can; roofline.eager_in_model_us), "
            "because the profiled model runs unfused, op by op")


# --- checks ---------------------------------------------------------------------------------------------------


def check_can_profile(device: str, supported: Callable[[], Iterable[Any]] | None = None) -> None:
    """Refuse profiling where it cannot measure anything, before any work is done.

    Args:
        device: the ``--device`` asked for (``"meta"``, ``"cpu"``, ``"cuda"``).
        supported: the profiler's activity list (default ``torch.profiler.supported_activities``; a parameter so
            tests can play a machine where the profiler does not see the GPU).

    Raises:
        ProfileError: ``device`` is meta (nothing runs there), or cuda while the profiler cannot record GPU
            activity (no CUPTI in this torch build or driver).
    """
    if device == "meta":
        raise ProfileError("--profile runs the model and measures it; on --device meta nothing runs. "
                           "Use --device cpu or --device cuda")
    if device not in ("cpu", "cuda"):
        raise ProfileError(f"--profile needs --device cpu or cuda, got {device!r}")
    if device == "cuda" and supported is None and not torch.cuda.is_available():
        raise ProfileError("--profile --device cuda: no CUDA GPU is available here; use --device cpu")
    if device == "cuda":
        acts = list((supported or torch.profiler.supported_activities)())
        if torch.profiler.ProfilerActivity.CUDA not in acts:
            raise ProfileError("--profile --device cuda: torch.profiler cannot see the GPU on this machine (no "
                               "CUPTI in this torch build or driver, or another profiler holds it); profile on "
                               "--device cpu, or install a CUDA build of torch with CUPTI")


def check_trace_path(path: Path) -> None:
    """Refuse a ``--trace`` file we must not write: a folder, a missing folder, or a file fusion-advisor did not write.

    Raises:
        UserError: with the path and the reason.
    """
    from fusion_advisor.files import check_out_file

    check_out_file(path, "--trace", lambda p: None if _written_by_us(p) else
                   "exists and was not written by fusion-advisor; refusing to overwrite it",
                   example="trace.json", writable=True)


def _written_by_us(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        return TRACE_MARKER.encode() in head
    except OSError:
        return False


# --- instrumentation ------------------------------------------------------------------------------------------


def _tagged(target: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """``target`` wrapped in a profiler range named ``tag``."""

    def fa_tagged(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(tag):
            return target(*args, **kwargs)

    return fa_tagged


def tag_graph(gm: torch.fx.GraphModule, graph_index: int, op_ids: set[str]) -> int:
    """Wrap every call_function node of ``gm`` whose id ``"g<graph_index>:<name>"`` is in ``op_ids`` in a profiler
    range ``"fa:<id>"`` (in place, then recompiled). Returns how many nodes were tagged."""
    count = 0
    for node in gm.graph.nodes:
        nid = f"g{graph_index}:{node.name}"
        if node.op == "call_function" and nid in op_ids:
            node.target = _tagged(node.target, TAG_PREFIX + nid)
            count += 1
    if count:
        gm.recompile()
    return count


def aten_schedule(gm: torch.fx.GraphModule, graph_index: int, op_ids: set[str]) -> list[tuple[str | None, str]]:
    """The ops an aten graph dispatches, in execution order, as the profiler names them: one
    ``(op id or None, "aten::mm")`` per call_function node whose target is an operator overload (``None`` for
    a node outside ``op_ids``, e.g. a view: it still dispatches an op that must be matched and passed over).
    Nodes that dispatch nothing (``operator.getitem``) are left out."""
    schedule: list[tuple[str | None, str]] = []
    for node in gm.graph.nodes:
        name = getattr(getattr(node.target, "_schema", None), "name", None) if node.op == "call_function" else None
        if name:
            nid = node.meta.get(OP_ID_META, f"g{graph_index}:{node.name}")
            schedule.append((nid if nid in op_ids else None, name))
    return schedule


@dataclass
class _Instrumented:
    run: Callable[[], Any]
    graphs_seen: Callable[[], int]
    tagged: Callable[[], int]
    #: graph index -> :func:`aten_schedule` of the graphs run inside ``fa-graph:<i>`` ranges (dynamo captures)
    schedules: dict[int, list[tuple[str | None, str]]]
    #: host stamps after each scheduled op (dynamo captures; ``None`` in tagged mode)
    stamps: HostStamps | None = None
    #: nodes pointed back at eager's entry point (:func:`call_eager_entries`), over the graphs compiled so far
    eager_entries: Callable[[], int] = lambda: 0


def _in_graph_range(fn: Callable[..., Any], graph_index: int, stamps: HostStamps) -> Callable[..., Any]:
    tag = f"{GRAPH_TAG_PREFIX}{graph_index}"

    def fa_graph(*args: Any) -> Any:
        with torch.profiler.record_function(tag):
            stamps.stamp(graph_index, -1)
            return fn(*args)

    return fa_graph


def _instrument(loaded: LoadedModel, cap: Capture, op_ids: set[str]) -> _Instrumented:
    """A callable running the model's captured graphs, each inside a ``fa-graph:<i>`` range (dynamo), or with every
    (non-view) op in its own ``fa:<id>`` range (a ``symbolic_trace`` capture, whose nodes call torch functions the
    profiler names differently)."""
    state = {"graphs": 0, "tagged": 0, "eager_entries": 0}
    schedules: dict[int, list[tuple[str | None, str]]] = {}
    stamps = HostStamps()
    if cap.method == "dynamo":
        def fw(gm: torch.fx.GraphModule, example_inputs: list[Any], i: int) -> Any:
            # BatchNorm as the module runs it (cuDNN's), not the graph's native op
            state["eager_entries"] += call_eager_entries(gm, i)
            schedules[i] = aten_schedule(gm, i, op_ids)
            state["tagged"] += sum(1 for op_id, _ in schedules[i] if op_id is not None)
            state["graphs"] += 1
            insert_stamps(gm, i, stamps)
            return _in_graph_range(gm.forward, i, stamps)

        # the backend capture used, recurrent layers in the graph as there: the same graphs
        compiled = DynamoBackend(aten_hook(fw)).compile(loaded.module, recurrent=True)
        return _Instrumented(lambda: compiled(*loaded.inputs), lambda: state["graphs"], lambda: state["tagged"],
                             schedules, stamps, lambda: state["eager_entries"])
    if cap.method == "symbolic_trace":
        gm = cap.graphs[0]
        graph = torch.fx.Graph()
        out = graph.graph_copy(gm.graph, {})
        graph.output(out)
        copy = torch.fx.GraphModule(gm, graph)
        state["tagged"] = tag_graph(copy, 0, op_ids)
        state["graphs"] = 1
        flat, _ = torch.utils._pytree.tree_flatten(loaded.inputs)
        return _Instrumented(lambda: copy(*flat), lambda: state["graphs"], lambda: state["tagged"], schedules)
    why = [w for w in cap.warnings if w.startswith("capture by dynamo")]
    raise ProfileError(f"{loaded.file}: --profile supports models captured by dynamo or symbolic_trace; this one "
                       f"was captured by {cap.method}, whose graph cannot be re-run on the model's inputs"
                       + (f" ({why[0][len('capture by '):]})" if why else ""))


# --- attribution ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attribution:
    """Per-op totals from a trace, per run.

    Attributes:
        nodes: measurement per op id.
        total_us: profiled total per run (see :attr:`fusion_advisor.analyze.records.Profile.total_us`).
        attributed_us: sum of the nodes' time.
        unattributed_us: ``total_us - attributed_us``.
        device_events: device activities (GPU) or top-level aten ops (CPU) seen, per run.
        unattributed_events: of those, how many no op of the graphs claimed, per run.
        unattributed_names: the names of those, most frequent first, with their count per run.
        wall_us: mean duration of the ``fa-run`` ranges (host wall time of one run under the profiler).
        unmatched_ops: scheduled aten ops (per run) that no profiled op event matched (sequence mode).
        graph_calls: graph index -> calls of that graph per run (``fa-graph:<i>`` ranges inside the runs, per run);
            more than 1 where dynamo reuses a graph, e.g. a graph break inside a loop over layers.
    """

    nodes: dict[str, NodeMeasurement]
    total_us: float
    attributed_us: float
    unattributed_us: float
    device_events: float
    unattributed_events: float
    wall_us: float
    unmatched_ops: float = 0.0
    graph_calls: dict[int, float] = field(default_factory=dict)
    unattributed_names: tuple[tuple[str, float], ...] = ()


class _Owned(NamedTuple):
    """A host interval whose device work belongs to ``owner`` (an op id, or ``None``: nobody's).

    ``window_start`` is where the host started issuing this op: the end of the previous op of the same graph range
    (or the range's start); the GPU cannot have waited on this op for longer than ``launch - window_start``."""

    start: float
    end: float
    owner: str | None
    window_start: float
    tagged: bool = False
    name: str = ""


class _Intervals:
    """Non-overlapping intervals of one host thread (tuples starting ``(start, end, ...)``: op events, run ranges,
    :class:`_Owned`), sorted, for lookup by timestamp."""

    def __init__(self, items: list[Any]):
        self.items = sorted(items, key=lambda r: r[0])
        self.starts = [r[0] for r in self.items]

    def find(self, ts: float) -> Any:
        i = bisect.bisect_right(self.starts, ts) - 1
        # intervals never nest, but walk back a little in case of a zero-length neighbour
        for j in range(i, max(i - 3, -1), -1):
            item = self.items[j]
            if item[0] <= ts <= item[1]:
                return item
        return None

    def inside(self, start: float, end: float) -> list[Any]:
        lo = bisect.bisect_left(self.starts, start)
        hi = bisect.bisect_right(self.starts, end)
        return self.items[lo:hi]


def _events(trace: Any) -> list[dict[str, Any]]:
    evs = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [e for e in evs if isinstance(e, dict) and e.get("ph") == "X"]


def _span(e: dict[str, Any]) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def _top_level(ops: _Intervals, start: float, end: float) -> list[tuple[float, float, str]]:
    """The cpu ops (``(start, end, name)``) inside ``[start, end]`` that no other op inside it encloses."""
    out: list[tuple[float, float, str]] = []
    open_end = -math.inf
    for s, e, name in ops.inside(start, end):
        if s >= open_end and e <= end + 1e-3:
            out.append((s, e, name))
            open_end = e
    return out


#: How many profiled op events the sequence matcher looks ahead for the next scheduled op.
MATCH_WINDOW = 8


def match_schedule(schedule: list[tuple[str | None, str]], observed: list[tuple[float, float, str]]
                   ) -> tuple[list[tuple[tuple[float, float, str], str | None]], int]:
    """Align a graph's scheduled ops with the top-level op events of one run of it (both in execution order).

    Greedy: each scheduled op takes the next observed event of the same name within :data:`MATCH_WINDOW` events;
    observed events passed over (ops the dispatcher issued on its own) belong to nobody; a scheduled op with no
    match is counted and skipped. Returns ``([(event, op id or None)], unmatched count)``.
    """
    pairs: list[tuple[tuple[float, float, str], str | None]] = []
    unmatched = 0
    j = 0
    for op_id, name in schedule:
        for k in range(j, min(j + MATCH_WINDOW, len(observed))):
            if observed[k][2] == name:
                pairs.extend((ev, None) for ev in observed[j:k])
                pairs.append((observed[k], op_id))
                j = k + 1
                break
        else:
            unmatched += 1
    pairs.extend((ev, None) for ev in observed[j:])
    return pairs, unmatched


def with_idle(att: Attribution, idle: dict[str, float], host: dict[str, float] | None = None) -> Attribution:
    """``att`` with every op's idle time replaced by ``idle`` (op id -> us per run; missing: 0), and its host issue
    time by ``host`` where given (kept where ``None``), times and totals recomputed (the unattributed part is
    kept)."""
    nodes = {op_id: replace(m, idle_us=idle.get(op_id, 0.0), time_us=m.busy_us + idle.get(op_id, 0.0),
                            host_us=m.host_us if host is None else host.get(op_id, 0.0))
             for op_id, m in att.nodes.items()}
    attributed = sum(m.time_us for m in nodes.values())
    return replace(att, nodes=nodes, attributed_us=attributed, total_us=attributed + att.unattributed_us)


def idle_scale(nodes: dict[str, NodeMeasurement], unattributed_us: float, wall_us: float) -> float:
    """The factor (0..1] that brings the ops' replayed idle time within the plain model's wall time.

    The replay issues the stamped FX graphs, whose host can be slower than the module called as written (a stamp
    after every op, the graph wrappers, a Python frame per graph). Stamped after the profiler had run (until
    session 20) four host-bound level-3 models came to 1.46-1.65x their plain wall time on the H200, most of it
    the profiler's lasting slowdown of the host; stamped before it, the same CNNs need a factor of 0.86-0.98
    (benchmarks/results/h200/accuracy/reprofile/README.md). The plain wall time
    ``wall_us`` bounds what one run spends, kernels and waits together, so where busy + idle + unattributed exceeds
    it the idle time is scaled down until it fits (never below zero); else 1.0. A ``wall_us`` that is not positive
    and finite leaves the idle time as replayed.
    """
    idle = sum(m.idle_us for m in nodes.values())
    total = sum(m.busy_us for m in nodes.values()) + idle + unattributed_us
    if idle <= 0 or not (wall_us > 0 and math.isfinite(wall_us)) or total <= wall_us:
        return 1.0
    return max(wall_us - (total - idle), 0.0) / idle


def scaled_idle(att: Attribution, factor: float) -> Attribution:
    """``att`` with every op's idle and host issue time multiplied by ``factor`` (:func:`idle_scale`: the stamped
    graphs' host is slower than the plain run's by as much), times and totals recomputed."""
    if factor == 1.0:
        return att
    return with_idle(att, {op_id: m.idle_us * factor for op_id, m in att.nodes.items()},
                     {op_id: m.host_us * factor for op_id, m in att.nodes.items()})


def _by_time(times: dict[str, float]) -> tuple[str, ...]:
    return tuple(name for name, _ in sorted(times.items(), key=lambda kv: -kv[1]))


def attribute(trace: Any, device: str, dispatch_us: float = 0.0, host_extra_us: float = 0.0,
              schedules: dict[int, list[tuple[str | None, str]]] | None = None) -> Attribution:
    """Attribute a chrome trace's time to the op graph's ops (see the module docstring, step 3).

    Which op owns a host interval: inside a ``fa-graph:<i>`` range, the top-level op events are aligned with
    ``schedules[i]`` (:func:`match_schedule`); a ``fa:<op id>`` range (tagged mode) belongs to that op.

    Args:
        trace: the parsed chrome-trace JSON (a dict with ``traceEvents``, or the event list).
        device: ``"cuda"``: attribute device kernels; ``"cpu"``: attribute the top-level aten ops.
        dispatch_us: CPU: the host cost of one eager op without profiler (measured by the probe, see
            :func:`profile_model`), counted as each aten op's idle part.
        host_extra_us: GPU: host time per op that profiling adds (profiler bookkeeping, and the tags in tagged
            mode), measured by the probe; subtracted from each device gap before it is charged, so the idle time
            is the one the plain run would show.
        schedules: graph index -> :func:`aten_schedule`, for the ``fa-graph:<i>`` ranges.

    GPU: a kernel is charged its duration (busy) plus the device idle time before it less ``host_extra_us``,
    capped by the host time spent issuing its op (from the end of the previous op of the same range to the launch,
    less ``host_extra_us``): a longer gap was spent elsewhere (Python between graphs, the loop between runs).
    CPU: each owned top-level aten op counts ``busy = max(0, duration - floor)`` and ``idle = dispatch_us``, where
    ``floor`` is the median duration of the top-level aten ops in the trace's ``fa-probe`` ranges (the profiled
    duration of an op that does no work; 0 without a probe).

    Returns:
        An :class:`Attribution`, all numbers per run (divided by the number of ``fa-run`` ranges, at least 1).

    Raises:
        ProfileError: the trace has no ``fa-run`` range, or (GPU) no device activity at all.
    """
    schedules = schedules or {}
    events = _events(trace)
    runs = [e for e in events if e.get("name") == RUN_TAG and e.get("cat") in ("user_annotation", None)]
    if not runs:
        raise ProfileError("the profile holds no run of the model (no 'fa-run' range): the profiler recorded "
                           "nothing; another profiler (nsys, ncu) may hold it")
    n = len(runs)
    wall_us = sum(float(e["dur"]) for e in runs) / n
    run_ranges = _Intervals([(*_span(e), RUN_TAG) for e in runs])

    def in_run(ts: float) -> bool:  # work outside the runs (the probe, set-up) is not the model's
        return run_ranges.find(ts) is not None

    cpu_ops: dict[Any, list[tuple[float, float, str]]] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            cpu_ops.setdefault(e.get("tid"), []).append((*_span(e), str(e.get("name", ""))))
    ops_by_tid = {tid: _Intervals(v) for tid, v in cpu_ops.items()}
    empty = _Intervals([])

    # who owns each host interval, per thread
    owned: dict[Any, list[_Owned]] = {}
    unmatched = 0
    calls: dict[int, float] = {}
    for e in events:
        if e.get("cat") != "user_annotation":
            continue
        name = str(e.get("name", ""))
        start, end = _span(e)
        tid = e.get("tid")
        if name.startswith(GRAPH_TAG_PREFIX):
            index = int(name[len(GRAPH_TAG_PREFIX):]) if name[len(GRAPH_TAG_PREFIX):].isdigit() else -1
            schedule = schedules.get(index, [])
            if in_run(start):
                calls[index] = calls.get(index, 0.0) + 1.0
            pairs, missed = match_schedule(schedule, _top_level(ops_by_tid.get(tid, empty), start, end))
            unmatched += missed
            prev_end = start
            for (s, en, event), op_id in pairs:
                owned.setdefault(tid, []).append(_Owned(s, en, op_id, prev_end, name=event))
                prev_end = en
        elif name.startswith(TAG_PREFIX):
            owned.setdefault(tid, []).append(_Owned(start, end, name[len(TAG_PREFIX):], start, tagged=True))
    owners = {tid: _Intervals(v) for tid, v in owned.items()}

    busy: dict[str, float] = {}
    idle: dict[str, float] = {}
    count: dict[str, float] = {}
    kernel_time: dict[str, dict[str, float]] = {}

    def add(op_id: str, b: float, i: float, k: float) -> None:
        busy[op_id] = busy.get(op_id, 0.0) + b
        idle[op_id] = idle.get(op_id, 0.0) + i
        count[op_id] = count.get(op_id, 0.0) + k

    if device == "cuda":
        launches = {}
        for e in events:
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {}):
                launches[e["args"]["correlation"]] = (float(e["ts"]), e.get("tid"))
        acts = sorted((e for e in events if e.get("cat") in DEVICE_CATEGORIES), key=lambda e: float(e["ts"]))
        if not acts:
            raise ProfileError("the profiler recorded no GPU kernel: it cannot see the GPU here (CUPTI missing or "
                               "held by another profiler such as nsys or ncu)")
        prev_end = None
        total = 0.0
        unclaimed: Counter[str] = Counter()  # the events no op claimed, by name
        n_events = 0
        for e in acts:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            launch = launches.get((e.get("args") or {}).get("correlation"))
            if launch is not None and not in_run(launch[0]):
                continue
            gap = max(ts - prev_end, 0.0) if prev_end is not None else 0.0
            prev_end = max(prev_end or ts + dur, ts + dur)
            n_events += 1
            item = owners[launch[1]].find(launch[0]) if launch and launch[1] in owners else None
            if item is None or item.owner is None:
                unclaimed[str(e.get("name", ""))] += 1
                total += dur
                continue
            # the GPU cannot have waited on this op longer than the host spent issuing it (in the plain run)
            charged = min(max(gap - host_extra_us, 0.0), max(launch[0] - item.window_start - host_extra_us, 0.0))
            add(item.owner, dur, charged, 1.0)
            names, kernel = kernel_time.setdefault(item.owner, {}), str(e.get("name", ""))
            names[kernel] = names.get(kernel, 0.0) + dur
            total += dur + charged
    else:
        probe_durs = [en - st for e in events if e.get("cat") == "user_annotation" and e.get("name") == PROBE_TAG
                      for st, en, _ in _top_level(ops_by_tid.get(e.get("tid"), empty), *_span(e))]
        floor = _median(probe_durs) if probe_durs else 0.0
        unclaimed = Counter()
        n_events = 0
        for tid, items in owned.items():
            for item in items:
                if not in_run(item.start):
                    continue
                # sequence mode: the interval is one top-level aten op; tagged mode: the aten ops inside the range
                inner = (_top_level(ops_by_tid.get(tid, empty), item.start, item.end) if item.tagged
                         else [(item.start, item.end, item.name)])
                if item.owner is None:
                    unclaimed.update(name for _, _, name in inner)
                elif not inner:  # a tagged op that ran no profiled aten op: its own wall time
                    add(item.owner, item.end - item.start, 0.0, 0.0)
                for st, en, _ in inner:
                    n_events += 1
                    if item.owner is not None:
                        add(item.owner, max(en - st - floor, 0.0), dispatch_us, 1.0)
        total = wall_us * n
    nodes = {
        op_id: NodeMeasurement(op_id=op_id, time_us=(busy[op_id] + idle[op_id]) / n, busy_us=busy[op_id] / n,
                               idle_us=idle[op_id] / n, kernels=count.get(op_id, 0.0) / n,
                               kernel_names=_by_time(kernel_time.get(op_id, {})))
        for op_id in busy
    }
    attributed = sum(m.time_us for m in nodes.values())
    total_us = total / n
    return Attribution(nodes=nodes, total_us=total_us, attributed_us=attributed,
                       unattributed_us=max(total_us - attributed, 0.0), device_events=n_events / n,
                       unattributed_events=sum(unclaimed.values()) / n, wall_us=wall_us, unmatched_ops=unmatched / n,
                       graph_calls={i: c / n for i, c in calls.items()},
                       unattributed_names=tuple((name or "?", c / n) for name, c in unclaimed.most_common()))


# --- per chain ------------------------------------------------------------------------------------------------


def _chain_kernels(ms: list[NodeMeasurement]) -> tuple[str, ...]:
    """Distinct kernel names of the ops ``ms``, in op order then each op's longest first."""
    return tuple(dict.fromkeys(name for m in ms for name in m.kernel_names))


def measure_chains(chains: list[Chain], ops: list[OpInfo], estimates: dict[str, Estimate], spec: DeviceSpec,
                   nodes: dict[str, NodeMeasurement], graph_calls: dict[int, float] | None = None
                   ) -> dict[str, ChainMeasurement]:
    """A :class:`ChainMeasurement` per chain from the per-op measurements ``nodes`` (ops without one count 0).

    ``graph_calls`` (graph index -> calls per run, default 1): a graph run ``k`` times per model call (dynamo
    reusing it, e.g. a graph break inside a loop over layers) has its ops measured summed over the ``k`` calls, so
    its chains' in-model prediction (``predicted_us``, one call of the graph), bytes, FLOPs and roofline floor are
    multiplied by ``k`` to compare like with like."""
    by_id = {o.id: o for o in ops}
    predicted = eager_in_model_us(chains, ops, spec)
    out: dict[str, ChainMeasurement] = {}
    for c in chains:
        k = (graph_calls or {}).get(c.graph_index, 1.0)
        k = k if k > 0 else 1.0
        predicted[c.id] *= k
        nbytes, flops = c.eager_bytes * k, c.flops * k
        est = estimates[c.id]
        ms = [nodes[i] for i in c.op_ids if i in nodes]
        busy = sum(m.busy_us for m in ms)
        idle = sum(m.idle_us for m in ms)
        t = busy + idle
        seconds = t * 1e-6
        floor = roofline_busy_us(c, by_id, spec) * k
        ratio = predicted[c.id] / t if t > 0 else math.nan
        out[c.id] = ChainMeasurement(
            chain_id=c.id,
            time_us=t,
            busy_us=busy,
            idle_us=idle,
            kernels=sum(m.kernels for m in ms),
            achieved_gbps=nbytes / seconds / 1e9 if t > 0 else math.nan,
            achieved_tflops=flops / seconds / 1e12 if t > 0 else math.nan,
            pct_of_roofline=100.0 * floor / t if t > 0 else math.nan,
            bound=measured_bound(busy, idle, flops, nbytes, est.peak_tflops, spec.memory_bandwidth_gbps),
            predicted_us=predicted[c.id],
            ratio=ratio,
            flagged=bool(t > 0 and (ratio > FLAG_FACTOR or ratio < 1.0 / FLAG_FACTOR)),
            kernel_names=_chain_kernels(ms),
            host_us=sum(m.host_us for m in ms),
        )
    return out


# --- the stage ------------------------------------------------------------------------------------------------


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    from fusion_advisor.devices.calibrate import cpu_name

    return cpu_name()


def probe_spread_note(probes: list[float]) -> str:
    """A profile note where the dispatch probes of one process (us per tiny op, in the order taken) spread more than
    :data:`PROBE_SPREAD_NOTE` (slowest over fastest), else ``""``: the host's speed moved while the model was timed,
    and the in-model prediction is scaled by their median alone."""
    if not probes or min(probes) <= 0 or max(probes) / min(probes) <= PROBE_SPREAD_NOTE:
        return ""
    return (f"the dispatch probe moved {max(probes) / min(probes):.2f}x within this process "
            f"({', '.join(f'{p:.2f}' for p in probes)} us per tiny op, in the order taken): the host's speed changed "
            f"while the model was timed, and its predictions are scaled by the median, {_median(probes):.2f} us")


def _probe_us(device: str, tagged: bool, ops: int = PROBE_OPS) -> float:
    """Host wall time per tiny op (``torch.add`` on 1024 elements), us, the loop inside one ``fa-probe`` range:
    plain, or with each op wrapped and tagged as a ``symbolic_trace`` capture's ops are (``tagged``). Under the
    profiler this is the profiled per-op cost; the difference to the plain cost is what profiling adds per op."""
    x = torch.ones(1024, device=device)
    fn = _tagged(torch.add, PROBE_TAG + "-op") if tagged else torch.add
    fn(x, 1.0)
    sync_device(device)
    with torch.profiler.record_function(PROBE_TAG):
        start = time.perf_counter()
        for _ in range(ops):
            fn(x, 1.0)
        sync_device(device)
        elapsed = time.perf_counter() - start
    return elapsed / ops * 1e6


def _median(values: Iterable[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2]


#: Loops of back-to-back runs the plain wall time is the median of.
WALL_LOOPS = 3


def _wall_us(fn: Callable[[], Any], device: str, runs: int) -> float:
    """Wall time per call of ``fn`` (us): the median over :data:`WALL_LOOPS` loops of ``runs`` back-to-back calls
    each (a pause in one loop does not move it)."""
    per_loop = []
    for _ in range(WALL_LOOPS):
        sync_device(device)
        start = time.perf_counter()
        for _ in range(runs):
            fn()
        sync_device(device)
        per_loop.append((time.perf_counter() - start) / runs * 1e6)
    return _median(per_loop)


def profile_model(loaded: LoadedModel, cap: Capture, ops: list[OpInfo], chains: list[Chain],
                  estimates: dict[str, Estimate], spec: DeviceSpec, runs: int = DEFAULT_RUNS,
                  warmup_runs: int = DEFAULT_WARMUP_RUNS, trace_path: Path | None = None) -> Profile:
    """Run the model under ``torch.profiler`` and measure every op and chain (module docstring).

    Args:
        loaded: the model on ``cpu`` or ``cuda`` with real inputs.
        cap: its capture (the profile re-captures it the same way, with each op tagged).
        ops, chains, estimates: the op graph's ops, the chains and their roofline estimates.
        spec: device spec (bandwidth and peaks for achieved fractions; launch overhead as CPU dispatch cost).
        runs: profiled runs (times are per run); warmup_runs: runs before profiling.
        trace_path: where to write the chrome trace (``--trace``), or ``None`` for a temporary file.

    Raises:
        ProfileError: meta device, a GPU the profiler cannot see, an ``export`` capture, or an empty profile.
        ModelRunError: the model fails when run.
    """
    device = loaded.device
    check_can_profile(device)
    if trace_path is not None:
        check_trace_path(trace_path)
    op_ids = {o.id for o in ops if not o.is_view}
    notes: list[str] = [n for n in (busy_cpu_note(device),) if n]
    inst = _instrument(loaded, cap, op_ids)
    from fusion_advisor.analyze.capture import quiet_native_stderr, quiet_torch_logs  # the same quieting capture uses

    with torch.no_grad(), warnings.catch_warnings(), quiet_torch_logs():
        warnings.simplefilter("ignore")
        for _ in range(max(warmup_runs, 1)):
            inst.run()
        sync_device(device)
        graphs = inst.graphs_seen()
        if graphs != len(cap.graphs):
            notes.append(f"the instrumented run compiled {graphs} graph(s), the capture {len(cap.graphs)}: "
                         "node names may not match and some ops may stay unmeasured")
        # the dispatch probe beside each plain timing (the wall time here, the stamped replay below): the host's
        # speed drifts between minutes, and the probe scales the prediction to the speed the times were taken at
        probes = [_probe_us(device, tagged=False)]
        eager_wall = _wall_us(lambda: loaded.module(*loaded.inputs), device, max(runs, 1))
        probes += [_probe_us(device, tagged=False) for _ in range(2)]
        # the stamped host timeline before the profiler: once torch.profiler has subscribed to CUPTI the process's
        # host runs 1.3-2x slower for good (benchmarks/results/h200/host/process_state_host.json), and the
        # timeline must be the host the plain wall time and the probes above were taken on
        replay_runs = max(runs, REPLAY_RUNS)
        host = (inst.stamps.record(inst.run, replay_runs, device)
                if inst.stamps is not None and device == "cuda" else [])
        host = host if any(host) else []
        if host:
            probes += [_probe_us(device, tagged=False) for _ in range(2)]
        if inst.graphs_seen() != graphs:
            notes.append("dynamo recompiled during the stamped runs; their host timeline may hold a compile")
            graphs = inst.graphs_seen()
        tagged_mode = not inst.schedules
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # libkineto prints "USDT: ... profiler_start/stop" on the native stderr: held back (quiet_native_stderr)
        with quiet_native_stderr(), torch.profiler.profile(activities=activities) as prof:
            for _ in range(runs):
                with torch.profiler.record_function(RUN_TAG):
                    inst.run()
                sync_device(device)
            instrumented = _median(_probe_us(device, tagged=tagged_mode) for _ in range(3))
        if inst.graphs_seen() != graphs:
            notes.append("dynamo recompiled during the profiled runs; ops of recompiled graphs are unmeasured")
        dispatch = _median(probes)
    torch._dynamo.reset()
    trace = _export_trace(prof, trace_path)
    extra = max(instrumented - dispatch, 0.0)
    att = attribute(trace, device, dispatch_us=dispatch if device == "cpu" else 0.0,
                    host_extra_us=extra if device == "cuda" else 0.0, schedules=inst.schedules)
    if host:
        att = with_idle(att, *replay_stamps(host, inst.schedules, att.nodes, att.graph_calls))
    factor = idle_scale(att.nodes, att.unattributed_us, eager_wall) if device == "cuda" else 1.0
    if factor < 1.0:
        notes.append(f"busy + idle came to {att.total_us:.1f} us per run, more than the plain model's wall time "
                     f"{eager_wall:.1f} us: every op's idle time is scaled by {factor:.3f} to fit within it")
        att = scaled_idle(att, factor)
    measured = set(att.nodes)
    missing = sorted(op_ids - measured)
    if device == "cpu" and missing:
        notes.append(f"{len(missing)} op(s) ran no profiled range (e.g. {', '.join(missing[:3])})")
    if att.unmatched_ops:
        notes.append(f"{att.unmatched_ops:g} op(s) of the graphs per run matched no profiled op event (by name, in "
                     "order): their kernels count as unattributed")
    if att.unattributed_events:
        what = "device kernel(s)" if device == "cuda" else "aten op(s)"
        names = fmt_some([f"{name} x{count:g}" for name, count in att.unattributed_names], 3)
        notes.append(f"{att.unattributed_events:g} {what} per run ran outside any op of the graph (graph-break "
                     f"code, view ops, Python glue: {names}); {att.unattributed_us:.1f} us per run, with the host's "
                     f"time between ops, not attributed to a chain")
    if device == "cpu" and eager_wall > 0 and att.attributed_us > CPU_PROFILED_OVER_WALL * eager_wall:
        notes.append(f"the profiled ops took {att.attributed_us / eager_wall:.0f}x the plain model's wall time "
                     f"({att.attributed_us:.1f} against {eager_wall:.1f} us per run): the profiler's own cost, or a CPU "
                     f"busy with other work; {NOT_THE_MODELS_TIMES} (calibrate --from-profile leaves this report "
                     f"out)")
    if device == "cpu" and att.total_us > 0 and att.unattributed_us > CPU_GLUE_NOTE_SHARE * att.total_us:
        notes.append(f"{att.unattributed_us:.1f} us of the profiled run's {att.total_us:.1f} us "
                     f"({att.unattributed_us / att.total_us:.0%}) ran outside every op of the graphs: on a CPU, "
                     f"dynamo's wrapper, Python glue, eager code between graphs and the profiler's own cost; the "
                     f"plain model takes "
                     f"{eager_wall:.1f} us per run")
    repeated = {i: k for i, k in sorted(att.graph_calls.items()) if k > 1.0}
    if repeated:
        notes.append("graph(s) run several times per model call (dynamo reuses a graph, e.g. after a graph break "
                     "inside a loop): " + ", ".join(f"graph {i} x{k:g}" for i, k in repeated.items())
                     + "; their chains' measured times sum all calls, and est_in_model_us, achieved GB/s, TFLOP/s and % "
                     "of roofline count all calls too, while the other estimate columns count one call")
    if device == "cuda" and (note := probe_spread_note(probes)):
        notes.append(note)
    # the in-model prediction at this host's measured speed (the spec's host costs scaled to the probe)
    host_spec = spec.at_host_speed(dispatch) if device == "cuda" else spec
    chain_ms = measure_chains(chains, ops, estimates, host_spec, att.nodes, att.graph_calls)
    unmeasured = [c.id for c in chains if chain_ms[c.id].time_us <= 0 and c.eager_kernels > 0]
    if unmeasured:
        notes.append(f"{len(unmeasured)} chain(s) launched no measured kernel: {' '.join(unmeasured[:12])}"
                     + (" ..." if len(unmeasured) > 12 else ""))
    how = ("each captured graph in one record_function range, its aten ops matched to the graph's nodes by name "
           "and order" if not tagged_mode else "each aten op of the captured graph in its own record_function range")
    if inst.eager_entries():
        how += f" ({inst.eager_entries()} BatchNorm node(s) run through aten.batch_norm, as eager code calls it)"
    where = (f"busy: CUDA kernels by correlation id; idle: the kernels replayed on the host timeline of "
             f"{replay_runs} plain (unprofiled) runs stamped after every op"
             + (f", scaled by {factor:.3f} to fit the plain wall time" if factor < 1.0 else "") if host else
             "CUDA kernels by correlation id; device gaps less the profiler's host cost per op "
             f"({extra:.2f} us, probe), capped by the host time issuing the op" if device == "cuda" else
             f"top-level aten ops, less the profiled duration of a no-work op, plus the plain dispatch cost "
             f"{dispatch:.2f} us (probe)")
    setup = (f"torch.profiler, {runs} run(s) after {max(warmup_runs, 1)} warm-up run(s), no_grad, {how}; "
             f"attributed: {where}; torch {torch.__version__}")
    return Profile(device=device, device_name=_device_name(device), runs=runs, warmup_runs=max(warmup_runs, 1),
                   total_us=att.total_us, attributed_us=att.attributed_us, unattributed_us=att.unattributed_us,
                   wall_us=att.wall_us, eager_wall_us=eager_wall, setup=setup, compared=COMPARED,
                   trace_file=str(trace_path) if trace_path is not None else "", nodes=att.nodes, chains=chain_ms,
                   notes=notes, dispatch_us=dispatch, dispatch_samples_us=[round(x, 3) for x in probes],
                   instrumented_dispatch_us=instrumented,
                   graph_calls={str(i): float(k) for i, k in sorted(att.graph_calls.items())})


def _export_trace(prof: Any, trace_path: Path | None) -> dict[str, Any]:
    """Export the profile as a chrome trace, read it back, and (with ``trace_path``) write it there atomically
    with a marker key, so a later run may replace it."""
    fd, tmp = tempfile.mkstemp(prefix=".fa-trace.", suffix=".json",
                               dir=str(trace_path.parent) if trace_path is not None else None)
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp) as f:
            trace = json.load(f)
        if trace_path is not None:
            if isinstance(trace, list):
                trace = {"traceEvents": trace}
            marked = {TRACE_MARKER: {"tool": "fusion-advisor analyze --profile", "torch": torch.__version__}, **trace}
            with open(tmp, "w") as f:
                json.dump(marked, f)
            os.chmod(tmp, 0o644)
            os.replace(tmp, trace_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return trace
