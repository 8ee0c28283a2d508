"""GEMM with a fused epilogue: ``y = act(x @ w.T + bias)``, forward and backward.

Replaces the ``gemm_epilogue`` chain: ``act(F.linear(x, w, bias))`` (nn.Linear layout: ``w`` is [N, K]) with
``act`` in none / relu / gelu (erf) / gelu_tanh / silu: the bias add and the activation run on the fp32
accumulator tile before the one store, instead of two more passes over the [M, N] output.

Kernel: Triton's matmul tutorial structure (``python/tutorials/03-matrix-multiplication.py``): [BLOCK_M, BLOCK_N]
output tiles, grouped program ordering (GROUP_M row tiles share each column tile of ``w`` while it is in L2),
fp32 accumulation, ``@triton.autotune`` over a handful of configs keyed on (M, N, K); the configs, the ordering
and the K loop live in :mod:`kernel_library._gemm`, shared with :mod:`kernel_library.matmul`.

fp32 inputs run on tensor cores at fp32's accuracy: ``tl.dot(..., input_precision="tf32x3")`` splits each operand
into a TF32 high part and a TF32 residual and sums three TF32 products (hi*hi + hi*lo + lo*hi; the split of
Henry, Tang & Heinecke, "Leveraging the bfloat16 AI datatype for higher-precision computations", ARITH 2019, and
of CUTLASS's 3xTF32 "fast accurate" GEMMs). Each product keeps ~21 of fp32's 24 mantissa bits, far below the
fp32 accumulation error of a K-long sum, so the result is as close to float64 as cuBLAS's fp32 SGEMM (which
PyTorch runs without TF32 by default), at three tensor-core passes instead of CUDA-core FMAs. fp16/bf16 inputs
use their native tensor-core products. Under TRITON_INTERPRET every dot is exact fp32.

Backward (``dz = dy * act'(z)``, ``dx = dz @ w``, ``dw = dz.T @ x``, ``dbias = sum dz``): the same kernel
recomputes ``z = x @ w.T + bias`` tile by tile and writes ``dz`` directly (an activation-gradient epilogue, so
``z`` is never stored); the two plain GEMMs go to ``torch.mm`` (cuBLAS: nothing to fuse there, and the routing
rules skip lone matmuls). With ``act = none``, ``dz = dy`` and no recompute runs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library._activations import gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad, silu, silu_grad
from kernel_library._checks import check_operands
from kernel_library._gemm import dot_args, grouped_tile, prune_by_dtype, tile_configs, tile_product
from kernel_library._op import launcher, library_op
from kernel_library._rows import rows_view
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ------------------------------------------------------------------------------------------------

#: Epilogue activations, named as the chain patterns name them ("gelu" is erf GELU, F.gelu's default).
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")

_CONFIGS_16BIT, _CONFIGS_FP32 = tile_configs()


# --- kernel ---------------------------------------------------------------------------------------------------


@triton.jit
def _act(z, ACTIVATION: tl.constexpr):
    # z fp32. relu as where(z < 0, 0, z) so that NaN propagates as in torch.relu.
    if ACTIVATION == "relu":
        y = tl.where(z < 0.0, 0.0, z)
    elif ACTIVATION == "gelu":
        y = gelu_erf(z)
    elif ACTIVATION == "gelu_tanh":
        y = gelu_tanh(z)
    elif ACTIVATION == "silu":
        y = silu(z)
    else:
        y = z
    return y


@triton.jit
def _act_grad(z, ACTIVATION: tl.constexpr):
    # d act / dz, z fp32; relu's is 1 where z > 0, else 0 (torch's threshold_backward).
    if ACTIVATION == "relu":
        g = tl.where(z > 0.0, 1.0, 0.0)
    elif ACTIVATION == "gelu":
        g = gelu_erf_grad(z)
    elif ACTIVATION == "gelu_tanh":
        g = gelu_tanh_grad(z)
    elif ACTIVATION == "silu":
        g = silu_grad(z)
    else:
        g = tl.full(z.shape, 1.0, tl.float32)
    return g


# M (the token count: 1 when decoding) is not specialised: loads vectorise along K and stores along N, so its
# divisibility buys nothing and would compile a variant per token-count class.
@triton.autotune(configs=_CONFIGS_16BIT + _CONFIGS_FP32, key=["M", "N", "K"],
                 prune_configs_by={"early_config_prune": prune_by_dtype("x_ptr", _CONFIGS_16BIT, _CONFIGS_FP32)})
@triton.jit(do_not_specialize=["M"])
def _gemm_epilogue_kernel(
    x_ptr,  # x [M, K]
    w_ptr,  # w [N, K] (nn.Linear weight)
    bias_ptr,  # bias [N] (unused without HAS_BIAS)
    grad_ptr,  # dL/dy [M, N] (read only with ACT_GRAD)
    y_ptr,  # output [M, N]: act(z), or dL/dz = dL/dy * act'(z) with ACT_GRAD
    M,
    N,
    K,
    stride_xm,  # x: elements between rows
    stride_xk,  # x: elements between columns
    stride_wn,  # w: elements between rows (output features)
    stride_wk,  # w: elements between columns (input features)
    stride_bias,  # bias: elements between entries
    stride_gm,  # grad: elements between rows
    stride_gn,  # grad: elements between columns
    stride_ym,  # y: elements between rows
    stride_yn,  # y: elements between columns
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # one of ACTIVATIONS
    ACT_GRAD: tl.constexpr,  # epilogue writes dL/dz instead of act(z)
    DOT_IN_FP32: tl.constexpr,  # interpreter workaround for bf16 (_gemm.dot_args); False on GPUs
    DOT_PRECISION: tl.constexpr,  # tl.dot input_precision: _gemm.FP32_DOT_PRECISION for fp32 operands, else "tf32"
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row tiles per group of the L2-friendly ordering
):
    offs_m, offs_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tile_product(x_ptr, w_ptr, offs_m, offs_n, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn,
                       DOT_IN_FP32, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)  # w [N, K] read as w.T [K, N]
    rn = offs_n % N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn * stride_bias).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if ACT_GRAD:
        g = tl.load(grad_ptr + offs_m[:, None] * stride_gm + offs_n[None, :] * stride_gn, mask=mask, other=0.0)
        out = g.to(tl.float32) * _act_grad(acc, ACTIVATION)
    else:
        out = _act(acc, ACTIVATION)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=mask)


# --- launchers ------------------------------------------------------------------------------------------------


def _check_args(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str) -> None:
    if x.dim() < 1:
        raise ValueError(f"x must be [..., K], got shape {tuple(x.shape)}")
    if w.dim() != 2 or w.shape[1] != x.shape[-1]:
        raise ValueError(f"w must be [N, {x.shape[-1]}] (nn.Linear weight, K = x's last dim), got {tuple(w.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != w.shape[0]):
        raise ValueError(f"bias must be [{w.shape[0]}] (w's rows), got {tuple(bias.shape)}")
    check_operands(x, "x", ("w", w), ("bias", bias))
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _launch(x2, w, bias, grad, y, activation: str, act_grad: bool) -> None:
    M, K = x2.shape
    N = w.shape[0]
    grad = y if grad is None else grad  # placeholder pointer, never read without ACT_GRAD
    bias_arg = x2 if bias is None else bias  # placeholder pointer, never read without HAS_BIAS

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    launcher(_gemm_epilogue_kernel)[grid](
        x2, w, bias_arg, grad, y, M, N, K,
        x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), 0 if bias is None else bias.stride(0),
        grad.stride(0), grad.stride(1), y.stride(0), y.stride(1),
        HAS_BIAS=bias is not None, ACTIVATION=activation, ACT_GRAD=act_grad, **dot_args(x2.dtype),
    )


def gemm_epilogue_forward(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> torch.Tensor:
    """``act(x @ w.T + bias)``: contiguous [..., N] in x's dtype. See :func:`gemm_epilogue`."""
    _check_args(x, w, bias, activation)
    x2 = rows_view(x)
    M, K = x2.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M and N:  # K == 0 needs no special case: the K loop is empty and z = bias
        _launch(x2, w, bias, None, y, activation, act_grad=False)
    return y.view(*x.shape[:-1], N)


def gemm_epilogue_backward(
    grad_y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dL/dx like x, dL/dw like w, dL/dbias like bias or an empty tensor when bias is None)."""
    _check_args(x, w, bias, activation)
    x2, gy2 = rows_view(x), rows_view(grad_y)
    M, K = x2.shape
    N = w.shape[0]
    if gy2.shape != (M, N):
        raise ValueError(f"grad_y must be [..., {N}] with x's leading dims, got {tuple(grad_y.shape)}")
    if activation == "none":
        grad_z = gy2
    else:
        grad_z = torch.empty((M, N), dtype=x.dtype, device=x.device)
        if M and N:
            _launch(x2, w, bias, gy2, grad_z, activation, act_grad=True)
    grad_x = torch.mm(grad_z, w).view(x.shape)
    grad_w = torch.mm(grad_z.t(), x2)
    if bias is None:
        grad_bias = torch.empty(0, dtype=x.dtype, device=x.device)
    else:
        grad_bias = grad_z.sum(dim=0, dtype=torch.float32).to(bias.dtype)
    return grad_x, grad_w, grad_bias


# --- torch.library ops ----------------------------------------------------------------------------------------


@library_op("fusion_advisor::gemm_epilogue", mutates_args={})
def gemm_epilogue_op(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    return gemm_epilogue_forward(x, w, bias, activation)


@library_op("fusion_advisor::gemm_epilogue_backward", mutates_args={})
def gemm_epilogue_backward_op(
    grad_y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return gemm_epilogue_backward(grad_y, x, w, bias, activation)


def _setup_context(ctx, inputs, output):
    x, w, bias, activation = inputs
    ctx.save_for_backward(x, w, bias)
    ctx.activation = activation


def _backward(ctx, grad_y):
    x, w, bias = ctx.saved_tensors
    grad_x, grad_w, grad_bias = gemm_epilogue_backward_op(grad_y, x, w, bias, ctx.activation)
    return grad_x, grad_w, (None if bias is None else grad_bias), None


gemm_epilogue_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ------------------------------------------------------------------------------------------


def gemm_epilogue(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none"
) -> torch.Tensor:
    """``act(x @ w.T + bias)`` with the bias and activation fused into the GEMM; differentiable in x, w, bias.

    Args:
        x: [..., K] fp32/fp16/bf16, any strides (leading dims flattened to M rows; copied only if they cannot be).
        w: [N, K] (nn.Linear weight), x's dtype, any strides.
        bias: [N] or None, x's dtype.
        activation: one of ``none``, ``relu``, ``gelu`` (erf), ``gelu_tanh``, ``silu``.

    Returns:
        contiguous [..., N] in x's dtype: ``act(F.linear(x, w, bias))`` accumulated in fp32 (3xTF32 products for
        fp32 inputs on a GPU: fp32 accuracy), bias and activation applied in fp32, one rounding.

    Raises:
        ValueError / TypeError: bad shapes, dtypes, device or activation (message names the argument).
    """
    return gemm_epilogue_op(x, w, bias, activation)


# --- contract -------------------------------------------------------------------------------------------------


def kernel_fn(x, w, bias=None, activation="none"):
    """The public wrapper, see :func:`gemm_epilogue`."""
    return gemm_epilogue(x, w, bias, activation)


def reference_activation(z: torch.Tensor, activation: str) -> torch.Tensor:
    """torch's version of the epilogue activation."""
    if activation == "relu":
        return F.relu(z)
    if activation == "gelu":
        return F.gelu(z)
    if activation == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    if activation == "silu":
        return F.silu(z)
    return z


def reference_fn(x, w, bias=None, activation="none"):
    """Plain PyTorch: ``act(F.linear(x, w, bias))``."""
    return reference_activation(F.linear(x, w, bias), activation)


def make_inputs(M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16, bias: bool = True,
                activation: str = "gelu", requires_grad: bool = True, scale: float = 1.0) -> list:
    """[x [M, K], w [N, K], bias [N] or None, activation]; w ~ N(0, 1/K) (nn.Linear-like), outputs ~ ``scale``."""
    device = _device.default_device()
    x = (scale * torch.randn(M, K, device=device)).to(dtype).requires_grad_(requires_grad)
    w = (torch.randn(N, K, device=device) / max(K, 1) ** 0.5).to(dtype).requires_grad_(requires_grad)
    b = (scale * 0.1 * torch.randn(N, device=device)).to(dtype).requires_grad_(requires_grad) if bias else None
    return [x, w, b, activation]


#: fp32 products run as 3xTF32 (fp32 accuracy), so ``verify`` holds fp32 outputs to the fp32 policy, with no TF32
#: floor.
USES_TF32 = False

#: ``get_inputs(size)`` sizes, ``(M, N, K)``.
SIZES = [(8192, 16384, 4096)] if _device.on_gpu() else [(37, 40, 48)]

#: The shapes ``verify`` runs besides ``get_inputs()`` (a GEMM's size is not (rows, width), so the generic edge
#: shapes do not apply): one row (decode), odd N and K (partial tiles on both), a tiny odd problem, 1025 rows, and
#: 65537 rows.
VERIFY_SIZES = [(1, 40, 48), (37, 41, 47), (5, 3, 7), (1025, 3, 5), (65537, 3, 5)]


def get_inputs(size: tuple[int, int, int] | None = None) -> list:
    """``size`` = ``(M, N, K)``, default ``SIZES[0]``: GPU GPT-style MLP up-projection + bias + GELU, 8192
    tokens x 4096 -> 16384, bf16; CPU 37 x 48 -> 40, fp32 (not multiples of the interpreter's 32-wide block)."""
    M, N, K = size or SIZES[0]
    return make_inputs(M, N, K, torch.bfloat16 if _device.on_gpu() else torch.float32)


#: The anchor chain (GEMM + bias + GELU at 8192 tokens), Llama-7B MLP widths, other activations and dtypes,
#: a decode-sized M: forward only (``requires_grad: False``). One fwd+bwd entry: note that a float64 check of
#: bf16 weight gradients summed over 2048 rows exceeds the bf16 table tolerance for torch's own eager autograd
#: too (dL/dz is rounded to bf16 before dw = dz.T @ x; see tests/kernel_library/test_gemm_epilogue.py).
BENCH_SHAPES: list[dict] = [
    {"M": 8192, "N": 16384, "K": 4096, "dtype": torch.bfloat16, "activation": "gelu", "requires_grad": False},
    {"M": 8192, "N": 11008, "K": 4096, "dtype": torch.bfloat16, "activation": "silu", "bias": False,
     "requires_grad": False},
    {"M": 8192, "N": 4096, "K": 11008, "dtype": torch.bfloat16, "activation": "none", "requires_grad": False},
    {"M": 8192, "N": 16384, "K": 4096, "dtype": torch.float16, "activation": "gelu_tanh", "requires_grad": False},
    {"M": 8192, "N": 16384, "K": 4096, "dtype": torch.float32, "activation": "relu", "requires_grad": False},
    {"M": 2048, "N": 16384, "K": 4096, "dtype": torch.bfloat16, "activation": "gelu", "requires_grad": False},
    {"M": 32, "N": 16384, "K": 4096, "dtype": torch.bfloat16, "activation": "gelu", "requires_grad": False},
    {"M": 2048, "N": 16384, "K": 4096, "dtype": torch.bfloat16, "activation": "gelu"},
]


def _rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1])


def bytes_moved(x, w, bias=None, activation="none") -> int:
    """x, w, bias read once, y written once (a GEMM is compute-bound: see :func:`flops`)."""
    b = 0 if bias is None else bias.numel() * bias.element_size()
    return (x.numel() + w.numel() + _rows(x) * w.shape[0]) * x.element_size() + b


def bytes_moved_backward(x, w, bias=None, activation="none") -> int:
    """dy, x, w read once; dx, dw, dbias written once (the recomputed z never leaves registers)."""
    b = 0 if bias is None else bias.numel() * bias.element_size()
    return (2 * (x.numel() + w.numel()) + _rows(x) * w.shape[0]) * x.element_size() + b


def flops(x, w, bias=None, activation="none") -> int:
    """2 M N K multiply-adds of the forward GEMM (the epilogue is negligible)."""
    return 2 * _rows(x) * w.shape[0] * x.shape[-1]


def _pattern(x, w, bias):
    # The anchor chain: nn.Linear followed by nn.GELU() (erf), as in GPT-2/BERT MLPs.
    return F.gelu(F.linear(x, w, bias))


def _replacement(x, w, bias):
    return kernel_fn(x, w, bias, "gelu")


ENTRY = register_kernel(KernelEntry(
    name="gemm_epilogue", module=__name__, op="fusion_advisor::gemm_epilogue", has_backward=True,
    description="act(x @ w.T + bias) with bias and none/relu/gelu/gelu_tanh/silu fused; matches act(F.linear)",
    pattern=_pattern, replacement=_replacement, example_args=((6, 16), (24, 16), (24,))))
