"""The row layout of the row-wise kernels, and the norms' launch heuristics.

Row layout: ``[..., n_cols]`` tensors as 2-D ``[n_rows, n_cols]`` views with any strides (:func:`as_rows` for the
norms, :func:`rows_view` for the element-wise kernels), row offsets in int64 (:func:`row_start`). Launch heuristics
of the norm kernels (rmsnorm, add_rmsnorm, layernorm, add_layernorm): :class:`RowConfig` from the row width, the
persistent backward grid (:func:`bwd_programs`), and the one kernel that sums the backward's fp32 partial
parameter gradients (:func:`sum_partials`). Each constant carries the measurement behind it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernel_library._device import interpreted
from kernel_library._op import launcher

# --- constants ----------------------------------------------------------------------------------------------

#: Widest row the forward keeps in registers in one block. Measured with ptxas for sm_90 (triton 3.9, bf16):
#: a 32768-wide block at 32 warps uses 64 registers and no stack; a 65536-wide one spills (256 bytes of stack
#: per thread), so rows wider than 32768 take the looped two-pass kernel.
MAX_FUSED_BLOCK_FWD = 32768

#: Widest row the backward keeps in registers. The backward holds x, dy, the weight and the dweight accumulator
#: (LayerNorm: also dbias) per element. Measured with ptxas for sm_90: 8192 at 16 warps uses 100 registers
#: (LayerNorm 128) and no stack; 16384 spills at 16 and at 32 warps, so wider rows take the looped backward.
MAX_FUSED_BLOCK_BWD = 8192

#: Chunk (elements) of the looped kernels for rows wider than the fused limits. With the warp tables below
#: (8 warps forward, 16 backward) ptxas reports 57-78 (forward) and 70-127 (backward) registers, no stack.
LOOP_BLOCK = 8192

#: Warps per program by block size, as ``(max_block_size, num_warps)`` steps. Forward: about 16 elements per
#: thread (4096 -> 8 warps: 32 registers, full occupancy). Backward: the same elements per thread up to 4096
#: (8 warps: ~100 registers, LayerNorm 128, i.e. 2 programs per SM) then 16 warps at 8192 to stay unspilled.
FWD_WARPS = ((2048, 4), (8192, 8), (16384, 16))
BWD_WARPS = ((2048, 4), (4096, 8), (8192, 16))
MAX_WARPS = 32

#: Backward programs per SM. Each program loops over rows and keeps its own fp32 dweight partial row. One
#: program of 8 warps per SM (Liger's choice) leaves an SM at 8 resident warps, too few to hide load latency;
#: the 4096-wide backward uses ~100-128 registers per thread at 8 warps, so two programs fit an SM's register
#: file. Cost: the partial-sum buffer, n_programs * n_cols * 4 bytes written and read once (264 x 4096 on an
#: H200: 8.7 MB against the backward's 201 MB at 8192 x 4096 bf16, ~4%). Tune on the GPU (1, 2, 4).
BWD_PROGRAMS_PER_SM = 2

#: Tile of the parameter-gradient finalisation (:func:`sum_partials`): BLOCK_N columns per program, BLOCK_M partial
#: rows per loop step. 4096 columns are 128 programs; 264 partial rows (2 per SM on an H200) are 5 steps of 8 KB
#: per buffer. It replaced ``partial.sum(0).to(dtype)`` per buffer (an aten reduction plus a cast kernel: 4.5 +
#: 1 us each on the H200 at 4096 columns, 11 us of LayerNorm's 103 us fwd+bwd).
FINAL_BLOCK_M = 64
FINAL_BLOCK_N = 32

#: "SM count" used under the CPU interpreter, where programs run one after another: small, so tests stay fast,
#: but more than one so that the per-program row loop and the cross-program dweight reduction are exercised.
CPU_SM_COUNT = 4

#: Column offsets (``col * stride_col``) are int32 in the kernels; a view whose column span reaches this many
#: elements is copied to a contiguous layout first (only a transposed view of > 2**31 elements can do that).
INT32_SPAN_LIMIT = 2**31


# --- kernels ------------------------------------------------------------------------------------------------


@triton.jit
def row_start(row, stride):
    """Element offset of the first element of ``row``: int64 before the multiply, so it cannot wrap past 2**31."""
    return tl.cast(row, tl.int64) * stride


@triton.jit
def load_f32(ptr, row, stride_row, cols, stride_col, mask):
    """``ptr[row, cols]`` in fp32, 0 where ``mask`` is off: one row (``row`` a scalar, ``cols`` [BLOCK]) or a block
    of rows (``row`` [R, 1], ``cols`` [1, BLOCK]); strides in elements."""
    return tl.load(ptr + row_start(row, stride_row) + cols * stride_col, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_rows(ptr, row, stride_row, cols, stride_col, value, mask):
    """``ptr[row, cols] = value`` rounded to ``ptr``'s dtype where ``mask`` is on (shapes as in :func:`load_f32`)."""
    tl.store(ptr + row_start(row, stride_row) + cols * stride_col, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_residual(x, r_ptr, s_ptr, row, stride_r_row, stride_r_col, stride_s_row, stride_s_col, cols, mask):
    """The residual add of a pre-norm block: ``s = x + residual`` rounded to ``s``'s dtype (HF adds in the input
    dtype), stored to ``s_ptr[row, cols]``; returns ``s`` in fp32, the row the norm then normalises."""
    r = tl.load(r_ptr + row_start(row, stride_r_row) + cols * stride_r_col, mask=mask, other=0.0)
    s = (x + r.to(tl.float32)).to(s_ptr.dtype.element_ty)
    tl.store(s_ptr + row_start(row, stride_s_row) + cols * stride_s_col, s, mask=mask)
    return s.to(tl.float32)


@triton.jit(do_not_specialize=["n_parts"])
def _sum_partials_kernel(
    a_ptr,  # in: fp32 partial sums [n_parts, n_cols], contiguous
    a_out_ptr,  # out: their column sums [n_cols], in the pointer's dtype
    b_ptr,  # in: a second partial-sum buffer like a (HAS_B only)
    b_out_ptr,  # out: its column sums (HAS_B only)
    n_parts,  # partial rows (backward programs)
    n_cols,  # columns
    HAS_B: tl.constexpr,  # sum the second buffer too (LayerNorm's dbias beside dweight)
    BLOCK_M: tl.constexpr,  # partial rows per loop step
    BLOCK_N: tl.constexpr,  # columns per program
):
    """Column sums of one or two fp32 partial-sum buffers, accumulated in fp32 in a fixed order (deterministic),
    cast once to the output dtype: ``a.sum(0).to(a_out.dtype)`` in one launch."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, n_parts, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < n_parts) & col_mask[None, :]
        offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        acc_a += tl.load(a_ptr + offs, mask=mask, other=0.0)
        if HAS_B:
            acc_b += tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(a_out_ptr + cols, tl.sum(acc_a, axis=0).to(a_out_ptr.dtype.element_ty), mask=col_mask)
    if HAS_B:
        tl.store(b_out_ptr + cols, tl.sum(acc_b, axis=0).to(b_out_ptr.dtype.element_ty), mask=col_mask)


# --- launch helpers -----------------------------------------------------------------------------------------


def sum_partials(parts: list[tuple[torch.Tensor, torch.dtype]]) -> list[torch.Tensor]:
    """Column sums of one or two of the backward's fp32 partial-sum buffers, ``[(partial, dtype), ...]`` with each
    partial [n_parts, n_cols] contiguous: ``[partial.sum(0).to(dtype), ...]`` (each [n_cols]) in one launch of
    :data:`FINAL_BLOCK_N`-column programs. The norm backwards' parameter gradients.

    Raises:
        ValueError: not one or two buffers, or buffers of different shapes.
    """
    if not 1 <= len(parts) <= 2 or len({p.shape for p, _ in parts}) != 1:
        shapes = [tuple(p.shape) for p, _ in parts]
        raise ValueError(f"sum_partials takes one or two partial buffers of one shape; got {shapes}")
    n_parts, n_cols = parts[0][0].shape
    # Triton's CPU interpreter narrows fp32 to bf16/fp16 by truncation (its fp_trunc ignores the round-to-nearest-even
    # the GPU uses), which doubles a bf16 dweight's error against the reference; there the kernel writes fp32 and
    # torch rounds, as the GPU would.
    round_in_torch = interpreted()
    outs = [torch.empty(n_cols, dtype=torch.float32 if round_in_torch else dtype, device=p.device)
            for p, dtype in parts]
    (a, _), (b, _) = parts[0], parts[-1]
    launcher(_sum_partials_kernel)[(triton.cdiv(n_cols, FINAL_BLOCK_N),)](
        a, outs[0], b, outs[-1], n_parts, n_cols,
        HAS_B=len(parts) == 2, BLOCK_M=FINAL_BLOCK_M, BLOCK_N=FINAL_BLOCK_N, num_warps=4,
    )
    return [out.to(dtype) for out, (_, dtype) in zip(outs, parts)] if round_in_torch else outs


def _warps_for(block_size: int, table: tuple[tuple[int, int], ...]) -> int:
    """Warps for ``block_size`` from a ``(max_block_size, num_warps)`` step table; ``MAX_WARPS`` beyond it."""
    for max_block, warps in table:
        if block_size <= max_block:
            return warps
    return MAX_WARPS


@dataclass(frozen=True)
class RowConfig:
    """Launch configuration of a row-wise norm kernel, built from the row width.

    Attributes:
        block_size: elements per ``tl.arange``: the whole row (``looped=False``) or one chunk of it.
        num_warps: warps per program.
        looped: whether the row is processed in chunks by the looped kernel.
        rows_per_iter: backward only (fused, not looped): rows each program processes per loop step, as one
            [rows_per_iter, block_size] block; a power of two. 1 (the default) is the one-row loop.
        num_stages: backward only (fused): ``tl.range(num_stages=)`` of the row loop; None leaves the loop
            without a hint (Triton's default).
        programs_per_sm: backward only: programs per SM of the persistent grid; None = ``BWD_PROGRAMS_PER_SM``.

    The looped backward (rows wider than ``MAX_FUSED_BLOCK_BWD``) ignores the last three.

    Raises:
        ValueError: ``rows_per_iter`` is not a power of two >= 1, ``num_stages`` or ``programs_per_sm`` < 1.
    """

    block_size: int
    num_warps: int
    looped: bool
    rows_per_iter: int = 1
    num_stages: int | None = None
    programs_per_sm: int | None = None

    def __post_init__(self) -> None:
        if self.rows_per_iter < 1 or self.rows_per_iter & (self.rows_per_iter - 1):
            raise ValueError(f"rows_per_iter must be a power of two >= 1; got {self.rows_per_iter}")
        if self.num_stages is not None and self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1 or None; got {self.num_stages}")
        if self.programs_per_sm is not None and self.programs_per_sm < 1:
            raise ValueError(f"programs_per_sm must be >= 1 or None; got {self.programs_per_sm}")

    @classmethod
    @functools.lru_cache(maxsize=4096)
    def _build(cls, n_cols: int, max_fused_block: int, table: tuple[tuple[int, int], ...]) -> "RowConfig":
        # cached per width (the config is frozen): every eager call asks for it, and building it costs host time
        # comparable to the rest of the launcher's Python
        block = triton.next_power_of_2(max(n_cols, 1))
        if block <= max_fused_block:
            return cls(block_size=block, num_warps=_warps_for(block, table), looped=False)
        # a max_fused_block below LOOP_BLOCK (tests) gives chunks of that size, to reach the looped kernels
        chunk = min(LOOP_BLOCK, triton.next_power_of_2(max_fused_block))
        return cls(block_size=chunk, num_warps=_warps_for(chunk, table), looped=True)

    @classmethod
    def forward(cls, n_cols: int, max_fused_block: int = MAX_FUSED_BLOCK_FWD) -> "RowConfig":
        """Forward kernels: one block per row up to ``max_fused_block`` columns, chunks beyond."""
        return cls._build(int(n_cols), max_fused_block, FWD_WARPS)  # a SymInt width: specialised (constexpr)

    @classmethod
    def backward(cls, n_cols: int, max_fused_block: int = MAX_FUSED_BLOCK_BWD) -> "RowConfig":
        """Backward kernels: one block per row up to ``max_fused_block`` columns, chunks beyond."""
        return cls._build(int(n_cols), max_fused_block, BWD_WARPS)  # a SymInt width: specialised (constexpr)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SM_COUNT


def bwd_programs(
    n_rows: int, device: torch.device, rows_per_iter: int = 1, programs_per_sm: int | None = None
) -> int:
    """Programs of a backward grid: ``programs_per_sm`` (default ``BWD_PROGRAMS_PER_SM``) per SM, never more
    than there are blocks of ``rows_per_iter`` rows."""
    per_sm = BWD_PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
    return max(1, min(-(-n_rows // rows_per_iter), _sm_count(device) * per_sm))  # ceil without triton.cdiv's wrapper


def as_rows(t: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``t`` [..., n_cols] as a 2-D [n_rows, n_cols] view with any strides.

    ``reshape`` returns a view whenever the leading dims collapse into one row stride (all contiguous tensors,
    row/column slices, 2-D transposes, expanded gradients); otherwise it copies. A view whose column offsets
    would pass 2**31 elements (int32 in the kernels) is copied to a contiguous layout.
    """
    t2 = t.reshape(-1, n_cols)
    if t2.stride(1) != 1 and (n_cols - 1) * t2.stride(1) >= INT32_SPAN_LIMIT:
        t2 = t2.contiguous()
    return t2


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` [..., n_cols] as [n_rows, n_cols]: a view when the leading dims collapse (contiguous tensors, column
    slices ``x[:, 3:]``, transposed 2-D tensors), else a copy (e.g. a 3-D tensor with permuted leading dims)."""
    # reshape is a view wherever one exists; a try of view() instead would need to catch RuntimeError on real tensors
    # but ValueError on fake ones (Inductor's trace of a permuted input raised it past such a try)
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])
