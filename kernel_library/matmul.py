"""fp32 ``torch.matmul`` / ``torch.bmm`` on tensor cores at fp32's accuracy: batched products as three TF32 products.

The GEMMs of an fp32 model that are not ``nn.Linear``: attention's ``q @ k.transpose(-2, -1)`` and ``att @ v``
(``torch.matmul`` on [B, H, T, D] tensors, or ``torch.bmm`` on [B*H, T, D] inside ``F.multi_head_attention_forward``),
and ``x @ w`` with a plain weight tensor. PyTorch runs them as cuBLAS SGEMM on CUDA cores (TF32 is off by default:
``torch.backends.cuda.matmul.allow_tf32``). This kernel is :mod:`kernel_library.gemm_epilogue`'s with a batch axis
(the tile configs, grouped ordering and K loop of :mod:`kernel_library._gemm` they share):
fp32 operands split into a TF32 high part and a TF32 residual and multiplied as hi*hi + hi*lo + lo*hi
(``tl.dot(input_precision="tf32x3")``; Henry, Tang & Heinecke, ARITH 2019; CUTLASS's 3xTF32 GEMMs), which is as
close to float64 as SGEMM is, at tensor-core speed (the 2-D kernel: 1.51-1.56x SGEMM on the H200,
benchmarks/results/h200/kernels/fp32_gemm.md; this one 1.29x torch.compile on MinGPT's [128, 8, 512, 512] attention
scores, but 0.97-0.98x where N is 96 or K 32: benchmarks/results/h200/kernels/matmul.md).

Layout: ``a`` [..., M, K] @ ``b`` [..., K, N] with numpy broadcasting of the batch dims. The kernel takes two batch
axes natively (strides per axis, 0 for a broadcast one), so [B, H, T, D] operands that are transposed views (q, k, v
after ``.transpose(1, 2)``) are read in place, never copied; more batch axes are folded into two (a copy only where
strides cannot be merged). A 2-D ``b`` under a batched ``a`` is one GEMM over ``a``'s flattened rows. Program
instances: axis 0 walks the [BLOCK_M, BLOCK_N] output tiles of one product in grouped order (Triton tutorial 03),
axis 1 the batch (at most 65535 per launch: larger batches launch in slices).

Backward: ``da = dc @ b^T`` and ``db = a^T @ dc`` with the same kernel, summed over broadcast batch dims.

Two registry entries replace the analysis' heavy ``matmul`` item: ``matmul`` (``torch.matmul`` / ``@`` with both
operands at least 2-D) and ``bmm`` (``torch.bmm``). Both match fp32 sites only, and only products of at least
:data:`MIN_OUTPUT_ELEMENTS` outputs: a small GEMM (fewer output tiles than SMs) loses to cuBLAS.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library._checks import check_operands
from kernel_library._gemm import dot_args, grouped_tile, prune_by_dtype, tile_configs, tile_product
from kernel_library._op import launcher, library_op
from kernel_library._rows import rows_view
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ------------------------------------------------------------------------------------------------

#: Smallest product (batch x M x N output elements) the registry entries match: 2**18, two 128 x 128 output tiles
#: per SM of the H200's 132. Below it a 2-D fp32 GEMM lost to SGEMM on the H200 (128 x 1000 x 4096: 0.94x;
#: benchmarks/results/h200/kernels/fp32_gemm.md), and apply reports the site as a near-miss instead of spending
#: its time checking it. Above it apply still times every swap and keeps only those that win (the attention
#: products of kernels/matmul.md: 1.29x torch.compile for the scores, 0.98x for att @ v).
MIN_OUTPUT_ELEMENTS = 1 << 18

#: Batch slices per launch: CUDA's limit on grid axis 1.
MAX_BATCH_PER_LAUNCH = 65535

_CONFIGS_16BIT, _CONFIGS_FP32 = tile_configs()

#: Narrow-N tiles for fp32, added to gemm_epilogue's set for attention's ``att @ v`` (N = head dim: 96 in
#: KernelBench's MinGPT, 32 in its VisionAttention), where a 128- or 256-wide tile computes 25-67% padding and the
#: library kernel lost to cuBLAS (0.98x at N 96, benchmarks/results/h200/kernels/matmul.md). Not yet timed on a GPU:
#: autotuning picks among all configs by measurement, so they can only be chosen where they are faster.
if _CONFIGS_FP32:
    _CONFIGS_FP32 = _CONFIGS_FP32 + [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 32, "GROUP_M": 8}, num_warps=w, num_stages=st)
        for bm, bn, w, st in ((128, 32, 4, 4), (256, 32, 8, 3), (256, 64, 8, 3))]


# --- kernel ---------------------------------------------------------------------------------------------------


@triton.autotune(configs=_CONFIGS_16BIT + _CONFIGS_FP32, key=["M", "N", "K"],
                 prune_configs_by={"early_config_prune": prune_by_dtype("a_ptr", _CONFIGS_16BIT, _CONFIGS_FP32)})
@triton.jit
def _bmm_kernel(
    a_ptr,  # a [B0, B1, M, K]
    b_ptr,  # b [B0, B1, K, N]
    c_ptr,  # c [B0, B1, M, N] (output)
    M,
    N,
    K,
    B1,  # size of the inner batch axis (program_id(1) = i0 * B1 + i1)
    stride_a0,  # a: elements between outer batch entries (0: broadcast)
    stride_a1,  # a: elements between inner batch entries (0: broadcast)
    stride_am,  # a: elements between rows
    stride_ak,  # a: elements between columns
    stride_b0,  # b: elements between outer batch entries (0: broadcast)
    stride_b1,  # b: elements between inner batch entries (0: broadcast)
    stride_bk,  # b: elements between rows (the K axis)
    stride_bn,  # b: elements between columns
    stride_c0,  # c: elements between outer batch entries
    stride_c1,  # c: elements between inner batch entries
    stride_cm,  # c: elements between rows
    stride_cn,  # c: elements between columns
    DOT_IN_FP32: tl.constexpr,  # interpreter workaround for bf16 (_gemm.dot_args); False on GPUs
    DOT_PRECISION: tl.constexpr,  # tl.dot input_precision: _gemm.FP32_DOT_PRECISION for fp32 operands, else "tf32"
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row tiles per group of the L2-friendly ordering
):
    batch = tl.program_id(1).to(tl.int64)
    i0 = batch // B1
    i1 = batch % B1
    a_ptr += i0 * stride_a0 + i1 * stride_a1
    b_ptr += i0 * stride_b0 + i1 * stride_b1
    c_ptr += i0 * stride_c0 + i1 * stride_c1

    offs_m, offs_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tile_product(a_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       DOT_IN_FP32, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


# --- launchers ------------------------------------------------------------------------------------------------


def _check_args(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError(f"a and b must be at least 2-D ([..., M, K] and [..., K, N]), got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a's last dim ({a.shape[-1]}) must equal b's second-to-last ({b.shape[-2]}): shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    check_operands(a, "a", ("b", b))


def _as_two_batch_axes(t: torch.Tensor) -> torch.Tensor:
    """``t`` [*batch, R, C] as [B0, B1, R, C]: size-1 axes in front of fewer than two batch axes, the leading ones
    folded together for more (a view where the strides allow, else a copy)."""
    while t.dim() < 4:
        t = t.unsqueeze(0)
    if t.dim() > 4:
        t = t.reshape(-1, *t.shape[-3:])
    return t


def _launch(a4: torch.Tensor, b4: torch.Tensor, c4: torch.Tensor) -> None:
    B0, B1, M, K = a4.shape
    N = b4.shape[-1]
    if B1 > MAX_BATCH_PER_LAUNCH:
        raise ValueError(f"inner batch axis of {B1} exceeds {MAX_BATCH_PER_LAUNCH} products per launch")
    # whole outer-batch entries per launch, so that one launch's grid axis 1 stays within CUDA's limit
    step = MAX_BATCH_PER_LAUNCH // max(B1, 1)
    for start in range(0, B0, step):
        a_s, b_s, c_s = a4[start:start + step], b4[start:start + step], c4[start:start + step]
        batches = a_s.shape[0] * B1

        def grid(meta, batches=batches):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), batches)

        launcher(_bmm_kernel)[grid](
            a_s, b_s, c_s, M, N, K, B1,
            a_s.stride(0), a_s.stride(1), a_s.stride(2), a_s.stride(3),
            b_s.stride(0), b_s.stride(1), b_s.stride(2), b_s.stride(3),
            c_s.stride(0), c_s.stride(1), c_s.stride(2), c_s.stride(3),
            **dot_args(a4.dtype),
        )


def matmul_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)`` for operands of at least 2 dims: contiguous [*batch, M, N]. See :func:`matmul`."""
    _check_args(a, b)
    M, K = a.shape[-2:]
    N = b.shape[-1]
    if b.dim() == 2 and a.dim() > 2:
        # one GEMM over a's rows: [rows, K] @ [K, N] fills the GPU where per-batch products would not
        a2 = rows_view(a)
        c = torch.empty((a2.shape[0], N), dtype=a.dtype, device=a.device)
        if c.numel():
            _launch(a2[None, None], b[None, None], c[None, None])
        return c.view(*a.shape[:-1], N)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    c = torch.empty((*batch, M, N), dtype=a.dtype, device=a.device)
    if c.numel():
        a4 = _as_two_batch_axes(a.expand(*batch, M, K))
        b4 = _as_two_batch_axes(b.expand(*batch, K, N))
        _launch(a4, b4, c.view(*a4.shape[:2], M, N))
    return c


# --- torch.library op and autograd ----------------------------------------------------------------------------


@library_op("fusion_advisor::matmul", mutates_args={})
def matmul_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return matmul_forward(a, b)


def _setup_context(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = matmul_op(grad_c, b.transpose(-1, -2)).sum_to_size(a.shape)
    if ctx.needs_input_grad[1]:
        if b.dim() == 2:
            # b shared by every batch entry: one GEMM over all rows, [K, rows] @ [rows, N]
            grad_b = matmul_op(rows_view(a).transpose(0, 1), rows_view(grad_c))
        else:
            grad_b = matmul_op(a.transpose(-1, -2), grad_c).sum_to_size(b.shape)
    return grad_a, grad_b


matmul_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ------------------------------------------------------------------------------------------


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)`` for operands of at least 2 dims; fp32 operands multiplied as 3xTF32 on a GPU (fp32
    accuracy), exact fp32 under TRITON_INTERPRET; fp16/bf16 as their tensor-core products. Differentiable in a, b.

    Args:
        a: [..., M, K] fp32 (fp16/bf16 accepted), any strides.
        b: [..., K, N], a's dtype, any strides; batch dims broadcast against a's as in ``torch.matmul``.

    Returns:
        contiguous [*broadcast batch, M, N] in a's dtype, accumulated in fp32.

    Raises:
        ValueError / TypeError: operands under 2-D, mismatched K, dtypes or devices (the message names them).
    """
    return matmul_op(a, b)


# --- contract -------------------------------------------------------------------------------------------------


def kernel_fn(a, b):
    """The public wrapper, see :func:`matmul`."""
    return matmul(a, b)


def reference_fn(a, b):
    """Plain PyTorch: ``torch.matmul(a, b)``."""
    return torch.matmul(a, b)


def make_inputs(B: int, H: int, M: int, N: int, K: int, dtype: torch.dtype = torch.float32,
                transposed_b: bool = True, flat: bool = False, requires_grad: bool = True,
                scale: float = 1.0) -> list:
    """[a [B, H, M, K], b [B, H, K, N]] as attention writes them: ``a`` a transposed view of a [B, M, H, K] tensor
    (q after ``.transpose(1, 2)``), ``b`` with ``transposed_b`` the transpose of a [B, H, N, K] tensor (k^T), so
    neither is contiguous; entries ~ N(0, scale^2) / N(0, 1/K). ``flat``: [B*H, M, K] and [B*H, K, N] as
    ``F.multi_head_attention_forward`` hands them to ``torch.bmm`` (``a`` contiguous, ``b`` still transposed)."""
    device = _device.default_device()
    a = (scale * torch.randn(B, M, H, K, device=device)).to(dtype).transpose(1, 2)
    if transposed_b:
        b = (torch.randn(B, H, N, K, device=device) / max(K, 1) ** 0.5).to(dtype).transpose(-1, -2)
    else:
        b = (torch.randn(B, H, K, N, device=device) / max(K, 1) ** 0.5).to(dtype)
    if flat:
        a = a.reshape(B * H, M, K)
        b = b.reshape(B * H, K, N) if not transposed_b else b.transpose(-1, -2).reshape(B * H, N, K).transpose(-1, -2)
    return [a.detach().requires_grad_(requires_grad), b.detach().requires_grad_(requires_grad)]


#: ``get_inputs(size)`` sizes, ``(B, H, M, N, K)``: attention scores of KernelBench level 3's MinGPT block (batch
#: 128, 8 heads, 512 tokens, head dim 96) on a GPU; small and odd under the CPU interpreter.
SIZES = [(128, 8, 512, 512, 96)] if _device.on_gpu() else [(2, 3, 37, 41, 24)]

#: The shapes ``verify`` runs besides ``get_inputs()``: one row, a single product, odd M/N/K (partial tiles on
#: every side), a broadcast-free tiny batch, many small products.
VERIFY_SIZES = [(1, 1, 1, 40, 48), (1, 1, 37, 41, 47), (2, 2, 5, 3, 7), (3, 5, 33, 17, 9), (40, 7, 3, 5, 5)]


def get_inputs(size: tuple[int, int, int, int, int] | None = None) -> list:
    """``size`` = ``(B, H, M, N, K)``, default ``SIZES[0]``; fp32 (what this op is for)."""
    return make_inputs(*(size or SIZES[0]), dtype=torch.float32)


def hard_inputs() -> list:
    """The hard values of an fp32 GEMM (as :func:`kernel_library.linear.hard_inputs`): large inputs (x 1e4: the
    split's residual must keep its relative size) and cancelling sums (each row of ``a`` paired with its negation
    across K, so every exact product sum is ~0 and only the rounding is left); and a broadcast ``b`` (stride 0 over
    the batch)."""
    a, b = get_inputs()
    large = (a.detach() * 1e4).requires_grad_(True)
    half = a.shape[-1] // 2
    cancel_a = a.detach().clone()
    cancel_b = b.detach().clone()
    cancel_a[..., half:2 * half] = cancel_a[..., :half]
    cancel_b[..., half:2 * half, :] = cancel_b[..., :half, :]
    shared_b = b.detach()[:1, :1].clone().requires_grad_(True)
    return [("inputs x 1e4", [large, b]),
            ("cancelling sums", [cancel_a.requires_grad_(True), cancel_b.requires_grad_(True)]),
            ("b broadcast over the batch", [a, shared_b])]


#: GPU benchmark shapes: attention's two products at KernelBench level 3's MinGPT widths (scores, then att @ v), a
#: ViT-sized one, forward+backward, and ``bmm`` on [B*H, T, D] operands as nn.MultiheadAttention computes its
#: weights (``flat``).
BENCH_SHAPES: list[dict] = [
    {"B": 128, "H": 8, "M": 512, "N": 512, "K": 96, "requires_grad": False},
    {"B": 128, "H": 8, "M": 512, "N": 96, "K": 512, "transposed_b": False, "requires_grad": False},
    {"B": 10, "H": 8, "M": 197, "N": 197, "K": 64, "requires_grad": False},
    {"B": 128, "H": 8, "M": 512, "N": 512, "K": 96},
    {"B": 2, "H": 4, "M": 4096, "N": 4096, "K": 32, "flat": True, "requires_grad": False},
]


def bytes_moved(a, b) -> int:
    """a, b read once, c written once (a GEMM is compute-bound: see :func:`flops`)."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = math.prod(batch) * a.shape[-2] * b.shape[-1]
    return (a.numel() + b.numel() + out) * a.element_size()


def bytes_moved_backward(a, b) -> int:
    """dc read twice (for da and db), a and b read once, da and db written once."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = math.prod(batch) * a.shape[-2] * b.shape[-1]
    return (2 * out + 2 * (a.numel() + b.numel())) * a.element_size()


def flops(a, b) -> int:
    """2 x batch x M x N x K."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return 2 * math.prod(batch) * a.shape[-2] * b.shape[-1] * a.shape[-1]


#: fp32 products run as 3xTF32 (fp32 accuracy): ``verify`` holds fp32 outputs to the fp32 policy, no TF32 floor.
USES_TF32 = False


# --- registration ---------------------------------------------------------------------------------------------


def _large_enough(a, b) -> bool:
    """Both operands at least 2-D and a product of at least :data:`MIN_OUTPUT_ELEMENTS` outputs."""
    if a.dim() < 2 or b.dim() < 2:
        return False
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return math.prod(batch) * a.shape[-2] * b.shape[-1] >= MIN_OUTPUT_ELEMENTS


def _pattern(a, b):
    return torch.matmul(a, b)


def _pattern_bmm(a, b):
    return torch.bmm(a, b)


def _replacement(a, b):
    return kernel_fn(a, b)


def bench_entry(shape: dict) -> str:
    """``bmm`` for a ``flat`` shape (3-D operands), else ``matmul``."""
    return "bmm" if shape.get("flat") else "matmul"


def contract_for(name: str) -> dict | None:
    """``fusion-advisor verify``'s contract of ``bmm``: every input set as [B*H, M, K] @ [B*H, K, N]."""
    if name != "bmm":
        return None

    def flat(args: list) -> list:
        a, b = (t.detach() for t in args)
        b = b.expand(*a.shape[:-2], *b.shape[-2:])
        return [a.reshape(-1, *a.shape[-2:]).requires_grad_(True), b.reshape(-1, *b.shape[-2:]).requires_grad_(True)]

    return {"get_inputs": lambda size=None: flat(get_inputs(size)),
            "hard_inputs": lambda: [(label, flat(args)) for label, args in hard_inputs()],
            "reference_fn": torch.bmm}


_COMMON = dict(module=__name__, replaces="matmul", op="fusion_advisor::matmul", dtypes=(torch.float32,),
               match_dtypes=(torch.float32,), has_backward=True, extra_check=_large_enough,
               replacement=_replacement, heavy_targets=("bmm",))

ENTRY = register_kernel(KernelEntry(
    name="matmul", description="fp32 torch.matmul(a, b) / a @ b (both at least 2-D) as 3xTF32 tensor-core products "
                               "(fp32 accuracy)",
    example_args=((2, 6, 16), (2, 16, 8)), pattern=_pattern, **_COMMON))
ENTRY_BMM = register_kernel(KernelEntry(
    name="bmm", description="fp32 torch.bmm(a, b) as 3xTF32 tensor-core products (fp32 accuracy)",
    example_args=((2, 6, 16), (2, 16, 8)), pattern=_pattern_bmm, **_COMMON))
