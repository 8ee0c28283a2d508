"""Stage 5b: the model's call. The chains' routes weighed together against the host time a routed call costs.

:func:`fusion_advisor.analyze.route.route_all` prices each chain alone. Carrying any route out changes how the
whole model is called: apply runs routed graphs through a dynamo backend (each captured graph a compiled call:
dynamo's guards, Inductor's wrapper), and a chain replayed from CUDA graphs makes that call a CUDA-graph tree's
replay. Those are fixed host costs per captured graph (:class:`HostCalls`, measured by calibrate:
``DeviceSpec.compiled_call_us``, ``graph_replay_us``) that no chain's price holds. On an H100 host a compiled call
cost about 3.7 eager adds of host time and a reduce-overhead call about 6.7 (benchmarks/results/h100/accuracy/
calibrate_compiled_call/): on a small model they can outweigh what the routed chains save, and a per-chain
"route to CUDA graphs" then advises a model slower than eager or than ``torch.compile(model)`` (a fresh user:
a Linear and four pointwise ops on the H200 spec, predicted 0.88x eager advised against 1.34x under
torch.compile(model)).

:func:`weigh_model_call` prices the model five ways, each the longer of its chains' device time and its host's
part (:func:`call_parts`): the rules' routes; the same with each CUDA-graph route a compiled one (where Inductor's
code beats eager, else as written); the same with every chain of a captured graph the rules graph a chain of
replayed too (the graph's call is a replay already, so its GEMMs and compiled chains cost no launches inside it:
a recurrent model's every step); on a GPU spec, every graph replayed (a host-bound model no rule graphed a chain
of: twelve Linear + ReLU layers); everything as written. The compiled or the replayed way replaces the rules'
where faster by :data:`CALL_MARGIN`, every graph replayed where the call's host part sets the time and replaying
is faster by :data:`WHOLE_MARGIN` (as the whole-model reduce-overhead route needs); as written replaces any where
predicted faster at all and the call's host part is what sets the routed time (the advice is not predicted
slower than the model as written for its calls). Leaving the model as written takes its library-kernel routes
too: on a model whose host sets the pace a kernel's device time saves nothing, and apply then tries no swap (it
times the model as written and torch.compile(model) whatever the routes). A chain routed on a profile's measured
bound class keeps its route (the roofline it would be weighed with is what the measurement overrode), and so does
one a rule of the user's own decided. The chains it changes say why, with the ways' times.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fusion_advisor.analyze.records import Analysis, Chain, Decision, Estimate
from fusion_advisor.analyze.route import SLOWER_SHARE, note_left_as_written

#: A way of carrying the routes out replaces the rules' only when predicted faster by more than this share
#: (route.SLOWER_SHARE's rounding margin).
CALL_MARGIN = SLOWER_SHARE

#: The way that replays every captured graph (no rule graphed a chain of some) replaces the others only when
#: predicted faster by more than this share, as a whole-model route must beat a simpler one
#: (report.views.ROUTE_MARGIN is this share): the margin apply's never-slower rule allows.
WHOLE_MARGIN = 0.03

#: Routes carried out inside a compiled call (skip is the model as written).
ROUTED = ("torch.compile", "triton", "cudagraphs")


@dataclass(frozen=True)
class HostCalls:
    """The host time a model's call pays beyond its chains' own kernels, from its device spec (us).

    Attributes:
        launch_us: one kernel launch inside a model (``launch_overhead_us`` at the spec's ``host_time_scale``, as
            the roofline charges a fused kernel).
        compiled_call_us: per call of a graph compiled by ``torch.compile`` (``DeviceSpec.compiled_call_us``:
            dynamo's guards, Inductor's wrapper).
        graph_replay_us: per call under ``mode="reduce-overhead"`` (``DeviceSpec.graph_replay_us``: the CUDA-graph
            tree's replay).
        graphs: captured graphs one model call runs (at least 1).
        input_copy_us: device time a call replayed from CUDA graphs spends copying the model's inputs into the
            graphs' static buffers (:func:`replay_input_copy_us`).
        unmeasured: where the spec's per-call costs were not measured on its GPU, the first clause of its
            ``compiled_call_source`` (the shipped h200 spec: "not measured on an H200"), else ``""``.
    """

    launch_us: float = 0.0
    compiled_call_us: float = 0.0
    graph_replay_us: float = 0.0
    graphs: int = 1
    input_copy_us: float = 0.0
    unmeasured: str = ""

    @classmethod
    def from_spec(cls, spec: Any, graphs: int, input_bytes: int = 0) -> "HostCalls":
        """The costs of a device spec (a :class:`~fusion_advisor.devices.DeviceSpec` or its ``to_dict()``) for
        ``graphs`` captured graphs and ``input_bytes`` of model inputs; a field the spec lacks costs 0;
        ``unmeasured`` from the YAML's ``compiled_call_source`` (:func:`_call_source`)."""
        get = spec.get if isinstance(spec, dict) else (lambda k: getattr(spec, k, None))
        return cls(launch_us=float(get("launch_overhead_us") or 0.0) * float(get("host_time_scale") or 1.0),
                   compiled_call_us=float(get("compiled_call_us") or 0.0),
                   graph_replay_us=float(get("graph_replay_us") or 0.0),
                   graphs=max(graphs, 1),
                   input_copy_us=replay_input_copy_us(input_bytes, float(get("memory_bandwidth_gbps") or 0.0)),
                   unmeasured=_unmeasured(_call_source(spec)))

    @classmethod
    def of(cls, analysis: Analysis) -> "HostCalls":
        """The costs of ``analysis``'s spec, for its captured graphs and inputs."""
        return cls.from_spec(analysis.device_spec or {}, len({op.graph_index for op in analysis.ops}),
                             analysis.input_bytes)


def replay_input_copy_us(input_bytes: int, bandwidth_gbps: float) -> float:
    """Device time (us) a call replayed through cudagraph trees (``mode="reduce-overhead"``, apply's CUDA-graph
    regions) spends copying the model's inputs into the graphs' static buffers: cudagraph trees copy every input
    that is not a parameter or buffer, ``input_bytes`` read and written at ``bandwidth_gbps``. Measured on the
    H200: six single-op KernelBench files with large inputs ran 1.4-2.2x slower under reduce-overhead than under
    torch.compile (benchmarks/results/h200/accuracy/cost_model/seed1_baselines.json). 0 without a bandwidth."""
    return 2.0 * input_bytes / (bandwidth_gbps * 1e9) * 1e6 if bandwidth_gbps > 0 else 0.0


def _call_source(spec: Any) -> str:
    """The spec's ``compiled_call`` source: ``sources["compiled_call"]`` of a DeviceSpec or of its ``to_dict()``
    (a YAML mapping's ``compiled_call_source`` key); ``""`` where there is none."""
    sources = spec.get("sources") if isinstance(spec, dict) else getattr(spec, "sources", None)
    if isinstance(sources, dict):
        return str(sources.get("compiled_call") or "")
    return str(spec.get("compiled_call_source") or "") if isinstance(spec, dict) else ""


def _unmeasured(source: str) -> str:
    """``"not measured on an H200"`` of a source beginning so (up to its first colon), else ``""``."""
    return source.split(":")[0].strip() if source.startswith("not measured") else ""


def _num(x: Any) -> float:
    """``x`` as a float, 0 for None or NaN (a chain without an estimate adds nothing)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(v) else v


def kept_from_replay(route: str, fixed: bool) -> bool:
    """Whether a chain on ``route`` runs apart from its graph's CUDA-graph replay in apply: its route a rule fixed
    (:attr:`~fusion_advisor.analyze.records.Decision.fixed`) and not to CUDA graphs (apply.search._region_executors
    keeps its region unreplayed; :func:`call_parts` prices it so)."""
    return fixed and route != "cudagraphs"


@dataclass(frozen=True)
class ChainCall:
    """One chain as the model's call issues it.

    Attributes:
        route: its route (:data:`~fusion_advisor.analyze.records.ROUTES`).
        after_us: its predicted time on that route (us; :func:`after_route_us`).
        host_us: the host time issuing its eager kernels (us; ``Estimate.launch_eager_us``).
        heavy: a heavy item (GEMM, convolution, attention): compiled, Inductor still calls cuBLAS / cuDNN / SDPA
            for it, as eagerly.
        graph: the captured graph it lives in.
        fixed: its route a rule fixed (:attr:`~fusion_advisor.analyze.records.Decision.fixed`): apply never
            replays its region with the graph's CUDA-graph regions (apply.search._region_executors).
    """

    route: str
    after_us: float
    host_us: float
    heavy: bool = False
    graph: int = 0
    fixed: bool = False

    @property
    def kept_from_replay(self) -> bool:
        """:func:`kept_from_replay` of its route."""
        return kept_from_replay(self.route, self.fixed)

    def issue_us(self, launch_us: float) -> float:
        """Host time issuing it (us): its eager kernels as written (and a heavy item compiled: Inductor calls
        the vendor library as eagerly), one launch (never more than as written) for a fused or library kernel,
        nothing replayed from a CUDA graph (the replay's own cost is the call's)."""
        host = _num(self.host_us)
        if self.route == "cudagraphs":
            return 0.0
        if self.route == "triton" or (self.route == "torch.compile" and not self.heavy):
            return min(host, launch_us)
        return host


def after_route_us(route: str, est: Estimate | None) -> float:
    """The chain's predicted time on its route (:meth:`Estimate.route_us`: the fused kernel at the share of the
    roofline the route's code reaches; under CUDA graphs without the launch floor), its eager time on skip; NaN
    without an estimate. A library kernel predicted slower than torch.compile or eager counts at the faster of
    those: it stays routed as a candidate, and apply keeps a swap only where it measures faster, else the faster
    whole-model variant (a fresh user's lone LayerNorm on h100 read "0.76x vs eager"; SwinMLP's LayerNorm chains,
    the kernel computing the LayerNorm alone between window copies, read 0.99x vs torch.compile(model))."""
    if est is None:
        return float("nan")
    t = est.route_us(route)
    return min(t, est.eager_us, est.route_us("torch.compile")) if route == "triton" else t


def call_parts(chains: Sequence[ChainCall], calls: HostCalls, every_graph_compiled: bool = False
               ) -> tuple[float, float]:
    """``(device us, host us)`` of one call of a model whose chains are ``chains``: their predicted times summed,
    and the host's part of the call, each chain's :meth:`ChainCall.issue_us` (none for a routed chain of a graph
    that holds a chain replayed from CUDA graphs: apply replays its compiled regions with it, but for a chain whose
    route a rule fixed) plus, per captured graph holding a chain replayed from CUDA graphs,
    ``calls.graph_replay_us`` (apply replays such regions through the CUDA-graph trees reduce-overhead uses: the
    whole call, its guards included; several regions of one graph count once, so this is a floor), per other graph
    holding a routed chain ``calls.compiled_call_us`` (apply carries routes out through a dynamo backend), and per
    graph holding both a replayed chain and a fixed compiled one, that compiled call and a second replay (the
    fixed region runs between the replayed ones); where a chain is replayed, the device time adds
    ``calls.input_copy_us`` (the inputs copied into the graphs' static buffers). ``every_graph_compiled``:
    ``torch.compile(model)``, every one of ``calls.graphs`` graphs a compiled call (no chain graphed)."""
    graphed = set() if every_graph_compiled else {c.graph for c in chains if c.route == "cudagraphs"}
    # apply replays a graph's compiled regions and library kernels with its CUDA-graph regions
    # (apply.search._region_executors): no launch of their own, but for a region a rule fixed
    in_graphed = [c.graph in graphed and c.route in ROUTED for c in chains]
    host = sum(0.0 if inside and not c.kept_from_replay else c.issue_us(calls.launch_us)
               for c, inside in zip(chains, in_graphed, strict=True))
    device = sum(_num(c.after_us) for c in chains)
    if every_graph_compiled:
        host += calls.graphs * calls.compiled_call_us
    else:
        compiled = {c.graph for c in chains if c.route in ROUTED} - graphed
        split = {c.graph for c, inside in zip(chains, in_graphed, strict=True) if inside and c.kept_from_replay}
        host += ((len(graphed) + len(split)) * calls.graph_replay_us
                 + (len(compiled) + len(split)) * calls.compiled_call_us)
        if graphed:
            device += calls.input_copy_us
    return device, host


def advised_us(chains: Sequence[ChainCall], calls: HostCalls) -> float:
    """The predicted time (us) of a model whose chains are ``chains``: the longer of its chains' device time and
    its host's part of a call (:func:`call_parts`). A call's fixed host cost hides under device work that outlasts
    it: the host issues the next call while the GPU runs this one."""
    return max(call_parts(chains, calls))


def _priced(chains: Sequence[Chain], estimates: dict[str, Estimate], routes: dict[str, str],
            calls: HostCalls, unused_us: float = 0.0, fixed: frozenset[str] = frozenset()) -> tuple[float, float]:
    """:func:`call_parts` of ``chains`` on ``routes`` (chain id -> route; ``fixed``: the ids whose route a rule
    fixed), plus ``unused_us`` of device time where nothing is routed: the model as written runs the work no output
    uses, which a routed model, called through dynamo, drops."""
    device, host = call_parts([ChainCall(routes[c.id], after_route_us(routes[c.id], estimates[c.id]),
                                         estimates[c.id].launch_eager_us, c.kind == "heavy", c.graph_index,
                                         c.id in fixed)
                               for c in chains], calls)
    return device + (unused_us if not any(r in ROUTED for r in routes.values()) else 0.0), host


def _compiled_instead(est: Estimate) -> str:
    """A CUDA-graph chain's route where the model's call is a compiled one: torch.compile where Inductor's code is
    predicted faster than eager (by route.SLOWER_SHARE), else as written."""
    return "torch.compile" if est.route_us("torch.compile") < est.eager_us * (1.0 - SLOWER_SHARE) else "skip"


def eager_tail(chains: Sequence[tuple[int, str]]) -> list[bool]:
    """Per chain, given as ``(graph index, pattern)`` in execution order: whether torch.compile leaves it as
    written. Dynamo stops at an nn.LSTM / GRU / RNN (``allow_rnn`` is off by default; the analysis captures with it
    on): the layer and every chain after it in its captured graph run eagerly (torch 2.13: of a Linear + sin, an
    LSTM, a Linear + cos, one graph of the Linear and the sin was compiled)."""
    stopped: set[int] = set()
    out = []
    for graph, pattern in chains:
        if pattern == "recurrent":
            stopped.add(graph)
        out.append(graph in stopped)
    return out


def _replayable(chain: Chain, route: str, graphs: set[int], fixed: frozenset[str], tail: frozenset[str]) -> bool:
    """Whether a replayed way moves ``chain`` (on ``route``) to CUDA graphs: it lies in one of ``graphs`` (graph
    indices), is left as written or compiled, is not in ``fixed``, and is not in ``tail`` (ids: a recurrent layer
    and the chains after it in its graph, which torch.compile runs as written, :func:`eager_tail`; a layer the
    rules route to CUDA graphs is replayed by apply's capture of the whole model, not through dynamo). A library
    kernel keeps its route: apply replays it with the graph's CUDA-graph regions (:func:`call_parts`)."""
    return (route in ("skip", "torch.compile") and chain.graph_index in graphs and chain.id not in fixed
            and chain.id not in tail)


def weigh_model_call(chains: Sequence[Chain], estimates: dict[str, Estimate], decisions: dict[str, Decision],
                     calls: HostCalls, unused_us: float = 0.0) -> dict[str, Decision]:
    """``decisions`` with the model's call weighed in (module docstring): the rules' routes, or each CUDA-graph
    route compiled instead (or left as written), or every chain of a graph holding one replayed with it, each
    taken in that order where predicted faster than the way chosen so far by :data:`CALL_MARGIN`; then every
    graph replayed (a GPU spec only) where the host's part sets the time of the way chosen and replaying is faster
    by :data:`WHOLE_MARGIN`; then every chain left as written where that is predicted faster than the way chosen
    and the call's host part sets the routed time; the changed decisions say why (their rule kept, its reason
    quoted). Chains without an estimate keep their decision; so do the chains whose decision is
    :attr:`~fusion_advisor.analyze.records.Decision.fixed` (routed on a profile's measured bound class or by a rule
    of the user's own), which take their route in every way.
    ``unused_us``: the eager time of the work no output uses (:attr:`Analysis.unused_us`), which only the model as
    written pays.
    Returns a new dict; raises nothing."""
    priced = [c for c in chains if c.id in estimates and c.id in decisions]
    if not priced:
        return dict(decisions)
    rules = {c.id: decisions[c.id].route for c in priced}
    fixed = frozenset(c.id for c in priced if decisions[c.id].fixed)
    tail = frozenset(c.id for c, t in zip(chains, eager_tail([(c.graph_index, getattr(c, "pattern", ""))
                                                               for c in chains]), strict=True) if t)
    graphed = {c.graph_index for c in priced if rules[c.id] == "cudagraphs" and c.id not in tail}
    # every graph replayed: only where the spec prices a replay (a GPU spec measured it; a CPU spec has none)
    every = {c.graph_index for c in priced} if calls.graph_replay_us > 0 else set()
    ways = {"rules": rules,
            "compiled": {i: (_compiled_instead(estimates[i]) if r == "cudagraphs" and i not in fixed else r)
                         for i, r in rules.items()},
            "replayed": {c.id: ("cudagraphs" if _replayable(c, rules[c.id], graphed, fixed, tail) else rules[c.id])
                         for c in priced},
            "every graph replayed": {c.id: ("cudagraphs" if _replayable(c, rules[c.id], every, fixed, tail)
                                            else rules[c.id]) for c in priced},
            "as written": {i: (r if i in fixed else "skip") for i, r in rules.items()}}
    parts = {name: _priced(priced, estimates, routes, calls, unused_us, fixed) for name, routes in ways.items()}
    times = {name: max(p) for name, p in parts.items()}
    best = "rules"
    for way in ("compiled", "replayed"):
        if ways[way] != ways[best] and times[way] < times[best] * (1.0 - CALL_MARGIN):
            best = way
    # every graph replayed where the host's launches set the pace (replaying a device-bound model drops only its
    # kernels' launch floors, which the rules weigh chain by chain)
    device, host = parts[best]
    whole = "every graph replayed"
    if ways[whole] != ways[best] and host > device and times[whole] < times[best] * (1.0 - WHOLE_MARGIN):
        best = whole
    # the call's host part must be what makes the advice slower than eager: a library kernel the prediction doubts
    # stays a candidate at its own price (route._kernel_doubt), for apply to measure
    device, host = parts[best]
    if ways["as written"] != ways[best] and times["as written"] < times[best] and host > device:
        best = "as written"
    if best == "rules":
        return dict(decisions)
    said = (f"the rules' routes {times['rules']:.1f} us, "
            + (f"CUDA-graph routes compiled instead {times['compiled']:.1f} us, "
               if ways["compiled"] != ways["rules"] else "")
            + (f"graphs with a replayed chain replayed whole {times['replayed']:.1f} us, "
               if ways["replayed"] != ways["rules"] else "")
            + (f"every graph replayed {times['every graph replayed']:.1f} us, "
               if ways["every graph replayed"] not in (ways["rules"], ways["replayed"]) else "")
            + f"as written {times['as written']:.1f} us"
            + (f"; the spec's per-call costs are {calls.unmeasured}" if calls.unmeasured else ""))
    costs = (f"{calls.compiled_call_us:.1f} us per compiled call"
             + (f", {calls.graph_replay_us:.1f} us per CUDA-graph replay" if "cudagraphs" in rules.values() else ""))
    replay = (f"a CUDA-graph replay costs {calls.graph_replay_us:.1f} us of host time per call of each captured "
              f"graph against {calls.compiled_call_us:.1f} us for a compiled call, more than replaying saves on this "
              f"model")
    out = dict(decisions)
    for i, route in ways[best].items():
        d = decisions[i]
        if route == d.route:
            continue
        if best == "every graph replayed":
            why = (f"replayed from CUDA graphs with its whole captured graph: the host's launches set this model's "
                   f"pace, and one CUDA-graph replay per graph ({calls.graph_replay_us:.1f} us of host time) costs "
                   f"less than them ({said})")
        elif best == "replayed":
            why = (f"replayed from CUDA graphs with the chains the rules graph in its captured graph: that graph is "
                   f"replayed anyway ({calls.graph_replay_us:.1f} us of host time per call), and inside the replay "
                   f"this chain costs no launch of its own ({said})")
        elif best == "compiled":
            why = (f"compiled instead of replayed from CUDA graphs: {replay} ({said})" if route == "torch.compile"
                   else f"left as written: {replay}, and Inductor's code is predicted no faster than eager for it "
                        f"({said})")
        else:
            why = (f"left as written: carrying the routes out costs the model's call more host time ({costs}, "
                   f"each captured graph) than its chains save ({said})")
        out[i] = dataclasses.replace(d, route=route, kernel="" if route != "triton" else d.kernel,
                                     reason=f"{why}. The rule's reason for its {d.route} route: {d.reason}",
                                     note=note_left_as_written(d.route, d.note) if route == "skip" else d.note)
    return out
