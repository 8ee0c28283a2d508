"""roofline.eager_in_model_us: the eager time of each chain inside the model, the host running ahead of the GPU."""

import dataclasses

import pytest

from fusion_advisor.devices import load_spec
from fusion_advisor.records import Chain, OpInfo, SourceLoc, TensorMeta
from fusion_advisor.roofline import eager_in_model_us, estimate

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
    assert got["c0"] == pytest.approx(110.0)  # the GPU waited 10 us for the very first launch
    assert got["c1"] == pytest.approx(3.0)  # hidden behind op0: device time only
    alone = estimate(short, {o.id: o for o in ops}, SPEC)
    assert alone.eager_us == pytest.approx(30.0) and alone.bound == "launch"  # priced alone: launch-bound


def test_a_run_of_short_ops_waits_for_every_launch():
    ops = [_op(i, 1.0) for i in range(4)]
    got = eager_in_model_us([_chain("c0", ops)], ops, SPEC)
    assert got["c0"] == pytest.approx(4 * 1.0 + 4 * 10.0 - 3 * 1.0)  # after each 1-us kernel the GPU waits 9 us
