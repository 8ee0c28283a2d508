"""Rewriting matches into calls of the kernels' custom ops, and cutting a match out as a subgraph.

:func:`rewrite` replaces each selected match in a pre-dispatch graph by its kernel's ``replacement`` (traced to
a pre-dispatch graph that calls the ``fusion_advisor::`` custom op, inlined), larger matches first, overlaps
skipped with their reason. :func:`grad_flags` recomputes which values require grad (``make_fx`` drops it) so a
replacement is traced as it will run. :func:`extract_subgraph` cuts a match out as ``f(*inputs) -> outputs``
for per-swap verification.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.apply.canonical import node_value
from fusion_advisor.apply.match import Match
from fusion_advisor.analyze.capture import first_line, quiet_torch_logs
from fusion_advisor.verification.trees import tensor_leaves

#: Namespaces of PyTorch's own ops: a traced replacement must call at least one op from another (its kernel's).
_ATEN_NAMESPACES = frozenset({"aten", "prims"})

#: Ops whose result never requires grad.
_NO_GRAD_OPS = frozenset({torch.ops.aten.detach.default})


def grad_flags(gm: torch.fx.GraphModule, input_requires_grad: Sequence[bool],
               grad_enabled: bool) -> tuple[dict[Node, bool], dict[Node, bool]]:
    """Per node: whether its value requires grad at run time, and whether grad mode is on when it runs.

    ``make_fx`` drops ``requires_grad`` from ``meta["val"]``; this recomputes it from the inputs' flags, the
    grad-mode nodes (``_set_grad_enabled``) and the rule that a floating result of a differentiable op on a
    tensor that requires grad requires grad.
    """
    rg: dict[Node, bool] = {}
    mode: dict[Node, bool] = {}
    placeholders = iter(input_requires_grad)
    enabled = grad_enabled
    for n in gm.graph.nodes:
        mode[n] = enabled
        if n.op == "placeholder":
            rg[n] = bool(next(placeholders, False))
            continue
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            enabled = bool(n.args[0]) if n.args else enabled
            rg[n] = False
            continue
        if n.op != "call_function" or n.target in _NO_GRAD_OPS or not enabled:
            rg[n] = False
            continue
        ins: list[Node] = []
        torch.fx.node.map_arg((n.args, n.kwargs), lambda a: ins.append(a) or a)
        val = node_value(n)
        floating = any(t.is_floating_point() or t.is_complex() for t in tensor_leaves(val))
        rg[n] = floating and any(rg.get(a, False) for a in ins)
    return rg, mode


# --- rewriting ----------------------------------------------------------------------------------------------


def _real_like(val: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A real zero tensor with ``val``'s shape, strides, dtype and device (for tracing a replacement)."""
    t = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=val.device)
    with torch.no_grad():
        t.zero_()
    return t.requires_grad_(requires_grad and (t.is_floating_point() or t.is_complex()))


def trace_replacement(m: Match, requires_grad: dict[Node, bool], grad_mode: bool) -> torch.fx.GraphModule:
    """``m``'s kernel replacement traced to a pre-dispatch graph (it calls the ``fusion_advisor::`` custom op).

    Traced on real zero tensors, not fake ones: a ``triton_op``'s fake implementation runs its Python body, and
    under ``TRITON_INTERPRET=1`` that launches the interpreter, which cannot take fake tensors. The tensors carry
    the ``requires_grad`` the values have at run time, and grad mode is that of the site, because a replacement
    may branch on them (the cross-entropy kernel computes its gradient in the forward only when needed).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernel_library._op import registered_ops_only

    with unset_fake_temporarily():
        args = [_real_like(node_value(a), requires_grad.get(a, False)) if isinstance(a, Node) else a
                for a in m.args_template]
        with torch.set_grad_enabled(grad_mode), quiet_torch_logs(), registered_ops_only():
            gm = make_fx(m.pattern.entry.replacement, pre_dispatch=True)(*args)
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
           and n.target.namespace not in _ATEN_NAMESPACES]
    if not ops:  # the kernel ran unseen by the tracer: its result would be lost, never run such a graph
        raise RuntimeError(f"tracing the {m.site.kernel} replacement recorded no custom op call (the kernel "
                           f"launch was not traced)")
    return gm


def rewrite(gm: torch.fx.GraphModule, matches: Sequence[Match], input_requires_grad: Sequence[bool],
            grad_enabled: bool) -> tuple[list[Match], list[tuple[Match, str]]]:
    """Replace each match in ``gm`` by its kernel's custom op; larger matches first, overlaps skipped.

    Returns ``(applied, skipped)`` with a reason per skipped match. Ends with ``graph.lint()``, ``recompile()``.
    """
    applied: list[Match] = []
    skipped: list[tuple[Match, str]] = []
    taken: dict[Node, Match] = {}
    replaced: dict[Node, Node] = {}  # output node of an applied match -> the node that now computes it
    rg, mode = grad_flags(gm, input_requires_grad, grad_enabled)
    for m in sorted(matches, key=lambda m: -m.site.n_ops):
        nodes = set(m.nmap.values())
        clash = next((taken[n] for n in nodes if n in taken), None)
        if clash is not None:
            skipped.append((m, f"overlaps {clash.site.kernel} swap {clash.site.id} ({clash.site.key})"))
            continue
        modes = {mode[n] for n in nodes}
        if len(modes) != 1:
            skipped.append((m, "the pattern spans a grad-mode change"))
            continue
        # inputs produced by an earlier swap (one add_rmsnorm's residual feeds the next) now come from its op
        live = replace(m, args_template=[replaced.get(a, a) if isinstance(a, Node) else a for a in m.args_template],
                       binds=[replaced.get(b, b) for b in m.binds])
        try:
            rgm = trace_replacement(live, rg, modes.pop())
            new_outs = _inline(gm, live, rgm)
        except Exception as e:  # a kernel whose replacement fails to trace is skipped, the rest continues
            skipped.append((m, f"rewriting raised {type(e).__name__}: {first_line(str(e))}"))
            continue
        for old, new in zip(m.out_nodes, new_outs):
            if isinstance(new, Node):
                replaced[old] = new
                rg[new] = rg.get(old, False)
                mode[new] = mode.get(old, grad_enabled)
        for n in nodes:
            taken[n] = m
        applied.append(m)
    gm.graph.lint()
    gm.recompile()
    return applied, skipped


def _inline(gm: torch.fx.GraphModule, m: Match, rgm: torch.fx.GraphModule) -> list[Any]:
    """Insert ``rgm``'s ops for match ``m`` into ``gm``, reroute the outputs' users, erase the matched ops;
    return the new output values (nodes), aligned with ``m.out_nodes``."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    mapped = set(m.nmap.values())
    inputs = [a for a in m.args_template if isinstance(a, Node)]
    last_input = max((order[a] for a in inputs), default=-1)
    users = [u for o in m.out_nodes for u in o.users if u not in mapped]
    first_user = min((order[u] for u in users), default=len(order))
    if last_input >= first_user:
        raise RuntimeError("no place in the graph where all inputs exist and no output is used yet")
    anchor = m.out_nodes[0]
    before = next(n for n in graph.nodes if order[n] == first_user) if first_user < len(order) else None
    rph = [n for n in rgm.graph.nodes if n.op == "placeholder"]
    env: dict[Node, Any] = dict(zip(rph, m.args_template))
    ctx = graph.inserting_before(before) if before is not None else graph.inserting_before(
        next(n for n in graph.nodes if n.op == "output"))
    results: list[Any] = []
    inserted: list[Node] = []
    try:
        with ctx:
            for n in rgm.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "output":
                    results = torch.utils._pytree.tree_leaves(torch.fx.node.map_arg(n.args[0], lambda a: env[a]))
                    continue
                if n.op == "get_attr":
                    raise RuntimeError("the traced replacement holds constants (get_attr); cannot inline it")
                new = graph.node_copy(n, lambda a: env[a])
                inserted.append(new)
                for k in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                    if k in anchor.meta:
                        new.meta[k] = anchor.meta[k]
                new.meta["val"] = _fakeify(n.meta.get("val"), node_value(anchor))
                env[n] = new
        if len(results) != len(m.out_nodes):
            raise RuntimeError(f"replacement returns {len(results)} values, the pattern {len(m.out_nodes)}")
        for old, new in zip(m.out_nodes, results):
            old_val, new_val = node_value(old), node_value(new) if isinstance(new, Node) else new
            if not (isinstance(old_val, torch.Tensor) and isinstance(new_val, torch.Tensor)):
                raise RuntimeError("replacement and pattern outputs are not both tensors")
            if old_val.dtype != new_val.dtype or tuple(old_val.shape) != tuple(new_val.shape):
                raise RuntimeError(f"replacement output {tuple(new_val.shape)} {new_val.dtype} differs from the "
                                   f"pattern's {tuple(old_val.shape)} {old_val.dtype}")
    except Exception:  # leave the graph as it was: no half-inserted replacement runs
        for n in reversed(inserted):
            graph.erase_node(n)
        raise
    for old, new in zip(m.out_nodes, results):
        old.replace_all_uses_with(new)
    for n in reversed(list(graph.nodes)):
        if n in mapped and not n.users:
            graph.erase_node(n)
    return results


def _fakeify(val: Any, like: Any) -> Any:
    """``val`` (real tensors from the replacement trace) as fake tensors of ``like``'s fake mode."""
    mode = getattr(like, "fake_mode", None)
    if mode is None:
        return None

    def conv(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            with mode:
                return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
        return t

    return torch.utils._pytree.tree_map(conv, val)


# --- subgraph extraction (for verification) -----------------------------------------------------------------


def extract_subgraph(m: Match) -> torch.fx.GraphModule:
    """The matched ops of the user's graph as a GraphModule ``f(*tensor_inputs) -> outputs`` (one per output,
    a tuple when several), inputs in the pattern's parameter order."""
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    for i, b in enumerate(m.binds):
        if b not in env:
            ph = graph.placeholder(f"in{i}_{b.name}")
            ph.meta = dict(b.meta)
            env[b] = ph
    order = {n: i for i, n in enumerate(m.gm.graph.nodes)}
    for n in sorted(m.nmap.values(), key=order.__getitem__):
        env[n] = graph.node_copy(n, lambda a: env[a])
    outs = [env[o] for o in m.out_nodes]
    graph.output(outs[0] if len(outs) == 1 else tuple(outs))
    graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph)


