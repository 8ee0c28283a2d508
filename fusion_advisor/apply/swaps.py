"""Per swap: verify the kernel against the user's own ops and float64, time it alone, and decide.

Per swap (:func:`verify_swap`), the verification engine (:func:`fusion_advisor.verification.kernel.check_case`)
checks the kernel's ``replacement`` against a float64 reference (the kernel's ``pattern`` run on float64 inputs,
in float64 throughout) with the user's own matched ops (the subgraph cut out of the captured graph, in the model's
dtypes) as the eager computation whose error sets the scale, on

- ``captured``: the chain's real inputs, recorded from a forward pass of the model on its example inputs;
- ``fresh-<seed>``: fresh inputs with the captured ones' structure
  (:func:`fusion_advisor.verification.inputs.fresh_like`: plain floats redrawn from N(mean, std) of their finite
  values; masks, ``-inf`` / ``finfo.min`` patterns, integers, index tensors, probabilities and one-hot rows kept);
- ``hard-large`` (plain floats x8), ``hard-tiny`` (x1e-3, below eps for norms) and ``hard-zeros`` (the first plain
  float input 0): :func:`fusion_advisor.verification.inputs.hard_variants`.

The kernel runs under poisoned allocations in redzones (an element it forgets to write is NaN, a store past an
output's end is seen), its inputs must be unchanged afterwards, its output dtypes must equal the original ops' (no
silent casts), and every output (with ``backward``, every input gradient for one random ``grad_output``) must pass
the error policy (:mod:`fusion_advisor.verification.policy`): no further from float64 than the original ops are,
times 2 norm-wise and 4 max-wise, plus the dtype's floor; NaN and inf only where float64 has them.

Timing (:func:`bench_swap`): on a GPU, the original ops eagerly, under ``torch.compile`` (first-call compile time
apart) and the kernel, forward (or forward+backward with ``backward``), each two ways: wall time
(``triton.testing.do_bench`` median) and device time (summed GPU kernel time of one call, torch.profiler). Without
a GPU nothing is timed: Triton's CPU interpreter says nothing about GPU speed.

Decision (:func:`decide`): an unverified swap is never kept; a verified one is kept when the kernel beats the
better of eager and torch.compile by ``margin`` in device time (wall time when device time is missing): a chain
timed alone is host-bound, while inside a model the host runs ahead and a swap changes GPU time. One that beats
eager but not torch.compile is kept for an eager rest only (:data:`KEPT_EAGER_REST`): in a variant whose other ops
run eagerly, the alternative to the swap is the eager op (a Llama step's SwiGLU at Llama-3-8B widths: the kernel
as fast as Inductor's code for it, 1.7x eager's on the H200). A swap kept here is only a candidate: the
whole-model variants (:mod:`fusion_advisor.apply.search`) decide whether the model uses it. Without GPU timings a
swap is kept only with ``keep_unmeasured``."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from fusion_advisor.apply.records import (
    KEPT, KEPT_EAGER_REST, NOT_KEPT, NOT_MEASURED_NOTE, NOT_VERIFIED, REJECTED, TIMER_GPU, TIMER_NONE, SwapTiming,
    SwapVerification,
)
from fusion_advisor.memory import release_cuda_memory
from fusion_advisor.verification.inputs import HARD_CASES, fresh_like, hard_variants
from fusion_advisor.verification.kernel import ReferenceFailed, check_case
from fusion_advisor.verification.policy import compare_outputs
from fusion_advisor.verification.trees import floating, tensor_leaves

#: Fresh input draws per swap (besides the captured inputs and the hard values).
DEFAULT_SEEDS = 2

#: Keep a swap only when it beats the better of eager and torch.compile by this fraction.
DEFAULT_MARGIN = 0.03

__all__ = ["DEFAULT_MARGIN", "DEFAULT_SEEDS", "HARD_CASES", "bench_swap", "decide", "verify_swap"]


# --- cases --------------------------------------------------------------------------------------------------


def _cases(captured: list[Any], seeds: int) -> list[tuple[str, Callable[[], list[Any]]]]:
    """``captured``, ``fresh-<seed>`` for each seed, then the hard values: ``(name, make_args)``."""
    def fresh(seed: int) -> Callable[[], list[Any]]:
        def make() -> list[Any]:
            gen = torch.Generator().manual_seed(1000 + seed)
            return [fresh_like(a, gen) if isinstance(a, torch.Tensor) else a for a in captured]
        return make

    cases: list[tuple[str, Callable[[], list[Any]]]] = [("captured", lambda: list(captured))]
    cases += [(f"fresh-{s}", fresh(s)) for s in range(seeds)]
    cases += [(name, (lambda a=a: a)) for name, a in hard_variants(captured)]
    return cases


# --- verification -------------------------------------------------------------------------------------------


def verify_swap(entry: Any, original: Callable[..., Any], captured: list[Any], names: list[str],
                backward: bool, seeds: int = DEFAULT_SEEDS,
                expected_outputs: Sequence[torch.Tensor] | None = None,
                requires_grad: Sequence[bool] | None = None, captured_only: bool = False) -> SwapVerification:
    """Check ``entry.replacement`` against the user's matched ops and float64 on the cases of the module docstring.

    Args:
        entry: the :class:`~kernel_library.registry.KernelEntry`.
        original: the matched ops, ``original(*tensor_args) -> output(s)`` (:func:`fusion_advisor.apply.extract_subgraph`).
        captured: the pattern's arguments as recorded (tensors) and captured (scalars), in parameter order.
        names: the pattern's parameter names (for messages).
        backward: also compare input gradients.
        seeds: fresh draws.
        expected_outputs: the outputs the model produced at this site; ``original`` on ``captured`` must reproduce
            them (within the dtype's element-wise tolerance), which proves the cut-out subgraph is the model's
            computation.
        requires_grad: per argument, whether it requires grad in the model (gradients are checked for those);
            default every floating tensor.
        captured_only: run only the ``captured`` case (the fresh and hard-value cases were run on another site
            with the same signature: same kernel, shapes, dtypes and constants).

    Never raises for a kernel fault: a kernel that raises (compile error, out of memory, bad launch) fails.
    """
    result = SwapVerification(verified=False)
    tensor_pos = [i for i, a in enumerate(captured) if isinstance(a, torch.Tensor)]

    def orig_call(*args: Any) -> Any:
        return original(*[args[i] for i in tensor_pos])

    if expected_outputs is not None:
        with torch.no_grad():
            got = tensor_leaves(orig_call(*captured))
        exp = list(expected_outputs)
        if len(got) != len(exp) or not all(
                g.shape == e.shape and g.dtype == e.dtype and compare_outputs(g, e)[0] for g, e in zip(got, exp)):
            result.reason = ("the cut-out original ops do not reproduce the model's values at this site: the swap "
                             "cannot be verified")
            result.details.append(result.reason)
            return result
        result.details.append("the original ops cut out of the graph reproduce the model's recorded values")

    grad_args = [backward and floating(a) and (requires_grad is None or bool(requires_grad[i]))
                 for i, a in enumerate(captured)]
    labels = [f"input '{names[i]}'" if i < len(names) else f"input {i}" for i in range(len(captured))]
    abs_max, rel_max, gabs_max, grel_max = 0.0, 0.0, 0.0, 0.0
    any_errs = out_of_memory = False
    cases = _cases(captured, seeds)
    for n, (case, make) in enumerate(cases[:1] if captured_only else cases):
        result.cases.append(case)
        args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in make()]
        try:
            outcome = check_case(case, entry.replacement, entry.pattern, args, eager_fn=orig_call, labels=labels,
                                 grad_args=grad_args, grad_seed=n, kernel_name="the kernel",
                                 reference_name="the pattern", eager_name="the original ops")
        except torch.cuda.OutOfMemoryError as e:
            ok, line = False, f"{case}: out of GPU memory: {str(e).splitlines()[0]}"
            out_of_memory = True
        except ReferenceFailed as e:
            ok, line = False, f"{case}: neither the pattern nor the original ops run on these inputs: {e}"
        except Exception as e:  # a fault of the verification itself: the swap is not verified, with the reason
            ok, line = False, f"{case}: raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            ok, line = outcome.ok, outcome.failure
            result.reference = result.reference or outcome.reference
            result.backward_checked |= outcome.backward_checked
            any_errs = True
            abs_max, rel_max = max(abs_max, outcome.max_abs_diff), max(rel_max, outcome.max_rel_diff)
            if outcome.grad_max_abs_diff is not None:
                gabs_max = max(gabs_max, outcome.grad_max_abs_diff)
                grel_max = max(grel_max, outcome.grad_max_rel_diff or 0.0)
            if ok:
                result.details.append(_case_summary(case, outcome))
        if not ok:
            result.reason = line
            result.details.append(line)
            break
    else:
        result.verified = True
    if out_of_memory:  # out of the handler, so the case's exception and the frames and tensors it held are gone
        args = outcome = None
        release_cuda_memory()
    if any_errs:
        result.max_abs_err, result.max_rel_err = abs_max, rel_max
        if result.backward_checked:
            result.grad_max_abs_err, result.grad_max_rel_err = gabs_max, grel_max
    return result


def _case_summary(case: str, outcome: Any) -> str:
    """``captured: passed; worst tensor: <its judgement>``: the tensor closest to its limits."""
    if not outcome.judgements:
        return f"{case}: passed"
    _, worst = max(outcome.judgements, key=lambda lj: lj[1].share_of_limit)
    return f"{case}: passed; closest to its limits: {worst.reason}"


# --- timing -------------------------------------------------------------------------------------------------


def _time_steady(fn: Callable[[], Any], label: str, recompiles: dict[str, Any], warm: bool = True) -> float:
    """``time_cuda(fn)`` median in ms, after one warm-up call (``warm``), under a RecompileWatch whose report
    goes to ``recompiles[label]``."""
    from fusion_advisor.kernel_tools.bench import time_cuda
    from fusion_advisor.kernel_tools.recompile import RecompileWatch

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
    from fusion_advisor.kernel_tools.bench import device_time_ms

    tensor_pos = [i for i, a in enumerate(captured) if isinstance(a, torch.Tensor)]
    float_pos = [i for i in tensor_pos if floating(captured[i]) and (requires_grad is None or requires_grad[i])]
    args = [a.detach().clone().requires_grad_(backward and i in float_pos) if isinstance(a, torch.Tensor) else a
            for i, a in enumerate(captured)]

    def step(fn: Callable[[list[Any]], Any]) -> Callable[[], Any]:
        if not backward:
            def fwd() -> Any:
                with torch.no_grad():
                    return fn(args)
            return fwd

        def fwd_bwd() -> Any:
            outs = [o for o in tensor_leaves(fn(args)) if o.requires_grad]
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
    from fusion_advisor.kernel_tools.recompile import summarize

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
    if eager is not None and compiled is not None and kernel <= eager * (1.0 - margin):
        return KEPT_EAGER_REST, (
            f"verified; for variants whose other ops run eagerly: {timing.what} {metric} {kernel:.4g} ms vs eager "
            f"{eager:.4g} ms ({eager / kernel:.2f}x), but not torch.compile's {compiled:.4g} ms "
            f"({compiled / kernel:.2f}x; needed {1 / (1 - margin):.2f}x){wall}")
    return NOT_KEPT, (f"verified but not faster: {timing.what} {metric} {kernel:.4g} ms vs {which} {best:.4g} ms "
                      f"({speedup:.2f}x; a swap must beat the better of eager and torch.compile by {margin:.0%}){wall}")


