"""``fusion-advisor doctor``: check the stack before anything else, and say what to do about each problem.

Checks, each independent (one that fails or raises never stops the others; a check that raises is reported as
failed with its exception, the traceback kept for ``--debug``):

- **python**: the version (fusion-advisor needs 3.10 or newer).
- **torch**: the version and the CUDA (or ROCm) version it was built with.
- **triton**: the installed version, and whether torch pins it. The pin is read from torch's own package
  metadata (``importlib.metadata.requires("torch")``: CUDA builds list ``triton==X`` or ``pytorch-triton==X``
  with a platform marker), never from a table kept here; a CPU build pins none, and the pairing is then
  reported as unknown, not as wrong.
- **cuda**: whether a CUDA device is usable, the driver version where torch exposes it.
- **gpu**: name, compute capability, memory, SM count, L2 size, and the shipped device spec that matches its
  name; "no GPU found" on a CPU machine (a stated situation, not a failure).
- **torch.compile**: a tiny function compiled, run and compared with eager (fp32 tolerance); on a CPU Inductor
  needs a C++ compiler.
- **triton copy kernel**: :mod:`fusion_advisor.devices.copy_kernel` launched and checked bit-exact against the input.
  On a GPU it is timed (``triton.testing.do_bench`` median via :func:`fusion_advisor.kernel_tools.bench.time_cuda`) on an
  fp32 input four times the L2 size (the device spec's ``l2_bytes``, else the GPU's), so it streams from HBM;
  GB/s counts bytes read plus written and is compared with the spec's ``memory_bandwidth_gbps``. Without a
  GPU it runs under Triton's interpreter on a small input and says that no bandwidth was measured.

The exit code is 1 when a check that matters (``matters=True``) fails, else 0.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import math
import os
import platform
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, ContextManager, Iterator

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"

#: Oldest Python fusion-advisor supports (pyproject.toml ``requires-python``).
MIN_PYTHON = (3, 10)

#: Distribution names under which torch pins its Triton (PyPI wheels: ``triton``; PyTorch's index:
#: ``pytorch-triton``, ``pytorch-triton-rocm``, ``pytorch-triton-xpu``).
TRITON_DISTS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")

#: The bandwidth input is this many times the L2 size, so the copy streams from device memory, not from L2.
L2_MULTIPLE = 4

#: L2 size assumed when neither the device spec nor torch gives one (bytes): larger than any current GPU's.
FALLBACK_L2_BYTES = 128 * 2**20

#: Elements of the interpreter check: two full blocks and a partial one (the mask edge).
INTERPRETER_ELEMENTS = 2 * 1024 + 7

#: Below this fraction of the spec's bandwidth the copy result gets a warning (busy GPU, low clocks, wrong spec).
LOW_BANDWIDTH_FRACTION = 0.5


@dataclass
class Check:
    """One check's outcome.

    Attributes:
        name: short name (``"triton"``, ``"torch.compile"``).
        status: ``"ok"``, ``"warn"`` (works, but look), ``"fail"``, or ``"info"`` (a stated situation, such as
            no GPU).
        summary: one line: what was found, with versions and numbers.
        advice: what to do about a warning or failure; empty when there is nothing to do.
        matters: a failure of this check makes the exit code non-zero.
        details: machine-readable findings (versions, GB/s, ...), JSON-ready.
        traceback: the traceback when the check itself raised (shown with ``--debug``), else empty.
    """

    name: str
    status: str
    summary: str
    advice: str = ""
    matters: bool = True
    details: dict[str, Any] = field(default_factory=dict)
    traceback: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "matters": self.matters, "summary": self.summary,
                "advice": self.advice or None, "details": self.details}


@dataclass
class DoctorReport:
    """All checks, in order; :attr:`exit_code` is 1 when a check that matters failed.

    Attributes:
        checks: the checks run.
        created_at: when the checks ran (UTC, ISO 8601), so a bandwidth number keeps its date.
    """

    checks: list[Check]
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL and c.matters]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        """``{"ok", "exit_code", "created_at", "checks": [{name, status, matters, summary, advice, details}]}``."""
        return {"ok": not self.failed, "exit_code": self.exit_code, "created_at": self.created_at,
                "checks": [c.to_dict() for c in self.checks]}


# --- versions -------------------------------------------------------------------------------------------------


def check_python() -> Check:
    """Python version against :data:`MIN_PYTHON`."""
    version = platform.python_version()
    details = {"version": version, "executable": sys.executable}
    if sys.version_info[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return Check("python", FAIL, f"Python {version}: fusion-advisor needs {need} or newer",
                     f"create a virtual environment with Python {need} or newer", details=details)
    return Check("python", OK, f"Python {version}", details=details)


def check_torch() -> Check:
    """torch's version and the CUDA / ROCm version it was built with."""
    import torch

    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    built = f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU build (no CUDA)"
    return Check("torch", OK, f"torch {torch.__version__}, {built}",
                 details={"version": torch.__version__, "cuda": cuda, "hip": hip})


def torch_requirements() -> list[str]:
    """torch's declared requirements (``importlib.metadata.requires("torch")``); empty when unreadable."""
    try:
        return list(importlib.metadata.requires("torch") or [])
    except importlib.metadata.PackageNotFoundError:
        return []


def installed_triton() -> tuple[str | None, str | None, str]:
    """``(distribution, version, import_error)`` of the installed Triton.

    The version is the distribution's (``triton`` or ``pytorch-triton...``), else ``triton.__version__``;
    ``import_error`` is the one-line error when ``import triton`` fails, else empty.
    """
    dist = version = None
    for name in TRITON_DISTS:
        try:
            version, dist = importlib.metadata.version(name), name
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import triton

        version = version or getattr(triton, "__version__", None)
        error = ""
    except Exception as e:  # noqa: BLE001 - a broken install is reported, not raised
        error = f"{type(e).__name__}: {_first_line(e)}"
    return dist, version, error


def triton_pins(requirements: list[str]) -> list[tuple[str, str]]:
    """``(distribution, specifier)`` of every Triton requirement in ``requirements`` that applies to this
    platform (markers evaluated; extras ignored), e.g. ``[("triton", "==3.6.0")]``."""
    pins = []
    for text in requirements:
        try:
            from packaging.requirements import InvalidRequirement, Requirement
        except ImportError:  # no packaging: a plain parse of "name==version; marker" (markers not evaluated)
            m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*([<>=!~][^;]*)?(;.*)?$", text)
            if m and m.group(1).lower() in TRITON_DISTS and "extra" not in (m.group(3) or ""):
                pins.append((m.group(1).lower(), (m.group(2) or "").strip()))
            continue
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() not in TRITON_DISTS:
            continue
        try:
            applies = req.marker is None or req.marker.evaluate({"extra": ""})
        except Exception:  # noqa: BLE001 - a marker this packaging cannot evaluate: assume it applies
            applies = True
        if applies:
            pins.append((req.name.lower(), str(req.specifier)))
    return pins


def _satisfies(version: str, specifier: str) -> bool | None:
    """Whether ``version`` meets ``specifier`` (PEP 440; a local ``+git...`` suffix matches ``==X``);
    ``None`` when it cannot be decided."""
    if not specifier:
        return True
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except Exception:  # noqa: BLE001 - no packaging, or an odd version string: compare == pins as text
        m = re.fullmatch(r"==\s*([\w.]+)", specifier.strip())
        return version.split("+")[0] == m.group(1) if m else None


def check_triton(requirements: list[str] | None = None,
                 installed: tuple[str | None, str | None, str] | None = None) -> Check:
    """The installed Triton against the version torch pins in its metadata.

    Args:
        requirements: torch's requirements (default: :func:`torch_requirements`).
        installed: ``(distribution, version, import_error)`` (default: :func:`installed_triton`).
    """
    import torch

    requirements = torch_requirements() if requirements is None else requirements
    dist, version, error = installed_triton() if installed is None else installed
    pins = triton_pins(requirements)
    interpret = os.environ.get("TRITON_INTERPRET", "")
    details = {"version": version, "distribution": dist, "torch_pins": [f"{d}{s}" for d, s in pins],
               "TRITON_INTERPRET": interpret or None}
    pin_text = ", ".join(f"{d}{s}" for d, s in pins)
    if version is None:
        want = f"pip install '{pins[0][0]}{pins[0][1]}'" if pins else "pip install triton"
        return Check("triton", FAIL, "Triton is not installed: library kernels cannot run",
                     f"install the Triton torch was built with: {want}", details=details)
    if error:
        return Check("triton", FAIL, f"triton {version} is installed but does not import: {error}",
                     "reinstall it (pip install --force-reinstall "
                     f"'{pins[0][0] + pins[0][1] if pins else 'triton'}'); rerun with --debug for the traceback",
                     details=details)
    if not pins:
        return Check("triton", WARN, f"triton {version}; unknown pairing: torch {torch.__version__} pins no Triton "
                     "in its metadata (CPU builds and source builds pin none)",
                     "nothing to do on a CPU machine; on a GPU install the Triton your torch build was released "
                     "with (the CUDA wheel of the same torch version pins it)", matters=False, details=details)
    verdicts = [_satisfies(version, spec) for _, spec in pins]
    if any(v is True for v in verdicts):
        details["pairing"] = "known-good"
        return Check("triton", OK, f"triton {version}; known-good pairing: torch {torch.__version__} pins "
                     f"{pin_text}", details=details)
    if all(v is None for v in verdicts):
        details["pairing"] = "unknown"
        return Check("triton", WARN, f"triton {version}; unknown pairing: cannot compare with torch's pin "
                     f"{pin_text}", "install the pinned version to be sure: pip install "
                     f"'{pins[0][0]}{pins[0][1]}'", matters=False, details=details)
    details["pairing"] = "mismatch"
    source = " from PyTorch's package index" if pins[0][0].startswith("pytorch-triton") else ""
    return Check("triton", FAIL, f"triton {version} does not match torch {torch.__version__}'s pin {pin_text}: "
                 "kernels may fail to compile or torch.compile may break",
                 f"install the pinned Triton{source}: pip install '{pins[0][0]}{pins[0][1]}'", details=details)


def _cuda_driver_version() -> str | None:
    getter = getattr(getattr(__import__("torch"), "_C"), "_cuda_getDriverVersion", None)
    if getter is None:
        return None
    try:
        v = int(getter())
    except Exception:  # noqa: BLE001 - a torch without a usable driver query
        return None
    return f"{v // 1000}.{(v % 1000) // 10}" if v > 0 else None


def check_cuda() -> Check:
    """Whether torch sees a usable CUDA (or ROCm) device; a CPU build is a stated situation, not a failure."""
    import torch

    built = torch.version.cuda or getattr(torch.version, "hip", None)
    details = {"built_with": built, "available": torch.cuda.is_available(), "driver": None, "device_count": 0}
    if not built:
        return Check("cuda", INFO, "CPU build of torch: no CUDA",
                     "for GPU measurements install a CUDA build of torch (https://pytorch.org/get-started/locally/)",
                     matters=False, details=details)
    if not torch.cuda.is_available():
        return Check("cuda", WARN, f"torch built with CUDA {built}, but no usable GPU",
                     "check the NVIDIA driver (nvidia-smi must list the GPU; a driver older than CUDA "
                     f"{built} hides it) and CUDA_VISIBLE_DEVICES", matters=False, details=details)
    details["driver"] = _cuda_driver_version()
    details["device_count"] = torch.cuda.device_count()
    driver = f", driver {details['driver']}" if details["driver"] else ""
    return Check("cuda", OK, f"CUDA {built}{driver}, {details['device_count']} device(s)", details=details)


# --- GPU ------------------------------------------------------------------------------------------------------


def spec_for_gpu(gpu_name: str) -> Any | None:
    """The shipped GPU device spec whose short name (``h200``, ``l4``) is a word of ``gpu_name``, else None.

    ``"NVIDIA H200"`` -> the ``h200`` spec; ``"NVIDIA L40S"`` matches no spec (``l4`` is not a word of it).
    """
    from fusion_advisor.devices import available_specs, load_spec

    for name in available_specs():
        spec = load_spec(name)
        if spec.kind == "gpu" and re.search(rf"\b{re.escape(spec.name)}\b", gpu_name, re.IGNORECASE):
            return spec
    return None


def check_gpu() -> Check:
    """The current GPU: name, compute capability, memory, SM count, L2 size and the matching device spec."""
    import torch

    if not torch.cuda.is_available():
        return Check("gpu", INFO, "no GPU found: analyze runs statically (meta device), Triton kernels run in "
                     "the CPU interpreter (verified, not timed), apply times eager and Inductor's CPU code",
                     matters=False, details={"gpu": None})
    index = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(index)
    l2 = int(getattr(p, "L2_cache_size", 0) or 0)
    spec = spec_for_gpu(p.name)
    details = {"index": index, "name": p.name, "compute_capability": f"{p.major}.{p.minor}",
               "memory_gib": round(p.total_memory / 2**30, 1), "sm_count": p.multi_processor_count,
               "l2_bytes": l2 or None, "device_spec": spec.name if spec else None}
    summary = (f"{p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
               f"{p.multi_processor_count} SMs" + (f", L2 {l2 / 2**20:.0f} MiB" if l2 else ""))
    if spec is None:
        return Check("gpu", WARN, summary + "; no shipped device spec matches it",
                     "give analyze a spec YAML for this GPU (--gpu SPEC.yaml, fields as in "
                     "fusion_advisor/devices/h200.yaml)", matters=False, details=details)
    return Check("gpu", OK, summary + f"; device spec {spec.name} ({spec.display_name})", details=details)


# --- torch.compile ----------------------------------------------------------------------------------------------


def _tiny(x: Any) -> Any:
    import torch

    return torch.sin(x) * 2.0 + 1.0


def _compile_advice(error: str, on_cuda: bool) -> str:
    low = error.lower()
    if not on_cuda and any(s in low for s in ("cxx", "c++", "compiler", "gcc", "clang", "cpp")):
        return ("Inductor compiles C++ on a CPU: install a C++ compiler (apt-get install g++, or build-essential) "
                "or set CXX to one")
    if "python" in low and "not supported" in low:
        return "this torch's torch.compile does not support this Python: use a Python it supports, or a newer torch"
    if on_cuda and "triton" in low:
        return "Inductor generates Triton kernels on a GPU: install the Triton torch pins (see the triton check)"
    return "rerun with --debug for the traceback; TORCH_LOGS=+dynamo,+inductor shows where it fails"


def check_compile() -> Check:
    """Compile ``sin(x) * 2 + 1`` with torch.compile (Inductor), run it, compare with eager (fp32 tolerance)."""
    import torch

    from fusion_advisor.tolerances import tolerance_for

    on_cuda = torch.cuda.is_available()
    device = "cuda" if on_cuda else "cpu"
    x = torch.randn(4099, device=device)  # prime-ish length: a partial last block
    details: dict[str, Any] = {"device": device, "first_call_s": None, "max_abs_diff": None}
    try:
        fn = torch.compile(_tiny, dynamic=False)
        start = time.perf_counter()
        got = fn(x)
        if on_cuda:
            torch.cuda.synchronize()
        details["first_call_s"] = round(time.perf_counter() - start, 3)
    except Exception as e:  # noqa: BLE001 - reported with what to do, never raised
        error = f"{type(e).__name__}: {_first_line(e)}"
        details["error"] = error
        return Check("torch.compile", FAIL, f"torch.compile failed on {device}: {error}",
                     _compile_advice(error, on_cuda), details=details)
    want = _tiny(x)
    atol, rtol = tolerance_for(torch.float32)
    diff = (got.float() - want).abs().max().item()
    details["max_abs_diff"] = _json_safe(diff)
    if not torch.allclose(got, want, atol=atol, rtol=rtol):
        return Check("torch.compile", FAIL, f"torch.compile ran on {device} but disagrees with eager (max abs "
                     f"diff {diff:.3g}, tolerance atol {atol:g} rtol {rtol:g})",
                     "report it with your torch and Triton versions; meanwhile route chains to eager",
                     details=details)
    return Check("torch.compile", OK, f"works on {device}: first call (compile) {details['first_call_s']:.1f} s, "
                 f"matches eager (max abs diff {diff:.2g})", details=details)


# --- Triton copy kernel -----------------------------------------------------------------------------------------


def _l2_bytes() -> tuple[int, str]:
    """L2 size of the current GPU, bytes, and where it came from (device spec, torch, or the fallback)."""
    import torch

    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    spec = spec_for_gpu(p.name)
    if spec is not None and spec.l2_bytes:
        return spec.l2_bytes, f"device spec {spec.name}"
    l2 = int(getattr(p, "L2_cache_size", 0) or 0)
    if l2:
        return l2, "torch device properties"
    return FALLBACK_L2_BYTES, "assumed (unknown L2 size)"


def check_copy_kernel(time_fn: Callable[..., Any] | None = None) -> Check:
    """Launch the Triton copy kernel, check it bit-exact, and on a GPU measure its GB/s against the spec.

    Args:
        time_fn: the GPU timer (default :func:`fusion_advisor.kernel_tools.bench.time_cuda`), a parameter for tests.
    """
    import torch

    from fusion_advisor.kernel_tools.verify import use_triton_interpreter_if_no_gpu

    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    if not torch.cuda.is_available():
        use_triton_interpreter_if_no_gpu()
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            return Check("triton copy kernel", FAIL, "no GPU and TRITON_INTERPRET=0: Triton kernels cannot run here",
                         "unset TRITON_INTERPRET (doctor then sets it to 1) or set TRITON_INTERPRET=1 to run "
                         "Triton kernels in its CPU interpreter")
    try:
        from fusion_advisor.devices import copy_kernel
    except Exception as e:  # noqa: BLE001 - triton missing or broken: said here and in the triton check
        return Check("triton copy kernel", FAIL, f"cannot import Triton: {type(e).__name__}: {_first_line(e)}",
                     "install the Triton torch pins (see the triton check)")
    if copy_kernel._copy_kernel.__class__.__name__ == "InterpretedFunction" and on_gpu:
        on_gpu = False  # decorated under the interpreter earlier in this process
    device = "cuda" if on_gpu else "cpu"
    # verification: a small input with a partial last block (the mask edge) first, bit-exact
    small = torch.randn(INTERPRETER_ELEMENTS, device=device)
    try:
        out = copy_kernel.copy(small)
    except Exception as e:  # noqa: BLE001 - a launch or compile failure is the finding
        error = f"{type(e).__name__}: {_first_line(e)}"
        return Check("triton copy kernel", FAIL, f"launch failed on {device}: {error}",
                     "check that triton matches torch (triton check) and that the CUDA driver supports this GPU; "
                     "rerun with --debug for the traceback", details={"device": device, "error": error})
    if not torch.equal(out, small):
        return Check("triton copy kernel", FAIL, f"the copy differs from its input on {device}: Triton produces "
                     "wrong results here", "report it with your GPU, driver, torch and Triton versions",
                     details={"device": device, "verified": False})
    if not on_gpu:
        why = ("TRITON_INTERPRET is set, so no bandwidth was measured" if torch.cuda.is_available()
               else "no GPU found, so no bandwidth was measured")
        return Check("triton copy kernel", OK, f"verified bit-exact under the Triton interpreter "
                     f"({INTERPRETER_ELEMENTS} fp32 elements); {why}",
                     details={"device": "cpu (Triton interpreter)", "verified": True, "elements": INTERPRETER_ELEMENTS,
                              "bandwidth_gbps": None})
    return _copy_bandwidth(copy_kernel, time_fn)


def _copy_bandwidth(copy_kernel: Any, time_fn: Callable[..., Any] | None) -> Check:
    """Time the copy on a GPU input :data:`L2_MULTIPLE` times the L2 size; GB/s vs the spec's bandwidth."""
    import torch

    if time_fn is None:
        from fusion_advisor.kernel_tools.bench import time_cuda as time_fn
    l2, l2_source = _l2_bytes()
    n = L2_MULTIPLE * l2 // 4  # fp32 elements
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    copy_kernel.copy(x, out)
    torch.cuda.synchronize()
    details: dict[str, Any] = {"device": torch.cuda.get_device_name(), "verified": False, "elements": n,
                               "input_bytes": n * 4, "l2_bytes": l2, "l2_source": l2_source}
    if not torch.equal(out, x):
        return Check("triton copy kernel", FAIL, f"the copy of {n * 4 / 2**20:.0f} MiB differs from its input",
                     "report it with your GPU, driver, torch and Triton versions", details=details)
    details["verified"] = True
    timing = time_fn(lambda: copy_kernel.copy(x, out))
    gbps = copy_kernel.bytes_moved(x) / (timing.median_ms * 1e-3) / 1e9
    details.update(time_ms=timing.median_ms, bandwidth_gbps=round(gbps, 1), timer="do_bench median")
    spec = spec_for_gpu(torch.cuda.get_device_name())
    where = f"{n * 4 / 2**20:.0f} MiB fp32 ({L2_MULTIPLE}x L2), bytes read + written"
    if spec is None:
        return Check("triton copy kernel", OK, f"verified bit-exact; {gbps:,.0f} GB/s on {where}; no device spec "
                     "for this GPU to compare with", details=details)
    pct = 100 * gbps / spec.memory_bandwidth_gbps
    details.update(spec=spec.name, spec_bandwidth_gbps=spec.memory_bandwidth_gbps, percent_of_spec=round(pct, 1))
    summary = (f"verified bit-exact; {gbps:,.0f} GB/s on {where} = {pct:.0f}% of the {spec.name} spec's "
               f"{spec.memory_bandwidth_gbps:,.0f} GB/s")
    if pct < 100 * LOW_BANDWIDTH_FRACTION:
        return Check("triton copy kernel", WARN, summary, "below half the spec: another process on the GPU, "
                     "low clocks (nvidia-smi -q -d CLOCK), or a spec that does not fit this GPU", matters=False,
                     details=details)
    return Check("triton copy kernel", OK, summary, details=details)


# --- running ----------------------------------------------------------------------------------------------------

#: The checks in the order they run and are shown.
CHECKS: dict[str, Callable[[], Check]] = {
    "python": check_python,
    "torch": check_torch,
    "triton": check_triton,
    "cuda": check_cuda,
    "gpu": check_gpu,
    "torch.compile": check_compile,
    "triton copy kernel": check_copy_kernel,
}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


@contextlib.contextmanager
def _no_stage(name: str) -> Iterator[None]:
    yield


def run_check(name: str, fn: Callable[[], Check]) -> Check:
    """Run one check; an exception becomes a failed :class:`Check` carrying its traceback."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - one check's crash never stops the others
        return Check(name, FAIL, f"the check raised {type(e).__name__}: {_first_line(e)}",
                     "rerun with --debug for the traceback", traceback=traceback.format_exc())


def run_doctor(only: list[str] | None = None,
               stage: Callable[[str], ContextManager[None]] = _no_stage) -> DoctorReport:
    """Run the checks (all, or those named in ``only``, in :data:`CHECKS` order) and return the report.

    Without a GPU, ``TRITON_INTERPRET=1`` is set first (when unset), so Triton kernels run in its interpreter.

    Raises:
        ValueError: ``only`` names an unknown check (the message lists the known ones).
    """
    from fusion_advisor.kernel_tools.verify import use_triton_interpreter_if_no_gpu

    unknown = [n for n in only or [] if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    use_triton_interpreter_if_no_gpu()
    checks = []
    for name, fn in CHECKS.items():
        if only is None or name in only:
            with stage(f"checking {name}"):
                checks.append(run_check(name, fn))
    return DoctorReport(checks)


_STYLE = {OK: "green", WARN: "yellow", FAIL: "bold red", INFO: "cyan"}


def render(report: DoctorReport) -> Any:
    """A rich Table of the report: check, status, finding, what to do."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="fusion-advisor doctor", show_lines=False)
    t.add_column("check", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("finding", overflow="fold")
    t.add_column("what to do", overflow="fold")
    for c in report.checks:
        status = c.status + ("" if c.matters or c.status in (OK, INFO) else " (not blocking)")
        t.add_row(c.name, f"[{_STYLE.get(c.status, 'white')}]{status}[/]", escape(c.summary), escape(c.advice))
    return t


def verdict(report: DoctorReport) -> str:
    """One line under the table."""
    if report.failed:
        return f"{len(report.failed)} check(s) failed: " + ", ".join(c.name for c in report.failed)
    warned = [c.name for c in report.checks if c.status == WARN]
    return "all checks that matter passed" + (f" (look at: {', '.join(warned)})" if warned else "")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
