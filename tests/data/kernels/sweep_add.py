"""Kernel file with sweep hooks (``fusion-advisor bench sweep_add.py --sweep``): ``out = x + y`` on 1-D tensors.

``SWEEP_CONFIGS`` sweeps BLOCK_SIZE and num_warps. One config sets ``EVEN_N=True``, a meta-parameter that tells
the kernel the length divides the block, so it only processes whole blocks (the bug a wrong ``EVEN`` heuristic
makes): at sizes that are not a multiple of its BLOCK_SIZE the tail stays unwritten and the sweep must reject it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_kernel(
    x_ptr,  # pointer to x: [n], contiguous
    y_ptr,  # pointer to y: [n], contiguous
    out_ptr,  # pointer to out: [n], contiguous
    n,  # number of elements
    BLOCK_SIZE: tl.constexpr,
    EVEN_N: tl.constexpr,  # True: assume n % BLOCK_SIZE == 0 (only whole blocks are processed)
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if EVEN_N:
        mask = offs < (n // BLOCK_SIZE) * BLOCK_SIZE  # wrong unless BLOCK_SIZE divides n
    else:
        mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def kernel_fn(x: torch.Tensor, y: torch.Tensor, BLOCK_SIZE: int = 1024, num_warps: int = 4,
              EVEN_N: bool = False) -> torch.Tensor:
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError(f"sweep_add: x and y must be contiguous, got strides {x.stride()} and {y.stride()}")
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _add_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, y, out, n, BLOCK_SIZE=BLOCK_SIZE, EVEN_N=EVEN_N,
                                                   num_warps=num_warps)
    return out


def reference_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


#: Elements: a multiple of every BLOCK_SIZE below, and a prime (a partial last block).
SIZES = [1024, 1031]

SWEEP_CONFIGS = [
    {"BLOCK_SIZE": 256, "num_warps": 2},
    {"BLOCK_SIZE": 1024, "num_warps": 4},
    {"BLOCK_SIZE": 256, "num_warps": 4, "EVEN_N": True},  # fault: breaks masking on 1031
]


def get_inputs(size: int = 1031) -> list:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [torch.randn(size, device=device), torch.randn(size, device=device)]


def bytes_moved(x: torch.Tensor, y: torch.Tensor) -> int:
    """Read x and y once, write out once."""
    return 3 * x.numel() * x.element_size()
