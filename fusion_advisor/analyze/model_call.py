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

:func:`weigh_model_call` prices the model three ways, each the longer of its chains' device time and its host's
part (:func:`advised_us`): the rules' routes; the same with each CUDA-graph route a compiled one (where Inductor's
code beats eager, else as written); everything as written. The compiled way replaces the rules' where faster by
:data:`CALL_MARGIN`; as written replaces either where predicted faster at all and the call's host part is what
sets the routed time (advice is not predicted slower than the model as written for its calls; a library kernel
the prediction doubts stays a candidate at its own price). The chains it changes say why, with the three times.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fusion_advisor.analyze.records import Analysis, Chain, Decision, Estimate

#: A way of carrying the routes out replaces a simpler one only when predicted faster by more than this share
#: (route.SLOWER_SHARE's rounding margin).
CALL_MARGIN = 0.01

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
        unmeasured: where the spec's per-call costs were not measured on its GPU, the first clause of its
            ``compiled_call_source`` (the shipped h200 spec: "not measured on an H200"), else ``""``.
    """

    launch_us: float = 0.0
    compiled_call_us: float = 0.0
    graph_replay_us: float = 0.0
    graphs: int = 1
    unmeasured: str = ""

    @classmethod
    def from_spec(cls, spec: Any, graphs: int) -> "HostCalls":
        """The costs of a device spec (a :class:`~fusion_advisor.devices.DeviceSpec` or its ``to_dict()``) for
        ``graphs`` captured graphs; a field the spec lacks costs 0."""
        get = spec.get if isinstance(spec, dict) else (lambda k: getattr(spec, k, None))
        return cls(launch_us=float(get("launch_overhead_us") or 0.0) * float(get("host_time_scale") or 1.0),
                   compiled_call_us=float(get("compiled_call_us") or 0.0),
                   graph_replay_us=float(get("graph_replay_us") or 0.0),
                   graphs=max(graphs, 1), unmeasured=_unmeasured(str(get("compiled_call_source") or "")))

    @classmethod
    def of(cls, analysis: Analysis) -> "HostCalls":
        """The costs of ``analysis``'s spec, for its captured graphs."""
        return cls.from_spec(analysis.device_spec or {}, len({op.graph_index for op in analysis.ops}))


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


def issued_us(launch_eager_us: Iterable[Any], one_launch: Iterable[bool], launch_us: float) -> float:
    """Host time (us) issuing chains' kernels: one launch (``launch_us``, never more than the chain's eager host
    time) for each chain where ``one_launch``, its eager host time (``launch_eager_us``) for the others."""
    return sum(min(_num(h), launch_us) if one else _num(h) for h, one in zip(launch_eager_us, one_launch))


def call_parts(routes: Sequence[str], after_route_us: Sequence[Any], launch_eager_us: Sequence[Any],
               calls: HostCalls) -> tuple[float, float]:
    """``(device us, host us)`` of a model whose chains take ``routes`` (per chain, aligned with their predicted
    ``after_route_us`` and eager host time ``launch_eager_us``): the chains' sum, and the host's part of a call. A
    chain left as written issues its eager kernels, a routed one at least one launch; per captured graph, where
    any chain is replayed from CUDA graphs, ``calls.graph_replay_us`` (apply replays such regions through the
    CUDA-graph trees reduce-overhead uses: the whole call, its guards included, and the replayed chains issue
    nothing more; several regions of one graph count once, so this is a floor), else, where any chain is routed,
    ``calls.compiled_call_us``."""
    graphed = [r == "cudagraphs" for r in routes]
    routed = [r in ROUTED for r in routes]
    host = issued_us((h for h, g in zip(launch_eager_us, graphed) if not g),
                     (r for r, g in zip(routed, graphed) if not g), calls.launch_us)
    if any(graphed):
        host += calls.graphs * calls.graph_replay_us
    elif any(routed):
        host += calls.graphs * calls.compiled_call_us
    return sum(_num(t) for t in after_route_us), host


def advised_us(routes: Sequence[str], after_route_us: Sequence[Any], launch_eager_us: Sequence[Any],
               calls: HostCalls) -> float:
    """The predicted time (us) of a model whose chains take ``routes``: the longer of its chains' device time and
    its host's part of a call (:func:`call_parts`). A call's fixed host cost hides under device work that outlasts
    it: the host issues the next call while the GPU runs this one."""
    return max(call_parts(routes, after_route_us, launch_eager_us, calls))


def _priced(chains: Sequence[Chain], estimates: dict[str, Estimate], routes: dict[str, str],
            calls: HostCalls) -> tuple[float, float]:
    """:func:`call_parts` of ``chains`` on ``routes`` (chain id -> route)."""
    est = [estimates[c.id] for c in chains]
    rs = [routes[c.id] for c in chains]
    return call_parts(rs, [e.route_us(r) for e, r in zip(est, rs)], [e.launch_eager_us for e in est], calls)


def _compiled_instead(est: Estimate) -> str:
    """A CUDA-graph chain's route where the model's call is a compiled one: torch.compile where Inductor's code is
    predicted faster than eager, else as written."""
    return "torch.compile" if est.route_us("torch.compile") < est.eager_us * (1.0 - CALL_MARGIN) else "skip"


def weigh_model_call(chains: Sequence[Chain], estimates: dict[str, Estimate], decisions: dict[str, Decision],
                     calls: HostCalls) -> dict[str, Decision]:
    """``decisions`` with the model's call weighed in (module docstring): the rules' routes, or each CUDA-graph
    route compiled instead (or left as written) where that is predicted faster by :data:`CALL_MARGIN`, or every
    chain left as written where that is predicted faster than either and the call's host part sets the routed
    time; the changed decisions say why (their rule kept, its reason quoted). Chains without an estimate keep
    their decision. Returns a new dict; raises nothing."""
    priced = [c for c in chains if c.id in estimates and c.id in decisions]
    if not priced:
        return dict(decisions)
    rules = {c.id: decisions[c.id].route for c in priced}
    ways = {"rules": rules,
            "compiled": {i: (_compiled_instead(estimates[i]) if r == "cudagraphs" else r) for i, r in rules.items()},
            "as written": {i: "skip" for i in rules}}
    parts = {name: _priced(priced, estimates, routes, calls) for name, routes in ways.items()}
    times = {name: max(p) for name, p in parts.items()}
    best = "rules"
    if ways["compiled"] != ways["rules"] and times["compiled"] < times["rules"] * (1.0 - CALL_MARGIN):
        best = "compiled"
    # the call's host part must be what makes the advice slower than eager: a library kernel the prediction doubts
    # stays a candidate at its own price (route._kernel_doubt), for apply to measure
    device, host = parts[best]
    if ways["as written"] != ways[best] and times["as written"] < times[best] and host > device:
        best = "as written"
    if best == "rules":
        return dict(decisions)
    said = (f"the rules' routes {times['rules']:.1f} us, CUDA-graph routes compiled instead "
            f"{times['compiled']:.1f} us, as written {times['as written']:.1f} us"
            + (f"; the spec's per-call costs are {calls.unmeasured}" if calls.unmeasured else ""))
    out = dict(decisions)
    for i, route in ways[best].items():
        d = decisions[i]
        if route == d.route:
            continue
        replay = (f"a CUDA-graph replay costs {calls.graph_replay_us:.1f} us of host time per call of each "
                  f"captured graph against {calls.compiled_call_us:.1f} us for a compiled call, more than replaying "
                  f"saves on this model")
        if best == "compiled":
            why = (f"compiled instead of replayed from CUDA graphs: {replay} ({said})" if route == "torch.compile"
                   else f"left as written: {replay}, and Inductor's code is predicted no faster than eager for it "
                        f"({said})")
        else:
            why = (f"left as written: carrying the routes out costs the model's call more host time "
                   f"({calls.compiled_call_us:.1f} us per compiled call, {calls.graph_replay_us:.1f} us per "
                   f"CUDA-graph replay, each captured graph) than its chains save ({said})")
        out[i] = dataclasses.replace(d, route=route, kernel="" if route != "triton" else d.kernel,
                                     reason=f"{why}. The rule's reason for its {d.route} route: {d.reason}")
    return out
