"""Measured convolution and matmul rates as a function of shape: the tables ``calibrate`` measures, how the
roofline reads them.

One peak per dtype prices cuDNN convolutions badly: on an H200 in fp32 (TF32 on, PyTorch's default) KernelBench's
convolutions ran at 1.1x to 75x their tensor-core roofline time (``analyze --profile`` of 38 files,
benchmarks/results/h200/accuracy/fit_kernelbench). The rate depends on the implicit GEMM's shape: few input or
output channels per group leave tensor-core tiles empty (cuDNN then picks CUDA-core kernels), large kernels and
strides change the algorithm, transposed convolutions run as data-gradient kernels, small problems do not fill the
GPU, a deep K over a small output is split over the SMs. So ``calibrate`` measures a seeded sample of convolutions
of every geometry class (:func:`fusion_advisor.devices.rate_sampling.sample_plan`) and the spec keeps each one's
achieved TFLOP/s and bytes moved (:class:`ConvRate`). An op's time comes from the measured convolutions of its
class, dtype and layout (:func:`conv_time_us`): a roofline fitted through them (:class:`ConvTimeModel`: a peak
derated by how full the implicit GEMM's tiles are in N, K and M x N, a bandwidth term and a fixed cost per call)
times a local correction from the residuals of the entries nearest it (:class:`LocalCorrection`, where it helps:
:class:`FittedTable`) where the class has :data:`MODEL_MIN_SAMPLES` or more, else the rate of its
:data:`NEIGHBOURS` nearest. FLOPs are ``torch.utils.flop_counter``'s convolution count, as the op graph counts them.

Matmuls the same way (:class:`MatmulRate`: ``torch.mm`` / ``torch.bmm`` at seeded sizes; :func:`matmul_time_us`):
cuBLAS's fp32 SGEMM (TF32 off, PyTorch's default) ran KernelBench's matmuls at 1.3x to 14.8x their roofline time
(median 1.9x, 61 ops of the same 38 files), by shape.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from dataclasses import dataclass, fields
from typing import Any, Iterable, Sequence

from fusion_advisor.dtypes import float_itemsize

#: Geometry classes (``conv_detail``) calibrate samples. A transposed convolution with groups is a class of its own:
#: cuDNN often runs it group by group in its legacy ``dgrad_engine`` kernels, and in three of five fp32 probes on the
#: H200 it ran at 0.9-1.5 TFLOP/s where the ungrouped transposed convolution of the same channels per group ran at
#: 2.4-15 (benchmarks/results/h200/accuracy/grouped_transpose/; KernelBench's level1_75 took 7.0 ms where the
#: transposed class priced 1.14).
CONV_CLASSES = ("conv1d", "conv2d", "conv3d", "conv2d_transpose", "conv3d_transpose", "conv2d_grouped",
                "conv2d_depthwise", "conv2d_transpose_grouped", "conv3d_transpose_grouped")
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
_CONV_DETAIL = re.compile(r"conv[123]d(_transpose_grouped|_transpose|_grouped|_depthwise)?")


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
            channel per group) or ``_grouped`` (groups > 1 otherwise); ``_transpose_grouped`` for a transposed
            convolution with groups > 1 (cuDNN runs it group by group: :data:`CONV_CLASSES`).
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
        shapes are not those of one (ranks differ, fewer than 3 dims, empty).

        Transposed or not by the channels, where they tell: a convolution's weight is ``[C_out, C_in / groups,
        ...]`` (``y[1] == w[0]``), a transposed one's ``[C_in, C_out / groups, ...]`` (``x[1] == w[0]``); where
        both or neither read so (as many channels out as in), by the spatial sizes (a larger output is a transposed
        convolution's). By the sizes alone a padded 1x1 convolution from 64 to 128 channels read as a grouped
        transposed one and was priced 70x its roofline, and a stride-1 transposed convolution as a grouped one (a
        reviewer)."""
        if len(x) < 3 or len(w) != len(x) or len(y) != len(x) or min(list(x) + list(w) + list(y)) <= 0:
            return None
        from torch.utils.flop_counter import conv_flop_count

        in_sp, out_sp = _prod(x[2:]), _prod(y[2:])
        forward = int(y[1]) == int(w[0]) and int(x[1]) % int(w[1]) == 0
        backward = int(x[1]) == int(w[0]) and int(y[1]) % int(w[1]) == 0
        transposed = backward if forward != backward else out_sp > in_sp
        d = len(x) - 2
        if transposed:  # weight [C_in, C_out / groups, *k]
            groups = max(int(y[1]) // max(int(w[1]), 1), 1)
            c_in_g, c_out_g = int(x[1]) // groups, int(w[1])
        else:  # weight [C_out, C_in / groups, *k]
            groups = max(int(x[1]) // max(int(w[1]), 1), 1)
            c_in_g, c_out_g = int(w[1]), int(w[0]) // groups
        detail = f"conv{d}d" + ("_transpose" if transposed else "")
        if groups > 1:
            detail += "_depthwise" if c_in_g == 1 and not transposed else "_grouped"
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
        return (m * per_in * self.c_in + m * per_out * n + n * k) * float_itemsize(self.dtype)

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
                       "conv1d_transpose": "conv2d_transpose", "conv1d_transpose_grouped": "conv2d_transpose_grouped",
                       "conv2d_transpose_grouped": "conv2d_transpose", "conv3d_transpose_grouped": "conv3d_transpose"}


def _pool(rates: Sequence[Any], detail: str, dtype: str, layout: str = "") -> list[Any]:
    """The entries of ``rates`` of class ``detail`` and ``dtype`` (:data:`DTYPE_FALLBACK`'s when it has none), of
    ``layout`` when given; a class with none takes its :data:`CONV_CLASS_FALLBACK` class's, and so on down the
    chain (a grouped transposed 1-D convolution: the grouped transposed 2-D class, else the transposed 2-D one,
    in a spec calibrated before grouped transposed convolutions were sampled)."""
    def of(det: str) -> list[Any]:
        for dt in (dtype, DTYPE_FALLBACK.get(dtype)):
            pool = [r for r in rates if r.detail == det and r.dtype == dt and (not layout or r.layout == layout)]
            if pool:
                return pool
        return []

    pool = of(detail)
    while not pool and detail in CONV_CLASS_FALLBACK:
        detail = CONV_CLASS_FALLBACK[detail]
        pool = of(detail)
    return pool


#: Fewest measured convolutions (matmuls) of one class, dtype and layout before their time is a fitted
#: :class:`FittedTable` rather than the nearest neighbours' rate (the model has 6 or 7 parameters).
MODEL_MIN_SAMPLES = 12
#: Fewest measured GEMMs with unaligned input channels (matmuls: K or N), and with aligned ones, in one pool before the model
#: fits the unaligned slowdown (:attr:`ConvTimeModel.unaligned_factor`); with fewer it is left at 0.
MIN_UNALIGNED_SAMPLES = 4


def channels_unaligned(c_in_per_group: int, dtype: str) -> bool:
    """Whether a convolution's input channels per group are not a multiple of 16 bytes of ``dtype`` (4 fp32, 8
    bf16/fp16 channels): cuDNN then cannot use its vectorised channel loads, and a 3-channel stem runs at 14-25
    TFLOP/s where its aligned neighbours run at 90-220 (the H200 profiles of KernelBench's convolution files,
    benchmarks/results/h200/accuracy/reprofile/). Depthwise convolutions (one channel per group) are their own class."""
    return c_in_per_group % max(16 // float_itemsize(dtype), 1) != 0


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
    Fitted in log time with an L1 loss (:func:`fit_gemm_model`): cuDNN's heuristics send some odd shapes to kernels
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


#: Each measured GEMM weighs its time to this power in the fit (weights normalised to mean 1): the L1 fit of
#: equal weights followed the many small table entries and priced KernelBench's large level-1 convolutions
#: (100-400 GFLOP, 1-4 M output positions) 1.15-1.3x over (session 21: table entries over 20 GFLOP at a median
#: 1.13-1.28x their time under each of three tables' fits); with 0.25 a second seeded table of 1012 convolutions
#: came out at median |log2 error| 0.354 (0.408 unweighted, 0.49 at 0.5).
FIT_WEIGHT_POWER = 0.25
# H200-scale start; the fit moves each by orders of magnitude (the unaligned factor starts at a 2x slowdown)
_MODEL_INIT = (200.0, 32.0, 64.0, 3e5, 3000.0, 5.0, 1.0)


def fit_gemm_model(rows: Sequence[tuple[float, float, float, float, bool, float]], iters: int = 60
                   ) -> ConvTimeModel:
    """:class:`ConvTimeModel` through measured GEMMs ``rows`` of ``(FLOPs, N, K, bytes, unaligned, time us)``,
    minimising the mean absolute log error of the time, each row weighted by its time to
    :data:`FIT_WEIGHT_POWER`: Levenberg-Marquardt on the log parameters, iteratively reweighted (weights
    ``row weight / max(|residual|, 0.02)``) for the L1 loss. Deterministic: a fixed start, a fixed number of
    steps. The unaligned slowdown is fitted where :data:`MIN_UNALIGNED_SAMPLES` rows of each kind are there.

    Raises:
        ValueError: ``rows`` is empty.
    """
    import numpy as np

    if not rows:
        raise ValueError("fit_gemm_model needs at least one measured GEMM")
    x = np.array([r[:5] for r in rows], dtype=np.float64)
    y = np.log(np.array([r[5] for r in rows], dtype=np.float64))
    weight = np.exp(y * FIT_WEIGHT_POWER)
    weight /= weight.mean()
    n_unaligned = int(x[:, 4].sum())
    fit_unaligned = min(n_unaligned, len(rows) - n_unaligned) >= MIN_UNALIGNED_SAMPLES
    theta, lam = np.log(np.array(_MODEL_INIT[:7 if fit_unaligned else 6])), 1e-2

    def params(t: Any) -> Any:
        return np.exp(t) if fit_unaligned else np.append(np.exp(t), 0.0)

    def residual(t: Any) -> Any:
        return np.log(_conv_roofline_us(*params(t), *x.T)) - y

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # trial steps may overflow: rejected
        for _ in range(iters):
            r = residual(theta)
            w = weight / np.maximum(np.abs(r), 0.02)
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


def _conv_row(r: ConvRate) -> tuple[float, float, float, float, bool, float]:
    return (r.gflop * 1e9, float(r.c_out), float(r.c_in * r.kernel), r.nbytes(), channels_unaligned(r.c_in, r.dtype),
            r.time_us())


#: Measured entries nearest an op whose residuals off the fitted surface correct its time (:class:`LocalCorrection`),
#: the width (weighted log2 units) of the Gaussian that weighs each by its distance, and the weight of no correction
#: beside them: one exact match moves an op two thirds of its residual, entries 3 units away (8x off in two of
#: channels, kernel and size) next to nothing. Chosen on the second seeded table (session 21): median |log2 error|
#: 0.354 against 0.365 for plain inverse-distance weights, which also carried far neighbours' residuals to
#: KernelBench's large level-1 convolutions (8% of 12 within 30% against 83%).
CORRECTION_NEIGHBOURS = 5
CORRECTION_WIDTH = 1.5
CORRECTION_PRIOR = 0.5
#: A correction is kept where it brings the table's mean leave-one-out |log error| below this share of the
#: surface's own, and the surface's is at least this (natural log: 2%): below it there is nothing to correct.
CORRECTION_MIN_GAIN = 0.95
CORRECTION_MIN_RESIDUAL = 0.02
#: Distance weights of a convolution's correction point (:func:`conv_point`): channels in and out per group, kernel
#: volume, stride, and the implicit GEMM's M (output positions x batch x groups), which sets how full the SMs are.
CONV_POINT_WEIGHTS = (1.0, 1.0, 1.0, 1.0, 0.7)
#: The same for a matmul (:func:`matmul_point`): M, N, K and the batch.
MATMUL_POINT_WEIGHTS = (1.0, 1.0, 1.0, 0.5)


def conv_point(c_in: float, c_out: float, kernel: float, stride: float, flops: float) -> tuple[float, ...]:
    """A convolution's place in the correction's feature space: log2 of channels in and out per group, kernel
    volume, stride and M = ``flops / (2 N K)``, each times :data:`CONV_POINT_WEIGHTS`."""
    m = flops / (2.0 * max(c_out, 1.0) * max(c_in * kernel, 1.0))
    return tuple(w * math.log2(max(v, 1.0)) for w, v in zip(CONV_POINT_WEIGHTS, (c_in, c_out, kernel, stride, m), strict=True))


def matmul_point(m: int, n: int, k: int, batch: int, layout: str = "nn") -> tuple[float, ...]:
    """A matmul's place in the correction's feature space: log2 of M, N, K and batch, times
    :data:`MATMUL_POINT_WEIGHTS`, and :data:`LAYOUT_DISTANCE` for an ``nt`` one (0 for ``nn``)."""
    return tuple(w * math.log2(max(v, 1)) for w, v in zip(MATMUL_POINT_WEIGHTS, (m, n, k, batch), strict=True)) + (
        LAYOUT_DISTANCE if layout == "nt" else 0.0,)


#: How far apart the two layouts (:data:`MATMUL_LAYOUTS`) lie in the correction's feature space: an entry of the
#: other layout weighs exp(-(4 / CORRECTION_WIDTH) ** 2) = 0.0008 of one of the op's own at the same sizes, so one
#: surface is fitted through both (cuBLAS's large GEMMs run alike in either) and each layout's regimes (the few-row
#: ``nt`` GEMMs' gemmSN_TN) are carried by its own entries' residuals.
LAYOUT_DISTANCE = 4.0


def _local_residual(points: Sequence[tuple[float, ...]], residuals: Sequence[float], at: Sequence[float],
                    skip: int = -1) -> float:
    """The ``residuals`` of the :data:`CORRECTION_NEIGHBOURS` ``points`` nearest ``at`` (``points[skip]`` left
    out), each weighted ``exp(-(distance / CORRECTION_WIDTH) ** 2)``, summed over the weights plus
    :data:`CORRECTION_PRIOR` (a kernel regression shrunk toward no correction)."""
    near = sorted((math.dist(p, at), i) for i, p in enumerate(points) if i != skip)[:CORRECTION_NEIGHBOURS]
    weights = [math.exp(-(d / CORRECTION_WIDTH) ** 2) for d, _ in near]
    return (sum(w * residuals[i] for w, (_, i) in zip(weights, near, strict=True))
            / (sum(weights) + CORRECTION_PRIOR))


@dataclass(frozen=True)
class LocalCorrection:
    """What a fitted surface misses near each measured entry: the log residuals (measured over fitted time) of the
    table, applied to a new op as the distance-weighted mean of its :data:`CORRECTION_NEIGHBOURS` nearest entries',
    shrunk toward none (``t = surface * exp(mean)``, :func:`_local_residual`). A 7-parameter roofline through a cuDNN table leaves the heuristics'
    choices in its residuals: neighbouring geometries of one class run at rates 2-10x apart, in clusters (split-K
    for a deep K over a small output, CUDA-core fallbacks). Kept only where the table's own leave-one-out error
    says it helps (:func:`fit_local_correction`).

    Attributes:
        points: each entry's feature point (:func:`conv_point`, :func:`matmul_point`).
        residuals: each entry's natural-log residual off the fitted surface.
    """

    points: tuple[tuple[float, ...], ...]
    residuals: tuple[float, ...]

    def factor(self, at: Sequence[float]) -> float:
        """The multiplicative correction at feature point ``at``."""
        return math.exp(_local_residual(self.points, self.residuals, at))


def fit_local_correction(points: Sequence[tuple[float, ...]], residuals: Sequence[float]
                         ) -> LocalCorrection | None:
    """A :class:`LocalCorrection` of these residuals, or None where it does not lower the mean absolute
    leave-one-out error (each entry corrected by its neighbours, itself left out) below
    :data:`CORRECTION_MIN_GAIN` of the surface alone's, where the surface is within
    :data:`CORRECTION_MIN_RESIDUAL` of the table already, or where fewer than twice :data:`CORRECTION_NEIGHBOURS`
    entries are there. On the shipped H200 fp32 tables (two calibrations of 2026-12-03 merged,
    benchmarks/results/h200/accuracy/reprofile/README.md, session 21) it is kept for the 1-D, 2-D, 3-D, both
    transposed and the depthwise convolution classes and for ``mm``, not for grouped convolutions or ``bmm``."""
    if len(points) < 2 * CORRECTION_NEIGHBOURS:
        return None
    alone = statistics.fmean(abs(r) for r in residuals)
    loo = statistics.fmean(abs(r - _local_residual(points, residuals, points[i], skip=i))
                           for i, r in enumerate(residuals))
    if alone < CORRECTION_MIN_RESIDUAL or loo >= CORRECTION_MIN_GAIN * alone:
        return None
    return LocalCorrection(tuple(map(tuple, points)), tuple(residuals))


#: A table row as the fit takes it: FLOPs, N, K, bytes, unaligned, measured time (us).
TableRow = tuple[float, float, float, float, bool, float]


@dataclass(frozen=True)
class FittedTable:
    """A measured table's time surface: the fitted roofline, and its local correction where one helps; below the
    table's smallest entry, never above a measured entry that does at least as much.

    Below the table the surface extrapolates its ``fixed_us``, which the fit sets where the time goes (the table's
    larger entries, :data:`FIT_WEIGHT_POWER`), not at the smallest calls: the H200's fp32 2-D convolution surface
    has 11.3 us fixed while its table holds entries of 4.2 us, and EfficientNet-B2's squeeze-and-excite 1x1
    convolutions on 2 x C x 1 x 1 maps (0.3-3 MFLOP) were priced 10-13 us against 2.6-6 us measured. An op with
    fewer FLOPs or fewer bytes than every entry is priced at most the least measured time of an entry at least as
    large in FLOPs, N, K and bytes, with the same channel alignment (:meth:`dominating_us`); inside the table's
    range the surface and its correction stand (cuDNN's heuristics make neighbouring shapes run 2-10x apart, so a
    larger entry that ran fast bounds nothing there).

    Attributes:
        model: :class:`ConvTimeModel` fitted through the table (:func:`fit_gemm_model`).
        correction: :class:`LocalCorrection` of its residuals, or None.
        rows: the measured entries (:data:`TableRow`); empty: no bound.
        layouts: each row's layout of ``B`` (:data:`MATMUL_LAYOUTS`) where the table mixes them (a matmul table);
            empty for a convolution table (one layout per pool). A bound takes rows of the op's layout alone: an
            ``nn`` entry says nothing of the ``nt`` kernels cuBLAS picks for the same sizes.
    """

    model: ConvTimeModel
    correction: LocalCorrection | None
    rows: tuple[TableRow, ...] = ()
    layouts: tuple[str, ...] = ()

    def time_us(self, flops: float, n: float, k: float, nbytes: float, unaligned: bool, point: Sequence[float],
                layout: str = "") -> float:
        """Device time (us) of a GEMM of ``flops``, ``n`` and ``k`` moving ``nbytes``, at feature ``point``
        (``layout``: the op's layout of ``B``, for a matmul table)."""
        t = self.model.time_us(flops, n, k, nbytes, unaligned)
        t = t * self.correction.factor(point) if self.correction is not None else t
        below = self.rows and (flops < self._least[0] or nbytes < self._least[1])
        return min(t, self.dominating_us(flops, n, k, nbytes, unaligned, layout)) if below else t

    @functools.cached_property
    def _least(self) -> tuple[float, float]:
        """The table's least FLOPs and least bytes (its lower edge), found once per table."""
        return min(r[0] for r in self.rows), min(r[3] for r in self.rows)

    def dominating_us(self, flops: float, n: float, k: float, nbytes: float, unaligned: bool,
                      layout: str = "") -> float:
        """The least measured time (us) of an entry with at least ``flops``, ``n``, ``k`` and ``nbytes``, the same
        alignment and (where the table records layouts and ``layout`` is given) the same layout; infinity where
        none is."""
        same = (lambda i: self.layouts[i] == layout) if self.layouts and layout else (lambda i: True)
        return min((r[5] for i, r in enumerate(self.rows) if r[0] >= flops and r[1] >= n and r[2] >= k
                    and r[3] >= nbytes and r[4] == unaligned and same(i)), default=math.inf)


def _fitted_table(rows: Sequence[TableRow], points: Sequence[tuple[float, ...]],
                  layouts: Sequence[str] = ()) -> FittedTable:
    model = fit_gemm_model(rows)
    residuals = [math.log(r[5] / model.time_us(*r[:5])) for r in rows]
    return FittedTable(model, fit_local_correction(points, residuals), tuple(rows), tuple(layouts))


@functools.lru_cache(maxsize=64)
def fit_conv_table(pool: tuple[ConvRate, ...]) -> FittedTable:
    """:class:`FittedTable` of the measured convolutions ``pool`` (one class, dtype and layout).

    Raises:
        ValueError: ``pool`` is empty.
    """
    if not pool:
        raise ValueError("fit_conv_table needs at least one measured convolution")
    return _fitted_table([_conv_row(r) for r in pool],
                         [conv_point(r.c_in, r.c_out, r.kernel, r.stride, r.gflop * 1e9) for r in pool])


def conv_time_us(rates: Sequence[ConvRate], geom: ConvGeometry, dtype: str, layout: str = "nchw"
                 ) -> float | None:
    """Predicted device time (us) of ``geom`` in ``dtype`` and ``layout``, from the measured ``rates`` of its class,
    dtype (:data:`DTYPE_FALLBACK` when that dtype has none) and layout: the class's :class:`FittedTable` (its
    :class:`ConvTimeModel`, locally corrected where that helps) where the table holds :data:`MODEL_MIN_SAMPLES` or
    more of them, else its FLOPs over the inverse-distance weighted
    rate of the :data:`NEIGHBOURS` nearest in :data:`FEATURE_WEIGHTS`-scaled feature space; None when the table
    has no such convolution."""
    pool = _pool(rates, geom.detail, dtype, layout)
    if not pool:
        return None
    if len(pool) < MODEL_MIN_SAMPLES:
        return geom.flops / (_nearest_tflops(pool, geom.features(), FEATURE_WEIGHTS) * 1e12) * 1e6
    table = fit_conv_table(tuple(pool))
    item = float_itemsize(dtype)
    return table.time_us(float(geom.flops), float(geom.c_out_per_group),
                         float(geom.c_in_per_group * geom.kernel_volume), float(geom.elements * item),
                         channels_unaligned(geom.c_in_per_group, dtype),
                         conv_point(geom.c_in_per_group, geom.c_out_per_group, geom.kernel_volume, geom.stride,
                                    geom.flops))


#: Measured convolutions whose activity counts :func:`conv_kernels` takes the median of.
KERNEL_NEIGHBOURS = 5

#: id(table) -> (table, its answers by (geometry, dtype, layout)): the analysis asks :func:`conv_kernels` several
#: times per convolution of a model, each a search of the whole table (810 entries in the shipped H200 spec, 1 ms
#: per question in Python: 0.43 s of a ResNet-101 analysis), and :func:`fastest_tflops` once per op; the table is
#: kept so its id is never reused.
_ANSWERS: dict[int, tuple[Sequence[Any], dict[tuple[Any, ...], Any]]] = {}


def _answers(rates: Sequence[Any]) -> dict[tuple[Any, ...], Any]:
    """The answers already given about the table ``rates`` (read as it is at its first question: a spec's table
    is a tuple), by question."""
    entry = _ANSWERS.get(id(rates))
    if entry is None or entry[0] is not rates:
        if len(_ANSWERS) >= 16:
            _ANSWERS.clear()
        entry = _ANSWERS[id(rates)] = (rates, {})
    return entry[1]


def conv_kernels(rates: Sequence[ConvRate], geom: ConvGeometry, dtype: str, layout: str = "nchw") -> float | None:
    """:func:`count_conv_kernels`, answered once per table, geometry, dtype and layout."""
    answers, key = _answers(rates), (geom, dtype, layout)
    if key not in answers:
        answers[key] = count_conv_kernels(rates, geom, dtype, layout)
    return answers[key]


def fastest_tflops(rates: Sequence[ConvRate | MatmulRate], dtype: str) -> float:
    """The highest rate (TFLOP/s) the table ``rates`` measured in ``dtype``, 0 where it measured none; answered
    once per table and dtype."""
    answers, key = _answers(rates), ("fastest", dtype)
    if key not in answers:
        answers[key] = max((r.tflops for r in rates if r.dtype == dtype), default=0.0)
    return answers[key]


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
#: How a matmul's second operand ``B`` (``K x N``) lies in memory: ``nn``, contiguous (``torch.mm(a, b)``); ``nt``, a
#: transposed view of a contiguous ``N x K`` tensor, as ``nn.Linear`` passes its weight (``addmm(bias, x, w.t())``)
#: and attention its keys (``q @ k.transpose(-2, -1)``): 684 (94%) of the 728 matmuls in the H200 profiles of
#: benchmarks/results/h200/accuracy/reprofile. cuBLAS picks its kernels by layout: a few-row ``nt`` GEMM (a
#: classifier head, a recurrent cell's step) runs ``gemmSN_TN``, whose time grows with K (on the H200 10 x 1920 x 10
#: took 20.1 us, 10 x 4096 x 1000 43.7) where a table of ``torch.mm`` calls priced 6.8 and 13.2.
MATMUL_LAYOUTS = ("nn", "nt")
#: Distance weights of :meth:`MatmulRate.features`: M, N, K, batch, alignment (an unaligned leading dimension
#: sends cuBLAS to its align1 kernels: a different regime, kept apart).
MATMUL_WEIGHTS = (1.0, 1.0, 1.0, 0.5, 3.0)


def matmul_aligned(n: int, k: int, dtype: str) -> bool:
    """Whether K and N are multiples of 16 bytes (cuBLAS's vectorised kernels need it)."""
    per = 16 // float_itemsize(dtype)
    return n % per == 0 and k % per == 0


@dataclass(frozen=True)
class MatmulRate:
    """One measured matmul ``[batch, M, K] x [batch, K, N]``: class, dtype, sizes, achieved TFLOP/s (fp32 with
    TF32 off, PyTorch's default for matmuls).

    Attributes:
        layout: ``B``'s layout (:data:`MATMUL_LAYOUTS`); ``nn`` in tables measured before it was recorded.
        kernels: device activities one call issued, as the profiler counted them (cuBLAS's split-K GEMMs add a
            reduction kernel); 0 where not recorded.
    """

    detail: str
    dtype: str
    m: int
    n: int
    k: int
    batch: int
    tflops: float
    layout: str = "nn"
    kernels: float = 0.0

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
                   _field(d, "batch", int), _field(d, "tflops", float), str(d.get("layout", "nn")),
                   _field(d, "kernels", float, positive=False) if "kernels" in d else 0.0)
        if rate.detail not in MATMUL_CLASSES:
            raise ValueError(f"detail {rate.detail!r} is not one of {', '.join(MATMUL_CLASSES)}")
        if rate.dtype not in RATE_DTYPES:
            raise ValueError(f"dtype {rate.dtype!r} is not one of {', '.join(RATE_DTYPES)}")
        if rate.layout not in MATMUL_LAYOUTS:
            raise ValueError(f"layout {rate.layout!r} is not one of {', '.join(MATMUL_LAYOUTS)}")
        if rate.kernels < 0:
            raise ValueError(f"kernels must be 0 (not recorded) or positive, got {rate.kernels!r}")
        return rate

    def rounded(self) -> "MatmulRate":
        """This entry with its rate to 4 significant figures for a spec file."""
        return MatmulRate(self.detail, self.dtype, self.m, self.n, self.k, self.batch, _sig(self.tflops),
                          self.layout, round(self.kernels, 2))


def matmul_features(m: int, n: int, k: int, batch: int, dtype: str) -> tuple[float, float, float, float, float]:
    """log2 of M, N, K and batch, and 1 when K and N are 16-byte aligned (:func:`matmul_aligned`) else 0."""
    return (math.log2(max(m, 1)), math.log2(max(n, 1)), math.log2(max(k, 1)), math.log2(max(batch, 1)),
            1.0 if matmul_aligned(n, k, dtype) else 0.0)


def _matmul_row(r: MatmulRate) -> tuple[float, float, float, float, bool, float]:
    flops = 2.0 * r.batch * r.m * r.n * r.k
    nbytes = matmul_bytes(r.m, r.n, r.k, r.batch, r.dtype)
    return flops, float(r.n), float(r.k), nbytes, not matmul_aligned(r.n, r.k, r.dtype), flops / (r.tflops * 1e6)


@functools.lru_cache(maxsize=16)
def fit_matmul_table(pool: tuple[MatmulRate, ...]) -> FittedTable:
    """:class:`FittedTable` of the measured matmuls ``pool`` (one class and dtype, one layout or both): the GEMM roofline of
    :class:`ConvTimeModel` with ``N``, ``K`` and ``M x N`` (times the batch) as they are.

    Raises:
        ValueError: ``pool`` is empty.
    """
    if not pool:
        raise ValueError("fit_matmul_table needs at least one measured matmul")
    return _fitted_table([_matmul_row(r) for r in pool], [matmul_point(r.m, r.n, r.k, r.batch, r.layout) for r in pool],
                         [r.layout for r in pool])


def matmul_pool(rates: Sequence[MatmulRate], detail: str, dtype: str) -> list[MatmulRate]:
    """The measured matmuls :func:`matmul_time_us` prices a ``detail`` (``mm`` / ``bmm``) matmul in ``dtype`` from:
    those of its class and dtype, else of :data:`DTYPE_FALLBACK`'s dtype; empty when none is measured."""
    return _pool(rates, detail, dtype)


#: Fewest measured matrix-vector products (:func:`is_matvec`) of a dtype, of either class, before that dtype's are
#: priced by :class:`MatvecModel` rather than by the GEMM surface.
MATVEC_MIN_SAMPLES = 12


def is_matvec(m: int, n: int) -> bool:
    """Whether a matmul's output has one row or one column (M or N is 1): a matrix-vector product, or a dot product
    where both are."""
    return min(m, n) == 1


@dataclass(frozen=True)
class MatvecModel:
    """Device time of a matrix-vector product: a stream over its operands, ``fixed_us + bytes / (efficiency x copy
    bandwidth)``.

    cuBLAS runs one as its gemv / dot kernels (KernelBench's level-1 2048 x 1,048,576 product on the H100:
    ``dot_kernel`` and ``reduce_1Block_kernel``, 2,763 us, 3.1 TB/s), not as a tiled GEMM, so the GEMM surface's
    tile-fill terms (:class:`ConvTimeModel`) priced it at 5,148 us (this model: 2,938). Over the shipped tables' fp32
    matrix-vector entries, each shape left out of the fits, median |log2 error| 0.235 (H100) and 0.212 (H200)
    against the surface's 0.809 and 0.724; the few bf16 ones stay with the surface
    (benchmarks/results/h100/accuracy/matvec/, ``benchmarks/accuracy/matvec_fit.py``).

    Attributes:
        fixed_us: time per call (us) beside the stream: the kernels' launch latency and a dot product's second,
            reducing kernel.
        efficiency: the share of the spec's copy bandwidth the stream reaches (above 1 where an operand set that fits
            in L2 stays there).
    """

    fixed_us: float
    efficiency: float

    def time_us(self, nbytes: float, bandwidth_gbps: float) -> float:
        """Device time (us) of a product moving ``nbytes`` bytes on a GPU copying at ``bandwidth_gbps`` GB/s."""
        return self.fixed_us + nbytes / (self.efficiency * bandwidth_gbps * 1e3)


def matmul_bytes(m: int, n: int, k: int, batch: int, dtype: str) -> float:
    """Bytes a ``[batch, M, K] x [batch, K, N]`` matmul in ``dtype`` reads and writes: both operands and the output,
    once each."""
    return float(batch * (m * k + k * n + m * n) * float_itemsize(dtype))


def fit_matvec_model(rates: Sequence[MatmulRate], bandwidth_gbps: float, dtype: str | None = None
                     ) -> MatvecModel | None:
    """:class:`MatvecModel` through the matrix-vector products among ``rates`` of ``dtype`` (every dtype for None;
    both classes: the stream is priced in bytes), minimising the mean absolute log error of the time, each entry
    weighted by its time to :data:`FIT_WEIGHT_POWER` as the GEMM fit weighs them: a grid over ``fixed_us`` in
    0.25 us steps to 8 us and ``efficiency`` in 0.01 steps from 0.2 to 1.2 (deterministic). None with fewer than
    :data:`MATVEC_MIN_SAMPLES` of them or without a bandwidth."""
    rows = [(matmul_bytes(r.m, r.n, r.k, r.batch, r.dtype), 2.0 * r.batch * r.m * r.n * r.k / (r.tflops * 1e6))
            for r in rates if is_matvec(r.m, r.n) and r.tflops > 0 and (dtype is None or r.dtype == dtype)]
    if len(rows) < MATVEC_MIN_SAMPLES or bandwidth_gbps <= 0:
        return None
    best: tuple[float, float, float] | None = None
    for i in range(1, 33):
        fixed = 0.25 * i
        for j in range(101):
            eff = 0.2 + 0.01 * j
            loss = sum(abs(math.log((fixed + b / (eff * bandwidth_gbps * 1e3)) / t)) * t ** FIT_WEIGHT_POWER
                       for b, t in rows)
            if best is None or loss < best[0]:
                best = (loss, fixed, eff)
    assert best is not None
    return MatvecModel(best[1], round(best[2], 2))


def matvec_time_us(rates: Sequence[MatmulRate], m: int, n: int, k: int, batch: int, dtype: str,
                   bandwidth_gbps: float) -> float | None:
    """Device time (us) of a ``[batch, M, K] x [batch, K, N]`` matmul in ``dtype`` as a matrix-vector stream: the
    :func:`fit_matvec_model` of the table's ``dtype`` entries (pooled, bf16 batch-1 Linear layers read 0.33-0.49x
    their time; a reviewer), fitted once per table, bandwidth and dtype. None where it does not apply: not a
    matrix-vector product (:func:`is_matvec`), no bandwidth, fewer than :data:`MATVEC_MIN_SAMPLES` of the dtype."""
    if not is_matvec(m, n):
        return None
    answers, key = _answers(rates), ("matvec", bandwidth_gbps, dtype)
    if key not in answers:
        answers[key] = fit_matvec_model(rates, bandwidth_gbps, dtype)
    model = answers[key]
    return None if model is None else model.time_us(matmul_bytes(m, n, k, batch, dtype), bandwidth_gbps)


def matmul_time_us(rates: Sequence[MatmulRate], detail: str, m: int, n: int, k: int, batch: int, dtype: str,
                   layout: str = "nn", bandwidth_gbps: float = 0.0) -> float | None:
    """Predicted device time (us) of a ``detail`` (``mm`` / ``bmm``) matmul ``[batch, M, K] x [batch, K, N]`` in
    ``dtype`` with ``B`` in ``layout`` (:data:`MATMUL_LAYOUTS`): the class's :class:`FittedTable` where the spec
    measured :data:`MODEL_MIN_SAMPLES` or more of its class and dtype, its local correction taken from the entries
    of the op's layout (:data:`LAYOUT_DISTANCE`; from the ``nn`` ones where the table holds none of its layout:
    tables measured before layouts were recorded), else its FLOPs at the inverse-distance weighted rate of the
    nearest measured ones (:data:`MATMUL_WEIGHTS`); None without a measured matmul of that class and dtype.

    The fitted surface replaced the nearest neighbours as the matmul price in session 21: on 120 matmuls of a
    second seeded table (fitted on calibrate's 96), median |log2 error| 0.20 -> 0.09 for ``mm``, 0.30 -> 0.11 for
    ``bmm``; KernelBench's fp32 GEMMs over 1 ms within 30% of their profiled time 90% -> 97%. The ``nt`` entries
    (session 29: on each GPU three seeded tables of 224 + 2 x 400 matmuls merged into its spec, the curves
    refitted): over the test sets' 549 profiled matmuls the mean of each model's median |log2 error| 0.354 -> 0.211
    on the H200 and 0.404 -> 0.269 on the H100; VGG16's 10 x 25088 x 4096 classifier GEMM priced 146 -> 324 us
    against 304 measured on the H200; the H100 seed-1 test set's chains within 30% 80.7% -> 90.0% (VanillaRNN's
    few-row Linear steps, gemmSN_TN), the H200's 72.9% -> 73.2%, where its steps' host time keeps them over
    (benchmarks/results/h{100,200}/accuracy/matmul_layouts).

    A matrix-vector product (:func:`is_matvec`) given the spec's copy ``bandwidth_gbps`` is priced by
    :class:`MatvecModel` where the table holds :data:`MATVEC_MIN_SAMPLES` of them in its dtype (either class)."""
    pool = _pool(rates, detail, dtype)
    if not pool:
        return None
    if (stream := matvec_time_us(rates, m, n, k, batch, dtype, bandwidth_gbps)) is not None:
        return stream
    flops = 2.0 * batch * m * n * k
    if len(pool) < MODEL_MIN_SAMPLES:
        return flops / (_nearest_tflops(pool, matmul_features(m, n, k, batch, dtype), MATMUL_WEIGHTS) * 1e12) * 1e6
    if not any(r.layout == layout for r in pool):
        layout = "nn"
    nbytes = matmul_bytes(m, n, k, batch, dtype)
    return fit_matmul_table(tuple(pool)).time_us(flops, float(n), float(k), nbytes, not matmul_aligned(n, k, dtype),
                                                 matmul_point(m, n, k, batch, layout), layout)


# --- recurrent layers ---------------------------------------------------------------------------------------------

#: The recurrent cells of ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` (tanh, relu), by their ``torch.<cell>`` names: what
#: calibrate measures, a spec's ``recurrent_step_us`` may name, and the op graph tells a recurrent op by.
RECURRENT_CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
