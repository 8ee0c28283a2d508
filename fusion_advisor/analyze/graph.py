"""Stage 3: the op graph — one node per aten op, with shapes, dtypes, FLOPs, bytes and source line.

Built as a ``networkx.DiGraph`` from the captured aten graphs. Node keys are op ids (``"g0:mm_3"``); node
attribute ``op`` holds the :class:`~fusion_advisor.analyze.records.OpInfo`. Graph inputs (parameters, user inputs) are
nodes with ``op=None``. An edge ``u -> v`` means v reads a tensor u produced; attribute ``meta`` is that tensor.

FLOPs: matmul, convolution and attention from ``torch.utils.flop_counter``'s formulas (a multiply-add counts 2);
pointwise ops 1 per output element; reductions 1 per input element; softmax and normalization 5 per element
(max/mean, subtract, exp/square, sum, scale) — approximations that only matter where compute is the ceiling.
Bytes: each tensor input read once and each output written once, as if the op ran as its own kernel; broadcast
(stride-0) dimensions count once; views and metadata ops move 0 bytes.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable

import networkx as nx
import torch
import torch.fx
from torch.utils.flop_counter import conv_flop_count, flop_registry

from fusion_advisor.analyze.capture import Capture, source_of
from fusion_advisor.analyze.composites import composite_record
from fusion_advisor.devices.op_rates import RECURRENT_CELLS
from fusion_advisor.dtypes import COMPLEX_NAMES, dtype_name
from fusion_advisor.analyze.load import KEYWORD_WRAPPER_ATTR
from fusion_advisor.analyze.records import OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.sdpa import BACKEND_OF_TARGET, choose_backend, fused_kernels, math_kernels
from fusion_advisor.verification.trees import tensor_leaves

CATEGORIES = (
    "pointwise",
    "reduction",
    "normalization",
    "softmax",
    "matmul",
    "conv",
    "attention",
    "view",
    "copy",
    "embedding",
    "recurrent",
    "other",
)

#: Categories one fused kernel (Inductor's or a handwritten Triton one) can take into a chain.
FUSIBLE = frozenset({"pointwise", "reduction", "normalization", "softmax", "copy"})
#: Categories served by a vendor library (cuBLAS, cuDNN, flash attention) or a gather: routing items of their own.
HEAVY = frozenset({"matmul", "conv", "attention", "embedding", "recurrent"})

_BY_NAME: dict[str, set[str]] = {
    # element-wise ops that torch does not tag pointwise (the rest are found by torch.Tag.pointwise)
    "pointwise": {"floor_divide", "hardswish", "hardswish_backward", "log_sigmoid_forward", "log_sigmoid_backward",
                  "prelu", "_prelu_kernel", "rrelu_with_noise", "where", "glu", "native_dropout", "dropout"},
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "matmul", "dot", "mv", "addmv", "_int_mm", "linear",
               "einsum"},
    "conv": {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable", "_slow_conv2d_forward",
             "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"},
    "attention": {"attention", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "_flash_attention_forward", "_efficient_attention_forward", "scaled_dot_product_attention"},
    "embedding": {"embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"},
    # cuDNN's recurrent layer stacks: our opaque op (capture.py) and the aten ops a GPU trace names
    "recurrent": {"recurrent", "_cudnn_rnn", *RECURRENT_CELLS},
    "softmax": {"_softmax", "_safe_softmax", "_log_softmax", "softmax", "log_softmax"},
    "normalization": {"native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
                      "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
                      "_fused_rms_norm", "rms_norm", "layer_norm", "group_norm", "batch_norm"},
    "reduction": {"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "prod",
                  "norm", "linalg_vector_norm", "logsumexp", "argmax", "argmin", "any", "all", "nll_loss_forward",
                  "nll_loss2d_forward", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy"},
    "copy": {"_to_copy", "clone", "cat", "stack", "copy", "constant_pad_nd", "contiguous", "_unsafe_view_copy",
             "repeat", "flip", "roll", "tril", "triu", "fill", "zeros_like", "ones_like", "full_like",
             "arange", "ones", "zeros", "full", "scalar_tensor", "new_ones", "new_zeros", "new_full", "empty",
             "new_empty", "empty_like", "empty_strided", "lift_fresh_copy",
             # writes of a slice into a copy, and gathers (:data:`GATHERS`): Inductor's code indexes them inside a
             # fused kernel (torch/_inductor/lowering.py lowers them as loads and stores with computed indices)
             "slice_scatter", "select_scatter", "diagonal_scatter", "index_select", "index", "gather", "take"},
    "view": {"_unsafe_view", "view", "reshape", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
             "slice", "select", "as_strided", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind",
             # the unsafe variants (aten.unsafe_split: what a GRU / LSTM cell's decomposition splits its gates with)
             # return views as well
             "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk", "tensor_split",
             "unflatten", "flatten", "narrow", "view_as", "expand_as", "_reshape_alias", "diagonal", "unfold",
             "_unsafe_index_put",
             # reads of a tensor's sizes and checks on them (data-dependent shapes): host-side, no kernel
             "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_assert_scalar", "sym_constrain_range",
             "sym_constrain_range_for_size", "_assert_tensor_metadata"},
}
_NAME_TO_CATEGORY = {name: cat for cat, names in _BY_NAME.items() for name in names}

#: Ops that read only the elements their index tensors select from their first input: they read their indices and
#: as many of the source's elements as they write (``aten.embedding`` is counted the same way).
GATHERS = frozenset({"index_select", "index", "gather", "take"})

#: FLOPs per element for ops that are not matmul-like (see module docstring).
_FLOPS_PER_ELEM = {"pointwise": 1, "reduction": 1, "softmax": 5, "normalization": 5, "copy": 0}


def row_major_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a layout is read in memory order by an elementwise kernel (:attr:`TensorMeta.contiguous`): the dims
    that move (size > 1, stride != 0) are non-overlapping with strides in decreasing order (``stride[i] >=
    stride[i+1] * size[i+1]``) and the innermost has stride 1. Broadcasts and offset/slice views pass; permutations
    and step slices do not."""
    moving = [(int(size), int(stride)) for size, stride in zip(shape, strides) if size > 1 and stride != 0]
    if not moving:
        return True
    if moving[-1][1] != 1:
        return False
    return all(outer[1] >= inner[1] * inner[0] for outer, inner in zip(moving, moving[1:]))


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    """:class:`TensorMeta` of a (fake or real) tensor; broadcast dims (stride 0) count once in ``nbytes``;
    ``contiguous`` from the strides (:func:`row_major_order`)."""
    shape = tuple(int(s) for s in t.shape)
    numel = 1
    stored = 1
    try:
        strides = t.stride()
    except (RuntimeError, NotImplementedError):  # sparse or nested tensors
        strides = (1,) * len(shape)
    for size, stride in zip(shape, strides):
        numel *= size
        if stride != 0:
            stored *= size
    if numel == 0:
        stored = 0
    return TensorMeta(shape=shape, dtype=dtype_name(t.dtype), numel=numel, nbytes=stored * t.element_size(),
                      contiguous=row_major_order(shape, tuple(int(s) for s in strides)))


def _op_name(target: Any) -> str:
    """``aten.mm.default`` -> ``"mm"``; custom ops -> their op name; Python callables -> ``__name__``."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def categorize(target: Any) -> str:
    """Category (one of :data:`CATEGORIES`) of a call_function target."""
    if target is operator.getitem:
        return "view"
    name = _op_name(target)
    pointwise = isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
    if name in _NAME_TO_CATEGORY:
        # ``aten.min.other`` / ``aten.max.other`` (an export's ``torch.min(x, y)``) are elementwise, not reductions
        return "pointwise" if pointwise and _NAME_TO_CATEGORY[name] == "reduction" else _NAME_TO_CATEGORY[name]
    if isinstance(target, torch._ops.OpOverload):
        if torch.Tag.pointwise in target.tags:
            return "pointwise"
        returns = target._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return "view"
    return "other"


def meta_value(node: Any) -> Any:
    """The (fake) value a traced node holds: ``meta["val"]`` (aten graphs), else ``meta["example_value"]`` (dynamo's
    graphs); a non-node argument as it is."""
    return node.meta.get("val", node.meta.get("example_value")) if isinstance(node, torch.fx.Node) else node


def _materialize(arg: Any) -> Any:
    """Replace fx nodes in ``arg`` by their fake values (for FLOP formulas)."""
    return torch.fx.node.map_aggregate(arg, meta_value)


#: Convolutions an export keeps whole (``torch.export`` preserves these composite ops; dynamo's graphs lower them
#: to ``aten.convolution``), with whether each is transposed.
_WHOLE_CONVS = {"conv1d": False, "conv2d": False, "conv3d": False,
                "conv_transpose1d": True, "conv_transpose2d": True, "conv_transpose3d": True}


def einsum_flops(equation: str, shapes: list[tuple[int, ...]]) -> int:
    """FLOPs of ``torch.einsum(equation, *operands)`` contracted left to right, pairwise (2 per multiply-add): each
    step multiplies the running result by the next operand over every index either holds, then keeps the indices a
    later operand or the output still needs. 0 where the equation does not read (an ellipsis, a missing ``->``, a
    subscript count or size that does not match the shapes). Source: the cost model of ``opt_einsum``'s pairwise
    contractions (Smith & Gray, "opt_einsum", JOSS 2018), in the operand order written, as ``torch.einsum`` runs it
    without ``opt_einsum``."""
    if "..." in equation or "->" not in equation:
        return 0
    lhs, out = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes) or any(len(s) != len(shape) for s, shape in zip(terms, shapes, strict=True)):
        return 0
    size: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        for letter, n in zip(term, shape, strict=True):
            if size.setdefault(letter, int(n)) != int(n) and 1 not in (n, size[letter]):
                return 0
            size[letter] = max(size[letter], int(n))
    flops, held = 0, set(terms[0])
    for i, term in enumerate(terms[1:], start=1):
        both = held | set(term)
        n = 1
        for letter in both:
            n *= size[letter]
        flops += 2 * n
        later = set(out).union(*terms[i + 1:]) if i + 1 < len(terms) else set(out)
        held = {letter for letter in both if letter in later}
    return flops


def _matmul_like_flops(target: Any, node: torch.fx.Node, out: Any) -> int:
    name = _op_name(target)
    if name in _WHOLE_CONVS:  # an exported conv2d / conv_transpose2d...: input, weight, bias, ...
        x, w = meta_value(node.args[0]), meta_value(node.args[1])
        if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and isinstance(out, torch.Tensor):
            return int(conv_flop_count(list(x.shape), list(w.shape), list(out.shape), transposed=_WHOLE_CONVS[name]))
        return 0
    if name in ("mv", "dot", "vdot", "addmv", "_int_mm"):  # not in torch's flop_registry (a reviewer: 0 FLOPs)
        # mv [M, K] @ [K], dot [K] . [K], addmv(bias, [M, K], [K]), _int_mm [M, K] @ [K, N]: 2 per multiply-add
        a = meta_value(node.args[1 if name == "addmv" else 0])
        if isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor) and a.dim() >= 1:
            return 2 * out.numel() * a.shape[-1]  # an empty output: none (a 0-d one has numel 1)
        return 0
    if name == "matmul":  # an exported torch.matmul: [..., M, K] @ [..., K, N], 2 FLOPs per multiply-add
        a = meta_value(node.args[0])
        if isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor) and a.dim() >= 1:
            return 2 * max(out.numel(), 1) * a.shape[-1]
        return 0
    if name == "einsum" and node.args and isinstance(node.args[0], str):
        operands = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
        values = [meta_value(a) for a in operands]
        if all(isinstance(v, torch.Tensor) for v in values):
            return einsum_flops(node.args[0], [tuple(v.shape) for v in values])
        return 0
    if name in ("attention", "scaled_dot_product_attention"):  # QK^T and PV, 2 FLOPs per multiply-add
        q, k, v = (meta_value(a) for a in node.args[:3])
        # batch x heads of the output: SDPA broadcasts q's, k's and v's leading dims
        batch = out.numel() // max(out.shape[-2] * out.shape[-1], 1) if isinstance(out, torch.Tensor) else \
            q.numel() // max(q.shape[-2] * q.shape[-1], 1)
        flops = 2 * batch * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        causal = node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False)
        # a causal flash kernel skips the masked upper triangle: about half the work when q and k are as long
        return flops // 2 if causal is True and q.shape[-2] == k.shape[-2] else flops
    if name == "linear":  # aten.linear (an export keeps it whole): x [..., K] @ weight[N, K].T
        x, w = meta_value(node.args[0]), meta_value(node.args[1])
        if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() >= 1 and w.dim() == 2:
            return 2 * (x.numel() // max(x.shape[-1], 1)) * w.shape[0] * x.shape[-1]
        return 0
    packet = getattr(target, "overloadpacket", None)
    fn = flop_registry.get(packet)
    if fn is None:
        return 0
    try:
        return int(fn(*_materialize(node.args), **_materialize(node.kwargs), out_val=out))
    except Exception:  # a formula that does not accept this overload's arguments: count as unknown
        return 0


def _recurrent_args(node: torch.fx.Node) -> tuple[str, Any, list[Any], int, bool, bool] | None:
    """``(cell, x, params, num_layers, bidirectional, batch_first)`` of a recurrent node, tensors as fake values:
    our opaque op (:func:`fusion_advisor.analyze.capture._recurrent`, the cell its first argument) or the aten op
    ``aten.<cell>.input`` an export or symbolic trace records (``input, hx, params, has_biases, num_layers,
    dropout, train, bidirectional, batch_first``); None for other nodes (the packed-sequence overloads included)."""
    name = _op_name(node.target)
    if name == "recurrent" and len(node.args) >= 10:
        cell, args = str(node.args[0]), node.args[1:10]
    elif name in RECURRENT_CELLS and len(node.args) >= 9 and isinstance(node.args[2], (list, tuple)):
        cell, args = name, node.args[:9]
    else:
        return None
    x, _, params, _, layers, _, _, bidir, batch_first = args
    return cell, meta_value(x), [meta_value(p) for p in params], int(layers), bool(bidir), bool(batch_first)


def recurrent_geometry(node: torch.fx.Node) -> tuple[str, int, int]:
    """``(cell, steps, FLOPs)`` of a recurrent op; ``("", 0, 0)`` when unreadable.

    cell: ``lstm``, ``gru``, ``rnn_tanh`` or ``rnn_relu``. steps: the cell steps that run one after another,
    ``layers * directions * sequence length``. FLOPs: every weight matrix (``w_ih [gates * hidden, in]``,
    ``w_hh [gates * hidden, hidden]`` per layer and direction) multiplies one vector per token, 2 FLOPs per
    multiply-add: ``2 * batch * seq * sum(w.numel())``; the gates' elementwise work is not counted."""
    args = _recurrent_args(node)
    if args is None or not isinstance(args[1], torch.Tensor) or args[1].dim() != 3:
        return "", 0, 0
    cell, x, params, layers, bidir, batch_first = args
    seq = x.shape[1] if batch_first else x.shape[0]
    weights = sum(p.numel() for p in params if isinstance(p, torch.Tensor) and p.dim() == 2)
    return cell, int(layers * (2 if bidir else 1) * seq), int(2 * x.shape[0] * x.shape[1] * weights)


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = (None, None, None, None, 0.0, False, None, False)


def _sdpa_call(node: torch.fx.Node) -> dict[str, Any]:
    """The arguments of an SDPA-signature node (our opaque op or ``aten.scaled_dot_product_attention``) by name,
    tensors as their fake values."""
    call = dict(zip(_SDPA_PARAMS, _SDPA_DEFAULTS))
    call.update(zip(_SDPA_PARAMS, node.args))
    call.update({k: v for k, v in node.kwargs.items() if k in call})
    return {k: meta_value(v) for k, v in call.items()}


def attention_variant(node: torch.fx.Node, name: str) -> tuple[str, int]:
    """``(backend, eager kernels)`` of an attention node: the SDPA backend torch runs on a GPU
    (:func:`fusion_advisor.analyze.sdpa.choose_backend`: torch's own choice when CUDA is present, else the sm80/sm90 rule)
    and the kernels it launches eagerly (:func:`fusion_advisor.analyze.sdpa.fused_kernels` for the fused backends,
    :func:`fusion_advisor.analyze.sdpa.math_kernels` for math). Ops named after their backend keep it; ``("", 1)`` when the arguments cannot be read."""
    if name in BACKEND_OF_TARGET:
        return BACKEND_OF_TARGET[name], 1
    if name not in ("attention", "scaled_dot_product_attention"):
        return "", 1
    call = _sdpa_call(node)
    q, k, v, mask = call["query"], call["key"], call["value"], call["attn_mask"]
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)) or not (mask is None or isinstance(mask, torch.Tensor)):
        return "", 1
    try:
        dropout = float(call["dropout_p"] or 0.0)
        causal = call["is_causal"] is True
        gqa = bool(call["enable_gqa"]) and q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3]
        backend, _ = choose_backend(q, k, v, mask, dropout, causal, call["scale"], bool(call["enable_gqa"]))
        kind = "" if mask is None else "bool" if mask.dtype == torch.bool else "float"
        if backend != "math":
            return backend, fused_kernels(kind)
        permuted = sum(not row_major_order(tuple(t.shape), tuple(t.stride())) for t in (q, k, v))
        return backend, math_kernels(kind, causal, dropout, gqa, permuted)
    except (TypeError, ValueError, RuntimeError):  # symbolic sizes or odd arguments: backend unknown
        return "", 1


def module_path_of(node: torch.fx.Node) -> str:
    """Dotted path of the nn.Module that issued ``node`` (from dynamo's ``nn_module_stack``), ``""`` at top level."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    for prefix in ("L['self'].", "L['self']", "L__self___", "self."):
        if path.startswith(prefix):
            path = path[len(prefix) :]
    path = path.replace("['", ".").replace("']", "").replace("[", ".").replace("]", "").strip(".")
    if path == KEYWORD_WRAPPER_ATTR or path.startswith(KEYWORD_WRAPPER_ATTR + "."):  # load.KeywordCall's model
        path = path[len(KEYWORD_WRAPPER_ATTR) + 1:]
    return path


#: Where a BatchNorm overload takes its ``training`` flag (aten schemas): ``native_batch_norm`` and
#: ``batch_norm``: (input, weight, bias, running_mean, running_var, training, ...); ``_native_batch_norm_legit``
#: and its ``_functional`` form the same; its ``no_stats`` overload (input, weight, bias, training, ...).
_BN_TRAINING_ARG = {"native_batch_norm": 5, "batch_norm": 5, "_native_batch_norm_legit": 5,
                    "_native_batch_norm_legit_functional": 5}


def _batch_statistics(node: torch.fx.Node, name: str) -> bool:
    """Whether a BatchNorm node normalizes by its batch's statistics (training, or no running stats) rather than
    its running ones: never for ``_native_batch_norm_legit_no_training``; else its ``training`` argument
    (:data:`_BN_TRAINING_ARG`; the ``no_stats`` overload's at 3), True where it cannot be read."""
    if name == "_native_batch_norm_legit_no_training":
        return False
    at = 3 if name == "_native_batch_norm_legit" and "no_stats" in str(node.target) else _BN_TRAINING_ARG.get(name)
    flag = node.args[at] if at is not None and len(node.args) > at else node.kwargs.get("training", True)
    return flag is not False


def _reduction_geometry(node: torch.fx.Node, name: str, category: str,
                        inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...]) -> tuple[int, bool]:
    """(elements reduced per output, whether the reduction runs over the last dim) of a reducing op."""
    if category not in ("reduction", "softmax", "normalization") or not inputs or not inputs[0].shape:
        return 0, True
    shape = inputs[0].shape
    if category == "softmax":
        dim = node.args[1] if len(node.args) > 1 and isinstance(node.args[1], int) else -1
        dim = dim % len(shape)
        return shape[dim], dim == len(shape) - 1
    if name in ("native_layer_norm", "layer_norm") and len(node.args) > 1:
        width = 1
        for s in node.args[1]:
            width *= int(s)
        return width, True
    if "batch_norm" in name:
        if not _batch_statistics(node, name):
            # eval: the running statistics make it a per-channel affine map, no reduction (Inductor decomposes it
            # to pointwise ops, and fuses it with a following ReLU and spatial mean into one reduction kernel)
            return 0, True
        # statistics per channel over the batch and the spatial dims (InstanceNorm's too, on its input reshaped to
        # 1 x N*C x ...): never a last-dim row, a 2-D input's included (it reduces dim 0)
        return (inputs[0].numel // max(shape[1], 1) if len(shape) > 1 else shape[-1]), False
    if name in ("native_group_norm", "group_norm"):
        # statistics per sample and group: C / groups x spatial elements, contiguous in NCHW
        groups = node.args[6] if name == "native_group_norm" and len(node.args) > 6 else \
            node.args[1] if name == "group_norm" and len(node.args) > 1 else 0
        if isinstance(groups, int) and groups > 0 and len(shape) > 1:
            return inputs[0].numel // max(shape[0] * groups, 1), True
    if category == "normalization" or name in ("nll_loss_forward", "nll_loss2d_forward"):
        return shape[-1], True
    out_numel = outputs[0].numel if outputs else 1
    # linalg_vector_norm(x, ord, dim) and norm(x, p, dim): the dims come third (their second argument, the order,
    # read as dims priced NetVLAD's norm over dim 1 as a last-dim one, 85 us against 44 measured; a reviewer)
    at = 2 if name in ("linalg_vector_norm", "norm") else 1
    dims = node.args[at] if len(node.args) > at else node.kwargs.get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims) if isinstance(dims, (list, tuple)) else []
    last = not dims or (len(shape) - 1) in [d % len(shape) for d in dims]
    return inputs[0].numel // max(out_numel, 1), last


#: View ops returning several views (read through a getitem each): their pieces are distinct parts of the tensor.
_MULTI_OUTPUT_VIEWS = frozenset({"split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split",
                                 "unsafe_split_with_sizes", "unsafe_chunk"})


@dataclass
class OpGraph:
    """The op graph of a model: a ``networkx.DiGraph`` plus the ops in topological order.

    Attributes:
        g: nodes are op ids (attribute ``op``: :class:`OpInfo`, or ``None`` for graph inputs); edges carry
            ``meta`` (:class:`TensorMeta`) of the tensor flowing; graph outputs are marked by node attribute
            ``is_output=True``.
        ops: every :class:`OpInfo`, in execution order.
        notes: assumptions made while building it (the value each data-dependent size was costed at).
    """

    g: nx.DiGraph
    ops: list[OpInfo]
    notes: list[str] = field(default_factory=list)

    def op(self, op_id: str) -> OpInfo:
        """The op with id ``op_id``. Raises ``KeyError`` if absent or a graph input."""
        op = self.g.nodes[op_id]["op"]
        if op is None:
            raise KeyError(f"{op_id} is a graph input, not an op")
        return op

    def data_preds(self, node_id: str) -> Iterable[tuple[str, TensorMeta]]:
        """Producers of the data ``node_id`` reads, looking through views: ``(producer id, meta as read)``.

        The producer is the nearest non-view op, or a graph input.
        """
        seen: set[str] = set()
        stack = [(u, self.g.edges[u, node_id]["meta"]) for u in self.g.predecessors(node_id)]
        while stack:
            u, meta = stack.pop()
            op = self.g.nodes[u]["op"]
            if op is not None and op.is_view:
                stack.extend((w, meta) for w in self.g.predecessors(u))
                continue
            if u not in seen:
                seen.add(u)
                yield u, meta

    def data_reads(self, node_id: str) -> Iterable[tuple[str, str, TensorMeta]]:
        """What ``node_id`` reads, looking through views: ``(producer id, part id, meta as read)``, once per part.

        The part is the piece of a multi-output view op (``split``, ``chunk``, ``unbind``: the getitem of it) the
        path comes through, else the producer itself: ``g, u = h.chunk(2)`` reads two parts of ``h``, where
        :meth:`data_preds` gives ``h`` once; any other view (a slice, a reshape, a view of a part) reads the part it
        is a view of, as no offsets are kept to tell two slices of one tensor apart."""
        seen: set[tuple[str, str]] = set()
        # (node, the node below it on the path toward node_id, the one below that)
        stack = [(u, node_id, "", self.g.edges[u, node_id]["meta"]) for u in self.g.predecessors(node_id)]
        while stack:
            u, child, grandchild, meta = stack.pop()
            op = self.g.nodes[u]["op"]
            if op is not None and op.is_view:
                stack.extend((w, u, child, meta) for w in self.g.predecessors(u))
                continue
            below = self.g.nodes[child]["op"] if child != node_id else None
            split = below is not None and below.name in _MULTI_OUTPUT_VIEWS and grandchild and grandchild != node_id
            part = grandchild if split else u
            if (u, part) not in seen:
                seen.add((u, part))
                yield u, part, meta

    def data_succs(self, node_id: str) -> Iterable[str]:
        """Consumers of ``node_id``'s output, looking through views (nearest non-view ops)."""
        seen: set[str] = set()
        stack = list(self.g.successors(node_id))
        while stack:
            v = stack.pop()
            op = self.g.nodes[v]["op"]
            if op is not None and op.is_view:
                stack.extend(self.g.successors(v))
                if self.g.nodes[v].get("is_output"):
                    seen.add("<output>")
                continue
            if v not in seen:
                seen.add(v)
                yield v

    def is_graph_output(self, node_id: str) -> bool:
        """True when ``node_id``'s value (or a view of it) leaves the graph."""
        if self.g.nodes[node_id].get("is_output"):
            return True
        stack = list(self.g.successors(node_id))
        while stack:
            v = stack.pop()
            op = self.g.nodes[v]["op"]
            if op is not None and op.is_view:
                if self.g.nodes[v].get("is_output"):
                    return True
                stack.extend(self.g.successors(v))
        return False


def _size_hint(s: Any, notes: dict[str, str]) -> int:
    """An int for one dimension: itself, a backed symbol's hint, or for a data-dependent (unbacked) size the upper
    bound of its value range (the worst case; ``notes`` records the assumption), else 1."""
    if isinstance(s, int):
        return s
    node = getattr(s, "node", None)
    env = getattr(node, "shape_env", None)
    if env is None:
        return int(s)
    hint = env.size_hint(node.expr, allow_none=True)
    if hint is not None:
        return int(hint)
    try:
        upper = env.bound_sympy(node.expr).upper
        value = int(upper) if upper.is_finite else 1
    except Exception:  # an expression the range analysis cannot bound
        value = 1
    how = "its upper bound (the worst case)" if value != 1 else "1 (no bound known)"
    notes.setdefault(str(node.expr), f"data-dependent size {node.expr} costed as {value}: {how}")
    return value


def concretize(gm: torch.fx.GraphModule, notes: dict[str, str]) -> None:
    """Give every node value with symbolic sizes (a data-dependent output: ``nonzero``, a boolean mask) concrete
    sizes in place, as meta tensors of hinted shape and strides (:func:`_size_hint`), so the stages after capture
    see ints; ``notes`` gets one line per data-dependent size and the value it was costed at."""
    def fix(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        sizes = list(t.shape)
        try:
            strides = list(t.stride())
        except (RuntimeError, NotImplementedError):
            return t
        if all(isinstance(x, int) for x in sizes + strides):
            return t
        shape = [_size_hint(x, notes) for x in sizes]
        stride = [_size_hint(x, notes) for x in strides]
        return torch.empty_strided(shape, stride, dtype=t.dtype, device="meta")

    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if val is not None:
            n.meta["val"] = torch.utils._pytree.tree_map(fix, val)


def build_op_graph(capture: Capture) -> OpGraph:
    """Build the :class:`OpGraph` of all captured graphs (graphs stay disconnected from each other). Data-dependent
    sizes are costed at a stated value (:func:`concretize`; the notes go to :attr:`OpGraph.notes`)."""
    g = nx.DiGraph()
    ops: list[OpInfo] = []
    notes: dict[str, str] = {}
    for gi, gm in enumerate(capture.graphs):
        concretize(gm, notes)
        ids: dict[torch.fx.Node, str] = {}
        for node in gm.graph.nodes:
            nid = f"g{gi}:{node.name}"
            ids[node] = nid
            if node.op in ("placeholder", "get_attr"):
                g.add_node(nid, op=None)
                continue
            if node.op == "output":
                for arg in torch.fx.node.map_arg(node.args, lambda n: n) and _flat_nodes(node.args):
                    if arg in ids:
                        g.nodes[ids[arg]]["is_output"] = True
                continue
            op = _make_op(nid, gi, node)
            g.add_node(nid, op=op)
            ops.append(op)
            for arg in _flat_nodes((node.args, node.kwargs)):
                if arg in ids:
                    val = meta_value(arg)
                    metas = [tensor_meta(t) for t in tensor_leaves(val)]
                    if metas:
                        g.add_edge(ids[arg], nid, meta=metas[0])
    return OpGraph(g=g, ops=ops, notes=list(notes.values()))


def _flat_nodes(args: Any) -> list[torch.fx.Node]:
    out: list[torch.fx.Node] = []
    torch.fx.node.map_arg(args, lambda n: out.append(n) or n)
    return out


#: aten ops that launch more than one kernel per eager call on a CUDA GPU, by op name: ``cumsum`` (CUB's device scan
#: or the innermost-dim scan kernel, plus a dtype/layout copy: 2-3 kernels) and ``index`` with tensor indices (the
#: index kernel plus an elementwise copy of the indices: 2-3). The lower count, measured on the H200 with torch 2.11
#: (``measured_kernels`` of the cumsum/index chains of HF Llama and GPT-2,
#: benchmarks/results/h200/accuracy/profile_accuracy_chains.csv). ``logsumexp`` is nine: amax, abs, eq, masked_fill_
#: (an infinite max), sub, exp_, sum, log_, add_ (aten/src/ATen/native/ReduceOps.cpp, logsumexp_out_impl; every one
#: of the 224 calibrate calls of the shipped H200 and H100 specs and every profiled call issued 9). The
#: out-of-place ``masked_fill`` clones its input, then fills in place (TensorAdvancedIndexing.cpp), and
#: ``constant_pad_nd`` fills its output, then copies the input into its interior (PadNd.cpp): 2 each, as every
#: profiled call of them on the H200 and H100 issued. Each kernel costs a launch.
MULTI_KERNEL_OPS = {"cumsum": 2, "index": 2, "logsumexp": 9, "masked_fill": 2, "constant_pad_nd": 2}


def eager_kernel_count(name: str, args: tuple, code: str = "") -> int:
    """Kernels aten op ``name`` launches per eager call (counted on a CUDA GPU; the CPU's ATen runs the same
    composites): :data:`MULTI_KERNEL_OPS`' count, except ``roll``, one per rolled dim (roll_common rolls one dim,
    then the rest on its output), ``constant_pad_nd`` with no positive pad (a crop: PadNd.cpp returns a clone,
    1) and a ``masked_fill`` the model's code calls in place (``code``, its source line, holds ``masked_fill_(``:
    the captured graph is functionalized, so the in-place call reads as the out-of-place op, yet it runs 1
    kernel). ``args`` are the node's (roll: self, shifts, dims; constant_pad_nd: self, pad, value); else 1."""
    if name == "roll" and len(args) > 2 and isinstance(args[2], (list, tuple)):
        return max(len(args[2]), 1)
    if name == "constant_pad_nd" and len(args) > 1 and isinstance(args[1], (list, tuple)) \
            and all(isinstance(p, int) and p <= 0 for p in args[1]):
        return 1
    if name == "masked_fill" and "masked_fill_(" in code:
        return 1
    return MULTI_KERNEL_OPS.get(name, 1)


#: aten pooling ops whose ``kernel_size`` (argument 1) sets the elements each output reads, by their spatial dims
#: (a kernel size of one int stands for all of them).
POOL_WINDOW_DIMS = {"max_pool1d": 1, "max_pool1d_with_indices": 1, "max_pool2d": 2, "max_pool2d_with_indices": 2,
                    "max_pool3d": 3, "max_pool3d_with_indices": 3, "avg_pool1d": 1, "avg_pool2d": 2, "avg_pool3d": 3}


def pool_window(node: torch.fx.Node, name: str) -> int:
    """Input elements each output of a pooling node reads: the product of its ``kernel_size`` over the op's
    spatial dims (:data:`POOL_WINDOW_DIMS`; dilation spreads the window, it does not grow it); 0 for other ops or
    a kernel size that is not a plain int or list of ints."""
    dims = POOL_WINDOW_DIMS.get(name)
    kernel = node.args[1] if len(node.args) > 1 else node.kwargs.get("kernel_size")
    if dims is None or kernel is None:
        return 0
    sizes = [kernel] if isinstance(kernel, int) else list(kernel) if isinstance(kernel, (list, tuple)) else []
    if not sizes or not all(isinstance(k, int) and k > 0 for k in sizes):
        return 0
    if len(sizes) == 1:
        sizes = sizes * dims
    window = 1
    for k in sizes:
        window *= k
    return window if len(sizes) == dims else 0


def unused_ops(nodes: Iterable[torch.fx.Node]) -> list[OpInfo]:
    """Op records of the eager calls no output depends on (:func:`fusion_advisor.analyze.capture.unused_nodes`), ids
    ``unused:<node name>`` and graph index -1 (they are in no captured graph); views left out."""
    ops = [_make_op(f"unused:{n.name}", -1, n) for n in nodes if n.op == "call_function"]
    return [o for o in ops if not o.is_view]


def _distinct_input_bytes(node: torch.fx.Node) -> int:
    """Bytes of the tensors ``node`` reads, each argument node once: ``x * x`` reads ``x`` from memory once (the
    second load of each element hits the cache; a reviewer found it counted twice)."""
    seen: set[torch.fx.Node] = set()
    total = 0
    for a in _flat_nodes((node.args, node.kwargs)):
        if a not in seen:
            seen.add(a)
            total += sum(tensor_meta(t).nbytes for t in tensor_leaves(meta_value(a)))
    return total


def _make_op(nid: str, gi: int, node: torch.fx.Node) -> OpInfo:
    target = node.target
    name = _op_name(target)
    category = categorize(target) if node.op == "call_function" else "other"
    out_val = meta_value(node)
    outputs = tuple(tensor_meta(t) for t in tensor_leaves(out_val))
    inputs = tuple(tensor_meta(t) for a in _flat_nodes((node.args, node.kwargs)) for t in tensor_leaves(meta_value(a)))
    if not outputs and not inputs:  # arithmetic on sizes (sym_size, comparisons, _assert_scalar): host-side only
        category = "view"
    if name == "index" and any(m.dtype == "bool" for m in inputs[1:]):
        category = "other"  # a boolean mask: its output's size depends on the values (a nonzero inside)
    if category in FUSIBLE and any(m.dtype in COMPLEX_NAMES for m in inputs + outputs):
        # Inductor runs an op reading or writing a complex tensor as an eager call (torch/_inductor/lowering.py,
        # unsupported_input_tensor): it fuses with nothing
        category = "other"
    row, last = _reduction_geometry(node, name, category, inputs, outputs)
    source = source_of(node) if node.meta.get("stack_trace") else SourceLoc()
    variant, kernels = (attention_variant(node, name) if category == "attention"
                        else ("", eager_kernel_count(name, node.args, source.code)))
    steps = recurrent_flops = 0
    if category == "recurrent":
        variant, steps, recurrent_flops = recurrent_geometry(node)
    # a native fast path (nn.TransformerEncoderLayer's): one call, a whole layer (analyze/composites.py)
    composite = composite_record(name, node.args, dict(node.kwargs), inputs) \
        if node.op == "call_function" else None
    if composite is not None:
        variant, kernels = composite[0], composite[1]
    if category == "view":
        flops, read, written = 0, 0, 0
    else:
        read = _distinct_input_bytes(node)
        written = sum(m.nbytes for m in outputs)
        if category == "recurrent":
            flops = recurrent_flops
        elif category in HEAVY:
            flops = _matmul_like_flops(target, node, out_val) if category != "embedding" else 0
            if category == "embedding" and len(inputs) >= 2 and outputs:
                read = inputs[1].nbytes + outputs[0].nbytes  # a gather reads only the selected rows
                if name in ("embedding_bag", "_embedding_bag", "_embedding_bag_forward_only") and inputs[0].shape:
                    # one output row per bag, the rows of every index gathered: indices x row bytes, the indices,
                    # the offsets (the output alone read 42x under for 4096 bags of 50 ids; a reviewer)
                    row = inputs[0].nbytes // max(inputs[0].shape[0], 1)
                    read = inputs[1].numel * row + sum(m.nbytes for m in inputs[1:])  # offsets, per-sample weights
                    flops = inputs[1].numel * math.prod(inputs[0].shape[1:])  # a sum per element gathered
        elif name in GATHERS and len(inputs) >= 2 and outputs:
            read = sum(m.nbytes for m in inputs[1:]) + outputs[0].nbytes  # the indices and the elements selected
            flops = 0
        elif name in ("nll_loss_forward", "nll_loss2d_forward") and len(inputs) >= 2:
            # a gather of one logit per row, then a sum: reads the targets and one element per row
            rows = inputs[1].numel
            read = inputs[1].nbytes + rows * inputs[0].nbytes // max(inputs[0].numel, 1)
            flops = rows
        elif composite is not None and composite[2] > 0:
            flops = composite[2]
        elif category in ("reduction", "softmax", "normalization"):
            flops = _FLOPS_PER_ELEM[category] * (inputs[0].numel if inputs else 0)
        else:
            flops = _FLOPS_PER_ELEM.get(category, 1) * sum(m.numel for m in outputs)
    return OpInfo(
        id=nid,
        graph_index=gi,
        target=str(target) if not isinstance(target, str) else target,
        category=category,
        inputs=inputs,
        outputs=outputs,
        flops=int(flops),
        bytes_read=int(read),
        bytes_written=int(written),
        module_path=module_path_of(node),
        source=source,
        reduction_elems=row,
        reduces_last_dim=last,
        variant=variant,
        eager_kernels=kernels,
        sequential_steps=steps,
        window_elems=pool_window(node, name) if node.op == "call_function" else 0,
    )
