"""fp32 ``nn.Linear`` on tensor cores at fp32's accuracy: ``y = x @ w.T + bias`` as three TF32 products.

PyTorch runs an fp32 ``F.linear`` as cuBLAS SGEMM on CUDA cores (TF32 is off by default:
``torch.backends.cuda.matmul.allow_tf32``), about 51 TFLOP/s on our H200. TF32 would be 7x faster but ~200x less
accurate (relative error 2.9e-4 against SGEMM's 1.6e-6 at 1024 x 8192 x 8192), which a model written in fp32 did
not ask for. This op is the library's GEMM (:mod:`kernel_library.gemm_epilogue`, activation ``none``) whose fp32
operands are split into a TF32 high part and a TF32 residual and multiplied as hi*hi + hi*lo + lo*hi
(``tl.dot(input_precision="tf32x3")``; Henry, Tang & Heinecke, ARITH 2019; CUTLASS's 3xTF32 GEMMs): on the H200
77-79 TFLOP/s, 1.51-1.56x SGEMM at KernelBench's GEMM widths, with a relative error of 1.7e-7 to 5.9e-7, below
SGEMM's own (benchmarks/results/h200/kernels/fp32_gemm.md). Small GEMMs (fewer output tiles than SMs) lose to
cuBLAS, which is why the shipped rule routes only large fp32 GEMMs here and apply keeps a swap only when the whole
model gets faster.

Two registry entries, both replacing the heavy ``matmul`` item of the analysis: ``linear`` (``F.linear`` with a
bias, nn.Linear's default) and ``linear_nobias``. Both match fp32 sites only (``match_dtypes``): a 16-bit GEMM is
cuBLAS's tensor-core GEMM already, not a near miss. Backward: ``dx = dy @ w`` and ``dw = dy.T @ x`` run as
``torch.mm`` (see :func:`kernel_library.gemm_epilogue.gemm_epilogue_backward`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernel_library import _device
from kernel_library.gemm_epilogue import bytes_moved as gemm_bytes_moved
from kernel_library.gemm_epilogue import flops as gemm_flops
from kernel_library.gemm_epilogue import gemm_epilogue
from kernel_library.gemm_epilogue import make_inputs as gemm_make_inputs
from kernel_library.registry import KernelEntry, register_kernel

# --- public function ------------------------------------------------------------------------------------------


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)``; fp32 operands multiplied as 3xTF32 on a GPU (fp32 accuracy), exact fp32 under
    TRITON_INTERPRET; fp16/bf16 as their tensor-core products. Differentiable in x, w and bias.

    Args:
        x: [..., K] fp32 (fp16/bf16 accepted), any strides.
        w: [N, K] (nn.Linear weight), x's dtype.
        bias: [N] or None, x's dtype.

    Returns:
        contiguous [..., N] in x's dtype.

    Raises:
        ValueError / TypeError: bad shapes, dtypes or device (the message names the argument).
    """
    return gemm_epilogue(x, w, bias, "none")


# --- contract -------------------------------------------------------------------------------------------------


def kernel_fn(x, w, bias=None):
    """The public wrapper, see :func:`linear`."""
    return linear(x, w, bias)


def reference_fn(x, w, bias=None):
    """Plain PyTorch: ``F.linear(x, w, bias)``."""
    return F.linear(x, w, bias)


def make_inputs(M: int, N: int, K: int, dtype: torch.dtype = torch.float32, bias: bool = True,
                requires_grad: bool = True, scale: float = 1.0) -> list:
    """[x [M, K], w [N, K], bias [N] or None]: :func:`kernel_library.gemm_epilogue.make_inputs` without the
    activation."""
    return gemm_make_inputs(M, N, K, dtype, bias, "none", requires_grad, scale)[:3]


#: ``get_inputs(size)`` sizes, ``(M, N, K)``: KernelBench level 2's GEMM (1024 x 8192 -> 8192) on a GPU.
SIZES = [(1024, 8192, 8192)] if _device.on_gpu() else [(37, 40, 48)]

#: The shapes ``verify`` runs besides ``get_inputs()``: one row, odd N and K (partial tiles on both), a tiny odd
#: problem, 1025 rows, 65537 rows.
VERIFY_SIZES = [(1, 40, 48), (37, 41, 47), (5, 3, 7), (1025, 3, 5), (65537, 3, 5)]


def get_inputs(size: tuple[int, int, int] | None = None) -> list:
    """``size`` = ``(M, N, K)``, default ``SIZES[0]``; fp32 (what this op is for)."""
    M, N, K = size or SIZES[0]
    return make_inputs(M, N, K, torch.float32)


def hard_inputs() -> list:
    """The hard values of an fp32 GEMM: large inputs (x 1e4, products near 1e8 summed over K: the split's residual
    must keep its relative size) and cancelling sums (each row of x is paired with its negation across K, so every
    exact product sum is ~0 and only the rounding is left)."""
    x, w, b = get_inputs()
    large = (x.detach() * 1e4).requires_grad_(True)
    half = x.shape[-1] // 2
    cancel_x = x.detach().clone()
    cancel_w = w.detach().clone()
    cancel_x[:, half:2 * half] = cancel_x[:, :half]
    cancel_w[:, half:2 * half] = -cancel_w[:, :half]
    return [("inputs x 1e4", [large, w, b]),
            ("cancelling sums", [cancel_x.requires_grad_(True), cancel_w.requires_grad_(True), b])]


def _without_bias(args: list) -> list:
    return [args[0], args[1], None]


def contract_for(name: str) -> dict | None:
    """``fusion-advisor verify``'s contract of the registry entry ``name`` where it is not this module's main one:
    ``linear_nobias`` runs every input set (``get_inputs``, its sizes, the hard values) with ``bias=None``."""
    if name != "linear_nobias":
        return None
    return {"get_inputs": lambda size=None: _without_bias(get_inputs(size)),
            "hard_inputs": lambda: [(label, _without_bias(args)) for label, args in hard_inputs()]}


#: GPU benchmark shapes: KernelBench level 2's GEMM widths in fp32, one without bias, and one small GEMM (fewer
#: output tiles than SMs: cuBLAS wins there; the rule keeps such GEMMs on cuBLAS).
BENCH_SHAPES: list[dict] = [
    {"M": 1024, "N": 8192, "K": 8192, "requires_grad": False},
    {"M": 128, "N": 32768, "K": 32768, "requires_grad": False},
    {"M": 16384, "N": 4096, "K": 4096, "requires_grad": False},
    {"M": 1024, "N": 8192, "K": 8192, "bias": False, "requires_grad": False},
    {"M": 128, "N": 1000, "K": 4096, "requires_grad": False},
    {"M": 2048, "N": 4096, "K": 4096},
]


def bench_entry(shape: dict) -> str:
    """``linear_nobias`` for a shape with ``bias=False``, else ``linear`` (this module registers both)."""
    return "linear" if shape.get("bias", True) else "linear_nobias"


def bytes_moved(x, w, bias=None) -> int:
    """x, w, bias read once, y written once (:func:`kernel_library.gemm_epilogue.bytes_moved`)."""
    return gemm_bytes_moved(x, w, bias)


def flops(x, w, bias=None) -> int:
    """2 M N K."""
    return gemm_flops(x, w)


# --- registration ---------------------------------------------------------------------------------------------


def _pattern(x, w, bias):
    return F.linear(x, w, bias)


def _replacement(x, w, bias):
    return kernel_fn(x, w, bias)


def _pattern_nobias(x, w):
    return F.linear(x, w)


def _replacement_nobias(x, w):
    return kernel_fn(x, w, None)


_COMMON = dict(module=__name__, replaces="matmul", op="fusion_advisor::gemm_epilogue", dtypes=(torch.float32,),
               match_dtypes=(torch.float32,), has_backward=True, heavy_targets=("addmm", "mm"))

ENTRY = register_kernel(KernelEntry(
    name="linear", description="fp32 F.linear(x, w, bias) as 3xTF32 tensor-core products (fp32 accuracy)",
    example_args=((6, 16), (24, 16), (24,)),
    pattern=_pattern, replacement=_replacement, **_COMMON))
ENTRY_NOBIAS = register_kernel(KernelEntry(
    name="linear_nobias", description="fp32 F.linear(x, w) without bias as 3xTF32 tensor-core products",
    example_args=((6, 16), (24, 16)),
    pattern=_pattern_nobias, replacement=_replacement_nobias, **_COMMON))
