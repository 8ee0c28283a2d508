"""LayerNorm over the last dim (``torch.nn.functional.layer_norm``), optionally fused with a residual add.

Formula (Ba, Kiros & Hinton 2016, "Layer Normalization"; torch's ``F.layer_norm``), computed in fp32:

    s = (residual + x).to(x.dtype)                  # only with a residual: the new residual, also returned
    mean = mean(s);  var = mean((s - mean)**2)      # biased variance, as torch
    y = ((s - mean) * rsqrt(var + eps) * weight + bias).to(x.dtype)

weight and bias are optional (``None`` as in ``F.layer_norm``) and may be fp32 for fp16/bf16 inputs (torch's
mixed-dtype layer_norm); the output has x's dtype.

Backward (mean and rstd are recomputed from the saved input; the row is in registers anyway):

    x_hat = (x - mean) * rstd;  g = dy * weight
    dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))   (+ d(new residual) with a residual)
    dweight = sum_rows dy * x_hat;  dbias = sum_rows dy

dweight and dbias are accumulated per program in fp32 partial sums ``[n_programs, n_cols]`` and reduced together
by one small kernel (``_rows.sum_partials``; Triton tutorial 05-layer-norm, Liger-Kernel ``layer_norm``). Rows
wider than a register block take looped kernels that compute the statistics with a chunked Welford/Chan merge
(exact as a two-pass variance).

Launch heuristics and helpers are shared with :mod:`kernel_library.rmsnorm` through :mod:`kernel_library._rows`
(``RowConfig``, ``row_start``...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernel_library._device import default_device, on_gpu
from kernel_library._op import launcher, library_op
from kernel_library.registry import KernelEntry, register_kernel
from kernel_library._checks import check_tensor
from kernel_library._rows import (RowConfig, add_residual, as_rows, bwd_programs, load_f32, row_start, store_rows,
                                  sum_partials)
from kernel_library.rmsnorm import BwdTuning

# --- constants ----------------------------------------------------------------------------------------------
# Block sizes, warps and the looped thresholds are kernel_library._rows' (RowConfig, FWD_WARPS, BWD_WARPS,
# MAX_FUSED_BLOCK_FWD/BWD, LOOP_BLOCK, BWD_PROGRAMS_PER_SM), whose comments give ptxas register counts for these
# LayerNorm kernels too: they hold the same arrays per element, plus the dbias accumulator in the backward
# (128 registers at 8192 columns and 16 warps, no stack). The backward's rows_per_iter / num_stages /
# programs_per_sm alternatives (RowConfig, off by default) at 4096 bf16 columns, ptxas sm_90 (triton 3.9),
# registers per thread, no stack in any: one row 8 warps 123, 16 warps 64; two rows 8 warps 166, 16 warps 105;
# four rows 16 warps 128; num_stages=3 adds (3 - 1) x rows x 16 KB of shared memory, registers about the same.

#: Launch overrides of the fused backward without (``BWD_TUNING``) and with (``ADD_BWD_TUNING``, add_layernorm) the
#: residual: rmsnorm.BwdTuning (row loop num_stages, rows per step, programs per SM, warps). The H200 best of
#: ``benchmarks/kernels/sweep_tiles.py --only layernorm_bwd,add_layernorm_bwd`` (8192 x 4096 bf16, 63 configs each
#: verified against float64; benchmarks/results/h200/kernels/sweep_tiles_norm_bwd.json), for both: 3 stages, 2 rows per
#: step, one program per SM, 8 warps. LayerNorm 0.0951 -> 0.0679 ms (50% -> 70% of copy); add_layernorm 0.1118 -> 0.0774
#: ms (57% -> 82%).
BWD_TUNING = BwdTuning(num_stages=3, rows_per_iter=2, programs_per_sm=1)
ADD_BWD_TUNING = BwdTuning(num_stages=3, rows_per_iter=2, programs_per_sm=1)

#: torch's default eps for LayerNorm (``nn.LayerNorm``, ``F.layer_norm``).
DEFAULT_EPS = 1e-5


# --- kernels ------------------------------------------------------------------------------------------------
# Exact means: means are divided with :func:`_div_refined`, exact whenever the quotient is representable (a constant
# row). Triton's fp32 ``/`` lowers to div.full.f32 on NVIDIA GPUs (up to 2 ulp; the interpreter divides exactly):
# 300 / 100 may give 3.0000002, x - mean is then not 0 on a constant row of 3.0, and rstd = 1/sqrt(eps) ~ 316
# amplifies that to the ~1e-4 error the H200 showed where torch gives y = bias exactly.


@triton.jit
def _div_refined(num, den):
    """``num / den`` for fp32 scalars: the approximate quotient refined by one Newton step on its exact remainder
    (``fma(-q, den, num)``), which makes it exact whenever the true quotient is representable and otherwise within
    about half an ulp. ``tl.div_rn`` (div.rn.f32) would do too, but it costs the fused forward 12 more registers
    (76 instead of 64 at 4096 columns and 8 warps, ptxas sm_90, triton 3.6): one resident program less per SM."""
    r = 1.0 / den
    q = num * r
    return tl.fma(tl.fma(-q, den, num), r, q)


@triton.jit
def _layer_norm_fwd_kernel(
    y_ptr,  # out: normalised rows [n_rows, n_cols], x dtype
    s_ptr,  # out: x + residual [n_rows, n_cols], x dtype (written only when HAS_RESIDUAL)
    x_ptr,  # in: rows to normalise [n_rows, n_cols]
    r_ptr,  # in: residual [n_rows, n_cols] (read only when HAS_RESIDUAL)
    w_ptr,  # in: weight [n_cols] (read only when HAS_WEIGHT)
    b_ptr,  # in: bias [n_cols] (read only when HAS_BIAS)
    stride_y_row,  # elements between rows of y
    stride_y_col,  # elements between columns of y
    stride_s_row,  # elements between rows of s
    stride_s_col,  # elements between columns of s
    stride_x_row,  # elements between rows of x
    stride_x_col,  # elements between columns of x
    stride_r_row,  # elements between rows of residual
    stride_r_col,  # elements between columns of residual
    stride_w,  # elements between weight entries
    stride_b,  # elements between bias entries
    n_cols,  # row width
    eps,  # added to the variance before the rsqrt
    HAS_RESIDUAL: tl.constexpr,  # normalise s = x + residual and write s
    HAS_WEIGHT: tl.constexpr,  # multiply by weight
    HAS_BIAS: tl.constexpr,  # add bias
    BLOCK_SIZE: tl.constexpr,  # power of two >= n_cols: the whole row in one block
):
    """One program normalises one row held in registers (mean, then the centred variance: two exact passes)."""
    eps = tl.cast(eps, tl.float32)  # fp32 under torch.compile too (see rmsnorm.py)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = load_f32(x_ptr, row, stride_x_row, cols, stride_x_col, mask)
    if HAS_RESIDUAL:
        x = add_residual(x, r_ptr, s_ptr, row, stride_r_row, stride_r_col, stride_s_row, stride_s_col, cols, mask)
    mean = _div_refined(tl.sum(x, axis=0), tl.cast(n_cols, tl.float32))  # see 'Exact means' above
    xc = tl.where(mask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    y = xc * rstd
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols * stride_b, mask=mask, other=0.0).to(tl.float32)
    store_rows(y_ptr, row, stride_y_row, cols, stride_y_col, y, mask)


@triton.jit
def _welford_merge(mean, m2, count, x, mask):
    """Merge one chunk ``x`` (fp32, masked lanes ignored) into running (mean, M2, count): the chunk's exact mean
    and sum of squared deviations, combined with Chan et al.'s parallel formula (no sum-of-squares cancellation)."""
    n_b = tl.sum(mask.to(tl.float32), axis=0)
    mean_b = _div_refined(tl.sum(tl.where(mask, x, 0.0), axis=0), n_b)  # see 'Exact means' above
    d = tl.where(mask, x - mean_b, 0.0)
    n_ab = count + n_b
    delta = mean_b - mean
    mean = mean + delta * _div_refined(n_b, n_ab)
    m2 = m2 + tl.sum(d * d, axis=0) + delta * delta * (count * n_b / n_ab)
    return mean, m2, n_ab


@triton.jit
def _welford_row(
    row_ptr,  # first element of the row
    stride_col,  # elements between columns
    n_cols,  # row width
    BLOCK_SIZE: tl.constexpr,  # chunk width
):
    """(mean, M2 = sum of squared deviations) of one row read in chunks of BLOCK_SIZE."""
    mean = tl.full([], 0.0, tl.float32)
    m2 = tl.full([], 0.0, tl.float32)
    count = tl.full([], 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(row_ptr + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
        mean, m2, count = _welford_merge(mean, m2, count, x, mask)
    return mean, m2


@triton.jit
def _layer_norm_fwd_looped_kernel(
    y_ptr,  # out: normalised rows [n_rows, n_cols], x dtype
    s_ptr,  # out: x + residual [n_rows, n_cols], x dtype (written only when HAS_RESIDUAL)
    x_ptr,  # in: rows to normalise [n_rows, n_cols]
    r_ptr,  # in: residual [n_rows, n_cols] (read only when HAS_RESIDUAL)
    w_ptr,  # in: weight [n_cols] (read only when HAS_WEIGHT)
    b_ptr,  # in: bias [n_cols] (read only when HAS_BIAS)
    stride_y_row,  # elements between rows of y
    stride_y_col,  # elements between columns of y
    stride_s_row,  # elements between rows of s
    stride_s_col,  # elements between columns of s
    stride_x_row,  # elements between rows of x
    stride_x_col,  # elements between columns of x
    stride_r_row,  # elements between rows of residual
    stride_r_col,  # elements between columns of residual
    stride_w,  # elements between weight entries
    stride_b,  # elements between bias entries
    n_cols,  # row width
    eps,  # added to the variance before the rsqrt
    HAS_RESIDUAL: tl.constexpr,  # normalise s = x + residual and write s
    HAS_WEIGHT: tl.constexpr,  # multiply by weight
    HAS_BIAS: tl.constexpr,  # add bias
    BLOCK_SIZE: tl.constexpr,  # chunk of the row processed per loop step
):
    """One program per row, two passes over chunks: Welford statistics (computing and writing s on the way when
    HAS_RESIDUAL), then normalise (re-reading x, or s) and store."""
    eps = tl.cast(eps, tl.float32)  # fp32 under torch.compile too (see rmsnorm.py)
    row = tl.program_id(0)
    x_row = x_ptr + row_start(row, stride_x_row)
    s_row = s_ptr + row_start(row, stride_s_row)
    y_row = y_ptr + row_start(row, stride_y_row)
    if HAS_RESIDUAL:
        r_row = r_ptr + row_start(row, stride_r_row)
        mean = tl.full([], 0.0, tl.float32)
        m2 = tl.full([], 0.0, tl.float32)
        count = tl.full([], 0.0, tl.float32)
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            mask = cols < n_cols
            x = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(r_row + cols * stride_r_col, mask=mask, other=0.0).to(tl.float32)
            s = (x + r).to(s_ptr.dtype.element_ty)
            tl.store(s_row + cols * stride_s_col, s, mask=mask)
            mean, m2, count = _welford_merge(mean, m2, count, s.to(tl.float32), mask)
        tl.debug_barrier()  # the normalise pass reads back s, written above by other threads of this program
    else:
        mean, m2 = _welford_row(x_row, stride_x_col, n_cols, BLOCK_SIZE)
    rstd = tl.rsqrt(m2 / n_cols + eps)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        if HAS_RESIDUAL:
            x = tl.load(s_row + cols * stride_s_col, mask=mask, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols * stride_b, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols * stride_y_col, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows", "n_programs"])
def _layer_norm_bwd_kernel(
    dx_ptr,  # out: gradient of x (and of residual) [n_rows, n_cols], x dtype
    dw_partial_ptr,  # out: fp32 dweight partial sums [n_programs, n_cols], contiguous (HAS_WEIGHT only)
    db_partial_ptr,  # out: fp32 dbias partial sums [n_programs, n_cols], contiguous (HAS_BIAS only)
    dy_ptr,  # in: gradient of y [n_rows, n_cols]
    ds_ptr,  # in: gradient of the new residual [n_rows, n_cols] (read only when HAS_RESIDUAL)
    x_ptr,  # in: the normalised input: x, or s = x + residual when HAS_RESIDUAL [n_rows, n_cols]
    w_ptr,  # in: weight [n_cols] (read only when HAS_WEIGHT)
    stride_dx_row,  # elements between rows of dx
    stride_dx_col,  # elements between columns of dx
    stride_dy_row,  # elements between rows of dy
    stride_dy_col,  # elements between columns of dy
    stride_ds_row,  # elements between rows of ds
    stride_ds_col,  # elements between columns of ds
    stride_x_row,  # elements between rows of x
    stride_x_col,  # elements between columns of x
    stride_w,  # elements between weight entries
    n_rows,  # number of rows
    n_cols,  # row width
    n_programs,  # programs in the grid: program p handles rows p, p + n_programs, ...
    eps,  # as in the forward
    HAS_RESIDUAL: tl.constexpr,  # add ds to dx
    HAS_WEIGHT: tl.constexpr,  # g = dy * weight, and accumulate dweight
    HAS_BIAS: tl.constexpr,  # accumulate dbias
    BLOCK_SIZE: tl.constexpr,  # power of two >= n_cols
    ROWS_PER_ITER: tl.constexpr = 1,  # rows per loop step (power of two): 1 = a 1-D row, else a 2-D block
    NUM_STAGES: tl.constexpr = None,  # software-pipelining stages of the row loop; None = no hint (Triton's default)
):
    """Each program loops over its rows, writes dx per row, and keeps dweight/dbias partial sums in registers.

    ``ROWS_PER_ITER == R > 1``: program p handles the row blocks p, p + n_programs, ... of R consecutive rows as
    one [R, BLOCK_SIZE] block (reductions along axis 1, dweight/dbias summed over axis 0), as in
    ``rmsnorm._rms_norm_bwd_kernel``; rows past ``n_rows`` are masked (dy = 0 there adds nothing).
    """
    eps = tl.cast(eps, tl.float32)  # fp32 under torch.compile too (see rmsnorm.py)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    if ROWS_PER_ITER == 1:
        for row in tl.range(pid, n_rows, n_programs, num_stages=NUM_STAGES):
            x = load_f32(x_ptr, row, stride_x_row, cols, stride_x_col, mask)
            dy = load_f32(dy_ptr, row, stride_dy_row, cols, stride_dy_col, mask)
            mean = _div_refined(tl.sum(x, axis=0), tl.cast(n_cols, tl.float32))  # as in the forward
            xc = tl.where(mask, x - mean, 0.0)
            rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
            x_hat = xc * rstd
            if HAS_WEIGHT:
                g = dy * w
            else:
                g = dy
            dx = rstd * (g - tl.sum(g, axis=0) / n_cols - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))
            if HAS_RESIDUAL:
                dx += load_f32(ds_ptr, row, stride_ds_row, cols, stride_ds_col, mask)
            store_rows(dx_ptr, row, stride_dx_row, cols, stride_dx_col, dx, mask)
            if HAS_WEIGHT:
                dw_acc += dy * x_hat
            if HAS_BIAS:
                db_acc += dy
    else:
        row_offs = tl.arange(0, ROWS_PER_ITER)
        cols_2d = cols[None, :]  # [1, BLOCK_SIZE]
        for first in tl.range(pid * ROWS_PER_ITER, n_rows, n_programs * ROWS_PER_ITER, num_stages=NUM_STAGES):
            rows = first + row_offs  # [ROWS_PER_ITER]
            mask_2d = (rows < n_rows)[:, None] & mask[None, :]  # [ROWS_PER_ITER, BLOCK_SIZE]
            x = load_f32(x_ptr, rows[:, None], stride_x_row, cols_2d, stride_x_col, mask_2d)
            dy = load_f32(dy_ptr, rows[:, None], stride_dy_row, cols_2d, stride_dy_col, mask_2d)
            mean = _div_refined(tl.sum(x, axis=1), tl.cast(n_cols, tl.float32))[:, None]  # [ROWS_PER_ITER, 1]
            xc = tl.where(mask_2d, x - mean, 0.0)
            rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)[:, None]
            x_hat = xc * rstd
            if HAS_WEIGHT:
                g = dy * w[None, :]
            else:
                g = dy
            dx = rstd * (
                g - (tl.sum(g, axis=1) / n_cols)[:, None] - x_hat * (tl.sum(g * x_hat, axis=1) / n_cols)[:, None]
            )
            if HAS_RESIDUAL:
                dx += load_f32(ds_ptr, rows[:, None], stride_ds_row, cols_2d, stride_ds_col, mask_2d)
            store_rows(dx_ptr, rows[:, None], stride_dx_row, cols_2d, stride_dx_col, dx, mask_2d)
            if HAS_WEIGHT:
                dw_acc += tl.sum(dy * x_hat, axis=0)
            if HAS_BIAS:
                db_acc += tl.sum(dy, axis=0)
    if HAS_WEIGHT:
        tl.store(dw_partial_ptr + row_start(pid, n_cols) + cols, dw_acc, mask=mask)
    if HAS_BIAS:
        tl.store(db_partial_ptr + row_start(pid, n_cols) + cols, db_acc, mask=mask)


@triton.jit(do_not_specialize=["n_rows", "n_programs"])
def _layer_norm_bwd_looped_kernel(
    dx_ptr,  # out: gradient of x (and of residual) [n_rows, n_cols], x dtype
    dw_partial_ptr,  # out: fp32 dweight partial sums [n_programs, n_cols], contiguous (HAS_WEIGHT only)
    db_partial_ptr,  # out: fp32 dbias partial sums [n_programs, n_cols], contiguous (HAS_BIAS only)
    stats_ptr,  # scratch: fp32 per-row (mean, rstd, mean(g), mean(g * x_hat)) [4, n_rows], contiguous
    dy_ptr,  # in: gradient of y [n_rows, n_cols]
    ds_ptr,  # in: gradient of the new residual [n_rows, n_cols] (read only when HAS_RESIDUAL)
    x_ptr,  # in: the normalised input: x, or s = x + residual when HAS_RESIDUAL [n_rows, n_cols]
    w_ptr,  # in: weight [n_cols] (read only when HAS_WEIGHT)
    stride_dx_row,  # elements between rows of dx
    stride_dx_col,  # elements between columns of dx
    stride_dy_row,  # elements between rows of dy
    stride_dy_col,  # elements between columns of dy
    stride_ds_row,  # elements between rows of ds
    stride_ds_col,  # elements between columns of ds
    stride_x_row,  # elements between rows of x
    stride_x_col,  # elements between columns of x
    stride_w,  # elements between weight entries
    n_rows,  # number of rows
    n_cols,  # row width
    n_programs,  # programs in the grid: program p handles rows p, p + n_programs, ...
    eps,  # as in the forward
    HAS_RESIDUAL: tl.constexpr,  # add ds to dx
    HAS_WEIGHT: tl.constexpr,  # g = dy * weight, and accumulate dweight
    HAS_BIAS: tl.constexpr,  # accumulate dbias
    BLOCK_SIZE: tl.constexpr,  # chunk of the row processed per loop step
):
    """Rows too wide for registers. Pass A, per row of this program: Welford statistics, then sum(g) and
    sum(g * x_hat) over chunks, kept in ``stats``. Pass B, per column chunk: loop over this program's rows, write
    dx and accumulate the dweight / dbias chunks in registers, store them once."""
    eps = tl.cast(eps, tl.float32)  # fp32 under torch.compile too (see rmsnorm.py)
    pid = tl.program_id(0)
    for row in tl.range(pid, n_rows, n_programs):
        x_row = x_ptr + row_start(row, stride_x_row)
        dy_row = dy_ptr + row_start(row, stride_dy_row)
        mean, m2 = _welford_row(x_row, stride_x_col, n_cols, BLOCK_SIZE)
        rstd = tl.rsqrt(m2 / n_cols + eps)
        sum_g = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        sum_gx = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            mask = cols < n_cols
            x = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
            sum_g += g
            sum_gx += g * ((x - mean) * rstd)  # g is 0 in masked lanes
        tl.store(stats_ptr + row, mean)
        tl.store(stats_ptr + n_rows + row, rstd)
        tl.store(stats_ptr + 2 * n_rows + row, tl.sum(sum_g, axis=0) / n_cols)
        tl.store(stats_ptr + 3 * n_rows + row, tl.sum(sum_gx, axis=0) / n_cols)
    tl.debug_barrier()  # pass B reads the row statistics stored above by other threads of this program
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for row in tl.range(pid, n_rows, n_programs):
            mean = tl.load(stats_ptr + row)
            rstd = tl.load(stats_ptr + n_rows + row)
            c1 = tl.load(stats_ptr + 2 * n_rows + row)
            c2 = tl.load(stats_ptr + 3 * n_rows + row)
            x = tl.load(x_ptr + row_start(row, stride_x_row) + cols * stride_x_col, mask=mask, other=0.0)
            dy = load_f32(dy_ptr, row, stride_dy_row, cols, stride_dy_col, mask)
            x_hat = (x.to(tl.float32) - mean) * rstd
            if HAS_WEIGHT:
                g = dy * w
            else:
                g = dy
            dx = rstd * (g - c1 - x_hat * c2)
            if HAS_RESIDUAL:
                dx += load_f32(ds_ptr, row, stride_ds_row, cols, stride_ds_col, mask)
            store_rows(dx_ptr, row, stride_dx_row, cols, stride_dx_col, dx, mask)
            if HAS_WEIGHT:
                dw_acc += dy * x_hat
            if HAS_BIAS:
                db_acc += dy
        if HAS_WEIGHT:
            tl.store(dw_partial_ptr + row_start(pid, n_cols) + cols, dw_acc, mask=mask)
        if HAS_BIAS:
            tl.store(db_partial_ptr + row_start(pid, n_cols) + cols, db_acc, mask=mask)


# --- launchers ----------------------------------------------------------------------------------------------


def _check_ln_inputs(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, residual: torch.Tensor | None
) -> None:
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension [..., hidden]; got a 0-d tensor")
    check_tensor("x", x)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if p.dim() != 1 or p.shape[0] != x.shape[-1]:
            raise ValueError(f"{name} must be 1-D of size x.shape[-1]={x.shape[-1]}; got shape {tuple(p.shape)}")
        check_tensor(name, p, x.device)
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)}; got {tuple(residual.shape)}")
        if residual.dtype != x.dtype:
            raise TypeError(f"residual must have x's dtype {x.dtype}; got {residual.dtype}")
        check_tensor("residual", residual, x.device)


def layer_norm_fwd_launch(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
    config: RowConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch the forward on 2-D ``x`` [n_rows, n_cols] (any strides, non-empty); returns ``(y, s)``, both
    contiguous in x's dtype, ``s = x + residual`` or None. ``config`` overrides the heuristic (tests)."""
    n_rows, n_cols = x.shape
    cfg = config or RowConfig.forward(n_cols)
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    s = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if residual is not None else None
    # placeholders for absent tensors: never read or written, the matching constexpr flag is False
    r = residual if residual is not None else x
    s_arg = s if s is not None else y
    w = weight if weight is not None else x
    b = bias if bias is not None else x
    kernel = _layer_norm_fwd_looped_kernel if cfg.looped else _layer_norm_fwd_kernel
    launcher(kernel)[(n_rows,)](
        y,
        s_arg,
        x,
        r,
        w,
        b,
        y.stride(0),
        y.stride(1),
        s_arg.stride(0),
        s_arg.stride(1),
        x.stride(0),
        x.stride(1),
        r.stride(0),
        r.stride(1),
        w.stride(-1),
        b.stride(-1),
        n_cols,
        eps,
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        BLOCK_SIZE=cfg.block_size,
        num_warps=cfg.num_warps,
    )
    return y, s


def layer_norm_bwd_launch(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    ds: torch.Tensor | None = None,
    config: RowConfig | None = None,
    tuning: BwdTuning | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward on 2-D ``dy``, ``x`` (and ``ds``) [n_rows, n_cols], non-empty.

    Returns ``(dx, dw, db)``: dx contiguous in x's dtype; dw / db [n_cols] in weight's / bias's dtype, or empty
    [0] tensors when weight / bias is None (a custom op cannot return None). ``config`` overrides the heuristic,
    including the fused kernel's rows per loop step, num_stages and programs per SM (see ``rmsnorm.RowConfig``).
    Without it, ``tuning`` (default :data:`ADD_BWD_TUNING` with ``ds``, else :data:`BWD_TUNING`) adjusts the
    heuristic's fused launch.
    """
    n_rows, n_cols = x.shape
    if tuning is None:
        tuning = ADD_BWD_TUNING if ds is not None else BWD_TUNING
    cfg = config or tuning.apply(RowConfig.backward(n_cols))
    rows_per_iter = 1 if cfg.looped else cfg.rows_per_iter
    n_programs = bwd_programs(n_rows, x.device, rows_per_iter, cfg.programs_per_sm)
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    # every program writes its whole partial rows (zeros if it had no rows), so no zero-fill is needed
    partial_shape = (n_programs, n_cols)
    dw_partial = torch.empty(partial_shape, dtype=torch.float32, device=x.device) if weight is not None else dx
    db_partial = torch.empty(partial_shape, dtype=torch.float32, device=x.device) if bias is not None else dx
    ds_arg = ds if ds is not None else dy  # placeholder pointer, never read when HAS_RESIDUAL is False
    w = weight if weight is not None else x  # placeholder pointer, never read when HAS_WEIGHT is False
    ptrs = [dx, dw_partial, db_partial, dy, ds_arg, x, w]
    fused_only = {}
    if cfg.looped:  # per-row (mean, rstd, mean(g), mean(g * x_hat)) scratch between the looped kernel's passes
        ptrs.insert(3, torch.empty((4, n_rows), dtype=torch.float32, device=x.device))
    else:  # every constexpr passed, defaults included: torch.compile's wrap_triton needs the full argument list
        fused_only = {"ROWS_PER_ITER": rows_per_iter, "NUM_STAGES": cfg.num_stages}
    kernel = _layer_norm_bwd_looped_kernel if cfg.looped else _layer_norm_bwd_kernel
    launcher(kernel)[(n_programs,)](
        *ptrs,
        *dx.stride(),  # every operand is 2-D [n_rows, n_cols]: (row stride, column stride)
        *dy.stride(),
        *ds_arg.stride(),
        *x.stride(),
        w.stride(-1),
        n_rows,
        n_cols,
        n_programs,
        eps,
        HAS_RESIDUAL=ds is not None,
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        BLOCK_SIZE=cfg.block_size,
        **fused_only,
        num_warps=cfg.num_warps,
    )
    wanted = [(p, t.dtype) for p, t in ((dw_partial, weight), (db_partial, bias)) if t is not None]
    sums = sum_partials(wanted) if wanted else []
    dw = sums.pop(0) if weight is not None else x.new_empty((0,))
    db = sums.pop(0) if bias is not None else x.new_empty((0,))
    return dx, dw, db


def _empty_param_grads(
    weight: torch.Tensor | None, bias: torch.Tensor | None, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Parameter gradients of an empty input: zeros (a sum over no rows), or [0] placeholders when absent."""
    dw = torch.zeros_like(weight) if weight is not None else like.new_empty((0,))
    db = torch.zeros_like(bias) if bias is not None else like.new_empty((0,))
    return dw, db


# --- torch.library ops --------------------------------------------------------------------------------------


@library_op("fusion_advisor::layer_norm", mutates_args={})
def _layer_norm_op(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    _check_ln_inputs(x, weight, bias, None)
    n_cols = x.shape[-1]
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y, _ = layer_norm_fwd_launch(as_rows(x, n_cols), weight, bias, eps)
    return y.view(x.shape)


@library_op("fusion_advisor::layer_norm_backward", mutates_args={})
def _layer_norm_backward_op(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_cols = x.shape[-1]
    if x.numel() == 0:
        return (torch.empty_like(x, memory_format=torch.contiguous_format), *_empty_param_grads(weight, bias, x))
    dx, dw, db = layer_norm_bwd_launch(as_rows(dy, n_cols), as_rows(x, n_cols), weight, bias, eps)
    return dx.view(x.shape), dw, db


def _layer_norm_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps = eps


def _layer_norm_backward(ctx, dy: torch.Tensor):
    x, weight, bias = ctx.saved_tensors
    dx, dw, db = _layer_norm_backward_op(dy, x, weight, bias, ctx.eps)
    return dx, (dw if weight is not None else None), (db if bias is not None else None), None


_layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup_context)


@library_op("fusion_advisor::add_layer_norm", mutates_args={})
def _add_layer_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_ln_inputs(x, weight, bias, residual)
    n_cols = x.shape[-1]
    if x.numel() == 0:
        return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
                torch.empty(x.shape, dtype=x.dtype, device=x.device))
    y, s = layer_norm_fwd_launch(as_rows(x, n_cols), weight, bias, eps, residual=as_rows(residual, n_cols))
    return y.view(x.shape), s.view(x.shape)


@library_op("fusion_advisor::add_layer_norm_backward", mutates_args={})
def _add_layer_norm_backward_op(
    dy: torch.Tensor,
    d_new_residual: torch.Tensor,
    new_residual: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_cols = new_residual.shape[-1]
    if new_residual.numel() == 0:
        empty_dx = torch.empty_like(new_residual, memory_format=torch.contiguous_format)
        return (empty_dx, *_empty_param_grads(weight, bias, new_residual))
    ds, dw, db = layer_norm_bwd_launch(
        as_rows(dy, n_cols), as_rows(new_residual, n_cols), weight, bias, eps, ds=as_rows(d_new_residual, n_cols)
    )
    return ds.view(new_residual.shape), dw, db


def _add_layer_norm_setup_context(ctx, inputs, output) -> None:
    _, _, weight, bias, eps = inputs
    _, new_residual = output
    ctx.save_for_backward(new_residual, weight, bias)
    ctx.eps = eps


def _add_layer_norm_backward(ctx, dy: torch.Tensor, d_new_residual: torch.Tensor):
    new_residual, weight, bias = ctx.saved_tensors
    # autograd materialises unused output gradients as zeros, so both are tensors here
    ds, dw, db = _add_layer_norm_backward_op(dy, d_new_residual, new_residual, weight, bias, ctx.eps)
    # x and residual receive the same gradient (as torch's own add backward returns one tensor for both)
    return ds, ds, (dw if weight is not None else None), (db if bias is not None else None), None


_add_layer_norm_op.register_autograd(_add_layer_norm_backward, setup_context=_add_layer_norm_setup_context)


# --- public function ----------------------------------------------------------------------------------------


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = DEFAULT_EPS,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dim (``F.layer_norm(x, (n_cols,), weight, bias, eps)``), optionally after a
    residual add; differentiable in every tensor argument.

    Args:
        x: [..., n_cols], fp32/fp16/bf16, any strides.
        weight: [n_cols] or None; bias: [n_cols] or None (fp32/fp16/bf16, e.g. fp32 with bf16 x).
        eps: added to the (biased) variance before the rsqrt.
        residual: None, or x's shape and dtype: then ``s = residual + x`` (rounded to x's dtype) is normalised.

    Returns:
        y [..., n_cols] in x's dtype without a residual; ``(y, s)`` with one (``y = LayerNorm(s)``).

    Raises:
        ValueError: x is 0-d, weight/bias is not [x.shape[-1]], residual's shape differs, or the tensors sit on
            different or unsupported devices.
        TypeError: a dtype other than fp32/fp16/bf16, or residual's dtype differs from x's.
    """
    if residual is None:
        return _layer_norm_op(x, weight, bias, float(eps))
    return _add_layer_norm_op(x, residual, weight, bias, float(eps))


# --- contract -----------------------------------------------------------------------------------------------

kernel_fn = layer_norm


def reference_fn(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = DEFAULT_EPS,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch: ``F.layer_norm`` (``nn.LayerNorm.forward``), after ``residual + x`` when a residual is given.

    weight / bias of another dtype than x (fp32 parameters with fp16/bf16 x) follow torch's mixed-dtype layer_norm
    as the CPU kernel implements it: computed in fp32 (float64 stays float64), output in x's dtype. Written out here
    because CUDA's F.layer_norm rejects the mix ("expected scalar type BFloat16 but found Float" on the H200).
    """
    hidden_states = x if residual is None else residual + x
    params = [p for p in (weight, bias) if p is not None]
    if any(p.dtype != x.dtype for p in params):
        acc = torch.promote_types(x.dtype, torch.float32)
        y = F.layer_norm(hidden_states.to(acc), (x.shape[-1],), None if weight is None else weight.to(acc),
                         None if bias is None else bias.to(acc), eps).to(x.dtype)
    else:
        y = F.layer_norm(hidden_states, (x.shape[-1],), weight, bias, eps)
    return y if residual is None else (y, hidden_states)


def make_inputs(
    n_rows: int,
    n_cols: int,
    dtype: torch.dtype = torch.bfloat16,
    eps: float = DEFAULT_EPS,
    residual: bool = False,
    requires_grad: bool = True,
    device: torch.device | str | None = None,
    seed: int = 0,
) -> list:
    """``[x [n_rows, n_cols], weight [n_cols], bias [n_cols], eps]`` plus ``residual`` [n_rows, n_cols] when
    ``residual=True``, on ``device``. x, residual ~ N(0, 1); weight ~ 1 + N(0, 0.1); bias ~ N(0, 0.1)."""
    device = torch.device(device) if device is not None else default_device()
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((n_rows, n_cols), generator=gen, device=device).to(dtype).requires_grad_(requires_grad)
    weight = (1.0 + 0.1 * torch.randn((n_cols,), generator=gen, device=device)).to(dtype)
    bias = (0.1 * torch.randn((n_cols,), generator=gen, device=device)).to(dtype)
    args = [x, weight.requires_grad_(requires_grad), bias.requires_grad_(requires_grad), eps]
    if residual:
        r = torch.randn((n_rows, n_cols), generator=gen, device=device).to(dtype)
        args.append(r.requires_grad_(requires_grad))
    return args


#: ``get_inputs(size)`` sizes, ``(n_rows, n_cols)``; ``verify`` derives its edge shapes from the first.
SIZES = [(8192, 4096)] if on_gpu() else [(16, 1000)]


def get_inputs(size: tuple[int, int] | None = None) -> list:
    """Plain LayerNorm, ``size`` = ``(n_rows, n_cols)``, default ``SIZES[0]``: Llama-7B shapes on a GPU
    (8192 x 4096), 16 x 1000 on the CPU interpreter; bf16; drawn from the seed ``verify`` set."""
    return _inputs(size)


def _inputs(size: tuple[int, int] | None, residual: bool = False) -> list:
    """:func:`get_inputs`, with a residual where ``residual`` (``add_layernorm``'s: :func:`contract_for`)."""
    n_rows, n_cols = size or SIZES[0]
    return make_inputs(n_rows, n_cols, torch.bfloat16, residual=residual, seed=torch.initial_seed())


def hard_inputs() -> list:
    """Hard values: rows of large magnitude with a large mean (x 1e3 + 1e3: a variance taken as E[x^2] - E[x]^2
    cancels catastrophically) and constant rows (variance 0: ``rstd = 1 / sqrt(eps)``)."""
    x, weight, bias, eps = get_inputs()
    large = (x.detach() * 1e3 + 1e3).requires_grad_(True)
    flat = x.detach().clone()
    flat[::3] = 2.5
    return [("rows x 1e3 + 1e3", [large, weight, bias, eps]), ("constant rows", [flat.requires_grad_(True), weight,
                                                                                   bias, eps])]


def contract_for(name: str) -> dict | None:
    """``fusion-advisor verify``'s contract of the registry entry ``name`` where it is not this module's main one:
    ``add_layernorm`` runs every input set with a residual (``make_inputs(..., residual=True)``; the hard values
    with the residual of the same rows), so the fused add is checked on its own, not through plain LayerNorm."""
    if name != "add_layernorm":
        return None

    def hard() -> list:
        r = _inputs(None, residual=True)[4]
        return [(f"{label}, with a residual", [*args, r]) for label, args in hard_inputs()]

    return {"get_inputs": lambda size=None: _inputs(size, residual=True), "hard_inputs": hard}


#: GPU benchmark shapes: the Llama-7B shape (8192 x 4096 bf16, benchmarks/results/h200/kernels/kernels_7b.md) in three
#: dtypes, a token and a width sweep, a row wide enough for the looped path, and the fused residual add
#: (``residual=True``: add_layernorm).
BENCH_SHAPES: list[dict] = [
    {"n_rows": 8192, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 4096, "dtype": torch.float16},
    {"n_rows": 8192, "n_cols": 4096, "dtype": torch.float32},
    {"n_rows": 1, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 32, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 512, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 2048, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 32768, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 768, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 2048, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 8192, "dtype": torch.bfloat16},
    {"n_rows": 4096, "n_cols": 16384, "dtype": torch.bfloat16},
    {"n_rows": 256, "n_cols": 131072, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 4096, "dtype": torch.bfloat16, "residual": True},
    {"n_rows": 8192, "n_cols": 2048, "dtype": torch.bfloat16, "residual": True},
]


def bench_entry(shape: dict) -> str:
    """The registry entry a ``BENCH_SHAPES`` shape exercises: ``"add_layernorm"`` with ``residual=True``, else
    ``"layernorm"`` (this module registers both)."""
    return "add_layernorm" if shape.get("residual") else "layernorm"


def _param_bytes(weight: torch.Tensor | None, bias: torch.Tensor | None) -> int:
    return sum(p.numel() * p.element_size() for p in (weight, bias) if p is not None)


def bytes_moved(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = DEFAULT_EPS,
    residual: torch.Tensor | None = None,
) -> int:
    """Fewest bytes the forward moves: read x (and residual), weight, bias; write y (and the new residual)."""
    per_elem = 2 if residual is None else 4  # tensors of x's size read or written per element
    return x.numel() * x.element_size() * per_elem + _param_bytes(weight, bias)


def bytes_moved_backward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = DEFAULT_EPS,
    residual: torch.Tensor | None = None,
) -> int:
    """Fewest bytes the backward moves: read dy, x (or the new residual), d(new residual) if any, weight; write
    dx (shared by x and residual), dweight, dbias (partial sums excluded)."""
    per_elem = 3 if residual is None else 4
    param_reads = weight.numel() * weight.element_size() if weight is not None else 0
    return x.numel() * x.element_size() * per_elem + param_reads + _param_bytes(weight, bias)


def _hf_layer_norm(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """The subgraph replaced: ``nn.LayerNorm.forward`` (module weight, bias and eps as inputs)."""
    return F.layer_norm(hidden_states, (hidden_states.shape[-1],), weight, bias, eps)


def _hf_layer_norm_replacement(
    hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    return kernel_fn(hidden_states, weight, bias, eps)


def _hf_add_layer_norm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The subgraph replaced: a pre-norm decoder layer's residual add followed by ``nn.LayerNorm.forward``."""
    hidden_states = residual + hidden_states
    residual = hidden_states
    return F.layer_norm(hidden_states, (hidden_states.shape[-1],), weight, bias, eps), residual


def _hf_add_layer_norm_replacement(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return kernel_fn(hidden_states, weight, bias, eps, residual=residual)


def _last_dim_only(hidden_states: torch.Tensor, *rest) -> str:
    """apply's check of a LayerNorm site: ``""`` where it normalizes over the last dim alone, else why not (an
    ``nn.LayerNorm([64, 256, 256])`` normalizes over three dims: its weight has their shape)."""
    weight = rest[-3] if len(rest) >= 3 else None  # (weight, bias, eps) end both patterns' parameters
    if isinstance(weight, torch.Tensor) and weight.dim() != 1:
        return (f"it normalizes over the last {weight.dim()} dims (weight {list(weight.shape)}); the kernel "
                f"normalizes over the last dim only")
    return ""


ENTRY = register_kernel(KernelEntry(
    name="layernorm", module=__name__, op="fusion_advisor::layer_norm", has_backward=True,
    description="LayerNorm over the last dim with optional weight/bias, fwd+bwd; matches F.layer_norm",
    pattern=_hf_layer_norm, replacement=_hf_layer_norm_replacement, example_args=((2, 3, 16), (16,), (16,), "scalar"),
    extra_check=_last_dim_only))

#: The fused residual add shares this module's contract: ``kernel_fn(..., residual=r)`` / ``reference_fn`` /
#: ``make_inputs(..., residual=True)``; ``get_inputs()`` covers the plain entry only, :func:`contract_for` this one.
ADD_ENTRY = register_kernel(KernelEntry(
    name="add_layernorm", module=__name__, op="fusion_advisor::add_layer_norm", has_backward=True,
    description="residual add + LayerNorm, fwd+bwd; returns (F.layer_norm(residual + x), residual + x)",
    pattern=_hf_add_layer_norm, replacement=_hf_add_layer_norm_replacement,
    example_args=((2, 3, 16), (2, 3, 16), (16,), (16,), "scalar"), extra_check=_last_dim_only))
