"""The error policy: how far from a float64 reference a kernel, a swap or a compiled model may land.

One policy judges every tensor that ``verify``, ``bench``, ``bench --sweep`` and ``apply`` check (kernel outputs and
gradients, each swap, each whole-model variant). It is the field's practice:

- **a float64 reference.** The computation is repeated on float64 copies of the inputs (in float64 throughout where
  the reference itself casts down, see :mod:`fusion_advisor.verification.kernel`), so the reference's own rounding
  is negligible next to the candidate's.
- **the eager computation's own error sets the scale.** The same computation run eagerly in the candidate's dtype
  (``reference_fn`` on the inputs as they are, the user's ops, the model as written) is also measured against
  float64; the candidate passes when it lands no more than a few times further. PyTorch judges compiled models this
  way (``torch._dynamo.utils.same(ref, res, fp64_ref=...)``, used by Inductor's benchmark suites: RMSE(res, fp64) <=
  2 x RMSE(eager, fp64) + tol / 10); FlashAttention's tests accept a kernel whose error is at most 2x PyTorch's own
  in the same dtype. A bf16 output that is only as wrong as bf16 rounding makes it passes; a loss off by 30% or a
  gradient 3x too large fails however small its values are.
- **per tensor, relative to the tensor's own scale, two ways**:

  - norm-wise ``||x - ref||_2 / ||ref||_2``: one number per tensor; a single element never decides it;
  - max-wise ``max |x - ref| / max |ref|``: the worst element, at the tensor's scale, so one wild element fails
    even in a large tensor.

  Each must be within ``K x eager's + floor``, K = :data:`NORM_ERROR_FACTOR` / :data:`MAX_ERROR_FACTOR`. An
  absolute tolerance alone is blind at small scales (a loss of 0.03 or a gradient of 1/N sits inside bf16's atol of
  2e-2 whatever its value), and an element-wise rule fails a kernel on the one element where eager happened to be
  exact although its largest error equals eager's own (Qwen2's RMSNorm gradient in fp32).
- **a floor of the dtype's rounding** (:data:`ERROR_FLOOR_ULPS` x ``finfo(dtype).eps``; TF32's where products may run
  in TF32): an eager computation that happens to be exact does not demand exactness.
- **NaN and inf never pass** unless float64 has the same one at the same place: a single NaN fails the tensor.

Lossy paths also get the signal-to-quantization-noise ratio ``SQNR = 20 log10(||ref|| / ||x - ref||)`` dB
(torchao's ``compute_error``), reported in every :class:`Judgement`.

Integer and bool tensors must match exactly. Where no float64 reference can run, or the user gives ``--atol`` /
``--rtol``, tensors are compared element-wise instead (:func:`compare_outputs`, :data:`TOLERANCES`): ``|a - e| <=
atol + rtol |e|``, with the same NaN rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from fusion_advisor.verification.poison import poison_value
from fusion_advisor.verification.trees import describe, dtype_text, first_true, leaves, unravel

# --- element-wise tolerances (explicit --atol/--rtol, no float64 reference, the kernels' own tests) -----------

#: (atol, rtol) per dtype of the output: fp32 arithmetic lands near 1e-5 relative, TF32 matmuls near 3e-4, bf16 and
#: fp16 operands near 1e-2 (../shared/TRITON_RULES.md, the device METHOD).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 1.6e-2),
}

#: (atol, rtol) for fp32 matmuls computed with TF32 tensor cores (Triton's default for fp32 ``tl.dot``).
TF32_TOLERANCE: tuple[float, float] = (3e-4, 3e-4)

#: Tolerances for Python ``float`` outputs (no dtype to look up): those of fp32, the precision kernels compute in.
SCALAR_FLOAT_DTYPE = torch.float32


def tolerance_for(dtype: torch.dtype, tf32: bool = False) -> tuple[float, float]:
    """(atol, rtol) for comparing an output of ``dtype`` element-wise; ``tf32`` selects the TF32 matmul tolerance
    for fp32. A complex dtype gets that of its parts (complex64: float32's). Integer and bool outputs must match
    exactly: ``(0.0, 0.0)``."""
    if dtype.is_complex:
        dtype = dtype.to_real()
    if tf32 and dtype == torch.float32:
        return TF32_TOLERANCE
    if not dtype.is_floating_point:
        return (0.0, 0.0)
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


# --- the policy's constants ---------------------------------------------------------------------------------

#: Norm-wise: the candidate may be at most this many times further from float64 than eager (``same``'s 2.0).
NORM_ERROR_FACTOR = 2.0
#: Max-wise: the worst element at most this many times eager's worst (one element varies more than a norm: eager's
#: worst element and the candidate's are rounded at different places).
MAX_ERROR_FACTOR = 4.0
#: Floors, in units of ``torch.finfo(dtype).eps``: (norm-wise, max-wise). fp32's are wider: a reduction summed in
#: another order moves an fp32 result by ~sqrt(n) ulps where eager may be exact (``same`` allows tol/10 = 1e-5);
#: fp16 and bf16 results are rounded to their dtype once at the end, which one eps bounds.
ERROR_FLOOR_ULPS: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (64.0, 256.0),
    torch.float32: (64.0, 256.0),
    torch.float16: (1.0, 4.0),
    torch.bfloat16: (1.0, 4.0),
}

#: Unit of TF32 rounding (10 explicit mantissa bits): an fp32 result that went through a TF32 tensor-core product.
TF32_EPS = 2.0 ** -10

#: Floors for fp32 results where PyTorch's settings let products run in TF32, in units of :data:`TF32_EPS`.
TF32_FLOOR_UNITS = (1.0, 4.0)


def error_floor(dtype: torch.dtype, tf32: bool = False) -> tuple[float, float]:
    """(norm-wise, max-wise) error floors of :func:`judge` for ``dtype``: ``ERROR_FLOOR_ULPS x finfo.eps``; for
    fp32 with ``tf32`` (convolutions under ``torch.backends.cudnn.allow_tf32``, PyTorch's default, matmuls under
    ``torch.backends.cuda.matmul.allow_tf32``, or a Triton ``tl.dot`` at its default precision) the TF32 floor."""
    if tf32 and dtype == torch.float32:
        return TF32_FLOOR_UNITS[0] * TF32_EPS, TF32_FLOOR_UNITS[1] * TF32_EPS
    ulps = ERROR_FLOOR_ULPS.get(dtype, ERROR_FLOOR_ULPS[torch.float32])
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return ulps[0] * eps, ulps[1] * eps


def policy_text() -> str:
    """One line naming the policy, for reports."""
    return (f"error policy: within {NORM_ERROR_FACTOR:g}x norm-wise / {MAX_ERROR_FACTOR:g}x max-wise eager's own "
            f"error against float64, plus the dtype's floor (fusion_advisor.verification.policy)")


# --- judging one tensor -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """The verdict on one tensor (:func:`judge`).

    Attributes:
        ok: the candidate passes.
        norm_err, max_err: the candidate's norm-wise and max-wise errors against float64 (relative, unitless;
            absolute where the reference is all zero; ``inf`` where NaN/inf are misplaced).
        eager_norm_err, eager_max_err: the same for the eager computation (``None`` when there is none).
        limit_norm, limit_max: the thresholds applied.
        reason: one line: why it failed, or the numbers when it passed.
        max_abs_diff: largest ``|x - ref|`` over finite elements (the tensor's unit; ``inf`` when misplaced).
        max_rel_diff: largest ``|x - ref| / |ref|`` over finite nonzero reference elements.
        sqnr_db: ``20 log10(||ref|| / ||x - ref||)`` in dB (torchao's ``compute_error``); ``inf`` when exact.
        worst: the worst element, ``"index (i, j): candidate v, float64 r, eager e"`` (``""`` when none).
        misplaced: elements non-finite where float64 is finite or the reverse (or another NaN/inf kind).
        nan_misplaced: those of them that are NaN in the candidate where float64 is finite (unwritten elements
            under :class:`~fusion_advisor.verification.poison.PoisonAllocations`).
        first_misplaced: ``"index (i,): candidate nan, float64 0.3"`` of the first misplaced element.
    """

    ok: bool
    norm_err: float
    max_err: float
    eager_norm_err: float | None
    eager_max_err: float | None
    limit_norm: float
    limit_max: float
    reason: str
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    sqnr_db: float = math.inf
    worst: str = ""
    misplaced: int = 0
    nan_misplaced: int = 0
    first_misplaced: str = ""

    @property
    def share_of_limit(self) -> float:
        """The larger of the norm-wise and max-wise errors over their limits (unitless): at most 1 passes. A zero
        limit (an exact dtype, a shape mismatch) counts 0 where its error is 0, else ``inf``."""
        def share(err: float, limit: float) -> float:
            return err / limit if limit > 0 else (0.0 if err == 0 else math.inf)

        return max(share(self.norm_err, self.limit_norm), share(self.max_err, self.limit_max))


def sqnr_db(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``candidate`` against ``reference`` in dB:
    ``20 log10(||ref|| / ||candidate - ref||)`` (torchao ``quantization/utils.py: compute_error``); ``inf`` when
    equal, ``-inf`` for a zero reference with a nonzero error; over elements finite in both."""
    x, r = candidate.detach().double(), reference.detach().double().to(candidate.device)
    fin = torch.isfinite(x) & torch.isfinite(r)
    return _sqnr(float((x - r)[fin].norm()), float(r[fin].norm()))


def _sqnr(noise: float, signal: float) -> float:
    """``20 log10(signal / noise)`` in dB (norms): ``inf`` without noise, ``-inf`` for noise on a zero signal."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 20.0 * math.log10(signal / noise)


def _fmt(v: float) -> str:
    return f"{v:.6g}"


#: Elements :func:`judge` compares at a time: its float64 temporaries (the difference, masks, relative errors) are a
#: few copies of one chunk (256 MiB each), not of the whole tensor. Whole-tensor temporaries asked an 80 GB H100 for
#: 8 GiB more beside a model's eager and float64 outputs (KernelBench's SqueezeNetFireModule returns a
#: 128 x 128 x 256 x 256 fp32 tensor) and apply stopped out of memory.
JUDGE_CHUNK = 1 << 25


@dataclass
class _ErrorSums:
    """Running sums over chunks of the differences ``d`` from the float64 reference ``r`` (the elements where it is
    finite): squared error and reference, their largest magnitudes, elements counted (see the module doc)."""

    d2: float = 0.0
    r2: float = 0.0
    d_max: float = 0.0
    r_max: float = 0.0
    n: int = 0

    def add(self, d: torch.Tensor, r: torch.Tensor) -> None:
        """Add the differences ``d`` and reference values ``r`` (float64, the counted elements only)."""
        if d.numel():
            self.d2 += float((d * d).sum())
            self.r2 += float((r * r).sum())
            self.d_max = max(self.d_max, float(d.abs().max()))
            self.r_max = max(self.r_max, float(r.abs().max()))
            self.n += d.numel()

    def errors(self) -> tuple[float, float]:
        """(norm-wise, max-wise) error: ``||d|| / ||r||`` and ``max|d| / max|r|``; absolute where the reference is all
        zero; (0, 0) over no element."""
        if self.n == 0:
            return 0.0, 0.0
        d_norm, r_norm = math.sqrt(self.d2), math.sqrt(self.r2)
        if r_norm == 0.0:  # an all-zero reference: the errors are absolute
            return d_norm, self.d_max
        tiny = torch.finfo(torch.float64).tiny
        return d_norm / max(r_norm, tiny), self.d_max / max(self.r_max, tiny)


def judge(candidate: torch.Tensor, reference: torch.Tensor, eager: torch.Tensor | None, label: str = "output",
          norm_factor: float = NORM_ERROR_FACTOR, max_factor: float = MAX_ERROR_FACTOR,
          tf32: bool = False) -> Judgement:
    """Judge ``candidate`` against the float64 ``reference``, with the eager computation's own error as the scale.

    Args:
        candidate: the kernel's or compiled model's tensor, in its own dtype, any shape.
        reference: the same value computed in float64 (any device; compared on ``candidate``'s), same shape.
        eager: the same value computed eagerly in ``candidate``'s dtype (the user's ops, the model as written);
            ``None``: no eager computation, the floors alone bound the error.
        label: names the tensor in ``reason``.
        norm_factor, max_factor: K of the module doc.
        tf32: fp32 products may run in TF32 under the present settings (see :func:`error_floor`).

    Returns:
        A :class:`Judgement`. Shapes that differ, and NaN / inf where the reference is finite (or finite where it
        is not, or another kind of non-finite value), always fail. Integer and bool tensors must be equal; complex
        ones are judged as their real and imaginary parts (``torch.view_as_real``).

    Compared on ``candidate``'s device, :data:`JUDGE_CHUNK` elements at a time.
    """
    if candidate.is_complex() and reference.is_complex():  # judged as its real and imaginary parts
        candidate, reference = _real_view(candidate.detach()), _real_view(reference.detach())
        eager = _real_view(eager.detach()) if eager is not None and eager.is_complex() else None
    if tuple(candidate.shape) != tuple(reference.shape):
        return Judgement(False, math.inf, math.inf, None, None, 0.0, 0.0,
                         f"{label}: shape {list(candidate.shape)}, the reference's {list(reference.shape)}",
                         math.inf, math.inf, -math.inf)
    if not candidate.dtype.is_floating_point:
        same = bool((candidate.detach().cpu() == reference.detach().cpu().to(candidate.dtype)).all())
        return Judgement(same, 0.0 if same else math.inf, 0.0 if same else math.inf, None, None, 0.0, 0.0,
                         f"{label}: {'equal' if same else 'differs from'} the reference ({candidate.dtype}: exact)",
                         0.0 if same else math.inf, 0.0 if same else math.inf, math.inf if same else -math.inf)
    x = candidate.detach().reshape(-1)  # flat: a copy only of a non-contiguous view, in its own dtype
    r_all = reference.detach().reshape(-1)  # cast and moved to x's device a chunk at a time
    e_all = None
    if eager is not None and tuple(eager.shape) == tuple(candidate.shape) and eager.dtype.is_floating_point:
        e_all = eager.detach().reshape(-1)
    n_bad = n_nan = 0
    first_bad = -1
    errs, e_errs = _ErrorSums(), _ErrorSums()
    max_abs = max_rel = 0.0
    w = -1
    for a in range(0, x.numel(), JUDGE_CHUNK):
        xc = x[a:a + JUDGE_CHUNK]
        rc = r_all[a:a + JUDGE_CHUNK].to(device=x.device, dtype=torch.float64)
        fin_ref, fin_x = torch.isfinite(rc), torch.isfinite(xc)
        misplaced = fin_ref != fin_x
        nonfinite = ~fin_ref & ~fin_x  # where both are non-finite they must be the same kind (NaN, +inf, -inf)
        if nonfinite.any():
            xr, rr = xc[nonfinite].double(), rc[nonfinite]
            misplaced[nonfinite] = ~((torch.isnan(xr) & torch.isnan(rr)) | (xr == rr))
        if misplaced.any():
            n_bad += int(misplaced.sum())
            n_nan += int((torch.isnan(xc) & fin_ref).sum())
            if first_bad < 0:
                first_bad = a + int(misplaced.nonzero()[0, 0])
        if n_bad:
            continue  # the verdict is a failure: only the misplaced elements are still counted
        diff = (xc.double() - rc).where(fin_ref, torch.zeros((), dtype=torch.float64, device=x.device))
        errs.add(diff[fin_ref], rc[fin_ref])
        if e_all is not None:
            ec = e_all[a:a + JUDGE_CHUNK].to(x.device)
            e_fin = torch.isfinite(ec) & fin_ref
            e_errs.add((ec.double() - rc)[e_fin], rc[e_fin])
        diff = diff.abs()
        i = int(diff.argmax())
        if float(diff[i]) > max_abs or w < 0:
            max_abs, w = float(diff[i]), a + i
        rel = (diff / rc.abs()).where(fin_ref & (rc != 0), torch.zeros((), dtype=torch.float64, device=x.device))
        max_rel = max(max_rel, float(rel.max()))
    if n_bad:
        first = (f"index {unravel(first_bad, candidate.shape)}: candidate {_fmt(x[first_bad].item())}, float64 "
                 f"{_fmt(float(r_all[first_bad].item()))}")
        return Judgement(False, math.inf, math.inf, None, None, 0.0, 0.0,
                         f"{label}: {n_bad} of {x.numel()} elements non-finite where float64 is not, or the reverse; "
                         f"first at {first}", math.inf, math.inf, -math.inf, misplaced=n_bad, nan_misplaced=n_nan,
                         first_misplaced=first)
    norm_err, max_err = errs.errors()
    floor_norm, floor_max = error_floor(candidate.dtype, tf32)
    e_norm = e_max = None
    if e_all is not None:
        e_norm, e_max = e_errs.errors()
    limit_norm = norm_factor * (e_norm or 0.0) + floor_norm
    limit_max = max_factor * (e_max or 0.0) + floor_max
    ok = norm_err <= limit_norm and max_err <= limit_max
    worst = ""
    if w >= 0:
        worst = (f"index {unravel(w, candidate.shape)}: candidate {_fmt(x[w].item())}, float64 "
                 f"{_fmt(float(r_all[w].item()))}"
                 + (f", eager {_fmt(e_all[w].item())}" if e_all is not None else ""))
    # SQNR over the elements finite in both (no element is misplaced here: those are the reference's finite ones)
    sqnr = _sqnr(math.sqrt(errs.d2), math.sqrt(errs.r2))
    eager_text = (f"eager {e_norm:.3g} / {e_max:.3g}" if e_norm is not None else "no eager computation")
    what = "within" if ok else "beyond"
    floor_name = "TF32" if tf32 and x.dtype == torch.float32 else dtype_text(x.dtype)
    reason = (f"{label}: error against float64 {norm_err:.3g} norm-wise / {max_err:.3g} max-wise ({eager_text}); "
              f"{what} the limits {limit_norm:.3g} / {limit_max:.3g} "
              f"({norm_factor:g}x / {max_factor:g}x eager + {floor_name} floor)")
    return Judgement(ok, norm_err, max_err, e_norm, e_max, limit_norm, limit_max, reason, max_abs, max_rel,
                     sqnr, worst)


# --- judging a whole (nested) output ------------------------------------------------------------------------


@dataclass
class OutputVerdict:
    """The verdict on a nested output (:func:`judge_outputs`).

    Attributes:
        ok: every leaf passed.
        lines: one line per leaf: ``"<label>: ok (...)"`` or ``"<label>: MISMATCH ..."`` with the worst element.
        failures: the lines of the leaves that failed (in order).
        max_abs_diff, max_rel_diff: the largest of the leaves' (``inf`` when NaN/inf are misplaced).
        judgements: ``(label, Judgement)`` of every floating leaf judged by the policy.
    """

    ok: bool = True
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    judgements: list[tuple[str, Judgement]] = field(default_factory=list)

    def add(self, ok: bool, line: str, max_abs: float, max_rel: float) -> None:
        """Record one leaf's verdict: its line, and its maxima into the running ones."""
        self.ok &= ok
        self.lines.append(line)
        if not ok:
            self.failures.append(line)
        self.max_abs_diff, self.max_rel_diff = max(self.max_abs_diff, max_abs), max(self.max_rel_diff, max_rel)


def as_tensor(x: Any) -> torch.Tensor | None:
    """A Python number as a tensor: a float as fp32 (the precision a kernel computes it in), an int as int64 (one
    past int64's range as a float64), a tensor as it is; ``None`` for anything else."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, bool):
        return torch.tensor(x)
    if isinstance(x, int):
        if not -2 ** 63 <= x < 2 ** 63:  # torch.tensor raises "Overflow when unpacking long"
            return torch.tensor(float(x), dtype=torch.float64)
        return torch.tensor(x, dtype=torch.int64)
    if isinstance(x, float):
        return torch.tensor(x, dtype=SCALAR_FLOAT_DTYPE)
    if isinstance(x, complex):
        return torch.tensor(x, dtype=torch.complex64)
    return None


def _real_view(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


#: What a NaN where the reference has none may be (the mismatch lines say it).
NAN_HINT = ("computed, or read where the kernel should not read or write (unwritten output elements, or past its "
            "input's real strides): verify fills the allocations it poisons, and the gaps of its strided case, "
            "with NaN")


def mismatch_line(label: str, what: str, j: Judgement, numel: int) -> str:
    """The report line of a failed :class:`Judgement` of tensor ``label`` (``what``: its description)."""
    if j.misplaced:
        parts = []
        if j.nan_misplaced:
            parts.append(f"{j.nan_misplaced} elements are NaN where the reference is not")
        if j.misplaced > j.nan_misplaced:
            parts.append(f"{j.misplaced - j.nan_misplaced} elements differ in NaN/inf")
        hint = f": {NAN_HINT}" if j.nan_misplaced else ""
        return (f"{label}: MISMATCH in {j.misplaced} of {numel} elements ({what}): {'; '.join(parts)} (first at "
                f"{j.first_misplaced}){hint}")
    if j.limit_norm == 0.0 and j.limit_max == 0.0:  # shape mismatch or an exact dtype
        return f"{label}: MISMATCH ({what}): {j.reason.split(': ', 1)[-1]}"
    eager = (f"eager's own {j.eager_norm_err:.3g} / {j.eager_max_err:.3g}" if j.eager_norm_err is not None
             else "no eager computation")
    return (f"{label}: MISMATCH ({what}): error against float64 {j.norm_err:.3g} norm-wise / {j.max_err:.3g} "
            f"max-wise, beyond the limits {j.limit_norm:.3g} / {j.limit_max:.3g} ({eager}); SQNR {j.sqnr_db:.1f} dB; "
            f"worst at {j.worst} (abs diff {j.max_abs_diff:.3g})")


def ok_line(label: str, what: str, j: Judgement) -> str:
    """The report line of a passed :class:`Judgement`."""
    eager = (f"eager {j.eager_norm_err:.3g} / {j.eager_max_err:.3g}" if j.eager_norm_err is not None
             else "no eager computation")
    return (f"{label}: ok ({what}; error against float64 {j.norm_err:.3g} norm-wise / {j.max_err:.3g} max-wise, "
            f"{eager}; limits {j.limit_norm:.3g} / {j.limit_max:.3g}; max abs diff {j.max_abs_diff:.3g}, SQNR "
            f"{j.sqnr_db:.1f} dB)")


def judge_outputs(actual: Any, reference: Any, eager: Any, label: str = "output", tf32: bool = False,
                  atol: float | None = None, rtol: float | None = None,
                  reference_is_float64: bool = True) -> OutputVerdict:
    """Judge a nested output leaf by leaf (tensors, Python numbers, ``None``; tuples / lists / dicts of them).

    Args:
        actual: the candidate's output.
        reference: the float64 reference's output, same structure.
        eager: the eager computation's output in the candidate's dtypes, same structure, or ``None``.
        label: the root label (``output``, ``grad of x``).
        tf32: fp32 leaves may come from TF32 products (:func:`error_floor`).
        atol, rtol: when either is given, every leaf is compared element-wise at these tolerances instead
            (:func:`compare_outputs`; the other from :data:`TOLERANCES`).
        reference_is_float64: ``False`` when ``reference`` had to run in the inputs' own dtypes: floating leaves are
            then compared element-wise at the dtype's tolerance.

    Returns:
        An :class:`OutputVerdict`; a structure mismatch fails with one line.
    """
    verdict = OutputVerdict()
    la, lr = leaves(actual, label), leaves(reference, label)
    if [lab for lab, _ in la] != [lab for lab, _ in lr]:
        verdict.add(False, f"{label}: kernel returns {describe(actual)}, reference returns {describe(reference)}",
                    math.inf, math.inf)
        return verdict
    le = leaves(eager, label) if eager is not None else []
    eager_by_label = dict(le) if [lab for lab, _ in le] == [lab for lab, _ in la] else {}
    for (lab, a), (_, r) in zip(la, lr):
        if atol is not None or rtol is not None or not reference_is_float64:
            ok, mabs, mrel, lines = _compare_leaf(a, r, atol, rtol, lab)
            verdict.add(ok, lines[0] if ok else "; ".join(lines), mabs, mrel)
            continue
        if a is None or r is None:
            ok = a is None and r is None
            verdict.add(ok, f"{lab}: ok (None)" if ok else
                        f"{lab}: kernel gives {describe(a)}, reference gives {describe(r)}", 0.0 if ok else math.inf,
                        0.0 if ok else math.inf)
            continue
        ta, tr = as_tensor(a), as_tensor(r)
        if ta is None or tr is None:
            ok = bool(a == r)
            verdict.add(ok, f"{lab}: ok (equal)" if ok else f"{lab}: kernel gives {a!r}, reference gives {r!r}",
                        0.0 if ok else math.inf, 0.0 if ok else math.inf)
            continue
        if ta.shape != tr.shape:
            verdict.add(False, f"{lab}: shape {list(ta.shape)}, reference shape {list(tr.shape)}", math.inf, math.inf)
            continue
        if ta.numel() == 0:
            verdict.add(True, f"{lab}: ok (empty)", 0.0, 0.0)
            continue
        if not (ta.is_floating_point() or ta.is_complex()):
            ok, mabs, mrel, lines = _compare_exact(ta, tr.to(ta.device), lab)
            verdict.add(ok, lines[0] if ok else "; ".join(lines), mabs, mrel)
            continue
        te = as_tensor(eager_by_label.get(lab)) if eager_by_label else None
        if te is not None and (te.shape != ta.shape or te.dtype != ta.dtype):
            te = None
        ca, cr = _real_view(ta), _real_view(tr.to(torch.complex128 if tr.is_complex() else torch.float64))
        ce = _real_view(te) if te is not None else None
        j = judge(ca, cr, ce, lab, tf32=tf32)
        verdict.judgements.append((lab, j))
        what = describe(a) if isinstance(a, torch.Tensor) else f"Python {type(a).__name__} (judged as fp32)"
        verdict.add(j.ok, ok_line(lab, what, j) if j.ok else mismatch_line(lab, what, j, ca.numel()),
                    j.max_abs_diff, j.max_rel_diff)
    return verdict


# --- element-wise comparison --------------------------------------------------------------------------------


def _real_pairs(t: torch.Tensor) -> torch.Tensor:
    """``t`` (shape ``S``) as ``S + (2,)`` real and imaginary parts: a view of a complex tensor (copied only where its
    conjugate bit is set), a real tensor stacked with zeros."""
    return _real_view(t) if t.is_complex() else torch.stack([t, torch.zeros_like(t)], dim=-1)


def _compare_leaf(a: Any, e: Any, atol: float | None, rtol: float | None,
                  label: str) -> tuple[bool, float, float, list[str]]:
    if a is None or e is None:
        if a is None and e is None:
            return True, 0.0, 0.0, [f"{label}: ok (None)"]
        return False, math.inf, math.inf, [f"{label}: kernel gives {describe(a)}, reference gives {describe(e)}"]
    ta, te = as_tensor(a), as_tensor(e)
    if ta is None or te is None:
        if bool(a == e):
            return True, 0.0, 0.0, [f"{label}: ok (equal)"]
        return False, math.inf, math.inf, [f"{label}: kernel gives {a!r}, reference gives {e!r}"]
    if ta.shape != te.shape:
        return False, math.inf, math.inf, [f"{label}: shape {list(ta.shape)}, reference shape {list(te.shape)}"]

    out_dtype = SCALAR_FLOAT_DTYPE if isinstance(a, float) else ta.dtype
    table_atol, table_rtol = tolerance_for(out_dtype)
    atol = table_atol if atol is None else atol
    rtol = table_rtol if rtol is None else rtol
    ta = ta.detach()
    te = te.detach().to(ta.device)
    n = ta.numel()
    if n == 0:
        return True, 0.0, 0.0, [f"{label}: ok (empty)"]
    parts = ""
    if ta.is_complex() or te.is_complex():  # (real, imaginary) pairs in their own precision: float64 by the chunk
        ta, te, n, parts = _real_pairs(ta), _real_pairs(te), 2 * n, " real and imaginary parts"

    if not (ta.is_floating_point() or te.is_floating_point()):
        return _compare_exact(ta, te, label)

    # float64 a chunk at a time (JUDGE_CHUNK elements): whole-tensor float64 copies of a 1.6 G-element output asked
    # an 80 GB H100 for 12 GiB more and stopped apply
    a_flat, e_flat = ta.reshape(-1), te.reshape(-1)
    n_finite = n_nan = n_other = 0  # n_nan + n_other: the non-finite elements in the wrong place
    first_nan = first_other = -1
    max_abs = max_rel = 0.0
    worst: tuple[float, int, float, float, float, float] | None = None  # excess, index, kernel, reference, abs, rel
    for c in range(0, a_flat.numel(), JUDGE_CHUNK):
        a64, e64 = a_flat[c:c + JUDGE_CHUNK].to(torch.float64), e_flat[c:c + JUDGE_CHUNK].to(torch.float64)
        a_nan, e_nan = torch.isnan(a64), torch.isnan(e64)
        finite = torch.isfinite(a64) & torch.isfinite(e64)
        same_special = (a_nan & e_nan) | (a64 == e64)  # NaN at the same place, or the same infinity
        bad_special = ~finite & ~same_special
        diff = torch.where(finite, (a64 - e64).abs(), torch.zeros_like(a64))
        mag = e64.abs()
        tol = atol + rtol * mag
        bad_finite = finite & (diff > tol)
        rel = torch.where(finite & (e64 != 0), diff / mag, torch.zeros_like(a64))
        n_finite += int(bad_finite.sum())
        max_abs, max_rel = max(max_abs, float(diff.max())), max(max_rel, float(rel.max()))
        nan_in_kernel = a_nan & ~e_nan
        k, first = first_true(nan_in_kernel)
        if k and first_nan < 0:
            first_nan, nan_ref = c + first, float(e64[first])
        n_nan += k
        k, first = first_true(bad_special & ~nan_in_kernel)
        if k and first_other < 0:
            first_other, other_vals = c + first, (float(a64[first]), float(e64[first]))
        n_other += k
        if bad_finite.any():
            excess = torch.where(bad_finite, diff / tol.clamp_min(1e-300), torch.full_like(diff, -1.0))
            i = int(excess.argmax())
            if worst is None or float(excess[i]) > worst[0]:
                worst = (float(excess[i]), c + i, float(a64[i]), float(e64[i]), float(diff[i]), float(rel[i]))
    n_special = n_nan + n_other
    if n_special:
        max_abs = max_rel = math.inf
    tol_text = f"atol {atol:g}, rtol {rtol:g}"
    if n_special == 0 and n_finite == 0:
        return True, max_abs, max_rel, [
            f"{label}: ok ({describe(a)}; max abs diff {max_abs:.3g}, max rel diff {max_rel:.3g}; {tol_text})"
        ]

    shape = ta.shape
    details = [f"{label}: MISMATCH in {n_special + n_finite} of {n}{parts or ' elements'} ({describe(a)}; {tol_text})"]
    if n_nan:
        details.append(
            f"{label}: {n_nan} elements are NaN where the reference is not (first at index "
            f"{unravel(first_nan, shape)}, reference {_fmt(nan_ref)}): {NAN_HINT}"
        )
    if n_other:
        details.append(
            f"{label}: {n_other} elements differ in NaN/inf (first at index {unravel(first_other, shape)}: "
            f"kernel {_fmt(other_vals[0])}, reference {_fmt(other_vals[1])})"
        )
    if n_finite and worst is not None:
        details.append(
            f"{label}: {n_finite} elements outside tolerance; worst at index {unravel(worst[1], shape)}: kernel "
            f"{_fmt(worst[2])}, reference {_fmt(worst[3])} (abs diff {worst[4]:.3g}, rel diff {worst[5]:.3g})"
        )
    return False, max_abs, max_rel, details


def _compare_exact(ta: torch.Tensor, te: torch.Tensor, label: str) -> tuple[bool, float, float, list[str]]:
    """Integer / bool outputs: equal or not."""
    a, e = ta.reshape(-1), te.reshape(-1)
    ne = a != e
    n_bad = int(ne.sum())
    diff = (a.to(torch.float64) - e.to(torch.float64)).abs()
    max_abs = float(diff.max())
    rel = torch.where(e != 0, diff / e.to(torch.float64).abs(), torch.zeros_like(diff))
    max_rel = float(rel.max())
    if n_bad == 0:
        return True, max_abs, max_rel, [f"{label}: ok ({describe(ta)}; exact match)"]
    first = int(ne.nonzero()[0, 0])
    details = [
        f"{label}: MISMATCH in {n_bad} of {a.numel()} elements ({describe(ta)}; must match exactly); first at "
        f"index {unravel(first, ta.shape)}: kernel {a[first].item()}, reference {e[first].item()}"
    ]
    if ta.dtype != torch.bool:
        sentinel = poison_value(ta.dtype)
        n_poison = int((ne & (a == sentinel)).sum())
        if n_poison:
            details.append(f"{label}: {n_poison} of them hold the poison value {sentinel}: unwritten elements?")
    return False, max_abs, max_rel, details


def compare_outputs(actual: Any, expected: Any, atol: float | None = None, rtol: float | None = None,
                    label: str = "output") -> tuple[bool, float, float, list[str]]:
    """Compare two outputs element-wise: ``|a - e| <= atol + rtol * |e|`` (explicit tolerances; the fallback where
    no float64 reference runs; the kernels' own tests).

    Args:
        actual: the kernel's output: a tensor, a Python number, ``None``, or (nested) tuples/lists/dicts of them.
        expected: the reference output, same structure (may be float64 where ``actual`` is lower precision).
        atol, rtol: tolerances; ``None`` takes each from :func:`tolerance_for` of the actual output's dtype (fp32's
            for a Python float; integers and bools must match exactly).
        label: name of the output in the details (``output``, ``grad of x``).

    NaN in ``actual`` passes only where ``expected`` is NaN at the same index; an infinity only where
    ``expected`` holds the same infinity.

    Returns:
        ``(ok, max_abs_diff, max_rel_diff, details)``: the largest absolute difference over elements finite in
        both, and the largest relative one (over nonzero reference elements), both ``inf`` when NaN/inf differ;
        ``details`` has one line per leaf (``ok`` with its maxima, or ``MISMATCH`` followed by the count of bad
        elements, the worst index and both values).
    """
    la, le = leaves(actual, label), leaves(expected, label)
    if [lab for lab, _ in la] != [lab for lab, _ in le]:
        return False, math.inf, math.inf, [
            f"{label}: kernel returns {describe(actual)}, reference returns {describe(expected)}"
        ]
    ok, max_abs, max_rel, details = True, 0.0, 0.0, []
    for (lab, a), (_, e) in zip(la, le):
        leaf_ok, leaf_abs, leaf_rel, leaf_details = _compare_leaf(a, e, atol, rtol, lab)
        ok &= leaf_ok
        max_abs, max_rel = max(max_abs, leaf_abs), max(max_rel, leaf_rel)
        details.extend(leaf_details)
    return ok, max_abs, max_rel, details
