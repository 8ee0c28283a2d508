"""Tests of kernel_library/softmax.py against its float64 reference (Triton interpreter on CPU, real kernels on GPU).

Grid choice: the interpreter runs each program in Python, so row counts are small and wide rows (65537, 262144) use
a single row. The looped (online) path is also exercised at small widths by forcing a small-block RowConfig, which
covers masks, causal and hard values on that path cheaply.
"""

from __future__ import annotations

import pytest
import torch

from kernel_library import _device
from kernel_library import softmax as sm
from kernel_library.registry import get_kernel

from kernel_asserts import DEVICE, DTYPES, assert_close

#: A looped config with a tiny block, so that rows of a few hundred columns take several online-softmax chunks.
LOOPED = sm.SoftmaxConfig(block_size=64, num_warps=2, single_block=False)
NEG_INF = float("-inf")


def rand(shape, dtype=torch.float32, std=3.0, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * std).to(dtype=dtype, device=DEVICE)


def check_forward_backward(x: torch.Tensor, scale=1.0, mask=None, causal=False, config=None, grad=True) -> None:
    """Forward (and backward against autograd of the float64 reference) for one input."""
    dtype = x.dtype
    if config is None:
        x_k = x.detach().clone().requires_grad_(grad)
        y = sm.kernel_fn(x_k, scale, mask, causal)
    else:
        y = sm._softmax_fwd_launch(x, scale, mask, causal, config=config)
    x64 = x.detach().double().requires_grad_(grad)
    m64 = mask.double() if mask is not None and mask.dtype != torch.bool else mask
    ref = sm.reference_fn(x64, scale, m64, causal)
    assert y.dtype == dtype
    assert_close(y, ref, dtype)
    if not grad:
        return
    dy = rand(x.shape, dtype, std=1.0, seed=7)
    ref.backward(dy.double())
    if config is None:
        y.backward(dy)
        dx = x_k.grad
    else:
        dx = sm._softmax_bwd_launch(y, dy, scale, config=config)
    assert_close(dx, x64.grad, dtype, "dx")


# --- widths and dtypes ---------------------------------------------------------------------------------------

# 1: a single column (y == 1); 17, 1000, 1536: odd widths below power-of-two blocks (single-block path); 4097: one
# past the single-block limit, so the looped online path at its real chunk size.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [1, 17, 1000, 1536, 4097])
def test_widths(n_cols, dtype):
    check_forward_backward(rand((3, n_cols), dtype))


# 65537 > MAX_SINGLE_BLOCK: the looped online path at its real block size; 262144 is the widest row promised.
@pytest.mark.parametrize("n_cols,dtype", [(65537, torch.float32), (65537, torch.bfloat16), (262144, torch.float32)])
def test_wide_rows_use_online_path(n_cols, dtype):
    assert not sm.SoftmaxConfig.for_row(n_cols).single_block
    x = rand((1, n_cols), dtype)
    check_forward_backward(x, grad=n_cols < 100000)


def test_single_row_and_rows_sum_to_one():
    x = rand((1, 777))
    y = sm.kernel_fn(x)
    assert torch.allclose(y.double().sum(-1), torch.ones(1, dtype=torch.float64, device=DEVICE), atol=1e-6)
    check_forward_backward(x)


def test_shift_invariance():
    x = rand((4, 300))
    assert_close(sm.kernel_fn(x + 1000.0), sm.reference_fn(x.double()), torch.float32)


@pytest.mark.parametrize("mask_kind", [None, "additive", "bool"])
@pytest.mark.parametrize("causal", [False, True])
def test_looped_path_forced(mask_kind, causal):
    x = rand((2, 3, 5, 300))
    mask = None
    if mask_kind == "additive":
        mask = rand((2, 1, 5, 300), seed=3)
    elif mask_kind == "bool":
        mask = torch.rand((1, 3, 5, 300), generator=torch.Generator().manual_seed(4)).to(DEVICE) > 0.3
    check_forward_backward(x, 0.7, mask, causal, config=LOOPED)


# --- hard values ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [None, LOOPED], ids=["single", "looped"])
def test_large_magnitudes_and_neg_inf(dtype, config):
    x = rand((4, 257), dtype, std=1.0)
    x[0, :] = 0.0
    x[0, 5] = 1e4  # one dominant entry: y = onehot
    x[1, ::3] = -1e4
    x[1, 1::3] = 1e4 if dtype != torch.float16 else 6e4
    x[2, ::2] = NEG_INF  # half the row at -inf: y = 0 there
    x[3, 100] = NEG_INF
    check_forward_backward(x, config=config)


@pytest.mark.parametrize("config", [None, LOOPED], ids=["single", "looped"])
def test_fully_masked_rows_give_zeros(config):
    x = rand((4, 200))
    x[1] = NEG_INF  # a row of -inf scores
    mask = torch.ones(4, 200, dtype=torch.bool, device=DEVICE)
    mask[2] = False  # a row masked out by the bool mask
    add = torch.zeros(4, 200, device=DEVICE)
    add[3] = NEG_INF  # a row masked out by an additive -inf mask
    for m in (mask, add):
        check_forward_backward(x, 1.0, m, config=config)
        y = sm._softmax_fwd_launch(x, 1.0, m, False, config=config)
        assert torch.equal(y[1], torch.zeros(200, device=DEVICE))
    # Documented difference: torch.softmax gives NaN on such rows, the kernel gives zeros.
    assert torch.isnan(torch.softmax(x, -1)[1]).all()


def test_fully_masked_row_gradient_is_zero():
    x = rand((2, 50)).requires_grad_()
    mask = torch.ones(2, 50, dtype=torch.bool, device=DEVICE)
    mask[0] = False
    sm.kernel_fn(x, 1.0, mask).backward(torch.ones(2, 50, device=DEVICE))
    assert torch.equal(x.grad[0], torch.zeros(50, device=DEVICE))


@pytest.mark.parametrize("config", [None, LOOPED], ids=["single", "looped"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_constant_upstream_gradient_gives_no_gradient_from_rounded_outputs(dtype, config):
    """softmax's Jacobian sends a constant ``dy`` to 0; the saved ``y``, rounded to ``dtype``, need not sum to 1, and
    ``y * (dy - sum(y * dy))`` left ``c * y * (1 - sum(y))``: about 4e-3 of ``c`` on these peaked bf16 rows, the same
    cancellation that made a [5, 3] bf16 gradient 6x further from float64 than the fp32-computed softmax's on a GPU.
    Dividing by ``sum(y)`` leaves fp32 rounding alone."""
    x = rand((6, 300 if config else 3), dtype, std=3.0, seed=11)
    x[:, 1] = 8.0  # peaked rows: one y near 1
    c = 5.0
    if config is None:
        x_k = x.detach().clone().requires_grad_()
        sm.kernel_fn(x_k).backward(torch.full(x.shape, c, dtype=dtype, device=DEVICE))
        dx = x_k.grad
    else:
        y = sm._softmax_fwd_launch(x, 1.0, None, False, config=config)
        dx = sm._softmax_bwd_launch(y, torch.full(x.shape, c, dtype=dtype, device=DEVICE), 1.0, config=config)
    assert dx.abs().max() <= 1e-5 * c, dx.abs().max()


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's numpy sees inf - inf
@pytest.mark.parametrize("config", [None, LOOPED], ids=["single", "looped"])
def test_nan_and_pos_inf_propagate_like_torch(config):
    x = rand((3, 100))
    x[0, 3] = float("inf")
    x[1, 7] = float("nan")
    y = sm.kernel_fn(x) if config is None else sm._softmax_fwd_launch(x, 1.0, None, False, config=config)
    assert torch.isnan(y[:2]).all() and torch.isnan(torch.softmax(x, -1)[:2]).all()
    assert_close(y[2:], sm.reference_fn(x[2:].double()), torch.float32)


# --- masks and causal ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_shape", [(2, 1, 6, 9), (1, 3, 6, 9), (1, 1, 6, 9), (6, 9), (9,), (2, 3, 6, 1)])
@pytest.mark.parametrize("kind", ["additive", "bool"])
def test_attention_masks_broadcast(mask_shape, kind):
    x = rand((2, 3, 6, 9), torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    if kind == "bool":
        mask = (torch.rand(mask_shape, generator=gen) > 0.3).to(DEVICE)
    else:
        mask = (torch.randn(mask_shape, generator=gen) * 2).to(dtype=torch.bfloat16, device=DEVICE)
    check_forward_backward(x, 0.125, mask)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # (finfo.min - max) * log2e -> -inf, exp2 -> 0
def test_hf_style_finfo_min_mask_and_scale():
    x = rand((1, 4, 8, 8), torch.bfloat16)
    causal = torch.full((8, 8), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16, device=DEVICE).triu(1)
    mask = causal[None, None].clone()
    mask[..., 0, :] = torch.finfo(torch.bfloat16).min  # a padded query row: every key at finfo.min
    check_forward_backward(x, 128 ** -0.5, mask)


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (5, 7), (2, 3, 7, 5), (7,), (2, 2, 2, 4, 6)])
def test_causal(shape):
    check_forward_backward(rand(shape), 0.5, None, True)


def test_causal_is_top_left_tril_on_q_index():
    x = rand((2, 3, 4, 6))
    keep = torch.ones(4, 6, dtype=torch.bool, device=DEVICE).tril()
    assert_close(sm.kernel_fn(x, causal=True), sm.reference_fn(x.double(), mask=keep), torch.float32)
    # causal + mask combine: both apply
    mask = rand((1, 1, 4, 6), seed=9)
    assert_close(sm.kernel_fn(x, 1.0, mask, True),
                 sm.reference_fn(x.double(), 1.0, mask.double().masked_fill(~keep, NEG_INF)), torch.float32)


def test_bool_mask_equals_additive_neg_inf_mask():
    x = rand((5, 40))
    keep = torch.rand(5, 40, generator=torch.Generator().manual_seed(2)).to(DEVICE) > 0.5
    add = torch.zeros(5, 40, device=DEVICE).masked_fill(~keep, NEG_INF)
    assert torch.equal(sm.kernel_fn(x, 1.0, keep), sm.kernel_fn(x, 1.0, add))


def test_additive_mask_gradient():
    x = rand((2, 3, 4, 10)).requires_grad_()
    mask = rand((2, 1, 4, 10), seed=1).requires_grad_()
    dy = rand(x.shape, seed=2)
    sm.kernel_fn(x, 0.3, mask).backward(dy)
    x64 = x.detach().double().requires_grad_()
    m64 = mask.detach().double().requires_grad_()
    sm.reference_fn(x64, 0.3, m64).backward(dy.double())
    assert_close(x.grad, x64.grad, torch.float32, "dx")
    assert_close(mask.grad, m64.grad, torch.float32, "dmask")


# --- layouts, offsets, contract ------------------------------------------------------------------------------


def test_transposed_and_offset_views():
    base = rand((40, 30))
    for x in (base.t(), base[1:], base[:, 3:], base[::2, ::3], base.t()[2:, 1:]):
        assert not x.is_contiguous() or x.storage_offset() > 0
        check_forward_backward(x)
    scores = rand((2, 5, 3, 7)).transpose(1, 2)  # [2, 3, 5, 7] with non-monotone strides
    check_forward_backward(scores, 1.0, rand((2, 3, 5, 7), seed=4)[:, :1], True)


def test_expanded_upstream_gradient():
    x = rand((3, 50)).requires_grad_()
    sm.kernel_fn(x).sum().backward()  # dy = ones expanded with stride 0
    assert torch.allclose(x.grad, torch.zeros_like(x.grad), atol=1e-6)  # rows sum to 1 -> zero gradient
    x.grad = None
    (sm.kernel_fn(x) * torch.arange(50.0, device=DEVICE)).sum().backward()  # dy broadcast over rows
    x64 = x.detach().double().requires_grad_()
    (sm.reference_fn(x64) * torch.arange(50.0, dtype=torch.float64, device=DEVICE)).sum().backward()
    assert_close(x.grad, x64.grad, torch.float32, "dx")


def test_launch_plans_keyed_by_geometry():
    """Direct eager calls reuse a launch plan per geometry (host time): one shape seen with other strides, masks of
    another broadcast, kind or dtype, causal on and off, and upstream gradients of other strides each get their own
    plan and a correct result, called back to back; a rank-5 input whose 4-D view is a copy never takes a plan."""
    sm._FWD_PLANS.clear()
    sm._BWD_PLANS.clear()
    base = rand((12, 12))
    row_mask, col_mask = rand((1, 12), seed=3), rand((12, 1), seed=4)
    keep = rand((12, 12), seed=5) > -2.0
    calls = [(base, None, False), (base.t(), None, False), (base, None, True), (base, row_mask, False),
             (base, col_mask, False), (base, keep, False), (base, row_mask.to(torch.float16), False),
             (base.t(), row_mask, True)]
    for _ in range(2):  # the second pass runs on the plans the first one made
        for x, mask, causal in calls:
            check_forward_backward(x, 0.5, mask, causal)
    assert len(sm._FWD_PLANS) == len(calls)
    x = rand((12, 12)).requires_grad_()
    for dy in (rand((12, 12), seed=6), rand((12, 24), seed=6)[:, ::2], rand((1, 12), seed=6).expand(12, 12)):
        x.grad = None
        sm.kernel_fn(x).backward(dy)
        x64 = x.detach().double().requires_grad_()
        sm.reference_fn(x64).backward(dy.double())
        assert_close(x.grad, x64.grad, torch.float32, "dx")
    assert len(sm._BWD_PLANS) >= 3
    five = rand((2, 3, 4, 5, 6)).permute(1, 0, 2, 3, 4)  # leading axes not mergeable: the 4-D view is a copy
    before = len(sm._FWD_PLANS)
    check_forward_backward(five, 1.0, rand((3, 1, 4, 5, 6), seed=7), False)
    assert len(sm._FWD_PLANS) == before


@pytest.mark.parametrize("shape", [(2, 2, 0, 4, 5), (2, 2, 3, 4, 0)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_empty_rank5_forward_and_backward(shape, with_mask):
    """An empty input of rank > 4 whose zero is in its last three axes cannot be seen as 4-D (reshape(-1, ...) of
    0 elements is ambiguous): it gives an empty output, as the rank <= 4 ones do (a review found it raising)."""
    x = torch.empty(shape, device=DEVICE, requires_grad=True)
    y = sm.kernel_fn(x, 1.0, torch.zeros(shape[-2:], device=DEVICE) if with_mask else None, True)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert sm.softmax_backward_op(y.detach(), torch.empty(shape, device=DEVICE), 1.0).shape == x.shape


@pytest.mark.parametrize("mask", [0.5, 0, [[0.0] * 4] * 3])
def test_non_tensor_mask_is_a_type_error(mask):
    with pytest.raises(TypeError, match="mask must be a torch.Tensor or None"):
        sm.kernel_fn(rand((3, 4)), 1.0, mask)


def test_launch_plans_bounded_and_errors_not_kept():
    sm._FWD_PLANS.clear()
    with pytest.raises(ValueError, match="does not broadcast"):
        sm.kernel_fn(rand((4, 8)), 1.0, rand((3, 8)))
    assert not sm._FWD_PLANS  # a failed check keeps no plan: the same call raises again
    with pytest.raises(ValueError, match="does not broadcast"):
        sm.kernel_fn(rand((4, 8)), 1.0, rand((3, 8)))
    for width in range(1, sm.MAX_PLANS + 2):
        sm.kernel_fn(rand((1, width)))
    assert 0 < len(sm._FWD_PLANS) <= sm.MAX_PLANS


def test_inputs_not_modified():
    x = rand((3, 4, 5, 33)).requires_grad_()
    mask = rand((3, 1, 5, 33), seed=8)
    x0, mask0 = x.detach().clone(), mask.clone()
    y = sm.kernel_fn(x, 0.5, mask, True)
    dy = rand(y.shape, seed=9)
    dy0 = dy.clone()
    y.backward(dy)
    assert torch.equal(x.detach(), x0) and torch.equal(mask, mask0) and torch.equal(dy, dy0)


def test_int64_column_offsets():
    assert not sm.needs_int64_cols(32000, 1)
    assert sm.needs_int64_cols(2**31 + 1, 1)
    assert sm.needs_int64_cols(70000, 40000)  # a transposed [40000, 70000] view: 69999 * 40000 > 2**31
    assert not sm.needs_int64_cols(1, 2**40)
    x = rand((30, 20)).t()
    for cfg in (None, LOOPED):
        y = sm._softmax_fwd_launch(x, 1.0, rand((20, 30), seed=1), True, config=cfg, force_int64_cols=True)
        assert_close(y, sm.reference_fn(x.double(), 1.0, rand((20, 30), seed=1).double(), True), torch.float32)
        dy = rand((20, 30), seed=2)
        dx = sm._softmax_bwd_launch(y, dy, 1.0, config=cfg, force_int64_cols=True)
        assert_close(dx, sm._softmax_bwd_launch(y, dy, 1.0, config=cfg), torch.float32, "dx")


@pytest.mark.parametrize("shape", [(0, 10), (4, 0), (2, 0, 3, 5)])
def test_empty(shape):
    x = torch.empty(shape, device=DEVICE, requires_grad=True)
    y = sm.kernel_fn(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_errors():
    with pytest.raises(TypeError, match="x must be"):
        sm.kernel_fn(torch.ones(3, 4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="at least one dimension"):
        sm.kernel_fn(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="does not broadcast"):
        sm.kernel_fn(torch.ones(3, 4, device=DEVICE), 1.0, torch.ones(2, 3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="does not broadcast"):
        sm.kernel_fn(torch.ones(3, 4, device=DEVICE), 1.0, torch.ones(5, device=DEVICE))
    with pytest.raises(TypeError, match="mask must be"):
        sm.kernel_fn(torch.ones(3, 4, device=DEVICE), 1.0, torch.ones(3, 4, dtype=torch.int32, device=DEVICE))


# the H200 sweep's choices (see softmax.py's constants): rows wider than 4096 loop in 4096-wide chunks, 16 warps
@pytest.mark.parametrize("width, config", [(32000, (4096, 16, False)), (128256, (4096, 16, False)),
                                           (4097, (4096, 16, False)), (4096, (4096, 8, True)), (17, (32, 1, True))])
def test_config_heuristic(width, config):
    assert sm.SoftmaxConfig.for_row(width) == sm.SoftmaxConfig(*config)


def test_backward_config_heuristic():
    # the backward's own single-block limit (not swept)
    assert sm.SoftmaxConfig.for_row(16384, sm.MAX_SINGLE_BLOCK_BWD) == sm.SoftmaxConfig(16384, 32, True)
    assert not sm.SoftmaxConfig.for_row(32000, sm.MAX_SINGLE_BLOCK_BWD).single_block


def test_contract_and_registry():
    args = sm.get_inputs()
    assert args[0].device.type == DEVICE.type and args[0].requires_grad and args[0].numel() < 1e5 or _device.on_gpu()
    assert_close(sm.kernel_fn(*args), sm.reference_fn(args[0].detach().double(), *args[1:]), args[0].dtype)
    x, scale, mask, causal = sm.make_inputs(shape=(2, 3, 4, 16), mask="additive", scale=0.5)
    assert mask.shape == (2, 1, 4, 16) and scale == 0.5
    assert sm.bytes_moved(x, scale, mask) == 2 * x.numel() * 4 + mask.numel() * 4
    assert sm.bytes_moved_backward(x) == 3 * x.numel() * 4
    plain, masked = get_kernel("softmax"), get_kernel("masked_softmax")
    assert plain.replaces == "softmax" and masked.replaces == "masked_softmax" and plain.module == masked.module
    xb = rand((4, 64), torch.bfloat16)
    assert_close(plain.replacement(xb), plain.pattern(xb.double()), torch.bfloat16)
    mb = rand((4, 64), torch.bfloat16, seed=1)
    assert_close(masked.replacement(xb, mb, 0.5), masked.pattern(xb.double(), mb.double(), 0.5), torch.bfloat16)


# --- GPU only ------------------------------------------------------------------------------------------------


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("n_cols", [1000, 32000, 65537])
def test_torch_compile_fullgraph(n_cols):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = rand((16, n_cols), torch.bfloat16).requires_grad_()
    mask = rand((1, n_cols), torch.bfloat16, seed=1)
    fn = torch.compile(sm.kernel_fn, fullgraph=True)
    y = fn(x, 0.5, mask, False)
    dy = rand(y.shape, torch.bfloat16, seed=2)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    ref = sm.reference_fn(x64, 0.5, mask.double())
    ref.backward(dy.double())
    assert_close(y, ref, torch.bfloat16)
    assert_close(x.grad, x64.grad, torch.bfloat16, "dx")


@pytest.mark.gpu
def test_gpu_llama_attention_shape():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, scale, mask, causal = sm.make_inputs(shape=(1, 32, 512, 512), dtype="bfloat16", mask="additive", scale=0.088)
    check_forward_backward(x, scale, mask, causal)
    check_forward_backward(x, scale, None, True)
