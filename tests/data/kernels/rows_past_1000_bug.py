"""Deliberately FAULTY row-scaling kernel, ``y = x * w``: rows past the first 1000 are never written (NaN).

A persistent grid of ``min(n_rows, MAX_PROGRAMS)`` programs, each meant to handle rows ``pid, pid + n_programs,
...``, but written without the loop: every row from 1000 on stays as ``torch.empty`` left it, which ``verify``
poisons with NaN. ``get_inputs()`` gives 64 rows, so it verifies there; ``verify``'s edge shape of 1025 rows
rejects it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_library._device import default_device

#: Programs of the persistent grid (about the resident programs of a large GPU).
MAX_PROGRAMS = 1000


@triton.jit
def _scale_rows_kernel(
    x_ptr,  # pointer to x: [n_rows, n_cols], row stride stride_x
    w_ptr,  # pointer to w: [n_cols]
    y_ptr,  # pointer to y: [n_rows, n_cols], contiguous
    n_cols,  # row width
    stride_x,  # stride of x's row axis, in elements
    BLOCK_SIZE: tl.constexpr,  # power of two >= n_cols
):
    row = tl.program_id(0).to(tl.int64)  # BUG (deliberate): no loop over row + k * num_programs
    offs = tl.arange(0, BLOCK_SIZE)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + offs, x * w, mask=mask)


def kernel_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x * w`` for ``x`` [n_rows, n_cols] and ``w`` [n_cols], both contiguous along the last axis."""
    if x.stride(1) != 1 or w.stride(0) != 1:
        raise ValueError(f"rows_past_1000_bug: x and w must be contiguous along their last axis, got strides "
                         f"{x.stride()} and {w.stride()}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        grid = (min(x.shape[0], MAX_PROGRAMS),)
        _scale_rows_kernel[grid](x, w, y, x.shape[1], x.stride(0), BLOCK_SIZE=triton.next_power_of_2(x.shape[1]))
    return y


def reference_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


#: Sizes ``(n_rows, n_cols)`` for ``get_inputs(size)``.
SIZES = [(64, 32)]


def get_inputs(size: tuple[int, int] = (64, 32)) -> list:
    n_rows, n_cols = size
    device = default_device()
    return [torch.randn(n_rows, n_cols, device=device), torch.randn(n_cols, device=device)]
