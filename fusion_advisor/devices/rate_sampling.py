"""What ``calibrate`` samples and times for the measured rate tables of :mod:`fusion_advisor.devices.op_rates`:
seeded convolutions of every geometry class (:func:`sample_plan`, :func:`measure_conv_rates`), seeded matmuls
(:func:`matmul_plan`, :func:`measure_matmul_rates`), the sample sizes and budgets per device
(:data:`CONV_SAMPLES`, :data:`MATMUL_SAMPLES`), and the recurrent layers' time per cell step
(:func:`measure_recurrent_steps`). The tables it returns are priced by op_rates' fitted surfaces."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from fusion_advisor.devices.op_rates import (CONV_CLASSES, MATMUL_CLASSES, MATMUL_LAYOUTS, ConvGeometry, ConvRate,
                                             MatmulRate, _prod, _sig)
from fusion_advisor.dtypes import float_dtype


def _dim(rng: random.Random, lo: int, hi: int) -> int:
    """A matmul dimension: half the time a multiple of 64 or a power of two (what models use), else any integer,
    log-uniform over [lo, hi]."""
    x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if rng.random() < 0.5:
        return max(lo, int(round(x / 64)) * 64) if x >= 64 else 1 << max(int(round(math.log2(x))), 0)
    return max(lo, int(round(x)))


#: Share of each class's sampled matmuls with one of M, N and K below 16 (:func:`_dim` over 1-15): a CNN's
#: classifier head (M = the batch of 2-10 rows over 1000-25088 features), a recurrent cell's step (8 rows), a
#: position-bias MLP's 3-24 outputs, a state-space scan's 3 x 3 blocks. cuBLAS runs them as GEMV-like or split-K
#: kernels far from the surface fitted through dims of 16 and up: on the H200 VGG16's 10 x 25088 x 4096 addmm took
#: 304 us where a table without them priced 149, its 10 x 4096 x 1000 one 43.6 us against 13.2
#: (benchmarks/results/h200/accuracy/reprofile, seed 3).
SMALL_DIM_SHARE = 0.25
#: Share of the ``nt`` matmuls (nn.Linear's layout) with M, the rows, over 1-15: a Linear over a small batch (a
#: classifier head, a recurrent cell's step), which cuBLAS runs as ``gemmSN_TN``, its time growing with K
#: (:data:`fusion_advisor.devices.op_rates.MATMUL_LAYOUTS`).
FEW_ROWS_SHARE = 0.25


def matmul_plan(per_class: dict[str, int], seed: int = 0, max_elems: int = 64 << 20,
                flop_range: tuple[float, float] = (1e8, 2e11)
                ) -> list[tuple[str, str, int, int, int, int, str]]:
    """``per_class[dtype]`` seeded matmuls ``(detail, dtype, batch, M, N, K, layout)`` per class of
    :data:`MATMUL_CLASSES`, the layouts of :data:`MATMUL_LAYOUTS` in turn: sizes log-uniform over 16-16384
    (:func:`_dim`), or, for :data:`FEW_ROWS_SHARE` of the ``nt`` ones, M over 1-15, or, for :data:`SMALL_DIM_SHARE`
    of the rest, one of M, N and K over 1-15; each operand within ``max_elems`` elements, FLOPs within
    ``flop_range``."""
    rng = random.Random(seed + 1)
    out = []
    for dtype, n in per_class.items():
        for detail in MATMUL_CLASSES:
            got = 0
            while got < n:
                layout = MATMUL_LAYOUTS[got % len(MATMUL_LAYOUTS)]
                batch = 1 if detail == "mm" else rng.choice((2, 4, 8, 16, 32, 64, 128, 256))
                dims = [_dim(rng, 16, 16384) for _ in range(3)]
                if layout == "nt" and rng.random() < FEW_ROWS_SHARE:
                    dims[0] = _dim(rng, 1, 15)
                elif rng.random() < SMALL_DIM_SHARE:
                    dims[rng.randrange(3)] = _dim(rng, 1, 15)
                m, nn, k = dims
                flops = 2 * batch * m * nn * k
                if max(m * k, k * nn, m * nn) * batch > max_elems or not flop_range[0] <= flops <= flop_range[1]:
                    continue
                out.append((detail, dtype, batch, m, nn, k, layout))
                got += 1
    return out


def _matmul_call(device: str, dt: Any, detail: str, batch: int, m: int, n: int, k: int, layout: str
                 ) -> Callable[[], Any]:
    """A call of one sampled matmul (see :func:`measure_matmul_rates`), its operands allocated."""
    import torch
    import torch.nn.functional as F

    if detail == "mm":
        a = torch.randn(m, k, device=device, dtype=dt)
        if layout == "nt":
            w, bias = torch.randn(n, k, device=device, dtype=dt), torch.randn(n, device=device, dtype=dt)
            return lambda: F.linear(a, w, bias)
        b = torch.randn(k, n, device=device, dtype=dt)
        return lambda: torch.mm(a, b)
    a = torch.randn(batch, m, k, device=device, dtype=dt)
    b = (torch.randn(batch, n, k, device=device, dtype=dt).transpose(1, 2) if layout == "nt"
         else torch.randn(batch, k, n, device=device, dtype=dt))
    return lambda: torch.bmm(a, b)


def measure_matmul_rates(device: str, plan: Sequence[tuple[str, str, int, int, int, int, str]],
                         timer: Callable[[Callable[[], Any]], Any], budget_s: float, dtypes: dict[str, Any]
                         ) -> tuple[list[MatmulRate], dict[str, str]]:
    """Time each matmul of ``plan`` with ``timer`` until ``budget_s`` seconds have passed, with PyTorch's default
    matmul precision (fp32 TF32 off) set for the measurement and restored: an ``nn`` ``mm`` as ``torch.mm(a, b)``,
    an ``nt`` one as ``nn.Linear`` issues it (``F.linear(a, w, bias)``: ``addmm(bias, a, w.t())``), a ``bmm`` as
    ``torch.bmm(a, b)`` with ``b`` a transposed view for ``nt``. Records the device activities per call where
    ``timer`` counts them (``kernels_per_call``)."""
    import time

    import torch

    rates: list[MatmulRate] = []
    failed: list[str] = []
    skipped: dict[str, str] = {}
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.perf_counter()
    try:
        for i, (detail, dtype, batch, m, n, k, layout) in enumerate(plan):
            if time.perf_counter() - start > budget_s:
                skipped["matmul_rates"] = f"{len(plan) - i} of {len(plan)} matmuls left out: the {budget_s:g} s budget"
                break
            dt = dtypes[dtype]
            try:
                timing = timer(_matmul_call(device, dt, detail, batch, m, n, k, layout))
            except (RuntimeError, ValueError) as e:
                failed.append(f"{detail} {layout} {dtype} {batch}x{m}x{n}x{k}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:100]}")
                continue
            rates.append(MatmulRate(detail, dtype, m, n, k, batch,
                                    2 * batch * m * n * k / (timing.median_ms * 1e-3) / 1e12, layout,
                                    float(getattr(timing, "kernels_per_call", None) or 0.0)))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    if failed:
        skipped["matmul_rates failed"] = f"{len(failed)} matmul(s) not measured, e.g. {failed[0]}"
    return rates, skipped


# --- what calibrate measures -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvProblem:
    """One convolution calibrate times: ``[batch, c_in, *spatial]`` through a ``kernel`` with ``stride``,
    ``padding`` and ``groups``, transposed or not, in ``dtype``."""

    detail: str
    dtype: str
    batch: int
    c_in: int
    c_out: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: int
    padding: tuple[int, ...]
    groups: int
    transposed: bool


#: Channels per group a sampled convolution draws from: image inputs (3, 4), the widths of common CNNs (ResNet's
#: 64-2048, Inception's 96-832) and KernelBench's small ones.
IN_CHANNELS = (3, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048)
OUT_CHANNELS = (8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048)
GROUP_CHANNELS = (2, 4, 8, 16, 32, 64, 128)
#: Share of sampled convolutions drawn as a network's layer (square kernel, "same" padding, a feature-map side of
#: :data:`FEATURE_MAP_SIDES`, the batch from the FLOP target); the rest draw free kernels, paddings and sizes.
#: Drawn freely, a wide layer came out at 4 x 4 to 8 x 8 positions with a 7 x 3 kernel and no padding, where
#: cuDNN runs 10-50x below the rate of the same layer in a ResNet.
NETWORK_SHARE = 0.5
#: Feature-map sides of a network-like sample by spatial rank (CNN stages; a 1-D signal's length).
FEATURE_MAP_SIDES = {1: (256, 1024, 4096, 16384), 2: (7, 14, 28, 56, 112, 224), 3: (8, 16, 32, 64)}
#: Share of sampled 2-D convolutions drawn as a late CNN stage's layer: a 7 x 7 or 14 x 14 feature map, hundreds to
#: thousands of input channels, few output channels (DenseNet's 3 x 3 growth layers: 32; ResNet's and DenseNet's 1 x
#: 1 bottlenecks: 64-256), a batch of 1-64. cuDNN splits such a deep K over the SMs; drawn as a network layer above,
#: where channels and side are drawn apart, a table of 200 held a handful of them, and the fitted surface priced
#: DenseNet-201's (10, 1408, 7, 7) x (32, 1408, 3, 3) at 88 us where it ran 23 (reprofile/README.md, session 20).
LATE_STAGE_SHARE = 0.25
LATE_STAGE_OUT_CHANNELS = (32, 32, 48, 64, 128, 128, 192, 256)


def _problem(rng: random.Random, detail: str, dtype: str, max_elems: int,
             flop_range: tuple[float, float]) -> ConvProblem:
    d = int(detail[4])
    transposed = "transpose" in detail
    if detail == "conv2d" and rng.random() < LATE_STAGE_SHARE:
        return _late_stage_problem(rng, dtype, max_elems)
    if detail.endswith("depthwise"):
        c_in = c_out = groups = rng.choice((32, 64, 96, 128, 192, 256, 384, 512, 768, 1024))
        kernel = tuple(rng.choice((3, 3, 5, 7)) for _ in range(d))
    else:
        groups = rng.choice((2, 3, 4, 8)) if detail.endswith("grouped") else 1
        per_in = rng.choice(GROUP_CHANNELS if groups > 1 else IN_CHANNELS)
        per_out = rng.choice(GROUP_CHANNELS[1:] if groups > 1 else OUT_CHANNELS)
        c_in, c_out = per_in * groups, per_out * groups
        sizes = (2, 3, 3, 4, 5) if transposed else ((1, 3, 3, 5) if d == 3 else (1, 3, 3, 3, 5, 7))
        if rng.random() < 0.3:  # a square kernel
            kernel = (rng.choice(sizes),) * d
        else:
            kernel = tuple(rng.choice(sizes) for _ in range(d))
    # "same" padding or none. A transposed convolution is drawn with stride 2 two times in three, and padded (k // 2)
    # only with a stride, half the time: KernelBench's level-2 ConvTranspose3d layers and decoders' upsamplings are
    # stride 2, padding 1, kernel 3, their output about twice their input, where the table without such samples
    # priced 8 of them 1.27x over on the H200 (the H100 table with them still prices its transposed convolutions
    # 1.15-1.46x over: benchmarks/results/h100/accuracy/calibrate/); unstrided, padding would leave the output no
    # larger than the input, and the op graph tells a transposed convolution by its larger output
    stride = rng.choice((1, 2, 2)) if transposed else rng.choice((1, 1, 1, 2))
    padded = rng.random() < 0.5 and (stride > 1 or not transposed)
    padding = tuple(k // 2 for k in kernel) if padded else (0,) * d
    # a target FLOP count, log-uniform over flop_range
    target = math.exp(rng.uniform(math.log(flop_range[0]), math.log(flop_range[1])))
    # FLOPs per input position (transposed) or per output position: 2 x C_in/g x C_out x kernel volume
    per_position = 2 * (c_in // groups) * c_out * _prod(kernel)
    if rng.random() < NETWORK_SHARE:  # as a network's layer: square kernel, same padding, a feature-map size
        if not detail.endswith("depthwise"):
            sizes = (2, 3, 4, 4) if transposed else ((1, 1, 3, 3, 5, 7) if d < 3 else (1, 3, 3, 5))
            kernel = (rng.choice(sizes),) * d
            per_position = 2 * (c_in // groups) * c_out * _prod(kernel)
        padding = tuple(k // 2 for k in kernel) if padded or not transposed else (0,) * d
        side = rng.choice(FEATURE_MAP_SIDES[d])
        side = max(side, max(kernel) + 1)
        batch = min(max(int(round(target / (per_position * (side / (1 if transposed else stride)) ** d))), 1), 256)
    else:  # the spatial size from the FLOP target at a drawn batch
        batch = rng.choice((1, 4, 8, 16, 32, 64, 128))
        positions = max(target / (batch * per_position), 1.0)
        side = int(round(positions ** (1.0 / d) * (1 if transposed else stride)))
        side = min(max(side, max(kernel) + 1), {1: 1 << 16, 2: 1024, 3: 192}[d])

    def elems(batch: int, side: int) -> int:  # the larger of input and output
        out_side = side * stride if transposed else side // stride
        return batch * max(c_in * side ** d, c_out * out_side ** d)

    while batch > 1 and elems(batch, side) > max_elems:
        batch //= 2
    while side > max(kernel) + 1 and elems(batch, side) > max_elems:
        side = max(side * 3 // 4, max(kernel) + 1)
    return ConvProblem(detail, dtype, batch, c_in, c_out, (side,) * d, kernel, stride, padding, groups, transposed)


def _late_stage_problem(rng: random.Random, dtype: str, max_elems: int) -> ConvProblem:
    """A 2-D convolution as a late CNN stage runs it (:data:`LATE_STAGE_SHARE`): a 1 x 1 or 3 x 3 kernel with
    "same" padding over a 7 x 7 or 14 x 14 map, 256-2048 input channels (any multiple of 32, as a dense block's
    concatenations make them), :data:`LATE_STAGE_OUT_CHANNELS` out, a batch of 1-64 (fewer where the input would
    pass ``max_elems``)."""
    side = rng.choice((7, 14))
    k = rng.choice((1, 3, 3))
    c_in, c_out = 32 * rng.randint(8, 64), rng.choice(LATE_STAGE_OUT_CHANNELS)
    batch = rng.choice((1, 2, 4, 8, 10, 16, 32, 64))
    while batch > 1 and batch * c_in * side * side > max_elems:
        batch //= 2
    return ConvProblem("conv2d", dtype, batch, c_in, c_out, (side, side), (k, k), 1, (k // 2, k // 2), 1, False)


#: FLOPs per sampled convolution on a GPU (log-uniform between): KernelBench's run 0.1 to 400 GFLOP, a ResNet's
#: or an Inception's layers 0.03 to 7 (batch 10); a table sampled at 0.3-30 GFLOP put the large level-1
#: convolutions at a third of their measured rate.
GPU_FLOP_RANGE = (1e7, 2e11)


#: Share of :func:`sample_plan`'s per-dtype count each class gets: the common 2-D convolution the most.
CLASS_SHARE = {"conv1d": 0.25, "conv2d": 1.0, "conv3d": 0.5, "conv2d_transpose": 0.5, "conv3d_transpose": 0.5,
               "conv2d_grouped": 0.375, "conv2d_depthwise": 0.25, "conv2d_transpose_grouped": 0.25,
               "conv3d_transpose_grouped": 0.25}
#: Most FLOPs a sampled convolution of these classes is drawn with (the range's top otherwise): a grouped
#: transposed convolution runs at about 1 TFLOP/s in fp32 on the H200, so the range's 2e11 would take 0.2 s a call.
#: Capped, 50 of them cost calibrate about a second; 25 per draw left the H100 table's nearest entries to
#: KernelBench's level1_75 at half its channels per group (benchmarks/results/h100/accuracy/calibrate/).
CLASS_MAX_FLOPS = {"conv2d_transpose_grouped": 2e10, "conv3d_transpose_grouped": 2e10}


def problem_geometry(p: ConvProblem) -> ConvGeometry:
    """The :class:`ConvGeometry` of a problem from its shapes (output sizes by PyTorch's formulas, no tensors)."""
    if p.transposed:
        out = [(s - 1) * p.stride - 2 * q + k for s, k, q in zip(p.spatial, p.kernel, p.padding)]
        w = (p.c_in, p.c_out // p.groups, *p.kernel)
    else:
        out = [(s + 2 * q - k) // p.stride + 1 for s, k, q in zip(p.spatial, p.kernel, p.padding)]
        w = (p.c_out, p.c_in // p.groups, *p.kernel)
    geom = ConvGeometry.from_shapes((p.batch, p.c_in, *p.spatial), w, (p.batch, p.c_out, *out))
    assert geom is not None, p
    return geom


def sample_plan(per_class: dict[str, int], seed: int = 0, max_elems: int = 64 << 20,
                flop_range: tuple[float, float] = GPU_FLOP_RANGE) -> list[ConvProblem]:
    """The convolutions calibrate measures: seeded random problems of every class of :data:`CONV_CLASSES` per
    dtype, ``per_class[dtype]`` times the class's :data:`CLASS_SHARE` (at least 2), interleaved (class by class,
    then dtype) so that a time budget cut anywhere leaves every class sampled. Each has a FLOP count drawn
    log-uniformly from ``flop_range`` (its top lowered to the class's :data:`CLASS_MAX_FLOPS`), except the
    late-stage 2-D layers (:func:`_late_stage_problem`: their batch is drawn, and those over 4x the range's top
    redrawn); input and output tensors stay within ``max_elems`` elements each."""
    rng = random.Random(seed)
    by: list[list[ConvProblem]] = []
    for dtype, n in per_class.items():
        for detail in CONV_CLASSES:
            count = max(2, round(n * CLASS_SHARE[detail]))
            drawn: list[ConvProblem] = []
            for _ in range(20 * count):  # redraw the few whose smallest size still overshoots the range 4x
                if len(drawn) == count:
                    break
                top = min(flop_range[1], CLASS_MAX_FLOPS.get(detail, flop_range[1]))
                p = _problem(rng, detail, dtype, max_elems, (min(flop_range[0], top), top))
                if problem_geometry(p).flops <= 4 * top:
                    drawn.append(p)
            by.append(drawn)
    out = []
    for i in range(max((len(b) for b in by), default=0)):
        out.extend(b[i] for b in by if i < len(b))
    return out


def measure_conv_rates(device: str, problems: Sequence[ConvProblem], timer: Callable[[Callable[[], Any]], Any],
                       budget_s: float, dtypes: dict[str, Any]) -> tuple[list[ConvRate], dict[str, str]]:
    """Time each of ``problems`` (``torch.nn.functional.conv{d}d`` or ``conv_transpose{d}d``, no bias, with PyTorch's
    default cuDNN settings: TF32 on for fp32, ``cudnn.benchmark`` as the caller has it) with ``timer`` (a call ->
    an object with ``median_ms``, and ``kernels_per_call`` where the timer counts device activities) until ``budget_s`` seconds have passed; returns the measured rates and, per
    problem that failed or was left out, why."""
    import time

    import torch
    import torch.nn.functional as F

    rates: list[ConvRate] = []
    skipped: dict[str, str] = {}
    failed: list[str] = []
    start = time.perf_counter()
    for i, p in enumerate(problems):
        if time.perf_counter() - start > budget_s:
            skipped["conv_rates"] = f"{len(problems) - i} of {len(problems)} convolutions left out: the {budget_s:g} s budget"
            break
        d = len(p.spatial)
        dt = dtypes[p.dtype]
        try:
            x = torch.randn(p.batch, p.c_in, *p.spatial, device=device, dtype=dt)
            if p.transposed:
                w = torch.randn(p.c_in, p.c_out // p.groups, *p.kernel, device=device, dtype=dt)
                fn = getattr(F, f"conv_transpose{d}d")
            else:
                w = torch.randn(p.c_out, p.c_in // p.groups, *p.kernel, device=device, dtype=dt)
                fn = getattr(F, f"conv{d}d")
            call = lambda x=x, w=w, fn=fn, p=p: fn(x, w, stride=p.stride, padding=p.padding, groups=p.groups)
            y = call()
            geom = ConvGeometry.from_shapes(tuple(x.shape), tuple(w.shape), tuple(y.shape))
            if geom is None or geom.detail != p.detail:
                failed.append(f"{p.detail} measured as {geom.detail if geom else 'nothing'}")
                continue
            del y
            timing = timer(call)
            ms = timing.median_ms
        except (RuntimeError, ValueError) as e:  # an unsupported geometry, out of memory
            failed.append(f"{p.detail} {p.dtype}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        finally:
            x = w = None  # noqa: F841 (free before the next problem)
        rates.append(ConvRate(p.detail, p.dtype, geom.c_in_per_group, geom.c_out_per_group, geom.kernel_volume,
                              geom.stride, geom.flops / 1e9, geom.flops / (ms * 1e-3) / 1e12, "nchw",
                              geom.elements * float_dtype(p.dtype).itemsize / 1e6,
                              float(getattr(timing, "kernels_per_call", None) or 0.0)))
    if failed:
        skipped["conv_rates failed"] = f"{len(failed)} convolution(s) not measured, e.g. {failed[0]}"
    return rates, skipped


# --- calibrate's sample sizes -------------------------------------------------------------------------------

#: Convolutions sampled per class of :data:`fusion_advisor.devices.op_rates.CONV_CLASSES` and dtype, and the time
#: budget (s) of the whole sample (checked between convolutions), by device and ``quick``. fp32 carries KernelBench
#: and most CNNs.
CONV_SAMPLES = {"cuda": ({"fp32": 200, "bf16": 40}, 20.0), "cuda-quick": ({"fp32": 24}, 6.0),
                "cpu": ({"fp32": 8}, 10.0), "cpu-quick": ({"fp32": 4}, 3.0)}
#: Timer budgets (ms) of one sampled convolution or matmul on a CPU (on a GPU both are timed by their kernels:
#: :data:`TABLE_KERNEL_CALLS`): hundreds are timed within the budget, each a median of a few calls.
TABLE_WARMUP_MS, TABLE_REP_MS = 2.0, 8.0
#: Profiled calls per sampled convolution or matmul on a GPU (:func:`fusion_advisor.kernel_tools.bench.device_time_ms`: the
#: summed durations of its kernels, L2 warm, as ``analyze --profile`` measures an op inside a model). Fitted through
#: the probe's 1214 convolutions timed by do_bench with L2 flushed, the level-3 models' 216 convolutions (ResNet-101,
#: GoogLeNet, ShuffleNet at batch 10: inputs of 1-48 MB, L2-resident after the op before) came out at a median
#: 1.58x their measured time; timed by their kernels, 1.08x (benchmarks/accuracy/conv_rate_probe.py).
TABLE_KERNEL_CALLS = 3
#: Elements of the larger of a sampled convolution's input and output on a GPU (512 MiB in fp32): KernelBench's
#: level-1 convolutions write outputs of over 100 M elements, and the largest run at several times the rate of
#: small ones.
GPU_MAX_ELEMS = 128 << 20
#: FLOPs per sampled convolution on a CPU (log-uniform between): a CPU runs them at well under a TFLOP/s.
CPU_CONV_FLOP_RANGE = (1e7, 1e9)


def measure_convolutions(device: str, quick: bool, timer: Callable[[Callable[[], Any]], Any],
                         dtypes: dict[str, Any]) -> tuple[list[ConvRate], dict[str, str]]:
    """The spec's ``conv_rates``: :data:`CONV_SAMPLES` convolutions of :func:`sample_plan` timed by
    :func:`measure_conv_rates`, with PyTorch's default cuDNN settings (TF32 on for convolutions,
    ``cudnn.benchmark`` off) set for the measurement and restored after it. ``timer``: calibrate's, on a GPU the
    summed durations of each one's kernels (:data:`TABLE_KERNEL_CALLS` profiled calls)."""
    per_class, budget = CONV_SAMPLES[device + ("-quick" if quick else "")]
    plan = (sample_plan(per_class, max_elems=GPU_MAX_ELEMS) if device == "cuda"
            else sample_plan(per_class, max_elems=4 << 20, flop_range=CPU_CONV_FLOP_RANGE))
    import torch

    cudnn = torch.backends.cudnn
    saved = (cudnn.allow_tf32, cudnn.benchmark)
    cudnn.allow_tf32, cudnn.benchmark = True, False
    try:
        return measure_conv_rates(device, plan, timer, budget, dtypes)
    finally:
        cudnn.allow_tf32, cudnn.benchmark = saved


#: FLOPs per sampled matmul on a GPU (log-uniform between): KernelBench's fp32 GEMMs run 0.05-0.55 TFLOP per call
#: (a 16384 x 4096 x 4096 addmm: 10.8 ms on the H200), a CNN's classifier head a few MFLOP (10 x 1920 x 1000); a
#: table that kept to 0.1-200 GFLOP and 64 M elements per operand priced both from neighbours 4-6 log2 units away.
#: From 0.1 MFLOP: a classifier head of 10 outputs (DenseNet-201's 10 x 1920 x 10: 0.38 MFLOP, 20 us on the H200).
GPU_MATMUL_FLOP_RANGE = (1e5, 1e12)
#: Matmuls sampled per class of :data:`fusion_advisor.devices.op_rates.MATMUL_CLASSES` and dtype, and the time
#: budget (s), by device and ``quick``; half of each in either layout (:data:`MATMUL_LAYOUTS`). On the H200 the
#: convolutions and these 224 matmuls took 16.4 s together, of a 56 s calibrate (session 29,
#: benchmarks/results/h200/accuracy/matmul_layouts; 9.5 s before the grouped transposed classes and the nt half).
MATMUL_SAMPLES = {"cuda": ({"fp32": 96, "bf16": 16}, 10.0), "cuda-quick": ({"fp32": 6}, 3.0),
                  "cpu": ({"fp32": 4}, 5.0), "cpu-quick": ({"fp32": 2}, 2.0)}


def measure_matmuls(device: str, quick: bool, timer: Callable[[Callable[[], Any]], Any],
                    dtypes: dict[str, Any]) -> tuple[list[MatmulRate], dict[str, str]]:
    """The spec's ``matmul_rates``: :data:`MATMUL_SAMPLES` matmuls of :func:`matmul_plan` timed by
    :func:`measure_matmul_rates` (fp32 with TF32 off, PyTorch's default)."""
    per_class, budget = MATMUL_SAMPLES[device + ("-quick" if quick else "")]
    plan = (matmul_plan(per_class, max_elems=GPU_MAX_ELEMS, flop_range=GPU_MATMUL_FLOP_RANGE) if device == "cuda"
            else matmul_plan(per_class, max_elems=4 << 20, flop_range=(1e7, 2e9)))
    return measure_matmul_rates(device, plan, timer, budget, dtypes)


# --- recurrent layers ---------------------------------------------------------------------------------------------


#: The recurrent layer stack calibrate times per cell: ``(input size, hidden size, layers, sequence length,
#: batch)``. Small enough that every cell step is latency-bound (KernelBench's LSTM/GRU files: hidden 256,
#: batch 10, 6 layers of 512 steps), so the time per step is what a recurrence of that kind costs at any length.
RECURRENT_PROBE = (128, 256, 2, 128, 10)
#: The probe's sequence length under ``--quick`` and on a CPU.
RECURRENT_PROBE_SEQ_QUICK = 16


def recurrent_probe(device: str, quick: bool) -> tuple[int, int, int, int, int]:
    """The ``(input, hidden, layers, sequence, batch)`` calibrate times: :data:`RECURRENT_PROBE`, with
    :data:`RECURRENT_PROBE_SEQ_QUICK` steps under ``quick`` or on a CPU."""
    size, hidden, layers, seq, batch = RECURRENT_PROBE
    return size, hidden, layers, RECURRENT_PROBE_SEQ_QUICK if quick or device != "cuda" else seq, batch


def measure_recurrent_steps(device: str, quick: bool, timer: Callable[[Callable[[], Any]], Any]
                            ) -> tuple[dict[str, float], dict[str, str]]:
    """The spec's ``recurrent_step_us``: device time per cell step (us) of ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN``
    (tanh, relu) at :data:`RECURRENT_PROBE` in fp32 (cuDNN on a GPU, TF32 as PyTorch's default allows), forward
    without grad: the call's time by ``timer`` (calibrate's, on a GPU the summed durations of its kernels) over its
    ``layers * sequence`` steps. Returns the steps and, per cell that failed, why."""
    import torch

    size, hidden, layers, seq, batch = recurrent_probe(device, quick)
    cells = {"lstm": (torch.nn.LSTM, {}), "gru": (torch.nn.GRU, {}), "rnn_tanh": (torch.nn.RNN, {}),
             "rnn_relu": (torch.nn.RNN, {"nonlinearity": "relu"})}
    out: dict[str, float] = {}
    failed: dict[str, str] = {}
    x = torch.randn(seq, batch, size, device=device)
    for cell, (cls, kw) in cells.items():
        try:
            layer = cls(size, hidden, layers, **kw).to(device)
            with torch.no_grad():
                ms = timer(lambda layer=layer: layer(x)).median_ms
            out[cell] = _sig(ms * 1e3 / (layers * seq))
        except (RuntimeError, ValueError) as e:
            failed[f"recurrent_step_us {cell}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return out, failed
