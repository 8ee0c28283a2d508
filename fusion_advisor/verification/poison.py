"""Memory guards around a kernel call: poisoned allocations in poisoned redzones, and the input-mutation check.

:class:`PoisonAllocations` fills every ``torch.empty`` / ``empty_like`` / ``new_empty`` / ``empty_strided`` result
with poison (NaN for floating dtypes, :func:`poison_value` for integers and bools), also inside ``torch.library``
custom ops such as ``triton_op``\\ s: an element the kernel forgets to write is then NaN on every device and every
run, never stale memory that happens to hold the right value. Each allocation sits between poisoned guards
(:data:`REDZONE_BYTES`), so a store past its end (a mask off by one) is seen even under Triton's interpreter.
:func:`snapshot` and :func:`modified_inputs` catch a kernel that writes into its inputs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fusion_advisor.verification.trees import describe, first_true, unravel

#: Namespaces of PyTorch's own ops; any other ``torch.ops`` namespace is a custom op whose Python implementation
#: :class:`PoisonAllocations` enters, so its allocations are poisoned too.
_TORCH_NAMESPACES = frozenset({"aten", "prim", "prims", "quantized", "profiler", "c10d", "_c10d_functional"})


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



# --- inputs left as they were -------------------------------------------------------------------------------


def snapshot(x: Any) -> Any:
    """A detached copy of an input, taken before the kernel runs; it keeps the ``requires_grad`` flag."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def modified_inputs(current: list[tuple[str, Any]], before: list[tuple[str, Any]], when: str) -> list[str]:
    """Lines naming each input tensor of ``current`` (``(label, tensor)``) that differs from its snapshot in
    ``before`` (NaN equal to NaN); ``when`` says by what (``"by kernel_fn"``)."""
    lines = []
    for (lab, now), (_, was) in zip(current, before):
        if not isinstance(now, torch.Tensor):
            continue
        now = now.detach()
        if now.shape != was.shape or now.dtype != was.dtype:
            lines.append(f"{lab} was modified in place {when}: now {describe(now)}, was {describe(was)}")
            continue
        same = now == was
        if now.is_floating_point() or now.is_complex():
            same |= torch.isnan(now) & torch.isnan(was)
        n_changed, first = first_true(~same)
        if n_changed:
            lines.append(
                f"{lab} was modified in place {when}: {n_changed} of {now.numel()} elements changed "
                f"(first at index {unravel(first, now.shape)}: {was.reshape(-1)[first].item()} -> "
                f"{now.reshape(-1)[first].item()}); kernels must not mutate their inputs"
            )
    return lines
