"""The records the apply passes hand each other, in one place.

Matching and rewriting: :class:`MatchKey`, :class:`SwapSite`, :class:`NearMiss`, :class:`GraphRecord`.
Per swap: :class:`SwapVerification`, :class:`SwapTiming`, :class:`SwapOutcome` (decisions :data:`KEPT` ...).
Whole-model variants: :class:`PlannedSwap`, :class:`RegionKey`, :class:`Region`, :class:`VariantSpec`,
:class:`VariantCheck`, :class:`VariantTiming`, :class:`VariantOutcome`. The run: :class:`ApplyOptions`,
:class:`ApplyResult`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from fusion_advisor.analyze.records import GraphBreak, SourceLoc, TensorMeta

#: Candidate policies: ``routed`` tries a kernel only where the analysis routes the chain to it; ``all`` tries
#: every match (the measurement decides).
CANDIDATE_POLICIES = ("routed", "all")

# per-swap decisions
KEPT = "kept"
#: Beat the model's own ops run eagerly, not torch.compile's code for them: a candidate only where the rest of the
#: graph runs eagerly (there the alternative to the swap is the eager op, not Inductor's fused code).
KEPT_EAGER_REST = "kept for an eager rest"
REJECTED = "rejected"
NOT_KEPT = "not kept"
NOT_TRIED = "not tried"
NOT_VERIFIED = "not verified"

TIMER_GPU = "do_bench median (cuda)"
TIMER_CPU = "cpu wall-clock median (not a GPU measurement)"
TIMER_NONE = "not measured"
NOT_MEASURED_NOTE = "not measured: no GPU (Triton runs in its CPU interpreter, whose speed says nothing about a GPU)"


# --- matching and rewriting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatchKey:
    """What identifies a swap site across captures (recompiles, a later :func:`fusion_advisor.load_plan`).

    Attributes:
        kernel: library kernel name.
        module_path: dotted path of the nn.Module that issued the pattern's last op (``layers.0.input_layernorm``).
        source: ``file name:line`` of that op.
        occurrence: index among the graph's matches of this kernel with the same module path and source.
    """

    kernel: str
    module_path: str
    source: str
    occurrence: int = 0

    def __str__(self) -> str:
        return f"{self.kernel}@{self.module_path or '<top>'}:{self.source}#{self.occurrence}"

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "module_path": self.module_path, "source": self.source,
                "occurrence": self.occurrence}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MatchKey":
        return cls(str(d["kernel"]), str(d.get("module_path", "")), str(d.get("source", "")),
                   int(d.get("occurrence", 0)))


@dataclass(frozen=True)
class SwapSite:
    """One match of a kernel's pattern in a captured graph: a candidate swap.

    Attributes:
        id: ``"s<index>"`` in the order found.
        kernel: library kernel name; ``pattern``: the chain pattern it replaces.
        graph_index: captured graph the match lives in.
        key: :class:`MatchKey` (how the plan finds the site again).
        op_ids: ids ``"g<graph>:<node>"`` of the matched ops in apply's pre-dispatch graphs.
        chain_ids: analysis chains that hold those ops (the ids of ``fusion-advisor analyze``), most ops first.
        source: where the site's chain starts in the analysis (its first op that launches a kernel, as in
            chains.csv); the pattern's last op when no chain is linked. ``module_path``: the pattern's last op's.
        inputs: ``(parameter name, TensorMeta)`` of the pattern's tensor arguments.
        scalars: the pattern's scalar parameters as captured from the model's constants (``{"eps": 1e-6}``).
        outputs: metas of the replaced values.
        n_ops: ops replaced.
        route, route_kernel, route_rule: the analysis decision of the chain (the first chain routed to a kernel).
        candidate: whether the swap is tried (verified and benchmarked) under the candidate policy.
        candidate_reason: why or why not.
    """

    id: str
    kernel: str
    pattern: str
    graph_index: int
    key: MatchKey
    op_ids: tuple[str, ...]
    chain_ids: tuple[str, ...]
    source: SourceLoc
    module_path: str
    inputs: tuple[tuple[str, TensorMeta], ...]
    scalars: dict[str, float]
    outputs: tuple[TensorMeta, ...]
    n_ops: int
    route: str = ""
    route_kernel: str = ""
    route_rule: str = ""
    candidate: bool = False
    candidate_reason: str = ""

    @property
    def signature(self) -> str:
        """Kernel plus input shapes/dtypes and scalars: sites with equal signatures time the same."""
        ins = ",".join(f"{m.dtype}{list(m.shape)}" for _, m in self.inputs)
        sc = ",".join(f"{k}={v:g}" for k, v in sorted(self.scalars.items()))
        return f"{self.kernel}({ins}{';' + sc if sc else ''})"


@dataclass(frozen=True)
class NearMiss:
    """A place that almost matched a kernel's pattern, with the reason it did not.

    Attributes:
        kernel: the kernel whose pattern nearly matched; ``pattern``: its chain pattern.
        graph_index: captured graph.
        op_ids: ops that did match (or the chain's ops for a chain-level near-miss).
        chain_ids: analysis chains holding them.
        source, module_path: of the op where matching started.
        reason: why it is not a match.
        kind: ``"structure"`` (ops or edges differ), ``"constant"`` (a constant differs or is computed at run
            time), ``"check"`` (dtype, row width, device or the kernel's extra_check), ``"chain"`` (the analysis
            found a chain of this pattern that nothing matched).
    """

    kernel: str
    pattern: str
    graph_index: int
    op_ids: tuple[str, ...]
    chain_ids: tuple[str, ...]
    source: SourceLoc
    module_path: str
    reason: str
    kind: str


@dataclass
class GraphRecord:
    """What :class:`RewriteBackend` saw and did for one dynamo graph.

    Attributes:
        index: order in which dynamo handed the graph over.
        graph: the canonicalised pre-dispatch aten graph *before* rewriting (kept only when ``keep_graphs``).
        sites: matches, with their runtime data (node maps) in :attr:`matches`.
        near_misses: near-misses found in this graph.
        applied: keys of the swaps rewritten into the graph that runs.
        skipped: ``(key, reason)`` of selected swaps that could not be rewritten.
        error: an exception that stopped matching or rewriting (the graph then runs unrewritten).
        analysis_graph: the decomposed aten graph the analysis stages read (only when ``analyze``).
        input_requires_grad, grad_enabled: the graph's inputs' ``requires_grad`` and the grad mode it was
            captured under.
        executor: how the graph runs; ``executor_error``: why it ran eagerly instead.
        regions: region overrides applied in this graph; ``notes``: overrides not found, and similar.
        causal_masks: attention calls whose mask is a constant causal mask (counted at capture;
            :mod:`fusion_advisor.apply.causal_mask`); ``causal_folded``: those rewritten to ``is_causal=True``.
    """

    index: int
    graph: torch.fx.GraphModule | None = None
    matches: list[Any] = field(default_factory=list)  # match.Match: the runtime data of each site
    near_misses: list[NearMiss] = field(default_factory=list)
    applied: list[MatchKey] = field(default_factory=list)
    skipped: list[tuple[MatchKey, str]] = field(default_factory=list)
    error: str = ""
    analysis_graph: torch.fx.GraphModule | None = None
    input_requires_grad: list[bool] = field(default_factory=list)
    grad_enabled: bool = True
    executor: str = ""
    executor_error: str = ""
    regions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    causal_masks: int = 0
    causal_folded: int = 0




# --- per swap -----------------------------------------------------------------------------------------------


@dataclass
class SwapVerification:
    """Outcome of :func:`verify_swap`.

    Attributes:
        verified: every case passed every check.
        reason: the first failure, one line (``""`` when verified).
        cases: cases run, in order (stops at the first failure).
        max_abs_err, max_rel_err: largest forward differences from the float64 reference over the cases
            (from the original ops where no float64 reference runs); ``None`` if nothing ran.
        grad_max_abs_err, grad_max_rel_err: the same for input gradients (``None`` unchecked).
        backward_checked: gradients were compared.
        reference: ``"float64"``, ``"float64 inputs; the pattern casts to float32"`` or ``"original ops"``.
        details: one line per check.
    """

    verified: bool
    reason: str = ""
    cases: list[str] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    grad_max_abs_err: float | None = None
    grad_max_rel_err: float | None = None
    backward_checked: bool = False
    reference: str = ""
    details: list[str] = field(default_factory=list)


@dataclass
class SwapTiming:
    """Outcome of :func:`bench_swap`; times in ms (median of one call), ``None`` when not measured.

    Attributes:
        timer: :data:`TIMER_GPU` or :data:`TIMER_NONE`.
        eager_ms, compile_ms, kernel_ms: original ops eagerly, under torch.compile, and the kernel: wall time of
            one call (do_bench median, host overhead included).
        eager_gpu_ms, compile_gpu_ms, kernel_gpu_ms: the same three as device time: summed GPU kernel time of one
            call (:func:`~fusion_advisor.kernel_tools.bench.device_time_ms`), what the swap changes inside a model whose host
            runs ahead of the GPU.
        compile_time_ms: torch.compile's first call (tracing + compiling), apart from ``compile_ms``.
        what: ``"forward"`` or ``"forward+backward"``.
        note: why something was not measured.
        steady_state_recompiles: Triton JIT compilations and torch.compile frame compilations during each timed
            run (``"eager"``, ``"kernel"``, ``"compile"``), after a warm-up call: should be 0
            (:func:`fusion_advisor.kernel_tools.recompile.summarize`); ``None`` when not measured.
    """

    timer: str
    eager_ms: float | None = None
    compile_ms: float | None = None
    kernel_ms: float | None = None
    compile_time_ms: float | None = None
    eager_gpu_ms: float | None = None
    compile_gpu_ms: float | None = None
    kernel_gpu_ms: float | None = None
    what: str = "forward"
    note: str = ""
    steady_state_recompiles: dict[str, Any] | None = None

    @property
    def best_baseline_ms(self) -> float | None:
        vals = [v for v in (self.eager_ms, self.compile_ms) if v is not None]
        return min(vals) if vals else None

    def decisive(self) -> tuple[str, float | None, float | None, float | None]:
        """``(metric, kernel, eager, compile)``: device times when the kernel's and a baseline's were measured,
        else wall times. A chain of a few microseconds timed alone is host-bound (the timing loop waits on Python
        and the launch path); inside a model the host runs ahead and the swap changes GPU time, so device time
        decides. The whole patched model is then timed by wall clock, which has the last word."""
        if self.kernel_gpu_ms is not None and (self.eager_gpu_ms is not None or self.compile_gpu_ms is not None):
            return "device time", self.kernel_gpu_ms, self.eager_gpu_ms, self.compile_gpu_ms
        return "wall time", self.kernel_ms, self.eager_ms, self.compile_ms


@dataclass
class SwapOutcome:
    """Everything decided about one swap site (joined with its :class:`~fusion_advisor.apply.SwapSite`)."""

    site_id: str
    decision: str
    reason: str
    verification: SwapVerification | None = None
    timing: SwapTiming | None = None

    @property
    def kept(self) -> bool:
        """A candidate for the whole-model variants: :data:`KEPT` or :data:`KEPT_EAGER_REST`."""
        return self.decision in (KEPT, KEPT_EAGER_REST)

    @property
    def kept_with_inductor(self) -> bool:
        """A candidate also where the rest of the graph is compiled by Inductor (beat torch.compile too)."""
        return self.decision == KEPT


# --- whole-model variants -----------------------------------------------------------------------------------

#: How the ops of a captured graph, or of one region of it, run.
EXECUTORS: dict[str, str] = {
    "eager": "the captured ops run as PyTorch runs them (cuBLAS, cuDNN, aten kernels), one launch each",
    "inductor": "Inductor compiles them (fused Triton kernels on a GPU, C++ on a CPU)",
    "eager+cudagraphs": "the ops as PyTorch runs them, captured once in a CUDA graph and replayed "
                        "(torch.compile backend='cudagraphs': AOTAutograd + cudagraph trees)",
    "inductor+cudagraphs": "Inductor's code captured in a CUDA graph and replayed (cudagraph trees, as "
                           "mode='reduce-overhead')",
}
#: The model called as written: no capture, no compilation.
AS_WRITTEN = "as-written"


def uses_cudagraphs(executor: str) -> bool:
    """Whether ``executor`` (an :data:`EXECUTORS` key) replays CUDA graphs."""
    return executor.endswith("+cudagraphs")


def with_cudagraphs(executor: str, on: bool) -> str:
    """``executor`` with CUDA graphs switched on or off (``"inductor"`` <-> ``"inductor+cudagraphs"``)."""
    base = executor.removesuffix("+cudagraphs")
    return f"{base}+cudagraphs" if on and base in ("eager", "inductor") else base


@dataclass(frozen=True)
class PlannedSwap:
    """A kept swap as a variant (and the plan) records it: what the backend needs to find and rewrite the site."""

    key: MatchKey
    signature: str = ""
    swap_id: str = ""


@dataclass(frozen=True)
class RegionKey:
    """What identifies a region across captures: graph, module path, and its occurrence among that graph's
    regions of the same module path (a module called twice gives two regions).

    ``str(key)`` is ``g<graph>:<module path or <top>>#<occurrence>``, the form plan.yaml stores.
    """

    graph_index: int
    module_path: str
    occurrence: int = 0

    def __str__(self) -> str:
        return f"g{self.graph_index}:{self.module_path or '<top>'}#{self.occurrence}"

    @classmethod
    def parse(cls, text: str) -> "RegionKey":
        """The key of ``str(key)``.

        Raises:
            ValueError: ``text`` is not of the form ``g<int>:<path>#<int>``.
        """
        head, sep, rest = text.partition(":")
        path, sep2, occ = rest.rpartition("#")
        if not (sep and sep2 and head.startswith("g") and head[1:].isdigit() and occ.isdigit()):
            raise ValueError(f"not a region key (g<graph>:<module path>#<occurrence>): {text!r}")
        return cls(int(head[1:]), "" if path == "<top>" else path, int(occ))


@dataclass(frozen=True)
class Region:
    """A contiguous run of one captured graph's ops issued by one module: the unit a variant may run with its own
    executor (:mod:`fusion_advisor.apply.regions`).

    Attributes:
        key: :class:`RegionKey`.
        depth: the module-path depth the graph was cut at (1: the model's children).
        n_ops: ops of the captured (dynamo) graph in the region.
        chain_ids: analysis chains whose ops lie in it.
        routes: ``(route, chains)`` pairs: how the analysis routes the region's chains.
        compile_gain_us: predicted device time fusion saves in the region, us (its chains' eager - fused estimates
            for chains routed to torch.compile or a library kernel; a chain of several regions gives each the share
            of its ops there).
        launch_us: predicted launch overhead of the region's eager kernels, us (what CUDA graphs remove; shared
            the same way).
        source: where its first op comes from.
        fixed_route: a chain in it keeps a route other than CUDA graphs that a rule fixed
            (:attr:`fusion_advisor.analyze.records.Decision.fixed`: a rule of the user's own, a measured bound
            class): the routes variant never replays the region with its graph's CUDA-graph regions.
    """

    key: RegionKey
    depth: int
    n_ops: int
    chain_ids: tuple[str, ...] = ()
    routes: tuple[tuple[str, int], ...] = ()
    compile_gain_us: float = 0.0
    launch_us: float = 0.0
    source: SourceLoc = field(default_factory=SourceLoc)
    fixed_route: bool = False

    @property
    def routed_executor(self) -> str:
        """The executor the analysis' routes ask for: ``inductor`` when a chain is routed to torch.compile, a
        library kernel (whose rest Inductor fuses) or CUDA graphs (Inductor fuses inside the graph), else
        ``eager``; with CUDA graphs when a chain is routed there."""
        routes = dict(self.routes)
        base = "inductor" if any(routes.get(r) for r in ("torch.compile", "triton", "cudagraphs")) else "eager"
        return with_cudagraphs(base, bool(routes.get("cudagraphs")))


@dataclass(frozen=True)
class VariantSpec:
    """One way of running the whole model: what ``apply`` verifies and times, and what the plan rebuilds.

    Attributes:
        name: short unique name (``torch.compile``, ``swaps+inductor+cudagraphs``, ...).
        rest: :data:`AS_WRITTEN` (the model called directly) or an :data:`EXECUTORS` key: how every graph (and
            region without an override) runs.
        inductor_options: Inductor config patches (``("max_autotune", True)``, ``("freezing", True)``).
        cudnn_benchmark: run the model with ``torch.backends.cudnn.benchmark`` on (cuDNN times its convolution
            algorithms on the first call of each shape and keeps the fastest).
        channels_last: forward only: run a copy of the model whose 4-D / 5-D weights are in channels-last memory
            format (NHWC / NDHWC), 4-D / 5-D float inputs converted to it on entry and outputs returned contiguous
            (:mod:`fusion_advisor.apply.variants`): cuDNN's tensor-core convolutions read NHWC without transposes.
        graphed: forward only, with the model as written (``rest`` :data:`AS_WRITTEN`, no swaps or regions): the
            whole model captured in one CUDA graph with ``torch.cuda.graph`` and replayed
            (:class:`fusion_advisor.apply.variants.WholeModelGraph`), for models dynamo's backends cannot graph.
        swaps: library kernels swapped in.
        regions: ``(str(RegionKey), executor)`` overrides.
        region_depths: ``(graph index, depth)``: where each graph with overrides is cut into regions.
        causal_sdpa: attention calls given a constant causal mask by the trace run with ``is_causal=True`` and no
            mask instead (:mod:`fusion_advisor.apply.causal_mask`), as the model as written runs them.
        why: why it is a candidate (the analysis' reason, or "baseline").
    """

    name: str
    rest: str = AS_WRITTEN
    inductor_options: tuple[tuple[str, Any], ...] = ()
    cudnn_benchmark: bool = False
    channels_last: bool = False
    graphed: bool = False
    swaps: tuple[PlannedSwap, ...] = ()
    regions: tuple[tuple[str, str], ...] = ()
    region_depths: tuple[tuple[int, int], ...] = ()
    causal_sdpa: bool = False
    why: str = ""

    @property
    def stock(self) -> bool:
        """Built with ``torch.compile`` exactly as a user would write it (no swaps, no regions, no graph pass)."""
        return not self.swaps and not self.regions and not self.causal_sdpa

    @property
    def cudagraphs(self) -> bool:
        return self.graphed or uses_cudagraphs(self.rest) or any(uses_cudagraphs(e) for _, e in self.regions)

    def describe(self) -> str:
        """The variant in words, as code where it is stock code."""
        parts = []
        opts = dict(self.inductor_options)
        if self.rest == AS_WRITTEN and self.graphed:
            parts.append("the model as written, captured whole in one CUDA graph (torch.cuda.graph) and replayed: "
                         "inputs copied into the graph's buffers, outputs cloned")
        elif self.rest == AS_WRITTEN:
            parts.append("the model as written")
        elif self.stock:
            parts.append(_stock_call(self.rest, opts))
        else:
            parts.append(f"each graph: {self.rest}")
            if opts:
                parts.append("Inductor options " + ", ".join(f"{k}={v}" for k, v in opts.items()))
        if self.swaps:
            kernels = sorted({s.key.kernel for s in self.swaps})
            parts.append(f"{len(self.swaps)} library swap(s) ({', '.join(kernels)})")
        if self.regions:
            parts.append("regions " + ", ".join(f"{k} -> {e}" for k, e in self.regions))
        if self.causal_sdpa:
            parts.append("attention given a constant causal mask by the trace runs with is_causal=True")
        if self.cudnn_benchmark:
            parts.append("torch.backends.cudnn.benchmark = True")
        if self.channels_last:
            parts.append("weights and inputs in channels-last memory format (a copy of the weights)")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rest": self.rest, "inductor_options": dict(self.inductor_options),
                "cudnn_benchmark": self.cudnn_benchmark, "channels_last": self.channels_last, "graphed": self.graphed,
                "swaps": [{"key": s.key.to_dict(), "signature": s.signature, "id": s.swap_id} for s in self.swaps],
                "regions": {k: e for k, e in self.regions},
                "region_depths": {g: d for g, d in self.region_depths}, "causal_sdpa": self.causal_sdpa,
                "why": self.why,
                "describe": self.describe()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VariantSpec":
        """The spec of :meth:`to_dict`'s output.

        Raises:
            ValueError: an unknown executor, a malformed swap or region key.
        """
        rest = str(d.get("rest", AS_WRITTEN))
        regions = tuple((str(RegionKey.parse(str(k))), str(e)) for k, e in (d.get("regions") or {}).items())
        for executor in [rest] + [e for _, e in regions]:
            if executor != AS_WRITTEN and executor not in EXECUTORS:
                raise ValueError(f"unknown executor {executor!r}; known: {AS_WRITTEN}, {', '.join(EXECUTORS)}")
        swaps = tuple(PlannedSwap(MatchKey.from_dict(s["key"]), str(s.get("signature", "")), str(s.get("id", "")))
                      for s in (d.get("swaps") or []))
        return cls(name=str(d.get("name", "")), rest=rest,
                   inductor_options=tuple(sorted((str(k), v) for k, v in (d.get("inductor_options") or {}).items())),
                   cudnn_benchmark=bool(d.get("cudnn_benchmark", False)),
                   channels_last=bool(d.get("channels_last", False)), graphed=bool(d.get("graphed", False)),
                   swaps=swaps, regions=regions,
                   region_depths=tuple(sorted((int(g), int(v)) for g, v in (d.get("region_depths") or {}).items())),
                   causal_sdpa=bool(d.get("causal_sdpa", False)), why=str(d.get("why", "")))


def _stock_call(executor: str, options: dict[str, Any]) -> str:
    if executor == "eager+cudagraphs":
        return "torch.compile(model, backend='cudagraphs')"
    if executor == "eager":
        return "torch.compile(model, backend='eager')"
    graphs = uses_cudagraphs(executor)
    if not options:
        return "torch.compile(model, mode='reduce-overhead')" if graphs else "torch.compile(model)"
    opts = dict(options, **({"triton.cudagraphs": True} if graphs else {}))
    return "torch.compile(model, options={" + ", ".join(f"{k!r}: {v!r}" for k, v in opts.items()) + "})"


@dataclass
class VariantCheck:
    """A variant's outputs (and parameter gradients with ``--backward``) judged against the float64 reference
    (:func:`fusion_advisor.tolerances.judge`, eager's own error as the scale) on every input set.

    Attributes:
        passed: every tensor of every input set passed.
        reference: what the outputs were judged against (``"float64 copy of the model"``, or the model as written
            at the dtype tolerance when no float64 copy could run, and why).
        input_sets: names of the input sets run (``example``, ``fresh-0``).
        worst: the judgement line of the tensor closest to (or past) its limit.
        norm_err, eager_norm_err: that tensor's norm-wise errors (candidate, eager) against float64.
        details: one line per failure, or a summary.
    """

    passed: bool
    reference: str = ""
    input_sets: list[str] = field(default_factory=list)
    worst: str = ""
    norm_err: float | None = None
    eager_norm_err: float | None = None
    details: list[str] = field(default_factory=list)


@dataclass
class VariantTiming:
    """One variant timed in the whole model (:mod:`fusion_advisor.apply.measure`).

    Attributes:
        timer: how (:data:`TIMER_GPU`, :data:`TIMER_CPU`).
        ms: steady-state time of one step, ms: the median of ``rounds_ms``.
        rounds_ms: the median of each timing round (rounds interleaved with other variants' where compared).
        spread: ``(max - min) / median`` of ``rounds_ms``: the noise of this measurement; where the rounds were
            timed twice (``discarded_rounds_ms``), the larger of that and the two sets' medians' disagreement.
        first_call_s: the first step's wall time, s (compilation and CUDA-graph capture included; in apply's
            process, where variants after the first compiled one find Inductor's caches warm).
        peak_mb: peak allocated memory over a few steps, MiB (GPU only).
        peak_reserved_mb: peak reserved memory over the same steps, MiB: it holds CUDA graphs' private pools, which
            the allocated peak does not count once captured (a graphed Llama-3-8B-width training step read its
            weights alone, 3.58 GiB, allocated), and the caching allocator's slack.
        device_ms: summed GPU kernel time of one step, ms (torch.profiler); ``device_ms_by_class`` splits it by
            :func:`~fusion_advisor.kernel_tools.bench.kernel_class`.
        steady_state_recompiles: Triton JIT and dynamo compilations while timed (should be 0).
        error: why there is no number.
        discarded_rounds_ms: where a set of rounds spread over :data:`NOISY_SPREAD` and was timed again, the
            set not kept (``rounds_ms`` holds the quieter, or the faster where the two sets' medians disagree
            beyond :data:`NOISY_SPREAD`: measure.quieter_sets); else empty.
    """

    timer: str = TIMER_NONE
    ms: float | None = None
    rounds_ms: list[float] = field(default_factory=list)
    spread: float | None = None
    first_call_s: float | None = None
    peak_mb: float | None = None
    peak_reserved_mb: float | None = None
    device_ms: float | None = None
    device_ms_by_class: dict[str, float] = field(default_factory=dict)
    steady_state_recompiles: dict[str, Any] | None = None
    error: str = ""
    discarded_rounds_ms: list[float] = field(default_factory=list)


#: A timed variant whose rounds spread more than this (max - min over the median) makes apply warn that its
#: speed-ups are not to be trusted: on an idle GPU the rounds agree within a few percent (benchmarks/results/h200).
NOISY_SPREAD = 0.25

# variant statuses
CHOSEN = "chosen"
CORRECT = "correct"
WRONG = "wrong"
FAILED = "failed"
SKIPPED = "skipped"
NOT_TIMED = "not timed"


@dataclass
class VariantOutcome:
    """Everything apply learnt about one variant.

    Attributes:
        spec: the :class:`VariantSpec`.
        status: :data:`CHOSEN`, :data:`CORRECT` (verified and timed, not the fastest), :data:`WRONG` (failed the
            check), :data:`FAILED` (raised while built or run), :data:`SKIPPED` (not tried: budget, device) or
            :data:`NOT_TIMED` (verified; no timer on this device).
        reason: why, with the numbers.
        check: :class:`VariantCheck` (``None`` when it never ran).
        timing: :class:`VariantTiming` (``None`` when not timed).
        problems: what did not happen as asked (graphs run unrewritten, CUDA graphs skipped and why).
        baseline: one of the whole-model baselines a user writes in one line (eager, ``torch.compile(model)``
            and its ``mode='reduce-overhead'``).
        applied, unapplied: the spec's swaps (``str(MatchKey)``) rewritten into the model's graphs, and those that
            could not be (the variant then failed: it is not what its spec says).
    """

    spec: VariantSpec
    status: str = SKIPPED
    reason: str = ""
    check: VariantCheck | None = None
    timing: VariantTiming | None = None
    problems: list[str] = field(default_factory=list)
    baseline: bool = False
    applied: list[str] = field(default_factory=list)
    unapplied: list[str] = field(default_factory=list)

    @property
    def ms(self) -> float | None:
        return self.timing.ms if self.timing is not None else None

    @property
    def correct(self) -> bool:
        return self.check is not None and self.check.passed and self.status not in (FAILED, WRONG)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.spec.name, "spec": self.spec.to_dict(), "status": self.status, "reason": self.reason,
                "baseline": self.baseline, "check": asdict(self.check) if self.check else None,
                "timing": asdict(self.timing) if self.timing else None, "problems": list(self.problems),
                "swaps_applied": list(self.applied), "swaps_not_applied": list(self.unapplied)}


# --- the run --------------------------------------------------------------------------------------------------


@dataclass
class ApplyOptions:
    """Options of :func:`~fusion_advisor.apply.apply` (the CLI's flags).

    Attributes:
        verify: verify (and where there is a timer, time) each swap and each whole-model variant; without it
            apply only finds and reports matches.
        backward: also verify gradients and time forward+backward, the model in eval mode as analysed (dropout
            off, batch norm on running statistics); ``None``: as the loaded model's mode, which ``load_model``
            leaves in eval: forward only.
        candidates: ``"routed"`` (only chains the analysis routes to the kernel) or ``"all"`` (every match).
        margin: keep a swap only when it beats the better of eager and torch.compile by this fraction.
        keep_unmeasured: keep verified swaps that could not be timed (no GPU).
        seeds: fresh random input draws per swap verification.
        kernels: restrict matching to these kernel names (default: every library kernel).
        gpu: device spec for the analysis (``h200``, ...); default the present GPU's, else h200.
        rules_files: user rules files, matched before the shipped rules.
        budget_s: seconds the variant search may spend beyond the baselines (compile, capture, check, time).
        time_limit_s: wall seconds, from the start of the capture, after which apply starts no new work: swap
            checks stop at half of it (the sites left are not tried), and a candidate variant whose estimated cost
            would end past it is not tried; the baselines and the final confirmation always run, so a plan is
            written from what was measured. 0: no limit.
        regions: also try per-region executors (a region = one module's run of ops in a captured graph).
        time_rounds: timing rounds per variant (their spread is the noise a win must exceed).
        variants: only try variants whose name matches one of these ``fnmatch`` patterns (``eager``,
            ``swaps+*``); ``None``: every variant.
    """

    verify: bool = False
    backward: bool | None = None
    candidates: str = "routed"
    margin: float = 0.03
    keep_unmeasured: bool = False
    seeds: int = 2
    kernels: tuple[str, ...] | None = None
    gpu: str | None = None
    rules_files: tuple[str, ...] = ()
    budget_s: float = 120.0
    time_limit_s: float = 240.0
    regions: bool = True
    time_rounds: int = 3
    variants: tuple[str, ...] | None = None

    def check(self) -> None:
        """Raise :class:`~fusion_advisor.errors.UserError` on an invalid option (before any long work)."""
        from fusion_advisor.errors import UserError

        if self.candidates not in CANDIDATE_POLICIES:
            raise UserError(f"unknown --candidates {self.candidates!r}; choose {' or '.join(CANDIDATE_POLICIES)}")
        if not (0.0 <= self.margin < 1.0) or math.isnan(self.margin):
            raise UserError(f"--margin {self.margin}: must be in [0, 1) (0.03 keeps swaps at least 3% faster)")
        if self.seeds < 0:
            raise UserError(f"--seeds {self.seeds}: must be 0 or more")
        if not (self.budget_s >= 0) or math.isinf(self.budget_s):
            raise UserError(f"--budget-s {self.budget_s}: must be a number of seconds, 0 or more")
        if not (self.time_limit_s >= 0) or math.isinf(self.time_limit_s):
            raise UserError(f"--time-limit-s {self.time_limit_s}: must be a number of seconds, 0 (no limit) or more")
        if self.time_rounds < 1:
            raise UserError(f"--time-rounds {self.time_rounds}: must be 1 or more")

    def flags(self) -> list[str]:
        """The ``fusion-advisor apply`` flags that give these options (those left at their defaults omitted; a
        device spec only where one other than ``cpu`` was named): what reruns this search elsewhere, the model
        file, ``--dtype`` and ``--out`` being the caller's. E.g. ``["--verify", "--candidates", "all",
        "--budget-s", "30"]``."""
        default = ApplyOptions()
        out = ["--verify"] if self.verify else []
        if self.backward:
            out.append("--backward")
        if self.gpu and self.gpu != "cpu":  # what apply takes by itself without a GPU; on one it would send every
            out += ["--gpu", self.gpu]      # kernel route to torch.compile
        for r in self.rules_files:
            out += ["--rules", str(r)]
        for k in self.kernels or ():
            out += ["--kernel", k]
        for name, flag in (("candidates", "--candidates"), ("margin", "--margin"), ("budget_s", "--budget-s"),
                           ("time_limit_s", "--time-limit-s"), ("time_rounds", "--time-rounds"),
                           ("seeds", "--seeds")):
            value = getattr(self, name)
            if value != getattr(default, name):
                text = repr(value) if isinstance(value, float) else str(value)  # a float's every digit
                out += [flag, text[:-2] if text.endswith(".0") else text]
        if not self.regions:
            out.append("--no-regions")
        for v in self.variants or ():
            out += ["--variants", v]
        if self.keep_unmeasured:
            out.append("--keep-unmeasured")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"verify": self.verify, "backward": self.backward, "candidates": self.candidates,
                "margin": self.margin, "keep_unmeasured": self.keep_unmeasured, "seeds": self.seeds,
                "kernels": list(self.kernels) if self.kernels else None, "gpu": self.gpu,
                "rules_files": [str(r) for r in self.rules_files], "budget_s": self.budget_s,
                "time_limit_s": self.time_limit_s, "regions": self.regions, "time_rounds": self.time_rounds,
                "variants": list(self.variants) if self.variants else None}


@dataclass
class ApplyResult:
    """Everything one ``apply`` run found and decided.

    Attributes:
        model_name, model_file, convention, device, dtype: as loaded.
        options: the options; ``backward``: whether gradients were verified / timed.
        sites: every match (:class:`SwapSite`); ``outcomes``: decision per site id.
        near_misses: places that almost matched, with reasons.
        analysis: the analysis of apply's own capture (chains, estimates, routes).
        regions: the regions of the captured graphs (:class:`Region`).
        variants: every whole-model variant apply considered, in the order tried (:class:`VariantOutcome`).
        chosen: the variant the plan keeps (``None`` without --verify); ``chosen_reason`` why.
        baseline: name of the fastest correct whole-model baseline (what the chosen one must not lose to).
        confirmed: ``(best baseline, speed-up)`` of the final confirmation's interleaved rounds when the chosen
            variant won it; ``confirmation_spread``: the larger of the two variants' spreads over those rounds
            (with the disagreement of two timings where the pair was timed twice; ``None`` when none ran to its
            end).
        busy_cpu: the warning that other processes held the CPU's cores as the timing began
            (:func:`fusion_advisor.host.busy_cpu_note`), ``""`` when not: every measured ratio is then unreliable.
        graph_breaks, warnings: as captured; ``library_problems``: kernels that cannot be matched, and why.
        versions, timings_s: library versions and GPU; wall time per stage.
        planned: the chosen model, built (in memory only), or ``None``.
        loaded: the :class:`~fusion_advisor.analyze.load.LoadedModel` (model and example inputs; in memory only).
        source_sha256: the model file's digest as apply began (:func:`fusion_advisor.apply.plan.source_digest`;
            ``""`` for the built-in model).
    """

    model_name: str
    model_file: str
    convention: str
    device: str
    dtype: str
    options: ApplyOptions
    backward: bool
    sites: list[SwapSite]
    outcomes: dict[str, SwapOutcome]
    near_misses: list[NearMiss]
    analysis: Any
    regions: list[Region] = field(default_factory=list)
    variants: list[VariantOutcome] = field(default_factory=list)
    chosen: VariantOutcome | None = None
    chosen_reason: str = ""
    baseline: str = ""
    confirmed: tuple[str, float] | None = None
    confirmation_spread: float | None = None
    busy_cpu: str = ""
    source_sha256: str = ""
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    library_problems: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    planned: Any = None
    loaded: Any = None

    @property
    def kept(self) -> list[SwapSite]:
        """Swaps that passed on their own (verified and faster alone); the chosen variant may use them or not."""
        return [s for s in self.sites if self.outcomes[s.id].kept]

    def variant(self, name: str) -> VariantOutcome | None:
        return next((v for v in self.variants if v.spec.name == name), None)

    @property
    def speedups(self) -> dict[str, float]:
        """The chosen variant's speed-up over each correct, timed baseline (``{"eager": 1.8, ...}``)."""
        if self.chosen is None or self.chosen.ms is None:
            return {}
        return {v.spec.name: v.ms / self.chosen.ms for v in self.variants
                if v.baseline and v.ms is not None and v.correct}

    @property
    def noisy_speedups(self) -> dict[str, float]:
        """The baselines of :attr:`speedups` whose ratio rests on rounds spread more than :data:`NOISY_SPREAD`
        (theirs or the chosen variant's), with the larger spread (``{"torch.compile": 8.47}``): figures a headline
        must not quote bare (on a busy 2-core CPU a new user read "7.03x vs torch.compile" for a model dynamo
        captured nothing of, eager and torch.compile running the same code, from rounds of 611, 41091, 4777 ms)."""
        if self.chosen is None or self.chosen.timing is None:
            return {}
        mine = self.chosen.timing.spread or 0.0
        out = {}
        for v in self.variants:
            if v is not self.chosen and v.spec.name in self.speedups and v.timing is not None:  # (itself: 1.00x)
                spread = max(mine, v.timing.spread or 0.0)
                if spread > NOISY_SPREAD:
                    out[v.spec.name] = spread
        return out
