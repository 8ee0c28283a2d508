"""Stage 1: load a model file (or the built-in default model) and its example inputs.

Conventions, detected in this order:

- ``kernelbench``: ``class Model(nn.Module)``, ``get_inputs()``, ``get_init_inputs()`` (KernelBench's format);
- ``get_model``: ``get_model()`` returning an ``nn.Module``, and ``get_inputs()``;
- ``kernel_contract``: ``kernel_fn``, ``reference_fn``, ``get_inputs()`` (a kernel file; ``reference_fn`` is analysed).

``get_inputs()`` returns ``forward()``'s positional arguments (a list), or its keyword arguments (a dict): the model
is then wrapped in :class:`KeywordCall`, so every later stage passes inputs positionally.

On ``device="meta"`` the model is built and the inputs made under ``torch.device("meta")``: parameters and
inputs have shapes and dtypes but no storage, so a 7B-parameter model needs no real memory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import torch
from torch import nn

from fusion_advisor.dtypes import CAST_NAMES, TORCH_DTYPES
from fusion_advisor.errors import ModelLoadError, ModelRunError
from fusion_advisor.files import no_bytecode

CONVENTIONS = {
    "kernelbench": "class Model, get_inputs(), get_init_inputs()  (KernelBench style)",
    "get_model": "get_model() and get_inputs()",
    "kernel_contract": "kernel_fn, reference_fn, get_inputs()  (kernel file; reference_fn is analysed)",
}
#: Short names of the conventions, for messages.
CONVENTION_LABELS = {"kernelbench": "KernelBench", "get_model": "get_model", "kernel_contract": "kernel-file"}
#: The callables each convention needs, in :data:`CONVENTIONS` order (the first complete one is taken).
CONVENTION_NAMES = {
    "kernelbench": ("Model", "get_inputs", "get_init_inputs"),
    "get_model": ("get_model", "get_inputs"),
    "kernel_contract": ("kernel_fn", "reference_fn", "get_inputs"),
}

#: what ``--dtype`` casts to: name -> torch dtype (:mod:`fusion_advisor.dtypes`).
DTYPES = {name: TORCH_DTYPES[name] for name in CAST_NAMES}

BUILTIN_DEFAULT = "fusion_advisor.models.llama"

#: The random seed the model's weights and inputs are made under (:func:`load_model`): every run of the tool sees
#: the same model and inputs, so a model whose Python branches on tensor values is cut into the same chains.
LOAD_SEED = 0
_RETRY = object()


@dataclass
class LoadedModel:
    """A model ready to capture.

    Attributes:
        name: model name (file stem, or the built-in's name).
        file: path of the model file, or ``"<builtin:module>"``.
        convention: one of :data:`CONVENTIONS` or ``"builtin"``.
        module: the ``nn.Module`` to analyse (in eval mode).
        inputs: positional example inputs, on ``device`` (for keyword inputs: the dict's values, in its order).
        device: ``"meta"``, ``"cpu"`` or ``"cuda"``.
        dtype: dtype override applied (``"bf16"``...), or ``""``.
        notes: facts the report should state (e.g. a model handed over in training mode is analysed in eval mode).
        make_inputs: ``make_inputs(seed)`` calls the file's ``get_inputs()`` again under ``seed`` (:func:`seeded`)
            (the caller's RNG state restored after) and returns inputs like :attr:`inputs`: fresh values with the
            structure the user's own code gives them (masks, labels, index tensors). ``None`` when not available.
        user_module: the user's own ``nn.Module`` (``module`` is a :class:`KeywordCall` around it for keyword
            inputs).
    """

    name: str
    file: str
    convention: str
    module: nn.Module
    inputs: tuple[Any, ...]
    device: str
    dtype: str
    notes: list[str] = field(default_factory=list)
    make_inputs: Callable[[int], tuple[Any, ...]] | None = field(default=None, repr=False)
    user_module: nn.Module | None = field(default=None, repr=False)

    @property
    def model(self) -> nn.Module:
        """The user's own module (what training-mode checks and messages should look at)."""
        return self.user_module if self.user_module is not None else self.module


#: Attribute under which a model called with keyword inputs sits in its :class:`KeywordCall` wrapper;
#: :func:`fusion_advisor.analyze.graph.module_path_of` drops it, so module paths name the user's modules.
KEYWORD_WRAPPER_ATTR = "fa_keyword_model"


class KeywordCall(nn.Module):
    """A model whose ``get_inputs()`` returns a dict, called as ``model(**inputs)``: the wrapper takes the values
    positionally, in the dict's order, and binds them to their names, so every later stage passes inputs
    positionally. The model sits under :data:`KEYWORD_WRAPPER_ATTR`."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.add_module(KEYWORD_WRAPPER_ATTR, model)
        self.names = tuple(names)

    def forward(self, *args: Any) -> Any:
        return getattr(self, KEYWORD_WRAPPER_ATTR)(**dict(zip(self.names, args)))


class _FunctionModule(nn.Module):
    """Wraps a plain function (a kernel file's ``reference_fn``) as an ``nn.Module`` so it can be captured."""

    def __init__(self, fn: Callable[..., Any]):
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _user_frame(exc: BaseException, path: Path) -> str:
    """``file:line`` of the innermost traceback frame inside ``path``, or ``str(path)`` if none."""
    where = str(path)
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            where = f"{frame.filename}:{frame.lineno}"
    return where


def import_model_file(path: str | Path) -> ModuleType:
    """Import a Python file as a fresh module without touching ``sys.path`` for good.

    Raises:
        ModelLoadError: the file is missing, unreadable, has a syntax error, or raises on import
            (the message names the file and line).
    """
    path = Path(path)
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, not a model file (give the path of a .py file)")
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    if path.suffix != ".py":
        raise ModelLoadError(f"{path}: expected a Python file (.py)")
    name = f"_fusion_advisor_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        sys.modules[name] = module
        with no_bytecode():
            spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise ModelLoadError(f"{e.filename or path}:{e.lineno}: syntax error: {e.msg}") from e
    except Exception as e:  # the user's module-level code raised
        sys.modules.pop(name, None)
        raise ModelLoadError(f"{_user_frame(e, path)}: importing the model file raised {type(e).__name__}: {e}") from e
    finally:
        sys.path.remove(str(path.parent.resolve()))
    return module


def detect_convention(module: ModuleType, origin: str) -> str:
    """Name the convention ``module`` follows.

    Raises:
        ModelLoadError: no convention fits; the message lists the known ones.
    """
    has = lambda n: callable(getattr(module, n, None))  # noqa: E731
    for convention, names in CONVENTION_NAMES.items():
        if all(has(n) for n in names):
            return convention
    known = "\n".join(f"  - {v}" for v in CONVENTIONS.values())
    # the convention the file comes nearest to (most of its names defined), when it defines any: say what is missing
    near = max(CONVENTION_NAMES, key=lambda c: sum(has(n) for n in CONVENTION_NAMES[c]) / len(CONVENTION_NAMES[c]))
    found = [n for n in CONVENTION_NAMES[near] if has(n)]
    missing = [n for n in CONVENTION_NAMES[near] if not has(n)]
    hint = (f" it defines {' and '.join(found)} but no {' or '.join(missing)} (the {CONVENTION_LABELS[near]} "
            f"convention);" if found else "")
    raise ModelLoadError(f"{origin}: follows no known model convention;{hint} define one of:\n{known}")


def _call_user(fn: Callable[..., Any], what: str, origin: str, path: Path | None) -> Any:
    """Call a user function, turning any exception into a :class:`ModelRunError` naming file and line."""
    try:
        return fn()
    except Exception as e:
        where = _user_frame(e, path) if path is not None else origin
        hint = ""
        if "meta" in str(e).lower() and torch.get_default_device().type == "meta":
            hint = " (it ran on --device meta, where tensors hold no values: try --device cpu or cuda)"
        elif "cuda" in str(e).lower() and not torch.cuda.is_available():
            hint = " (no CUDA here: make the file create tensors without .cuda(), or analyse on a GPU machine)"
        raise ModelRunError(f"{where}: {what} raised {type(e).__name__}: {e}{hint}") from e


def _convert(x: Any, device: str, dtype: torch.dtype | None) -> Any:
    """Move tensors (nested in lists/tuples/dicts) to ``device``; cast floating ones to ``dtype``."""
    if isinstance(x, torch.Tensor):
        if dtype is not None and x.is_floating_point():
            x = x.to(dtype)
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_convert(v, device, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _convert(v, device, dtype) for k, v in x.items()}
    return x


@contextlib.contextmanager
def seeded(device: str, seed: int) -> Iterator[None]:
    """Run the body with the random generators a model built on ``device`` draws from seeded with ``seed`` (the CPU's,
    and on ``"cuda"`` the current GPU's), every other generator untouched and these restored after:
    ``torch.manual_seed`` would reseed every GPU's generator, the caller's too (a training script's dropout
    stream). The values differ between devices: a CPU and a GPU generator given one seed draw different numbers."""
    devices = [torch.cuda.current_device()] if device.startswith("cuda") and torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed(seed)
        yield


def _build(module: ModuleType, inner: str, device: str, origin: str, file_path: Path | None) -> tuple[Any, Any]:
    """The model and its raw inputs as the file makes them (``inner``: its convention), built under ``device``.

    Raises:
        ModelLoadError, ModelRunError: as :func:`_call_user` and :func:`_make_raw_inputs` raise them.
    """
    with torch.device(device):
        if inner == "kernelbench":
            init = _call_user(module.get_init_inputs, "get_init_inputs()", origin, file_path)
            if isinstance(init, dict):
                model = _call_user(lambda: module.Model(**init), "Model(**get_init_inputs())", origin, file_path)
            elif isinstance(init, (list, tuple)):
                model = _call_user(lambda: module.Model(*init), "Model(*get_init_inputs())", origin, file_path)
            else:
                raise ModelLoadError(f"{origin}: get_init_inputs() must return a list (or a dict of keyword "
                                     f"arguments), got {type(init).__name__}")
        elif inner == "get_model":
            model = _call_user(module.get_model, "get_model()", origin, file_path)
        else:
            model = _FunctionModule(module.reference_fn)
    inputs = _make_raw_inputs(module, device, origin, file_path)
    return model, inputs


def load_model(path: str | Path | None, device: str = "meta", dtype: str = "") -> LoadedModel:
    """Load the model in ``path`` (``None``: the built-in default model) with example inputs on ``device``.

    Args:
        path: model file, or ``None`` for the built-in Llama-style decoder.
        device: ``"meta"`` (shapes only, nothing executed), ``"cpu"`` or ``"cuda"``.
        dtype: ``""`` (as the file makes it), ``"fp32"``, ``"bf16"`` or ``"fp16"``: casts the model's parameters
            and floating inputs.

    Raises:
        ModelLoadError: the file cannot be read or follows no convention.
        ModelRunError: building the model or ``get_inputs()`` raised.
    """
    if device not in ("meta", "cpu", "cuda"):
        raise ModelLoadError(f"unknown --device {device!r}; choose meta, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda asked for, but no CUDA GPU is available; use --device meta or cpu")
    if dtype and dtype not in DTYPES:
        raise ModelLoadError(f"unknown --dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    torch_dtype = DTYPES.get(dtype)

    if path is None:
        module = importlib.import_module(BUILTIN_DEFAULT)
        origin, file_path, convention = f"<builtin:{BUILTIN_DEFAULT}>", None, "builtin"
        name = getattr(module, "MODEL_NAME", "default")
        inner = "get_model"
    else:
        file_path = Path(path)
        module = import_model_file(file_path)
        origin = str(file_path)
        convention = inner = detect_convention(module, origin)
        name = file_path.stem

    # Build the model and make the inputs under the target device, so meta needs no memory at all. Inputs that
    # cannot be made there (a CPU generator, say) are made as the file writes them, then moved. Under a fixed seed
    # (LOAD_SEED; the caller's random state restored after): the weights and inputs, and so the branches a model
    # that reads tensor values takes, are the same in every run (a fresh user's model branching on h.mean() > 0
    # was cut into other chains on a second run)
    with seeded(device, LOAD_SEED):
        model, inputs = _build(module, inner, device, origin, file_path)

    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"{origin}: the model is a {type(model).__name__}, not a torch.nn.Module")
    if inputs is None:
        raise ModelLoadError(f"{origin}: get_inputs() returned None; return a list of the positional arguments "
                             "of forward() (a missing return statement?)")
    user_model = model
    keywords: tuple[str, ...] | None = None
    if isinstance(inputs, dict):  # keyword inputs: forward(**inputs)
        bad = [k for k in inputs if not isinstance(k, str) or not k.isidentifier()]
        if bad or not inputs:
            raise ModelLoadError(f"{origin}: get_inputs() returned a dict whose keys must be forward()'s keyword "
                                 f"argument names" + (f", got {bad[:3]!r}" if bad else ", got an empty dict"))
        keywords = tuple(inputs)
        model = KeywordCall(model, keywords)
    inputs = _positional(inputs, keywords)
    try:
        model = model.to(device=device, dtype=torch_dtype) if torch_dtype else model.to(device)
    except Exception as e:
        raise ModelRunError(f"{origin}: moving the model to {device} failed: {e}") from e
    notes = _cache_off(user_model, origin)
    mode_matters = any(isinstance(m, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm))
                       for m in model.modules())
    if user_model.training and mode_matters:  # the user's module, not the KeywordCall wrapper around it
        notes.append(
            f"{origin}: the model was in training mode; it is analysed in eval mode, forward only (dropout off, "
            "batch norm with running statistics); `apply --backward` verifies swaps' gradients too, in eval mode as "
            "well"
        )
    model.eval()

    def make_inputs(seed: int) -> tuple[Any, ...]:
        with seeded(device, seed):
            raw = _make_raw_inputs(module, device, origin, file_path)
        return tuple(_convert(x, device, torch_dtype) for x in _positional(raw, keywords))

    return LoadedModel(
        name=name,
        file=origin,
        convention=convention,
        module=model,
        inputs=tuple(_convert(x, device, torch_dtype) for x in inputs),
        device=device,
        dtype=dtype,
        notes=notes,
        make_inputs=make_inputs if device != "meta" else None,
        user_module=user_model,
    )


def _cache_off(model: nn.Module, origin: str) -> list[str]:
    """Turn the KV cache off in every Hugging Face model inside ``model`` (its ``config.use_cache``), returning a
    note per model changed.

    A transformers model built from its default config returns a ``DynamicCache`` from its forward: dynamo fakes
    ``torch.cat`` of its empty (0,)-sized tensors and export cannot flatten it (no pytree), and its mask code reads
    tensor values; a forward without a cache is what a training step or a prefill runs, and captures everywhere.
    The tool built this instance from the file itself, so the user's own objects are untouched.
    """
    notes = []
    for name, m in model.named_modules():
        config = getattr(m, "config", None)
        if config is None or not getattr(config, "use_cache", False) or not hasattr(m, "generation_config") and \
                not type(m).__module__.startswith("transformers."):
            continue
        config.use_cache = False
        where = f" ({name})" if name else ""
        notes.append(f"{origin}: {type(m).__name__}{where} analysed with use_cache=False (a forward without a KV "
                     f"cache, as in training or a prefill); set by fusion-advisor on its own instance of the model")
    return notes


def _make_raw_inputs(module: ModuleType, device: str, origin: str, file_path: Path | None) -> Any:
    """``module.get_inputs()`` under ``torch.device(device)`` (so meta inputs need no memory); inputs that cannot be
    made there (a CPU generator, say) are made as the file writes them, then moved by the caller."""
    try:
        with torch.device(device):
            return module.get_inputs()
    except Exception:  # e.g. a CPU torch.Generator under the device context: retry as the file wrote it
        return _call_user(module.get_inputs, "get_inputs()", origin, file_path)


def _positional(inputs: Any, keywords: tuple[str, ...] | None) -> tuple[Any, ...]:
    """``get_inputs()``'s result as positional arguments (a dict's values in the order of ``keywords``)."""
    if keywords is not None:
        if not isinstance(inputs, dict) or tuple(inputs) != keywords:
            raise ModelLoadError(f"get_inputs() returned {type(inputs).__name__} with other keys than before "
                                 f"({list(inputs) if isinstance(inputs, dict) else ''} vs {list(keywords)})")
        return tuple(inputs.values())
    return tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
