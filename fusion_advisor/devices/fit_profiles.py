"""``fusion-advisor calibrate --from-profile``: learn per-op-class eager times from ``analyze --profile`` runs.

A profiled report (``analyze MODEL --profile``, report.json) holds every op's roofline facts (FLOPs, bytes, dtype,
shapes) and its measured device time (:class:`fusion_advisor.records.NodeMeasurement`). This module fits, per op
class (:func:`fusion_advisor.analyze.op_classes.op_class_keys`: ``conv/conv3d/fp32``, ``conv/conv3d``, ``conv``), a curve
from the op's roofline time ``r`` to its measured busy time ``t``:

    log t = a + b log r        (weighted least squares on the fit set's ops of the class)

- every op weighs ``sqrt(t)`` of its measured time (:data:`WEIGHT_POWER`): the curve leans to where the time goes,
  so many launch-sized ops do not set the factor of the few that take a model's milliseconds, without letting one
  large op decide alone;
- ``b`` (the exponent) is fitted only when the class has at least :data:`SLOPE_MIN_SAMPLES` ops spanning at least
  :data:`SLOPE_MIN_SPAN` in roofline time, clipped to [0.5, 1.5], and kept only when it lowers the weighted median
  absolute log residual against ``b = 1``; otherwise ``b = 1`` (one efficiency factor for the class);
- ``a`` is the weighted median of ``log t - b log r`` (robust to a few outlying ops);
- every level of a class with at least ``min_samples`` ops gets a curve (a category level only over two or more
  aten ops); the roofline applies the most specific one an op has
  (:meth:`fusion_advisor.devices.DeviceSpec.op_time_fit`).

The host term's prices are calibrate's; one factor on all of them is fitted here (:func:`fit_host_time_scale`:
what the ops the GPU waited for measured on the host, over their price at the profile's host speed), and one more on
the ops whose aten op had not run for many launches (:func:`fit_cold_host_scale`: a classifier head's ``addmm``).

A graph run ``k`` times per model call (a graph break in a loop over layers) has its ops measured summed over
the ``k`` calls: ``k`` is read back from the report (its chains' in-model prediction over one call's) and the
measured times divided by it.

The fit is judged on chains and models the way ``analyze --profile`` compares them (the in-model eager prediction,
:func:`fusion_advisor.roofline.eager_in_model_us`, against the measured chain time; the predicted whole-model time,
summed over chains, against the profiled total), before (the reports' own spec) and after (that spec with the
fitted curves), on the fit set and on a test set the fit never saw.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from fusion_advisor.devices import DeviceSpec, OpTimeFit, parse_spec, spec_fields, spec_mapping
from fusion_advisor.errors import CalibrationError, UserError
from fusion_advisor.analyze.records import NOT_THE_MODELS_TIMES, Analysis, Profile
from fusion_advisor.analyze.op_classes import launches
from fusion_advisor.analyze.roofline import (COLD_REUSE_LAUNCHES, cold_ops, eager_in_model_us, estimate,
                                             estimate_all, fit_keys, measured_bound, measured_op_us, op_host_us,
                                             pool_window_us, roofline_op_us, view_host_us)
from fusion_advisor.devices.profile_devices import check_device_kind, other_gpu_notes, reports_by_spec

#: Fewest measured ops a class needs before it gets a curve.
MIN_SAMPLES = 3
#: Fewest ops, and smallest max/min roofline-time ratio, before a class's exponent is fitted (else 1).
SLOPE_MIN_SAMPLES, SLOPE_MIN_SPAN = 6, 4.0
#: The exponent's range.
SLOPE_RANGE = (0.5, 1.5)

#: Each op weighs its measured time to this power in the fit (0: every op alike; 1: by its time). Chosen by 3-fold
#: cross-validation over 38 profiled KernelBench files on the H200 (held-out chains within 30% / models within 25%
#: / median |log2 error|: power 0 35% / 42% / 0.62, power 0.5 44% / 47% / 0.60, power 1 44% / 50% / 0.69;
#: benchmarks/results/h200/README.md, accuracy/fit_kernelbench).
WEIGHT_POWER = 0.5
#: Prior weight, in samples, of "no correction" in every fitted class (:func:`shrunk`). 3-fold cross-validation
#: over the 38 seed-0 KernelBench reports alone put 0, 2 and 5 within a point of each other on chains and models
#: (5: the lowest median error) and 10 or more below them (benchmarks/results/h200/accuracy/cost_model/).
SHRINK_SAMPLES = 5.0
#: Fewest ops with a measured host time the GPU waited for before a host time scale is fitted.
MIN_HOST_SAMPLES = 20
#: Fewest such ops a report needs to vote in the host time scale (a level-2 file's two or three waited ops say
#: little of how a host-bound model's host runs).
MIN_MODEL_HOST_SAMPLES = 10
#: Fewest models with a cold op the GPU waited for (:func:`fit_cold_host_scale`) before a cold host scale is fitted,
#: and the prior weight, in models, of "no cold cost": in every host-bound model profiled on the H200 and the H100
#: (nine models, 22 profiles) the cold ops ran above their warm in-model price, per profile a median of 1.6x
#: (SwinMLP) to 4.2x, 2.9x the median of all 45 (VanillaRNNHidden's one 256-input stack, 22x, left out;
#: benchmarks/results/h200/accuracy/reprofile/README.md, session 31), so the prior is one model's, not the host time
#: scale's five.
MIN_COLD_MODELS, COLD_SHRINK_MODELS = 3, 1.0
#: Accuracy bands of the summary (the issue's targets): chain within +-30 %, model within +-25 %, chain within 2x.
CHAIN_BAND, MODEL_BAND, WIDE_BAND = 0.30, 0.25, 2.0


@dataclass(frozen=True)
class ProfiledReport:
    """One ``analyze --profile`` report folder read back.

    Attributes:
        name: the folder's name (as given or found).
        path: the folder.
        analysis: its analysis (with :attr:`Analysis.profile`).
        spec: the device spec it was analysed with.
        graph_calls: graph index -> calls per model run (1 unless dynamo reused the graph in a loop).
    """

    name: str
    path: Path
    analysis: Analysis
    spec: DeviceSpec
    graph_calls: dict[int, float]


@dataclass(frozen=True)
class OpSample:
    """One measured op: its classes, its time before the fit (``roofline_us``: the roofline, or the spec's measured
    convolution / matmul rate when ``measured_rate``) and its measured busy time per call (us)."""

    report: str
    op_id: str
    keys: tuple[str, ...]
    roofline_us: float
    measured_us: float
    measured_rate: bool = False


@dataclass(frozen=True)
class ChainResidual:
    """One chain's measured time beside its prediction before and after the fit.

    Attributes:
        report: the report's name.
        split: ``"fit"`` or ``"test"``.
        chain_id: the chain.
        pattern: its pattern.
        measured_us: measured eager time per run (busy + idle, us).
        before_us: the in-model eager prediction with the report's spec (us).
        after_us: the same with the fitted spec (us).
        measured_bound: the profile's bound class.
        before_bound: the roofline's bound class with the report's spec.
        after_bound: the same with the fitted spec.
    """

    report: str
    split: str
    chain_id: str
    pattern: str
    measured_us: float
    before_us: float
    after_us: float
    measured_bound: str
    before_bound: str
    after_bound: str


@dataclass(frozen=True)
class ModelResidual:
    """One model's measured eager time (:func:`model_eager_us`) beside its predicted total (sum over chains) before
    and after the fit (us)."""

    report: str
    split: str
    measured_us: float
    before_us: float
    after_us: float


@dataclass(frozen=True)
class ClassFit:
    """One fitted op class for the summary: its curve and the fit set's median measured-over-roofline ratio."""

    key: str
    fit: OpTimeFit
    median_ratio: float


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_from_profiles` found.

    Attributes:
        spec: the base spec with the fitted :attr:`DeviceSpec.op_time_fits`.
        base: the base spec (the reports' own unless one was given), fits removed.
        classes: the fitted classes, most ops first.
        fit_reports / test_reports: names of the reports fitted on / tested on.
        chains: per-chain residuals of both sets.
        models: per-model residuals of both sets.
        samples: ops fitted.
        notes: how the split was made, reports skipped and why.
    """

    spec: DeviceSpec
    base: DeviceSpec
    classes: tuple[ClassFit, ...]
    fit_reports: tuple[str, ...]
    test_reports: tuple[str, ...]
    chains: tuple[ChainResidual, ...]
    models: tuple[ModelResidual, ...]
    samples: int
    notes: tuple[str, ...]


# --- reading -------------------------------------------------------------------------------------------------


def report_folders(paths: Iterable[Path]) -> list[Path]:
    """Report folders under ``paths``: each path that holds a report.json, else its subfolders that do (one level
    down), sorted by name.

    Raises:
        UserError: a path that does not exist, or one with no report folder in or under it.
    """
    from fusion_advisor.report.write import FILE_NAMES

    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise UserError(f"{p}: no such folder (give `analyze --profile` report folders, or a folder of them)")
        if (p / FILE_NAMES["json"]).is_file():
            out.append(p)
            continue
        found = sorted(d for d in p.iterdir() if d.is_dir() and (d / FILE_NAMES["json"]).is_file()) \
            if p.is_dir() else []
        if not found:
            raise UserError(f"{p}: no {FILE_NAMES['json']} in it or in its subfolders (written by "
                            "`fusion-advisor analyze MODEL --profile --out DIR`)")
        out.extend(found)
    return list(dict.fromkeys(out))


def _graph_calls(analysis: Analysis, spec: DeviceSpec) -> dict[int, float]:
    """Calls per run of each graph: as the profile recorded them, else (reports written before it did) the chains'
    stored in-model prediction over one call's on ``spec``, the spec the report was analysed with, fits included
    (rounded, >= 1), where every chain of the graph agrees on it within :data:`GRAPH_CALLS_AGREEMENT`, else 1.
    Without its fits the ratio would be the fits' factor, not the calls."""
    assert analysis.profile is not None
    if analysis.profile.graph_calls:
        return {int(g): max(1.0, float(k)) for g, k in analysis.profile.graph_calls.items()}
    one_call = eager_in_model_us(analysis.chains, analysis.ops, spec)  # reports of that age: no host scaling
    ratios: dict[int, list[float]] = {}
    for c in analysis.chains:
        m = analysis.profile.chains.get(c.id)
        if m is not None and one_call.get(c.id, 0.0) > 0 and m.predicted_us > 0:
            ratios.setdefault(c.graph_index, []).append(m.predicted_us / one_call[c.id])
    out = {}
    for g, r in ratios.items():
        k = max(1, round(statistics.median(r)))
        # the ratio is the calls only where every chain agrees on one whole number: a change of the pricing code
        # between the report and now reads as calls too (a one-op cumsum read 5 calls, a 3-D max pool 4)
        out[g] = float(k) if all(abs(x / k - 1.0) <= GRAPH_CALLS_AGREEMENT for x in r) else 1.0
    return out


#: How far each chain's stored-over-recomputed prediction may lie from the whole number of calls per run a
#: report written before graph calls were recorded is read with (else it is read as one call).
GRAPH_CALLS_AGREEMENT = 0.02


class UnprofiledReportError(UserError):
    """A report folder analysed without ``--profile``: nothing measured to fit or to test on."""


def read_report(path: Path) -> ProfiledReport:
    """Read one ``analyze --profile`` report folder.

    Raises:
        UserError: no report there; :class:`UnprofiledReportError`: one analysed without ``--profile``.
    """
    from fusion_advisor.report.write import load_report

    analysis = load_report(path)
    if analysis.profile is None or not analysis.profile.nodes:
        raise UnprofiledReportError(f"{path}: the report has no measured times (analyze it with --profile)")
    stored = parse_spec(spec_fields(analysis.device_spec), f"{path}/report.json: device_spec")
    return ProfiledReport(name=path.name, path=path, analysis=analysis, spec=without_fits(stored),
                          graph_calls=_graph_calls(analysis, stored))


def without_fits(spec: DeviceSpec) -> DeviceSpec:
    """``spec`` with nothing fitted from profiles (no op-class curves, host, view host and cold host scales of 1, and
    none of their sources): the plain roofline and calibrated host prices the fit starts from."""
    fitted = ("op_time_fits", "host_time_scale", "cold_host_scale", "view_host_scale")
    sources = {k: v for k, v in (spec.sources or {}).items() if k not in fitted}
    if not spec.op_time_fits and spec.host_time_scale == 1.0 and spec.cold_host_scale == 1.0 \
            and spec.view_host_scale == 1.0 and sources == (spec.sources or {}):
        return spec
    return replace(spec, op_time_fits={}, op_time_fit_dtypes=(), host_time_scale=1.0, cold_host_scale=1.0,
                   view_host_scale=1.0, sources=sources)


# --- fitting -------------------------------------------------------------------------------------------------


def op_samples(rep: ProfiledReport, spec: DeviceSpec) -> list[OpSample]:
    """Every op of ``rep`` with a measured busy time and a roofline time above zero, per call of its graph."""
    assert rep.analysis.profile is not None
    nodes = rep.analysis.profile.nodes
    out = []
    for op in rep.analysis.ops:
        m = nodes.get(op.id)
        if m is None or op.is_view or m.busy_us <= 0 or pool_window_us(op, spec) > 0:
            continue  # a pooling op priced by its measured window rate takes no fitted curve
        measured = measured_op_us(op, spec)
        r = roofline_op_us(op, spec) if measured is None else measured
        if r <= 0:
            continue
        k = rep.graph_calls.get(op.graph_index, 1.0)
        rated = measured is not None
        out.append(OpSample(rep.name, op.id, fit_keys(op, rated), r, m.busy_us / k, rated))
    return out


def host_samples(rep: ProfiledReport, spec: DeviceSpec, cold: bool = False) -> list[tuple[float, float]]:
    """``(measured, priced)`` host time (us per call) of every warm op of ``rep`` the GPU waited for (``cold``:
    every cold one instead, :func:`fusion_advisor.analyze.roofline.cold_ops`): its measured
    :attr:`NodeMeasurement.host_us` (the stamped replay's, per call of its graph) and its price on ``spec`` at the
    profile's host speed (:func:`fusion_advisor.analyze.roofline.op_host_us` plus the views since the previous
    launch, as the replay charges them; module calls left out: the stamped graphs make none).

    Only ops with idle time count (the host was what the GPU waited for there; where the GPU was the bottleneck the
    host time decides nothing measured), not a graph's first op (it carries the graph's entry, 70-160 us on the
    H200, which the module called as written does not pay) and not a recurrent layer (cuDNN's own step loop)."""
    return [(m, own + views) for m, own, views in _waited_ops(rep, spec, cold)]


def _waited_ops(rep: ProfiledReport, spec: DeviceSpec, cold: bool = False) -> list[tuple[float, float, float]]:
    """:func:`host_samples`' ops as ``(measured, own price, views' price)``: the op's own host price and that of
    the views since the previous launch apart."""
    a = rep.analysis
    assert a.profile is not None
    host_spec = profiled_host(a, spec)
    cold_ids = cold_ops(a.ops, {g for g, k in rep.graph_calls.items() if k > 1})
    nodes, out, pending, started = a.profile.nodes, [], 0.0, set()
    for op in a.ops:
        if op.is_view:
            pending += view_host_us(op, host_spec)
            continue
        if not launches(op):
            continue
        first, own, views, pending = op.graph_index not in started, op_host_us(op, host_spec), pending, 0.0
        started.add(op.graph_index)
        m = nodes.get(op.id)
        if first or m is None or m.host_us <= 0 or m.idle_us <= 0 or op.category == "recurrent" or own + views <= 0 \
                or (op.id in cold_ids) != cold:
            continue
        out.append((m.host_us / rep.graph_calls.get(op.graph_index, 1.0), own, views))
    return out


def fit_host_time_scale(reports: list[ProfiledReport], spec: DeviceSpec) -> tuple[float, int] | None:
    """The in-model over tight-loop host time (:attr:`DeviceSpec.host_time_scale`) the reports measured, and the
    ops it rests on: per report, the weighted median of ``log(measured / priced)`` over its :func:`host_samples`
    (each op weighs the square root of its measured host time, as :func:`fit_curve` weighs busy times); then the
    median over the reports with :data:`MIN_MODEL_HOST_SAMPLES` or more such ops (each host-bound model one vote:
    pooled, SwinTransformerV2's 382 ops outvoted four other models' 245), shrunk toward 1 by their number
    (:data:`SHRINK_SAMPLES`: one model moves it a sixth of the way); the ops counted are the voters'. None when
    no report votes or the voters hold fewer than :data:`MIN_HOST_SAMPLES` ops.

    calibrate prices each op class in a tight loop of that one call; inside a model the host runs a mix of calls
    (on the H200 GoogLeNet's ops cost 1.7-2.3x their price, ResNet-101's 1.2-1.4x, SwinMLP's 1.0x; with the
    stamped timeline taken before the profiler, 1.10-1.70x across ten models,
    benchmarks/results/h200/accuracy/reprofile/README.md)."""
    voters = [ps for ps in (host_samples(r, spec) for r in reports) if len(ps) >= MIN_MODEL_HOST_SAMPLES]
    ops = sum(len(ps) for ps in voters)
    if not voters or ops < MIN_HOST_SAMPLES:
        return None
    votes = [_weighted_median([math.log(m / p) for m, p in ps], [m ** WEIGHT_POWER for m, _ in ps]) for ps in voters]
    return math.exp(statistics.median(votes) * len(votes) / (len(votes) + SHRINK_SAMPLES)), ops


#: The view host scales :func:`fit_view_host_scale` tries: 0.25x to 8x in steps of 2 ** (1/16).
VIEW_SCALE_GRID = tuple(2.0 ** (i / 16) for i in range(-32, 49))
#: Prior weight, in models, of "views cost their price" (:func:`fit_view_host_scale`): few models are host-bound
#: through their views (on the H200 fit sets two: SwinMLP and SwinTransformerV2, 81 and 255 ops, each vote a
#: 2-3x scale that lowers its median |log error| 2-5x), so one model's prior, as the cold host scale's, not the
#: host time scale's five.
VIEW_SHRINK_MODELS = 1.0


def fit_view_host_scale(reports: list[ProfiledReport], spec: DeviceSpec) -> tuple[float, int, int] | None:
    """The host time of a view op inside a model over its price (:attr:`DeviceSpec.view_host_scale`), the ops and
    the models it rests on: per report, over its warm ops the GPU waited for that follow one or more priced views
    (:func:`host_samples`' ops), the scale ``v`` (of :data:`VIEW_SCALE_GRID`) whose price ``own + v * views``
    leaves the least weighted median ``|log(measured / price)|`` (weights as :func:`fit_host_time_scale`'s); the
    median over the reports with :data:`MIN_MODEL_HOST_SAMPLES` or more such ops, shrunk toward 1 in log by their
    number (:data:`VIEW_SHRINK_MODELS`). ``spec`` carries the fitted host time scale, so the
    own price is the op's in-model one. None when no report votes.

    calibrate prices a view as code writes it in a tight loop (``x.view(...)``, one Python call); the captured
    graph issues each view its aten ops take, a dispatcher call of its own (``nn.Linear`` on a 3-D input: ``view``,
    ``t``, ``addmm``, ``view``): on the H200 profiles of 2026-12-03, with each model's own host scale free, the
    least-squares cost of a view came to 4-13 us at the calibrating host's speed, against its 2.6 us price
    (benchmarks/results/h200/accuracy/view_host/README.md)."""
    voters = []
    for rep in reports:
        ops = [(m, own, views) for m, own, views in _waited_ops(rep, spec) if views > 0]
        if len(ops) >= MIN_MODEL_HOST_SAMPLES:
            voters.append(ops)
    if not voters:
        return None
    votes = []
    for ops in voters:
        weights = [m ** WEIGHT_POWER for m, _, _ in ops]
        err = {v: _weighted_median([abs(math.log(m / (own + v * views))) for m, own, views in ops], weights)
               for v in VIEW_SCALE_GRID}
        votes.append(math.log(min(VIEW_SCALE_GRID, key=lambda v: (err[v], abs(math.log(v))))))
    shrink = len(votes) / (len(votes) + VIEW_SHRINK_MODELS)
    return math.exp(statistics.median(votes) * shrink), sum(len(ops) for ops in voters), len(voters)


#: Rounds of :func:`fit_host_scales`: the host time scale prices the views too, so each fit moves the other.
HOST_FIT_ROUNDS = 3


def fit_host_scales(reports: list[ProfiledReport], spec: DeviceSpec
                    ) -> tuple[tuple[float, int] | None, tuple[float, int, int] | None]:
    """The host time scale (:func:`fit_host_time_scale`) and the view host scale (:func:`fit_view_host_scale`),
    fitted in turn :data:`HOST_FIT_ROUNDS` times, each over the other's last value (the host time scale's price of an
    op includes the views before it)."""
    host = view = None
    for _ in range(HOST_FIT_ROUNDS):
        host = fit_host_time_scale(reports, replace(spec, view_host_scale=view[0] if view else 1.0))
        view = fit_view_host_scale(reports, replace(spec, host_time_scale=host[0] if host else 1.0))
    return host, view


def fit_cold_host_scale(reports: list[ProfiledReport], spec: DeviceSpec) -> tuple[float, int, int] | None:
    """The host time of a cold op inside a model over its warm in-model price (:attr:`DeviceSpec.cold_host_scale`),
    the ops and the models it rests on: per report, the weighted median of ``log(measured / priced)`` over its cold
    :func:`host_samples` (``spec`` carries the fitted :attr:`DeviceSpec.host_time_scale`, so the price is a warm op's
    in the model); the median over the reports that have one, shrunk toward 1 by :data:`COLD_SHRINK_MODELS`. None
    with fewer than :data:`MIN_COLD_MODELS` such reports.

    A tight loop of one call keeps its code and data in the CPU's caches; inside a model an aten op the model runs
    once per call finds them cold (:data:`fusion_advisor.analyze.roofline.COLD_REUSE_LAUNCHES`)."""
    voters = [ps for ps in (host_samples(r, spec, cold=True) for r in reports) if ps]
    if len(voters) < MIN_COLD_MODELS:
        return None
    votes = [_weighted_median([math.log(m / p) for m, p in ps], [m ** WEIGHT_POWER for m, _ in ps]) for ps in voters]
    shrink = len(votes) / (len(votes) + COLD_SHRINK_MODELS)
    return math.exp(statistics.median(votes) * shrink), sum(len(ps) for ps in voters), len(voters)


def _weighted_median(values: list[float], weights: list[float]) -> float:
    """The value at half the total weight (values sorted); the plain median's when all weights are equal."""
    pairs = sorted(zip(values, weights))
    half, acc = sum(weights) / 2.0, 0.0
    for v, w in pairs:
        acc += w
        if acc >= half:
            return v
    return pairs[-1][0]


def fit_curve(roofline_us: list[float], measured_us: list[float], slope: bool = True) -> OpTimeFit:
    """The :class:`OpTimeFit` of measured against roofline times (both us, same length, all > 0; module
    docstring: the exponent only when the sizes span enough and it helps, the intercept a median).

    Every op weighs its measured time to :data:`WEIGHT_POWER` (the square root): the curve leans to where a
    model's time goes, so thirty launch-sized GEMMs of a few us do not set the factor of the one that takes
    milliseconds (weighted least squares for the exponent, weighted medians for the intercept and for the residual
    that decides whether the exponent is kept)."""
    x = [math.log(r) for r in roofline_us]
    y = [math.log(t) for t in measured_us]
    w = [t ** WEIGHT_POWER for t in measured_us]
    b = 1.0
    if slope and len(x) >= SLOPE_MIN_SAMPLES and max(roofline_us) >= SLOPE_MIN_SPAN * min(roofline_us):
        sw = sum(w)
        mx, my = sum(wi * xi for wi, xi in zip(w, x)) / sw, sum(wi * yi for wi, yi in zip(w, y)) / sw
        var = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x))
        slope = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y)) / var if var > 0 else 1.0
        slope = min(max(slope, SLOPE_RANGE[0]), SLOPE_RANGE[1])
        a1 = _weighted_median([yi - xi for xi, yi in zip(x, y)], w)
        a_s = _weighted_median([yi - slope * xi for xi, yi in zip(x, y)], w)
        if _weighted_median([abs(yi - slope * xi - a_s) for xi, yi in zip(x, y)], w) < \
                _weighted_median([abs(yi - xi - a1) for xi, yi in zip(x, y)], w):
            b = slope
    a = _weighted_median([yi - b * xi for xi, yi in zip(x, y)], w)
    return OpTimeFit(scale=math.exp(a), exponent=round(b, 4), min_us=min(roofline_us), max_us=max(roofline_us),
                     samples=len(x))


def shrunk(fit: OpTimeFit, prior_samples: float | None = None) -> OpTimeFit:
    """``fit`` pulled toward no correction (``t = r``) by its sample count ``n``: in log space the fitted line
    weighs ``w = n / (n + prior_samples)`` (default :data:`SHRINK_SAMPLES`) and the identity ``1 - w``, so a class
    fitted on three ops of one file moves its predictions half as far as its own fit says, and one fitted on
    thirty almost all the way (the usual shrinkage of a group mean toward the prior by its count)."""
    k = SHRINK_SAMPLES if prior_samples is None else prior_samples
    if k <= 0 or fit.samples <= 0:
        return fit
    w = fit.samples / (fit.samples + k)
    return replace(fit, scale=math.exp(w * math.log(fit.scale)), exponent=round(w * fit.exponent + (1 - w), 4))


def fit_op_times(samples: list[OpSample], min_samples: int = MIN_SAMPLES) -> tuple[ClassFit, ...]:
    """A curve (:func:`fit_curve`) for every class level with at least ``min_samples`` ops, most ops first; a
    category level only where its ops are of two or more aten ops (else its curve is that one op's)."""
    by_key: dict[str, list[OpSample]] = {}
    for s in samples:
        for key in s.keys:
            by_key.setdefault(key, []).append(s)
    out = []
    for key, ss in by_key.items():
        if len(ss) < min_samples:
            continue
        if "/" not in key and len({s.keys[1] for s in ss if len(s.keys) > 1}) < 2:
            # a category's curve fitted on one aten op alone is that op's curve, and would price the category's
            # other ops by it: 18 attention softmaxes (1.53x their roofline) priced a long-row log_softmax 2.1x
            # over its measured time
            continue
        # ops priced from a measured rate table already carry their size dependence: one factor, no slope (a
        # slope fitted over a few large KernelBench convolutions inflated every small ResNet one 6x)
        fit = shrunk(fit_curve([s.roofline_us for s in ss], [s.measured_us for s in ss],
                               slope=not all(s.measured_rate for s in ss)))
        out.append(ClassFit(key, fit, statistics.median(s.measured_us / s.roofline_us for s in ss)))
    return tuple(sorted(out, key=lambda c: (-c.fit.samples, c.key)))


# --- judging -------------------------------------------------------------------------------------------------


def profiled_host(analysis: Analysis, spec: DeviceSpec) -> DeviceSpec:
    """``spec`` at the host speed of a GPU profile (:meth:`DeviceSpec.at_host_speed` of the profile's own dispatch
    probe, as ``analyze --profile`` predicted it): a report is judged against the host it was measured on."""
    p = analysis.profile
    return spec.at_host_speed(p.dispatch_us) if p is not None and p.device == "cuda" else spec


def _predicted(rep: ProfiledReport, spec: DeviceSpec) -> tuple[dict[str, float], dict[str, str]]:
    """In-model eager prediction (times the graph's calls) and bound class of every chain of ``rep`` on ``spec``."""
    a = rep.analysis
    spec = profiled_host(a, spec)
    times = eager_in_model_us(a.chains, a.ops, spec)
    bounds = {cid: e.bound for cid, e in estimate_all(a.chains, a.ops, spec).items()}
    return ({c.id: times.get(c.id, 0.0) * rep.graph_calls.get(c.graph_index, 1.0) for c in a.chains}, bounds)


def model_eager_us(prof: Profile) -> float:
    """A profiled model's measured eager time per run (us): the plain model's wall time
    (:attr:`Profile.eager_wall_us`: the user's module called as written, no profiler, no stamps) where it was
    measured, else the profile's attributed total.

    The attributed total sums each chain's busy time (its kernels under the profiler) and idle time (the kernels
    replayed on the host timeline of the stamped FX graphs), which is how the chains are measured but not how the
    model runs: on the H200 it came out 0.43-1.80x the plain wall time across 137 profiled KernelBench files, and
    1.8x for a GoogLeNet and an RNN loop in one session where the plain wall time matched the previous session's
    within 7% (benchmarks/results/h200/accuracy/reprofile/README.md)."""
    return prof.model_eager_us


def measured_bounds(rep: ProfiledReport, spec: DeviceSpec) -> dict[str, str]:
    """Each profiled chain's measured bound class against ``spec``'s ceilings (chain id -> class): launch-bound as
    the profile measured it (idle over busy), else compute- or memory-bound by ``spec``'s peak and bandwidth
    (:func:`fusion_advisor.analyze.roofline.measured_bound`, the chain's FLOPs and bytes per call of its graph
    times the graph's calls). The profile recorded its classes against the spec it ran with; that part of the test
    holds no time (the busy time cancels out), so a report profiled with a datasheet spec and judged on a
    calibrated one of other ceilings would count their disagreement as the model's."""
    a = rep.analysis
    assert a.profile is not None
    by_id = {o.id: o for o in a.ops}
    out = {}
    for c in a.chains:
        m = a.profile.chains.get(c.id)
        if m is None:
            continue
        k = rep.graph_calls.get(c.graph_index, 1.0)
        out[c.id] = measured_bound(m.busy_us, m.idle_us, int(c.flops * k), int(c.eager_bytes * k),
                                   estimate(c, by_id, spec).peak_tflops, spec.memory_bandwidth_gbps)
    return out


def residuals(rep: ProfiledReport, split: str, before: DeviceSpec, after: DeviceSpec
              ) -> tuple[list[ChainResidual], ModelResidual]:
    """Chain and model residuals of ``rep`` on the spec ``before`` and ``after`` the fit; the measured bound
    classes against ``after``'s ceilings (:func:`measured_bounds`). A model's prediction is its chains' plus the
    eager time of the work no output uses (:attr:`Analysis.unused`, as analysed: eager runs it, no chain holds it)."""
    prof = rep.analysis.profile
    assert prof is not None
    t0, b0 = _predicted(rep, before)
    t1, b1 = _predicted(rep, after)
    measured = measured_bounds(rep, after)
    rows = []
    for c in rep.analysis.chains:
        m = prof.chains.get(c.id)
        if m is None or m.time_us <= 0:
            continue
        rows.append(ChainResidual(rep.name, split, c.id, c.pattern, m.time_us, t0[c.id], t1[c.id],
                                  measured.get(c.id, m.bound), b0.get(c.id, ""), b1.get(c.id, "")))
    # the model as written also runs the work no output uses, which no chain holds (priced when analysed)
    unused = rep.analysis.unused_us
    model = ModelResidual(rep.name, split, model_eager_us(prof), sum(t0.values()) + unused,
                          sum(t1.values()) + unused)
    return rows, model


def _within(pred: float, measured: float, band: float) -> bool:
    return measured > 0 and abs(pred / measured - 1.0) <= band


def _within_factor(pred: float, measured: float, factor: float) -> bool:
    return measured > 0 and pred > 0 and 1.0 / factor <= pred / measured <= factor


def summary(result: FitResult, split: str) -> dict[str, dict[str, float]]:
    """Accuracy of one split before and after the fit: ``{"before": {...}, "after": {...}}`` with the shares (0-1)
    of chains within +-30 % (``chains_30pct``) and 2x (``chains_2x``), of chains whose bound class equals the
    measured (``bound_match``), of models within +-25 % (``models_25pct``), the median absolute log2 error of
    chains (``median_log2_error``), and the counts ``chains`` / ``models``. Empty when the split has no chain."""
    chains = [r for r in result.chains if r.split == split]
    models = [m for m in result.models if m.split == split]
    if not chains:
        return {}
    out = {}
    for when in ("before", "after"):
        t = [(getattr(r, f"{when}_us"), r.measured_us) for r in chains]
        bounds = [(getattr(r, f"{when}_bound"), r.measured_bound) for r in chains if r.measured_bound]
        mt = [(getattr(m, f"{when}_us"), m.measured_us) for m in models if m.measured_us > 0]
        out[when] = {
            "chains": len(t),
            "models": len(mt),
            "chains_30pct": sum(_within(p, m, CHAIN_BAND) for p, m in t) / len(t),
            "chains_2x": sum(_within_factor(p, m, WIDE_BAND) for p, m in t) / len(t),
            "bound_match": sum(p == m for p, m in bounds) / len(bounds) if bounds else math.nan,
            "models_25pct": sum(_within(p, m, MODEL_BAND) for p, m in mt) / len(mt) if mt else math.nan,
            "median_log2_error": statistics.median(abs(math.log2(p / m)) if p > 0 else math.inf for p, m in t),
        }
    return out


def worse_after_fit(sums: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """A warning per split (:func:`summary` of ``fit`` and ``test``) whose median |log2 error| of chains grew with
    the fit: the spec written prices those reports worse than its base did (an H200 fit onto the shipped h200,
    tested on another seed: chains within 30% 88% -> 74%; a fresh user's busy-CPU profiles: 3.78 -> 4.20, written
    without a word). The test set's, where there is one, is the one to trust."""
    out = []
    for split in ("test", "fit"):
        s = sums.get(split) or {}
        if not s:
            continue
        before, after = s["before"]["median_log2_error"], s["after"]["median_log2_error"]
        if after > before:
            out.append(f"on the {split} set the fit prices chains worse than the spec without profile fits (the "
                       f"'before' column: median |log2 error| {before:.2f} -> {after:.2f}, chains within 30% "
                       f"{100 * s['before']['chains_30pct']:.0f}% -> {100 * s['after']['chains_30pct']:.0f}%): "
                       f"profiles unlike the models you will analyse, or too few of them; the spec is written, but "
                       f"the base may serve better")
    return out


# --- the job -------------------------------------------------------------------------------------------------


def model_key(r: ProfiledReport) -> str:
    """Which model a report profiled: its model file's folder and name and the model's name (two runs of one file,
    from two checkouts, in two report folders or on two days, are one model; ``a/model.py`` and ``b/model.py``,
    one folder per model as many suites keep them, are two)."""
    a = r.analysis
    if not a.model_file:
        return r.name
    path = Path(a.model_file)
    return f"{path.parent.name}/{path.name}:{a.model_name}"


def split_reports(reports: list[ProfiledReport], test: list[ProfiledReport] | None
                  ) -> tuple[list[ProfiledReport], list[ProfiledReport], str]:
    """The fit and test sets and a note on how they were made, split by model (:func:`model_key`), so that no
    test report is a second run of a model the fit saw: ``test`` when given (its reports of a model the fit set
    holds are left out of the test set, and named in the note), else every third model in name order held out
    with all its reports (3 or more models), else no test set."""
    if test is not None:
        fitted = {model_key(r) for r in reports}
        both = [r.name for r in test if model_key(r) in fitted]
        test = [r for r in test if model_key(r) not in fitted]
        return reports, test, f"test set given: {len(test)} report(s)" + (
            f"; {len(both)} of it profile a model the fit set holds too ({', '.join(both[:4])}"
            f"{' ...' if len(both) > 4 else ''}), so they are not in the test set" if both else "")
    models = sorted({model_key(r) for r in reports})
    if len(models) < 3:
        return (sorted(reports, key=lambda r: r.name), [],
                "fewer than 3 models: no test set (give --test DIR to test on reports the fit never saw)")
    held_out = {m for i, m in enumerate(models) if i % 3 == 2}
    fit = sorted((r for r in reports if model_key(r) not in held_out), key=lambda r: r.name)
    held = sorted((r for r in reports if model_key(r) in held_out), key=lambda r: r.name)
    return fit, held, (f"every third model in name order held out: {len(held_out)} of {len(models)} "
                       f"({len(held)} of {len(reports)} reports)")


def _read_profiled(paths: list[Path], skipped: list[str], noisy: list[str]) -> list[ProfiledReport]:
    """The profiled reports among ``paths``; a report analysed without ``--profile`` is named in ``skipped``
    while another one is profiled, one whose profile says its per-op times are not the model's
    (:data:`~fusion_advisor.analyze.records.NOT_THE_MODELS_TIMES`: a busy CPU's run) in ``noisy`` (a fresh
    user's such reports fitted pointwise ops at 885x their roofline).

    Raises:
        UserError: none of ``paths`` holds a profiled report (the first one's reason), or every profiled one is
            noisy.
    """
    out, first_error = [], None
    for p in paths:
        try:
            rep = read_report(p)
        except UnprofiledReportError as e:
            first_error = first_error or e
            skipped.append(str(p))
            continue
        if any(NOT_THE_MODELS_TIMES in n for n in rep.analysis.profile.notes):  # a busy CPU's, the profiler's
            noisy.append(str(p))
            continue
        out.append(rep)
    if not out and noisy:
        raise UserError(f"every profiled report says its per-op times are not the model's (its ops took far longer "
                        f"than the plain model: the profiler's cost, or a busy CPU): {', '.join(noisy[:3])}; profile "
                        f"again on an idle machine")
    if not out and first_error is not None:
        raise first_error
    return out


def fit_from_profiles(fit_paths: Iterable[Path], test_paths: Iterable[Path] | None = None,
                      base: DeviceSpec | None = None, min_samples: int = MIN_SAMPLES) -> FitResult:
    """Fit op-class curves on the reports under ``fit_paths`` and judge them there and on ``test_paths``.

    Args:
        fit_paths: ``analyze --profile`` report folders, or folders of them (:func:`report_folders`).
        test_paths: held-out report folders; ``None``: every third fit report is held out instead.
        base: the spec the curves are added to; default the reports' own (all must share one spec name).
        min_samples: fewest ops a class needs to be fitted.

    Raises:
        UserError: no report, a report without a profile, reports of different specs (without ``base``),
            profiles of a CPU for a GPU's spec or the other way round, or no op measured at all.
    """
    skipped: list[str] = []
    noisy: list[str] = []
    reports = _read_profiled(report_folders(fit_paths), skipped, noisy)
    tests = _read_profiled(report_folders(test_paths), skipped, noisy) if test_paths else None
    every = reports + (tests or [])
    if base is None:
        by_spec = reports_by_spec(every)
        if len(by_spec) > 1:
            which = "; ".join(f"{n}: {', '.join(f[:4])}{' ...' if len(f) > 4 else ''}" for n, f in by_spec.items())
            raise UserError(f"the reports were analysed with different device specs ({which}): fit one device at "
                            "a time, or name the spec to add the fits to with --base")
        base = reports[0].spec
    check_device_kind(every, base)
    base = without_fits(base)
    fit_set, test_set, how = split_reports(reports, tests)
    host, view = fit_host_scales(fit_set, base)
    warm = replace(base, host_time_scale=host[0] if host else 1.0, view_host_scale=view[0] if view else 1.0)
    cold = fit_cold_host_scale(fit_set, warm)
    samples = [s for r in fit_set for s in op_samples(r, base)]
    if not samples:
        raise UserError("no op in the fit set has a measured time above zero: nothing to fit")
    classes = fit_op_times(samples, min_samples)
    if not classes:
        raise UserError(f"no op class has {min_samples} or more measured ops in the fit set ({len(samples)} op(s) "
                        f"measured in all): nothing to fit; profile more or larger models")
    # the fits hold for the dtypes they were measured on: an fp32-only fit set leaves bf16 ops on the roofline
    dtypes = tuple(sorted({s.keys[0].rsplit("/", 1)[-1] for s in samples}))
    fitted = replace(base, op_time_fits={c.key: c.fit for c in classes}, op_time_fit_dtypes=dtypes,
                     host_time_scale=round(host[0], 4) if host else 1.0,
                     cold_host_scale=round(cold[0], 4) if cold else 1.0,
                     view_host_scale=round(view[0], 4) if view else 1.0)
    chains: list[ChainResidual] = []
    models: list[ModelResidual] = []
    for split, group in (("fit", fit_set), ("test", test_set)):
        for r in group:
            rows, model = residuals(r, split, base, fitted)
            chains.extend(rows)
            models.append(model)
    notes = [how] + ([f"skipped (analysed without --profile): {', '.join(skipped)}"] if skipped else []) + (
        [f"left out (their profiles say their per-op times are not the model's: a busy CPU or the profiler's own "
         f"cost): {', '.join(noisy)}"] if noisy else []) + [
        f"{len(samples)} measured op(s) fitted into {len(classes)} class curve(s) "
        f"(classes with fewer than {min_samples} ops keep the roofline or a coarser class's curve)",
        f"host time scale {host[0]:.3f} from {host[1]} op(s) the GPU waited for, one vote per model with "
        f"{MIN_MODEL_HOST_SAMPLES} or more (measured over priced host time)"
        if host else f"host time scale 1: no model with {MIN_MODEL_HOST_SAMPLES} or more ops the GPU waited for "
        f"with a measured host time, or fewer than {MIN_HOST_SAMPLES} such ops in all (profiles from before it was "
        "recorded have none)",
        f"view host scale {view[0]:.3f} from {view[1]} op(s) after a view of {view[2]} model(s) (measured over "
        "priced host time, the op's own price at the host time scale)"
        if view else f"view host scale 1: no model with {MIN_MODEL_HOST_SAMPLES} or more ops after a view the GPU "
        "waited for",
        f"cold host scale {cold[0]:.3f} from {cold[1]} op(s) of {cold[2]} model(s) whose aten op had not run for more "
        f"than {COLD_REUSE_LAUNCHES} launches (measured over the warm in-model price)"
        if cold else f"cold host scale 1: fewer than {MIN_COLD_MODELS} models with a cold op the GPU waited for"]
    if not (host or view or cold) and not any(r.analysis.profile is not None and r.analysis.profile.device == "cuda"
                                              for r in fit_set):
        # a CPU profile measures each op's own time: no GPU waits for the host, so no host time is apart
        notes[-3:] = ["host, view host and cold host scales 1: the fit set's profiles ran on a CPU, where each op's "
                      "measured time holds its own host time (no GPU waits for the host)"]
    if any(k > 1 for r in every for k in r.graph_calls.values()):
        notes.append("graphs run several times per model call: their ops' measured times divided by the calls")
    notes += other_gpu_notes(every, base)
    return FitResult(spec=fitted, base=base, classes=classes, fit_reports=tuple(r.name for r in fit_set),
                     test_reports=tuple(r.name for r in test_set), chains=tuple(chains), models=tuple(models),
                     samples=len(samples), notes=tuple(notes))


def fitted_spec_data(result: FitResult, date: str) -> dict:
    """The fitted spec as YAML fields: the base spec's, ``op_time_fits`` and their source, and a ``fit`` block
    naming the fit and test sets and the accuracy before and after."""
    data = spec_mapping(result.spec)
    def sig(us: float) -> float:  # 6 significant figures: a class of sub-nanosecond roofline times stays above 0
        return float(f"{us:.6g}")

    fits = {c.key: {"scale": round(c.fit.scale, 6), "exponent": c.fit.exponent, "min_us": sig(c.fit.min_us),
                    "max_us": sig(c.fit.max_us), "samples": c.fit.samples} for c in result.classes}
    data["op_time_fits"] = fits
    data["op_time_fit_dtypes"] = list(result.spec.op_time_fit_dtypes)
    data["op_time_fits_source"] = (
        f"fitted by fusion-advisor calibrate --from-profile on {date} from {result.samples} measured ops of "
        f"{len(result.fit_reports)} analyze --profile report(s): log t = a + b log r per op class (b fitted only "
        f"with {SLOPE_MIN_SAMPLES}+ ops spanning {SLOPE_MIN_SPAN:g}x), t the measured busy time, r the roofline time")
    if result.spec.host_time_scale != 1.0:
        data["host_time_scale_source"] = (
            f"fitted by fusion-advisor calibrate --from-profile on {date} from the host time the fit set's ops "
            "measured where the GPU waited for them, over their calibrated price (fit_profiles.fit_host_time_scale)")
    if result.spec.cold_host_scale != 1.0:
        data["cold_host_scale_source"] = (
            f"fitted by fusion-advisor calibrate --from-profile on {date} from the host time the fit set's ops whose "
            f"aten op had not run for more than {COLD_REUSE_LAUNCHES} launches measured where the GPU waited for them, "
            "over their warm in-model price (fit_profiles.fit_cold_host_scale)")
    if result.spec.view_host_scale != 1.0:
        data["view_host_scale_source"] = (
            f"fitted by fusion-advisor calibrate --from-profile on {date} from the host time the fit set's ops after "
            "one or more views measured where the GPU waited for them, less their own in-model price, over the views' "
            "calibrated price (fit_profiles.fit_view_host_scale)")
    if not str(data.get("name", "")).endswith("-fitted"):
        data["name"] = f"{data['name']}-fitted"
    data["fit"] = {
        "date": date,
        "fit_set": list(result.fit_reports),
        "test_set": list(result.test_reports),
        "notes": list(result.notes),
        "accuracy": {split: _rounded(summary(result, split)) for split in ("fit", "test") if summary(result, split)},
    }
    parse_spec(data, "calibrate --from-profile output")  # the loader must take what we write
    return data


def _rounded(d: dict) -> dict:
    return {k: _rounded(v) if isinstance(v, dict) else (round(v, 4) if isinstance(v, float) and math.isfinite(v)
                                                      else (None if isinstance(v, float) else v))
            for k, v in d.items()}


def residual_frame(result: FitResult):
    """Per-chain residuals as a DataFrame (one row per chain; ``before_ratio`` / ``after_ratio`` = predicted /
    measured)."""
    import pandas as pd

    frame = pd.DataFrame([r.__dict__ for r in result.chains])
    if not frame.empty:
        frame["before_ratio"] = frame["before_us"] / frame["measured_us"]
        frame["after_ratio"] = frame["after_us"] / frame["measured_us"]
    return frame


def write_fit(result: FitResult, out: Path, date: str) -> dict[str, Path]:
    """Write the fitted spec YAML to ``out`` and, beside it, ``<stem>_residuals.csv`` (per chain),
    ``<stem>_models.csv`` (per model) and ``<stem>_classes.csv`` (per fitted class), atomically.

    Raises:
        CalibrationError: ``out`` is a file calibrate did not write, or not a .yaml path.
    """
    import pandas as pd

    from fusion_advisor.devices.calibrate import check_out_file, render_spec
    from fusion_advisor.devices import load_spec
    from fusion_advisor.report.write import atomic_write_bytes

    out = Path(out)
    check_out_file(out)
    data = fitted_spec_data(result, date)
    paths = {"spec": out, "residuals": out.with_name(f"{out.stem}_residuals.csv"),
             "models": out.with_name(f"{out.stem}_models.csv"), "classes": out.with_name(f"{out.stem}_classes.csv")}
    if not out.exists():  # the tables beside a spec we wrote are ours; any other file of their names is not
        taken = [str(p) for k, p in paths.items() if k != "spec" and p.exists()]
        if taken:
            raise CalibrationError(f"--out {out}: {', '.join(taken)} exist(s) and fusion-advisor did not write "
                                   "them beside this spec; refusing to overwrite (choose another file name)")
    atomic_write_bytes(paths["spec"], render_spec(data).encode("utf-8"))
    load_spec(str(out))
    atomic_write_bytes(paths["residuals"], residual_frame(result).to_csv(index=False).encode("utf-8"))
    models = pd.DataFrame([m.__dict__ for m in result.models])
    atomic_write_bytes(paths["models"], models.to_csv(index=False).encode("utf-8"))
    classes = pd.DataFrame([{"class": c.key, "samples": c.fit.samples, "scale": c.fit.scale,
                             "exponent": c.fit.exponent, "min_roofline_us": c.fit.min_us,
                             "max_roofline_us": c.fit.max_us, "median_measured_over_roofline": c.median_ratio}
                            for c in result.classes])
    atomic_write_bytes(paths["classes"], classes.to_csv(index=False).encode("utf-8"))
    return paths
