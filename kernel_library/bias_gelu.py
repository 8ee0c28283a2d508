"""Bias + GELU with optional seeded dropout: ``y = dropout(gelu(x + bias))``, forward and backward.

Replaces the ``bias_gelu`` chain: ``F.gelu(x + bias, approximate=...)`` where a linear layer's bias is added
separately from its matmul (GPT-2 / BERT MLPs, Megatron-LM's ``bias_gelu_impl``), optionally followed by
``F.dropout(..., p, training=True)`` (Megatron's ``bias_dropout_add`` family).

Dropout is *seeded and reproducible*: element ``i`` (its flat index in the row-major output, whatever the
strides of ``x``) is kept when ``tl.rand(seed, i) >= dropout_p``. The backward regenerates the same mask from
the seed instead of storing it. :func:`dropout_mask` draws that same mask with a tiny Triton kernel, so that
:func:`reference_fn` (plain PyTorch otherwise) applies exactly the kernel's mask: ``verify`` compares like with
like. (torch's own ``F.dropout`` uses a different generator, so no reference built on it could match.)

The fp32 GELU device helpers it calls (``gelu_erf``, ``gelu_tanh`` and their derivatives) live in
:mod:`kernel_library._activations`, the launcher helpers in :mod:`kernel_library._rows` and
:mod:`kernel_library._checks`, shared with the other kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library._activations import gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad
from kernel_library._checks import check_operands
from kernel_library._op import launcher, library_op
from kernel_library._rows import rows_view
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ------------------------------------------------------------------------------------------------

#: Tile shape and warps, measured on H200 2026-11-29 (benchmarks/results/h200/kernels/sweep_tiles.json: 8192 x 16384
#: bf16, erf, BLOCK_C {256..2048} x tile {2048, 4096, 8192} elements x {4, 8, 16} warps, summed CUDA time): 1024-wide
#: column blocks, 4096-element tiles (4 rows) over 4 warps were fastest forward (0.2005 ms, 1.05x torch.compile; the
#: earlier 512 x 4 rows over 8 warps: 0.245 ms, 0.86x) and within 3% of the fastest forward+backward (0.519 ms, 1.04x).
#: Fewer warps with more elements per thread won throughout: 32 values per thread is four 16-byte bf16 vectors in flight
#: per load.
MAX_BLOCK_C = 1024
#: Elements per tile (BLOCK_R * BLOCK_C).
TILE_ELEMS = 4096
#: Contiguous elements per thread: 4096-element tiles over 4 warps (128 threads).
ELEMS_PER_THREAD = 32
#: At most this many warps per program.
MAX_NUM_WARPS = 8
#: Rows one backward program walks through while summing dbias. 64 rows keep the fp32 partial-sum buffer
#: ([cdiv(n_rows, 64), n_cols]) at ~1% of the backward's traffic for bf16 and still give thousands of programs
#: at 8192 tokens (128 row groups x 22 column blocks at n_cols = 11008).
BWD_ROWS_PER_PROGRAM = 64

#: ``approximate=`` values of ``F.gelu``.
APPROXIMATIONS = ("none", "tanh")


@triton.jit
def _gelu(x, APPROXIMATE: tl.constexpr):
    if APPROXIMATE == "tanh":
        y = gelu_tanh(x)
    else:
        y = gelu_erf(x)
    return y


@triton.jit
def _gelu_grad(x, APPROXIMATE: tl.constexpr):
    if APPROXIMATE == "tanh":
        g = gelu_tanh_grad(x)
    else:
        g = gelu_erf_grad(x)
    return g


@triton.jit
def _dropout_keep(seed, offsets, dropout_p):
    """Keep mask of ``offsets`` (flat row-major output indices, int64): ``tl.rand(seed, offsets) >= dropout_p``."""
    return tl.rand(seed, offsets) >= dropout_p


# --- kernels --------------------------------------------------------------------------------------------------
# Float arguments (dropout_p, dropout_scale) are cast to fp32 at kernel entry. Eager Triton passes a Python float as
# fp32, but Inductor types it fp64 when torch.compile compiles these triton_ops: the backward's loop-carried fp32
# dbias sum then fails to compile (seen on the H200), and ``tl.rand(...) >= dropout_p`` compared in fp64 would keep
# other elements than the eager kernels and :func:`dropout_mask`, which compare with the fp32 dropout_p.
# ``tl.cast`` rather than ``.to``: under TRITON_INTERPRET the argument is a plain Python float, which has no ``.to``;
# tl.cast also accepts a constexpr.


@triton.jit
def _tile(row_block, col_block, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Rows [BLOCK_R] and columns [BLOCK_C] of tile (row_block, col_block), int64 so that ``row * stride`` and
    the flat dropout index ``row * n_cols + col`` cannot overflow int32."""
    rows = row_block.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = col_block.to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    return rows, cols


@triton.jit(do_not_specialize=["n_rows", "n_col_blocks", "seed", "dropout_p", "dropout_scale"])
def _bias_gelu_fwd_kernel(
    x_ptr,  # input [n_rows, n_cols]
    bias_ptr,  # bias [n_cols]
    y_ptr,  # output [n_rows, n_cols]
    n_rows,  # rows of x (leading dims flattened)
    n_cols,  # columns of x = bias length
    n_col_blocks,  # cdiv(n_cols, BLOCK_C): programs per row block
    stride_x_row,  # x: elements between rows
    stride_x_col,  # x: elements between columns
    stride_bias,  # bias: elements between entries
    stride_y_row,  # y: elements between rows
    stride_y_col,  # y: elements between columns
    seed,  # dropout seed (ignored without HAS_DROPOUT)
    dropout_p,  # drop probability in [0, 1]
    dropout_scale,  # 1 / (1 - dropout_p), 0 when dropout_p == 1
    APPROXIMATE: tl.constexpr,  # "none" (erf) or "tanh"
    HAS_DROPOUT: tl.constexpr,
    BLOCK_R: tl.constexpr,  # rows per tile
    BLOCK_C: tl.constexpr,  # columns per tile
):
    # One [BLOCK_R, BLOCK_C] tile per program, column blocks fastest: the bias block is loaded once per tile.
    dropout_p = tl.cast(dropout_p, tl.float32)  # see 'Float arguments' above
    dropout_scale = tl.cast(dropout_scale, tl.float32)
    pid = tl.program_id(0)
    row_block = pid // n_col_blocks
    rows, cols = _tile(row_block, pid - row_block * n_col_blocks, BLOCK_R, BLOCK_C)
    col_mask = cols < n_cols
    mask = (rows < n_rows)[:, None] & col_mask[None, :]

    bias = tl.load(bias_ptr + cols * stride_bias, mask=col_mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :] * stride_x_col, mask=mask, other=0.0)
    y = _gelu(x.to(tl.float32) + bias[None, :], APPROXIMATE)
    if HAS_DROPOUT:
        keep = _dropout_keep(seed, rows[:, None] * n_cols + cols[None, :], dropout_p)
        y = tl.where(keep, y * dropout_scale, 0.0)
    tl.store(
        y_ptr + rows[:, None] * stride_y_row + cols[None, :] * stride_y_col,
        y.to(y_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit(do_not_specialize=["n_rows", "n_col_blocks", "seed", "dropout_p", "dropout_scale"])
def _bias_gelu_bwd_kernel(
    grad_y_ptr,  # upstream gradient [n_rows, n_cols]
    x_ptr,  # forward input [n_rows, n_cols]
    bias_ptr,  # bias [n_cols]
    grad_x_ptr,  # output dL/dx [n_rows, n_cols]
    grad_bias_partial_ptr,  # output fp32 [n_row_groups, n_cols]: dL/dbias summed over each row group
    n_rows,
    n_cols,
    n_col_blocks,  # cdiv(n_cols, BLOCK_C)
    stride_gy_row,  # grad_y: elements between rows
    stride_gy_col,  # grad_y: elements between columns
    stride_x_row,
    stride_x_col,
    stride_bias,
    stride_gx_row,  # grad_x: elements between rows
    stride_gx_col,
    stride_partial_row,  # grad_bias_partial: elements between row groups
    seed,
    dropout_p,
    dropout_scale,
    APPROXIMATE: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,  # rows of one row group, a multiple of BLOCK_R
):
    # dz = dy * keep * scale * gelu'(x + bias); dx = dz; dbias = sum over rows of dz, reduced here per row
    # group in fp32 (deterministic: no atomics) and finished by a small torch sum over the groups.
    dropout_p = tl.cast(dropout_p, tl.float32)  # see 'Float arguments' above
    dropout_scale = tl.cast(dropout_scale, tl.float32)
    pid = tl.program_id(0)
    row_group = pid // n_col_blocks
    col_block = pid - row_group * n_col_blocks
    blocks_per_group: tl.constexpr = ROWS_PER_PROGRAM // BLOCK_R
    cols = col_block.to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)  # int64: see _tile
    col_mask = cols < n_cols
    bias = tl.load(bias_ptr + cols * stride_bias, mask=col_mask, other=0.0).to(tl.float32)

    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for i in range(0, blocks_per_group):
        # (not `rows, _ = _tile(...)`: a discarded name re-bound in a loop breaks Triton's type check on GPU)
        rows = (row_group * blocks_per_group + i).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x_row + cols[None, :] * stride_x_col, mask=mask, other=0.0)
        dy = tl.load(
            grad_y_ptr + rows[:, None] * stride_gy_row + cols[None, :] * stride_gy_col, mask=mask, other=0.0
        )
        dz = dy.to(tl.float32) * _gelu_grad(x.to(tl.float32) + bias[None, :], APPROXIMATE)
        if HAS_DROPOUT:
            keep = _dropout_keep(seed, rows[:, None] * n_cols + cols[None, :], dropout_p)
            dz = tl.where(keep, dz * dropout_scale, 0.0)
        dz = tl.where(mask, dz, 0.0)
        tl.store(
            grad_x_ptr + rows[:, None] * stride_gx_row + cols[None, :] * stride_gx_col,
            dz.to(grad_x_ptr.dtype.element_ty),
            mask=mask,
        )
        acc += dz
    tl.store(grad_bias_partial_ptr + row_group * stride_partial_row + cols, tl.sum(acc, axis=0), mask=col_mask)


@triton.jit(do_not_specialize=["seed"])  # a fresh random seed per call: specialising it compiles variants for nothing
def _dropout_mask_kernel(
    keep_ptr,  # output uint8 [n_elements]: 1 where kept
    n_elements,
    seed,
    dropout_p,
    BLOCK_SIZE: tl.constexpr,
):
    dropout_p = tl.cast(dropout_p, tl.float32)  # see 'Float arguments' above
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    keep = _dropout_keep(seed, offsets, dropout_p)
    tl.store(keep_ptr + offsets, keep.to(tl.uint8), mask=offsets < n_elements)


# --- launchers ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BiasGeluConfig:
    """Tile shape and warps of the bias+GELU kernels, from the problem size."""

    block_r: int
    block_c: int
    num_warps: int
    rows_per_program: int  # backward only

    @classmethod
    def from_shape(cls, n_rows: int, n_cols: int) -> "BiasGeluConfig":
        block_c = min(MAX_BLOCK_C, triton.next_power_of_2(n_cols))
        block_r = min(max(1, TILE_ELEMS // block_c), triton.next_power_of_2(n_rows))
        num_warps = min(MAX_NUM_WARPS, max(1, block_r * block_c // (ELEMS_PER_THREAD * 32)))
        # Both powers of two, so rows_per_program is a multiple of block_r.
        rows_per_program = max(block_r, min(BWD_ROWS_PER_PROGRAM, triton.next_power_of_2(n_rows)))
        return cls(block_r, block_c, num_warps, rows_per_program)


def _check_args(x: torch.Tensor, bias: torch.Tensor, approximate: str, dropout_p: float) -> None:
    if x.dim() < 1:
        raise ValueError(f"x must have at least 1 dimension [..., n_cols], got shape {tuple(x.shape)}")
    if bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"bias must have shape [{x.shape[-1]}] (x's last dim), got {tuple(bias.shape)}")
    check_operands(x, "x", ("bias", bias))
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")


def _dropout_scale(dropout_p: float) -> float:
    return 1.0 / (1.0 - dropout_p) if dropout_p < 1.0 else 0.0


def bias_gelu_forward(
    x: torch.Tensor, bias: torch.Tensor, approximate: str, dropout_p: float, seed: int,
    config: BiasGeluConfig | None = None,
) -> torch.Tensor:
    """Launch the forward kernel; returns contiguous y with ``x``'s shape and dtype. See :func:`bias_gelu`."""
    _check_args(x, bias, approximate, dropout_p)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    x2, y2 = rows_view(x), y.view(-1, x.shape[-1])
    n_rows, n_cols = x2.shape
    cfg = config or BiasGeluConfig.from_shape(n_rows, n_cols)
    n_col_blocks = triton.cdiv(n_cols, cfg.block_c)
    grid = (triton.cdiv(n_rows, cfg.block_r) * n_col_blocks,)
    launcher(_bias_gelu_fwd_kernel)[grid](
        x2, bias, y2, n_rows, n_cols, n_col_blocks,
        x2.stride(0), x2.stride(1), bias.stride(0), y2.stride(0), y2.stride(1),
        seed, dropout_p, _dropout_scale(dropout_p),
        APPROXIMATE=approximate, HAS_DROPOUT=dropout_p > 0.0,
        BLOCK_R=cfg.block_r, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps,
    )
    return y


def bias_gelu_backward(
    grad_y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str, dropout_p: float, seed: int,
    config: BiasGeluConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward kernel; returns (grad_x like ``x``, grad_bias like ``bias``)."""
    _check_args(x, bias, approximate, dropout_p)
    if grad_y.shape != x.shape:
        raise ValueError(f"grad_y must have x's shape {tuple(x.shape)}, got {tuple(grad_y.shape)}")
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return grad_x, torch.zeros_like(bias)
    gy2, x2, gx2 = rows_view(grad_y), rows_view(x), grad_x.view(-1, x.shape[-1])
    n_rows, n_cols = x2.shape
    cfg = config or BiasGeluConfig.from_shape(n_rows, n_cols)
    n_col_blocks = triton.cdiv(n_cols, cfg.block_c)
    n_row_groups = triton.cdiv(n_rows, cfg.rows_per_program)
    partial = torch.empty((n_row_groups, n_cols), dtype=torch.float32, device=x.device)
    launcher(_bias_gelu_bwd_kernel)[(n_row_groups * n_col_blocks,)](
        gy2, x2, bias, gx2, partial, n_rows, n_cols, n_col_blocks,
        gy2.stride(0), gy2.stride(1), x2.stride(0), x2.stride(1), bias.stride(0),
        gx2.stride(0), gx2.stride(1), partial.stride(0),
        seed, dropout_p, _dropout_scale(dropout_p),
        APPROXIMATE=approximate, HAS_DROPOUT=dropout_p > 0.0,
        BLOCK_R=cfg.block_r, BLOCK_C=cfg.block_c, ROWS_PER_PROGRAM=cfg.rows_per_program,
        num_warps=cfg.num_warps,
    )
    return grad_x, partial.sum(dim=0).to(bias.dtype)


def dropout_mask(seed: int, shape: tuple[int, ...] | torch.Size, dropout_p: float, device) -> torch.Tensor:
    """The keep mask (bool, ``shape``) the kernels apply for ``seed`` and ``dropout_p``.

    Element at flat row-major index ``i`` is kept iff ``tl.rand(seed, i) >= dropout_p``; the same seed and shape
    always give the same mask, on the same Triton version.
    """
    n = 1
    for s in shape:
        n *= s
    keep = torch.empty(n, dtype=torch.uint8, device=device)
    if n:
        block = 1024
        _dropout_mask_kernel[(triton.cdiv(n, block),)](keep, n, seed, dropout_p, BLOCK_SIZE=block)
    return keep.view(tuple(shape)).bool()


# --- torch.library ops ----------------------------------------------------------------------------------------


@library_op("fusion_advisor::bias_gelu", mutates_args={})
def bias_gelu_op(x: torch.Tensor, bias: torch.Tensor, approximate: str, dropout_p: float, seed: int) -> torch.Tensor:
    return bias_gelu_forward(x, bias, approximate, dropout_p, seed)


@library_op("fusion_advisor::bias_gelu_backward", mutates_args={})
def bias_gelu_backward_op(
    grad_y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str, dropout_p: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return bias_gelu_backward(grad_y, x, bias, approximate, dropout_p, seed)


def _setup_context(ctx, inputs, output):
    x, bias, approximate, dropout_p, seed = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate, ctx.dropout_p, ctx.seed = approximate, dropout_p, seed


def _backward(ctx, grad_y):
    x, bias = ctx.saved_tensors
    grad_x, grad_bias = bias_gelu_backward_op(grad_y, x, bias, ctx.approximate, ctx.dropout_p, ctx.seed)
    return grad_x, grad_bias, None, None, None


bias_gelu_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ------------------------------------------------------------------------------------------


def _draw_seed() -> int:
    # torch's default CPU generator: reproducible under torch.manual_seed, and no GPU sync. Under torch.compile
    # this is a graph break; pass an explicit seed there.
    return int(torch.randint(0, 2**31 - 1, (), dtype=torch.int64))


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", dropout_p: float = 0.0, seed: int | None = None
) -> torch.Tensor:
    """``dropout(gelu(x + bias))`` in one pass; differentiable in ``x`` and ``bias``.

    Args:
        x: [..., n_cols] fp32/fp16/bf16, any strides.
        bias: [n_cols], x's dtype.
        approximate: ``"none"`` (erf GELU) or ``"tanh"``, as ``F.gelu``.
        dropout_p: drop probability in [0, 1]; kept elements are scaled by 1 / (1 - p) as ``F.dropout``.
        seed: dropout seed; ``None`` draws one from torch's CPU generator (so ``torch.manual_seed`` fixes it).
            Same seed and shape give the same mask (see :func:`dropout_mask`).

    Returns:
        y: contiguous [..., n_cols], x's dtype. Formula: ``F.gelu(x + bias, approximate=approximate)`` then the
        dropout mask; GELU computed in fp32 with one rounding to x's dtype.

    Raises:
        ValueError / TypeError: bad shape, dtype, device, ``approximate`` or ``dropout_p`` (message names it).
    """
    if seed is None:
        seed = _draw_seed() if dropout_p > 0.0 else 0
    return bias_gelu_op(x, bias, approximate, float(dropout_p), int(seed))


# --- contract -------------------------------------------------------------------------------------------------


def kernel_fn(x, bias, approximate="none", dropout_p=0.0, seed=None):
    """The public wrapper, see :func:`bias_gelu`."""
    return bias_gelu(x, bias, approximate, dropout_p, seed)


def reference_fn(x, bias, approximate="none", dropout_p=0.0, seed=None):
    """Plain PyTorch: ``F.gelu(x + bias, approximate)``, then the kernel's own dropout mask (:func:`dropout_mask`).

    Raises:
        ValueError: ``dropout_p > 0`` without a seed (the mask could not be reproduced).
    """
    y = F.gelu(x + bias, approximate=approximate)
    if dropout_p > 0.0:
        if seed is None:
            raise ValueError("reference_fn needs an explicit seed when dropout_p > 0 to reproduce the kernel's mask")
        keep = dropout_mask(int(seed), y.shape, float(dropout_p), y.device)
        y = torch.where(keep, y * _dropout_scale(float(dropout_p)), torch.zeros((), dtype=y.dtype, device=y.device))
    return y


def make_inputs(n_rows: int, n_cols: int, dtype: torch.dtype = torch.bfloat16, requires_grad: bool = True,
                approximate: str = "none", dropout_p: float = 0.0, seed: int | None = None) -> list:
    """[x [n_rows, n_cols], bias [n_cols]] (+ approximate, dropout_p, seed when not the defaults)."""
    device = _device.default_device()
    x = torch.randn(n_rows, n_cols, dtype=dtype, device=device).requires_grad_(requires_grad)
    bias = (0.1 * torch.randn(n_cols, dtype=dtype, device=device)).requires_grad_(requires_grad)
    if approximate == "none" and dropout_p == 0.0:
        return [x, bias]
    return [x, bias, approximate, dropout_p, 1234 if seed is None else seed]


#: ``get_inputs(size)`` sizes, ``(n_rows, n_cols)``; ``verify`` derives its edge shapes from the first.
SIZES = [(8192, 16384)] if _device.on_gpu() else [(16, 1000)]


def get_inputs(size: tuple[int, int] | None = None) -> list:
    """``size`` = ``(n_rows, n_cols)``, default ``SIZES[0]``: GPU the MLP up-projection output of a
    GPT-style model, 8192 tokens x 16384 (4 x 4096), bf16; CPU 16 x 1000 fp32."""
    n_rows, n_cols = size or SIZES[0]
    return make_inputs(n_rows, n_cols, torch.bfloat16 if _device.on_gpu() else torch.float32)


def hard_inputs() -> list:
    """Hard values: pre-activations of large magnitude (x 100: tanh / erf saturate), and the tanh approximation."""
    x, bias = get_inputs()
    return [("x 100", [(x.detach() * 100.0).requires_grad_(True), bias]),
            ("approximate='tanh'", [x, bias, "tanh", 0.0, 1234])]


#: 8192 tokens x 4*4096 (GPT MLP) and x 11008 (Llama-7B intermediate); a decode-sized and a mid-sized batch; tanh.
BENCH_SHAPES: list[dict] = [
    {"n_rows": 8192, "n_cols": 16384, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.float16},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.float32},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.bfloat16, "approximate": "tanh"},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.bfloat16, "dropout_p": 0.1},
    {"n_rows": 2048, "n_cols": 16384, "dtype": torch.bfloat16},
    {"n_rows": 32, "n_cols": 16384, "dtype": torch.bfloat16},
]


def bytes_moved(x, bias, *args) -> int:
    """x and bias read once, y written once (the dropout mask is generated, not read)."""
    return 2 * x.numel() * x.element_size() + bias.numel() * bias.element_size()


def bytes_moved_backward(x, bias, *args) -> int:
    """grad_y, x, bias read; grad_x, grad_bias written (the fp32 partial sums are not counted)."""
    return 3 * x.numel() * x.element_size() + 2 * bias.numel() * bias.element_size()


def _pattern(x, bias):
    # HF GPT-2/BERT style: the bias of a linear layer added separately, then GELU (erf).
    return F.gelu(x + bias)


def _replacement(x, bias):
    return kernel_fn(x, bias)


ENTRY = register_kernel(KernelEntry(
    name="bias_gelu", module=__name__, op="fusion_advisor::bias_gelu", has_backward=True,
    description="dropout(gelu(x + bias)) (erf or tanh GELU, seeded dropout); matches F.gelu(x + bias)",
    pattern=_pattern, replacement=_replacement, example_args=((6, 24), (24,))))
