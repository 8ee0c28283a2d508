"""Host time of eager PyTorch beyond one launch per kernel, measured for ``calibrate``: per view op, per
``nn.Module`` call, and per call of the op classes whose calls cost the host more than an elementwise add (cuDNN and
cuBLAS set up each call; the modules that issue them run Python of their own). The spec's ``view_overhead_us``,
``module_call_us`` and ``launch_overhead_by_class`` (:func:`fusion_advisor.analyze.roofline.op_launch_us`). Also
the host time per call of a compiled model beyond its kernels (:func:`measure_compiled_call`: the spec's
``compiled_call_us`` and ``graph_replay_us``, which the whole-model route predictions charge).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fusion_advisor.kernel_tools.bench import sync_device


def per_op_us(device: str, body: Callable[[], Any], ops: int, repeats: int, warmup: bool = True) -> float:
    """Median wall time per call of ``body`` (us) over ``repeats`` loops of ``ops`` calls after one warm-up loop
    (none with ``warmup`` false), synchronised once per loop."""
    import time

    times = []
    for i in range(repeats + warmup):
        sync_device(device)
        start = time.perf_counter()
        for _ in range(ops):
            body()
        sync_device(device)
        if i or not warmup:
            times.append((time.perf_counter() - start) / ops * 1e6)
    return float(statistics.median(times))


def add_probe(device: str, numel: int = 1024) -> Callable[[], torch.Tensor]:
    """The launch probe: one tiny eager ``torch.add(x, 1.0)`` on ``numel`` fp32 elements, whose wall time per call
    in a loop is the spec's ``launch_overhead_us`` (calibrate); the profile's dispatch probe times the same op
    (``fusion_advisor.analyze.profile._probe_us``)."""
    x = torch.ones(numel, device=device)
    return lambda: torch.add(x, 1.0)


def host_us_at_launch(device: str, body: Callable[[], Any], launch_us: float, ops: int, repeats: int,
                      numel: int = 1024) -> float:
    """Host time per call of ``body`` (us) at the host speed ``launch_us`` was measured at: in each of ``repeats``
    rounds a loop of ``ops`` calls of ``body`` and one of :func:`add_probe`, back to back (:func:`per_op_us`); the
    median of their ratios, times ``launch_us``. A host's speed moves 1.5x within minutes and 1.3-2x with the
    process's history (benchmarks/results/h200/host/process_state_host.json, host_probe_modes.json); a ratio to an
    add timed beside it holds where microseconds do not, and the analysis scales every host cost to the add its
    profile measures (``DeviceSpec.at_host_speed``). ``launch_us`` 0: :func:`per_op_us` as measured."""
    if launch_us <= 0:
        return per_op_us(device, body, ops, repeats)
    add = add_probe(device, numel)
    ratios = []
    for i in range(repeats):  # the first round warms both loops up
        t = per_op_us(device, body, ops, 1, warmup=i == 0)
        ratios.append(t / max(per_op_us(device, add, ops, 1, warmup=i == 0), 1e-9))
    return float(statistics.median(ratios)) * launch_us


class _AddOne(torch.nn.Module):
    """The innermost module of :func:`measure_module_call_us`: one ``x + 1``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.add(x, 1.0)


class _Calls(torch.nn.Module):
    """A module whose forward calls its child, as a model's blocks call their layers (``self.inner(x)``: the
    attribute lookup through ``nn.Module.__getattr__`` and the child's ``__call__``)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


#: The view ops :func:`measure_view_us` times, as model code writes them: reshapes, axis moves, indexing.
VIEW_PROBES = ("x.view(-1)", "x.reshape(-1)", "x.flatten()", "x.permute(1, 0)", "x.transpose(0, 1)", "x.t()",
               "x.unsqueeze(0)", "x[0]", "x[:, :16]", "x.expand(2, -1, -1)")


def measure_view_us(device: str, ops: int = 2000, numel: int = 1024, repeats: int = 5, launch_us: float = 0.0
                    ) -> float:
    """Host time of one eager view op (us): the median over :data:`VIEW_PROBES` (each ``ops`` calls in a loop on a
    tiny ``[32, numel // 32]`` tensor, :func:`host_us_at_launch` of ``repeats`` rounds). A view launches no kernel;
    this is the dispatcher's cost of making the alias plus, for indexing, Python's ``__getitem__`` parsing; one
    ``x.view(-1)`` alone (what calibrate timed before 2026-12) is the cheapest of them."""
    x = torch.ones(32, max(numel // 32, 16), device=device)
    per = [host_us_at_launch(device, eval(f"lambda: {code}", {"x": x}), launch_us, ops, repeats, numel)
           for code in VIEW_PROBES]
    return float(statistics.median(per))


def measure_module_call_us(device: str, ops: int = 2000, numel: int = 1024, repeats: int = 5,
                           launch_us: float = 0.0) -> float:
    """Host time of one ``nn.Module`` call inside a model (us): a module calling a child that calls a module whose
    forward is one ``x + 1``, less that last module called alone, over the two nested calls; ``ops`` calls per
    loop, the loops interleaved ``repeats`` times, the median of the differences (0 when not above it). With
    ``launch_us``, each round's difference is over an :func:`add_probe` loop timed beside it, times ``launch_us``
    (:func:`host_us_at_launch`). Each nested call is what a model's forward pays per layer it calls: the child's
    lookup through ``nn.Module.__getattr__`` and its ``__call__`` (hooks checked, ``forward`` entered)."""
    x = torch.ones(numel, device=device)
    leaf = _AddOne().to(device)
    nested = _Calls(_Calls(leaf))
    add = add_probe(device, numel)
    diffs = []
    for _ in range(repeats):
        diff = per_op_us(device, lambda: nested(x), ops, 1) - per_op_us(device, lambda: leaf(x), ops, 1)
        diffs.append(diff / max(per_op_us(device, add, ops, 1), 1e-9) * launch_us if launch_us > 0 else diff)
    return max(statistics.median(diffs) / 2, 0.0)


@dataclass(frozen=True)
class HostProbe:
    """One op class's host-cost probe: the eager call model code makes for it, and what of that call the analysis
    prices elsewhere.

    Attributes:
        fn, args: the call ``fn(*args)`` on tiny tensors: through the ``nn.Module`` that usually issues the op where
            there is one (``nn.Conv2d``, ``nn.Linear``, ``nn.BatchNorm2d``...: its ``forward``'s Python and the
            functional wrapper are host time the aten op alone does not show), else the ``torch`` function.
        views: view ops the capture records for the call beside the op (``nn.Linear``: the weight's ``t``), each
            charged ``view_overhead_us`` apart.
        launches: other kernels the capture records for the call (``nn.BatchNorm2d`` in training: the
            ``num_batches_tracked`` add), each charged ``launch_overhead_us`` apart.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    views: int = 0
    launches: int = 0

    @property
    def module(self) -> bool:
        """Whether the call enters an ``nn.Module`` (the analysis charges ``module_call_us`` for that apart)."""
        return isinstance(self.fn, torch.nn.Module)

    def __call__(self) -> Any:
        return self.fn(*self.args)


#: Classes that take another's measurement: the same eager call captured under another aten name
#: (training BatchNorm is ``_native_batch_norm_legit_functional`` after AOTAutograd's functionalisation, the
#: in-place ``_native_batch_norm_legit`` in graphs captured without it).
ALIASES = {"normalization/_native_batch_norm_legit": "normalization/_native_batch_norm_legit_functional"}


def host_probes(device: str) -> dict[str, HostProbe]:
    """One tiny eager call per op class whose host cost :func:`measure_launch_by_class` measures, keyed by the
    class of the aten op the captured graphs call for it (:func:`fusion_advisor.analyze.op_classes.op_class_keys`)."""
    nn, F = torch.nn, torch.nn.functional
    f = dict(device=device, dtype=torch.float32)
    x4, x2 = torch.randn(2, 8, 8, 8, **f), torch.randn(16, 64, **f)
    a, m = torch.randn(16, 16, **f), torch.randn(4, 16, 16, **f)
    return {
        "conv": HostProbe(nn.Conv2d(8, 8, 3, padding=1).to(device), (x4,)),
        "matmul/mm": HostProbe(torch.matmul, (a, a)),
        "matmul/addmm": HostProbe(nn.Linear(16, 16).to(device), (a,), views=1),
        "matmul/bmm": HostProbe(torch.bmm, (m, m)),
        "normalization/_native_batch_norm_legit_no_training": HostProbe(nn.BatchNorm2d(8).to(device).eval(), (x4,)),
        "normalization/_native_batch_norm_legit_functional":
            HostProbe(nn.BatchNorm2d(8).to(device).train(), (x4,), launches=1),
        "normalization/native_layer_norm": HostProbe(nn.LayerNorm(64).to(device), (x2,)),
        "normalization/native_group_norm": HostProbe(nn.GroupNorm(2, 8).to(device), (x4,)),
        "softmax": HostProbe(F.softmax, (x2, -1)),
        "reduction": HostProbe(torch.sum, (x2, -1)),
        "other/max_pool2d_with_indices": HostProbe(nn.MaxPool2d(2).to(device), (x4,)),
        "other/avg_pool2d": HostProbe(nn.AvgPool2d(2).to(device), (x4,)),
        "copy/cat": HostProbe(torch.cat, ([x2, x2],)),
        "copy/clone": HostProbe(torch.clone, (x2,)),
    }


def measure_launch_by_class(device: str, module_call_us: float = 0.0, view_us: float = 0.0, launch_us: float = 0.0,
                            ops: int = 500, repeats: int = 3) -> dict[str, float]:
    """Host time per eager call (us) of each op class of :func:`host_probes`: ``ops`` tiny calls in a loop,
    synchronised once per loop (a tiny call's device time is below its host time, so the loop runs at the host's
    pace), each loop beside an add loop, at the host speed of ``launch_us`` (:func:`host_us_at_launch`, median of
    ``repeats`` rounds), less what the analysis charges the call apart: ``module_call_us`` for a probe through an
    ``nn.Module``, ``view_us`` per view and ``launch_us`` per other kernel the capture records beside the op
    (:class:`HostProbe`; never below a tenth of the call). The spec's ``launch_overhead_by_class``."""
    out = {}
    for key, probe in host_probes(device).items():
        try:
            t = host_us_at_launch(device, probe, launch_us, ops, repeats)
        except (RuntimeError, TypeError):  # an op this torch build lacks on this device: the class keeps the default
            continue
        apart = module_call_us * probe.module + view_us * probe.views + launch_us * probe.launches
        out[key] = round(max(t - apart, 0.1 * t), 3)
    out.update({alias: out[key] for alias, key in ALIASES.items() if key in out})
    return out


@dataclass(frozen=True)
class ActivityHostCost:
    """Host time per device activity of a cuDNN convolution call, fitted over :func:`conv_activity_probes`.

    Attributes:
        probe_kernels: device activities (kernels, memsets, copies) the ``conv`` class's probe of
            :func:`host_probes` issues per call: what its ``launch_overhead_by_class`` entry already pays for.
        share: host time per further activity as a share of a call issuing ``probe_kernels``: the least-squares
            slope of host time over activities across the probes, over the fitted line's value at
            ``probe_kernels``. A share, not microseconds: the host's speed moved 1.5x between calibrations of one
            day (its slope 7.9-14.7 us), the share 0.21-0.29.
        probes: ``(activities, host us)`` of each probe, for the spec's source line.
    """

    probe_kernels: float
    share: float
    probes: tuple[tuple[float, float], ...]


def conv_activity_probes(device: str) -> list[HostProbe]:
    """Tiny ``nn.Conv*`` calls that cuDNN runs as different numbers of device activities (a 1x1 convolution as one
    GEMM, a 3x3 one with layout transforms around it, a transposed one as a data-gradient with more), each far
    shorter on the GPU than on the host. The first is the ``conv`` class's probe of :func:`host_probes`."""
    nn = torch.nn
    f = dict(device=device, dtype=torch.float32)
    conv = host_probes(device)["conv"]
    x4 = conv.args[0]
    x5, wide = torch.randn(2, 8, 4, 8, 8, **f), torch.randn(2, 64, 16, 16, **f)
    return [conv,
            HostProbe(nn.Conv2d(8, 8, 1).to(device), (x4,)),
            HostProbe(nn.Conv2d(64, 64, 3, padding=1).to(device), (wide,)),
            HostProbe(nn.Conv2d(64, 64, 1).to(device), (wide,)),
            HostProbe(nn.ConvTranspose2d(8, 8, 3, stride=2).to(device), (x4,)),
            HostProbe(nn.Conv3d(8, 8, 3, padding=1).to(device), (x5,)),
            HostProbe(nn.Conv2d(8, 8, 3, padding=1, groups=4).to(device), (x4,))]


#: Least spread of activity counts (max - min) across the probes for a slope to be fitted.
MIN_ACTIVITY_SPREAD = 2.0


def measure_activity_host_share(device: str, ops: int = 200, repeats: int = 7) -> ActivityHostCost | None:
    """Host time per device activity of a cuDNN convolution call, as a share of a call issuing as many as the
    ``conv`` class's probe: each of :func:`conv_activity_probes` timed as :func:`measure_launch_by_class` times a
    class (``ops`` calls in a loop, synchronised once), the probes' loops interleaved round by round, median of
    ``repeats`` rounds, its activities counted by the profiler; the least-squares slope of the one over the other,
    over the line's value at the probe's count. cuDNN issues a convolution as 1-12 activities depending on its
    geometry, and each costs the host about a launch (benchmarks/results/h200/host/host_by_shape.json: ResNet-101's
    convolutions of 1 activity took a median 36 us of host time per call, those of 5 activities 76 us). None on a
    CPU, and where the probes' counts spread less than :data:`MIN_ACTIVITY_SPREAD` (no slope to fit).

    Raises:
        RuntimeError: from the profiler, when CUDA is asked for and absent.
    """
    if device != "cuda":
        return None
    from fusion_advisor.kernel_tools.bench import device_kernels_per_call

    probes, counts = [], []
    for probe in conv_activity_probes(device):
        try:
            counts.append(device_kernels_per_call(probe))
            probes.append(probe)
        except RuntimeError:  # a geometry this cuDNN build refuses: the others still fit
            continue
    if len(probes) < 3 or max(counts) - min(counts) < MIN_ACTIVITY_SPREAD:
        return None
    rounds: list[list[float]] = [[] for _ in probes]
    for _ in range(repeats):  # interleaved: a host whose speed drifts moves every probe alike
        for times, probe in zip(rounds, probes):
            times.append(per_op_us(device, probe, ops, 1))
    times = [statistics.median(t) for t in rounds]
    slope, intercept = statistics.linear_regression(counts, times)
    at_probe = intercept + slope * counts[0]
    return ActivityHostCost(counts[0], max(slope, 0.0) / at_probe if at_probe > 0 else 0.0,
                            tuple((round(a, 2), round(t, 2)) for a, t in zip(counts, times)))


@dataclass(frozen=True)
class CompiledCallCost:
    """Host time per call of a whole model under ``torch.compile``, beyond the work of its kernels
    (:func:`measure_compiled_call`).

    Attributes:
        compiled_call_us: default mode: dynamo's guards and Inductor's wrapper per call of a compiled graph, beyond
            one launch per kernel (us).
        graph_replay_us: ``mode="reduce-overhead"``: the host time of one call replaying the CUDA-graph tree (its
            checks, the input copy's launch, the graph launch), us; None on a CPU (no CUDA graphs).
        probes: the timed calls in units of the add probe beside them (``{"compiled": 4.1, "reduce-overhead":
            8.1}``), for the spec's source line.
    """

    compiled_call_us: float
    graph_replay_us: float | None
    probes: dict[str, float]


def _compiled_chain(x: torch.Tensor) -> torch.Tensor:
    """The model :func:`measure_compiled_call` compiles: four multiply-adds (eight eager aten ops), one fused
    kernel under Inductor."""
    for i in range(4):
        x = x * 1.0001 + 0.001 * i
    return x


def measure_compiled_call(device: str, launch_us: float, ops: int = 200, repeats: int = 5,
                          backend: str = "inductor") -> CompiledCallCost:
    """Host time per call of a compiled model beyond its kernels: :func:`_compiled_chain` on 1,024 floats (a
    negligible kernel: the loop runs at the host's pace) compiled by ``torch.compile`` (``backend``), and on a GPU
    also with ``mode="reduce-overhead"``, each timed as :func:`host_us_at_launch` times a class (``ops`` calls in a
    loop beside an add loop, median of ``repeats`` rounds' ratios, times ``launch_us``). ``compiled_call_us`` is
    the compiled call less one launch (its fused kernel's, which the roofline charges apart); ``graph_replay_us``
    the reduce-overhead call whole (None where CUDA graphs failed). Measured on one H100
    (benchmarks/results/h100/host/compiled_call_probe.json): a compiled call cost about 4 adds whatever the chain's
    length (1, 4 or 16 multiply-adds), a reduce-overhead call about 8; the whole-model route predictions had priced
    neither (a fresh user: three integer ops predicted
    41.1 us eager, 2.4 us under CUDA graphs). Compiling takes a few seconds; dynamo's caches are reset after,
    for the whole process (a caller's compiled models compile again).

    Raises:
        RuntimeError: the backend cannot compile on ``device`` (no C++ compiler for Inductor's CPU code, no Triton;
            dynamo's errors derive from it).
        ValueError: ``launch_us`` not above 0.
    """
    if launch_us <= 0:
        raise ValueError(f"launch_us must be above 0 (the add probe's host time), got {launch_us}")
    x = torch.ones(1024, device=device)
    probes: dict[str, float] = {}
    try:
        compiled = torch.compile(_compiled_chain, backend=backend, dynamic=False)
        probes["compiled"] = host_us_at_launch(device, lambda: compiled(x), launch_us, ops, repeats) / launch_us
        if device == "cuda" and backend == "inductor":
            try:
                graphed = torch.compile(_compiled_chain, mode="reduce-overhead", dynamic=False)
                probes["reduce-overhead"] = host_us_at_launch(device, lambda: graphed(x), launch_us, ops,
                                                              repeats) / launch_us
            except RuntimeError:  # CUDA graphs refused here: the compiled call stands on its own
                pass
    finally:
        torch._dynamo.reset()  # process-wide: dynamo's caches and the CUDA-graph trees of every compiled model
    replay = probes["reduce-overhead"] * launch_us if "reduce-overhead" in probes else None
    return CompiledCallCost(max(probes["compiled"] - 1.0, 0.0) * launch_us, replay,
                            {k: round(v, 2) for k, v in probes.items()})
