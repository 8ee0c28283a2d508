"""What the library's GEMM kernels share (``gemm_epilogue``: ``act(x @ w.T + bias)``; ``matmul``: batched
``a @ b``): the tile configs they autotune over, the dot precision of each operand dtype, the grouped program
ordering and the K loop of one output tile.

Structure: Triton's matmul tutorial (``python/tutorials/03-matrix-multiplication.py``): [BLOCK_M, BLOCK_N] output
tiles, grouped ordering (GROUP_M row tiles share each column tile of the second operand while it is in L2), fp32
accumulation. fp32 operands multiply as three TF32 products (see :data:`FP32_DOT_PRECISION` and gemm_epilogue's
module docstring).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_library import _device

#: ``tl.dot`` precision of fp32 operands: three TF32 products per product (hi*hi + hi*lo + lo*hi of TF32 halves),
#: fp32's accuracy on tensor cores. "tf32" would be ~3x faster again but ~1000x less accurate than the fp32 model it
#: replaces; apply's check (never further from float64 than eager) would reject it.
FP32_DOT_PRECISION = "tf32x3"


def tile_configs() -> tuple[list[triton.Config], list[triton.Config]]:
    """Autotune candidates, ``(16-bit operands, fp32 operands)``. On a GPU: the H100-class configs of Triton's
    matmul tutorial for 16-bit operands (128x256 / 256x128 tiles with 8 warps for large bf16 GEMMs, 128x128 and
    64x256 with 4 warps, 64x64 for small M such as decode), and for fp32 operands (4 bytes each: BLOCK_K 32 keeps
    3-4 pipeline stages inside the 227 KiB of shared memory) 128x256 / 256x128 / 128x128 tiles;
    :func:`prune_by_dtype` keeps the set of the operands' dtype. Under TRITON_INTERPRET: one small config, so the
    CPU interpreter never benchmarks candidates."""
    if _device.interpreted():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}, num_warps=4,
                              num_stages=1)], []

    def cfg(bm, bn, bk, warps, stages):
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps,
                             num_stages=stages)

    sixteen_bit = [cfg(128, 256, 64, 8, 3), cfg(256, 128, 64, 8, 3), cfg(128, 128, 64, 8, 4), cfg(128, 128, 64, 4, 4),
                   cfg(64, 256, 32, 4, 4), cfg(128, 64, 32, 4, 4), cfg(64, 64, 64, 4, 4), cfg(64, 128, 32, 4, 5)]
    fp32 = [cfg(128, 256, 32, 8, 3), cfg(256, 128, 32, 8, 3), cfg(128, 128, 32, 8, 4), cfg(128, 128, 32, 4, 3),
            cfg(64, 128, 32, 4, 4), cfg(64, 64, 32, 4, 4)]
    return sixteen_bit, fp32


def prune_by_dtype(operand: str, sixteen_bit: list[triton.Config], fp32: list[triton.Config]):
    """An autotune ``early_config_prune`` keeping the configs of the dtype of the kernel argument ``operand``
    (``fp32`` for fp32, else ``sixteen_bit``); all configs when that set is empty (the interpreter's one)."""

    def prune(configs: list[triton.Config], named_args: dict, **_: object) -> list[triton.Config]:
        return (fp32 if named_args[operand].dtype == torch.float32 else sixteen_bit) or configs

    return prune


def dot_args(dtype: torch.dtype) -> dict[str, object]:
    """The ``DOT_IN_FP32`` and ``DOT_PRECISION`` constexprs of :func:`tile_product` for operands of ``dtype``.

    ``DOT_IN_FP32``: TRITON_INTERPRET's ``tl.dot`` multiplies bf16 operands as their raw uint16 bits (triton 3.9,
    interpreter.py create_dot); bf16 -> fp32 is exact and the interpreter's fp32 dot is exact, so the upcast gives
    the products a GPU's bf16 tensor cores give, accumulated in fp32 as there. ``DOT_PRECISION``: fp16/bf16
    operands ignore it; "tf32" is ``tl.dot``'s default."""
    return {"DOT_IN_FP32": _device.interpreted() and dtype == torch.bfloat16,
            "DOT_PRECISION": FP32_DOT_PRECISION if dtype == torch.float32 else "tf32"}


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Output rows [BLOCK_M] and columns [BLOCK_N] (int64, so ``row * stride`` cannot overflow) of program
    ``pid`` in grouped ordering (Triton tutorial 03): consecutive programs walk GROUP_M row tiles down one
    column tile, which keeps that column tile of the second operand in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n


@triton.jit
def tile_product(a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 DOT_IN_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N] tile ``a[offs_m, :] @ b[:, offs_n]`` of ``a`` [M, K] and ``b`` [K, N] (any strides,
    elements), K in BLOCK_K steps. Rows / columns past the edge wrap onto valid ones, so the loads need no M/N mask
    (the caller's store masks them); K's tail is masked to 0."""
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M
    rn = offs_n % N
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn
    # int64 pointer steps: a transposed operand's K stride times BLOCK_K may pass 2**31.
    a_step = tl.cast(BLOCK_K, tl.int64) * stride_ak
    b_step = tl.cast(BLOCK_K, tl.int64) * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None], other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += a_step
        b_ptrs += b_step
    return acc
