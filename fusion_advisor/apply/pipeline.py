"""The apply pipeline: the passes in order, from a model file to a verified, measured plan.

::

    load -> capture (dynamo + RewriteBackend: graphs, matches, each match's real values)
         -> analyze (analyze's own capture and stages: the chains, ids and source lines of `fusion-advisor analyze`)
         -> link (chains <-> matches by graph, module and source line; candidacy) -> swaps (each verified and
            timed alone)
         -> regions (the captured graphs cut by module)
         -> variants (search.py: baselines, candidates, regions; each checked against float64 and timed whole)
         -> plan (plan.py, outputs.py)

:func:`apply` loads a model file; :func:`apply_module` runs the rest on a loaded model. Without ``--verify``
only matches, near-misses and regions are found and reported.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.stages import Stage, no_progress, stage_timer
from fusion_advisor.host import busy_cpu_note
from fusion_advisor.apply.backend import RewriteBackend
from fusion_advisor.apply.match import Match
from fusion_advisor.apply.measure import ModelHarness
from fusion_advisor.apply.plan import source_digest
from fusion_advisor.apply.records import (
    NOISY_SPREAD, NOT_KEPT, NOT_TRIED, NOT_VERIFIED, REJECTED, ApplyOptions, ApplyResult, NearMiss, Region,
    SwapOutcome, SwapSite, SwapVerification,
)
from fusion_advisor.apply.regions import describe_regions
from fusion_advisor.apply.rewrite import extract_subgraph, grad_flags
from fusion_advisor.apply.search import COMPILE, EAGER, SearchInputs, search
from fusion_advisor.apply.swaps import bench_swap, decide, verify_swap
from fusion_advisor.apply.variants import PlannedModel
from fusion_advisor.analyze.capture import first_line, quiet_torch_logs, source_of
from fusion_advisor.analyze.graph import module_path_of
from fusion_advisor.analyze.records import SourceLoc
from fusion_advisor.memory import release_cuda_memory
from fusion_advisor.verification.trees import tensor_leaves


def apply(model_path: str | Path | None, options: ApplyOptions | None = None, device: str | None = None,
          dtype: str = "", stage: Stage = no_progress) -> ApplyResult:
    """Run ``apply`` on a model file (``None``: the built-in default model); see :func:`apply_module`.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (default: cuda when present). ``meta`` is refused: apply runs the model.
        dtype: ``""``, ``"fp32"``, ``"bf16"`` or ``"fp16"``.

    Raises:
        UserError: bad options, a model file that cannot be loaded or run.
    """
    from fusion_advisor.errors import UserError
    from fusion_advisor.analyze.load import load_model

    options = options or ApplyOptions()
    options.check()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "meta":
        raise UserError("apply runs the model to verify swaps on real values: use --device cpu or cuda, not meta")
    if device == "cuda" and not torch.cuda.is_available():  # load_model's message offers meta, which apply refuses
        raise UserError("--device cuda asked for, but no CUDA GPU is available; apply runs the model: use --device "
                        "cpu")
    from kernel_library._device import interpreted

    if device == "cpu" and not interpreted():
        raise UserError("on --device cpu the Triton kernels run only in Triton's interpreter: set TRITON_INTERPRET=1 "
                        "before triton is first imported (the fusion-advisor command does this without a GPU)")
    # cheap checks first, so that a bad option fails before a long model load
    from fusion_advisor.analyze.pipeline import default_spec_name
    from fusion_advisor.devices import load_spec
    from fusion_advisor.analyze.rules import load_rules

    _library_for(options)
    load_spec(options.gpu or default_spec_name())
    load_rules(list(options.rules_files))
    with stage("load"):
        loaded = load_model(model_path, device=device, dtype=dtype)
    return apply_module(loaded, options, stage)


def _library_for(options: ApplyOptions) -> dict[str, Any]:
    from fusion_advisor.errors import UserError
    from kernel_library.registry import load_all

    every = load_all()
    if not options.kernels:
        return dict(every)
    unknown = [k for k in options.kernels if k not in every]
    if unknown:
        raise UserError(f"unknown kernel(s) {', '.join(unknown)}; known kernels: {', '.join(sorted(every))}")
    return {k: every[k] for k in options.kernels}


def apply_module(loaded: Any, options: ApplyOptions | None = None, stage: Stage = no_progress) -> ApplyResult:
    """Run the passes of the module docstring on ``loaded`` (a :class:`~fusion_advisor.analyze.load.LoadedModel`).

    Raises:
        ModelRunError: the model fails on its own inputs.
    """
    from fusion_advisor.analyze.pipeline import default_spec_name, versions
    from fusion_advisor.devices import load_spec
    from fusion_advisor.analyze.rules import load_rules

    options = options or ApplyOptions()
    options.check()
    digest = source_digest(loaded.file) if loaded.file else ""  # the code apply measures, before it takes minutes
    kernels = _library_for(options)
    # apply measures on the device it runs on: on a CPU its times are a CPU's, so the analysis beside them is too
    spec = load_spec(options.gpu or ("cpu" if loaded.device == "cpu" else default_spec_name()))
    rules = load_rules(list(options.rules_files))
    backward = bool(options.backward) if options.backward is not None else bool(loaded.model.training)
    timings: dict[str, float] = {}
    timed = stage_timer(stage, timings)
    start = time.perf_counter()
    deadline = start + options.time_limit_s if options.time_limit_s > 0 else math.inf

    with timed("capture"):
        backend = _capture(loaded, kernels, backward)
    with timed("analyze"):
        analysis = _analyze(loaded, backend, spec, rules)
        links = ChainLinks.build(backend, analysis)
        sites, near = _link(backend, analysis, options, links)
        regions = _regions(backend, analysis, links)
    matches = {m.site.id: m for g in backend.graphs for m in g.matches}
    with timed("swaps" if options.verify else "swap sites"):
        outcomes = _verify_all(sites, matches, backend, kernels, options, backward, stage,
                               swaps_until=start + (deadline - start) / 2)
    backend.release_values()  # the sites' recorded inputs and outputs served the swap checks alone
    result = ApplyResult(
        model_name=loaded.name, model_file=loaded.file, convention=loaded.convention, device=loaded.device,
        dtype=loaded.dtype, options=options, backward=backward, sites=sites, outcomes=outcomes, near_misses=near,
        analysis=analysis, regions=regions, graph_breaks=list(backend.breaks),
        library_problems=dict(backend.library.problems), versions=versions(), timings_s=timings, loaded=loaded,
        source_sha256=digest,
    )
    result.warnings += [f"graph {g.index}: {g.error}" for g in backend.graphs if g.error]
    result.warnings += [w for w in analysis.warnings if w not in result.warnings]
    if not options.verify:
        return result
    result.busy_cpu = busy_cpu_note(loaded.device)  # before the timing: a shared CPU's times can be 100x an idle one's
    if result.busy_cpu:
        result.warnings.append(result.busy_cpu)
    with timed("variants"):
        harness = ModelHarness(loaded, backward, tf32=tf32_allowed(analysis, loaded.device))
        found = search(SearchInputs(
            harness=harness, kernels=kernels, analysis=analysis, regions=regions,
            swaps=[s for s in sites if outcomes[s.id].kept],
            inductor_swaps=frozenset(s.id for s in sites if outcomes[s.id].kept_with_inductor),
            causal_masks=sum(g.causal_masks for g in backend.graphs),
            budget_s=options.budget_s,
            time_rounds=options.time_rounds, use_regions=options.regions, keep_unmeasured=options.keep_unmeasured,
            progress=stage, only=options.variants, deadline=deadline, time_limit_s=options.time_limit_s))
    result.warnings += [n for n in harness.notes() if n not in result.warnings]
    result.variants, result.chosen, result.chosen_reason = found.variants, found.chosen, found.reason
    result.confirmed, result.confirmation_spread = found.confirmed, found.confirmation_spread
    result.baseline, result.planned = found.baseline, found.planned
    if options.variants and not any(v.spec.name == COMPILE and v.timing is not None for v in found.variants):
        result.warnings.append("torch.compile(model) was not timed (--variants leaves it out): the plan is not "
                               "compared with it, only with the model as written")
    for p in found.unmatched_patterns:  # a typo must not read as "eager is best"
        result.warnings.append(f"--variants {p!r} matched none of the variants apply considered for this model "
                               f"(some are built only from others: swaps+<rest> from swaps+eager, region trials "
                               f"from the best plain variant); those considered: {', '.join(found.considered)}")
    noisy = noise_warning(found.variants, found.confirmation_spread)
    if noisy:
        result.warnings.append(noisy)
    off = spec_warning(analysis, found.variants, loaded.device) if not backward else ""  # the analysis: forward only
    if off:
        result.warnings.append(off)
    if result.planned is None and result.chosen is not None:  # built lazily: compiles on its first call
        result.planned = PlannedModel(loaded.module, result.chosen.spec, kernels)
    _mark_swaps(result, found.swap_notes)
    return result


#: Measured over predicted time of the model as written (or the reverse) beyond which apply says the device spec's
#: ceilings are not this machine's: on the H200 the calibrated spec predicted KernelBench models within 25% for 94% of
#: a test set (benchmarks/results/h200/accuracy/reprofile), while a new user's 2-core VM ran LeNet-5 eager 28x slower
#: than the shipped 'cpu' spec predicted (207.8 against 7.36 ms; calibrate measured 25.6 GB/s there, the spec assumes
#: 100), with nothing said.
SPEC_OFF_FACTOR = 4.0


def spec_warning(analysis: Any, variants: list[Any], device: str) -> str:
    """A warning when apply's measured time of the model as written and the analysis's prediction of it (the sum
    of its chains' ``eager_us`` and the unused work's) differ more than :data:`SPEC_OFF_FACTOR` either way, naming
    both and how to calibrate a spec of this machine; ``""`` otherwise or where either is missing."""
    eager = next((v for v in variants if v.spec.name == EAGER and v.timing is not None and v.timing.ms > 0), None)
    predicted_us = sum(e.eager_us for e in analysis.estimates.values()) + analysis.unused_us
    if eager is None or not predicted_us > 0 or not math.isfinite(predicted_us):
        return ""
    measured_us = eager.timing.ms * 1e3
    factor = max(measured_us / predicted_us, predicted_us / measured_us)
    if factor <= SPEC_OFF_FACTOR:
        return ""
    name = (analysis.device_spec or {}).get("name", "?")
    return (f"the device spec {name!r} predicted {predicted_us / 1e3:.3g} ms for the model as written, apply measured "
            f"{eager.timing.ms:.3g} ms ({factor:.1f}x {'slower' if measured_us > predicted_us else 'faster'}): its "
            f"ceilings are not this machine's, so the analysis's bound classes and predicted gains may not hold "
            f"here; `fusion-advisor calibrate --device {device} --out spec.yaml` measures them, and `--spec "
            f"spec.yaml` uses them")


def noise_warning(variants: list[Any], confirmation_spread: float | None = None) -> str:
    """A warning when some timed variant's rounds, or the final confirmation's (``confirmation_spread``, the
    larger of its two variants', with the disagreement of two timings where it was timed twice), spread more than
    :data:`NOISY_SPREAD` (the machine busy, its clocks changing, a variant not settled), naming the worst; ``""``
    when the timings agree."""
    spread = [(v.timing.spread, v.spec.name) for v in variants
              if v.timing is not None and v.timing.spread is not None and v.timing.ms]
    timed = len(spread)
    if confirmation_spread is not None:
        spread.append((confirmation_spread, "the confirmation's interleaved rounds"))
    if not spread or max(spread)[0] <= NOISY_SPREAD:
        return ""
    worst, name = max(spread)
    n = sum(1 for s, _ in spread[:timed] if s > NOISY_SPREAD)
    confirmation = (", and the final confirmation's" if confirmation_spread is not None
                    and confirmation_spread > NOISY_SPREAD else "")
    return (f"timings are noisy: {n} of {timed} timed variants' rounds{confirmation} spread more than "
            f"{NOISY_SPREAD:.0%} (worst {name}, {worst:.0%}): the machine was busy, its clocks varied or a variant had not settled "
            f"(its rounds drifting the same way twice), so the speed-ups below and the choice between close variants "
            f"are not reliable; re-run apply on an idle machine")


def tf32_allowed(analysis: Any, device: str) -> bool:
    """Whether PyTorch's present settings let the model's fp32 products run in TF32 on ``device``: convolutions
    with ``torch.backends.cudnn.allow_tf32`` (on by default), matmuls with ``torch.backends.cuda.matmul.allow_tf32``
    (off by default)."""
    if device != "cuda":
        return False
    categories = {op.category for op in analysis.ops}
    return bool(("conv" in categories and torch.backends.cudnn.allow_tf32)
                or (categories & {"matmul", "attention"} and torch.backends.cuda.matmul.allow_tf32))


def _mark_swaps(result: ApplyResult, notes: dict[str, str]) -> None:
    """Swaps that won alone but are not in the chosen variant: say why (left out of the swap variants, with the
    search's reason, or the chosen variant has none)."""
    chosen = result.chosen.spec if result.chosen is not None else None
    used = {s.key for s in chosen.swaps} if chosen is not None else set()
    for s in result.kept:
        if s.key in used:
            continue
        o = result.outcomes[s.id]
        alone = o.reason.replace("kept because", "would be kept as")
        note = notes.get(str(s.key))
        o.decision = REJECTED if note and "fails the check" in note else NOT_KEPT
        if note:
            o.reason = f"{alone}; not kept: {note}"
        else:
            name = chosen.name if chosen is not None else "none"
            o.reason = (f"{alone}; not in the plan: the chosen whole-model variant is {name} (faster than every "
                        f"variant with library swaps, or those were not tried; see the variants)")


def _regions(backend: RewriteBackend, analysis: Any, links: "ChainLinks") -> list[Region]:
    """The captured graphs' regions, each with the analysis chains of its ops (:class:`ChainLinks`)."""
    chain_of_node: dict[tuple[int, str], str] = {}
    graphs = []
    for g in backend.graphs:
        if g.graph is None:
            continue
        graphs.append((g.index, g.graph))
        for n in g.graph.graph.nodes:
            found = links.chains_of_node(g.index, n.name)
            if found:
                chain_of_node[(g.index, n.name)] = found[0]
    return describe_regions(graphs, chain_of_node, analysis)


def _capture(loaded: Any, kernels: dict[str, Any], backward: bool) -> RewriteBackend:
    from fusion_advisor.analyze.capture import run_eagerly
    from fusion_advisor.errors import CaptureError

    # the analysis runs on analyze's own capture (_analyze), so the backend traces no analysis graph of its own
    backend = RewriteBackend(kernels, record_values=True, analyze=False, keep_graphs=True, count_causal=True)
    try:
        compiled = backend.compile(loaded.module)
        with torch.set_grad_enabled(backward), warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            compiled(*loaded.inputs)
    except Exception as e:
        run_eagerly(loaded)  # the model's own failure gets the model's message
        raise CaptureError(f"{loaded.file}: capturing the model with torch.compile failed: {type(e).__name__}: "
                           f"{first_line(str(e))}") from e
    finally:
        torch._dynamo.reset()
    return backend


def _analyze(loaded: Any, backend: RewriteBackend, spec: Any, rules: Any) -> Any:
    """The analysis of the model exactly as ``fusion-advisor analyze`` makes it: analyze's own capture
    (:func:`fusion_advisor.analyze.capture.capture`) and stages (:func:`fusion_advisor.analyze.pipeline.analyze_capture`), so the
    chain ids, patterns and source lines apply reports are the ones of ``analyze`` on the same model and device
    (one report per model folder reads both), but with the graph broken around cuDNN RNN layers as apply's backend
    breaks it (analyze keeps them one op each). A model analyze cannot capture is analysed as having no chains;
    the whole-model variants are still tried."""
    from fusion_advisor.analyze.pipeline import analyze_capture
    from fusion_advisor.analyze.capture import Capture, capture
    from fusion_advisor.errors import CaptureError

    warns: list[str] = []
    if not backend.graphs:
        rnns = sorted({type(m).__name__ for m in loaded.module.modules() if isinstance(m, torch.nn.RNNBase)})
        why = (f"its {'/'.join(rnns)} layers: torch.compile does not trace them (dynamo's allow_rnn is off), so "
               f"torch.compile(model) runs the model as written too" if rnns else
               "dynamo skipped it, or gave up on every frame")
        warns.append(f"dynamo captured no graph (the whole forward ran eagerly: {why}): nothing to swap or compile "
                     f"by region; the whole-model variants are still tried")
    try:
        with warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            cap = capture(loaded, recurrent=False)  # apply's backend breaks graphs at RNNs too: same numbering
    except CaptureError as e:
        warns.append(f"the analysis could not capture the model ({first_line(str(e))}): no chains to analyse")
        cap = Capture(graphs=[], method="dynamo", breaks=list(backend.breaks))
    finally:
        torch._dynamo.reset()
    return analyze_capture(loaded, cap, spec, rules, notes=warns)


def _empty_graph() -> torch.fx.Graph:
    g = torch.fx.Graph()
    g.output(())
    return g


def _link(backend: RewriteBackend, analysis: Any, options: ApplyOptions,
          links: "ChainLinks") -> tuple[list[SwapSite], list[NearMiss]]:
    """Chain ids, routes and candidacy of every site; near-misses with chain ids, filtered and completed. A site's
    source line is that of its first op with one (as a chain's is), read from apply's own graph (the analysis'
    ops come from another trace, whose node names mean other nodes): the softmax of ``y = x * 2; softmax(y)``
    reads the softmax's line, not that of the chain's multiply."""
    chains = {c.id: c for c in analysis.chains}

    def chains_of(gi: int, op_ids: Sequence[str]) -> tuple[str, ...]:
        return links.chains_of_ops(gi, op_ids)

    sites: list[SwapSite] = []
    for g in backend.graphs:
        for m in g.matches:
            s = m.site
            chain_ids = chains_of(g.index, s.op_ids)
            decs = [analysis.decisions[c] for c in chain_ids if c in analysis.decisions]
            routed = next((d for d in decs if d.route == "triton" and _same_family(backend, d.kernel, s.kernel)),
                          None)
            main = routed or next((d for d in decs if d.route == "triton"), decs[0] if decs else None)
            # the rule's own route may have fallen back (a triton rule on a CPU spec): the note says why
            route_text = (f"chain {main.chain_id} -> {main.route}{'/' + main.kernel if main.kernel else ''} "
                          f"(rule {main.rule_id}{': ' + main.note if main.note else ''})") if main else \
                "no analysis chain linked to these ops"
            if options.candidates == "all":
                candidate, why = True, f"tried (--candidates all); analysis: {route_text}"
            elif routed is not None:
                candidate, why = True, f"analysis routes {route_text}"
            else:
                candidate, why = False, (f"not tried: analysis routes {route_text}; --candidates all tries every "
                                         f"match")
            lead = chains.get(main.chain_id) if main else None
            s = replace(s, chain_ids=chain_ids, route=main.route if main else "", route_kernel=main.kernel if main
                        else "", route_rule=main.rule_id if main else "", candidate=candidate, candidate_reason=why,
                        source=links.first_source(g.index, s.op_ids)
                        or (s.source if s.source.file or lead is None else lead.source))
            m.site = s
            sites.append(s)

    matched_ops = {op for s in sites for op in s.op_ids}
    near: list[NearMiss] = []
    seen: set[tuple[str, tuple[str, ...], str]] = set()
    for g in backend.graphs:
        for nm in g.near_misses:
            if nm.kind != "check" and nm.op_ids and set(nm.op_ids) <= matched_ops:
                continue  # a partial match of ops another kernel's match already covers
            key = (nm.kernel, nm.op_ids, nm.reason)
            if key in seen:
                continue
            seen.add(key)
            near.append(replace(nm, chain_ids=chains_of(g.index, nm.op_ids)))
    # chains the analysis names after a kernel's pattern that no match and no near-miss covers
    by_pattern: dict[str, list[str]] = {}
    for name, entry in backend.library.kernels.items():
        by_pattern.setdefault(entry.replaces, []).append(name)
    covered = {c for s in sites for c in s.chain_ids} | {c for nm in near for c in nm.chain_ids}
    for c in analysis.chains:
        if c.kind != "fusible" or c.pattern not in by_pattern or c.id in covered:
            continue
        names = by_pattern[c.pattern]
        problems = [f"{k}: {backend.library.problems[k]}" for k in names if k in backend.library.problems]
        article = "an" if c.pattern[:1] and c.pattern[0] in "aeiou" else "a"
        reason = (f"the analysis found {article} {c.pattern} chain ({len(c.targets)} ops) but no op sequence in it "
                  f"matches the pattern of {', '.join(names)}" + (f" ({'; '.join(problems)})" if problems else ""))
        near.append(NearMiss(names[0], c.pattern, c.graph_index, tuple(c.op_ids), (c.id,), c.source, c.module_path,
                             reason, "chain"))
    return sites, near


def _same_family(backend: RewriteBackend, routed: str, matched: str) -> bool:
    """Whether the analysis' kernel ``routed`` and the matched kernel ``matched`` are one, or two entries that
    replace the same chain pattern (``linear`` / ``linear_nobias``: the analysis routes the GEMM, the match knows
    whether it has a bias)."""
    kernels = backend.library.kernels
    if routed == matched:
        return True
    return routed in kernels and matched in kernels and kernels[routed].replaces == kernels[matched].replaces


class ChainLinks:
    """Which analysis chains hold each node of apply's pre-dispatch graphs.

    The analysis comes from analyze's own capture (AOTAutograd's decomposed graphs), apply's matches from its
    pre-dispatch graphs: two traces of the same dynamo graphs, with no node shared. They are linked by where each
    op came from: the graph index, the issuing module's path and the source line. A pre-dispatch node is in the
    chains whose ops share its key, most ops first (a line that two chains share, such as ``rotate_half`` under
    the q and the k RoPE, links to both). When the two captures cut the model into a different number of graphs,
    the graph index is left out of the key.
    """

    def __init__(self, by_key: dict[tuple[Any, ...], dict[str, int]], node_keys: dict[tuple[int, str], tuple],
                 order: dict[str, int], node_locs: dict[tuple[int, str], SourceLoc] | None = None):
        self._by_key, self._node_keys, self._order = by_key, node_keys, order
        self._node_locs = node_locs or {}

    @classmethod
    def build(cls, backend: RewriteBackend, analysis: Any) -> "ChainLinks":
        n_graphs = len({op.graph_index for op in analysis.ops})
        same_graphs = n_graphs == len([g for g in backend.graphs if g.graph is not None])
        chain_of_op = {op_id: c.id for c in analysis.chains for op_id in c.op_ids}
        by_key: dict[tuple[Any, ...], dict[str, int]] = {}
        for op in analysis.ops:
            cid = chain_of_op.get(op.id)
            if cid is None:
                continue
            key = (op.graph_index if same_graphs else -1, op.module_path, op.source.file, op.source.line)
            counts = by_key.setdefault(key, {})
            counts[cid] = counts.get(cid, 0) + 1
        node_keys: dict[tuple[int, str], tuple] = {}
        node_locs: dict[tuple[int, str], SourceLoc] = {}
        for g in backend.graphs:
            if g.graph is None:
                continue
            for n in g.graph.graph.nodes:  # g.graph: the canonical pre-dispatch GraphModule
                if n.op not in ("call_function", "call_method", "call_module"):
                    continue
                loc = source_of(n) if n.meta.get("stack_trace") else SourceLoc()
                node_keys[(g.index, n.name)] = (g.index if same_graphs else -1, module_path_of(n), loc.file,
                                                loc.line)
                if loc.file:
                    node_locs[(g.index, n.name)] = loc
        order = {c.id: i for i, c in enumerate(analysis.chains)}
        return cls(by_key, node_keys, order, node_locs)

    def first_source(self, graph_index: int, op_ids: Sequence[str]) -> SourceLoc | None:
        """The source line of the first of the pre-dispatch ops ``op_ids`` (in order) that has one, else None."""
        return next((self._node_locs[(graph_index, i.split(":", 1)[1])] for i in op_ids
                     if (graph_index, i.split(":", 1)[1]) in self._node_locs), None)

    def chains_of_node(self, graph_index: int, name: str) -> tuple[str, ...]:
        """Chains holding the node ``name`` of pre-dispatch graph ``graph_index``, most ops first."""
        counts = self._by_key.get(self._node_keys.get((graph_index, name), ()), {})
        return tuple(sorted(counts, key=lambda c: (-counts[c], self._order.get(c, 0))))

    def chains_of_ops(self, graph_index: int, op_ids: Sequence[str]) -> tuple[str, ...]:
        """Chains holding the ops ``op_ids`` (``"g<graph>:<node>"``), by how many of the ops each holds."""
        votes: dict[str, int] = {}
        for op_id in op_ids:
            for c in self.chains_of_node(graph_index, op_id.split(":", 1)[1]):
                votes[c] = votes.get(c, 0) + 1
        return tuple(sorted(votes, key=lambda c: (-votes[c], self._order.get(c, 0))))


def _values_for(backend: RewriteBackend, m: Match) -> tuple[list[Any] | None, list[Any] | None]:
    vals = backend.values.get(m.site.graph_index, {})
    args: list[Any] = []
    for a in m.args_template:
        if isinstance(a, Node):
            if a.name not in vals:
                return None, None
            args.append(vals[a.name])
        else:
            args.append(a)
    outs = []
    for o in m.out_nodes:
        if o.name not in vals:
            return args, None
        outs.extend(t for t in tensor_leaves(vals[o.name]))
    return args, outs


def _verify_and_time(s: SwapSite, m: Match, entry: Any, args: list[Any], outs: list[Any], rg: list[bool],
                     first: tuple[str, Any] | None, options: ApplyOptions, backward: bool,
                     timing_cache: dict[str, Any], stage: Stage = no_progress, where: str = "") -> Any:
    """Verify one candidate swap (only on its captured inputs when ``first``, an earlier site of the same signature,
    passed the fresh and hard-value cases), time it when verified, and decide; returns its ``SwapOutcome``.

    ``stage`` shows each step (verification, then timing where there is a GPU); ``where`` names the swap in it."""
    on_gpu = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
    cases = ("its captured inputs" if first is not None else
             f"its captured inputs, {options.seeds} fresh draw(s) and hard values")
    what = "forward and backward" if backward else "forward"
    try:
        with stage(f"verifying swap {where}: {what} on {cases} against float64"):
            ver = verify_swap(entry, extract_subgraph(m), args, m.pattern.params, backward, options.seeds, outs,
                              requires_grad=rg, captured_only=first is not None)
    except Exception as e:  # a bug in verification itself must not keep the swap, nor stop the others
        ver = SwapVerification(False, reason=f"verification raised {type(e).__name__}: {first_line(str(e))}")
    if first is not None:
        first_id, first_ver = first
        ver.details.append(f"fresh and hard-value cases: passed on {first_id} (same signature)")
        ver.cases += [f"{c} (on {first_id})" for c in first_ver.cases[1:]]
    timing = None
    if ver.verified:
        cache_key = f"{s.signature}|{backward}|{rg}"
        failure, out_of_memory = "", False
        try:
            timing = timing_cache.get(cache_key)
            if timing is None:
                # on a CPU bench_swap returns at once (not measured: the interpreter's speed says nothing)
                with stage(f"timing swap {where}: eager, torch.compile and the kernel") if on_gpu \
                        else contextlib.nullcontext():
                    timing = bench_swap(entry, extract_subgraph(m), args, backward, rg)
            timing_cache[cache_key] = timing
        except Exception as e:  # a kernel that fails (or runs out of memory) while timed is rejected
            failure = f"timing raised {type(e).__name__}: {first_line(str(e))}"
            out_of_memory = isinstance(e, torch.cuda.OutOfMemoryError)
        if failure:
            if out_of_memory:  # out of the handler, whose exception held the timed frames
                release_cuda_memory()
            return SwapOutcome(s.id, REJECTED, failure, ver, None)
    decision, reason = decide(ver, timing, options.margin, options.keep_unmeasured)
    return SwapOutcome(s.id, decision, reason, ver, timing)


def _verify_all(sites: list[SwapSite], matches: dict[str, Match], backend: RewriteBackend,
                kernels: dict[str, Any], options: ApplyOptions, backward: bool,
                stage: Callable[[str], contextlib.AbstractContextManager] = no_progress,
                swaps_until: float = math.inf) -> dict[str, Any]:
    """Verify (and on a GPU time) each candidate site, then drop overlaps; sites reached after ``swaps_until``
    (``time.perf_counter()`` seconds: half of ``--time-limit-s``) are not tried."""
    outcomes: dict[str, Any] = {}
    timing_cache: dict[str, Any] = {}
    by_signature: dict[str, tuple[str, Any]] = {}  # signature -> (first site id, its verification)
    flags: dict[int, dict[Node, bool]] = {}  # graph index -> node -> requires grad in the model
    for g in backend.graphs:
        if g.matches:
            flags[g.index] = grad_flags(g.matches[0].gm, g.input_requires_grad, g.grad_enabled)[0] if backward else {}
    n_candidates = sum(1 for x in sites if x.candidate)
    n_seen = 0
    for s in sites:
        if not s.candidate:
            outcomes[s.id] = SwapOutcome(s.id, NOT_TRIED, s.candidate_reason)
            continue
        if not options.verify:
            outcomes[s.id] = SwapOutcome(s.id, NOT_VERIFIED, "not verified: dry run (add --verify)")
            continue
        if time.perf_counter() > swaps_until:
            outcomes[s.id] = SwapOutcome(s.id, NOT_TRIED, f"not tried: swap checks stop at half of apply's "
                                                           f"--time-limit-s of {options.time_limit_s:g} s")
            continue
        n_seen += 1
        m = matches[s.id]
        entry = kernels[s.kernel]
        args, outs = _values_for(backend, m)
        if args is None:
            outcomes[s.id] = SwapOutcome(s.id, REJECTED, "verification impossible: the site's inputs were not "
                                                               "recorded during the forward pass")
            continue
        rg = [flags[s.graph_index].get(a, False) if isinstance(a, Node) else False for a in m.args_template]
        # fresh and hard-value inputs behave alike at every site of one signature: once they passed at one site,
        # the others are verified on their own captured inputs only
        sig = f"{s.signature}|{rg}"
        first = by_signature.get(sig)
        outcomes[s.id] = _verify_and_time(s, m, entry, args, outs, rg, first, options, backward, timing_cache,
                                          stage, f"{s.id} ({s.kernel}, {n_seen} of {n_candidates})")
        if first is None and outcomes[s.id].verification is not None and outcomes[s.id].verification.verified:
            by_signature[sig] = (s.id, outcomes[s.id].verification)
    resolve_overlaps(sites, outcomes)
    return outcomes


def resolve_overlaps(sites: list[SwapSite], outcomes: dict[str, SwapOutcome]) -> None:
    """Kept swaps must not overlap: those that beat torch.compile too take their ops first (an eager-rest-only swap
    that took them would leave variants with an Inductor rest neither), then larger ones first; a swap that loses
    an overlap is marked not kept, with what it earned alone."""
    taken: dict[str, SwapSite] = {}
    for s in sorted((s for s in sites if outcomes[s.id].kept),
                    key=lambda s: (not outcomes[s.id].kept_with_inductor, -s.n_ops)):
        clash = next((taken[o] for o in s.op_ids if o in taken), None)
        if clash is not None:
            o = outcomes[s.id]
            # the overlap decides; what the swap earned alone follows, so the reason never reads "kept ... not kept"
            larger = "the larger one" if clash.n_ops >= s.n_ops else "which beat torch.compile too"
            o.decision, o.reason = NOT_KEPT, (f"not kept: overlaps kept swap {clash.id} ({clash.kernel}), {larger}; "
                                              f"on its own: {o.reason.replace('kept because', 'would be kept as')}")
            continue
        for o in s.op_ids:
            taken[o] = s


