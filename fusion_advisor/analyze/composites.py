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
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_advisor.analyze.records import OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.sdpa import SdpaArgs, rule_backend

#: aten name of the encoder layer's fast path.
ENCODER_LAYER = "_transformer_encoder_layer_fwd"

#: Kernels one eager call of :data:`ENCODER_LAYER` launches on a CUDA GPU (module docstring): its nine parts.
ENCODER_LAYER_KERNELS = 9

#: Host time of one call in eager launches (an add's host time): the seed-2 profile of KernelBench's
#: ConvolutionalVisionTransformer measured a median 161 us per call where its eager add took 8.5 us on that host,
#: 19.0 adds in the model, i.e. 16.5 launches before the spec's in-model ``host_time_scale`` (1.152) multiplies them;
#: native_layer_probe.json found the call's host time within 184-220 us over five configurations on one host.
ENCODER_LAYER_HOST_LAUNCHES = 16.5

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
          outputs: list[tuple[int, ...]], flops: int, reduction_elems: int = 0, variant: str = "") -> OpInfo:
    ins = tuple(_meta(s, op.dtype) for s in inputs)
    outs = tuple(_meta(s, op.dtype) for s in outputs)
    return OpInfo(id=f"{op.id}/{name}", graph_index=op.graph_index, target=target, category=category, inputs=ins,
                  outputs=outs, flops=flops, bytes_read=sum(m.nbytes for m in ins),
                  bytes_written=sum(m.nbytes for m in outs), module_path=op.module_path, source=SourceLoc(),
                  reduction_elems=reduction_elems, reduces_last_dim=True, variant=variant)


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
