"""Roofline estimates of chain times on a device spec, and the bound class of each chain.

Model (Williams, Waterman & Patterson, "Roofline", CACM 2009, plus a per-kernel launch term):

- one kernel moving ``B`` bytes and doing ``F`` FLOPs keeps the GPU busy ``t = max(F / peak, B / bandwidth)``;
- the host issues one kernel per ``launch`` microseconds (eager dispatch plus launch), overlapping with the GPU,
  so a kernel costs ``max(t, launch)``: short kernels leave the GPU idle while the next one is issued;
- eager time of a chain: that, summed over its ops (each op ``OpInfo.eager_kernels`` kernels, one but for the
  composites aten runs as several: logsumexp's nine; views launch none);
- fused time: the chain as one kernel, moving only its fused bytes: ``max(t_fused, launch)``;
- arithmetic intensity = FLOPs / fused bytes; ridge point = peak / bandwidth.

Bound class: **launch-bound** when, run eagerly, the GPU would sit idle waiting for launches longer than it
computes (``sum(max(0, launch - t_op)) > sum(t_op)``); otherwise **compute-bound** when the arithmetic intensity
is above the ridge point, else **memory-bound**.
Matmuls, convolutions and attention use the tensor-core peak of their dtype; everything else the vector peak.

Attention ops are costed for the SDPA backend torch runs (``OpInfo.variant``, :mod:`fusion_advisor.analyze.sdpa`): the rate
is :meth:`DeviceSpec.attention_peak_tflops` (measured per backend, dtype, sequence length and head dim when the spec
has ``attention_rates``, else its flat ``attention_tflops``, else the matmul peak). An op launching
``OpInfo.eager_kernels`` kernels costs at least ``kernels * launch`` (the math backend: a dozen; any backend given
a boolean mask: 4 more); the math backend also moves its score matrix through memory several times
(:func:`fusion_advisor.analyze.sdpa.math_score_bytes`, added to its memory term).

Eager elementwise and reduction kernels cost a fixed device time on top of their bytes (ramp-up and tail of a
bandwidth-bound kernel; not for plain memcpy copies nor library ops): a chain of nine such kernels pays it nine
times, a fused kernel once. An eager op pays it as a profile measures its kernel (``kernel_busy_overhead_us``,
calibrate's profiled tiny adds, else ``elementwise_overhead_us``); a fused kernel as timed back to back
(``elementwise_overhead_us``: the gap to the next kernel included).

Matmuls with a leading dimension that is not a multiple of 16 bytes (:func:`unaligned_matmul`) use the spec's
measured ``unaligned_tensor_tflops`` when it has one.

Non-matmul ops that read an input in a permuted layout (``OpInfo.reads_permuted``: ``x.transpose(1, 2)`` feeding a
pointwise op or a ``.contiguous()`` copy) run far below copy bandwidth in eager TensorIterator kernels; when the
spec has a measured ``strided_bandwidth_gbps`` it is their memory ceiling (their own bytes only). Without it, the
old behaviour (copy bandwidth).

Where the spec has **fitted op-class curves** (``op_time_fits``, fitted from ``analyze --profile`` runs by
``fusion-advisor calibrate --from-profile``, :mod:`fusion_advisor.devices.fit_profiles`), an op's eager device time is its
class's curve applied to the roofline time above (:func:`op_class_keys`: the most specific class the spec has);
:func:`roofline_op_us` and :func:`roofline_busy_us` stay the plain roofline (the floor a measured run approaches).
Fused times are not fitted: they price code that has not run yet.

Where the spec has **measured convolution or matmul rates** (``conv_rates`` / ``matmul_rates``, measured by
``calibrate`` over a seeded sample of shapes, :mod:`fusion_advisor.devices.op_rates`), a convolution's eager time
is the roofline fitted through the measured ones of its class and dtype (locally corrected where that helps),
plus its bias pass (:func:`measured_conv_us`), and a matmul's the same surface through its class's measured
matmuls (:func:`measured_matmul_us`), instead of the tensor-core roofline; a fitted curve then corrects that
(:func:`base_op_us`).

Host time per kernel is the spec's ``launch_overhead_us``, or its measured ``launch_overhead_by_class`` entry for the
op's class (:func:`op_launch_us`). Inside a model (:func:`in_model_times`) the host also spends the spec's measured
``view_overhead_us`` per view op (times the fitted ``view_host_scale``: :func:`view_host_us`)
and ``module_call_us`` per ``nn.Module`` call entered, before the next launch, and an op whose aten op has not run
for more than :data:`COLD_REUSE_LAUNCHES` launches (:func:`cold_ops`: a classifier head's ``mean`` and ``addmm``, once
per run) costs the spec's ``cold_host_scale`` times its price; the bound class a chain gets from
:func:`estimate_all` is the one it has there.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Collection

from fusion_advisor.devices import DeviceSpec
from fusion_advisor.devices.op_rates import (ConvGeometry, conv_kernels, conv_time_us, fastest_tflops,
                                             matmul_time_us, matvec_time_us)
from fusion_advisor.devices.reduction_rates import REDUCE_OPS, reduction_time_us
from fusion_advisor.dtypes import float_itemsize
from fusion_advisor.analyze.composites import composite_host_launches, encoder_layer_parts
from fusion_advisor.analyze.matmul_shapes import matmul_problem
from fusion_advisor.analyze.op_classes import has_bias, launches, op_class_keys, short_target
from fusion_advisor.analyze.records import Chain, Estimate, OpInfo
from fusion_advisor.analyze.sdpa import math_score_bytes

_TENSOR_CORE_CATEGORIES = frozenset({"matmul", "conv", "attention", "recurrent"})
#: Library ops whose memory ceiling is not the elementwise one (their kernels tile permuted operands themselves).
_LIBRARY_CATEGORIES = frozenset({"matmul", "conv", "attention", "embedding", "recurrent"})


def attention_geometry(op: OpInfo) -> tuple[int, int, bool]:
    """``(sequence length, head dim, causal)`` of an attention op from its q/k shapes and FLOPs: the key length,
    q's last dim, and causal when the op's FLOPs are half the full ``2 * rows * Lk * (E + Ev)`` (how
    :mod:`fusion_advisor.analyze.graph` counts a causal op). ``(0, 0, False)`` without q/k/v inputs."""
    if len(op.inputs) < 3 or len(op.inputs[0].shape) < 2 or len(op.inputs[1].shape) < 2:
        return 0, 0, False
    q, k, v = op.inputs[:3]
    rows = q.numel // max(q.shape[-1], 1)
    full = 2 * rows * k.shape[-2] * (q.shape[-1] + (v.shape[-1] if v.shape else q.shape[-1]))
    return int(k.shape[-2]), int(q.shape[-1]), bool(full) and op.flops * 2 == full


def op_peak_tflops(op: OpInfo, spec: DeviceSpec) -> float:
    """Compute ceiling (TFLOP/s) of one op: attention at its backend's rate, matmul/conv at the tensor-core peak,
    the rest at the vector peak."""
    if op.category == "attention":
        seq, head_dim, causal = attention_geometry(op)
        return spec.attention_peak_tflops(op.variant, op.dtype, seq, head_dim, causal, masked=len(op.inputs) > 3)[0]
    tensor = op.category in _TENSOR_CORE_CATEGORIES
    if op.category == "matmul" and op.dtype in spec.unaligned_tensor_tflops and unaligned_matmul(op):
        return float(spec.unaligned_tensor_tflops[op.dtype])
    return spec.peak_tflops(_compute_dtype(op.dtype, {op.category}), tensor)


def unaligned_matmul(op: OpInfo) -> bool:
    """Whether a matmul's reduction dim (K, the first operand's last dim) or output columns (N) is not a multiple of
    16 bytes: cuBLAS needs 16-byte aligned leading dimensions for its vectorised tensor-core kernels and otherwise
    runs ``align1`` kernels (NVIDIA, cuBLAS docs, "Tensor Core Usage": leading dimensions multiple of 16 bytes)."""
    if not op.inputs or not op.outputs or not op.inputs[0].shape or not op.outputs[0].shape:
        return False
    per_16_bytes = 16 // float_itemsize(op.dtype)
    return op.inputs[0].shape[-1] % per_16_bytes != 0 or op.outputs[0].shape[-1] % per_16_bytes != 0


#: aten scans: PyTorch runs them eagerly in its own scan kernels (priced at the spec's ``scan_bandwidth_gbps``),
#: Inductor in a Triton scan it generates.
SCAN_OPS = frozenset(("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"))


def is_scan(op: OpInfo) -> bool:
    """Whether ``op`` is an aten scan (:data:`SCAN_OPS`)."""
    return short_target(op.target) in SCAN_OPS


#: The eager memory-rate kinds an op may read its inputs as, in the order :func:`op_bandwidth_gbps` prefers them,
#: each with its test: a scan (:func:`is_scan`), a non-library op reading a permuted input, a pointwise op
#: broadcasting an input (:attr:`OpInfo.reads_broadcast`).
_MEMORY_READ_KINDS: dict[str, Callable[[OpInfo], bool]] = {
    "scan": is_scan,
    "permuted": lambda op: op.category not in _LIBRARY_CATEGORIES and op.reads_permuted,
    "broadcast": lambda op: op.category == "pointwise" and op.reads_broadcast,
}


def memory_read_kinds(op: OpInfo) -> tuple[str, ...]:
    """The eager memory-rate kinds (:data:`_MEMORY_READ_KINDS`) that apply to ``op``, preferred first; empty for an
    op that reads its inputs contiguously."""
    return tuple(kind for kind, applies in _MEMORY_READ_KINDS.items() if applies(op))


def op_bandwidth_gbps(op: OpInfo, spec: DeviceSpec) -> float:
    """Memory ceiling (GB/s) of one op run eagerly: the spec's rate of the first of its
    :func:`memory_read_kinds` the spec measured (``scan_bandwidth_gbps``, ``strided_bandwidth_gbps``,
    ``broadcast_bandwidth_gbps``), else the copy bandwidth. On the H200 the eager pointwise ops and copies inside
    113 profiled KernelBench files ran at a median 4,250 GB/s, those broadcasting an input at 2,570 and those
    reading a permuted view at 2,450 (benchmarks/results/h200/accuracy/memory_rates/). Never above the copy
    bandwidth: these are slower paths than a contiguous copy, and a rate measured above it was measured in cache
    (a CPU calibrate's 1 MiB broadcast add, 154 GB/s against a copy of 58)."""
    for kind, gbps in (("scan", spec.scan_bandwidth_gbps), ("permuted", spec.strided_bandwidth_gbps),
                       ("broadcast", spec.broadcast_bandwidth_gbps)):
        if gbps > 0 and _MEMORY_READ_KINDS[kind](op):
            return min(gbps, spec.memory_bandwidth_gbps)
    return spec.memory_bandwidth_gbps


#: Longest row (elements) PyTorch's eager softmax / log-softmax runs in its persistent warp-per-row kernel
#: (``dispatch_softmax_forward``: ``dim_size <= 1024`` and at most 4096 bytes), which reads its input once.
#: Longer rows and softmax over a dim other than the last run block-per-row (``cunn_SoftMaxForward``) or spatial
#: kernels that pass over the input three times: for the max, for the sum of exponentials, and to write the output.
#: Measured on the H200 (analyze --profile, 2026-12-01/02): rows of 8192 and 393216 fp32 at 2.16x and 2.04x the
#: one-read roofline, rows of 512 at 1.09x, softmax over channels (rows of 16-24) at 2.4x and 4.7x.
SOFTMAX_PERSISTENT_ROW = 1024


def op_bytes(op: OpInfo) -> int:
    """Bytes one op moves run eagerly: its reads and writes, plus the math SDPA backend's score-matrix traffic,
    plus two more reads of the input for a softmax PyTorch does not run in one pass
    (:data:`SOFTMAX_PERSISTENT_ROW`)."""
    extra = 0
    if op.category == "attention" and op.variant == "math" and len(op.inputs) >= 2:
        extra = math_score_bytes(op.inputs[0].shape, op.inputs[1].shape, float_itemsize(op.dtype),
                                 mask=len(op.inputs) > 3)
    elif op.category == "softmax" and op.inputs and (not op.reduces_last_dim
                                                      or op.reduction_elems > SOFTMAX_PERSISTENT_ROW):
        extra = 2 * op.inputs[0].nbytes
    return op.bytes_read + op.bytes_written + extra


def _compute_dtype(dtype: str, categories: set[str] | frozenset[str]) -> str:
    """The dtype whose peak applies: fp32 convolutions and recurrent layers run on TF32 tensor cores (cuDNN's
    default in PyTorch)."""
    return "tf32" if dtype == "fp32" and ("conv" in categories or "recurrent" in categories) else dtype


#: Copies PyTorch runs as one device-to-device memcpy when the input is contiguous and of the output's dtype.
#: ``cat``, ``constant_pad_nd``, ``repeat``, ``fill`` and the other copy-category ops run kernels of their own.
MEMCPY_OPS = frozenset(("clone", "copy", "_to_copy", "contiguous", "lift_fresh_copy", "_unsafe_view_copy"))


def memcpy_like(op: OpInfo) -> bool:
    """A copy that runs as a DMA memcpy (:data:`MEMCPY_OPS`, same dtype, no permuted input): no elementwise
    kernel's ramp and tail."""
    return (op.category == "copy" and short_target(op.target) in MEMCPY_OPS and not op.reads_permuted
            and all(i.dtype == op.dtype for i in op.inputs))


def has_kernel_overhead(op: OpInfo) -> bool:
    """Whether an eager kernel of ``op`` pays the fixed elementwise ramp-up and tail: not a library op (cuBLAS,
    cuDNN...), not a plain memcpy, not an op on empty tensors (it launches no kernel)."""
    return not (op.category in _LIBRARY_CATEGORIES or memcpy_like(op) or not launches(op))


def op_overhead_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Fixed device time of one eager kernel of ``op`` beyond its bytes, as a profile measures its busy time
    (us): the spec's ``kernel_busy_overhead_us`` where measured, else its ``elementwise_overhead_us``, for ops
    :func:`has_kernel_overhead`; a memcpy (:func:`memcpy_like`) the former only (the profiler timed the H200's
    device-to-device memcpys of 0.1-0.5 MB at 1.0-1.2 us, its tiny adds at 0.86); else 0."""
    if memcpy_like(op) and launches(op):
        return spec.kernel_busy_overhead_us
    if not has_kernel_overhead(op):
        return 0.0
    return spec.kernel_busy_overhead_us or spec.elementwise_overhead_us


def pool_window_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Time a pooling op spends reading its windows (us): outputs x :attr:`OpInfo.window_elems` input elements at
    the spec's measured :attr:`DeviceSpec.pool_window_gelem_s`; 0 for other ops or when the rate is not measured.

    Eager pooling kernels run one thread per output looping over its window: the loads, not the bytes, bound them.
    Measured on the H200 (the 26 pooling ops of the re-profiled KernelBench sets, max and avg, 1-3d, kernel 2-27
    elements, stride 1-4; benchmarks/results/h200/accuracy/reprofile/README.md): bytes at copy bandwidth plus this
    term at the shipped 822 G/s came within 25% of the measured busy time for 23 of them, the bytes alone for 12
    (they under-priced stride-1 windows 4-5x: a 4x4 max pool over 32 x 64 x 512 x 512 ran 11.0 ms, its bytes 2.0).
    """
    if op.window_elems <= 0 or spec.pool_window_gelem_s <= 0 or not op.outputs:
        return 0.0
    return op.outputs[0].numel * op.window_elems / (spec.pool_window_gelem_s * 1e3)


def cat_inputs_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Device time ``aten.cat`` spends on its inputs beyond their bytes (us): each input sweeps the grid blocks of
    the largest, ``min(largest input's bytes, cat_sweep_cap_bytes) / cat_sweep_gbps``, as the spec measured them
    (:func:`fusion_advisor.devices.memory_rates.measure_cat_sweep`); 0 for other ops or when not measured. A
    DenseNet's concatenations join a transition's large map with dozens of small ones, and ran at up to 4x their
    bytes at the copy bandwidth on the H200."""
    if spec.cat_sweep_gbps <= 0 or short_target(op.target) != "cat" or not op.inputs:
        return 0.0
    largest = max(t.nbytes for t in op.inputs)
    if spec.cat_sweep_cap_bytes > 0:
        largest = min(largest, spec.cat_sweep_cap_bytes)
    return len(op.inputs) * largest / (spec.cat_sweep_gbps * 1e3)


def roofline_op_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Roofline device time of one op run eagerly (us): ``max(FLOPs / peak, bytes / bandwidth + overhead)`` with
    the op's own ceilings (:func:`op_overhead_us`: an eager elementwise kernel's ramp-up and tail, when measured),
    plus a pooling op's window reads (:func:`pool_window_us`) and a concatenation's inputs
    (:func:`cat_inputs_us`)."""
    compute = op.flops / (op_peak_tflops(op, spec) * 1e12) * 1e6
    memory = op_bytes(op) / (op_bandwidth_gbps(op, spec) * 1e9) * 1e6 + op_overhead_us(op, spec)
    return max(compute, memory + pool_window_us(op, spec) + cat_inputs_us(op, spec))


#: Output-sized transfers at copy bandwidth a convolution's bias costs: eager PyTorch adds it in a separate
#: broadcast kernel after cuDNN's. Measured on the H200 (2026-12-02, benchmarks/accuracy/conv_rate_probe.py
#: --kernels, 391 convolutions whose bias pass took over 20 us): the pass took a median 1.49x of a read and a write
#: of the output at 90% of copy bandwidth, i.e. 3.3 transfers at copy bandwidth.
CONV_BIAS_TRANSFERS = 3.3


def measured_conv_us(op: OpInfo, spec: DeviceSpec, layout: str = "nchw") -> float | None:
    """Device time of a convolution in ``layout`` from the spec's measured ``conv_rates`` (us): the time fitted
    through the measured convolutions of its class, dtype and layout
    (:func:`fusion_advisor.devices.op_rates.conv_time_us`), plus its bias pass (:data:`CONV_BIAS_TRANSFERS`) when
    it has a bias; None for other ops, or when the spec measured no convolution of that class and layout.
    ``"nchw"``: eager, as written; ``"nhwc"``: channels-last."""
    if op.category != "conv" or not spec.conv_rates or len(op.inputs) < 2 or not op.outputs:
        return None
    geom = ConvGeometry.from_shapes(op.inputs[0].shape, op.inputs[1].shape, op.outputs[0].shape)
    if geom is None:
        return None
    t = conv_time_us(spec.conv_rates, geom, op.dtype, layout)
    if t is None:
        return None
    if has_bias(op):
        t += CONV_BIAS_TRANSFERS * op.outputs[0].nbytes / (spec.memory_bandwidth_gbps * 1e9) * 1e6
    return t


def measured_matmul_us(op: OpInfo, spec: DeviceSpec) -> float | None:
    """Eager device time of an ``mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` (or an exported ``linear`` or ``matmul``)
    from the spec's measured ``matmul_rates`` (us): the surface fitted through its class's measurements in the layout
    of its second operand (:func:`~fusion_advisor.analyze.matmul_shapes.matmul_layout`;
    :func:`fusion_advisor.devices.op_rates.matmul_time_us`), a
    matrix-vector product as a stream at the spec's copy bandwidth (:class:`~fusion_advisor.devices.op_rates.
    MatvecModel`); None for other ops, or without a measured matmul of its class and dtype."""
    problem = matmul_problem(op) if spec.matmul_rates else None
    return None if problem is None else matmul_time_us(spec.matmul_rates, *problem,
                                                       bandwidth_gbps=spec.memory_bandwidth_gbps)


def _middle_dims(op: OpInfo) -> tuple[int, int, int] | None:
    """``(outer, reduced, inner)`` of a softmax or reduction over ``op.reduction_elems`` elements per output: over
    the last dims (inner 1) where :attr:`OpInfo.reduces_last_dim`, else the leftmost run of dims below the last
    whose sizes multiply to the reduced count and whose following dims the output keeps (a softmax keeps them all).
    None where no such run exists."""
    shape, red = op.inputs[0].shape, op.reduction_elems
    numel = math.prod(shape)
    if red <= 0 or numel <= 0:
        return None
    if op.reduces_last_dim:
        return max(numel // red, 1), red, 1
    out = op.outputs[0].shape if op.outputs else ()
    for i in range(len(shape) - 1):
        for j in range(i + 1, len(shape)):
            tail = shape[j:]
            if math.prod(shape[i:j]) == red and (op.category == "softmax" or tuple(out[len(out) - len(tail):]) == tail):
                return math.prod(shape[:i]), red, math.prod(tail)
    return None


def reduction_geometry(op: OpInfo) -> tuple[str, tuple[int, int, int]] | None:
    """The measured class (:data:`fusion_advisor.devices.reduction_rates.REDUCTION_CLASSES`) and dims that price
    ``op`` from a spec's ``reduction_rates``, or None for an op no class covers: BatchNorm (``N x C x spatial``;
    the graph's ``_native_batch_norm_legit_no_training`` in eval, its other overloads with training statistics,
    InstanceNorm's among them), ``native_group_norm`` (its groups from the ``N x groups`` statistics it returns),
    ``native_layer_norm``, softmax and log-softmax, ``logsumexp`` and the single-kernel reductions of
    :data:`fusion_advisor.devices.reduction_rates.REDUCE_OPS`."""
    if not op.inputs or not op.inputs[0].shape or op.inputs[0].numel <= 0:
        return None
    name, shape = short_target(op.target), op.inputs[0].shape
    if name.startswith("_native_batch_norm_legit") or name in ("native_batch_norm", "cudnn_batch_norm"):
        if len(shape) < 2:
            return None
        kind = "batch_norm" if name == "_native_batch_norm_legit_no_training" else "batch_norm_train"
        return kind, (shape[0], shape[1], math.prod(shape[2:]))
    if name == "native_group_norm":
        if len(shape) < 2 or len(op.outputs) < 2 or len(op.outputs[1].shape) != 2:
            return None
        groups = op.outputs[1].shape[1]
        if groups <= 0 or shape[1] % groups:
            return None
        return "group_norm", (shape[0] * groups, shape[1] // groups, math.prod(shape[2:]))
    if name == "native_layer_norm":
        row = op.reduction_elems
        return ("layer_norm", (max(op.inputs[0].numel // row, 1), row, 1)) if row > 0 else None
    kind = ("softmax" if op.category == "softmax" else "logsumexp" if name == "logsumexp"
            else "reduce" if name in REDUCE_OPS else None)
    dims = _middle_dims(op) if kind else None
    return (kind, dims) if kind and dims else None


def measured_reduction_us(op: OpInfo, spec: DeviceSpec) -> float | None:
    """Eager device time of a normalization, softmax or reduction from the spec's measured ``reduction_rates``
    (us): the entries of its class nearest its geometry (:func:`reduction_geometry`,
    :func:`fusion_advisor.devices.reduction_rates.reduction_time_us`); None for other ops, or without a measured
    entry of its class."""
    if not spec.reduction_rates or op.category not in ("normalization", "softmax", "reduction"):
        return None
    geometry = reduction_geometry(op)
    if geometry is None:
        return None
    # the table is keyed by the dtype read (an argmax's int64 output fell to the fp32 entries: a bf16 argmax priced
    # at twice a bf16 amax; a reviewer)
    dtype = op.inputs[0].dtype if op.inputs and op.inputs[0].dtype else op.dtype
    return reduction_time_us(spec.reduction_rates, geometry[0], geometry[1], dtype, spec.memory_bandwidth_gbps,
                             spec.kernel_busy_overhead_us or spec.elementwise_overhead_us)


#: Host time of one cell step of a cuDNN recurrent layer, in eager-op launches (``launch_overhead_us``): cuDNN
#: launches 2 kernels per step (a GEMM and the cell's elementwise kernel) from its own loop. Measured on the H200
#: (2026-12-02, benchmarks/results/h200/accuracy/recurrent/): the six KernelBench cuDNN LSTM/GRU files ran
#: host-bound, 4.98-5.68 us of kernels per step in 11.7-22.1 us per step; per step over each profile's dispatch
#: probe: 1.17-2.62, median 1.5.
RECURRENT_STEP_LAUNCHES = 1.5


def recurrent_op_us(op: OpInfo, spec: DeviceSpec) -> float | None:
    """Eager device time of a cuDNN recurrent op (us): its :attr:`OpInfo.sequential_steps` times the spec's
    measured ``recurrent_step_us`` of its cell (each step waits for the one before: a latency-bound chain of small
    GEMMs), or its FLOPs at the tensor-core peak when that is longer; None for other ops, or when the spec
    measured no step time for the cell."""
    if op.category != "recurrent" or op.sequential_steps <= 0 or op.variant not in spec.recurrent_step_us:
        return None
    floor = op.flops / (op_peak_tflops(op, spec) * 1e12) * 1e6 if op.flops else 0.0
    return max(op.sequential_steps * spec.recurrent_step_us[op.variant], floor)


def measured_op_us(op: OpInfo, spec: DeviceSpec) -> float | None:
    """Eager device time of one op from the spec's measured rate tables (us): :func:`measured_conv_us` for a
    convolution, :func:`measured_matmul_us` for a matmul (both at least :func:`table_floor_us`),
    :func:`recurrent_op_us` for a recurrent layer stack,
    :func:`measured_reduction_us` for a normalization, softmax or reduction; None when no table prices it."""
    if op.category == "recurrent":
        return recurrent_op_us(op, spec)
    if op.category in ("conv", "matmul"):
        t = measured_conv_us(op, spec) if op.category == "conv" else measured_matmul_us(op, spec)
        return None if t is None else max(t, table_floor_us(op, spec))
    return measured_reduction_us(op, spec)


def table_floor_us(op: OpInfo, spec: DeviceSpec) -> float:
    """The least time (us) a convolution or matmul priced from the spec's measured table may take: its FLOPs at the
    faster of the op's peak (:func:`op_peak_tflops`) and the fastest rate the table measured in its dtype, and for a
    matmul moving more bytes than the GPU's L2 holds, its bytes at the spec's copy bandwidth
    (:func:`matmul_memory_floor_us`). A surface fitted through a table without large entries of a dtype
    extrapolates past the GPU: the shipped H100 spec, whose largest bf16 matmul ran 229 TFLOP/s, priced a bf16
    8192^3 GEMM at 6.2 PFLOP/s (found by a fresh user)."""
    fastest = fastest_tflops(spec.conv_rates if op.category == "conv" else spec.matmul_rates, op.dtype)
    peak = max(op_peak_tflops(op, spec), fastest)
    compute = op.flops / (peak * 1e12) * 1e6 if peak > 0 else 0.0
    return max(compute, matmul_memory_floor_us(op, spec)) if op.category == "matmul" else compute


def matmul_memory_floor_us(op: OpInfo, spec: DeviceSpec) -> float:
    """The least time (us) of a matmul whose operands and output take more bytes than the GPU's L2 holds: all its
    bytes at the spec's copy bandwidth (a working set larger than L2 streams through it); 0 for one that fits in L2
    or a spec without ``l2_bytes``.

    Every matmul of the shipped H200 and H100 tables moving more than L2 holds ran at most at the spec's copy
    bandwidth (H200: 490 entries, the fastest 4,256 GB/s of 4,275; H100: 429, 3,006 of 3,018), while entries inside
    L2 ran up to 4,380 and 4,984 GB/s: the bf16 surfaces, fitted on those, carried an L2-speed memory term to
    weights far larger than L2 (found by a fresh user: a batch-1 bf16 GEMV over a 4096 x 14336 weight priced at
    6.96 TB/s on the H200). Convolutions get no such floor: cuDNN's 3-D fp32 ones measured up to 4.0 TB/s of the
    bytes the table counts on the H100's 3.0 TB/s."""
    nbytes = op.bytes_read + op.bytes_written
    if spec.l2_bytes <= 0 or nbytes <= spec.l2_bytes:
        return 0.0
    return nbytes / (spec.memory_bandwidth_gbps * 1e9) * 1e6


def base_op_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Eager device time of one op before any profile fit (us): its measured rate where the spec has one
    (:func:`measured_op_us`), else the roofline (:func:`roofline_op_us`)."""
    measured = measured_op_us(op, spec)
    return roofline_op_us(op, spec) if measured is None else measured


def fit_keys(op: OpInfo, rated: bool) -> tuple[str, ...]:
    """The classes whose fitted curve may reprice ``op`` (most specific first): :func:`op_class_keys`, less the
    category-wide one where it pools unlike ops: for an op priced from a measured table (``rated``: its class's own
    rates; a curve fitted over every convolution class inflated depthwise ones 6x) and for ``other`` (pooling,
    scans and activations alike)."""
    keys = op_class_keys(op)
    return keys[:-1] if rated or op.category == "other" else keys


def _op_time_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Predicted eager device time of one op (us): :func:`base_op_us`, through its class's fitted curve when the
    spec has one (:meth:`DeviceSpec.op_time_fit` of :func:`fit_keys`)."""
    parts = encoder_layer_parts(op)
    if parts:
        # a native composite (analyze/composites.py): its parts priced as their own ops, each through its class's
        # fit (its own class's curve is not applied: it was fitted against the one-kernel price)
        return sum(_op_time_us(p, spec) for p in parts)
    measured = measured_op_us(op, spec)
    t = roofline_op_us(op, spec) if measured is None else measured
    if not spec.op_time_fits or pool_window_us(op, spec) > 0 or (measured is not None and _priced_as_matvec(op, spec)):
        # a pooling op priced by its measured window rate, a matrix-vector product by its stream: the profile fits
        # were learned against other prices (the bytes alone; the GEMM surface: an mm, a bmm and an addmm of one
        # product read 22.5, 26.4 and 26.9 us through them where the stream said 25.2; a reviewer)
        return t
    fit = spec.op_time_fit(fit_keys(op, rated=measured is not None), op.dtype)
    if fit is None:
        return t
    # a fit under 1 (the shipped fp32 matmul curves: 0.9) never takes a table-priced op past the floors its price
    # already stood on, nor any op past the bytes L2 cannot hold
    floor = max(dram_floor_us(op, spec), table_floor_us(op, spec) if measured is not None and
                op.category in ("conv", "matmul") else 0.0)
    return max(fit(t, bounded_gain=measured is None), floor)


def price_source(op: OpInfo, spec: DeviceSpec) -> str:
    """How :func:`_op_time_us` priced ``op``'s eager device time, for ops.csv: ``"matmul table"``, ``"conv table"``,
    ``"reduction table"`` (the spec's measured rates), ``"recurrent steps"`` or ``"roofline"``, then
    ``" x fit <class>"`` where a profile-fitted curve applies; a native composite (an encoder layer's fast path)
    ``"parts: "`` and its parts' own; ``""`` for a view or an op that launches nothing. A price raised to its floors
    (:func:`table_floor_us`, :func:`dram_floor_us`) is still named by what priced it first."""
    if op.is_view or not launches(op):
        return ""
    parts = encoder_layer_parts(op)
    if parts:  # a native composite: each part priced as its own op (_op_time_us)
        return "parts: " + "; ".join(dict.fromkeys(price_source(p, spec) for p in parts))
    measured = measured_op_us(op, spec)
    how = "roofline" if measured is None else "recurrent steps" if op.category == "recurrent" else (
        f"{op.category if op.category in ('matmul', 'conv') else 'reduction'} table")
    stream = measured is not None and _priced_as_matvec(op, spec)
    if stream:
        how += " (matrix-vector stream)"
    if spec.op_time_fits and pool_window_us(op, spec) <= 0 and not stream:
        keys = fit_keys(op, rated=measured is not None)
        if spec.op_time_fit(keys, op.dtype) is not None:
            how += " x fit " + next(k for k in keys if k in spec.op_time_fits)
    return how


def _priced_as_matvec(op: OpInfo, spec: DeviceSpec) -> bool:
    """Whether :func:`measured_matmul_us` priced ``op`` as a matrix-vector stream (its table holds enough of them)."""
    problem = matmul_problem(op) if spec.matmul_rates else None
    return problem is not None and matvec_time_us(spec.matmul_rates, *problem[1:6],
                                                  spec.memory_bandwidth_gbps) is not None


def op_device_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Predicted eager device time of one op (us), as the chain estimates price it; 0 for a view or an op that
    launches nothing."""
    return 0.0 if op.is_view or not launches(op) else _op_time_us(op, spec)


def dram_floor_us(op: OpInfo, spec: DeviceSpec) -> float:
    """The least time (us) an op moving more bytes than the GPU's L2 holds can take: the bytes beyond what L2 can
    hold (its producer may have left that much there) at the spec's copy bandwidth; 0 for an op that fits in L2,
    or a spec without ``l2_bytes``. A profile fit under the roofline learnt in-model reads from L2 (0.73x for the
    H100's clones); carried to a 384 MiB clone or a 570 MB LayerNorm it priced them past the memory's bandwidth
    (found by a fresh user)."""
    beyond = op.bytes_read + op.bytes_written - spec.l2_bytes
    if spec.l2_bytes <= 0 or beyond <= 0:
        return 0.0
    return beyond / (spec.memory_bandwidth_gbps * 1e9) * 1e6


def op_launch_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Host time (us) of issuing one eager kernel of ``op``: the spec's measured ``launch_overhead_by_class`` entry
    of the op's most specific class that has one (:func:`op_class_keys`: cuDNN convolutions and cuBLAS matmuls
    spend far more host time per call than an elementwise add), else ``launch_overhead_us``; times the spec's
    ``host_time_scale`` (the in-model over tight-loop host time fitted from profiles, 1 unless fitted)."""
    if spec.launch_overhead_by_class:
        for key in op_class_keys(op):
            if key in spec.launch_overhead_by_class:
                return spec.launch_overhead_by_class[key] * spec.host_time_scale
    return spec.launch_overhead_us * spec.host_time_scale


def op_host_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Host time (us) of issuing ``op`` eagerly: :func:`op_launch_us` per kernel it launches, for a convolution
    plus :func:`conv_activity_host_us`, and for a cuDNN recurrent op :data:`RECURRENT_STEP_LAUNCHES` launches per
    cell step (cuDNN issues each step from its host)."""
    if op.category == "recurrent" and op.sequential_steps > 0:
        return op.sequential_steps * RECURRENT_STEP_LAUNCHES * spec.launch_overhead_us
    launches_per_call = composite_host_launches(op)
    if launches_per_call:  # a native layer: its host time per call, measured in launches (composites.py)
        return launches_per_call * op_launch_us(op, spec)
    base = max(op.eager_kernels, 1) * op_launch_us(op, spec)
    return base + conv_activity_host_us(op, spec, base) if op.category == "conv" else base


#: Least share of its class's host time a convolution issuing fewer activities than the probe is priced at.
MIN_CONV_HOST_SHARE = 0.5


def conv_activity_host_us(op: OpInfo, spec: DeviceSpec, base_us: float) -> float:
    """Host time (us, may be negative) a convolution costs beyond its class's probe (``base_us``): the spec's
    ``activity_host_share`` of ``base_us`` per device activity cuDNN issues for its geometry beyond the probe's
    (``conv_probe_kernels``), the count that of its nearest measured neighbours
    (:func:`fusion_advisor.devices.op_rates.conv_kernels`), plus one for a bias (the table's convolutions have
    none; eager PyTorch adds a bias in a kernel of its own, and the probe, an ``nn.Conv2d``, has one); never below
    :data:`MIN_CONV_HOST_SHARE` of ``base_us`` in all. 0 where the spec measured no activity cost or the table
    recorded no counts.

    On the H200 ResNet-101's convolutions issued 1-5 activities (layout transforms, workspace memsets) and their
    host time per call grew with them, 36 us of host time for one activity to 76 us for five
    (benchmarks/results/h200/host/host_by_shape.json)."""
    if spec.activity_host_share <= 0 or spec.conv_probe_kernels <= 0 or len(op.inputs) < 2 or not op.outputs:
        return 0.0
    geom = ConvGeometry.from_shapes(op.inputs[0].shape, op.inputs[1].shape, op.outputs[0].shape)
    kernels = conv_kernels(spec.conv_rates, geom, op.dtype) if geom is not None else None
    if kernels is None:
        return 0.0
    kernels += 1.0 if has_bias(op) else 0.0
    return base_us * max((kernels - spec.conv_probe_kernels) * spec.activity_host_share, MIN_CONV_HOST_SHARE - 1.0)


def view_host_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Host time (us) of an eager view op: ``view_overhead_us`` times ``host_time_scale`` and ``view_host_scale``
    (fitted from profiles: a view inside a model over its tight-loop price), except for the graph's ``getitem`` of
    a tuple output (``_native_batch_norm_legit``'s, ``max_pool2d_with_indices``'s), which model code never
    dispatches: the aten op returned the tuple."""
    return 0.0 if "getitem" in op.target else spec.view_overhead_us * spec.host_time_scale * spec.view_host_scale


#: Launches after which an aten op's host path is cold: an op whose aten op (``OpInfo.target``) last ran more launches
#: before it than this costs the spec's ``cold_host_scale`` times its warm in-model host time (its price times
#: ``host_time_scale``, the views before it included) inside a model (:func:`in_model_times`; :func:`estimate`, which
#: prices a chain alone, in a loop of its own, does not charge it). In the stamped
#: replays of the H200 and H100 profiles (benchmarks/results/h200/accuracy/reprofile, h100/accuracy/profiles), ops
#: the GPU waited for cost 0.88-1.13x their model's median measured-over-priced host time (the median of each bucket
#: of 1, 2, 3-4, ..., 33-64 launches) when their aten op had run 1 to 64 launches before (4,635 ops), 2.2-2.8x at
#: 65-128 launches (21 ops) and 3.4-3.7x at 257-512 (13 ops): the mean and addmm of a CNN's classifier head,
#: DenseNet's one max pool, its three average pools (the caches a tight loop keeps warm are cold again).
COLD_REUSE_LAUNCHES = 64


def cold_ops(ops: list[OpInfo], repeated_graphs: Collection[int] = ()) -> frozenset[str]:
    """Ids of the launching ops of one model (``ops`` in execution order) whose aten op last ran more than
    :data:`COLD_REUSE_LAUNCHES` launches before them, counting on from the run before (a model called in a loop):
    an aten op the model runs once is its whole run of launches from its last call. Launches are ops here, as
    :func:`in_model_times` issues them (a recurrent layer's thousands of step launches count as one).

    Every graph is taken to run once per model call, as :func:`in_model_times` runs it; a graph a profile saw run
    several times (``repeated_graphs``: a graph break inside a loop over layers) runs its ops again within its own
    launches, so none of them is cold (an op after it may be colder than counted)."""
    launching = [op for op in ops if not op.is_view and launches(op)]
    last: dict[str, int] = {}
    for i, op in enumerate(launching):  # where each aten op ran last in the run before
        last[op.target] = i - len(launching)
    cold = set()
    for i, op in enumerate(launching):
        if i - last[op.target] > COLD_REUSE_LAUNCHES and op.graph_index not in repeated_graphs:
            cold.add(op.id)
        last[op.target] = i
    return frozenset(cold)


#: Fixed device time of one kernel replayed from a CUDA graph, us, where the spec measures none
#: (``elementwise_overhead_us``): what ``calibrate`` measured per eager elementwise kernel on the H200
#: (benchmarks/results/h200/accuracy/calibrated_spec.yaml: 2.332 us). Without a floor a tiny chain's graph time was
#: its bytes at copy bandwidth (0.1 us), and the report predicted 337x over eager for one softmax.
GRAPH_KERNEL_FLOOR_US = 2.3


#: The library's fp32 GEMM kernels (3xTF32 products) at their best against cuBLAS SGEMM, forward: 1.51-1.56x at
#: KernelBench's GEMM widths on the H200 (benchmarks/results/h200/kernels/fp32_gemm.md); at attention's few-K
#: shapes 0.97x (K = 32), 1.34x (K = 96), 1.15x (N = 96) (benchmarks/results/h200/kernels/matmul.md). A triton
#: route never predicts more: at its compute roofline alone a K = 32 bmm read 2.97x (a fresh user).
LIBRARY_GEMM_BEST_SPEEDUP = 1.56


def estimate(chain: Chain, ops: dict[str, OpInfo], spec: DeviceSpec) -> Estimate:
    """Roofline :class:`Estimate` of ``chain`` on ``spec``; ``ops`` maps op ids to :class:`OpInfo`. Times in us."""
    tensor = bool(set(chain.categories) & _TENSOR_CORE_CATEGORIES)
    compute_dtype = _compute_dtype(chain.dtype, set(chain.categories))
    attention = [ops[i] for i in chain.op_ids if ops[i].category == "attention"]
    peak_tflops = (op_peak_tflops(attention[0], spec) if attention
                   else spec.peak_tflops(compute_dtype, tensor))
    bw = spec.memory_bandwidth_gbps * 1e9
    compute_us = chain.flops / (peak_tflops * 1e12) * 1e6
    memory_eager_us = chain.eager_bytes / bw * 1e6
    memory_fused_us = chain.fused_bytes / bw * 1e6
    launch_eager_us = sum(op_host_us(ops[i], spec) for i in chain.op_ids if not ops[i].is_view and launches(ops[i]))
    launch = spec.launch_overhead_us * spec.host_time_scale  # a fused kernel's launch, at the host scale eager's pay
    # an op on empty tensors launches no kernel (PyTorch returns before launching one)
    # an op launching n kernels (SDPA's math backend, or any backend converting a boolean mask) costs at least n
    # launches
    busy = [(_op_time_us(ops[i], spec), launches(ops[i]), op_host_us(ops[i], spec))
            for i in chain.op_ids]
    eager_us = sum(max(t, host) if runs else 0.0 for t, runs, host in busy)
    idle_us = sum(max(0.0, host - t) if runs else 0.0 for t, runs, host in busy)
    busy_us = sum(t if runs else 0.0 for t, runs, _ in busy)
    fusible = chain.kind == "fusible" and chain.eager_kernels > 1
    any_work = any(runs for _, runs, _ in busy)
    # the fused kernel's ramp and tail, once, as timed back to back (elementwise_overhead_us, the gap included)
    overhead = spec.elementwise_overhead_us if any(has_kernel_overhead(ops[i]) for i in chain.op_ids) else 0.0
    overhead += sum(pool_window_us(ops[i], spec) for i in chain.op_ids)  # a fused pool still reads its windows
    fused_us = (max(compute_us, memory_fused_us + overhead, launch) if any_work else 0.0) if fusible else eager_us

    def lowered(efficiency: float, floor: float) -> float:  # one kernel at a share of the memory roofline
        return max(compute_us, memory_fused_us / efficiency + overhead, floor) if any_work else 0.0

    def at(efficiency: float, floor: float) -> float:  # the fused kernel, for a fusible chain
        return lowered(efficiency, floor) if fusible else eager_us

    compile_eff = spec.efficiency("torch.compile", chain.pattern)
    compile_us = at(compile_eff, launch)
    if any_work and not fusible and spec.kind == "gpu" and any(is_scan(ops[i]) for i in chain.op_ids):
        # Inductor lowers a scan to a Triton scan of its own: its bytes at compile's share of the copy roofline,
        # not the aten kernel's measured rate (on the H200: a 32768 x 32768 cumsum 2.59 ms compiled, 4.48 eager);
        # its CPU code has no scan (BackendFeature.SCAN is Triton's) and calls ATen's
        compile_us = min(eager_us, lowered(compile_eff, launch))
    triton_eff = spec.efficiency("triton", chain.pattern)
    triton_us = at(triton_eff, launch)
    # the fp32 GEMM as 3xTF32 (the library's linear and matmul take fp32 alone): no rate for other dtypes
    heavy_rate = ((spec.route_efficiency.get("triton") or {}).get(chain.pattern)
                  if chain.kind == "heavy" and chain.dtype == "fp32" else None)
    if heavy_rate and any_work:
        # a library kernel that replaces a heavy op itself (the fp32 GEMM as 3xTF32): its measured share of the
        # op's compute roofline, which may pass 1 when it uses units the roofline's peak does not count, and never
        # more than its best measured speed-up over the eager op's own time (a shape SGEMM runs far below its
        # peak, few-K or few-tile, runs the kernel below its rate too)
        triton_us = max(compute_us / float(heavy_rate), eager_us / LIBRARY_GEMM_BEST_SPEEDUP,
                        memory_fused_us + overhead, launch)
    elif chain.kind == "fusible" and not fusible and any_work:
        # a lone kernel the library's replaces (a wide-row softmax): its share of the memory roofline, as fused
        triton_us = lowered(triton_eff, launch)
    if chain.kernel_op_ids and fusible and any_work:
        # the library kernel computes part of the chain (a LayerNorm between contiguous clones): its bytes at its
        # share of the roofline, the chain's other ops as they run eagerly (apply swaps the kernel in alone)
        core = set(chain.kernel_op_ids)
        rest_us = sum(max(t, host) for i, (t, runs, host) in zip(chain.op_ids, busy, strict=True)
                      if runs and i not in core)
        kernel_us = max(compute_us, chain.kernel_bytes / bw * 1e6 / triton_eff + overhead, launch)
        triton_us = kernel_us + rest_us
    # replayed from a CUDA graph a kernel costs no launch, but still its fixed device time
    floor = spec.elementwise_overhead_us or GRAPH_KERNEL_FLOOR_US
    kernels = sum(max(ops[i].eager_kernels, 1) for i in chain.op_ids if launches(ops[i]))
    # a recurrent layer's cell steps too: apply's whole-model CUDA graph (torch.cuda.graph) captures cuDNN's
    # launches (KernelBench's LSTM/GRU files 3.4-8.8x eager on the H200); torch.compile's reduce-overhead does not
    # reach them (report.views.predicted_model_routes prices that route apart)
    cudagraphs_us = at(compile_eff, floor) if fusible else max(busy_us, kernels * floor)
    peeled_compile_us, peeled_graph_us = _peeled_bias_change_us(chain, ops, spec)
    compile_us, cudagraphs_us = max(compile_us + peeled_compile_us, 0.0), max(cudagraphs_us + peeled_graph_us, 0.0)
    if chain.prologue_of and any_work:  # Inductor reads the pool's input through this chain: no pass of its own
        compile_us = cudagraphs_us = compute_us
    ridge = peak_tflops * 1e12 / (spec.memory_bandwidth_gbps * 1e9)
    bound = _bound(idle_us, busy_us, chain.arithmetic_intensity, ridge)
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
        compile_us=compile_us,
        triton_us=triton_us,
        cudagraphs_us=cudagraphs_us,
    )


def eager_alone_us(op: OpInfo, spec: DeviceSpec) -> float:
    """Eager time (us) of ``op`` run on its own: the longer of its device time and its host time (0 for a view or an
    op that launches nothing), as :func:`estimate` prices each op of a chain."""
    if op.is_view or not launches(op):
        return 0.0
    return max(_op_time_us(op, spec), op_host_us(op, spec))


def roofline_busy_us(chain: Chain, ops: dict[str, OpInfo], spec: DeviceSpec) -> float:
    """Roofline device time of ``chain`` run op by op, no launch term: :func:`roofline_op_us` summed (us), each op
    at its own ceilings (its bandwidth, the fixed time of an eager elementwise kernel, a pool's window reads, a
    cat's input sweeps), no measured table or fit. The floor a measured eager run of the chain approaches; an op
    reading from L2 what its producer left there can run under it."""
    return sum(roofline_op_us(ops[i], spec) for i in chain.op_ids)


def _module_calls(prev: str, path: str) -> int:
    """nn.Module calls entered between an op issued in module ``prev`` and one issued in ``path`` (dotted paths,
    ``""`` the top level): the components of ``path`` below its common prefix with ``prev``. Returning to a parent
    enters none; ``"a.b"`` -> ``"a.c.d"`` enters two (``a.c`` and ``a.c.d``)."""
    if path == prev or not path:
        return 0
    new, old = path.split("."), prev.split(".") if prev else []
    common = 0
    for x, y in zip(new, old, strict=False):
        if x != y:
            break
        common += 1
    return len(new) - common


def measured_bound(busy_us: float, idle_us: float, flops: int, nbytes: int, peak_tflops: float,
                   bandwidth_gbps: float) -> str:
    """Measured bound class of a chain (see :class:`~fusion_advisor.analyze.records.ChainMeasurement`).

    ``"launch"`` when ``idle_us > busy_us``; else ``"compute"`` when the chain's FLOP/s over its busy time is a
    larger fraction of ``peak_tflops`` than its bytes/s is of ``bandwidth_gbps``, else ``"memory"``; ``""`` when
    nothing was measured (no time). The busy time cancels out of the compute-or-memory test: that part is the
    chain's FLOPs over ``peak_tflops`` against its bytes over ``bandwidth_gbps``, so it is only as right as the
    ceilings it is given (:func:`fusion_advisor.devices.fit_profiles.measured_bounds` reclassifies a profile
    against the spec it is judged on).
    """
    if busy_us + idle_us <= 0:
        return ""
    if idle_us > busy_us:
        return "launch"
    if busy_us <= 0:
        return "launch"
    compute_frac = flops / (busy_us * 1e-6) / (peak_tflops * 1e12) if peak_tflops > 0 else 0.0
    memory_frac = nbytes / (busy_us * 1e-6) / (bandwidth_gbps * 1e9) if bandwidth_gbps > 0 else 0.0
    return "compute" if compute_frac > memory_frac else "memory"


def _bound(idle_us: float, busy_us: float, arithmetic_intensity: float, ridge: float) -> str:
    """Launch-bound when the GPU idles longer than it is busy, else compute- or memory-bound by the ridge point."""
    if idle_us > busy_us:
        return "launch"
    return "compute" if arithmetic_intensity > ridge else "memory"


def estimate_all(chains: list[Chain], ops: list[OpInfo], spec: DeviceSpec,
                 device_us: dict[str, float] | None = None) -> dict[str, Estimate]:
    """:func:`estimate` for every chain of one model, keyed by chain id, with each chain's bound class as it runs
    inside the model (:func:`in_model_times`, ``device_us`` passed on): launch-bound only when the GPU waits for the
    host longer than it computes there. Alone (:func:`estimate`) every short chain waits for its own launches;
    inside a model the host often runs ahead of the GPU (while a long GEMM or convolution runs it issues the next
    ops), and a profile of the model (:func:`fusion_advisor.analyze.profile.measured_bound`) sees those chains
    busy, not idle."""
    by_id = {o.id: o for o in ops}
    in_model = in_model_times(chains, ops, spec, device_us)
    out = {}
    for c in chains:
        est = estimate(c, by_id, spec)
        busy, idle = in_model[c.id]
        bound = _bound(idle, busy, c.arithmetic_intensity, est.ridge_point) if busy + idle > 0 else est.bound
        out[c.id] = est if bound == est.bound else replace(est, bound=bound)
    return out


def _peeled_bias_change_us(chain: Chain, by_id: dict[str, OpInfo], spec: DeviceSpec) -> tuple[float, float]:
    """How Inductor's code changes a convolution chain's time on a GPU, ``(compiled, replayed from a CUDA graph)``
    (us; negative where it saves): it calls cuDNN without the bias ("peel off the bias, cudnn is slower with it":
    torch/_inductor/kernel/conv.py, torch 2.11-2.13) and adds it in the Triton kernel that reads the output next.
    Per biased convolution priced from the table, its device time without the bias (the convolution priced again
    without that input, so a profile fit's scale applies to both alike) replaces the one with it; where not every
    op reading the output is one Inductor writes a kernel for (:attr:`Chain.output_fuses` false: a graph output
    reads it, or another convolution), the add is a kernel of its own, a read and a write of the output at
    torch.compile's share of the roofline (replayed, at least the graph's kernel floor). Compiled, each op keeps at
    least its host time: cuDNN is called as eagerly, a host-bound convolution saves nothing; replayed, device time
    alone counts. torch.compile(model) of the 25 convolution models of the H200's seed-0 route set was predicted a
    median 1.46x slow of measured with the bias pass kept (at 49b3a77;
    benchmarks/results/h200/accuracy/route_prediction). 0 for other chains, a CPU spec (Inductor's CPU convolution
    keeps its bias) and a convolution priced without a table."""
    if spec.kind != "gpu" or chain.kind != "heavy" or "conv" not in chain.categories:
        return 0.0, 0.0
    bw = spec.memory_bandwidth_gbps * 1e9
    compiled = graphed = 0.0
    for i in chain.op_ids:
        op = by_id[i]
        if op.category != "conv" or not has_bias(op) or not op.outputs or measured_conv_us(op, spec) is None:
            continue
        host = op_host_us(op, spec)
        device = _op_time_us(op, spec)
        peeled = _op_time_us(replace(op, inputs=op.inputs[:2]), spec)
        add = 0.0 if chain.output_fuses else max(2.0 * op.outputs[0].nbytes / bw * 1e6
                                            / spec.efficiency("torch.compile", "pointwise"),
                                            spec.elementwise_overhead_us or GRAPH_KERNEL_FLOOR_US)
        compiled += max(peeled + add, host) - max(device, host)
        graphed += peeled + add - device
    return compiled, graphed


def eager_in_model_us(chains: list[Chain], ops: list[OpInfo], spec: DeviceSpec) -> dict[str, float]:
    """Roofline eager time of every chain as it runs inside the whole model, keyed by chain id (us): its device
    time plus the GPU's idle time waiting for its launches (:func:`in_model_times`)."""
    return {cid: busy + idle for cid, (busy, idle) in in_model_times(chains, ops, spec).items()}


def in_model_times(chains: list[Chain], ops: list[OpInfo], spec: DeviceSpec,
                   device_us: dict[str, float] | None = None) -> dict[str, tuple[float, float]]:
    """``(device us, idle us)`` of every chain as it runs inside the whole model, keyed by chain id.

    :func:`estimate` prices a chain alone: each op ``max(t, launch)``. Inside a model the host may run ahead of the
    GPU: while a long GEMM runs, the host issues the next ops, so short kernels after it wait for no launch. This
    replays the model's ops in execution order (``ops`` order) on two clocks, as
    :func:`fusion_advisor.analyze.host_stamps.replay_stamps` replays measured kernels: issuing an op costs the host
    its host time per kernel it launches (ops on empty tensors launch nothing and cost no host time here); an op's
    kernel starts when it is issued or when the GPU finished the previous kernel, whichever is later; the GPU's
    wait for an op (capped by the host time issuing it) is that op's idle time. As in a loop over the model (what
    ``analyze --profile`` measures), the times are those of a run after another: the replay runs the ops twice and
    keeps the second pass, whose first op finds the GPU still busy with the run before where that run kept it busy
    (a GPU-bound model) and idle where the host set the pace (a host-bound one: it drained after the last launch;
    assuming it busy gave every host-bound model's first op no idle time at all). A chain's
    time is its ops' predicted device time (:func:`_op_time_us`) plus their idle times. This is what ``analyze --profile`` compares with the
    measured chain time; routing keeps :func:`estimate`'s per-chain numbers. Host time per kernel is
    :func:`op_launch_us`; views add :func:`view_host_us` and each ``nn.Module`` call entered ``module_call_us`` to
    the host time before the next launch (:func:`_module_calls`); an op whose aten op has not run for more than
    :data:`COLD_REUSE_LAUNCHES` launches (:func:`cold_ops`) costs ``cold_host_scale`` times its own and its views'
    host time, as :func:`fusion_advisor.devices.fit_profiles.fit_cold_host_scale` measures it. A recurrent op issues its steps while the GPU
    runs them (:data:`RECURRENT_STEP_LAUNCHES` launches of host time per step): it takes the longer of its issue
    and its device time. ``device_us`` (op id -> us) replaces the predicted device time of the ops it names: a
    profile's measured busy times, to judge the host model apart from the device model.
    """
    idle: dict[str, float] = {}
    device: dict[str, float] = {}
    cold = cold_ops(ops) if spec.cold_host_scale != 1.0 else frozenset()
    host = gpu_free = 0.0
    for _ in range(2):  # a run, then the run after it (steady state): the second pass's times are kept
        # each run enters the model from its top level, and what its last launch left pending (trailing views) is
        # not the next run's: the measured replay counts an op's wait only from its graph's start
        prev_path, pending, views = "", 0.0, 0.0  # host time of module calls and views not yet followed by a launch
        for op in ops:
            calls = _module_calls(prev_path, op.module_path)
            prev_path = op.module_path
            pending += calls * spec.module_call_us * spec.host_time_scale
            if op.is_view:
                views += view_host_us(op, spec)
                continue
            if not launches(op):
                continue
            if op.id not in device:  # priced once: the second pass replays the first's device times
                device[op.id] = device_us[op.id] if device_us and op.id in device_us else _op_time_us(op, spec)
            if op.category == "recurrent" and op.sequential_steps > 0:
                # cuDNN issues each cell step's kernels from its own host loop while the GPU runs the steps before:
                # the GPU waits for the host's excess over its own time, not for the whole issue
                start = host + pending + views
                issue = op_host_us(op, spec)
                span = max(device[op.id], issue)
                idle[op.id] = max(0.0, start - gpu_free) + span - device[op.id]
                host, gpu_free, pending, views = start + issue, max(start, gpu_free) + span, 0.0, 0.0
                continue
            own = op_host_us(op, spec) + views  # SDPA's math: a dozen kernels
            issue = (own * spec.cold_host_scale if op.id in cold else own) + pending
            pending = views = 0.0
            host += issue
            idle[op.id] = min(host - gpu_free, issue) if host > gpu_free else 0.0
            gpu_free = max(host, gpu_free) + device[op.id]
    # ops that launch nothing cost nothing (views are in no chain; an op on empty tensors has no time)
    return {c.id: (sum(device.get(i, 0.0) for i in c.op_ids), sum(idle.get(i, 0.0) for i in c.op_ids))
            for c in chains}
