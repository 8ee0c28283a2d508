"""PyTorch's native composite ops: one aten call that runs a whole layer in C++, priced as the ops it runs.

``nn.TransformerEncoderLayer`` in eval under ``torch.no_grad()`` (``batch_first=True``, ReLU or GELU, no key
padding mask...: the "fast path" of ``torch/nn/modules/transformer.py``) runs as one call of
``aten._transformer_encoder_layer_fwd``: the QKV projection, the bias-and-rescale transform of q/k/v, attention, the
output projection, the residual adds, two LayerNorms and the feed-forward block's two GEMMs and activation
(``aten/src/ATen/native/transformers/transformer.cpp``, ``attention.cpp``). Priced as one op of one kernel it came to
0.07-0.10x of what the H200 measured (KernelBench's ConvolutionalVisionTransformer: 150-250 us per layer against
13 us predicted): its device time is that of its parts, and its host time that of a C++ loop issuing 21 kernels.

:func:`encoder_layer_parts` gives those parts as :class:`OpInfo` records (the GEMMs as ``addmm`` / ``bmm``, the
norms as ``native_layer_norm``, the rest as elementwise kernels) for the roofline to price with its own tables;
the attention is taken as the math path (``bmm``, softmax, ``bmm``), which the native op runs when no fused SDPA
kernel takes its shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_advisor.analyze.records import OpInfo, SourceLoc, TensorMeta

#: aten name of the encoder layer's fast path.
ENCODER_LAYER = "_transformer_encoder_layer_fwd"

#: Kernels one eager call of :data:`ENCODER_LAYER` launches on a CUDA GPU: measured on the H200 (torch 2.11, fp32;
#: the seed-2 profile of KernelBench's level3_32_ConvolutionalVisionTransformer, d_model 128, 4 heads, 6 layers:
#: 21 kernels in every call, benchmarks/results/h200/accuracy/reprofile/seed2/reports.tar.gz). Its parts below
#: name 14; the others are the native code's copies and transposes.
ENCODER_LAYER_KERNELS = 21

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
    """Whether ``op`` is a native composite op this module prices (:data:`ENCODER_LAYER`)."""
    return ENCODER_LAYER in op.target


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
          outputs: list[tuple[int, ...]], flops: int, reduction_elems: int = 0) -> OpInfo:
    ins = tuple(_meta(s, op.dtype) for s in inputs)
    outs = tuple(_meta(s, op.dtype) for s in outputs)
    return OpInfo(id=f"{op.id}/{name}", graph_index=op.graph_index, target=target, category=category, inputs=ins,
                  outputs=outs, flops=flops, bytes_read=sum(m.nbytes for m in ins),
                  bytes_written=sum(m.nbytes for m in outs), module_path=op.module_path, source=SourceLoc(),
                  reduction_elems=reduction_elems, reduces_last_dim=True)


def heads_variant(heads: int) -> str:
    """The :attr:`OpInfo.variant` an encoder-layer op carries its head count in (``"heads=8"``)."""
    return f"heads={heads}"


def _heads(variant: str) -> int:
    try:
        return int(variant.split("=", 1)[1]) if variant.startswith("heads=") else 0
    except ValueError:
        return 0


def encoder_layer_parts(op: OpInfo) -> list[OpInfo]:
    """The ops one :data:`ENCODER_LAYER` call runs, as records the roofline prices (module docstring); empty for
    another op or when the call's shapes do not read as an encoder layer's (:func:`encoder_layer_shape`)."""
    if not is_composite(op):
        return []
    s = encoder_layer_shape(op.inputs, _heads(op.variant))
    if s is None:
        return []
    b, n, e, h, f, t = s.batch, s.seq, s.embed, s.heads, s.ffn, s.tokens
    d = e // h
    bh = b * h
    return [
        _part(op, "qkv", "matmul", "aten.addmm.default", [(3 * e,), (t, e), (e, 3 * e)], [(t, 3 * e)], 6 * t * e * e),
        _part(op, "qkv_transform", "pointwise", "aten.add.Tensor", [(t, 3 * e), (3 * e,)], [(3, bh, n, d)], 3 * t * e),
        _part(op, "scores", "matmul", "aten.bmm.default", [(bh, n, d), (bh, d, n)], [(bh, n, n)], 2 * bh * n * n * d),
        _part(op, "softmax", "softmax", "aten._softmax.default", [(bh, n, n)], [(bh, n, n)], 5 * bh * n * n, n),
        _part(op, "context", "matmul", "aten.bmm.default", [(bh, n, n), (bh, n, d)], [(bh, n, d)], 2 * bh * n * n * d),
        _part(op, "heads_merge", "copy", "aten.clone.default", [(bh, n, d)], [(b, n, e)], 0),
        _part(op, "proj", "matmul", "aten.addmm.default", [(e,), (t, e), (e, e)], [(t, e)], 2 * t * e * e),
        _part(op, "residual_1", "pointwise", "aten.add.Tensor", [(t, e), (t, e)], [(t, e)], t * e),
        _part(op, "norm_1", "normalization", "aten.native_layer_norm.default", [(t, e), (e,), (e,)], [(t, e)],
              5 * t * e, e),
        _part(op, "ffn_1", "matmul", "aten.addmm.default", [(f,), (t, e), (e, f)], [(t, f)], 2 * t * e * f),
        _part(op, "activation", "pointwise", "aten.relu.default", [(t, f)], [(t, f)], t * f),
        _part(op, "ffn_2", "matmul", "aten.addmm.default", [(e,), (t, f), (f, e)], [(t, e)], 2 * t * e * f),
        _part(op, "residual_2", "pointwise", "aten.add.Tensor", [(t, e), (t, e)], [(t, e)], t * e),
        _part(op, "norm_2", "normalization", "aten.native_layer_norm.default", [(t, e), (e,), (e,)], [(t, e)],
              5 * t * e, e),
    ]
