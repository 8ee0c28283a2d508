"""PyTorch's native composite ops: one aten call that runs a whole layer in C++, priced as the ops it runs.

``nn.TransformerEncoderLayer`` in eval under ``torch.no_grad()`` (``batch_first=True``, ReLU or GELU, on a CUDA or
CPU tensor...: the "fast path" of ``torch/nn/modules/transformer.py``) runs as one call of
``aten._transformer_encoder_layer_fwd``: the QKV projection, fused attention (``_scaled_dot_product_efficient_
attention`` in fp32, cuDNN's or flash in 16-bit), the output projection, the residual adds, two LayerNorms and the
feed-forward block's two GEMMs, the activation fused into the first (``_addmm_activation``)
(``aten/src/ATen/native/transformers/transformer.cpp``). Priced as one op of one kernel it came to 0.07-0.10x of
what the H200 measured (KernelBench's ConvolutionalVisionTransformer: 150-250 us per layer against 13 us).

Measured on the H200 (torch 2.11; ``benchmarks/accuracy/native_layer_probe.py``,
``benchmarks/results/h200/accuracy/reprofile/composites/native_layer_probe.json``): five configurations from 10 x 2
tokens of width 128 to 2 x 197 of width 768, fp32 and bf16, post- and pre-norm, ReLU and GELU, ran 9-10 kernels
per call (the four GEMMs, attention, two adds, two norms), 21 where cuBLAS split each tiny GEMM into four (20 tokens);
their host time per call 23-28 eager adds in a tight loop whatever the kernels (19.0 in the CViT's profile, in the
model), device time 38-307 us. So :func:`encoder_layer_parts`
gives the nine parts as :class:`OpInfo` records for the roofline to price with its own tables (GEMMs through the
measured matmul surface, which holds split-K's kernels in its times; attention at its backend's measured rate;
norms through the reduction table; a fused attention part of a small layer is priced at its FLOPs over the
backend's rate, with no kernel floor, as standalone attention ops are), and the host time is a fixed number of
launches (:data:`ENCODER_LAYER_HOST_LAUNCHES`). Given a mask (``src_mask``, ``src_key_padding_mask``) the native
attention does not fuse: QK^T, a masked softmax over the full score matrix and PV
(``_native_multi_head_attention``'s branch for a mask, ``aten/src/ATen/native/transformers/attention.cpp``), which
the parts then hold instead.

Only the encoder layer: ``nn.MultiheadAttention`` skips its own fast path while it is traced
(``_is_make_fx_tracing``), so the capture records its ordinary ops whatever eager runs. The layer itself takes its
fast path only on CPU and CUDA tensors: an analysis without a GPU (fake tensors on the ``meta`` device) records its
slow path's ops, as ``analyze --device cpu`` or ``--device cuda`` do not.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_advisor.analyze.records import OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.sdpa import SdpaArgs, rule_backend
from fusion_advisor.dtypes import float_itemsize

#: aten name of the encoder layer's fast path.
ENCODER_LAYER = "_transformer_encoder_layer_fwd"

#: Kernels one eager call of :data:`ENCODER_LAYER` launches on a CUDA GPU (module docstring): its nine parts.
ENCODER_LAYER_KERNELS = 9

#: Host time of one call in eager launches (an add's host time): the seed-2 profile of KernelBench's
#: ConvolutionalVisionTransformer measured a median 161 us per call where its eager add took 8.5 us on that host,
#: 19.0 adds in the model, i.e. 16.5 launches before the spec's in-model ``host_time_scale`` (1.152) multiplies them;
#: native_layer_probe.json found the call's host time within 23-28 adds over five configurations in a tight loop.
ENCODER_LAYER_HOST_LAUNCHES = 16.5


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
    return TensorMeta(shape=shape, dtype=dtype, numel=numel, nbytes=numel * float_itemsize(dtype))


def _part(op: OpInfo, name: str, category: str, target: str, inputs: list[tuple[int, ...]],
          outputs: list[tuple[int, ...]], flops: int, reduction_elems: int = 0, variant: str = "") -> OpInfo:
    ins = tuple(_meta(s, op.dtype) for s in inputs)
    outs = tuple(_meta(s, op.dtype) for s in outputs)
    return OpInfo(id=f"{op.id}/{name}", graph_index=op.graph_index, target=target, category=category, inputs=ins,
                  outputs=outs, flops=flops, bytes_read=sum(m.nbytes for m in ins),
                  bytes_written=sum(m.nbytes for m in outs), module_path=op.module_path, source=SourceLoc(),
                  reduction_elems=reduction_elems, reduces_last_dim=True, variant=variant)


def heads_variant(heads: int) -> str:
    """The :attr:`OpInfo.variant` a composite op carries its head count in (``"heads=8"``)."""
    return f"heads={heads}"


def _heads(op: OpInfo) -> int:
    """The head count :func:`heads_variant` put in ``op``'s variant; 0 when it holds none (a report written
    before)."""
    name, _, value = op.variant.partition("=")
    return int(value) if name == "heads" and value.isdigit() else 0


#: Tensor arguments of :data:`ENCODER_LAYER` before its optional mask: src, the QKV and output projections' weights
#: and biases, the two norms' weights and biases, the two feed-forward weights and biases.
ENCODER_LAYER_TENSORS = 13

#: Kernels of a call with a mask (``src_mask`` or ``src_key_padding_mask``): the fused attention kernel replaced by
#: the five of the unfused path (``_native_multi_head_attention``'s branch for a mask, attention.cpp).
ENCODER_LAYER_MASKED_KERNELS = ENCODER_LAYER_KERNELS - 1 + 5


def _masked(inputs: tuple[TensorMeta, ...]) -> bool:
    return len(inputs) > ENCODER_LAYER_TENSORS


def _readable_layer(op: OpInfo) -> EncoderLayerShape | None:
    """The sizes of an :data:`ENCODER_LAYER` record whose heads and shapes read; None for other ops."""
    return encoder_layer_shape(op.inputs, _heads(op)) if ENCODER_LAYER in op.target else None


def encoder_layer_parts(op: OpInfo) -> list[OpInfo]:
    """The ops one :data:`ENCODER_LAYER` call runs, as records the roofline prices (module docstring); empty for
    another op or when the call's shapes do not read as an encoder layer's (:func:`encoder_layer_shape`)."""
    s = _readable_layer(op)
    if s is None:
        return []
    b, n, e, h, f, t = s.batch, s.seq, s.embed, s.heads, s.ffn, s.tokens
    d = e // h
    q = (b, h, n, d)
    if _masked(op.inputs):
        # with a mask the native attention runs unfused: q/k/v transform, QK^T, masked softmax, PV, head merge
        mask = op.inputs[ENCODER_LAYER_TENSORS].shape
        attention = [
            _part(op, "qkv_transform", "pointwise", "aten.add.Tensor", [(t, 3 * e), (3 * e,)], [(3, b * h, n, d)],
                  3 * t * e),
            _part(op, "scores", "matmul", "aten.bmm.default", [(b * h, n, d), (b * h, d, n)], [(b * h, n, n)],
                  2 * b * h * n * n * d),
            _part(op, "masked_softmax", "softmax", "aten._masked_softmax.default", [(b * h, n, n), mask],
                  [(b * h, n, n)], 5 * b * h * n * n, reduction_elems=n),
            _part(op, "context", "matmul", "aten.bmm.default", [(b * h, n, n), (b * h, n, d)], [(b * h, n, d)],
                  2 * b * h * n * n * d),
            _part(op, "heads_merge", "copy", "aten.clone.default", [q], [(b, n, e)], 0),
        ]
    else:  # a fused attention kernel (memory-efficient in fp32, flash or cuDNN in 16-bit)
        backend = rule_backend(SdpaArgs(q_shape=q, k_shape=q, v_shape=q, dtype=op.dtype))[0]
        attention = [_part(op, "attention", "attention", "fusion_advisor_capture.attention.default", [q, q, q], [q],
                           4 * b * h * n * n * d, variant=backend)]
    return [
        _part(op, "qkv", "matmul", "aten.addmm.default", [(3 * e,), (t, e), (e, 3 * e)], [(t, 3 * e)], 6 * t * e * e),
        *attention,
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


def composite_host_launches(op: OpInfo) -> float:
    """Host time of one call of a native composite op in eager launches (:data:`ENCODER_LAYER_HOST_LAUNCHES`); 0
    for other ops and records :func:`encoder_layer_parts` cannot read."""
    return ENCODER_LAYER_HOST_LAUNCHES if _readable_layer(op) is not None else 0.0


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
        if shape is None:  # unreadable: one op, one kernel, as before (the roofline prices it so)
            return "", 1, 0
        kernels = ENCODER_LAYER_MASKED_KERNELS if _masked(inputs) else ENCODER_LAYER_KERNELS
        return heads_variant(heads), kernels, encoder_layer_flops(shape)
    return None
