"""The host timeline of plain (unprofiled) runs of the captured graphs, for ``analyze --profile``
(:mod:`fusion_advisor.analyze.profile`): a stamp after every op the graphs dispatch (:class:`HostStamps`,
:func:`insert_stamps`), and the profiled kernels replayed on it (:func:`replay_stamps`): each op's GPU idle time
and the host time issuing it."""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

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

    def record(self, fn: Callable[[], Any], runs: int, device: str) -> list[tuple[int, int, int]]:
        """Run ``fn`` ``runs`` times back to back (no synchronisation between runs, as a plain loop would) with
        stamping on; return the stamps."""
        sync_device(device)
        self.items = []
        self.on = True
        try:
            for _ in range(runs):
                fn()
        finally:
            self.on = False
        sync_device(device)
        return self.items


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


def replay_stamps(stamps: list[tuple[int, int, int]], schedules: dict[int, list[tuple[str | None, str]]],
                  nodes: dict[str, NodeMeasurement], runs: int) -> ReplayTimes:
    """GPU idle time and host issue time per op of the plain run, per run (us): the profiled kernels replayed on
    the plain run's host timeline.

    Each op's kernels (its profiled busy time, one block) start when the host issued the op (its stamp) or when the
    GPU finished the previous op's kernels, whichever is later (one stream runs kernels in order). The host time
    issuing an op is the time since the previous op that launched kernels in the same graph, or the graph's start
    (views and other kernel-less ops between are charged to the op after them, as
    :func:`fusion_advisor.analyze.roofline.in_model_times` charges them). The GPU waited for an op by ``issue -
    previous end`` when positive, capped by that host time: a longer wait was spent outside the graph (Python
    between graphs or runs) and is nobody's. Kernels outside the graphs' ops are not replayed.

    Args:
        stamps: :meth:`HostStamps.record`'s output over ``runs`` back-to-back runs.
        schedules: graph index -> :func:`aten_schedule`.
        nodes: the profiled measurement per op id (busy time and kernel count per run).
        runs: runs the stamps cover (the sums are divided by it).
    """
    busy = {op_id: m.busy_us for op_id, m in nodes.items() if m.kernels > 0}
    idle: dict[str, float] = {}
    host: dict[str, float] = {}
    gpu_free: float | None = None
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
        gpu_free = max(t, gpu_free if gpu_free is not None else t) + busy[op_id]
        window = t
    n = max(runs, 1)
    return ReplayTimes({op_id: v / n for op_id, v in idle.items()}, {op_id: v / n for op_id, v in host.items()})
