"""Measured normalizations, softmaxes and reductions (devices/reduction_rates.py): the table's entries, how an op's
time is read from it, the sampled calls, and the geometry the roofline gives each captured op."""

import dataclasses
import math

import pytest
import torch
import torch.nn as nn

from fusion_advisor.analyze.graph import build_op_graph
from fusion_advisor.analyze.records import OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.roofline import (measured_op_us, memcpy_like, op_overhead_us, reduction_geometry,
                                             roofline_op_us)
from fusion_advisor.analyze.capture import capture
from fusion_advisor.analyze.load import LoadedModel
from fusion_advisor.devices import load_spec, parse_spec, spec_mapping
from fusion_advisor.devices.reduction_rates import (MIN_PATH_ENTRIES, REDUCTION_CLASSES, ReductionRate,
                                                    measure_reduction_rates, reduction_bytes, reduction_call,
                                                    reduction_path, reduction_plan, reduction_time_us)
from fusion_advisor.errors import DeviceSpecError
from fusion_advisor.kernel_tools.bench import Timing

COPY_GBPS, KERNEL_US = 1000.0, 1.0
SPEC = dataclasses.replace(load_spec("cpu"), name="toy", memory_bandwidth_gbps=COPY_GBPS, launch_overhead_us=10.0,
                           kernel_busy_overhead_us=KERNEL_US, op_time_fits={}, op_time_fit_dtypes=())


def _rate(op, dims, time_us, kernels=1.0, dtype="fp32") -> ReductionRate:
    return ReductionRate(op, dtype, tuple(dims), reduction_bytes(op, dims, dtype) / 1e6, time_us, kernels)


def _stream_us(op, dims, dtype="fp32") -> float:
    return reduction_bytes(op, dims, dtype) / (COPY_GBPS * 1e3)


# --- the table ----------------------------------------------------------------------------------------------------


def test_bytes_count_the_input_and_an_output_as_large_for_norms_and_one_value_per_row_for_reductions():
    assert reduction_bytes("batch_norm", (2, 3, 4), "fp32") == 2 * 24 * 4
    assert reduction_bytes("softmax", (2, 3, 4), "bf16") == 2 * 24 * 2
    assert reduction_bytes("reduce", (2, 3, 4), "fp32") == (24 + 8) * 4


def test_an_entry_is_read_back_exactly_where_it_was_measured():
    entry = _rate("softmax", (64, 1000, 1), 40.0, kernels=2.0)
    assert reduction_time_us([entry], "softmax", (64, 1000, 1), "fp32", COPY_GBPS, KERNEL_US) == pytest.approx(40.0)


def test_time_scales_its_streaming_part_with_the_bytes_and_keeps_the_kernels_fixed_part():
    # 2 kernels (2 us fixed) + 38 us streaming; twice the rows: twice the streaming part
    entry = _rate("softmax", (64, 1000, 1), 40.0, kernels=2.0)
    t = reduction_time_us([entry], "softmax", (128, 1000, 1), "fp32", COPY_GBPS, KERNEL_US)
    assert t == pytest.approx(2.0 + 2 * 38.0)


def test_a_dtype_without_entries_takes_fp32s_efficiency_over_its_own_bytes():
    entry = _rate("layer_norm", (512, 1024, 1), 21.0)
    t = reduction_time_us([entry], "layer_norm", (512, 1024, 1), "bf16", COPY_GBPS, KERNEL_US)
    assert t == pytest.approx(1.0 + 20.0 / 2)
    assert reduction_time_us([entry], "softmax", (512, 1024, 1), "fp32", COPY_GBPS, KERNEL_US) is None


def test_nearer_entries_weigh_more():
    near, far = _rate("reduce", (1024, 64, 1), 10.0), _rate("reduce", (1024, 64, 4096), 10_000.0)
    t = reduction_time_us([near, far], "reduce", (1024, 64, 2), "fp32", COPY_GBPS, KERNEL_US)
    # efficiency taken almost all from the near entry: about twice its streaming time
    near_eff = (10.0 - KERNEL_US) / _stream_us("reduce", (1024, 64, 1))
    assert t == pytest.approx(KERNEL_US + near_eff * _stream_us("reduce", (1024, 64, 2)), rel=0.05)


def test_an_op_far_beyond_every_entry_streams_at_copy_bandwidth():
    """Small entries carry their fixed costs in their efficiency (4x their bytes at copy bandwidth here); an op 12
    log2 units beyond them (a 10.7 GB mean over 4 attention heads) is priced at the copy roofline, while one near
    them keeps their efficiency."""
    small = [_rate("reduce", (1, n, 50176), 4.0 * _stream_us("reduce", (1, n, 50176)) + KERNEL_US)
             for n in (2, 5, 8)]
    far = (2, 4, 1 << 28)
    t = reduction_time_us(small, "reduce", far, "fp32", COPY_GBPS, KERNEL_US)
    assert t == pytest.approx(KERNEL_US + _stream_us("reduce", far), rel=0.01)
    near = (1, 4, 50176)
    t = reduction_time_us(small, "reduce", near, "fp32", COPY_GBPS, KERNEL_US)
    assert t == pytest.approx(KERNEL_US + 4.0 * _stream_us("reduce", near), rel=0.01)


def test_layer_norm_reads_only_entries_of_its_kernel_path_where_there_are_enough():
    assert reduction_path("layer_norm", (10, 768, 1)) and not reduction_path("layer_norm", (10, 78, 1))
    assert reduction_path("softmax", (10, 78, 1))
    fast = [_rate("layer_norm", (100 * (i + 1), 256, 1), 5.0) for i in range(MIN_PATH_ENTRIES)]
    slow = [_rate("layer_norm", (100 * (i + 1), 258, 1), 50.0, kernels=2.0) for i in range(MIN_PATH_ENTRIES)]
    t_fast = reduction_time_us(fast + slow, "layer_norm", (400, 256, 1), "fp32", COPY_GBPS, KERNEL_US)
    t_slow = reduction_time_us(fast + slow, "layer_norm", (400, 258, 1), "fp32", COPY_GBPS, KERNEL_US)
    assert t_fast == pytest.approx(reduction_time_us(fast, "layer_norm", (400, 256, 1), "fp32", COPY_GBPS, KERNEL_US))
    assert t_slow > 5 * t_fast
    # too few of its path: the class's entries
    assert reduction_time_us(fast + slow[:1], "layer_norm", (400, 258, 1), "fp32", COPY_GBPS, KERNEL_US) < 2 * t_fast


def test_the_table_round_trips_through_a_spec_file_and_bad_entries_are_named():
    spec = dataclasses.replace(SPEC, reduction_rates=(_rate("group_norm", (64, 8, 49), 3.5, kernels=3.0),
                                                      _rate("reduce", (1, 4096, 1), 2.0)))
    assert parse_spec(spec_mapping(spec), "test").reduction_rates == spec.reduction_rates
    for field, value, match in (("dims", [1, 2], "three positive integers"), ("op", "cumsum", "not one of"),
                                ("dtype", "int8", "not one of"), ("dims", [1, 0, 2], "three positive")):
        data = spec_mapping(spec)
        data["reduction_rates"][1][field] = value
        with pytest.raises(DeviceSpecError, match=rf"reduction_rates\[1\].*{match}"):
            parse_spec(data, "bad.yaml")


def test_the_shipped_h200_spec_has_measured_entries_of_every_class():
    h200 = load_spec("h200")
    assert {r.op for r in h200.reduction_rates} == set(REDUCTION_CLASSES)
    assert all(r.time_us > 0 and r.kernels >= 1 for r in h200.reduction_rates)


# --- the sample ---------------------------------------------------------------------------------------------------


def test_the_plan_is_seeded_sized_and_covers_every_regime():
    per_class = {op: 40 for op in REDUCTION_CLASSES}
    plan = reduction_plan(per_class, 1 << 22, seed=3)
    assert plan == reduction_plan(per_class, 1 << 22, seed=3) and plan != reduction_plan(per_class, 1 << 22, seed=4)
    assert {op: sum(p[0] == op for p in plan) for op in REDUCTION_CLASSES} == per_class
    assert all(1 << 10 <= math.prod(dims) <= 1 << 22 for _, _, dims, _ in plan)
    norms = [p for p in plan if p[0] in ("batch_norm", "group_norm")]
    assert any(dims[2] == 1 for _, _, dims, _ in norms) and any(dims[2] > 1 for _, _, dims, _ in norms)
    assert all(dims[0] % groups == 0 for op, _, dims, groups in plan if op == "group_norm")
    assert any(dims[0] == 1 and dims[2] == 1 for op, _, dims, _ in plan if op == "reduce")  # whole-input sums
    assert any(dims[2] > 1 for op, _, dims, _ in plan if op == "softmax")  # over a middle dim
    assert any(not reduction_path(op, dims) for op, _, dims, _ in plan if op == "layer_norm")


@pytest.mark.parametrize("op,dims,groups", [
    ("batch_norm", (4, 6, 9), 1), ("batch_norm", (32, 6, 1), 1), ("batch_norm_train", (4, 6, 16), 1),
    ("group_norm", (8, 3, 16), 4), ("group_norm", (8, 3, 1), 2), ("layer_norm", (5, 10, 1), 1),
    ("softmax", (3, 7, 5), 1), ("reduce", (3, 7, 5), 1), ("reduce", (1, 300, 1), 1), ("logsumexp", (3, 7, 1), 1)])
def test_each_sampled_call_runs_as_model_code_writes_it_and_its_captured_geometry_is_its_dims(op, dims, groups):
    fn = reduction_call(op, dims, torch.float32, "cpu", groups=groups)
    out = fn()
    assert torch.isfinite(out).all()
    if op in ("batch_norm", "batch_norm_train", "group_norm", "layer_norm", "softmax"):
        assert out.numel() == math.prod(dims)
    else:
        assert out.numel() == dims[0] * dims[2]
    if dims[2] == 1 and op in ("batch_norm", "group_norm"):
        assert out.dim() == 2  # a norm after a Linear layer: a batch x features matrix


def test_measuring_counts_kernels_records_failures_and_keeps_to_its_budget():
    plan = [("softmax", "fp32", (4, 8, 1), 1), ("batch_norm", "fp32", (2, 3, 4), 1), ("nope", "fp32", (1, 1, 1), 1)]

    def timer(fn):
        fn()
        return Timing(median_ms=0.01, warmup_iters=1, benchmark_iters=1, kernels_per_call=2.0)

    def failing(op, *a, **k):
        if op == "nope":
            raise RuntimeError("no such class")
        return reduction_call(op, *a, **k)

    import fusion_advisor.devices.reduction_rates as rr
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rr, "reduction_call", failing)
        rates, skipped = measure_reduction_rates("cpu", plan, timer, 60.0, {"fp32": torch.float32})
    assert [(r.op, r.dims, r.time_us, r.kernels) for r in rates] == [("softmax", (4, 8, 1), 10.0, 2.0),
                                                                       ("batch_norm", (2, 3, 4), 10.0, 2.0)]
    assert rates[0].mbytes == pytest.approx(reduction_bytes("softmax", (4, 8, 1), "fp32") / 1e6)
    assert "1 calls failed" in skipped["reduction_rates failed"] and "nope" in skipped["reduction_rates failed"]
    rates, skipped = measure_reduction_rates("cpu", plan, timer, 0.0, {"fp32": torch.float32})
    assert rates == [] and "3 of 3 calls left out" in skipped["reduction_rates"]


# --- the roofline's geometry of captured ops ----------------------------------------------------------------------


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _ops(model, x):
    return build_op_graph(capture(LoadedModel("m", "<test>", "test", model, (x,), "cpu", ""))).ops


def _priced(model, x):
    """(class, dims) of every op of the captured model a reduction class prices."""
    return [g for g in (reduction_geometry(o) for o in _ops(model, x) if not o.is_view) if g is not None]


def test_captured_norms_take_their_class_and_geometry():
    x = torch.randn(4, 8, 5, 5)
    assert _priced(nn.BatchNorm2d(8).eval(), x) == [("batch_norm", (4, 8, 25))]
    assert _priced(nn.BatchNorm2d(8).train(), x) == [("batch_norm_train", (4, 8, 25))]
    assert _priced(nn.BatchNorm1d(8).eval(), torch.randn(16, 8)) == [("batch_norm", (16, 8, 1))]
    assert _priced(nn.GroupNorm(2, 8), x) == [("group_norm", (8, 4, 25))]
    assert _priced(nn.LayerNorm(5), x) == [("layer_norm", (160, 5, 1))]


def test_captured_softmaxes_and_reductions_see_the_reduced_dim_as_the_middle_one():
    x = torch.randn(2, 3, 4, 5)
    assert _priced(_Fn(lambda t: torch.softmax(t, dim=1)), x) == [("softmax", (2, 3, 20))]
    assert _priced(_Fn(lambda t: torch.softmax(t, dim=-1)), x) == [("softmax", (24, 5, 1))]
    assert _priced(_Fn(lambda t: t.sum(dim=(2, 3))), x) == [("reduce", (6, 20, 1))]
    assert _priced(_Fn(lambda t: t.amax(dim=1)), x) == [("reduce", (2, 3, 20))]
    assert _priced(_Fn(lambda t: t.mean()), x) == [("reduce", (1, 120, 1))]
    assert _priced(_Fn(lambda t: torch.logsumexp(t, dim=2)), x) == [("logsumexp", (6, 4, 5))]
    assert _priced(_Fn(lambda t: t.cumsum(dim=1)), x) == []  # a scan: no class prices it


def test_a_spec_with_a_table_prices_a_captured_norm_from_it_and_one_without_from_its_bytes():
    op = next(o for o in _ops(nn.BatchNorm2d(8).eval(), torch.randn(4, 8, 5, 5)) if not o.is_view)
    assert measured_op_us(op, SPEC) is None
    table = dataclasses.replace(SPEC, reduction_rates=(_rate("batch_norm", (4, 8, 25), 7.0),))
    assert measured_op_us(op, table) == pytest.approx(7.0)
    assert roofline_op_us(op, SPEC) < 7.0


# --- copies -------------------------------------------------------------------------------------------------------


def _copy_op(target, shape=(64, 64)):
    t = TensorMeta(shape=shape, dtype="fp32", numel=math.prod(shape), nbytes=4 * math.prod(shape))
    return OpInfo(id="g0:op0", graph_index=0, target=target, category="copy", inputs=(t,), outputs=(t,), flops=0,
                  bytes_read=t.nbytes, bytes_written=t.nbytes, module_path="", source=SourceLoc("m.py", 1, "x"))


def test_a_clone_is_a_memcpy_with_the_busy_overhead_and_a_cat_runs_a_kernel_of_its_own():
    clone, cat = _copy_op("aten.clone.default"), _copy_op("aten.cat.default")
    assert memcpy_like(clone) and not memcpy_like(cat)
    assert op_overhead_us(clone, SPEC) == pytest.approx(KERNEL_US)
    assert op_overhead_us(cat, SPEC) == pytest.approx(KERNEL_US)
    no_busy = dataclasses.replace(SPEC, kernel_busy_overhead_us=0.0, elementwise_overhead_us=2.0)
    assert op_overhead_us(clone, no_busy) == 0.0 and op_overhead_us(cat, no_busy) == pytest.approx(2.0)


def test_the_first_calls_one_time_costs_do_not_spend_the_budget():
    import time

    plan = [("softmax", "fp32", (4, 8, 1), 1)] * 5
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)  # a fresh process's CUDA context and profiler start
        return Timing(median_ms=0.01, warmup_iters=1, benchmark_iters=1, kernels_per_call=1.0)

    rates, skipped = measure_reduction_rates("cpu", plan, timer, 0.2, {"fp32": torch.float32})
    assert len(rates) == 5 and not skipped


def test_an_argmax_is_priced_at_the_dtype_it_reads():
    """An argmax's int64 output keyed the reduction table, whose fp32 entries then priced a bf16 argmax at twice a
    bf16 amax over the same rows (a reviewer)."""
    from fusion_advisor.analyze.roofline import measured_reduction_us
    from fusion_advisor.devices import load_spec

    class Argmax(nn.Module):
        def forward(self, x):
            return x.argmax(-1)

    class Amax(nn.Module):
        def forward(self, x):
            return x.amax(-1)

    spec = load_spec("h200")
    x = torch.randn(512, 4096, dtype=torch.bfloat16)
    (argmax,) = [o for o in _ops(Argmax(), x) if not o.is_view]
    (amax,) = [o for o in _ops(Amax(), x) if not o.is_view]
    (argmax32,) = [o for o in _ops(Argmax(), x.float()) if not o.is_view]
    assert argmax.dtype == "int64" and argmax.inputs[0].dtype == "bf16"
    assert measured_reduction_us(argmax, spec) == pytest.approx(measured_reduction_us(amax, spec), rel=0.25)
    assert measured_reduction_us(argmax, spec) < measured_reduction_us(argmax32, spec)
