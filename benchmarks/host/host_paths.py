"""Where a library call's host time goes, beside Liger-Kernel's: forward, backward alone, forward+backward, with
the autograd engine's device threads on and off, cProfiles, kernels per call, and the cost of one Triton launch.

Issue 16 asks for host time per call no higher than Liger's. ``benchmarks/kernels/lce_liger.py`` measures the
totals; this splits them, on the same tiny inputs (``lce_liger.HOST_SHAPES``, bf16) and the same callables
(``lce_liger.provider_fn``: ``ours`` is the registered replacement, ``ours-jit`` the same with every Triton launch
through the JIT, ``kernel_library._launch.FAST_LAUNCH`` off; ``liger`` Liger's functional API):

- ``fwd``: the forward under ``torch.no_grad()``; ``fwd_grad``: the forward with its graph recorded (dropped
  unused); ``fwd+bwd``: the forward and ``torch.autograd.grad`` to the
  floating inputs; ``bwd``: ``torch.autograd.grad(retain_graph=True)`` again and again through one forward's graph
  (what the backward alone costs). Each ``_st`` twin runs with ``torch.autograd.set_multithreading_enabled(False)``:
  the backward then runs on the calling thread instead of the engine's CUDA device thread.
- ``kernels``: GPU kernels one forward+backward launches (``torch.profiler``).
- cProfile of 200 forward+backward calls with the device threads off (so the backward's Python is seen), own time.
- ``launch``: one Triton launch of the library's RMSNorm forward kernel (4 x 256 bf16, 17 arguments): through
  ``JITFunction.__getitem__`` (``jit``, what every library and Liger call does) and through the compiled kernel's
  launcher with the argument list the JIT built (``launcher``: the binder, cache key and launch-metadata steps
  skipped) and through the library's ``kernel_library._launch.CachedLauncher`` (``cached``); each on the calling
  thread and inside a backward on the engine's device thread, per launch (a backward of 16 launches minus one of
  none, over 16).

Host us per call: ``benchmarks.common.interleaved_per_call_us`` (``--calls`` back-to-back calls, median of
``--repeats`` loops, the GPU drained before each loop and not timed after it; the providers' loops interleaved
round by round, so a drifting host shifts them alike).

    python benchmarks/host/host_paths.py --out DIR [--calls 200] [--repeats 7]

Writes ``host_paths.json`` and ``host_paths.md``.
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

from benchmarks.common import gpu_probe_args, interleaved_per_call_us, per_call_us  # noqa: E402
from benchmarks.host.host_overhead import profile_top  # noqa: E402
from benchmarks.kernels import lce_liger  # noqa: E402
from kernel_library import _launch  # noqa: E402

OPS = ("rmsnorm", "layernorm", "softmax", "cross_entropy")
#: ``ours``: the library's replacement as it ships (direct eager path, cached launches); ``ours-jit``: the same with
#: every launch through ``kernel[grid]`` (``kernel_library._launch.FAST_LAUNCH`` off).
PROVIDERS = ("ours", "ours-jit", "liger")
LAUNCHES_PER_BACKWARD = 16


def _leaves(args: list) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point() and a.requires_grad]


MODES = ("fwd", "fwd_grad", "fwd+bwd", "bwd")


def _launching(provider: str, call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with the library's direct launch on, or off for ``ours-jit`` (every provider gets the same
    wrapper, so the switch costs them alike)."""
    fast = provider != "ours-jit"

    def run():
        _launch.FAST_LAUNCH = fast
        try:
            return call()
        finally:
            _launch.FAST_LAUNCH = True

    return run


def calls_for(fn: Callable, args: list) -> dict[str, Callable[[], Any]]:
    """The timed no-argument calls: fwd, fwd+bwd, bwd (through one retained graph)."""
    leaves = _leaves(args)

    def fwd():
        with torch.no_grad():
            return fn(*args)

    def fwd_grad():  # the forward that records the graph (an autograd.Function's apply), dropped unused
        return fn(*args)

    out = lce_liger.float_outputs(fn(*args))
    grads = [torch.ones_like(o) for o in out]

    def fwd_bwd():
        outs = lce_liger.float_outputs(fn(*args))
        return torch.autograd.grad(outs, leaves, [g.clone() for g in grads[: len(outs)]], allow_unused=True)

    retained = lce_liger.float_outputs(fn(*args))

    def bwd():
        # a clone of the upstream gradient each time: Liger writes its dX into dY (in_place=True)
        return torch.autograd.grad(retained, leaves, [g.clone() for g in grads[: len(retained)]], retain_graph=True,
                                   allow_unused=True)

    return {"fwd": fwd, "fwd_grad": fwd_grad, "fwd+bwd": fwd_bwd, "bwd": bwd}


def count_kernels(call: Callable[[], Any]) -> int | None:
    """GPU kernels one ``call`` launches (torch.profiler's CUDA kernel events; copies and memsets excluded)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(1 for n in names if not n.lower().startswith(("memcpy", "memset")))


def in_backward_us(launch: Callable[[], Any], calls: int, repeats: int) -> float:
    """Host us of one ``launch()`` inside a backward on the engine's device thread: a backward of
    :data:`LAUNCHES_PER_BACKWARD` launches minus one of none, over that count."""

    class InBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, n):
            ctx.n = n
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            for _ in range(ctx.n):
                launch()
            return g, None

    t = torch.zeros(4, device="cuda", requires_grad=True)
    g = torch.ones(4, device="cuda")
    per = {n: per_call_us(lambda n=n: torch.autograd.grad(InBackward.apply(t, n), [t], g), calls, repeats,
                          count_drain=False) for n in (0, LAUNCHES_PER_BACKWARD)}
    return (per[LAUNCHES_PER_BACKWARD] - per[0]) / LAUNCHES_PER_BACKWARD


def launch_costs(calls: int, repeats: int) -> dict[str, Any]:
    """Per-launch host us of the library's RMSNorm forward kernel, JIT path vs the compiled launcher, on the
    calling thread and inside a backward."""
    from kernel_library import rmsnorm

    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
    recorded: dict[str, tuple] = {}
    kernel = rmsnorm._rms_norm_fwd_kernel if hasattr(rmsnorm, "_rms_norm_fwd_kernel") else None
    if kernel is None:
        return {"error": "kernel_library.rmsnorm has no _rms_norm_fwd_kernel"}

    # capture the exact launcher call the JIT makes for this launch (one call through rms_norm_fwd_launch, on the
    # direct path: kernel[grid], not wrap_triton)
    from kernel_library import _op

    _op._state.direct = True
    rmsnorm.rms_norm_fwd_launch(x, w, 1e-6, 0.0)
    torch.cuda.synchronize()
    caches = kernel.device_caches[torch.cuda.current_device()]
    kernel_cache = caches[0]
    compiled = list(kernel_cache.values())
    if not compiled:
        return {"error": "no compiled kernel in the JIT cache"}
    ck = compiled[-1]
    original_run = ck.run
    jit_args: dict[str, Any] = {}
    orig_getitem = type(kernel).__getitem__

    def spy(*a):
        recorded["args"] = a
        return original_run(*a)

    attr = "_run" if hasattr(ck, "_run") else "run"  # newer tritons: run is a property over _run
    try:
        setattr(ck, attr, spy)
    except AttributeError:
        return {"error": "cannot intercept CompiledKernel.run on this triton"}

    def grab_getitem(self, grid):
        launcher = orig_getitem(self, grid)

        def wrapped(*a, **kw):
            jit_args["grid"], jit_args["a"], jit_args["kw"] = grid, a, kw
            return launcher(*a, **kw)
        return wrapped

    type(kernel).__getitem__ = grab_getitem
    try:
        rmsnorm.rms_norm_fwd_launch(x, w, 1e-6, 0.0)
    finally:
        _op._state.direct = False
        type(kernel).__getitem__ = orig_getitem
        setattr(ck, attr, original_run)
    if "args" not in recorded or "a" not in jit_args:
        return {"error": "the launch was not intercepted"}
    la = recorded["args"]
    grid, a, kw = jit_args["grid"], jit_args["a"], jit_args["kw"]

    def jit():
        kernel[grid](*a, **kw)

    def launcher():
        original_run(*la)

    cached = _launch.CachedLauncher(kernel)

    def cached_launch():
        cached[grid](*a, **kw)

    for _ in range(3):  # compile, check, then direct
        cached_launch()
    out: dict[str, Any] = {"n_args": len(a) + len(kw),
                           "cached_state": [e.why or e.state for e in cached.entries.values()],
                           "cached_bypassed": dict(cached.bypassed)}
    for name, fn in (("jit", jit), ("launcher", launcher), ("cached", cached_launch)):
        out[f"{name}_us"] = per_call_us(fn, calls, repeats, count_drain=False)
        out[f"{name}_in_backward_us"] = in_backward_us(fn, calls, repeats)
    from triton.runtime import driver

    dev = torch.cuda.current_device()
    out["get_current_stream_us"] = per_call_us(lambda: driver.active.get_current_stream(dev), calls * 10, repeats,
                                               count_drain=False)
    out["torch_current_stream_us"] = per_call_us(lambda: torch.cuda.current_stream(), calls * 10, repeats,
                                                 count_drain=False)
    out["empty_us"] = per_call_us(lambda: torch.empty(4, 256, device="cuda", dtype=torch.bfloat16), calls * 10,
                                  repeats, count_drain=False)
    return out


def main() -> None:
    args = gpu_probe_args(__doc__.splitlines()[0], repeats=7)
    liger = lce_liger.load_liger()
    ops = {op.module: op for op in lce_liger.OPS}
    rows, profiles = [], {}
    for name in OPS:
        op = ops[name]
        shape = lce_liger.HOST_SHAPES[name]
        by: dict[str, dict[str, Any]] = {p: {"op": name, "shape": op.label(shape), "provider": p} for p in PROVIDERS}
        calls: dict[str, dict[str, Callable[[], Any]]] = {}
        for provider in PROVIDERS:
            try:
                fn = lce_liger.provider_fn(op, provider.split("-")[0], liger, "inductor")
                calls[provider] = calls_for(fn, lce_liger.fresh(op.make(shape, torch.bfloat16, True)))
            except Exception as e:  # noqa: BLE001 - one provider failing must not stop the probe
                by[provider]["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        for single_thread in (False, True):
            torch.autograd.set_multithreading_enabled(not single_thread)
            try:
                for mode in MODES:
                    key = f"{mode}{'_st' if single_thread else ''}_us"
                    fns = {p: _launching(p, c[mode]) for p, c in calls.items()}
                    measured = interleaved_per_call_us(fns, args.calls, args.repeats)
                    for p in fns:
                        if p in measured:
                            by[p][key] = measured[p]
                        else:  # e.g. ours' cross-entropy refuses a second backward through one forward
                            by[p]["error"] = (by[p].get("error", "") + f" {key}: raised").strip()
                if single_thread:
                    for p in ("ours", "liger"):
                        if p in calls:
                            profiles[f"{name} {p}"] = profile_top(calls[p]["fwd+bwd"], args.calls, n=25)
            finally:
                torch.autograd.set_multithreading_enabled(True)
        for p, c in calls.items():
            try:
                by[p]["kernels_fwd_bwd"] = count_kernels(c["fwd+bwd"])
                by[p]["kernels_fwd"] = count_kernels(c["fwd"])
            except Exception as e:  # noqa: BLE001
                by[p]["error"] = (by[p].get("error", "") + f" kernels: {type(e).__name__}").strip()
        for row in by.values():
            rows.append(row)
            print(json.dumps(row), flush=True)
    bypassed = {getattr(lau.kernel, "__name__", str(k)): dict(lau.bypassed)
                for k, lau in _launch._launchers.items() if lau.bypassed}
    not_direct = {getattr(lau.kernel, "__name__", str(k)): sorted({e.why for e in lau.entries.values() if e.why})
                  for k, lau in _launch._launchers.items() if any(e.why for e in lau.entries.values())}
    try:
        launch = launch_costs(args.calls, args.repeats)
    except Exception as e:  # noqa: BLE001
        launch = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(json.dumps(launch), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "liger": liger.version, "python": platform.python_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "calls": args.calls,
            "repeats": args.repeats, "launch_hooks": [repr(h) for h in _launch._launch_hooks()]}
    (args.out / "host_paths.json").write_text(json.dumps({"meta": meta, "rows": rows, "launch": launch,
                                                          "bypassed": bypassed, "not_direct": not_direct,
                                                          "profiles": profiles}, indent=1))
    cols = ["fwd_us", "fwd_grad_us", "fwd+bwd_us", "bwd_us", "fwd_st_us", "fwd_grad_st_us", "fwd+bwd_st_us",
            "bwd_st_us", "kernels_fwd", "kernels_fwd_bwd"]
    lines = [f"Host us per call ({meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, liger "
             f"{meta['liger']}, {meta['date']}); _st: autograd device threads off.", "",
             "| op | shape | provider | " + " | ".join(cols) + " | error |", "|---" * (len(cols) + 4) + "|"]
    for r in rows:
        vals = [r.get(c) for c in cols]
        lines.append(f"| {r['op']} | {r['shape']} | {r['provider']} | "
                     + " | ".join("-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
                                  for v in vals) + f" | {r.get('error', '')} |")
    lines += ["", "Launch: " + json.dumps(launch), "",
              "Library launches sent to the JIT (kernel_library._launch): "
              + json.dumps({"bypassed": bypassed, "not_direct": not_direct}), "",
              "## cProfiles (fwd+bwd, device threads off, own time)", ""]
    for k, text in profiles.items():
        lines += [f"### {k}", "", "```", text.strip(), "```", ""]
    (args.out / "host_paths.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
