"""Roofline terms added for eager costs: attention at its SDPA backend's measured rate (log-linear in seq, clamped,
with fallbacks), the math backend's kernels and score traffic, and the permuted-read bandwidth; specs without the
new fields behave as before, and bad fields are refused naming them."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from fusion_advisor.devices import AttentionRate, load_spec, parse_spec
from fusion_advisor.errors import DeviceSpecError
from fusion_advisor.analyze.records import Chain, OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.roofline import attention_geometry, estimate

H200 = load_spec("h200")


def _rate(backend, seq, tflops, dtype="bf16", head_dim=128, causal=False):
    return AttentionRate(backend=backend, dtype=dtype, seq=seq, head_dim=head_dim, causal=causal, tflops=tflops)


RATES = (_rate("flash", 512, 300.0), _rate("flash", 2048, 600.0), _rate("flash", 1024, 200.0, causal=True),
         _rate("flash", 512, 100.0, head_dim=64), _rate("math", 512, 20.0), _rate("math", 4096, 40.0))
SPEC = dataclasses.replace(H200, attention_rates=RATES)


@pytest.mark.parametrize("backend,seq,head_dim,causal,want,origin", [
    ("flash", 512, 128, False, 300.0, "rates"),
    ("flash", 1024, 128, False, 450.0, "rates"),      # log2 midpoint of 512 and 2048
    ("flash", 128, 128, False, 300.0, "rates"),       # clamped below
    ("flash", 65536, 128, False, 600.0, "rates"),     # clamped above
    ("", 2048, 128, False, 600.0, "rates"),           # backend unknown: taken as flash
    ("flash", 4096, 128, True, 200.0, "rates"),       # causal entries when there are any
    ("flash", 512, 64, False, 100.0, "rates"),        # its own head dim
    ("flash", 512, 80, False, 100.0, "rates"),        # nearest measured head dim
    ("math", 2048, 128, False, 20.0 + 20.0 * 2 / 3, "rates"),
    ("efficient", 2048, 128, False, 607.0, "attention_tflops"),  # no rates for it: the flat table
    ("flash", 2048, 128, False, 67.0, "tensor_tflops"),           # fp32 below: no fp32 rates, no flat fp32 entry
])
def test_attention_peak_lookup(backend, seq, head_dim, causal, want, origin):
    spec = SPEC
    if origin == "tensor_tflops":
        spec = dataclasses.replace(SPEC, attention_tflops={"bf16": 607.0})
        got = spec.attention_peak_tflops(backend, "fp32", seq, head_dim, causal)
    else:
        got = spec.attention_peak_tflops(backend, "bf16", seq, head_dim, causal)
    assert got[0] == pytest.approx(want) and got[1] == origin


def test_fp16_attention_takes_the_bf16_rates_where_it_has_none_of_its_own():
    # calibrate times the grid in bf16 alone (fp16 ran at 0.93-1.04x its rate on the H200 and the H100)
    assert SPEC.attention_peak_tflops("flash", "fp16", 2048, 128) == (600.0, "rates")
    assert SPEC.attention_peak_tflops("math", "fp16", 4096, 128) == (40.0, "rates")
    own = dataclasses.replace(SPEC, attention_rates=RATES + (_rate("flash", 2048, 550.0, dtype="fp16"),))
    assert own.attention_peak_tflops("flash", "fp16", 2048, 128) == (550.0, "rates")  # its own entries first
    assert own.attention_peak_tflops("flash", "bf16", 2048, 128) == (600.0, "rates")
    # fp32 has no twin: without fp32 rates it takes the flat table, then the tensor-core peak
    assert SPEC.attention_peak_tflops("flash", "fp32", 2048, 128)[1] != "rates"


def _attention_op(variant: str, causal: bool = False, mask: bool = False, kernels: int = 1):
    b, h, s, d = 2, 32, 2048, 128
    q = TensorMeta(shape=(b, h, s, d), dtype="bf16", numel=b * h * s * d, nbytes=2 * b * h * s * d)
    flops = 4 * b * h * s * s * d // (2 if causal else 1)
    inputs = (q, q, q) + ((TensorMeta((b, 1, s, s), "bf16", b * s * s, 2 * b * s * s),) if mask else ())
    op = OpInfo(id="g0:attn", graph_index=0, target="fusion_advisor_capture.attention.default",
                category="attention", inputs=inputs, outputs=(q,), flops=flops,
                bytes_read=sum(m.nbytes for m in inputs), bytes_written=q.nbytes, module_path="",
                source=SourceLoc("m.py", 1, "attn"), variant=variant, eager_kernels=kernels)
    chain = Chain(id="c0", kind="heavy", op_ids=(op.id,), targets=(op.target,), pattern="attention",
                  categories=("attention",), dtype="bf16", eager_kernels=kernels,
                  eager_bytes=op.bytes_read + op.bytes_written, fused_bytes=op.bytes_read + op.bytes_written,
                  flops=flops, numel=q.numel, row_elems=0, source=op.source, module_path="")
    return op, chain


def test_attention_geometry_reads_causal_from_flops():
    assert attention_geometry(_attention_op("flash")[0]) == (2048, 128, False)
    assert attention_geometry(_attention_op("flash", causal=True)[0]) == (2048, 128, True)


def test_estimate_uses_the_backend_rate():
    op, chain = _attention_op("flash")
    est = estimate(chain, {op.id: op}, SPEC)
    assert est.peak_tflops == pytest.approx(600.0)
    assert est.compute_us == pytest.approx(op.flops / 600e12 * 1e6) == pytest.approx(est.eager_us)
    assert est.ridge_point == pytest.approx(600e12 / (H200.memory_bandwidth_gbps * 1e9))
    # without rates: as before (the flat measured attention rate)
    old = estimate(chain, {op.id: op}, H200)
    assert old.peak_tflops == 607.0 and old.compute_us == pytest.approx(op.flops / 607e12 * 1e6)


def test_math_backend_costs_its_kernels_and_score_traffic():
    op, chain = _attention_op("math", mask=True, kernels=10)
    est = estimate(chain, {op.id: op}, H200)  # no rates: flat rate, but score traffic and 10 launches
    scores = 2 * 32 * 2048 * 2048
    memory_us = (op.bytes_read + op.bytes_written + scores * 2 * 9.5) / (H200.memory_bandwidth_gbps * 1e9) * 1e6
    launch = H200.launch_overhead_us * H200.host_time_scale  # an eager launch's host time inside a model
    assert est.eager_us == pytest.approx(max(op.flops / 607e12 * 1e6, memory_us, 10 * launch))
    assert est.launch_eager_us == pytest.approx(10 * launch)
    fused, _ = _attention_op("flash", mask=True)
    assert est.eager_us > estimate(chain, {fused.id: fused}, H200).eager_us
    with_rate = estimate(chain, {op.id: op}, SPEC)  # math measured at 20-40 TFLOP/s
    assert with_rate.eager_us == pytest.approx(op.flops / ((20.0 + 20.0 * 2 / 3) * 1e12) * 1e6)


def _pointwise(permuted: bool, category: str = "pointwise"):
    shape = (2, 32, 2048, 128)
    n = 2 * 32 * 2048 * 128
    a = TensorMeta(shape, "bf16", n, 2 * n, contiguous=not permuted)
    cos = TensorMeta((2048, 128), "bf16", 2048 * 128, 2 * 2048 * 128)
    out = TensorMeta(shape, "bf16", n, 2 * n)
    op = OpInfo(id="g0:mul", graph_index=0, target="aten.mul.Tensor", category=category, inputs=(a, cos),
                outputs=(out,), flops=n, bytes_read=a.nbytes + cos.nbytes, bytes_written=out.nbytes,
                module_path="", source=SourceLoc())
    chain = Chain(id="c0", kind="fusible", op_ids=(op.id,), targets=(op.target,), pattern="pointwise",
                  categories=(category,), dtype="bf16", eager_kernels=1, eager_bytes=op.bytes_read + op.bytes_written,
                  fused_bytes=op.bytes_read + op.bytes_written, flops=n, numel=n, row_elems=0, source=op.source,
                  module_path="")
    return op, chain


def test_permuted_reads_use_the_strided_bandwidth():
    h200 = dataclasses.replace(H200, elementwise_overhead_us=0.0, kernel_busy_overhead_us=0.0,  # bytes alone
                               broadcast_bandwidth_gbps=0.0,  # (the cos table broadcasts: its own test below)
                               strided_bandwidth_gbps=0.0)
    strided = dataclasses.replace(h200, strided_bandwidth_gbps=1500.0)
    op, chain = _pointwise(permuted=True)
    nbytes = op.bytes_read + op.bytes_written
    assert estimate(chain, {op.id: op}, strided).eager_us == pytest.approx(nbytes / 1500e9 * 1e6)
    assert estimate(chain, {op.id: op}, h200).eager_us == pytest.approx(nbytes / 4275e9 * 1e6)  # not measured
    plain, chain2 = _pointwise(permuted=False)
    assert estimate(chain2, {plain.id: plain}, strided).eager_us == pytest.approx(nbytes / 4275e9 * 1e6)
    # library ops keep their ceilings whatever the operand layout
    mm, chain3 = _pointwise(permuted=True, category="matmul")
    assert estimate(chain3, {mm.id: mm}, strided).eager_us == estimate(chain3, {mm.id: mm}, H200).eager_us


def test_a_pointwise_op_broadcasting_an_input_runs_at_the_broadcast_bandwidth():
    from fusion_advisor.analyze.roofline import roofline_op_us

    plain = dataclasses.replace(H200, elementwise_overhead_us=0.0, kernel_busy_overhead_us=0.0,
                                broadcast_bandwidth_gbps=0.0)
    spec = dataclasses.replace(plain, broadcast_bandwidth_gbps=2500.0)
    op, _ = _pointwise(permuted=False)  # x [2, 32, 2048, 128] * cos [2048, 128]
    nbytes = op.bytes_read + op.bytes_written
    assert op.reads_broadcast
    assert roofline_op_us(op, spec) == pytest.approx(nbytes / 2500e9 * 1e6)
    assert roofline_op_us(op, plain) == pytest.approx(nbytes / plain.memory_bandwidth_gbps / 1e3)  # not measured
    same = dataclasses.replace(op, inputs=(op.inputs[0], op.outputs[0]))  # two full-size operands
    assert not same.reads_broadcast and roofline_op_us(same, spec) == roofline_op_us(same, plain)
    scalar = dataclasses.replace(op, inputs=(op.inputs[0], TensorMeta((), "bf16", 1, 2)))  # a 0-dim tensor
    assert scalar.reads_broadcast
    conv = dataclasses.replace(op, category="conv")  # a library op with a bias keeps its own ceiling
    assert roofline_op_us(conv, spec) == roofline_op_us(conv, plain)
    # the shipped H200 spec carries one, under its copy bandwidth (fitted from profiles)
    assert 0 < H200.broadcast_bandwidth_gbps < H200.memory_bandwidth_gbps


BASE = "name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\nlaunch_overhead_us: 1\n"


def _spec(extra: str):
    return parse_spec(yaml.safe_load(BASE + extra), "s.yaml")


def test_spec_new_fields_load():
    spec = _spec("strided_bandwidth_gbps: 50\nattention_rates:\n"
                 "  - {backend: flash, dtype: bf16, seq: 1024, head_dim: 128, tflops: 5}\n"
                 "  - {backend: math, dtype: fp32, seq: 512, head_dim: 64, causal: true, tflops: 0.5}\n")
    assert spec.strided_bandwidth_gbps == 50.0
    assert spec.attention_rates == (_rate("flash", 1024, 5.0), _rate("math", 512, 0.5, "fp32", 64, True))
    plain = _spec("")
    assert plain.attention_rates == () and plain.strided_bandwidth_gbps == 0.0
    for name in ("h200", "h100", "a100", "l4", "cpu"):  # shipped specs carry no unmeasured numbers
        shipped = load_spec(name)
        assert shipped.attention_rates == ()
        for field in ("strided_bandwidth", "broadcast_bandwidth"):
            assert getattr(shipped, f"{field}_gbps") == 0.0 or (shipped.sources or {})[field].startswith(
                ("measured", "fitted from analyze --profile runs"))


@pytest.mark.parametrize("extra,message", [
    ("attention_rates: {flash: 1}\n", "field 'attention_rates' must be a list"),
    ("attention_rates: [3]\n", r"attention_rates\[0\] must be a mapping"),
    ("attention_rates: [{backend: flash, dtype: bf16, seq: 1, head_dim: 1}]\n", r"attention_rates\[0\]: missing key\(s\) tflops"),
    ("attention_rates: [{backend: xformers, dtype: bf16, seq: 1, head_dim: 1, tflops: 1}]\n",
     r"attention_rates\[0\].backend must be one of flash, efficient, cudnn, math"),
    ("attention_rates: [{backend: flash, dtype: bf16, seq: 1.5, head_dim: 1, tflops: 1}]\n",
     r"attention_rates\[0\].seq must be a positive integer"),
    ("attention_rates: [{backend: flash, dtype: bf16, seq: 1, head_dim: 0, tflops: 1}]\n",
     r"attention_rates\[0\].head_dim must be a positive integer"),
    ("attention_rates: [{backend: flash, dtype: bf16, seq: 1, head_dim: 1, tflops: -2}]\n",
     r"attention_rates\[0\].tflops must be a positive number"),
    ("attention_rates: [{backend: flash, dtype: bf16, seq: 1, head_dim: 1, tflops: 1, causal: maybe}]\n",
     r"attention_rates\[0\].causal must be true or false"),
    ("attention_rates: [{backend: flash, dtype: bf16, seq: 1, head_dim: 1, tflops: 1, speed: 2}]\n",
     r"attention_rates\[0\]: unknown key\(s\) speed"),
    ("strided_bandwidth_gbps: fast\n", "field 'strided_bandwidth_gbps' must be a positive number"),
    ("strided_bandwidth_gbps: 0\n", "field 'strided_bandwidth_gbps' must be a positive number"),
])
def test_spec_new_fields_refused(extra, message):
    with pytest.raises(DeviceSpecError, match=message) as err:
        _spec(extra)
    assert str(err.value).startswith("s.yaml: ")
