"""Measured convolution / matmul rates (devices/op_rates.py), host time per op class and per module call, and the
bound class each chain has inside the model (analyze/roofline.py)."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from fusion_advisor.analyze.records import Chain, OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.roofline import (_module_calls, base_op_us, conv_detail, eager_in_model_us, estimate,
                                             estimate_all, measured_conv_us, measured_matmul_us, op_launch_us,
                                             roofline_op_us)
from fusion_advisor.devices import load_spec, parse_spec, spec_mapping
from fusion_advisor.devices.op_rates import (CONV_CLASSES, ConvGeometry, ConvRate, MatmulRate,
                                             interpolated_tflops, matmul_tflops, measure_conv_rates,
                                             measure_matmul_rates, matmul_plan, sample_plan)
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


def test_interpolation_leans_to_the_nearest_measured_convolutions():
    rates = [_rate(4, 16, 5.0), _rate(256, 256, 80.0), _rate(8, 16, 6.0)]
    few = ConvGeometry("conv2d", 4, 16, 9, 1.0, int(10e9))
    many = ConvGeometry("conv2d", 256, 256, 9, 1.0, int(10e9))
    assert interpolated_tflops(rates, few, "fp32") < 10.0  # near the few-channel samples
    assert interpolated_tflops(rates, many, "fp32") > 30.0  # an exact match weighs most
    assert interpolated_tflops(rates, dataclasses.replace(few, detail="conv3d"), "fp32") is None
    bf16 = [_rate(4, 16, 50.0, dtype="bf16")]
    assert interpolated_tflops(bf16, few, "fp16") == pytest.approx(50.0)  # fp16 reads bf16's table
    assert interpolated_tflops(bf16, few, "fp32") is None
    nhwc = [dataclasses.replace(r, layout="nhwc", tflops=2 * r.tflops) for r in rates]
    assert interpolated_tflops(rates + nhwc, many, "fp32", "nhwc") == pytest.approx(
        2 * interpolated_tflops(rates + nhwc, many, "fp32"))  # each layout reads its own entries


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
    assert matmul_tflops(rates, "bmm", 64, 128, 32, 8, "fp32") is None
    assert measured_matmul_us(mm, SPEC) is None


def test_the_tables_round_trip_through_a_spec_file_and_bad_entries_are_named():
    spec = dataclasses.replace(SPEC, conv_rates=(_rate(4, 16, 2.0),),
                               matmul_rates=(MatmulRate("bmm", "bf16", 8, 16, 32, 4, 1.5),),
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


def test_the_shipped_h200_spec_has_measured_tables_for_every_conv_class():
    h200 = load_spec("h200")
    assert {r.detail for r in h200.conv_rates if r.dtype == "fp32"} == set(CONV_CLASSES)
    assert {r.detail for r in h200.matmul_rates} == {"mm", "bmm"}
    assert h200.launch_overhead_by_class["conv"] > h200.launch_overhead_us


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


class _Timing:
    median_ms = 0.5


def test_measuring_the_tables_on_a_cpu_with_a_stub_timer():
    plan = sample_plan({"fp32": 2}, max_elems=1 << 14, flop_range=(1e5, 1e6))
    calls = []

    def timer(fn):
        calls.append(fn())
        return _Timing()

    rates, skipped = measure_conv_rates("cpu", plan, timer, budget_s=60.0, dtypes={"fp32": torch.float32})
    layouts = sum(2 if len(p.spatial) in (2, 3) else 1 for p in plan)  # 2-D and 3-D also channels-last
    assert len(rates) == layouts and not skipped and all(r.tflops > 0 for r in rates)
    assert {r.layout for r in rates if r.detail == "conv1d"} == {"nchw"}
    assert {r.layout for r in rates if r.detail == "conv2d"} == {"nchw", "nhwc"}
    assert rates[0].tflops == pytest.approx(rates[0].gflop * 1e9 / 0.5e-3 / 1e12)
    mm = matmul_plan({"fp32": 2}, max_elems=1 << 12, flop_range=(1e3, 1e7))
    mrates, _ = measure_matmul_rates("cpu", mm, timer, budget_s=60.0, dtypes={"fp32": torch.float32})
    assert len(mrates) == len(mm) and {r.detail for r in mrates} == {"mm", "bmm"}
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
    spec = dataclasses.replace(SPEC, launch_overhead_by_class={"conv": 40.0}, view_overhead_us=2.0, module_call_us=4.0)
    fast = spec.at_host_speed(5.0)
    assert (fast.launch_overhead_us, fast.launch_overhead_by_class["conv"], fast.view_overhead_us,
            fast.module_call_us) == (5.0, 20.0, 1.0, 2.0)
    assert spec.at_host_speed(0.0) is spec


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
    from fusion_advisor.devices.op_rates import CPU_CONV_FLOP_RANGE, problem_geometry

    plan = sample_plan({"fp32": 8}, max_elems=4 << 20, flop_range=CPU_CONV_FLOP_RANGE)
    assert {p.detail for p in plan} == set(CONV_CLASSES)
    assert max(problem_geometry(p).flops for p in plan) <= 4 * CPU_CONV_FLOP_RANGE[1]


def test_a_class_with_enough_measurements_is_priced_from_a_fitted_surface():
    from fusion_advisor.devices.op_rates import REGRESSION_MIN_SAMPLES

    # rates that grow with output channels, as tensor-core tiles fill: a surface follows the trend between samples
    rates = [_rate(16, c, 2.0 * c ** 0.5, gflop=10.0) for c in (4, 8, 16, 32, 64, 128, 256, 512)] * 3
    assert len(rates) >= REGRESSION_MIN_SAMPLES
    mid = ConvGeometry("conv2d", 16, 90, 9, 1.0, int(10e9))
    got = interpolated_tflops(rates, mid, "fp32")
    assert 2.0 * 64 ** 0.5 < got < 2.0 * 128 ** 0.5  # between its neighbours 64 and 128
    beyond = ConvGeometry("conv2d", 16, 1 << 14, 9, 1.0, int(10e9))
    assert interpolated_tflops(rates, beyond, "fp32") == pytest.approx(max(r.tflops for r in rates))  # capped
    few = rates[:REGRESSION_MIN_SAMPLES - 1]
    from fusion_advisor.devices.op_rates import FEATURE_WEIGHTS, _nearest_tflops

    assert interpolated_tflops(few, mid, "fp32") == pytest.approx(_nearest_tflops(few, mid.features(), FEATURE_WEIGHTS))
