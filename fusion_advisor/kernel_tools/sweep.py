"""``fusion-advisor bench FILE --sweep``: time a kernel's launch configs over the sizes its file can produce.

Sweep hooks (an extension of the kernel contract of :mod:`fusion_advisor.kernel_tools.verify`; all optional, but at least one
source of configs is needed):

* **sizes** — ``get_inputs(size)`` taking one argument, plus ``SIZES`` (a list of ints or shape tuples) or
  ``SHAPES`` (a list of shape tuples); each size is passed to ``get_inputs(size)``. Without them the single size
  of ``get_inputs()`` is swept (label ``"default"``).
* **configs** — either ``SWEEP_CONFIGS``: a list of dicts of meta-parameters (``{"BLOCK_SIZE": 1024,
  "num_warps": 4}``), or a function ``SWEEP_CONFIGS(size) -> list[dict]`` when the sensible configs depend on the
  size; ``kernel_fn(*args, **config)`` must accept every key. Or, without ``SWEEP_CONFIGS``, one
  ``@triton.autotune``-decorated kernel in the file (a :class:`triton.runtime.autotuner.Autotuner` with
  ``.configs``): each of its configs is forced in turn (the autotuner is given that one config, so it launches it
  without benchmarking) and ``kernel_fn(*args)`` is called as is.
* **throughput** — ``bytes_moved(*args)`` (bytes the call must move at least: each input read once, each output
  written once) gives GB/s; ``flops(*args)`` gives TFLOP/s. Without them only times are reported.

For ``kernel_library`` kernels, whose modules define no hooks, :mod:`kernel_library.sweeps` provides them
(``fusion-advisor bench rmsnorm --sweep``).

For each size and config, :func:`run_sweep`

1. calls the kernel once and times that call on its own (``first_call_ms``: Triton JIT compilation, or the
   autotuner's choice, plus one run; Triton's on-disk cache can make a repeat sweep's first call fast). A
   config that raises here (too many registers, out of shared memory, a compile error) is **rejected** with
   the exception as its reason and the sweep goes on;
2. verifies it with :func:`fusion_advisor.kernel_tools.verify.verify_kernel` (one seed; a fresh clone of the size's inputs,
   drawn once per size with seed 0; poisoned allocations, float64 reference, per-dtype tolerances); a config that fails is **rejected** with the first
   failing detail as its reason and is not timed;
3. times the forward as ``fusion-advisor bench`` does: :func:`fusion_advisor.kernel_tools.bench.time_cuda` (do_bench median,
   L2 flushed) on a GPU, :func:`fusion_advisor.kernel_tools.bench.time_cpu` on the CPU; under ``torch.no_grad()``, on inputs
   detached from autograd (the sweep is of the forward launch).

GB/s = ``bytes_moved / time``; TFLOP/s = ``flops / time``; % of roofline = the roofline time of the call on the
device spec (``max(flops / peak, bytes / bandwidth)``, :mod:`fusion_advisor.analyze.roofline`'s model without the launch
term; vector peak of the inputs' dtype unless the file sets ``SWEEP_TENSOR_CORES = True``) over the measured
time. The best config of a size is its fastest verified one, on a GPU (interpreter times choose nothing).

Without a GPU the kernels run under Triton's interpreter: the sweep still verifies every config and measures
times, but those are CPU-interpreter times (:data:`CPU_LABEL` in every row), not a GPU measurement; GB/s and %
of roofline are left empty there, since they would compare an interpreter with a GPU's bandwidth.

:func:`write_sweep` writes ``sweep.csv`` (one row per size and config, columns :data:`COLUMNS`) and
``sweep.json`` atomically, refusing a folder that holds such files not written by fusion-advisor.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from fusion_advisor.kernel_tools.bench import (
    DEFAULT_REP_MS,
    DEFAULT_WARMUP_MS,
    TIMER_CPU,
    TIMER_CUDA,
    describe_device,
    device_of,
    sync_device,
    time_cpu,
    time_cuda,
)
from fusion_advisor.errors import ContractError, UserError
from fusion_advisor.kernel_tools.verify import KernelContract, fresh_inputs, takes_argument, verify_kernel
from fusion_advisor.verification.trees import tree_map

#: Label of every time measured under the Triton interpreter.
CPU_LABEL = "CPU interpreter, not a GPU measurement"

#: How the reason of a config that computed wrong values starts (a rejection that makes ``bench --sweep`` exit 1).
FAILED_VERIFICATION = "failed verification"

#: Files written by :func:`write_sweep`.
FILE_NAMES = ("sweep.csv", "sweep.json")

#: What a kernel file must add to be swept (in the error of a file without hooks).
HOOKS_HELP = (
    "define SWEEP_CONFIGS = [{'BLOCK_SIZE': 1024, 'num_warps': 4}, ...] (or a function SWEEP_CONFIGS(size) "
    "returning such a list) with kernel_fn(*args, **config) accepting those keys, or decorate the kernel with "
    "@triton.autotune(configs=[...], key=[...]); to sweep sizes, define get_inputs(size) and SIZES = [...] "
    "(ints or shape tuples) or SHAPES = [...]; optional bytes_moved(*args) / flops(*args) give GB/s / TFLOP/s"
)

#: CSV columns (one row per size and config) -> documentation.
COLUMNS: dict[str, str] = {
    "size": "The size passed to get_inputs(size) ('default' when get_inputs() takes none).",
    "config": "The launch meta-parameters, 'key=value' space separated.",
    "status": "'ok' (verified and timed) or 'rejected'.",
    "reason": "Why a config was rejected (compile/launch error or failed verification), else empty.",
    "first_call_ms": "Wall time of the first call (JIT compile or autotune + one run), synchronised (ms).",
    "time_ms": "Steady-state median time of one call (ms); empty when rejected.",
    "gbps": "bytes_moved / time_ms (GB/s, 1e9 bytes/s); empty without bytes_moved or on the CPU interpreter.",
    "tflops": "flops / time_ms (TFLOP/s); empty without flops or on the CPU interpreter.",
    "pct_roofline": "Roofline time max(flops/peak, bytes/bandwidth) on the device spec over time_ms (%); empty "
    "without bytes_moved/flops or on the CPU interpreter.",
    "best": "True for the fastest verified config of its size, False for the other configs of a ranked size; empty "
    "where nothing was ranked (the CPU interpreter's times rank no config).",
    "warmup_iters": "Untimed calls of the steady-state timer.",
    "benchmark_iters": "Timed calls; time_ms is their median.",
    "bytes": "bytes_moved(*args) of this size (bytes), empty without it.",
    "flops": "flops(*args) of this size (FLOP), empty without it.",
    "measured_on": "Where the time was measured (GPU name, or the CPU-interpreter label).",
}


# --- hooks --------------------------------------------------------------------------------------------------


@dataclass
class SweepHooks:
    """What a sweep needs from a kernel file, read by :func:`load_hooks`.

    Attributes:
        name: the kernel's name.
        sizes: sizes for ``get_inputs``; ``[None]`` means ``get_inputs()`` with no argument.
        get_inputs: ``get_inputs(size)`` (or ``get_inputs()`` when ``sizes == [None]``) -> list of arguments.
        kernel_fn: ``kernel_fn(*args, **config)`` (SWEEP_CONFIGS) or ``kernel_fn(*args)`` (autotune).
        reference_fn: plain-PyTorch reference, same positional signature.
        configs: ``SWEEP_CONFIGS`` (a list, or a function of the size), or ``None`` with an autotuner.
        autotuner: the file's ``triton.autotune`` kernel when configs come from it, else ``None``.
        bytes_moved, flops: optional throughput formulas over the arguments.
        tensor_cores: whether % of roofline uses the tensor-core peak (``SWEEP_TENSOR_CORES``).
        source: ``"SWEEP_CONFIGS"`` or ``"triton.autotune"``.
        path: the kernel file, or ``None``.
    """

    name: str
    sizes: list[Any]
    get_inputs: Callable[..., Sequence[Any]]
    kernel_fn: Callable[..., Any]
    reference_fn: Callable[..., Any]
    configs: list[dict[str, Any]] | Callable[[Any], list[dict[str, Any]]] | None
    autotuner: Any = None
    bytes_moved: Callable[..., int] | None = None
    flops: Callable[..., int] | None = None
    tensor_cores: bool = False
    source: str = "SWEEP_CONFIGS"
    path: Path | None = None

    def configs_for(self, size: Any) -> list[dict[str, Any]]:
        """The configs to try at ``size``, each a dict of meta-parameters.

        Raises:
            ContractError: ``SWEEP_CONFIGS`` is not a list of dicts (or its function raised).
        """
        if self.autotuner is not None:
            return [_triton_config_dict(c) for c in self.autotuner.configs]
        configs = self.configs
        if callable(configs):
            try:
                configs = configs(size)
            except Exception as exc:
                raise ContractError(f"{self.name}: SWEEP_CONFIGS({size!r}) raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(configs, (list, tuple)) or not all(isinstance(c, dict) for c in configs):
            raise ContractError(f"{self.name}: SWEEP_CONFIGS must be a list of dicts of meta-parameters, "
                                f"got {type(configs).__name__}; {HOOKS_HELP}")
        return [dict(c) for c in configs]


def _triton_config_dict(cfg: Any) -> dict[str, Any]:
    """A ``triton.Config`` as one flat dict: its kwargs plus num_warps, num_stages (and num_ctas when not 1)."""
    d = dict(getattr(cfg, "kwargs", {}) or {})
    for key in ("num_warps", "num_stages"):
        if getattr(cfg, key, None) is not None:
            d[key] = getattr(cfg, key)
    if getattr(cfg, "num_ctas", 1) not in (None, 1):
        d["num_ctas"] = cfg.num_ctas
    return d


def _autotuners(module: ModuleType) -> list[tuple[str, Any]]:
    """``(name, Autotuner)`` for every ``triton.autotune``-decorated kernel defined at the module's top level."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # pragma: no cover - triton is a dependency
        return []
    return [(n, v) for n, v in vars(module).items() if isinstance(v, Autotuner)]


def _library_hooks(name: str) -> Any:
    """The :mod:`kernel_library.sweeps` entry for library kernel ``name``, or ``None``."""
    try:
        from kernel_library.sweeps import SWEEPS
    except ImportError:
        return None
    return SWEEPS.get(name)


def load_hooks(contract: KernelContract) -> SweepHooks:
    """Read the sweep hooks of ``contract``'s module (see the module doc), or of :mod:`kernel_library.sweeps` for a
    library kernel.

    Raises:
        ContractError: nothing to sweep (the message says which names to add); ``SIZES``/``SHAPES`` is not a
            non-empty list, or given while ``get_inputs`` takes no argument; several ``triton.autotune`` kernels
            and no ``SWEEP_CONFIGS``.
    """
    module = contract.module
    where = str(contract.path) if contract.path else contract.name
    source: Any = module
    is_library = module is not None and module.__name__.startswith("kernel_library.")
    if is_library and not hasattr(module, "SWEEP_CONFIGS"):
        lib = _library_hooks(contract.name)
        if lib is None:
            try:
                from kernel_library.sweeps import SWEEPS
                known = ", ".join(sorted(SWEEPS))
            except ImportError:
                known = "(kernel_library.sweeps not importable)"
            raise ContractError(f"{contract.name}: this library kernel has no sweep hooks in kernel_library/sweeps.py "
                                f"(kernels with hooks: {known})")
        source = lib
    get = functools.partial(getattr, source)

    configs = get("SWEEP_CONFIGS", None)
    autotuner = None
    if configs is None and module is not None:
        tuners = _autotuners(module)
        if len(tuners) > 1:
            raise ContractError(f"{where}: several triton.autotune kernels ({', '.join(n for n, _ in tuners)}) and no "
                                f"SWEEP_CONFIGS: say which configs to sweep with SWEEP_CONFIGS")
        if tuners:
            autotuner = tuners[0][1]
    if configs is None and autotuner is None:
        raise ContractError(f"{where}: nothing to sweep: no SWEEP_CONFIGS and no triton.autotune kernel; {HOOKS_HELP}")

    get_inputs = get("get_inputs", contract.get_inputs)
    sizes_attr = next((n for n in ("SIZES", "SHAPES") if get(n, None) is not None), None)
    if sizes_attr is not None:
        sizes = get(sizes_attr)
        if not isinstance(sizes, (list, tuple)) or not sizes:
            raise ContractError(f"{where}: {sizes_attr} must be a non-empty list of sizes (ints or shape tuples)")
        if not takes_argument(get_inputs):
            raise ContractError(f"{where}: {sizes_attr} is given but get_inputs() takes no argument; "
                                f"define get_inputs(size)")
        sizes = [tuple(s) if isinstance(s, list) else s for s in sizes]
        for size in sizes:  # as verify and bench check them (a size 0 was swept and timed, -4 failed in get_inputs)
            dims = size if isinstance(size, tuple) else (size,)
            if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
                raise ContractError(f"{where}: {sizes_attr}: a size must be a positive int or a tuple of them, "
                                    f"got {size!r}")
    else:
        sizes = [None]
    return SweepHooks(
        name=contract.name,
        sizes=list(sizes),
        get_inputs=get_inputs,
        kernel_fn=get("kernel_fn", contract.kernel_fn),
        reference_fn=get("reference_fn", contract.reference_fn),
        configs=configs,
        autotuner=autotuner,
        bytes_moved=get("bytes_moved", None),
        flops=get("flops", None),
        tensor_cores=bool(get("SWEEP_TENSOR_CORES", False)),
        source="SWEEP_CONFIGS" if configs is not None else "triton.autotune",
        path=contract.path,
    )


# --- results ------------------------------------------------------------------------------------------------


@dataclass
class SweepRow:
    """One (size, config) of a sweep; times in ms. See :data:`COLUMNS` for each field."""

    size: str
    config: str
    status: str
    reason: str = ""
    first_call_ms: float | None = None
    time_ms: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_roofline: float | None = None
    best: bool | None = None
    warmup_iters: int | None = None
    benchmark_iters: int | None = None
    bytes: int | None = None
    flops: int | None = None
    measured_on: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def csv_row(self) -> dict[str, Any]:
        """The row's :data:`COLUMNS` values."""
        return {k: getattr(self, k) for k in COLUMNS}


@dataclass
class SizeSummary:
    """Per size: the best verified config, and for autotuned kernels what the autotuner chose.

    Attributes:
        size: the size label.
        best_config: the fastest verified config, ``""`` when every config was rejected or the times come from
            the CPU interpreter (which ranks nothing about a GPU).
        best_time_ms: its median time (ms), ``None`` where ``best_config`` is ``""``.
        rejected: number of configs rejected at this size.
        failed_verification: those of them that ran but computed wrong values (NaN, a mismatch, an out-of-bounds
            store, a mutated input): a kernel bug at this size, unlike a config that does not compile or launch.
        autotune_ms: wall time of the autotuner's first call at this size with all its configs (its
            benchmarking included), apart from the steady state; ``None`` without an autotuner.
        autotune_choice: the config the autotuner picked, ``""`` when unknown.
        autotune_error: why the autotuned call failed, else ``""``.
    """

    size: str
    best_config: str
    best_time_ms: float | None
    rejected: int
    failed_verification: int = 0
    autotune_ms: float | None = None
    autotune_choice: str = ""
    autotune_error: str = ""


@dataclass
class SweepResult:
    """Outcome of :func:`run_sweep`.

    Attributes:
        name, path: the kernel.
        source: where the configs came from (``"SWEEP_CONFIGS"`` or ``"triton.autotune"``).
        device: where it ran (``"cuda:0 (NVIDIA H200)"`` or ``"cpu (Triton interpreter)"``).
        timer: the timer (:data:`fusion_advisor.kernel_tools.bench.TIMER_CUDA` / ``TIMER_CPU``).
        interpreted: times come from the CPU interpreter (:data:`CPU_LABEL`).
        spec: name of the device spec used for % of roofline.
        rows: one per (size, config), sizes in order.
        sizes: one :class:`SizeSummary` per size.
        note: a caveat on the numbers, else ``""``.
        warmup_ms, rep_ms: the timer's budgets.
        versions: torch/triton versions and GPU name.
    """

    name: str
    path: str
    source: str
    device: str
    timer: str
    interpreted: bool
    spec: str
    rows: list[SweepRow]
    sizes: list[SizeSummary]
    note: str = ""
    warmup_ms: float = DEFAULT_WARMUP_MS
    rep_ms: float = DEFAULT_REP_MS
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def failed_sizes(self) -> list[str]:
        """Labels of the sizes where some config computed wrong values, or where every config was rejected by a
        TypeError (a ``kernel_fn`` that takes no launch parameters: the file is wrong, not the configs; a size no
        config fits, out of resources, is not a failure); ``bench --sweep`` then exits 1."""
        by_size: dict[str, list[SweepRow]] = {}
        for r in self.rows:
            by_size.setdefault(r.size, []).append(r)
        return [s.size for s in self.sizes if s.failed_verification
                or (by_size.get(s.size) and all(r.status == "rejected" and "TypeError" in r.reason
                                                for r in by_size[s.size]))]

    def frame(self) -> Any:
        """The rows as a pandas DataFrame with exactly the :data:`COLUMNS` columns."""
        import pandas as pd

        return pd.DataFrame([r.csv_row() for r in self.rows], columns=list(COLUMNS))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite numbers become ``None``)."""
        from fusion_advisor.report.write import jsonable

        import fusion_advisor

        return jsonable({
            "sweep": self.name, "path": self.path, "source": self.source, "device": self.device,
            "timer": self.timer, "interpreted": self.interpreted, "note": self.note, "spec": self.spec,
            "warmup_ms": self.warmup_ms, "rep_ms": self.rep_ms, "versions": self.versions,
            "sizes": [s.__dict__ for s in self.sizes], "failed_sizes": self.failed_sizes,
            "rows": [{**r.csv_row(), "params": r.params} for r in self.rows],
            "columns": COLUMNS, "tool_version": fusion_advisor.__version__,
        })


# --- running ------------------------------------------------------------------------------------------------


def _label(size: Any) -> str:
    if size is None:
        return "default"
    if isinstance(size, tuple):
        return "x".join(str(s) for s in size)
    return str(size)


def config_label(config: dict[str, Any]) -> str:
    """``{"BLOCK_SIZE": 1024, "num_warps": 4}`` -> ``"BLOCK_SIZE=1024 num_warps=4"``."""
    return " ".join(f"{k}={v}" for k, v in config.items()) or "(defaults)"


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


def _clone(x: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".strip().rstrip(":")


def _dtype_short(args: Sequence[Any]) -> str:
    from fusion_advisor.dtypes import dtype_name

    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return dtype_name(a.dtype)
    return "fp32"


class _ForcedConfig:
    """Context manager: the autotuner launches only ``config`` (no benchmarking), its cache cleared; restored on exit."""

    def __init__(self, autotuner: Any, config: Any):
        self.autotuner, self.config = autotuner, config

    def __enter__(self) -> None:
        self.saved = (self.autotuner.configs, dict(getattr(self.autotuner, "cache", {})))
        self.autotuner.configs = [self.config]
        if hasattr(self.autotuner, "cache"):
            self.autotuner.cache = {}

    def __exit__(self, *exc: Any) -> None:
        self.autotuner.configs = self.saved[0]
        if hasattr(self.autotuner, "cache"):
            self.autotuner.cache = self.saved[1]


def run_sweep(hooks: SweepHooks, *, spec_name: str | None = None, warmup_ms: float = DEFAULT_WARMUP_MS,
              rep_ms: float = DEFAULT_REP_MS, rtol: float | None = None, atol: float | None = None,
              progress: Callable[[str], None] | None = None) -> SweepResult:
    """Verify and time every config of ``hooks`` at every size (see the module doc).

    Args:
        hooks: from :func:`load_hooks`.
        spec_name: device spec for % of roofline (``h200``, a YAML path, ...); default: the present GPU's.
        warmup_ms, rep_ms: the timer's budgets per config, ms.
        rtol, atol: verification tolerances (``None``: by dtype).
        progress: called with a one-line status before each config.

    Raises:
        ContractError: ``get_inputs(size)`` or ``reference_fn`` raised, or ``SWEEP_CONFIGS`` is malformed.
        DeviceSpecError: unknown ``spec_name``.
    """
    from fusion_advisor.analyze.pipeline import default_spec_name, versions
    from fusion_advisor.devices import load_spec

    spec = load_spec(spec_name or default_spec_name())
    rows: list[SweepRow] = []
    summaries: list[SizeSummary] = []
    device_label, on_cuda = "", False
    for size in hooks.sizes:
        label = _label(size)

        def make_inputs(size: Any = size) -> list[Any]:
            args = hooks.get_inputs() if size is None else hooks.get_inputs(size)
            return [tree_map(_detach, a) for a in args] if isinstance(args, (list, tuple)) else args

        probe = KernelContract(name=hooks.name, path=hooks.path, kernel_fn=hooks.kernel_fn,
                               reference_fn=hooks.reference_fn, get_inputs=make_inputs)
        # One draw per size (seed 0), shared by every config: each verification gets fresh clones of it, so a
        # config that wrote into its inputs cannot pass that on, and large inputs are generated once.
        args = fresh_inputs(probe, seed=0)

        def get_inputs(args: list[Any] = args) -> list[Any]:
            return [tree_map(_clone, a) for a in args]
        device = device_of(args)
        on_cuda = device.type == "cuda"
        device_label = describe_device(device)
        n_bytes = _call_formula(hooks.bytes_moved, args, "bytes_moved", hooks.name)
        n_flops = _call_formula(hooks.flops, args, "flops", hooks.name)
        summary = SizeSummary(size=label, best_config="", best_time_ms=None, rejected=0)
        if hooks.autotuner is not None:
            if on_cuda:
                _time_autotune(hooks, args, device, summary)
            else:
                summary.autotune_error = ("not run on the CPU interpreter: triton.autotune benchmarks its configs "
                                          "with a GPU timer")

        size_rows: list[SweepRow] = []
        configs = hooks.configs_for(size)
        raw = list(hooks.autotuner.configs) if hooks.autotuner is not None else [None] * len(configs)
        for config, triton_cfg in zip(configs, raw):
            text = config_label(config)
            if progress is not None:
                progress(f"{hooks.name} size {label}: {text}")
            if triton_cfg is not None:
                forced: Any = _ForcedConfig(hooks.autotuner, triton_cfg)
                call = hooks.kernel_fn
            else:
                forced = contextlib.nullcontext()
                call = functools.partial(hooks.kernel_fn, **config)
            row = SweepRow(size=label, config=text, status="rejected", bytes=n_bytes, flops=n_flops,
                           measured_on=device_label if on_cuda else CPU_LABEL, params=config)
            with forced:
                _sweep_one(row, call, hooks, get_inputs, args, device, on_cuda, warmup_ms, rep_ms, rtol, atol)
            if row.status == "ok":
                _throughput(row, spec, on_cuda, hooks.tensor_cores, _dtype_short(args))
            size_rows.append(row)
        if on_cuda:  # interpreter times rank the interpreter, not the configs on a GPU: no best there
            mark_best(size_rows, summary)
        summary.rejected = sum(r.status == "rejected" for r in size_rows)
        summary.failed_verification = sum(r.reason.startswith(FAILED_VERIFICATION) for r in size_rows)
        rows += size_rows
        summaries.append(summary)

    note = "" if on_cuda else (f"{CPU_LABEL}: every time here comes from Triton's CPU interpreter and says nothing "
                               f"about GPU speed; the sweep verified each config; run it on a GPU to choose one")
    return SweepResult(
        name=hooks.name, path=str(hooks.path or hooks.name), source=hooks.source, device=device_label,
        timer=TIMER_CUDA if on_cuda else TIMER_CPU, interpreted=not on_cuda, spec=spec.name, rows=rows,
        sizes=summaries, note=note, warmup_ms=warmup_ms, rep_ms=rep_ms, versions=versions(),
    )


def mark_best(size_rows: list[SweepRow], summary: SizeSummary) -> None:
    """Mark the fastest verified row of one size (``best``) and write it into ``summary``; nothing when no row
    verified (every row's ``best`` then stays ``None``: unranked). Only GPU times are ranked: :func:`run_sweep`
    does not call this under the interpreter."""
    ok = [r for r in size_rows if r.status == "ok" and r.time_ms is not None]
    if ok:
        best = min(ok, key=lambda r: r.time_ms)
        for r in size_rows:
            r.best = r is best
        summary.best_config, summary.best_time_ms = best.config, best.time_ms


def _call_formula(fn: Callable[..., int] | None, args: list[Any], what: str, name: str) -> int | None:
    if fn is None:
        return None
    try:
        return int(fn(*args))
    except Exception as exc:
        raise ContractError(f"{name}: {what}(*args) raised {_first_line(exc)}") from exc


def _timed_first_call(fn: Callable[[], Any], device: torch.device) -> float:
    sync_device(device)
    start = time.perf_counter()
    fn()
    sync_device(device)
    return (time.perf_counter() - start) * 1e3


def _time_autotune(hooks: SweepHooks, args: list[Any], device: torch.device, summary: SizeSummary) -> None:
    """Time the autotuner's first call at this size with all its configs (cache cleared), and record its pick."""
    tuner = hooks.autotuner
    saved = dict(getattr(tuner, "cache", {}))
    if hasattr(tuner, "cache"):
        tuner.cache = {}
    try:
        with torch.no_grad():
            summary.autotune_ms = _timed_first_call(lambda: hooks.kernel_fn(*args), device)
        best = getattr(tuner, "best_config", None)
        summary.autotune_choice = config_label(_triton_config_dict(best)) if best is not None else ""
    except Exception as exc:  # noqa: BLE001 - reported, the per-config sweep goes on
        summary.autotune_error = _first_line(exc)
    finally:
        if hasattr(tuner, "cache"):
            tuner.cache = saved


def _sweep_one(row: SweepRow, call: Callable[..., Any], hooks: SweepHooks, get_inputs: Callable[[], list[Any]],
               args: list[Any], device: torch.device, on_cuda: bool, warmup_ms: float, rep_ms: float,
               rtol: float | None, atol: float | None) -> None:
    """Fill ``row``: first call, verification, steady-state timing; a failure sets ``reason`` and stops."""
    try:
        with torch.no_grad():
            row.first_call_ms = _timed_first_call(lambda: call(*args), device)
    except Exception as exc:  # noqa: BLE001 - a config that does not compile or launch is rejected, not fatal
        row.reason = f"failed to compile or launch: {_first_line(exc)}"
        return
    contract = KernelContract(name=f"{hooks.name}[{row.config}]", path=hooks.path, kernel_fn=call,
                              reference_fn=hooks.reference_fn, get_inputs=get_inputs)
    # the size is the shape here: no edge shapes, no hard values (each config of each size is verified)
    verified = verify_kernel(contract, rtol=rtol, atol=atol, seeds=1, shapes="given", hard_values=False)
    if not verified.correct:
        row.reason = FAILED_VERIFICATION + ": " + (verified.failure or verified.details[0])
        return
    try:
        with torch.no_grad():
            timing = time_cuda(lambda: call(*args), warmup_ms, rep_ms) if on_cuda else \
                time_cpu(lambda: call(*args), warmup_ms, rep_ms)
    except Exception as exc:  # noqa: BLE001 - rejected with the reason; the sweep goes on
        row.reason = f"failed while timing: {_first_line(exc)}"
        return
    row.status = "ok"
    row.time_ms = timing.median_ms
    row.warmup_iters, row.benchmark_iters = timing.warmup_iters, timing.benchmark_iters


def _throughput(row: SweepRow, spec: Any, on_cuda: bool, tensor_cores: bool, dtype: str) -> None:
    """GB/s, TFLOP/s and % of roofline of a timed row (GPU only; see the module doc)."""
    if not on_cuda or not row.time_ms or row.time_ms <= 0:
        return
    seconds = row.time_ms * 1e-3
    roof_s = 0.0
    if row.bytes is not None:
        row.gbps = row.bytes / seconds / 1e9
        roof_s = max(roof_s, row.bytes / (spec.memory_bandwidth_gbps * 1e9))
    if row.flops is not None:
        row.tflops = row.flops / seconds / 1e12
        roof_s = max(roof_s, row.flops / (spec.peak_tflops(dtype, tensor_cores) * 1e12))
    if roof_s > 0:
        row.pct_roofline = 100.0 * roof_s / seconds


# --- writing ------------------------------------------------------------------------------------------------


def _written_by_us(out_dir: Path) -> bool:
    try:
        doc = json.loads((out_dir / "sweep.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "tool_version" in doc and "sweep" in doc


def check_sweep_dir(out_dir: Path) -> None:
    """Refuse ``out_dir`` when it holds a sweep.csv / sweep.json that fusion-advisor did not write.

    Raises:
        UserError: see :func:`fusion_advisor.report.write.check_out_dir`.
    """
    from fusion_advisor.report.write import check_out_dir

    check_out_dir(Path(out_dir), names=FILE_NAMES, written_by_us=_written_by_us)


def write_sweep(result: SweepResult, out_dir: Path) -> dict[str, Path]:
    """Write ``sweep.csv`` and ``sweep.json`` into ``out_dir`` (created if missing), each atomically.

    Returns ``{"csv": path, "json": path}``.

    Raises:
        UserError: ``out_dir`` holds such files not written by fusion-advisor, or is not writable.
    """
    from fusion_advisor.files import atomic_write_bytes

    out_dir = Path(out_dir)
    check_sweep_dir(out_dir)
    doc = result.to_dict()
    doc["generated_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    csv_bytes = result.frame().to_csv(index=False, lineterminator="\n").encode("utf-8")
    json_bytes = (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode("utf-8")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out_dir / FILE_NAMES[0], "json": out_dir / FILE_NAMES[1]}
        atomic_write_bytes(paths["csv"], csv_bytes)
        atomic_write_bytes(paths["json"], json_bytes)
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot write: {exc.strerror or exc}") from exc
    return paths


def sweep_table(result: SweepResult) -> Any:
    """The sweep as a :class:`rich.table.Table` (best config per size marked with ``*``)."""
    from rich.table import Table

    title = f"Sweep of {result.name} ({result.source}) on {result.device}"
    if result.interpreted:
        title += f" — {CPU_LABEL}"
    t = Table(title=title)
    for col, just in (("size", "left"), ("config", "left"), ("first call ms", "right"), ("time ms", "right"),
                      ("GB/s", "right"), ("TFLOP/s", "right"), ("% roofline", "right"), ("best", "center"),
                      ("status / reason", "left")):
        t.add_column(col, justify=just)

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None or not math.isfinite(v) else format(v, fmt)

    for r in result.rows:
        t.add_row(r.size, r.config, num(r.first_call_ms, ",.1f"), num(r.time_ms, ",.4f"), num(r.gbps, ",.0f"),
                  num(r.tflops, ",.1f"), num(r.pct_roofline, ".0f"), "*" if r.best else "",
                  r.status if not r.reason else f"rejected: {r.reason}")
    return t
