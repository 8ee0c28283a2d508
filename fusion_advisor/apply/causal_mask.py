"""Causal masks a trace materialised, handed back to attention as ``is_causal=True``.

Under dynamo, transformers' sdpa attention builds its causal mask as a tensor (``masking_utils``: ``arange``
comparisons of the query and key positions, and-ed with a packed-sequence check) and passes it as ``attn_mask``,
where the model as written passes ``is_causal=True`` and no mask. A fused attention kernel given a mask reads it and
cannot skip the masked half of the score matrix: on the H200, the Llama-3-8B-width training step of issue 16 (4
layers, 2 x 2048 tokens) spent 2.34 ms per step in cuDNN's flash attention forward and backward as written and
6.89 / 7.29 ms through dynamo (``aot_eager`` / ``torch.compile``;
``benchmarks/results/h200/kernels/llama_advised/llama_kernel_diff.json``).

A mask is given back when the attention call's ``attn_mask`` reads no graph input or parameter (a function of the
graph's shapes alone, so one value holds for every call of the graph, which apply compiles per shape), draws no
random numbers, no op of the graph that writes in place reads it or what it is built from (``masked_fill_`` of a
padding mask after the causal one was built, ``setitem``, ``out=``, ``inplace=True``, ``set_``, a mutable aten op),
its value, computed once when the graph is compiled, is
exactly the top-left causal mask ``tril(ones(L, S))`` broadcast over its leading axes (a bool mask, or a float one
of 0 and -inf / the dtype's lowest), and the query and key lengths are equal, where top-left and bottom-right
alignment agree. The call then becomes ``attn_mask=None, is_causal=True``, everything else unchanged; the mask's
own nodes go when nothing else reads them (nothing else: an in-place update elsewhere whose result no node reads
stays). The result is the same attention; a variant with the rewrite is still checked against float64 and timed
like any other. A model given an ``attention_mask`` (even all ones) keeps it: that mask reads an input.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.analyze.graph import meta_value

#: The attention callables a graph may hold (dynamo's graph, the pre-dispatch aten graph).
SDPA_TARGETS = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention,
                torch.ops.aten.scaled_dot_product_attention.default)

#: Their arguments in order.
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")

#: Largest mask evaluated when a graph is compiled (elements): beyond it the call keeps its mask.
MAX_MASK_ELEMENTS = 1 << 28


def _argument(node: Node, name: str, default: Any = None) -> Any:
    i = SDPA_ARGS.index(name)
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[i] if len(node.args) > i else default


def _shape(node: Any) -> tuple[int, ...] | None:
    val = meta_value(node) if isinstance(node, Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _ancestors(node: Node) -> set[Node]:
    seen, todo = {node}, [node]
    while todo:
        for a in todo.pop().all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return seen


def _writes(n: Node) -> bool:
    """Whether ``n`` writes to a tensor in place: a method or function ending in ``_`` (``masked_fill_``,
    ``set_``, ``torch._foreach_zero_``), ``operator.setitem`` and the augmented assignments, an ``out=`` argument,
    ``inplace=True`` (``F.relu(x, inplace=True)``), a mutable aten op."""
    if n.op == "call_method":
        return n.target.endswith("_") and not n.target.startswith("__")
    if n.op != "call_function":
        return False
    if "out" in n.kwargs or n.kwargs.get("inplace") is True:
        return True
    if n.target in (operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                    operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
                    operator.ilshift, operator.irshift):
        return True
    name = getattr(n.target, "__name__", "")
    if name.endswith("_") and not name.endswith("__") and \
            getattr(n.target, "__module__", None) not in ("operator", "_operator"):  # operator.and_ writes nothing
        return True
    schema = getattr(n.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


#: Substrings of the ops that draw random numbers: a mask built with one is never folded (removing the op would
#: shift the random stream every later draw reads).
RANDOM_OPS = ("rand", "bernoulli", "dropout", "normal", "multinomial", "uniform", "exponential", "poisson",
              "cauchy", "geometric", "log_normal")


def _random(n: Node) -> bool:
    name = n.target if n.op == "call_method" else getattr(n.target, "__name__", str(n.target))
    return n.op in ("call_method", "call_function") and any(r in str(name).lower() for r in RANDOM_OPS)


def mutation_free(gm: torch.fx.GraphModule, node: Node, built_from: set[Node] | None = None) -> bool:
    """Whether no op of ``gm`` that writes in place (:func:`_writes`) takes as any argument ``node``, what it is
    built from, or anything derived from those other than through an attention call, and none of those draws
    random numbers. Conservative: a write to another tensor that merely reads the mask refuses too (``y.set_(m)``
    makes ``y`` the mask, and a later ``y.fill_`` changes it). ``built_from``: ``node``'s ancestors, when known."""
    built_from = _ancestors(node) if built_from is None else built_from
    if any(_writes(n) or _random(n) for n in built_from):
        return False  # evaluating an in-place op here could also write to a buffer of the model
    reach = set(built_from)
    for n in gm.graph.nodes:  # graph order: every node after its arguments
        if n in reach or (n.op == "call_function" and n.target in SDPA_TARGETS):
            continue
        if any(a in reach for a in n.all_input_nodes):
            if _writes(n):
                return False
            reach.add(n)
    return True


def constant_value(gm: torch.fx.GraphModule, node: Node) -> torch.Tensor | None:
    """The value of ``node`` computed from the graph's own nodes, or None when it reads a graph input or a
    submodule, an op writes to it or what it is built from in place (:func:`mutation_free`), or an op of it fails
    (a mask that depends on the inputs is left alone)."""
    needed = _ancestors(node)
    if any(n.op in ("placeholder", "call_module", "output") for n in needed) or not mutation_free(gm, node, needed):
        return None
    env: dict[Node, Any] = {}

    def value(a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: env[n])

    try:
        with torch.no_grad(), _real_tensors():
            for n in gm.graph.nodes:
                if n not in needed:
                    continue
                if n.op == "get_attr":
                    env[n] = operator.attrgetter(n.target)(gm)
                elif n.op == "call_function":
                    env[n] = n.target(*value(n.args), **value(n.kwargs))
                else:  # call_method
                    self_obj, *rest = value(n.args)
                    env[n] = getattr(self_obj, n.target)(*rest, **value(n.kwargs))
    except Exception:  # an op that cannot run outside the trace: the call keeps its mask
        return None
    out = env.get(node)
    return out if isinstance(out, torch.Tensor) else None


def _real_tensors() -> Any:
    """A context where new tensors are real, also inside a backend called under a fake-tensor mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def is_causal_mask(mask: torch.Tensor, q_len: int, k_len: int) -> bool:
    """Whether ``mask`` (``[..., q_len or 1, k_len]``) keeps exactly the positions ``j <= i`` of every query row
    ``i``: a bool mask (True = keep) or a float additive one (0 = keep, -inf or the dtype's lowest = masked), with
    ``q_len == k_len``."""
    if q_len != k_len or mask.dim() < 2 or tuple(mask.shape[-2:]) != (q_len, k_len):
        return False
    if mask.numel() > MAX_MASK_ELEMENTS:
        return False
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.is_floating_point():
        low = torch.finfo(mask.dtype).min
        if not bool(((mask == 0) | (mask <= low)).all()):
            return False
        keep = mask == 0
    else:
        return False
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril()
    return bool(torch.equal(keep, causal.expand_as(keep)))


def causal_mask_sites(gm: torch.fx.GraphModule) -> list[Node]:
    """The attention calls of ``gm`` whose mask is a constant top-left causal mask (module docstring)."""
    sites = []
    values: dict[tuple[Node, int, int], bool] = {}  # one mask is often read by every layer's call
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in SDPA_TARGETS:
            continue
        mask = _argument(n, "attn_mask")
        if not isinstance(mask, Node) or _argument(n, "is_causal", False):
            continue
        q, k = _shape(_argument(n, "query")), _shape(_argument(n, "key"))
        if q is None or k is None or len(q) < 2 or len(k) < 2:
            continue
        key = (mask, q[-2], k[-2])  # per lengths: one mask read by calls of other lengths is judged for each
        if key not in values:
            shape = _shape(mask)  # before building it: a mask too large to check is never built
            small = shape is not None and math.prod(shape) <= MAX_MASK_ELEMENTS and q[-2] == k[-2]
            m = constant_value(gm, mask) if small else None
            values[key] = m is not None and is_causal_mask(m, q[-2], k[-2])
        if values[key]:
            sites.append(n)
    return sites


def fold_causal_masks(gm: torch.fx.GraphModule, sites: list[Node] | None = None) -> int:
    """Rewrite every call of :func:`causal_mask_sites` (or ``sites``, its result) to ``attn_mask=None,
    is_causal=True`` in place (the mask's nodes removed when nothing else reads them, the module recompiled);
    returns how many calls changed."""
    sites = causal_mask_sites(gm) if sites is None else sites
    masks = [_argument(n, "attn_mask") for n in sites]
    for n in sites:
        args, kwargs = list(n.args), dict(n.kwargs)
        for name, new in (("attn_mask", None), ("is_causal", True)):
            i = SDPA_ARGS.index(name)
            if name in kwargs or len(args) <= i:
                kwargs[name] = new
            else:
                args[i] = new
        n.args, n.kwargs = tuple(args), kwargs
    if sites:
        own = set().union(*(_ancestors(m) for m in masks))  # mutation-free (causal_mask_sites checked)
        for n in reversed(list(gm.graph.nodes)):
            if n in own and not n.users:
                gm.graph.erase_node(n)
        gm.recompile()
    return len(sites)
