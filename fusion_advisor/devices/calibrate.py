"""``fusion-advisor calibrate``: measure the roofline ceilings of the present device and write a device-spec YAML.

What is measured (:func:`measure`):

- **copy bandwidth**: ``dst.copy_(src)`` on buffers several times larger than the L2 cache (GPU: 8x L2, at least
  1 GiB each; CPU: 256 MiB each), counting bytes read plus written (``2 * nbytes``) over the median time, as the
  shipped specs count it;
- **matmul throughput** per dtype: ``torch.mm`` of square ``n x n`` matrices, ``2 n^3`` FLOPs over the median
  time. GPU: fp32 with TF32 off (``torch.backends.cuda.matmul.allow_tf32 = False``), tf32 (on), bf16 and fp16,
  ``n = 8192``; CPU: fp32 and bf16 (and fp16 where the CPU build runs it), ``n = 1024``;
- **permuted-copy bandwidth**: ``dst.copy_(x.transpose(1, 2))`` of a bf16 ``[B, S, H, D]`` tensor (S 2048, H 32,
  D 128, B filling the copy buffer size) into a contiguous ``[B, H, S, D]``: the eager TensorIterator copy reading a
  permuted view, ``2 * nbytes`` over the median time: the spec's ``strided_bandwidth_gbps``;
- **SDPA rate per backend** (GPU only, not with ``quick``): ``F.scaled_dot_product_attention`` forced to one
  backend with ``torch.nn.attention.sdpa_kernel`` over the grid of :mod:`fusion_advisor.devices.attention_rates`
  (``ATTENTION_CONFIGS`` x ``ATTENTION_DTYPES`` x ``ATTENTION_SEQS`` x ``ATTENTION_HEAD_DIMS``, batch x seq =
  ``ATTENTION_TOKENS``, heads x head_dim = ``ATTENTION_MODEL_DIM``), FLOPs as ``fusion_advisor.analyze.graph``
  counts them (``4 b h s^2 d``, halved when causal) over the median time: the spec's ``attention_rates``;
  combinations a backend refuses are listed as not measured;
- **per-op launch overhead**: wall time per tiny eager op (``y = x + 1`` on 1024 elements) in a long loop,
  synchronised once at the end: the rate at which eager PyTorch issues kernels, which is the roofline's
  ``launch_overhead_us`` (:mod:`fusion_advisor.analyze.roofline`). On a GPU also the time per back-to-back tiny kernel
  replayed from a CUDA graph (no host cost): the device's own floor per kernel, recorded in the file's
  ``calibration`` block.

GPU timings are ``triton.testing.do_bench`` medians (:func:`fusion_advisor.kernel_tools.bench.time_cuda`, L2 flushed before
each call); CPU timings are wall-clock medians (:func:`fusion_advisor.kernel_tools.bench.time_cpu`). Rates calibrate cannot
measure (vector-unit TFLOP/s; on a CPU, TF32) are copied from the closest shipped spec, and their ``*_source``
says so.

The YAML has exactly the fields of ``fusion_advisor/devices/*.yaml`` (validated with
:func:`fusion_advisor.devices.parse_spec` before it is written), so ``analyze --gpu SPEC.yaml`` and
``apply --gpu SPEC.yaml`` take it. Its first line marks it as written by calibrate: an existing file without that
line is never overwritten. Written atomically.
"""

from __future__ import annotations

import platform
import re
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from fusion_advisor.devices import DeviceSpec, available_specs, load_spec, parse_spec
from fusion_advisor.devices.attention_rates import (ATTENTION_MODEL_DIM, ATTENTION_REP_MS, ATTENTION_SHAPE,
                                                   ATTENTION_TOKENS, ATTENTION_WARMUP_MS, measure_attention_rates,
                                                   measure_attention_tflops)
from fusion_advisor.devices.ceilings import (MEASURED_DTYPES, ELEMENTWISE_KERNELS, ELEMENTWISE_MIB, Sizes, timer_for,
                                             kernel_timer, measure_copy_gbps, measure_elementwise_overhead_us,
                                             measure_kernel_floor_us, measure_launch_us, measure_matmul_tflops,
                                             measure_strided_copy_gbps, measure_unaligned_matmul_tflops)
from fusion_advisor.devices.host_costs import (ActivityHostCost, CompiledCallCost, measure_activity_host_share,
                                               measure_compiled_call, measure_launch_by_class, measure_module_call_us,
                                               measure_view_us)
from fusion_advisor.devices.op_rates import ConvRate, MatmulRate, fastest_tflops
from fusion_advisor.devices.reduction_rates import ReductionRate, measure_reductions
from fusion_advisor.devices.rate_sampling import (TABLE_KERNEL_CALLS, TABLE_REP_MS, TABLE_WARMUP_MS,
                                                  measure_convolutions, measure_matmuls, measure_recurrent_steps,
                                                  recurrent_probe)
from fusion_advisor.devices.memory_rates import (BUSY_OVERHEAD_SOURCE, measure_kernel_busy_overhead_us,
                                                 measure_broadcast_gbps, measure_cat_sweep,
                                                 measure_pool_window_rate, measure_scan_gbps)
from fusion_advisor.errors import CalibrationError
from fusion_advisor import files

#: First line of every spec calibrate writes; a file without it is not ours and is never overwritten.
MARKER = "# fusion-advisor calibrate: measured device spec"

@dataclass(frozen=True)
class Calibration:
    """What :func:`measure` found.

    Attributes:
        device: ``"cuda"`` or ``"cpu"``.
        device_name: the GPU's name or the CPU's.
        date: UTC date of the measurement (``YYYY-MM-DD``).
        versions: torch (and triton, CUDA) versions.
        copy_gbps: copy bandwidth, bytes read plus written (GB/s, 1e9 bytes/s).
        matmul_tflops: matmul TFLOP/s by dtype name (``fp32``, ``tf32``, ``bf16``, ``fp16``).
        matmul_notes: per dtype, why it was not measured (absent when measured).
        attention_tflops: GPU only: fused attention (``F.scaled_dot_product_attention``) TFLOP/s by dtype.
        attention_shape: ``(batch, heads, seq, head_dim)`` of that measurement.
        attention_rates: GPU only: SDPA TFLOP/s per backend, dtype, seq, head dim and causal flag (entries in the
            spec's ``attention_rates`` format, :class:`fusion_advisor.devices.AttentionRate`).
        unaligned_tflops: GPU only: matmul TFLOP/s by dtype with output columns not a multiple of 16 bytes.
        elementwise_overhead_us: GPU only: fixed device time per eager elementwise kernel beyond its bytes at copy
            bandwidth (:func:`measure_elementwise_overhead_us`), None when not measured.
        kernel_busy_overhead_us: GPU only: the same as the profiler sees a kernel's duration
            (:func:`fusion_advisor.devices.memory_rates.measure_kernel_busy_overhead_us`), None when not measured.
        strided_gbps: bandwidth of a copy reading a permuted view (GB/s, read + written), None when not measured.
        cat_sweep: ``(GB/s, cap bytes)`` of ``torch.cat``'s per-input cost
            (:func:`fusion_advisor.devices.memory_rates.measure_cat_sweep`), None when not measured.
        scan_gbps: bandwidth of an eager ``cumsum`` (GB/s, read + written, :func:`measure_scan_gbps`), None when
            not measured.
        broadcast_gbps: bandwidth of an eager add broadcasting a ``[C, 1, 1]`` input (GB/s, read + written,
            :func:`measure_broadcast_gbps`), None when not measured.
        not_measured: spec fields or grid points not measured, with the reason (e.g. GPU only).
        view_us: host time of one eager view op (us, :func:`measure_view_us`).
        module_call_us: host time of entering one ``nn.Module`` call (us, :func:`measure_module_call_us`).
        compiled_call: host time per call of a compiled model beyond its kernels
            (:func:`fusion_advisor.devices.host_costs.measure_compiled_call`), None when not measured.
        conv_rates: measured convolutions by geometry (:func:`measure_convolutions`).
        matmul_rates: measured matmuls by shape (:func:`measure_matmuls`).
        reduction_rates: measured normalizations, softmaxes and reductions by shape
            (:func:`fusion_advisor.devices.reduction_rates.measure_reductions`).
        recurrent_step_us: device time per cell step of cuDNN recurrent layers by cell (us,
            :func:`measure_recurrent_steps`).
        recurrent_probe: the ``(input, hidden, layers, sequence, batch)`` those were measured at.
        pool_window_gelem_s: G input elements per second eager pooling kernels read their windows at
            (:func:`fusion_advisor.devices.memory_rates.measure_pool_window_rate`), None when not measured;
            ``pool_probes``: its rows.
        launch_by_class: host time per eager call by op class (us, :func:`measure_launch_by_class`).
        activity: GPU only: host time per device activity of a cuDNN convolution call and the ``conv`` probe's
            activity count (:func:`measure_activity_host_share`), None when not measured.
        step_seconds: wall seconds of each measurement step, by its progress line.
        quick: measured with ``--quick`` (shorter budgets; recorded in the spec's ``calibration.quick``).
        launch_us: wall time per tiny eager op in a long loop (us).
        kernel_floor_us: GPU only: device time per back-to-back tiny kernel from a CUDA-graph replay (us), else None.
        l2_bytes: L2 cache size (GPU), 0 when unknown.
        sizes: the problem sizes used.
        timer: how times were taken.
    """

    device: str
    device_name: str
    date: str
    versions: dict[str, str]
    copy_gbps: float
    matmul_tflops: dict[str, float]
    matmul_notes: dict[str, str]
    launch_us: float
    kernel_floor_us: float | None
    l2_bytes: int
    sizes: Sizes
    timer: str
    extra: dict[str, Any] = field(default_factory=dict)
    attention_tflops: dict[str, float] = field(default_factory=dict)
    attention_shape: tuple[int, int, int, int] = ATTENTION_SHAPE
    attention_rates: list[dict[str, Any]] = field(default_factory=list)
    strided_gbps: float | None = None
    scan_gbps: float | None = None
    broadcast_gbps: float | None = None
    cat_sweep: tuple[float, float] | None = None
    unaligned_tflops: dict[str, float] = field(default_factory=dict)
    elementwise_overhead_us: float | None = None
    kernel_busy_overhead_us: float | None = None
    not_measured: dict[str, str] = field(default_factory=dict)
    view_us: float | None = None
    module_call_us: float | None = None
    compiled_call: CompiledCallCost | None = None
    conv_rates: list[ConvRate] = field(default_factory=list)
    matmul_rates: list[MatmulRate] = field(default_factory=list)
    reduction_rates: list[ReductionRate] = field(default_factory=list)
    launch_by_class: dict[str, float] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)
    recurrent_step_us: dict[str, float] = field(default_factory=dict)
    recurrent_probe: tuple[int, ...] = ()
    pool_window_gelem_s: float | None = None
    pool_probes: list[dict] = field(default_factory=list)
    quick: bool = False
    activity: ActivityHostCost | None = None


def _rate(tflops: float) -> float:
    """A measured TFLOP/s as written to a spec: six significant figures (three decimals rounded a loaded CPU's
    0.0004 TFLOP/s bf16 matmul to 0, which the spec's loader refuses)."""
    return float(f"{tflops:.6g}")


def _versions() -> dict[str, str]:
    out = {"torch": str(torch.__version__)}
    try:
        import triton

        out["triton"] = str(triton.__version__)
    except ImportError:
        pass
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's ``model name``), else what :mod:`platform` knows (``"x86_64"``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def check_out_file(path: Path) -> None:
    """Refuse an ``--out`` we must not write, before anything is measured or fitted: a folder, a missing or
    unwritable folder, or a file calibrate did not write (a read-only folder ended a minute's measuring in
    "internal error: PermissionError").

    Raises:
        CalibrationError: naming the path and the reason.
    """

    def foreign(p: Path) -> str | None:
        try:
            first = p.read_text().splitlines()[:1]
        except (OSError, UnicodeDecodeError):
            first = []
        return None if first == [MARKER] else ("exists and was not written by fusion-advisor calibrate; refusing to "
                                               "overwrite it (choose another file)")

    def wrong_suffix(p: Path) -> str | None:
        return None if p.suffix in (".yaml", ".yml") else \
            "a device spec is a .yaml file (analyze --gpu reads it by suffix)"

    files.check_out_file(path, "--out", foreign, example="my_gpu.yaml", wrong_suffix=wrong_suffix, writable=True,
                         error=CalibrationError)


def measure(device: str | None = None, sizes: Sizes | None = None, quick: bool = False,
            progress: Callable[[str], None] | None = None) -> Calibration:
    """Measure copy bandwidth, matmul throughput per dtype and per-op launch overhead on ``device``.

    Args:
        device: ``"cuda"`` or ``"cpu"``; default ``"cuda"`` when a GPU is present.
        sizes: problem sizes; default :meth:`Sizes.for_device`.
        quick: small sizes (see :meth:`Sizes.for_device`).
        progress: called with a short line ("matmul bf16 (3 of 8)") as each measurement starts.

    Raises:
        CalibrationError: unknown device, or cuda asked for without a GPU.
    """
    device = checked_device(device)
    l2 = 0
    if device == "cuda":
        name = torch.cuda.get_device_name()
        l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
    else:
        name = cpu_name()
    sizes = sizes or Sizes.for_device(device, quick=quick, l2_bytes=l2)
    timer = timer_for(device, sizes)
    matmul_dtypes = ("fp32", "tf32", "bf16", "fp16") if device == "cuda" else ("fp32", "bf16", "fp16")
    steps = 1 + len(matmul_dtypes) + (2 if device == "cuda" else 0) + (3 if device == "cuda" and not quick else 0) \
        + 2 + (2 if device == "cuda" else 0) + 5 + (0 if quick else 1)
    done = [0]

    seconds: dict[str, float] = {}
    clock = [time.perf_counter(), ""]

    def step(what: str) -> None:
        now = time.perf_counter()
        if clock[1]:
            seconds[clock[1]] = round(now - clock[0], 2)
        clock[0], clock[1] = now, what
        done[0] += 1
        if progress is not None:
            progress(f"{what} ({done[0]} of {steps})")

    with torch.no_grad():
        step(f"copy bandwidth ({device})")
        copy = measure_copy_gbps(device, sizes, timer)
        tflops: dict[str, float] = {}
        notes: dict[str, str] = {}
        not_measured: dict[str, str] = {}
        for dtype in matmul_dtypes:
            step(f"matmul {dtype}")
            try:
                tflops[dtype] = measure_matmul_tflops(device, dtype, sizes, timer)
            except (RuntimeError, NotImplementedError) as e:  # e.g. a CPU build without fp16 matmul
                notes[dtype] = f"not measured ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        unaligned: dict[str, float] = {}
        if device == "cuda":
            for dtype in ("bf16", "fp16"):
                step(f"unaligned matmul {dtype}")
                try:
                    unaligned[dtype] = measure_unaligned_matmul_tflops(device, dtype, sizes, timer)
                except RuntimeError as e:
                    not_measured[f"unaligned_tensor_tflops {dtype}"] = f"{type(e).__name__}: {str(e)[:120]}"
        else:
            not_measured["unaligned_tensor_tflops"] = "GPU only (cuBLAS's align1 kernels): not measured on a CPU"
        if device == "cpu":
            notes["tf32"] = "no TF32 on a CPU: torch runs fp32 matmuls in fp32; the measured fp32 rate"
            tflops["tf32"] = tflops["fp32"]
        attention: dict[str, float] = {}
        rates: list[dict[str, Any]] = []
        if device == "cuda" and not quick:
            for dtype in ("bf16", "fp16"):
                step(f"attention {dtype}")
                try:
                    attention[dtype] = measure_attention_tflops(dtype, timer)
                except RuntimeError as e:
                    notes[f"attention {dtype}"] = f"not measured ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
            step("attention rates per backend")
            try:
                rates, skipped = measure_attention_rates()
                not_measured.update({f"attention_rates {k}": v for k, v in skipped.items()})
            except (RuntimeError, ImportError) as e:
                not_measured["attention_rates"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        elif device == "cuda":
            not_measured["attention_tflops"] = not_measured["attention_rates"] = "not measured with --quick"
        else:
            not_measured["attention_tflops"] = not_measured["attention_rates"] = \
                "GPU only (SDPA's flash / efficient / cuDNN kernels): not measured on a CPU"
        step("strided copy bandwidth")
        try:
            strided: float | None = measure_strided_copy_gbps(device, sizes, timer)
        except (RuntimeError, MemoryError) as e:
            strided = None
            not_measured["strided_bandwidth_gbps"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        step("launch overhead per eager op")
        launch = measure_launch_us(device, sizes)
        step("host time per view op, per nn.Module call and per call of each op class")
        # each priced at the launch's host speed: its loops beside add loops (host_costs.host_us_at_launch)
        view_us = measure_view_us(device, sizes.launch_ops, sizes.launch_numel, launch_us=launch)
        module_us = measure_module_call_us(device, sizes.launch_ops, sizes.launch_numel, launch_us=launch)
        launch_by_class = measure_launch_by_class(device, module_us, view_us, launch)
        activity = measure_activity_host_share(device)
        if activity is None:
            not_measured["activity_host_share"] = ("GPU only (cuDNN's device activities per convolution call)"
                                                if device != "cuda" else
                                                "the convolution probes' activity counts spread too little for a slope")
        step("convolutions and matmuls by shape")
        table_timer = timer_for(device, replace(sizes, warmup_ms=TABLE_WARMUP_MS, rep_ms=TABLE_REP_MS))
        # on a GPU convolutions, matmuls and recurrent layers are timed by their kernels, as a profile measures an op
        conv_rates, conv_skipped = measure_convolutions(device, quick, kernel_timer if device == "cuda"
                                                        else table_timer, MEASURED_DTYPES)
        not_measured.update(conv_skipped)
        matmul_rates, matmul_skipped = measure_matmuls(device, quick, kernel_timer if device == "cuda"
                                                       else table_timer, MEASURED_DTYPES)
        not_measured.update(matmul_skipped)
        step("normalizations, softmaxes and reductions by shape")
        reduction_rates, reduction_skipped = measure_reductions(device, quick, kernel_timer if device == "cuda"
                                                                else table_timer, MEASURED_DTYPES)
        not_measured.update(reduction_skipped)
        step("pooling window reads and scans")
        pool_rate, pool_rows = measure_pool_window_rate(device, copy, quick, kernel_timer if device == "cuda"
                                                        else table_timer)
        if pool_rate is None:
            not_measured["pool_window_gelem_s"] = "no pooling probe ran longer than its bytes at copy bandwidth"
        scan = measure_scan_gbps(device, quick, kernel_timer if device == "cuda" else table_timer, sizes.copy_bytes)
        broadcast = measure_broadcast_gbps(device, quick, kernel_timer if device == "cuda" else table_timer,
                                           sizes.copy_bytes)
        cat_sweep = None
        if device != "cuda":
            not_measured["cat_sweep_gbps"] = "GPU only (the grid of PyTorch's CUDA cat kernel)"
        else:
            try:
                cat_sweep = measure_cat_sweep(device, copy, kernel_timer)
            except RuntimeError as e:  # out of memory
                not_measured["cat_sweep_gbps"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            if cat_sweep is None and "cat_sweep_gbps" not in not_measured:
                not_measured["cat_sweep_gbps"] = "the concatenation probe took no longer than its bytes"
        step("recurrent layers (time per cell step)")
        recurrent, recurrent_failed = measure_recurrent_steps(device, quick, kernel_timer if device == "cuda"
                                                              else timer)  # CPU: the longer timer
        not_measured.update(recurrent_failed)
        floor = elementwise = busy_overhead = None
        if device == "cuda":
            step("kernel floor (CUDA-graph replay)")
            floor = measure_kernel_floor_us(sizes)
            step("elementwise overhead (graph replay, profiled)")
            elementwise = measure_elementwise_overhead_us(copy, sizes)
            busy_overhead = measure_kernel_busy_overhead_us(copy)
        if elementwise is None:
            not_measured["elementwise_overhead_us"] = ("GPU only (CUDA-graph replay of eager adds)" if device != "cuda"
                                                       else "CUDA graphs unavailable")
        if busy_overhead is None:
            not_measured["kernel_busy_overhead_us"] = "GPU only (profiled tiny adds)"
        compiled_call = None
        if quick:
            not_measured["compiled_call_us"] = "not measured with --quick (it compiles a model: a few seconds)"
        else:  # last: Inductor's compile workers stay behind
            step("host time per call of a compiled model")
            try:
                compiled_call = measure_compiled_call(device, launch)
            except RuntimeError as e:  # no C++ compiler or Triton for this device
                not_measured["compiled_call_us"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        if device != "cuda" or compiled_call is None or compiled_call.graph_replay_us is None:
            not_measured["graph_replay_us"] = ("GPU only (torch.compile's CUDA graphs)" if device != "cuda"
                                               else not_measured.get("compiled_call_us", "not measured"))
    seconds[clock[1]] = round(time.perf_counter() - clock[0], 2)
    if device == "cuda":
        torch.cuda.empty_cache()
    return Calibration(
        device=device, device_name=name, date=datetime.now(timezone.utc).strftime("%Y-%m-%d"), versions=_versions(),
        copy_gbps=copy, matmul_tflops=tflops, matmul_notes=notes, launch_us=launch, kernel_floor_us=floor,
        l2_bytes=l2, sizes=sizes, attention_tflops=attention, attention_rates=rates, strided_gbps=strided, scan_gbps=scan,
        broadcast_gbps=broadcast, cat_sweep=cat_sweep,
        unaligned_tflops=unaligned, elementwise_overhead_us=elementwise, kernel_busy_overhead_us=busy_overhead,
        not_measured=not_measured, view_us=view_us, module_call_us=module_us, conv_rates=conv_rates,
        compiled_call=compiled_call,
        launch_by_class=launch_by_class, activity=activity, step_seconds=seconds,
        matmul_rates=matmul_rates, reduction_rates=reduction_rates, recurrent_step_us=recurrent,
        recurrent_probe=recurrent_probe(device, quick),
        pool_window_gelem_s=pool_rate, pool_probes=pool_rows, quick=quick,
        timer="triton.testing.do_bench median (L2 flushed before each call)" if device == "cuda"
        else "wall-clock median (time.perf_counter)")


def closest_shipped_spec(cal: Calibration) -> DeviceSpec:
    """The shipped spec closest to the measured device: ``cpu`` for a CPU; for a GPU the one whose name appears in
    the GPU's name (``"NVIDIA H200"`` -> ``h200``), else the one with the nearest memory bandwidth."""
    if cal.device == "cpu":
        return load_spec("cpu")
    # a shipped spec is named as its file (tests/test_devices.py): read the one the GPU's name names, not all of
    # them (the H100 and H200 specs' tables take 1-2 s each)
    for name in available_specs():
        if re.search(rf"\b{re.escape(name)}\b", cal.device_name, re.IGNORECASE):
            named = load_spec(name)
            if named.kind == "gpu":
                return named
    gpus = [s for s in (load_spec(n) for n in available_specs()) if s.kind == "gpu"]
    return min(gpus, key=lambda s: abs(s.memory_bandwidth_gbps - cal.copy_gbps))


#: A measured rate below this share of the closest shipped spec's is flagged loudly: a measurement that did not reach
#: the ceiling (a buffer inside L2, a matmul too small, a busy GPU) rather than a slower device.
SANITY_SHARE = 0.25


def sanity_warnings(cal: "Calibration", base: DeviceSpec) -> list[str]:
    """Measured rates of ``cal`` below :data:`SANITY_SHARE` of the closest shipped spec's (``base``), one line each:
    the copy bandwidth, every measured matmul dtype, fused attention."""
    measured = [("copy bandwidth", cal.copy_gbps, base.memory_bandwidth_gbps, "GB/s")]
    measured += [(f"{k} matmul", v, base.peak_tflops(k, True), "TFLOP/s") for k, v in cal.matmul_tflops.items()]
    measured += [(f"{k} attention", v, base.attention_tflops[k], "TFLOP/s") for k, v in cal.attention_tflops.items()
                 if k in base.attention_tflops]
    out = []
    for what, got, ref, unit in measured:
        if ref > 0 and got < SANITY_SHARE * ref:
            out.append(f"{what} measured {got:,.4g} {unit}, under {SANITY_SHARE:.0%} of the shipped {base.name} "
                       f"spec's {ref:,.4g} {unit}: the measurement probably did not reach the ceiling (a buffer inside "
                       f"the L2 cache, a matmul too small, a busy device), and analyses with this spec would be that "
                       f"far off; rerun calibrate without --quick on an idle device")
    return out


def table_warnings(cal: "Calibration") -> list[str]:
    """A line per matmul dtype whose measured peak is under :data:`SANITY_SHARE` of the fastest matmul the same
    calibration timed in its shape table (``matmul_rates``): the spec would contradict itself (a fresh user's quick
    CPU spec: an fp32 peak of 0.0062 TFLOP/s beside table entries at 0.22), on any device."""
    out = []
    for k, peak in cal.matmul_tflops.items():
        fastest = fastest_tflops(cal.matmul_rates, k)
        if fastest > 0 and peak < SANITY_SHARE * fastest:
            out.append(f"{k} matmul peak measured {peak:,.4g} TFLOP/s, under {SANITY_SHARE:.0%} of the fastest "
                       f"matmul this calibration timed in its shape table ({fastest:,.4g}): the peak's probe did not "
                       f"reach the ceiling; rerun calibrate without --quick on an idle device")
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def spec_dict(cal: Calibration, base: DeviceSpec | None = None) -> dict[str, Any]:
    """The device-spec mapping (fields of ``fusion_advisor/devices/*.yaml``) of a calibration, unmeasured rates
    copied from ``base`` (default :func:`closest_shipped_spec`) and labelled so."""
    base = base or closest_shipped_spec(cal)
    v = cal.versions
    where = f"{cal.device_name}, {cal.date}, torch {v.get('torch')}"
    if "triton" in v:
        where += f", triton {v['triton']}"
    by = f"measured by fusion-advisor calibrate on {where}"
    # the timer of the probes timed by their kernels on a GPU (kernel_timer), by the table timer elsewhere
    kernel_time = "summed kernel durations" if cal.device == "cuda" else cal.timer
    s = cal.sizes
    tensor = {k: _rate(float(cal.matmul_tflops.get(k, base.peak_tflops(k, True))))
              for k in ("bf16", "fp16", "tf32", "fp32")}
    copied = [k for k in tensor if k not in cal.matmul_tflops]
    tensor_src = (f"{by}: torch.mm of {s.matmul_n}x{s.matmul_n} operands, 2n^3 FLOPs over the {cal.timer}"
                  + ("; fp32 with TF32 off, tf32 with it on" if cal.device == "cuda" else ""))
    for k, note in cal.matmul_notes.items():
        if not k.startswith("attention"):
            tensor_src += f"; {k}: {note}"
    if copied:
        tensor_src += f"; {', '.join(copied)} copied from the shipped spec {base.name}"
    vector = {k: float(x) for k, x in base.vector_tflops.items()}
    vector_src = f"copied from the shipped spec {base.name} (not measured by calibrate)"
    if cal.device == "cpu" and "fp32" in cal.matmul_tflops:
        # a CPU's matmuls run on the same vector units: its elementwise rate cannot exceed its measured matmul rate
        cap = _rate(float(cal.matmul_tflops["fp32"]))
        if any(x > cap for x in vector.values()):
            vector = {k: min(x, cap) for k, x in vector.items()}
            vector_src += f", capped at the measured fp32 matmul rate {cap} TFLOP/s (the same vector units run both)"
    launch_src = (f"{by}: wall time per tiny eager op, {s.launch_ops} x (x + 1) on {s.launch_numel} fp32 elements, "
                  "synchronised once, median of 5 loops")
    if cal.kernel_floor_us is not None:
        launch_src += f"; device floor per back-to-back kernel (CUDA graph replay) {cal.kernel_floor_us:.2f} us"
    data: dict[str, Any] = {
        "name": f"calibrated-{_slug(cal.device_name)}"[:60],
        "kind": "gpu" if cal.device == "cuda" else "cpu",
        "display_name": f"{cal.device_name} (calibrated {cal.date})",
        "memory_bandwidth_gbps": round(cal.copy_gbps, 1),
        "memory_bandwidth_source": (f"{by}: dst.copy_(src) of 2 x {s.copy_bytes / 2**20:.0f} MiB fp32 buffers, "
                                    f"bytes read + written over the {cal.timer}"),
        "tensor_tflops": tensor,
        "tensor_tflops_source": tensor_src,
        "vector_tflops": vector,
        "vector_tflops_source": vector_src,
        **({"attention_tflops": {k: _rate(float(x)) for k, x in cal.attention_tflops.items()},
            "attention_tflops_source": (f"{by}: F.scaled_dot_product_attention, non-causal, q/k/v of shape "
                                        f"{tuple(cal.attention_shape)} (batch, heads, seq, head_dim), "
                                        f"4 b h s^2 d FLOPs over the {cal.timer}")}
           if cal.attention_tflops else {}),
        **({"attention_rates": [dict(r) for r in cal.attention_rates],
            "attention_rates_source": (f"{by}: F.scaled_dot_product_attention forced to each backend with "
                                       f"torch.nn.attention.sdpa_kernel; batch x seq = {ATTENTION_TOKENS}, heads x "
                                       f"head_dim = {ATTENTION_MODEL_DIM}; masked entries (efficient, math) with an "
                                       "additive [B, 1, S, S] mask of the q dtype; 4 b h s^2 d FLOPs (halved when "
                                       f"causal) over the triton.testing.do_bench median ({ATTENTION_WARMUP_MS:g} ms "
                                       f"warm-up, {ATTENTION_REP_MS:g} ms timed)"
                                       + ("" if any(r.get("dtype") == "fp16" for r in cal.attention_rates) else
                                          "; fp16 not timed, priced by the bf16 entries (the same kernels' rate: "
                                          "attention_rates.ATTENTION_DTYPES)"))}
           if cal.attention_rates else {}),
        **({"unaligned_tensor_tflops": {k: _rate(float(x)) for k, x in cal.unaligned_tflops.items()},
            "unaligned_tensor_tflops_source": (f"{by}: torch.mm of [{s.matmul_n}, {s.matmul_n}] x [{s.matmul_n}, "
                                               f"{s.matmul_n - 1}] (output columns not a multiple of 16 bytes), "
                                               f"2 n^2 (n - 1) FLOPs over the {cal.timer}")}
           if cal.unaligned_tflops else {}),
        **({"elementwise_overhead_us": round(cal.elementwise_overhead_us, 3),
            "elementwise_overhead_source": (f"{by}: torch.add(a, b, out=c) on bf16 operands of "
                                            f"{'/'.join(map(str, ELEMENTWISE_MIB))} MiB, {ELEMENTWISE_KERNELS} per CUDA "
                                            "graph on distinct buffers, replayed; per kernel time less 3 x bytes at the "
                                            "copy bandwidth, median over the sizes")}
           if cal.elementwise_overhead_us is not None else {}),
        **({"kernel_busy_overhead_us": round(cal.kernel_busy_overhead_us, 3),
            "kernel_busy_overhead_source": f"{by}: {BUSY_OVERHEAD_SOURCE}"} if cal.kernel_busy_overhead_us is not None
           else {}),
        **({"scan_bandwidth_gbps": round(cal.scan_gbps, 1),
            "scan_bandwidth_source": f"{by}: torch.cumsum along the last dim of fp32 tensors (fusion_advisor."
                                     "devices.memory_rates.SCAN_SHAPES), the highest of bytes read + written over the "
                                     + kernel_time}
           if cal.scan_gbps else {}),
        **({"broadcast_bandwidth_gbps": round(cal.broadcast_gbps, 1),
            "broadcast_bandwidth_source": f"{by}: torch.add of fp32 [N, C, H, W] and [C, 1, 1] tensors (fusion_advisor."
                                          "devices.memory_rates.BROADCAST_SHAPES), the highest of bytes read + written "
                                          "over the " + kernel_time}
           if cal.broadcast_gbps else {}),
        **({"cat_sweep_gbps": round(cal.cat_sweep[0], 1), "cat_sweep_cap_bytes": round(cal.cat_sweep[1]),
            "cat_sweep_source": (f"{by}: torch.cat along dim 1 of one fp32 10 x 928 x s x s map and 32 of 10 x 32 x s "
                                 "x s, s in 7, 14, 28, 56 (fusion_advisor.devices.memory_rates.measure_cat_sweep): "
                                 "per input, the time less the bytes at the copy bandwidth, " + kernel_time
                                 + "; the rate at the smallest side, the cap the largest cost seen")}
           if cal.cat_sweep else {}),
        **({"strided_bandwidth_gbps": round(cal.strided_gbps, 1),
            "strided_bandwidth_source": (f"{by}: dst.copy_(x.transpose(1, 2)) of a bf16 [B, 2048, 32, 128] tensor "
                                         "into a contiguous [B, 32, 2048, 128] (B filling "
                                         f"{s.copy_bytes / 2**20:.0f} MiB), bytes read + written over the "
                                         f"{cal.timer}")}
           if cal.strided_gbps else {}),
        "launch_overhead_us": round(cal.launch_us, 3),
        "launch_overhead_source": launch_src,
        **({"launch_overhead_by_class": dict(cal.launch_by_class),
            "launch_overhead_by_class_source": (f"{by}: wall time per tiny eager call of each class, through the "
                                                "nn.Module that issues it where there is one, less the module call, "
                                                "views and other launches priced apart (fusion_advisor.devices."
                                                "host_costs.host_probes), 500 in a loop, synchronised once, each loop "
                                                "beside a loop of the launch's add: the median of 3 rounds' ratios "
                                                "times the launch overhead (host_costs.host_us_at_launch)")}
           if cal.launch_by_class else {}),
        **({"activity_host_share": round(cal.activity.share, 4),
            "conv_probe_kernels": round(cal.activity.probe_kernels, 2),
            "activity_host_source": (f"{by}: the least-squares slope of host time per call over device activities "
                                     "per call (torch.profiler) of seven tiny nn.Conv1d-3d / ConvTranspose2d calls "
                                     "(fusion_advisor.devices.host_costs.conv_activity_probes), their loops "
                                     "interleaved, over the line at the conv probe's count; (activities, us): "
                                     + ", ".join(f"({a:g}, {t:g})" for a, t in cal.activity.probes)),
            "conv_probe_kernels_source": f"{by}: device activities per call of the conv class's host probe"}
           if cal.activity is not None else {}),
        **({"view_overhead_us": round(cal.view_us, 3),
            "view_overhead_source": f"{by}: median over ten view ops as model code writes them (view, reshape, "
                                    "permute, transpose, indexing...; host_costs.VIEW_PROBES) of the wall time per "
                                    f"call on a tiny tensor, {s.launch_ops} in a loop beside a loop of the launch's "
                                    "add, the median of 5 rounds' ratios times the launch overhead"}
           if cal.view_us is not None else {}),
        **({"module_call_us": round(cal.module_call_us, 3),
            "module_call_source": (f"{by}: a module calling a child that calls a module whose forward is one x + 1, "
                                   "less that last module alone, over the two nested calls (each a child's "
                                   f"__getattr__ and __call__), {s.launch_ops} calls per loop, the two loops and one "
                                   "of the launch's add interleaved 5 times, the median difference over the add "
                                   "times the launch overhead")}
           if cal.module_call_us is not None else {}),
        **({"compiled_call_us": round(cal.compiled_call.compiled_call_us, 3),
            "compiled_call_source": (f"{by}: a torch.compile'd chain of four multiply-adds on 1,024 floats (one fused "
                                     "kernel; host_costs.measure_compiled_call) called in a loop beside a loop of "
                                     "the launch's add, the median of 5 rounds' ratios "
                                     f"({cal.compiled_call.probes['compiled']:g} adds) less one launch, times the "
                                     "launch overhead")}
           if cal.compiled_call is not None else {}),
        **(_copied_call_costs(cal, base) if cal.compiled_call is None else {}),
        **({"graph_replay_us": round(cal.compiled_call.graph_replay_us, 3),
            "graph_replay_source": (f"{by}: the same chain under torch.compile(mode=\"reduce-overhead\"), the median "
                                    "of 5 rounds' ratios to the add "
                                    f"({cal.compiled_call.probes['reduce-overhead']:g}) times the launch overhead")}
           if cal.compiled_call is not None and cal.compiled_call.graph_replay_us is not None else {}),
        **({"conv_rates": [asdict(r.rounded()) for r in cal.conv_rates],
            "conv_rates_source": (f"{by}: {len(cal.conv_rates)} seeded random convolutions "
                                  "(fusion_advisor.devices.rate_sampling.sample_plan: every class of CONV_CLASSES, half "
                                  "drawn as a network layer, a quarter of the 2-D ones as a late CNN stage's, "
                                  "F.conv*d / F.conv_transpose*d without bias, "
                                  "cudnn.allow_tf32 on, cudnn.benchmark off), torch.utils.flop_counter FLOPs over "
                                  + (f"the summed kernel durations of {TABLE_KERNEL_CALLS} profiled calls (L2 warm)"
                                     if cal.device == "cuda" else
                                     f"the {cal.timer}, {TABLE_WARMUP_MS:g} ms warm-up and {TABLE_REP_MS:g} ms timed")
                                  + " per convolution")}
           if cal.conv_rates else {}),
        **({"matmul_rates": [asdict(r.rounded()) for r in cal.matmul_rates],
            "matmul_rates_source": (f"{by}: {len(cal.matmul_rates)} seeded matmuls (fusion_advisor.devices.rate_sampling."
                                    "matmul_plan: torch.mm and torch.bmm with B contiguous (layout nn), and for half of "
                                    "them B a transposed view (nt: F.linear with a bias, torch.bmm of a transposed B), "
                                    "sizes log-uniform over 16-16384, a quarter of the nt ones with M over 1-15 and a "
                                    "quarter of the rest with one of M, N, K over 1-15, half multiples of 64 or powers "
                                    "of two; fp32 with TF32 off), 2 B M N K FLOPs "
                                    "over "
                                    + (f"the summed kernel durations of {TABLE_KERNEL_CALLS} profiled calls (L2 warm)"
                                       if cal.device == "cuda" else
                                       f"the {cal.timer}, {TABLE_WARMUP_MS:g} ms warm-up and {TABLE_REP_MS:g} ms timed")
                                    + " per matmul")}
           if cal.matmul_rates else {}),
        **({"reduction_rates": [r.entry() for r in cal.reduction_rates],
            "reduction_rates_source": (f"{by}: {len(cal.reduction_rates)} seeded fp32 calls "
                                       "(fusion_advisor.devices.reduction_rates.reduction_plan: F.batch_norm eval and "
                                       "training, F.group_norm, F.layer_norm, torch.softmax, torch.sum / mean / amax "
                                       "and torch.logsumexp over dim 1, shapes of CNN stages and rows), "
                                       + (f"the summed kernel durations and kernel count of {TABLE_KERNEL_CALLS} "
                                          "profiled calls (L2 warm)" if cal.device == "cuda" else
                                          f"the {cal.timer}, {TABLE_WARMUP_MS:g} ms warm-up and {TABLE_REP_MS:g} ms "
                                          "timed")
                                       + " per call")}
           if cal.reduction_rates else {}),
        **({"recurrent_step_us": dict(cal.recurrent_step_us),
            "recurrent_step_us_source": (
                f"{by}: nn.LSTM / nn.GRU / nn.RNN (input, hidden, layers, sequence, batch) = "
                f"{tuple(cal.recurrent_probe)}, fp32, forward without grad, the call's " + kernel_time
                + " over its layers x sequence steps")}
           if cal.recurrent_step_us else {}),
        **({"pool_window_gelem_s": round(cal.pool_window_gelem_s, 1),
            "pool_window_gelem_s_source": (
                f"{by}: fp32 max / avg pools 1-3d, kernel 2-8, stride 1-kernel "
                "(fusion_advisor.devices.memory_rates.POOL_PROBES), each's " + kernel_time
                + " less its bytes at the copy bandwidth, over its outputs x window elements; median over "
                f"{len(cal.pool_probes)} probes")}
           if cal.pool_window_gelem_s else {}),
        "l2_bytes": int(cal.l2_bytes or base.l2_bytes),
        "l2_bytes_source": (f"{by}: torch.cuda.get_device_properties().L2_cache_size" if cal.l2_bytes
                            else f"copied from the shipped spec {base.name}"),
        "source": f"{by}; rates not measured copied from the shipped spec {base.name}",
        "calibration": {
            "device": cal.device,
            "device_name": cal.device_name,
            "date": cal.date,
            "versions": dict(v),
            "timer": cal.timer,
            "quick": cal.quick,
            "sizes": asdict(s),
            "kernel_floor_us": round(cal.kernel_floor_us, 3) if cal.kernel_floor_us is not None else None,
            "base_spec": base.name,
            "not_measured": dict(cal.not_measured),
            "step_seconds": dict(cal.step_seconds),
            **({"pool_probes": [dict(r) for r in cal.pool_probes]} if cal.pool_probes else {}),
        },
    }
    warnings = (sanity_warnings(cal, base) if cal.device == "cuda" else []) + table_warnings(cal)
    if warnings:
        data["calibration"]["warnings"] = warnings
    parse_spec(data, "the spec calibrate measured (a calibrate bug: please report it)")  # the loader must take it
    return data


def _copied_call_costs(cal: Calibration, base: DeviceSpec) -> dict[str, Any]:
    """``base``'s host costs per compiled call and per graph replay, at this calibration's host speed (their ratio
    to ``base``'s launch overhead times the measured one), labelled copied, for a calibration that did not measure
    them (``--quick``, or a failed compile): without them a tiny model is priced under torch.compile without its
    call (a fresh user's quick CPU spec predicted 4.74x where apply measured 1.05x). ``{}`` where ``base`` has
    none."""
    if base.launch_overhead_us <= 0 or cal.launch_us <= 0:
        return {}
    k, out = cal.launch_us / base.launch_overhead_us, {}
    why = cal.not_measured.get("compiled_call_us", "not measured")
    for name in ("compiled_call_us", "graph_replay_us"):
        value = getattr(base, name)
        if value > 0 and (name != "graph_replay_us" or cal.device == "cuda"):
            out[name] = round(value * k, 3)
            out[name[: -len("_us")] + "_source"] = (
                f"copied from the shipped spec {base.name} ({why}): its {value:g} us at {base.launch_overhead_us:g} "
                f"us per eager add, scaled to this host's {cal.launch_us:.3g} us")
    return out


def render_spec(data: dict[str, Any]) -> str:
    """The YAML text of a spec mapping, the calibrate marker on its first line."""
    # libyaml's emitter where PyYAML has it: 0.3 s instead of 1.7 for a GPU spec's tables, the same text as safe_dump's
    # for every shipped spec (characters beyond the BMP are escaped differently; they load back the same)
    body = yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False,
                     default_flow_style=False, width=120, allow_unicode=True)
    usage = "# Written by `fusion-advisor calibrate`; use it with `fusion-advisor analyze --gpu THIS.yaml`.\n"
    return f"{MARKER}\n{usage}{body}"


def default_out(cal_device: str) -> Path:
    """Default output file: ``device_spec_<gpu|cpu>.yaml`` in the current folder."""
    return Path(f"device_spec_{'gpu' if cal_device == 'cuda' else 'cpu'}.yaml")


def checked_device(device: str | None) -> str:
    """The device calibrate measures: ``device``, by default ``cuda`` where there is a GPU, else ``cpu``.

    Raises:
        CalibrationError: an unknown device, or cuda without a GPU.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu"):
        raise CalibrationError(f"unknown --device {device!r}: calibrate measures cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("--device cuda asked for, but no CUDA GPU is available; use --device cpu")
    return device


def calibrate(out: Path | None = None, device: str | None = None, quick: bool = False,
              progress: Callable[[str], None] | None = None) -> tuple[Path, dict[str, Any]]:
    """Measure the device and write its spec YAML to ``out`` (checked before measuring, written atomically).

    ``progress`` is called with one line as each measurement starts (:func:`measure`).

    Returns:
        The path written and the spec mapping.

    Raises:
        CalibrationError: bad device, or an ``out`` that must not be written.
    """
    from fusion_advisor.files import atomic_write_bytes

    device = checked_device(device)
    path = Path(out) if out is not None else default_out(device)
    check_out_file(path)
    cal = measure(device, quick=quick, progress=progress)
    data = spec_dict(cal)
    check_out_file(path)  # again: the file may have appeared while measuring
    atomic_write_bytes(path, render_spec(data).encode("utf-8"))
    load_spec(str(path))  # read back through the loader analyze uses
    return path, data
