"""Check a kernel against its contract: ``kernel_fn(*args)`` must match ``reference_fn(*args)``.

A kernel file (or ``kernel_library`` module) defines the contract of ``kernel_library/__init__.py``:
``kernel_fn(*args)`` (the kernel), ``reference_fn(*args)`` (plain PyTorch, same signature and semantics) and
``get_inputs()`` (a list of fresh arguments). :func:`load_contract` imports one, :func:`verify_kernel` checks it.

For each seed ``s`` in ``range(seeds)``, :func:`verify_kernel`

1. calls ``torch.manual_seed(s)`` and then ``get_inputs()``, so every seed gets fresh inputs;
2. runs ``kernel_fn`` under :class:`PoisonAllocations`, which fills every ``torch.empty`` / ``empty_like`` /
   ``new_empty`` / ``empty_strided`` result with NaN (integers with :func:`poison_value`), also inside
   ``torch.library`` custom ops such as ``triton_op``\\ s: an element the kernel forgets to write is then NaN
   on every device and every run, never stale memory that happens to hold the right value;
3. checks that ``kernel_fn`` left its inputs as they were (compared with clones taken before the call);
4. runs ``reference_fn`` in float64 (floating inputs upcast) where it allows, else in the inputs' own dtypes,
   and says which in the details;
5. compares with :func:`compare_outputs`: per-dtype tolerances from :mod:`fusion_advisor.tolerances` unless
   given; NaN (or an infinity) in the kernel's output passes only where the reference has the same value at the
   same place; outputs may be tensors, scalars or (nested) tuples/lists of them; output dtypes must be those of
   ``reference_fn`` run in the inputs' own dtypes;
6. when an input requires grad: runs the backward of both with the same random ``grad_outputs`` and compares
   the input gradients the same way (reference gradients in float64 where possible), again with poisoned
   allocations and an input-mutation check.

It stops at the first seed that fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import math
import os
import pkgutil
import random
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fusion_advisor.errors import ContractError, KernelLoadError
from fusion_advisor.tolerances import EAGER_ERROR_FACTOR, tolerance_for, within_eager_error

#: Names a kernel file must define.
CONTRACT_NAMES = ("kernel_fn", "reference_fn", "get_inputs")

CONTRACT_HELP = (
    "a kernel file defines kernel_fn(*args) (the kernel), reference_fn(*args) (plain PyTorch, same signature) "
    "and get_inputs() (a list of fresh arguments)"
)

#: Seeds :func:`verify_kernel` runs by default: a few fresh inputs catch what one lucky draw hides, and the
#: CPU interpreter stays fast enough at three.
DEFAULT_SEEDS = 3

#: Tolerances for Python ``float`` outputs (no dtype to look up): those of fp32, the precision kernels compute in.
SCALAR_FLOAT_DTYPE = torch.float32

#: Namespaces of PyTorch's own ops; any other ``torch.ops`` namespace is a custom op whose Python implementation
#: :class:`PoisonAllocations` enters, so its allocations are poisoned too.
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "quantized", "profiler", "c10d", "_c10d_functional"})


# --- loading a contract -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelContract:
    """A kernel and what it must match.

    Attributes:
        name: short name (the file stem, or the module's last component).
        path: the file it came from, or ``None`` (contract built in code).
        kernel_fn: the kernel's public function, ``kernel_fn(*args)``.
        reference_fn: plain-PyTorch function with the same signature and semantics.
        get_inputs: returns a list of fresh arguments (tensors on the current device, scalars).
        module: the imported module, or ``None``.
        note: said in every result's details (e.g. that a registry name resolved to another module's contract).
    """

    name: str
    path: Path | None
    kernel_fn: Callable[..., Any]
    reference_fn: Callable[..., Any]
    get_inputs: Callable[[], Sequence[Any]]
    module: ModuleType | None = None
    note: str = ""

    @classmethod
    def from_module(cls, module: ModuleType, name: str | None = None, origin: str | None = None) -> KernelContract:
        """The contract defined by ``module``'s ``kernel_fn``, ``reference_fn`` and ``get_inputs``.

        Raises:
            ContractError: a name is missing or not callable; the message names ``origin`` (default: the
                module's file) and the missing names.
        """
        file = getattr(module, "__file__", None)
        origin = origin or file or module.__name__
        missing = [n for n in CONTRACT_NAMES if not hasattr(module, n)]
        if missing:
            raise ContractError(f"{origin}: missing kernel contract: {', '.join(missing)} not defined; {CONTRACT_HELP}")
        not_callable = [n for n in CONTRACT_NAMES if not callable(getattr(module, n))]
        if not_callable:
            what = ", ".join(f"{n} is a {type(getattr(module, n)).__name__}" for n in not_callable)
            raise ContractError(f"{origin}: {what}, not a function; {CONTRACT_HELP}")
        return cls(
            name=name or module.__name__.rsplit(".", 1)[-1],
            path=Path(file) if file else None,
            kernel_fn=module.kernel_fn,
            reference_fn=module.reference_fn,
            get_inputs=module.get_inputs,
            module=module,
        )


def use_triton_interpreter_if_no_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when no CUDA GPU is present and the variable is unset; return whether set now.

    Triton reads the variable when a kernel is decorated, so call this before a kernel file is imported.
    """
    if torch.cuda.is_available() or "TRITON_INTERPRET" in os.environ:
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def load_contract(spec: str | os.PathLike[str]) -> KernelContract:
    """Import a kernel file or module and return its contract.

    Args:
        spec: a path to a ``.py`` file (anything with a path separator, ending in ``.py``, or naming an
            existing file), a dotted module name (``kernel_library.rmsnorm``), or the bare name of a
            ``kernel_library`` module (``rmsnorm``).

    Raises:
        KernelLoadError: the file does not exist, the module is unknown, or importing raised (a syntax error
            names file and line; another exception names the innermost line of the file).
        ContractError: ``kernel_fn``, ``reference_fn`` or ``get_inputs`` is missing or not callable.
    """
    text = os.fspath(spec)
    if isinstance(spec, os.PathLike) or text.endswith(".py") or os.sep in text or "/" in text or Path(text).is_file():
        path = Path(text)
        module = _import_file(path)
        return KernelContract.from_module(module, name=path.stem, origin=str(path))
    module = _import_module_name(text)
    contract = KernelContract.from_module(module, name=module.__name__.rsplit(".", 1)[-1], origin=text)
    if "." not in text and contract.name != text:  # a registry name living in another kernel's module
        contract = dataclasses.replace(contract, note=(
            f"'{text}' is registered in {module.__name__}, which has one contract: this checks its kernel_fn "
            f"({contract.name}) against its reference_fn, not '{text}' on its own"))
    return contract


#: Kernel files imported by :func:`_import_file`: resolved path -> (mtime_ns, module). Importing a file twice
#: would register its ``torch.library`` ops twice, which raises.
_FILE_MODULES: dict[Path, tuple[int, ModuleType]] = {}

_FILE_MODULE_PREFIX = "_fusion_advisor_kernel_"


#: kernel_library modules that hold no kernel contract (the registry; the sweep hooks of bench --sweep).
_NOT_KERNEL_MODULES = frozenset({"registry", "sweeps"})


def _library_modules() -> list[str]:
    """Names of the kernel modules in ``kernel_library``."""
    import kernel_library

    names = (m.name for m in pkgutil.iter_modules(kernel_library.__path__))
    return sorted(n for n in names if not n.startswith("_") and n not in _NOT_KERNEL_MODULES)


def _user_frame(exc: BaseException, path: Path | None) -> str:
    """``file:line`` of the innermost traceback frame inside ``path`` (or the innermost frame at all)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if path is not None:
        resolved = path.resolve()
        inside = [f for f in frames if Path(f.filename).resolve() == resolved]
        if inside:
            return f"{inside[-1].filename}:{inside[-1].lineno}"
        return str(path)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "<unknown>"


def _syntax_error_message(exc: SyntaxError, path: Path | str) -> str:
    where = f"{exc.filename or path}:{exc.lineno}"
    line = (exc.text or "").strip()
    return f"{where}: syntax error: {exc.msg}" + (f": {line}" if line else "")


def _registered_module(name: str) -> str | None:
    """The module of the kernel registered as ``name`` (``masked_softmax`` lives in kernel_library.softmax)."""
    try:
        from kernel_library.registry import load_all

        entry = load_all().get(name)
    except Exception:  # a broken library: fall back to the plain module name
        return None
    return entry.module if entry is not None else None


def _import_module_name(name: str) -> ModuleType:
    target = name if "." in name else (_registered_module(name) or f"kernel_library.{name}")
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            try:
                known = ", ".join(_library_modules()) or "(none)"
            except Exception:  # kernel_library itself broken: still say what was looked for
                known = "(kernel_library not importable)"
            raise KernelLoadError(
                f"{name}: no such kernel file or module (looked for module {target}); "
                f"kernel_library modules: {known}; pass a path to a .py file for your own kernel"
            ) from exc
        where = _user_frame(exc, None)
        raise KernelLoadError(f"{where}: importing {target} raised ModuleNotFoundError: {exc}") from exc
    except SyntaxError as exc:
        raise KernelLoadError(_syntax_error_message(exc, target)) from exc
    except Exception as exc:
        where = _user_frame(exc, None)
        raise KernelLoadError(f"{where}: importing {target} raised {type(exc).__name__}: {exc}") from exc


def _import_file(path: Path) -> ModuleType:
    if not path.exists():
        raise KernelLoadError(f"{path}: no such file")
    if not path.is_file():
        raise KernelLoadError(f"{path}: not a file; expected a Python kernel file (.py)")
    resolved = path.resolve()

    # A file of the kernel_library package is imported as its module, never a second time under another name.
    import kernel_library

    lib_file = getattr(kernel_library, "__file__", None)  # None if a namespace package shadows it
    if lib_file and resolved.parent == Path(lib_file).resolve().parent and resolved.suffix == ".py":
        return _import_module_name(f"kernel_library.{resolved.stem}")
    mtime = resolved.stat().st_mtime_ns
    cached = _FILE_MODULES.get(resolved)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    if cached is None:  # imported some other way already (e.g. a test imported it): reuse that module
        for mod in list(sys.modules.values()):
            file = getattr(mod, "__file__", None)
            if file and not mod.__name__.startswith(_FILE_MODULE_PREFIX) and Path(file).resolve() == resolved:
                return mod

    stem = re.sub(r"\W", "_", resolved.stem)
    digest = hashlib.sha1(f"{resolved}:{mtime}".encode()).hexdigest()[:10]
    mod_name = f"{_FILE_MODULE_PREFIX}{stem}_{digest}"
    loader = importlib.machinery.SourceFileLoader(mod_name, str(resolved))
    spec = importlib.util.spec_from_file_location(mod_name, resolved, loader=loader)
    if spec is None:
        raise KernelLoadError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    parent = str(resolved.parent)
    sys.path.insert(0, parent)  # so the file can import its neighbours, as when run as a script
    sys.modules[mod_name] = module
    try:
        loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(mod_name, None)
        raise KernelLoadError(_syntax_error_message(exc, path)) from exc
    except Exception as exc:  # the file's module-level code raised
        sys.modules.pop(mod_name, None)
        where = _user_frame(exc, resolved)
        raise KernelLoadError(f"{where}: importing {path} raised {type(exc).__name__}: {exc}") from exc
    finally:
        try:
            sys.path.remove(parent)
        except ValueError:
            pass
    _FILE_MODULES[resolved] = (mtime, module)
    return module


# --- poisoning allocations ----------------------------------------------------------------------------------


def poison_value(dtype: torch.dtype) -> float | int | bool | complex:
    """What :class:`PoisonAllocations` fills a fresh allocation of ``dtype`` with.

    NaN for floating dtypes (``nan+nanj`` for complex), the most negative value for signed integers, the
    largest for unsigned ones (0 is too common a true value), ``True`` for bool.
    """
    if dtype.is_complex:
        return complex(math.nan, math.nan)
    if dtype.is_floating_point:
        return math.nan
    if dtype == torch.bool:
        return True
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def poison_(t: torch.Tensor) -> bool:
    """Fill ``t`` in place with :func:`poison_value` of its dtype; return False where that is impossible."""
    if t.numel() == 0 or t.device.type == "meta":
        return False
    try:
        with torch.no_grad():
            t.detach().fill_(poison_value(t.dtype))
    except (RuntimeError, TypeError):  # e.g. a float8 or bit dtype without fill_ on this device
        return False
    return True


def _factories() -> frozenset:
    names = [(torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"), (torch, "empty_permuted"),
             (torch.Tensor, "new_empty"), (torch.Tensor, "new_empty_strided")]
    return frozenset(getattr(owner, n) for owner, n in names if hasattr(owner, n))


_FACTORIES = _factories()


def _custom_op_name(func: Any) -> str | None:
    """``"ns::op"`` when ``func`` is a ``torch.ops`` op outside PyTorch's own namespaces, else ``None``."""
    if isinstance(func, torch._ops.OpOverload):
        name = func._schema.name
    elif isinstance(func, torch._ops.OpOverloadPacket):
        name = func._qualified_op_name
    else:
        return None
    return None if name.split("::", 1)[0] in _TORCH_NAMESPACES else name


def _opdefs() -> dict[str, Any]:
    """``torch.library.custom_op`` definitions by ``"ns::op"`` (private to torch: empty if it moves)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return {}
    return OPDEFS


def _custom_op_impl(name: str, args: tuple, kwargs: dict) -> Callable | None:
    """The Python implementation the dispatcher would run for custom op ``name`` on these arguments, if known."""
    opdef = _opdefs().get(name)
    if opdef is None:
        return None
    backends = getattr(opdef, "_backend_fns", {})
    device_type = next(
        (a.device.type for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)), None
    )
    return backends.get(device_type) or backends.get(None) or getattr(opdef, "_init_fn", None)


#: Bytes of poisoned guard memory before and after every allocation :class:`PoisonAllocations` makes (a multiple
#: of 16 bytes, so the allocation keeps the 16-byte alignment Triton specialises on).
REDZONE_BYTES = 256


def _storage_span(t: torch.Tensor) -> int:
    """Elements between the first and the last element ``t`` addresses, inclusive (its strided footprint)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def _is_poison(t: torch.Tensor) -> torch.Tensor:
    """Element-wise: does ``t`` still hold :func:`poison_value` (NaN for floating dtypes)?"""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return torch.isnan(t)
    return t == poison_value(t.dtype)


class PoisonAllocations(TorchFunctionMode):
    """Fill every ``torch.empty`` / ``empty_like`` / ``empty_strided`` / ``Tensor.new_empty`` result with poison,
    inside a poisoned **redzone**: each allocation is a view into a buffer with :data:`REDZONE_BYTES` of poison
    before and after it, so a kernel storing past the end (or before the start) of an output it allocated, e.g. a
    mask off by one, is caught by :meth:`redzone_violations`, even under Triton's interpreter.

    A torch-function mode sees the calls a Python function makes, but a ``torch.library`` custom op (such as a
    ``triton_op``) runs its implementation with the mode set aside. So a custom op is run under
    :class:`_EnterCustomOps`, which, once autograd has been handled, runs the op's Python implementation with
    this mode active again: the kernel's own ``torch.empty`` calls are poisoned too. A custom op whose
    implementation is not reachable this way (registered with ``torch.library.Library.impl``) runs as is and is
    listed in :attr:`opaque_custom_ops`.

    Attributes:
        poisoned: number of allocations filled.
        entered_custom_ops: custom ops whose implementation ran under the mode.
        opaque_custom_ops: custom ops whose allocations could not be poisoned.
    """

    def __init__(self, redzones: bool = True) -> None:
        super().__init__()
        self.poisoned = 0
        self.entered_custom_ops: set[str] = set()
        self.opaque_custom_ops: set[str] = set()
        self.redzones = redzones
        self._guarded: list[tuple[torch.Tensor, int, int, str]] = []  # (buffer, guard elems, span, description)

    def _with_redzone(self, out: torch.Tensor) -> torch.Tensor:
        """``out``'s shape, strides and dtype as a view into a buffer with poisoned guards around it."""
        if (not self.redzones or out.numel() == 0 or out.device.type == "meta" or out.requires_grad
                or any(st < 0 for st in out.stride())):
            return out
        guard = max(1, REDZONE_BYTES // out.element_size())
        span = _storage_span(out)
        try:
            buf = torch.empty(span + 2 * guard, dtype=out.dtype, device=out.device)
            if not poison_(buf):
                return out
            view = buf.as_strided(out.shape, out.stride(), guard)
        except (RuntimeError, TypeError):
            return out
        what = f"an allocation of shape {list(out.shape)} {str(out.dtype).replace('torch.', '')}"
        self._guarded.append((buf, guard, span, what))
        return view

    def redzone_violations(self) -> list[str]:
        """One line per allocation whose guard memory was written (elements stored out of its bounds)."""
        lines = []
        for buf, guard, span, what in self._guarded:
            with torch.no_grad():
                before = int((~_is_poison(buf[:guard])).sum())
                after = int((~_is_poison(buf[guard + span:])).sum())
            if before or after:
                where = []
                if after:
                    where.append(f"{after} element(s) after its end")
                if before:
                    where.append(f"{before} before its start")
                lines.append(f"out-of-bounds store: the kernel wrote {' and '.join(where)} of {what} it made "
                             f"(a store mask or offset off by some elements)")
        return lines

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _custom_op_name(func)
        if name is not None:
            if name in _opdefs():
                with _EnterCustomOps(self):
                    return func(*args, **kwargs)
            self.opaque_custom_ops.add(name)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in _FACTORIES and isinstance(out, torch.Tensor):
            out = self._with_redzone(out)
            if poison_(out):
                self.poisoned += 1
        return out


class _EnterCustomOps(TorchDispatchMode):
    """Below autograd, run a custom op's Python implementation with ``poison_mode`` active (see above)."""

    def __init__(self, poison_mode: PoisonAllocations):
        super().__init__()
        self.poison_mode = poison_mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _custom_op_name(func)
        impl = _custom_op_impl(name, args, kwargs) if name is not None else None
        if impl is None:
            return func(*args, **kwargs)
        self.poison_mode.entered_custom_ops.add(name)
        with self.poison_mode:
            return impl(*args, **kwargs)


def run_backward(outputs: Sequence[torch.Tensor], grad_outputs: Sequence[torch.Tensor],
                  inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
    """Input gradients of ``outputs`` (``allow_unused``), calling the autograd engine directly.

    ``torch.autograd.grad`` hands itself to the active torch-function mode, which then runs it with the mode
    set aside; the engine itself does not, so the backward's Python code (custom-op backwards) runs with
    :class:`PoisonAllocations` active when called under it.
    """
    engine = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if engine is not None:
        return engine(tuple(outputs), tuple(grad_outputs), False, False, tuple(inputs), True, accumulate_grad=False)
    return torch.autograd.Variable._execution_engine.run_backward(  # older torch
        tuple(outputs), tuple(grad_outputs), False, False, tuple(inputs), True, False
    )


# --- comparing ----------------------------------------------------------------------------------------------


def _leaves(obj: Any, label: str) -> list[tuple[str, Any]]:
    """(label, leaf) pairs of a nested output: tensors, numbers and ``None`` are leaves; lists, tuples and
    dicts are walked (a list and a tuple of the same leaves are the same structure)."""
    if isinstance(obj, (list, tuple)):
        return [pair for i, v in enumerate(obj) for pair in _leaves(v, f"{label}[{i}]")]
    if isinstance(obj, dict):
        return [pair for k, v in obj.items() for pair in _leaves(v, f"{label}[{k!r}]")]
    return [(label, obj)]


def _tree_map(fn: Callable[[Any], Any], obj: Any) -> Any:
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_tree_map(fn, v) for v in obj)
    if isinstance(obj, tuple):  # namedtuple
        return type(obj)(*(_tree_map(fn, v) for v in obj))
    if isinstance(obj, dict):
        return {k: _tree_map(fn, v) for k, v in obj.items()}
    return fn(obj)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {list(x.shape)} {str(x.dtype).replace('torch.', '')}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__


def _fmt(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def _as_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, bool):
        return torch.tensor(x)
    if isinstance(x, int):
        return torch.tensor(x, dtype=torch.int64)
    if isinstance(x, float):
        return torch.tensor(x, dtype=torch.float64)
    if isinstance(x, complex):
        return torch.tensor(x, dtype=torch.complex128)
    return None


def _compare_leaf(a: Any, e: Any, atol: float | None, rtol: float | None,
                  label: str) -> tuple[bool, float, float, list[str]]:
    if a is None or e is None:
        if a is None and e is None:
            return True, 0.0, 0.0, []
        return False, math.inf, math.inf, [f"{label}: kernel gives {_describe(a)}, reference gives {_describe(e)}"]
    ta, te = _as_tensor(a), _as_tensor(e)
    if ta is None or te is None:
        if bool(a == e):
            return True, 0.0, 0.0, [f"{label}: ok (equal)"]
        return False, math.inf, math.inf, [f"{label}: kernel gives {a!r}, reference gives {e!r}"]
    if ta.shape != te.shape:
        return False, math.inf, math.inf, [f"{label}: shape {list(ta.shape)}, reference shape {list(te.shape)}"]

    out_dtype = SCALAR_FLOAT_DTYPE if isinstance(a, float) else ta.dtype
    table_atol, table_rtol = tolerance_for(out_dtype)
    atol = table_atol if atol is None else atol
    rtol = table_rtol if rtol is None else rtol
    ta = ta.detach()
    te = te.detach().to(ta.device)
    n = ta.numel()
    if n == 0:
        return True, 0.0, 0.0, [f"{label}: ok (empty)"]
    if ta.is_complex() or te.is_complex():
        ta, te = torch.view_as_real(ta.to(torch.complex128)), torch.view_as_real(te.to(torch.complex128))

    if not (ta.is_floating_point() or te.is_floating_point()):
        return _compare_exact(ta, te, label)

    a64, e64 = ta.to(torch.float64).reshape(-1), te.to(torch.float64).reshape(-1)
    a_nan, e_nan = torch.isnan(a64), torch.isnan(e64)
    finite = torch.isfinite(a64) & torch.isfinite(e64)
    same_special = (a_nan & e_nan) | (a64 == e64)  # NaN at the same place, or the same infinity
    bad_special = ~finite & ~same_special
    diff = torch.where(finite, (a64 - e64).abs(), torch.zeros_like(a64))
    mag = e64.abs()
    tol = atol + rtol * mag
    bad_finite = finite & (diff > tol)
    rel = torch.where(finite & (e64 != 0), diff / mag, torch.zeros_like(a64))
    n_special, n_finite = int(bad_special.sum()), int(bad_finite.sum())
    max_abs = math.inf if n_special else float(diff.max())
    max_rel = math.inf if n_special else float(rel.max())
    tol_text = f"atol {atol:g}, rtol {rtol:g}"
    if n_special == 0 and n_finite == 0:
        return True, max_abs, max_rel, [
            f"{label}: ok ({_describe(a)}; max abs diff {max_abs:.3g}, max rel diff {max_rel:.3g}; {tol_text})"
        ]

    shape = ta.shape
    details = [f"{label}: MISMATCH in {n_special + n_finite} of {n} elements ({_describe(a)}; {tol_text})"]
    nan_in_kernel = a_nan & ~e_nan
    if bool(nan_in_kernel.any()):
        first = int(nan_in_kernel.nonzero()[0, 0])
        details.append(
            f"{label}: {int(nan_in_kernel.sum())} elements are NaN where the reference is not (first at index "
            f"{_index(first, shape)}, reference {_fmt(float(e64[first]))}): unwritten elements? verify fills "
            f"torch.empty allocations with NaN"
        )
    other = bad_special & ~nan_in_kernel
    if bool(other.any()):
        first = int(other.nonzero()[0, 0])
        details.append(
            f"{label}: {int(other.sum())} elements differ in NaN/inf (first at index {_index(first, shape)}: "
            f"kernel {_fmt(float(a64[first]))}, reference {_fmt(float(e64[first]))})"
        )
    if n_finite:
        excess = torch.where(bad_finite, diff / tol.clamp_min(1e-300), torch.full_like(diff, -1.0))
        worst = int(excess.argmax())
        details.append(
            f"{label}: {n_finite} elements outside tolerance; worst at index {_index(worst, shape)}: kernel "
            f"{_fmt(float(a64[worst]))}, reference {_fmt(float(e64[worst]))} (abs diff {float(diff[worst]):.3g}, "
            f"rel diff {float(rel[worst]):.3g})"
        )
    return False, max_abs, max_rel, details


def _compare_exact(ta: torch.Tensor, te: torch.Tensor, label: str) -> tuple[bool, float, float, list[str]]:
    """Integer / bool outputs: equal or not."""
    a, e = ta.reshape(-1), te.reshape(-1)
    ne = a != e
    n_bad = int(ne.sum())
    diff = (a.to(torch.float64) - e.to(torch.float64)).abs()
    max_abs = float(diff.max())
    rel = torch.where(e != 0, diff / e.to(torch.float64).abs(), torch.zeros_like(diff))
    max_rel = float(rel.max())
    if n_bad == 0:
        return True, max_abs, max_rel, [f"{label}: ok ({_describe(ta)}; exact match)"]
    first = int(ne.nonzero()[0, 0])
    details = [
        f"{label}: MISMATCH in {n_bad} of {a.numel()} elements ({_describe(ta)}; must match exactly); first at "
        f"index {_index(first, ta.shape)}: kernel {a[first].item()}, reference {e[first].item()}"
    ]
    if ta.dtype != torch.bool:
        sentinel = poison_value(ta.dtype)
        n_poison = int((ne & (a == sentinel)).sum())
        if n_poison:
            details.append(f"{label}: {n_poison} of them hold the poison value {sentinel}: unwritten elements?")
    return False, max_abs, max_rel, details


def compare_outputs(actual: Any, expected: Any, atol: float | None = None, rtol: float | None = None,
                    label: str = "output") -> tuple[bool, float, float, list[str]]:
    """Compare a kernel's output with the reference's, elementwise: ``|a - e| <= atol + rtol * |e|``.

    Args:
        actual: the kernel's output: a tensor, a Python number, ``None``, or (nested) tuples/lists/dicts of them.
        expected: the reference output, same structure (may be float64 where ``actual`` is lower precision).
        atol, rtol: tolerances; ``None`` takes each from :func:`fusion_advisor.tolerances.tolerance_for` of the
            actual output's dtype (fp32's for a Python float; integers and bools must match exactly).
        label: name of the output in the details (``output``, ``grad of x``).

    NaN in ``actual`` passes only where ``expected`` is NaN at the same index; an infinity only where
    ``expected`` holds the same infinity.

    Returns:
        ``(ok, max_abs_diff, max_rel_diff, details)``: the largest absolute difference over elements finite in
        both, and the largest relative one (over nonzero reference elements), both ``inf`` when NaN/inf differ;
        ``details`` has one line per leaf (``ok`` with its maxima, or ``MISMATCH`` followed by the count of bad
        elements, the worst index and both values).
    """
    la, le = _leaves(actual, label), _leaves(expected, label)
    if [lab for lab, _ in la] != [lab for lab, _ in le]:
        return False, math.inf, math.inf, [
            f"{label}: kernel returns {_describe(actual)}, reference returns {_describe(expected)}"
        ]
    ok, max_abs, max_rel, details = True, 0.0, 0.0, []
    for (lab, a), (_, e) in zip(la, le):
        leaf_ok, leaf_abs, leaf_rel, leaf_details = _compare_leaf(a, e, atol, rtol, lab)
        ok &= leaf_ok
        max_abs, max_rel = max(max_abs, leaf_abs), max(max_rel, leaf_rel)
        details.extend(leaf_details)
    return ok, max_abs, max_rel, details


# --- verifying ----------------------------------------------------------------------------------------------


@dataclass
class VerifyResult:
    """Outcome of :func:`verify_kernel`.

    Attributes:
        name: the kernel's name.
        correct: every seed passed every check.
        max_abs_diff, max_rel_diff: largest differences of the forward outputs over all seeds run (``inf`` where
            NaN/inf differ; ``null`` in JSON).
        details: human-readable lines: the reference precision, then per seed one line per output / gradient,
            with the worst index and values on a mismatch.
        seeds: the seeds run (fewer than asked when one failed).
        reference_precision: ``"float64"`` (inputs upcast), ``"input dtypes"`` (float64 failed or no floating
            inputs) or ``"mixed"`` (differed between seeds).
        backward_checked: gradients were compared (some input requires grad).
        grad_max_abs_diff, grad_max_rel_diff: largest differences of the input gradients, ``None`` if unchecked.
        atol, rtol: tolerances given by the caller; ``None`` means the per-dtype table.
        traceback: formatted traceback when ``kernel_fn`` raised (not part of :meth:`to_dict`).
    """

    name: str
    correct: bool
    max_abs_diff: float
    max_rel_diff: float
    details: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    reference_precision: str = "float64"
    backward_checked: bool = False
    grad_max_abs_diff: float | None = None
    grad_max_rel_diff: float | None = None
    atol: float | None = None
    rtol: float | None = None
    traceback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``correct``, ``max_abs_diff``, ``max_rel_diff``, ``details`` first; non-finite
        numbers become ``None``."""
        return {
            "correct": self.correct,
            "max_abs_diff": _json_float(self.max_abs_diff),
            "max_rel_diff": _json_float(self.max_rel_diff),
            "details": list(self.details),
            "kernel": self.name,
            "seeds": list(self.seeds),
            "reference_precision": self.reference_precision,
            "backward_checked": self.backward_checked,
            "grad_max_abs_diff": _json_float(self.grad_max_abs_diff),
            "grad_max_rel_diff": _json_float(self.grad_max_rel_diff),
            "atol": self.atol,
            "rtol": self.rtol,
        }


def _json_float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), ``random`` and, if imported, numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)


def fresh_inputs(contract: KernelContract, seed: int) -> list[Any]:
    """``contract.get_inputs()`` after :func:`seed_everything` (``seed``), checked to be a list.

    Raises:
        ContractError: ``get_inputs()`` raised or returned something other than a list or tuple.
    """
    seed_everything(seed)
    try:
        args = contract.get_inputs()
    except Exception as exc:
        raise ContractError(
            f"{_user_frame(exc, contract.path)}: get_inputs() of {contract.name} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(args, (list, tuple)):
        raise ContractError(
            f"{contract.name}: get_inputs() returned a {type(args).__name__}, expected a list of arguments"
        )
    return list(args)


def _arg_labels(fn: Callable, n: int) -> list[str]:
    """Names of the first ``n`` positional parameters of ``fn`` (``input i`` where unknown)."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [f"input {i} ({params[i]})" if i < len(params) else f"input {i}" for i in range(n)]


def _input_leaves(args: list[Any], labels: list[str]) -> list[tuple[str, Any]]:
    return [pair for arg, lab in zip(args, labels) for pair in _leaves(arg, lab)]


def _snapshot(x: Any) -> Any:
    """A detached copy of an input, taken before ``kernel_fn`` runs; it keeps the ``requires_grad`` flag."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def _modified_inputs(current: list[tuple[str, Any]], before: list[tuple[str, Any]], when: str) -> list[str]:
    """Lines naming each input tensor that differs from its snapshot."""
    lines = []
    for (lab, now), (_, was) in zip(current, before):
        if not isinstance(now, torch.Tensor):
            continue
        now = now.detach()
        if now.shape != was.shape or now.dtype != was.dtype:
            lines.append(f"{lab} was modified in place {when}: now {_describe(now)}, was {_describe(was)}")
            continue
        same = now == was
        if now.is_floating_point() or now.is_complex():
            same |= torch.isnan(now) & torch.isnan(was)
        changed = ~same.reshape(-1)
        if bool(changed.any()):
            first = int(changed.nonzero()[0, 0])
            lines.append(
                f"{lab} was modified in place {when}: {int(changed.sum())} of {now.numel()} elements changed "
                f"(first at index {_index(first, now.shape)}: {was.reshape(-1)[first].item()} -> "
                f"{now.reshape(-1)[first].item()}); kernels must not mutate their inputs"
            )
    return lines


def _upcast(x: Any) -> Any:
    """A fresh float64 leaf for a floating tensor (complex128 for complex), a fresh copy of other tensors."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return x.detach().to(torch.float64).requires_grad_(x.requires_grad)
        if x.is_complex():
            return x.detach().to(torch.complex128).requires_grad_(x.requires_grad)
        return x.detach().clone()
    return x


def _same_dtype_copy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


@dataclass
class _ReferenceRun:
    precision: str  # "float64" or "input dtypes"
    output: Any
    grads: dict[int, torch.Tensor | None]  # input leaf index -> gradient
    grad_pairs: list[int]  # output leaf indices whose reference output requires grad
    note: str | None = None


def _reference(contract: KernelContract, snapshot: list[Any], labels: list[str], grad_inputs: list[int],
               grad_outputs: dict[int, torch.Tensor]) -> _ReferenceRun:
    """Run ``reference_fn`` (and its backward when ``grad_inputs``) in float64 if it can, else in input dtypes."""

    def run(convert: Callable[[Any], Any], precision: str) -> _ReferenceRun:
        args = [_tree_map(convert, a) for a in snapshot]
        out = contract.reference_fn(*args)
        grads: dict[int, torch.Tensor | None] = {}
        pairs: list[int] = []
        if grad_inputs:
            out_leaves = [leaf for _, leaf in _leaves(out, "output")]
            pairs = [i for i, leaf in enumerate(out_leaves)
                     if i in grad_outputs and isinstance(leaf, torch.Tensor) and leaf.requires_grad]
            if pairs:
                leaves = [leaf for _, leaf in _input_leaves(args, labels)]
                res = torch.autograd.grad(
                    [out_leaves[i] for i in pairs],
                    [leaves[j] for j in grad_inputs],
                    [grad_outputs[i].to(out_leaves[i].dtype) for i in pairs],
                    allow_unused=True,
                )
                grads = dict(zip(grad_inputs, res))
        return _ReferenceRun(precision, out, grads, pairs)

    has_floating = any(isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())
                       for _, x in _input_leaves(snapshot, labels))
    note = None
    if has_floating:
        try:
            return run(_upcast, "float64")
        except Exception as exc:
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            note = (f"reference_fn failed in float64 ({type(exc).__name__}: {first_line}); "
                    f"compared against reference_fn in the inputs' own dtypes")
    try:
        result = run(_same_dtype_copy, "input dtypes")
    except Exception as exc:
        raise ContractError(
            f"{_user_frame(exc, contract.path)}: reference_fn of {contract.name} raised {type(exc).__name__}: {exc}"
        ) from exc
    result.note = note
    return result


def _dtype_mismatches(actual: Any, expected: Any) -> list[str]:
    """Lines for output leaves whose dtype differs from the reference's (run in the inputs' own dtypes)."""
    la, le = _leaves(actual, "output"), _leaves(expected, "output")
    if [lab for lab, _ in la] != [lab for lab, _ in le]:
        return []  # the structure mismatch is reported by compare_outputs
    return [
        f"{lab}: dtype {str(a.dtype).replace('torch.', '')}, reference_fn returns {str(e.dtype).replace('torch.', '')}"
        for (lab, a), (_, e) in zip(la, le)
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and a.dtype != e.dtype
    ]


@dataclass
class _SeedOutcome:
    ok: bool
    max_abs: float
    max_rel: float
    details: list[str]
    precision: str
    backward_checked: bool = False
    grad_max_abs: float | None = None
    grad_max_rel: float | None = None
    traceback: str | None = None


def _kernel_raised(seed: int, what: str, exc: Exception, contract: KernelContract) -> _SeedOutcome:
    return _SeedOutcome(
        False, math.inf, math.inf,
        [f"seed {seed}: {what} raised {type(exc).__name__}: {exc} (at {_user_frame(exc, contract.path)})"],
        "n/a", traceback="".join(traceback.format_exception(exc)),
    )


def _verify_seed(contract: KernelContract, seed: int, atol: float | None, rtol: float | None) -> _SeedOutcome:
    args = fresh_inputs(contract, seed)
    labels = _arg_labels(contract.reference_fn, len(args))
    arg_leaves = _input_leaves(args, labels)
    snapshot = [_tree_map(_snapshot, a) for a in args]
    snapshot_leaves = _input_leaves(snapshot, labels)
    grad_inputs = [j for j, (_, x) in enumerate(arg_leaves) if isinstance(x, torch.Tensor) and x.requires_grad]

    # Kernel forward, allocations poisoned.
    mode = PoisonAllocations()
    try:
        with mode:
            out = contract.kernel_fn(*args)
    except Exception as exc:
        return _kernel_raised(seed, "kernel_fn", exc, contract)
    details = [f"seed {seed}: kernel_fn ran with {mode.poisoned} allocation(s) poisoned"
               + (f"; custom ops {', '.join(sorted(mode.opaque_custom_ops))} could not be entered, so their "
                  f"allocations were not poisoned" if mode.opaque_custom_ops else "")]
    mutated = _modified_inputs(arg_leaves, snapshot_leaves, "by kernel_fn")
    mutated += [f"seed {seed}: kernel_fn: {line}" for line in mode.redzone_violations()]

    # One random grad_output per floating output of the kernel, the same for kernel and reference.
    out_pairs = _leaves(out, "output")
    out_labels, out_leaves = [lab for lab, _ in out_pairs], [leaf for _, leaf in out_pairs]
    grad_outputs: dict[int, torch.Tensor] = {}
    if grad_inputs:
        for i, leaf in enumerate(out_leaves):
            if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()):
                gen = torch.Generator(device=leaf.device).manual_seed(10_000 + 97 * seed + i)
                grad_outputs[i] = torch.randn(leaf.shape, dtype=leaf.dtype, device=leaf.device, generator=gen)

    ref = _reference(contract, snapshot, labels, grad_inputs, grad_outputs)
    if ref.note:
        details.append(f"seed {seed}: {ref.note}")
    if ref.precision == "float64":
        with torch.no_grad():
            same_dtype_out = contract.reference_fn(*[_tree_map(_same_dtype_copy, a) for a in snapshot])
    else:
        same_dtype_out = ref.output

    ok, max_abs, max_rel, cmp_details = compare_outputs(out, ref.output, atol=atol, rtol=rtol)
    details += cmp_details
    dtype_lines = _dtype_mismatches(out, same_dtype_out)
    details += dtype_lines
    details += mutated
    ok = ok and not dtype_lines and not mutated

    outcome = _SeedOutcome(ok, max_abs, max_rel, details, ref.precision)
    if not grad_inputs:
        return outcome
    if not ref.grad_pairs:
        details.append(f"seed {seed}: inputs require grad but reference_fn's outputs do not: backward not checked")
        return outcome

    # Kernel backward, allocations poisoned, on the outputs whose reference output requires grad.
    no_grad = [out_labels[i] for i in ref.grad_pairs
               if not (isinstance(out_leaves[i], torch.Tensor) and out_leaves[i].requires_grad)]
    outcome.backward_checked = True
    if no_grad:
        details.append(
            f"seed {seed}: {', '.join(no_grad)} of kernel_fn does not require grad although reference_fn's does "
            f"(no autograd formula registered for the kernel?)"
        )
        outcome.ok = False
        return outcome
    grad_leaves = [arg_leaves[j][1] for j in grad_inputs]
    bmode = PoisonAllocations()
    try:
        with bmode:
            kernel_grads = run_backward([out_leaves[i] for i in ref.grad_pairs],
                                         [grad_outputs[i] for i in ref.grad_pairs], grad_leaves)
    except Exception as exc:
        failed = _kernel_raised(seed, "the backward of kernel_fn", exc, contract)
        failed.details = details + failed.details
        failed.precision = outcome.precision  # the forward was compared before the backward raised
        return failed
    details.append(f"seed {seed}: backward ran with {bmode.poisoned} allocation(s) poisoned")
    mutated = _modified_inputs(arg_leaves, snapshot_leaves, "by the backward of kernel_fn")
    mutated += [f"seed {seed}: the backward of kernel_fn: {line}" for line in bmode.redzone_violations()]
    details += mutated
    outcome.ok = outcome.ok and not mutated

    gmax_abs, gmax_rel = 0.0, 0.0
    for j, kg in zip(grad_inputs, kernel_grads):
        lab = f"grad of {arg_leaves[j][0]}"
        rg = ref.grads.get(j)
        if rg is None and kg is None:
            continue
        if kg is None:
            details.append(f"{lab}: kernel_fn gives no gradient, reference_fn does")
            outcome.ok = False
            continue
        if rg is None:  # the reference does not depend on this input: its gradient is zero
            rg = torch.zeros_like(kg, dtype=torch.float64)
        g_ok, g_abs, g_rel, g_details = compare_outputs(kg, rg, atol=atol, rtol=rtol, label=lab)
        if not g_ok and atol is None and rtol is None and ref.precision == "float64" \
                and kg.dtype in (torch.float16, torch.bfloat16):
            g_ok, g_details = _within_eager_error(contract, snapshot, labels, grad_inputs, grad_outputs, ref,
                                                  j, kg, rg, g_abs, lab, g_details)
        details += g_details
        outcome.ok = outcome.ok and g_ok
        gmax_abs, gmax_rel = max(gmax_abs, g_abs), max(gmax_rel, g_rel)
    outcome.grad_max_abs, outcome.grad_max_rel = gmax_abs, gmax_rel
    return outcome


def _within_eager_error(contract: KernelContract, snapshot: list[Any], labels: list[str], grad_inputs: list[int],
                        grad_outputs: dict[int, torch.Tensor], ref: _ReferenceRun, j: int, kg: torch.Tensor,
                        rg: torch.Tensor, kernel_abs: float, lab: str, g_details: list[str]) -> tuple[bool, list[str]]:
    """Re-judge a fp16/bf16 gradient against eager PyTorch's own error (see :data:`EAGER_ERROR_FACTOR`)."""
    args = [_tree_map(_same_dtype_copy, a) for a in snapshot]
    out = contract.reference_fn(*args)
    out_leaves = [leaf for _, leaf in _leaves(out, "output")]
    leaves = [leaf for _, leaf in _input_leaves(args, labels)]
    try:
        eager = torch.autograd.grad([out_leaves[i] for i in ref.grad_pairs], [leaves[j]],
                                    [grad_outputs[i].to(out_leaves[i].dtype) for i in ref.grad_pairs],
                                    allow_unused=True)[0]
    except RuntimeError:
        return False, g_details
    if eager is None or torch.isnan(kg).any() and not torch.isnan(rg).any():
        return False, g_details
    eager_abs = float((eager.double() - rg).abs().max())
    if within_eager_error(kernel_abs, eager_abs):
        return True, [f"{lab}: ok within {EAGER_ERROR_FACTOR:g}x eager's own {str(kg.dtype).replace('torch.', '')} "
                      f"error (kernel max abs {_fmt(kernel_abs)}, eager {_fmt(eager_abs)} against float64)"]
    return False, g_details + [f"{lab}: also beyond {EAGER_ERROR_FACTOR:g}x eager's own error ({_fmt(eager_abs)})"]


def verify_kernel(contract: KernelContract, rtol: float | None = None, atol: float | None = None,
                  seeds: int = DEFAULT_SEEDS) -> VerifyResult:
    """Check ``contract.kernel_fn`` against ``contract.reference_fn`` on ``seeds`` fresh inputs (see module doc).

    Args:
        contract: from :func:`load_contract` or built directly.
        rtol, atol: tolerances for every output and gradient; ``None`` takes each from the per-dtype table.
        seeds: number of seeds (``0 .. seeds-1``), at least 1.

    Returns:
        a :class:`VerifyResult`; a kernel that raises is reported there (``correct=False``), not raised.

    Raises:
        ContractError: ``get_inputs()`` raised or returned no list, or ``reference_fn`` raised.
        ValueError: ``seeds < 1``.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    result = VerifyResult(name=contract.name, correct=True, max_abs_diff=0.0, max_rel_diff=0.0, atol=atol, rtol=rtol)
    precisions: set[str] = set()
    for seed in range(seeds):
        outcome = _verify_seed(contract, seed, atol=atol, rtol=rtol)
        result.seeds.append(seed)
        result.details += outcome.details
        if outcome.precision != "n/a":
            precisions.add(outcome.precision)
        result.max_abs_diff = max(result.max_abs_diff, outcome.max_abs)
        result.max_rel_diff = max(result.max_rel_diff, outcome.max_rel)
        if outcome.backward_checked:
            result.backward_checked = True
            result.grad_max_abs_diff = max(result.grad_max_abs_diff or 0.0, outcome.grad_max_abs or 0.0)
            result.grad_max_rel_diff = max(result.grad_max_rel_diff or 0.0, outcome.grad_max_rel or 0.0)
        if not outcome.ok:
            result.correct = False
            result.traceback = outcome.traceback
            if seed + 1 < seeds:
                result.details.append(f"stopped after seed {seed}: it failed")
            break
    result.reference_precision = precisions.pop() if len(precisions) == 1 else ("mixed" if precisions else "n/a")
    if atol is None and rtol is None:
        tol = "tolerances by output dtype (fusion_advisor.tolerances)"
    else:
        tol = ", ".join(f"{n} {v:g}" if v is not None else f"{n} by output dtype"
                        for n, v in (("atol", atol), ("rtol", rtol)))
    if result.reference_precision == "n/a":  # the kernel raised before any output was compared
        against = "kernel_fn raised before its outputs could be compared with reference_fn"
    else:
        against = f"against reference_fn in {result.reference_precision}; {tol}"
    result.details.insert(0, f"{contract.name}: {'correct' if result.correct else 'INCORRECT'} over seeds "
                             f"{result.seeds} {against}")
    if contract.note:
        result.details.insert(1, "note: " + contract.note)
    return result
