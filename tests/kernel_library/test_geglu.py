"""Tests of kernel_library/geglu.py (``fusion_advisor::geglu``), run under TRITON_INTERPRET on the CPU.

GeGLU runs the gated-unit kernels of kernel_library/swiglu.py with the tanh-GELU gate: the dtype x width grid, the
layouts (fused gate_up chunks, offset, transposed, broadcast and permuted views), hard values, empty tensors and bad
inputs run for both units in test_swiglu.py (``GATED``). Here: what the tanh-GELU gate adds (its curved region and
tails); the contract and the op's registration (opcheck, torch.compile) are checked in test_swiglu.py.
"""

import torch

from kernel_library import geglu as mod

from kernel_asserts import DEVICE, check_fwd_bwd, pair


def _check(a, b, equal_nan=False):
    """Forward and backward of the kernel on (a, b) against float64 autograd of the reference; inputs unchanged."""
    return check_fwd_bwd(mod.kernel_fn, mod.reference_fn, [a, b], equal_nan)


def test_single_row_and_wide_range():
    _check(*pair(1, 1536))
    # gate values across GELU's curved region and both tails
    a = torch.linspace(-12, 12, 1001, device=DEVICE).reshape(1, -1).requires_grad_()
    _check(a, torch.randn(1, 1001, device=DEVICE, requires_grad=True))
