"""Roofline estimates of chain times on a device spec, and the bound class of each chain.

Model (Williams, Waterman & Patterson, "Roofline", CACM 2009, plus a per-kernel launch term):

- one kernel moving ``B`` bytes and doing ``F`` FLOPs keeps the GPU busy ``t = max(F / peak, B / bandwidth)``;
- the host issues one kernel per ``launch`` microseconds (eager dispatch plus launch), overlapping with the GPU,
  so a kernel costs ``max(t, launch)``: short kernels leave the GPU idle while the next one is issued;
- eager time of a chain: that, summed over its ops (each op is one kernel; views launch none);
- fused time: the chain as one kernel, moving only its fused bytes: ``max(t_fused, launch)``;
- arithmetic intensity = FLOPs / fused bytes; ridge point = peak / bandwidth.

Bound class: **launch-bound** when, run eagerly, the GPU would sit idle waiting for launches longer than it
computes (``sum(max(0, launch - t_op)) > sum(t_op)``); otherwise **compute-bound** when the arithmetic intensity
is above the ridge point, else **memory-bound**.
Matmuls, convolutions and attention use the tensor-core peak of their dtype (attention: the spec's measured fused
attention rate when it has one, see ``DeviceSpec.attention_tflops``); everything else the vector peak.
"""

from __future__ import annotations

from fusion_advisor.devices import DeviceSpec
from fusion_advisor.records import Chain, Estimate, OpInfo

_TENSOR_CORE_CATEGORIES = frozenset({"matmul", "conv", "attention"})


def _compute_dtype(dtype: str, categories: set[str] | frozenset[str]) -> str:
    """The dtype whose peak applies: fp32 convolutions run on TF32 tensor cores (cuDNN's default in PyTorch)."""
    return "tf32" if dtype == "fp32" and "conv" in categories else dtype


def _op_time_us(op: OpInfo, spec: DeviceSpec) -> float:
    tensor = op.category in _TENSOR_CORE_CATEGORIES
    peak = spec.peak_tflops(_compute_dtype(op.dtype, {op.category}), tensor, op.category) * 1e12
    compute = op.flops / peak
    memory = (op.bytes_read + op.bytes_written) / (spec.memory_bandwidth_gbps * 1e9)
    return max(compute, memory) * 1e6


def _launches(op: OpInfo) -> bool:
    """Whether ``op`` launches a kernel when run eagerly: not when every output is empty (0 elements)."""
    return not op.outputs or any(o.numel > 0 for o in op.outputs)


def estimate(chain: Chain, ops: dict[str, OpInfo], spec: DeviceSpec) -> Estimate:
    """Roofline :class:`Estimate` of ``chain`` on ``spec``; ``ops`` maps op ids to :class:`OpInfo`. Times in us."""
    tensor = bool(set(chain.categories) & _TENSOR_CORE_CATEGORIES)
    compute_dtype = _compute_dtype(chain.dtype, set(chain.categories))
    category = "attention" if "attention" in chain.categories else ""
    peak_tflops = spec.peak_tflops(compute_dtype, tensor, category)
    bw = spec.memory_bandwidth_gbps * 1e9
    compute_us = chain.flops / (peak_tflops * 1e12) * 1e6
    memory_eager_us = chain.eager_bytes / bw * 1e6
    memory_fused_us = chain.fused_bytes / bw * 1e6
    launch_eager_us = chain.eager_kernels * spec.launch_overhead_us
    launch = spec.launch_overhead_us
    # an op on empty tensors launches no kernel (PyTorch returns before launching one)
    busy = [(_op_time_us(ops[i], spec), _launches(ops[i])) for i in chain.op_ids]
    eager_us = sum(max(t, launch) if runs else 0.0 for t, runs in busy)
    idle_us = sum(max(0.0, launch - t) if runs else 0.0 for t, runs in busy)
    fusible = chain.kind == "fusible" and chain.eager_kernels > 1
    any_work = any(runs for _, runs in busy)
    fused_us = (max(compute_us, memory_fused_us, launch) if any_work else 0.0) if fusible else eager_us
    ridge = spec.ridge_point(compute_dtype, tensor, category)
    if idle_us > sum(t for t, _ in busy):
        bound = "launch"
    elif chain.arithmetic_intensity > ridge:
        bound = "compute"
    else:
        bound = "memory"
    return Estimate(
        compute_us=compute_us,
        memory_eager_us=memory_eager_us,
        memory_fused_us=memory_fused_us,
        launch_eager_us=launch_eager_us,
        eager_us=eager_us,
        fused_us=fused_us,
        saving_us=max(eager_us - fused_us, 0.0),
        ridge_point=ridge,
        bound=bound,
        peak_tflops=peak_tflops,
    )


def roofline_busy_us(chain: Chain, ops: dict[str, OpInfo], spec: DeviceSpec) -> float:
    """Pure roofline device time of ``chain`` run op by op, no launch term: per op ``max(FLOPs / peak, bytes /
    bandwidth)`` summed (us). The floor a measured eager run of the chain can approach."""
    return sum(_op_time_us(ops[i], spec) for i in chain.op_ids)


def estimate_all(chains: list[Chain], ops: list[OpInfo], spec: DeviceSpec) -> dict[str, Estimate]:
    """:func:`estimate` for every chain, keyed by chain id."""
    by_id = {o.id: o for o in ops}
    return {c.id: estimate(c, by_id, spec) for c in chains}


def eager_in_model_us(chains: list[Chain], ops: list[OpInfo], spec: DeviceSpec) -> dict[str, float]:
    """Roofline eager time of every chain as it runs inside the whole model, keyed by chain id (us).

    :func:`estimate` prices a chain alone: each op ``max(t, launch)``. Inside a model the host may run ahead of the
    GPU: while a long GEMM runs, the host issues the next ops, so short kernels after it wait for no launch. This
    replays the model's ops in execution order (``ops`` order) on two clocks, as
    :func:`fusion_advisor.profile.replay_idle` replays measured kernels: the host issues one op per
    ``spec.launch_overhead_us`` (ops on empty tensors launch nothing and cost no host time here); an op's kernel
    starts when it is issued or when the GPU finished the previous kernel, whichever is later; the GPU's wait for
    an op (capped by the host time issuing it) is that op's idle time. A chain's time is its ops' roofline device
    time (:func:`roofline_busy_us`) plus their idle times. This is what ``analyze --profile`` compares with the
    measured chain time; routing keeps :func:`estimate`'s per-chain numbers.
    """
    launch = spec.launch_overhead_us
    idle: dict[str, float] = {}
    host = gpu_free = 0.0  # the GPU starts idle, waiting for the first launch
    for op in ops:
        if op.is_view or not _launches(op):
            continue
        host += launch
        if host > gpu_free:
            idle[op.id] = min(host - gpu_free, launch)
        gpu_free = max(host, gpu_free) + _op_time_us(op, spec)
    by_id = {o.id: o for o in ops}
    return {c.id: roofline_busy_us(c, by_id, spec) + sum(idle.get(i, 0.0) for i in c.op_ids) for c in chains}
