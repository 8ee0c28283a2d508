"""Native composite ops (analyze/composites.py): nn.TransformerEncoderLayer's and nn.MultiheadAttention's fast paths
are one aten call that runs a whole layer; the graph stage records its FLOPs, kernels and heads, and the roofline
prices it as its parts (device) and as a measured number of launches (host). A record without the heads (a report
written before) keeps the one-op price."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fusion_advisor.analyze.capture import capture
from fusion_advisor.analyze.composites import (ENCODER_LAYER_HOST_LAUNCHES, ENCODER_LAYER_KERNELS, MHA_HOST_LAUNCHES,
                                               EncoderLayerShape, composite_parts, encoder_layer_parts,
                                               encoder_layer_shape)
from fusion_advisor.analyze.graph import build_op_graph
from fusion_advisor.analyze.load import LoadedModel
from fusion_advisor.analyze.roofline import _op_time_us, op_host_us, op_launch_us
from fusion_advisor.devices import load_spec

H200 = load_spec("h200")
B, S, E, H, F = 2, 8, 64, 4, 128


class FastPathLayer(torch.nn.Module):
    """Calls the encoder layer's fast-path op directly (the capture runs the module's slow path otherwise)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(d_model=E, nhead=H, dim_feedforward=F, dropout=0.0,
                                                      batch_first=True).eval()

    def forward(self, x):
        l = self.layer  # noqa: E741
        return torch._transformer_encoder_layer_fwd(
            x, E, H, l.self_attn.in_proj_weight, l.self_attn.in_proj_bias, l.self_attn.out_proj.weight,
            l.self_attn.out_proj.bias, False, False, l.norm1.eps, l.norm1.weight, l.norm1.bias, l.norm2.weight,
            l.norm2.bias, l.linear1.weight, l.linear1.bias, l.linear2.weight, l.linear2.bias, None, None)


@pytest.fixture(scope="module")
def layer_op():
    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", FastPathLayer(), (torch.randn(B, S, E),),
                                            "cpu", "")))
    ops = [o for o in og.ops if "_transformer_encoder_layer_fwd" in o.target]
    assert len(ops) == 1
    return ops[0]


def test_the_graph_records_the_layer_flops_kernels_and_heads(layer_op):
    t = B * S
    gemms = 2 * t * E * 3 * E + 2 * t * E * E + 2 * 2 * t * E * F  # QKV, output projection, two FFN GEMMs
    attention = 2 * 2 * B * S * S * E  # QK^T and PV over all heads
    assert layer_op.flops == gemms + attention
    assert layer_op.eager_kernels == ENCODER_LAYER_KERNELS and layer_op.variant == f"heads={H}"
    assert encoder_layer_shape(layer_op.inputs, H) == EncoderLayerShape(B, S, E, H, F, "fp32")


def test_the_parts_carry_the_layer_gemms_and_its_kernels(layer_op):
    parts = encoder_layer_parts(layer_op)
    assert len(parts) == ENCODER_LAYER_KERNELS  # four GEMMs (the activation fused), attention, two adds, two norms
    assert sum(p.flops for p in parts if p.category in ("matmul", "attention")) == layer_op.flops
    attention = [p for p in parts if p.category == "attention"]
    assert len(attention) == 1 and attention[0].variant == "efficient"  # fp32: flash refuses it
    assert attention[0].inputs[0].shape == (B, H, S, E // H)
    assert {p.category for p in parts} == {"matmul", "attention", "pointwise", "normalization"}


def test_device_time_is_the_parts_and_host_time_the_measured_launches(layer_op):
    parts = encoder_layer_parts(layer_op)
    assert _op_time_us(layer_op, H200) == pytest.approx(sum(_op_time_us(p, H200) for p in parts))
    assert op_host_us(layer_op, H200) == pytest.approx(ENCODER_LAYER_HOST_LAUNCHES * op_launch_us(layer_op, H200))
    # a layer of GEMMs, attention and norms costs far more than one kernel's bytes: 0.07-0.10x measured before
    assert _op_time_us(layer_op, H200) > ENCODER_LAYER_KERNELS * H200.kernel_busy_overhead_us


def test_16_bit_layers_take_a_fused_16_bit_backend(layer_op):
    half = dataclasses.replace(layer_op, inputs=tuple(dataclasses.replace(m, dtype="bf16", nbytes=m.nbytes // 2)
                                                      for m in layer_op.inputs),
                               outputs=tuple(dataclasses.replace(m, dtype="bf16", nbytes=m.nbytes // 2)
                                             for m in layer_op.outputs))
    attention = [p for p in encoder_layer_parts(half) if p.category == "attention"]
    assert attention[0].variant == "flash" and attention[0].dtype == "bf16"


def test_a_record_without_heads_keeps_the_one_op_price(layer_op):
    old = dataclasses.replace(layer_op, variant="", eager_kernels=1)
    assert encoder_layer_parts(old) == []
    assert op_host_us(old, H200) == pytest.approx(op_launch_us(old, H200))


def test_shapes_that_do_not_read_as_a_layer_give_no_parts(layer_op):
    assert encoder_layer_shape(layer_op.inputs, 0) is None  # no heads
    assert encoder_layer_shape(layer_op.inputs, 5) is None  # 64 not divisible by 5
    assert encoder_layer_shape(layer_op.inputs[:3], H) is None
    squeezed = (dataclasses.replace(layer_op.inputs[0], shape=(B * S, E)),) + layer_op.inputs[1:]
    assert encoder_layer_shape(squeezed, H) is None  # a 2-D src (unbatched)


class FastPathMha(torch.nn.Module):
    """nn.MultiheadAttention's fast-path op called directly, self-attention on ``x`` (``need_weights`` as given)."""

    def __init__(self, need_weights: bool, average: bool = True):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
        self.need_weights, self.average = need_weights, average

    def forward(self, x):
        m = self.mha
        out, _ = torch._native_multi_head_attention(x, x, x, E, H, m.in_proj_weight, m.in_proj_bias,
                                                    m.out_proj.weight, m.out_proj.bias, None, self.need_weights,
                                                    self.average)
        return out


@pytest.mark.parametrize("need_weights, average, weights, kernels", [
    (True, True, "average", 8), (True, False, "per-head", 7), (False, True, "", 5)])
def test_multihead_attention_fast_path(need_weights, average, weights, kernels):
    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", FastPathMha(need_weights, average),
                                            (torch.randn(B, S, E),), "cpu", "")))
    (op,) = [o for o in og.ops if "_native_multi_head_attention" in o.target]
    t = B * S
    assert op.flops == 2 * t * E * 3 * E + 2 * t * E * E + 2 * 2 * B * S * S * E
    assert op.variant == f"heads={H}" + (f",weights={weights}" if weights else "") and op.eager_kernels == kernels
    parts = composite_parts(op)
    assert len(parts) == kernels
    assert sum(p.flops for p in parts if p.category in ("matmul", "attention")) == op.flops
    assert any(p.category == "attention" for p in parts) is (not need_weights)  # weights need the scores
    assert _op_time_us(op, H200) == pytest.approx(sum(_op_time_us(p, H200) for p in parts))
    assert op_host_us(op, H200) == pytest.approx(MHA_HOST_LAUNCHES * op_launch_us(op, H200))


def test_cross_attention_takes_two_projection_gemms():
    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", FastPathMha(True), (torch.randn(B, S, E),),
                                            "cpu", "")))
    (op,) = [o for o in og.ops if "_native_multi_head_attention" in o.target]
    longer = dataclasses.replace(op.inputs[1], shape=(B, 3 * S, E), numel=B * 3 * S * E)
    cross = dataclasses.replace(op, inputs=(op.inputs[0], longer, longer) + op.inputs[3:])
    parts = composite_parts(cross)
    assert [p.id.split("/")[1] for p in parts[:2]] == ["q_proj", "kv_proj"]
    lq, lk = S, 3 * S
    want = 2 * 2 * B * lq * E * E + 2 * 2 * B * lk * E * E + 2 * 2 * B * lq * lk * E
    assert sum(p.flops for p in parts if p.category in ("matmul", "attention")) == want
