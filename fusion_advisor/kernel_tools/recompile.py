"""Count just-in-time compilations inside a block, each with its cause: Triton kernels and torch.compile frames.

A kernel timed in its steady state must not compile: a Triton JIT compilation (tens to hundreds of ms) or a
dynamo recompilation (seconds) inside a timed loop makes the median meaningless, and in a model it repeats
whenever its cause repeats. :class:`RecompileWatch` counts both and says why each happened:

- **Triton**: Triton specializes every launch on its arguments (TRITON_RULES "Specialization and tuning"): an
  int equal to 1 becomes the constant 1, an int divisible by 16 and a 16-byte-aligned pointer carry a
  ``tt.divisibility=16`` attribute, ints of 2**31 and more become ``i64``, each dtype and each ``constexpr``
  value is its own variant. A new combination compiles a new variant. The watch installs
  ``triton.knobs.runtime.jit_post_compile_hook`` (present, with the same keyword arguments ``key``, ``repr``,
  ``fn``, ``compile``, in Triton 3.4 to 3.9 and checked in 3.6 and 3.9), chained to any hook already set, and
  compares the new variant's specialization (``compile["signature"]``, ``["constants"]``, ``["configs"][0]``,
  launch options) with the variants compiled before (the JITFunction's own kernel cache, and those any watch
  saw): the arguments that differ from the closest earlier variant are the cause. Under
  ``TRITON_INTERPRET=1`` nothing is compiled, and the report says Triton was not counted.
- **torch.compile (dynamo)**: every frame compilation is recorded by dynamo in
  ``torch._dynamo.utils.get_compilation_metrics()`` (torch 2.5 to 2.13) with ``recompile_reason``, the first
  failing guard (``"0/0: n == 0"``, ``"tensor 'x' size mismatch at index 0. expected 4, actual 8"``); the
  watch keeps the records that appeared inside it. A frame compiled for the first time has no reason and is
  reported as a first compilation.

Example::

    with RecompileWatch() as watch:
        for _ in range(100):
            step()
    print(watch.report.triton_compiles, watch.report.dynamo_recompiles, watch.report.causes())
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

#: Why Triton compilations are not counted under the interpreter.
TRITON_INTERPRETED_NOTE = "not counted under the Triton interpreter (TRITON_INTERPRET=1): nothing is compiled"

#: Earlier variants remembered per kernel (beyond those in the JITFunction's own cache).
_HISTORY_LIMIT = 64

#: Launch options whose change compiles a new variant, in the order reported.
_OPTION_KEYS = ("num_warps", "num_stages", "num_ctas")

_INT_TYPES = frozenset({"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"})


# --- Triton: specializations and their differences ------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """How Triton specialized one kernel argument in one compiled variant.

    Attributes:
        type: Triton's signature type: ``"*fp32"`` (pointer to fp32), ``"i32"``, ``"i64"``, ``"fp32"``,
            ``"constexpr"`` (a declared ``tl.constexpr``, or an int equal to 1, or ``None``).
        value: the constant's value as text when ``type == "constexpr"``, else ``None``.
        attrs: Triton's compile attributes of the argument, e.g. ``(("tt.divisibility", 16),)``: an int
            divisible by 16, or a pointer aligned to 16 bytes.
        declared_constexpr: the kernel declares the argument ``tl.constexpr`` (a new value is a new variant
            by design).
    """

    type: str
    value: str | None = None
    attrs: tuple[tuple[str, Any], ...] = ()
    declared_constexpr: bool = False

    @property
    def divisible_by_16(self) -> bool:
        """The ``tt.divisibility=16`` attribute: int % 16 == 0, or pointer address % 16 == 0."""
        return any(name == "tt.divisibility" and value == 16 for name, value in self.attrs)

    @property
    def is_pointer(self) -> bool:
        return self.type.startswith("*")

    @property
    def is_specialized_one(self) -> bool:
        """An int argument Triton turned into the constant 1 (its value was 1 at launch)."""
        return self.type == "constexpr" and not self.declared_constexpr and self.value == "1"

    def describe(self) -> str:
        """Short text: ``"*fp32, 16-byte aligned"``, ``"i32, divisible by 16"``, ``"== 1 (constant)"``."""
        if self.type == "constexpr":
            if self.is_specialized_one:
                return "== 1 (specialized to the constant 1)"
            return f"constexpr {self.value}"
        if self.is_pointer:
            return f"{self.type}, {'16-byte aligned' if self.divisible_by_16 else 'not 16-byte aligned'}"
        if self.type in _INT_TYPES:
            return f"{self.type}, {'divisible by 16' if self.divisible_by_16 else 'not divisible by 16'}"
        extra = [f"{k}={v}" for k, v in self.attrs]
        return self.type + (f" ({', '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class TritonVariant:
    """One compiled variant of a Triton kernel: its specialization, argument by argument, and launch options.

    Attributes:
        kernel: ``module.qualname`` of the ``@triton.jit`` function.
        params: argument name (``"x_ptr"``, or ``"args[1]"`` inside a tuple argument) -> :class:`ParamSpec`,
            in the kernel's argument order.
        options: ``num_warps``, ``num_stages``, ``num_ctas`` where known.
    """

    kernel: str
    params: dict[str, ParamSpec]
    options: dict[str, Any] = field(default_factory=dict)


def _as_path(key: Any) -> tuple[int, ...] | None:
    if isinstance(key, int):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(i, int) for i in key):
        return key
    return None


def _value_text(value: Any) -> str:
    inner = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
    return str(inner)


def variant_from_compile(kernel: str, signature: dict[str, Any], constants: dict[Any, Any] | None = None,
                         attrs: dict[Any, Any] | None = None, options: dict[str, Any] | None = None,
                         declared_constexpr: Iterable[str] = ()) -> TritonVariant:
    """Build a :class:`TritonVariant` from what Triton hands its compile hooks (or keeps in ``CompiledKernel.src``).

    Args:
        kernel: the kernel's name.
        signature: argument name -> type (``"*fp32"``, ``"i32"``, ``"constexpr"``), in argument order.
        constants: path (``(index,)``, or ``(index, j)`` inside a tuple argument) -> value, for every
            ``constexpr`` entry of the signature.
        attrs: path -> list of ``[attribute, value]`` pairs (``[["tt.divisibility", 16]]``).
        options: launch options (``num_warps``, ...); others are ignored.
        declared_constexpr: names of the arguments the kernel declares ``tl.constexpr``.
    """
    names = list(signature)
    declared = set(declared_constexpr)
    constants = constants or {}
    attrs = attrs or {}

    def name_of(path: tuple[int, ...]) -> str | None:
        if path[0] >= len(names):
            return None
        return names[path[0]] + "".join(f"[{i}]" for i in path[1:])

    values: dict[str, str] = {}
    for key, value in constants.items():
        path = _as_path(key) if not isinstance(key, str) else (names.index(key),) if key in names else None
        if path is not None and (n := name_of(path)) is not None:
            values[n] = _value_text(value)
    attributes: dict[str, tuple[tuple[str, Any], ...]] = {}
    for key, pairs in attrs.items():
        path = _as_path(key)
        if path is None or (n := name_of(path)) is None:
            continue
        attributes[n] = tuple(sorted((str(p[0]), p[1]) for p in pairs if isinstance(p, (list, tuple)) and len(p) == 2))
    params: dict[str, ParamSpec] = {}
    for n, ty in signature.items():
        ty = str(ty)
        params[n] = ParamSpec(ty, values.get(n) if ty == "constexpr" else None, attributes.get(n, ()), n in declared)
    for n in sorted(set(values) | set(attributes)):  # entries inside tuple arguments
        if n not in params:
            params[n] = ParamSpec("constexpr" if n in values else "", values.get(n), attributes.get(n, ()))
    opts = {k: (options or {})[k] for k in _OPTION_KEYS if k in (options or {})}
    return TritonVariant(kernel, params, opts)


def _param_cause(name: str, old: ParamSpec | None, new: ParamSpec | None) -> str:
    """One sentence on why ``name``'s specialization change compiles a new variant, and what to do about it."""
    if old is None or new is None:
        return f"{name}: argument {'added' if old is None else 'removed'}"
    change = f"{name}: {old.describe()} -> {new.describe()}"
    if old.is_specialized_one or new.is_specialized_one:
        return (f"{change}: Triton specializes an int argument equal to 1 into a constant; if its value varies "
                f"at runtime, list {name} in do_not_specialize")
    if old.type != new.type:
        if old.type in _INT_TYPES and new.type in _INT_TYPES:
            return f"{change}: the value crossed 2**31, so the argument became 64-bit"
        if old.is_pointer and new.is_pointer:
            return f"{change}: a new dtype is a new variant, by design"
        return f"{change}: the argument's type changed"
    if old.type == "constexpr":
        return f"{change}: a new constexpr value is a new variant, by design (autotuning, a heuristic, a launch " \
               f"argument)"
    if old.divisible_by_16 != new.divisible_by_16:
        if new.is_pointer:
            return (f"{change}: pointer alignment is specialized; an offset view (x[1:], x[:, 3:]) gives a new "
                    f"variant; pass 16-byte-aligned tensors, or list {name} in do_not_specialize_on_alignment")
        return (f"{change}: Triton specializes ints on divisibility by 16; keep that for sizes and strides that "
                f"enable vectorized loads, otherwise list {name} in do_not_specialize")
    return f"{change}: its compile attributes changed"


def diff_variants(old: TritonVariant, new: TritonVariant) -> list[str]:
    """Causes, one per argument or launch option whose specialization differs between ``old`` and ``new``."""
    causes = [_param_cause(n, old.params.get(n), new.params.get(n))
              for n in list(new.params) + [n for n in old.params if n not in new.params]
              if old.params.get(n) != new.params.get(n)]
    for k in _OPTION_KEYS:
        if k in old.options and k in new.options and old.options[k] != new.options[k]:
            causes.append(f"{k}: {old.options[k]} -> {new.options[k]} (a launch option; a new variant, by design)")
    return causes


def explain_compile(new: TritonVariant, earlier: Sequence[TritonVariant]) -> tuple[bool, str, list[str]]:
    """Why ``new`` was compiled, given the variants of the same kernel compiled ``earlier``.

    Returns:
        ``(recompile, cause, changed)``: ``recompile`` is False for a kernel's first variant; ``changed`` holds
        one cause per differing argument against the closest earlier variant (fewest differences), and
        ``cause`` joins them.
    """
    if not earlier:
        return False, f"first compilation of {new.kernel} in this process", []
    best = min((diff_variants(old, new) for old in earlier), key=len)
    if not best:
        return True, "same specialization as an earlier variant (a cleared cache or a changed kernel source)", []
    return True, "; ".join(best), best


# --- events and the report ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileEvent:
    """One compilation seen by a :class:`RecompileWatch`.

    Attributes:
        kind: ``"triton"`` (a JIT-compiled Triton kernel variant) or ``"dynamo"`` (a torch.compile frame).
        name: the kernel (``module.qualname``) or the frame (``"f (model.py:12)"``).
        recompile: False for the first compilation of that kernel or frame in this process.
        cause: why it compiled: the changed specialization, or the failed guard.
        changed: Triton: one cause per changed argument/option; empty for dynamo.
    """

    kind: str
    name: str
    recompile: bool
    cause: str
    changed: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "recompile": self.recompile, "cause": self.cause,
                "changed": list(self.changed)}


@dataclass
class RecompileReport:
    """What a :class:`RecompileWatch` saw.

    Attributes:
        triton_counted: Triton compilations were counted (False under the interpreter, or on a Triton
            without ``knobs.runtime.jit_post_compile_hook``); ``triton_note`` says why not.
        dynamo_counted: torch.compile frame compilations were counted; ``dynamo_note`` says why not, or that
            some may have been missed.
        events: every compilation: Triton's in the order they happened, then dynamo's in theirs.
    """

    triton_counted: bool
    dynamo_counted: bool
    triton_note: str = ""
    dynamo_note: str = ""
    events: list[CompileEvent] = field(default_factory=list)

    @property
    def triton_compiles(self) -> int | None:
        """Triton kernel variants compiled; ``None`` when not counted."""
        return sum(e.kind == "triton" for e in self.events) if self.triton_counted else None

    @property
    def dynamo_compiles(self) -> int | None:
        """torch.compile frames compiled (first compilations and recompilations); ``None`` when not counted."""
        return sum(e.kind == "dynamo" for e in self.events) if self.dynamo_counted else None

    @property
    def dynamo_recompiles(self) -> int | None:
        """torch.compile frames recompiled after a guard failed; ``None`` when not counted."""
        return sum(e.kind == "dynamo" and e.recompile for e in self.events) if self.dynamo_counted else None

    def causes(self) -> list[str]:
        """``"kind name: cause"`` for every event."""
        return [f"{e.kind} {e.name}: {e.cause}" for e in self.events]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the counts (``None`` = not counted), the notes and the events."""
        return {"triton_compiles": self.triton_compiles, "dynamo_compiles": self.dynamo_compiles,
                "dynamo_recompiles": self.dynamo_recompiles, "triton_note": self.triton_note or None,
                "dynamo_note": self.dynamo_note or None, "events": [e.to_dict() for e in self.events]}


def summarize(reports: dict[str, RecompileReport]) -> dict[str, Any]:
    """Totals over several watched phases (``{"kernel": report, ...}``) and each phase's report, JSON-ready.

    ``triton_compiles`` / ``dynamo_compiles`` are ``None`` when no phase counted them.
    """
    def total(attr: str) -> int | None:
        vals = [getattr(r, attr) for r in reports.values() if getattr(r, attr) is not None]
        return sum(vals) if vals else None

    return {"triton_compiles": total("triton_compiles"), "dynamo_compiles": total("dynamo_compiles"),
            "dynamo_recompiles": total("dynamo_recompiles"),
            "phases": {name: r.to_dict() for name, r in reports.items()}}


# --- Triton hook ----------------------------------------------------------------------------------------------

#: Variants seen by any watch, per kernel: the earlier variants when a kernel's own cache cannot be read.
_seen: dict[str, list[TritonVariant]] = {}


def _triton_knobs_runtime() -> Any | None:
    try:
        from triton import knobs
    except Exception:  # noqa: BLE001 - no triton, or one without knobs (< 3.4): Triton is then not counted
        return None
    runtime = getattr(knobs, "runtime", None)
    return runtime if runtime is not None and hasattr(runtime, "jit_post_compile_hook") else None


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _declared_constexpr(jit_fn: Any) -> list[str]:
    names = list(getattr(jit_fn, "arg_names", []) or [])
    return [names[i] for i in getattr(jit_fn, "constexprs", []) or [] if isinstance(i, int) and i < len(names)]


def _cached_variants(jit_fn: Any, device: Any, kernel: str, exclude_key: Any) -> list[TritonVariant]:
    """Variants already in ``jit_fn``'s kernel cache for ``device`` (``device_caches[device][0]``: key ->
    ``CompiledKernel`` whose ``src`` is the ``ASTSource`` with ``signature``, ``constants``, ``attrs``)."""
    caches = getattr(jit_fn, "device_caches", None)
    try:
        entry = caches.get(device) if caches is not None else None
        kernel_cache = entry[0] if entry else {}
        items = list(kernel_cache.items())
    except Exception:  # noqa: BLE001 - another Triton layout: fall back to the variants the watches saw
        return []
    declared = _declared_constexpr(jit_fn)
    out = []
    for key, compiled in items:
        src = getattr(compiled, "src", None)
        if key == exclude_key or not isinstance(getattr(src, "signature", None), dict):
            continue
        meta = getattr(compiled, "metadata", None)
        options = {k: getattr(meta, k) for k in _OPTION_KEYS if hasattr(meta, k)}
        out.append(variant_from_compile(kernel, src.signature, getattr(src, "constants", None),
                                        getattr(src, "attrs", None), options, declared))
    return out


def record_triton_compile(events: list[CompileEvent], key: Any, fn: Any, compile: dict[str, Any]) -> None:
    """Turn one ``jit_post_compile_hook`` call into a :class:`CompileEvent` appended to ``events``.

    ``fn`` is Triton's ``JitFunctionInfo`` (``module``, ``name``, ``jit_function``); ``compile`` holds
    ``signature``, ``constants``, ``configs`` (``[attrs]``), ``device`` and the launch options. A call whose
    arguments cannot be read is still counted, with the reason.
    """
    if not isinstance(compile, dict):  # torch._inductor calls the hook with its CompiledKernel (opt-in)
        name = getattr(compile, "name", None) or getattr(fn, "__name__", None) or "?"
        events.append(CompileEvent("triton", str(name), True, "compiled outside Triton's JIT launcher (an "
                                   "Inductor-generated kernel): its specialization is not read"))
        return
    kernel = f"{getattr(fn, 'module', '?')}.{getattr(fn, 'name', '?')}"
    try:
        jit_fn = getattr(fn, "jit_function", None)
        configs = compile.get("configs") or [{}]
        new = variant_from_compile(kernel, dict(compile["signature"]), compile.get("constants"), configs[0],
                                   compile, _declared_constexpr(jit_fn))
        earlier = _cached_variants(jit_fn, compile.get("device"), kernel, key)
        earlier += [v for v in _seen.get(kernel, []) if v not in earlier]
        recompile, cause, changed = explain_compile(new, earlier)
        history = _seen.setdefault(kernel, [])
        history.append(new)
        del history[:-_HISTORY_LIMIT]
    except Exception as e:  # noqa: BLE001 - the compile is counted even when its specialization is unreadable
        recompile, cause, changed = True, f"cause unknown (could not read the compile info: {type(e).__name__}: {e})", []
    events.append(CompileEvent("triton", kernel, recompile, cause, tuple(changed)))


# --- dynamo ---------------------------------------------------------------------------------------------------


def _dynamo_metrics() -> list[Any] | None:
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except Exception:  # noqa: BLE001 - a torch without it: dynamo is then not counted, and the report says so
        return None
    return list(get_compilation_metrics())


def clean_guard_reason(reason: str) -> str:
    """Dynamo's ``recompile_reason`` as one line.

    ``"0/0: n == 0      # f.py:4 in f\\nUser stack trace: ..."`` -> ``"n == 0 (guard of compile 0/0, at f.py:4
    in f)"``; ``"0/1: tensor 'x' size mismatch at index 0. expected 4, actual 8"`` keeps its text.
    """
    first = reason.split("User stack trace:")[0].strip().splitlines()
    text = " ".join(line.strip() for line in first if line.strip())
    m = re.match(r"^(\d+/\d+):\s*(.*)$", text)
    compile_id, text = (m.group(1), m.group(2)) if m else ("", text)
    guard, _, where = text.partition("#")
    where = re.sub(r"^[#\s]+", "", where).strip()
    extra = ", ".join(p for p in (f"guard of compile {compile_id}" if compile_id else "",
                                  f"at {where}" if where else "") if p)
    return " ".join(guard.split()) + (f" ({extra})" if extra else "")


def _dynamo_event(metric: Any) -> CompileEvent:
    name = str(getattr(metric, "co_name", None) or "?")
    filename = getattr(metric, "co_filename", None)
    if filename:
        name += f" ({os.path.basename(str(filename))}:{getattr(metric, 'co_firstlineno', '?')})"
    if getattr(metric, "is_forward", True) is False:
        return CompileEvent("dynamo", f"backward of {name}", False, "backward graph compiled (at its first backward)")
    reason = getattr(metric, "recompile_reason", None)
    if reason:
        return CompileEvent("dynamo", name, True, clean_guard_reason(str(reason)))
    return CompileEvent("dynamo", name, False, "first compilation of this frame")


# --- the context manager --------------------------------------------------------------------------------------


class RecompileWatch:
    """Context manager counting Triton JIT compilations and torch.compile frame compilations inside it.

    Args:
        triton: count Triton compilations (installs ``knobs.runtime.jit_post_compile_hook`` for the block,
            chained to the hook already set, which is restored on exit).
        dynamo: count torch.compile (dynamo) frame compilations.

    After the block, :attr:`report` is a :class:`RecompileReport`. Never raises for its own bookkeeping: what
    cannot be counted is reported as not counted, with the reason.
    """

    def __init__(self, triton: bool = True, dynamo: bool = True):
        self._want_triton = triton
        self._want_dynamo = dynamo
        self._events: list[CompileEvent] = []
        self._runtime: Any = None
        self._previous_hook: Any = None
        self._hook: Any = None
        self._before: list[Any] = []
        self.report = RecompileReport(triton_counted=False, dynamo_counted=False)

    def __enter__(self) -> RecompileWatch:
        report = self.report
        if not self._want_triton:
            report.triton_note = "not watched"
        elif _interpreted():
            report.triton_note = TRITON_INTERPRETED_NOTE
        elif (runtime := _triton_knobs_runtime()) is None:
            report.triton_note = ("not counted: this Triton has no knobs.runtime.jit_post_compile_hook "
                                  "(Triton 3.4 or newer has it), or Triton is not installed")
        else:
            self._install(runtime)
            report.triton_counted = True
        if not self._want_dynamo:
            report.dynamo_note = "not watched"
        else:
            before = _dynamo_metrics()
            if before is None:
                report.dynamo_note = "not counted: this torch has no torch._dynamo.utils.get_compilation_metrics"
            else:
                self._before = before  # kept referenced, so no new record can reuse an old one's id
                report.dynamo_counted = True
        return self

    def _install(self, runtime: Any) -> None:
        previous = runtime.jit_post_compile_hook
        events = self._events

        def hook(*, key: Any, repr: Any = None, fn: Any = None, compile: Any = None, **kwargs: Any) -> Any:
            result = previous(key=key, repr=repr, fn=fn, compile=compile, **kwargs) if previous is not None else None
            record_triton_compile(events, key, fn, {} if compile is None else compile)
            return result

        self._runtime, self._previous_hook, self._hook = runtime, previous, hook
        runtime.jit_post_compile_hook = hook

    def __exit__(self, *exc: Any) -> None:
        if self._runtime is not None and self._runtime.jit_post_compile_hook is self._hook:
            self._runtime.jit_post_compile_hook = self._previous_hook
        self._runtime = None
        events = list(self._events)
        if self.report.dynamo_counted:
            after = _dynamo_metrics() or []
            old = {id(m) for m in self._before}
            new = [m for m in after if id(m) not in old]
            maxlen = _dynamo_metrics_maxlen()
            if maxlen is not None and len(new) >= maxlen:
                self.report.dynamo_note = (f"at least {len(new)}: dynamo keeps only its last {maxlen} compilation "
                                           "records, so some may be missing")
            events += [_dynamo_event(m) for m in new]
            self._before = []
        self.report.events = events


def _dynamo_metrics_maxlen() -> int | None:
    try:
        from torch._dynamo import utils
    except Exception:  # noqa: BLE001
        return None
    return getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)
