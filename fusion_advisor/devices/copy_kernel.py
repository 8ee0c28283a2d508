"""A vector-copy Triton kernel: the smallest kernel that exercises Triton end to end, used by ``doctor``.

``out[i] = x[i]`` for a contiguous 1-D tensor. A copy reads and writes every byte once, so its GB/s (bytes read
plus written per second) is the memory-bandwidth ceiling every memory-bound kernel is compared with
(4275 GB/s on our H200: fusion_advisor/devices/h200.yaml). Imported only after ``TRITON_INTERPRET`` is settled: Triton decides
between compiling and interpreting when the kernel is decorated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Elements per program: a power of two; 1024 is Triton's tutorial 01 value for 1-D elementwise work
#: (4 warps x 32 threads x 8 elements), enough for 16-byte vector loads of fp32.
BLOCK_SIZE = 1024


@triton.jit
def _copy_kernel(
    x_ptr,  # pointer to x: [n], contiguous
    out_ptr,  # pointer to out: [n], contiguous
    n,  # number of elements
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # int64: n may pass 2**31
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def copy(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy ``x: [n]`` (1-D, contiguous, any dtype) with :func:`_copy_kernel` into ``out`` (a new ``[n]`` when
    ``None``: pass one to time the kernel without the allocation) and return ``out``.

    Raises:
        ValueError: ``x`` is not 1-D or not contiguous; ``out`` differs from ``x`` in shape, dtype or device,
            or is not contiguous.
    """
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"copy: x must be a contiguous 1-D tensor [n], got shape {list(x.shape)}, "
                         f"strides {list(x.stride())}")
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"copy: out must be a contiguous {list(x.shape)} {x.dtype} tensor on {x.device}, got "
                         f"{list(out.shape)} {out.dtype} on {out.device}")
    n = x.numel()
    if n == 0:
        return out
    _copy_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK_SIZE=BLOCK_SIZE)
    return out


def bytes_moved(x: torch.Tensor) -> int:
    """Bytes a copy of ``x`` must move: each element read once and written once."""
    return 2 * x.numel() * x.element_size()
