"""Tests of kernel_library/geglu.py (``fusion_advisor::geglu``), run under TRITON_INTERPRET on the CPU.

GeGLU runs the gated-unit kernels of kernel_library/swiglu.py with the tanh-GELU gate: the dtype x width grid, the
layouts (fused gate_up chunks, offset, transposed, broadcast and permuted views), empty tensors and bad inputs run
for both units in test_swiglu.py (``GATED``). Here: what the tanh-GELU gate adds (its curved region and tails, hard
values in every dtype); the contract and the op's registration (opcheck, torch.compile) are checked in test_swiglu.py.
"""

import torch

from kernel_library import geglu as mod

from kernel_asserts import DEVICE, DTYPES, check_fwd_bwd, pair


def _check(a, b, equal_nan=False):
    """Forward and backward of the kernel on (a, b) against float64 autograd of the reference; inputs unchanged."""
    return check_fwd_bwd(mod.kernel_fn, mod.reference_fn, [a, b], equal_nan)


def test_single_row_and_wide_range():
    _check(*pair(1, 1536))
    # gate values across GELU's curved region and both tails
    a = torch.linspace(-12, 12, 1001, device=DEVICE).reshape(1, -1).requires_grad_()
    _check(a, torch.randn(1, 1001, device=DEVICE, requires_grad=True))


def test_hard_values():
    # gelu_tanh(-inf) is NaN in torch (0.5 * -inf * (1 + tanh(-inf)) = -inf * 0) and here; +-1e4 saturate.
    # Products stay inside fp16's range.
    a = torch.tensor([[1e4, -1e4, 0.0, -float("inf"), float("inf"), 5.0, -80.0, 1.0]], device=DEVICE).requires_grad_()
    b = torch.tensor([[2.0, 3.0, 1e4, 1.0, 1.0, -1e4, 1e4, -1.0]], device=DEVICE).requires_grad_()
    out = mod.kernel_fn(a, b)
    assert torch.isnan(out[0, 3]) and torch.isnan(mod.reference_fn(a, b)[0, 3])
    assert torch.isfinite(out[0, [0, 1, 2, 5, 6, 7]]).all()
    for dtype in DTYPES:
        _check(a.detach().to(dtype).requires_grad_(), b.detach().to(dtype).requires_grad_(), equal_nan=True)
