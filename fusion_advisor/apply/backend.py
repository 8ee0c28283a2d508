"""The backend apply compiles the model with: dynamo graph -> pre-dispatch aten graph -> matches -> rewrite ->
executor, and the graph conversions it needs.

Why rewrite before AOTAutograd
------------------------------
The model is captured with ``torch.compile`` and this backend. It turns each dynamo graph into a **pre-dispatch
aten graph** (``make_fx(..., pre_dispatch=True)``): aten ops *above* autograd, with grad-mode changes
(``torch.no_grad`` blocks) kept as ``_set_grad_enabled`` nodes. Kernel patterns are matched there and each match
is replaced by a call of the kernel's ``torch.library`` custom op (``fusion_advisor::*``). The rewritten graph
then goes to its executor (eager, Inductor, CUDA graphs; :mod:`fusion_advisor.apply.executors`): every aten op
and every custom op has its autograd formula, so forward *and* backward work, and the custom op's backward is
the kernel's own.

Why not ``torch._inductor.pattern_matcher`` on AOTAutograd's graphs: its ``fwd_only`` patterns only see
inference graphs, and ``joint_fwd_bwd`` patterns must match the *joint* forward+backward graph that the
partitioner and decompositions produce, a graph whose shape changes between torch versions, and in which a
custom op with ``register_autograd`` is already differentiated, not one opaque node. Rewriting before
AOTAutograd gives one mechanism for inference and training, keeps the kernel's backward, and depends only on
``make_fx(pre_dispatch=True)``, ``node.meta["val"]``, ``stack_trace`` and ``nn_module_stack``, all present and
unchanged in torch 2.11 and 2.13. ``meta["from_node"]`` (used to link matches to analysis chains) is newer;
without it the link falls back to module path and source line. The matcher is our own
(:mod:`fusion_advisor.apply.match`), so a failed match can say *where* and *why* it failed (a near-miss).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.apply.canonical import canonicalize
from fusion_advisor.apply.causal_mask import causal_mask_sites, fold_causal_masks
from fusion_advisor.apply.executors import compile_graph, inherit_dynamo_metadata
from fusion_advisor.apply.match import find_matches
from fusion_advisor.apply.patterns import PatternLibrary
from fusion_advisor.apply.records import GraphRecord, MatchKey, RegionKey, SwapSite
from fusion_advisor.apply.regions import choose_depth, compile_regions
from fusion_advisor.apply.rewrite import rewrite
from fusion_advisor.analyze.capture import DynamoBackend, first_line, quiet_torch_logs

Selector = Callable[[SwapSite], bool]


class RewriteBackend(DynamoBackend):
    """The ``torch.compile`` backend of apply: swaps library kernels into every graph dynamo hands it, then runs
    the graph (or each of its regions) with an executor. It is the :class:`DynamoBackend` analyze and profile use,
    with apply's hook, so graph indices and graph breaks mean the same in all three.

    Per graph: dynamo graph -> pre-dispatch aten graph (``make_fx``) -> :func:`canonicalize` ->
    :func:`find_matches` -> :func:`rewrite` of the matches ``select`` accepts -> the executor
    (:mod:`~fusion_advisor.apply.executors`; per region with :mod:`~fusion_advisor.apply.regions`). A graph
    with nothing to rewrite and only the executor to apply skips the retrace and hands dynamo's own graph to the
    executor. Any failure in matching or rewriting is recorded in the graph's :class:`GraphRecord` and the graph
    runs unrewritten; an executor that fails falls back to running the graph's ops as they are, said so: the
    model never breaks because of a swap or a compiler.

    Args:
        kernels: ``{name: KernelEntry}`` to match; default every registered kernel.
        select: which matches to rewrite (default: none, i.e. find only).
        executor: how each graph runs (an :data:`~fusion_advisor.apply.records.EXECUTORS` key).
        inductor_options: Inductor config patches for the Inductor executors.
        regions: ``str(RegionKey) -> executor`` overrides; ``region_depths``: graph index -> cut depth.
        record_values: on the first call of each graph, record the values of every matched input and output
            (:attr:`values`), for verification on the model's real inputs (the graph runs eagerly).
        analyze: also trace the decomposed aten graph the analysis stages read (:attr:`GraphRecord.analysis_graph`).
        keep_graphs: keep a copy of each canonical graph before rewriting.
        match: find matches at all (``False``: a plain executor backend; no retrace where nothing asks for one).
        causal_sdpa: rewrite attention calls given a constant causal mask to ``is_causal=True``
            (:func:`~fusion_advisor.apply.causal_mask.fold_causal_masks`) before anything else.
        count_causal: count such calls (:attr:`GraphRecord.causal_masks`; apply's capture), each mask evaluated
            once.
    """

    def __init__(self, kernels: dict[str, Any] | None = None, select: Selector | None = None,
                 executor: str = "eager", inductor_options: dict[str, Any] | None = None,
                 regions: dict[str, str] | None = None, region_depths: dict[int, int] | None = None,
                 record_values: bool = False, analyze: bool = False, keep_graphs: bool = False,
                 library: PatternLibrary | None = None, match: bool = True, causal_sdpa: bool = False,
                 count_causal: bool = False):
        super().__init__(self._on_graph)
        if library is None and match:
            from kernel_library.registry import load_all

            library = PatternLibrary.for_kernels(kernels if kernels is not None else load_all())
        self.library = library
        self.select = select or (lambda site: False)
        self.executor = executor
        self.inductor_options = dict(inductor_options or {})
        self.regions = dict(regions or {})
        self.region_depths = dict(region_depths or {})
        self.record_values = record_values
        self.analyze = analyze
        self.keep_graphs = keep_graphs
        self.match = match
        self.causal_sdpa = causal_sdpa
        self.count_causal = count_causal
        self.graphs: list[GraphRecord] = []
        self.values: dict[int, dict[str, Any]] = {}  # graph index -> node name -> recorded value
        self._sites = itertools.count()

    def _on_graph(self, gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable[..., Any]:
        """The :class:`DynamoBackend` hook: one dynamo graph matched, rewritten and handed to its executor."""
        record = GraphRecord(index=index)
        self.graphs.append(record)
        record.grad_enabled = torch.is_grad_enabled()
        record.input_requires_grad = [bool(getattr(x, "requires_grad", False)) for x in example_inputs]
        try:
            sites = causal_mask_sites(gm) if self.causal_sdpa or self.count_causal else []
            record.causal_masks = len(sites)
            if self.causal_sdpa and sites:
                record.causal_folded = fold_causal_masks(gm, sites)
        except Exception as e:  # a graph the pass does not understand runs as traced
            record.notes.append(f"causal masks left as traced: {type(e).__name__}: {first_line(str(e))}")
        if not self.match:  # nothing to match or rewrite: dynamo's graph goes to the executor as it is
            return self._execute(gm, gm, example_inputs, record)
        try:
            aten = to_aten_graph(gm, example_inputs)
        except Exception as e:  # not traceable to aten: run dynamo's graph as it is
            record.error = f"tracing to aten failed: {type(e).__name__}: {first_line(str(e))}"
            return self._execute(gm, gm, example_inputs, record)
        try:
            canonicalize(aten)
            if self.keep_graphs:
                record.graph = copy_graph_module(aten)
            if self.analyze:
                try:
                    record.analysis_graph = to_analysis_graph(aten, example_inputs)
                except Exception as e:  # the analysis loses this graph's chains; matching goes on
                    record.error = f"decomposing for the analysis failed: {type(e).__name__}: {first_line(str(e))}"
            matches, near = find_matches(aten, self.library, index, self._sites)
            record.matches, record.near_misses = matches, near
            if self.record_values:
                return self._recording_runner(aten, record, index)
            selected = [m for m in matches if self.select(m.site)]
            runnable = aten
            if selected:
                # rewrite a copy, so that a failure half-way leaves ``aten`` intact to run unrewritten
                runnable = copy_graph_module(aten)
                again, _ = find_matches(runnable, self.library, index, itertools.count())
                keys = {m.site.key for m in selected}
                applied, skipped = rewrite(runnable, [m for m in again if m.site.key in keys],
                                           record.input_requires_grad, record.grad_enabled)
                record.applied = [m.site.key for m in applied]
                record.skipped = [(m.site.key, why) for m, why in skipped]
        except Exception as e:  # a bug or an unexpected graph: record it, run the canonical graph unrewritten
            record.error = f"{type(e).__name__}: {first_line(str(e))}"
            record.applied = []
            runnable = aten
        inherit_dynamo_metadata(runnable, gm)
        return self._execute(runnable, gm, example_inputs, record)

    def _execute(self, runnable: torch.fx.GraphModule, dynamo_gm: torch.fx.GraphModule, example_inputs: list[Any],
                 record: GraphRecord) -> Callable[..., Any]:
        """``runnable`` compiled with the executor (per region where overrides name this graph); on failure its
        ops run as they are and ``record.executor_error`` says why."""
        overrides = {k: e for k, e in self.regions.items() if RegionKey.parse(k).graph_index == record.index}
        record.executor = self.executor
        try:
            if overrides:
                depth = self.region_depths.get(record.index) or choose_depth(runnable)
                fn, notes = compile_regions(runnable, example_inputs, record.index, depth, overrides, self.executor,
                                            self.inductor_options, dynamo_gm)
                record.notes += notes
                record.regions = dict(sorted(overrides.items()))
                return fn
            return compile_graph(runnable, example_inputs, self.executor, self.inductor_options)
        except Exception as e:  # the compiler failed on this graph: run its ops as they are and say so
            what = f"{self.executor}{' with region overrides' if overrides else ''}"
            record.executor_error = f"{what} failed ({type(e).__name__}: {first_line(str(e))}); the graph ran eagerly"
            return runnable.forward

    def _recording_runner(self, aten: torch.fx.GraphModule, record: GraphRecord, index: int) -> Callable[..., Any]:
        wanted: set[str] = set()
        for m in record.matches:
            wanted.update(n.name for n in m.binds)
            wanted.update(n.name for n in m.out_nodes)
        store = self.values.setdefault(index, {})
        backend = self

        class _Recorder(torch.fx.Interpreter):
            def run_node(self, n: Node) -> Any:
                out = super().run_node(n)
                if n.name in wanted and n.name not in store:
                    store[n.name] = torch.utils._pytree.tree_map(
                        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)
                return out

        def run(*args: Any) -> Any:
            if backend.record_values and len(store) < len(wanted):
                return _Recorder(aten).run(*args)
            return aten(*args)

        return run

    def release_values(self) -> None:
        """Drop the recorded values (:attr:`values`: every matched site's inputs and outputs, as large as the
        model's activations) and record no more."""
        for store in self.values.values():
            store.clear()
        self.values.clear()
        self.record_values = False

    # summaries
    def sites(self) -> list[SwapSite]:
        return [m.site for g in self.graphs for m in g.matches]

    def applied(self) -> list[MatchKey]:
        return [k for g in self.graphs for k in g.applied]


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with its own graph (node meta copied), sharing ``gm``'s attributes."""
    new_graph = torch.fx.Graph()
    out_value = new_graph.graph_copy(gm.graph, {})
    new_graph.output(out_value)
    return torch.fx.GraphModule(gm, new_graph)


def to_aten_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
    """A dynamo graph traced to a pre-dispatch aten graph on fake copies of ``example_inputs``.

    Node meta (``stack_trace``, ``nn_module_stack``) is carried over; ``meta["val"]`` holds fake tensors.
    """
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with torch.fx.traceback.preserve_node_meta(), quiet_torch_logs():
        fake = [fake_mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor)
                and not isinstance(x, torch._subclasses.FakeTensor) else x for x in example_inputs]
        with fake_mode:
            return make_fx(torch.fx.Interpreter(gm).run, pre_dispatch=True)(*fake)


def to_analysis_graph(aten: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
    """The pre-dispatch graph decomposed to the aten ops the analysis stages know (``linear`` -> ``mm``, ...).

    Each node's ``meta["from_node"]`` names the pre-dispatch node it came from (torch >= 2.6), which links the
    analysis chains to the matches.
    """
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with torch.fx.traceback.preserve_node_meta(), quiet_torch_logs():
        fake = [fake_mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor)
                and not isinstance(x, torch._subclasses.FakeTensor) else x for x in example_inputs]
        with fake_mode, torch.no_grad():
            return make_fx(torch.fx.Interpreter(aten).run)(*fake)


def origin_of(node: Node) -> str:
    """Name of the pre-dispatch node an analysis-graph node came from (``meta["from_node"]``), or ``""``."""
    src = node.meta.get("from_node")
    if not src:
        return ""
    first = src[0]
    return getattr(first, "name", "") or ""


