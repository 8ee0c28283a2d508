"""Where a softmax call's host time goes, layer by layer, ours beside Liger-Kernel's (issue 16: host time per call no
higher than Liger's; softmax is the op where ours is behind).

Each row is one no-argument callable on a tiny bf16 input (4 x 256), timed side by side with the others
(``benchmarks.common.interleaved_per_call_us``: ``--calls`` back-to-back calls, median of ``--repeats`` rounds):

- ``ours fwd`` / ``liger fwd``: the whole forward under ``torch.no_grad()`` (ours: the registered replacement);
- ``ours fwd_grad`` / ``liger fwd_grad``: the same recording the graph (the ``autograd.Function``), output dropped;
- ``ours launch fn``: ``_softmax_fwd_launch`` alone (argument checks, allocation, reshape, the Triton launch);
- ``ours kernel[grid]`` / ``liger kernel[grid]``: the Triton launch alone, with the arguments each library passes
  (ours 17, Liger's 7);
- ``ours kernel direct``: our launch through ``kernel_library._launch.CachedLauncher`` once it goes direct;
- ``Function 4 args`` / ``Function 1 arg``: an ``autograd.Function`` whose forward allocates its output and
  launches nothing, applied to ``(x, 1.0, None, False)`` / ``(x,)``, with the graph recorded;
- ``torch.empty`` / ``x.reshape``: one allocation and one view of the same size;
- ``ours fwd+bwd`` / ``liger fwd+bwd``: the forward and ``torch.autograd.grad`` to ``x`` (the backward runs on the
  autograd engine's device thread);
- ``ours bwd op`` / ``ours bwd launch fn`` / ``liger bwd fn``: the backward's op call, our launch function (direct)
  and Liger's ``_softmax_backward``, called on the main thread;
- ``Function 4 args fwd+bwd`` / ``Function 1 arg fwd+bwd``: the launch-free Functions above through
  ``torch.autograd.grad``: the engine's own cost.

    python benchmarks/host/softmax_layers.py --out DIR [--calls 200] [--repeats 15]
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import gpu_probe_args, interleaved_per_call_us  # noqa: E402
from benchmarks.kernels import lce_liger  # noqa: E402
from kernel_library import _launch, _op, softmax  # noqa: E402


class _Alloc4(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, mask, causal):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g), None, None, None


class _Alloc1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g)


def _recorded_launch(kernel: Any, run: Callable[[], Any]) -> tuple[tuple, tuple, dict]:
    """``(grid, args, meta)`` of the ``kernel[grid](*args, **meta)`` call ``run()`` makes (the JIT path)."""
    seen: dict[str, Any] = {}
    original = type(kernel).__getitem__

    def spy(self, grid):
        launch = original(self, grid)

        def wrapped(*a, **kw):
            if self is kernel:
                seen.update(grid=grid, a=a, kw=kw)
            return launch(*a, **kw)
        return wrapped

    type(kernel).__getitem__ = spy
    fast = _launch.FAST_LAUNCH
    _launch.FAST_LAUNCH = False
    try:
        run()
    finally:
        type(kernel).__getitem__ = original
        _launch.FAST_LAUNCH = fast
    return seen["grid"], seen["a"], seen["kw"]


def callables(liger: Any) -> dict[str, Callable[[], Any]]:
    """The timed callables (module docstring)."""
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    xd = x.detach()
    ours = softmax.ENTRY.replacement
    out: dict[str, Callable[[], Any]] = {}

    def no_grad(fn):
        def call():
            with torch.no_grad():
                return fn(x)
        return call

    out["ours fwd"] = no_grad(ours)
    out["ours fwd_grad"] = lambda: ours(x)

    def launch_fn():
        _op._state.direct = True
        try:
            return softmax._softmax_fwd_launch(xd, 1.0, None, False)
        finally:
            _op._state.direct = False

    out["ours launch fn"] = launch_fn
    grid, a, kw = _recorded_launch(softmax._softmax_fwd_kernel, launch_fn)
    kernel = softmax._softmax_fwd_kernel
    out["ours kernel[grid]"] = lambda: kernel[grid](*a, **kw)
    direct = _launch.CachedLauncher(kernel)
    out["ours kernel direct"] = lambda: direct[grid](*a, **kw)
    if liger.functional is not None:
        lfn = liger.functional.liger_softmax
        out["liger fwd"] = no_grad(lfn)
        out["liger fwd_grad"] = lambda: lfn(x)
        from liger_kernel.ops import softmax as lsm

        lk = lsm._softmax_single_block_forward_kernel
        lgrid, la, lkw = _recorded_launch(lk, lambda: lsm._softmax_forward(xd))
        out["liger kernel[grid]"] = lambda: lk[lgrid](*la, **lkw)
    dy = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    y = ours(xd)

    def with_direct(fn):
        def call():
            _op._state.direct = True
            try:
                return fn()
            finally:
                _op._state.direct = False
        return call

    out["ours fwd+bwd"] = lambda: torch.autograd.grad(ours(x), [x], dy)
    out["ours bwd op"] = lambda: softmax.softmax_backward_op(y, dy, 1.0)
    out["ours bwd launch fn"] = with_direct(lambda: softmax._softmax_bwd_launch(y, dy, 1.0))
    if liger.functional is not None:
        out["liger fwd+bwd"] = lambda: torch.autograd.grad(lfn(x), [x], dy)
        block, warps = lsm.calculate_settings(256)
        out["liger bwd fn"] = lambda: lsm._softmax_backward(dy, y, block, warps, False)
    out["Function 4 args fwd+bwd"] = lambda: torch.autograd.grad(_Alloc4.apply(x, 1.0, None, False), [x], dy)
    out["Function 1 arg fwd+bwd"] = lambda: torch.autograd.grad(_Alloc1.apply(x), [x], dy)
    out["Function 4 args"] = lambda: _Alloc4.apply(x, 1.0, None, False)
    out["Function 1 arg"] = lambda: _Alloc1.apply(x)
    out["torch.empty"] = lambda: torch.empty((4, 256), dtype=torch.bfloat16, device="cuda")
    out["x.reshape"] = lambda: xd.reshape(1, 1, 4, 256)
    return out


def main() -> None:
    args = gpu_probe_args(__doc__.splitlines()[0], repeats=15)
    liger = lce_liger.load_liger()
    fns = callables(liger)
    us = interleaved_per_call_us(fns, args.calls, args.repeats)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "liger": liger.version, "python": platform.python_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "calls": args.calls,
            "repeats": args.repeats, "missing": sorted(set(fns) - set(us))}
    (args.out / "softmax_layers.json").write_text(json.dumps({"meta": meta, "host_us": us}, indent=1))
    lines = [f"Host us per call, softmax 4 x 256 bf16 ({meta['gpu']}, torch {meta['torch']}, triton "
             f"{meta['triton']}, liger {meta['liger']}, {meta['date']}; interleaved, median of {args.repeats} rounds "
             f"of {args.calls} calls)", "", "| callable | host us |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in us.items()]
    (args.out / "softmax_layers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
