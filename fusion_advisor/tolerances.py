"""Tolerances by dtype, used by ``verify``, ``apply`` and the tests.

Values follow ../shared/TRITON_RULES.md and the device METHOD: fp32 arithmetic lands near 1e-5 relative,
TF32 matmuls near 3e-4, bf16/fp16 operands near 1e-2. NaN never passes (see :mod:`fusion_advisor.verify`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: (atol, rtol) per dtype of the kernel's output.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 1.6e-2),
}

#: (atol, rtol) for fp32 matmuls computed with TF32 tensor cores (Triton's default for fp32 ``tl.dot``).
TF32_TOLERANCE: tuple[float, float] = (3e-4, 3e-4)


def tolerance_for(dtype: torch.dtype, tf32: bool = False) -> tuple[float, float]:
    """(atol, rtol) for comparing an output of ``dtype``; ``tf32`` selects the TF32 matmul tolerance for fp32.

    Integer and bool outputs must match exactly: ``(0.0, 0.0)``.
    """
    if tf32 and dtype == torch.float32:
        return TF32_TOLERANCE
    if not dtype.is_floating_point:
        return (0.0, 0.0)
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


#: A low-precision gradient that misses the dtype tolerance still passes when its largest error against float64
#: is at most this many times eager PyTorch's own error in the same dtype. Gradients that sum over many rows (a
#: norm's dweight, a bias gradient) carry rounding that no fixed bf16 tolerance covers: terms of magnitude ~1 summed
#: over thousands of rows cancel to a small result, and rounding each input to bf16 moves that result by more than
#: 1e-2 of itself. FlashAttention's tests use the same 2x-of-PyTorch's-error criterion.
EAGER_ERROR_FACTOR = 2.0


def within_eager_error(kernel_abs_err: float, eager_abs_err: float) -> bool:
    """Whether a fp16/bf16 gradient's max abs error against float64 is within :data:`EAGER_ERROR_FACTOR` times
    eager PyTorch's own max abs error (same inputs, same dtype, same float64 reference). NaN never passes."""
    if kernel_abs_err != kernel_abs_err or eager_abs_err != eager_abs_err:  # NaN
        return False
    return kernel_abs_err <= EAGER_ERROR_FACTOR * eager_abs_err


# --- the error policy: the candidate's error against float64, set beside eager's own error ---------------------
#
# How the field judges a kernel or a compiled model (PyTorch's ``torch._dynamo.utils.same(ref, res, fp64_ref)``,
# which Inductor's benchmark suites use: RMSE(res, fp64) <= 2 x RMSE(eager, fp64) + tol / 10; FlashAttention's
# tests: max error <= 2 x PyTorch's own error in the same dtype): compute a float64 reference, measure how far the
# eager computation in the candidate's dtype lands from it, and accept the candidate when it lands no more than a
# few times further. An absolute tolerance alone is blind at small scales (a loss of 0.03 or a gradient of 1/N
# sits inside atol 2e-2 whatever its value), so both errors are taken relative to the tensor's own scale:
#
# - norm-wise:  ||x - ref||_2 / ||ref||_2            (one number per tensor; a single element never decides it)
# - max-wise:   max |x - ref| / max |ref|            (the worst element, at the tensor's scale)
#
# A candidate passes a tensor when both are within ``K x eager's + floor``, the floor being a few units of the
# dtype's rounding (``finfo(dtype).eps``) so that an eager computation that happens to be exact does not demand
# exactness; and when every NaN / inf sits where the float64 reference has one (a NaN never passes otherwise).

#: Norm-wise: the candidate may be at most this many times further from float64 than eager (``same``'s 2.0).
NORM_ERROR_FACTOR = 2.0
#: Max-wise: the worst element at most this many times eager's worst (one element varies more than a norm).
MAX_ERROR_FACTOR = 4.0
#: Floors, in units of ``torch.finfo(dtype).eps``: (norm-wise, max-wise). fp32's are wider: a reduction summed in
#: another order moves an fp32 result by ~sqrt(n) ulps where eager may be exact (``same`` allows tol/10 = 1e-5).
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
    fp32 with ``tf32`` (convolutions under ``torch.backends.cudnn.allow_tf32``, PyTorch's default, or matmuls
    under ``torch.backends.cuda.matmul.allow_tf32``) the TF32 floor, since any eager run may take a TF32 kernel."""
    if tf32 and dtype == torch.float32:
        return TF32_FLOOR_UNITS[0] * TF32_EPS, TF32_FLOOR_UNITS[1] * TF32_EPS
    ulps = ERROR_FLOOR_ULPS.get(dtype, ERROR_FLOOR_ULPS[torch.float32])
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return ulps[0] * eps, ulps[1] * eps


@dataclass(frozen=True)
class Judgement:
    """The verdict on one tensor (:func:`judge`).

    Attributes:
        ok: the candidate passes.
        norm_err, max_err: the candidate's norm-wise and max-wise errors against float64 (see the section above).
        eager_norm_err, eager_max_err: the same for the eager computation (``None`` when there is none).
        limit_norm, limit_max: the thresholds applied.
        reason: one line: why it failed, or the numbers when it passed.
    """

    ok: bool
    norm_err: float
    max_err: float
    eager_norm_err: float | None
    eager_max_err: float | None
    limit_norm: float
    limit_max: float
    reason: str


def _errors(x: torch.Tensor, ref: torch.Tensor, finite: torch.Tensor) -> tuple[float, float]:
    d = (x.double() - ref)[finite]
    r = ref[finite]
    ref_norm, ref_max = float(r.norm()), float(r.abs().max()) if r.numel() else 0.0
    tiny = torch.finfo(torch.float64).tiny
    norm = float(d.norm()) / max(ref_norm, tiny) if d.numel() else 0.0
    worst = float(d.abs().max()) / max(ref_max, tiny) if d.numel() else 0.0
    if ref_norm == 0.0:  # an all-zero reference: the errors are absolute
        norm, worst = float(d.norm()), float(d.abs().max()) if d.numel() else 0.0
    return norm, worst


def judge(candidate: torch.Tensor, reference: torch.Tensor, eager: torch.Tensor | None, label: str = "output",
          norm_factor: float = NORM_ERROR_FACTOR, max_factor: float = MAX_ERROR_FACTOR,
          tf32: bool = False) -> Judgement:
    """Judge ``candidate`` against the float64 ``reference``, with the eager computation's own error as the scale.

    Args:
        candidate: the kernel's or compiled model's tensor, in its own dtype.
        reference: the same value computed in float64 (any device; compared on ``candidate``'s).
        eager: the same value computed eagerly in ``candidate``'s dtype (the user's ops, the model as written);
            ``None``: no eager computation, the floors alone bound the error.
        label: names the tensor in ``reason``.
        norm_factor, max_factor: K of the section above.
        tf32: fp32 products may run in TF32 under the present settings (see :func:`error_floor`).

    Returns:
        A :class:`Judgement`. Shapes that differ, and NaN / inf where the reference is finite (or finite where it
        is not), always fail.
    """
    if tuple(candidate.shape) != tuple(reference.shape):
        return Judgement(False, math.inf, math.inf, None, None, 0.0, 0.0,
                         f"{label}: shape {list(candidate.shape)}, the reference's {list(reference.shape)}")
    if not candidate.dtype.is_floating_point and not candidate.dtype.is_complex:
        same = bool((candidate.detach().cpu() == reference.detach().cpu().to(candidate.dtype)).all())
        return Judgement(same, 0.0 if same else math.inf, 0.0 if same else math.inf, None, None, 0.0, 0.0,
                         f"{label}: {'equal' if same else 'differs from'} the reference ({candidate.dtype}: exact)")
    x = candidate.detach()
    ref = reference.detach().to(device=x.device, dtype=torch.float64)
    fin_ref, fin_x = torch.isfinite(ref), torch.isfinite(x)
    misplaced = fin_ref != fin_x
    if not misplaced.any():  # where both are non-finite they must be the same kind (NaN, +inf, -inf)
        nonfinite = ~fin_ref
        if nonfinite.any():
            xr, rr = x[nonfinite].double(), ref[nonfinite]
            misplaced = torch.zeros_like(fin_ref)
            misplaced[nonfinite] = ~((torch.isnan(xr) & torch.isnan(rr)) | (xr == rr))
    if misplaced.any():
        flat = misplaced.reshape(-1).nonzero()[0, 0].item()
        return Judgement(False, math.inf, math.inf, None, None, 0.0, 0.0,
                         f"{label}: {int(misplaced.sum())} of {x.numel()} elements non-finite where float64 is "
                         f"not, or the reverse; first at flat index {flat}: candidate "
                         f"{x.reshape(-1)[flat].item():.6g}, float64 {ref.reshape(-1)[flat].item():.6g}")
    norm_err, max_err = _errors(x, ref, fin_ref)
    floor_norm, floor_max = error_floor(x.dtype, tf32)
    e_norm = e_max = None
    if eager is not None and tuple(eager.shape) == tuple(x.shape):
        e = eager.detach().to(x.device)
        e_fin = torch.isfinite(e) & fin_ref
        e_norm, e_max = _errors(e, ref, e_fin)
    limit_norm = norm_factor * (e_norm or 0.0) + floor_norm
    limit_max = max_factor * (e_max or 0.0) + floor_max
    ok = norm_err <= limit_norm and max_err <= limit_max
    eager_text = (f"eager {e_norm:.3g} / {e_max:.3g}" if e_norm is not None else "no eager computation")
    what = "within" if ok else "beyond"
    reason = (f"{label}: error against float64 {norm_err:.3g} norm-wise / {max_err:.3g} max-wise ({eager_text}); "
              f"{what} the limits {limit_norm:.3g} / {limit_max:.3g} "
              f"({norm_factor:g}x / {max_factor:g}x eager + {'TF32' if tf32 and x.dtype == torch.float32 else x.dtype} "
              f"floor)")
    return Judgement(ok, norm_err, max_err, e_norm, e_max, limit_norm, limit_max, reason)
