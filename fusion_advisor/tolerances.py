"""Tolerances by dtype, used by ``verify``, ``apply`` and the tests.

Values follow ../shared/TRITON_RULES.md and the device METHOD: fp32 arithmetic lands near 1e-5 relative,
TF32 matmuls near 3e-4, bf16/fp16 operands near 1e-2. NaN never passes (see :mod:`fusion_advisor.verify`).
"""

from __future__ import annotations

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
