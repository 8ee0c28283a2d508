"""Fused residual add + RMSNorm (Hugging Face Llama decoder layer): one read of x and residual, two writes.

Formula, over the last dim, as transformers' ``LlamaDecoderLayer`` computes it around ``post_attention_layernorm``
(``hidden_states = residual + hidden_states; residual = hidden_states; hidden_states = norm(hidden_states)``):

    s = (residual + x).to(x.dtype)                       # the new residual, rounded to the input dtype
    y = weight * (s.float() * rsqrt(mean(s.float()**2) + eps)).to(x.dtype)     # LlamaRMSNorm(s)

Backward: ``ds = dRMSNorm(dy) + d(s)``; x and residual both receive ``ds`` (the add passes it through), and
dweight is reduced from per-program fp32 partial sums. The kernels are those of :mod:`kernel_library.rmsnorm`
with ``HAS_RESIDUAL=True``; the backward reads the saved ``s`` instead of re-adding x and residual.
"""

from __future__ import annotations

import torch

from kernel_library._device import default_device
from kernel_library._op import library_op
from kernel_library.registry import KernelEntry, register_kernel
from kernel_library._checks import check_tensor
from kernel_library._rows import as_rows
from kernel_library.rmsnorm import (
    BENCH_SHAPES as rms_bench_shapes,
    SIZES,
    BwdTuning,
    rms_norm_bwd_launch,
    rms_norm_fwd_launch,
    rms_out_dtype,
)

# --- constants ----------------------------------------------------------------------------------------------
# Block sizes, warps, the looped-kernel thresholds and the backward grid are those of kernel_library._rows
# (RowConfig, MAX_FUSED_BLOCK_FWD/BWD, BWD_PROGRAMS_PER_SM): the fused add adds one load and one store per
# element; ptxas reports the same register counts with and without it (rmsnorm's constants).

#: Launch overrides of the residual backward (three input streams: dy, d(new residual), new residual; one output): the
#: H200 best of ``benchmarks/kernels/sweep_tiles.py --only add_rmsnorm_bwd`` (8192 x 4096 bf16, 63 configs each verified
#: against float64; benchmarks/results/h200/kernels/sweep_tiles_norm_bwd.json): row loop pipelined 4 stages, one program
#: per SM, one row per step, 8 warps: 0.0984 -> 0.0696 ms GPU time, 65% -> 91% of copy bandwidth.
BWD_TUNING = BwdTuning(num_stages=4, programs_per_sm=1)

#: Offset of the Llama form (weight applied as is; no Gemma ``1 + weight``).
_LLAMA_OFFSET = 0.0

# --- kernels: kernel_library.rmsnorm._rms_norm_{fwd,bwd}[_looped]_kernel with HAS_RESIDUAL=True -------------

# --- launcher -----------------------------------------------------------------------------------------------


def _check_add_rms_inputs(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension [..., hidden]; got a 0-d tensor")
    if residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}; got {tuple(residual.shape)}")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual must have x's dtype {x.dtype}; got {residual.dtype}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must be 1-D of size x.shape[-1]={x.shape[-1]}; got shape {tuple(weight.shape)}")
    check_tensor("x", x)
    check_tensor("residual", residual, x.device)
    check_tensor("weight", weight, x.device)


# --- torch.library ops --------------------------------------------------------------------------------------


@library_op("fusion_advisor::add_rms_norm", mutates_args={})
def _add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_add_rms_inputs(x, residual, weight)
    n_cols = x.shape[-1]
    if x.numel() == 0:
        y = torch.empty(x.shape, dtype=rms_out_dtype(x.dtype, weight.dtype, _LLAMA_OFFSET), device=x.device)
        return y, torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y, s = rms_norm_fwd_launch(as_rows(x, n_cols), weight, eps, _LLAMA_OFFSET, residual=as_rows(residual, n_cols))
    return y.view(x.shape), s.view(x.shape)


@library_op("fusion_advisor::add_rms_norm_backward", mutates_args={})
def _add_rms_norm_backward_op(
    dy: torch.Tensor, d_new_residual: torch.Tensor, new_residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    n_cols = new_residual.shape[-1]
    if new_residual.numel() == 0:
        return torch.empty_like(new_residual, memory_format=torch.contiguous_format), torch.zeros_like(weight)
    ds, dw = rms_norm_bwd_launch(
        as_rows(dy, n_cols),
        as_rows(new_residual, n_cols),
        weight,
        eps,
        _LLAMA_OFFSET,
        ds=as_rows(d_new_residual, n_cols),
        tuning=BWD_TUNING,
    )
    return ds.view(new_residual.shape), dw


def _add_rms_norm_setup_context(ctx, inputs, output) -> None:
    _, _, weight, eps = inputs
    _, new_residual = output
    ctx.save_for_backward(new_residual, weight)
    ctx.eps = eps


def _add_rms_norm_backward(ctx, dy: torch.Tensor, d_new_residual: torch.Tensor):
    new_residual, weight = ctx.saved_tensors
    # autograd materialises unused output gradients as zeros, so both are tensors here
    ds, dw = _add_rms_norm_backward_op(dy, d_new_residual, new_residual, weight, ctx.eps)
    # x and residual receive the same gradient (as torch's own add backward returns one tensor for both)
    return ds, ds, dw, None


_add_rms_norm_op.register_autograd(_add_rms_norm_backward, setup_context=_add_rms_norm_setup_context)


# --- public function ----------------------------------------------------------------------------------------


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then Llama RMSNorm: returns ``(normed, new_residual)``, differentiable in all tensors.

    Args:
        x: [..., n_cols] (the sublayer output), fp32/fp16/bf16, any strides.
        residual: x's shape and dtype, any strides.
        weight: [n_cols], fp32/fp16/bf16.
        eps: added to ``mean(s**2)`` before the rsqrt.

    Returns:
        normed [..., n_cols] in ``promote_types(x, weight)``, ``weight * (s * rstd).to(x.dtype)``;
        new_residual [..., n_cols] in x's dtype, ``s = residual + x`` (transformers ``LlamaDecoderLayer``).

    Raises:
        ValueError: x is 0-d, residual's shape differs from x's, weight is not [x.shape[-1]], or the tensors sit
            on different or unsupported devices.
        TypeError: a dtype other than fp32/fp16/bf16, or residual's dtype differs from x's.
    """
    return _add_rms_norm_op(x, residual, weight, float(eps))


# --- contract -----------------------------------------------------------------------------------------------

kernel_fn = add_rms_norm


def reference_fn(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch, as transformers' Llama decoder layer writes it (see :func:`_hf_add_rmsnorm`), except that
    the upcast is to ``promote_types(dtype, float32)`` so float64 inputs stay float64 (the tests' reference)."""
    hidden_states = residual + x
    new_residual = hidden_states
    compute_dtype = torch.promote_types(hidden_states.dtype, torch.float32)
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(compute_dtype)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype), new_residual


def make_inputs(
    n_rows: int,
    n_cols: int,
    dtype: torch.dtype = torch.bfloat16,
    eps: float = 1e-6,
    requires_grad: bool = True,
    device: torch.device | str | None = None,
    seed: int = 0,
) -> list:
    """``[x [n_rows, n_cols], residual [n_rows, n_cols], weight [n_cols], eps]`` on ``device``.

    x, residual ~ N(0, 1); weight ~ 1 + N(0, 0.1); all in ``dtype``.
    """
    device = torch.device(device) if device is not None else default_device()
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((n_rows, n_cols), generator=gen, device=device).to(dtype)
    residual = torch.randn((n_rows, n_cols), generator=gen, device=device).to(dtype)
    weight = (1.0 + 0.1 * torch.randn((n_cols,), generator=gen, device=device)).to(dtype)
    return [t.requires_grad_(requires_grad) for t in (x, residual, weight)] + [eps]


def get_inputs(size: tuple[int, int] | None = None) -> list:
    """``rmsnorm.get_inputs`` with a residual: ``size`` = ``(n_rows, n_cols)``, default ``SIZES[0]`` (rmsnorm's
    sizes: Llama-7B shapes on a GPU, 16 x 1000 on the CPU interpreter); bf16; from the seed ``verify`` set."""
    return make_inputs(*(size or SIZES[0]), torch.bfloat16, seed=torch.initial_seed())


def hard_inputs() -> list:
    """Hard values: a residual stream of large magnitude (x 1e4, as deep in a long model) and a sum that cancels to
    zero rows (``residual = -x``: ``rstd = 1 / sqrt(eps)``)."""
    x, residual, weight, eps = get_inputs()
    large = [(t.detach() * 1e4).requires_grad_(True) for t in (x, residual)]
    cancel = (-x.detach()).requires_grad_(True)
    return [("residual stream x 1e4", large + [weight, eps]), ("x + residual = 0", [x, cancel, weight, eps])]


#: GPU benchmark shapes: the same as the plain RMSNorm's (the Llama-7B anchor in three dtypes, token and width
#: sweeps, one row for the looped path).
BENCH_SHAPES: list[dict] = list(rms_bench_shapes)


def bytes_moved(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> int:
    """Fewest bytes the forward moves: read x, residual and weight; write normed and new_residual."""
    out_size = torch.empty((), dtype=rms_out_dtype(x.dtype, weight.dtype, _LLAMA_OFFSET)).element_size()
    return x.numel() * (3 * x.element_size() + out_size) + weight.numel() * weight.element_size()


def bytes_moved_backward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> int:
    """Fewest bytes the backward moves: read d(normed), d(new_residual), new_residual and weight; write one
    gradient shared by x and residual, and dweight (partial sums excluded)."""
    out_size = torch.empty((), dtype=rms_out_dtype(x.dtype, weight.dtype, _LLAMA_OFFSET)).element_size()
    return x.numel() * (out_size + 3 * x.element_size()) + 2 * weight.numel() * weight.element_size()


def _hf_add_rmsnorm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The subgraph replaced: the residual add of transformers' ``LlamaDecoderLayer`` followed by
    ``LlamaRMSNorm.forward`` (module weight and eps as inputs)."""
    hidden_states = residual + hidden_states
    residual = hidden_states
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype), residual


def _hf_add_rmsnorm_replacement(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return kernel_fn(hidden_states, residual, weight, eps)


ENTRY = register_kernel(KernelEntry(
    name="add_rmsnorm", module=__name__, op="fusion_advisor::add_rms_norm", has_backward=True,
    description="residual add + RMSNorm, fwd+bwd; returns (LlamaRMSNorm(residual + x), residual + x) as "
                "transformers' LlamaDecoderLayer computes them",
    pattern=_hf_add_rmsnorm, replacement=_hf_add_rmsnorm_replacement,
    example_args=((2, 3, 16), (2, 3, 16), (16,), "scalar")))
