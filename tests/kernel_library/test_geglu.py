"""Tests of kernel_library/geglu.py (``fusion_advisor::geglu``), run under TRITON_INTERPRET on the CPU.

GeGLU runs the gated-unit kernels of kernel_library/swiglu.py with the tanh-GELU gate: the dtype x width grid, the
layouts (fused gate_up chunks, offset, transposed, broadcast and permuted views), empty tensors and bad inputs run
for both units in test_swiglu.py (``GATED``). Here: what the tanh-GELU gate adds (its curved region and tails, hard
values in every dtype), the contract and the op's registration.
"""

import pytest
import torch
import torch.nn.functional as F

from kernel_library import _device
from kernel_library import geglu as mod

from kernel_asserts import DEVICE, DTYPES, assert_matches, check_fwd_bwd, pair


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


def test_contract_and_registry():
    args = mod.get_inputs()
    assert all(t.requires_grad for t in args) and args[0].device.type == DEVICE.type
    assert args[0].numel() < 100_000 or _device.on_gpu()  # get_inputs() gives Llama-7B shapes on a GPU
    ref = mod.reference_fn(*(t.detach().double() for t in args))
    assert_matches(mod.kernel_fn(*args), ref, args[0].dtype)
    assert mod.bytes_moved(*args) == 3 * args[0].numel() * args[0].element_size()
    entry = mod.ENTRY
    assert entry.replaces == "geglu" and entry.op == "fusion_advisor::geglu" and entry.has_backward
    a, b = (t.detach() for t in args)
    torch.testing.assert_close(entry.pattern(a, b), F.gelu(a, approximate="tanh") * b)
    torch.testing.assert_close(entry.replacement(a, b), mod.kernel_fn(a, b))


def test_opcheck():
    # Schema and autograd registration here; the fake-tensor and AOT-dispatch checks run the op on fake tensors,
    # which only works with compiled (GPU) Triton, not under TRITON_INTERPRET.
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE.type == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fusion_advisor.geglu.default, tuple(mod.make_inputs(4, 40, torch.float32)), test_utils=utils)


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("fused", [False, True])
def test_torch_compile_fullgraph(fused):
    a, b = mod.make_inputs(64, 1000, torch.bfloat16, fused=fused)
    compiled = torch.compile(mod.kernel_fn, fullgraph=True)
    out = compiled(a, b)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (a, b), grad)
    eager = mod.kernel_fn(a, b)
    eager_grads = torch.autograd.grad(eager, (a, b), grad)
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=0, rtol=0)
