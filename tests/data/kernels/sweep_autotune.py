"""Kernel file whose kernel is ``triton.autotune``-decorated: ``fusion-advisor bench --sweep`` sweeps its configs.

``out = 2 * x`` over 1-D tensors; SHAPES feed ``get_inputs(shape)``; no bytes_moved, so only times are reported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 128}, num_warps=2),
        triton.Config({"BLOCK_SIZE": 512}, num_warps=4),
    ],
    key=["n"],
)
@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask), mask=mask)


def kernel_fn(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, out, n)
    return out


def reference_fn(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


SHAPES = [(700,), (2, 300)]


def get_inputs(shape=(700,)) -> list:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [torch.randn(shape, device=device)]
