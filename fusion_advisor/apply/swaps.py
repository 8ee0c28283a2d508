"""Per swap: verify the kernel against the user's own ops and float64, time it alone, and decide.

Per swap (:func:`verify_swap`), the kernel's ``replacement`` is compared with the user's own matched ops (the
subgraph cut out of the captured graph) and with a float64 reference (the kernel's ``pattern`` run on float64
inputs) on

- ``captured``: the chain's real inputs, recorded from a forward pass of the model on its example inputs;
- ``fresh-<seed>``: fresh random inputs of the same shapes and dtypes (floats with the captured mean and std,
  integers drawn from the captured values, so labels keep their ``ignore_index``);
- ``hard-large`` (floats x8), ``hard-tiny`` (x1e-3, below eps for norms) and ``hard-zeros`` (first float input 0).

The kernel runs under :class:`~fusion_advisor.verify.PoisonAllocations` (every ``torch.empty`` it makes is NaN
first, so an element it forgets to write fails), its inputs must be unchanged afterwards, its output dtypes must
equal the original ops' (no silent casts). An element passes when it is within the output dtype's tolerance
(:mod:`fusion_advisor.tolerances`) of the float64 reference **or** of the original ops (which may themselves sit
further from float64, e.g. bf16 rounding of intermediates); NaN and inf must sit where the reference or the
original has them. With ``backward``, input gradients are checked the same way for one random ``grad_output``.

Timing (:func:`bench_swap`): on a GPU, the original ops eagerly, under ``torch.compile`` (first-call compile time
apart) and the kernel, forward (or forward+backward with ``backward``), each two ways: wall time
(``triton.testing.do_bench`` median) and device time (summed GPU kernel time of one call, torch.profiler). Without
a GPU nothing is timed: Triton's CPU interpreter says nothing about GPU speed.

Decision (:func:`decide`): an unverified swap is never kept; a verified one is kept when the kernel beats the
better of eager and torch.compile by ``margin`` in device time (wall time when device time is missing): a chain
timed alone is host-bound, while inside a model the host runs ahead and a swap changes GPU time. A swap kept
here is only a candidate: the whole-model variants (:mod:`fusion_advisor.apply.search`) decide whether the model
uses it. Without GPU timings a swap is kept only with ``keep_unmeasured``."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from fusion_advisor.apply.records import (
    KEPT, NOT_KEPT, NOT_MEASURED_NOTE, NOT_VERIFIED, REJECTED, TIMER_GPU, TIMER_NONE, SwapTiming, SwapVerification,
)
from fusion_advisor.tolerances import EAGER_ERROR_FACTOR, tolerance_for, within_eager_error
from fusion_advisor.verify import PoisonAllocations, compare_outputs, run_backward

#: Fresh random input draws per swap (besides the captured inputs and the hard values).
DEFAULT_SEEDS = 2

#: Keep a swap only when it beats the better of eager and torch.compile by this fraction.
DEFAULT_MARGIN = 0.03

#: Hard-value cases: name -> how to derive the inputs from the captured ones.
HARD_CASES = ("hard-large", "hard-tiny", "hard-zeros")


# --- inputs -------------------------------------------------------------------------------------------------


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def fresh_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A fresh tensor shaped like ``t``: floats ~ N(mean, std) of ``t``; integers/bools drawn from ``t``'s values."""
    if t.numel() == 0:
        return t.clone()
    if _floating(t):
        f = t.detach().double()
        mean = float(f.mean())
        std = float(f.std()) if t.numel() > 1 else 1.0
        std = std if math.isfinite(std) and std > 0 else 1.0
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        return (noise * std + mean).to(device=t.device, dtype=t.dtype)
    flat = t.detach().reshape(-1).cpu()
    idx = torch.randint(0, flat.numel(), tuple(t.shape), generator=gen)
    return flat[idx].to(t.device)


def _hard(case: str, args: list[Any]) -> list[Any]:
    out = []
    first = True
    for a in args:
        if _floating(a):
            if case == "hard-large":
                a = a * 8
            elif case == "hard-tiny":
                a = a * 1e-3
            elif case == "hard-zeros" and first:
                a = torch.zeros_like(a)
            first = False
        out.append(a)
    return out


def _cases(captured: list[Any], seeds: int) -> list[tuple[str, Callable[[], list[Any]]]]:
    def fresh(seed: int) -> Callable[[], list[Any]]:
        def make() -> list[Any]:
            gen = torch.Generator().manual_seed(1000 + seed)
            return [fresh_like(a, gen) if isinstance(a, torch.Tensor) else a for a in captured]
        return make

    cases = [("captured", lambda: list(captured))]
    cases += [(f"fresh-{s}", fresh(s)) for s in range(seeds)]
    cases += [(c, (lambda c=c: _hard(c, captured))) for c in HARD_CASES]
    return cases


# --- element-wise judgement ---------------------------------------------------------------------------------


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _leaves(v)]
    return [obj]


def _close(a: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Element-wise: finite and within ``atol + rtol*|e|``, or the same NaN/inf."""
    a64, e64 = a.detach().double(), e.detach().double().to(a.device)
    finite = torch.isfinite(a64) & torch.isfinite(e64)
    same = (torch.isnan(a64) & torch.isnan(e64)) | (a64 == e64)
    return same | (finite & ((a64 - e64).abs() <= atol + rtol * e64.abs()))


def judge(actual: Any, reference: Any, original: Any, label: str) -> tuple[bool, float, float, list[str]]:
    """Whether ``actual`` (the kernel) is acceptable: per element within its dtype's tolerance of ``reference``
    (float64, or ``None``) or of ``original`` (the user's ops in their own dtypes).

    Returns ``(ok, max_abs, max_rel, details)``; the maxima are against ``reference`` when given, else against
    ``original``; details come from :func:`~fusion_advisor.verify.compare_outputs`.
    """
    target = reference if reference is not None else original
    _, max_abs, max_rel, details = compare_outputs(actual, target, label=label)
    la, lo = _leaves(actual), _leaves(original)
    lr = _leaves(reference) if reference is not None else [None] * len(la)
    if len(la) != len(lo) or len(la) != len(lr):
        return False, math.inf, math.inf, [f"{label}: kernel returns {len(la)} values, the original ops {len(lo)}"]
    ok = True
    for i, (a, o, r) in enumerate(zip(la, lo, lr)):
        if not isinstance(a, torch.Tensor) or not isinstance(o, torch.Tensor):
            if a != o:
                ok = False
                details.append(f"{label}[{i}]: kernel gives {a!r}, the original ops {o!r}")
            continue
        if a.shape != o.shape:
            ok = False
            details.append(f"{label}[{i}]: shape {list(a.shape)}, original {list(o.shape)}")
            continue
        atol, rtol = tolerance_for(a.dtype)
        good = _close(a, o, atol, rtol)
        if isinstance(r, torch.Tensor):
            good |= _close(a, r, atol, rtol)
        bad = int((~good).sum())
        if bad:
            ok = False
            flat = (~good).reshape(-1).nonzero()
            first = int(flat[0, 0]) if flat.numel() else 0
            ref_v = r.reshape(-1)[first].item() if isinstance(r, torch.Tensor) else float("nan")
            details.append(f"{label}[{i}]: {bad} of {a.numel()} elements outside tolerance (atol {atol:g}, rtol "
                           f"{rtol:g}) of both float64 and the original ops; first at flat index {first}: kernel "
                           f"{a.reshape(-1)[first].item():.6g}, original {o.reshape(-1)[first].item():.6g}, "
                           f"float64 {ref_v:.6g}")
    return ok, max_abs, max_rel, details


def _snapshot(args: list[Any]) -> list[Any]:
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


def _mutated(args: list[Any], before: list[Any], names: list[str], when: str) -> list[str]:
    lines = []
    for a, b, n in zip(args, before, names):
        if isinstance(a, torch.Tensor):
            same = a.detach() == b
            if a.is_floating_point():
                same |= torch.isnan(a.detach()) & torch.isnan(b)
            if not bool(same.all()):
                lines.append(f"input '{n}' was modified in place {when}: kernels must not mutate their inputs")
    return lines


# --- verification -------------------------------------------------------------------------------------------


def verify_swap(entry: Any, original: Callable[..., Any], captured: list[Any], names: list[str],
                backward: bool, seeds: int = DEFAULT_SEEDS,
                expected_outputs: Sequence[torch.Tensor] | None = None,
                requires_grad: Sequence[bool] | None = None, captured_only: bool = False) -> SwapVerification:
    """Check ``entry.replacement`` against the user's matched ops on the cases of the module docstring.

    Args:
        entry: the :class:`~kernel_library.registry.KernelEntry`.
        original: the matched ops, ``original(*tensor_args) -> output(s)`` (:func:`fusion_advisor.apply.extract_subgraph`).
        captured: the pattern's arguments as recorded (tensors) and captured (scalars), in parameter order.
        names: the pattern's parameter names (for messages).
        backward: also compare input gradients.
        seeds: fresh random draws.
        expected_outputs: the outputs the model produced at this site; ``original`` on ``captured`` must reproduce
            them exactly, which proves the cut-out subgraph is the model's computation.
        requires_grad: per argument, whether it requires grad in the model (gradients are checked for those);
            default every floating tensor.
        captured_only: run only the ``captured`` case (the fresh and hard-value cases were run on another site
            with the same signature: same kernel, shapes, dtypes and constants).

    Never raises for a kernel fault: a kernel that raises (compile error, out of memory, bad launch) fails.
    """
    result = SwapVerification(verified=False)
    tensor_pos = [i for i, a in enumerate(captured) if isinstance(a, torch.Tensor)]

    def orig_call(args: list[Any]) -> Any:
        return original(*[args[i] for i in tensor_pos])

    if expected_outputs is not None:
        with torch.no_grad():
            got = _leaves(orig_call(captured))
        exp = list(expected_outputs)
        if len(got) != len(exp) or not all(
                isinstance(g, torch.Tensor) and g.shape == e.shape and g.dtype == e.dtype
                and bool(_close(g, e, *tolerance_for(g.dtype)).all()) for g, e in zip(got, exp)):
            result.reason = ("the cut-out original ops do not reproduce the model's values at this site: the swap "
                             "cannot be verified")
            result.details.append(result.reason)
            return result
        result.details.append("the original ops cut out of the graph reproduce the model's recorded values")

    abs_max, rel_max, gabs_max, grel_max = 0.0, 0.0, 0.0, 0.0
    any_errs = False
    cases = _cases(captured, seeds)
    for case, make in cases[:1] if captured_only else cases:
        result.cases.append(case)
        try:
            ok, line, errs = _verify_case(entry, orig_call, make(), names, backward, case, result, requires_grad)
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            ok, line, errs = False, f"{case}: out of GPU memory: {str(e).splitlines()[0]}", None
        except Exception as e:  # the kernel (or its reference) raised: reject with the reason
            ok, line, errs = False, f"{case}: raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", None
        if errs is not None:
            any_errs = True
            abs_max, rel_max = max(abs_max, errs[0]), max(rel_max, errs[1])
            if errs[2] is not None:
                gabs_max, grel_max = max(gabs_max, errs[2]), max(grel_max, errs[3])
        if not ok:
            result.reason = line
            result.details.append(line)
            break
    else:
        result.verified = True
    if any_errs:
        result.max_abs_err, result.max_rel_err = abs_max, rel_max
        if result.backward_checked:
            result.grad_max_abs_err, result.grad_max_rel_err = gabs_max, grel_max
    return result


def _headline(details: list[str]) -> str:
    """The most telling mismatch line: unwritten (NaN) elements first, then the both-references verdict."""
    for key in ("NaN where the reference is not", "of both float64 and the original ops", "outside tolerance"):
        line = next((d for d in details if key in d), None)
        if line is not None:
            return line
    return details[0] if details else "mismatch"


def _upcast(a: Any) -> Any:
    if _floating(a):
        return a.detach().to(torch.float64)
    return a.detach().clone() if isinstance(a, torch.Tensor) else a


def _verify_case(entry: Any, orig_call: Callable[[list[Any]], Any], args: list[Any], names: list[str],
                 backward: bool, case: str, result: SwapVerification, requires_grad: Sequence[bool] | None):
    """One case; returns ``(ok, line, (abs, rel, grad_abs, grad_rel) | None)``."""
    float_pos = [i for i, a in enumerate(args) if _floating(a) and (requires_grad is None or requires_grad[i])]
    need_grad = backward and bool(float_pos)

    def leaves_of(xs: list[Any]) -> list[torch.Tensor]:
        return [xs[i] for i in float_pos]

    def prepared(convert: Callable[[Any], Any]) -> list[Any]:
        out = [convert(a) if isinstance(a, torch.Tensor) else a for a in args]
        if need_grad:
            for i in float_pos:
                out[i] = out[i].detach().requires_grad_(True)
        return out

    # original ops, in the inputs' own dtypes
    o_args = prepared(lambda a: a.detach().clone())
    with torch.set_grad_enabled(need_grad):
        o_out = orig_call(o_args)
    # float64 reference: the pattern on float64 inputs
    ref_out, r_args, ref_note = None, None, ""
    try:
        r_args = prepared(_upcast)
        with torch.set_grad_enabled(need_grad):
            ref_out = entry.pattern(*r_args)
        ref_dtypes = {t.dtype for t in _leaves(ref_out) if _floating(t)}
        result.reference = ("float64" if ref_dtypes <= {torch.float64} else
                            f"float64 inputs; the pattern casts to {', '.join(sorted(str(d).replace('torch.', '') for d in ref_dtypes))}")
    except Exception as e:  # a pattern that cannot run in float64: the original ops are the reference
        ref_out, ref_note = None, f"float64 reference failed ({type(e).__name__}); judged against the original ops"
        result.reference = "original ops"
    # the kernel, allocations poisoned, inputs checked unchanged
    k_args = prepared(lambda a: a.detach().clone())
    before = _snapshot(k_args)
    with torch.set_grad_enabled(need_grad), PoisonAllocations() as mode:
        k_out = entry.replacement(*k_args)
    lines = _mutated(k_args, before, names, "by the kernel's forward") + mode.redzone_violations()
    if lines:
        return False, f"{case}: {lines[0]}", None
    ko, oo = _leaves(k_out), _leaves(o_out)
    dtype_bad = [f"output {i}: kernel {k.dtype}, original {o.dtype}" for i, (k, o) in enumerate(zip(ko, oo))
                 if isinstance(k, torch.Tensor) and isinstance(o, torch.Tensor) and k.dtype != o.dtype]
    if len(ko) != len(oo) or dtype_bad:
        why = "; ".join(dtype_bad) or f"kernel returns {len(ko)} values, original {len(oo)}"
        return False, f"{case}: outputs differ in type from the original ops (no silent casts): {why}", None
    ok, fabs, frel, details = judge(k_out, ref_out, o_out, f"{case} output")
    result.details.extend(d for d in details if "MISMATCH" in d or "outside tolerance" in d or not ok)
    if ref_note:
        result.details.append(f"{case}: {ref_note}")
    if not ok:
        return False, f"{case}: forward mismatch: {_headline(details)}", (fabs, frel, None, None)
    if not need_grad:
        return True, "", (fabs, frel, None, None)

    # gradients: the same random grad_output for all three
    outs_k = [t for t in ko if isinstance(t, torch.Tensor) and t.requires_grad]
    idx = [i for i, t in enumerate(ko) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not idx:
        return False, f"{case}: the kernel's outputs do not require grad (no autograd formula?)", (fabs, frel, None, None)
    gen = torch.Generator().manual_seed(4242)
    gouts = [torch.randn(ko[i].shape, generator=gen, dtype=torch.float64).to(ko[i].device) for i in idx]
    result.backward_checked = True
    with PoisonAllocations() as bmode:
        k_grads = run_backward(outs_k, [g.to(ko[i].dtype) for g, i in zip(gouts, idx)], leaves_of(k_args))
    lines = _mutated(k_args, before, names, "by the kernel's backward") + bmode.redzone_violations()
    if lines:
        return False, f"{case}: {lines[0]}", (fabs, frel, None, None)
    o_grads = torch.autograd.grad([oo[i] for i in idx], leaves_of(o_args),
                                  [g.to(oo[i].dtype) for g, i in zip(gouts, idx)], allow_unused=True)
    r_grads: Sequence[Any] = [None] * len(k_grads)
    if ref_out is not None:
        ro = _leaves(ref_out)
        r_grads = torch.autograd.grad([ro[i] for i in idx], leaves_of(r_args),
                                      [g.to(ro[i].dtype) for g, i in zip(gouts, idx)], allow_unused=True)
    gabs, grel = 0.0, 0.0
    for j, (kg, og, rg) in enumerate(zip(k_grads, o_grads, r_grads)):
        name = names[float_pos[j]] if float_pos[j] < len(names) else f"arg{float_pos[j]}"
        if kg is None and og is None:
            continue
        if kg is None or og is None:
            return False, f"{case}: gradient of '{name}': kernel {'none' if kg is None else 'some'}, original " \
                          f"{'none' if og is None else 'some'}", (fabs, frel, gabs, grel)
        g_ok, a, r, gd = judge(kg, rg, og, f"{case} grad of {name}")
        if not g_ok and isinstance(rg, torch.Tensor) and kg.dtype in (torch.float16, torch.bfloat16):
            g_ok, line = _within_eager_error(kg, og, rg, f"{case} grad of {name}")
            gd.append(line)
            if g_ok:
                result.details.append(line)
        gabs, grel = max(gabs, a), max(grel, r)
        if not g_ok:
            return False, f"{case}: gradient mismatch: {_headline(gd)}", (fabs, frel, gabs, grel)
    return True, "", (fabs, frel, gabs, grel)


def _within_eager_error(kernel_grad: torch.Tensor, eager_grad: torch.Tensor, reference: torch.Tensor,
                        label: str) -> tuple[bool, str]:
    """Re-judge a fp16/bf16 gradient that missed the element-wise tolerance: it passes when its max abs error
    against float64 is within :data:`~fusion_advisor.tolerances.EAGER_ERROR_FACTOR` times the original ops' own
    error (the rule ``fusion-advisor verify`` applies; see :func:`~fusion_advisor.tolerances.within_eager_error`)."""
    ref = reference.detach().double()
    k_err = float((kernel_grad.detach().double().to(ref.device) - ref).abs().max())
    e_err = float((eager_grad.detach().double().to(ref.device) - ref).abs().max())
    ok = within_eager_error(k_err, e_err)
    verdict = "ok" if ok else "also beyond"
    return ok, (f"{label}: {verdict} {EAGER_ERROR_FACTOR:g}x the original ops' own "
                f"{str(kernel_grad.dtype).replace('torch.', '')} error against float64 (kernel max abs {k_err:.3g}, "
                f"original {e_err:.3g})")


# --- timing -------------------------------------------------------------------------------------------------


def _time_steady(fn: Callable[[], Any], label: str, recompiles: dict[str, Any], warm: bool = True) -> float:
    """``time_cuda(fn)`` median in ms, after one warm-up call (``warm``), under a RecompileWatch whose report
    goes to ``recompiles[label]``."""
    from fusion_advisor.bench import time_cuda
    from fusion_advisor.recompile import RecompileWatch

    if warm:
        fn()
    with RecompileWatch() as watch:
        ms = time_cuda(fn).median_ms
    recompiles[label] = watch.report
    return ms


def bench_swap(entry: Any, original: Callable[..., Any], captured: list[Any], backward: bool,
               requires_grad: Sequence[bool] | None = None) -> SwapTiming:
    """Time the original ops eagerly and under torch.compile, and the kernel (see the module docstring).

    ``requires_grad``: per argument, whether it requires grad in the model (default: every floating tensor)."""
    tensors = [a for a in captured if isinstance(a, torch.Tensor)]
    on_cuda = any(t.device.type == "cuda" for t in tensors)
    what = "forward+backward" if backward else "forward"
    if not on_cuda:
        return SwapTiming(timer=TIMER_NONE, what=what, note=NOT_MEASURED_NOTE)
    from fusion_advisor.bench import device_time_ms

    tensor_pos = [i for i, a in enumerate(captured) if isinstance(a, torch.Tensor)]
    float_pos = [i for i in tensor_pos if _floating(captured[i]) and (requires_grad is None or requires_grad[i])]
    args = [a.detach().clone().requires_grad_(backward and i in float_pos) if isinstance(a, torch.Tensor) else a
            for i, a in enumerate(captured)]

    def step(fn: Callable[[list[Any]], Any]) -> Callable[[], Any]:
        if not backward:
            def fwd() -> Any:
                with torch.no_grad():
                    return fn(args)
            return fwd

        def fwd_bwd() -> Any:
            outs = [o for o in _leaves(fn(args)) if isinstance(o, torch.Tensor) and o.requires_grad]
            return torch.autograd.grad(outs, [args[i] for i in float_pos], [torch.ones_like(o) for o in outs],
                                       allow_unused=True)
        return fwd_bwd

    timing = SwapTiming(timer=TIMER_GPU, what=what)
    recompiles: dict[str, Any] = {}
    eager_step = step(lambda a: original(*[a[i] for i in tensor_pos]))
    kernel_step = step(lambda a: entry.replacement(*a))
    timing.eager_ms = _time_steady(eager_step, "eager", recompiles)
    timing.kernel_ms = _time_steady(kernel_step, "kernel", recompiles)
    timing.eager_gpu_ms = device_time_ms(eager_step)
    timing.kernel_gpu_ms = device_time_ms(kernel_step)
    try:
        compiled = torch.compile(original, dynamic=False)
        fn = step(lambda a: compiled(*[a[i] for i in tensor_pos]))
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        timing.compile_time_ms = (time.perf_counter() - start) * 1e3
        timing.compile_ms = _time_steady(fn, "compile", recompiles, warm=False)
        timing.compile_gpu_ms = device_time_ms(fn)
    except Exception as e:  # torch.compile failing on the chain leaves eager as the baseline, said so
        timing.note = f"torch.compile of the original ops failed: {type(e).__name__}: {str(e).splitlines()[0]}"
    from fusion_advisor.recompile import summarize

    timing.steady_state_recompiles = summarize(recompiles)
    return timing


def decide(verification: SwapVerification | None, timing: SwapTiming | None, margin: float,
           keep_unmeasured: bool) -> tuple[str, str]:
    """``(decision, reason)`` for a verified-or-not, timed-or-not swap (see the module docstring)."""
    if verification is None:
        return NOT_VERIFIED, "not verified (run apply with --verify)"
    if not verification.verified:
        return REJECTED, f"verification failed: {verification.reason}"
    if timing is None or timing.kernel_ms is None or timing.best_baseline_ms is None:
        if keep_unmeasured:
            return KEPT, "verified; not measured on a GPU, kept because --keep-unmeasured was given"
        return NOT_KEPT, "verified; not measured on a GPU, kept only with --keep-unmeasured"
    metric, kernel, eager, compiled = timing.decisive()
    baselines = [(v, n) for v, n in ((eager, "eager"), (compiled, "torch.compile")) if v is not None]
    if kernel is None or not baselines:
        if keep_unmeasured:
            return KEPT, "verified; not measured on a GPU, kept because --keep-unmeasured was given"
        return NOT_KEPT, "verified; not measured on a GPU, kept only with --keep-unmeasured"
    best, which = min(baselines)
    speedup = best / kernel if kernel > 0 else math.inf
    wall = ""
    if metric == "device time" and timing.kernel_ms is not None and timing.best_baseline_ms is not None:
        wall = f"; wall {timing.kernel_ms:.4g} ms vs {timing.best_baseline_ms:.4g} ms"
    if kernel <= best * (1.0 - margin):
        return KEPT, (f"verified; {timing.what} {metric} {kernel:.4g} ms vs {which} {best:.4g} ms "
                      f"({speedup:.2f}x, needed {1 / (1 - margin):.2f}x){wall}")
    return NOT_KEPT, (f"verified but not faster: {timing.what} {metric} {kernel:.4g} ms vs {which} {best:.4g} ms "
                      f"({speedup:.2f}x; a swap must beat the better of eager and torch.compile by {margin:.0%}){wall}")


