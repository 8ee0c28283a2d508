"""Softmax over the last dimension, with optional scale, additive or boolean mask and causal mask.

Forward ``y = softmax(scale * x + mask)`` and backward ``dx = scale * y * (dy - sum(dy * y) / sum(y))`` as Triton
kernels, one row per program. Rows up to :data:`MAX_SINGLE_BLOCK` elements are held in registers (one read, one write);
wider rows use the online softmax of Milakov & Gimelshein 2018 ("Online normalizer calculation for softmax",
arXiv:1805.02867): a first pass keeps a running max and a running sum rescaled whenever the max grows, a second
pass writes the normalised values (two reads, one write).

Semantics (``reference_fn`` implements exactly these):

- ``x`` has any rank >= 1; softmax runs over ``x.shape[-1]``, in fp32, and ``y`` has ``x``'s dtype and shape.
- ``mask`` broadcasts to ``x`` (never the reverse). A float mask is *added* after scaling (HF's
  ``attn_weights * scaling + causal_mask``); a bool mask *keeps* positions where it is True (the others become
  ``-inf``), like ``scaled_dot_product_attention``'s boolean ``attn_mask``.
- ``causal=True`` masks column ``j`` of a row whose query position is ``q`` when ``j > q``; ``q = row % q_len`` with
  ``q_len = x.shape[-2]`` (1 for 1-D ``x``). That is top-left alignment, like ``torch.tril`` and
  ``scaled_dot_product_attention(is_causal=True)``; it differs from bottom-right (KV-cache) alignment when
  ``q_len != k_len``: pass an explicit mask for that case.
- A row whose every score is ``-inf`` (fully masked) gives **zeros** and a zero gradient, where
  ``torch.softmax`` gives NaN. NaN or ``+inf`` scores give a NaN row, like ``torch.softmax``.
- ``x`` (and the mask broadcast to it) of rank > 4 has its leading axes merged by ``reshape``: a view when their
  strides allow, else a copy (HF attention scores are rank 4 and never copied).
- A float mask that requires grad receives ``d(mask) = sum over broadcast axes of y * (dy - sum(dy * y) / sum(y))``;
  ``scale`` is a Python float and gets no gradient.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library._op import direct_call, launcher, library_op
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ----------------------------------------------------------------------------------------------

#: Widest row (power-of-two block) the forward holds in registers as one block. Measured on H200 2026-11-29,
#: benchmarks/results/h200/kernels/sweep_rows.json (forward, bf16, 8192 x 32000, n_cols specialised, per-lane online
#: pass): the single 32768-wide block took 0.349 ms at its best (16 warps; 0.357 / 0.419 ms at 32 / 8), the looped
#: online path below 0.314 ms although it reads the row twice (the second read mostly from L2). Rows wider than 4096
#: therefore loop; rows up to 4096 (not swept) keep one block, at most 16 values per thread (:data:`ELEMS_PER_THREAD`).
MAX_SINGLE_BLOCK = 4096

#: The backward's single-block limit (it keeps y and dy live). Not part of the sweep, which timed the forward: kept
#: at its register-based value (two rows of 16384 fp32 values over 32 warps) until the backward is measured.
MAX_SINGLE_BLOCK_BWD = 16384

#: Chunk width and warps of the looped (online) path. Measured on H200 2026-11-29,
#: benchmarks/results/h200/kernels/sweep_rows.json (forward, bf16, chunks {1024, 2048, 4096, 8192} x {4, 8, 16} warps):
#: 4096 over 16 warps (8 values per thread per chunk) was fastest at 8192 x 32000 (0.314 ms, 79% of copy, 2.31x
#: torch.compile; next 4096 / 8 warps, 0.322 ms) and within 1% of the fastest at 2048 x 128256 (0.397 ms vs 0.393 ms
#: for 8192 / 16 warps, 1.85x). The backward's looped path (rows beyond :data:`MAX_SINGLE_BLOCK_BWD`) uses the same
#: setting, unmeasured.
LOOP_BLOCK = 4096
LOOP_WARPS = 16

#: Target elements per thread when picking num_warps for a single block (16 fp32 registers; the backward's
#: 16384-element blocks get the 32-warp maximum). Matches Liger-Kernel's warps-per-block table within a factor of two.
ELEMS_PER_THREAD = 16

#: Most warps per program Triton/CUDA allow (1024 threads).
MAX_WARPS = 32

#: log2(e): the kernels compute exp(v) as exp2(v * log2(e)), which is what the GPU's ex2 unit evaluates.
LOG2E = tl.constexpr(1.4426950408889634)

#: Mask kinds, passed to the kernel as a constexpr.
MASK_NONE, MASK_ADDITIVE, MASK_BOOL = 0, 1, 2


# --- kernels ------------------------------------------------------------------------------------------------
# Float arguments (scale) are cast to fp32 at kernel entry. Eager Triton passes a Python float as fp32, but Inductor
# types it fp64 when torch.compile compiles these triton_ops: the scores then run in fp64 (slower, rounded unlike
# eager), and the online softmax's loop-carried fp32 max fails to compile once it meets an fp64 score (seen on the
# H200: "Loop-carried variable m has initial type fp32 but is re-assigned to fp64"). ``tl.cast`` rather than
# ``.to``: under TRITON_INTERPRET the argument is a plain Python float, which has no ``.to``; tl.cast also accepts a
# constexpr.


@triton.jit
def _load_scores(x_row, m_row, cols, n_live, x_stride_col, m_stride_col, scale,
                 MASK_KIND: tl.constexpr, EVICT_LAST: tl.constexpr):
    """fp32 scores ``scale * x (+ mask)`` at ``cols`` of one row; ``-inf`` at masked lanes and at ``cols >= n_live``.

    ``EVICT_LAST`` asks L2 to keep x (it is read again); otherwise x is streamed (evict_first).
    """
    live = cols < n_live
    if EVICT_LAST:
        x = tl.load(x_row + cols * x_stride_col, mask=live, other=0.0, eviction_policy="evict_last")
    else:
        x = tl.load(x_row + cols * x_stride_col, mask=live, other=0.0, eviction_policy="evict_first")
    x = x.to(tl.float32)
    z = x * scale
    if MASK_KIND == 1:
        add = tl.load(m_row + cols * m_stride_col, mask=live, other=0.0).to(tl.float32)
        z = z + add
    elif MASK_KIND == 2:
        keep = tl.load(m_row + cols * m_stride_col, mask=live, other=0) != 0
        z = tl.where(keep, z, float("-inf"))
    return tl.where(live, z, float("-inf"))


@triton.jit
def online_lse_update(m_lane, s_lane, z):
    """One chunk of an online log-sum-exp kept per lane (Milakov & Gimelshein 2018): each lane carries a running
    max ``m_lane`` and a running sum ``s_lane`` of exp(z - max), rescaled when its max grows. fp32 [BLOCK] each;
    ``z`` holds -inf at dead lanes. Returns the new ``(m_lane, s_lane)``. No cross-warp reduction: the lanes are
    combined once after the loop by :func:`online_lse_combine`."""
    m_new = tl.maximum(m_lane, z)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane with only -inf so far: no -inf - -inf
    s_lane = s_lane * tl.exp2((m_lane - m_safe) * LOG2E) + tl.exp2((z - m_safe) * LOG2E)
    return m_new, s_lane


@triton.jit
def online_lse_combine(m_lane, s_lane):
    """The row's max ``m`` and sum of exp(z - m) ``s`` from the per-lane state of :func:`online_lse_update`."""
    m = tl.max(m_lane, axis=0)
    m_row_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(s_lane * tl.exp2((m_lane - m_row_safe) * LOG2E), axis=0)
    return m, s


@triton.jit
def _split_row(row, size1, size2):
    """Flat row index -> ``(i0, i1, i2)`` of the 4-D view ``[size0, size1, size2, n_cols]``; all non-negative, so C
    division is safe."""
    i2 = row % size2
    i01 = row // size2
    i1 = i01 % size1
    i0 = i01 // size1
    return i0, i1, i2


@triton.jit
def _row_ptr(ptr, i0, i1, i2, stride0, stride1, stride2):
    """``ptr`` advanced to row ``(i0, i1, i2)`` of a 4-D view with those strides (elements), in int64."""
    return ptr + i0.to(tl.int64) * stride0 + i1.to(tl.int64) * stride1 + i2.to(tl.int64) * stride2


# Specialisation: n_cols stays specialised. Triton then knows when it is a multiple of 16, so the masked loads and
# stores along the row compile to 16-byte vector accesses; marked do_not_specialize, every access was a scalar 2-byte
# one (H200, 8192 x 32000 bf16: 41% of copy bandwidth). The row-splitting sizes buy nothing from specialisation.
@triton.jit(do_not_specialize=["size1", "size2"])
def _softmax_fwd_kernel(
    x_ptr,  # *T: scores x, seen as [size0, size1, size2, n_cols] (leading axes padded with size 1)
    x_stride0, x_stride1, x_stride2, x_stride_col,  # strides of x's four axes, in elements
    m_ptr,  # *mask (float for additive, uint8 for boolean), broadcast to x's 4-D view; unused when MASK_KIND == 0
    m_stride0, m_stride1, m_stride2, m_stride_col,  # strides of the mask's four axes (0 on broadcast axes)
    y_ptr,  # *T: output y, contiguous [n_rows, n_cols]
    y_stride_row,  # stride between output rows, in elements
    scale,  # fp32 multiplier of x, applied before the mask
    n_cols,  # row length (softmax axis)
    size1, size2,  # sizes of axes 1 and 2 of the 4-D view (to split the row index); size2 is q_len for causal
    MASK_KIND: tl.constexpr,  # 0 none, 1 additive, 2 boolean keep-mask
    CAUSAL: tl.constexpr,  # mask column j > q, q = row % size2
    SINGLE_BLOCK: tl.constexpr,  # whole row in one block (BLOCK >= n_cols), else looped online softmax
    BLOCK: tl.constexpr,  # elements per block (power of two)
    COLS_I64: tl.constexpr,  # column offsets in int64 (when (n_cols - 1) * |stride_col| may pass 2**31)
):
    scale = tl.cast(scale, tl.float32)  # see 'Float arguments' above
    row = tl.program_id(0)
    i0, i1, i2 = _split_row(row, size1, size2)
    x_row = _row_ptr(x_ptr, i0, i1, i2, x_stride0, x_stride1, x_stride2)
    m_row = _row_ptr(m_ptr, i0, i1, i2, m_stride0, m_stride1, m_stride2)
    y_row = y_ptr + row.to(tl.int64) * y_stride_row
    # Columns past the causal limit are never loaded: they are -inf scores whose output is 0.
    n_live = n_cols
    if CAUSAL:
        n_live = tl.minimum(n_cols, i2 + 1)
    offs = tl.arange(0, BLOCK)
    if COLS_I64:
        offs = offs.to(tl.int64)

    if SINGLE_BLOCK:
        z = _load_scores(x_row, m_row, offs, n_live, x_stride_col, m_stride_col, scale, MASK_KIND, False)
        m = tl.max(z, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)  # fully masked row: exp2(-inf) = 0 below, not NaN
        e = tl.exp2((z - m_safe) * LOG2E)
        s = tl.sum(e, axis=0)
        # s == 0 only for a fully masked row -> zeros; a NaN s stays NaN. The inner where avoids computing 1 / 0.
        inv = tl.where(s == 0.0, 0.0, 1.0 / tl.where(s == 0.0, 1.0, s))
        tl.store(y_row + offs, (e * inv).to(y_ptr.dtype.element_ty), mask=offs < n_cols)
    else:
        # Pass 1: online softmax kept per lane (see online_lse_update): the loop is a pure stream, no cross-warp
        # reduction per chunk.
        m_lane = tl.full([BLOCK], float("-inf"), tl.float32)
        s_lane = tl.zeros([BLOCK], dtype=tl.float32)
        for start in tl.range(0, n_live, BLOCK):
            cols = start + offs
            # evict_last: ask L2 to keep the row for pass 2.
            z = _load_scores(x_row, m_row, cols, n_live, x_stride_col, m_stride_col, scale, MASK_KIND, True)
            m_lane, s_lane = online_lse_update(m_lane, s_lane, z)
        m, s = online_lse_combine(m_lane, s_lane)
        # Pass 2: y = exp(z - m) / s = exp2((z - m) * log2e - log2 s); (z - m) first, so that 1e4-scale scores keep
        # fp32 accuracy. A fully masked row has s == 0: log2 s := +inf gives zeros (not -inf - -inf = NaN).
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        log2_s = tl.where(s == 0.0, float("inf"), tl.log2(tl.where(s == 0.0, 1.0, s)))
        for start in tl.range(0, n_cols, BLOCK):
            cols = start + offs
            z = _load_scores(x_row, m_row, cols, n_live, x_stride_col, m_stride_col, scale, MASK_KIND, False)
            y = tl.exp2((z - m_safe) * LOG2E - log2_s)
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _weighted_mean(y_dy, y_sum):
    """``sum(y * dy) / sum(y)``: the mean of ``dy`` under the saved ``y``, whose ``T``-rounded elements need not sum
    to 1. Dividing by their sum keeps ``dx = y * (dy - mean)`` zero for a constant ``dy``, as the exact softmax
    Jacobian is; with ``sum(y * dy)`` alone, a peaked bf16 row (one ``y`` near 1) left ``dy_i - mean`` to its
    rounding error. Over 100 draws of ``verify``'s [5, 3] bf16 inputs, rounded to nearest as on a GPU, the
    gradient's error against float64 over that of ``reference_fn`` (the softmax in fp32): median 2.52x, 90th
    percentile 5.92x with ``sum(y * dy)`` (on an H100 ``verify`` failed this shape at 6x), 1.10x and 1.71x with the
    division; at width 1000 1.29x / 1.64x and 1.29x / 1.60x (benchmarks/kernels/softmax_bwd_rounding.py,
    benchmarks/results/cpu/softmax_bwd_rounding). A fully masked row (``sum(y) == 0``, all ``y`` zero) gives 0."""
    return tl.where(y_sum == 0.0, 0.0, y_dy / tl.where(y_sum == 0.0, 1.0, y_sum))


@triton.jit(do_not_specialize=["size1", "size2"])
def _softmax_bwd_kernel(
    y_ptr,  # *T: forward output y, contiguous [n_rows, n_cols]
    y_stride_row,  # stride between rows of y, in elements
    dy_ptr,  # *T: upstream gradient, seen as [size0, size1, size2, n_cols]
    dy_stride0, dy_stride1, dy_stride2, dy_stride_col,  # strides of dy's four axes (0 where autograd expanded it)
    dx_ptr,  # *T: output dx, contiguous [n_rows, n_cols]
    scale,  # the forward's scale (chain rule through scale * x)
    n_cols,  # row length
    size1, size2,  # sizes of axes 1 and 2 of dy's 4-D view
    SINGLE_BLOCK: tl.constexpr,  # whole row in one block, else two looped passes
    BLOCK: tl.constexpr,  # elements per block (power of two)
    COLS_I64: tl.constexpr,  # column offsets of dy in int64
):
    scale = tl.cast(scale, tl.float32)  # see 'Float arguments' above
    row = tl.program_id(0)
    i0, i1, i2 = _split_row(row, size1, size2)
    dy_row = _row_ptr(dy_ptr, i0, i1, i2, dy_stride0, dy_stride1, dy_stride2)
    y_row = y_ptr + row.to(tl.int64) * y_stride_row
    dx_row = dx_ptr + row.to(tl.int64) * y_stride_row
    offs = tl.arange(0, BLOCK)
    if COLS_I64:
        offs = offs.to(tl.int64)

    if SINGLE_BLOCK:
        live = offs < n_cols
        y = tl.load(y_row + offs, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_row + offs * dy_stride_col, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dot = _weighted_mean(tl.sum(y * dy, axis=0), tl.sum(y, axis=0))
        dx = scale * y * (dy - dot)
        tl.store(dx_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=live)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)  # per-lane partial sums of y * dy, reduced once after the loop
        mass = tl.zeros([BLOCK], dtype=tl.float32)  # and of y
        for start in tl.range(0, n_cols, BLOCK):
            cols = start + offs
            live = cols < n_cols
            y = tl.load(y_row + cols, mask=live, other=0.0, eviction_policy="evict_last").to(tl.float32)
            dy = tl.load(dy_row + cols * dy_stride_col, mask=live, other=0.0, eviction_policy="evict_last")
            acc += y * dy.to(tl.float32)
            mass += y
        dot = _weighted_mean(tl.sum(acc, axis=0), tl.sum(mass, axis=0))
        for start in tl.range(0, n_cols, BLOCK):
            cols = start + offs
            live = cols < n_cols
            y = tl.load(y_row + cols, mask=live, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_row + cols * dy_stride_col, mask=live, other=0.0, eviction_policy="evict_first")
            dx = scale * y * (dy.to(tl.float32) - dot)
            tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=live)


# --- launchers ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxConfig:
    """Launch configuration for one row per program.

    Attributes:
        block_size: elements per block (power of two); the whole row when ``single_block``.
        num_warps: warps per program.
        single_block: the row fits one block (held in registers) instead of the looped online path.
    """

    block_size: int
    num_warps: int
    single_block: bool

    @classmethod
    def for_row(cls, n_cols: int, max_single_block: int = MAX_SINGLE_BLOCK) -> "SoftmaxConfig":
        """Single block when ``next_power_of_2(n_cols) <= max_single_block`` (:func:`warps_for` warps), else
        :data:`LOOP_BLOCK` chunks over :data:`LOOP_WARPS` warps (the H200 sweep's choices, see the constants).
        A symbolic width (torch.compile with dynamic shapes) is specialised: the block is a constexpr."""
        return cls._for_row(int(n_cols), max_single_block)

    @classmethod
    @functools.lru_cache(maxsize=4096)  # frozen: one per width, not rebuilt on every eager call (host time)
    def _for_row(cls, n_cols: int, max_single_block: int) -> "SoftmaxConfig":
        block = triton.next_power_of_2(max(n_cols, 1))
        if block <= max_single_block:
            return cls(block, warps_for(block), True)
        return cls(LOOP_BLOCK, LOOP_WARPS, False)


#: The old name, still looked up by benchmarks/kernels/sweep_rows.py (``getattr(sm, "RowConfig")``); the norms'
#: :class:`kernel_library._rows.RowConfig` is another class.
RowConfig = SoftmaxConfig


def warps_for(block: int) -> int:
    """num_warps giving about :data:`ELEMS_PER_THREAD` elements per thread, between 1 and :data:`MAX_WARPS`."""
    return max(1, min(MAX_WARPS, block // (32 * ELEMS_PER_THREAD)))


def needs_int64_cols(n_cols: int, stride_col: int) -> bool:
    """Whether a column offset ``col * stride_col`` of a row of ``n_cols`` can pass the int32 range."""
    return (max(n_cols, 1) - 1) * abs(stride_col) >= 2**31


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """``t`` seen as ``[size0, size1, size2, n_cols]``: leading size-1 axes added (a view), or leading axes beyond
    the last three merged with ``reshape`` (a view when the strides allow it, else a copy)."""
    if t.dim() <= 4:
        return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t
    return t.reshape(-1, *t.shape[-3:])


def _check_softmax_args(x: torch.Tensor, mask: Optional[torch.Tensor]) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("softmax: x must have at least one dimension (softmax runs over the last)")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"softmax: x must be float32, float16 or bfloat16, got {x.dtype}")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"softmax: mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.device != x.device:
        raise ValueError(f"softmax: mask is on {mask.device} but x is on {x.device}")
    if mask.dtype != torch.bool and mask.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"softmax: mask must be bool (True = keep) or a float additive mask, got {mask.dtype}")
    try:
        shape = torch.broadcast_shapes(mask.shape, x.shape)
    except RuntimeError:
        shape = None
    if shape != x.shape:
        raise ValueError(f"softmax: mask of shape {tuple(mask.shape)} does not broadcast to x's {tuple(x.shape)}")


#: Launch plans of direct eager calls (:func:`kernel_library._op.direct_call`), by the geometry that decides them:
#: what :func:`_softmax_fwd_launch` / :func:`_softmax_bwd_launch` derive from shapes, strides and dtypes (the argument
#: checks, the 4-D strides, the config, the int64 decision), so that a model calling a geometry again pays a dict
#: lookup for them. Host time, issue 16: the softmax forward + backward was the one library op spending more host
#: time per call than Liger-Kernel's (385 vs 290 us on the H200 host, 4 x 256 bf16;
#: benchmarks/results/h200/kernels/lce_liger_kernels.md). Traced calls (symbolic shapes) never use them; rank > 4
#: (whose 4-D view may be a copy) neither. Cleared when :data:`MAX_PLANS` are held.
_FWD_PLANS: dict[tuple, tuple] = {}
_BWD_PLANS: dict[tuple, tuple] = {}
MAX_PLANS = 1024


def _remember(plans: dict[tuple, tuple], key: tuple, plan: tuple) -> tuple:
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


def _fwd_plan(x: torch.Tensor, mask: Optional[torch.Tensor], causal: bool, config: SoftmaxConfig | None = None,
              force_int64_cols: bool = False) -> tuple:
    """The forward launch's ``(n_rows, x strides, mask kind, mask strides, (n_cols, size1, size2), meta)`` for
    ``x`` of rank <= 4 seen as ``[size0, size1, size2, n_cols]`` and the mask broadcast to it; ``n_rows`` 0 when
    ``x`` is empty.

    Raises:
        TypeError, ValueError: as :func:`softmax` says.
    """
    _check_softmax_args(x, mask)
    if x.numel() == 0:
        return (0, (), MASK_NONE, (), (), {})
    n_cols = x.shape[-1]
    x4 = _as_4d(x)
    if mask is None:
        kind, m4 = MASK_NONE, x4
    else:
        kind = MASK_BOOL if mask.dtype == torch.bool else MASK_ADDITIVE
        m4 = _as_4d(mask.expand(x.shape))
    cfg = config or SoftmaxConfig.for_row(n_cols)
    cols_i64 = force_int64_cols or needs_int64_cols(n_cols, x4.stride(3)) or needs_int64_cols(n_cols, m4.stride(3))
    meta = {"MASK_KIND": kind, "CAUSAL": bool(causal), "SINGLE_BLOCK": cfg.single_block, "BLOCK": cfg.block_size,
            "COLS_I64": cols_i64, "num_warps": cfg.num_warps}
    return (x4.shape[0] * x4.shape[1] * x4.shape[2], x4.stride(), kind, m4.stride(),
            (n_cols, x4.shape[1], x4.shape[2]), meta)


def _softmax_fwd_launch(x: torch.Tensor, scale: float, mask: Optional[torch.Tensor], causal: bool,
                        config: SoftmaxConfig | None = None, force_int64_cols: bool = False) -> torch.Tensor:
    """Allocate y and launch the forward kernel (``config`` and ``force_int64_cols`` exist for tests)."""
    if (direct_call() and config is None and not force_int64_cols and isinstance(x, torch.Tensor) and x.dim() <= 4
            and (mask is None or isinstance(mask, torch.Tensor))):
        key = (x.shape, x.stride(), x.dtype, bool(causal),
               None if mask is None else (mask.shape, mask.stride(), mask.dtype, mask.device, x.device))
        plan = _FWD_PLANS.get(key)
        if plan is None:
            plan = _remember(_FWD_PLANS, key, _fwd_plan(x, mask, causal))
        src = x
    else:
        _check_softmax_args(x, mask)
        src = x
        if x.dim() > 4 and x.numel() > 0:  # x seen as 4-D (leading axes merged; a copy if strides need it)
            mask = None if mask is None else _as_4d(mask.expand(x.shape))
            src = _as_4d(x)
        plan = _fwd_plan(src, mask, causal, config, force_int64_cols)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    n_rows, x_strides, kind, m_strides, sizes, meta = plan
    if n_rows == 0:
        return y
    # no mask: x stands in for the unread mask pointer; a bool mask is read as uint8 (same bytes; Triton loads uint8
    # more portably than i1)
    m = src if kind == MASK_NONE else mask.view(torch.uint8) if kind == MASK_BOOL else mask
    launcher(_softmax_fwd_kernel)[(n_rows,)](src, *x_strides, m, *m_strides, y, sizes[0], float(scale), *sizes,
                                             **meta)
    return y


def _bwd_plan(y: torch.Tensor, dy: torch.Tensor, config: SoftmaxConfig | None = None,
              force_int64_cols: bool = False) -> tuple:
    """The backward launch's ``(n_rows, dy strides, (n_cols, size1, size2), meta)`` for ``dy`` of rank <= 4 seen
    as ``[size0, size1, size2, n_cols]``; ``n_rows`` 0 when ``y`` is empty.

    Raises:
        ValueError: ``dy``'s shape is not ``y``'s, or ``y`` is not contiguous.
    """
    if dy.shape != y.shape:
        raise ValueError(f"softmax backward: dy of shape {tuple(dy.shape)} does not match y's {tuple(y.shape)}")
    if not y.is_contiguous():
        raise ValueError("softmax backward: y must be the contiguous forward output")
    if y.numel() == 0:
        return (0, (), (), {})
    n_cols = y.shape[-1]
    dy4 = _as_4d(dy)
    cfg = config or SoftmaxConfig.for_row(n_cols, MAX_SINGLE_BLOCK_BWD)
    cols_i64 = force_int64_cols or needs_int64_cols(n_cols, dy4.stride(3))
    meta = {"SINGLE_BLOCK": cfg.single_block, "BLOCK": cfg.block_size, "COLS_I64": cols_i64,
            "num_warps": cfg.num_warps}
    return (y.numel() // n_cols, dy4.stride(), (n_cols, dy4.shape[1], dy4.shape[2]), meta)


def _softmax_bwd_launch(y: torch.Tensor, dy: torch.Tensor, scale: float,
                        config: SoftmaxConfig | None = None, force_int64_cols: bool = False) -> torch.Tensor:
    """Allocate dx and launch the backward kernel; ``y`` is the contiguous forward output."""
    if direct_call() and config is None and not force_int64_cols and dy.dim() <= 4:
        key = (y.shape, y.stride(), dy.shape, dy.stride())
        plan = _BWD_PLANS.get(key)
        if plan is None:
            plan = _remember(_BWD_PLANS, key, _bwd_plan(y, dy))
    else:
        y_seen = y
        if dy.dim() > 4 and dy.numel() > 0 and dy.shape == y.shape and y.is_contiguous():
            # seen as 4-D: dy's view is a copy when its strides do not allow one; y's is a view (same pointer)
            y_seen, dy = _as_4d(y), _as_4d(dy)
        plan = _bwd_plan(y_seen, dy, config, force_int64_cols)
    dx = torch.empty_like(y, memory_format=torch.contiguous_format)
    n_rows, dy_strides, sizes, meta = plan
    if n_rows == 0:
        return dx
    launcher(_softmax_bwd_kernel)[(n_rows,)](y, sizes[0], dy, *dy_strides, dx, float(scale), *sizes, **meta)
    return dx


# --- custom ops and autograd --------------------------------------------------------------------------------


@library_op("fusion_advisor::softmax", mutates_args={})
def softmax_op(x: torch.Tensor, scale: float, mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
    """``softmax(scale * x + mask)`` over the last axis (see the module docstring for the mask rules)."""
    return _softmax_fwd_launch(x, scale, mask, causal)


@library_op("fusion_advisor::softmax_backward", mutates_args={})
def softmax_backward_op(y: torch.Tensor, dy: torch.Tensor, scale: float) -> torch.Tensor:
    """``dx = scale * y * (dy - sum(dy * y, -1) / sum(y, -1))`` for the contiguous forward output ``y``
    (``_weighted_mean``)."""
    return _softmax_bwd_launch(y, dy, scale)


def _setup_context(ctx, inputs, output) -> None:
    x, scale, mask, _causal = inputs
    ctx.scale = scale
    ctx.x_dtype = x.dtype
    ctx.mask_shape = None if mask is None else mask.shape
    ctx.mask_dtype = None if mask is None else mask.dtype
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    need_x, _, need_mask, _ = ctx.needs_input_grad
    dx = dmask = None
    if need_mask:
        # d(z)/d(mask) = 1: the unscaled softmax gradient, summed over the axes the mask was broadcast along.
        g = softmax_backward_op(y, dy, 1.0)
        dmask = g.float().sum_to_size(ctx.mask_shape).to(ctx.mask_dtype)
        if need_x:
            dx = (g.float() * ctx.scale).to(ctx.x_dtype)
    elif need_x:
        dx = softmax_backward_op(y, dy, ctx.scale)
    return dx, None, dmask, None


softmax_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ----------------------------------------------------------------------------------------


def softmax(x: torch.Tensor, scale: float = 1.0, mask: Optional[torch.Tensor] = None,
            causal: bool = False) -> torch.Tensor:
    """Softmax of ``scale * x + mask`` over the last axis, with forward and backward in Triton.

    Args:
        x: scores ``[..., n_cols]`` (e.g. ``[n_rows, n_cols]`` or attention ``[batch, heads, q_len, k_len]``),
            float32, float16 or bfloat16, any strides.
        scale: Python float multiplying ``x`` before the mask (HF's attention ``scaling``).
        mask: ``None``, a float additive mask, or a bool keep-mask (True = keep), broadcastable to ``x``
            (e.g. ``[batch or 1, heads or 1, q_len, k_len]``); broadcast axes are read with stride 0.
        causal: also mask column ``j > row % q_len`` with ``q_len = x.shape[-2]`` (top-left aligned).

    Returns:
        ``y`` with ``x``'s shape and dtype (contiguous): ``softmax(z, -1)`` with ``z = scale * x + mask``
        computed in fp32. Rows whose scores are all ``-inf`` give zeros (``torch.softmax`` gives NaN).

    Formula: ``y_j = exp(z_j - max z) / sum_k exp(z_k - max z)``; rows wider than :data:`MAX_SINGLE_BLOCK` use the
    online normaliser of Milakov & Gimelshein 2018. Backward: ``dx = scale * y * (dy - sum(dy * y) / sum(y))``
    from the saved ``y`` (``sum(y) = 1`` exactly; dividing by the rounded ``y``'s sum keeps the gradient of a
    peaked bf16 row accurate, see ``_weighted_mean``).

    Raises:
        TypeError: ``x`` is not fp32/fp16/bf16, or ``mask`` is neither bool nor float.
        ValueError: ``x`` is 0-d, or ``mask`` is on another device or does not broadcast to ``x``.
    """
    return softmax_op(x, float(scale), mask, bool(causal))


# --- contract -----------------------------------------------------------------------------------------------


def kernel_fn(x: torch.Tensor, scale: float = 1.0, mask: Optional[torch.Tensor] = None,
              causal: bool = False) -> torch.Tensor:
    """The public wrapper (:func:`softmax`)."""
    return softmax(x, scale, mask, causal)


def reference_fn(x: torch.Tensor, scale: float = 1.0, mask: Optional[torch.Tensor] = None,
                 causal: bool = False) -> torch.Tensor:
    """Plain-PyTorch :func:`softmax`: same arguments, same semantics (fully masked rows give zeros).

    Computes in ``promote_types(x.dtype, float32)`` (float64 stays float64) and returns ``x``'s dtype. Fully masked
    rows are replaced by a zero score before ``torch.softmax`` and zeroed after it, so that their gradient is 0
    (as in the kernel) rather than NaN.
    """
    acc = torch.promote_types(x.dtype, torch.float32)
    z = x.to(acc) * scale
    if mask is not None:
        z = z.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else z + mask.to(acc)
    if causal:
        q_len = x.shape[-2] if x.dim() >= 2 else 1
        q = torch.arange(q_len, device=x.device)[:, None]
        k = torch.arange(x.shape[-1], device=x.device)[None, :]
        future = (k > q) if x.dim() >= 2 else (k > q)[0]
        z = z.masked_fill(future, float("-inf"))
    fully_masked = (z == float("-inf")).all(dim=-1, keepdim=True)
    y = torch.softmax(z.masked_fill(fully_masked, 0.0), dim=-1).masked_fill(fully_masked, 0.0)
    return y.to(x.dtype)


def _dtype(d) -> torch.dtype:
    return getattr(torch, d) if isinstance(d, str) else d


def make_inputs(n_rows: int | None = None, n_cols: int = 1000, dtype="float32", shape=None, mask: str | None = None,
                causal: bool = False, scale: float = 1.0, requires_grad: bool = True, seed: int = 0,
                device=None) -> list:
    """Arguments ``[x, scale, mask, causal]`` for :func:`kernel_fn`.

    Args:
        n_rows, n_cols: ``x`` is ``[n_rows, n_cols]`` unless ``shape`` (e.g. ``(batch, heads, q, k)``) is given.
        dtype: torch dtype or its name.
        mask: ``None``, ``"additive"`` (0 / finfo.min, HF style) or ``"bool"``; shape ``[n_rows, n_cols]`` for 2-D
            ``x``, ``[batch, 1, q, k]`` (broadcast over heads) for 4-D ``x``. About 10% of positions are masked.
        causal, scale: passed through.
    """
    dtype = _dtype(dtype)
    device = device or _device.default_device()
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(shape) if shape is not None else (n_rows if n_rows is not None else 8, n_cols)
    x = torch.randn(shape, generator=gen).mul_(3.0).to(dtype=dtype, device=device)
    x.requires_grad_(requires_grad)
    m = None
    if mask is not None:
        mshape = (shape[0], 1, *shape[2:]) if len(shape) == 4 else shape
        keep = (torch.rand(mshape, generator=gen) > 0.1).to(device)
        if mask == "bool":
            m = keep
        elif mask == "additive":
            m = torch.zeros(mshape, dtype=dtype, device=device).masked_fill_(~keep, torch.finfo(dtype).min)
        else:
            raise ValueError(f"make_inputs: mask must be None, 'additive' or 'bool', got {mask!r}")
    return [x, float(scale), m, bool(causal)]


#: ``get_inputs(size)`` sizes, ``(n_rows, n_cols)``; ``verify`` derives its edge shapes from the first.
SIZES = [(8192, 32000)] if _device.on_gpu() else [(8, 1000)]


def get_inputs(size: tuple[int, int] | None = None) -> list:
    """``[x, 1.0, None, False]``, ``x`` ``size`` = ``(n_rows, n_cols)``, default ``SIZES[0]``: 8192 x 32000
    bf16 (vocab-wide rows) on a GPU, 8 x 1000 fp32 on the CPU; drawn from the seed ``verify`` set."""
    return _inputs(size)


def _inputs(size: tuple[int, int] | None, **options) -> list:
    """:func:`get_inputs` with ``options`` (``mask``, ``scale``, ...) passed to :func:`make_inputs`."""
    n_rows, n_cols = size or SIZES[0]
    dtype = "bfloat16" if _device.on_gpu() else "float32"
    return make_inputs(n_rows=n_rows, n_cols=n_cols, dtype=dtype, seed=torch.initial_seed(), **options)


def hard_inputs() -> list:
    """The hard values the kernel documents: fully masked rows give 0 (not torch's NaN), with a boolean mask and
    with an additive ``-inf`` mask; scores of large magnitude (x 1e3: ``exp`` overflows unless the row max is
    subtracted); HF's additive ``finfo.min`` mask with a scale."""
    x, _, _, _ = get_inputs()
    keep = torch.rand(x.shape, device=x.device) > 0.3
    keep[0] = False  # a fully masked row
    keep[2] = False
    additive = torch.zeros(x.shape, dtype=x.dtype, device=x.device).masked_fill(~keep, float("-inf"))
    hf = torch.zeros(x.shape, dtype=x.dtype, device=x.device).masked_fill(~keep, torch.finfo(x.dtype).min)
    hf[0] = 0.0  # an all-finfo.min row is uniform for torch and the kernel alike: unmask these rows here
    hf[2] = 0.0
    large = (x.detach() * 1e3).requires_grad_(True)
    return [("fully masked rows (bool mask)", [x, 1.0, keep, False]),
            ("fully masked rows (additive -inf mask)", [x, 1.0, additive, False]),
            ("scores x 1e3", [large, 1.0, None, False]),
            ("additive finfo.min mask, scale 0.125", [x, 0.125, hf, False])]


def contract_for(name: str) -> dict | None:
    """``fusion-advisor verify``'s contract of the registry entry ``name`` where it is not this module's main one:
    ``masked_softmax`` (scale, then an additive or boolean mask) runs every input set with HF's additive
    ``finfo.min`` mask and a scale of 0.125, and the hard values that carry a mask, so the entry is checked on its
    own inputs, not through the plain softmax."""
    if name != "masked_softmax":
        return None

    return {"get_inputs": lambda size=None: _inputs(size, mask="additive", scale=0.125),
            "hard_inputs": lambda: [(label, args) for label, args in hard_inputs() if args[2] is not None]}


#: GPU benchmark shapes: the reference rows (8192 x 32000 / 128256 bf16, scale + mask + softmax at 32000), attention
#: scores of Llama-7B (32 heads, 2048 tokens) with an HF-style additive mask and with causal, and a width sweep
#: across the single-block limit (4096 single; 16384, 32768, 65536 looped) plus a decode-like few-row case.
BENCH_SHAPES: list[dict] = [
    {"n_rows": 8192, "n_cols": 32000, "dtype": "bfloat16"},
    {"n_rows": 8192, "n_cols": 128256, "dtype": "bfloat16"},
    {"n_rows": 8192, "n_cols": 32000, "dtype": "bfloat16", "mask": "additive", "scale": 0.125},
    {"shape": (1, 32, 2048, 2048), "dtype": "bfloat16", "mask": "additive", "scale": 1 / math.sqrt(128)},
    {"shape": (1, 32, 2048, 2048), "dtype": "bfloat16", "causal": True, "scale": 1 / math.sqrt(128)},
    {"n_rows": 8192, "n_cols": 4096, "dtype": "bfloat16"},
    {"n_rows": 8192, "n_cols": 16384, "dtype": "bfloat16"},
    {"n_rows": 8192, "n_cols": 32768, "dtype": "bfloat16"},
    {"n_rows": 8192, "n_cols": 65536, "dtype": "bfloat16"},
    {"n_rows": 32, "n_cols": 32000, "dtype": "bfloat16"},
    {"n_rows": 8192, "n_cols": 32000, "dtype": "float32"},
]


def bench_entry(shape: dict) -> str:
    """The registry entry a ``BENCH_SHAPES`` shape exercises: ``"masked_softmax"`` with a mask, a scale or causal
    masking, else ``"softmax"`` (this module registers both)."""
    masked = shape.get("mask") or shape.get("causal") or shape.get("scale", 1.0) != 1.0
    return "masked_softmax" if masked else "softmax"


def bytes_moved(x: torch.Tensor, scale: float = 1.0, mask: Optional[torch.Tensor] = None,
                causal: bool = False) -> int:
    """Fewest bytes of the forward: read x, read the mask's own elements once (not its broadcast), write y."""
    n = x.numel() * x.element_size()
    mask_bytes = 0 if mask is None else mask.numel() * mask.element_size()
    return 2 * n + mask_bytes


def bytes_moved_backward(x: torch.Tensor, scale: float = 1.0, mask: Optional[torch.Tensor] = None,
                         causal: bool = False) -> int:
    """Fewest bytes of the backward: read y and dy, write dx."""
    return 3 * x.numel() * x.element_size()


# --- registration -------------------------------------------------------------------------------------------


def _softmax_pattern(x: torch.Tensor) -> torch.Tensor:
    # HF eager attention: nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)


def _softmax_replacement(x: torch.Tensor) -> torch.Tensor:
    return kernel_fn(x)


def _masked_softmax_pattern(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    # HF eager attention: attn_weights = q @ k.T * scaling; attn_weights = attn_weights + causal_mask; softmax in fp32
    return torch.nn.functional.softmax(x * scale + mask, dim=-1, dtype=torch.float32).to(x.dtype)


def _masked_softmax_replacement(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    return kernel_fn(x, scale, mask)


ENTRY = register_kernel(KernelEntry(
    name="softmax", module=__name__, op="fusion_advisor::softmax", has_backward=True,
    description="softmax over the last axis in fp32 (matches torch.softmax; rows of any width, online beyond 4096)",
    pattern=_softmax_pattern, replacement=_softmax_replacement, example_args=((2, 2, 8, 8),)))

MASKED_ENTRY = register_kernel(KernelEntry(
    name="masked_softmax", module=__name__, op="fusion_advisor::softmax", has_backward=True,
    description="softmax(scale * x + mask) over the last axis in fp32, additive or bool mask broadcast with "
                "stride 0; fully -inf rows give 0 where torch gives NaN",
    pattern=_masked_softmax_pattern, replacement=_masked_softmax_replacement,
    example_args=((2, 2, 8, 8), (2, 1, 8, 8), "scalar")))
