"""Tests of kernel_library/geglu.py (``fusion_advisor::geglu``), run under TRITON_INTERPRET on the CPU.

GeGLU runs the gated-unit kernels of kernel_library/swiglu.py with the tanh-GELU gate; the layout machinery they
share (offset math, block heuristic) is tested in test_swiglu.py. Here: the tanh-GELU numerics over the same grid
(all dtypes x widths 1, 17, 1000, 4097: degenerate, sub-block, non-power-of-two, masked second block), both
kernel paths (flat contiguous and strided), hard values, gradients against float64 autograd of the reference.
"""

import pytest
import torch
import torch.nn.functional as F

from fusion_advisor.tolerances import TOLERANCES
from kernel_library import _device
from kernel_library import geglu as mod

DEVICE = _device.default_device()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _assert_close(actual, expected, dtype, equal_nan=False):
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=equal_nan)


def _check(a, b, equal_nan=False):
    """Forward and backward of the kernel on (a, b) against float64 autograd of the reference; inputs unchanged."""
    dtype = a.dtype
    before = [a.detach().clone(), b.detach().clone()]
    out = mod.kernel_fn(a, b)
    assert out.dtype == dtype and out.shape == a.shape
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    ref = mod.reference_fn(a64, b64)
    _assert_close(out, ref, dtype, equal_nan)
    grad = torch.randn_like(out)
    grad_a, grad_b = torch.autograd.grad(out, (a, b), grad)
    ref_a, ref_b = torch.autograd.grad(ref, (a64, b64), grad.double())
    _assert_close(grad_a, ref_a, dtype, equal_nan)
    _assert_close(grad_b, ref_b, dtype, equal_nan)
    for t, t0 in zip((a, b), before):
        torch.testing.assert_close(t.detach(), t0, atol=0, rtol=0, equal_nan=True)


def _pair(*shape, dtype=torch.float32):
    return [torch.randn(*shape, dtype=dtype, device=DEVICE).requires_grad_() for _ in range(2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [1, 17, 1000, 4097])
def test_dtypes_and_widths(dtype, n_cols):
    _check(*_pair(3, n_cols, dtype=dtype))


def test_single_row_and_wide_range():
    _check(*_pair(1, 1536))
    # gate values across GELU's curved region and both tails
    a = torch.linspace(-12, 12, 1001, device=DEVICE).reshape(1, -1).requires_grad_()
    _check(a, torch.randn(1, 1001, device=DEVICE, requires_grad=True))


def test_fused_gate_up_chunks():
    a, b = mod.make_inputs(5, 1000, torch.bfloat16, fused=True)
    assert not a.is_contiguous() and a.stride(0) == 2000
    _check(a, b)


@pytest.mark.parametrize(
    "make",
    [
        lambda x, y: (x[1:], y[:-1]),
        lambda x, y: (x[:, 3:], y[:, :-3]),
        lambda x, y: (x.t(), y.t()),
        lambda x, y: (x, y[0:1].expand_as(y)),
    ],
    ids=["offset_rows", "offset_cols", "transposed", "expanded"],
)
def test_strided_views(make):
    x = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    y = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    _check(*make(x, y))


def test_permuted_3d_is_copied_and_correct():
    x = torch.randn(3, 2, 50, device=DEVICE, requires_grad=True)
    y = torch.randn(3, 2, 50, device=DEVICE, requires_grad=True)
    _check(x.transpose(0, 1), y.transpose(0, 1))


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


def test_empty():
    for shape in [(0, 7), (4, 0)]:
        a, b = _pair(*shape)
        out = mod.kernel_fn(a, b)
        assert out.shape == shape
        grad_a, grad_b = torch.autograd.grad(out, (a, b), torch.ones_like(out))
        assert grad_a.shape == shape and grad_b.shape == shape


def test_bad_inputs_name_the_argument():
    a = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="b must have a's shape"):
        mod.kernel_fn(a, torch.randn(8, 4, device=DEVICE))
    with pytest.raises(TypeError, match="b must have a's dtype"):
        mod.kernel_fn(a, a.bfloat16())


def test_contract_and_registry():
    args = mod.get_inputs()
    assert all(t.requires_grad for t in args) and args[0].device.type == DEVICE.type
    assert args[0].numel() < 100_000 or _device.on_gpu()  # get_inputs() gives Llama-7B shapes on a GPU
    ref = mod.reference_fn(*(t.detach().double() for t in args))
    _assert_close(mod.kernel_fn(*args), ref, args[0].dtype)
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
