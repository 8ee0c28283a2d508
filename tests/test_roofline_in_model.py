"""roofline.eager_in_model_us: the eager time of each chain inside the model, the host running ahead of the GPU."""

import dataclasses

import pytest

from fusion_advisor.devices import load_spec
from fusion_advisor.analyze.records import Chain, OpInfo, SourceLoc, TensorMeta
from fusion_advisor.analyze.roofline import eager_in_model_us, estimate, in_model_times

SPEC = dataclasses.replace(load_spec("cpu"), name="toy", memory_bandwidth_gbps=1000.0, launch_overhead_us=10.0)


def _op(i: int, device_us: float) -> OpInfo:
    """A memory-bound op moving ``device_us`` us worth of bytes at 1000 GB/s."""
    nbytes = int(device_us * 1e-6 * 1000e9)
    t = TensorMeta(shape=(nbytes // 2,), dtype="fp32", numel=nbytes // 4, nbytes=nbytes // 2)
    return OpInfo(id=f"g0:op{i}", graph_index=0, target="aten.add.Tensor", category="pointwise", inputs=(t,),
                  outputs=(t,), flops=0, bytes_read=nbytes // 2, bytes_written=nbytes // 2, module_path="",
                  source=SourceLoc("m.py", i, "x"))


def _chain(cid: str, ops: list[OpInfo]) -> Chain:
    return Chain(id=cid, kind="fusible", op_ids=tuple(o.id for o in ops), targets=tuple(o.target for o in ops),
                 pattern="pointwise", categories=("pointwise",), dtype="fp32", eager_kernels=len(ops),
                 eager_bytes=sum(o.bytes_read + o.bytes_written for o in ops), fused_bytes=0, flops=0, numel=1,
                 row_elems=0, source=ops[0].source, module_path="")


def test_short_ops_behind_a_long_kernel_wait_for_no_launch():
    # op0: 100 us on the GPU; then three 1-us ops the host issues (10 us apart) while op0 still runs
    ops = [_op(0, 100.0), _op(1, 1.0), _op(2, 1.0), _op(3, 1.0)]
    long, short = _chain("c0", ops[:1]), _chain("c1", ops[1:])
    got = eager_in_model_us([long, short], ops, SPEC)
    assert got["c0"] == pytest.approx(100.0)  # steady state: the previous run's kernels covered the first launch
    assert got["c1"] == pytest.approx(3.0)  # hidden behind op0: device time only
    alone = estimate(short, {o.id: o for o in ops}, SPEC)
    assert alone.eager_us == pytest.approx(30.0) and alone.bound == "launch"  # priced alone: launch-bound


def test_a_run_of_short_ops_waits_for_every_launch():
    ops = [_op(i, 1.0) for i in range(4)]
    got = eager_in_model_us([_chain("c0", ops)], ops, SPEC)
    # after each 1-us kernel the GPU waits 9 us, and so does the first: the run before drained the GPU 9 us before
    # this run's first launch (a host-bound loop; assuming the GPU still busy there priced it 4 + 3 * 9)
    assert got["c0"] == pytest.approx(4 * 1.0 + 4 * 9.0)


def test_a_run_ending_in_a_long_kernel_covers_the_next_runs_first_launch():
    # steady state of a loop over the model: the 100-us kernel that ends a run still runs when the next run's
    # first op is issued, so that op waits for no launch; the short op after the long one in the same run does
    ops = [_op(0, 1.0), _op(1, 100.0), _op(2, 1.0)]
    got = in_model_times([_chain("c0", ops[:1]), _chain("c1", ops[1:2]), _chain("c2", ops[2:])], ops, SPEC)
    assert got["c0"] == pytest.approx((1.0, 0.0))
    assert got["c1"] == pytest.approx((100.0, 0.0)) and got["c2"] == pytest.approx((1.0, 0.0))


def test_each_run_enters_the_model_from_its_top_level_and_leaves_nothing_pending():
    # module calls are counted from the top level at every run's start (a wrapper's `self.net(x)`), and host time a
    # run's trailing views spend is not charged to the next run's first launch (the measured replay counts an op's
    # wait only from its graph's start)
    spec = dataclasses.replace(SPEC, module_call_us=5.0, view_overhead_us=20.0, host_time_scale=1.0)
    ops = [dataclasses.replace(_op(i, 1.0), module_path="net") for i in range(2)]
    view = dataclasses.replace(_op(2, 0.0), target="aten.view.default", category="view", module_path="net")
    got = in_model_times([_chain("c0", ops[:1]), _chain("c1", ops[1:])], ops + [view], spec)
    assert got["c0"] == pytest.approx((1.0, 10.0 + 5.0 - 1.0))  # its launch and the call into `net`, less op1's us
    assert got["c1"] == pytest.approx((1.0, 9.0))


def test_measured_device_times_replace_the_predicted_ones_for_the_ops_they_name():
    """The host model judged alone (benchmarks/accuracy/judge_reports.py --measured-busy): with op0 measured at
    5 us instead of its predicted 100, the short ops behind it wait for their launches again."""
    ops = [_op(0, 100.0), _op(1, 1.0), _op(2, 1.0), _op(3, 1.0)]
    chains = [_chain("c0", ops[:1]), _chain("c1", ops[1:])]
    assert in_model_times(chains, ops, SPEC)["c1"] == pytest.approx((3.0, 0.0))
    busy, idle = in_model_times(chains, ops, SPEC, device_us={"g0:op0": 5.0})["c1"]
    assert busy == pytest.approx(3.0) and idle == pytest.approx(5.0 + 9.0 + 9.0)  # op0 ends 5 us before op1 is issued


def _mm(k: int, n: int, dtype: str = "bf16") -> OpInfo:
    a = TensorMeta(shape=(4096, k), dtype=dtype, numel=4096 * k, nbytes=2 * 4096 * k)
    out = TensorMeta(shape=(4096, n), dtype=dtype, numel=4096 * n, nbytes=2 * 4096 * n)
    return OpInfo(id="g0:mm", graph_index=0, target="aten.mm.default", category="matmul", inputs=(a,), outputs=(out,),
                  flops=2 * 4096 * k * n, bytes_read=a.nbytes, bytes_written=out.nbytes, module_path="",
                  source=SourceLoc("m.py", 1, "x"))


def test_unaligned_matmuls_take_the_measured_unaligned_rate():
    from fusion_advisor.analyze.roofline import op_peak_tflops, unaligned_matmul

    assert not unaligned_matmul(_mm(768, 50256)) and unaligned_matmul(_mm(768, 50257))
    assert unaligned_matmul(_mm(767, 1024))  # K: the first operand's leading dimension
    assert unaligned_matmul(_mm(766, 1024, "fp32")) and not unaligned_matmul(_mm(764, 1024, "fp32"))  # 4 per 16 B
    h200 = load_spec("h200")
    assert op_peak_tflops(_mm(768, 50257), h200) == h200.tensor_tflops["bf16"]  # no measured rate: the peak
    measured = dataclasses.replace(h200, unaligned_tensor_tflops={"bf16": 90.0})
    assert op_peak_tflops(_mm(768, 50257), measured) == 90.0
    assert op_peak_tflops(_mm(768, 50256), measured) == h200.tensor_tflops["bf16"]


def test_unaligned_rate_is_validated(tmp_path):
    from fusion_advisor.errors import DeviceSpecError

    spec = tmp_path / "s.yaml"
    base = "name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\nlaunch_overhead_us: 1\n"
    spec.write_text(base + "unaligned_tensor_tflops: {bf16: 2.5}\n")
    assert load_spec(str(spec)).unaligned_tensor_tflops == {"bf16": 2.5}
    spec.write_text(base + "unaligned_tensor_tflops: {bf16: -1}\n")
    with pytest.raises(DeviceSpecError, match="'unaligned_tensor_tflops.bf16' must be a positive number"):
        load_spec(str(spec))


def test_an_op_launching_several_kernels_waits_for_each_launch():
    ops = [_op(0, 1.0), dataclasses.replace(_op(1, 1.0), eager_kernels=12)]  # SDPA's math backend: a dozen launches
    # the 12 launches wait 120 - 1 us after op0's kernel; op0 waits 10 - 1 after the run before
    assert eager_in_model_us([_chain("c0", ops)], ops, SPEC)["c0"] == pytest.approx(2.0 + 120.0 - 1.0 + 9.0)


def test_elementwise_kernels_pay_the_measured_overhead_memcpy_and_library_ops_do_not():
    from fusion_advisor.analyze.roofline import op_overhead_us, roofline_busy_us

    spec = dataclasses.replace(SPEC, elementwise_overhead_us=4.0)
    add = _op(0, 10.0)
    memcpy = dataclasses.replace(_op(1, 10.0), category="copy", target="aten.clone.default")
    to_fp32 = dataclasses.replace(memcpy, outputs=(dataclasses.replace(memcpy.outputs[0], dtype="bf16"),))
    assert op_overhead_us(add, spec) == 4.0 and op_overhead_us(to_fp32, spec) == 4.0  # a dtype cast is a kernel
    assert op_overhead_us(memcpy, spec) == 0.0 and op_overhead_us(_mm(768, 1024), spec) == 0.0
    assert op_overhead_us(add, SPEC) == 0.0  # not measured: the plain roofline
    ops = [_op(i, 20.0) for i in range(3)]
    chain = dataclasses.replace(_chain("c0", ops), fused_bytes=int(40e-6 * 1000e9))  # 40 us of bytes fused
    assert roofline_busy_us(chain, {o.id: o for o in ops}, spec) == pytest.approx(3 * (20.0 + 4.0))
    est = estimate(chain, {o.id: o for o in ops}, spec)
    assert est.eager_us == pytest.approx(3 * 24.0)  # three kernels pay it three times, the fused one once
    assert est.fused_us == pytest.approx(40.0 + 4.0)


def test_an_eager_kernel_pays_the_profiled_busy_overhead_a_fused_one_the_graph_replays():
    from fusion_advisor.analyze.roofline import op_overhead_us, roofline_busy_us

    # calibrate's graph replay (4 us, the gap to the next kernel in it) and the profiler's kernel duration (1 us)
    spec = dataclasses.replace(SPEC, elementwise_overhead_us=4.0, kernel_busy_overhead_us=1.0)
    ops = [_op(i, 20.0) for i in range(3)]
    chain = dataclasses.replace(_chain("c0", ops), fused_bytes=int(40e-6 * 1000e9))
    assert op_overhead_us(ops[0], spec) == 1.0
    assert roofline_busy_us(chain, {o.id: o for o in ops}, spec) == pytest.approx(3 * 21.0)
    est = estimate(chain, {o.id: o for o in ops}, spec)
    assert est.eager_us == pytest.approx(3 * 21.0) and est.fused_us == pytest.approx(40.0 + 4.0)
    # a DMA memcpy: the profiled duration only (the H200 timed 0.1-0.5 MB ones at 1.0-1.2 us), never the replay's
    memcpy = dataclasses.replace(ops[0], category="copy", target="aten.clone.default")
    assert op_overhead_us(memcpy, spec) == 1.0 and op_overhead_us(_mm(768, 1024), spec) == 0.0
    assert op_overhead_us(memcpy, dataclasses.replace(spec, kernel_busy_overhead_us=0.0)) == 0.0


def test_elementwise_overhead_is_validated(tmp_path):
    from fusion_advisor.errors import DeviceSpecError

    spec = tmp_path / "s.yaml"
    base = "name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\nlaunch_overhead_us: 1\n"
    spec.write_text(base + "elementwise_overhead_us: 3.5\n")
    assert load_spec(str(spec)).elementwise_overhead_us == 3.5
    spec.write_text(base + "elementwise_overhead_us: -1\n")
    with pytest.raises(DeviceSpecError, match="non-negative"):
        load_spec(str(spec))
    spec.write_text(base + "kernel_busy_overhead_us: 0.99\n")
    assert load_spec(str(spec)).kernel_busy_overhead_us == 0.99
    spec.write_text(base + "kernel_busy_overhead_us: -0.5\n")
    with pytest.raises(DeviceSpecError, match="kernel_busy_overhead_us"):
        load_spec(str(spec))


def test_an_op_on_empty_tensors_pays_no_kernel_overhead():
    from fusion_advisor.analyze.roofline import op_overhead_us, roofline_busy_us

    spec = dataclasses.replace(SPEC, elementwise_overhead_us=4.0)
    empty = TensorMeta(shape=(0, 8), dtype="fp32", numel=0, nbytes=0)
    op = dataclasses.replace(_op(0, 0.0), inputs=(empty,), outputs=(empty,), bytes_read=0, bytes_written=0)
    chain = _chain("c0", [op])
    assert op_overhead_us(op, spec) == 0.0  # launches no kernel
    assert roofline_busy_us(chain, {op.id: op}, spec) == 0.0 and eager_in_model_us([chain], [op], spec)["c0"] == 0.0


def test_a_recurrent_layer_takes_the_longer_of_its_steps_issue_and_device_time():
    from fusion_advisor.analyze.roofline import RECURRENT_STEP_LAUNCHES, in_model_times

    spec = dataclasses.replace(SPEC, recurrent_step_us={"lstm": 5.0}, op_time_fits={}, op_time_fit_dtypes=())
    rnn = dataclasses.replace(_op(0, 1.0), id="g0:rnn", target="fusion_advisor_capture.recurrent.default",
                              category="recurrent", variant="lstm", sequential_steps=100, flops=1)
    chain = _chain("c0", [rnn])
    busy, idle = in_model_times([chain], [rnn], spec)["c0"]
    issue = 100 * RECURRENT_STEP_LAUNCHES * 10.0  # the host issues each step's kernels: 1500 us
    assert busy == pytest.approx(500.0)  # 100 steps of 5 us
    assert busy + idle == pytest.approx(issue)  # host-bound: the steps are issued no faster
    fast_host = dataclasses.replace(spec, launch_overhead_us=1.0)
    busy, idle = in_model_times([chain], [rnn], fast_host)["c0"]
    assert (busy, idle) == (pytest.approx(500.0), pytest.approx(0.0))  # the GPU's steps take longer than issuing


def test_a_cuda_graph_replays_a_recurrent_layer_at_its_device_time():
    """apply's whole-model torch.cuda.graph captures cuDNN's host-issued steps (3.4-8.8x eager on KernelBench's
    LSTM/GRU files); torch.compile's reduce-overhead does not reach them, which the whole-model route prediction
    prices apart (tests/test_capture.py)."""
    spec = dataclasses.replace(SPEC, recurrent_step_us={"lstm": 5.0}, op_time_fits={}, op_time_fit_dtypes=())
    rnn = dataclasses.replace(_op(0, 1.0), id="g0:rnn", target="fusion_advisor_capture.recurrent.default",
                              category="recurrent", variant="lstm", sequential_steps=100, flops=1)
    chain = dataclasses.replace(_chain("c0", [rnn]), kind="heavy", pattern="recurrent", categories=("recurrent",))
    est = estimate(chain, {rnn.id: rnn}, spec)
    assert est.eager_us == pytest.approx(1500.0)  # host-bound: 100 steps of 1.5 launches of 10 us
    assert est.cudagraphs_us == pytest.approx(500.0)  # replayed: the 100 steps of 5 us on the device alone


@pytest.mark.parametrize("row, last, passes", [(512, True, 1), (1024, True, 1), (8192, True, 3), (16, False, 3)])
def test_eager_softmax_reads_its_input_once_only_in_the_persistent_kernel(row, last, passes):
    from fusion_advisor.analyze.roofline import op_bytes

    t = TensorMeta(shape=(64, row), dtype="fp32", numel=64 * row, nbytes=4 * 64 * row)
    op = OpInfo(id="g0:sm", graph_index=0, target="aten._softmax.default", category="softmax", inputs=(t,),
                outputs=(t,), flops=0, bytes_read=t.nbytes, bytes_written=t.nbytes, module_path="",
                source=SourceLoc("m.py", 1, "x"), reduction_elems=row, reduces_last_dim=last)
    assert op_bytes(op) == passes * t.nbytes + t.nbytes  # the input read `passes` times, the output written once


def _pool(window: int, target: str = "aten.max_pool2d_with_indices.default") -> OpInfo:
    x = TensorMeta(shape=(8, 64, 128, 128), dtype="fp32", numel=8 * 64 * 128 * 128, nbytes=4 * 8 * 64 * 128 * 128)
    y = TensorMeta(shape=(8, 64, 64, 64), dtype="fp32", numel=8 * 64 * 64 * 64, nbytes=4 * 8 * 64 * 64 * 64)
    return OpInfo(id="g0:pool", graph_index=0, target=target, category="other", inputs=(x,), outputs=(y,), flops=0,
                  bytes_read=x.nbytes, bytes_written=y.nbytes, module_path="", source=SourceLoc("m.py", 1, "x"),
                  window_elems=window)


def test_a_pooling_op_pays_its_window_reads_at_the_measured_rate():
    from fusion_advisor.analyze.roofline import pool_window_us, roofline_op_us

    op = _pool(9)
    assert pool_window_us(op, SPEC) == 0.0  # rate not measured: the bytes alone, as before
    spec = dataclasses.replace(SPEC, pool_window_gelem_s=500.0)
    want = 8 * 64 * 64 * 64 * 9 / 500e9 * 1e6
    assert pool_window_us(op, spec) == pytest.approx(want)
    assert roofline_op_us(op, spec) == pytest.approx(roofline_op_us(op, SPEC) + want)
    assert pool_window_us(_pool(0), spec) == 0.0  # no window known (an old report, an adaptive pool)


def test_a_window_priced_pool_takes_no_profile_fit():
    from fusion_advisor.analyze.roofline import _op_time_us, roofline_op_us
    from fusion_advisor.devices import OpTimeFit

    fit = {"other/max_pool2d_with_indices": OpTimeFit(scale=2.0, exponent=1.0, samples=5)}
    spec = dataclasses.replace(SPEC, op_time_fits=fit, op_time_fit_dtypes=())
    assert _op_time_us(_pool(0), spec) == pytest.approx(2.0 * roofline_op_us(_pool(0), spec))  # the fit applies
    priced = dataclasses.replace(spec, pool_window_gelem_s=500.0)
    assert _op_time_us(_pool(9), priced) == pytest.approx(roofline_op_us(_pool(9), priced))  # the window rate only


def _model_with_one_mul(n: int, at: int) -> list[OpInfo]:
    """``n`` 1-us adds with a 1-us mul in place of the ``at``-th."""
    ops = [_op(i, 1.0) for i in range(n)]
    ops[at] = dataclasses.replace(ops[at], target="aten.mul.Tensor")
    return ops


def test_an_aten_op_the_model_has_not_run_for_many_launches_is_cold():
    from fusion_advisor.analyze.roofline import COLD_REUSE_LAUNCHES, cold_ops

    n = COLD_REUSE_LAUNCHES + 6
    assert cold_ops(_model_with_one_mul(n, 10)) == {"g0:op10"}  # once per run: n launches since its last call
    twice = _model_with_one_mul(n, 10)
    twice[45] = dataclasses.replace(twice[45], target="aten.mul.Tensor")
    assert cold_ops(twice) == set()  # 35 launches apart, and 35 from the run before's second to this run's first
    short = _model_with_one_mul(COLD_REUSE_LAUNCHES, 3)
    assert cold_ops(short) == set()  # a model of 64 launches runs every aten op within 64 of its last call
    view = dataclasses.replace(_op(99, 1.0), target="aten.view.default", category="view")
    assert view.outputs[0].numel > 0
    assert cold_ops(_model_with_one_mul(n, 10) + [view] * 10) == {"g0:op10"}  # views launch nothing: not counted
    assert cold_ops(_model_with_one_mul(n, 10), repeated_graphs={0}) == set()  # a graph run again in each call


def test_a_cold_op_costs_the_cold_host_scale_times_its_host_time():
    # a host-bound loop: every 1-us kernel waits 9 us for its 10-us launch; the cold mul's launch costs 3x
    n = 70
    ops = _model_with_one_mul(n, 10)
    chains = [_chain(f"c{i}", [o]) for i, o in enumerate(ops)]
    warm = in_model_times(chains, ops, SPEC)
    assert warm["c10"] == pytest.approx((1.0, 9.0))
    cold = in_model_times(chains, ops, dataclasses.replace(SPEC, cold_host_scale=3.0))
    assert cold["c10"] == pytest.approx((1.0, 29.0)) and cold["c11"] == pytest.approx((1.0, 9.0))


def test_the_cold_scale_takes_the_views_before_the_op_not_the_module_calls():
    # what fit_cold_host_scale measures: the op's host time with the views issued before it, no module call (the
    # stamped graphs make none)
    spec = dataclasses.replace(SPEC, view_overhead_us=2.0, module_call_us=5.0, host_time_scale=1.0,
                               cold_host_scale=3.0)
    ops = _model_with_one_mul(70, 10)
    view = dataclasses.replace(_op(99, 1.0), id="g0:view", target="aten.view.default", category="view")
    ops[10] = dataclasses.replace(ops[10], module_path="head")  # entered from the top level: one module call
    ops.insert(10, view)
    got = in_model_times([_chain("c", [ops[11]])], ops, spec)["c"]
    assert got == pytest.approx((1.0, 3.0 * (10.0 + 2.0) + 5.0 - 1.0))
