"""Tests of kernel_library/swiglu.py (``fusion_advisor::swiglu``), run under TRITON_INTERPRET on the CPU.

Every output is compared element by element with ``reference_fn`` evaluated in float64 on the same (upcast)
inputs, with the tolerance of the kernel's dtype; gradients with float64 autograd of the reference.

Grid: all three dtypes x widths 1 (degenerate row), 17 (under one block, odd), 1000 (not a power of two) and 4097
(one past a power of two: the masked tail of a second block); 3 rows, plus one single-row case. Layouts cover
both kernel paths: the flat contiguous one and the [rows, cols] strided one (gate_up chunks, offset views,
a transpose, a broadcast, and a permuted 3-D tensor that must be copied).
"""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fusion_advisor.tolerances import TOLERANCES
from kernel_library import _device
from kernel_library import swiglu as mod

DEVICE = _device.default_device()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _pair(*shape, dtype=torch.float32):
    return [torch.randn(*shape, dtype=dtype, device=DEVICE).requires_grad_() for _ in range(2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [1, 17, 1000, 4097])
def test_dtypes_and_widths(dtype, n_cols):
    _check(*_pair(3, n_cols, dtype=dtype))


def test_single_row_and_1d():
    _check(*_pair(1, 1536))
    _check(*_pair(300))


def test_fused_gate_up_chunks():
    # a = x[:, :I], b = x[:, I:] of one gate_up projection: row stride 2I, no copy; gradients reach x.
    a, b = mod.make_inputs(5, 1000, torch.bfloat16, fused=True)
    assert not a.is_contiguous() and a.stride(0) == 2000
    _check(a, b)


@pytest.mark.parametrize(
    "make",
    [
        lambda x, y: (x[1:], y[:-1]),  # offset rows (contiguous views with a storage offset)
        lambda x, y: (x[:, 3:], y[:, :-3]),  # offset columns: row stride 40, 37 columns, unaligned start
        lambda x, y: (x.t(), y.t()),  # transposed: column stride 40
        lambda x, y: (x.t(), y.t().contiguous()),  # one transposed, one contiguous: strided path for both
        lambda x, y: (x, y[0:1].expand_as(y)),  # broadcast b: row stride 0
    ],
    ids=["offset_rows", "offset_cols", "transposed", "mixed", "expanded"],
)
def test_strided_views(make):
    # Separate sources for a and b: gradients are compared per input, so a and b must not alias.
    x = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    y = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    _check(*make(x, y))


def test_3d_contiguous_and_permuted():
    _check(*_pair(2, 3, 50))
    # Leading dims that cannot be flattened into one row stride are copied first; results still match.
    x = torch.randn(3, 2, 50, device=DEVICE, requires_grad=True)
    _check(x.transpose(0, 1), x.transpose(0, 1) * 2)


def test_hard_values():
    # silu(-inf) is NaN in torch (-inf * sigmoid(-inf) = -inf * 0) and here; 1e4 saturates sigmoid to 0 / 1.
    # Products stay inside fp16's range (65504) so that fp16 can be checked against the float64 reference.
    a = torch.tensor([[1e4, -1e4, 0.0, -float("inf"), float("inf"), 5.0, -80.0, 1.0]], device=DEVICE).requires_grad_()
    b = torch.tensor([[2.0, 3.0, 1e4, 1.0, 1.0, -1e4, 1e4, -1.0]], device=DEVICE).requires_grad_()
    out = mod.kernel_fn(a, b)
    assert torch.isnan(out[0, 3]) and torch.isnan(mod.reference_fn(a, b)[0, 3])
    assert torch.isfinite(out[0, [0, 1, 2, 5, 6, 7]]).all()
    _check(a, b, equal_nan=True)
    for dtype in (torch.float16, torch.bfloat16):
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
        mod.kernel_fn(a, torch.randn(4, 9, device=DEVICE))
    with pytest.raises(TypeError, match="b must have a's dtype"):
        mod.kernel_fn(a, a.half())
    with pytest.raises(TypeError, match="a must be one of"):
        mod.kernel_fn(a.long(), a.long())
    with pytest.raises(ValueError, match="at least 1 dimension"):
        mod.kernel_fn(torch.tensor(1.0, device=DEVICE), torch.tensor(2.0, device=DEVICE))


@triton.jit
def _offsets_probe(out_ptr, pid, n_col_blocks, stride_row, stride_col, BLOCK_SIZE: tl.constexpr):
    row, cols = mod._program_cols(pid, n_col_blocks, BLOCK_SIZE)
    tl.store(out_ptr + tl.arange(0, BLOCK_SIZE), row * stride_row + cols * stride_col)


@pytest.mark.parametrize(
    "pid,n_col_blocks,stride_row,stride_col",
    [
        (2**31 - 2, 3, 3 * 2**20, 1),  # row ~7e8 times a 3M row stride: passes 2**31 by far
        (2**30 + 5, 2**30 + 7, 0, 1),  # one flat row: columns past 2**31
        (123_456, 1000, 7, 2**21),  # a transposed operand: column index times a large column stride
    ],
)
def test_offsets_are_int64(pid, n_col_blocks, stride_row, stride_col):
    block = 16
    out = torch.empty(block, dtype=torch.int64, device=DEVICE)
    _offsets_probe[(1,)](out, pid, n_col_blocks, stride_row, stride_col, BLOCK_SIZE=block)
    row, col_block = divmod(pid, n_col_blocks)
    expected = [row * stride_row + (col_block * block + i) * stride_col for i in range(block)]
    assert out.tolist() == expected


def test_config_heuristic():
    assert mod.GluConfig.from_cols(11008 * 8192) == mod.GluConfig(2048, 8)
    assert mod.GluConfig.from_cols(1000) == mod.GluConfig(1024, 4)
    assert mod.GluConfig.from_cols(17) == mod.GluConfig(32, 1)


def test_contract_and_registry():
    args = mod.get_inputs()
    assert all(t.requires_grad for t in args) and args[0].device.type == DEVICE.type
    assert args[0].numel() < 100_000 or _device.on_gpu()  # get_inputs() gives Llama-7B shapes on a GPU
    ref = mod.reference_fn(*(t.detach().double() for t in args))
    _assert_close(mod.kernel_fn(*args), ref, args[0].dtype)
    assert mod.bytes_moved(*args) == 3 * args[0].numel() * args[0].element_size()
    entry = mod.ENTRY
    assert entry.replaces == "swiglu" and entry.op == "fusion_advisor::swiglu" and entry.has_backward
    a, b = (t.detach() for t in args)
    torch.testing.assert_close(entry.pattern(a, b), F.silu(a) * b)
    torch.testing.assert_close(entry.replacement(a, b), mod.kernel_fn(a, b))


def test_opcheck():
    # Schema and autograd registration here; the fake-tensor and AOT-dispatch checks run the op on fake tensors,
    # which only works with compiled (GPU) Triton, not under TRITON_INTERPRET.
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE.type == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fusion_advisor.swiglu.default, tuple(mod.make_inputs(4, 40, torch.float32, fused=True)), test_utils=utils)


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
