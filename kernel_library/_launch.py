"""A Triton launch without the JIT's per-call binding, for the library's direct eager calls.

``kernel[grid](*args, **meta)`` cost the host of an H200 machine (torch 2.11, triton 3.6, Python 3.12) 27.4 us per
launch, 42.8 us inside a backward on the autograd engine's device thread; the compiled kernel's own launcher, called
with the argument list the JIT builds, 11.8 and 18.7 us (``benchmarks/results/h200/host/host_paths.md``). The
difference is the JIT's binder (specialising every argument), its cache key, its keyword handling and its launch
metadata, which come out the same on every call of a model whose shapes do not change. Through this module the
softmax forward's launch (16 arguments) took 14.3 us against 20.2 us through the JIT, and Liger-Kernel's softmax
launch (7 arguments, the JIT) 13.7 us, interleaved in one process on an H200 machine
(``benchmarks/results/h200/host/softmax_layers.md``, 2026-12-04, with every check below in the key).

:class:`CachedLauncher` keeps, per **call key** — the device; the global Triton state the JIT folds into its own
key (debug, instrumentation); for each positional argument a tensor's dtype and 16-byte alignment, a float's type,
an int's exact value (kept bare: no other entry equals an int), a bool's, str's or None's type and value; every
meta keyword's type and exact value — the compiled kernel the JIT chose, and launches it directly. The key is
stricter than the JIT's own (which keeps only an int's divisibility by 16 and whether it is 1), so a key never maps
to a kernel the JIT would not pick for those arguments. A key is taken on in three steps:

1. first call: through the JIT, which compiles or finds the kernel and returns it;
2. second call: through the JIT again, with the kernel's launcher watched: the direct launch is used for the key
   only when the JIT's launcher call equals the one this module makes (grid, stream, the kernel's function and
   metadata, the launch hooks, the bound arguments in order: tensors by identity, the rest by type and value);
3. later calls: the kernel's launcher directly, with the positional arguments as given and the rest of the bound
   values (keywords and defaults: fixed by the key) as the JIT bound them.

Triton's launch hooks (``triton.knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``: empty ``HookChain``
objects on triton 3.6, which profilers fill) are read on every launch and passed on, with launch metadata built
whenever a hook would see it; the globals a kernel read when compiled are checked on every launch, as the JIT
checks them. Everything else takes the JIT as written: pre-run hooks, a stages-inspection hook, a callable grid,
an argument or meta value of another type (a tuple, a wrapper object), a constexpr passed by position, more than
:data:`MAX_KEYS` keys, a launcher another thread was checking, the interpreter (``TRITON_INTERPRET=1``: not a
``JITFunction``), a triton whose launcher call does not match, and every call while :data:`FAST_LAUNCH` is False.
One check runs at a time (a module lock), so two threads never take each other's watcher for the launcher.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import torch

#: Switch for the direct launch (True by default); False sends every launch through ``kernel[grid]``
#: (benchmarks/host/host_paths.py times both).
FAST_LAUNCH = True

#: Most call keys one kernel keeps; beyond them new keys take the JIT (a kernel called with a fresh int on every
#: call, e.g. a seed, must not grow the table without bound).
MAX_KEYS = 256

_VERIFY, _FAST, _JIT = 0, 1, 2
_LAUNCH_PREFIX = 9  # grid x 3, stream, function, packed metadata, launch metadata, enter hook, exit hook
_Tensor = torch.Tensor

_lock = threading.Lock()
_launchers: dict[int, "CachedLauncher"] = {}
_runtime: list[Any] = []  # knobs.runtime, knobs.HookChain, knobs.compilation: resolved once
_verify_lock = threading.Lock()  # one watched launch at a time: two would save each other's watcher as the launcher


def _jit_types() -> tuple[type, ...]:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # pragma: no cover - triton ships with torch's CUDA builds and our CPU test setup
        return ()
    return (JITFunction,)


def _knobs() -> tuple[Any, Any, Any]:
    """``(triton.knobs.runtime, triton.knobs.HookChain or None, triton.knobs.compilation or None)``, resolved
    once."""
    if not _runtime:
        from triton import knobs

        _runtime.extend([knobs.runtime, getattr(knobs, "HookChain", None), getattr(knobs, "compilation", None)])
    return _runtime[0], _runtime[1], _runtime[2]


def _launch_hooks() -> tuple[Any, Any]:
    """Triton's launch enter and exit hooks, read on every launch as the JIT reads them (a profiler or a library
    may set them at any time)."""
    rt = _knobs()[0]
    return rt.launch_enter_hook, rt.launch_exit_hook


_driver: list[Any] = []  # get_current_device, get_current_stream of triton's active driver, resolved once


def _device_and_stream() -> tuple[int, int]:
    if not _driver:
        from triton.runtime import driver

        _driver.extend([driver.active.get_current_device, driver.active.get_current_stream])
    device = _driver[0]()
    return device, _driver[1](device)


def _hook_is_empty(hook: Any) -> bool:
    """Whether calling ``hook`` does nothing: unset, or a ``HookChain`` with no hook in it (then nothing sees the
    launch metadata, and none is built)."""
    chain = _knobs()[1]
    return hook is None or (chain is not None and type(hook) is chain and not hook.calls)


#: Argument types keyed by type and value (anything else, e.g. a tuple or a wrapper object, takes the JIT).
_SCALARS = frozenset((int, bool, str, type(None)))


def _call_key(device: int, state: tuple, args: tuple, meta: dict[str, Any]) -> tuple | None:
    """The call key of a launch (module docstring), or None when an argument or meta value is of a type the direct
    launch does not take. A tensor is keyed by its dtype and 16-byte alignment (never held: the table must not keep
    memory alive), a float by its type, an int, bool, str or None by type and value; a meta value by type and
    value, a float one by its exact bits (``0.0`` and ``-0.0`` differ)."""
    # every direct launch builds its key: the commonest types are tested first, by identity, and an int is kept bare
    # (no other type's entry equals one: a bool's is a (bool, value) pair, a float's the float type); 1.5 us per
    # launch of the softmax forward's 16 arguments on the CI machine's CPU against 2.3 us with a pair for every int
    key: list[Any] = [device, state]
    append = key.append
    for a in args:
        t = type(a)
        if t is int:
            append(a)
        elif t is float:
            append(float)
        elif t is _Tensor or isinstance(a, _Tensor):
            append((a.dtype, not a.data_ptr() & 15))
        elif t in _SCALARS:
            append((t, a))
        else:
            return None
    for k, v in meta.items():
        t = type(v)
        if t is float:
            append((k, float, v.hex()))
        elif t in _SCALARS:
            append((k, t, v))
        else:
            return None
    return tuple(key)


def _jit_state() -> tuple | None:
    """The global Triton state the JIT folds into its own cache key on every call (debug, instrumentation, the
    fp-sanitiser casts), or None while a stages-inspection hook is set (its hash is the JIT's to ask for)."""
    rt, _, comp = _knobs()
    if getattr(rt, "add_stages_inspection_hook", None) is not None:
        return None
    return (rt.debug, getattr(comp, "instrumentation_mode", None), getattr(comp, "fpsan_homomorphic_casts", None))


def _check_globals(kernel: Any) -> None:
    """The JIT's check that the globals a kernel read when it was compiled still hold their values.

    Raises:
        RuntimeError: one has changed (the JIT's own message).
    """
    used = kernel.used_global_vals
    if used:
        missing = object()
        for (name, _), (val, globals_dict) in used.items():
            if (new := globals_dict.get(name, missing)) != val:
                raise RuntimeError(
                    f"Global variable {name} has changed since we compiled this kernel, from {val} to {new}")


class _Entry:
    """One call key's state: checking, direct (with the launcher, function, metadata and the bound values after the
    positional arguments), or JIT only (``why``)."""

    __slots__ = ("state", "kernel", "run", "function", "packed", "tail", "why")

    def __init__(self) -> None:
        self.state, self.kernel, self.why = _VERIFY, None, ""
        self.run = self.function = self.packed = None
        self.tail: tuple = ()


class CachedLauncher:
    """``CachedLauncher(kernel)[grid](*args, **meta)``: launches like ``kernel[grid](*args, **meta)`` (module
    docstring), with the JIT's binding skipped for call keys it has checked.

    Attributes:
        kernel: the ``triton.jit`` function.
        entries: call key -> its state (checking, direct, or JIT only with the reason).
        bypassed: launches sent to the JIT before any key was looked up, by reason.
    """

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.entries: dict[tuple, _Entry] = {}
        self.bypassed: collections.Counter[str] = collections.Counter()
        self._params = list(kernel.params)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **meta: Any) -> Any:
            return self.launch(grid, args, meta)

        return launch

    def bound_args(self, args: tuple, meta: dict[str, Any], constexprs: bool = True) -> list[Any] | None:
        """Every kernel parameter's value in the signature's order, as the JIT binds them (positional, then by
        keyword, then the default), the constexpr ones left out unless ``constexprs``; None when an argument is
        missing or there are too many."""
        params = self._params
        if len(args) > len(params):
            return None
        out = list(args)
        for p in params[len(args):]:
            if p.name in meta:
                out.append(meta[p.name])
            elif p.has_default:
                out.append(p.default)
            else:
                return None
        if not constexprs:
            out = [v for v, p in zip(out, params) if not p.is_constexpr]
        return out

    def launch(self, grid: Any, args: tuple, meta: dict[str, Any]) -> Any:
        """Launch ``kernel`` on ``grid`` (a tuple of 1-3 ints) with ``args`` and ``meta``; returns the compiled
        kernel, as ``kernel[grid]`` does."""
        kernel = self.kernel
        if not FAST_LAUNCH or type(grid) is not tuple or kernel.pre_run_hooks:
            self.bypassed[self._why_bypassed(grid)] += 1
            return kernel[grid](*args, **meta)
        state = _jit_state()
        if state is None:
            self.bypassed["a stages-inspection hook set"] += 1
            return kernel[grid](*args, **meta)
        device, stream = _device_and_stream()
        key = _call_key(device, state, args, meta)
        if key is None:
            self.bypassed["an argument of another type"] += 1
            return kernel[grid](*args, **meta)
        entry = self.entries.get(key)
        if entry is not None and entry.state == _FAST:
            _check_globals(kernel)
            n = len(grid)
            enter, leave = _launch_hooks()
            # as the JIT: launch metadata whenever an enter hook is set, unless no hook would see it
            md = None if enter is None or (_hook_is_empty(enter) and _hook_is_empty(leave)) else \
                entry.kernel.launch_metadata(grid, stream, *args, *entry.tail)
            entry.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, entry.function,
                      entry.packed, md, enter, leave, *args, *entry.tail)
            return entry.kernel
        if entry is None:
            if len(self.entries) >= MAX_KEYS:
                self.bypassed["too many call keys"] += 1
                return kernel[grid](*args, **meta)
            with _lock:
                entry = self.entries.setdefault(key, _Entry())
            compiled = kernel[grid](*args, **meta)
            if entry.kernel is None:
                entry.kernel = compiled
            return compiled
        if entry.state == _JIT:
            return kernel[grid](*args, **meta)
        return self._verify(entry, grid, stream, args, meta)

    def _why_bypassed(self, grid: Any) -> str:
        if not FAST_LAUNCH:
            return "FAST_LAUNCH off"
        if type(grid) is not tuple:
            return f"grid of type {type(grid).__name__}"
        return "pre-run hooks"

    def _verify(self, entry: _Entry, grid: tuple, stream: int, args: tuple, meta: dict[str, Any]) -> Any:
        """A launch through the JIT with the compiled kernel's launcher watched; the key goes direct when the JIT's
        launcher call is the one :meth:`launch` makes."""
        compiled = entry.kernel
        original = getattr(compiled, "run", None) if compiled is not None else None
        if original is None or not hasattr(compiled, "function") or not hasattr(compiled, "packed_metadata"):
            entry.state, entry.why = _JIT, "the JIT returned no compiled kernel with a launcher"
            return self.kernel[grid](*args, **meta)
        attr = "_run" if isinstance(vars(type(compiled)).get("run"), property) else "run"  # newer tritons: a property
        seen: list[tuple] = []

        def watch(*call: Any) -> Any:
            seen.append(call)
            return original(*call)

        with _verify_lock:
            if getattr(compiled, "run", None) != original:  # another thread's watch came and went meanwhile
                entry.state, entry.why = _JIT, "the launcher changed while it was checked"
                return self.kernel[grid](*args, **meta)
            try:
                setattr(compiled, attr, watch)
            except AttributeError:
                entry.state, entry.why = _JIT, "the compiled kernel's launcher cannot be watched"
                return self.kernel[grid](*args, **meta)
            try:
                result = self.kernel[grid](*args, **meta)
            finally:
                setattr(compiled, attr, original)
        # the launcher takes every parameter's value, or (some tritons) the non-constexpr ones only
        constexprs = len(seen) == 1 and len(seen[0]) - _LAUNCH_PREFIX == len(self._params)
        bound = self.bound_args(args, meta, constexprs)
        entry.why = self._mismatch(seen, compiled, grid, stream, bound)
        if not entry.why and any(p.is_constexpr for p in self._params[:len(args)]):
            entry.why = "a constexpr passed by position"  # a float one would be keyed by its type alone
        if not entry.why:
            entry.run, entry.function, entry.packed = original, compiled.function, compiled.packed_metadata
            entry.tail = tuple(bound[len(args):])
        entry.state = _JIT if entry.why else _FAST
        return result

    @staticmethod
    def _mismatch(seen: list[tuple], compiled: Any, grid: tuple, stream: int, bound: list[Any] | None) -> str:
        """Why the watched launcher call differs from the direct one ("" when it does not)."""
        if len(seen) != 1:
            return f"the JIT called a different kernel's launcher ({len(seen)} calls of the one kept)"
        call = seen[0]
        if bound is None or len(call) != _LAUNCH_PREFIX + len(bound):
            return "the launcher takes another argument list on this triton"
        full = tuple(grid) + (1,) * (3 - len(grid))
        if tuple(call[:3]) != full or call[3] != stream:
            return "another grid or stream"
        enter, leave = _launch_hooks()
        silent = enter is None or (_hook_is_empty(enter) and _hook_is_empty(leave))
        if call[4] is not compiled.function or call[5] is not compiled.packed_metadata or call[7] is not enter \
                or call[8] is not leave or (call[6] is None and not silent):
            return "launch metadata or hooks"
        for got, ours in zip(call[_LAUNCH_PREFIX:], bound):
            same = got is ours if isinstance(ours, torch.Tensor) else (type(got) is type(ours) and got == ours)
            if not same:
                return "the bound arguments differ"
        return ""


def cached_launcher(kernel: Any) -> Any:
    """The :class:`CachedLauncher` of ``kernel`` (one per kernel), or ``kernel`` itself when it is not a compiled
    ``triton.jit`` function (the interpreter's, an autotuner) or :data:`FAST_LAUNCH` is off."""
    if not FAST_LAUNCH:
        return kernel
    found = _launchers.get(id(kernel))
    if found is not None and found.kernel is kernel:
        return found
    jit = _jit_types()
    if not jit or not isinstance(kernel, jit):
        return kernel
    with _lock:
        found = _launchers.get(id(kernel))
        if found is None or found.kernel is not kernel:
            found = _launchers[id(kernel)] = CachedLauncher(kernel)
    return found
