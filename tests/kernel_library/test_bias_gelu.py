"""Tests of kernel_library/bias_gelu.py (``fusion_advisor::bias_gelu``), run under TRITON_INTERPRET on the CPU.

Outputs and gradients (dx, dbias) are compared element by element with float64 autograd of ``reference_fn``.
Dropout: the reference applies the kernel's own mask (``dropout_mask(seed, shape)``, the same ``tl.rand``
stream), so kernel and reference are compared like with like; separate tests check that the mask is reproducible,
independent of x's strides, changes with the seed, and drops close to ``dropout_p`` of the elements.

Grid: 3 dtypes x both GELU forms x widths 1, 17, 1000, 4097 (degenerate, sub-tile, non-power-of-two, masked tail
of a 512-column tile) on 3 rows; a 150-row case spans several 64-row backward groups so dbias is reduced across
program partial sums.
"""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library import bias_gelu as mod

from kernel_asserts import DEVICE, DTYPES, assert_matches, check_empty


def _check(x, bias, approximate="none", dropout_p=0.0, seed=None, equal_nan=False):
    """Kernel vs float64 reference: y, dx, dbias; inputs unchanged. Returns the kernel's y."""
    dtype = x.dtype
    before = [x.detach().clone(), bias.detach().clone()]
    y = mod.kernel_fn(x, bias, approximate, dropout_p, seed)
    assert y.dtype == dtype and y.shape == x.shape
    x64, b64 = (t.detach().double().requires_grad_() for t in (x, bias))
    ref = mod.reference_fn(x64, b64, approximate, dropout_p, seed)
    assert_matches(y, ref, dtype, equal_nan)
    grad = torch.randn_like(y)
    grad_x, grad_b = torch.autograd.grad(y, (x, bias), grad)
    ref_x, ref_b = torch.autograd.grad(ref, (x64, b64), grad.double())
    assert_matches(grad_x, ref_x, dtype, equal_nan)
    assert_matches(grad_b, ref_b, dtype, equal_nan)  # summed in fp32 from unrounded dz: one final rounding
    for t, t0 in zip((x, bias), before):
        torch.testing.assert_close(t.detach(), t0, atol=0, rtol=0, equal_nan=True)
    return y


def _inputs(n_rows, n_cols, dtype=torch.float32):
    x = torch.randn(n_rows, n_cols, dtype=dtype, device=DEVICE, requires_grad=True)
    bias = torch.randn(n_cols, dtype=dtype, device=DEVICE, requires_grad=True)
    return x, bias


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("n_cols", [1, 17, 1000, 4097])
def test_dtypes_and_widths(dtype, approximate, n_cols):
    _check(*_inputs(3, n_cols, dtype), approximate)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_single_row_and_many_row_groups(approximate):
    _check(*_inputs(1, 1536), approximate)
    # 150 rows of 200: BLOCK_C 256, BLOCK_R 16, 64 rows per backward program -> 3 row groups of 4 tiles, the last
    # group partial (22 rows: one full tile, one partial, two empty).
    cfg = mod.BiasGeluConfig.from_shape(150, 200)
    assert (cfg.block_r, cfg.block_c, cfg.rows_per_program) == (16, 256, 64)
    _check(*_inputs(150, 200, torch.bfloat16), approximate)


@pytest.mark.parametrize(
    "make",
    [
        lambda x, b: (x[1:], b),  # offset rows
        lambda x, b: (x[:, 3:], b[3:]),  # offset columns, bias offset too
        lambda x, b: (x.t()[:, :24], b[:24]),  # transposed x: column stride 24
        lambda x, b: (x.view(4, 6, 24), b),  # 3-D x
        lambda x, b: (x.view(4, 6, 24).transpose(0, 1), b),  # permuted leading dims: copied
        lambda x, b: (x[:, ::2], b[::2]),  # column stride 2 for x and bias
    ],
    ids=["offset_rows", "offset_cols", "transposed", "3d", "permuted_3d", "stride2"],
)
def test_strided_views(make):
    x = torch.randn(24, 24, device=DEVICE, requires_grad=True)
    b = torch.randn(24, device=DEVICE, requires_grad=True)
    xv, bv = make(x, b)
    _check(xv, bv, "none")
    _check(xv, bv, "tanh", dropout_p=0.25, seed=3)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_hard_values(approximate):
    # gelu(-inf) is NaN in torch (-inf * 0) and here; +-1e4 saturate to x and -0; dbias of a column holding a
    # NaN/inf gradient is NaN in both. Values stay inside fp16's range.
    x = torch.tensor([[1e4, -1e4, 0.0, -float("inf"), 3.0, -30.0], [-2.0, 1.0, 1e4, 2.0, -1e4, 0.5]], device=DEVICE)
    bias = torch.tensor([0.5, -0.5, 0.0, 1.0, 1e4, 0.0], device=DEVICE)
    for dtype in DTYPES:
        xd, bd = x.to(dtype).requires_grad_(), bias.to(dtype).requires_grad_()
        y = _check(xd, bd, approximate, equal_nan=True)
        assert torch.isnan(y[0, 3]) and torch.isfinite(y[1]).all()


def test_dropout_matches_reference_and_is_reproducible():
    x, bias = _inputs(20, 1000)
    p = 0.3
    y = _check(x, bias, "none", p, seed=1234)
    again = mod.kernel_fn(x, bias, "none", p, 1234)
    assert torch.equal(y, again)
    other = mod.kernel_fn(x, bias, "none", p, 1235)
    assert not torch.equal(y == 0, other == 0)
    keep = mod.dropout_mask(1234, y.shape, p, y.device)
    assert torch.equal(keep, mod.dropout_mask(1234, y.shape, p, y.device))
    # Where the mask drops, y is exactly 0; where it keeps, y = gelu(x + b) / (1 - p).
    assert (y[~keep] == 0).all()
    torch.testing.assert_close(y[keep], F.gelu(x + bias)[keep] / (1 - p))


def test_dropout_rate():
    n = 50 * 1000
    for p in (0.1, 0.5, 0.9):
        keep = mod.dropout_mask(7, (50, 1000), p, DEVICE)
        drop_rate = 1.0 - keep.double().mean().item()
        sigma = (p * (1 - p) / n) ** 0.5
        assert abs(drop_rate - p) < 5 * sigma, (p, drop_rate)


def test_dropout_mask_ignores_strides():
    # The mask follows the row-major index of the output, not x's memory layout.
    x = torch.randn(30, 40, device=DEVICE)
    bias = torch.randn(40, device=DEVICE)
    y = mod.kernel_fn(x, bias, "none", 0.5, 99)
    y_t = mod.kernel_fn(x.t().contiguous().t(), bias, "none", 0.5, 99)
    assert torch.equal(y, y_t)


def test_dropout_extremes_and_seed_from_torch_generator():
    x, bias = _inputs(8, 64)
    y = mod.kernel_fn(x, bias, "none", 1.0, 5)
    assert torch.equal(y, torch.zeros_like(y))
    grad_x, grad_b = torch.autograd.grad(y, (x, bias), torch.ones_like(y))
    assert not grad_x.any() and not grad_b.any()
    torch.testing.assert_close(mod.kernel_fn(x, bias, "none", 0.0, 5), F.gelu(x + bias))
    torch.manual_seed(42)
    y1 = mod.kernel_fn(x, bias, "tanh", 0.5)
    torch.manual_seed(42)
    y2 = mod.kernel_fn(x, bias, "tanh", 0.5)
    assert torch.equal(y1, y2)
    with pytest.raises(ValueError, match="explicit seed"):
        mod.reference_fn(x, bias, "none", 0.5, None)


def test_empty():
    for (x, _), (grad_x, grad_b) in check_empty(mod.kernel_fn, _inputs):
        assert grad_x.shape == x.shape and not grad_b.any()


def test_bad_inputs_name_the_argument():
    x, bias = torch.randn(4, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    with pytest.raises(ValueError, match="bias must have shape"):
        mod.kernel_fn(x, torch.randn(9, device=DEVICE))
    with pytest.raises(TypeError, match="bias must have x's dtype"):
        mod.kernel_fn(x, bias.half())
    with pytest.raises(ValueError, match="approximate must be"):
        mod.kernel_fn(x, bias, "sigmoid")
    with pytest.raises(ValueError, match="dropout_p must be"):
        mod.kernel_fn(x, bias, "none", 1.5, 0)


@triton.jit
def _tile_probe(rows_ptr, flat_ptr, row_block, col_block, n_cols, stride_row, BLOCK_R: tl.constexpr,
                BLOCK_C: tl.constexpr):
    rows, cols = mod._tile(row_block, col_block, BLOCK_R, BLOCK_C)
    r = tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    tl.store(rows_ptr + r, rows * stride_row)
    tl.store(flat_ptr + r[:, None] * BLOCK_C + c[None, :], rows[:, None] * n_cols + cols[None, :])


def test_offsets_are_int64():
    # Row block 2**29 of 4-row tiles: rows ~2**31; times a row stride of 11008 and as a flat dropout index.
    block_r, block_c, row_block, col_block, n_cols = 4, 8, 2**29 + 3, 5, 11008
    rows_off = torch.empty(block_r, dtype=torch.int64, device=DEVICE)
    flat = torch.empty(block_r, block_c, dtype=torch.int64, device=DEVICE)
    _tile_probe[(1,)](rows_off, flat, row_block, col_block, n_cols, n_cols, BLOCK_R=block_r, BLOCK_C=block_c)
    rows = [row_block * block_r + i for i in range(block_r)]
    assert rows_off.tolist() == [r * n_cols for r in rows]
    assert flat.tolist() == [[r * n_cols + col_block * block_c + j for j in range(block_c)] for r in rows]


def test_contract_and_registry():
    args = mod.get_inputs()
    assert all(t.requires_grad for t in args) and args[0].device.type == DEVICE.type
    assert args[0].numel() < 100_000 or _device.on_gpu()  # get_inputs() gives GPT-MLP shapes (bf16) on a GPU
    ref = mod.reference_fn(*(t.detach().double() for t in args))
    assert_matches(mod.kernel_fn(*args), ref, args[0].dtype)
    x, bias = (t.detach() for t in args)
    assert mod.bytes_moved(x, bias) == 2 * x.numel() * x.element_size() + bias.numel() * bias.element_size()
    x2, b2, approximate, p, seed = mod.make_inputs(4, 32, torch.float32, dropout_p=0.2)
    assert (approximate, p, seed) == ("none", 0.2, 1234)
    entry = mod.ENTRY
    assert entry.replaces == "bias_gelu" and entry.op == "fusion_advisor::bias_gelu" and entry.has_backward
    torch.testing.assert_close(entry.pattern(x, bias), F.gelu(x + bias))
    torch.testing.assert_close(entry.replacement(x, bias), mod.kernel_fn(x, bias))


def test_opcheck():
    # Schema and autograd registration here; the fake-tensor and AOT-dispatch checks run the op on fake tensors,
    # which only works with compiled (GPU) Triton, not under TRITON_INTERPRET.
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE.type == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fusion_advisor.bias_gelu.default, (*mod.make_inputs(4, 40, torch.float32), "tanh", 0.2, 5), test_utils=utils)


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("approximate,dropout_p", [("none", 0.0), ("tanh", 0.1)])
def test_torch_compile_fullgraph(approximate, dropout_p):
    x, bias = mod.make_inputs(256, 1000, torch.bfloat16)
    compiled = torch.compile(mod.kernel_fn, fullgraph=True)
    y = compiled(x, bias, approximate, dropout_p, 11)  # an explicit seed: drawing one is a graph break
    grad = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, bias), grad)
    eager = mod.kernel_fn(x, bias, approximate, dropout_p, 11)
    eager_grads = torch.autograd.grad(eager, (x, bias), grad)
    torch.testing.assert_close(y, eager, atol=0, rtol=0)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=0, rtol=0)
