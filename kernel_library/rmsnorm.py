"""RMSNorm with Hugging Face semantics (Llama, and Gemma's ``1 + weight`` variant): Triton forward and backward.

Formula (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"), over the last dim of ``x``:

    rstd = 1 / sqrt(mean(x**2) + eps)          # in fp32
    Llama (offset == 0):  y = weight * (x * rstd).to(x.dtype)              # transformers LlamaRMSNorm
    Gemma (offset != 0):  y = ((x * rstd) * (offset + weight.float())).to(x.dtype)   # GemmaRMSNorm

The Llama form rounds the normalised row to the input dtype *before* the weight multiply and returns
``promote_types(x.dtype, weight.dtype)`` (HF's ``self.weight * hidden_states.to(input_dtype)``); the Gemma form
stays in fp32 until the final cast to ``x.dtype`` (HF's ``output.type_as(x)``).

The kernels also serve ``kernel_library.add_rmsnorm`` (``HAS_RESIDUAL=True``: ``s = x + residual`` is rounded to
the input dtype, written out, and normalised), and ``kernel_library.layernorm`` reuses the launch helpers
(:class:`RowConfig`, :func:`row_start`, :func:`as_rows`, :func:`bwd_programs`, all in :mod:`kernel_library._rows`).

Backward (rstd is recomputed from the saved input: the row is in registers anyway, so it costs no traffic):

    g = dy * w_eff                      (w_eff = weight, or offset + weight)
    dx = rstd * (g - xhat * mean(g * xhat))        xhat = x * rstd
    dweight = sum over rows of dy * xhat (Llama: xhat rounded to x.dtype, as HF's autograd sees it)

dweight is accumulated per program in fp32 partial sums ``[n_programs, n_cols]`` and reduced by one small kernel
(:func:`kernel_library._rows.sum_partials`), as in Triton's tutorial 05-layer-norm and Liger-Kernel's ``rms_norm``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernel_library._device import default_device, on_gpu
from kernel_library._op import launcher, library_op
from kernel_library._checks import check_tensor
from kernel_library._rows import (RowConfig, add_residual, as_rows, bwd_programs, load_f32, row_start, store_rows,
                                  sum_partials)
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ----------------------------------------------------------------------------------------------

#: Alternatives the lead sweeps on the GPU (benchmarks/kernels/sweep_tiles.py --only rmsnorm_bwd), all off by default:
#: ``RowConfig.rows_per_iter`` (R rows per loop step as one [R, BLOCK_SIZE] block), ``RowConfig.num_stages`` (a
#: ``tl.range`` pipelining hint: loads of the next steps go through shared memory with cp.async) and
#: ``RowConfig.programs_per_sm``. ptxas for sm_90 (triton 3.9, contiguous bf16 rows of 4096), registers per thread
#: / stack bytes: R=1: 4 warps 168/0, 8 warps 101/0, 16 warps 60/0; R=2: 4 warps 255/120, 8 warps 162/0, 16 warps
#: 98/0; R=4: 8 warps 255/8, 16 warps 128/32. num_stages=S adds (S - 1) * R * 16 KB of shared memory (x and dy)
#: and leaves the registers about as they are (R=1, 8 warps, S=3: 98 registers, 32 KB).

#: ``tl.range`` pipelining depth of the fused backward's row loop (the loads of the next rows go through shared
#: memory with cp.async while the current row reduces). Measured on H200 2026-11-29
#: (benchmarks/results/h200/kernels/sweep_tiles.json, key ``rmsnorm_bwd_session2``: 8192 x 4096 bf16, rows per step
#: {1, 2, 4} x programs per SM {1, 2, 4} x warps {4, 8, 16} x num_stages {None, 2, 3, 4}, each verified against
#: float64): with the default one row per step, 2 programs per SM and 8 warps, num_stages=3 took 0.0576 ms (82% of
#: copy) against 0.0797 ms (59%) without the hint; the fastest of all, 2 rows per step on 1 program per SM with
#: num_stages=3, took 0.0562 ms (84%), within 3%, so the simpler setting is the default. Applied to the plain
#: RMSNorm backward (:data:`BWD_TUNING`); the residual variant (add_rmsnorm, a third input stream) has its own
#: ``add_rmsnorm.BWD_TUNING``, swept by ``benchmarks/kernels/sweep_tiles.py --only add_rmsnorm_bwd``.
BWD_NUM_STAGES = 3

# --- kernels ------------------------------------------------------------------------------------------------
# Float arguments (eps, offset) are cast to fp32 at kernel entry. Eager Triton passes a Python float as fp32, but
# Inductor types it fp64 when torch.compile compiles these triton_ops: ``mean(x**2) + eps`` and all that follows
# then run in fp64 (slower, rounded unlike eager: compiled y and dx were not bit-identical to eager on the H200),
# and a loop-carried fp32 accumulator re-assigned an fp64 value fails to compile (seen there too: "Loop-carried
# variable dw_acc has initial type fp32 but is re-assigned to fp64"). ``tl.cast`` rather than ``.to``: under
# TRITON_INTERPRET the argument is a plain Python float, which has no ``.to``; tl.cast also accepts a constexpr.


@triton.jit
def _rms_norm_fwd_kernel(
    y_ptr,  # out: normalised rows [n_rows, n_cols], output dtype
    s_ptr,  # out: x + residual [n_rows, n_cols], x dtype (written only when HAS_RESIDUAL)
    x_ptr,  # in: rows to normalise [n_rows, n_cols]
    r_ptr,  # in: residual [n_rows, n_cols], x dtype (read only when HAS_RESIDUAL)
    w_ptr,  # in: weight [n_cols]
    stride_y_row,  # elements between rows of y
    stride_y_col,  # elements between columns of y
    stride_s_row,  # elements between rows of s
    stride_s_col,  # elements between columns of s
    stride_x_row,  # elements between rows of x
    stride_x_col,  # elements between columns of x
    stride_r_row,  # elements between rows of residual
    stride_r_col,  # elements between columns of residual
    stride_w,  # elements between weight entries
    n_cols,  # row width (hidden size)
    eps,  # added to mean(x**2) before the rsqrt
    offset,  # Gemma: weight is applied as (offset + weight); ignored unless GEMMA
    HAS_RESIDUAL: tl.constexpr,  # normalise s = x + residual and write s
    GEMMA: tl.constexpr,  # fp32 (offset + weight) multiply, one rounding at the end; else HF Llama rounding
    BLOCK_SIZE: tl.constexpr,  # power of two >= n_cols: the whole row in one block
):
    """One program normalises one row held entirely in registers."""
    eps = tl.cast(eps, tl.float32)  # see 'Float arguments' above
    offset = tl.cast(offset, tl.float32)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = load_f32(x_ptr, row, stride_x_row, cols, stride_x_col, mask)
    if HAS_RESIDUAL:
        x = add_residual(x, r_ptr, s_ptr, row, stride_r_row, stride_r_col, stride_s_row, stride_s_col, cols, mask)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    rstd = tl.rsqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
    x_hat = x * rstd
    if GEMMA:
        y = x_hat * (offset + w)
    else:
        # HF Llama: the normalised row is cast to the input dtype, then multiplied by the weight
        y = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32) * w
    store_rows(y_ptr, row, stride_y_row, cols, stride_y_col, y, mask)


@triton.jit
def _rms_norm_fwd_looped_kernel(
    y_ptr,  # out: normalised rows [n_rows, n_cols], output dtype
    s_ptr,  # out: x + residual [n_rows, n_cols], x dtype (written only when HAS_RESIDUAL)
    x_ptr,  # in: rows to normalise [n_rows, n_cols]
    r_ptr,  # in: residual [n_rows, n_cols], x dtype (read only when HAS_RESIDUAL)
    w_ptr,  # in: weight [n_cols]
    stride_y_row,  # elements between rows of y
    stride_y_col,  # elements between columns of y
    stride_s_row,  # elements between rows of s
    stride_s_col,  # elements between columns of s
    stride_x_row,  # elements between rows of x
    stride_x_col,  # elements between columns of x
    stride_r_row,  # elements between rows of residual
    stride_r_col,  # elements between columns of residual
    stride_w,  # elements between weight entries
    n_cols,  # row width (hidden size)
    eps,  # added to mean(x**2) before the rsqrt
    offset,  # Gemma: weight is applied as (offset + weight); ignored unless GEMMA
    HAS_RESIDUAL: tl.constexpr,  # normalise s = x + residual and write s
    GEMMA: tl.constexpr,  # fp32 (offset + weight) multiply, one rounding at the end; else HF Llama rounding
    BLOCK_SIZE: tl.constexpr,  # chunk of the row processed per loop step
):
    """One program per row, two passes over column chunks: sum of squares, then normalise and store."""
    eps = tl.cast(eps, tl.float32)  # see 'Float arguments' above
    offset = tl.cast(offset, tl.float32)
    row = tl.program_id(0)
    x_row = x_ptr + row_start(row, stride_x_row)
    r_row = r_ptr + row_start(row, stride_r_row)
    s_row = s_ptr + row_start(row, stride_s_row)
    y_row = y_ptr + row_start(row, stride_y_row)
    sum_sq = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(r_row + cols * stride_r_col, mask=mask, other=0.0)
            s = (x + r.to(tl.float32)).to(s_ptr.dtype.element_ty)
            tl.store(s_row + cols * stride_s_col, s, mask=mask)
            x = s.to(tl.float32)
        sum_sq += x * x
    rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / n_cols + eps)
    if HAS_RESIDUAL:
        tl.debug_barrier()  # the second pass reads back s, written above by other threads of this program
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        if HAS_RESIDUAL:
            x = tl.load(s_row + cols * stride_s_col, mask=mask, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
        x_hat = x * rstd
        if GEMMA:
            y = x_hat * (offset + w)
        else:
            y = x_hat.to(x_ptr.dtype.element_ty).to(tl.float32) * w
        tl.store(y_row + cols * stride_y_col, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows", "n_programs"])
def _rms_norm_bwd_kernel(
    dx_ptr,  # out: gradient of x (and of residual) [n_rows, n_cols], x dtype
    dw_partial_ptr,  # out: fp32 dweight partial sums [n_programs, n_cols], contiguous, one row per program
    dy_ptr,  # in: gradient of y [n_rows, n_cols], output dtype
    ds_ptr,  # in: gradient of the new residual s [n_rows, n_cols] (read only when HAS_RESIDUAL)
    x_ptr,  # in: the normalised input: x, or s = x + residual when HAS_RESIDUAL [n_rows, n_cols]
    w_ptr,  # in: weight [n_cols]
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
    offset,  # as in the forward (GEMMA only)
    HAS_RESIDUAL: tl.constexpr,  # add ds to dx (the new residual's gradient flows straight through)
    GEMMA: tl.constexpr,  # weight applied as (offset + weight) in fp32; else HF Llama rounding
    BLOCK_SIZE: tl.constexpr,  # power of two >= n_cols
    ROWS_PER_ITER: tl.constexpr = 1,  # rows per loop step (power of two): 1 = a 1-D row, else a 2-D block
    NUM_STAGES: tl.constexpr = None,  # software-pipelining stages of the row loop; None = no hint (Triton's default)
):
    """Each program loops over its rows, writes dx per row and keeps a dweight partial sum in registers.

    ``ROWS_PER_ITER == 1``: program p handles rows p, p + n_programs, ... one [BLOCK_SIZE] row per step.
    ``ROWS_PER_ITER == R > 1``: program p handles the row blocks p, p + n_programs, ... of R consecutive rows,
    one [R, BLOCK_SIZE] block per step (reductions along axis 1, dweight summed over axis 0): R rows of loads in
    flight per program and one pair of block reductions (shared memory + barriers) per R rows. Rows past
    ``n_rows`` are masked: x = dy = 0 there, so they add nothing to dweight.
    """
    eps = tl.cast(eps, tl.float32)  # see 'Float arguments' above
    offset = tl.cast(offset, tl.float32)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = offset + w
    dw_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    if ROWS_PER_ITER == 1:
        for row in tl.range(pid, n_rows, n_programs, num_stages=NUM_STAGES):
            x = load_f32(x_ptr, row, stride_x_row, cols, stride_x_col, mask)
            dy = load_f32(dy_ptr, row, stride_dy_row, cols, stride_dy_col, mask)
            rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
            x_hat = x * rstd
            g = dy * w
            dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / n_cols))
            if HAS_RESIDUAL:
                dx += load_f32(ds_ptr, row, stride_ds_row, cols, stride_ds_col, mask)
            store_rows(dx_ptr, row, stride_dx_row, cols, stride_dx_col, dx, mask)
            if GEMMA:
                dw_acc += dy * x_hat
            else:
                dw_acc += dy * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        row_offs = tl.arange(0, ROWS_PER_ITER)
        cols_2d = cols[None, :]  # [1, BLOCK_SIZE]
        w_2d = w[None, :]
        for first in tl.range(pid * ROWS_PER_ITER, n_rows, n_programs * ROWS_PER_ITER, num_stages=NUM_STAGES):
            rows = first + row_offs  # [ROWS_PER_ITER]
            mask_2d = (rows < n_rows)[:, None] & mask[None, :]  # [ROWS_PER_ITER, BLOCK_SIZE]
            x = load_f32(x_ptr, rows[:, None], stride_x_row, cols_2d, stride_x_col, mask_2d)
            dy = load_f32(dy_ptr, rows[:, None], stride_dy_row, cols_2d, stride_dy_col, mask_2d)
            rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)[:, None]  # [ROWS_PER_ITER, 1]
            x_hat = x * rstd
            g = dy * w_2d
            dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=1) / n_cols)[:, None])
            if HAS_RESIDUAL:
                dx += load_f32(ds_ptr, rows[:, None], stride_ds_row, cols_2d, stride_ds_col, mask_2d)
            store_rows(dx_ptr, rows[:, None], stride_dx_row, cols_2d, stride_dx_col, dx, mask_2d)
            if GEMMA:
                dw_acc += tl.sum(dy * x_hat, axis=0)
            else:
                dw_acc += tl.sum(dy * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32), axis=0)
    tl.store(dw_partial_ptr + row_start(pid, n_cols) + cols, dw_acc, mask=mask)


@triton.jit(do_not_specialize=["n_rows", "n_programs"])
def _rms_norm_bwd_looped_kernel(
    dx_ptr,  # out: gradient of x (and of residual) [n_rows, n_cols], x dtype
    dw_partial_ptr,  # out: fp32 dweight partial sums [n_programs, n_cols], contiguous, one row per program
    stats_ptr,  # scratch: fp32 per-row (rstd, c) [2, n_rows], contiguous; written and read by the row's program
    dy_ptr,  # in: gradient of y [n_rows, n_cols], output dtype
    ds_ptr,  # in: gradient of the new residual s [n_rows, n_cols] (read only when HAS_RESIDUAL)
    x_ptr,  # in: the normalised input: x, or s = x + residual when HAS_RESIDUAL [n_rows, n_cols]
    w_ptr,  # in: weight [n_cols]
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
    offset,  # as in the forward (GEMMA only)
    HAS_RESIDUAL: tl.constexpr,  # add ds to dx
    GEMMA: tl.constexpr,  # weight applied as (offset + weight) in fp32; else HF Llama rounding
    BLOCK_SIZE: tl.constexpr,  # chunk of the row processed per loop step
):
    """Rows too wide for registers. Pass A, per row of this program: sum(x**2) and sum(g * x) over chunks, kept
    as (rstd, c = mean(g * x_hat)) in ``stats``. Pass B, per column chunk: loop over this program's rows, write dx
    and accumulate the dweight chunk in registers, store it once (no partial-sum read-modify-write)."""
    eps = tl.cast(eps, tl.float32)  # see 'Float arguments' above
    offset = tl.cast(offset, tl.float32)
    pid = tl.program_id(0)
    for row in tl.range(pid, n_rows, n_programs):
        x_row = x_ptr + row_start(row, stride_x_row)
        dy_row = dy_ptr + row_start(row, stride_dy_row)
        sum_sq = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        sum_gx = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            mask = cols < n_cols
            x = tl.load(x_row + cols * stride_x_col, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
            if GEMMA:
                w = offset + w
            sum_sq += x * x
            sum_gx += dy * w * x
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / n_cols + eps)
        tl.store(stats_ptr + row, rstd)
        tl.store(stats_ptr + n_rows + row, rstd * tl.sum(sum_gx, axis=0) / n_cols)  # mean(g * x_hat)
    tl.debug_barrier()  # pass B reads the row statistics stored above by other threads of this program
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
        if GEMMA:
            w = offset + w
        dw_acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
        for row in tl.range(pid, n_rows, n_programs):
            rstd = tl.load(stats_ptr + row)
            c = tl.load(stats_ptr + n_rows + row)
            x = load_f32(x_ptr, row, stride_x_row, cols, stride_x_col, mask)
            dy = load_f32(dy_ptr, row, stride_dy_row, cols, stride_dy_col, mask)
            x_hat = x * rstd
            dx = rstd * (dy * w - x_hat * c)
            if HAS_RESIDUAL:
                dx += load_f32(ds_ptr, row, stride_ds_row, cols, stride_ds_col, mask)
            store_rows(dx_ptr, row, stride_dx_row, cols, stride_dx_col, dx, mask)
            if GEMMA:
                dw_acc += dy * x_hat
            else:
                dw_acc += dy * x_hat.to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(dw_partial_ptr + row_start(pid, n_cols) + cols, dw_acc, mask=mask)


# --- launchers ----------------------------------------------------------------------------------------------


def _check_rms_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension [..., hidden]; got a 0-d tensor")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must be 1-D of size x.shape[-1]={x.shape[-1]}; got shape {tuple(weight.shape)}")
    check_tensor("x", x)
    check_tensor("weight", weight, x.device)


def rms_out_dtype(x_dtype: torch.dtype, w_dtype: torch.dtype, offset: float) -> torch.dtype:
    """Output dtype: HF Llama returns ``promote_types(x, weight)``; the Gemma form (offset != 0) ``x.dtype``."""
    return x_dtype if offset != 0.0 else torch.promote_types(x_dtype, w_dtype)


def rms_norm_fwd_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    residual: torch.Tensor | None = None,
    config: RowConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch the forward on ``x`` [n_rows, n_cols] (2-D, any strides, non-empty); returns ``(y, s)``.

    ``y`` [n_rows, n_cols] is contiguous in :func:`rms_out_dtype`; ``s = x + residual`` (x dtype) when
    ``residual`` is given, else None. ``config`` overrides the heuristic (tests force the looped kernel).
    """
    n_rows, n_cols = x.shape
    cfg = config or RowConfig.forward(n_cols)
    y = torch.empty((n_rows, n_cols), dtype=rms_out_dtype(x.dtype, weight.dtype, offset), device=x.device)
    s = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device) if residual is not None else None
    r = residual if residual is not None else x  # placeholder pointer, never read when HAS_RESIDUAL is False
    s_arg = s if s is not None else y  # placeholder pointer, never written when HAS_RESIDUAL is False
    kernel = _rms_norm_fwd_looped_kernel if cfg.looped else _rms_norm_fwd_kernel
    launcher(kernel)[(n_rows,)](
        y,
        s_arg,
        x,
        r,
        weight,
        y.stride(0),
        y.stride(1),
        s_arg.stride(0),
        s_arg.stride(1),
        x.stride(0),
        x.stride(1),
        r.stride(0),
        r.stride(1),
        weight.stride(0),
        n_cols,
        eps,
        offset,
        HAS_RESIDUAL=residual is not None,
        GEMMA=offset != 0.0,
        BLOCK_SIZE=cfg.block_size,
        num_warps=cfg.num_warps,
    )
    return y, s


@dataclass(frozen=True)
class BwdTuning:
    """Measured overrides of a fused norm backward's launch (the looped backward ignores them), one per kernel.

    Each norm module holds its own as a module-level constant (``rmsnorm.BWD_TUNING``, ``add_rmsnorm.BWD_TUNING``,
    ``layernorm.BWD_TUNING`` / ``ADD_BWD_TUNING``), read at every launch: flipping a measured best is one line, and
    ``benchmarks/kernels/sweep_tiles.py --only <kernel>_bwd`` prints that line. Per call, the launchers' ``config``
    argument overrides everything.

    Attributes:
        num_stages: ``tl.range(num_stages=)`` of the row loop; None = no hint.
        rows_per_iter: rows per loop step (power of two), see :class:`RowConfig`.
        programs_per_sm: programs per SM of the backward grid; None = :data:`BWD_PROGRAMS_PER_SM`.
        num_warps: warps per program; None = the ``BWD_WARPS`` table's.
    """

    num_stages: int | None = None
    rows_per_iter: int = 1
    programs_per_sm: int | None = None
    num_warps: int | None = None

    def apply(self, cfg: RowConfig) -> RowConfig:
        """``cfg`` with these overrides, or ``cfg`` unchanged when it is looped (rows wider than a block)."""
        return _tuned(self, cfg)


@functools.lru_cache(maxsize=4096)  # both frozen: the tuned config of a width is built once (host time per call)
def _tuned(tuning: BwdTuning, cfg: RowConfig) -> RowConfig:
    if cfg.looped:
        return cfg
    return dataclasses.replace(
        cfg,
        num_stages=tuning.num_stages,
        rows_per_iter=tuning.rows_per_iter,
        programs_per_sm=tuning.programs_per_sm,
        num_warps=tuning.num_warps if tuning.num_warps is not None else cfg.num_warps,
    )


#: The plain RMSNorm backward's tuning: the row loop's :data:`BWD_NUM_STAGES` (H200 sweep, see there).
BWD_TUNING = BwdTuning(num_stages=BWD_NUM_STAGES)


def default_bwd_config(n_cols: int, residual: bool = False, tuning: BwdTuning | None = None) -> RowConfig:
    """The backward's launch configuration for rows of ``n_cols``: :meth:`RowConfig.backward` with ``tuning``
    applied (default: :data:`BWD_TUNING` for the plain backward; for ``residual``, ``add_rmsnorm.BWD_TUNING``,
    passed by that module; no overrides when ``residual`` and no ``tuning`` is given)."""
    if tuning is None:
        tuning = BwdTuning() if residual else BWD_TUNING
    return tuning.apply(RowConfig.backward(n_cols))


def rms_norm_bwd_launch(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    offset: float,
    ds: torch.Tensor | None = None,
    config: RowConfig | None = None,
    tuning: BwdTuning | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward on 2-D ``dy``, ``x`` (and ``ds``) [n_rows, n_cols], non-empty; returns ``(dx, dw)``.

    ``dx`` [n_rows, n_cols] contiguous in x's dtype (plus ``ds`` when given); ``dw`` [n_cols] in weight's dtype.
    ``config`` overrides the heuristic: block size, warps, looped, and for the fused kernel rows per loop step,
    the row loop's num_stages and programs per SM (see :class:`RowConfig`). Without it, ``tuning`` (see
    :func:`default_bwd_config`) adjusts the heuristic's fused launch.
    """
    n_rows, n_cols = x.shape
    cfg = config or default_bwd_config(n_cols, residual=ds is not None, tuning=tuning)
    rows_per_iter = 1 if cfg.looped else cfg.rows_per_iter
    n_programs = bwd_programs(n_rows, x.device, rows_per_iter, cfg.programs_per_sm)
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    # every program writes its whole partial row (zeros if it had no rows), so no zero-fill is needed
    dw_partial = torch.empty((n_programs, n_cols), dtype=torch.float32, device=x.device)
    ds_arg = ds if ds is not None else dy  # placeholder pointer, never read when HAS_RESIDUAL is False
    ptrs = [dx, dw_partial, dy, ds_arg, x, weight]
    fused_only = {}
    if cfg.looped:  # per-row (rstd, mean(g * x_hat)) scratch between the looped kernel's two passes
        ptrs.insert(2, torch.empty((2, n_rows), dtype=torch.float32, device=x.device))
    else:  # every constexpr passed, defaults included: torch.compile's wrap_triton needs the full argument list
        fused_only = {"ROWS_PER_ITER": rows_per_iter, "NUM_STAGES": cfg.num_stages}
    kernel = _rms_norm_bwd_looped_kernel if cfg.looped else _rms_norm_bwd_kernel
    launcher(kernel)[(n_programs,)](
        *ptrs,
        *dx.stride(),  # every operand is 2-D [n_rows, n_cols]: (row stride, column stride)
        *dy.stride(),
        *ds_arg.stride(),
        *x.stride(),
        weight.stride(0),
        n_rows,
        n_cols,
        n_programs,
        eps,
        offset,
        HAS_RESIDUAL=ds is not None,
        GEMMA=offset != 0.0,
        BLOCK_SIZE=cfg.block_size,
        **fused_only,
        num_warps=cfg.num_warps,
    )
    return dx, sum_partials([(dw_partial, weight.dtype)])[0]


# --- torch.library ops --------------------------------------------------------------------------------------


@library_op("fusion_advisor::rms_norm", mutates_args={})
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    _check_rms_inputs(x, weight)
    n_cols = x.shape[-1]
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=rms_out_dtype(x.dtype, weight.dtype, offset), device=x.device)
    y, _ = rms_norm_fwd_launch(as_rows(x, n_cols), weight, eps, offset)
    return y.view(x.shape)


@library_op("fusion_advisor::rms_norm_backward", mutates_args={})
def _rms_norm_backward_op(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    n_cols = x.shape[-1]
    if x.numel() == 0:
        return torch.empty_like(x, memory_format=torch.contiguous_format), torch.zeros_like(weight)
    dx, dw = rms_norm_bwd_launch(as_rows(dy, n_cols), as_rows(x, n_cols), weight, eps, offset)
    return dx.view(x.shape), dw


def _rms_norm_setup_context(ctx, inputs, output) -> None:
    x, weight, eps, offset = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.offset = offset


def _rms_norm_backward(ctx, dy: torch.Tensor):
    x, weight = ctx.saved_tensors
    dx, dw = _rms_norm_backward_op(dy, x, weight, ctx.eps, ctx.offset)
    return dx, dw, None, None


_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup_context)


# --- public function ----------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0) -> torch.Tensor:
    """RMSNorm over the last dim, Hugging Face semantics, differentiable in ``x`` and ``weight``.

    Args:
        x: [..., n_cols], fp32/fp16/bf16, any strides.
        weight: [n_cols], fp32/fp16/bf16.
        eps: added to ``mean(x**2)`` before the rsqrt.
        offset: 0 for transformers' ``LlamaRMSNorm`` (``weight * (x * rstd).to(x.dtype)``, output dtype
            ``promote_types(x, weight)``); nonzero (1.0 for Gemma) for ``GemmaRMSNorm``
            (``(x * rstd * (offset + weight.float())).to(x.dtype)``).

    Returns:
        y [..., n_cols], contiguous.

    Raises:
        ValueError: ``x`` is 0-d, ``weight`` is not [x.shape[-1]], or the tensors sit on different or
            unsupported devices.
        TypeError: a dtype other than fp32, fp16, bf16.
    """
    return _rms_norm_op(x, weight, float(eps), float(offset))


# --- contract -----------------------------------------------------------------------------------------------

kernel_fn = rms_norm


def reference_fn(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0) -> torch.Tensor:
    """Plain PyTorch, written as transformers' ``LlamaRMSNorm`` / ``GemmaRMSNorm`` forwards.

    The one change: HF upcasts to fp32; this upcasts to ``promote_types(x.dtype, float32)``, which is fp32 for
    every dtype the kernel takes and keeps float64 inputs in float64 (the tests' high-precision reference).
    """
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    input_dtype = x.dtype
    hidden_states = x.to(compute_dtype)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    if offset != 0.0:
        return (hidden_states * (offset + weight.to(compute_dtype))).to(input_dtype)
    return weight * hidden_states.to(input_dtype)


def make_inputs(
    n_rows: int,
    n_cols: int,
    dtype: torch.dtype = torch.bfloat16,
    eps: float = 1e-6,
    offset: float = 0.0,
    requires_grad: bool = True,
    device: torch.device | str | None = None,
    seed: int = 0,
) -> list:
    """``[x [n_rows, n_cols], weight [n_cols], eps, offset]`` on ``device`` (default: the kernels' device).

    x ~ N(0, 1); weight ~ 1 + N(0, 0.1) (Llama) or N(0, 0.1) (Gemma stores weight - 1), both in ``dtype``.
    """
    device = torch.device(device) if device is not None else default_device()
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((n_rows, n_cols), generator=gen, device=device).to(dtype)
    weight = 0.1 * torch.randn((n_cols,), generator=gen, device=device)
    weight = (weight if offset != 0.0 else 1.0 + weight).to(dtype)
    return [x.requires_grad_(requires_grad), weight.requires_grad_(requires_grad), eps, offset]


#: ``get_inputs(size)`` sizes, ``(n_rows, n_cols)``: ``verify`` derives its edge shapes (one row, a partial last
#: block, odd widths, many rows) from the first (``fusion_advisor/verification/inputs.py``).
SIZES = [(8192, 4096)] if on_gpu() else [(16, 1000)]


def get_inputs(size: tuple[int, int] | None = None) -> list:
    """``size`` = ``(n_rows, n_cols)``, default ``SIZES[0]``: Llama-7B shapes on a GPU (8192 tokens x 4096
    hidden), 16 x 1000 on the CPU interpreter; bf16; drawn from the seed ``verify`` set (``torch.initial_seed()``)."""
    n_rows, n_cols = size or SIZES[0]
    return make_inputs(n_rows, n_cols, torch.bfloat16, seed=torch.initial_seed())


def hard_inputs() -> list:
    """The hard values of a norm (``verify`` runs them): rows of large magnitude (x 1e4: a sum of squares that must
    be accumulated in fp32) and all-zero rows (``rstd = 1 / sqrt(eps)``)."""
    x, weight, eps, offset = get_inputs()
    large = (x.detach() * 1e4).requires_grad_(True)
    zeros = x.detach().clone()
    zeros[::3] = 0.0
    return [("rows x 1e4", [large, weight, eps, offset]), ("all-zero rows", [zeros.requires_grad_(True), weight, eps,
                                                                            offset])]


#: GPU benchmark shapes: the Llama-7B shape (8192 x 4096, benchmarks/results/h200/kernels/kernels_7b.md) in three
#: dtypes, a token sweep (decode to long prefill), a width sweep (Llama-1B 2048 .. Llama-405B 16384 hidden) and one row
#: wide enough for the looped path.
BENCH_SHAPES: list[dict] = [
    {"n_rows": 8192, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 4096, "dtype": torch.float16},
    {"n_rows": 8192, "n_cols": 4096, "dtype": torch.float32},
    {"n_rows": 1, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 32, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 512, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 2048, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 32768, "n_cols": 4096, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 2048, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 5120, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 8192, "dtype": torch.bfloat16},
    {"n_rows": 4096, "n_cols": 16384, "dtype": torch.bfloat16},
    {"n_rows": 256, "n_cols": 131072, "dtype": torch.bfloat16},
]


def bytes_moved(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0) -> int:
    """Fewest bytes the forward moves: read x and weight once, write y once."""
    out_size = torch.empty((), dtype=rms_out_dtype(x.dtype, weight.dtype, offset)).element_size()
    return x.numel() * (x.element_size() + out_size) + weight.numel() * weight.element_size()


def bytes_moved_backward(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0) -> int:
    """Fewest bytes the backward moves: read dy, x and weight, write dx and dweight (partial sums excluded)."""
    out_size = torch.empty((), dtype=rms_out_dtype(x.dtype, weight.dtype, offset)).element_size()
    return x.numel() * (out_size + 2 * x.element_size()) + 2 * weight.numel() * weight.element_size()


def _hf_llama_rmsnorm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The subgraph replaced: transformers' ``LlamaRMSNorm.forward`` with the module's weight and eps as inputs."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def _hf_llama_rmsnorm_replacement(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return kernel_fn(hidden_states, weight, eps)


ENTRY = register_kernel(KernelEntry(
    name="rmsnorm", module=__name__, op="fusion_advisor::rms_norm", has_backward=True,
    description="RMSNorm over the last dim, fwd+bwd; matches transformers LlamaRMSNorm (offset=0) and "
                "GemmaRMSNorm (offset=1)",
    pattern=_hf_llama_rmsnorm, replacement=_hf_llama_rmsnorm_replacement, example_args=((2, 3, 16), (16,), "scalar")))
