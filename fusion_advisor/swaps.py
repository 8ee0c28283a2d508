"""Verify, time and decide each candidate swap; check and time the whole patched model; write swaps.csv/html.

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
timed alone is host-bound, while inside a model the host runs ahead and a swap changes GPU time. The whole
patched model is then timed by wall clock against eager and torch.compile(model); without GPU timings a swap is
kept only with ``keep_unmeasured``.

Whole model (:func:`check_whole_model`, :func:`bench_whole_model`): the patched model against the original on
the example inputs and fresh ones (outputs, and parameter gradients with ``backward``), with a float64 copy of
the model as the judge where the dtype tolerance is exceeded; on a GPU, each way of running the model timed with
do_bench (first call apart, peak memory). Reports: :func:`swaps_rows`, :func:`render_swaps_csv`,
:func:`render_swaps_html` (report.py offers no hook for an extra section, so swaps.html is its own small page).
"""

from __future__ import annotations

import copy
import html
import io
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from fusion_advisor.tolerances import EAGER_ERROR_FACTOR, tolerance_for, within_eager_error
from fusion_advisor.verify import PoisonAllocations, run_backward, compare_outputs

#: Fresh random input draws per swap (besides the captured inputs and the hard values).
DEFAULT_SEEDS = 2

#: Keep a swap only when it beats the better of eager and torch.compile by this fraction.
DEFAULT_MARGIN = 0.03

#: Hard-value cases: name -> how to derive the inputs from the captured ones.
HARD_CASES = ("hard-large", "hard-tiny", "hard-zeros")

#: An element the kernel gets wrong may still pass if it is no further from float64 than the original ops are,
#: times this factor (see the module docstring).
ORIGINAL_ERROR_FACTOR = 2.0

TIMER_GPU = "do_bench median (cuda)"
TIMER_NONE = "not measured"
NOT_MEASURED_NOTE = "not measured: no GPU (Triton runs in its CPU interpreter, whose speed says nothing about a GPU)"

# decisions
KEPT = "kept"
REJECTED = "rejected"
NOT_KEPT = "not kept"
NOT_TRIED = "not tried"
NOT_VERIFIED = "not verified"


# --- records ------------------------------------------------------------------------------------------------


@dataclass
class SwapVerification:
    """Outcome of :func:`verify_swap`.

    Attributes:
        verified: every case passed every check.
        reason: the first failure, one line (``""`` when verified).
        cases: cases run, in order (stops at the first failure).
        max_abs_err, max_rel_err: largest forward differences from the float64 reference over the cases
            (from the original ops where no float64 reference runs); ``None`` if nothing ran.
        grad_max_abs_err, grad_max_rel_err: the same for input gradients (``None`` unchecked).
        backward_checked: gradients were compared.
        reference: ``"float64"``, ``"float64 inputs; the pattern casts to float32"`` or ``"original ops"``.
        details: one line per check.
    """

    verified: bool
    reason: str = ""
    cases: list[str] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    grad_max_abs_err: float | None = None
    grad_max_rel_err: float | None = None
    backward_checked: bool = False
    reference: str = ""
    details: list[str] = field(default_factory=list)


@dataclass
class SwapTiming:
    """Outcome of :func:`bench_swap`; times in ms (median of one call), ``None`` when not measured.

    Attributes:
        timer: :data:`TIMER_GPU` or :data:`TIMER_NONE`.
        eager_ms, compile_ms, kernel_ms: original ops eagerly, under torch.compile, and the kernel: wall time of
            one call (do_bench median, host overhead included).
        eager_gpu_ms, compile_gpu_ms, kernel_gpu_ms: the same three as device time: summed GPU kernel time of one
            call (:func:`~fusion_advisor.bench.device_time_ms`), what the swap changes inside a model whose host
            runs ahead of the GPU.
        compile_time_ms: torch.compile's first call (tracing + compiling), apart from ``compile_ms``.
        what: ``"forward"`` or ``"forward+backward"``.
        note: why something was not measured.
        steady_state_recompiles: Triton JIT compilations and torch.compile frame compilations during each timed
            run (``"eager"``, ``"kernel"``, ``"compile"``), after a warm-up call: should be 0
            (:func:`fusion_advisor.recompile.summarize`); ``None`` when not measured.
    """

    timer: str
    eager_ms: float | None = None
    compile_ms: float | None = None
    kernel_ms: float | None = None
    compile_time_ms: float | None = None
    eager_gpu_ms: float | None = None
    compile_gpu_ms: float | None = None
    kernel_gpu_ms: float | None = None
    what: str = "forward"
    note: str = ""
    steady_state_recompiles: dict[str, Any] | None = None

    @property
    def best_baseline_ms(self) -> float | None:
        vals = [v for v in (self.eager_ms, self.compile_ms) if v is not None]
        return min(vals) if vals else None

    def decisive(self) -> tuple[str, float | None, float | None, float | None]:
        """``(metric, kernel, eager, compile)``: device times when the kernel's and a baseline's were measured,
        else wall times. A chain of a few microseconds timed alone is host-bound (the timing loop waits on Python
        and the launch path); inside a model the host runs ahead and the swap changes GPU time, so device time
        decides. The whole patched model is then timed by wall clock, which has the last word."""
        if self.kernel_gpu_ms is not None and (self.eager_gpu_ms is not None or self.compile_gpu_ms is not None):
            return "device time", self.kernel_gpu_ms, self.eager_gpu_ms, self.compile_gpu_ms
        return "wall time", self.kernel_ms, self.eager_ms, self.compile_ms


@dataclass
class SwapOutcome:
    """Everything decided about one swap site (joined with its :class:`~fusion_advisor.apply.SwapSite`)."""

    site_id: str
    decision: str
    reason: str
    verification: SwapVerification | None = None
    timing: SwapTiming | None = None

    @property
    def kept(self) -> bool:
        return self.decision == KEPT


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


# --- whole model --------------------------------------------------------------------------------------------


@dataclass
class WholeModelCheck:
    """Patched model vs the original on the example inputs and fresh ones.

    Attributes:
        passed: every input set agreed (outputs, and parameter gradients with ``backward``).
        max_abs_err, max_rel_err: largest output differences patched vs original.
        grad_max_abs_err, grad_max_rel_err: largest parameter-gradient differences (``None`` without backward).
        input_sets: names of the input sets run (``example``, ``fresh-0``).
        swaps_applied: swap keys the patched model's graphs actually contain.
        details: one line per check.
        reference: how the judgement was made (``"original"`` or ``"original, float64 model"``).
    """

    passed: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    grad_max_abs_err: float | None = None
    grad_max_rel_err: float | None = None
    input_sets: list[str] = field(default_factory=list)
    swaps_applied: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    reference: str = "original"


def _tensor_leaves(obj: Any) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _scalarize(out: Any, cache: dict[Any, torch.Tensor] | None = None) -> torch.Tensor:
    """A scalar from a model's outputs to call backward on: a fixed random projection of every float output.

    ``cache`` keeps the projection weights between calls (timed steps must not regenerate them).
    """
    total = None
    for i, t in enumerate(_tensor_leaves(out)):
        if t.is_floating_point() and t.requires_grad:
            key = (i, tuple(t.shape), str(t.device))
            w = cache.get(key) if cache is not None else None
            if w is None:
                gen = torch.Generator().manual_seed(777 + i)
                w = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.device)
                if cache is not None:
                    cache[key] = w
            term = (t.float() * w).sum()
            total = term if total is None else total + term
    if total is None:
        raise RuntimeError("the model's outputs do not require grad: nothing to differentiate")
    return total


def fresh_inputs(inputs: Sequence[Any], seed: int) -> list[Any]:
    """Fresh model inputs like ``inputs`` (see :func:`fresh_like`); non-tensors unchanged."""
    gen = torch.Generator().manual_seed(2000 + seed)
    return [fresh_like(x, gen) if isinstance(x, torch.Tensor) else x for x in inputs]


def _run(model: Callable[..., Any], params: list[torch.Tensor], inputs: Sequence[Any],
         backward: bool) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    with torch.set_grad_enabled(backward):
        out = model(*inputs)
    outs = [t.detach() for t in _tensor_leaves(out)]
    grads: list[torch.Tensor | None] = []
    if backward:
        grads = list(torch.autograd.grad(_scalarize(out), params, allow_unused=True))
    return outs, grads


def check_whole_model(model: torch.nn.Module, patched: Callable[..., Any], inputs: Sequence[Any],
                      backward: bool, fresh_sets: int = 1) -> WholeModelCheck:
    """Compare ``patched`` with ``model`` (eager) on ``inputs`` and ``fresh_sets`` fresh input sets.

    An element passes within its dtype's tolerance of the original; where it does not, a float64 copy of the
    model decides: the patched value passes when it is no further from float64 than the original is, times
    :data:`ORIGINAL_ERROR_FACTOR`, plus the tolerance (bf16 models drift through many layers either way).
    """
    check = WholeModelCheck(passed=True)
    params = [p for p in model.parameters() if p.requires_grad] if backward else []
    sets = [("example", list(inputs))] + [(f"fresh-{s}", fresh_inputs(inputs, s)) for s in range(fresh_sets)]
    model64: torch.nn.Module | None = None
    for name, xs in sets:
        check.input_sets.append(name)
        o_out, o_grads = _run(model, params, xs, backward)
        p_out, p_grads = _run(patched, params, xs, backward)
        pairs = [(f"{name} output {i}", p, o) for i, (p, o) in enumerate(zip(p_out, o_out))]
        pairs += [(f"{name} grad {i}", p, o) for i, (p, o) in enumerate(zip(p_grads, o_grads))
                  if p is not None and o is not None]
        if len(p_out) != len(o_out):
            check.passed = False
            check.details.append(f"{name}: patched model returns {len(p_out)} tensors, original {len(o_out)}")
            continue
        bad = []
        for label, p, o in pairs:
            _, a, r, _ = compare_outputs(p, o, label=label)
            if "grad" in label:
                check.grad_max_abs_err = max(check.grad_max_abs_err or 0.0, a)
                check.grad_max_rel_err = max(check.grad_max_rel_err or 0.0, r)
            else:
                check.max_abs_err, check.max_rel_err = max(check.max_abs_err, a), max(check.max_rel_err, r)
            atol, rtol = tolerance_for(p.dtype)
            if not bool(_close(p, o, atol, rtol).all()):
                bad.append((label, p, o))
        if not bad:
            check.details.append(f"{name}: {len(pairs)} tensors within dtype tolerance of the original model")
            continue
        if model64 is None:
            model64 = _float64_copy(model)
        if model64 is None:
            check.passed = False
            check.details += [f"{label}: outside dtype tolerance of the original (and no float64 model to judge)"
                              for label, _, _ in bad]
            continue
        check.reference = "original, float64 model"
        params64 = [p for p in model64.parameters() if p.requires_grad] if backward else []
        r_out, r_grads = _run(model64, params64, [_upcast(x) for x in xs], backward)
        ref = {f"{name} output {i}": t for i, t in enumerate(r_out)}
        ref.update({f"{name} grad {i}": t for i, t in enumerate(r_grads) if t is not None})
        for label, p, o in bad:
            r = ref.get(label)
            atol, rtol = tolerance_for(p.dtype)
            if r is None:
                ok = False
            else:
                p64, o64, r64 = p.double(), o.double(), r.double().to(p.device)
                ok = bool(((p64 - r64).abs() <= ORIGINAL_ERROR_FACTOR * (o64 - r64).abs() + atol
                           + rtol * r64.abs()).all())
            check.details.append(f"{label}: outside dtype tolerance of the original; "
                                 + ("no further from the float64 model than the original is: ok" if ok
                                    else "further from the float64 model than the original: FAIL"))
            check.passed = check.passed and ok
    return check


def _float64_copy(model: torch.nn.Module) -> torch.nn.Module | None:
    try:
        return copy.deepcopy(model).to(torch.float64)
    except Exception:  # a model that cannot be copied or cast
        return None


@dataclass
class VariantTiming:
    """One way of running the whole model, timed on a GPU (:func:`time_model_variant`).

    Attributes:
        ms: steady-state median of one step (do_bench), ``None`` on error.
        first_call_s: wall time of the first step (compilation included).
        peak_mb: ``torch.cuda.max_memory_allocated`` over three steps, MiB.
        device_ms: summed GPU kernel time of one step, ms (torch.profiler).
        device_ms_by_class: ``device_ms`` split by :func:`~fusion_advisor.bench.kernel_class` (``library`` GEMM /
            attention, ``inductor``, ``fusion_advisor``, ``aten``): what fusing can and cannot touch.
        error: why there is no number.
        steady_state_recompiles: Triton JIT compilations and torch.compile frame compilations while ``ms`` was
            timed (after the first call): should be 0 (:meth:`fusion_advisor.recompile.RecompileReport.to_dict`).
    """

    ms: float | None = None
    first_call_s: float | None = None
    peak_mb: float | None = None
    device_ms: float | None = None
    device_ms_by_class: dict[str, float] = field(default_factory=dict)
    error: str = ""
    steady_state_recompiles: dict[str, Any] | None = None


def time_model_variant(make: Callable[[], Callable[..., Any]], inputs: Sequence[Any], backward: bool,
                       params: Sequence[torch.Tensor]) -> VariantTiming:
    """Build a variant with ``make()`` and time one step of it (forward, or forward + backward to ``params``).

    Never raises for the variant's own failure (compile error, out of memory): it is returned in ``error``.
    """
    from fusion_advisor.bench import device_time_by_kernel, kernel_class, time_cuda
    from fusion_advisor.recompile import RecompileWatch

    cache: dict[Any, torch.Tensor] = {}

    def step(fn: Callable[..., Any]) -> Callable[[], Any]:
        if not backward:
            def fwd() -> Any:
                with torch.no_grad():
                    return fn(*inputs)
            return fwd

        def fwd_bwd() -> Any:
            return torch.autograd.grad(_scalarize(fn(*inputs), cache), list(params), allow_unused=True)
        return fwd_bwd

    out = VariantTiming()
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn = step(make())
        fn()
        torch.cuda.synchronize()
        out.first_call_s = time.perf_counter() - start
        with RecompileWatch() as watch:
            out.ms = time_cuda(fn).median_ms
        out.steady_state_recompiles = watch.report.to_dict()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out.peak_mb = torch.cuda.max_memory_allocated() / 2**20
        by_kernel = device_time_by_kernel(fn, iters=3)
        out.device_ms = sum(by_kernel.values())
        for name, ms in by_kernel.items():
            cls = kernel_class(name)
            out.device_ms_by_class[cls] = out.device_ms_by_class.get(cls, 0.0) + ms
    except Exception as e:  # one variant failing (OOM, compile error) is recorded; the others still run
        if isinstance(e, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        out.ms = None
        out.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


@dataclass
class WholeModelBench:
    """The whole model timed on a GPU, several ways (:func:`bench_whole_model`).

    Attributes:
        what: ``"forward"`` or ``"forward+backward"``.
        variants: ``"eager"``, ``"compile"`` (``torch.compile(model)``), and the advised variants
            (``"advised-eager-rest"``, ``"advised-compile-rest"``) -> :class:`VariantTiming`.
        chosen: the fastest advised variant (the one the plan keeps).
    """

    what: str
    variants: dict[str, VariantTiming] = field(default_factory=dict)
    chosen: str = ""

    def ms(self, name: str) -> float | None:
        v = self.variants.get(name)
        return v.ms if v is not None else None

    @property
    def eager_ms(self) -> float | None:
        return self.ms("eager")

    @property
    def compile_ms(self) -> float | None:
        return self.ms("compile")

    @property
    def advised_ms(self) -> float | None:
        return self.ms(self.chosen) if self.chosen else None

    @property
    def speedup_vs_eager(self) -> float | None:
        return self.eager_ms / self.advised_ms if self.eager_ms and self.advised_ms else None

    @property
    def speedup_vs_compile(self) -> float | None:
        return self.compile_ms / self.advised_ms if self.compile_ms and self.advised_ms else None

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "chosen": self.chosen, "eager_ms": self.eager_ms, "compile_ms": self.compile_ms,
                "advised_ms": self.advised_ms, "speedup_vs_eager": self.speedup_vs_eager,
                "speedup_vs_compile": self.speedup_vs_compile,
                "variants": {k: asdict(v) for k, v in self.variants.items()}}


def bench_whole_model(model: torch.nn.Module, advised: dict[str, Callable[[], Callable[..., Any]]],
                      inputs: Sequence[Any], backward: bool) -> WholeModelBench:
    """Time ``model`` eagerly, ``torch.compile(model)`` and each advised variant (GPU only); choose the fastest
    advised variant."""
    result = WholeModelBench(what="forward+backward" if backward else "forward")
    params = [p for p in model.parameters() if p.requires_grad]
    makers: dict[str, Callable[[], Callable[..., Any]]] = {"eager": lambda: model,
                                                           "compile": lambda: torch.compile(model)}
    makers.update(advised)
    for name, make in makers.items():
        torch._dynamo.reset()
        result.variants[name] = time_model_variant(make, inputs, backward, params)
    timed = {n: result.variants[n].ms for n in advised if result.variants[n].ms is not None}
    result.chosen = min(timed, key=timed.__getitem__) if timed else ""
    return result


# --- reports ------------------------------------------------------------------------------------------------

#: swaps.csv columns and what each holds.
SWAP_COLUMNS: dict[str, str] = {
    "swap": "Swap id 's<index>' (in the order matches were found).",
    "chain": "Analysis chain(s) holding the matched ops (';'-separated), ids of apply's own capture.",
    "kernel": "Library kernel whose pattern matched.",
    "verified": "True/False after verification; empty when not verified (not a candidate, or no --verify).",
    "max_abs_err": "Largest forward |kernel - float64 reference| over the verification cases.",
    "max_rel_err": "Largest forward relative difference over the verification cases.",
    "grad_max_abs_err": "Largest input-gradient |kernel - float64 reference| (empty without backward).",
    "eager_ms": "Original ops, eager, ms (median); empty when not measured.",
    "compile_ms": "Original ops under torch.compile, ms (median, compile time apart); empty when not measured.",
    "kernel_ms": "The kernel, ms (median); empty when not measured.",
    "eager_gpu_ms": "Original ops, eager: device time, summed GPU kernel time of one call, ms (torch.profiler).",
    "compile_gpu_ms": "Original ops under torch.compile: device time of one call, ms.",
    "kernel_gpu_ms": "The kernel: device time of one call, ms. Decides when measured (see 'reason').",
    "compile_time_ms": "torch.compile's first call on the original ops (compilation), ms.",
    "timer": "How times were taken ('do_bench median (cuda)' or 'not measured').",
    "decision": "kept / rejected / not kept / not tried / not verified.",
    "reason": "Why, with the numbers.",
    "route": "The analysis route of the chain (skip / torch.compile / triton) and the rule that decided.",
    "source": "file:line of the pattern's last op.",
    "module_path": "nn.Module that issued it.",
    "signature": "Kernel with input shapes/dtypes and captured constants.",
    "ops": "Matched op ids (apply's capture), ';'-separated.",
}


def swaps_rows(sites: Sequence[Any], outcomes: dict[str, SwapOutcome]) -> list[dict[str, Any]]:
    """One row per swap site, keys :data:`SWAP_COLUMNS`."""
    rows = []
    for s in sites:
        o = outcomes.get(s.id)
        v = o.verification if o else None
        t = o.timing if o else None
        rows.append({
            "swap": s.id,
            "chain": ";".join(s.chain_ids),
            "kernel": s.kernel,
            "verified": "" if v is None else bool(v.verified),
            "max_abs_err": _num(v.max_abs_err if v else None),
            "max_rel_err": _num(v.max_rel_err if v else None),
            "grad_max_abs_err": _num(v.grad_max_abs_err if v else None),
            "eager_ms": _num(t.eager_ms if t else None),
            "compile_ms": _num(t.compile_ms if t else None),
            "kernel_ms": _num(t.kernel_ms if t else None),
            "eager_gpu_ms": _num(t.eager_gpu_ms if t else None),
            "compile_gpu_ms": _num(t.compile_gpu_ms if t else None),
            "kernel_gpu_ms": _num(t.kernel_gpu_ms if t else None),
            "compile_time_ms": _num(t.compile_time_ms if t else None),
            "timer": t.timer if t else "",
            "decision": o.decision if o else "",
            "reason": o.reason if o else "",
            "route": f"{s.route}{' (' + s.route_rule + ')' if s.route_rule else ''}",
            "source": f"{s.source.file}:{s.source.line}" if s.source.file else "",
            "module_path": s.module_path,
            "signature": s.signature,
            "ops": ";".join(s.op_ids),
        })
    return rows


def _num(x: float | None) -> float | str:
    return "" if x is None or not math.isfinite(x) else float(x)


def render_swaps_csv(rows: list[dict[str, Any]]) -> str:
    import csv

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(SWAP_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


_CSS = ("body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}"
        "td{max-width:28em;overflow-wrap:anywhere}td:nth-child(5){min-width:24em}th{background:#f3f3f3}"
        ".kept{background:#e6f4ea}.rejected{background:#fce8e6}.muted{color:#777}code{font-size:12px}")


def render_swaps_html(title: str, header: list[tuple[str, str]], rows: list[dict[str, Any]],
                      near_misses: list[dict[str, Any]], whole: dict[str, Any] | None, notes: list[str]) -> str:
    """A small self-contained HTML page: swaps, near-misses, whole-model results (every string escaped)."""
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style>"
           f"</head><body><h1>{e(title)}</h1><table>"]
    out += [f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in header]
    out.append("</table>")
    for n in notes:
        out.append(f"<p class='muted'>{e(n)}</p>")
    cols = ["swap", "kernel", "chain", "decision", "reason", "verified", "max_abs_err", "max_rel_err",
            "eager_ms", "compile_ms", "kernel_ms", "eager_gpu_ms", "compile_gpu_ms", "kernel_gpu_ms", "route", "source",
            "module_path"]  # the long signature (shapes, constants) is in swaps.csv
    out.append(f"<h2>Swaps ({len(rows)})</h2><table><tr>" + "".join(f"<th>{e(c)}</th>" for c in cols) + "</tr>")
    for r in rows:
        cls = "kept" if r["decision"] == KEPT else "rejected" if r["decision"] == REJECTED else ""
        cells = "".join(f"<td>{e(_fmt(r.get(c, '')))}</td>" for c in cols)
        out.append(f"<tr class='{cls}'>{cells}</tr>")
    out.append("</table>")
    out.append(f"<h2>Near-misses ({len(near_misses)})</h2>")
    if near_misses:
        ncols = ["kernel", "kind", "reason", "chains", "source", "module_path"]
        out.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in ncols) + "</tr>")
        for r in near_misses:
            out.append("<tr>" + "".join(f"<td>{e(_fmt(r.get(c, '')))}</td>" for c in ncols) + "</tr>")
        out.append("</table>")
    out.append("<h2>Whole model</h2>")
    if whole:
        out.append("<table>" + "".join(f"<tr><th>{e(k)}</th><td>{e(_fmt(v))}</td></tr>" for k, v in whole.items())
                   + "</table>")
    else:
        out.append("<p class='muted'>No swap kept: the model is unchanged, nothing to check.</p>")
    cdoc = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in SWAP_COLUMNS.items())
    out.append(f"<h2>Columns</h2><table>{cdoc}</table></body></html>\n")
    return "".join(out)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "; ".join(str(x) for x in v)
    return "" if v is None else str(v)


def asdict_or_none(obj: Any) -> dict[str, Any] | None:
    return asdict(obj) if obj is not None else None
