"""Host-cost probes of calibrate: each probe's call is captured as the op class it is keyed by, with the views and
other launches it declares, so the analysis does not charge them twice."""

from __future__ import annotations

import pytest
import torch

from fusion_advisor.analyze.capture import capture
from fusion_advisor.analyze.graph import build_op_graph
from fusion_advisor.analyze.load import LoadedModel
from fusion_advisor.analyze.op_classes import op_class_keys
from fusion_advisor.analyze.roofline import view_host_us
from fusion_advisor.devices import load_spec
from fusion_advisor.devices import host_costs
from fusion_advisor.devices.host_costs import (ALIASES, VIEW_PROBES, conv_activity_probes, host_probes,
                                               measure_activity_host_share, measure_launch_by_class, measure_view_us)


class _Call(torch.nn.Module):
    """The probe's call as a model: a module is captured as it is; a function over the probe's own tensors."""

    def __init__(self, probe):
        super().__init__()
        self.probe = probe

    def forward(self):
        return self.probe()


def _captured_ops(probe):
    model = probe.fn if probe.module else _Call(probe)
    inputs = probe.args if probe.module else ()
    return build_op_graph(capture(LoadedModel("probe", "<test>", "test", model, inputs, "cpu", ""))).ops


@pytest.mark.parametrize("key", sorted(host_probes("cpu")))
def test_each_probe_is_captured_as_its_class_with_the_views_and_launches_it_declares(key):
    probe = host_probes("cpu")[key]
    ops = _captured_ops(probe)
    owners = [o for o in ops if key in op_class_keys(o)]
    assert len(owners) == 1, [o.target for o in ops]
    dispatched_views = [o for o in ops if o.is_view and "getitem" not in o.target]
    others = [o for o in ops if not o.is_view and o is not owners[0]]
    assert len(dispatched_views) == probe.views, [o.target for o in dispatched_views]
    assert len(others) == probe.launches, [o.target for o in others]


def _add_at(monkeypatch, add_us, probe_us):
    """per_op_us faked: ``add_us`` per call of the launch's add probe, ``probe_us(body)`` for anything else."""
    import fusion_advisor.devices.host_costs as hc

    add = lambda: None  # noqa: E731 - a sentinel body
    monkeypatch.setattr(hc, "add_probe", lambda device, numel=1024: add)
    monkeypatch.setattr(hc, "per_op_us", lambda device, body, ops, repeats, warmup=True:
                        add_us if body is add else probe_us(body))


def test_the_priced_apart_parts_are_subtracted_and_aliases_copied(monkeypatch):
    _add_at(monkeypatch, 50.0, lambda body: 100.0)  # every probe twice an add: 100 us at a 50 us launch
    out = measure_launch_by_class("cpu", module_call_us=5.0, view_us=2.0, launch_us=50.0, ops=1, repeats=1)
    assert out["conv"] == 95.0  # a module: its call is charged apart
    assert out["matmul/addmm"] == 93.0  # nn.Linear: the call and the weight's t()
    assert out["normalization/_native_batch_norm_legit_functional"] == 45.0  # and the num_batches_tracked add
    assert out["matmul/mm"] == 100.0 and out["copy/cat"] == 100.0  # torch functions: nothing apart
    for alias, key in ALIASES.items():
        assert out[alias] == out[key]
    huge = measure_launch_by_class("cpu", module_call_us=500.0, ops=1, repeats=1)  # no launch: as measured
    assert huge["conv"] == 10.0  # never below a tenth of the call
    slow = measure_launch_by_class("cpu", launch_us=10.0, ops=1, repeats=1)  # the launch measured on a faster host
    assert slow["matmul/mm"] == 20.0


def test_host_time_at_the_launch_speed_is_the_median_ratio_to_an_add_timed_beside_it(monkeypatch):
    import fusion_advisor.devices.host_costs as hc

    add = lambda: None  # noqa: E731
    body = lambda: None  # noqa: E731
    # rounds: body 20 / add 10, body 30 / add 10, body 80 / add 40 -> ratios 2, 3, 2 -> median 2
    times = iter([20.0, 10.0, 30.0, 10.0, 80.0, 40.0])
    warm = []

    def fake(device, b, ops, repeats, warmup=True):
        warm.append(warmup)
        return next(times)

    monkeypatch.setattr(hc, "add_probe", lambda device, numel=1024: add)
    monkeypatch.setattr(hc, "per_op_us", fake)
    assert hc.host_us_at_launch("cpu", body, 7.0, ops=1, repeats=3) == 14.0
    assert warm == [True, True, False, False, False, False]  # only the first round warms up
    monkeypatch.setattr(hc, "per_op_us", lambda device, b, ops, repeats, warmup=True: 33.0)
    assert hc.host_us_at_launch("cpu", body, 0.0, ops=1, repeats=3) == 33.0  # no launch: as measured


def test_view_probes_are_views_and_the_median_is_reported(monkeypatch):
    x = torch.ones(32, 32)
    for code in VIEW_PROBES:
        y = eval(code, {"x": x})
        assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), code
    import fusion_advisor.devices.host_costs as hc

    times = iter(range(1, len(VIEW_PROBES) + 1))
    monkeypatch.setattr(hc, "per_op_us", lambda device, body, ops, repeats, warmup=True: float(next(times)))
    assert measure_view_us("cpu", ops=1, repeats=1) == (1 + len(VIEW_PROBES)) / 2
    _add_at(monkeypatch, 4.0, lambda body: 6.0)
    assert measure_view_us("cpu", ops=1, repeats=1, launch_us=2.0) == 3.0  # 1.5 adds at a 2 us launch


def test_getitem_of_a_tuple_output_costs_no_host_time():
    spec = load_spec("h200")
    ops = _captured_ops(host_probes("cpu")["other/max_pool2d_with_indices"])
    getitem = [o for o in ops if "getitem" in o.target]
    assert getitem and all(view_host_us(o, spec) == 0.0 for o in getitem)
    t = [o for o in _captured_ops(host_probes("cpu")["matmul/addmm"]) if o.is_view]
    assert [view_host_us(o, spec) for o in t] == [spec.view_overhead_us * spec.host_time_scale * spec.view_host_scale]


def test_module_call_is_half_the_median_difference_of_two_nested_calls(monkeypatch):
    import fusion_advisor.devices.host_costs as hc

    # interleaved: nested, leaf, nested, leaf...; nested - leaf = 9, 3, 5 -> median 5, over two nested calls
    times = iter([19.0, 10.0, 13.0, 10.0, 15.0, 10.0])
    monkeypatch.setattr(hc, "per_op_us", lambda device, body, ops, repeats, warmup=True: next(times))
    assert hc.measure_module_call_us("cpu", ops=1, repeats=3) == 2.5
    # with the launch: nested, leaf, add per round; (19 - 10) / 10 = 0.9, (13 - 10) / 5 = 0.6, (15 - 10) / 10 = 0.5
    times = iter([19.0, 10.0, 10.0, 13.0, 10.0, 5.0, 15.0, 10.0, 10.0])
    assert hc.measure_module_call_us("cpu", ops=1, repeats=3, launch_us=8.0) == pytest.approx(0.6 * 8.0 / 2)
    nested = hc._Calls(hc._Calls(hc._AddOne()))
    assert torch.equal(nested(torch.zeros(2)), torch.ones(2))


def test_the_activity_probes_are_convolutions_and_the_first_is_the_conv_class_probe():
    probes = conv_activity_probes("cpu")
    assert all(o.category == "conv" for p in probes for o in _captured_ops(p) if not o.is_view)
    first, conv = probes[0].fn, host_probes("cpu")["conv"].fn
    assert (type(first), first.in_channels, first.kernel_size) == (type(conv), conv.in_channels, conv.kernel_size)
    assert probes[0].args[0].shape == host_probes("cpu")["conv"].args[0].shape


def test_the_host_cost_per_activity_is_the_slope_over_the_probes_as_a_share_of_the_conv_probe(monkeypatch):
    import fusion_advisor.kernel_tools.bench as bench

    counts = dict(zip(range(7), [2.0, 1.0, 5.0, 2.0, 6.0, 3.0, 2.0]))
    probes = conv_activity_probes("cpu")
    index = {id(p): i for i, p in enumerate(probes)}
    monkeypatch.setattr(host_costs, "conv_activity_probes", lambda device: probes)
    monkeypatch.setattr(bench, "device_kernels_per_call", lambda probe: counts[index[id(probe)]])
    # 8 us per activity over 14 us: 30 us at the probe's 2 activities
    monkeypatch.setattr(host_costs, "per_op_us",
                        lambda device, probe, ops, repeats, warmup=True: 14.0 + 8.0 * counts[index[id(probe)]])
    cost = measure_activity_host_share("cuda")
    assert cost.probe_kernels == 2.0 and cost.share == pytest.approx(8.0 / 30.0)
    assert len(cost.probes) == 7
    monkeypatch.setattr(bench, "device_kernels_per_call", lambda probe: 2.0)
    assert measure_activity_host_share("cuda") is None  # no spread: no slope
    assert measure_activity_host_share("cpu") is None


def test_a_compiled_call_costs_its_ratio_to_the_add_less_one_launch(monkeypatch):
    import fusion_advisor.devices.host_costs as hc

    seen = []

    def at_launch(device, body, launch_us, ops, repeats, numel=1024):
        seen.append(body())  # the compiled chain runs: four multiply-adds of ones
        return 4.0 * launch_us  # a compiled call: four adds of host time

    monkeypatch.setattr(hc, "host_us_at_launch", at_launch)
    cost = hc.measure_compiled_call("cpu", 10.0, backend="eager")
    expected = torch.ones(1024)
    for i in range(4):
        expected = expected * 1.0001 + 0.001 * i
    assert torch.equal(seen[0], expected)
    assert cost.compiled_call_us == 30.0  # its fused kernel's launch is charged apart
    assert cost.graph_replay_us is None and cost.probes == {"compiled": 4.0}  # no CUDA graphs on a CPU
    with pytest.raises(ValueError, match="launch_us must be above 0"):
        hc.measure_compiled_call("cpu", 0.0, backend="eager")


def test_a_compiled_call_is_measured_through_dynamo():
    # dynamo's guards and the compiled frame's call, here with the eager backend (no C++ compile in CI) running
    # the chain's eight aten ops: more than twice an add
    cost = host_costs.measure_compiled_call("cpu", 1.0, ops=50, repeats=3, backend="eager")
    assert cost.probes["compiled"] > 2.0 and cost.compiled_call_us == pytest.approx(cost.probes["compiled"] - 1.0,
                                                                                     abs=0.01)
