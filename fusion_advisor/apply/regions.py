"""Regions: a captured graph cut into contiguous runs of ops by the module that issued them, each run with its own
executor.

A region is a maximal run of consecutive ops of one graph whose module paths agree up to a depth (depth 1: the
model's children, ``layer1``, ``fc``; ops issued by ``forward`` itself form ``<top>`` runs between them). Runs
are contiguous in the graph's order, so cutting at them (``torch.fx.passes.split_module``) gives a chain of
submodules with no cycle between them. A graph is cut at the deepest depth that gives at most
:data:`MAX_REGIONS_PER_GRAPH` regions, so a model made of one ``nn.Sequential`` is cut inside it.

:func:`describe_regions` lists the regions of the captured graphs with the analysis chains in each (how the
analysis routes them, the gain it predicts); :func:`compile_regions` compiles one graph with an executor per
region, adjacent regions of one executor merged into one submodule, each compiled as DDPOptimizer compiles its
buckets (``torch/_dynamo/backends/distributed.py``: fake tensors propagated through the split graph, every
submodule compiled on its inputs' fake values).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.apply.executors import compile_graph, inherit_dynamo_metadata
from fusion_advisor.apply.records import Region, RegionKey
from fusion_advisor.analyze.capture import source_of
from fusion_advisor.analyze.graph import module_path_of
from fusion_advisor.analyze.model_call import kept_from_replay
from fusion_advisor.analyze.records import SourceLoc

#: At most this many regions per graph: the depth is chosen so; more would make the search long and each region
#: small enough that its boundary (no fusion across it) costs more than a different executor buys.
MAX_REGIONS_PER_GRAPH = 16

#: Deepest module-path depth tried.
MAX_DEPTH = 6

_OPS = ("call_function", "call_method", "call_module")


@dataclass
class RegionRun:
    """One region's key and the graph's nodes in it, in order."""

    key: RegionKey
    nodes: list[Node]


def _prefix(path: str, depth: int) -> str:
    return ".".join(path.split(".")[:depth]) if path else ""


def _grad_switch(n: Node) -> bool | None:
    """The grad mode a ``torch._C._set_grad_enabled`` node sets (``torch.no_grad`` blocks in the graph), else
    None."""
    if n.op == "call_function" and n.target is torch._C._set_grad_enabled and n.args:
        return bool(n.args[0])
    return None


def region_runs(gm: torch.fx.GraphModule, depth: int, graph_index: int) -> list[RegionRun]:
    """The regions of ``gm`` at module-path ``depth``, in graph order.

    An op without module information (a grad-mode switch the retrace adds) joins the run before it. A grad-mode
    block (from a switch away from the graph's entry mode to the switch back) is never cut: its ops join the run
    its first switch is in. Cut, the regions ran with another executor each and the mode switched off in one was
    never switched back where the other was compiled (transformers' ``LlamaRotaryEmbedding.forward``, a
    ``torch.no_grad`` function: every later variant of an ``apply --backward`` run then saw no gradient).
    """
    runs: list[RegionRun] = []
    seen: dict[str, int] = {}
    entry_mode: bool | None = None  # the graph's grad mode outside its blocks: the opposite of its first switch
    in_block = False
    for n in gm.graph.nodes:
        if n.op not in _OPS:
            continue
        joins = (in_block or n.meta.get("nn_module_stack") is None) and runs
        mode = _grad_switch(n)
        if mode is not None:
            entry_mode = (not mode) if entry_mode is None else entry_mode
            in_block = mode != entry_mode
        if joins:
            runs[-1].nodes.append(n)
            continue
        prefix = _prefix(module_path_of(n), depth)
        if runs and runs[-1].key.module_path == prefix:
            runs[-1].nodes.append(n)
            continue
        occ = seen.get(prefix, 0)
        seen[prefix] = occ + 1
        runs.append(RegionRun(RegionKey(graph_index, prefix, occ), [n]))
    return runs


def choose_depth(gm: torch.fx.GraphModule, max_regions: int = MAX_REGIONS_PER_GRAPH) -> int:
    """The deepest module-path depth at which ``gm`` has at most ``max_regions`` regions (at least 1)."""
    best, last = 1, -1
    for depth in range(1, MAX_DEPTH + 1):
        count = len(region_runs(gm, depth, 0))
        if count > max_regions:
            break
        if count != last:
            best, last = depth, count
    return best


def describe_regions(graphs: Sequence[tuple[int, torch.fx.GraphModule]], chain_of_node: dict[tuple[int, str], str],
                     analysis: Any) -> list[Region]:
    """The regions of the captured graphs, with the analysis' chains, routes and predicted gains in each. A chain
    whose ops lie in several regions (a GroupNorm, a tanh and a HardSwish of three modules) gives each its share of
    its gain and launches, by its ops there: summed over the regions, every chain counts once.

    Args:
        graphs: ``(graph index, graph)`` pairs (apply's pre-dispatch graphs).
        chain_of_node: ``(graph index, node name) -> chain id`` for the graphs' nodes that lie in a chain.
        analysis: the :class:`~fusion_advisor.analyze.records.Analysis` (chains, estimates, decisions).
    """
    out: list[Region] = []
    runs: list[tuple[int, int, RegionRun]] = []  # (graph index, depth it was cut at, run)
    for gi, gm in graphs:
        depth = choose_depth(gm)
        runs += [(gi, depth, run) for run in region_runs(gm, depth, gi)]
    chain_nodes = Counter(chain_of_node[(gi, n.name)] for gi, _, run in runs for n in run.nodes
                          if (gi, n.name) in chain_of_node)
    for gi, depth, run in runs:
        here = Counter(chain_of_node[(gi, n.name)] for n in run.nodes if (gi, n.name) in chain_of_node)
        ids = list(here)  # first-seen order
        routes: dict[str, int] = {}
        gain = launch = 0.0
        fixed = False
        for cid in ids:
            d = analysis.decisions.get(cid)
            est = analysis.estimates.get(cid)
            share = here[cid] / chain_nodes[cid]
            if d is not None:
                routes[d.route] = routes.get(d.route, 0) + 1
                fixed = fixed or kept_from_replay(d.route, d.fixed)
            if est is not None:
                launch += est.launch_eager_us * share
                if d is not None and d.route in ("torch.compile", "triton", "cudagraphs"):
                    gain += max(est.saving_us, 0.0) * share
        first = run.nodes[0]
        src = source_of(first) if first.meta.get("stack_trace") else SourceLoc()
        out.append(Region(key=run.key, depth=depth, n_ops=len(run.nodes), chain_ids=tuple(ids),
                          routes=tuple(sorted(routes.items())), compile_gain_us=gain, launch_us=launch,
                          source=src, fixed_route=fixed))
    return out


class _Unwrap(torch.nn.Module):
    """A compiled submodule called with the split graph's arguments; returns a bare value where the submodule
    did (compilers want tuple outputs, so the submodule was made to return one)."""

    def __init__(self, fn: Callable[..., Any], single: bool):
        super().__init__()
        self.fn = fn
        self.single = single

    def forward(self, *args: Any) -> Any:
        out = self.fn(*args)
        return out[0] if self.single and isinstance(out, (tuple, list)) else out


def compile_regions(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], graph_index: int, depth: int,
                    overrides: dict[str, str], default: str, inductor_options: dict[str, Any] | None = None,
                    dynamo_gm: torch.fx.GraphModule | None = None) -> tuple[Callable[..., Any], list[str]]:
    """A callable running ``gm`` with ``overrides`` (``str(RegionKey) -> executor``) and ``default`` elsewhere.

    Returns ``(callable, notes)``; ``notes`` name the override keys found nowhere in the graph. Regions of one
    executor that follow each other run as one submodule (Inductor fuses across them).

    Raises:
        Exception: what splitting or a compiler raises (the caller runs the graph otherwise and says why).
    """
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.split_module import split_module

    runs = region_runs(gm, depth, graph_index)
    found = {str(r.key) for r in runs}
    notes = [f"region {k} not found in graph {graph_index} (cut at depth {depth})" for k in overrides
             if RegionKey.parse(k).graph_index == graph_index and k not in found]
    part_of: dict[Node, int] = {}
    executors: list[str] = []
    for run in runs:
        executor = overrides.get(str(run.key), default)
        if not executors or executors[-1] != executor:
            executors.append(executor)
        for n in run.nodes:
            part_of[n] = len(executors) - 1
    if len(executors) <= 1:
        return compile_graph(gm, example_inputs, executors[0] if executors else default, inductor_options), notes

    split = split_module(gm, None, lambda n: part_of.get(n, 0), keep_original_order=True)
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    dyn_ph = [n for n in (dynamo_gm or gm).graph.nodes if n.op == "placeholder"]
    own_ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dynamo_of = dict(zip([n.name for n in own_ph], dyn_ph)) if len(dyn_ph) == len(own_ph) else {}
    fake_mode = detect_fake_mode(list(example_inputs)) or FakeTensorMode(allow_non_fake_inputs=True)

    def fake(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, torch._subclasses.FakeTensor):
            return fake_mode.from_tensor(x, static_shapes=True)
        return x

    outer = split

    class _Compiler(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            sub = self.fetch_attr(str(target))
            index = int(str(target).rsplit("_", 1)[-1])
            with fake_mode:
                out = sub(*args, **kwargs)
            single = not isinstance(out, tuple)
            out_node = next(n for n in sub.graph.nodes if n.op == "output")
            if single:
                out_node.args = ((out_node.args[0],),)
                sub.recompile()
            sub_ph = [n for n in sub.graph.nodes if n.op == "placeholder"]
            inherit_dynamo_metadata(sub, dynamo_gm or gm,
                                    [dynamo_of.get(n.target) if n.target in placeholders else None for n in sub_ph])
            compiled = compile_graph(sub, list(args), executors[index], inductor_options)
            setattr(outer, str(target), _Unwrap(compiled, single))
            return out

    _Compiler(split).run(*[fake(x) for x in example_inputs])
    return split.forward, notes
