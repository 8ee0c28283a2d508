"""Measured convolution and matmul rates as a function of shape: what ``calibrate`` samples, how the roofline reads them.

One peak per dtype prices cuDNN convolutions badly: on an H200 in fp32 (TF32 on, PyTorch's default) KernelBench's
convolutions ran at 1.1x to 75x their tensor-core roofline time (``analyze --profile`` of 38 files,
benchmarks/results/h200/accuracy/fit_kernelbench). The rate depends on the implicit GEMM's shape: few input or
output channels per group leave tensor-core tiles empty (cuDNN then picks CUDA-core kernels), large kernels and
strides change the algorithm, transposed convolutions run as data-gradient kernels, small problems do not fill the
GPU. So ``calibrate`` measures a seeded sample of convolutions of every geometry class (:func:`sample_plan`) and
the spec keeps each one's achieved TFLOP/s and bytes moved (:class:`ConvRate`). An op's time comes from the
measured convolutions of its class, dtype and layout (:func:`conv_time_us`): a roofline fitted through them
(:class:`ConvTimeModel`: a peak derated by how full the implicit GEMM's tiles are in N, K and M x N, a bandwidth
term and a fixed cost per call) where the class has :data:`MODEL_MIN_SAMPLES` or more, else the rate of its
:data:`NEIGHBOURS` nearest. FLOPs are ``torch.utils.flop_counter``'s convolution count, as the op graph counts them.

Matmuls the same way (:class:`MatmulRate`: ``torch.mm`` / ``torch.bmm`` at seeded sizes, features log2 M, N, K,
batch and whether K and N are 16-byte aligned): cuBLAS's fp32 SGEMM (TF32 off, PyTorch's default) ran KernelBench's
matmuls at 1.3x to 14.8x their roofline time (median 1.9x, 61 ops of the same 38 files), by shape.
"""

from __future__ import annotations

import functools
import math
import random
import re
import statistics
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Sequence

#: Geometry classes (``conv_detail``) calibrate samples.
CONV_CLASSES = ("conv1d", "conv2d", "conv3d", "conv2d_transpose", "conv3d_transpose", "conv2d_grouped",
                "conv2d_depthwise")
#: Measured convolutions an op's rate is interpolated from.
NEIGHBOURS = 3
#: Weight of each feature in the distance (log2 units): channels, kernel volume and stride decide the algorithm;
#: size mostly decides occupancy, which levels off above a few GFLOP.
FEATURE_WEIGHTS = (1.0, 1.0, 1.0, 1.0, 0.5)
#: Memory layouts of the measured convolutions: contiguous, and channels-last (2-D and 3-D classes only).
LAYOUTS = ("nchw", "nhwc")
#: dtypes whose table stands in for another's (fp16 runs on the same tensor cores as bf16).
DTYPE_FALLBACK = {"fp16": "bf16"}


#: dtypes a table entry may name (the op graph's names, :mod:`fusion_advisor.dtypes`).
RATE_DTYPES = ("fp32", "bf16", "fp16", "fp64")
_CONV_DETAIL = re.compile(r"conv[123]d(_transpose|_grouped|_depthwise)?")
_ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8}


def _sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant figures (a slow CPU convolution at 0.0004 TFLOP/s must not round to 0)."""
    return float(f"{x:.{digits}g}")


def _field(d: dict[str, Any], key: str, kind: type, positive: bool = True) -> Any:
    """``d[key]`` as a finite number of ``kind`` (``int``: no fraction), above 0 when ``positive``; booleans and
    strings refused. Raises KeyError (missing) or ValueError (anything else)."""
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{key} must be a finite number, got {v!r}")
    if kind is int and v != int(v):
        raise ValueError(f"{key} must be a whole number, got {v!r}")
    if positive and v <= 0:
        raise ValueError(f"{key} must be positive, got {v!r}")
    return kind(v)


def _entry(d: Any, cls: type) -> dict[str, Any]:
    """``d`` as a mapping with no key ``cls`` does not have; ValueError otherwise."""
    if not isinstance(d, dict):
        raise ValueError(f"an entry is a mapping, got {type(d).__name__}")
    unknown = sorted(set(map(str, d)) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}")
    return d


def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


@dataclass(frozen=True)
class ConvGeometry:
    """Shape facts of one convolution, from its input ``[N, C_in, *spatial]``, weight and output shapes.

    Attributes:
        detail: ``conv<d>d`` plus ``_transpose`` (more output than input positions), ``_depthwise`` (one input
            channel per group) or ``_grouped`` (groups > 1 otherwise).
        c_in_per_group, c_out_per_group: channels per group.
        kernel_volume: product of the kernel's spatial extents.
        stride: input positions per output position (transposed: output per input), >= 1 in effect.
        flops: ``torch.utils.flop_counter``'s count (a multiply-add counts 2).
        elements: elements of input, weight and output together (the bytes moved over the dtype's item size).
    """

    detail: str
    c_in_per_group: int
    c_out_per_group: int
    kernel_volume: int
    stride: float
    flops: int
    elements: int = 0

    @classmethod
    def from_shapes(cls, x: Sequence[int], w: Sequence[int], y: Sequence[int]) -> "ConvGeometry | None":
        """The geometry of a convolution with input ``x``, weight ``w`` and output ``y`` shapes; None when the
        shapes are not those of one (ranks differ, fewer than 3 dims, empty)."""
        if len(x) < 3 or len(w) != len(x) or len(y) != len(x) or min(list(x) + list(w) + list(y)) <= 0:
            return None
        from torch.utils.flop_counter import conv_flop_count

        in_sp, out_sp = _prod(x[2:]), _prod(y[2:])
        transposed = out_sp > in_sp
        d = len(x) - 2
        if transposed:  # weight [C_in, C_out / groups, *k]
            groups = max(int(y[1]) // max(int(w[1]), 1), 1)
            c_in_g, c_out_g = int(x[1]) // groups, int(w[1])
        else:  # weight [C_out, C_in / groups, *k]
            groups = max(int(x[1]) // max(int(w[1]), 1), 1)
            c_in_g, c_out_g = int(w[1]), int(w[0]) // groups
        detail = f"conv{d}d" + ("_transpose" if transposed else "")
        if not transposed and groups > 1:
            detail += "_depthwise" if c_in_g == 1 else "_grouped"
        stride = (out_sp / in_sp) if transposed else (in_sp / out_sp)
        flops = int(conv_flop_count(list(x), list(w), list(y), transposed=transposed))
        return cls(detail, c_in_g, c_out_g, _prod(w[2:]), max(stride, 1.0), flops, _prod(x) + _prod(w) + _prod(y))

    def features(self) -> tuple[float, float, float, float, float]:
        """log2 of (input channels per group, output channels per group, kernel volume, stride, GFLOP)."""
        return (math.log2(max(self.c_in_per_group, 1)), math.log2(max(self.c_out_per_group, 1)),
                math.log2(max(self.kernel_volume, 1)), math.log2(max(self.stride, 1.0)),
                math.log2(max(self.flops, 1) / 1e9))


@dataclass(frozen=True)
class ConvRate:
    """One measured convolution: its class, dtype, geometry features, achieved TFLOP/s and bytes moved.

    Attributes:
        detail: :attr:`ConvGeometry.detail`.
        dtype: ``fp32``, ``bf16`` or ``fp16`` (fp32 measured with PyTorch's default TF32 settings: cuDNN's on).
        c_in, c_out: channels per group; kernel: kernel volume; stride: as :attr:`ConvGeometry.stride`.
        gflop: FLOPs of the call / 1e9.
        tflops: FLOPs over the measured device time (TFLOP/s).
        layout: ``"nchw"`` (contiguous, how eager PyTorch runs a model as written: what the roofline prices) or
            ``"nhwc"`` (input and weight channels-last; tables of 2026-11 measured both, nothing prices them).
        mbytes: MB (1e6 bytes) of input, weight and output; 0 in tables measured before it was recorded (then
            estimated from the other fields, one group assumed: :meth:`nbytes`).
        kernels: device activities (kernels, memsets, copies) one call issues, as the profiler counted them: cuDNN
            adds layout transforms and workspace memsets around the convolution's own kernel, and each costs the
            host a launch (:func:`conv_kernels`); 0 in tables measured before it was recorded.
    """

    detail: str
    dtype: str
    c_in: int
    c_out: int
    kernel: int
    stride: float
    gflop: float
    tflops: float
    layout: str = "nchw"
    mbytes: float = 0.0
    kernels: float = 0.0

    def features(self) -> tuple[float, float, float, float, float]:
        return (math.log2(max(self.c_in, 1)), math.log2(max(self.c_out, 1)), math.log2(max(self.kernel, 1)),
                math.log2(max(self.stride, 1.0)), math.log2(max(self.gflop, 1e-9)))

    def time_us(self) -> float:
        """The measured device time of the call (us)."""
        return self.gflop * 1e9 / (self.tflops * 1e12) * 1e6

    def nbytes(self) -> float:
        """Bytes of input, weight and output: :attr:`mbytes`, or for older tables an estimate from the implicit
        GEMM (output ``M x N``, input ``M x stride x C_in``, transposed the other way round, weight ``N x K``)."""
        if self.mbytes > 0:
            return self.mbytes * 1e6
        n, k = self.c_out, self.c_in * self.kernel
        m = self.gflop * 1e9 / (2 * n * k)
        per_in, per_out = (1.0, self.stride) if "transpose" in self.detail else (self.stride, 1.0)
        return (m * per_in * self.c_in + m * per_out * n + n * k) * _ITEMSIZE.get(self.dtype, 4)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ConvRate":
        """An entry of a spec's ``conv_rates`` (this class's fields as keys).

        Raises:
            KeyError, ValueError, TypeError: a missing or malformed field, or a rate or size not above zero (the
                spec loader names the file and the entry).
        """
        d = _entry(d, cls)
        rate = cls(str(d["detail"]), str(d["dtype"]), _field(d, "c_in", int), _field(d, "c_out", int),
                   _field(d, "kernel", int), _field(d, "stride", float), _field(d, "gflop", float),
                   _field(d, "tflops", float), str(d.get("layout", "nchw")),
                   _field(d, "mbytes", float, positive=False) if "mbytes" in d else 0.0,
                   _field(d, "kernels", float, positive=False) if "kernels" in d else 0.0)
        if not _CONV_DETAIL.fullmatch(rate.detail):
            raise ValueError(f"detail {rate.detail!r} is not a convolution class (conv2d, conv3d_transpose, ...)")
        if rate.dtype not in RATE_DTYPES:
            raise ValueError(f"dtype {rate.dtype!r} is not one of {', '.join(RATE_DTYPES)}")
        if rate.layout not in LAYOUTS:
            raise ValueError(f"layout {rate.layout!r} is not one of {', '.join(LAYOUTS)}")
        if rate.stride < 1:
            raise ValueError(f"stride must be at least 1, got {rate.stride!r}")
        if rate.mbytes < 0:
            raise ValueError(f"mbytes must be 0 (not recorded) or positive, got {rate.mbytes!r}")
        if rate.kernels < 0:
            raise ValueError(f"kernels must be 0 (not recorded) or positive, got {rate.kernels!r}")
        return rate

    def rounded(self) -> "ConvRate":
        """This entry with its floats to 4 significant figures for a spec file."""
        return ConvRate(self.detail, self.dtype, self.c_in, self.c_out, self.kernel, _sig(self.stride),
                        _sig(self.gflop), _sig(self.tflops), self.layout, _sig(self.mbytes) if self.mbytes else 0.0,
                        round(self.kernels, 2))


def _by_distance(points: Iterable[tuple[Sequence[float], float]], features: Sequence[float],
                 weights: Sequence[float]) -> list[tuple[float, float]]:
    """``(distance, value)`` of each ``(features, value)`` point from ``features``, nearest first (distances
    scaled by ``weights``)."""
    return sorted((math.sqrt(sum((w * (a - b)) ** 2 for w, a, b in zip(weights, features, f))), v)
                  for f, v in points)


def _nearest_tflops(pool: Sequence[Any], features: Sequence[float], weights: Sequence[float]) -> float:
    """Inverse-distance weighted geometric mean of the ``tflops`` of the :data:`NEIGHBOURS` entries of ``pool``
    nearest ``features`` (each entry's ``features()``, distances scaled by ``weights``)."""
    near = _by_distance(((r.features(), r.tflops) for r in pool), features, weights)[:NEIGHBOURS]
    inv = [1.0 / (d + 0.25) for d, _ in near]
    return math.exp(sum(w * math.log(t) for w, (_, t) in zip(inv, near)) / sum(inv))


#: Convolution classes calibrate does not sample, priced from the class cuDNN runs them as: PyTorch views a 1-D
#: convolution as a 2-D one of height 1 before it calls cuDNN (``ConvParams::view1d_as_2d`` in
#: aten/src/ATen/native/Convolution.cpp), so a grouped, depthwise or transposed ``conv1d`` is that ``conv2d``.
#: SwinMLP's spatial MLP (a grouped 1x1 Conv1d, 49 channels per group) ran 27-64 us of kernels per call on the H200
#: where the roofline without a measured class gave 5-7 us; the conv2d_grouped fit gives 1.4x the measured time.
CONV_CLASS_FALLBACK = {"conv1d_grouped": "conv2d_grouped", "conv1d_depthwise": "conv2d_depthwise",
                       "conv1d_transpose": "conv2d_transpose"}


def _pool(rates: Sequence[Any], detail: str, dtype: str, layout: str = "") -> list[Any]:
    """The entries of ``rates`` of class ``detail`` and ``dtype`` (:data:`DTYPE_FALLBACK`'s when it has none), of
    ``layout`` when given; a class with none takes its :data:`CONV_CLASS_FALLBACK` class's."""
    def of(det: str) -> list[Any]:
        for dt in (dtype, DTYPE_FALLBACK.get(dtype)):
            pool = [r for r in rates if r.detail == det and r.dtype == dt and (not layout or r.layout == layout)]
            if pool:
                return pool
        return []

    return of(detail) or (of(CONV_CLASS_FALLBACK[detail]) if detail in CONV_CLASS_FALLBACK else [])


#: Fewest measured convolutions of one class, dtype and layout before their time is a fitted
#: :class:`ConvTimeModel` rather than the nearest neighbours' rate (the model has 6 or 7 parameters).
MODEL_MIN_SAMPLES = 12
#: Fewest measured convolutions with unaligned input channels, and with aligned ones, in one pool before the model
#: fits the unaligned slowdown (:attr:`ConvTimeModel.unaligned_factor`); with fewer it is left at 0.
MIN_UNALIGNED_SAMPLES = 4


def channels_unaligned(c_in_per_group: int, dtype: str) -> bool:
    """Whether a convolution's input channels per group are not a multiple of 16 bytes of ``dtype`` (4 fp32, 8
    bf16/fp16 channels): cuDNN then cannot use its vectorised channel loads, and a 3-channel stem runs at 14-25
    TFLOP/s where its aligned neighbours run at 90-220 (the H200 profiles of KernelBench's convolution files,
    benchmarks/results/h200/accuracy/reprofile/). Depthwise convolutions (one channel per group) are their own class."""
    return c_in_per_group % max(16 // _ITEMSIZE.get(dtype, 4), 1) != 0


@dataclass(frozen=True)
class ConvTimeModel:
    """A roofline fitted through the measured convolutions of one class, dtype and layout.

    A convolution is an implicit GEMM of ``M x N x K`` per group (``N`` output channels per group, ``K`` input
    channels per group times the kernel volume, ``M`` output positions, or input positions for a transposed one,
    times the batch and the groups; ``2 M N K = FLOPs``). Its device time (us)::

        t = FLOPs / (peak * N / (N + n_half) * K / (K + k_half) * MN / (MN + mn_half)) + bytes / bandwidth + fixed

    Each factor is the share of a tensor-core tile's work that is done: it is 1/2 where that dimension is its
    ``*_half`` and tends to 1 above it (few channels leave tiles empty, a small output does not fill the SMs);
    ``bytes`` is input, weight and output; ``fixed`` the per-call cost of cuDNN's kernels (2-5 of them per call).
    Fitted in log time with an L1 loss (:func:`fit_conv_model`): cuDNN's heuristics send some odd shapes to kernels
    10-50x slower than their neighbours', which a squared loss lets pull the whole surface. On the H200 probe's
    1214 convolutions (2026-12-02, benchmarks/results/h200/accuracy/cost_model/conv_probe.json), 5-fold
    cross-validation: median error 1.35x for fp32 2-D convolutions, 1.2x transposed 2-D, 1.12x depthwise, 1.6x 3-D;
    on the 257 convolutions inside the 70 profiled KernelBench files, 1.21x (the ridge surface it replaced: 1.75x).
    The unaligned-channel slowdown (session 15, on the shipped 810-convolution table): 5-fold cross-validation
    1.363x -> 1.358x; the 257 KernelBench convolutions of benchmarks/results/h200/accuracy/reprofile/ within 30% of
    their measured time 63.0% -> 65.8%; with the op-class curves refitted over it, seed-1 models within 25% 78.8% ->
    84.8% (that folder's README).

    A convolution whose input channels per group are unaligned (:func:`channels_unaligned`) has its rate divided by
    ``1 + unaligned_factor``, fitted where the pool holds :data:`MIN_UNALIGNED_SAMPLES` of each kind.

    Attributes:
        peak_tflops: TFLOP/s of a convolution with every dimension large.
        n_half, k_half, mn_half: the N, K and M x N at which the rate halves.
        gbps: GB/s of the bandwidth term.
        fixed_us: fixed time per call (us).
        unaligned_factor: the slowdown of unaligned input channels, less 1 (0: none fitted).
    """

    peak_tflops: float
    n_half: float
    k_half: float
    mn_half: float
    gbps: float
    fixed_us: float
    unaligned_factor: float = 0.0

    def time_us(self, flops: float, n: float, k: float, nbytes: float, unaligned: bool = False) -> float:
        """Device time (us) of a convolution of ``flops`` FLOPs, ``n`` output channels per group, ``k`` input
        channels per group times the kernel volume, moving ``nbytes`` bytes, its input channels ``unaligned`` or
        not."""
        return _conv_roofline_us(self.peak_tflops, self.n_half, self.k_half, self.mn_half, self.gbps, self.fixed_us,
                                 self.unaligned_factor, flops, n, max(k, 1.0), nbytes, float(unaligned))


def _conv_roofline_us(peak_tflops: Any, n_half: Any, k_half: Any, mn_half: Any, gbps: Any, fixed_us: Any,
                      unaligned_factor: Any, flops: Any, n: Any, k: Any, nbytes: Any, unaligned: Any) -> Any:
    """:class:`ConvTimeModel`'s formula (us), elementwise: on floats for one convolution, on numpy arrays for a
    fit over many (``unaligned`` 1.0 or 0.0)."""
    mn = flops / (2.0 * k)
    rate = peak_tflops * 1e12 * n / (n + n_half) * k / (k + k_half) * mn / (mn + mn_half)
    return flops / rate * (1.0 + unaligned_factor * unaligned) * 1e6 + nbytes / (gbps * 1e9) * 1e6 + fixed_us


# H200-scale start; the fit moves each by orders of magnitude (the unaligned factor starts at a 2x slowdown)
_MODEL_INIT = (200.0, 32.0, 64.0, 3e5, 3000.0, 5.0, 1.0)


@functools.lru_cache(maxsize=64)
def fit_conv_model(pool: tuple[ConvRate, ...], iters: int = 60) -> ConvTimeModel:
    """:class:`ConvTimeModel` through the measured convolutions ``pool`` (one class, dtype and layout), minimising
    the mean absolute log error of the time: Levenberg-Marquardt on the log parameters, iteratively reweighted
    (weights 1 / max(|residual|, 0.02)) for the L1 loss. Deterministic: a fixed start, a fixed number of steps.

    Raises:
        ValueError: ``pool`` is empty.
    """
    import numpy as np

    if not pool:
        raise ValueError("fit_conv_model needs at least one measured convolution")
    x = np.array([[r.gflop * 1e9, r.c_out, r.c_in * r.kernel, r.nbytes(), float(channels_unaligned(r.c_in, r.dtype))]
                  for r in pool], dtype=np.float64)
    y = np.log(np.array([r.time_us() for r in pool], dtype=np.float64))
    n_unaligned = int(x[:, 4].sum())
    fit_unaligned = min(n_unaligned, len(pool) - n_unaligned) >= MIN_UNALIGNED_SAMPLES
    theta, lam = np.log(np.array(_MODEL_INIT[:7 if fit_unaligned else 6])), 1e-2

    def params(t: Any) -> Any:
        return np.exp(t) if fit_unaligned else np.append(np.exp(t), 0.0)

    def residual(t: Any) -> Any:
        return np.log(_conv_roofline_us(*params(t), *x.T)) - y

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # trial steps may overflow: rejected
        for _ in range(iters):
            r = residual(theta)
            w = 1.0 / np.maximum(np.abs(r), 0.02)
            jac = np.empty((len(y), len(theta)))
            for j in range(len(theta)):
                step = np.zeros_like(theta)
                step[j] = 1e-5
                jac[:, j] = (residual(theta + step) - r) / 1e-5
            a, g, cost = jac.T @ (jac * w[:, None]), jac.T @ (w * r), float(np.sum(w * r * r))
            for _ in range(10):
                trial = np.clip(theta + np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-9), -g), -20.0, 30.0)
                trial_cost = float(np.sum(w * residual(trial) ** 2))
                if np.isfinite(trial_cost) and trial_cost < cost:
                    theta, lam = trial, max(lam / 3.0, 1e-6)
                    break
                lam *= 4.0
            if lam > 1e8:  # no step lowers the cost: converged
                break
    return ConvTimeModel(*(float(v) for v in params(theta)))


def conv_time_us(rates: Sequence[ConvRate], geom: ConvGeometry, dtype: str, layout: str = "nchw"
                 ) -> float | None:
    """Predicted device time (us) of ``geom`` in ``dtype`` and ``layout``, from the measured ``rates`` of its class,
    dtype (:data:`DTYPE_FALLBACK` when that dtype has none) and layout: the class's :class:`ConvTimeModel` where
    the table holds :data:`MODEL_MIN_SAMPLES` or more of them, else its FLOPs over the inverse-distance weighted
    rate of the :data:`NEIGHBOURS` nearest in :data:`FEATURE_WEIGHTS`-scaled feature space; None when the table
    has no such convolution."""
    pool = _pool(rates, geom.detail, dtype, layout)
    if not pool:
        return None
    if len(pool) < MODEL_MIN_SAMPLES:
        return geom.flops / (_nearest_tflops(pool, geom.features(), FEATURE_WEIGHTS) * 1e12) * 1e6
    model = fit_conv_model(tuple(pool))
    item = _ITEMSIZE.get(dtype, 4)
    return model.time_us(float(geom.flops), float(geom.c_out_per_group),
                         float(geom.c_in_per_group * geom.kernel_volume), float(geom.elements * item),
                         channels_unaligned(geom.c_in_per_group, dtype))


#: Measured convolutions whose activity counts :func:`conv_kernels` takes the median of.
KERNEL_NEIGHBOURS = 5

#: id(table) -> (table, its answers by (geometry, dtype, layout)): the analysis asks :func:`conv_kernels` several
#: times per convolution of a model, each a search of the whole table (810 entries in the shipped H200 spec, 1 ms
#: per question in Python: 0.43 s of a ResNet-101 analysis); the table is kept so its id is never reused.
_ANSWERS: dict[int, tuple[Sequence[ConvRate], dict[tuple[ConvGeometry, str, str], float | None]]] = {}


def conv_kernels(rates: Sequence[ConvRate], geom: ConvGeometry, dtype: str, layout: str = "nchw") -> float | None:
    """:func:`count_conv_kernels`, answered once per table, geometry, dtype and layout (``rates`` is read as it is
    at its first question: a spec's table is a tuple)."""
    entry = _ANSWERS.get(id(rates))
    if entry is None or entry[0] is not rates:
        if len(_ANSWERS) >= 16:
            _ANSWERS.clear()
        entry = _ANSWERS[id(rates)] = (rates, {})
    key = (geom, dtype, layout)
    if key not in entry[1]:
        entry[1][key] = count_conv_kernels(rates, geom, dtype, layout)
    return entry[1][key]


def count_conv_kernels(rates: Sequence[ConvRate], geom: ConvGeometry, dtype: str, layout: str = "nchw"
                       ) -> float | None:
    """Device activities (kernels, memsets, copies) one eager call of ``geom`` in ``dtype`` issues: the median
    count of the :data:`KERNEL_NEIGHBOURS` measured convolutions of its class, dtype and layout nearest it in
    :data:`FEATURE_WEIGHTS`-scaled feature space, among those whose count was recorded; None when there is none.

    cuDNN decides per geometry whether a call is one kernel (a GEMM over NCHW for most 1x1 convolutions) or
    several (NCHW -> NHWC transforms of the input and back for the output, a workspace memset, a split-K
    reduction): on the H200 the convolutions of ResNet-101, GoogLeNet, ShuffleNet and DenseNet-121 issued 1-12
    activities each, and their host time per call grew with them (benchmarks/results/h200/host/host_by_shape.json)."""
    pool = [(r.features(), r.kernels) for r in _pool(rates, geom.detail, dtype, layout) if r.kernels > 0]
    if not pool:
        return None
    near = _by_distance(pool, geom.features(), FEATURE_WEIGHTS)[:KERNEL_NEIGHBOURS]
    return float(statistics.median(k for _, k in near))


# --- matmuls -----------------------------------------------------------------------------------------------------

#: Matmul classes calibrate samples: ``mm`` (also prices ``addmm``: cuBLAS adds the bias in its epilogue) and
#: ``bmm``.
MATMUL_CLASSES = ("mm", "bmm")
#: Distance weights of :meth:`MatmulRate.features`: M, N, K, batch, alignment (an unaligned leading dimension
#: sends cuBLAS to its align1 kernels: a different regime, kept apart).
MATMUL_WEIGHTS = (1.0, 1.0, 1.0, 0.5, 3.0)
def matmul_aligned(n: int, k: int, dtype: str) -> bool:
    """Whether K and N are multiples of 16 bytes (cuBLAS's vectorised kernels need it)."""
    per = 16 // _ITEMSIZE.get(dtype, 4)
    return n % per == 0 and k % per == 0


@dataclass(frozen=True)
class MatmulRate:
    """One measured matmul ``[batch, M, K] x [batch, K, N]``: class, dtype, sizes, achieved TFLOP/s (fp32 with
    TF32 off, PyTorch's default for matmuls)."""

    detail: str
    dtype: str
    m: int
    n: int
    k: int
    batch: int
    tflops: float

    def features(self) -> tuple[float, float, float, float, float]:
        return matmul_features(self.m, self.n, self.k, self.batch, self.dtype)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MatmulRate":
        """An entry of a spec's ``matmul_rates``.

        Raises:
            KeyError, ValueError: a missing, unknown or malformed field (the spec loader names the file and entry).
        """
        d = _entry(d, cls)
        rate = cls(str(d["detail"]), str(d["dtype"]), _field(d, "m", int), _field(d, "n", int), _field(d, "k", int),
                   _field(d, "batch", int), _field(d, "tflops", float))
        if rate.detail not in MATMUL_CLASSES:
            raise ValueError(f"detail {rate.detail!r} is not one of {', '.join(MATMUL_CLASSES)}")
        if rate.dtype not in RATE_DTYPES:
            raise ValueError(f"dtype {rate.dtype!r} is not one of {', '.join(RATE_DTYPES)}")
        return rate

    def rounded(self) -> "MatmulRate":
        """This entry with its rate to 4 significant figures for a spec file."""
        return MatmulRate(self.detail, self.dtype, self.m, self.n, self.k, self.batch, _sig(self.tflops))


def matmul_features(m: int, n: int, k: int, batch: int, dtype: str) -> tuple[float, float, float, float, float]:
    """log2 of M, N, K and batch, and 1 when K and N are 16-byte aligned (:func:`matmul_aligned`) else 0."""
    return (math.log2(max(m, 1)), math.log2(max(n, 1)), math.log2(max(k, 1)), math.log2(max(batch, 1)),
            1.0 if matmul_aligned(n, k, dtype) else 0.0)


def matmul_tflops(rates: Sequence[MatmulRate], detail: str, m: int, n: int, k: int, batch: int, dtype: str
                  ) -> float | None:
    """The TFLOP/s a ``detail`` (``mm`` / ``bmm``) matmul of these sizes is predicted to run at (nearest measured
    neighbours, as :func:`conv_time_us` for a class with few measurements); None without a measured matmul of that class and dtype."""
    pool = _pool(rates, detail, dtype)
    return _nearest_tflops(pool, matmul_features(m, n, k, batch, dtype), MATMUL_WEIGHTS) if pool else None


def _dim(rng: random.Random, lo: int, hi: int) -> int:
    """A matmul dimension: half the time a multiple of 64 or a power of two (what models use), else any integer,
    log-uniform over [lo, hi]."""
    x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if rng.random() < 0.5:
        return max(lo, int(round(x / 64)) * 64) if x >= 64 else 1 << max(int(round(math.log2(x))), 0)
    return max(lo, int(round(x)))


def matmul_plan(per_class: dict[str, int], seed: int = 0, max_elems: int = 64 << 20,
                flop_range: tuple[float, float] = (1e8, 2e11)) -> list[tuple[str, str, int, int, int, int]]:
    """``per_class[dtype]`` seeded matmuls ``(detail, dtype, batch, M, N, K)`` per class of :data:`MATMUL_CLASSES`:
    sizes log-uniform (:func:`_dim`), each operand within ``max_elems`` elements, FLOPs within ``flop_range``."""
    rng = random.Random(seed + 1)
    out = []
    for dtype, n in per_class.items():
        for detail in MATMUL_CLASSES:
            got = 0
            while got < n:
                batch = 1 if detail == "mm" else rng.choice((2, 4, 8, 16, 32, 64, 128, 256))
                m, nn, k = _dim(rng, 16, 16384), _dim(rng, 16, 16384), _dim(rng, 16, 16384)
                flops = 2 * batch * m * nn * k
                if max(m * k, k * nn, m * nn) * batch > max_elems or not flop_range[0] <= flops <= flop_range[1]:
                    continue
                out.append((detail, dtype, batch, m, nn, k))
                got += 1
    return out


def measure_matmul_rates(device: str, plan: Sequence[tuple[str, str, int, int, int, int]],
                         timer: Callable[[Callable[[], Any]], Any], budget_s: float, dtypes: dict[str, Any]
                         ) -> tuple[list[MatmulRate], dict[str, str]]:
    """Time each matmul of ``plan`` (``torch.mm`` / ``torch.bmm``) with ``timer`` until ``budget_s`` seconds
    have passed, with PyTorch's default matmul precision (fp32 TF32 off) set for the measurement and restored."""
    import time

    import torch

    rates: list[MatmulRate] = []
    failed: list[str] = []
    skipped: dict[str, str] = {}
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.perf_counter()
    try:
        for i, (detail, dtype, batch, m, n, k) in enumerate(plan):
            if time.perf_counter() - start > budget_s:
                skipped["matmul_rates"] = f"{len(plan) - i} of {len(plan)} matmuls left out: the {budget_s:g} s budget"
                break
            dt = dtypes[dtype]
            try:
                if detail == "mm":
                    a, b = torch.randn(m, k, device=device, dtype=dt), torch.randn(k, n, device=device, dtype=dt)
                    ms = timer(lambda a=a, b=b: torch.mm(a, b)).median_ms
                else:
                    a = torch.randn(batch, m, k, device=device, dtype=dt)
                    b = torch.randn(batch, k, n, device=device, dtype=dt)
                    ms = timer(lambda a=a, b=b: torch.bmm(a, b)).median_ms
            except (RuntimeError, ValueError) as e:
                failed.append(f"{detail} {dtype} {batch}x{m}x{n}x{k}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
                continue
            finally:
                a = b = None  # noqa: F841
            rates.append(MatmulRate(detail, dtype, m, n, k, batch, 2 * batch * m * n * k / (ms * 1e-3) / 1e12))
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


def _problem(rng: random.Random, detail: str, dtype: str, max_elems: int,
             flop_range: tuple[float, float]) -> ConvProblem:
    d = int(detail[4])
    transposed = "transpose" in detail
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
    stride = rng.choice((1, 1, 1, 2))
    # "same" padding or none; a transposed convolution keeps none (with padding its output can be smaller than
    # its input, and the op graph tells a transposed convolution by its larger output)
    padding = tuple(k // 2 for k in kernel) if not transposed and rng.random() < 0.5 else (0,) * d
    # a target FLOP count, log-uniform over flop_range
    target = math.exp(rng.uniform(math.log(flop_range[0]), math.log(flop_range[1])))
    # FLOPs per input position (transposed) or per output position: 2 x C_in/g x C_out x kernel volume
    per_position = 2 * (c_in // groups) * c_out * _prod(kernel)
    if rng.random() < NETWORK_SHARE:  # as a network's layer: square kernel, same padding, a feature-map size
        if not detail.endswith("depthwise"):
            sizes = (2, 3, 4, 4) if transposed else ((1, 1, 3, 3, 5, 7) if d < 3 else (1, 3, 3, 5))
            kernel = (rng.choice(sizes),) * d
            per_position = 2 * (c_in // groups) * c_out * _prod(kernel)
        padding = (0,) * d if transposed else tuple(k // 2 for k in kernel)
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


#: FLOPs per sampled convolution on a GPU (log-uniform between): KernelBench's run 0.1 to 400 GFLOP, a ResNet's
#: or an Inception's layers 0.03 to 7 (batch 10); a table sampled at 0.3-30 GFLOP put the large level-1
#: convolutions at a third of their measured rate.
GPU_FLOP_RANGE = (1e7, 2e11)


#: Share of :func:`sample_plan`'s per-dtype count each class gets: the common 2-D convolution the most.
CLASS_SHARE = {"conv1d": 0.25, "conv2d": 1.0, "conv3d": 0.5, "conv2d_transpose": 0.5, "conv3d_transpose": 0.5,
               "conv2d_grouped": 0.375, "conv2d_depthwise": 0.25}


def problem_geometry(p: ConvProblem) -> ConvGeometry:
    """The :class:`ConvGeometry` of a problem from its shapes (output sizes by PyTorch's formulas, no tensors)."""
    if p.transposed:
        out = [(s - 1) * p.stride + k for s, k in zip(p.spatial, p.kernel)]
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
    log-uniformly from ``flop_range``; input and output tensors stay within ``max_elems`` elements each."""
    rng = random.Random(seed)
    by: list[list[ConvProblem]] = []
    for dtype, n in per_class.items():
        for detail in CONV_CLASSES:
            count = max(2, round(n * CLASS_SHARE[detail]))
            drawn: list[ConvProblem] = []
            for _ in range(20 * count):  # redraw the few whose smallest size still overshoots the range 4x
                if len(drawn) == count:
                    break
                p = _problem(rng, detail, dtype, max_elems, flop_range)
                if problem_geometry(p).flops <= 4 * flop_range[1]:
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
                              geom.elements * _ITEMSIZE[p.dtype] / 1e6,
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
#: do_bench budgets of one sampled matmul (ms), and of a convolution on a CPU: hundreds are timed within the
#: budget, each a median of a few calls (its L2 flushed between calls).
TABLE_WARMUP_MS, TABLE_REP_MS = 2.0, 8.0
#: Profiled calls per sampled convolution on a GPU (:func:`fusion_advisor.kernel_tools.bench.device_time_ms`: the
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


#: Matmuls sampled per class of :data:`fusion_advisor.devices.op_rates.MATMUL_CLASSES` and dtype, and the time
#: budget (s), by device and ``quick``.
MATMUL_SAMPLES = {"cuda": ({"fp32": 20, "bf16": 8}, 6.0), "cuda-quick": ({"fp32": 6}, 3.0),
                  "cpu": ({"fp32": 4}, 5.0), "cpu-quick": ({"fp32": 2}, 2.0)}


def measure_matmuls(device: str, quick: bool, timer: Callable[[Callable[[], Any]], Any],
                    dtypes: dict[str, Any]) -> tuple[list[MatmulRate], dict[str, str]]:
    """The spec's ``matmul_rates``: :data:`MATMUL_SAMPLES` matmuls of :func:`matmul_plan` timed by
    :func:`measure_matmul_rates` (fp32 with TF32 off, PyTorch's default)."""
    per_class, budget = MATMUL_SAMPLES[device + ("-quick" if quick else "")]
    plan = (matmul_plan(per_class) if device == "cuda"
            else matmul_plan(per_class, max_elems=4 << 20, flop_range=(1e7, 2e9)))
    return measure_matmul_rates(device, plan, timer, budget, dtypes)


# --- recurrent layers ---------------------------------------------------------------------------------------------

#: The recurrent cells of ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` (tanh, relu), by their ``torch.<cell>`` names: what
#: calibrate measures, a spec's ``recurrent_step_us`` may name, and the op graph tells a recurrent op by.
RECURRENT_CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")

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
