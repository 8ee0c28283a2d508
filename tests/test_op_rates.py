"""Measured convolution / matmul rates (devices/op_rates.py), host time per op class and per module call, and the
bound class each chain has inside the model (analyze/roofline.py)."""

import dataclasses
import math
import random

import pytest
import torch
import torch.nn.functional as F

from fusion_advisor.analyze.records import Chain, OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.op_classes import conv_detail
from fusion_advisor.analyze.roofline import (_module_calls, base_op_us, eager_in_model_us, estimate, estimate_all,
                                             measured_conv_us, measured_matmul_us, op_bandwidth_gbps, op_host_us,
                                             op_launch_us, roofline_op_us)
from fusion_advisor.devices import load_spec, parse_spec, spec_mapping
from fusion_advisor.devices.op_rates import (CONV_CLASSES, ConvGeometry, ConvRate, MatmulRate, channels_unaligned,
                                             conv_kernels, conv_time_us, matmul_time_us)
from fusion_advisor.devices.rate_sampling import (CLASS_MAX_FLOPS, CLASS_SHARE, GPU_MAX_ELEMS, matmul_plan,
                                                  measure_conv_rates, measure_matmul_rates,
                                                  problem_geometry, sample_plan)
from fusion_advisor.errors import DeviceSpecError

SPEC = dataclasses.replace(load_spec("cpu"), name="toy", memory_bandwidth_gbps=1000.0, launch_overhead_us=10.0,
                           op_time_fits={}, op_time_fit_dtypes=())


def _t(shape, dtype="fp32") -> TensorMeta:
    n = math.prod(shape)
    return TensorMeta(shape=tuple(shape), dtype=dtype, numel=n, nbytes=4 * n)


def _op(target, category, inputs, outputs, flops=0, module_path="", i=0) -> OpInfo:
    return OpInfo(id=f"g0:op{i}", graph_index=0, target=target, category=category, inputs=tuple(inputs),
                  outputs=tuple(outputs), flops=flops, bytes_read=sum(t.nbytes for t in inputs),
                  bytes_written=sum(t.nbytes for t in outputs), module_path=module_path,
                  source=SourceLoc("m.py", i, "x"))


def _conv_op(x, w, y, i=0) -> OpInfo:
    g = ConvGeometry.from_shapes(x, w, y)
    return _op("aten.convolution.default", "conv", [_t(x), _t(w)], [_t(y)], flops=g.flops, i=i)


def _chain(cid, ops, pattern="pointwise") -> Chain:
    return Chain(id=cid, kind="fusible", op_ids=tuple(o.id for o in ops), targets=tuple(o.target for o in ops),
                 pattern=pattern, categories=tuple(o.category for o in ops), dtype="fp32", eager_kernels=len(ops),
                 eager_bytes=sum(o.bytes_read + o.bytes_written for o in ops), fused_bytes=0, flops=0, numel=1,
                 row_elems=0, source=ops[0].source, module_path="")


# --- geometry -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, detail", [
    (lambda: (torch.empty(2, 8, 16, 16), torch.empty(32, 8, 3, 3), {}), "conv2d"),
    (lambda: (torch.empty(2, 8, 16, 16), torch.empty(32, 2, 3, 3), {"groups": 4}), "conv2d_grouped"),
    (lambda: (torch.empty(2, 8, 16, 16), torch.empty(8, 1, 3, 3), {"groups": 8}), "conv2d_depthwise"),
    (lambda: (torch.empty(2, 4, 6, 6, 6), torch.empty(8, 4, 3, 3, 3), {}), "conv3d"),
    (lambda: (torch.empty(2, 4, 64), torch.empty(8, 4, 5), {}), "conv1d"),
])
def test_conv_geometry_of_real_convolutions(make, detail):
    x, w, kw = make()
    y = getattr(F, f"conv{x.dim() - 2}d")(x, w, **kw)
    g = ConvGeometry.from_shapes(x.shape, w.shape, y.shape)
    assert g.detail == detail
    assert g.c_in_per_group == w.shape[1] and g.kernel_volume == math.prod(w.shape[2:])
    from torch.utils.flop_counter import conv_flop_count

    assert g.flops == conv_flop_count(list(x.shape), list(w.shape), list(y.shape), transposed=False)


def test_conv_geometry_of_a_transposed_convolution():
    x, w = torch.empty(2, 16, 8, 8), torch.empty(16, 4, 4, 4)  # weight [C_in, C_out / groups, k, k]
    y = F.conv_transpose2d(x, w, stride=2)
    g = ConvGeometry.from_shapes(x.shape, w.shape, y.shape)
    assert g.detail == "conv2d_transpose" and (g.c_in_per_group, g.c_out_per_group) == (16, 4)
    assert g.stride == pytest.approx(y.shape[2] * y.shape[3] / 64)


def test_a_grouped_transposed_convolution_is_a_class_of_its_own():
    x, w = torch.empty(2, 16, 8, 8), torch.empty(16, 8, 3, 5)  # 4 groups of 4 -> 8 channels
    y = F.conv_transpose2d(x, w, stride=2, groups=4, dilation=(2, 1))
    g = ConvGeometry.from_shapes(x.shape, w.shape, y.shape)
    assert g.detail == "conv2d_transpose_grouped" and (g.c_in_per_group, g.c_out_per_group) == (4, 8)
    x3, w3 = torch.empty(1, 8, 4, 4, 4), torch.empty(8, 1, 3, 3, 3)  # one channel per group: still grouped
    g3 = ConvGeometry.from_shapes(x3.shape, w3.shape, F.conv_transpose3d(x3, w3, groups=8).shape)
    assert g3.detail == "conv3d_transpose_grouped"


def test_conv_geometry_refuses_what_is_not_a_convolution():
    assert ConvGeometry.from_shapes((2, 8), (8, 8), (2, 8)) is None
    assert ConvGeometry.from_shapes((2, 8, 4, 4), (8, 8, 1), (2, 8, 4, 4)) is None
    assert ConvGeometry.from_shapes((0, 8, 4, 4), (8, 8, 1, 1), (0, 8, 4, 4)) is None


def test_conv_detail_is_the_geometry_class():
    op = _conv_op((2, 8, 16, 16), (8, 1, 3, 3), (2, 8, 14, 14))
    assert conv_detail(op) == "conv2d_depthwise"
    bare = dataclasses.replace(op, inputs=())
    assert conv_detail(bare) == "conv"


# --- the tables -----------------------------------------------------------------------------------------------


def _rate(c_in, c_out, tflops, kernel=9, gflop=10.0, detail="conv2d", dtype="fp32") -> ConvRate:
    return ConvRate(detail, dtype, c_in, c_out, kernel, 1.0, gflop, tflops)


def _us(geom: ConvGeometry, tflops: float) -> float:
    return geom.flops / (tflops * 1e12) * 1e6


def test_few_measurements_price_at_the_nearest_measured_rates():
    rates = [_rate(4, 16, 5.0), _rate(256, 256, 80.0), _rate(8, 16, 6.0)]
    few = ConvGeometry("conv2d", 4, 16, 9, 1.0, int(10e9))
    many = ConvGeometry("conv2d", 256, 256, 9, 1.0, int(10e9))
    assert conv_time_us(rates, few, "fp32") > _us(few, 10.0)  # near the few-channel samples
    assert conv_time_us(rates, many, "fp32") < _us(many, 30.0)  # an exact match weighs most
    assert conv_time_us(rates, dataclasses.replace(few, detail="conv3d"), "fp32") is None
    bf16 = [_rate(4, 16, 50.0, dtype="bf16")]
    assert conv_time_us(bf16, few, "fp16") == pytest.approx(_us(few, 50.0))  # fp16 reads bf16's table
    assert conv_time_us(bf16, few, "fp32") is None
    nhwc = [dataclasses.replace(r, layout="nhwc", tflops=2 * r.tflops) for r in rates]
    assert conv_time_us(rates + nhwc, many, "fp32", "nhwc") == pytest.approx(
        conv_time_us(rates + nhwc, many, "fp32") / 2)  # each layout reads its own entries


@pytest.mark.parametrize("measured, asked, nearer, unrelated", [
    # a 1-D class with no measurements: the 2-D class cuDNN runs it as
    ("conv2d_grouped", "conv1d_grouped", "conv1d_grouped", "conv3d_grouped"),
    # down a chain: a grouped transposed 1-D convolution takes the grouped transposed 2-D class, else (a spec
    # calibrated before grouped transposed convolutions were sampled) the transposed 2-D one
    ("conv2d_transpose", "conv1d_transpose_grouped", "conv2d_transpose_grouped", "conv3d_transpose_grouped"),
])
def test_a_class_with_no_measurements_is_priced_from_the_class_it_falls_back_to(measured, asked, nearer, unrelated):
    table = [dataclasses.replace(_rate(4, 16, 5.0), detail=measured),
             dataclasses.replace(_rate(64, 64, 40.0), detail=measured)]
    geom = ConvGeometry(asked, 4, 16, 1, 1.0, int(10e9))
    assert conv_time_us(table, geom, "fp32") == pytest.approx(
        conv_time_us(table, dataclasses.replace(geom, detail=measured), "fp32"))
    own = table + [dataclasses.replace(_rate(4, 16, 1.0), detail=nearer)]
    assert conv_time_us(own, geom, "fp32") == pytest.approx(_us(geom, 1.0))  # the nearer class first
    assert conv_time_us(table, dataclasses.replace(geom, detail=unrelated), "fp32") is None


def test_a_convolution_is_priced_from_the_table_not_the_roofline():
    op = _conv_op((8, 4, 64, 64), (16, 4, 3, 3), (8, 16, 62, 62))
    spec = dataclasses.replace(SPEC, conv_rates=(_rate(4, 16, 2.0, gflop=op.flops / 1e9),))
    want = op.flops / 2e12 * 1e6
    assert measured_conv_us(op, spec) == pytest.approx(want)
    assert base_op_us(op, spec) == pytest.approx(want)
    assert measured_conv_us(op, SPEC) is None and base_op_us(op, SPEC) == roofline_op_us(op, SPEC)


def test_matmuls_take_their_operands_by_overload():
    a, b, bias = _t((64, 32)), _t((32, 128)), _t((128,))
    mm = _op("aten.mm.default", "matmul", [a, b], [_t((64, 128))], flops=2 * 64 * 32 * 128)
    addmm = _op("aten.addmm.default", "matmul", [bias, a, b], [_t((64, 128))], flops=2 * 64 * 32 * 128)
    rates = (MatmulRate("mm", "fp32", 64, 128, 32, 1, 4.0), MatmulRate("mm", "fp32", 4096, 4096, 4096, 1, 40.0))
    spec = dataclasses.replace(SPEC, matmul_rates=rates)
    want = 2 * 64 * 32 * 128 / 4e12 * 1e6  # at the exact neighbour's 4 TFLOP/s; the far one weighs ~3%
    assert measured_matmul_us(mm, spec) == pytest.approx(want, rel=0.1)
    assert measured_matmul_us(addmm, spec) == measured_matmul_us(mm, spec)
    assert matmul_time_us(rates, "bmm", 64, 128, 32, 8, "fp32") is None
    assert measured_matmul_us(mm, SPEC) is None


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_a_gemm_priced_from_a_table_never_beats_the_compute_roofline(gpu):
    """A fresh user's bf16 8192^3 Linear on the shipped H100 spec read 178 us (6.2 PFLOP/s; its table's largest bf16
    matmul ran 229 TFLOP/s and the surface extrapolated past the GPU), and the whole default model 2.27x vs eager."""
    from fusion_advisor.analyze.roofline import base_op_us, op_peak_tflops, measured_op_us

    n = 8192
    a, b = TensorMeta((n, n), "bf16", n * n, 2 * n * n), TensorMeta((n, n), "bf16", n * n, 2 * n * n)
    mm = OpInfo("g0:mm", 0, "aten.mm.default", "matmul", (a, b), (a,), 2 * n ** 3, 4 * n * n, 2 * n * n, "",
                SourceLoc("m.py", 1, "x @ w"))
    spec = load_spec(gpu)
    floor = mm.flops / (op_peak_tflops(mm, spec) * 1e12) * 1e6
    assert measured_op_us(mm, spec) >= floor * (1 - 1e-9) and base_op_us(mm, spec) >= floor * (1 - 1e-9)
    assert measured_op_us(mm, spec) < 1.5 * floor  # at this size a GEMM runs near the peak


def _gemv(k: int, n: int, dtype: str) -> OpInfo:
    """A batch-1 ``x [1, k] @ w [k, n]`` mm in ``dtype``."""
    size = 2 if dtype in ("bf16", "fp16") else 4
    x, w = TensorMeta((1, k), dtype, k, size * k), TensorMeta((k, n), dtype, k * n, size * k * n)
    y = TensorMeta((1, n), dtype, n, size * n)
    return OpInfo("g0:mm", 0, "aten.mm.default", "matmul", (x, w), (y,), 2 * k * n, x.nbytes + w.nbytes, y.nbytes,
                  "", SourceLoc("m.py", 1, "x @ w"))


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_a_matmul_moving_more_than_l2_holds_is_priced_no_faster_than_copy_bandwidth(gpu):
    """A fresh user's batch-1 bf16 GEMV over a 4096 x 14336 weight (117 MB) read 16.9 us on the shipped H200 spec,
    6.96 TB/s on a 4.3 TB/s GPU: its bf16 surface carried an L2-speed memory term (every over-L2 entry of the
    tables ran at most at copy bandwidth)."""
    from fusion_advisor.analyze.roofline import matmul_memory_floor_us, measured_op_us

    spec = load_spec(gpu)
    gemv = _gemv(4096, 14336, "bf16")
    floor = (gemv.bytes_read + gemv.bytes_written) / (spec.memory_bandwidth_gbps * 1e3)
    assert matmul_memory_floor_us(gemv, spec) == pytest.approx(floor)
    assert measured_op_us(gemv, spec) >= floor * (1 - 1e-9)
    small = dataclasses.replace(gemv, bytes_read=2 ** 20)  # inside L2: the table's own rate stands
    assert matmul_memory_floor_us(small, spec) == 0.0


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_a_profile_fit_never_takes_a_table_priced_matmul_past_its_floors(gpu):
    """The shipped fp32 matmul fits (0.9) took an fp32 GEMV over a 67 MB weight, priced at its memory floor, to
    3,373 GB/s on the H100's 3,018 (a reviewer); its reason read "112% of its roofline"."""
    from fusion_advisor.analyze.roofline import _op_time_us, matmul_memory_floor_us

    spec = load_spec(gpu)
    gemv = _gemv(1024, 16384, "fp32")
    assert spec.op_time_fit(("matmul/mm/fp32", "matmul/mm"), "fp32") is not None  # the fit the floor must bound
    assert _op_time_us(gemv, spec) >= matmul_memory_floor_us(gemv, spec) * (1 - 1e-9) > 0


def _bmm(batch: int, m: int, k: int, n: int, line: int = 4) -> OpInfo:
    a = TensorMeta((batch, m, k), "fp32", batch * m * k, 4 * batch * m * k)
    b = TensorMeta((batch, k, n), "fp32", batch * k * n, 4 * batch * k * n)
    out = TensorMeta((batch, m, n), "fp32", batch * m * n, 4 * batch * m * n)
    return OpInfo("g0:bmm", 0, "aten.bmm.default", "matmul", (a, b), (out,), 2 * batch * m * n * k,
                  a.nbytes + b.nbytes, out.nbytes, "", SourceLoc("m.py", line, "torch.einsum(...)"))


def test_a_matmul_far_beyond_the_table_is_named_as_an_extrapolation():
    """A fresh user's einsum('bik,bik->b') ran as a bmm of M = N = 1 over K = 262,144 (the table's largest K:
    16,382) and read 4.2 ms (16 GB/s) with a reason saying vendor GEMMs run near their ceiling. A dot product is now
    priced as a stream (MatvecModel); two rows and columns over that K still run through the GEMM surface far
    beyond its table, and are named."""
    from fusion_advisor.analyze.roofline import op_device_us
    from fusion_advisor.analyze.table_range import beyond_table_note

    spec = load_spec("h200")
    dot = _bmm(32, 1, 262144, 1)
    assert beyond_table_note(dot, spec) == ""
    assert op_device_us(dot, spec) < 2 * (dot.bytes_read + dot.bytes_written) / (spec.memory_bandwidth_gbps * 1e3)
    pair = _bmm(32, 2, 262144, 2)
    note = beyond_table_note(pair, spec)
    assert note.startswith("m.py:4: bmm [2 x 262144] @ [262144 x 2] x 32 fp32 is priced beyond")
    assert "K 262,144 against at most 16,382" in note and "% of its roofline, is an extrapolation" in note
    assert f"est. {op_device_us(pair, spec):,.1f} us," in note  # the price the chains carry (a fresh user: the
    # warning read 11,184.6 us, the table and the reason 10,141.2, its profile fit applied)
    # beyond the table but priced at its ceiling (the default model's 32000-wide LM head): nothing to doubt
    x, w = TensorMeta((2048, 4096), "bf16", 2048 * 4096, 2 * 2048 * 4096), \
        TensorMeta((4096, 32000), "bf16", 4096 * 32000, 2 * 4096 * 32000)
    y = TensorMeta((2048, 32000), "bf16", 2048 * 32000, 2 * 2048 * 32000)
    head = OpInfo("g0:mm", 0, "aten.mm.default", "matmul", (x, w), (y,), 2 * 2048 * 4096 * 32000,
                  x.nbytes + w.nbytes, y.nbytes, "", SourceLoc("m.py", 9, "self.lm_head(h)"))
    assert beyond_table_note(head, spec) == ""
    inside = dataclasses.replace(pair, inputs=(TensorMeta((32, 64, 512), "fp32", 32 * 64 * 512, 4 * 32 * 64 * 512),
                                              TensorMeta((32, 512, 64), "fp32", 32 * 64 * 512, 4 * 32 * 64 * 512)))
    assert beyond_table_note(inside, spec) == ""


def test_a_fit_under_the_roofline_never_prices_an_op_past_the_bytes_l2_cannot_hold():
    """The shipped H100 fits of clones (0.73x) and LayerNorm (0.94x) learnt in-model L2 reads; carried to a
    384 MiB clone they priced it at 4.1 TB/s on a 3.0 TB/s GPU (found by a fresh user). The bytes beyond what L2
    holds come from memory."""
    from fusion_advisor.analyze.roofline import _op_time_us, dram_floor_us
    from fusion_advisor.devices import OpTimeFit

    n = 96 * 2 ** 20  # 384 MiB of fp32 read, 384 MiB written
    x = TensorMeta((n,), "fp32", n, 4 * n)
    clone = OpInfo("g0:c", 0, "aten.clone.default", "copy", (x,), (x,), 0, 4 * n, 4 * n, "",
                   SourceLoc("m.py", 1, "x.clone()"))
    spec = dataclasses.replace(load_spec("h100"), op_time_fits={"copy/clone": OpTimeFit(0.5, 1.0, 1.0, 20.0)},
                               op_time_fit_dtypes=("fp32",))
    floor = (8 * n - spec.l2_bytes) / (spec.memory_bandwidth_gbps * 1e3)
    assert dram_floor_us(clone, spec) == pytest.approx(floor) and _op_time_us(clone, spec) >= floor
    small = dataclasses.replace(clone, bytes_read=2 ** 20, bytes_written=2 ** 20)
    assert dram_floor_us(small, spec) == 0.0  # in L2: the fit's gain may stand


def test_a_matmul_is_corrected_by_the_entries_of_its_second_operands_layout():
    from fusion_advisor.analyze.matmul_shapes import matmul_layout

    x, w_t, bias = _t((8, 1024)), dataclasses.replace(_t((1024, 256)), contiguous=False), _t((256,))
    linear = _op("aten.addmm.default", "matmul", [bias, x, w_t], [_t((8, 256))], flops=2 * 8 * 1024 * 256)
    mm = _op("aten.mm.default", "matmul", [x, _t((1024, 256))], [_t((8, 256))], flops=2 * 8 * 1024 * 256)
    assert matmul_layout(w_t) == "nt" and matmul_layout(_t((1024, 256))) == "nn"
    sizes = [(m, n, k) for m in (4, 8, 64, 512) for n in (128, 1024) for k in (256, 2048)]  # 16 of each layout
    rates = tuple(MatmulRate("mm", "fp32", m, n, k, 1, 2 * m * n * k / (t * 1e6), layout)
                  for m, n, k in sizes for layout, t in (("nn", 3.0 + k / 1000), ("nt", 3.0 + k / 100)))
    spec = dataclasses.replace(SPEC, matmul_rates=rates)
    # one surface through both; each op moved toward its own layout's entries (8 x 256 x 1024: 4.0 and 13.2 us;
    # the correction, shrunk toward none, takes the nn one 5.4)
    nn_us, nt_us = measured_matmul_us(mm, spec), measured_matmul_us(linear, spec)
    assert nt_us == pytest.approx(3.0 + 10.24, rel=0.2) and nn_us < 1.5 * (3.0 + 1.024) and nt_us > 2 * nn_us
    # a table without entries of the op's layout (measured before layouts were): priced as an nn one
    old = dataclasses.replace(SPEC, matmul_rates=tuple(r for r in rates if r.layout == "nn"))
    assert measured_matmul_us(linear, old) == measured_matmul_us(mm, old)


def test_the_tables_round_trip_through_a_spec_file_and_bad_entries_are_named():
    spec = dataclasses.replace(SPEC, conv_rates=(_rate(4, 16, 2.0),),
                               matmul_rates=(MatmulRate("bmm", "bf16", 8, 16, 32, 4, 1.5),
                                             MatmulRate("mm", "fp32", 8, 16, 32, 1, 0.5, "nt", 2.0)),
                               launch_overhead_by_class={"conv": 40.0}, view_overhead_us=1.5, module_call_us=3.0)
    back = parse_spec(spec_mapping(spec), "test")
    assert back.conv_rates == spec.conv_rates and back.matmul_rates == spec.matmul_rates
    assert back.launch_overhead_by_class == {"conv": 40.0} and back.view_overhead_us == 1.5
    data = spec_mapping(spec)
    data["conv_rates"][0]["tflops"] = -1
    with pytest.raises(DeviceSpecError, match=r"conv_rates\[0\]"):
        parse_spec(data, "bad.yaml")
    data = spec_mapping(spec)
    data["launch_overhead_by_class"] = {"conv": "fast"}
    with pytest.raises(DeviceSpecError, match="launch_overhead_by_class.conv"):
        parse_spec(data, "bad.yaml")
    data = spec_mapping(spec)
    data["matmul_rates"][1]["layout"] = "tn"
    with pytest.raises(DeviceSpecError, match=r"matmul_rates\[1\].*layout 'tn'"):
        parse_spec(data, "bad.yaml")


def test_the_shipped_specs_have_measured_tables_for_every_conv_class():
    from fusion_advisor.devices.op_rates import _pool

    # both calibrated with grouped transposed convolutions as classes of their own, and matmuls in both layouts
    for spec in (load_spec("h100"), load_spec("h200")):
        assert {r.detail for r in spec.conv_rates if r.dtype == "fp32"} == set(CONV_CLASSES)
        assert all(_pool(spec.conv_rates, detail, "fp32") for detail in CONV_CLASSES)
        assert {(r.detail, r.layout) for r in spec.matmul_rates} == {(d, lay) for d in ("mm", "bmm") for lay in ("nn", "nt")}
        assert spec.launch_overhead_by_class["conv"] > spec.launch_overhead_us


# --- what calibrate samples ------------------------------------------------------------------------------------


def test_every_sampled_convolution_is_of_its_class():
    plan = sample_plan({"fp32": 12, "bf16": 3})
    assert plan == sample_plan({"fp32": 12, "bf16": 3})  # seeded
    assert {p.detail for p in plan} == set(CONV_CLASSES)
    assert {p.detail for p in plan[:len(CONV_CLASSES)]} == set(CONV_CLASSES)  # interleaved: a cut keeps every class
    for p in plan:
        x = torch.empty(1, p.c_in, *p.spatial, device="meta")
        d = len(p.spatial)
        if p.transposed:
            w = torch.empty(p.c_in, p.c_out // p.groups, *p.kernel, device="meta")
            y = getattr(F, f"conv_transpose{d}d")(x, w, stride=p.stride, padding=p.padding, groups=p.groups)
        else:
            w = torch.empty(p.c_out, p.c_in // p.groups, *p.kernel, device="meta")
            y = getattr(F, f"conv{d}d")(x, w, stride=p.stride, padding=p.padding, groups=p.groups)
        assert ConvGeometry.from_shapes(x.shape, w.shape, y.shape).detail == p.detail, p


def test_transposed_samples_are_strided_and_padded_as_models_write_them():
    plan = [p for p in sample_plan({"fp32": 200}) if p.transposed]
    padded = [p for p in plan if any(p.padding)]
    assert len(padded) >= len(plan) // 5 and all(p.stride > 1 for p in padded)
    for p in padded[:20]:  # the geometry calibrate records is the one the convolution runs
        x = torch.empty(p.batch, p.c_in, *p.spatial, device="meta")
        w = torch.empty(p.c_in, p.c_out // p.groups, *p.kernel, device="meta")
        y = getattr(F, f"conv_transpose{len(p.spatial)}d")(x, w, stride=p.stride, padding=p.padding, groups=p.groups)
        assert problem_geometry(p) == ConvGeometry.from_shapes(x.shape, w.shape, y.shape)


def test_grouped_transposed_samples_stay_under_their_flop_cap():
    plan = sample_plan({"fp32": 200}, max_elems=GPU_MAX_ELEMS)
    for detail, cap in CLASS_MAX_FLOPS.items():
        drawn = [problem_geometry(p).flops for p in plan if p.detail == detail]
        assert len(drawn) == round(200 * CLASS_SHARE[detail])
        assert max(drawn) <= 4 * cap and min(drawn) < cap


class _Timing:
    median_ms = 0.5
    kernels_per_call = 3.0


def test_measuring_the_tables_on_a_cpu_with_a_stub_timer():
    plan = sample_plan({"fp32": 2}, max_elems=1 << 14, flop_range=(1e5, 1e6))
    calls = []

    def timer(fn):
        calls.append(fn())
        return _Timing()

    rates, skipped = measure_conv_rates("cpu", plan, timer, budget_s=60.0, dtypes={"fp32": torch.float32})
    assert len(rates) == len(plan) and not skipped and all(r.tflops > 0 for r in rates)
    assert {r.layout for r in rates} == {"nchw"}
    assert rates[0].tflops == pytest.approx(rates[0].gflop * 1e9 / 0.5e-3 / 1e12)
    geom = problem_geometry(plan[0])
    assert rates[0].mbytes == pytest.approx(geom.elements * 4 / 1e6)  # input, weight and output in fp32
    assert {r.kernels for r in rates} == {3.0}  # the timer's activity count is recorded
    mm = matmul_plan({"fp32": 2}, max_elems=1 << 12, flop_range=(1e3, 1e7))
    calls.clear()
    mrates, _ = measure_matmul_rates("cpu", mm, timer, budget_s=60.0, dtypes={"fp32": torch.float32})
    assert len(mrates) == len(mm) and {r.detail for r in mrates} == {"mm", "bmm"}
    assert [r.layout for r in mrates] == ["nn", "nt", "nn", "nt"] and {r.kernels for r in mrates} == {3.0}
    for (_, _, batch, m, n, _, _), y in zip(mm, calls, strict=True):  # each call computed its [batch,] M x N
        assert tuple(y.shape) == ((m, n) if batch == 1 else (batch, m, n))
    none, note = measure_conv_rates("cpu", plan, timer, budget_s=-1.0, dtypes={"fp32": torch.float32})
    assert not none and "budget" in note["conv_rates"]


# --- host time ------------------------------------------------------------------------------------------------


def test_host_time_per_call_by_op_class():
    conv = _conv_op((1, 4, 8, 8), (4, 4, 3, 3), (1, 4, 6, 6))
    add = _op("aten.add.Tensor", "pointwise", [_t((4,))], [_t((4,))])
    spec = dataclasses.replace(SPEC, launch_overhead_by_class={"conv": 40.0})
    assert op_launch_us(conv, spec) == 40.0 and op_launch_us(add, spec) == 10.0
    alone = estimate(_chain("c0", [conv], "conv"), {conv.id: conv}, spec)
    assert alone.eager_us == pytest.approx(40.0) and alone.bound == "launch"


@pytest.mark.parametrize("prev, path, calls", [
    ("", "", 0), ("a", "a", 0), ("", "a.b", 2), ("a.b", "a", 0), ("a.b", "a.c.d", 2), ("a.b", "x", 1),
])
def test_module_calls_entered_between_two_ops(prev, path, calls):
    assert _module_calls(prev, path) == calls


def test_views_and_module_calls_cost_the_host_in_the_model():
    ops = [_op("aten.add.Tensor", "pointwise", [_t((256,))], [_t((256,))], module_path=f"m{i}", i=i)
           for i in range(3)]
    chains = [_chain(f"c{i}", [o]) for i, o in enumerate(ops)]
    plain = eager_in_model_us(chains, ops, SPEC)
    slow = eager_in_model_us(chains, ops, dataclasses.replace(SPEC, module_call_us=5.0))
    assert slow["c1"] == pytest.approx(plain["c1"] + 5.0)  # each op enters one more module: 5 us more waiting


def test_at_host_speed_scales_every_host_cost():
    spec = dataclasses.replace(SPEC, launch_overhead_by_class={"conv": 40.0}, view_overhead_us=2.0, module_call_us=4.0,
                               activity_host_share=0.25, conv_probe_kernels=2.0)
    fast = spec.at_host_speed(5.0)
    assert (fast.launch_overhead_us, fast.launch_overhead_by_class["conv"], fast.view_overhead_us,
            fast.module_call_us) == (5.0, 20.0, 1.0, 2.0)
    assert (fast.activity_host_share, fast.conv_probe_kernels) == (0.25, 2.0)  # a share and a count, not costs
    assert spec.at_host_speed(0.0) is spec


def _counted(c_in, c_out, kernels, kernel=9) -> ConvRate:
    return dataclasses.replace(_rate(c_in, c_out, 10.0, kernel=kernel), kernels=kernels)


def test_a_convolution_takes_the_activity_count_of_its_nearest_measured_neighbours():
    rates = [_counted(64, 64, 1.0, kernel=1), _counted(64, 64, 1.0, kernel=1), _counted(64, 128, 2.0, kernel=1),
             _counted(32, 64, 1.0, kernel=1), _counted(256, 256, 5.0), _counted(256, 256, 5.0),
             _counted(256, 512, 5.0), _counted(128, 256, 4.0), _counted(512, 256, 5.0), _rate(256, 256, 10.0)]
    pointwise = ConvGeometry("conv2d", 64, 64, 1, 1.0, int(10e9))
    three = ConvGeometry("conv2d", 256, 256, 9, 1.0, int(10e9))
    assert conv_kernels(rates, three, "fp32") == 5.0  # the uncounted entry (kernels 0) is not a neighbour
    assert conv_kernels(rates, pointwise, "fp32") == 1.0
    assert conv_kernels(rates, dataclasses.replace(three, detail="conv3d"), "fp32") is None
    assert conv_kernels([_rate(256, 256, 10.0)], three, "fp32") is None  # an old table: no counts


def test_a_convolution_issuing_more_activities_than_the_probe_costs_the_host_more():
    op = _conv_op((8, 256, 28, 28), (256, 256, 3, 3), (8, 256, 26, 26))
    table = tuple(_counted(256, 256, k) for k in (5.0, 5.0, 5.0))
    spec = dataclasses.replace(SPEC, launch_overhead_by_class={"conv": 30.0}, conv_rates=table,
                               activity_host_share=0.2, conv_probe_kernels=2.0)
    assert op_host_us(op, spec) == pytest.approx(30.0 * (1 + 3 * 0.2))
    assert op_host_us(op, dataclasses.replace(spec, activity_host_share=0.0)) == 30.0  # not measured: the probe's
    one = dataclasses.replace(spec, conv_rates=tuple(_counted(256, 256, 1.0) for _ in range(3)))
    assert op_host_us(op, one) == pytest.approx(30.0 * 0.8)  # one activity fewer than the probe
    floor = dataclasses.replace(one, activity_host_share=3.0)
    assert op_host_us(op, floor) == pytest.approx(15.0)  # never below half the class's probe
    # the table's convolutions have no bias; one with a bias issues its add kernel on top (the probe has one too)
    biased = dataclasses.replace(op, inputs=(*op.inputs, _t((256,))))
    assert op_host_us(biased, one) == pytest.approx(30.0)  # 1 + the bias = the probe's 2 activities
    assert op_host_us(biased, spec) == pytest.approx(30.0 * (1 + 4 * 0.2))
    no_bias = dataclasses.replace(op, inputs=(*op.inputs, _t((0,))))  # aten.convolution's empty bias: none
    assert op_host_us(no_bias, one) == pytest.approx(30.0 * 0.8)
    chain = _chain("c0", [op], "conv")
    assert estimate(chain, {op.id: op}, spec).launch_eager_us == pytest.approx(48.0)  # 30 x 1.6
    assert eager_in_model_us([chain], [op], spec)["c0"] >= eager_in_model_us([chain], [op], one)["c0"]


def test_activity_counts_round_trip_through_a_spec_file_and_negative_ones_are_refused():
    spec = dataclasses.replace(SPEC, conv_rates=(_counted(4, 16, 3.0),), activity_host_share=0.25,
                               conv_probe_kernels=2.0)
    back = parse_spec(spec_mapping(spec), "test")
    assert back.conv_rates[0].kernels == 3.0 and (back.activity_host_share, back.conv_probe_kernels) == (0.25, 2.0)
    assert parse_spec(spec_mapping(SPEC), "test").activity_host_share == 0.0  # optional
    data = spec_mapping(spec)
    data["conv_rates"][0]["kernels"] = -1
    with pytest.raises(DeviceSpecError, match=r"conv_rates\[0\]"):
        parse_spec(data, "bad.yaml")
    data = spec_mapping(spec)
    data["activity_host_share"] = "slow"
    with pytest.raises(DeviceSpecError, match="activity_host_share"):
        parse_spec(data, "bad.yaml")


def test_a_short_chain_behind_a_long_kernel_is_not_launch_bound_in_the_model():
    # without the in-model bound class it was "launch" (priced alone) while a profile measures it busy
    nbytes = int(100e-6 * 1000e9)
    big = _op("aten.add.Tensor", "pointwise", [_t((nbytes // 8,))], [_t((nbytes // 8,))], i=0)
    small = [_op("aten.relu.default", "pointwise", [_t((256,))], [_t((256,))], i=i) for i in (1, 2)]
    chains = [_chain("c0", [big]), _chain("c1", small)]
    ops = [big, *small]
    assert estimate(chains[1], {o.id: o for o in ops}, SPEC).bound == "launch"
    assert estimate_all(chains, ops, SPEC)["c1"].bound == "memory"



@pytest.mark.parametrize("key, value", [("tflops", float("nan")), ("tflops", float("inf")), ("tflops", True),
                                        ("tflops", "0.5"), ("c_in", 3.7), ("c_in", -4), ("stride", 0.0),
                                        ("detail", "conv9d"), ("dtype", "float32"), ("tflopz", 1.0)])
def test_a_malformed_table_entry_is_refused_with_its_index(key, value):
    data = spec_mapping(dataclasses.replace(SPEC, conv_rates=(_rate(4, 16, 2.0),)))
    data["conv_rates"][0][key] = value
    with pytest.raises(DeviceSpecError, match=r"bad.yaml: conv_rates\[0\]"):
        parse_spec(data, "bad.yaml")


def test_slow_rates_keep_their_significant_figures_in_a_spec_file():
    slow = _rate(4, 16, 0.00042, gflop=0.00731).rounded()
    assert slow.tflops == 0.00042 and slow.gflop == 0.00731
    parse_spec(spec_mapping(dataclasses.replace(SPEC, conv_rates=(slow,))), "cpu calibration")


def test_a_non_numeric_l2_size_is_a_spec_error():
    data = spec_mapping(SPEC)
    data["l2_bytes"] = "big"
    with pytest.raises(DeviceSpecError, match="l2_bytes"):
        parse_spec(data, "bad.yaml")


def test_the_cpu_sample_stays_near_its_flop_range():
    from fusion_advisor.devices.rate_sampling import CPU_CONV_FLOP_RANGE

    plan = sample_plan({"fp32": 8}, max_elems=4 << 20, flop_range=CPU_CONV_FLOP_RANGE)
    assert {p.detail for p in plan} == set(CONV_CLASSES)
    assert max(problem_geometry(p).flops for p in plan) <= 4 * CPU_CONV_FLOP_RANGE[1]


def _synthetic_rates(model, shapes, noise=None) -> list[ConvRate]:
    """Convolutions timed by ``model`` (one outlier per ``noise`` entry: index -> factor)."""
    out = []
    for i, (c_in, c_out, kernel, gflop, mbytes) in enumerate(shapes):
        t = model.time_us(gflop * 1e9, c_out, c_in * kernel, mbytes * 1e6, channels_unaligned(c_in, "fp32")) \
            * (noise or {}).get(i, 1.0)
        out.append(ConvRate("conv2d", "fp32", c_in, c_out, kernel, 1.0, gflop, gflop * 1e9 / (t * 1e-6) / 1e12,
                            "nchw", mbytes))
    return out


def test_a_class_with_enough_measurements_is_priced_from_a_fitted_roofline():
    from fusion_advisor.devices.op_rates import MODEL_MIN_SAMPLES, ConvTimeModel, fit_conv_table

    truth = ConvTimeModel(peak_tflops=250.0, n_half=40.0, k_half=80.0, mn_half=2e5, gbps=2500.0, fixed_us=6.0)
    rng = random.Random(0)
    shapes = [(rng.choice((3, 16, 64, 256, 1024)), rng.choice((8, 32, 128, 512, 2048)), rng.choice((1, 9, 25)),
               10 ** rng.uniform(-2, 2), 10 ** rng.uniform(0, 3)) for _ in range(120)]
    # a tenth of them sent to a kernel 20x slower, as cuDNN's heuristics do with odd shapes: the L1 fit ignores them
    rates = _synthetic_rates(truth, shapes, noise={i: 20.0 for i in range(0, 120, 10)})
    fitted = fit_conv_table(tuple(rates)).model
    clean = _synthetic_rates(truth, shapes)
    errors = sorted(abs(math.log2(fitted.time_us(r.gflop * 1e9, r.c_out, r.c_in * r.kernel, r.nbytes())
                                  / r.time_us())) for r in clean)
    assert errors[len(errors) // 2] < 0.1  # the median clean convolution within 7%
    # conv_time_us uses it from MODEL_MIN_SAMPLES measurements on, with the op's bytes
    geom = ConvGeometry("conv2d", 64, 128, 9, 1.0, int(2e9), elements=10_000_000)
    assert len(rates) >= MODEL_MIN_SAMPLES
    assert conv_time_us(rates, geom, "fp32") == pytest.approx(fitted.time_us(2e9, 128, 64 * 9, 4e7))
    # a larger convolution takes longer; the rate saturates at the peak (no unbounded extrapolation)
    big = dataclasses.replace(geom, flops=int(2e12), elements=10 ** 9)
    assert conv_time_us(rates, big, "fp32") > 100 * conv_time_us(rates, geom, "fp32") / 2
    assert big.flops / (conv_time_us(rates, big, "fp32") * 1e-6) / 1e12 < 1.1 * fitted.peak_tflops


def test_unaligned_input_channels_get_their_own_fitted_slowdown():
    from fusion_advisor.devices.op_rates import MIN_UNALIGNED_SAMPLES, ConvTimeModel, fit_conv_table

    assert channels_unaligned(3, "fp32") and not channels_unaligned(64, "fp32")
    assert channels_unaligned(4, "bf16") and not channels_unaligned(8, "fp16") and not channels_unaligned(4, "fp32")
    truth = ConvTimeModel(peak_tflops=250.0, n_half=40.0, k_half=80.0, mn_half=2e5, gbps=2500.0, fixed_us=6.0,
                          unaligned_factor=4.0)  # a 3-channel stem at a fifth of its neighbours' rate
    rng = random.Random(1)
    shapes = [(rng.choice((3, 6, 64, 256, 1024)), rng.choice((8, 32, 128, 512, 2048)), rng.choice((1, 9, 25)),
               10 ** rng.uniform(0, 2), 10 ** rng.uniform(0, 2)) for _ in range(120)]
    fitted = fit_conv_table(tuple(_synthetic_rates(truth, shapes))).model
    assert fitted.unaligned_factor == pytest.approx(4.0, rel=0.2)
    geom = ConvGeometry("conv2d", 3, 64, 49, 1.0, int(2e10), elements=10_000_000)
    aligned = dataclasses.replace(geom, c_in_per_group=4)
    rates = _synthetic_rates(truth, shapes)
    assert conv_time_us(rates, geom, "fp32") > 3 * conv_time_us(rates, aligned, "fp32") * 3 / 4
    # too few unaligned measurements: no slowdown fitted (a pool of aligned convolutions says nothing about it)
    few = [s for s in shapes if s[0] >= 64] + [s for s in shapes if s[0] < 64][:MIN_UNALIGNED_SAMPLES - 1]
    assert fit_conv_table(tuple(_synthetic_rates(truth, few))).model.unaligned_factor == 0.0


def test_a_table_entry_without_bytes_estimates_them():
    r = ConvRate("conv2d", "fp32", 64, 128, 9, 2.0, 2.0, 10.0)  # M = 2e9 / (2 * 128 * 576) output positions
    m = 2e9 / (2 * 128 * 576)
    assert r.nbytes() == pytest.approx((m * 2.0 * 64 + m * 128 + 128 * 576) * 4)
    assert dataclasses.replace(r, mbytes=5.0).nbytes() == 5e6
    assert ConvRate.from_dict({**dataclasses.asdict(r), "mbytes": 5.0}).mbytes == 5.0
    with pytest.raises(ValueError, match="mbytes"):
        ConvRate.from_dict({**dataclasses.asdict(r), "mbytes": -1.0})


# --- recurrent layers -----------------------------------------------------------------------------------------


def _recurrent_op(steps: int, flops: int, cell: str = "lstm") -> OpInfo:
    op = _op("fusion_advisor_capture.recurrent.default", "recurrent", [_t((512, 10, 128))], [_t((512, 10, 256))],
             flops=flops)
    return dataclasses.replace(op, variant=cell, sequential_steps=steps)


def test_a_recurrent_layer_costs_its_steps_or_its_flops():
    from fusion_advisor.analyze.roofline import recurrent_op_us

    spec = dataclasses.replace(SPEC, recurrent_step_us={"lstm": 5.0, "gru": 15.0})
    op = _recurrent_op(3072, int(1e9))
    assert recurrent_op_us(op, spec) == pytest.approx(3072 * 5.0)  # latency-bound: one step after another
    assert base_op_us(op, spec) == pytest.approx(3072 * 5.0)
    assert recurrent_op_us(dataclasses.replace(op, variant="gru"), spec) == pytest.approx(3072 * 15.0)
    huge = _recurrent_op(16, int(1e15))  # a wide layer: its FLOPs at the tensor-core peak take longer
    assert recurrent_op_us(huge, spec) > 16 * 5.0
    assert recurrent_op_us(op, SPEC) is None  # not measured: the roofline prices it
    assert recurrent_op_us(dataclasses.replace(op, variant="rnn_relu"), spec) is None


def test_recurrent_step_times_are_validated():
    data = spec_mapping(SPEC)
    data["recurrent_step_us"] = {"lstm": 5.0}
    assert parse_spec(data, "ok.yaml").recurrent_step_us == {"lstm": 5.0}
    assert parse_spec(spec_mapping(parse_spec(data, "ok.yaml")), "again.yaml").recurrent_step_us == {"lstm": 5.0}
    for bad, match in (({"lstmm": 5.0}, "unknown cell"), ({"lstm": 0.0}, "positive"), ({"gru": "fast"}, "gru"),
                       ([5.0], "must map")):
        data["recurrent_step_us"] = bad
        with pytest.raises(DeviceSpecError, match=match):
            parse_spec(data, "bad.yaml")


def test_calibrate_measures_a_step_time_per_cell_on_a_cpu():
    from fusion_advisor.devices.rate_sampling import measure_recurrent_steps

    calls = []

    def timer(fn):
        calls.append(fn())
        return _Timing()

    steps, failed = measure_recurrent_steps("cpu", True, timer)
    assert set(steps) == {"lstm", "gru", "rnn_tanh", "rnn_relu"} and not failed
    layers, seq = 2, 16
    assert steps["lstm"] == pytest.approx(0.5e3 / (layers * seq), rel=1e-3)  # the stub's 0.5 ms over 32 steps
    assert isinstance(calls[0], tuple) and calls[0][0].shape == (seq, 10, 256)


# --- scans ------------------------------------------------------------------------------------------------------


def _scan_chain(target="aten.cumsum.default"):
    x = _t((4096, 16384))
    op = _op(target, "other", [x], [x])
    return op, Chain(id="c0", kind="other", op_ids=(op.id,), targets=(op.target,), pattern="cumsum",
                     categories=("other",), dtype="fp32", eager_kernels=1, eager_bytes=2 * x.nbytes,
                     fused_bytes=2 * x.nbytes, flops=x.numel, numel=x.numel, row_elems=16384, source=op.source,
                     module_path="")


def test_an_eager_scan_runs_at_the_measured_scan_bandwidth_and_compiled_at_the_copy_roofline():
    op, chain = _scan_chain()
    spec = dataclasses.replace(SPEC, kind="gpu", scan_bandwidth_gbps=400.0,
                               route_efficiency={"torch.compile": {"default": 0.8}})
    assert op_bandwidth_gbps(op, spec) == 400.0 and op_bandwidth_gbps(op, SPEC) == SPEC.memory_bandwidth_gbps
    add = _op("aten.add.Tensor", "pointwise", [_t((4,))], [_t((4,))])
    assert op_bandwidth_gbps(add, spec) == spec.memory_bandwidth_gbps  # only scans
    est = estimate(chain, {op.id: op}, spec)
    bytes_ = 2 * 4096 * 16384 * 4
    assert est.eager_us == pytest.approx(bytes_ / 400e9 * 1e6, rel=0.01)
    assert est.compile_us == pytest.approx(bytes_ / (1000e9 * 0.8) * 1e6, rel=0.01)  # Inductor's own scan
    plain = estimate(chain, {op.id: op}, dataclasses.replace(SPEC, kind="gpu"))
    assert plain.compile_us == pytest.approx(plain.eager_us)  # unmeasured: no gain is claimed
    on_cpu = estimate(chain, {op.id: op}, dataclasses.replace(spec, kind="cpu"))
    assert on_cpu.compile_us == pytest.approx(on_cpu.eager_us)  # Inductor's CPU code calls ATen's scan
    other = _op("aten.sort.default", "other", op.inputs, op.outputs)
    assert estimate(dataclasses.replace(chain, op_ids=(other.id,)), {other.id: other}, spec).compile_us == \
        pytest.approx(estimate(dataclasses.replace(chain, op_ids=(other.id,)), {other.id: other}, spec).eager_us)


def test_the_scan_rate_is_measured_and_round_trips_through_a_spec_file():
    from fusion_advisor.devices.memory_rates import SCAN_SHAPES_SMALL, measure_scan_gbps

    gbps = measure_scan_gbps("cpu", True, lambda fn: (fn(), _Timing())[1])
    assert gbps == pytest.approx(2 * math.prod(SCAN_SHAPES_SMALL[0]) * 4 / 0.5e-3 / 1e9)
    back = parse_spec(spec_mapping(dataclasses.replace(SPEC, scan_bandwidth_gbps=1900.0)), "test")
    assert back.scan_bandwidth_gbps == 1900.0
    with pytest.raises(DeviceSpecError, match="scan_bandwidth_gbps"):
        parse_spec({**spec_mapping(SPEC), "scan_bandwidth_gbps": -1}, "bad.yaml")


def test_broadcast_and_scan_rates_are_measured_out_of_cache_and_never_price_above_the_copy():
    """A new user's CPU calibrate timed a 1 MiB broadcast add in its L2 at 154 GB/s against a copy of 58 GB/s, and
    the spec priced a bias add 4x cheaper than a plain add measured as long: CPU and quick shapes now hold the copy
    buffer's bytes, and the roofline takes no special-path rate above the copy bandwidth."""
    from fusion_advisor.devices.memory_rates import measure_broadcast_gbps, measure_scan_gbps

    nbytes = 4 << 20
    for measure in (measure_broadcast_gbps, measure_scan_gbps):
        gbps = measure("cpu", True, lambda fn: _Timing(), nbytes)  # 0.5 ms a call
        assert gbps * 1e9 * 0.5e-3 / 2 == pytest.approx(nbytes, rel=0.01)  # read + written: one fp32 buffer each
    op, _ = _scan_chain()
    fast = dataclasses.replace(SPEC, scan_bandwidth_gbps=3 * SPEC.memory_bandwidth_gbps)
    assert op_bandwidth_gbps(op, fast) == SPEC.memory_bandwidth_gbps


def test_a_cluster_the_fitted_surface_misses_is_corrected_locally_and_far_ops_are_not():
    from fusion_advisor.devices.op_rates import ConvTimeModel, conv_point, fit_conv_table

    truth = ConvTimeModel(peak_tflops=250.0, n_half=40.0, k_half=80.0, mn_half=2e5, gbps=2500.0, fixed_us=6.0)
    rng = random.Random(2)
    shapes = [(rng.choice((16, 64, 256, 1024)), rng.choice((32, 128, 512, 2048)), rng.choice((1, 9, 25)),
               10 ** rng.uniform(-1, 2), 10 ** rng.uniform(0, 3)) for _ in range(150)]
    # deep-K 3x3 convolutions into 32 channels run 3x faster than the surface says (cuDNN's split-K): a cluster of
    # them, as a late CNN stage has, which no 7-parameter roofline follows
    cluster = [(1024 + 32 * i, 32, 9, 0.3 + 0.01 * i, 5.0) for i in range(12)]
    rates = _synthetic_rates(truth, shapes) + [
        dataclasses.replace(r, tflops=3 * r.tflops) for r in _synthetic_rates(truth, cluster)]
    table = fit_conv_table(tuple(rates))
    assert table.correction is not None  # it lowers the table's own leave-one-out error
    inside = ConvGeometry("conv2d", 1200, 32, 9, 1.0, int(0.35e9), elements=1_250_000)
    far = ConvGeometry("conv2d", 16, 2048, 1, 1.0, int(50e9), elements=200_000_000)
    surface = table.model.time_us(inside.flops, 32, 1200 * 9, inside.elements * 4)
    assert conv_time_us(rates, inside, "fp32") < 0.6 * surface  # most of the way to the cluster's 3x
    far_surface = table.model.time_us(far.flops, 2048, 16, far.elements * 4)
    assert conv_time_us(rates, far, "fp32") == pytest.approx(far_surface, rel=0.05)
    assert table.correction.factor(conv_point(16, 2048, 1, 1.0, far.flops)) == pytest.approx(1.0, abs=0.05)
    # a table the surface fits already gets no correction
    assert fit_conv_table(tuple(_synthetic_rates(truth, shapes))).correction is None


def test_matmuls_with_enough_measurements_are_priced_from_a_fitted_surface():
    from fusion_advisor.devices.op_rates import MODEL_MIN_SAMPLES, ConvTimeModel, fit_matmul_table

    truth = ConvTimeModel(peak_tflops=50.0, n_half=8.0, k_half=20.0, mn_half=3e5, gbps=4000.0, fixed_us=4.0)
    rng = random.Random(3)
    rates = []
    for _ in range(40):
        m, n, k = (rng.choice((64, 256, 1024, 4096, 16384)) for _ in range(3))
        flops = 2.0 * m * n * k
        t = truth.time_us(flops, n, k, 4.0 * (m * k + k * n + m * n))
        rates.append(MatmulRate("mm", "fp32", m, n, k, 1, flops / (t * 1e6)))
    assert len(rates) >= MODEL_MIN_SAMPLES
    # a size no entry has (3000^3): the surface, not a neighbour's rate, prices it
    want = truth.time_us(2.0 * 3000 ** 3, 3000, 3000, 4.0 * 3 * 3000 ** 2)
    assert matmul_time_us(rates, "mm", 3000, 3000, 3000, 1, "fp32") == pytest.approx(want, rel=0.1)
    assert fit_matmul_table(tuple(rates)).model.peak_tflops == pytest.approx(50.0, rel=0.15)


def test_the_table_samples_late_cnn_stage_convolutions_and_large_matmuls():
    from fusion_advisor.devices.rate_sampling import GPU_MATMUL_FLOP_RANGE, GPU_MAX_ELEMS, MATMUL_SAMPLES

    plan = sample_plan({"fp32": 200}, max_elems=GPU_MAX_ELEMS)
    late = [p for p in plan if p.detail == "conv2d" and p.spatial[0] in (7, 14) and p.c_in >= 256 and p.c_out <= 64]
    assert len(late) >= 20  # DenseNet's growth layers: deep K into 32 channels at 7 x 7 and 14 x 14
    assert len({p.batch for p in late}) >= 4
    mm = [row for row in matmul_plan(MATMUL_SAMPLES["cuda"][0], max_elems=GPU_MAX_ELEMS,
                                     flop_range=GPU_MATMUL_FLOP_RANGE) if row[1] == "fp32"]  # what calibrate draws
    assert max(2 * b * m * n * k for _, _, b, m, n, k, _ in mm) > 2e11  # KernelBench's GEMMs reach 0.55 TFLOP
    # classifier heads and recurrent steps (M of 2-10 rows), few outputs (N), tiny blocks (K): each dim below 16
    for axis in range(3):
        assert any(row[3 + axis] < 16 and min(row[3:6]) == row[3 + axis] for row in mm if row[0] == "mm")
    # half of each class in nn.Linear's layout, with heads over wide features among them (cuBLAS's gemmSN_TN)
    for detail in ("mm", "bmm"):
        assert sum(row[6] == "nt" for row in mm if row[0] == detail) == MATMUL_SAMPLES["cuda"][0]["fp32"] // 2
    assert sum(m < 16 and n * k >= 1 << 16 for d, _, _, m, n, k, lay in mm if d == "mm" and lay == "nt") >= 8
    assert any(m < 16 and n * k >= 1 << 20 for d, _, _, m, n, k, lay in mm if d == "mm" and lay == "nt")  # a wide head


def test_a_concatenation_costs_each_input_the_sweep_of_the_largest():
    from fusion_advisor.analyze.roofline import cat_inputs_us

    parts = [_t((10, 928, 7, 7))] + [_t((10, 32, 7, 7)) for _ in range(32)]
    cat = _op("aten.cat.default", "copy", parts, [_t((10, 32 * 32 + 928, 7, 7))])
    add = _op("aten.add.Tensor", "pointwise", parts[:2], [_t((10, 928, 7, 7))])
    assert cat_inputs_us(cat, SPEC) == 0.0  # not measured: its bytes alone
    spec = dataclasses.replace(SPEC, cat_sweep_gbps=3500.0, cat_sweep_cap_bytes=7e6)
    largest = 10 * 928 * 49 * 4
    assert cat_inputs_us(cat, spec) == pytest.approx(33 * largest / 3.5e6) and cat_inputs_us(add, spec) == 0.0
    assert roofline_op_us(cat, spec) == pytest.approx(roofline_op_us(cat, SPEC) + 33 * largest / 3.5e6)
    big = _op("aten.cat.default", "copy", [_t((10, 928, 56, 56))] * 2, [_t((10, 1856, 56, 56))])
    assert cat_inputs_us(big, spec) == pytest.approx(2 * 7e6 / 3.5e6)  # the grid's width is capped
    back = parse_spec(spec_mapping(spec), "test")
    assert (back.cat_sweep_gbps, back.cat_sweep_cap_bytes) == (3500.0, 7e6)


def test_the_cat_probe_reads_the_rate_at_the_smallest_side_and_the_cap_from_the_largest_cost():
    from fusion_advisor.devices.memory_rates import (CAT_PROBE_FIRST, CAT_PROBE_INPUTS, CAT_PROBE_SIDES,
                                                     measure_cat_sweep)

    class Timing:
        def __init__(self, ms):
            self.median_ms = ms

    def timer_at(gbps, cap):  # each input sweeps min(largest, cap) at gbps; bytes at 1000 GB/s
        sides = iter(CAT_PROBE_SIDES)

        def timer(fn):
            s = next(sides)
            fn()
            largest = 10 * CAT_PROBE_FIRST * s * s * 4
            nbytes = 2 * 4 * 10 * s * s * (CAT_PROBE_FIRST + 32 * (CAT_PROBE_INPUTS - 1))
            return Timing((nbytes / 1e6 + CAT_PROBE_INPUTS * min(largest, cap) / (gbps * 1e3)) / 1e3)
        return timer

    gbps, cap = measure_cat_sweep("cpu", 1000.0, timer_at(3500.0, 7e6))
    assert gbps == pytest.approx(3500.0) and cap == pytest.approx(7e6)
    assert measure_cat_sweep("cpu", 1000.0, lambda fn: Timing(1e-6)) is None  # faster than its bytes


def test_a_correction_that_would_only_fit_noise_is_refused():
    from fusion_advisor.devices.op_rates import CORRECTION_NEIGHBOURS, fit_local_correction

    rng = random.Random(4)
    points = [tuple(rng.uniform(0, 10) for _ in range(5)) for _ in range(200)]
    assert fit_local_correction(points, [rng.gauss(0, 0.3) for _ in points]) is None  # neighbours say nothing
    # the same points with a smooth residual surface: the neighbours predict each other, the correction is kept
    smooth = [0.5 * math.sin(p[0] / 2) for p in points]
    assert fit_local_correction(points, smooth) is not None
    assert fit_local_correction(points[:2 * CORRECTION_NEIGHBOURS - 1], smooth) is None  # too few entries


def test_below_the_table_an_op_is_never_priced_over_a_measured_entry_that_does_more():
    from fusion_advisor.devices.op_rates import ConvTimeModel, conv_point, fit_conv_table

    # a surface whose fixed time (12 us) is above the table's smallest measured entry (4 us at 40 MFLOP)
    truth = ConvTimeModel(peak_tflops=250.0, n_half=40.0, k_half=80.0, mn_half=2e5, gbps=2500.0, fixed_us=12.0)
    rng = random.Random(1)
    shapes = [(rng.choice((16, 64, 256)), rng.choice((32, 128, 512)), rng.choice((1, 9)), 10 ** rng.uniform(0, 2),
               10 ** rng.uniform(1, 3)) for _ in range(60)]
    rates = _synthetic_rates(truth, shapes)
    small = ConvRate("conv2d", "fp32", 96, 16, 1, 1.0, 0.04, 0.04e9 / 4e-6 / 1e12, "nchw", 5.0)  # 4 us
    table = fit_conv_table(tuple(rates + [small]))
    tiny = (0.3e6, 4.0, 96.0, 0.3e6, False)  # a squeeze-and-excite 1x1 convolution: below every entry
    point = conv_point(96, 4, 1, 1.0, 0.3e6)
    assert table.model.time_us(*tiny) > 8.0  # the surface alone extrapolates its fixed time
    assert table.time_us(*tiny, point) == pytest.approx(4.0, rel=1e-3)  # bounded by the 4 us entry that does more
    assert table.dominating_us(0.3e6, 4.0, 96.0, 0.3e6, True) == math.inf  # unaligned: no entry of its kind
    inside = (shapes[0][3] * 1e9, float(shapes[0][1]), float(shapes[0][0] * shapes[0][2]), shapes[0][4] * 1e6, False)
    at = conv_point(shapes[0][0], shapes[0][1], shapes[0][2], 1.0, inside[0])
    # inside the table's range the surface stands, even where a larger entry ran faster
    assert table.time_us(*inside, at) == pytest.approx(table.model.time_us(*inside)
                                                       * (table.correction.factor(at) if table.correction else 1.0))


def test_a_matmul_below_its_table_is_bounded_by_entries_of_its_own_layout():
    from fusion_advisor.devices.op_rates import ConvTimeModel, FittedTable

    surface = ConvTimeModel(peak_tflops=250.0, n_half=40.0, k_half=80.0, mn_half=2e5, gbps=2500.0, fixed_us=12.0)
    rows = ((2 * 253 * 960 * 256, 960.0, 256.0, 2e6, False, 5.4),   # nn, 5.4 us
            (2 * 4 * 960 * 256, 960.0, 256.0, 1e6, False, 2.2))     # nt (gemmSN_TN), 2.2 us
    table = FittedTable(surface, None, rows, ("nn", "nt"))
    tiny = (2 * 2 * 64 * 256, 64.0, 256.0, 7e4, False)
    assert table.time_us(*tiny, (), "nn") == pytest.approx(5.4)  # not the nt entry's 2.2
    assert table.time_us(*tiny, (), "nt") == pytest.approx(2.2)
    assert FittedTable(surface, None, rows).time_us(*tiny, ()) == pytest.approx(2.2)  # a conv table: one layout


def test_a_matrix_vector_product_is_priced_as_a_stream_fitted_on_the_tables_own():
    """KernelBench's level-1 2048 x 1,048,576 matrix-vector product ran cuBLAS's dot kernels at 3.11 TB/s on the H100,
    2,763 us (benchmarks/results/h100/accuracy/matvec/); the GEMM surface's tile-fill terms priced it at 5,148. A
    matmul whose M or N is 1 is priced as fixed time plus its bytes at a fitted share of the copy bandwidth, fitted
    on the table's matrix-vector entries of its dtype, and no profile fit of the GEMM surface's prices applies; with
    too few of them (the shipped bf16 ones), the surface as before."""
    from fusion_advisor.analyze.roofline import measured_matmul_us, price_source
    from fusion_advisor.devices.op_rates import (MATVEC_MIN_SAMPLES, MatvecModel, fit_matvec_model, is_matvec,
                                                 matmul_bytes, matmul_time_us)

    assert is_matvec(2048, 1) and is_matvec(1, 4096) and not is_matvec(2, 2)
    spec = load_spec("h100")
    a = TensorMeta((2048, 1048576), "fp32", 2048 * 1048576, 4 * 2048 * 1048576)
    v = TensorMeta((1048576, 1), "fp32", 1048576, 4 * 1048576)
    y = TensorMeta((2048, 1), "fp32", 2048, 4 * 2048)
    gemv = OpInfo("g0:mm", 0, "aten.mm.default", "matmul", (a, v), (y,), 2 * 2048 * 1048576, a.nbytes + v.nbytes,
                  y.nbytes, "", SourceLoc("m.py", 22, "torch.matmul(A, B)"))
    assert measured_matmul_us(gemv, spec) == pytest.approx(2763.0, rel=0.3)
    assert price_source(gemv, spec) == "matmul table (matrix-vector stream)"  # no profile fit over it
    from fusion_advisor.analyze.roofline import op_device_us

    assert op_device_us(gemv, spec) == pytest.approx(measured_matmul_us(gemv, spec))
    half = dataclasses.replace(gemv, inputs=tuple(dataclasses.replace(t, dtype="bf16") for t in gemv.inputs),
                               outputs=tuple(dataclasses.replace(t, dtype="bf16") for t in gemv.outputs))
    assert half.dtype == "bf16"  # too few bf16 products measured: the surface
    assert price_source(half, spec).startswith("matmul table") and "matrix-vector" not in price_source(half, spec)
    # the fit recovers a stream it is given, and needs MATVEC_MIN_SAMPLES entries
    truth = MatvecModel(3.0, 0.8)
    shapes = [(m, 1, k) for m, k in ((256, 512), (1024, 1024), (4096, 2048), (8192, 4096), (512, 8192),
                                     (2048, 256), (64, 4096))] + \
        [(1, n, k) for n, k in ((128, 256), (2048, 2048), (4096, 8192), (16384, 1024), (768, 3072), (32000, 512))]
    table = [MatmulRate("mm", "fp32", m, n, k, 1, 2.0 * m * n * k / (truth.time_us(
        matmul_bytes(m, n, k, 1, "fp32"), 3000.0) * 1e6)) for m, n, k in shapes]
    assert fit_matvec_model(table, 3000.0) == truth
    assert fit_matvec_model(table[:MATVEC_MIN_SAMPLES - 1], 3000.0) is None
    gemm = [MatmulRate("mm", "fp32", 64 * i, 64 * i, 64 * i, 1, 0.5 * i) for i in range(1, 13)]
    few = gemm + table[:MATVEC_MIN_SAMPLES - 1]
    assert matmul_time_us(few, "mm", 4096, 1, 4096, 1, "fp32", "nn", 3000.0) == \
        matmul_time_us(few, "mm", 4096, 1, 4096, 1, "fp32", "nn")  # no bandwidth given: the surface
    streamed = matmul_time_us(gemm + table, "mm", 4096, 1, 4096, 1, "fp32", "nn", 3000.0)
    assert streamed == pytest.approx(truth.time_us(matmul_bytes(4096, 1, 4096, 1, "fp32"), 3000.0))
    assert matmul_time_us(gemm + table, "mm", 4096, 2, 4096, 1, "fp32", "nn", 3000.0) == \
        matmul_time_us(gemm + table, "mm", 4096, 2, 4096, 1, "fp32", "nn")  # two columns: a GEMM


def test_a_convolution_is_transposed_or_not_by_its_channels_before_its_sizes():
    """By the spatial sizes alone a padded 1x1 convolution from 64 to 128 channels (a larger output) read as a
    grouped transposed one and was priced at 860 us against a 12 us roofline, and a stride-1 transposed convolution
    from 128 to 64 channels as a grouped convolution (a reviewer). The weight's layout tells them apart; where it
    cannot (as many channels out as in), the sizes still do."""
    padded = ConvGeometry.from_shapes((8, 64, 56, 56), (128, 64, 1, 1), (8, 128, 58, 58))
    assert padded.detail == "conv2d" and (padded.c_in_per_group, padded.c_out_per_group) == (64, 128)
    same_size = ConvGeometry.from_shapes((8, 128, 56, 56), (128, 64, 3, 3), (8, 64, 56, 56))
    assert same_size.detail == "conv2d_transpose" and (same_size.c_in_per_group, same_size.c_out_per_group) == (128, 64)
    assert ConvGeometry.from_shapes((8, 64, 28, 28), (64, 32, 4, 4), (8, 32, 56, 56)).detail == "conv2d_transpose"
    assert ConvGeometry.from_shapes((8, 64, 28, 28), (64, 64, 4, 4), (8, 64, 56, 56)).detail == "conv2d_transpose"
    assert ConvGeometry.from_shapes((8, 64, 56, 56), (64, 1, 3, 3), (8, 64, 56, 56)).detail == "conv2d_depthwise"
    assert ConvGeometry.from_shapes((8, 64, 56, 56), (32, 16, 3, 3), (8, 32, 54, 54)).detail == "conv2d_grouped"
