"""Stage 5: route every chain through the rules to SKIP, torch.compile or a library Triton kernel.

A triton route names a kernel (or ``auto``: the library kernel that replaces the chain's pattern). When that
kernel is not in ``kernel_library`` yet, or cannot take the chain (dtype, row width), the chain falls back to
torch.compile and the decision's note says why.
"""

from __future__ import annotations

from fusion_advisor.analyze.records import Chain, ChainMeasurement, Decision, Estimate, aten_name
from fusion_advisor.analyze.rules import RuleSet, render_reason
from fusion_advisor.dtypes import float_dtype


def _library() -> tuple[dict, str]:
    """The kernel registry, and an error message if importing the library failed."""
    try:
        from kernel_library.registry import load_all

        return load_all(), ""
    except Exception as e:  # a broken kernel module must not stop the analysis
        return {}, f"kernel_library failed to import ({type(e).__name__}: {e})"


#: A route predicted slower than eager by more than this share is left as written (a rounding of the same time,
#: or a route priced at eager's time because nothing measured says better, is not "slower").
SLOWER_SHARE = 0.01


def _left_as_written(route: str, rule_route: str, est: Estimate, device_kind: str, kind: str = "fusible") -> str:
    """Why the chain stays eager although a rule routed it, or ``""``: its torch.compile or CUDA-graph route is
    predicted slower than eager (on any spec: "routed to torch.compile (est. 664 -> 799 us)" promised a loss, and
    apply times torch.compile(model) whole anyway), or, on a CPU spec, the torch.compile stand-in for a GPU-only
    route is predicted to save nothing (nothing to fuse), or an op that fuses with nothing (``kind`` ``other``: a
    scan Inductor lowers on a GPU only) is predicted no faster compiled. A triton route stays
    (:func:`_kernel_doubt`)."""
    if route in ("skip", "triton"):  # a kernel the prediction doubts stays a candidate (_kernel_doubt)
        return ""
    route_us, eager_us = est.route_us(route), est.eager_us
    stand_in = device_kind != "gpu" and rule_route != route
    if stand_in and not route_us < eager_us:
        return (f"left as written: {route}, the stand-in for the rule's {rule_route} route on this spec, is "
                f"predicted at {route_us:.1f} us against eager's {eager_us:.1f} us.")
    if kind == "other" and route == "torch.compile" and not route_us < eager_us:
        return (f"left as written: torch.compile is predicted no faster than eager here ({route_us:.1f} us "
                f"against {eager_us:.1f} us).")
    if route_us > eager_us * (1.0 + SLOWER_SHARE):
        return (f"left as written: {route} is predicted slower than eager here ({route_us:.1f} us against "
                f"{eager_us:.1f} us; apply still times torch.compile(model)).")
    return ""


def note_left_as_written(route: str, note: str) -> str:
    """A decision's ``note`` once its chain, routed to ``route``, is left as written: a CPU stand-in's "the chain
    goes to torch.compile instead" says where it would go; a library kernel's note (a doubt that keeps it a
    candidate for apply) no longer holds and is dropped; any other note stays."""
    if route == "triton":
        return ""
    return note.replace("the chain goes to torch.compile instead", "torch.compile would take it instead")


def _kernel_doubt(chain: Chain, est: Estimate) -> str:
    """A note where the prediction doubts the library kernel the rule routed to: torch.compile or eager predicted
    faster (a kernel computing part of the chain, a softmax after a scale it does not fold, the rest left as
    written), else ``""``. The route stays: apply measures the swap and keeps it only where it wins (its candidates
    are the chains routed to a kernel), and the kernel's share was measured at other shapes than the chain's."""
    triton = est.route_us("triton")
    rivals = [(name, t) for name, t in (("torch.compile", est.route_us("torch.compile")), ("eager", est.eager_us))
              if t < triton * (1.0 - SLOWER_SHARE)]
    if not rivals:
        return ""
    name, t = min(rivals, key=lambda r: r[1])
    part = (f"; the kernel computes {len(chain.kernel_op_ids)} op(s) of the chain, the rest run as written"
            if chain.kernel_op_ids else "")
    return (f"predicted slower than {name} here ({triton:.1f} us against {t:.1f} us{part}): kept as a candidate, "
            f"apply measures the swap and keeps it only where it wins")


def route_chain(chain: Chain, est: Estimate, rules: RuleSet, kernels: dict, library_error: str = "",
                device_kind: str = "gpu", measured: ChainMeasurement | None = None) -> Decision:
    """The :class:`Decision` for one chain: the first matching rule, with the library fallback applied.

    ``device_kind`` is the device spec's kind: on a ``"cpu"`` spec a triton or cudagraphs route falls back to
    torch.compile (both need a CUDA GPU), with a note saying so, or to skip where torch.compile is predicted to
    save nothing (a single kernel: nothing to fuse), the reason saying why.
    ``measured`` is the chain's profiled measurement, when there is one (rules may match its bound class).
    A chain whose torch.compile or CUDA-graph route is predicted slower than eager stays as written, the reason
    giving both times and the rule's own reason (:func:`_left_as_written`); a library kernel predicted slower than
    torch.compile or eager stays routed to it, a note saying so (:func:`_kernel_doubt`).
    """
    rule, features = rules.first_match(chain, est, measured)
    if rule is None:
        return Decision(chain.id, "skip", "", "(none)", "", "no rule matched", est.bound)
    route, kernel, note = rule.route, "", ""
    if route == "triton" and device_kind != "gpu":
        route = "torch.compile"
        note = "library Triton kernels target GPUs; on a CPU device spec the chain goes to torch.compile instead"
    elif route == "cudagraphs" and device_kind != "gpu":
        route = "torch.compile"
        note = ("CUDA graphs replay CUDA kernels; on a CPU device spec the chain goes to torch.compile instead "
                "(Inductor's CPU code runs the chain's ops as one loop, without a dispatch each)")
    if route == "triton":
        candidates = (
            [k for k in kernels.values() if k.replaces == chain.pattern] if rule.kernel == "auto"
            else [kernels[rule.kernel]] if rule.kernel in kernels else []
        )
        # several kernels for one heavy op (linear for mm / addmm, matmul for bmm): the one meant for the item's op
        ops = {aten_name(t) for t in chain.targets}
        candidates.sort(key=lambda k: not set(k.heavy_targets) & ops)
        wanted = chain.pattern if rule.kernel == "auto" else rule.kernel
        if candidates and candidates[0].replaces != chain.pattern:  # a user rule naming another pattern's kernel
            route = "torch.compile"
            note = (f"kernel '{candidates[0].name}' replaces {candidates[0].replaces} chains and this chain is a "
                    f"{chain.pattern}; falling back to torch.compile")
        elif not candidates:
            route = "torch.compile"
            note = (
                f"kernel for '{wanted}' is not in kernel_library yet; falling back to torch.compile"
                + (f" ({library_error})" if library_error else "")
            )
        else:
            dtype = float_dtype(chain.dtype)
            refusals = []
            for k in candidates:
                ok, why = k.supports(dtype, chain.row_elems) if dtype is not None else (False, f"dtype {chain.dtype}")
                if ok:
                    kernel = k.name
                    break
                refusals.append(f"{k.name}: {why}")
            if not kernel:
                route = "torch.compile"
                note = "library kernel cannot take this chain (" + "; ".join(refusals) + "); falling back to torch.compile"
            else:
                note = _kernel_doubt(chain, est)
    reason = render_reason(rule, features, kernel=kernel or rule.kernel, route=route)
    left = _left_as_written(route, rule.route, est, device_kind, chain.kind)
    if left:
        # the note said where the chain would go instead; it stays as written (a fresh user read "skip" and "goes to
        # torch.compile instead" in one line)
        note = note_left_as_written(route, note)
        return Decision(chain.id, "skip", "", rule.id, rule.file,
                        f"{left} The rule's reason for its {rule.route} route: {reason}", rule.bound or est.bound,
                        note)
    return Decision(
        chain_id=chain.id,
        route=route,
        kernel=kernel,
        rule_id=rule.id,
        rules_file=rule.file,
        reason=reason,
        bound=rule.bound or est.bound,
        note=note,
    )


def route_all(chains: list[Chain], estimates: dict[str, Estimate], rules: RuleSet,
              device_kind: str = "gpu", measured: dict[str, ChainMeasurement] | None = None) -> dict[str, Decision]:
    """Decisions for every chain, keyed by chain id (``device_kind`` and ``measured`` as in :func:`route_chain`)."""
    kernels, error = _library() if device_kind == "gpu" else ({}, "")
    measured = measured or {}
    return {c.id: route_chain(c, estimates[c.id], rules, kernels, error, device_kind, measured.get(c.id))
            for c in chains}
