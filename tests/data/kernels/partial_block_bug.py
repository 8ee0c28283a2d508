"""Deliberately FAULTY row-centering kernel, ``y = x - mean(x, -1)``: wrong only when the row width is not a
multiple of its block.

The mean is summed over the row's whole blocks only (``n_cols // BLOCK_SIZE`` of them): the last, partial block is
never added, while the division is by ``n_cols``. Every width that ``get_inputs()`` and ``SIZES`` give is a multiple
of 64, so the kernel verifies on them; ``verify``'s edge shapes (a partial last block, odd widths) reject it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_library._device import default_device

#: Columns per block: a power of two, like the chunk of a looped row kernel.
BLOCK_SIZE = 64


@triton.jit
def _center_kernel(
    x_ptr,  # pointer to x: [n_rows, n_cols], row stride stride_x
    y_ptr,  # pointer to y: [n_rows, n_cols], contiguous
    n_cols,  # row width
    stride_x,  # stride of x's row axis, in elements
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    n_whole = (n_cols // BLOCK_SIZE) * BLOCK_SIZE  # BUG (deliberate): the partial last block is left out of the sum
    for start in range(0, n_whole, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(x_ptr + row * stride_x + offs).to(tl.float32)
    mean = tl.sum(acc, 0) / n_cols
    for start in range(0, n_cols, BLOCK_SIZE):
        offs = start + tl.arange(0, BLOCK_SIZE)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, (x - mean).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x: torch.Tensor) -> torch.Tensor:
    """``x - x.mean(-1, keepdim=True)`` for ``x`` [n_rows, n_cols] (last dim contiguous)."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"partial_block_bug: x must be [n_rows, n_cols] with a contiguous last dim, got "
                         f"{list(x.shape)} strides {x.stride()}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        _center_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK_SIZE=BLOCK_SIZE)
    return y


def reference_fn(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


#: Sizes ``(n_rows, n_cols)`` for ``get_inputs(size)``: every width a multiple of BLOCK_SIZE.
SIZES = [(8, 256), (4, 512)]


def get_inputs(size: tuple[int, int] = (8, 256)) -> list:
    n_rows, n_cols = size
    return [torch.randn(n_rows, n_cols, device=default_device())]
