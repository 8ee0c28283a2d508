"""Tests of kernel_library/rmsnorm.py against the Hugging Face formula evaluated in float64.

Grid choice: few rows (the interpreter runs each program in Python); widths 17, 1000, 1536 and 4097 cover
ragged masks, a non-power-of-two multiple of 512 and one column past a power of two; a single row, a 3-D input
and the looped (chunked) kernels at small widths through a forced small-block config. Llama (offset 0) and
Gemma (offset 1) semantics are both checked in every dtype, forward and backward.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library import _rows as rows
from kernel_library import rmsnorm as rms
from kernel_library.registry import get_kernel
from kernel_asserts import DEVICE, DTYPES, assert_close, assert_row_sum_grad_close

OFFSETS = (0.0, 1.0)
#: (shape of x) single row, ragged widths, one past a power of two, a 3-D [batch, seq, hidden] input
SHAPES = ((1, 17), (3, 1000), (2, 1536), (2, 4097), (2, 3, 64))
EPS = 1e-6
#: rows for the looped-kernel tests: more than the backward grid has programs, so that some programs accumulate
#: several rows into their dweight partial sums
LOOP_ROWS = rms.bwd_programs(10**6, DEVICE) + 3


def make(shape, dtype, offset=0.0, seed=0):
    """x of ``shape`` and weight [shape[-1]] in ``dtype`` (leaves with requires_grad)."""
    n_cols = shape[-1]
    n_rows = 1
    for d in shape[:-1]:
        n_rows *= d
    x, w, _, _ = rms.make_inputs(n_rows, n_cols, dtype, offset=offset, requires_grad=False, device=DEVICE, seed=seed)
    return x.view(shape).requires_grad_(), w.requires_grad_()


def f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_()


def eager_dweight(x: torch.Tensor, w: torch.Tensor, offset: float, dy: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch's dweight in the inputs' own dtypes: autograd of reference_fn on copies of x and w."""
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    return torch.autograd.grad(rms.reference_fn(xe, we, EPS, offset), we, dy)[0]


def check_fwd_bwd(x, w, offset, dtype, seed=1):
    """Kernel output and (dx, dw) against autograd of reference_fn in float64 on the same input values."""
    y = rms.kernel_fn(x, w, EPS, offset)
    x64, w64 = f64(x), f64(w)
    y64 = rms.reference_fn(x64, w64, EPS, offset)
    assert y.dtype == rms.rms_out_dtype(x.dtype, w.dtype, offset)
    assert_close(y, y64, dtype, "y")
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    dy = torch.randn(y.shape, generator=gen, device=DEVICE).to(y.dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    assert dx.dtype == x.dtype and dw.dtype == w.dtype
    assert_close(dx, dx64, dtype, "dx")
    assert_row_sum_grad_close(dw, dw64, dtype, "dweight", lambda: eager_dweight(x, w, offset, dy))


# --- forward and backward over dtypes, widths, semantics -----------------------------------------------------


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_reference(dtype, shape, offset):
    x, w = make(shape, dtype, offset)
    check_fwd_bwd(x, w, offset, dtype)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", (17, 300))
def test_looped_kernels(dtype, n_cols, offset):
    """Rows wider than the fused limit: forced 16/64-wide chunks run the two-pass kernels on small rows."""
    x, w = make((LOOP_ROWS, n_cols), dtype, offset)
    x, w = x.detach(), w.detach()
    cfg = rms.RowConfig.forward(n_cols, max_fused_block=16 if n_cols < 64 else 64)
    assert cfg.looped and cfg.block_size < n_cols
    y, s = rms.rms_norm_fwd_launch(x, w, EPS, offset, config=cfg)
    assert s is None
    x64, w64 = f64(x), f64(w)
    y64 = rms.reference_fn(x64, w64, EPS, offset)
    assert_close(y, y64, dtype, "y (looped)")
    dy = torch.randn(y.shape, generator=torch.Generator(device=DEVICE).manual_seed(3), device=DEVICE).to(y.dtype)
    dx, dw = rms.rms_norm_bwd_launch(dy, x, w, EPS, offset, config=cfg)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    assert_close(dx, dx64, dtype, "dx (looped)")
    assert_row_sum_grad_close(dw, dw64, dtype, "dweight (looped)", lambda: eager_dweight(x, w, offset, dy))


@pytest.mark.parametrize("offset", OFFSETS)
def test_looped_kernels_strided(offset):
    """The looped kernels honour every stride: transposed x and dy, strided weight."""
    n_cols = 45
    x = make((n_cols, LOOP_ROWS), torch.float32, offset)[0].detach().t()
    w = make((1, 2 * n_cols), torch.float32, offset)[1].detach()[::2]
    cfg = rms.RowConfig.forward(n_cols, max_fused_block=16)
    y, _ = rms.rms_norm_fwd_launch(x, w, EPS, offset, config=cfg)
    x64, w64 = f64(x), f64(w)
    y64 = rms.reference_fn(x64, w64, EPS, offset)
    assert_close(y, y64, torch.float32, "y (looped, strided)")
    dy = torch.randn((n_cols, LOOP_ROWS), device=DEVICE).t()
    dx, dw = rms.rms_norm_bwd_launch(dy, x, w, EPS, offset, config=cfg)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    assert_close(dx, dx64, torch.float32, "dx (looped, strided)")
    assert_close(dw, dw64, torch.float32, "dweight (looped, strided)")


def test_more_rows_than_backward_programs():
    """Each backward program loops over several rows and the per-program partial sums are reduced."""
    n_rows = rms.bwd_programs(10**6, torch.device(DEVICE)) * 2 + 3
    x, w = make((n_rows, 40), torch.float32)
    check_fwd_bwd(x, w, 0.0, torch.float32)


# --- backward with several rows per loop step (RowConfig.rows_per_iter) ------------------------------------
# Rows 1 and 3 leave the last [rows_per_iter, BLOCK_SIZE] block partly masked (rows past n_rows); 17 rows at
# programs_per_sm=1 (4 programs on the CPU grid) give 9 or 5 row blocks, so programs loop over several blocks and
# their last one is partial too. Widths: ragged 17, 1000, and 4097 (an 8192-wide fused block, half masked).


def bwd_with(dy, x, w, offset, ds=None, **fields):
    """``rms_norm_bwd_launch`` with the default backward RowConfig of x's width, ``fields`` replaced."""
    cfg = dataclasses.replace(rms.RowConfig.backward(x.shape[-1]), **fields)
    return rms.rms_norm_bwd_launch(dy, x, w, EPS, offset, ds=ds, config=cfg)


def check_rows_per_iter(x, w, offset, dtype, rows_per_iter, residual=False, **fields):
    """(dx, dw) at ``rows_per_iter`` against float64 autograd of reference_fn and against one row per step."""
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    x64, w64 = f64(x), f64(w)
    y64 = rms.reference_fn(x64, w64, EPS, offset)
    dy = torch.randn(y64.shape, generator=gen, device=DEVICE).to(rms.rms_out_dtype(x.dtype, w.dtype, offset))
    ds = torch.randn(x.shape, generator=gen, device=DEVICE).to(x.dtype) if residual else None
    dx, dw = bwd_with(dy, x, w, offset, ds, rows_per_iter=rows_per_iter, **fields)
    dx1, dw1 = bwd_with(dy, x, w, offset, ds, rows_per_iter=1, **fields)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    if residual:
        dx64 = dx64 + ds.double()
    what = f"rows_per_iter={rows_per_iter}"
    assert dx.dtype == x.dtype and dw.dtype == w.dtype
    assert_close(dx, dx64, dtype, f"dx ({what})")
    assert_row_sum_grad_close(dw, dw64, dtype, f"dweight ({what})", lambda: eager_dweight(x, w, offset, dy))
    # same per-row arithmetic as one row per step; only dweight's fp32 summation order may differ
    assert_close(dx, dx1, dtype, f"dx ({what} vs 1)")
    assert_close(dw, dw1, dtype, f"dweight ({what} vs 1)")


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("n_cols", (17, 1000))
@pytest.mark.parametrize("n_rows", (1, 3, 17))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("rows_per_iter", (2, 4))
def test_backward_rows_per_iter(rows_per_iter, dtype, n_rows, n_cols, offset):
    x, w = make((n_rows, n_cols), dtype, offset)
    check_rows_per_iter(x.detach(), w.detach(), offset, dtype, rows_per_iter, programs_per_sm=1)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("rows_per_iter", (2, 4))
def test_backward_rows_per_iter_wide_row_and_stages(rows_per_iter, dtype):
    """4097 columns (fused 8192-wide block), default grid, with a num_stages hint on the row loop."""
    x, w = make((5, 4097), dtype, 1.0)
    check_rows_per_iter(x.detach(), w.detach(), 1.0, dtype, rows_per_iter, num_stages=2)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("rows_per_iter", (2, 4))
@pytest.mark.parametrize("n_rows", (3, 17))
def test_backward_rows_per_iter_residual(n_rows, rows_per_iter, dtype):
    """HAS_RESIDUAL (add_rmsnorm's backward): the new residual's gradient is added to dx on every row."""
    x, w = make((n_rows, 300), dtype)
    check_rows_per_iter(x.detach(), w.detach(), 0.0, dtype, rows_per_iter, residual=True, programs_per_sm=1)


@pytest.mark.parametrize("rows_per_iter", (2, 4))
def test_backward_rows_per_iter_strided(rows_per_iter):
    """Transposed x and dy (column stride != 1) and a strided weight, several row blocks per program."""
    n_cols, n_rows = 45, 19
    x = make((n_cols, n_rows), torch.float32)[0].detach().t()
    w = make((1, 2 * n_cols), torch.float32)[1].detach()[::2]
    x64, w64 = f64(x), f64(w)
    y64 = rms.reference_fn(x64, w64, EPS, 0.0)
    dy = torch.randn((n_cols, n_rows), device=DEVICE).t()
    dx, dw = bwd_with(dy, x, w, 0.0, rows_per_iter=rows_per_iter, programs_per_sm=1)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    assert_close(dx, dx64, torch.float32, "dx (rows_per_iter, strided)")
    assert_close(dw, dw64, torch.float32, "dweight (rows_per_iter, strided)")


@pytest.mark.parametrize("rows_per_iter", (2, 4))
def test_backward_rows_per_iter_keeps_hf_rounding(rows_per_iter):
    """bf16 x with an fp32 weight: dweight comes out in fp32, so the HF Llama rounding of x_hat to bf16 in the
    dweight term (a ~2**-9 relative change per term) shows at the fp32 tolerance against one row per step."""
    x = make((17, 300), torch.bfloat16)[0].detach()
    w = make((1, 300), torch.float32)[1].detach()
    dy = torch.randn(x.shape, generator=torch.Generator(device=DEVICE).manual_seed(2), device=DEVICE)
    dx, dw = bwd_with(dy, x, w, 0.0, rows_per_iter=rows_per_iter, programs_per_sm=1)
    dx1, dw1 = bwd_with(dy, x, w, 0.0, rows_per_iter=1, programs_per_sm=1)
    assert dw.dtype == torch.float32
    assert torch.equal(dx, dx1)
    assert_close(dw, dw1, torch.float32, f"dweight (rows_per_iter={rows_per_iter} vs 1, bf16 x, fp32 weight)")


def test_looped_backward_ignores_rows_per_iter():
    """The looped (wide-row) backward stays one row per step: the same result whatever rows_per_iter says."""
    x, w = make((LOOP_ROWS, 40), torch.bfloat16)
    x, w = x.detach(), w.detach()
    dy = torch.randn(x.shape, device=DEVICE).to(x.dtype)
    looped = rms.RowConfig.backward(40, max_fused_block=16)
    assert looped.looped
    dx1, dw1 = rms.rms_norm_bwd_launch(dy, x, w, EPS, 0.0, config=looped)
    dx4, dw4 = rms.rms_norm_bwd_launch(dy, x, w, EPS, 0.0, config=dataclasses.replace(looped, rows_per_iter=4))
    assert torch.equal(dx1, dx4) and torch.equal(dw1, dw4)


def test_backward_config_fields():
    """Defaults keep today's backward (one row per step, no num_stages hint, BWD_PROGRAMS_PER_SM); bad values
    are refused; the grid never has more programs than row blocks."""
    for n_cols in (17, 4096, rows.MAX_FUSED_BLOCK_BWD + 1):
        cfg = rms.RowConfig.backward(n_cols)
        assert (cfg.rows_per_iter, cfg.num_stages, cfg.programs_per_sm) == (1, None, None)
    for bad in ({"rows_per_iter": 3}, {"rows_per_iter": 0}, {"num_stages": 0}, {"programs_per_sm": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            rms.RowConfig(block_size=32, num_warps=4, looped=False, **bad)
    cpu = torch.device("cpu")
    assert rms.bwd_programs(17, cpu, rows_per_iter=4) == 5
    assert rms.bwd_programs(10**6, cpu, rows_per_iter=4) == rows.CPU_SM_COUNT * rows.BWD_PROGRAMS_PER_SM
    assert rms.bwd_programs(10**6, cpu, programs_per_sm=1) == rows.CPU_SM_COUNT


# --- launch heuristics ---------------------------------------------------------------------------------------


def test_row_config_heuristic():
    llama = rms.RowConfig.forward(4096)
    assert (llama.block_size, llama.num_warps, llama.looped) == (4096, 8, False)
    assert rms.RowConfig.forward(4097).block_size == 8192
    assert rms.RowConfig.forward(17) == rms.RowConfig(block_size=32, num_warps=4, looped=False)
    assert rms.RowConfig.forward(rows.MAX_FUSED_BLOCK_FWD).looped is False
    wide = rms.RowConfig.forward(rows.MAX_FUSED_BLOCK_FWD + 1)
    assert wide.looped and wide.block_size == rows.LOOP_BLOCK
    assert rms.RowConfig.backward(rows.MAX_FUSED_BLOCK_BWD).looped is False
    assert rms.RowConfig.backward(rows.MAX_FUSED_BLOCK_BWD + 1).looped
    # warps never decrease with the block, and are powers of two within [4, 32]
    for table_cfg in (rms.RowConfig.forward, rms.RowConfig.backward):
        warps = [table_cfg(2**k, max_fused_block=2**20).num_warps for k in range(4, 20)]
        assert warps == sorted(warps) and all(w in (4, 8, 16, 32) for w in warps)
    assert rms.bwd_programs(1, torch.device("cpu")) == 1
    assert rms.bwd_programs(10**6, torch.device("cpu")) == rows.CPU_SM_COUNT * rows.BWD_PROGRAMS_PER_SM


# --- layouts -------------------------------------------------------------------------------------------------


STRIDED_CASES = ("row offset x[1:]", "column slice x[:, 3:]", "transposed x.t()", "strided weight w[::2]",
                 "3-D permuted (leading dims do not collapse: reshape copies)")


def _strided_case(case: str, dtype: torch.dtype):
    base, w = make((6, 70), dtype)
    base, w = base.detach(), w.detach()
    if case == "row offset x[1:]":
        return base[1:], w
    if case == "column slice x[:, 3:]":
        return base[:, 3:], make((1, 67), dtype)[1].detach()
    if case == "transposed x.t()":
        return make((70, 5), dtype)[0].detach().t(), w
    if case == "strided weight w[::2]":
        return base, make((1, 140), dtype)[1].detach()[::2]
    return base.view(2, 3, 70).transpose(0, 1), w


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("case", STRIDED_CASES)
def test_strided_inputs(dtype, case):
    x, w = _strided_case(case, dtype)
    check_fwd_bwd(x.requires_grad_(), w.requires_grad_(), 0.0, dtype)


def test_expanded_output_gradient():
    """``y.sum().backward()`` hands the backward a stride-0 (expanded) dy."""
    x, w = make((4, 33), torch.float32)
    rms.kernel_fn(x, w).sum().backward()
    x64, w64 = f64(x), f64(w)
    rms.reference_fn(x64, w64).sum().backward()
    assert_close(x.grad, x64.grad, torch.float32, "dx")
    assert_close(w.grad, w64.grad, torch.float32, "dweight")


# --- hard values ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitudes(dtype):
    """|x| ~ 1e4: x**2 summed over the row reaches 1e11 (fp32 accumulation needed; fp16 x**2 would overflow)."""
    x, w = make((3, 257), dtype)
    x = (x.detach().float() * 1e4).to(dtype).requires_grad_()
    check_fwd_bwd(x, w, 0.0, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_row_uses_eps(dtype):
    """An all-zero row: mean(x**2) = 0, rstd = 1/sqrt(eps) stays finite; y = 0 and dx = rstd * dy * w."""
    x, w = make((3, 100), dtype)
    x = x.detach().clone()
    x[1] = 0
    check_fwd_bwd(x.requires_grad_(), w, 0.0, dtype)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf, 0 * inf
def test_inf_input_propagates_like_reference():
    """An inf in a row: HF gives rstd = 0, so finite entries become 0 and the inf entry NaN. The kernel must give
    the same, not silently finite values (NaN positions compared explicitly; NaN never counts as a match)."""
    x, w = make((2, 50), torch.float32)
    x = x.detach().clone()
    x[0, 7] = float("inf")
    y = rms.kernel_fn(x, w.detach())
    ref = rms.reference_fn(x.double(), w.detach().double())
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.isnan(y[0, 7])
    finite = ~torch.isnan(ref)
    assert_close(y[finite], ref[finite], torch.float32, "y (finite entries)")


# --- semantics: transformers modules, dtypes, errors ----------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_transformers_llama_and_gemma(dtype):
    """reference_fn reproduces LlamaRMSNorm (offset 0) and GemmaRMSNorm (offset 1) bit for bit."""
    llama_mod = pytest.importorskip("transformers.models.llama.modeling_llama")
    gemma_mod = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    x, w = make((4, 96), dtype)
    x, w = x.detach(), w.detach()
    llama = llama_mod.LlamaRMSNorm(96, eps=EPS).to(device=DEVICE, dtype=dtype)
    gemma = gemma_mod.GemmaRMSNorm(96, eps=EPS).to(device=DEVICE, dtype=dtype)
    with torch.no_grad():
        llama.weight.copy_(w)
        gemma.weight.copy_(w - 1)
        assert torch.equal(rms.reference_fn(x, w, EPS), llama(x))
        assert torch.equal(rms.reference_fn(x, w - 1, EPS, 1.0), gemma(x))
        # and the kernel agrees with the transformers module within the dtype's tolerance
        assert_close(rms.kernel_fn(x, w, EPS), llama(x), dtype, "kernel vs LlamaRMSNorm")
        assert_close(rms.kernel_fn(x, w - 1, EPS, 1.0), gemma(x), dtype, "kernel vs GemmaRMSNorm")


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_rounding_matches_transformers(dtype, offset):
    """Beyond tolerance: the kernel rounds where HF rounds (Llama: the normalised row to x.dtype before the weight
    multiply; Gemma: once at the end), so nearly every element is bit-identical to reference_fn. An fp32-only
    Llama path (no cast before the multiply) agrees on only ~75% of the elements."""
    if dtype == torch.bfloat16 and _device.interpreted():
        pytest.skip("the Triton interpreter truncates fp32->bf16 casts; the GPU rounds to nearest even")
    x, w = make((64, 1000), dtype, offset)
    with torch.no_grad():
        same = rms.kernel_fn(x, w, EPS, offset) == rms.reference_fn(x, w, EPS, offset)
    assert same.float().mean().item() >= 0.99, f"only {same.float().mean().item():.3f} of elements bit-identical"


@pytest.mark.parametrize("offset", OFFSETS)
def test_mixed_dtypes_follow_hf_promotion(offset):
    """bf16 activations with an fp32 weight (AMP master weights): Llama returns fp32 (promotion), Gemma bf16."""
    x, _ = make((3, 130), torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(130, device=DEVICE)).requires_grad_()
    y = rms.kernel_fn(x, w, EPS, offset)
    ref = rms.reference_fn(x.detach(), w.detach(), EPS, offset)
    assert y.dtype == ref.dtype == (torch.float32 if offset == 0.0 else torch.bfloat16)
    # the HF semantics round to bf16 inside, so bf16 is the precision to expect
    assert_close(y, ref, torch.bfloat16, "y (bf16 x, fp32 weight)")
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = f64(x), f64(w)
    dx64, dw64 = torch.autograd.grad(rms.reference_fn(x64, w64, EPS, offset), (x64, w64), dy.double())
    assert dx.dtype == torch.bfloat16 and dw.dtype == torch.float32
    assert_close(dx, dx64, torch.bfloat16, "dx")
    assert_close(dw, dw64, torch.bfloat16, "dweight")


def test_empty_input():
    x = torch.empty((0, 64), device=DEVICE, requires_grad=True)
    w = torch.ones(64, device=DEVICE, requires_grad=True)
    y = rms.kernel_fn(x, w)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert x.grad.shape == (0, 64) and torch.equal(w.grad, torch.zeros(64, device=DEVICE))


def test_inputs_not_modified():
    x, w = make((4, 100), torch.bfloat16)
    x0, w0 = x.detach().clone(), w.detach().clone()
    y = rms.kernel_fn(x, w)
    dy = torch.randn_like(y)
    dy0 = dy.clone()
    torch.autograd.grad(y, (x, w), dy)
    assert torch.equal(x, x0) and torch.equal(w, w0) and torch.equal(dy, dy0)


def test_errors_name_the_argument():
    x, w = make((2, 8), torch.float32)
    with pytest.raises(ValueError, match="weight"):
        rms.kernel_fn(x, w[:4])
    with pytest.raises(TypeError, match="^x has dtype"):
        rms.kernel_fn(x.detach().to(torch.float64), w)
    with pytest.raises(TypeError, match="^weight has dtype"):
        rms.kernel_fn(x, w.detach().to(torch.int32))
    with pytest.raises(ValueError, match="0-d"):
        rms.kernel_fn(torch.tensor(1.0, device=DEVICE), w)


# --- int64 offsets -------------------------------------------------------------------------------------------


@triton.jit
def _offset_probe_kernel(out_ptr, row_ptr, stride, SAFE: tl.constexpr):
    """Evaluates rmsnorm.row_start(row, stride) with ``row`` an int32 runtime value, as program ids are."""
    row = tl.load(row_ptr)  # int32
    if SAFE:
        off = rms.row_start(row, stride)
    else:
        off = (row * stride).to(tl.int64)  # what the kernels would compute without the int64 cast
    tl.store(out_ptr, off)


def _offset_probe(row: int, stride: int, safe: bool) -> int:
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    _offset_probe_kernel[(1,)](out, torch.tensor([row], dtype=torch.int32, device=DEVICE), stride, SAFE=safe)
    return int(out.item())


def test_row_offsets_are_int64():
    """Row 600000 of a 4096-wide tensor starts at element 2.46e9 > 2**31: exact with row_start, wrapped without."""
    row, stride = 600_000, 4096
    assert _offset_probe(row, stride, True) == row * stride
    if _device.interpreted():  # int32 overflow wraps in numpy; on the GPU it is undefined behaviour in LLVM
        assert _offset_probe(row, stride, False) != row * stride  # the probe can tell


def test_wide_transposed_views_are_copied():
    """Column offsets stay int32 in the kernels: as_rows copies a view whose column span reaches 2**31."""
    big_stride = torch.empty_strided((2, 3), (1, 2**30), device="meta")
    assert rms.as_rows(big_stride, 3).is_contiguous()
    small = torch.arange(6.0).view(3, 2).t()
    assert rms.as_rows(small, 3).data_ptr() == small.data_ptr()


# --- contract and registry -----------------------------------------------------------------------------------


def test_contract_and_registry():
    args = rms.get_inputs()
    x, w = args[0], args[1]
    if not _device.on_gpu():
        assert x.numel() < 1e5
    assert x.requires_grad and w.requires_grad and x.device.type == DEVICE.type
    assert_close(rms.kernel_fn(*args), rms.reference_fn(*args), x.dtype, "kernel_fn(*get_inputs())")
    assert rms.bytes_moved(*args) == x.numel() * 2 * 2 + w.numel() * 2  # bf16: read x, write y, read w
    assert rms.bytes_moved_backward(*args) == x.numel() * 3 * 2 + 2 * w.numel() * 2
    entry = get_kernel("rmsnorm")
    assert entry.replaces == "rmsnorm" and entry.has_backward and entry.module == rms.__name__
    assert hasattr(torch.ops.fusion_advisor, "rms_norm") and hasattr(torch.ops.fusion_advisor, "rms_norm_backward")
    with torch.no_grad():
        assert torch.equal(entry.pattern(x, w, 1e-5), rms.reference_fn(x, w, 1e-5))
        assert_close(entry.replacement(x, w, 1e-5), entry.pattern(x, w, 1e-5), x.dtype, "replacement")
    for shape in rms.BENCH_SHAPES:
        assert set(shape) <= {"n_rows", "n_cols", "dtype"}


# --- torch.compile (GPU only) --------------------------------------------------------------------------------


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("offset", OFFSETS)
def test_compiled_matches_eager(offset):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, w, eps, _ = rms.make_inputs(256, 4096, torch.bfloat16, offset=offset, device="cuda")
    dy = torch.randn(x.shape, device="cuda").to(rms.rms_out_dtype(x.dtype, w.dtype, offset))

    def fwd_bwd(fn):
        xl, wl = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = fn(xl, wl)
        y.backward(dy)
        return y, xl.grad, wl.grad

    y_e, dx_e, dw_e = fwd_bwd(lambda a, b: rms.kernel_fn(a, b, eps, offset))
    y_c, dx_c, dw_c = fwd_bwd(torch.compile(lambda a, b: rms.kernel_fn(a, b, eps, offset), fullgraph=True))
    # the same Triton kernels run in both: y and dx are bit-identical; Inductor may reorder the final dweight sum
    assert torch.equal(y_c, y_e) and torch.equal(dx_c, dx_e)
    assert_close(dw_c, dw_e, torch.bfloat16, "dweight compiled vs eager")


def test_default_backward_pipelines_the_row_loop_of_the_plain_norm_only():
    # the H200 sweep's choice (see BWD_NUM_STAGES): the fused backward's row loop gets num_stages; the residual
    # variant (unmeasured) and the looped kernel for wide rows do not
    assert rms.default_bwd_config(4096).num_stages == rms.BWD_NUM_STAGES
    assert rms.default_bwd_config(4096, residual=True).num_stages is None
    assert rms.default_bwd_config(65536).looped and rms.default_bwd_config(65536).num_stages is None


@pytest.mark.parametrize("n_parts,n_cols", [(1, 1), (3, 17), (65, 33), (264, 4097)])
@pytest.mark.parametrize("two", [False, True])
def test_sum_partials_matches_a_float64_column_sum(n_parts, n_cols, two):
    gen = torch.Generator().manual_seed(n_parts + n_cols)
    a = (torch.randn(n_parts, n_cols, generator=gen) * 1e3).to(DEVICE)
    b = torch.randn(n_parts, n_cols, generator=gen).to(DEVICE)
    parts = [(a, torch.bfloat16)] + ([(b, torch.float32)] if two else [])
    outs = rms.sum_partials(parts)
    assert len(outs) == len(parts)
    for (p, dtype), out in zip(parts, outs):
        assert out.dtype == dtype and out.shape == (n_cols,)
        assert_close(out, p.double().sum(0), dtype, f"sum_partials {dtype}")


def test_sum_partials_refuses_mismatched_buffers():
    a = torch.zeros(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="one shape"):
        rms.sum_partials([(a, torch.float32), (torch.zeros(4, 9, device=DEVICE), torch.float32)])
    with pytest.raises(ValueError, match="one or two"):
        rms.sum_partials([])
