"""The engine: one candidate call checked against its float64 reference and its eager computation.

:func:`check_case` is what ``verify`` / ``bench`` / ``bench --sweep`` run for a kernel contract (candidate
``kernel_fn``, reference and eager ``reference_fn``) and what ``apply`` runs for each swap (candidate the library
kernel, reference its pattern, eager the user's own ops cut out of the model). On one set of arguments it

1. runs the candidate under :class:`~fusion_advisor.verification.poison.PoisonAllocations` (every allocation NaN
   inside poisoned redzones) and :class:`~fusion_advisor.verification.launch.GridLimits` (CUDA's grid limits,
   enforced under Triton's interpreter too); a candidate that raises fails, with the file and line;
2. checks that it left its inputs as they were and stored nothing outside its allocations;
3. runs the eager computation on copies of the inputs in their own dtypes, and the reference on float64 copies
   under :class:`KeepFloat64` (a ``.float()`` or ``dtype=torch.float32`` inside the reference stays float64, so the
   reference is float64 throughout); where that raises, in float64 as written; where that raises too, the eager
   output is the reference (compared element-wise at the dtype's tolerance, and said so);
4. requires the candidate's output dtypes to be the eager computation's (no silent casts) and judges every output
   leaf with :func:`~fusion_advisor.verification.policy.judge_outputs` (the error policy; element-wise at the
   caller's ``atol`` / ``rtol`` when given);
5. when inputs require grad: one random ``grad_output`` per floating output (seeded, the same for all three), the
   candidate's backward under poisoned allocations again (with the mutation and redzone checks), and every input
   gradient judged against the float64 reference's with the eager gradient as the scale.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from fusion_advisor.verification.inputs import same_dtype_copy, upcast
from fusion_advisor.verification.launch import GridLimits
from fusion_advisor.verification.poison import PoisonAllocations, modified_inputs, run_backward, snapshot
from fusion_advisor.verification.policy import Judgement, judge_outputs
from fusion_advisor.verification.trees import dtype_text, floating, input_leaves, leaves, tree_map

#: Floating dtypes a float64 reference must not be cast down to (see :class:`KeepFloat64`).
_LOWER_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
_LOWER_COMPLEX = frozenset({torch.complex64, getattr(torch, "complex32", torch.complex64)})


class KeepFloat64(TorchFunctionMode):
    """Keep a float64 computation in float64: casts of float64 tensors to fp32 / fp16 / bf16 become no-ops.

    The patterns ``apply`` matches are written as the model's code is (``hidden.to(torch.float32)``,
    ``softmax(x, dtype=torch.float32)``, ``logits.float()``), so run on float64 inputs they would compute in fp32,
    and a reference as precise as the candidate cannot tell the candidate's error from eager's. Under this mode
    ``Tensor.to`` / ``type`` / ``float`` / ``half`` / ``bfloat16`` of a float64 (complex128) tensor to a lower
    precision, and a ``dtype=`` argument naming one when a float64 tensor is among the arguments, keep float64
    (complex128). Casts to integers and bools are untouched.

    Attributes:
        kept: casts turned into no-ops.
    """

    def __init__(self) -> None:
        super().__init__()
        self.kept = 0

    @staticmethod
    def _high(x: Any) -> bool:
        return isinstance(x, torch.Tensor) and x.dtype in (torch.float64, torch.complex128)

    def _keep(self, dtype: Any, src: torch.Tensor) -> Any:
        """``dtype``, or ``src``'s own where ``dtype`` is a lower precision of the same kind (real / complex)."""
        lower = _LOWER_COMPLEX if src.is_complex() else _LOWER_FLOATS
        if isinstance(dtype, torch.dtype) and dtype in lower:
            self.kept += 1
            return src.dtype
        return dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16) and args \
                and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            self.kept += 1
            return args[0]  # as x.float() of an fp32 tensor returns x itself
        if func in (torch.Tensor.to, torch.Tensor.type) and args and self._high(args[0]):
            src = args[0]
            rest = []
            for a in args[1:]:
                if isinstance(a, torch.Tensor) and a.dtype in _LOWER_FLOATS and not src.is_complex():
                    a = self._keep(a.dtype, src) if a.device == src.device else a.device  # x.to(other)
                rest.append(self._keep(a, src))
            if "dtype" in kwargs:
                kwargs["dtype"] = self._keep(kwargs["dtype"], src)
            return func(src, *rest, **kwargs)
        if isinstance(kwargs.get("dtype"), torch.dtype) and kwargs["dtype"] in _LOWER_FLOATS:
            src = next((a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.float64), None)
            if src is not None:
                kwargs["dtype"] = self._keep(kwargs["dtype"], src)
        return func(*args, **kwargs)


class ReferenceFailed(Exception):
    """The reference raised in float64 and in the inputs' own dtypes, and no eager computation ran either.

    Attributes:
        original: the exception of the last attempt.
    """

    def __init__(self, message: str, original: BaseException):
        super().__init__(message)
        self.original = original


def user_frame(exc: BaseException, path: Path | None) -> str:
    """``file:line`` of the innermost traceback frame inside ``path`` (or the innermost frame at all)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if path is not None:
        resolved = Path(path).resolve()
        inside = [f for f in frames if Path(f.filename).resolve() == resolved]
        if inside:
            return f"{inside[-1].filename}:{inside[-1].lineno}"
        return str(path)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "<unknown>"


def arg_labels(fn: Callable, n: int) -> list[str]:
    """``input i (name)`` for the first ``n`` positional parameters of ``fn`` (``input i`` where unknown)."""
    import inspect

    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [f"input {i} ({params[i]})" if i < len(params) else f"input {i}" for i in range(n)]


def describe_inputs(args: Sequence[Any], labels: Sequence[str]) -> str:
    """``x [16, 1000] bfloat16, weight [1000] bfloat16``: the tensor arguments' shapes and dtypes."""
    parts = [f"{lab} {list(x.shape)} {dtype_text(x.dtype)}" for lab, x in input_leaves(list(args), list(labels))
             if isinstance(x, torch.Tensor)]
    return ", ".join(parts) or "no tensors"


@dataclass
class CaseOutcome:
    """What :func:`check_case` found on one set of arguments.

    Attributes:
        case: the case's name (``seed 0``, ``captured``, ``hard-large``, ``shape one row``).
        ok: every check passed.
        details: one line per check, each starting with ``case``.
        failure: the first failing line (``""`` when ok).
        reference: ``"float64"``, ``"float64 inputs; the reference casts to float32"`` or ``"input dtypes"``.
        inputs: the tensor arguments' shapes and dtypes (:func:`describe_inputs`).
        max_abs_diff, max_rel_diff: largest forward differences from the reference over the output leaves
            (``inf`` where NaN/inf are misplaced or the candidate raised).
        backward_checked: gradients were compared.
        grad_max_abs_diff, grad_max_rel_diff: the same over input gradients (``None`` unchecked).
        judgements: ``(label, Judgement)`` of every floating output and gradient judged by the policy.
        traceback: the candidate's formatted traceback when it raised (forward or backward); ``raised``: the
            exception's type then.
    """

    case: str
    ok: bool = True
    details: list[str] = field(default_factory=list)
    failure: str = ""
    reference: str = ""
    inputs: str = ""
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    backward_checked: bool = False
    grad_max_abs_diff: float | None = None
    grad_max_rel_diff: float | None = None
    judgements: list[tuple[str, Judgement]] = field(default_factory=list)
    traceback: str | None = None
    raised: type[BaseException] | None = None

    def fail(self, line: str) -> None:
        """Record a failing ``line`` (prefixed with the case)."""
        line = f"{self.case}: {line}"
        self.details.append(line)
        if self.ok:
            self.failure = line
        self.ok = False

    def note(self, line: str) -> None:
        """Record a passing or informational ``line`` (prefixed with the case)."""
        self.details.append(f"{self.case}: {line}")


@dataclass
class _Run:
    output: Any
    grads: dict[int, torch.Tensor | None]  # input leaf index -> gradient
    pairs: list[int]  # output leaf indices whose output requires grad (and got a grad_output)


def _run(fn: Callable[..., Any], args: list[Any], labels: list[str], grad_idx: list[int],
         grad_outputs: dict[int, torch.Tensor], pairs: list[int] | None = None) -> _Run:
    """``fn(*args)`` and, when ``grad_idx``, the input gradients for ``grad_outputs`` (on ``pairs``, default every
    output leaf that requires grad)."""
    with torch.set_grad_enabled(bool(grad_idx)):
        out = fn(*args)
    grads: dict[int, torch.Tensor | None] = {}
    if not grad_idx:
        return _Run(out, grads, [])
    out_leaves = [leaf for _, leaf in leaves(out, "output")]
    if pairs is None:
        pairs = [i for i, leaf in enumerate(out_leaves)
                 if i in grad_outputs and isinstance(leaf, torch.Tensor) and leaf.requires_grad]
    usable = [i for i in pairs if i < len(out_leaves) and isinstance(out_leaves[i], torch.Tensor)
              and out_leaves[i].requires_grad]
    if usable and usable == pairs:
        in_leaves = [leaf for _, leaf in input_leaves(args, labels)]
        res = torch.autograd.grad([out_leaves[i] for i in pairs], [in_leaves[j] for j in grad_idx],
                                  [grad_outputs[i].to(out_leaves[i].dtype) for i in pairs], allow_unused=True)
        grads = dict(zip(grad_idx, res))
    return _Run(out, grads, pairs)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def check_case(case: str, kernel_fn: Callable[..., Any], reference_fn: Callable[..., Any], args: Sequence[Any], *,
               eager_fn: Callable[..., Any] | None = None, labels: Sequence[str] | None = None,
               grad_args: Sequence[bool] | None = None, atol: float | None = None, rtol: float | None = None,
               tf32: bool = False, grad_seed: int = 0, path: Path | None = None, kernel_name: str = "kernel_fn",
               reference_name: str = "reference_fn", eager_name: str | None = None) -> CaseOutcome:
    """Check ``kernel_fn(*args)`` against ``reference_fn`` in float64 and ``eager_fn`` in the inputs' dtypes.

    Args:
        case: the case's name, prefixed to every detail line.
        kernel_fn: the candidate, called on ``args`` themselves (strides and offsets as given).
        reference_fn: plain PyTorch with the same signature, run on float64 copies (the reference).
        args: the arguments: tensors (nested lists / tuples / dicts too), numbers, strings, ``None``.
        eager_fn: the eager computation, same signature, run on same-dtype copies; default ``reference_fn``.
        labels: one label per argument for messages (default :func:`arg_labels` of ``reference_fn``).
        grad_args: per top-level argument, whether its gradient is checked (the argument is detached and made
            to require grad, or not); ``None``: the arguments' own ``requires_grad`` flags decide.
        atol, rtol: element-wise tolerances instead of the error policy (either given).
        tf32: fp32 outputs may come from TF32 products (the policy's TF32 floor).
        grad_seed: seeds the random ``grad_output``\\ s.
        path: the candidate's file, for ``file:line`` in messages.
        kernel_name, reference_name, eager_name: how messages name the three (``eager_name`` defaults to
            ``reference_name``).

    Returns:
        A :class:`CaseOutcome`; a candidate that raises fails there, it is not raised.

    Raises:
        ReferenceFailed: neither the reference (float64 or the inputs' dtypes) nor the eager computation runs.
    """
    eager_name = eager_name or reference_name
    args = list(args)
    if grad_args is not None:
        args = [a.detach().requires_grad_(bool(g) and floating(a)) if isinstance(a, torch.Tensor) else a
                for a, g in zip(args, list(grad_args) + [False] * (len(args) - len(grad_args)))]
    labels = list(labels) if labels is not None else arg_labels(reference_fn, len(args))
    outcome = CaseOutcome(case, inputs=describe_inputs(args, labels))
    arg_leaves = input_leaves(args, labels)
    snap = [tree_map(snapshot, a) for a in args]
    snap_leaves = input_leaves(snap, labels)
    grad_idx = [j for j, (_, x) in enumerate(arg_leaves) if isinstance(x, torch.Tensor) and x.requires_grad]

    # 1-2. the candidate, allocations poisoned, launches within CUDA's limits; inputs unchanged
    mode = PoisonAllocations()
    try:
        with torch.set_grad_enabled(bool(grad_idx) or torch.is_grad_enabled()), GridLimits(), mode:
            out = kernel_fn(*args)
    except Exception as exc:  # the candidate's own failure: reported, never raised
        outcome.fail(f"{kernel_name} raised {type(exc).__name__}: {exc} (at {user_frame(exc, path)})")
        outcome.max_abs_diff = outcome.max_rel_diff = math.inf
        outcome.traceback = "".join(traceback.format_exception(exc))
        outcome.raised = type(exc)
        return outcome
    outcome.note(f"{kernel_name} ran with {mode.poisoned} allocation(s) poisoned"
                 + (f"; custom ops {', '.join(sorted(mode.opaque_custom_ops))} could not be entered, so their "
                    f"allocations were not poisoned" if mode.opaque_custom_ops else ""))
    guards = modified_inputs(arg_leaves, snap_leaves, f"by {kernel_name}")
    guards += [f"{kernel_name}: {line}" for line in mode.redzone_violations()]

    # one random grad_output per floating output of the candidate, the same for all three
    out_pairs = leaves(out, "output")
    out_labels, out_leaves = [lab for lab, _ in out_pairs], [leaf for _, leaf in out_pairs]
    grad_outputs: dict[int, torch.Tensor] = {}
    if grad_idx:
        for i, leaf in enumerate(out_leaves):
            if floating(leaf):
                gen = torch.Generator(device=leaf.device).manual_seed(10_000 + 97 * grad_seed + i)
                grad_outputs[i] = torch.randn(leaf.shape, dtype=leaf.dtype, device=leaf.device, generator=gen)

    # 3. the reference in float64 (throughout, else as written), then the eager computation on its output pairs
    ref: _Run | None = None
    failures: list[BaseException] = []
    keep = KeepFloat64()
    for attempt in ("float64 throughout", "float64 as written"):
        try:
            f64_args = [tree_map(upcast, a) for a in snap]
            if attempt == "float64 throughout":
                with keep:
                    ref = _run(reference_fn, f64_args, labels, grad_idx, grad_outputs)
            else:
                ref = _run(reference_fn, f64_args, labels, grad_idx, grad_outputs)
            break
        except Exception as exc:  # the reference refuses float64 (this way): try the next
            failures.append(exc)
    eager: _Run | None = None
    eager_exc: BaseException | None = None
    try:
        eager = _run(eager_fn or reference_fn, [tree_map(same_dtype_copy, a) for a in snap], labels, grad_idx,
                     grad_outputs, ref.pairs if ref is not None else None)
    except Exception as exc:  # no eager computation: the floors alone bound the error
        eager_exc = exc
    if ref is not None:
        out_dtypes = {x.dtype for _, x in leaves(ref.output, "") if floating(x)}
        if len(failures) == 0:
            outcome.reference = "float64"
            if keep.kept:
                outcome.note(f"{reference_name} ran in float64 throughout ({keep.kept} cast(s) to a lower precision "
                             f"kept at float64)")
        elif out_dtypes <= {torch.float64, torch.complex128}:
            outcome.reference = "float64"
        else:
            outcome.reference = ("float64 inputs; the reference casts to "
                                 + ", ".join(sorted(dtype_text(d) for d in out_dtypes)))
    elif eager is not None:
        outcome.reference = "input dtypes"
        outcome.note(f"{reference_name} failed in float64 ({type(failures[-1]).__name__}: "
                     f"{_first_line(failures[-1])}); compared against {eager_name} in the inputs' own dtypes")
        ref = eager
    else:
        # the last failure leaves with the exception and no local keeps it (a local would close the cycle below)
        failures[:] = [eager_exc or failures[-1]]
        eager_exc = None
        raise ReferenceFailed(f"{reference_name} raised {type(failures[0]).__name__}: {failures[0]}", failures.pop())
    if eager is None and eager_exc is not None:
        outcome.note(f"{eager_name} does not run in the inputs' own dtypes ({type(eager_exc).__name__}: "
                     f"{_first_line(eager_exc)}): the dtype floors alone bound the error")
    # a caught exception's traceback holds this frame, and with it every tensor above, in a reference cycle that
    # only the collector frees: on an H100 a float64 reference that ran out of memory kept 54 GiB allocated past
    # the check of KernelBench's 4096 x 393216 softmax. Their messages are written: drop them
    failures.clear()
    eager_exc = None

    # 4. dtypes and values of the outputs
    for line in guards:
        outcome.fail(line)
    if eager is not None:
        le = leaves(eager.output, "output")
        if [lab for lab, _ in le] == out_labels:
            for (lab, a), (_, e) in zip(out_pairs, le):
                if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and a.dtype != e.dtype:
                    outcome.fail(f"{lab}: dtype {dtype_text(a.dtype)}, {eager_name} returns {dtype_text(e.dtype)} "
                                 f"(no silent casts)")
    f64 = outcome.reference != "input dtypes"
    verdict = judge_outputs(out, ref.output, eager.output if eager is not None else None, "output", tf32=tf32,
                            atol=atol, rtol=rtol, reference_is_float64=f64)
    outcome.judgements += verdict.judgements
    outcome.max_abs_diff, outcome.max_rel_diff = verdict.max_abs_diff, verdict.max_rel_diff
    for line in verdict.lines:
        if line in verdict.failures:
            outcome.fail(line)
        else:
            outcome.note(line)

    # 5. gradients
    if not grad_idx:
        return outcome
    if not ref.pairs:
        outcome.note(f"inputs require grad but {reference_name}'s outputs do not: backward not checked")
        return outcome
    outcome.backward_checked = True
    no_grad = [out_labels[i] for i in ref.pairs
               if not (i < len(out_leaves) and isinstance(out_leaves[i], torch.Tensor) and out_leaves[i].requires_grad)]
    if no_grad:
        outcome.fail(f"{', '.join(no_grad)} of {kernel_name} does not require grad although {reference_name}'s "
                     f"does (no autograd formula registered for the kernel?)")
        return outcome
    grad_leaves = [arg_leaves[j][1] for j in grad_idx]
    bmode = PoisonAllocations()
    try:
        with GridLimits(), bmode:
            kernel_grads = run_backward([out_leaves[i] for i in ref.pairs], [grad_outputs[i] for i in ref.pairs],
                                        grad_leaves)
    except Exception as exc:  # the candidate's backward failed: reported
        outcome.fail(f"the backward of {kernel_name} raised {type(exc).__name__}: {exc} (at {user_frame(exc, path)})")
        outcome.traceback = "".join(traceback.format_exception(exc))
        outcome.raised = type(exc)
        return outcome
    outcome.note(f"backward ran with {bmode.poisoned} allocation(s) poisoned")
    for line in modified_inputs(arg_leaves, snap_leaves, f"by the backward of {kernel_name}"):
        outcome.fail(line)
    for line in bmode.redzone_violations():
        outcome.fail(f"the backward of {kernel_name}: {line}")
    gmax_abs, gmax_rel = 0.0, 0.0
    for j, kg in zip(grad_idx, kernel_grads):
        lab = f"grad of {arg_leaves[j][0]}"
        rg = ref.grads.get(j)
        eg = eager.grads.get(j) if eager is not None else None
        if rg is None and kg is None:
            continue
        if kg is None:
            outcome.fail(f"{lab}: {kernel_name} gives no gradient, {reference_name} does")
            continue
        if rg is None:  # the reference does not depend on this input: its gradient is zero
            rg = torch.zeros_like(kg, dtype=torch.float64)
        if eg is None and eager is not None and eager.grads:
            eg = torch.zeros_like(kg)
        g = judge_outputs(kg, rg, eg, lab, tf32=tf32, atol=atol, rtol=rtol, reference_is_float64=f64)
        outcome.judgements += g.judgements
        for line in g.lines:
            if line in g.failures:
                outcome.fail(line)
            else:
                outcome.note(line)
        gmax_abs, gmax_rel = max(gmax_abs, g.max_abs_diff), max(gmax_rel, g.max_rel_diff)
    outcome.grad_max_abs_diff, outcome.grad_max_rel_diff = gmax_abs, gmax_rel
    return outcome
