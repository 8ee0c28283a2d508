"""Deliberately FAULTY bf16 cross-entropy: the true-class gradient is rounded to bf16 before 1 is subtracted.

The bug of a public report against a popular kernel library: the kernel writes the row's softmax into the bf16
gradient buffer and then subtracts 1 at the target from that rounded value, ``bf16(p_y) - 1`` instead of
``p_y - 1`` in fp32. For a confident prediction, p_y = 0.999 rounds to 1.0 in bf16 (8 bits of mantissa: the
neighbours of 1 are 0.99609375 and 1.00390625), so on a GPU the true-class gradient is 0 where float64 gives
-(1 - 0.999) / N = -2.5e-4 at N = 4 tokens (Triton's CPU interpreter converts to bf16 by truncation, to 0.99609375,
and gives -9.8e-4 there: wrong by 4x instead of by 100%). Every value involved (a loss of ~0.01, gradients of ~1e-3 / N) sits
inside bf16's element-wise tolerance (atol 2e-2), which is why a fixed table passes it; the error policy of
fusion_advisor/verification/policy.py judges each tensor at its own scale and rejects it.

``make_kernel(grad_scale, loss_scale, round_before_subtract)`` builds variants for tests/test_verify.py: the
gradient x 3, the loss x 0.3, and the correct kernel (``round_before_subtract=False``) that must verify.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernel_library._device import default_device

# --- kernel -------------------------------------------------------------------------------------------------


@triton.jit
def _ce_fwd_kernel(
    logits_ptr,  # pointer to logits: [n_rows, n_cols] bf16, row stride stride_row
    target_ptr,  # pointer to target: [n_rows] int64 class indices
    loss_ptr,  # pointer to the per-row loss: [n_rows] fp32
    dlogits_ptr,  # pointer to d(mean loss)/d(logits): [n_rows, n_cols] bf16, contiguous
    n_cols,  # vocabulary size
    stride_row,  # stride of logits' row axis, in elements
    scale,  # 1 / n_rows (mean reduction) times the gradient scale of the variant
    loss_scale,  # the loss scale of the variant (1.0: correct)
    BLOCK_SIZE: tl.constexpr,  # power of two >= n_cols: the whole row in one block
    ROUND_BEFORE_SUBTRACT: tl.constexpr,  # True: the bug
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols
    x = tl.load(logits_ptr + row * stride_row + offs, mask=mask, other=-float("inf")).to(tl.float32)
    y = tl.load(target_ptr + row)
    m = tl.max(x, 0)
    e = tl.exp(x - m)
    s = tl.sum(e, 0)
    x_y = tl.sum(tl.where(offs == y, x, 0.0), 0)
    tl.store(loss_ptr + row, (m + tl.log(s) - x_y) * loss_scale)  # -log softmax(x)_y
    p = e / s
    if ROUND_BEFORE_SUBTRACT:
        # BUG (deliberate): the probability stored in the bf16 gradient buffer is what 1 is subtracted from
        p_y = tl.sum(tl.where(offs == y, p.to(tl.bfloat16).to(tl.float32), 0.0), 0)
    else:
        p_y = tl.sum(tl.where(offs == y, p, 0.0), 0)
    grad = tl.where(offs == y, p_y - 1.0, p) * scale
    tl.store(dlogits_ptr + row * n_cols + offs, grad.to(tl.bfloat16), mask=mask)


# --- launcher, autograd, public function --------------------------------------------------------------------


def _forward(logits: torch.Tensor, target: torch.Tensor, grad_scale: float, loss_scale: float,
             round_before_subtract: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.dim() != 2 or logits.dtype != torch.bfloat16 or logits.stride(1) != 1:
        raise ValueError(f"ce_bf16_grad_rounding: logits must be [n_rows, n_cols] bf16 with a contiguous last axis, "
                         f"got {list(logits.shape)} {logits.dtype} strides {logits.stride()}")
    target = target.contiguous()
    n_rows, n_cols = logits.shape
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    dlogits = torch.empty((n_rows, n_cols), dtype=torch.bfloat16, device=logits.device)
    _ce_fwd_kernel[(n_rows,)](logits, target, loss_rows, dlogits, n_cols, logits.stride(0), grad_scale / n_rows,
                              loss_scale, BLOCK_SIZE=triton.next_power_of_2(n_cols),
                              ROUND_BEFORE_SUBTRACT=round_before_subtract)
    return (loss_rows.sum() / n_rows).to(torch.bfloat16), dlogits


def make_kernel(grad_scale: float = 1.0, loss_scale: float = 1.0, round_before_subtract: bool = True):
    """A ``kernel_fn(logits, target) -> loss`` (mean cross-entropy, bf16 scalar) with the gradient written in the
    forward and scaled by ``grad_output`` in the backward; ``grad_scale`` / ``loss_scale`` != 1 are wrong
    variants, ``round_before_subtract=False`` is the correct kernel."""

    class _CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target):
            loss, dlogits = _forward(logits.detach(), target, grad_scale, loss_scale, round_before_subtract)
            ctx.save_for_backward(dlogits)
            return loss

        @staticmethod
        def backward(ctx, grad_output):
            (dlogits,) = ctx.saved_tensors
            return dlogits * grad_output.to(dlogits.dtype), None

    def kernel(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return _CrossEntropy.apply(logits, target)

    return kernel


# --- contract -----------------------------------------------------------------------------------------------

kernel_fn = make_kernel()


def reference_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy`` in fp32 (float64 stays float64), returned in the logits' dtype."""
    acc = torch.promote_types(logits.dtype, torch.float32)
    return torch.nn.functional.cross_entropy(logits.to(acc), target).to(logits.dtype)


#: True-class probabilities of the rows of ``get_inputs()``: a trained language model's confident predictions.
CONFIDENCE = (0.999, 0.99, 0.995, 0.999)


def get_inputs() -> list:
    """``[logits [4, 1000] bf16, target [4] int64]``: N(0, 1) logits with each target's logit set so that its
    probability is :data:`CONFIDENCE` (before the logits are rounded to bf16)."""
    device = default_device()
    n_rows, vocab = len(CONFIDENCE), 1000
    logits = torch.randn(n_rows, vocab, dtype=torch.float64)
    target = torch.randint(0, vocab, (n_rows,))
    for i, q in enumerate(CONFIDENCE):
        logits[i, target[i]] = -math.inf
        others = torch.logsumexp(logits[i], 0)
        logits[i, target[i]] = others + math.log(q / (1 - q))
    return [logits.to(torch.bfloat16).to(device).requires_grad_(True), target.to(device)]
