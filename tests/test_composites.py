"""Native composite ops (analyze/composites.py): nn.TransformerEncoderLayer's fast path is one aten call that runs a
whole layer; the graph stage records its FLOPs, kernels and heads, and the roofline prices it as its parts (device)
and as a measured number of launches (host); with a mask its attention runs unfused. A record without the heads (a
report written before) keeps the one-op price."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fusion_advisor.analyze.capture import capture
from fusion_advisor.analyze.composites import (ENCODER_LAYER_HOST_LAUNCHES, ENCODER_LAYER_KERNELS,
                                               ENCODER_LAYER_MASKED_KERNELS, EncoderLayerShape, encoder_layer_parts,
                                               encoder_layer_shape)
from fusion_advisor.analyze.graph import build_op_graph
from fusion_advisor.analyze.load import LoadedModel
from fusion_advisor.analyze.roofline import _op_time_us, op_host_us, op_launch_us
from fusion_advisor.devices import load_spec

H200 = load_spec("h200")
B, S, E, H, F = 2, 8, 64, 4, 128


class FastPathLayer(torch.nn.Module):
    """Calls the encoder layer's fast-path op directly: the record is then tested on any device (the module takes
    its fast path only on a CPU or CUDA tensor, not on the meta device a GPU-less analysis runs on)."""

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


def _capture_layer(mask: bool, layer: torch.nn.Module | None = None):
    layer = layer or torch.nn.TransformerEncoderLayer(E, H, F, dropout=0.0, batch_first=True).eval()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            if mask:
                return self.layer(x, src_mask=torch.nn.Transformer.generate_square_subsequent_mask(S))
            return self.layer(x)

    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", M(), (torch.randn(B, S, E),), "cpu", "")))
    return [o for o in og.ops if "_transformer_encoder_layer_fwd" in o.target]


def test_the_module_on_a_cpu_tensor_is_captured_as_the_composite():
    (op,) = _capture_layer(mask=False)
    assert op.eager_kernels == ENCODER_LAYER_KERNELS and len(encoder_layer_parts(op)) == ENCODER_LAYER_KERNELS


def test_a_masked_layer_runs_its_attention_unfused():
    ops = _capture_layer(mask=True)
    assert len(ops) == 1, "the masked layer takes the fast path too"
    op = ops[0]
    parts = encoder_layer_parts(op)
    assert op.eager_kernels == ENCODER_LAYER_MASKED_KERNELS == len(parts)
    assert not any(p.category == "attention" for p in parts)  # no fused kernel with a mask
    softmax = [p for p in parts if p.category == "softmax"]
    assert softmax and softmax[0].outputs[0].shape == (B * H, S, S)  # the whole score matrix is written
    assert sum(p.flops for p in parts if p.category == "matmul") == op.flops
    assert op_host_us(op, H200) == pytest.approx(ENCODER_LAYER_HOST_LAUNCHES * op_launch_us(op, H200))


def test_an_unreadable_call_is_one_op_of_one_kernel(layer_op):
    from fusion_advisor.analyze.composites import composite_record

    variant, kernels, flops = composite_record("_transformer_encoder_layer_fwd", (None, E, 0), {}, layer_op.inputs)
    assert (variant, kernels, flops) == ("", 1, 0)  # no heads: nothing to price the parts by


def test_ops_csv_says_a_composite_is_priced_by_its_parts():
    """A reviewer: price_source read "roofline" for the encoder layer's fast path, which _op_time_us prices as
    the sum of its parts, each through the matmul or reduction table and its fit."""
    from fusion_advisor.analyze.roofline import price_source

    (op,) = _capture_layer(mask=False)
    said = price_source(op, H200)
    assert said.startswith("parts: ") and "matmul table" in said and "reduction table" in said, said
