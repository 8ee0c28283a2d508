"""The variant search: which ways of running the whole model apply tries, in which order, and which it keeps.

1. **Baselines**, always: the model as written, ``torch.compile(model)`` and, on a GPU,
   ``torch.compile(model, mode="reduce-overhead")`` (Inductor + CUDA graphs): what a user gets in one line.
2. **Candidates**, in order of what the analysis predicts they buy, while ``--budget-s`` lasts:
   the model's own ops in CUDA graphs (``backend="cudagraphs"``: launch-bound models whose Inductor code is
   slower than cuDNN's); the library swaps that won alone, with an eager rest, an Inductor rest and an Inductor
   rest in CUDA graphs (an Inductor rest takes only the swaps that beat torch.compile alone, an eager rest also
   those that beat eager only); the two fastest so far with attention given back ``is_causal`` where the trace
   materialised a causal mask (``+causal-sdpa``, :mod:`fusion_advisor.apply.causal_mask`; the fastest baseline
   with it is tried first of all the candidates); the analysis' routing
   carried out region by region; ``cudnn.benchmark`` and channels-last weights and inputs (forward only) for models
   with convolutions; Inductor's freezing (forward only: weights
   folded as constants, conv + batch norm folded);
   max-autotune for GEMM- and convolution-heavy models.
3. **Regions** (``--regions``): from the fastest variant so far, one region at a time switched to the other
   executor (Inductor <-> eager), in order of predicted gain; a change is kept only when the whole model gets
   faster by more than the measured noise. Regions are chosen by timing the whole model, never by timing a
   region alone (small host-bound pieces do not add up).

Every variant is built, run once (compile and capture time apart), checked against the float64 reference
(:class:`~fusion_advisor.apply.measure.ModelHarness`) and only then timed; a wrong one is reported with its error
and never chosen. **The choice**: the fastest correct variant, confirmed against the fastest correct baseline in
interleaved timing rounds; it is kept only when it wins the confirmation too, else the next fastest that beat the
baseline in the search is confirmed (:data:`MAX_CONFIRMATIONS`), else the baseline is the plan. So
the chosen model is never slower than the best baseline beyond the noise the rounds measure.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, NamedTuple

import torch

from fusion_advisor.stages import Stage, no_progress
from fusion_advisor.apply.executors import CudagraphSkips, reset_compiled_state
from fusion_advisor.apply.measure import (LONG_CALL_MS, MIN_TIMED_CALLS, ROUND_REP_MS, ModelHarness, quieter_sets,
                                          should_time_again, summarize_rounds)
from fusion_advisor.apply.records import (
    AS_WRITTEN, CHOSEN, CORRECT, FAILED, NOISY_SPREAD, NOT_TIMED, SKIPPED, WRONG, PlannedSwap, Region, SwapSite,
    VariantOutcome, VariantSpec, VariantTiming, uses_cudagraphs, with_cudagraphs,
)
from fusion_advisor.apply.variants import PlannedModel
from fusion_advisor.analyze.capture import first_line, quiet_torch_logs
from fusion_advisor.memory import release_cuda_memory

#: Names of the baselines (what ``torch.compile`` gives in one line, and the model as written).
EAGER, COMPILE, REDUCE_OVERHEAD = "eager", "torch.compile", "torch.compile reduce-overhead"

#: Interleaved rounds of the final confirmation (chosen vs best baseline).
CONFIRM_ROUNDS = 4

#: The fastest variant replaces the best baseline only when it wins the confirmation by at least this share (or
#: the rounds' spread, whichever is larger): a win inside the noise buys nothing and risks losing elsewhere.
MIN_WIN = 0.01

#: Variants confirmed against the best baseline at most, fastest first, while none wins and apply's time limit
#: lasts: the fastest, then the next fastest that beat the baseline in the search by :data:`MIN_WIN`.
MAX_CONFIRMATIONS = 2

#: A region change is kept only when the whole model gets faster by at least this share (or the measured spread,
#: whichever is larger).
MIN_REGION_GAIN = 0.02

#: Most region changes tried per search (each one recompiles the model).
MAX_REGION_TRIALS = 8

#: max-autotune is tried when GEMMs, convolutions and attention hold at least this share of the predicted time.
AUTOTUNE_HEAVY_SHARE = 0.3

@dataclass
class SearchInputs:
    """What the search needs from the stages before it.

    Attributes:
        harness: the model's :class:`~fusion_advisor.apply.measure.ModelHarness`.
        kernels: ``{name: KernelEntry}`` for swaps.
        analysis: the :class:`~fusion_advisor.analyze.records.Analysis` of apply's capture.
        regions: the captured graphs' :class:`Region` list.
        swaps: the swaps that won alone (verified and faster than eager, and maybe torch.compile, on their own).
        inductor_swaps: ids of those that also beat torch.compile alone, the only ones a variant with an Inductor
            rest takes (None: all of them).
        causal_masks: attention calls the capture found with a constant causal mask (``+causal-sdpa`` variants).
        budget_s: seconds for the candidates after the baselines.
        time_rounds: timing rounds per variant.
        use_regions: try region changes.
        keep_unmeasured: a verified variant that cannot be timed (library kernels under the CPU interpreter)
            may be chosen.
        progress: ``progress(text)`` context manager shown while a step runs.
        only: ``--variants`` patterns (see :meth:`wanted`).
        swap_notes: filled by the search: why a swap was left out of the swap variants.
        considered: filled by the search: the name of every variant :meth:`wanted` was asked about, in order.
        deadline: ``time.perf_counter()`` seconds after which no candidate is started whose estimated cost would
            end past it (apply's ``--time-limit-s``; ``time_limit_s`` names it in the reasons); the baselines and
            the fastest variant's confirmation still run, a runner-up's only where it is expected to end in time
            (:func:`_confirmation_s`).
    """

    harness: ModelHarness
    kernels: dict[str, Any]
    analysis: Any
    regions: list[Region]
    swaps: list[SwapSite]
    inductor_swaps: frozenset[str] | None = None
    causal_masks: int = 0
    budget_s: float = 120.0
    time_rounds: int = 3
    use_regions: bool = True
    keep_unmeasured: bool = False
    progress: Stage = no_progress
    only: tuple[str, ...] | None = None
    swap_notes: dict[str, str] = field(default_factory=dict)
    considered: list[str] = field(default_factory=list)
    deadline: float = math.inf
    time_limit_s: float = 0.0

    def wanted(self, spec: VariantSpec) -> bool:
        """Whether ``spec`` passes the ``--variants`` filter (``fnmatch`` patterns on its name); its name joins
        :attr:`considered`."""
        self.considered.append(spec.name)
        return self.only is None or any(fnmatch.fnmatchcase(spec.name, p) for p in self.only)

    def unmatched_patterns(self) -> list[str]:
        """The ``--variants`` patterns no variant considered so far matched (a typo, or a variant this model does
        not have)."""
        return [p for p in self.only or () if not any(fnmatch.fnmatchcase(n, p) for n in self.considered)]


@dataclass
class SearchResult:
    """The search's outcome: every variant in the order tried, the chosen one and why, the best baseline, and
    why a swap that won alone was left out of the swap variants (``swap_notes``: ``str(MatchKey) -> reason``)."""

    variants: list[VariantOutcome]
    chosen: VariantOutcome | None
    reason: str
    baseline: str
    planned: Any = None
    swap_notes: dict[str, str] = field(default_factory=dict)
    #: ``(best baseline, speed-up)`` the chosen variant showed over it in the interleaved confirmation rounds, when
    #: one ran and it won: the figure a headline should quote (the search's single rounds can read a win too high).
    confirmed: tuple[str, float] | None = None
    #: The larger of the two variants' spreads over the confirmation's rounds (with the two timings' disagreement
    #: where the pair was timed twice), when one ran to its end.
    confirmation_spread: float | None = None
    #: ``--variants`` patterns that matched no variant of this model, and the variants there were (names).
    unmatched_patterns: list[str] = field(default_factory=list)
    considered: list[str] = field(default_factory=list)


def baselines(device: str) -> list[VariantSpec]:
    """The whole-model baselines on ``device``."""
    out = [VariantSpec(EAGER, AS_WRITTEN, why="baseline: the model as written"),
           VariantSpec(COMPILE, "inductor", why="baseline: torch.compile(model)")]
    if device == "cuda":
        out.append(VariantSpec(REDUCE_OVERHEAD, "inductor+cudagraphs",
                               why="baseline: torch.compile(model, mode='reduce-overhead'), Inductor + CUDA graphs"))
    return out


# --- one variant ----------------------------------------------------------------------------------------------


def evaluate(spec: VariantSpec, inp: SearchInputs, baseline: bool = False) -> VariantOutcome:
    """Build ``spec``, run it once, check it, and (when correct and timeable) time it; never raises for the
    variant's own failure."""
    h = inp.harness
    out = VariantOutcome(spec, baseline=baseline)
    reset_compiled_state()
    timing = VariantTiming(timer=h.timer)
    with CudagraphSkips() as skips, warnings.catch_warnings(), quiet_torch_logs(), grad_mode_kept():
        warnings.simplefilter("ignore")
        failure, out_of_memory = "", False
        try:
            with inp.progress(f"variant {spec.name}: building and running once (compile / capture)"):
                model = PlannedModel(h.model, spec, inp.kernels, cudnn_thread=True)
                timing.first_call_s = h.first_call(model)
        except Exception as e:  # a compiler or capture failure is this variant's, not the run's
            failure = f"failed on its first call: {type(e).__name__}: {first_line(str(e))}"
            if spec.channels_last and "view" in str(e) and "stride" in str(e):
                failure += (" (the model calls .view on a convolution's output, which channels-last strides do not "
                            "allow: .reshape would; the model as written is unaffected)")
            out_of_memory = isinstance(e, torch.cuda.OutOfMemoryError)
        if failure:
            if out_of_memory:  # out of the handler, whose exception held the failed call's frames
                release_cuda_memory()
            out.status, out.reason = FAILED, failure
            return out
        with inp.progress(f"variant {spec.name}: checking against the float64 reference"):
            out.check = h.check(model)
        out.problems = model.problems() + [f"CUDA graphs not used for a graph: {r}" for r in skips.reasons]
        out.applied = sorted({str(k) for k in model.applied_swaps()})
        out.unapplied = [str(k) for k in model.missing_swaps()]
        if spec.causal_sdpa and not model.causal_masks_folded():
            out.status, out.reason = FAILED, "no attention call's causal mask could be given back as is_causal"
            return out
        if out.unapplied:
            out.status = FAILED
            why = "; ".join(p for p in out.problems if "not rewritten" in p or "at " in p)[:300]
            out.reason = (f"{len(out.unapplied)} of {len(spec.swaps)} swap(s) could not be rewritten into the "
                          f"model's graph" + (f": {why}" if why else ""))
            return out
        if not out.check.passed:
            out.status = WRONG
            out.reason = "wrong: " + (out.check.details[0] if out.check.details else "failed the check")
            return out
        if not _timeable(spec, h.device):
            out.status = NOT_TIMED
            out.reason = ("correct; not timed: library Triton kernels run in the CPU interpreter here, whose speed "
                          "says nothing about a GPU")
            return out
        with inp.progress(f"variant {spec.name}: timing ({inp.time_rounds} rounds)"):
            out.timing = h.time(model, inp.time_rounds, timing)
    if out.timing.ms is None:
        out.status, out.reason = FAILED, f"correct, but failed while timed: {out.timing.error}"
    else:
        out.status = CORRECT
        out.reason = f"correct; {_ms(out.timing)}"
    return out


@contextlib.contextmanager
def grad_mode_kept() -> Iterator[None]:
    """The process's grad mode as it was on entry, whatever the block did: a variant that fails midway (a
    ``torch.no_grad`` block of the model entered and never left) must not leave every variant after it without
    gradients."""
    grad = torch.is_grad_enabled()
    try:
        yield
    finally:
        torch.set_grad_enabled(grad)


def _timeable(spec: VariantSpec, device: str) -> bool:
    return device == "cuda" or not spec.swaps


def _ms(t: VariantTiming) -> str:
    again = (f"; timed twice, the first set spread over {NOISY_SPREAD:.0%}: the quieter set (the faster where their "
             f"medians disagree), its spread with the two sets' disagreement" if t.discarded_rounds_ms else "")
    spread = f" (spread {t.spread:.1%} over {len(t.rounds_ms)} rounds{again})" if t.spread is not None else ""
    first = f", first call {t.first_call_s:.2f} s" if t.first_call_s is not None else ""
    return f"{t.ms:.4g} ms per step{spread}{first}"


# --- the candidates ---------------------------------------------------------------------------------------------


def _model_features(analysis: Any) -> dict[str, Any]:
    heavy = total = 0.0
    has_conv = False
    for c in analysis.chains:
        est = analysis.estimates.get(c.id)
        if est is None:
            continue
        total += est.eager_us
        if set(c.categories) & {"matmul", "conv", "attention"}:
            heavy += est.eager_us
        has_conv = has_conv or "conv" in c.categories
    return {"heavy_share": heavy / total if total > 0 else 0.0, "has_conv": has_conv}


def _best(outcomes: list[VariantOutcome], pred: Callable[[VariantOutcome], bool] = lambda o: True
          ) -> VariantOutcome | None:
    timed = [o for o in outcomes if o.correct and o.ms is not None and pred(o)]
    return min(timed, key=lambda o: o.ms) if timed else None


def _family(spec: VariantSpec) -> str:
    return "eager" if spec.rest in (AS_WRITTEN, "eager", "eager+cudagraphs") else "inductor"


def candidates(inp: SearchInputs, outcomes: list[VariantOutcome]) -> Iterator[VariantSpec]:
    """The candidates after the baselines, in order (a generator: later ones look at the outcomes so far)."""
    h = inp.harness
    cuda = h.device == "cuda"
    feats = _model_features(inp.analysis)
    tried: set[VariantSpec] = set()

    def fresh(spec: VariantSpec) -> bool:
        key = replace(spec, name="", why="")
        if key in tried or any(replace(o.spec, name="", why="") == key for o in outcomes):
            return False
        tried.add(key)
        return True

    # attention with a traced causal mask: the fastest baseline without it first (cheap, and on the H200 the mask
    # tripled a Llama step's attention time); the fastest variants with swaps follow them
    yield from (spec for spec in _causal_sdpa(inp, outcomes, 1) if fresh(spec))
    if cuda:
        spec = VariantSpec("cudagraphs", "eager+cudagraphs",
                           why="the model's own kernels (cuBLAS, cuDNN) replayed from a CUDA graph: no launch "
                               "overhead, no Inductor code")
        if fresh(spec):
            yield spec
        if not h.backward and not h.mutated_inputs():
            spec = VariantSpec("cuda-graph", AS_WRITTEN, graphed=True,
                               why="the model as written captured whole in one CUDA graph (torch.cuda.graph): no "
                                   "launch overhead, also where dynamo's backends run the model without graphs "
                                   "(forward only; inputs copied into the graph's buffers, outputs cloned)")
            if fresh(spec):
                yield spec
    surviving = yield from _swap_set(inp, outcomes)
    for rest in (_swap_rests(outcomes) if cuda and surviving else []):
        swaps = _swaps_for_rest(inp, surviving, rest)
        if not swaps:
            continue
        kernels = ", ".join(sorted({s.key.kernel for s in swaps}))
        spec = VariantSpec(f"swaps+{rest}", rest, swaps=tuple(swaps),
                           why=f"the library kernels that won alone ({kernels}); the rest of each graph: {rest}")
        if fresh(spec):
            yield spec
    yield from (spec for spec in _causal_sdpa(inp, outcomes, 2) if fresh(spec))
    routed = _routed_regions(inp, outcomes)
    if routed is not None and fresh(routed):
        yield routed
    if cuda and feats["has_conv"]:
        for base in _cudnn_benchmark_bases(outcomes):
            spec = replace(base.spec, name=f"{base.spec.name} +cudnn.benchmark", cudnn_benchmark=True,
                           why="the model runs convolutions: cuDNN times its algorithms once per shape and keeps "
                               "the fastest (cudnn.benchmark)")
            if fresh(spec):
                yield spec
    # channels-last converts the inputs (copies) and, while apply measures, a copy of the model: a model that
    # changes its inputs or buffers in place would change the copies, not what the caller holds
    if feats["has_conv"] and not h.backward and not h.mutated_inputs() and not h.mutated_buffers:
        for base in _top(outcomes, 2):
            if not base.spec.stock or base.spec.channels_last:
                continue
            spec = replace(base.spec, name=f"{base.spec.name} +channels-last", channels_last=True,
                           why="the model runs convolutions: weights and inputs in channels-last memory format "
                               "(NHWC), which cuDNN's tensor-core convolutions read without transposing (forward "
                               "only: a copy of the weights)")
            if fresh(spec):
                yield spec
    if not h.backward and any(True for _ in h.model.parameters()):
        base = _best(outcomes, lambda o: _family(o.spec) == "inductor" and not o.spec.swaps)
        if base is not None and "freezing" not in dict(base.spec.inductor_options):
            opts = tuple(sorted({**dict(base.spec.inductor_options), "freezing": True}.items()))
            spec = replace(base.spec, name=f"{base.spec.name} +freezing", inductor_options=opts,
                           why="forward only: Inductor folds the weights in as constants (conv + batch norm folded, "
                               "weight layouts fixed at compile time)")
            if fresh(spec):
                yield spec
    if cuda and feats["heavy_share"] >= AUTOTUNE_HEAVY_SHARE:
        base = _best(outcomes, lambda o: _family(o.spec) == "inductor")
        if base is not None and "max_autotune" not in dict(base.spec.inductor_options):
            opts = tuple(sorted({**dict(base.spec.inductor_options), "max_autotune": True,
                                 "coordinate_descent_tuning": True}.items()))
            spec = replace(base.spec, name=f"{base.spec.name} +max-autotune", inductor_options=opts,
                           why=f"GEMMs / convolutions / attention hold {feats['heavy_share']:.0%} of the predicted "
                               f"time: Inductor times its own GEMM and convolution templates against the vendor's "
                               f"and fuses epilogues into them (max-autotune)")
            if fresh(spec):
                yield spec


def _causal_sdpa(inp: SearchInputs, outcomes: list[VariantOutcome], n: int) -> Iterator[VariantSpec]:
    """The ``n`` fastest variants so far with attention given back ``is_causal`` (``+causal-sdpa``), where the
    capture found attention calls given a constant causal mask (:mod:`fusion_advisor.apply.causal_mask`)."""
    if not inp.causal_masks:
        return
    for base in _top(outcomes, n):
        if base.spec.causal_sdpa or base.spec.graphed or base.spec.channels_last:
            continue
        rest = "eager" if base.spec.rest == AS_WRITTEN else base.spec.rest
        yield replace(base.spec, name=f"{base.spec.name} +causal-sdpa", rest=rest, causal_sdpa=True,
                      why=f"{inp.causal_masks} attention call(s) get a causal mask the trace materialised: run "
                          f"with is_causal=True and no mask, as the model as written runs them (the attention "
                          f"kernel skips the masked half)")


def _swap_rests(outcomes: list[VariantOutcome]) -> list[str]:
    """The executors for the rest of a swapped model, in the order tried: Inductor's with CUDA graphs first when the
    fastest baseline so far replays CUDA graphs (a launch-bound model keeps wanting them with the swaps in, and a
    budget that runs out should run out on the less likely rest), else Inductor's plain code first."""
    best = _best(outcomes, lambda o: o.baseline)
    if best is not None and best.spec.cudagraphs:
        return ["inductor+cudagraphs", "inductor", "eager+cudagraphs"]
    return ["inductor", "inductor+cudagraphs", "eager+cudagraphs"]


def _swaps_for_rest(inp: SearchInputs, swaps: list[PlannedSwap], rest: str) -> list[PlannedSwap]:
    """The swaps a variant with ``rest`` takes: all of them with an eager rest; with an Inductor rest only those
    that beat torch.compile alone (:attr:`SearchInputs.inductor_swaps`)."""
    if _family(VariantSpec("", rest)) == "eager" or inp.inductor_swaps is None:
        return list(swaps)
    return [p for p in swaps if p.swap_id in inp.inductor_swaps]


def _swap_set(inp: SearchInputs, outcomes: list[VariantOutcome]) -> Iterator[VariantSpec]:
    """Yield ``swaps+eager`` variants until the set of swaps that works in the whole model is known; return it.

    A swap that cannot be rewritten into the graph is dropped; when the whole model with the swaps fails the
    check, each kernel is left out in turn, and one whose absence makes the model correct is dropped (a kernel
    correct on its own inputs can still break the whole model, e.g. through a broken trace path). Why each swap
    was dropped goes to ``inp.swap_notes``.
    """
    current = [PlannedSwap(s.key, s.signature, s.id) for s in inp.swaps]
    if not current:
        return []

    def spec_of(swaps: list[PlannedSwap], without: str = "") -> VariantSpec:
        kernels = ", ".join(sorted({p.key.kernel for p in swaps}))
        name = "swaps+eager" + (f" (without {without})" if without else "")
        return VariantSpec(name, "eager", swaps=tuple(swaps),
                           why=f"the library kernels that won alone ({kernels}); the rest of each graph runs eagerly")

    while current:
        yield spec_of(current)
        last = outcomes[-1]
        if last.unapplied:
            gone = set(last.unapplied)
            for p in current:
                if str(p.key) in gone:
                    inp.swap_notes[str(p.key)] = f"it could not be rewritten into the model's graph: {last.reason}"
            current = [p for p in current if str(p.key) not in gone]
            continue
        if last.status != WRONG:
            return current if last.correct else []
        culprit = None
        for kernel in sorted({p.key.kernel for p in current}):
            rest = [p for p in current if p.key.kernel != kernel]
            if not rest:
                continue
            yield spec_of(rest, without=kernel)
            if outcomes[-1].correct:
                culprit = kernel
                break
        detail = last.check.details[0] if last.check and last.check.details else last.reason
        if culprit is None:
            for p in current:
                inp.swap_notes[str(p.key)] = f"the whole model with the swaps fails the check: {detail}"
            return []
        for p in current:
            if p.key.kernel == culprit:
                inp.swap_notes[str(p.key)] = (f"the whole model fails the check with the {culprit} swaps and "
                                              f"passes without them: {detail}")
        return [p for p in current if p.key.kernel != culprit]
    return []


def _cudnn_benchmark_bases(outcomes: list[VariantOutcome]) -> list[VariantOutcome]:
    """The two fastest correct variants to try again with ``cudnn.benchmark``, none on cudagraph trees: such a
    variant runs in a thread of its own (:func:`fusion_advisor.apply.variants.in_cudnn_thread`), and
    reduce-overhead's trees, kept per thread, failed their first call there ("AssertionError: ", on each of the
    three convolution models of the H100's seed-43 apply draw), so cudnn.benchmark is never tried on top of
    reduce-overhead; a whole-model ``torch.cuda.graph`` works."""
    return _top([o for o in outcomes if not (o.spec.cudagraphs and not o.spec.graphed)], 2)


def _top(outcomes: list[VariantOutcome], n: int) -> list[VariantOutcome]:
    timed = sorted((o for o in outcomes if o.correct and o.ms is not None), key=lambda o: o.ms)
    return timed[:n]


def _routed_regions(inp: SearchInputs, outcomes: list[VariantOutcome]) -> VariantSpec | None:
    """The analysis' routing carried out: each region with the executor its chains' routes ask for."""
    if not inp.use_regions or len(inp.regions) < 2:
        return None
    best = _best(outcomes)
    cuda = inp.harness.device == "cuda"
    graphs = bool(best is not None and best.spec.cudagraphs)
    wanted = {k: with_cudagraphs(e, cuda and (graphs or uses_cudagraphs(e)))
              for k, e in _region_executors(inp.regions).items()}
    if len(set(wanted.values())) < 2:
        # one executor everywhere (after CUDA graphs are dropped off a GPU): a whole-model variant already is the
        # routing (a reviewer: on a CPU, inductor+cudagraphs and inductor regions had collapsed into a second
        # torch.compile timed under another name)
        return None
    counts: dict[str, int] = {}
    for e in wanted.values():
        counts[e] = counts.get(e, 0) + 1
    rest = max(counts, key=counts.__getitem__)
    overrides = tuple(sorted((k, e) for k, e in wanted.items() if e != rest))
    return VariantSpec("routes", rest, regions=overrides, region_depths=_depths(inp.regions),
                       why="the analysis' routes carried out region by region: "
                           f"{len(overrides)} of {len(wanted)} regions run {', '.join(sorted(set(wanted.values()) - {rest}))}, "
                           f"the rest {rest}")


def _region_executors(regions: list[Region]) -> dict[str, str]:
    """The executor each region's chains' routes ask for (:attr:`Region.routed_executor`), keyed by region; a region
    holding no chain (views, a flatten between layers) runs with the region before it in its graph (the first
    ones with the next): given ``eager`` it cut a graph the analysis replays whole into several CUDA-graph
    submodules, each replayed on its own (a reviewer: three replays where the advice priced one). In a graph where
    some region is replayed from CUDA graphs, the compiled regions are replayed too, but for one holding a chain a
    rule fixed outside CUDA graphs (:attr:`Region.fixed_route`: a user's own rule sent it to torch.compile or kept
    it eager)."""
    wanted: dict[str, str | None] = {str(r.key): (r.routed_executor if r.chain_ids else None) for r in regions}
    fixed = {str(r.key): r.fixed_route for r in regions}
    for graph in sorted({r.key.graph_index for r in regions}):
        keys = [str(r.key) for r in regions if r.key.graph_index == graph]
        last = next((wanted[k] for k in keys if wanted[k] is not None), "eager")
        for k in keys:
            last = wanted[k] = wanted[k] or last
        # a graph that replays some regions replays its compiled ones too (a library kernel's, a fused chain's):
        # adjacent regions of one executor then merge into one CUDA graph (model_call.call_parts prices it so)
        if any(uses_cudagraphs(wanted[k] or "") for k in keys):
            for k in keys:
                if wanted[k] == "inductor" and not fixed[k]:
                    wanted[k] = with_cudagraphs("inductor", True)
    return {k: e or "eager" for k, e in wanted.items()}


def _depths(regions: list[Region]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted({(r.key.graph_index, r.depth) for r in regions}))


# --- regions ----------------------------------------------------------------------------------------------------


def region_trials(inp: SearchInputs, base: VariantSpec) -> list[tuple[Region, str]]:
    """``(region, executor)`` changes to try from ``base``, in order of predicted gain: from an Inductor base,
    the regions where the analysis predicts Inductor gains least go eager first; from an eager base, the regions
    where it predicts most get Inductor first."""
    if base.swaps:
        return []
    graphs = base.cudagraphs
    family = _family(base)
    current = dict(base.regions)
    out = []
    for r in inp.regions:
        now = current.get(str(r.key), base.rest if base.rest != AS_WRITTEN else "eager")
        alt_family = "eager" if _family(replace(base, rest=now)) == "inductor" else "inductor"
        out.append((r, with_cudagraphs(alt_family, graphs)))
    reverse = family != "inductor"
    out.sort(key=lambda ra: ra[0].compile_gain_us, reverse=reverse)
    return out[:MAX_REGION_TRIALS]


# --- the search ---------------------------------------------------------------------------------------------


def search(inp: SearchInputs) -> SearchResult:
    """Run the whole search (see the module docstring)."""
    h = inp.harness
    outcomes: list[VariantOutcome] = []
    walls: dict[str, float] = {}
    for spec in baselines(h.device):
        # the model as written always runs: it is the reference every other variant is judged against, and the plan
        # when nothing else is correct (--variants patterns that name no baseline still get a plan)
        if inp.wanted(spec) or spec.name == EAGER:
            t0 = time.perf_counter()
            outcomes.append(evaluate(spec, inp, baseline=True))
            walls[spec.name] = time.perf_counter() - t0
    start = time.perf_counter()
    compiled = next((o for o in outcomes if o.spec.name == COMPILE and o.timing is not None), None)
    compile_s = (compiled.timing.first_call_s or 0.0) if compiled is not None else 10.0
    check_s = walls.get(EAGER, 1.0)  # building nothing: what checking and timing one variant costs

    def refusal(spec: VariantSpec) -> str:
        """Why ``spec`` is not tried now ("" when it is): a budget it would overrun."""
        now = time.perf_counter()
        left = inp.budget_s - (now - start)
        estimate = check_s + compile_cost(spec) * compile_s
        build = (f"{compile_cost(spec):g}x torch.compile's first call of {compile_s:.1f} s, plus checking and timing"
                 if compile_cost(spec) else "checking and timing it, as long as the model as written took")
        # one decimal: "about 11 s, 11 s left" read as if it fitted (a new user's 10.6 s against 10.5 s)
        cost = f"would take about {estimate:.1f} s ({build})"
        if estimate > left:
            return f"not tried: {cost}, {max(left, 0):.1f} s of the --budget-s of {inp.budget_s:g} s left"
        if now + estimate > inp.deadline:
            return (f"not tried: {cost}, {max(inp.deadline - now, 0):.1f} s of apply's --time-limit-s of "
                    f"{inp.time_limit_s:g} s left")
        return ""

    for spec in candidates(inp, outcomes):
        if not inp.wanted(spec):  # not asked for (--variants): not tried, not listed
            outcomes.append(VariantOutcome(spec, SKIPPED, "not among --variants"))
            continue
        why = refusal(spec)
        outcomes.append(VariantOutcome(spec, SKIPPED, why) if why else evaluate(spec, inp))
    outcomes[:] = [o for o in outcomes if o.reason != "not among --variants"]
    if inp.use_regions and len(inp.regions) >= 2:
        _search_regions(inp, outcomes, refusal)
    result = _choose(inp, outcomes)
    result.swap_notes = dict(inp.swap_notes)
    result.unmatched_patterns = inp.unmatched_patterns()
    result.considered = list(dict.fromkeys(inp.considered))
    return result


def compile_cost(spec: VariantSpec) -> float:
    """A variant's build cost in units of ``torch.compile(model)``'s first call (what the budget is checked with):
    nothing to compile for the model as written, a trace and a capture for CUDA graphs of the model's own
    kernels, one Inductor compile otherwise, about ten for max-autotune (it times every GEMM / convolution
    template)."""
    opts = dict(spec.inductor_options)
    if opts.get("max_autotune"):
        return 10.0
    if spec.rest == AS_WRITTEN and spec.stock:
        return 0.1 if spec.graphed else 0.0
    if spec.rest in ("eager", "eager+cudagraphs") and not any(e.startswith("inductor") for _, e in spec.regions):
        return 0.3
    return 1.0


def _search_regions(inp: SearchInputs, outcomes: list[VariantOutcome], refusal: Callable[[VariantSpec], str]
                    ) -> None:
    best = _best(outcomes, lambda o: not o.spec.swaps and not o.spec.cudnn_benchmark
                 and not o.spec.inductor_options and not o.spec.channels_last and not o.spec.graphed)
    if best is None:
        return
    base = best
    for region, executor in region_trials(inp, base.spec):
        regions = dict(base.spec.regions)
        default = base.spec.rest if base.spec.rest != AS_WRITTEN else "eager"
        if executor == default:
            regions.pop(str(region.key), None)
        else:
            regions[str(region.key)] = executor
        # the overrides after this change; none left (the region went back to the rest's executor): the change
        changes = ", ".join(f"{k}={e}" for k, e in sorted(regions.items())) or f"{region.key}={executor}"
        spec = replace(base.spec, name=f"{_root_name(base.spec)} [{changes}]",
                       rest=default, regions=tuple(sorted(regions.items())), region_depths=_depths(inp.regions),
                       why=f"from {base.spec.name}: region {region.key} ({region.n_ops} ops, predicted fusion gain "
                           f"{region.compile_gain_us:.1f} us) runs {executor}")
        if not inp.wanted(spec):
            break
        why = refusal(spec)
        if why:
            outcomes.append(VariantOutcome(spec, SKIPPED, why))
            break
        trial = evaluate(spec, inp)
        outcomes.append(trial)
        if trial.ms is None or not trial.correct or base.ms is None:
            continue
        noise = max(base.timing.spread or 0.0, trial.timing.spread or 0.0, MIN_REGION_GAIN)
        if trial.ms < base.ms * (1.0 - noise):
            trial.reason += f"; kept as the new base ({base.ms / trial.ms:.3f}x {base.spec.name})"
            base = trial
        else:
            trial.reason += (f"; not kept: {trial.ms:.4g} ms vs {base.ms:.4g} ms of {base.spec.name} (needs "
                             f"{noise:.1%} better)")


def _root_name(spec: VariantSpec) -> str:
    return spec.name.split(" [", 1)[0]


def _choose(inp: SearchInputs, outcomes: list[VariantOutcome]) -> SearchResult:
    best_base = _best(outcomes, lambda o: o.baseline)
    best = _best(outcomes)
    baseline = best_base.spec.name if best_base is not None else ""
    untimed = [o for o in outcomes if o.status == NOT_TIMED and o.correct]
    if untimed and inp.keep_unmeasured:  # asked for: library kernels verified where they cannot be timed
        pick = max(untimed, key=lambda o: len(o.spec.swaps))
        pick.status = CHOSEN
        return SearchResult(outcomes, pick, f"{pick.spec.name}: correct, not timed (library kernels under the CPU "
                                            f"interpreter); chosen because --keep-unmeasured was given", baseline)
    eager = next((o for o in outcomes if o.spec.name == EAGER), None)
    if best is None:
        reason = "no variant could be checked and timed: the plan runs the model as written"
        if eager is not None and eager.status == FAILED:
            reason = f"the model as written failed: {eager.reason}"
        return SearchResult(outcomes, None, reason, baseline)
    if best_base is None and eager is not None and eager.status == WRONG:
        # the model as written failed its own check: a variant that passes it disagrees with the user's model
        return SearchResult(outcomes, None, f"the model as written did not pass its own check ({eager.reason}): no "
                                            f"variant is chosen, and the plan runs the model as written", baseline)
    if best is best_base or best_base is None:
        best.status = CHOSEN
        why = "the fastest correct variant" + (", a baseline" if best.baseline else "")
        return SearchResult(outcomes, best, f"{best.spec.name}: {why} ({_ms(best.timing)})", baseline)
    # confirm against the best baseline in interleaved rounds: the fastest variant, and where it does not confirm,
    # the next fastest that beat the baseline in the search (a fresh user: channels-last failed its confirmation and
    # the plan fell back to torch.compile while a region variant 1.9x faster than it was never confirmed)
    runners_up = sorted((o for o in outcomes if o is not best and o.correct and o.ms is not None and not o.baseline
                         and o.ms < best_base.ms * (1.0 - MIN_WIN)), key=lambda o: o.ms)
    challengers = [best, *runners_up][:MAX_CONFIRMATIONS]
    failed: list[str] = []
    spreads: list[float] = []  # every confirmation's: a noisy first one is often why the fastest lost
    for i, challenger in enumerate(challengers):
        cost = _confirmation_s(challenger, best_base)
        if i and time.perf_counter() + cost > inp.deadline:
            failed.append(f"{challenger.spec.name} was not confirmed: it would take about {cost:.1f} s, past "
                          f"apply's --time-limit-s of {inp.time_limit_s:g} s")
            break
        with inp.progress(f"confirming {challenger.spec.name} against {best_base.spec.name} ({CONFIRM_ROUNDS} "
                          f"interleaved rounds)"):
            won, line, planned, ratio, spread = _confirm(inp, challenger, best_base)
        spreads += [spread] if spread is not None else []
        worst = max(spreads) if spreads else None
        if won:
            challenger.status = CHOSEN
            rank = "the fastest correct variant" + ("" if challenger is best else " that confirmed")
            reason = (f"{challenger.spec.name}: {rank}, {best_base.ms / challenger.ms:.3f}x the best baseline "
                      f"{best_base.spec.name} in the search; confirmed in interleaved rounds: {line}"
                      + (f" ({'; '.join(failed)})" if failed else ""))
            return SearchResult(outcomes, challenger, reason, baseline, planned,
                                confirmed=(best_base.spec.name, ratio), confirmation_spread=worst)
        challenger.reason += f"; not chosen: it did not confirm against {best_base.spec.name}: {line}"
        failed.append(f"{challenger.spec.name} was faster in the search ({challenger.ms:.4g} vs {best_base.ms:.4g} "
                      f"ms) but did not confirm in interleaved rounds ({line})")
    best_base.status = CHOSEN
    reason = f"{best_base.spec.name}: the best baseline; " + "; ".join(failed)
    return SearchResult(outcomes, best_base, reason, baseline, None, confirmed=None,
                        confirmation_spread=max(spreads) if spreads else None)


def _confirmation_s(a: VariantOutcome, b: VariantOutcome) -> float:
    """Seconds a confirmation of ``a`` against ``b`` is expected to take: both built again (their first calls, as
    the search measured them) and :data:`CONFIRM_ROUNDS` rounds of each (a round at least the harness's round
    budget, or one call of a long step), twice over where noisy rounds are timed again."""
    first = sum((o.timing.first_call_s or 0.0) if o.timing is not None else 0.0 for o in (a, b))
    steps = [o.ms or 0.0 for o in (a, b)]
    per_round = sum(ms if ms >= LONG_CALL_MS else max(ROUND_REP_MS, MIN_TIMED_CALLS * ms) for ms in steps) / 1e3
    return first + 2 * CONFIRM_ROUNDS * per_round


def _interleaved(round_a: Callable[[], float], round_b: Callable[[], float]) -> tuple[list[float], list[float]]:
    """:data:`CONFIRM_ROUNDS` rounds of each, alternating: the round times of ``a`` and of ``b``, ms."""
    ta, tb = [], []
    for _ in range(CONFIRM_ROUNDS):
        ta.append(round_a())
        tb.append(round_b())
    return ta, tb


class Confirmation(NamedTuple):
    """:func:`_confirm`'s outcome: whether ``a`` won, the line saying so, ``a``'s model when it won, ``b``'s median
    over ``a``'s (0.0 when ``a`` raised) and the larger of the two variants' spreads over the rounds, with the two
    timings' disagreement where the pair was timed twice (``None`` when ``a`` raised)."""

    won: bool
    line: str
    model: Any
    ratio: float
    spread: float | None


def _confirm(inp: SearchInputs, a: VariantOutcome, b: VariantOutcome) -> Confirmation:
    """Time ``a`` and ``b`` in alternating rounds (both built, both warm)."""
    h = inp.harness
    reset_compiled_state()
    failure, out_of_memory = "", False
    retimed: float | None = None  # the reported spread of a pair timed twice
    with warnings.catch_warnings(), quiet_torch_logs(), grad_mode_kept():
        warnings.simplefilter("ignore")
        try:
            ma = PlannedModel(h.model, a.spec, inp.kernels, cudnn_thread=True)
            mb = PlannedModel(h.model, b.spec, inp.kernels, cudnn_thread=True)
            h.first_call(ma)
            h.first_call(mb)
            round_a, round_b = h.round_timer(ma), h.round_timer(mb)  # as each was timed in the search
            ta, tb = _interleaved(round_a, round_b)
            if should_time_again([ta, tb]):  # as h.time does: once more, the quieter (or faster) pair kept
                (ta, tb), _, retimed = quieter_sets([ta, tb], list(_interleaved(round_a, round_b)))
        except Exception as e:  # the challenger failing now is a loss
            failure = f"raised {type(e).__name__}: {first_line(str(e))}"
            out_of_memory = isinstance(e, torch.cuda.OutOfMemoryError)
    if failure:
        if out_of_memory:  # out of the handler, whose exception held the failed call's frames
            release_cuda_memory()
        return Confirmation(False, failure, None, 0.0, None)
    ra, rb = VariantTiming(rounds_ms=ta), VariantTiming(rounds_ms=tb)
    summarize_rounds(ra)
    summarize_rounds(rb)
    spread = max(ra.spread or 0.0, rb.spread or 0.0, retimed or 0.0)
    need = max(MIN_WIN, spread)
    won = ra.ms < rb.ms * (1.0 - need)
    line = (f"{ra.ms:.4g} ms (spread {ra.spread:.1%}) vs {rb.ms:.4g} ms (spread {rb.spread:.1%}), "
            f"{rb.ms / ra.ms:.3f}x")
    if retimed is not None:
        line += (f" (the quieter of two timings, or the faster where they disagree: the first spread over "
                 f"{NOISY_SPREAD:.0%}; spread {retimed:.1%} "
                 f"with the two timings' disagreement)")
    if not won:  # a challenger that was faster, but by less than the noise, is said to be so
        line += (f", a win under the {need:.1%} it needed (the larger of {MIN_WIN:.0%} and the rounds' spread)"
                 if ra.ms < rb.ms else ", no faster")
    return Confirmation(won, line, ma if won else None, rb.ms / ra.ms, spread)
