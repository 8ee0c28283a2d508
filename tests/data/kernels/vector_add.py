"""Example kernel file following the contract of ``fusion-advisor verify`` / ``bench``: ``out = x + y``.

A user's own kernel file looks like this one: a Triton kernel, a launcher, a ``torch.library.triton_op``
wrapper, and the contract ``kernel_fn``, ``reference_fn``, ``get_inputs``. Standalone on purpose (imports
nothing from fusion-advisor), so it doubles as the template for kernels written outside the project.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# --- constants ----------------------------------------------------------------------------------------------

#: Elements per program: a power of two; 1024 is Triton's tutorial 01 value for 1-D elementwise work
#: (4 warps x 32 threads x 8 elements).
BLOCK_SIZE = 1024


# --- kernel -------------------------------------------------------------------------------------------------


@triton.jit
def _vector_add_kernel(
    x_ptr,  # pointer to x: [n]
    y_ptr,  # pointer to y: [n]
    out_ptr,  # pointer to out: [n], contiguous
    n,  # number of elements
    stride_x,  # stride of x's only axis, in elements
    stride_y,  # stride of y's only axis, in elements
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # int64: n may pass 2**31
    mask = offs < n
    x = tl.load(x_ptr + offs * stride_x, mask=mask)
    y = tl.load(y_ptr + offs * stride_y, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


# --- launcher, op, public function --------------------------------------------------------------------------


def _check(name: str, t: torch.Tensor) -> None:
    if t.dim() != 1:
        raise ValueError(f"vector_add: {name} must be 1-D [n], got shape {list(t.shape)}")


@torch.library.triton_op("fusion_advisor_examples::vector_add", mutates_args={})
def _vector_add_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n == 0:
        return out
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    torch.library.wrap_triton(_vector_add_kernel)[grid](x, y, out, n, x.stride(0), y.stride(0), BLOCK_SIZE=BLOCK_SIZE)
    return out


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for 1-D tensors ``x, y: [n]`` of one dtype on one device (any strides); returns a new ``[n]``.

    Raises:
        ValueError: not 1-D, shapes, dtypes or devices differ.
    """
    _check("x", x)
    _check("y", y)
    if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
        raise ValueError(
            f"vector_add: x and y must match in shape, dtype and device; got {list(x.shape)} {x.dtype} {x.device} "
            f"and {list(y.shape)} {y.dtype} {y.device}"
        )
    return _vector_add_op(x, y)


# --- contract -----------------------------------------------------------------------------------------------


def kernel_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return vector_add(x, y)


def reference_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def get_inputs() -> list:
    """8192 x 4096 bf16 elements (a Llama-7B activation) on a GPU; 9973 fp32 (prime: a partial last block) on CPU."""
    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    if on_gpu:
        n, dtype, device = 8192 * 4096, torch.bfloat16, "cuda"
    else:
        n, dtype, device = 9973, torch.float32, "cpu"
    return [torch.randn(n, dtype=dtype, device=device), torch.randn(n, dtype=dtype, device=device)]
