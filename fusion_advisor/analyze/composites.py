"""PyTorch's native composite ops: one aten call that runs a whole layer in C++, priced as the ops it runs.

``nn.TransformerEncoderLayer`` in eval under ``torch.no_grad()`` (``batch_first=True``, ReLU or GELU, no key
padding mask...: the "fast path" of ``torch/nn/modules/transformer.py``) runs as one call of
``aten._transformer_encoder_layer_fwd``: the QKV projection, fused attention (``_scaled_dot_product_efficient_
attention`` in fp32, cuDNN's or flash in 16-bit), the output projection, the residual adds, two LayerNorms and the
feed-forward block's two GEMMs, the activation fused into the first (``_addmm_activation``)
(``aten/src/ATen/native/transformers/transformer.cpp``). Priced as one op of one kernel it came to 0.07-0.10x of
what the H200 measured (KernelBench's ConvolutionalVisionTransformer: 150-250 us per layer against 13 us).

Measured on the H200 (torch 2.11; ``benchmarks/accuracy/native_layer_probe.py``,
``benchmarks/results/h200/accuracy/reprofile/composites/native_layer_probe.json``): five configurations from 10 x 2
tokens of width 128 to 2 x 197 of width 768, fp32 and bf16, post- and pre-norm, ReLU and GELU, ran 9-10 kernels
per call (the four GEMMs, attention, two adds, two norms), 21 where cuBLAS split each tiny GEMM into four (20 tokens);
their host time per call was 184-220 us whatever the kernels, device time 38-305 us. So :func:`encoder_layer_parts`
gives the nine parts as :class:`OpInfo` records for the roofline to price with its own tables (GEMMs through the
measured matmul surface, which holds split-K's kernels in its times; attention at its backend's measured rate;
norms through the reduction table), and the host time is a fixed number of launches
(:data:`ENCODER_LAYER_HOST_LAUNCHES`).

``nn.MultiheadAttention`` (``batch_first=True``) takes the same kind of fast path on its own:
``aten._native_multi_head_attention``, 9-12 kernels per call in the probe (QKV GEMM, the bias-and-rescale transform,
QK^T, softmax, PV, the head merge, the output GEMM and, with ``need_weights`` (the default), the head average of the
weights; without them a fused attention kernel replaces QK^T, softmax and PV), and 0.52-0.78x (median 0.66) of the
encoder layer's host time per call, timed beside it (:data:`MHA_HOST_LAUNCHES`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_advisor.analyze.records import OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.sdpa import SdpaArgs, rule_backend

#: aten names of the fast paths: the encoder layer's and MultiheadAttention's.
ENCODER_LAYER = "_transformer_encoder_layer_fwd"
MHA = "_native_multi_head_attention"

#: Kernels one eager call of :data:`ENCODER_LAYER` launches on a CUDA GPU (module docstring): its nine parts.
ENCODER_LAYER_KERNELS = 9

#: Host time of one call in eager launches (an add's host time): the seed-2 profile of KernelBench's
#: ConvolutionalVisionTransformer measured a median 161 us per call where its eager add took 8.5 us on that host,
#: 19.0 adds in the model, i.e. 16.5 launches before the spec's in-model ``host_time_scale`` (1.152) multiplies them;
#: native_layer_probe.json found the call's host time within 184-220 us over five configurations on one host.
ENCODER_LAYER_HOST_LAUNCHES = 16.5

#: Host time of one :data:`MHA` call in eager launches: 0.66 (the median over six configurations, 0.52-0.78) of the
#: encoder layer's, each timed beside the other on the H200 (native_layer_probe.json: 12.5-18.5 adds against
#: 23.3-28.4), times :data:`ENCODER_LAYER_HOST_LAUNCHES`.
MHA_HOST_LAUNCHES = 0.66 * ENCODER_LAYER_HOST_LAUNCHES

_ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8}


@dataclass(frozen=True)
class EncoderLayerShape:
    """Sizes of one :data:`ENCODER_LAYER` call: ``batch`` x ``seq`` tokens of width ``embed``, ``heads`` heads,
    feed-forward width ``ffn``, element type ``dtype`` (short name)."""

    batch: int
    seq: int
    embed: int
    heads: int
    ffn: int
    dtype: str

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def is_composite(op: OpInfo) -> bool:
    """Whether ``op`` is a native composite op this module prices (:data:`ENCODER_LAYER`, :data:`MHA`)."""
    return ENCODER_LAYER in op.target or MHA in op.target


def encoder_layer_shape(inputs: tuple[TensorMeta, ...], heads: int) -> EncoderLayerShape | None:
    """The sizes of an encoder-layer call from its tensor inputs in argument order (``src [batch, seq, embed]``,
    ``qkv_weight [3 embed, embed]``, its bias, ``proj_weight``, its bias, the two norms' weights and biases,
    ``ffn_weight_1 [ffn, embed]``...) and its head count; None when they do not read as such (a nested tensor, a
    2-D ``src``)."""
    if len(inputs) < 10 or heads <= 0:
        return None
    src, qkv_w, ffn_w1 = inputs[0], inputs[1], inputs[9]
    if len(src.shape) != 3 or len(qkv_w.shape) != 2 or len(ffn_w1.shape) != 2:
        return None
    batch, seq, embed = src.shape
    if qkv_w.shape != (3 * embed, embed) or ffn_w1.shape[1] != embed or embed % heads:
        return None
    return EncoderLayerShape(batch, seq, embed, heads, ffn_w1.shape[0], src.dtype)


def encoder_layer_flops(s: EncoderLayerShape) -> int:
    """FLOPs of one call (a multiply-add counts 2): the QKV, output and two feed-forward GEMMs, QK^T and PV."""
    t, e = s.tokens, s.embed
    gemms = 2 * t * e * (3 * e) + 2 * t * e * e + 2 * (2 * t * e * s.ffn)
    attention = 2 * 2 * s.batch * s.seq * s.seq * e
    return gemms + attention


def _meta(shape: tuple[int, ...], dtype: str) -> TensorMeta:
    numel = 1
    for d in shape:
        numel *= d
    return TensorMeta(shape=shape, dtype=dtype, numel=numel, nbytes=numel * _ELEM_BYTES.get(dtype, 4))


def _part(op: OpInfo, name: str, category: str, target: str, inputs: list[tuple[int, ...]],
          outputs: list[tuple[int, ...]], flops: int, reduction_elems: int = 0, variant: str = "") -> OpInfo:
    ins = tuple(_meta(s, op.dtype) for s in inputs)
    outs = tuple(_meta(s, op.dtype) for s in outputs)
    return OpInfo(id=f"{op.id}/{name}", graph_index=op.graph_index, target=target, category=category, inputs=ins,
                  outputs=outs, flops=flops, bytes_read=sum(m.nbytes for m in ins),
                  bytes_written=sum(m.nbytes for m in outs), module_path=op.module_path, source=SourceLoc(),
                  reduction_elems=reduction_elems, reduces_last_dim=True, variant=variant)


def heads_variant(heads: int, weights: str = "") -> str:
    """The :attr:`OpInfo.variant` a composite op carries its head count in (``"heads=8"``), and for :data:`MHA`
    the attention weights it returns (``"heads=8,weights=average"`` or ``"weights=per-head"``; none without)."""
    return f"heads={heads}" + (f",weights={weights}" if weights else "")


def _variant_fields(variant: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in variant.split(",") if "=" in part)


def _heads(variant: str) -> int:
    try:
        return int(_variant_fields(variant).get("heads", "0"))
    except ValueError:
        return 0


def encoder_layer_parts(op: OpInfo) -> list[OpInfo]:
    """The ops one :data:`ENCODER_LAYER` call runs, as records the roofline prices (module docstring); empty for
    another op or when the call's shapes do not read as an encoder layer's (:func:`encoder_layer_shape`)."""
    if ENCODER_LAYER not in op.target:
        return []
    s = encoder_layer_shape(op.inputs, _heads(op.variant))
    if s is None:
        return []
    b, n, e, h, f, t = s.batch, s.seq, s.embed, s.heads, s.ffn, s.tokens
    d = e // h
    q = (b, h, n, d)
    backend = rule_backend(SdpaArgs(q_shape=q, k_shape=q, v_shape=q, dtype=op.dtype))[0]
    return [
        _part(op, "qkv", "matmul", "aten.addmm.default", [(3 * e,), (t, e), (e, 3 * e)], [(t, 3 * e)], 6 * t * e * e),
        _part(op, "attention", "attention", "fusion_advisor_capture.attention.default", [q, q, q], [q],
              4 * b * h * n * n * d, variant=backend),
        _part(op, "proj", "matmul", "aten.addmm.default", [(e,), (t, e), (e, e)], [(t, e)], 2 * t * e * e),
        _part(op, "residual_1", "pointwise", "aten.add.Tensor", [(t, e), (t, e)], [(t, e)], t * e),
        _part(op, "norm_1", "normalization", "aten.native_layer_norm.default", [(t, e), (e,), (e,)], [(t, e)],
              5 * t * e, reduction_elems=e),
        _part(op, "ffn_1", "matmul", "aten.addmm.default", [(f,), (t, e), (e, f)], [(t, f)], 2 * t * e * f),
        _part(op, "ffn_2", "matmul", "aten.addmm.default", [(e,), (t, f), (f, e)], [(t, e)], 2 * t * e * f),
        _part(op, "residual_2", "pointwise", "aten.add.Tensor", [(t, e), (t, e)], [(t, e)], t * e),
        _part(op, "norm_2", "normalization", "aten.native_layer_norm.default", [(t, e), (e,), (e,)], [(t, e)],
              5 * t * e, reduction_elems=e),
    ]


@dataclass(frozen=True)
class MhaShape:
    """Sizes of one :data:`MHA` call: ``batch`` queries of length ``q_len``, keys of length ``k_len``, width
    ``embed``, ``heads`` heads, element type ``dtype``."""

    batch: int
    q_len: int
    k_len: int
    embed: int
    heads: int
    dtype: str


def mha_shape(inputs: tuple[TensorMeta, ...], heads: int) -> MhaShape | None:
    """The sizes of a :data:`MHA` call from its tensor inputs in argument order (``query [batch, q_len, embed]``,
    ``key``, ``value [batch, k_len, embed]``, ``qkv_weight [3 embed, embed]``, ...) and its head count; None when
    they do not read as such."""
    if len(inputs) < 4 or heads <= 0:
        return None
    q, k, v, w = inputs[:4]
    if len(q.shape) != 3 or len(k.shape) != 3 or k.shape != v.shape or len(w.shape) != 2:
        return None
    b, lq, e = q.shape
    if k.shape[0] != b or k.shape[2] != e or w.shape != (3 * e, e) or e % heads:
        return None
    return MhaShape(b, lq, k.shape[1], e, heads, q.dtype)


def mha_flops(s: MhaShape) -> int:
    """FLOPs of one :data:`MHA` call: the Q, K, V and output projections, QK^T and PV."""
    b, lq, lk, e = s.batch, s.q_len, s.k_len, s.embed
    return 2 * b * lq * e * e * 2 + 2 * 2 * b * lk * e * e + 2 * 2 * b * lq * lk * e


def mha_parts(op: OpInfo) -> list[OpInfo]:
    """The ops one :data:`MHA` call runs (module docstring), as records the roofline prices; empty for another op
    or shapes that do not read as its."""
    if MHA not in op.target:
        return []
    fields = _variant_fields(op.variant)
    s = mha_shape(op.inputs, _heads(op.variant))
    if s is None:
        return []
    b, lq, lk, e, h = s.batch, s.q_len, s.k_len, s.embed, s.heads
    d, tq, tk = e // h, b * lq, b * lk
    q, k = (b, h, lq, d), (b, h, lk, d)
    weights = fields.get("weights", "")
    if lq == lk:  # self-attention (query is key is value): one GEMM for the three projections
        parts = [_part(op, "qkv", "matmul", "aten.addmm.default", [(3 * e,), (tq, e), (e, 3 * e)], [(tq, 3 * e)],
                       6 * tq * e * e)]
    else:
        parts = [_part(op, "q_proj", "matmul", "aten.addmm.default", [(e,), (tq, e), (e, e)], [(tq, e)],
                       2 * tq * e * e),
                 _part(op, "kv_proj", "matmul", "aten.addmm.default", [(2 * e,), (tk, e), (e, 2 * e)],
                       [(tk, 2 * e)], 4 * tk * e * e)]
    parts += [
        _part(op, "qkv_transform", "pointwise", "aten.add.Tensor", [(tq + 2 * tk, e), (3 * e,)],
              [(b * h * (lq + 2 * lk), d)], (tq + 2 * tk) * e),
    ]
    if weights:  # the weights are returned: attention runs as QK^T, softmax, PV
        parts += [
            _part(op, "scores", "matmul", "aten.bmm.default", [(b * h, lq, d), (b * h, d, lk)], [(b * h, lq, lk)],
                  2 * b * h * lq * lk * d),
            _part(op, "softmax", "softmax", "aten._softmax.default", [(b * h, lq, lk)], [(b * h, lq, lk)],
                  5 * b * h * lq * lk, reduction_elems=lk),
            _part(op, "context", "matmul", "aten.bmm.default", [(b * h, lq, lk), (b * h, lk, d)], [(b * h, lq, d)],
                  2 * b * h * lq * lk * d),
        ]
        if weights == "average":
            parts.append(_part(op, "weights_mean", "reduction", "aten.mean.dim", [(b, h, lq, lk)], [(b, lq, lk)],
                               b * h * lq * lk, reduction_elems=h))
    else:
        backend = rule_backend(SdpaArgs(q_shape=q, k_shape=k, v_shape=k, dtype=op.dtype))[0]
        parts.append(_part(op, "attention", "attention", "fusion_advisor_capture.attention.default", [q, k, k], [q],
                           4 * b * h * lq * lk * d, variant=backend))
    parts += [
        _part(op, "heads_merge", "copy", "aten.clone.default", [q], [(b, lq, e)], 0),
        _part(op, "proj", "matmul", "aten.addmm.default", [(e,), (tq, e), (e, e)], [(tq, e)], 2 * tq * e * e),
    ]
    return parts


def composite_parts(op: OpInfo) -> list[OpInfo]:
    """The parts of a native composite op (:func:`encoder_layer_parts`, :func:`mha_parts`); empty for other ops
    and for records whose heads or shapes do not read (reports written before these were recorded)."""
    return encoder_layer_parts(op) or mha_parts(op)


def composite_host_launches(op: OpInfo) -> float:
    """Host time of one call of a native composite op in eager launches (:data:`ENCODER_LAYER_HOST_LAUNCHES`,
    :data:`MHA_HOST_LAUNCHES`); 0 for other ops and records :func:`composite_parts` cannot read."""
    if not composite_parts(op):
        return 0.0
    return ENCODER_LAYER_HOST_LAUNCHES if ENCODER_LAYER in op.target else MHA_HOST_LAUNCHES


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: object) -> object:
    return args[index] if len(args) > index else kwargs.get(name, default)


def composite_record(name: str, args: tuple, kwargs: dict, inputs: tuple[TensorMeta, ...]
                     ) -> tuple[str, int, int] | None:
    """``(variant, eager kernels, FLOPs)`` the graph stage records for a native composite op named ``name`` (the
    aten op's name) called with ``args`` / ``kwargs`` (non-tensor ones as Python values) on tensor ``inputs``; None
    for other ops. FLOPs are 0 where the shapes do not read as the op's (then the roofline keeps the one-op price)."""
    if name == ENCODER_LAYER:
        heads = _arg(args, kwargs, 2, "num_heads", 0)
        heads = heads if isinstance(heads, int) else 0
        shape = encoder_layer_shape(inputs, heads)
        return heads_variant(heads), ENCODER_LAYER_KERNELS, encoder_layer_flops(shape) if shape else 0
    if name == MHA:
        heads = _arg(args, kwargs, 4, "num_head", 0)
        heads = heads if isinstance(heads, int) else 0
        need = _arg(args, kwargs, 10, "need_weights", True)
        average = _arg(args, kwargs, 11, "average_attn_weights", True)
        weights = "" if need is False else "average" if average is not False else "per-head"
        shape = mha_shape(inputs, heads)
        # the parts of mha_parts: one QKV GEMM for self-attention, two when the key length differs
        kernels = {"average": 8, "per-head": 7, "": 5}[weights] + (1 if shape and shape.q_len != shape.k_len else 0)
        return heads_variant(heads, weights), kernels, mha_flops(shape) if shape else 0
    return None
