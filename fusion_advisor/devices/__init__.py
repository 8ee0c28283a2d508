"""Device specs: the roofline ceilings (memory bandwidth, peak FLOP/s per dtype, launch overhead) of a device.

Shipped specs are YAML files beside this module (``h200``, ``h100``, ``a100``, ``l4``, ``cpu``); ``--gpu`` also takes
the path of a YAML file with the same fields. Every number carries its source.

Beside the specs, the tools that measure a device: :mod:`~fusion_advisor.devices.doctor` (stack checks, with
:mod:`~fusion_advisor.devices.copy_kernel`'s Triton copy kernel), :mod:`~fusion_advisor.devices.calibrate` (a measured
spec YAML) and :mod:`~fusion_advisor.devices.fit_profiles` (per-op-class eager-time curves, ``calibrate
--from-profile``) and :mod:`~fusion_advisor.devices.op_rates` (measured convolution rates by geometry).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from fusion_advisor.devices.op_rates import RECURRENT_CELLS, ConvRate, MatmulRate
from fusion_advisor.devices.reduction_rates import ReductionRate
from fusion_advisor.errors import DeviceSpecError

SPEC_DIR = Path(__file__).parent

_REQUIRED = ("name", "memory_bandwidth_gbps", "tensor_tflops", "vector_tflops", "launch_overhead_us")

#: SDPA backends an ``attention_rates`` entry may name (:mod:`fusion_advisor.analyze.sdpa`).
ATTENTION_BACKENDS = ("flash", "efficient", "cudnn", "math")
_RATE_KEYS = ("backend", "dtype", "seq", "head_dim", "causal", "masked", "tflops")
#: dtype names the optional per-dtype rates (``unaligned_tensor_tflops``, ``attention_rates[].dtype``) may use:
#: the names the op graph gives dtypes (:func:`fusion_advisor.dtypes.dtype_name`), plus tf32; another name would
#: never match an op and its number would be silently unused.
RATE_DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16")
#: The 16-bit float dtype whose attention rates stand in for one a spec has none of: the GPU runs both on the same
#: tensor-core kernels (:data:`fusion_advisor.devices.attention_rates.ATTENTION_DTYPES` says what was measured).
HALF_TWIN = {"fp16": "bf16", "bf16": "fp16"}


#: A number in exponent form that PyYAML (YAML 1.1) leaves as text: ``3.35e3``, ``1e8`` (it wants ``3.35e+3``).
_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _number(value: Any, where: str, unit: str, positive: bool = True) -> float:
    """``value`` as a finite float, > 0 (``positive``) or >= 0; else :class:`DeviceSpecError` naming ``where``.
    Booleans and strings are refused (YAML ``true`` or ``"5"`` is a typo, not a rate), except a number in the
    exponent form PyYAML reads as text (:data:`_YAML11_FLOAT`)."""
    import math

    if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
        value = float(value)  # 3.35e3: YAML 1.1 (PyYAML) reads an exponent without a dot and sign as text
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and (value > 0 if positive else value >= 0)
    if not ok:
        raise DeviceSpecError(f"{where} must be a {'positive' if positive else 'non-negative'} number "
                              f"({unit}, finite), got {value!r}")
    return float(value)


def _optional_fields(data: dict[str, Any], origin: str) -> tuple[float, dict[str, float], float]:
    """The optional measured fields ``elementwise_overhead_us`` (us, >= 0), ``unaligned_tensor_tflops`` (a
    mapping dtype -> TFLOP/s > 0, dtypes from :data:`RATE_DTYPES`) and ``strided_bandwidth_gbps`` (GB/s > 0),
    validated; absent (or null) fields give 0 / ``{}``. Errors name the file and the field."""
    elementwise = data.get("elementwise_overhead_us")
    elementwise = 0.0 if elementwise is None else _number(elementwise, f"{origin}: field 'elementwise_overhead_us'",
                                                          "us", positive=False)
    raw = data.get("unaligned_tensor_tflops")
    if raw is not None and not isinstance(raw, dict):
        raise DeviceSpecError(f"{origin}: field 'unaligned_tensor_tflops' must be a mapping of dtype "
                              f"({', '.join(RATE_DTYPES)}) to TFLOP/s, got {raw!r}")
    unaligned = {}
    for k, v in (raw or {}).items():
        if str(k) not in RATE_DTYPES:
            raise DeviceSpecError(f"{origin}: field 'unaligned_tensor_tflops': unknown dtype {k!r}; known: "
                                  f"{', '.join(RATE_DTYPES)}")
        unaligned[str(k)] = _number(v, f"{origin}: field 'unaligned_tensor_tflops.{k}'", "TFLOP/s")
    strided = data.get("strided_bandwidth_gbps")
    strided = 0.0 if strided is None else _number(strided, f"{origin}: field 'strided_bandwidth_gbps'", "GB/s")
    return elementwise, unaligned, strided


@dataclass(frozen=True)
class AttentionRate:
    """One measured SDPA rate: ``backend`` on q/k/v of ``dtype`` with Lq = Lk = ``seq`` and ``head_dim``.

    Attributes:
        backend: one of :data:`ATTENTION_BACKENDS`.
        dtype: q/k/v dtype name (``"bf16"``, ``"fp16"``, ``"fp32"``).
        seq: sequence length (tokens).
        head_dim: head dimension.
        causal: measured with ``is_causal=True`` (FLOPs counted as half, as ``fusion_advisor.analyze.graph`` counts them).
        tflops: TFLOP/s, ``4 b h s^2 d`` FLOPs (halved when causal) over the median time.
        masked: measured with an additive ``[B, 1, S, S]`` attention mask (cuDNN runs about half as fast with one
            on an H200: benchmarks/results/h200/sdpa/sdpa_backends.json).
    """

    backend: str
    dtype: str
    seq: int
    head_dim: int
    causal: bool
    tflops: float
    masked: bool = False


#: A roofline-priced op class fitted only on ops whose roofline times all lie under this (us) keeps, above its
#: fitted range, the microseconds its largest op lost against the roofline rather than the ratio
#: (:meth:`OpTimeFit.__call__`): at these sizes a kernel's fixed device time (2.4 us per eager elementwise kernel
#: on the H200) is most of the excess.
FIXED_TIME_RANGE_US = 20.0


@dataclass(frozen=True)
class OpTimeFit:
    """Measured eager device time of one op class as a function of its roofline time, fitted from profiles
    (``fusion-advisor calibrate --from-profile``, :mod:`fusion_advisor.devices.fit_profiles`).

    ``t = scale * r ** exponent`` (both in us) for a roofline time ``r`` in ``[min_us, max_us]`` (the fitted
    range); outside it the curve continues proportionally from its nearer end (``t(edge) * r / edge``), so an op
    far larger or smaller than any fitted one keeps the fitted efficiency of the nearest measured size.

    Attributes:
        scale: ``exp(a)`` of the log-log fit ``log t = a + exponent * log r`` (us ** (1 - exponent)).
        exponent: the fit's slope: 1 for a constant efficiency factor; below 1 when small ops of the class run
            further below the roofline than large ones (ramp-up, tails, occupancy).
        min_us: smallest roofline time fitted (us).
        max_us: largest roofline time fitted (us).
        samples: measured ops fitted.
    """

    scale: float
    exponent: float = 1.0
    min_us: float = 0.0
    max_us: float = float("inf")
    samples: int = 0

    def __call__(self, roofline_us: float, bounded_gain: bool = False) -> float:
        """The fitted device time (us) of an op whose roofline time is ``roofline_us`` (0 stays 0).

        ``bounded_gain`` (an op priced at its roofline, not from a measured table: in practice the memory-bound
        classes, elementwise ops and copies): above the fitted range a curve under the roofline
        keeps the microseconds its largest fitted op saved, not the ratio. Inside a model a memory-bound op that
        beats the measured copy bandwidth reads some of its input from L2, where its producer left it; the bytes
        L2 holds are bounded, and so is the gain: on the H200 a standalone 6.4 GB hardtanh took 1.0x its roofline
        where its class's in-model fits (ops of up to 23 us) ran at 0.83x. A loss over the roofline is held the
        same way where every fitted op was small (``max_us`` under :data:`FIXED_TIME_RANGE_US`): such a fit learnt
        a kernel's fixed device time, not a bandwidth factor (the H200's clamp_min and index fits, ops of about
        1 us, read proportionally priced a 10 ms op at 1.4x and 2.3x its roofline; found by a reviewer). On the
        shipped H200 and H100 accuracy sets this moved the chains within 30% by at most 0.2 points."""
        if roofline_us <= 0:
            return 0.0
        edge = min(max(roofline_us, self.min_us), self.max_us) if self.min_us > 0 else roofline_us
        at_edge = self.scale * edge ** self.exponent
        if bounded_gain and roofline_us > edge and (at_edge < edge or self.max_us < FIXED_TIME_RANGE_US):
            return roofline_us + (at_edge - edge)
        return at_edge * (roofline_us / edge)


@dataclass(frozen=True)
class DeviceSpec:
    """Roofline ceilings of one device.

    Attributes:
        name: short name (``"h200"``).
        display_name: full device name.
        memory_bandwidth_gbps: peak memory bandwidth in GB/s (1e9 bytes/s), counting bytes read plus written.
        tensor_tflops: matmul ceiling in TFLOP/s by operand dtype (``bf16``, ``fp16``, ``tf32``, ``fp32``).
        vector_tflops: elementwise/reduction ceiling in TFLOP/s by dtype.
        attention_tflops: optional, fused attention (``F.scaled_dot_product_attention``, flash / memory-efficient
            kernels) TFLOP/s by dtype, measured: these kernels reach well under the matmul peak (softmax, masking and
            the online rescaling between their two GEMMs). Attention ops without an entry use ``tensor_tflops``.
        attention_rates: optional, measured SDPA rates per backend, dtype, sequence length, head dim and causal flag
            (``fusion-advisor calibrate``); used by :meth:`attention_peak_tflops` before ``attention_tflops``.
        strided_bandwidth_gbps: optional, bandwidth (GB/s, read + written) of an eager copy reading a permuted view
            (``x.transpose(1, 2).contiguous()``), measured; the memory ceiling of non-matmul ops that read a
            permuted input (:attr:`fusion_advisor.analyze.records.OpInfo.reads_permuted`). 0: not measured, such ops use
            ``memory_bandwidth_gbps``.
        unaligned_tensor_tflops: optional, measured matmul TFLOP/s by dtype when a leading dimension is not a
            multiple of 16 bytes (e.g. GPT-2's 50257-column vocabulary projection in bf16): cuBLAS then falls back to
            ``align1`` kernels far below the peak. Dtypes without an entry use ``tensor_tflops``.
        elementwise_overhead_us: optional, measured fixed device time (us) of an eager elementwise/reduction kernel
            beyond its bytes at copy bandwidth (ramp-up and tail of a bandwidth-bound kernel), as a CUDA-graph
            replay of back-to-back kernels measures it (the gap to the next kernel included): what a fused or
            graphed kernel pays; 0: not measured.
        host_time_scale: optional, fitted from ``analyze --profile`` runs
            (:func:`fusion_advisor.devices.fit_profiles.fit_host_time_scale`): the eager host time an op costs
            inside a model over the tight-loop price calibrate measured (``launch_overhead_us``, its by-class
            entries, views and module calls all take it; a recurrent layer's step loop, cuDNN's own, does not).
            1: not fitted.
        cold_host_scale: optional, fitted from ``analyze --profile`` runs
            (:func:`fusion_advisor.devices.fit_profiles.fit_cold_host_scale`): the host time inside a model of an op
            whose aten op has not run for more than ``roofline.COLD_REUSE_LAUNCHES`` launches (a classifier head's
            ``addmm``, once per run), over the in-model price of the same op run often (``host_time_scale``'s).
            1: not fitted.
        view_host_scale: optional, fitted from ``analyze --profile`` runs
            (:func:`fusion_advisor.devices.fit_profiles.fit_view_host_scale`): the host time of a view op inside a
            model over its in-model price without it (``view_overhead_us``, calibrate's tight-loop price, times
            ``host_time_scale``): the captured graph
            issues every view its aten ops take (``nn.Linear`` on a 3-D input: a ``view``, a ``t`` and a
            ``view`` around its ``addmm``), each a dispatcher call of its own. 1: not fitted.
        kernel_busy_overhead_us: optional, the same as the profiler sees it: an eager kernel's own duration beyond
            its bytes, without the gap to the next kernel, measured by ``calibrate``
            (:func:`fusion_advisor.devices.memory_rates.measure_kernel_busy_overhead_us`); an eager op's device time
            (what a profile measures as busy) uses it where set, else ``elementwise_overhead_us``. On the H200 261
            profiled elementwise kernels under 0.1 MB took a median 0.99 us against the graph replay's 2.38.
        op_time_fits: optional, eager device time per op class fitted from profiles (:class:`OpTimeFit`), keyed
            ``category``, ``category/detail`` or ``category/detail/dtype`` (:func:`fusion_advisor.analyze.op_classes.op_class_keys`;
            ``conv/conv3d/fp32``); the roofline applies the most specific one an op has. Empty: the plain roofline.
        op_time_fit_dtypes: the op dtypes (``fp32``, ``bf16``) the fits were measured on: an op of another dtype
            keeps the plain roofline, so a class-level curve learnt from fp32 models never reprices bf16 ones.
            Empty: the fits apply to every dtype.
        route_efficiency: optional, measured share of the fused roofline (fused bytes at copy bandwidth) a route's
            code reaches, by route (``torch.compile``, ``triton``) and chain pattern (``rmsnorm``; ``default``
            for any other pattern): ``{"torch.compile": {"softmax": 0.43, ...}}``. A route without an entry is
            priced at the roofline (1.0), as before these were measured; a ``triton`` pattern without one, at
            ``torch.compile``'s share where the table has entries (:meth:`efficiency`).
        conv_rates: optional, measured convolutions (:class:`fusion_advisor.devices.op_rates.ConvRate`: class,
            dtype, geometry, achieved TFLOP/s, bytes; ``calibrate``): a convolution's eager time is the roofline
            fitted through the measured convolutions of the same class, dtype and layout, locally corrected where
            that helps (:func:`fusion_advisor.devices.op_rates.conv_time_us`). Empty: the tensor-core roofline.
        matmul_rates: optional, measured matmuls (:class:`fusion_advisor.devices.op_rates.MatmulRate`; ``calibrate``):
            ``mm`` / ``addmm`` / ``bmm`` ops take the roofline fitted through the measured ones of their class and
            dtype (:func:`fusion_advisor.devices.op_rates.matmul_time_us`; fewer than a dozen: their nearest
            neighbours' rate). Empty: the tensor-core roofline.
        reduction_rates: optional, measured normalizations, softmaxes and reductions
            (:class:`fusion_advisor.devices.reduction_rates.ReductionRate`: class, dtype, geometry, bytes, kernel time
            and count; ``calibrate``): such an op's eager time is interpolated from the entries of its class nearest
            its geometry (:func:`fusion_advisor.devices.reduction_rates.reduction_time_us`). Empty: its bytes at
            copy bandwidth.
        view_overhead_us: optional, measured host time (us) of one eager view op (``x.view``, ``transpose``,
            slicing), which launches no kernel; 0: not measured (views cost the host nothing in the replay).
        module_call_us: optional, measured host time (us) of entering one ``nn.Module`` call beyond the ops it
            runs; 0: not measured.
        compiled_call_us: optional, measured host time (us) per call of a graph compiled by ``torch.compile``
            beyond one launch per kernel (dynamo's guards, Inductor's wrapper;
            :func:`fusion_advisor.devices.host_costs.measure_compiled_call`): the whole-model torch.compile
            prediction charges it per captured graph. 0: not measured.
        graph_replay_us: optional, measured host time (us) of one call under ``torch.compile(mode=
            "reduce-overhead")`` (the CUDA-graph tree's replay): the whole-model reduce-overhead prediction takes at
            least this per captured graph. 0: not measured.
        launch_overhead_us: time per eager kernel launch (dispatch plus launch), microseconds.
        launch_overhead_by_class: optional, measured host time per eager call (us) by op class key (``conv``,
            ``matmul``, ``normalization/native_group_norm``, ...: :func:`fusion_advisor.analyze.op_classes.op_class_keys`),
            for classes whose calls cost the host more than an elementwise op's (cuDNN and cuBLAS set up their
            calls); other ops take ``launch_overhead_us``.
        broadcast_bandwidth_gbps: optional, measured bandwidth (GB/s, read + written) of an eager elementwise kernel
            with a broadcast input (``x + bias[:, None, None]``, ``x * scale`` of a 0-dim tensor): TensorIterator
            leaves its vectorised contiguous loop for one that computes each operand's offset. The memory ceiling
            of pointwise ops that read one (:attr:`fusion_advisor.analyze.records.OpInfo.reads_broadcast`); 0: not
            measured (the copy bandwidth).
        scan_bandwidth_gbps: optional, measured bandwidth (GB/s, read + written) of PyTorch's eager scan kernels
            (``cumsum``, ``cumprod``; ``calibrate``): their memory ceiling
            (:func:`fusion_advisor.analyze.roofline.op_bandwidth_gbps`); 0: not measured (the copy bandwidth).
        cat_sweep_gbps, cat_sweep_cap_bytes: optional, how ``torch.cat``'s grid costs it per input beyond its
            bytes (``calibrate``: :func:`fusion_advisor.devices.memory_rates.measure_cat_sweep`): each input sweeps
            the blocks of the largest, up to the cap, at this rate (GB/s;
            :func:`fusion_advisor.analyze.roofline.cat_inputs_us`); 0: not measured (a concatenation costs its
            bytes).
        activity_host_share: optional, measured host time per device activity (kernel, memset, copy) of a cuDNN
            convolution call as a share of the ``conv`` class's host time (``calibrate``:
            :func:`fusion_advisor.devices.host_costs.measure_activity_host_share`): a convolution that issues more
            activities than that class's probe (:attr:`conv_probe_kernels`) costs this share more host time per
            extra one, fewer this share less
            (:func:`fusion_advisor.analyze.roofline.op_host_us`, its count from :attr:`conv_rates`). 0: not
            measured (every convolution costs the probe's host time).
        conv_probe_kernels: the device activities per call of the ``conv`` class's host probe (``calibrate``); 0:
            not measured.
        recurrent_step_us: optional, measured device time (us) of one cell step of a cuDNN recurrent layer by cell
            (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``; ``calibrate``, at a small hidden size where each step
            is latency-bound): a recurrent op costs its steps times this, or its FLOPs at the tensor-core peak
            when that is longer. Empty: the FLOPs alone (a recurrence priced as one large GEMM, far too fast).
        pool_window_gelem_s: optional, measured rate at which eager max / avg pooling kernels read their windows,
            G input elements per second (``calibrate``): a pooling op costs its bytes at copy bandwidth plus its
            outputs x window elements at this rate (:func:`fusion_advisor.analyze.roofline.pool_window_us`). 0: not
            measured (its bytes alone).
        l2_bytes: L2 cache size in bytes (0 if unknown).
        kind: ``"gpu"`` or ``"cpu"``; library Triton kernels are routed to on GPU specs only.
        source: where the numbers come from; per-field sources in ``sources``.
        sources: per-field source notes.
    """

    name: str
    display_name: str
    memory_bandwidth_gbps: float
    tensor_tflops: dict[str, float]
    vector_tflops: dict[str, float]
    launch_overhead_us: float
    l2_bytes: int = 0
    kind: str = "gpu"
    source: str = ""
    sources: dict[str, str] | None = None
    attention_tflops: dict[str, float] = field(default_factory=dict)
    attention_rates: tuple[AttentionRate, ...] = ()
    strided_bandwidth_gbps: float = 0.0
    unaligned_tensor_tflops: dict[str, float] = field(default_factory=dict)
    elementwise_overhead_us: float = 0.0
    kernel_busy_overhead_us: float = 0.0
    host_time_scale: float = 1.0
    cold_host_scale: float = 1.0
    view_host_scale: float = 1.0
    route_efficiency: dict[str, dict[str, float]] = field(default_factory=dict)
    op_time_fits: dict[str, OpTimeFit] = field(default_factory=dict)
    op_time_fit_dtypes: tuple[str, ...] = ()
    conv_rates: tuple[ConvRate, ...] = ()
    matmul_rates: tuple[MatmulRate, ...] = ()
    reduction_rates: tuple[ReductionRate, ...] = ()
    view_overhead_us: float = 0.0
    module_call_us: float = 0.0
    compiled_call_us: float = 0.0
    graph_replay_us: float = 0.0
    launch_overhead_by_class: dict[str, float] = field(default_factory=dict)
    recurrent_step_us: dict[str, float] = field(default_factory=dict)
    pool_window_gelem_s: float = 0.0
    activity_host_share: float = 0.0
    conv_probe_kernels: float = 0.0
    scan_bandwidth_gbps: float = 0.0
    broadcast_bandwidth_gbps: float = 0.0
    cat_sweep_gbps: float = 0.0
    cat_sweep_cap_bytes: float = 0.0

    def op_time_fit(self, keys: tuple[str, ...], dtype: str = "") -> OpTimeFit | None:
        """The fitted curve of the first of ``keys`` (most specific first) :attr:`op_time_fits` has, else None;
        None too for an op of ``dtype`` outside :attr:`op_time_fit_dtypes` (when that is set)."""
        if dtype and self.op_time_fit_dtypes and dtype not in self.op_time_fit_dtypes:
            return None
        for key in keys:
            if key in self.op_time_fits:
                return self.op_time_fits[key]
        return None

    def at_host_speed(self, dispatch_us: float) -> "DeviceSpec":
        """This spec with its host costs (``launch_overhead_us``, ``launch_overhead_by_class``,
        ``view_overhead_us``, ``module_call_us``, ``compiled_call_us``, ``graph_replay_us``) scaled to a host
        measured at ``dispatch_us`` per tiny eager op (the probe ``analyze --profile`` runs beside the model). Host
        speed differs between machines with the same GPU far more than device rates do: five calibrations on H200
        machines measured 7.9-11.5 us per eager add, four of them 25-47 us per cuDNN convolution call. Unchanged
        when either time is not above 0."""
        if dispatch_us <= 0 or self.launch_overhead_us <= 0:
            return self
        k = dispatch_us / self.launch_overhead_us
        return replace(self, launch_overhead_us=dispatch_us, view_overhead_us=self.view_overhead_us * k,
                       module_call_us=self.module_call_us * k, compiled_call_us=self.compiled_call_us * k,
                       graph_replay_us=self.graph_replay_us * k,
                       launch_overhead_by_class={c: us * k for c, us in self.launch_overhead_by_class.items()})

    def efficiency(self, route: str, pattern: str) -> float:
        """Share of the fused roofline ``route``'s code reaches on a chain of ``pattern`` (:attr:`route_efficiency`:
        the pattern's entry, else the route's ``default``, else 1.0). A ``triton`` route whose table measured
        neither the pattern nor a default takes ``torch.compile``'s share (:meth:`measured_efficiency` tells it
        apart): a library kernel claims no edge over Inductor its spec did not measure (the shipped H200 priced the
        unmeasured linear cross-entropy forward at the roofline, ahead of torch.compile, while its one measurement,
        forward and backward, ran 0.94-0.97x torch.compile's; a fresh user)."""
        if route == "triton" and not self.measured_efficiency(route, pattern) and self.route_efficiency:
            return self.efficiency("torch.compile", pattern)
        table = self.route_efficiency.get(route) or {}
        return float(table.get(pattern, table.get("default", 1.0)))

    def measured_efficiency(self, route: str, pattern: str) -> bool:
        """Whether :attr:`route_efficiency` holds a share for ``route`` on ``pattern`` (its own entry or the route's
        ``default``)."""
        table = self.route_efficiency.get(route) or {}
        return pattern in table or "default" in table

    def attention_peak_tflops(self, backend: str, dtype: str, seq: int, head_dim: int,
                              causal: bool = False, masked: bool = False) -> tuple[float, str]:
        """Ceiling (TFLOP/s) of one attention op and where it came from (``"rates"``, ``"attention_tflops"``,
        ``"tensor_tflops"``).

        Lookup: the :attr:`attention_rates` entries of ``backend`` and ``dtype`` (an empty ``backend``, not known,
        is taken as ``flash``; for fp16 or bf16 without entries of its own, the other's: :data:`HALF_TWIN`), of the
        same mask flag, then the same causal flag, when there are any (else the
        others), of the measured
        head dim nearest ``head_dim``; over their sequence lengths the rate is interpolated linearly in
        ``log(seq)`` and held constant beyond the measured ends. Without such entries: :attr:`attention_tflops`
        (flash at calibrate's shape; an optimistic ceiling for the other backends, whose extra launches and, for
        math, score-matrix traffic the roofline adds separately), then the matmul peak (:meth:`peak_tflops` on
        tensor cores).
        """
        import math

        want = backend or "flash"
        rows = [r for r in self.attention_rates if r.backend == want and r.dtype == dtype]
        if not rows and dtype in HALF_TWIN:  # calibrate times bf16 alone: fp16 runs at its rate
            rows = [r for r in self.attention_rates if r.backend == want and r.dtype == HALF_TWIN[dtype]]
        if rows:
            rows = [r for r in rows if r.masked == bool(masked)] or rows
            same = [r for r in rows if r.causal == bool(causal)]
            rows = same or rows
            hd = min({r.head_dim for r in rows}, key=lambda d: (abs(d - head_dim), d))
            pts = sorted((r.seq, r.tflops) for r in rows if r.head_dim == hd)
            x = math.log(max(seq, 1))
            if x <= math.log(pts[0][0]):
                return float(pts[0][1]), "rates"
            for (s0, t0), (s1, t1) in zip(pts, pts[1:], strict=False):
                if x <= math.log(s1):
                    w = (x - math.log(s0)) / (math.log(s1) - math.log(s0)) if s1 != s0 else 1.0
                    return float(t0 + w * (t1 - t0)), "rates"
            return float(pts[-1][1]), "rates"
        if dtype in self.attention_tflops:
            return float(self.attention_tflops[dtype]), "attention_tflops"
        return self.peak_tflops(dtype, True), "tensor_tflops"

    def peak_tflops(self, dtype: str, tensor_cores: bool) -> float:
        """Compute ceiling (TFLOP/s) for ``dtype`` on tensor cores (matmuls) or vector units (everything else);
        attention ops take :meth:`attention_peak_tflops`.

        Unknown dtypes fall back to the fp32 rate.
        """
        table = self.tensor_tflops if tensor_cores else self.vector_tflops
        return float(table.get(dtype, table.get("fp32", min(table.values()))))

    def ridge_point(self, dtype: str, tensor_cores: bool) -> float:
        """Arithmetic intensity (FLOP/byte) where the compute and memory roofs meet."""
        return self.peak_tflops(dtype, tensor_cores) * 1e12 / (self.memory_bandwidth_gbps * 1e9)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a plain dict (for reports)."""
        return asdict(self)


def available_specs() -> list[str]:
    """Names of the shipped device specs."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def _parse(data: Any, origin: str) -> DeviceSpec:
    if not isinstance(data, dict):
        raise DeviceSpecError(f"{origin}: a device spec is a YAML mapping with fields {', '.join(_REQUIRED)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise DeviceSpecError(f"{origin}: missing field(s) {', '.join(missing)}")
    for key in ("tensor_tflops", "vector_tflops"):
        if not isinstance(data[key], dict) or not data[key]:
            raise DeviceSpecError(f"{origin}: field '{key}' must map dtype names to TFLOP/s (fp32: 67), "
                                  f"got {data[key]!r}")
    if not isinstance(data.get("attention_tflops") or {}, dict):
        raise DeviceSpecError(f"{origin}: field 'attention_tflops' must map dtype names to TFLOP/s")
    # NaN and infinity are refused like zero: a NaN bandwidth dropped the memory term out of every max()
    bw = _number(data["memory_bandwidth_gbps"], f"{origin}: memory_bandwidth_gbps", "GB/s")
    tensor, vector, attention = ({str(k): _number(v, f"{origin}: {key}.{k}", "TFLOP/s")
                                  for k, v in (data.get(key) or {}).items()}
                                 for key in ("tensor_tflops", "vector_tflops", "attention_tflops"))
    launch = _number(data["launch_overhead_us"], f"{origin}: launch_overhead_us", "us", positive=False)
    if str(data.get("kind", "gpu")) not in ("gpu", "cpu"):
        raise DeviceSpecError(f"{origin}: field 'kind' must be gpu or cpu")
    elementwise, unaligned, strided = _optional_fields(data, origin)
    rates = _parse_rates(data.get("attention_rates"), origin)
    efficiency = _parse_efficiency(data.get("route_efficiency"), origin)
    fits = _parse_fits(data.get("op_time_fits"), origin)
    fit_dtypes = data.get("op_time_fit_dtypes") or []
    if not isinstance(fit_dtypes, list) or not all(isinstance(d, str) for d in fit_dtypes):
        raise DeviceSpecError(f"{origin}: field 'op_time_fit_dtypes' must be a list of dtype names (fp32, bf16), "
                              f"got {fit_dtypes!r}")
    sources = {k[: -len("_source")]: str(v) for k, v in data.items() if k.endswith("_source")}
    return DeviceSpec(
        name=str(data["name"]),
        display_name=str(data.get("display_name", data["name"])),
        memory_bandwidth_gbps=bw,
        tensor_tflops=tensor,
        vector_tflops=vector,
        launch_overhead_us=launch,
        l2_bytes=int(_number(data.get("l2_bytes", 0), f"{origin}: l2_bytes", "bytes", positive=False)),
        kind=str(data.get("kind", "gpu")),
        source=str(data.get("source", "")),
        sources=sources,
        attention_tflops=attention,
        attention_rates=rates,
        strided_bandwidth_gbps=strided,
        unaligned_tensor_tflops=unaligned,
        elementwise_overhead_us=elementwise,
        kernel_busy_overhead_us=_number(data.get("kernel_busy_overhead_us", 0.0),
                                        f"{origin}: kernel_busy_overhead_us", "us", positive=False),
        host_time_scale=_number(data.get("host_time_scale", 1.0), f"{origin}: host_time_scale",
                                "in-model over tight-loop host time"),
        cold_host_scale=_number(data.get("cold_host_scale", 1.0), f"{origin}: cold_host_scale",
                                "cold over warm in-model host time"),
        view_host_scale=_number(data.get("view_host_scale", 1.0), f"{origin}: view_host_scale",
                                "in-model over tight-loop view host time"),
        route_efficiency=efficiency,
        op_time_fits=fits,
        op_time_fit_dtypes=tuple(fit_dtypes),
        conv_rates=_parse_rate_list(data.get("conv_rates"), "conv_rates", ConvRate, origin),
        matmul_rates=_parse_rate_list(data.get("matmul_rates"), "matmul_rates", MatmulRate, origin),
        reduction_rates=_parse_rate_list(data.get("reduction_rates"), "reduction_rates", ReductionRate, origin),
        view_overhead_us=_number(data.get("view_overhead_us", 0.0), f"{origin}: view_overhead_us", "us",
                                 positive=False),
        module_call_us=_number(data.get("module_call_us", 0.0), f"{origin}: module_call_us", "us", positive=False),
        compiled_call_us=_number(data.get("compiled_call_us", 0.0), f"{origin}: compiled_call_us", "us",
                                 positive=False),
        graph_replay_us=_number(data.get("graph_replay_us", 0.0), f"{origin}: graph_replay_us", "us", positive=False),
        launch_overhead_by_class=_parse_launch_by_class(data.get("launch_overhead_by_class"), origin),
        recurrent_step_us=_parse_recurrent_steps(data.get("recurrent_step_us"), origin),
        pool_window_gelem_s=_number(data.get("pool_window_gelem_s", 0.0), f"{origin}: pool_window_gelem_s",
                                    "G elements/s", positive=False),
        activity_host_share=_number(data.get("activity_host_share", 0.0), f"{origin}: activity_host_share",
                                    "share of the conv class's host time", positive=False),
        conv_probe_kernels=_number(data.get("conv_probe_kernels", 0.0), f"{origin}: conv_probe_kernels",
                                   "activities", positive=False),
        scan_bandwidth_gbps=_number(data.get("scan_bandwidth_gbps", 0.0), f"{origin}: scan_bandwidth_gbps", "GB/s",
                                    positive=False),
        broadcast_bandwidth_gbps=_number(data.get("broadcast_bandwidth_gbps", 0.0),
                                         f"{origin}: broadcast_bandwidth_gbps", "GB/s", positive=False),
        cat_sweep_gbps=_number(data.get("cat_sweep_gbps", 0.0), f"{origin}: cat_sweep_gbps", "GB/s", positive=False),
        cat_sweep_cap_bytes=_number(data.get("cat_sweep_cap_bytes", 0.0), f"{origin}: cat_sweep_cap_bytes", "bytes",
                                    positive=False),
    )


def _optional_mapping(raw: Any, name: str, what: str, origin: str) -> dict:
    """An optional mapping field: ``{}`` when absent, else ``raw``; :class:`DeviceSpecError` (``what`` it must map)
    when it is not a mapping."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DeviceSpecError(f"{origin}: field {name!r} must map {what}, got {type(raw).__name__}")
    return raw


def _parse_launch_by_class(raw: Any, origin: str) -> dict[str, float]:
    """Validate the optional ``launch_overhead_by_class`` mapping (op class key -> us, >= 0)."""
    raw = _optional_mapping(raw, "launch_overhead_by_class",
                            "an op class (conv, matmul, normalization/native_layer_norm) to microseconds", origin)
    return {str(k): _number(v, f"{origin}: launch_overhead_by_class.{k}", "us", positive=False) for k, v in raw.items()}


def _parse_recurrent_steps(raw: Any, origin: str) -> dict[str, float]:
    """Validate the optional ``recurrent_step_us`` mapping (cell -> us per step, > 0)."""
    raw = _optional_mapping(raw, "recurrent_step_us", f"a recurrent cell ({', '.join(RECURRENT_CELLS)}) to "
                            "microseconds per step", origin)
    unknown = sorted(str(k) for k in raw if k not in RECURRENT_CELLS)
    if unknown:
        raise DeviceSpecError(f"{origin}: recurrent_step_us names unknown cell(s) {', '.join(unknown)}; known: "
                              f"{', '.join(RECURRENT_CELLS)}")
    return {str(k): _number(v, f"{origin}: recurrent_step_us.{k}", "us") for k, v in raw.items()}


def _parse_rate_list(raw: Any, name: str, kind: type, origin: str) -> tuple:
    """Validate an optional list of measured rates (``conv_rates`` / ``matmul_rates`` / ``reduction_rates``: mappings
    of ``kind``'s fields, read by its ``from_dict``)."""
    if raw is None:
        return ()
    keys = ", ".join(f.name for f in fields(kind))
    if not isinstance(raw, list):
        raise DeviceSpecError(f"{origin}: field {name!r} must be a list of measured entries (mappings with keys "
                              f"{keys})")
    out = []
    for i, entry in enumerate(raw):
        try:
            out.append(kind.from_dict(entry))
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise DeviceSpecError(f"{origin}: {name}[{i}] is not a measured entry ({type(e).__name__}: {e}); keys "
                                  f"{keys}") from e
    return tuple(out)


_FIT_KEYS = ("scale", "exponent", "min_us", "max_us", "samples")


def _parse_fits(raw: Any, origin: str) -> dict[str, OpTimeFit]:
    """Validate the optional ``op_time_fits`` mapping (op class key -> :class:`OpTimeFit` fields)."""
    raw = _optional_mapping(raw, "op_time_fits", f"an op class (conv/conv2d/fp32) to a mapping with keys "
                            f"{', '.join(_FIT_KEYS)}", origin)
    out: dict[str, OpTimeFit] = {}
    for key, entry in raw.items():
        where = f"{origin}: op_time_fits.{key}"
        if not isinstance(entry, dict) or "scale" not in entry:
            raise DeviceSpecError(f"{where} must be a mapping with at least 'scale' (keys {', '.join(_FIT_KEYS)})")
        unknown = sorted(set(map(str, entry)) - set(_FIT_KEYS))
        if unknown:
            raise DeviceSpecError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(_FIT_KEYS)}")
        exponent = _number(entry.get("exponent", 1.0), f"{where}.exponent", "slope of the log-log fit")
        if not 0.25 <= exponent <= 2.0:
            raise DeviceSpecError(f"{where}.exponent = {exponent:g}: the fit's slope must lie in [0.25, 2]")
        lo = _number(entry.get("min_us", 0.0), f"{where}.min_us", "us", positive=False)
        hi = entry.get("max_us", float("inf"))
        hi = float("inf") if hi is None else _number(hi, f"{where}.max_us", "us")
        if hi < lo:
            raise DeviceSpecError(f"{where}: max_us {hi:g} < min_us {lo:g}")
        samples = entry.get("samples", 0)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise DeviceSpecError(f"{where}.samples must be a non-negative integer, got {samples!r}")
        out[str(key)] = OpTimeFit(scale=_number(entry["scale"], f"{where}.scale", "us"), exponent=exponent,
                                  min_us=lo, max_us=hi, samples=samples)
    return out


def spec_mapping(spec: DeviceSpec) -> dict[str, Any]:
    """``spec`` as the YAML mapping :func:`parse_spec` reads (the inverse of parsing)."""
    return spec_fields(asdict(spec))


def spec_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A spec stored as :meth:`DeviceSpec.to_dict` (report.json's ``device_spec``) as the YAML mapping
    :func:`parse_spec` reads: ``sources`` back as ``<field>_source`` keys, unset optional fields (empty, 0) left
    out, an unbounded fit's ``max_us`` as null."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    sources = data.pop("sources", None) or {}
    for key in ("attention_tflops", "attention_rates", "unaligned_tensor_tflops", "route_efficiency",
                "op_time_fits", "op_time_fit_dtypes", "strided_bandwidth_gbps", "elementwise_overhead_us",
                "kernel_busy_overhead_us", "conv_rates", "matmul_rates", "reduction_rates", "view_overhead_us",
                "module_call_us", "compiled_call_us", "graph_replay_us", "launch_overhead_by_class",
                "recurrent_step_us", "pool_window_gelem_s", "activity_host_share", "conv_probe_kernels",
                "scan_bandwidth_gbps", "broadcast_bandwidth_gbps", "cat_sweep_gbps", "cat_sweep_cap_bytes"):
        if not data.get(key):
            data.pop(key, None)
    for key in ("host_time_scale", "cold_host_scale", "view_host_scale"):
        if data.get(key) == 1.0:
            data.pop(key)
    if data.get("op_time_fit_dtypes"):
        data["op_time_fit_dtypes"] = list(data["op_time_fit_dtypes"])
    for key in ("conv_rates", "matmul_rates", "reduction_rates", "attention_rates"):
        if data.get(key):
            data[key] = [dict(r) for r in data[key]]
    for r in data.get("reduction_rates") or ():
        r["dims"] = list(r["dims"])
    fits = {k: dict(v) for k, v in (data.get("op_time_fits") or {}).items()}
    for fit in fits.values():
        if fit.get("max_us") == float("inf"):
            fit["max_us"] = None
    if fits:
        data["op_time_fits"] = fits
    data.update({f"{k}_source": v for k, v in sources.items()})
    return data


#: Routes a ``route_efficiency`` table may name: the ones whose code the analysis prices below the roofline.
EFFICIENCY_ROUTES = ("torch.compile", "triton")


def _parse_efficiency(raw: Any, origin: str) -> dict[str, dict[str, float]]:
    """Validate the optional ``route_efficiency`` mapping (route -> pattern -> share in (0, 1.5])."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DeviceSpecError(f"{origin}: field 'route_efficiency' must map a route ({', '.join(EFFICIENCY_ROUTES)}) "
                              f"to a mapping of chain pattern -> share of the roofline")
    out: dict[str, dict[str, float]] = {}
    for route, table in raw.items():
        if route not in EFFICIENCY_ROUTES:
            raise DeviceSpecError(f"{origin}: route_efficiency: unknown route {route!r}; known: "
                                  f"{', '.join(EFFICIENCY_ROUTES)}")
        if not isinstance(table, dict):
            raise DeviceSpecError(f"{origin}: route_efficiency.{route} must map chain patterns to shares")
        out[route] = {}
        for pattern, share in table.items():
            v = _number(share, f"{origin}: route_efficiency.{route}.{pattern}", "share of the roofline")
            if v > 1.5:
                raise DeviceSpecError(f"{origin}: route_efficiency.{route}.{pattern} = {v:g}: a share of the "
                                      f"roofline, at most 1.5 (above 1 only where a kernel moves fewer bytes than "
                                      f"the chain's fused count)")
            out[route][str(pattern)] = v
    return out


def _parse_rates(raw: Any, origin: str) -> tuple[AttentionRate, ...]:
    """Validate the optional ``attention_rates`` list (see :class:`AttentionRate`); errors name the entry and key."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise DeviceSpecError(f"{origin}: field 'attention_rates' must be a list of mappings with keys "
                              f"{', '.join(_RATE_KEYS)}")
    out = []
    for i, entry in enumerate(raw):
        where = f"{origin}: attention_rates[{i}]"
        if not isinstance(entry, dict):
            raise DeviceSpecError(f"{where} must be a mapping with keys {', '.join(_RATE_KEYS)}")
        unknown = sorted(set(map(str, entry)) - set(_RATE_KEYS))
        if unknown:
            raise DeviceSpecError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(_RATE_KEYS)}")
        missing = [k for k in _RATE_KEYS if k not in ("causal", "masked") and k not in entry]
        if missing:
            raise DeviceSpecError(f"{where}: missing key(s) {', '.join(missing)}")
        if entry["dtype"] not in RATE_DTYPES:
            raise DeviceSpecError(f"{where}.dtype must be one of {', '.join(RATE_DTYPES)}, got {entry['dtype']!r}")
        if entry["backend"] not in ATTENTION_BACKENDS:
            raise DeviceSpecError(f"{where}.backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                                  f"got {entry['backend']!r}")
        for key in ("seq", "head_dim"):
            if isinstance(entry[key], bool) or not isinstance(entry[key], int) or entry[key] <= 0:
                raise DeviceSpecError(f"{where}.{key} must be a positive integer, got {entry[key]!r}")
        t = _number(entry["tflops"], f"{where}.tflops", "TFLOP/s")
        causal, masked = entry.get("causal", False), entry.get("masked", False)
        for key, flag in (("causal", causal), ("masked", masked)):
            if not isinstance(flag, bool):
                raise DeviceSpecError(f"{where}.{key} must be true or false, got {flag!r}")
        out.append(AttentionRate(backend=str(entry["backend"]), dtype=str(entry["dtype"]), seq=int(entry["seq"]),
                                 head_dim=int(entry["head_dim"]), causal=causal, tflops=float(t), masked=masked))
    return tuple(out)


def parse_spec(data: Any, origin: str) -> DeviceSpec:
    """Validate a spec already read from YAML (a mapping) as :func:`load_spec` does; ``origin`` names it in errors.

    Raises:
        DeviceSpecError: missing or invalid fields.
    """
    return _parse(data, origin)


def spec_file(name_or_path: str) -> str:
    """The absolute path of the spec YAML ``name_or_path`` names when it is a file of the user's (what
    :func:`load_spec` reads as a path: a ``.yaml`` / ``.yml`` name or an existing file), ``""`` for a shipped
    spec's name: a command that reruns the work must name the file, not the spec's ``name`` field."""
    path = Path(name_or_path)
    return str(path.resolve()) if path.suffix in (".yaml", ".yml") or path.is_file() else ""


def load_spec(name_or_path: str) -> DeviceSpec:
    """Load a shipped spec by name (``"h200"``) or a spec YAML by path. The spec returned is shared by every call
    that reads the same file text in this process (:data:`_LOADED`): treat it as read-only (``dataclasses.replace``
    makes a changed copy).

    Raises:
        DeviceSpecError: unknown name (the message lists the shipped ones), unreadable or invalid YAML.
    """
    path = Path(name_or_path)
    if spec_file(name_or_path):
        origin = str(path)
    else:
        path = SPEC_DIR / f"{name_or_path.lower()}.yaml"
        origin = name_or_path
        if not path.is_file():
            raise DeviceSpecError(
                f"unknown device spec {name_or_path!r}; shipped specs: {', '.join(available_specs())}, "
                "or give the path of a spec YAML"
            )
    try:
        text = path.read_text()
    except OSError as e:
        raise DeviceSpecError(f"{origin}: cannot read: {e.strerror}") from e
    key = (origin, text)
    if key in _LOADED:
        return _LOADED[key]
    try:
        # libyaml's loader where PyYAML has it: the H200 spec's rate tables are ~5,000 entries (1.7 s in pure Python)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise DeviceSpecError(f"{origin}: invalid YAML: {e}") from e
    spec = _parse(data, origin)
    if len(_LOADED) >= _LOADED_MAX:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = spec
    return spec


#: Specs :func:`load_spec` parsed in this process, by origin and file text (a file rewritten is parsed again,
#: whatever its timestamp says). Nothing writes to a loaded spec's tables, so one parse serves every analysis of a
#: process: the shipped H200 and H100 specs take 1-2 s each to read (their rate tables' ~77,000 YAML scalars
#: built into Python objects, even by libyaml's loader).
_LOADED: dict[tuple[str, str], DeviceSpec] = {}
_LOADED_MAX = 8
