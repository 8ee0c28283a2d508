"""Canonical form of pre-dispatch aten graphs, the same for the model's graphs and the kernels' patterns.

:func:`canonicalize` removes no-op dtype casts, moves a dtype cast whose only user is a reshape after the reshape
(``x.float().view(-1, V)`` == ``x.view(-1, V).float()``; how causal-LM heads feed the loss) and drops a softmax
``dtype`` argument equal to the input's dtype.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.fx
from torch.fx import Node

#: ``aten.to`` overloads; they return their input itself when nothing changes (a no-op the canonicaliser drops).
_TO_OPS = frozenset({torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout, torch.ops.aten.to.device,
                     torch.ops.aten.to.other})
#: Pure dtype casts that may be moved after a reshape.
_CAST_OPS = frozenset({torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default})
#: Reshapes a dtype cast may be moved behind.
_RESHAPE_OPS = frozenset({torch.ops.aten.view.default, torch.ops.aten.reshape.default,
                          torch.ops.aten._unsafe_view.default})
#: Ops with a ``dtype`` argument that changes nothing when it equals the input's dtype.
_DTYPE_ARG_OPS = frozenset({torch.ops.aten.softmax.int, torch.ops.aten.log_softmax.int})
#: Ops whose ``dim`` (an int or a list) counts the input's axes: a negative one is written as ``dim % rank``, so that
#: ``softmax(x, 1)`` of a 2-D ``x`` and the pattern's ``softmax(x, -1)`` are the same graph.
_DIM_OPS = frozenset({
    torch.ops.aten.softmax.int, torch.ops.aten.log_softmax.int, torch.ops.aten._softmax.default,
    torch.ops.aten._log_softmax.default, torch.ops.aten.sum.dim_IntList, torch.ops.aten.mean.dim,
    torch.ops.aten.amax.default, torch.ops.aten.amin.default, torch.ops.aten.logsumexp.default,
    torch.ops.aten.var.correction, torch.ops.aten.var_mean.correction, torch.ops.aten.cumsum.default,
})


def node_value(n: Any) -> Any:
    """``meta["val"]`` of a node (its fake value), or ``n`` itself when it is not a node."""
    return n.meta.get("val") if isinstance(n, Node) else n


def _is_noop_to(node: Node) -> bool:
    """``aten.to`` that returns its input itself (same dtype, device, layout; no copy, no memory format)."""
    if node.op != "call_function" or node.target not in _TO_OPS:
        return False
    src, out = node_value(node.args[0]) if node.args else None, node_value(node)
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    norm = normalized_args(node)
    if norm.get("copy") or norm.get("memory_format") not in (None, torch.preserve_format):
        return False
    return src.dtype == out.dtype and src.device == out.device and src.layout == out.layout


def _pure_cast_dtype(node: Node) -> torch.dtype | None:
    """The target dtype of a cast that changes nothing but the dtype, else ``None``."""
    if node.op != "call_function" or node.target not in _CAST_OPS:
        return None
    norm = normalized_args(node)
    if node.target is torch.ops.aten.to.dtype:
        if norm.get("copy") or norm.get("non_blocking") or norm.get("memory_format") not in (None, torch.preserve_format):
            return None
        return norm.get("dtype")
    extra = {k: v for k, v in norm.items() if k not in ("self", "dtype") and v not in (None, False)}
    src, out = node_value(node.args[0]), node_value(node)
    if extra.keys() - {"layout", "device"} or not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    if out.device != src.device or out.layout != src.layout:
        return None
    return norm.get("dtype")


def canonicalize(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Rewrite ``gm`` in place into the canonical form patterns are matched in; return counts per rewrite.

    - ``noop_casts``: ``aten.to`` nodes that return their input itself are removed (uses point at the input);
    - ``casts_after_reshape``: ``view(cast(x, d), s)`` with the cast used only there becomes
      ``cast(reshape(x, s), d)`` — the same values (a cast is elementwise), and the cast moves fewer bytes;
    - ``redundant_dtype_args``: ``softmax(x, dim, dtype=x.dtype)`` becomes ``softmax(x, dim)`` (also log_softmax);
    - ``negative_dims``: a negative ``dim`` of a softmax or a reduction becomes ``dim % x.dim()``.

    Ends with ``graph.lint()`` and ``recompile()``.
    """
    counts = {"noop_casts": 0, "casts_after_reshape": 0, "redundant_dtype_args": 0, "negative_dims": 0}
    graph = gm.graph
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _DIM_OPS and _nonnegative_dims(node):
            counts["negative_dims"] += 1
        if node.op == "call_function" and node.target in _DTYPE_ARG_OPS:
            norm = normalized_args(node)
            src = node_value(norm.get("self"))
            if norm.get("dtype") is not None and isinstance(src, torch.Tensor) and norm["dtype"] == src.dtype:
                node.args, node.kwargs = (norm["self"], norm["dim"]), {}
                counts["redundant_dtype_args"] += 1
    for node in list(graph.nodes):
        if _is_noop_to(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            counts["noop_casts"] += 1
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _RESHAPE_OPS or not node.args:
            continue
        cast = node.args[0]
        if not isinstance(cast, Node) or len(cast.users) != 1:
            continue
        dtype = _pure_cast_dtype(cast)
        src = cast.args[0] if cast.args else None
        if dtype is None or not isinstance(src, Node) or not isinstance(node_value(src), torch.Tensor):
            continue
        shape = node.args[1]
        with graph.inserting_before(node):
            reshaped = graph.call_function(torch.ops.aten.reshape.default, (src, shape))
            recast = graph.call_function(cast.target, (reshaped,) + tuple(cast.args[1:]), dict(cast.kwargs))
        src_val = node_value(src)
        try:
            with _fake_mode_of(src_val):
                reshaped.meta["val"] = src_val.reshape(shape)
        except Exception:  # a shape the fake tensor refuses: leave this pair alone
            graph.erase_node(recast)
            graph.erase_node(reshaped)
            continue
        for k in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node"):
            if k in node.meta:
                reshaped.meta[k] = node.meta[k]
            if k in cast.meta:
                recast.meta[k] = cast.meta[k]
        recast.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(recast)
        graph.erase_node(node)
        graph.erase_node(cast)
        counts["casts_after_reshape"] += 1
    graph.lint()
    gm.recompile()
    return counts


def _nonnegative_dims(node: Node) -> bool:
    """Rewrite ``node``'s negative ``dim`` (int or list) as ``dim % rank`` of its input; whether it changed."""
    target = node.target
    names = [a.name for a in target._schema.arguments]
    if "dim" not in names or not node.args:
        return False
    src = node_value(node.args[0])
    if not isinstance(src, torch.Tensor) or src.dim() == 0:
        return False
    i = names.index("dim")
    in_args = i < len(node.args)
    dim = node.args[i] if in_args else node.kwargs.get("dim")
    rank = src.dim()
    if isinstance(dim, int) and not isinstance(dim, bool) and dim < 0:
        new: Any = dim % rank
    elif isinstance(dim, (list, tuple)) and dim and all(isinstance(d, int) for d in dim) and any(d < 0 for d in dim):
        new = type(dim)(d % rank for d in dim)
    else:
        return False
    if in_args:
        node.args = node.args[:i] + (new,) + node.args[i + 1:]
    else:
        node.kwargs = {**node.kwargs, "dim": new}
    return True


def _fake_mode_of(val: Any) -> contextlib.AbstractContextManager:
    mode = getattr(val, "fake_mode", None)
    return mode if mode is not None else contextlib.nullcontext()




def normalized_args(node: Node) -> dict[str, Any]:
    """Arguments of ``node`` by schema name with defaults filled (positional and keyword forms compare equal)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        out: dict[str, Any] = {}
        args = list(node.args)
        for i, a in enumerate(target._schema.arguments):
            if i < len(args) and not a.kwarg_only:
                out[a.name] = args[i]
            elif a.name in node.kwargs:
                out[a.name] = node.kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            else:
                out[a.name] = None
        return out
    out = {f"arg{i}": a for i, a in enumerate(node.args)}
    out.update(node.kwargs)
    return out
