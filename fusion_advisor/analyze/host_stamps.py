"""The host timeline of plain (unprofiled) runs of the captured graphs, for ``analyze --profile``
(:mod:`fusion_advisor.analyze.profile`): a stamp after every op the graphs dispatch (:class:`HostStamps`,
:func:`insert_stamps`), and the profiled kernels replayed on it (:func:`replay_stamps`): each op's GPU idle time
and the host time issuing it."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, NamedTuple, Sequence

import torch

from fusion_advisor.analyze.records import NodeMeasurement
from fusion_advisor.kernel_tools.bench import sync_device


class HostStamps:
    """Host timestamps of plain (unprofiled) runs of the captured graphs: ``(graph index, position in the graph's
    :func:`aten_schedule` or -1 at the graph's start, time.perf_counter_ns())`` per stamp, in order.

    Each scheduled node of a dynamo graph is followed by a call of :meth:`stamp` (about 0.3 us of host time); it
    records only while :attr:`on` is set, so the profiled runs pay the call and nothing else.
    """

    def __init__(self) -> None:
        self.on = False
        self.items: list[tuple[int, int, int]] = []

    def stamp(self, graph_index: int, position: int) -> None:
        """Record that graph ``graph_index`` just issued its scheduled op ``position`` (-1: started)."""
        if self.on:
            self.items.append((graph_index, position, time.perf_counter_ns()))

    def record(self, fn: Callable[[], Any], runs: int, device: str) -> list[list[tuple[int, int, int]]]:
        """Run ``fn`` ``runs`` times back to back (no synchronisation between runs, as a plain loop would) with
        stamping on; return the stamps of each run (a list per run, in order)."""
        sync_device(device)
        self.items = []
        starts: list[int] = []
        self.on = True
        try:
            for _ in range(runs):
                starts.append(len(self.items))
                fn()
        finally:
            self.on = False
        sync_device(device)
        ends = starts[1:] + [len(self.items)]
        return [self.items[a:b] for a, b in zip(starts, ends, strict=True)]


def insert_stamps(gm: torch.fx.GraphModule, graph_index: int, stamps: HostStamps) -> int:
    """After every node of ``gm`` that :func:`aten_schedule` lists, insert a call ``stamps.stamp(graph_index, j)``
    (``j``: the node's position in the schedule); recompile. Returns the number of stamps inserted."""
    j = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and getattr(getattr(node.target, "_schema", None), "name", None):
            with gm.graph.inserting_after(node):
                gm.graph.call_function(stamps.stamp, (graph_index, j))
            j += 1
    if j:
        gm.recompile()
    return j


class ReplayTimes(NamedTuple):
    """Per-op times (op id -> us per run) of :func:`replay_stamps`: ``idle``, the GPU's wait for the op's issue;
    ``host``, the host time spent issuing it."""

    idle: dict[str, float]
    host: dict[str, float]


def replay_stamps(runs: Sequence[Sequence[tuple[int, int, int]]], schedules: dict[int, list[tuple[str | None, str]]],
                  nodes: dict[str, NodeMeasurement], graph_calls: dict[int, float] | None = None) -> ReplayTimes:
    """GPU idle time and host issue time per op of the plain runs (us per run, the median over the runs): the
    profiled kernels replayed on the plain runs' host timeline.

    Each op's kernels (its profiled busy time, one block) start when the host issued the op (its stamp) or when the
    GPU finished the previous op's kernels, whichever is later (one stream runs kernels in order; the timeline runs
    on from one run into the next, as back-to-back calls do). The host time issuing an op is the time since the
    previous op that launched kernels in the same graph, or the graph's start (views and other kernel-less ops
    between are charged to the op after them, as :func:`fusion_advisor.analyze.roofline.in_model_times` charges
    them). The GPU waited for an op by ``issue - previous end`` when positive, capped by that host time: a longer
    wait was spent outside the graph (Python between graphs or runs) and is nobody's. Kernels outside the graphs'
    ops are not replayed.

    Each op's times are summed within a run (a graph called several times per run adds up), then the median over
    the runs is taken, op by op: one run's pause (a garbage collection, the OS) does not move an op's time. A wait
    an op has in fewer than half the runs is a median of 0, so the sum of the ops' idle times can come out below
    any one run's: the choice is an op's typical time over the run total's.

    Args:
        runs: :meth:`HostStamps.record`'s output: the stamps of each of the back-to-back runs.
        schedules: graph index -> :func:`aten_schedule`.
        nodes: the profiled measurement per op id (busy time and kernel count per run, all calls of its graph).
        graph_calls: graph index -> calls per run (:attr:`Attribution.graph_calls`; 1 when missing): each stamp
            replays one call's share of the op's busy time.
    """
    calls = graph_calls or {}
    busy = {op_id: m.busy_us for op_id, m in nodes.items() if m.kernels > 0}
    idle_runs: list[dict[str, float]] = []
    host_runs: list[dict[str, float]] = []
    gpu_free: float | None = None
    for stamps in runs:
        idle: dict[str, float] = {}
        host: dict[str, float] = {}
        window = 0.0
        for graph_index, position, ns in stamps:
            t = ns / 1000.0
            if position < 0:
                window = t
                continue
            schedule = schedules.get(graph_index, [])
            op_id = schedule[position][0] if position < len(schedule) else None
            if op_id is None or op_id not in busy:
                continue
            host[op_id] = host.get(op_id, 0.0) + t - window
            if gpu_free is not None and t > gpu_free:
                idle[op_id] = idle.get(op_id, 0.0) + min(t - gpu_free, t - window)
            per_call = busy[op_id] / max(calls.get(graph_index, 1.0), 1.0)
            gpu_free = max(t, gpu_free if gpu_free is not None else t) + per_call
            window = t
        idle_runs.append(idle)
        host_runs.append(host)
    return ReplayTimes(_median_per_op(idle_runs), _median_per_op(host_runs))


def _median_per_op(per_run: list[dict[str, float]]) -> dict[str, float]:
    """Op id -> the median over the runs of its value (0 in a run that has none); ops that are 0 in every run are
    left out."""
    ops = {op_id for run in per_run for op_id in run}
    out = {op_id: statistics.median(run.get(op_id, 0.0) for run in per_run) for op_id in ops}
    return {op_id: v for op_id, v in out.items() if v != 0.0}
