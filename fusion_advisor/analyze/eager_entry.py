"""Stage 5b helper: make a captured aten graph call the ops eager PyTorch calls, for ``analyze --profile``.

AOTAutograd records some ops below the entry point eager code dispatches to, and the op below runs other kernels.
BatchNorm is the one that matters: ``F.batch_norm`` (``nn.BatchNorm*d`` in eval mode, and ``F.instance_norm``,
which eager PyTorch runs as a batch norm over a ``(1, N*C, ...)`` view) calls ``aten::batch_norm``, which on a GPU
picks cuDNN's kernel; the captured graph calls ``_native_batch_norm_legit_no_training`` (or
``_native_batch_norm_legit.no_stats``), PyTorch's native kernels. On the H200 the module's call issued one device
activity and the graph's op three, with their own host time (benchmarks/results/h200/host/host_by_shape.json), so a
profile of the graph measured another BatchNorm than the model runs.

:func:`call_eager_entries` rewrites those nodes to call ``aten.batch_norm`` with the arguments eager code passes
(``cudnn_enabled`` as ``torch.backends.cudnn.enabled`` reads now). The op graph keeps the captured node and its id:
the new node carries it in ``node.meta[OP_ID_META]``.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

#: ``node.meta`` key of the op id (``"g0:_native_batch_norm_legit_no_training"``) a rewritten node stands for.
OP_ID_META = "fa_op_id"

_aten = torch.ops.aten


def _no_training(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``_native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps)``."""
    if len(args) != 7:
        return None
    x, w, b, mean, var, momentum, eps = args
    return x, w, b, mean, var, False, momentum, eps


def _no_stats(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``_native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)``: batch statistics."""
    if len(args) != 6:
        return None
    x, w, b, training, momentum, eps = args
    return x, w, b, None, None, training, momentum, eps


#: captured op -> the arguments of ``aten.batch_norm`` before ``cudnn_enabled`` (None: a call this does not know)
_BATCH_NORMS: dict[Any, Callable[[tuple[Any, ...]], tuple[Any, ...] | None]] = {
    _aten._native_batch_norm_legit_no_training.default: _no_training,
    _aten._native_batch_norm_legit.no_stats: _no_stats,
}


def _only_first_output_used(node: torch.fx.Node) -> bool:
    """Whether every use of ``node``'s tuple output is ``getitem(node, 0)``, or a ``getitem`` nobody reads: the
    saved mean and inverse std of an inference BatchNorm are empty, and ``aten.batch_norm`` returns neither."""
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem or user.kwargs:
            return False
        if user.args[1] != 0 and user.users:
            return False
    return True


def call_eager_entries(gm: torch.fx.GraphModule, graph_index: int) -> int:
    """Rewrite the BatchNorm nodes of ``gm`` (graph ``graph_index`` of the capture) to call ``aten.batch_norm`` as
    eager code does; recompile. A node with keyword arguments, an unknown arity or a used saved statistic is left
    as captured. Returns the number of nodes rewritten."""
    done = 0
    for node in list(gm.graph.nodes):
        how = _BATCH_NORMS.get(node.target) if node.op == "call_function" else None
        args = how(node.args) if how is not None and not node.kwargs else None
        if args is None or not _only_first_output_used(node):
            continue
        with gm.graph.inserting_after(node):
            eager = gm.graph.call_function(_aten.batch_norm.default, (*args, torch.backends.cudnn.enabled))
        eager.meta = {k: v for k, v in node.meta.items() if k != "val"}
        eager.meta[OP_ID_META] = node.meta.get(OP_ID_META, f"g{graph_index}:{node.name}")
        for user in list(node.users):
            if user.args[1] == 0:
                user.replace_all_uses_with(eager)
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.recompile()
    return done
