"""Deliberately BROKEN elementwise add, ``out = x + y``: its mask is off by one, so the last element stays unwritten.

vector_add.py with the bug, cut to what the contract needs. Used by tests/test_verify.py and tests/test_bench.py:
verify must catch the unwritten element (it is poisoned with NaN) and bench must refuse to time the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_library._device import default_device

BLOCK_SIZE = 1024


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, stride_x, stride_y, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n - 1  # BUG (deliberate): off by one, the last element is never written
    tl.store(out_ptr + offs, tl.load(x_ptr + offs * stride_x, mask=mask) + tl.load(y_ptr + offs * stride_y, mask=mask),
             mask=mask)


@torch.library.triton_op("fusion_advisor_examples::broken_mask_add", mutates_args={})
def _add_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        grid = (triton.cdiv(x.numel(), BLOCK_SIZE),)
        torch.library.wrap_triton(_add_kernel)[grid](x, y, out, x.numel(), x.stride(0), y.stride(0),
                                                     BLOCK_SIZE=BLOCK_SIZE)
    return out


def kernel_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for 1-D ``x, y: [n]``, except the last element (the bug)."""
    return _add_op(x, y)


def reference_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def get_inputs() -> list:
    """Two 9973-element fp32 vectors (prime: a partial last block) on the default device."""
    return [torch.randn(9973, device=default_device()) for _ in range(2)]
