"""Deliberately FAULTY layout of a correct computation, ``y = 2 x``: rows on grid axis 1.

Right on every shape the Triton interpreter runs, and on a GPU up to 65,535 rows; past that CUDA refuses the launch
(grid axes 1 and 2 hold at most 65,535 programs). ``verify --shapes all`` runs 65,537 rows, and under the
interpreter :class:`fusion_advisor.verification.launch.GridLimits` refuses the launch as the GPU would.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_library._device import default_device

BLOCK_SIZE = 16


@triton.jit
def _double_kernel(
    x_ptr,  # pointer to x: [n_rows, n_cols], row stride stride_x
    y_ptr,  # pointer to y: [n_rows, n_cols], contiguous
    n_cols,  # row width
    stride_x,  # stride of x's row axis, in elements
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(1).to(tl.int64)  # BUG (deliberate): rows belong on grid axis 0
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + offs, 2.0 * x, mask=mask)


def kernel_fn(x: torch.Tensor) -> torch.Tensor:
    if x.stride(1) != 1:
        raise ValueError(f"rows_on_grid_axis1: x must be contiguous along its last axis, got strides {x.stride()}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        _double_kernel[(triton.cdiv(x.shape[1], BLOCK_SIZE), x.shape[0])](x, y, x.shape[1], x.stride(0),
                                                                          BLOCK_SIZE=BLOCK_SIZE)
    return y


def reference_fn(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * x


SIZES = [(8, 16)]


def get_inputs(size: tuple[int, int] = (8, 16)) -> list:
    return [torch.randn(*size, device=default_device())]
