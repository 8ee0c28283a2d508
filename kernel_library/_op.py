"""Library ops: a ``torch.library.triton_op`` for torch.compile, export and tracing, plus a direct eager path.

Every kernel module declares its ops with :func:`library_op` instead of ``torch.library.triton_op`` and launches its
kernels through :func:`launcher` instead of ``torch.library.wrap_triton``. The op is registered exactly as
``triton_op`` registers it (``torch.ops.fusion_advisor.<name>``, fake impl, autograd), so torch.compile sees and
fuses it the same way. What changes is an eager call with plain tensors: it runs the implementation directly (under
an ``autograd.Function`` built from the op's own ``setup_context`` / ``backward`` when a gradient is needed), not
through the dispatcher.

Why: host time. On the H200 host (torch 2.11, Python 3.12) one call through a custom op cost ~190 us against ~33 us
for the Triton launch alone (``benchmarks/results/h200/host/launch_overhead.json``: the dispatcher's autograd and
backend hops, ``torch._dynamo.disable`` around the implementation, the aliasing check), so a forward + backward of a
norm took ~1 ms of host time for ~0.1 ms of GPU work at Llama-7B shapes. PyTorch measured the same cost
(pytorch/pytorch#188077) and proposed the same remedy for ``custom_op`` itself (pytorch/pytorch#178216: an
``is_compiling()`` check, then an ``autograd.Function``).

The direct path is taken only when nothing needs the dispatcher (:func:`direct_mode`): not while Dynamo or
``torch.jit.trace`` traces, no ``TorchDispatchMode`` (FakeTensorMode, FlopCounterMode, functionalization) or
functorch transform active, every tensor argument a plain ``torch.Tensor`` / ``nn.Parameter`` and none on the
``meta`` device. Everything else takes the registered op, as before; so does a call that needs a gradient from an
op without an autograd formula.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterable, Iterator

import torch

from kernel_library._launch import cached_launcher

_state = threading.local()

#: Switch for the direct path (True by default); False sends every call through the registered op, as a plain
#: ``triton_op`` would (benchmarks/host/host_overhead.py times both).
DIRECT_EAGER = True

_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing
_functorch_active = torch._C._are_functorch_transforms_active
_dispatch_stack_len = torch._C._len_torch_dispatch_stack  # a TorchDispatchMode is active when > 0
_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


def launcher(kernel: Any) -> Any:
    """The launchable form of the Triton ``kernel`` for the current call: on a direct eager call ``kernel``
    through its :class:`kernel_library._launch.CachedLauncher` (the JIT's per-call binding skipped once checked),
    else ``torch.library.wrap_triton(kernel)`` (which a traced call records as a graph node, and which is a plain
    launch inside the op's own eager implementation). Use as ``launcher(kernel)[grid](*args, **meta)``."""
    if getattr(_state, "direct", False):
        return cached_launcher(kernel)
    return torch.library.wrap_triton(kernel)


def direct_call() -> bool:
    """Whether the running implementation was entered on the direct eager path (plain tensors, concrete shapes):
    then a kernel module may reuse what it computed for an earlier call of the same geometry (a launch plan)."""
    return getattr(_state, "direct", False)


#: :func:`direct_mode`'s answers.
REGISTERED, DIRECT, DIRECT_GRAD = 0, 1, 2


def direct_mode(args: Iterable[Any]) -> int:
    """How an op call with ``args`` runs: :data:`REGISTERED` (through the registered op) unless :data:`DIRECT_EAGER`
    is set, the call is eager (not traced by Dynamo or ``torch.jit.trace``), no ``TorchDispatchMode`` or functorch
    transform is active and every tensor in ``args`` is a plain ``torch.Tensor`` or ``nn.Parameter`` not on the
    ``meta`` device; then :data:`DIRECT_GRAD` when grad mode is on and a tensor requires grad, else :data:`DIRECT`.
    """
    # every eager library call runs this: the checks are bound to module names (_is_compiling...), ordered cheapest
    # first, and the arguments are walked once (host time, issue 16)
    if not DIRECT_EAGER or _is_compiling() or _is_tracing() or getattr(_state, "registered_only", False):
        return REGISTERED
    if _dispatch_stack_len() or _functorch_active():
        return REGISTERED
    grad = False
    for a in args:
        t = type(a)
        if t is _Tensor or t is _Parameter:
            if a.is_meta:
                return REGISTERED
            grad = grad or a.requires_grad
        elif isinstance(a, _Tensor):  # a subclass: FakeTensor, FunctionalTensor, DTensor...
            return REGISTERED
    return DIRECT_GRAD if grad and _grad_enabled() else DIRECT


def direct_call_ok(args: Iterable[Any]) -> bool:
    """True when an op call with ``args`` can skip the dispatcher (:func:`direct_mode` is not
    :data:`REGISTERED`)."""
    return direct_mode(args) != REGISTERED


@contextlib.contextmanager
def registered_ops_only() -> Iterator[None]:
    """Inside the block every library op call goes through the registered op, never the direct path.

    Tracing with ``make_fx(pre_dispatch=True)`` on real tensors pushes its proxy mode on the pre-dispatch stack,
    which :func:`direct_call_ok` does not see: a direct call would launch the kernel eagerly, unseen by the
    tracer, and the traced graph would keep only the output's allocation (``empty_like``) — an uninitialised
    tensor in place of the kernel's result. apply traces its replacements inside this block.
    """
    previous = getattr(_state, "registered_only", False)
    _state.registered_only = True
    try:
        yield
    finally:
        _state.registered_only = previous


class LibraryOp:
    """A Triton-backed ``torch.library`` op with a direct eager path (see the module docstring).

    Attributes:
        op: the ``torch.library.triton_op`` (a ``CustomOpDef``; a plain ``custom_op`` when the op declares a
            ``fake``, see :func:`library_op`); ``torch.ops.fusion_advisor.<name>`` is its overload.
        impl: the implementation (the decorated function), run by both paths.
    """

    def __init__(self, name: str, impl: Callable, mutates_args: Iterable[str] | str, fake: Callable | None = None):
        self.name = name
        self.impl = impl
        if fake is None:
            self.op = torch.library.triton_op(name, mutates_args=mutates_args)(impl)
        else:  # opaque: torch.compile calls the implementation as one op instead of tracing into it
            self.op = torch.library.custom_op(name, mutates_args=mutates_args)(impl)
            self.op.register_fake(fake)
        params = list(inspect.signature(impl).parameters)
        mutated = () if mutates_args == "unknown" else tuple(mutates_args)
        self._mutated_positions = tuple(params.index(m) for m in mutated)
        self._function: type[torch.autograd.Function] | None = None
        functools.update_wrapper(self, impl)

    def register_autograd(self, backward: Callable, *, setup_context: Callable) -> None:
        """Register ``backward(ctx, *grads)`` and ``setup_context(ctx, inputs, output)`` with the op (as
        ``CustomOpDef.register_autograd``) and build the ``autograd.Function`` the direct path uses from the same
        two functions."""
        self.op.register_autograd(backward, setup_context=setup_context)
        run = self._run_direct

        # forward(ctx, *args) calling setup_context itself, not a separate setup_context staticmethod: with one,
        # Function.apply binds default arguments through inspect.signature on every call (~50 us on the H200 host, torch
        # 2.11; benchmarks/results/h200/host/autograd_probe_signature_bind.json). Every argument is passed, so nothing
        # to bind.
        def forward(ctx, *args):
            output = run(*args)
            setup_context(ctx, args, output)
            return output

        self._function = type(
            f"{self.impl.__name__}_function",
            (torch.autograd.Function,),
            {"forward": staticmethod(forward), "backward": staticmethod(backward)},
        )

    def _run_direct(self, *args: Any) -> Any:
        previous = getattr(_state, "direct", False)
        _state.direct = True
        try:
            return self.impl(*args)
        finally:
            _state.direct = previous

    def __call__(self, *args: Any) -> Any:
        """Run the op on positional ``args`` (every argument passed; the signature of the decorated function)."""
        mode = direct_mode(args)
        if mode == REGISTERED:
            return self.op(*args)
        if mode == DIRECT_GRAD:
            if self._function is None:
                # no autograd formula (a backward op differentiated again, e.g. create_graph=True): the registered
                # op says so when its output is differentiated; a direct call would return a silent constant
                return self.op(*args)
            return self._function.apply(*args)
        out = self._run_direct(*args)
        for i in self._mutated_positions:  # as the dispatcher does for a mutating op: autograd sees the write
            torch.autograd.graph.increment_version(args[i])
        return out


def library_op(name: str, *, mutates_args: Iterable[str] | str,
               fake: Callable | None = None) -> Callable[[Callable], LibraryOp]:
    """Decorator: ``@library_op("fusion_advisor::x", mutates_args={})`` over the implementation, in place of
    ``@torch.library.triton_op`` (same arguments; the implementation launches through :func:`launcher`).

    ``fake``: a fake-tensor implementation (the outputs' shapes and dtypes from the inputs'). With it the op is a
    plain ``torch.library.custom_op``, opaque to torch.compile: Inductor calls the implementation as one op at run
    time instead of tracing into its Python. For ops whose host code loops over chunks and accumulates in place
    (``linear_cross_entropy``): traced into, the loop is functionalised, every in-place accumulation becomes a new
    buffer, and on the H200 the Llama-3-8B-width step under torch.compile peaked at 14.61 GiB against 11.40 GiB
    eagerly (``benchmarks/results/h200/kernels/lce_liger.md``)."""

    def wrap(impl: Callable) -> LibraryOp:
        return LibraryOp(name, impl, mutates_args, fake)

    return wrap
