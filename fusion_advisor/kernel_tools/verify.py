"""Check a kernel against its contract: ``kernel_fn(*args)`` must match ``reference_fn(*args)``.

A kernel file (or ``kernel_library`` module) defines the contract of ``kernel_library/__init__.py``:
``kernel_fn(*args)`` (the kernel), ``reference_fn(*args)`` (plain PyTorch, same signature and semantics) and
``get_inputs()`` (a list of fresh arguments). :func:`load_contract` imports one, :func:`verify_kernel` checks it
with the verification engine (:mod:`fusion_advisor.verification`), on these cases, in order:

1. **seeds**: for each seed ``s`` in ``range(seeds)``, ``get_inputs()`` after seeding every RNG with ``s``;
2. **hard values** (seed 0's inputs): the plain floating inputs x 8, x 1e-3, the first one zeroed (masks,
   integers and probabilities left alone: :func:`~fusion_advisor.verification.inputs.hard_variants`), then the
   cases the file documents itself: ``hard_inputs()`` returning ``[(label, args), ...]`` (fully masked rows,
   confident predictions, large magnitudes);
3. **shapes**: where the file's ``get_inputs`` takes a size and it names its sizes (``SIZES`` or ``SHAPES``, the
   sweep hooks of :mod:`fusion_advisor.kernel_tools.sweep`), the edge shapes derived from the first one (one row, a partial last
   block, odd widths, 1025 rows, 65537 rows: :func:`~fusion_advisor.verification.inputs.edge_sizes`), or the file's
   own ``VERIFY_SIZES``; under Triton's interpreter the shape over 65,535 rows runs only with ``shapes="all"``
   (one program per row takes ~1.5 ms there), and the result says so;
4. **layout** (with the hard values): seed 0's inputs, every tensor a view at storage offset 1 with stride 2 along
   its last axis, the gaps poisoned (NaN for floating tensors;
   :func:`~fusion_advisor.verification.inputs.strided_variant`): a kernel that reads them as contiguous reads the
   poison. One whose forward or backward refuses them with a
   ``ValueError``, ``TypeError`` or ``NotImplementedError`` (:data:`LAYOUT_REFUSALS`) is reported as refusing.

Each case is :func:`~fusion_advisor.verification.kernel.check_case`: poisoned allocations in redzones, CUDA's grid
limits, inputs unchanged, output dtypes equal to ``reference_fn``'s in the inputs' own dtypes, every output and
(where inputs require grad) every input gradient within the error policy
(:mod:`fusion_advisor.verification.policy`: against ``reference_fn`` in float64, with ``reference_fn`` in the
inputs' own dtypes as the scale), or element-wise at the caller's ``atol`` / ``rtol``. It stops at the first case
that fails; :attr:`VerifyResult.shapes` lists every case with its input shapes and status.
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
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

from fusion_advisor.errors import ContractError, KernelLoadError
from fusion_advisor.files import no_bytecode
from fusion_advisor.verification.inputs import (
    STRIDED_CASE, EdgeSize, edge_sizes, explicit_sizes, hard_variants, seed_everything, strideable, strided_variant,
)
from fusion_advisor.verification.kernel import CaseOutcome, ReferenceFailed, check_case, user_frame
from fusion_advisor.verification.poison import PoisonAllocations, poison_, poison_value, run_backward  # noqa: F401
from fusion_advisor.verification.policy import SCALAR_FLOAT_DTYPE, compare_outputs, policy_text  # noqa: F401

#: Errors a kernel may raise to refuse the strided case's layouts (documented argument checks): the case is then
#: reported as refused, not failed; any other error, or a wrong answer, fails it.
LAYOUT_REFUSALS = (ValueError, TypeError, NotImplementedError)

#: Names kept importable from here for callers of the contract checker (they live in fusion_advisor.verification).
__all__ = [
    "CONTRACT_HELP", "CONTRACT_NAMES", "DEFAULT_SEEDS", "KernelContract", "PoisonAllocations", "SCALAR_FLOAT_DTYPE",
    "SHAPE_MODES", "VerifyResult", "compare_outputs", "fresh_inputs", "interpreted", "load_contract", "poison_",
    "poison_value", "run_backward", "seed_everything", "shape_plan", "use_triton_interpreter_if_no_gpu",
    "verify_kernel",
]

CONTRACT_NAMES = ("kernel_fn", "reference_fn", "get_inputs")

CONTRACT_HELP = (
    "a kernel file defines kernel_fn(*args) (the kernel), reference_fn(*args) (plain PyTorch, same signature) "
    "and get_inputs() (a list of fresh arguments)"
)

#: Seeds :func:`verify_kernel` runs by default: a few fresh inputs catch what one lucky draw hides, and the
#: CPU interpreter stays fast enough at three.
DEFAULT_SEEDS = 3

#: Said when the strided case fails: the usual cause, and the two ways out.
STRIDED_HINT = ("the inputs are views (offset 1, every other element along the last axis), and a kernel that loads "
                "them as if contiguous reads the wrong elements: pass each tensor's strides to the kernel, or call "
                ".contiguous() in kernel_fn; a kernel that takes contiguous tensors alone may refuse other layouts "
                "by raising ValueError, TypeError or NotImplementedError (reported as refused, not failed). "
                "bench --sweep times contiguous inputs only, so it passes such a kernel")


#: Said when an edge shape cannot be built or the kernel refuses it.
SHAPE_HINT = ("if the kernel does not take this shape, list the sizes it does take in VERIFY_SIZES (or verify with "
              "--shapes given)")

#: How many extra shapes ``verify`` runs (``--shapes``): ``edges`` the edge shapes derived from the file's size hooks
#: (under Triton's interpreter without the one over 65,535 rows), ``all`` those too, ``given`` only ``get_inputs()``.
SHAPE_MODES = ("edges", "all", "given")


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
        sizes: the file's ``SIZES`` / ``SHAPES`` when ``get_inputs`` takes a size (the edge shapes are derived from
            the first, see :func:`fusion_advisor.verification.inputs.edge_sizes`), else ``()``.
        verify_sizes: the file's ``VERIFY_SIZES``: the extra sizes to run instead of the derived ones, else ``()``.
        hard_inputs: the file's ``hard_inputs()``, returning ``[(label, args), ...]`` (or a dict label -> args) of
            the hard values the kernel documents (fully masked rows, confident predictions, ...), or ``None``.
        tf32: the file sets ``USES_TF32 = True``: fp32 outputs come from TF32 products on a GPU (the policy's
            TF32 floor applies there).
        max_row_elems: the widest row the kernel takes (its registry entry's limit), or ``None``.
    """

    name: str
    path: Path | None
    kernel_fn: Callable[..., Any]
    reference_fn: Callable[..., Any]
    get_inputs: Callable[..., Sequence[Any]]
    module: ModuleType | None = None
    note: str = ""
    sizes: tuple[Any, ...] = ()
    verify_sizes: tuple[Any, ...] = ()
    hard_inputs: Callable[[], Any] | None = None
    tf32: bool = False
    max_row_elems: int | None = None

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
        sized = takes_argument(module.get_inputs)
        sizes_attr = next((getattr(module, n) for n in ("SIZES", "SHAPES") if getattr(module, n, None) is not None),
                          None)
        explicit = getattr(module, "VERIFY_SIZES", None)
        for attr, value in (("SIZES/SHAPES", sizes_attr), ("VERIFY_SIZES", explicit)):
            if value is not None and (not isinstance(value, (list, tuple)) or not value):
                raise ContractError(f"{origin}: {attr} must be a non-empty list of sizes (ints or shape tuples)")
        if explicit is not None and not sized:
            raise ContractError(f"{origin}: VERIFY_SIZES is given but get_inputs() takes no argument; define "
                                f"get_inputs(size)")
        hard = getattr(module, "hard_inputs", None)
        if hard is not None and not callable(hard):
            raise ContractError(f"{origin}: hard_inputs is a {type(hard).__name__}, not a function returning "
                                f"[(label, args), ...]")
        return cls(
            name=name or module.__name__.rsplit(".", 1)[-1],
            path=Path(file) if file else None,
            kernel_fn=module.kernel_fn,
            reference_fn=module.reference_fn,
            get_inputs=module.get_inputs,
            module=module,
            sizes=tuple(_as_size(s) for s in sizes_attr) if sized and sizes_attr is not None else (),
            verify_sizes=tuple(_as_size(s) for s in explicit) if explicit is not None else (),
            hard_inputs=hard,
            tf32=bool(getattr(module, "USES_TF32", False)),
            max_row_elems=_row_limit(module),
        )


def _as_size(s: Any) -> Any:
    return tuple(s) if isinstance(s, list) else s


def takes_argument(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a positional argument (``get_inputs(size)``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _row_limit(module: ModuleType) -> int | None:
    """The smallest ``max_row_elems`` of the registry entries living in ``module`` (a kernel_library module)."""
    if not module.__name__.startswith("kernel_library."):
        return None
    try:
        from kernel_library.registry import KERNELS
    except ImportError:
        return None
    limits = [e.max_row_elems for e in KERNELS.values() if e.module == module.__name__ and e.max_row_elems]
    return min(limits) if limits else None


def use_triton_interpreter_if_no_gpu() -> bool:
    """Set ``TRITON_INTERPRET=1`` when no CUDA GPU is present and the variable is unset; return whether set now.

    Triton reads the variable when a kernel is decorated, so call this before a kernel file is imported. Under the
    interpreter NumPy's floating-point warnings from Triton's own emulation (``overflow encountered in multiply``
    when verify's hard values reach inf, as they do on a GPU without a word) are silenced: verify judges the
    outputs, inf and NaN included.
    """
    set_now = not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ
    if set_now:
        os.environ["TRITON_INTERPRET"] = "1"
    if os.environ.get("TRITON_INTERPRET") == "1":
        _quiet_interpreter_arithmetic()
    return set_now


def _quiet_interpreter_arithmetic() -> None:
    # floating-point array arithmetic only: an integer scalar's overflow (an int32 offset wrapping) still warns
    warnings.filterwarnings("ignore", message=r"(overflow|underflow|invalid value|divide by zero) encountered in "
                            r"(?!scalar )", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


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
        overrides = module.contract_for(text) if callable(getattr(module, "contract_for", None)) else None
        if overrides:  # the module says how this entry differs (e.g. linear_nobias: every input without bias)
            return dataclasses.replace(contract, name=text, **overrides, note=(
                f"'{text}' is registered in {module.__name__}: checked with that module's contract_for('{text}')"))
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


def _library_names() -> list[str]:
    """The names ``verify`` and ``bench`` take: every kernel module and every registry entry (``masked_softmax``
    lives in kernel_library.softmax)."""
    try:
        from kernel_library.registry import load_all

        entries = list(load_all())
    except Exception:  # a broken registry: the modules alone
        entries = []
    return sorted(set(_library_modules()) | set(entries))


_user_frame = user_frame


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
                known = ", ".join(_library_names()) or "(none)"
            except Exception:  # kernel_library itself broken: still say what was looked for
                known = "(kernel_library not importable)"
            raise KernelLoadError(
                f"{name}: no such kernel file or module (looked for module {target}); "
                f"kernel_library kernels: {known}; pass a path to a .py file for your own kernel"
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
        with no_bytecode():
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




# --- verifying ----------------------------------------------------------------------------------------------


@dataclass
class VerifyResult:
    """Outcome of :func:`verify_kernel`.

    Attributes:
        name: the kernel's name.
        correct: every case run passed every check.
        max_abs_diff, max_rel_diff: largest differences of the forward outputs over all cases run (``inf`` where
            NaN/inf differ; ``null`` in JSON).
        details: human-readable lines: the verdict, the shapes run, then per case one line per output / gradient
            (errors against float64, eager's own, the limits; the worst index and values on a mismatch).
        seeds: the seeds run (fewer than asked when one failed).
        cases: the names of the cases run, in order (``seed 0``, ``hard-large``, ``shape one row``, ...).
        shapes: one dict per case planned: ``case``, ``size`` (what ``get_inputs`` was given), ``inputs`` (the
            tensor arguments' shapes and dtypes), ``status`` (``passed``, ``FAILED``, ``skipped: why``, ``not run:
            stopped at the first failure``).
        reference_precision: ``"float64"`` (inputs upcast), ``"input dtypes"`` (float64 failed or no floating
            inputs) or ``"mixed"`` (differed between cases).
        backward_checked: gradients were compared (some input requires grad).
        grad_max_abs_diff, grad_max_rel_diff: largest differences of the input gradients, ``None`` if unchecked.
        atol, rtol: tolerances given by the caller; ``None`` means the error policy.
        worst_share_of_limit: the error policy's largest error over its limit among every output and gradient of
            every case (:attr:`~fusion_advisor.verification.policy.Judgement.share_of_limit`: at most 1 passes),
            ``None`` where the policy judged none (``--atol`` / ``--rtol`` given); ``worst_share_at`` names its
            case and tensor.
        failure: the first failing line (``""`` when correct).
        traceback: formatted traceback when ``kernel_fn`` raised (not part of :meth:`to_dict`).
    """

    name: str
    correct: bool
    max_abs_diff: float
    max_rel_diff: float
    details: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    shapes: list[dict[str, str]] = field(default_factory=list)
    reference_precision: str = "float64"
    backward_checked: bool = False
    grad_max_abs_diff: float | None = None
    grad_max_rel_diff: float | None = None
    atol: float | None = None
    rtol: float | None = None
    worst_share_of_limit: float | None = None
    worst_share_at: str = ""
    failure: str = ""
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
            "cases": list(self.cases),
            "shapes": [dict(s) for s in self.shapes],
            "reference_precision": self.reference_precision,
            "backward_checked": self.backward_checked,
            "grad_max_abs_diff": _json_float(self.grad_max_abs_diff),
            "grad_max_rel_diff": _json_float(self.grad_max_rel_diff),
            "atol": self.atol,
            "rtol": self.rtol,
            "worst_share_of_limit": _json_float(self.worst_share_of_limit),
            "worst_share_at": self.worst_share_at,
            "failure": self.failure,
            "diffs_note": DIFFS_NOTE,
        }


#: What the JSON's ``max_*_diff`` fields are (a new user read ``max_rel_diff 1.0`` beside ``correct: true`` as an
#: alarm): element-wise maxima, which the error policy does not judge by.
DIFFS_NOTE = ("max_abs_diff, max_rel_diff and their grad_ twins are element-wise maxima over every case, against "
              "reference_fn in float64: a relative difference over a reference element near zero can be large in a "
              "correct kernel (1.0 where the reference is ~0). The verdict is the error policy's (per tensor, "
              "norm-wise and max-wise against float64, scaled by reference_fn's own error in the inputs' dtype: "
              "see details), or --atol / --rtol's element-wise test when given. worst_share_of_limit is the "
              "policy's measure: the largest error over its limit of any output or gradient of any case (at most "
              "1 passes), worst_share_at where.")


def _json_float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _checked_args(contract: KernelContract, args: Any, call: str) -> list[Any]:
    if not isinstance(args, (list, tuple)):
        raise ContractError(f"{contract.name}: {call} returned a {type(args).__name__}, expected a list of arguments")
    return list(args)


def fresh_inputs(contract: KernelContract, seed: int, size: Any = None) -> list[Any]:
    """``contract.get_inputs()`` (``get_inputs(size)`` when ``size`` is given) after seeding every RNG with
    ``seed`` (:func:`~fusion_advisor.verification.inputs.seed_everything`), checked to be a list.

    Raises:
        ContractError: ``get_inputs`` raised or returned something other than a list or tuple.
    """
    seed_everything(seed)
    call = "get_inputs()" if size is None else f"get_inputs({size!r})"
    try:
        args = contract.get_inputs() if size is None else contract.get_inputs(size)
    except Exception as exc:
        raise ContractError(
            f"{user_frame(exc, contract.path)}: {call} of {contract.name} raised {type(exc).__name__}: {exc}"
        ) from exc
    return _checked_args(contract, args, call)


def _documented_hard_inputs(contract: KernelContract) -> list[tuple[str, list[Any]]]:
    """The file's ``hard_inputs()`` (seed 0), as ``[(label, args), ...]``.

    Raises:
        ContractError: it raised, or returned something other than a list of ``(label, args)`` or a dict.
    """
    if contract.hard_inputs is None:
        return []
    seed_everything(0)
    try:
        cases = contract.hard_inputs()
    except Exception as exc:
        raise ContractError(f"{user_frame(exc, contract.path)}: hard_inputs() of {contract.name} raised "
                            f"{type(exc).__name__}: {exc}") from exc
    items = list(cases.items()) if isinstance(cases, dict) else cases
    if not isinstance(items, (list, tuple)) or not all(
            isinstance(c, (list, tuple)) and len(c) == 2 and isinstance(c[0], str) for c in items):
        raise ContractError(f"{contract.name}: hard_inputs() must return [(label, args), ...] or {{label: args}}, "
                            f"got {type(cases).__name__}")
    return [(f"hard: {label}", _checked_args(contract, args, f"hard_inputs()[{label!r}]")) for label, args in items]


def interpreted() -> bool:
    """Whether Triton kernels run under the CPU interpreter here (``TRITON_INTERPRET`` set, or no CUDA GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or not torch.cuda.is_available()


def shape_plan(contract: KernelContract, shapes: str = "edges") -> list[EdgeSize]:
    """The extra sizes :func:`verify_kernel` runs for ``contract`` under ``shapes`` (see :data:`SHAPE_MODES`):
    the file's ``VERIFY_SIZES``, else the edge shapes of its first ``SIZES`` / ``SHAPES`` entry, else none.

    Raises:
        ContractError: a size of ``SIZES`` / ``SHAPES`` is neither an int nor a tuple of positive ints.
    """
    if shapes == "given":
        return []
    huge = shapes == "all"
    if contract.verify_sizes:
        return explicit_sizes(contract.verify_sizes, interpreted=interpreted(), huge=huge)
    if not contract.sizes:
        return []
    try:
        return edge_sizes(contract.sizes[0], interpreted=interpreted(), huge=huge,
                          max_row_elems=contract.max_row_elems)
    except ValueError as exc:
        raise ContractError(f"{contract.path or contract.name}: SIZES/SHAPES: {exc}; list the sizes to verify in "
                            f"VERIFY_SIZES instead") from exc


def verify_kernel(contract: KernelContract, rtol: float | None = None, atol: float | None = None,
                  seeds: int = DEFAULT_SEEDS, shapes: str = "edges", hard_values: bool = True,
                  progress: Callable[[str], None] | None = None) -> VerifyResult:
    """Check ``contract.kernel_fn`` against ``contract.reference_fn`` on the cases of the module docstring.

    Args:
        contract: from :func:`load_contract` or built directly.
        rtol, atol: element-wise tolerances for every output and gradient instead of the error policy.
        seeds: number of seeds (``0 .. seeds-1``), at least 1.
        shapes: ``"edges"``, ``"all"`` or ``"given"`` (:data:`SHAPE_MODES`).
        hard_values: run the hard-value cases (generic and the file's ``hard_inputs()``).
        progress: called with ``"<case> (<size>)"`` before each case runs: a kernel that crashes the process (a
            store far out of bounds) leaves the case it crashed in on the caller's screen.

    Returns:
        a :class:`VerifyResult`; a kernel that raises is reported there (``correct=False``), not raised.

    Raises:
        ContractError: ``get_inputs()`` (or ``hard_inputs()``) raised or returned no list, or ``reference_fn``
            raised in float64 and in the inputs' own dtypes.
        ValueError: ``seeds < 1`` or an unknown ``shapes``.
    """
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    if shapes not in SHAPE_MODES:
        raise ValueError(f"shapes must be one of {', '.join(SHAPE_MODES)}, got {shapes!r}")
    result = VerifyResult(name=contract.name, correct=True, max_abs_diff=0.0, max_rel_diff=0.0, atol=atol, rtol=rtol)
    tf32 = contract.tf32 and not interpreted()

    # (case, size label, make_args, skip reason)
    plan: list[tuple[str, str, Callable[[], list[Any]], str]] = [
        (f"seed {s}", "get_inputs()", (lambda s=s: fresh_inputs(contract, s)), "") for s in range(seeds)]
    if hard_values:
        base = fresh_inputs(contract, 0)
        plan += [(name, "get_inputs() (seed 0)", (lambda a=a: a), "") for name, a in hard_variants(base)]
        plan += [(name, "hard_inputs()", (lambda a=a: a), "") for name, a in _documented_hard_inputs(contract)]
    for edge in shape_plan(contract, shapes):
        plan.append((f"shape {edge.label}", f"get_inputs({edge.size!r})",
                     (lambda s=edge.size: fresh_inputs(contract, 0, s)), edge.skip))
    if hard_values and strideable(base):  # built when it runs: after the largest shapes, not beside them
        plan.append((STRIDED_CASE, "get_inputs() (seed 0)", (lambda: strided_variant(fresh_inputs(contract, 0))), ""))

    precisions: set[str] = set()
    failed_at = ""
    for case, size, make, skip in plan:
        entry = {"case": case, "size": size, "inputs": "", "status": ""}
        result.shapes.append(entry)
        if skip:
            entry["status"] = f"skipped: {skip}"
            continue
        if failed_at:
            entry["status"] = f"not run: stopped after {failed_at} failed"
            continue
        try:
            args = make()
        except ContractError as exc:
            if not case.startswith("shape "):
                raise
            raise ContractError(f"{exc}; {SHAPE_HINT}") from exc
        seed = int(case.split()[1]) if case.startswith("seed ") else 0
        if progress is not None:
            progress(f"{case} ({size})")
        try:
            outcome = check_case(case, contract.kernel_fn, contract.reference_fn, args, atol=atol, rtol=rtol,
                                 tf32=tf32, grad_seed=seed, path=contract.path)
        except ReferenceFailed as exc:
            raise ContractError(f"{user_frame(exc.original, contract.path)}: reference_fn of {contract.name} raised "
                                f"{type(exc.original).__name__}: {exc.original}") from exc.original
        if case == STRIDED_CASE and outcome.raised is not None and issubclass(outcome.raised, LAYOUT_REFUSALS):
            entry["inputs"], entry["status"] = outcome.inputs, "refused"
            result.details.append(f"{outcome.failure}: refused, not a wrong answer (callers must pass the layouts "
                                  f"it takes)")
            continue
        _merge(result, outcome, precisions)
        entry["inputs"] = outcome.inputs
        entry["status"] = "passed" if outcome.ok else "FAILED"
        if case.startswith("seed "):
            result.seeds.append(seed)
        if not outcome.ok:
            result.correct = False
            result.traceback = outcome.traceback
            result.failure = outcome.failure
            failed_at = case
            if case.startswith("shape ") and outcome.traceback is not None:
                result.details.append(f"{case}: {SHAPE_HINT}")
            if case == STRIDED_CASE:
                result.details.append(f"{case}: {STRIDED_HINT}")
    result.reference_precision = precisions.pop() if len(precisions) == 1 else ("mixed" if precisions else "n/a")
    if failed_at and any(e["status"].startswith("not run") for e in result.shapes):
        result.details.append(f"stopped after {failed_at}: it failed")
    if atol is None and rtol is None:
        tol = policy_text()
    else:
        tol = ", ".join(f"{n} {v:g}" if v is not None else f"{n} by output dtype"
                        for n, v in (("atol", atol), ("rtol", rtol))) + " (element-wise)"
    if result.reference_precision == "n/a":  # the kernel raised before any output was compared
        against = "kernel_fn raised before its outputs could be compared with reference_fn"
    else:
        against = f"against reference_fn in {result.reference_precision}; {tol}"
    head = [f"{contract.name}: {'correct' if result.correct else 'INCORRECT'} over {len(result.cases)} case(s) "
            f"({', '.join(result.cases)}) {against}"]
    if contract.note:
        head.append("note: " + contract.note)
    head.append("shapes: " + _shapes_line(result.shapes))
    result.details[:0] = head
    return result


def _shapes_line(entries: list[dict[str, str]]) -> str:
    """The cases grouped by inputs and status: ``seed 0, seed 1: x [16, 1000] bfloat16 passed; ...``."""
    groups: list[tuple[list[str], str, str]] = []
    for e in entries:
        what = e["inputs"] or e["size"]
        if groups and groups[-1][1] == what and groups[-1][2] == e["status"]:
            groups[-1][0].append(e["case"])
        else:
            groups.append(([e["case"]], what, e["status"]))
    return "; ".join(f"{', '.join(cases)} ({what}): {status}" for cases, what, status in groups)


def _merge(result: VerifyResult, outcome: CaseOutcome, precisions: set[str]) -> None:
    result.cases.append(outcome.case)
    result.details += outcome.details
    if outcome.reference:
        precisions.add(outcome.reference)
    result.max_abs_diff = max(result.max_abs_diff, outcome.max_abs_diff)
    result.max_rel_diff = max(result.max_rel_diff, outcome.max_rel_diff)
    for label, j in outcome.judgements:
        if result.worst_share_of_limit is None or j.share_of_limit > result.worst_share_of_limit:
            result.worst_share_of_limit, result.worst_share_at = j.share_of_limit, f"{outcome.case}: {label}"
    if outcome.backward_checked:
        result.backward_checked = True
        result.grad_max_abs_diff = max(result.grad_max_abs_diff or 0.0, outcome.grad_max_abs_diff or 0.0)
        result.grad_max_rel_diff = max(result.grad_max_rel_diff or 0.0, outcome.grad_max_rel_diff or 0.0)
