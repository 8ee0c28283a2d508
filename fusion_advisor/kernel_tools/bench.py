"""Time a verified kernel against its reference, eager and under ``torch.compile``.

:func:`bench_kernel` first runs :func:`fusion_advisor.kernel_tools.verify.verify_kernel` with one seed (plus the hard values and
the edge shapes the file's size hooks allow) and refuses to time a kernel that fails it (TRITON_RULES: never benchmark before verify passes). Then, on one ``get_inputs()`` draw
(seed 0), it times the forward of ``kernel_fn``, ``reference_fn`` and ``torch.compile(reference_fn)`` under
``torch.no_grad()``:

- on CUDA with ``triton.testing.do_bench(fn, warmup, rep)``: the median of per-call CUDA-event times, the L2
  cache flushed before each timed call; the iteration counts are those do_bench ran (counted, see
  :func:`time_cuda`);
- on CPU with ``time.perf_counter`` around each call, the median over ``rep_ms`` worth of calls after
  ``warmup_ms`` of warm-up (:func:`time_cpu`). Under the Triton interpreter such numbers say nothing about GPU
  speed, and the result's ``note`` says so.

``torch.compile``'s first call (tracing + Inductor codegen + compilation) is timed on its own as
``compile_time_ms``, apart from its steady-state median. Dynamo's in-process caches are reset first
(``torch.compiler.reset()``) so the compile is not skipped; Inductor's on-disk caches may still make a repeat
compile faster, and the time is reported as measured. A compile failure (on CPU Inductor needs a C++ compiler)
is caught and reported as ``compiled_reference_time_ms = None`` with the reason.

Each timer run is wrapped in a :class:`fusion_advisor.kernel_tools.recompile.RecompileWatch`: every function is called once
before it is timed (``kernel_fn`` and ``reference_fn`` by one extra warm-up call under ``no_grad``, counted in
``warmup_iters``; the compiled reference by its first, compiling call), so any Triton JIT compilation or
torch.compile recompilation during the timer's warm-up and timed calls is a steady-state one, and should be 0. The counts and their causes are reported as
``steady_state_triton_compiles`` (``None`` under the Triton interpreter, where nothing is compiled),
``steady_state_dynamo_recompiles`` and ``steady_state_recompiles`` (per timed function).
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from fusion_advisor.errors import VerificationFailed
from fusion_advisor.kernel_tools.recompile import RecompileReport, RecompileWatch, summarize
from fusion_advisor.kernel_tools.verify import KernelContract, VerifyResult, fresh_inputs, verify_kernel

#: do_bench's defaults (ms of warm-up and of timed calls), also used on CPU.
DEFAULT_WARMUP_MS = 25.0
DEFAULT_REP_MS = 100.0

#: Fewest timed calls on CPU: a median of fewer says little (do_bench allows 1 on GPU, where calls are steadier).
CPU_MIN_TIMED_CALLS = 3

#: Most timed calls on CPU (a call of a few us would otherwise be timed tens of thousands of times).
CPU_MAX_TIMED_CALLS = 20000

TIMER_CUDA = "triton.testing.do_bench median (cuda events, L2 flushed before each call)"
TIMER_CPU = "cpu-wallclock-median"

CPU_NOTE = (
    "CPU wall-clock timings; under the Triton interpreter (TRITON_INTERPRET=1) they say nothing about GPU speed, "
    "so no speedup is given: benchmark on a GPU"
)


@dataclass(frozen=True)
class Timing:
    """One function's timing.

    Attributes:
        median_ms: median time of one call, in ms.
        warmup_iters: calls made and not timed (first call, warm-up loop).
        benchmark_iters: calls timed; ``median_ms`` is their median. ``None`` when the timer cannot tell.
        kernels_per_call: device activities (kernels, memsets, copies) per call, where the timer profiles them
            (:func:`device_time_and_kernels`); else ``None``.
        spread: the timed calls' spread, ``(p80 - p20) / median`` (:func:`timing_spread`); ``None`` when the timer
            returned no per-call times.
    """

    median_ms: float
    warmup_iters: int | None
    benchmark_iters: int | None
    kernels_per_call: float | None = None
    spread: float | None = None


#: A timing whose calls spread more than this ((p80 - p20) / median) is flagged in bench's JSON: its median, and a
#: ratio built on it, moved with the machine's load more than with the code (the same bar as apply's
#: ``NOISY_SPREAD``, over another statistic: single calls' middle deciles, where apply takes the range of 3-5
#: rounds' medians).
NOISY_TIMING_SPREAD = 0.25


def timing_spread(times_ms: list[float]) -> float | None:
    """Spread of per-call times: ``(p80 - p20) / median``, dimensionless (0.05 = the middle 60% of the calls lie
    within 5% of the median's width); ``None`` for fewer than 3 calls or a median of 0. The quantiles are
    ``statistics.quantiles(n=10)``'s (inclusive method) 2nd and 8th deciles."""
    if len(times_ms) < 3:
        return None
    median = statistics.median(times_ms)
    if median <= 0:
        return None
    deciles = statistics.quantiles(times_ms, n=10, method="inclusive")
    return (deciles[7] - deciles[1]) / median


def time_cuda(fn: Callable[[], Any], warmup_ms: float = DEFAULT_WARMUP_MS, rep_ms: float = DEFAULT_REP_MS,
              do_bench: Callable[..., Any] | None = None) -> Timing:
    """Time ``fn`` on the GPU with ``triton.testing.do_bench`` and report how many calls it made.

    do_bench calls ``fn`` once, 5 more times to estimate its runtime, ``max(1, int(warmup / estimate))`` times
    to warm up, then ``max(1, int(rep / estimate))`` timed times, flushing the L2 cache before each timed call.
    Asked for every per-call time (``return_mode="all"``), it returns the timed ones: their count is
    ``benchmark_iters`` and their median is the median do_bench's ``return_mode="median"`` gives. ``fn`` is
    wrapped in a call counter, so ``warmup_iters`` (every untimed call) is counted, not assumed.

    Args:
        do_bench: the timer, ``triton.testing.do_bench`` by default (a parameter so tests can check the counting).
    """
    if do_bench is None:
        import triton.testing

        do_bench = triton.testing.do_bench
    calls = 0

    def counted() -> None:
        nonlocal calls
        calls += 1
        fn()

    try:
        times = do_bench(counted, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    except (AssertionError, TypeError, ValueError):
        if calls:  # fn itself raised
            raise
        # A Triton whose do_bench rejects return_mode="all" (it asserts before calling fn): counts unknown.
        median = do_bench(counted, warmup=warmup_ms, rep=rep_ms, return_mode="median")
        return Timing(float(median), None, None)
    return Timing(float(statistics.median(times)), calls - len(times), len(times), spread=timing_spread(times))


def _device_events(fn: Callable[[], Any], iters: int, caller: str) -> list[Any]:
    """``torch.profiler`` key averages of the device activities of ``iters`` calls of ``fn`` (one untimed call first).

    Raises:
        RuntimeError: no CUDA device (``caller`` names the function asked).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        raise RuntimeError(f"{caller} needs a CUDA device")
    fn()
    torch.cuda.synchronize()
    from fusion_advisor.analyze.capture import quiet_native_stderr  # libkineto's "USDT: profiler_start" lines

    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with quiet_native_stderr(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
    return [e for e in prof.key_averages() if e.self_device_time_total > 0]


def device_time_by_kernel(fn: Callable[[], Any], iters: int = 10) -> dict[str, float]:
    """GPU kernel name -> ms of device time per call of ``fn`` (``torch.profiler``; see :func:`device_time_ms`).

    Raises:
        RuntimeError: no CUDA device.
    """
    return {e.key: e.self_device_time_total / iters / 1e3
            for e in _device_events(fn, iters, "device_time_by_kernel")}


def device_time_and_kernels(fn: Callable[[], Any], iters: int = 10) -> tuple[float, float]:
    """``(ms of device time, device activities)`` per call of ``fn`` from one profiled run (see
    :func:`device_time_ms` and :func:`device_kernels_per_call`).

    Raises:
        RuntimeError: no CUDA device.
    """
    events = _device_events(fn, iters, "device_time_and_kernels")
    return (sum(e.self_device_time_total for e in events) / iters / 1e3, sum(e.count for e in events) / iters)


def device_kernels_per_call(fn: Callable[[], Any], iters: int = 3) -> float:
    """Device activities (kernels, memsets, copies) one call of ``fn`` launches (``torch.profiler``).

    Raises:
        RuntimeError: no CUDA device.
    """
    return device_time_and_kernels(fn, iters)[1]


#: Kernel-name patterns of vendor-library kernels (cuBLAS/cuBLASLt, CUTLASS, cuDNN, flash / memory-efficient
#: attention): the work the advisor routes to SKIP.
LIBRARY_KERNEL_PATTERNS = ("gemm", "cublas", "cutlass", "nvjet", "xmma", "sm90_", "sm80_", "cudnn", "flash",
                           "fmha", "attention", "attn", "splitk", "scaled_dot")


def kernel_class(name: str) -> str:
    """Class of a GPU kernel by its name: ``"library"`` (GEMM/attention from cuBLAS, CUTLASS, flash attention...),
    ``"inductor"`` (Triton kernels Inductor generated: ``triton_poi_``/``triton_red_``/``triton_per_``...),
    ``"fusion_advisor"`` (our library's Triton kernels, named ``_..._kernel``) or ``"aten"`` (PyTorch's own)."""
    low = name.lower()
    if low.startswith("triton_"):
        return "inductor"
    if any(p in low for p in LIBRARY_KERNEL_PATTERNS):
        return "library"
    if low.startswith("_") and low.endswith("_kernel"):
        return "fusion_advisor"
    return "aten"


def device_time_ms(fn: Callable[[], Any], iters: int = 10) -> float:
    """Summed duration of the GPU kernels one call of ``fn`` launches, ms (``torch.profiler``, CUDA activity).

    Host time and idle gaps between kernels are excluded: this is the time ``fn`` occupies the GPU, which is what
    it costs inside a model whose host runs ahead of the GPU. One untimed call first, then ``iters`` profiled
    calls; returns their total kernel time / ``iters``. L2 is warm (no flush between calls).

    Raises:
        RuntimeError: no CUDA device.
    """
    return sum(device_time_by_kernel(fn, iters).values())


def time_cpu(fn: Callable[[], Any], warmup_ms: float = DEFAULT_WARMUP_MS, rep_ms: float = DEFAULT_REP_MS) -> Timing:
    """Median wall-clock time of ``fn`` on CPU (ms), do_bench's budgets spent by the clock.

    One first call, warm-up calls for ``warmup_ms`` (at least one), then timed calls (``time.perf_counter``) until
    there are ``rep_ms`` worth of them at their running median (at least :data:`CPU_MIN_TIMED_CALLS`, at most
    :data:`CPU_MAX_TIMED_CALLS`). The count follows the median of the calls so far rather than an estimate from
    the first ones: on a busy machine a few early calls descheduled for milliseconds once made the estimate 1000x
    too long and left three timed calls, whose median was the stall, not the call.
    """
    fn()
    n_warmup = 0
    deadline = time.perf_counter() + warmup_ms / 1e3
    while n_warmup < 1 or time.perf_counter() < deadline:
        fn()
        n_warmup += 1
    times: list[float] = []
    wanted = CPU_MIN_TIMED_CALLS
    while len(times) < min(wanted, CPU_MAX_TIMED_CALLS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
        if len(times) == wanted or len(times) % 64 == 0:
            wanted = max(CPU_MIN_TIMED_CALLS, int(rep_ms / max(statistics.median(times), 1e-6)))
    return Timing(statistics.median(times), 1 + n_warmup, len(times), spread=timing_spread(times))


@dataclass
class BenchResult:
    """Outcome of :func:`bench_kernel`; times are medians in ms of one forward call.

    Attributes:
        name: the kernel's name.
        device: where it ran (``"cuda:0 (NVIDIA H200)"``, ``"cpu (Triton interpreter)"``).
        timer: :data:`TIMER_CUDA` or :data:`TIMER_CPU`.
        kernel_time_ms, reference_time_ms: ``kernel_fn`` and eager ``reference_fn``.
        speedup: ``reference_time_ms / kernel_time_ms``; ``None`` on the CPU, where the kernel's time is the
            Triton interpreter's (:data:`CPU_NOTE`).
        warmup_iters, benchmark_iters: untimed and timed calls of ``kernel_fn`` (``iterations`` has all three).
        compiled_reference_time_ms: steady-state ``torch.compile(reference_fn)``; ``None`` if skipped or failed.
        compile_time_ms: wall time of the compiled reference's first call (compilation included), apart from
            the steady state; ``None`` if skipped or failed.
        speedup_vs_compile: ``compiled_reference_time_ms / kernel_time_ms``; ``None`` without a compiled time
            or on the CPU.
        compile_error: why there is no compiled time (``"skipped (--no-compile)"``, the exception), else ``None``.
        note: a caveat on the numbers (CPU timings), else ``None``.
        iterations: ``{"kernel" | "reference" | "compiled_reference": {"warmup": n, "benchmark": n}}``.
        warmup_ms, rep_ms: the timer's budgets.
        verify: the one-seed verification that preceded the timing.
        recompiles: per timed function (``"kernel"``, ``"reference"``, ``"compiled_reference"``), the Triton JIT
            compilations and torch.compile frame compilations during its timer run (steady state).
        spreads: per timed function (the keys of ``iterations``), its timed calls' ``(p80 - p20) / median``
            (:func:`timing_spread`), ``None`` where the timer gave no per-call times.
    """

    name: str
    device: str
    timer: str
    kernel_time_ms: float
    reference_time_ms: float
    speedup: float | None
    warmup_iters: int | None
    benchmark_iters: int | None
    compiled_reference_time_ms: float | None = None
    compile_time_ms: float | None = None
    speedup_vs_compile: float | None = None
    compile_error: str | None = None
    note: str | None = None
    iterations: dict[str, dict[str, int | None]] = field(default_factory=dict)
    warmup_ms: float = DEFAULT_WARMUP_MS
    rep_ms: float = DEFAULT_REP_MS
    verify: VerifyResult | None = None
    recompiles: dict[str, RecompileReport] = field(default_factory=dict)
    spreads: dict[str, float | None] = field(default_factory=dict)

    @property
    def noisy_timings(self) -> list[str]:
        """The timed functions whose calls spread over :data:`NOISY_TIMING_SPREAD`: their medians, and the
        speedups built on them, are not reliable (a busy machine, a clock-throttled GPU)."""
        return [name for name, spread in self.spreads.items() if spread is not None and spread > NOISY_TIMING_SPREAD]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, the contract's keys first; non-finite numbers become ``None``.

        ``steady_state_triton_compiles`` (``None`` when not counted, as under the Triton interpreter) and
        ``steady_state_dynamo_recompiles`` (every torch.compile frame compilation during the timed runs) should be
        0; ``steady_state_recompiles`` holds each timed function's counts and the causes. ``timing_spread`` gives
        each timed function's ``(p80 - p20) / median``; ``noisy_timings`` names those over
        :data:`NOISY_TIMING_SPREAD`, whose speedups should be measured again.
        """
        f = _json_float
        steady = summarize(self.recompiles)
        return {
            "kernel_time_ms": f(self.kernel_time_ms),
            "reference_time_ms": f(self.reference_time_ms),
            "speedup": f(self.speedup),
            "warmup_iters": self.warmup_iters,
            "benchmark_iters": self.benchmark_iters,
            "compiled_reference_time_ms": f(self.compiled_reference_time_ms),
            "compile_time_ms": f(self.compile_time_ms),
            "speedup_vs_compile": f(self.speedup_vs_compile),
            "compile_error": self.compile_error,
            "device": self.device,
            "timer": self.timer,
            "note": self.note,
            "kernel": self.name,
            "iterations": self.iterations,
            "timing_spread": {name: f(spread) for name, spread in self.spreads.items()},
            "noisy_timings": self.noisy_timings,
            "timing_spread_note": (f"(p80 - p20) / median of each function's timed calls; those over "
                                   f"{NOISY_TIMING_SPREAD:g} are named in noisy_timings: their medians and the "
                                   f"speedups built on them moved with the machine's load"),
            "warmup_ms": self.warmup_ms,
            "rep_ms": self.rep_ms,
            "verify": self.verify.to_dict() if self.verify is not None else None,
            "steady_state_triton_compiles": steady["triton_compiles"],
            "steady_state_dynamo_recompiles": steady["dynamo_compiles"],
            "steady_state_recompiles": steady["phases"],
        }


def _json_float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def device_of(args: list[Any]) -> torch.device:
    """Device of the first tensor in ``args`` (one level into lists/tuples), else the kernels' default device."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return b.device
    from kernel_library._device import default_device

    return default_device()


def describe_device(device: torch.device) -> str:
    """``device`` for reports: ``"cuda:0 (NVIDIA H200)"``, ``"cpu (Triton interpreter)"``, ``"cpu"``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    from kernel_library._device import interpreted

    return f"{device.type} (Triton interpreter)" if device.type == "cpu" and interpreted() else device.type


def sync_device(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op off CUDA); ``device`` as a torch.device or ``"cuda"``/``"cpu"``."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_kernel(contract: KernelContract, warmup_ms: float = DEFAULT_WARMUP_MS, rep_ms: float = DEFAULT_REP_MS,
                 compile_reference: bool = True, *, rtol: float | None = None,
                 atol: float | None = None) -> BenchResult:
    """Verify ``contract`` (one seed, the hard values and the edge shapes: :func:`fusion_advisor.kernel_tools.verify.verify_kernel`),
    then time its kernel, its reference and the compiled reference.

    Args:
        contract: from :func:`fusion_advisor.kernel_tools.verify.load_contract`.
        warmup_ms, rep_ms: warm-up and timed budget per function, in ms (do_bench's ``warmup`` and ``rep``).
        compile_reference: also time ``torch.compile(reference_fn)``; ``False`` skips it (``--no-compile``).
        rtol, atol: tolerances for the verification (``None``: per-dtype table).

    Raises:
        VerificationFailed: the kernel failed verification; nothing was timed. ``.result`` holds the
            :class:`~fusion_advisor.kernel_tools.verify.VerifyResult`.
        ContractError: ``get_inputs()`` or ``reference_fn`` raised.
    """
    verified = verify_kernel(contract, rtol=rtol, atol=atol, seeds=1)
    if not verified.correct:
        lines = "\n  ".join(verified.details)
        raise VerificationFailed(
            f"{contract.name}: verification failed, so it is not benchmarked:\n  {lines}", result=verified
        )

    args = fresh_inputs(contract, seed=0)
    device = device_of(args)
    on_cuda = device.type == "cuda"

    recompiles: dict[str, RecompileReport] = {}

    def timer(fn: Callable[[], Any], label: str, warm: bool = True) -> Timing:
        """Time ``fn``, counting the compilations during the timer's run; ``warm``: call it once before (counted
        in ``warmup_iters``), so a first call's compilation in this mode (``no_grad``) is not steady state."""
        if warm:
            fn()
            sync_device(device)
        with RecompileWatch() as watch:
            timing = time_cuda(fn, warmup_ms, rep_ms) if on_cuda else time_cpu(fn, warmup_ms, rep_ms)
        recompiles[label] = watch.report
        if warm and timing.warmup_iters is not None:
            timing = replace(timing, warmup_iters=timing.warmup_iters + 1)
        return timing

    kernel_fn, reference_fn = contract.kernel_fn, contract.reference_fn
    with torch.no_grad():
        kernel = timer(lambda: kernel_fn(*args), "kernel")
        reference = timer(lambda: reference_fn(*args), "reference")
        compiled, compile_ms, compile_error = None, None, None
        if not compile_reference:
            compile_error = "skipped (--no-compile)"
        else:
            try:
                torch.compiler.reset()  # a cold compile, not a hit in dynamo's in-process cache
                compiled_fn = torch.compile(reference_fn)
                sync_device(device)
                start = time.perf_counter()
                compiled_fn(*args)  # first call: trace + Inductor codegen + compile
                sync_device(device)
                compile_ms = (time.perf_counter() - start) * 1e3
                compiled = timer(lambda: compiled_fn(*args), "compiled_reference", warm=False)
            except Exception as exc:  # noqa: BLE001 - any compile failure is reported, not raised
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                compile_error = f"torch.compile(reference_fn) failed: {type(exc).__name__}: {first}"
                compiled, compile_ms = None, None

    iterations = {"kernel": {"warmup": kernel.warmup_iters, "benchmark": kernel.benchmark_iters},
                  "reference": {"warmup": reference.warmup_iters, "benchmark": reference.benchmark_iters}}
    spreads = {"kernel": kernel.spread, "reference": reference.spread}
    if compiled is not None:
        iterations["compiled_reference"] = {"warmup": compiled.warmup_iters, "benchmark": compiled.benchmark_iters}
        spreads["compiled_reference"] = compiled.spread
    return BenchResult(
        name=contract.name,
        device=describe_device(device),
        timer=TIMER_CUDA if on_cuda else TIMER_CPU,
        kernel_time_ms=kernel.median_ms,
        reference_time_ms=reference.median_ms,
        speedup=(reference.median_ms / kernel.median_ms if kernel.median_ms > 0 else math.inf) if on_cuda else None,
        warmup_iters=kernel.warmup_iters,
        benchmark_iters=kernel.benchmark_iters,
        compiled_reference_time_ms=compiled.median_ms if compiled is not None else None,
        compile_time_ms=compile_ms,
        speedup_vs_compile=(compiled.median_ms / kernel.median_ms
                            if on_cuda and compiled is not None and kernel.median_ms > 0 else None),
        compile_error=compile_error,
        note=None if on_cuda else CPU_NOTE,
        iterations=iterations,
        warmup_ms=warmup_ms,
        rep_ms=rep_ms,
        verify=verified,
        recompiles=recompiles,
        spreads=spreads,
    )
