"""Measured eager times of normalizations, softmaxes and reductions by shape: the table ``calibrate`` measures and
how the roofline reads it.

Bytes at copy bandwidth price these ops badly, in both directions, because their kernels' parallelism follows
their shape, not their bytes. On the H200 (``analyze --profile`` of four seeded KernelBench sets, 2026-12-02/03,
benchmarks/results/h200/accuracy/reprofile/README.md, session 22): cuDNN's inference BatchNorm kernel ran DenseNet's
7 x 7 maps (10 x 1536 x 7 x 7) at 0.55 TB/s and its 28 x 28 maps at 3.2 TB/s, about 7 ns per channel whatever
the map, one block per channel; ``native_group_norm`` over 1024 x 8192 took 5x its bytes at copy bandwidth
(a row-moments kernel over 32 rows); a 9-kernel ``logsumexp`` 2.5-6x; softmax over long rows half its three-pass
roofline. So ``calibrate`` times a seeded sample of each class (:func:`reduction_plan`, :func:`measure_reductions`)
by its kernels, as a profile times an op, and keeps each call's geometry, bytes, kernel time and kernel count
(:class:`ReductionRate`). An op's time comes from the entries of its class nearest it in log geometry
(:func:`reduction_time_us`).

The classes and the geometry each keeps (``dims``, three sizes whose meaning is the class's):

========================  ===========================  ================================================
class                     aten ops priced              dims
========================  ===========================  ================================================
``batch_norm``            BatchNorm, eval              ``(N, C, spatial)``: input ``N x C x spatial``
                                                       (spatial 1: a ``N x C`` matrix)
``batch_norm_train``      BatchNorm / InstanceNorm,    ``(N, C, spatial)``
                          training statistics
``group_norm``            ``native_group_norm``        ``(N x groups, C / groups, spatial)``
``layer_norm``            ``native_layer_norm``        ``(rows, normalized size, 1)``
``softmax``               softmax, log-softmax         ``(outer, dim, inner)``: the input viewed so
                                                       that the reduced dim is the middle one
``reduce``                sum, mean, amax, var, ...    ``(outer, reduced, inner)``
``logsumexp``             ``logsumexp``                ``(outer, reduced, inner)``
========================  ===========================  ================================================
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Callable, Sequence

from fusion_advisor.devices.op_rates import RATE_DTYPES, _entry, _field, _sig
from fusion_advisor.dtypes import float_itemsize

#: Classes of :data:`REDUCTION_CLASSES` calibrate samples, and the meaning of each one's ``dims``.
REDUCTION_DIMS = {
    "batch_norm": ("N", "C", "spatial"),
    "batch_norm_train": ("N", "C", "spatial"),
    "group_norm": ("N x groups", "C / groups", "spatial"),
    "layer_norm": ("rows", "normalized", "1"),
    "softmax": ("outer", "dim", "inner"),
    "reduce": ("outer", "reduced", "inner"),
    "logsumexp": ("outer", "reduced", "inner"),
}
REDUCTION_CLASSES = tuple(REDUCTION_DIMS)
#: The classes whose input is a ``N x C x spatial`` map (or a ``N x C`` matrix): BatchNorm and GroupNorm.
NORM_CLASSES = ("batch_norm", "batch_norm_train", "group_norm")
#: The reductions the ``reduce`` class prices (one ATen ``reduce_kernel`` each); calibrate samples the first three.
REDUCE_OPS = ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std", "var_mean",
              "std_mean", "linalg_vector_norm", "norm")
SAMPLED_REDUCE_OPS = ("sum", "mean", "amax")


@dataclass(frozen=True)
class ReductionRate:
    """One measured call of a normalization, softmax or reduction.

    Attributes:
        op: its class (:data:`REDUCTION_CLASSES`).
        dtype: ``fp32``, ``bf16``, ``fp16`` or ``fp64``.
        dims: the class's three sizes (:data:`REDUCTION_DIMS`).
        mbytes: MB (1e6 bytes) read and written, as :func:`reduction_bytes` counts them.
        time_us: summed durations of the kernels of one call (us).
        kernels: device kernels one call issues.
    """

    op: str
    dtype: str
    dims: tuple[int, int, int]
    mbytes: float
    time_us: float
    kernels: float

    @cached_property
    def point(self) -> tuple[float, float, float]:
        """log2 of the dims: where the entry sits for :func:`reduction_time_us`."""
        return reduction_point(self.dims)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReductionRate":
        """An entry of a spec's ``reduction_rates``.

        Raises:
            KeyError, ValueError, TypeError: a missing, unknown or malformed field (the spec loader names the file
                and the entry).
        """
        d = _entry(d, cls)
        dims = d["dims"]
        if not isinstance(dims, (list, tuple)) or len(dims) != 3 or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in dims):
            raise ValueError(f"dims must be three positive integers, got {dims!r}")
        rate = cls(str(d["op"]), str(d["dtype"]), (int(dims[0]), int(dims[1]), int(dims[2])),
                   _field(d, "mbytes", float), _field(d, "time_us", float), _field(d, "kernels", float))
        if rate.op not in REDUCTION_DIMS:
            raise ValueError(f"op {rate.op!r} is not one of {', '.join(REDUCTION_CLASSES)}")
        if rate.dtype not in RATE_DTYPES:
            raise ValueError(f"dtype {rate.dtype!r} is not one of {', '.join(RATE_DTYPES)}")
        return rate

    def rounded(self) -> "ReductionRate":
        """This entry with its floats to 4 significant figures for a spec file."""
        return ReductionRate(self.op, self.dtype, self.dims, _sig(self.mbytes), _sig(self.time_us),
                             round(self.kernels, 2))

    def entry(self) -> dict[str, Any]:
        """This entry rounded (:meth:`rounded`) as a spec's YAML or JSON mapping, its dims a list."""
        d = asdict(self.rounded())
        d["dims"] = list(self.dims)
        return d


def reduction_point(dims: Sequence[int]) -> tuple[float, float, float]:
    """log2 of each of ``dims`` (at least 1)."""
    return (math.log2(max(dims[0], 1)), math.log2(max(dims[1], 1)), math.log2(max(dims[2], 1)))


def reduction_bytes(op: str, dims: Sequence[int], dtype: str) -> float:
    """Bytes a call of class ``op`` over ``dims`` reads and writes in ``dtype``: the input and the output (as large
    as the input for the normalizations and softmax, one value per reduction for the reductions), the statistics
    and affine parameters not counted (at most 4 per channel or group)."""
    a, b, c = dims
    numel = a * b * c
    out = a * c if op in ("reduce", "logsumexp") else numel
    return float((numel + out) * float_itemsize(dtype))


# --- pricing ------------------------------------------------------------------------------------------------------

#: Entries an op's time is interpolated from, and the Gaussian width of their weights (log2 units of the dims).
REDUCTION_NEIGHBOURS = 6
REDUCTION_WIDTH = 1.5
#: Distance (log2 units of the dims) at which the copy roofline weighs as much as one measured entry: an op far from
#: every entry of its class streams at about copy bandwidth, not at the efficiency of small entries whose fixed
#: costs dominate. nn.MultiheadAttention's mean of its weights over 4 heads of [2, 4, 16384, 16384] (10.7 GB), 12.4
#: units from the nearest 1-2 MB entries, was priced at 2.6x its bytes at copy bandwidth: 13.1 ms on the h100 spec,
#: where an H100 profile leaves it at most 5.4 ms (the model's 21.6 ms less its chains' 16.2); now 4.9. At 6 units
#: no op of the profiled accuracy sets moves (at 3 and 4.5, ops 2-4 units from the table did).
COPY_PRIOR_DISTANCE = 6.0
#: Least share of an entry's time its streaming part may be (the rest its kernels' fixed cost).
MIN_STREAM_SHARE = 0.25


#: Fewest entries of an op's kernel path (:func:`reduction_path`) its time is read from alone; fewer: its class's.
MIN_PATH_ENTRIES = 8


def reduction_path(op: str, dims: Sequence[int]) -> bool:
    """Whether a call takes its class's main kernel path. ``layer_norm``: PyTorch's vectorized one-kernel LayerNorm
    needs the normalized size to be a multiple of its vector width (4); other sizes take a two-kernel path several
    times slower per byte (on the H200 the 72 calibrated calls split exactly so: 45 one-kernel, 27 two-kernel,
    2026-12-04). Every other class: True."""
    return op != "layer_norm" or dims[1] % 4 == 0


#: A spec's table (a tuple, kept alive here so that its id is not reused) -> its entries by class and dtype.
_BY_CLASS: dict[int, tuple[Sequence[ReductionRate], dict[tuple[str, str], list[ReductionRate]]]] = {}


def _by_class(rates: Sequence[ReductionRate]) -> dict[tuple[str, str], list[ReductionRate]]:
    """``rates`` grouped by ``(op, dtype)``; cached for a tuple (a spec's table: every op of a model reads it)."""
    hit = _BY_CLASS.get(id(rates)) if isinstance(rates, tuple) else None
    if hit is not None and hit[0] is rates:
        return hit[1]
    index: dict[tuple[str, str], list[ReductionRate]] = {}
    for r in rates:
        index.setdefault((r.op, r.dtype), []).append(r)
    if isinstance(rates, tuple):
        if len(_BY_CLASS) >= 8:
            _BY_CLASS.clear()
        _BY_CLASS[id(rates)] = (rates, index)
    return index


def _pool(rates: Sequence[ReductionRate], op: str, dims: Sequence[int], dtype: str) -> list[ReductionRate]:
    """The entries of class ``op`` in ``dtype``, else in fp32 (the table's ratio to the bytes carries over); of
    those, the ones of the call's kernel path (:func:`reduction_path`) where there are :data:`MIN_PATH_ENTRIES`."""
    index = _by_class(rates)
    for dt in (dtype, "fp32"):
        pool = index.get((op, dt), [])
        if pool:
            path = reduction_path(op, dims)
            same = [r for r in pool if reduction_path(op, r.dims) == path]
            return same if len(same) >= MIN_PATH_ENTRIES else pool
    return []


def reduction_time_us(rates: Sequence[ReductionRate], op: str, dims: Sequence[int], dtype: str, copy_gbps: float,
                      kernel_us: float) -> float | None:
    """Predicted device time (us) of a call of class ``op`` over ``dims`` in ``dtype``, from the measured entries of
    its class (its dtype's, else fp32's; of its kernel path, :func:`reduction_path`); None without any.

    Each entry splits into a fixed part, ``kernels x kernel_us`` (the fixed device time of one eager kernel as a
    profile measures it), and a streaming part, the rest (at least :data:`MIN_STREAM_SHARE` of it), whose ratio to
    the entry's bytes at ``copy_gbps`` is its efficiency. The op takes the Gaussian-weighted means (width
    :data:`REDUCTION_WIDTH` in log2 of the dims) of the kernels and the log efficiency of its
    :data:`REDUCTION_NEIGHBOURS` nearest entries, the log efficiency pulled toward the copy roofline's (0) by a
    weight of an entry :data:`COPY_PRIOR_DISTANCE` away (nothing near the table, all of it far beyond):
    ``kernels x kernel_us + bytes / copy_gbps x efficiency``."""
    pool = _pool(rates, op, dims, dtype)
    if not pool or copy_gbps <= 0:
        return None
    at = reduction_point(dims)
    near = sorted((math.dist(r.point, at), i) for i, r in enumerate(pool))[:REDUCTION_NEIGHBOURS]
    weights = [math.exp(-(d / REDUCTION_WIDTH) ** 2) + 1e-12 for d, _ in near]
    total = sum(weights)
    kernels = sum(w * pool[i].kernels for w, (_, i) in zip(weights, near, strict=True)) / total
    prior = math.exp(-(COPY_PRIOR_DISTANCE / REDUCTION_WIDTH) ** 2)  # the copy roofline: log efficiency 0
    log_eff = sum(w * _log_efficiency(pool[i], copy_gbps, kernel_us)
                  for w, (_, i) in zip(weights, near, strict=True)) / (total + prior)
    stream_us = reduction_bytes(op, dims, dtype) / (copy_gbps * 1e3)
    return kernels * kernel_us + stream_us * math.exp(log_eff)


def _log_efficiency(r: ReductionRate, copy_gbps: float, kernel_us: float) -> float:
    """Natural log of an entry's streaming time over its bytes at ``copy_gbps``."""
    stream = max(r.time_us - r.kernels * kernel_us, MIN_STREAM_SHARE * r.time_us)
    return math.log(stream / (r.mbytes * 1e6 / (copy_gbps * 1e3)))


# --- sampling -----------------------------------------------------------------------------------------------------

#: Spatial sides of the sampled normalization inputs (square maps): a CNN's stages, 1 x 1 heads to 224 x 224 stems.
SIDES = (1, 2, 4, 7, 8, 14, 16, 28, 32, 56, 64, 112, 128, 224)
#: Batch sizes of the sampled normalization inputs.
BATCHES = (1, 2, 4, 8, 10, 16, 32, 64, 128)
GROUPS = (1, 2, 4, 8, 16, 32)
#: Share of sampled BatchNorm / GroupNorm inputs that are ``batch x features`` matrices (after a Linear layer).
FEATURE_SHARE = 0.25
#: Share of sampled ``reduce`` calls over the whole input (one output: PyTorch splits the reduction over blocks).
FULL_REDUCE_SHARE = 0.15


def _log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _three_dims(rng: random.Random, numel: int, last_share: float, dim_range: tuple[int, int]) -> tuple[int, int, int]:
    """``(outer, dim, inner)`` of about ``numel`` elements: the reduced dim last (inner 1) with probability
    ``last_share``, else over a middle dim of a map (inner a square side's area)."""
    if rng.random() < last_share:
        dim = _log_uniform(rng, *dim_range)
        if rng.random() < 0.5 and dim >= 64:
            dim = dim // 64 * 64
        return max(numel // dim, 1), dim, 1
    dim = _log_uniform(rng, 2, 1024)
    inner = rng.choice(SIDES[1:]) ** 2
    return max(numel // (dim * inner), 1), dim, inner


def _norm_dims(rng: random.Random, op: str) -> tuple[tuple[int, int, int], int]:
    """``(dims, groups)`` of a sampled BatchNorm or GroupNorm input: with probability :data:`FEATURE_SHARE` a
    ``batch x channels`` matrix (a norm after a Linear layer: batch of 8-65536, channels of 16-8192), else a CNN
    stage's map (batch from :data:`BATCHES`, channels of 8-2048, a square side from :data:`SIDES`); group norm's
    channels a multiple of a group count from :data:`GROUPS`."""
    if rng.random() < FEATURE_SHARE:
        batch, channels, area = _log_uniform(rng, 8, 65536), _log_uniform(rng, 16, 8192), 1
    else:
        batch, channels, area = rng.choice(BATCHES), _log_uniform(rng, 8, 2048), rng.choice(SIDES) ** 2
    if op != "group_norm":
        return (batch, channels, area), 1
    groups = rng.choice(GROUPS)
    return (batch * groups, max(channels // groups, 1), area), groups


def reduction_plan(per_class: dict[str, int], max_elems: int, seed: int = 0, min_elems: int = 1 << 10
                   ) -> list[tuple[str, str, tuple[int, int, int], int]]:
    """``per_class[op]`` seeded fp32 calls ``(op, dtype, dims, groups)`` of each class of ``per_class`` (``groups``
    the group norm's group count, else 1), each input of ``min_elems`` to ``max_elems`` elements. Normalizations:
    :func:`_norm_dims`; layer norm: rows of 32-16384 (half of them a multiple of 64); softmax and reductions: over
    the last dim (60%, rows of 8-65536) or a middle dim of 2-1024 over a map, and for ``reduce`` a share
    (:data:`FULL_REDUCE_SHARE`) over the whole input (``torch.sum(x)``: one output)."""
    rng = random.Random(seed + 7)
    out = []
    for op, n in per_class.items():
        got = tries = 0
        while got < n and tries < 1000 * n:
            tries += 1
            groups = 1
            if op in NORM_CLASSES:
                dims, groups = _norm_dims(rng, op)
            elif op == "layer_norm":
                width = _log_uniform(rng, 32, 16384)
                width = width // 64 * 64 if rng.random() < 0.5 and width >= 64 else width
                dims = (max(_log_uniform(rng, min_elems, max_elems) // width, 1), width, 1)
            elif op == "reduce" and rng.random() < FULL_REDUCE_SHARE:
                dims = (1, _log_uniform(rng, min_elems, max_elems), 1)
            else:
                dims = _three_dims(rng, _log_uniform(rng, min_elems, max_elems), 0.6, (8, 65536))
            if not min_elems <= dims[0] * dims[1] * dims[2] <= max_elems:
                continue
            out.append((op, "fp32", dims, groups))
            got += 1
    return out


def reduction_call(op: str, dims: Sequence[int], dtype: Any, device: str, groups: int = 1, index: int = 0
                   ) -> Callable[[], Any]:
    """A call of class ``op`` over ``dims`` on fresh inputs, as model code makes it (``F.batch_norm`` on a
    ``N x C x side x side`` map, or a ``N x C`` matrix where ``spatial`` is 1, ``F.group_norm`` in ``groups``
    groups, ``F.layer_norm`` over the last dim, ``torch.softmax`` / ``torch.sum`` / ``torch.mean`` /
    ``torch.amax`` (the ``index``-th of :data:`SAMPLED_REDUCE_OPS`) / ``torch.logsumexp`` over dim 1 of
    ``outer x dim x inner``)."""
    import torch
    import torch.nn.functional as F

    a, b, c = dims
    if op in NORM_CLASSES:
        side = max(int(math.isqrt(c)), 1)
        n, channels = (a // groups, b * groups) if op == "group_norm" else (a, b)
        # spatial 1: the ``batch x features`` matrix of a norm after a Linear layer (cuDNN runs a 2-D BatchNorm
        # per activation, a N x C x 1 x 1 one spatially: 100x slower at 16384 x 4096 on the H200)
        x = (torch.randn(n, channels, device=device, dtype=dtype) if c == 1
             else torch.randn(n, channels, side, c // side, device=device, dtype=dtype))
        w, bias = torch.rand(channels, device=device, dtype=dtype) + 0.5, torch.randn(channels, device=device,
                                                                                       dtype=dtype)
        if op == "group_norm":
            return lambda: F.group_norm(x, groups, w, bias)
        mean, var = torch.zeros(channels, device=device, dtype=dtype), torch.ones(channels, device=device, dtype=dtype)
        training = op == "batch_norm_train"
        return lambda: F.batch_norm(x, mean, var, w, bias, training=training)
    if op == "layer_norm":
        x = torch.randn(a, b, device=device, dtype=dtype)
        w, bias = torch.rand(b, device=device, dtype=dtype) + 0.5, torch.randn(b, device=device, dtype=dtype)
        return lambda: F.layer_norm(x, (b,), w, bias)
    x = torch.randn(a, b, c, device=device, dtype=dtype) if c > 1 else torch.randn(a, b, device=device, dtype=dtype)
    if op == "softmax":
        return lambda: torch.softmax(x, dim=1)
    if op == "logsumexp":
        return lambda: torch.logsumexp(x, dim=1)
    fn = getattr(torch, SAMPLED_REDUCE_OPS[index % len(SAMPLED_REDUCE_OPS)])
    return lambda: fn(x, dim=1)


def measure_reduction_rates(device: str, plan: Sequence[tuple[str, str, tuple[int, int, int], int]],
                            timer: Callable[[Callable[[], Any]], Any], budget_s: float, dtypes: dict[str, Any]
                            ) -> tuple[list[ReductionRate], dict[str, str]]:
    """Time each call of ``plan`` (:func:`reduction_call`) with ``timer`` (on a GPU the summed durations of its
    kernels, whose ``kernels`` it counts) until ``budget_s`` seconds have passed since the first call (which carries
    the process's one-time costs: the CUDA context, the profiler's start, cuDNN's load; 4.7 s in a fresh process on
    the H200). Returns the entries and, where calls were left out or failed, why."""
    import torch

    rates: list[ReductionRate] = []
    failed: list[str] = []
    skipped: dict[str, str] = {}
    start = time.perf_counter()
    for i, (op, dtype, dims, groups) in enumerate(plan):
        if time.perf_counter() - start > budget_s:
            skipped["reduction_rates"] = f"{len(plan) - i} of {len(plan)} calls left out: the {budget_s:g} s budget"
            break
        try:
            fn = reduction_call(op, dims, dtypes[dtype], device, groups=groups, index=i)
            timing = timer(fn)
        except (RuntimeError, ValueError) as e:
            failed.append(f"{op} {dtype} {dims}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
            continue
        finally:
            fn = None  # noqa: F841 (free the inputs before the next call)
            if i == 0:
                start = time.perf_counter()
        us = timing.median_ms * 1e3
        if us > 0:
            kernels = timing.kernels_per_call or 1.0
            rates.append(ReductionRate(op, dtype, tuple(dims), reduction_bytes(op, dims, dtype) / 1e6, us,
                                       float(kernels)))
    if failed:
        skipped["reduction_rates failed"] = f"{len(failed)} calls failed, e.g. {failed[0]}"
    if device == "cuda":
        torch.cuda.empty_cache()
    return rates, skipped


#: Calls sampled per class and the time budget (s), by device and ``quick``. On a GPU each is timed by its kernels
#: (a few ms per call with the profiler's start): 224 in 1.1-1.3 s on the H200 (2026-12-04).
REDUCTION_SAMPLES = {
    "cuda": ({"batch_norm": 48, "batch_norm_train": 24, "group_norm": 32, "layer_norm": 32, "softmax": 32,
              "reduce": 40, "logsumexp": 16}, 10.0),
    "cuda-quick": ({op: 6 for op in REDUCTION_CLASSES}, 3.0),
    "cpu": ({op: 4 for op in REDUCTION_CLASSES}, 5.0),
    "cpu-quick": ({op: 2 for op in REDUCTION_CLASSES}, 2.0),
}
#: Input elements of a sampled call on a GPU (256 MiB in fp32) and on a CPU.
GPU_MAX_ELEMS, CPU_MAX_ELEMS = 64 << 20, 1 << 18


def measure_reductions(device: str, quick: bool, timer: Callable[[Callable[[], Any]], Any], dtypes: dict[str, Any],
                       seed: int = 0) -> tuple[list[ReductionRate], dict[str, str]]:
    """The spec's ``reduction_rates``: :data:`REDUCTION_SAMPLES` calls of :func:`reduction_plan` timed by
    :func:`measure_reduction_rates`."""
    per_class, budget = REDUCTION_SAMPLES[device + ("-quick" if quick else "")]
    plan = reduction_plan(per_class, GPU_MAX_ELEMS if device == "cuda" else CPU_MAX_ELEMS, seed=seed)
    return measure_reduction_rates(device, plan, timer, budget, dtypes)
