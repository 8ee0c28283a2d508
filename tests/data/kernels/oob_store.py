"""A kernel whose output is right but whose store mask is off by one: it writes one element past the end of the
output it allocates (``offs <= n`` instead of ``offs < n``). The values verify; only the redzone catches it."""

import torch
import triton
import triton.language as tl

from kernel_library._device import default_device


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, x * 2.0, mask=offs <= n)  # the bug: one element too many


def kernel_fn(x):
    y = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[(triton.cdiv(n + 1, 64),)](x, y, n, BLOCK_SIZE=64)
    return y


def reference_fn(x):
    return x * 2.0


def get_inputs():
    return [torch.randn(1000, device=default_device())]
