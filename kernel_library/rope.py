"""RoPE in Hugging Face's rotate_half convention, q and k in one launch, forward and backward.

Replaces the ``rope`` chain, HF ``apply_rotary_pos_emb`` (``transformers.models.llama.modeling_llama``)::

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)          # [batch or 1, 1, seq, head_dim]
    q_embed = q * cos + rotate_half(q) * sin               # rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])
    k_embed = k * cos + rotate_half(k) * sin

(Su et al. 2021, "RoFormer"). With x1 = x[..., :d/2], x2 = x[..., d/2:] and cos/sin split the same way:

    out1 = x1 * cos1 - x2 * sin1            out2 = x2 * cos2 + x1 * sin2

The backward is the transpose of that linear map (for HF's cos/sin, whose halves are equal, a rotation by -sin):

    dx1 = dy1 * cos1 + dy2 * sin2           dx2 = dy2 * cos2 - dy1 * sin1

The kernel uses all d values of cos and sin, so it also matches cos/sin whose halves differ. cos and sin are
constants (HF computes them under ``torch.no_grad``): :func:`rope` refuses cos/sin that require grad.

One program per (batch, position) row (grid axis 0, batch * seq programs): it loads that position's cos and sin
once and applies them to every q head and then every k head, in [BLOCK_H, d/2] tiles. All four strides of q, k
and the outputs are passed, so the ``view(b, s, h, d).transpose(1, 2)`` layout of HF attention needs no copy;
outputs keep q's and k's layout (``torch.empty_like``), as the eager chain's elementwise ops do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library._checks import SUPPORTED_DTYPES, check_device
from kernel_library._op import launcher, library_op
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ------------------------------------------------------------------------------------------------

#: Elements of one half-tile [BLOCK_H, HALF_D] at most: 1024 = 16 heads x 64 (half of Llama-7B's head_dim 128), so the
#: head loop runs twice for q's 32 heads. Measured on H200 2026-11-29 (benchmarks/results/h200/kernels/sweep_tiles.json,
#: 4 x 2048 tokens, 32 heads of 128, bf16, HF layout; BLOCK_H {4, 8, 16, 32} x {1, 2, 4, 8} warps): 16 heads over 4
#: warps was fastest (0.0674 ms, 94% of copy, 1.05x torch.compile); the earlier 32 heads over 8 warps took 0.0723 ms
#: (0.98x).
MAX_HALF_TILE = 1024
#: Contiguous elements per thread (x2 halves): one 16-byte vector of bf16/fp16 for each half.
ELEMS_PER_THREAD = 8
#: A program holds at most one half-tile pair; more than 8 warps would leave threads under one vector.
MAX_NUM_WARPS = 8
#: Widest head_dim: half of one head must fit a half-tile (HF models use 64-256).
MAX_HEAD_DIM = 2 * MAX_HALF_TILE


# --- kernels --------------------------------------------------------------------------------------------------


@triton.jit
def _position(pid, seq_len):
    """(batch, position) of row ``pid`` of the batch * seq grid, int64 so that ``b * stride_b`` cannot overflow."""
    return (pid // seq_len).to(tl.int64), (pid % seq_len).to(tl.int64)


@triton.jit
def _rope_heads(
    x_ptr, out_ptr, b, s, n_heads,
    stride_xb, stride_xh, stride_xs, stride_xd,
    stride_ob, stride_oh, stride_os, stride_od,
    cos1, cos2, sin1, sin2, half_d,
    BACKWARD: tl.constexpr, BLOCK_H: tl.constexpr, HALF_D: tl.constexpr,
):
    # Rotate every head of x[b, :, s, :] by one position's cos/sin ([HALF_D] fp32 halves), BLOCK_H heads at a time.
    d = tl.arange(0, HALF_D).to(tl.int64)
    d_mask = d < half_d
    x_row = x_ptr + b * stride_xb + s * stride_xs
    o_row = out_ptr + b * stride_ob + s * stride_os
    for h0 in range(0, n_heads, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        mask = (h < n_heads)[:, None] & d_mask[None, :]
        x_heads = x_row + h[:, None].to(tl.int64) * stride_xh
        x1 = tl.load(x_heads + d[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_heads + (d + half_d)[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
        if BACKWARD:
            o1 = x1 * cos1[None, :] + x2 * sin2[None, :]
            o2 = x2 * cos2[None, :] - x1 * sin1[None, :]
        else:
            o1 = x1 * cos1[None, :] - x2 * sin1[None, :]
            o2 = x2 * cos2[None, :] + x1 * sin2[None, :]
        o_heads = o_row + h[:, None].to(tl.int64) * stride_oh
        tl.store(o_heads + d[None, :] * stride_od, o1.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(o_heads + (d + half_d)[None, :] * stride_od, o2.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["seq_len", "n_q_heads", "n_k_heads"])
def _rope_kernel(
    q_ptr,  # q [batch, n_q_heads, seq, head_dim]
    k_ptr,  # k [batch, n_k_heads, seq, head_dim]
    cos_ptr,  # cos [batch (stride 0 when broadcast), seq, head_dim]
    sin_ptr,  # sin, like cos
    q_out_ptr,  # output, q's shape
    k_out_ptr,  # output, k's shape
    seq_len,
    n_q_heads,
    n_k_heads,
    half_d,  # head_dim // 2
    stride_qb, stride_qh, stride_qs, stride_qd,  # q: elements between batches, heads, positions, features
    stride_kb, stride_kh, stride_ks, stride_kd,  # k: the same four
    stride_cb, stride_cs, stride_cd,  # cos: batches (0 when shared), positions, features
    stride_sb, stride_ss, stride_sd,  # sin: the same three
    stride_qob, stride_qoh, stride_qos, stride_qod,  # q_out: four strides
    stride_kob, stride_koh, stride_kos, stride_kod,  # k_out: four strides
    BACKWARD: tl.constexpr,  # apply the transposed map (the gradient)
    BLOCK_H: tl.constexpr,  # heads per tile
    HALF_D: tl.constexpr,  # next power of two >= half_d
):
    b, s = _position(tl.program_id(0), seq_len)
    d = tl.arange(0, HALF_D).to(tl.int64)
    d_mask = d < half_d
    cos_row = cos_ptr + b * stride_cb + s * stride_cs
    sin_row = sin_ptr + b * stride_sb + s * stride_ss
    cos1 = tl.load(cos_row + d * stride_cd, mask=d_mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_row + (d + half_d) * stride_cd, mask=d_mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_row + d * stride_sd, mask=d_mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_row + (d + half_d) * stride_sd, mask=d_mask, other=0.0).to(tl.float32)
    _rope_heads(
        q_ptr, q_out_ptr, b, s, n_q_heads,
        stride_qb, stride_qh, stride_qs, stride_qd, stride_qob, stride_qoh, stride_qos, stride_qod,
        cos1, cos2, sin1, sin2, half_d, BACKWARD, BLOCK_H, HALF_D,
    )
    _rope_heads(
        k_ptr, k_out_ptr, b, s, n_k_heads,
        stride_kb, stride_kh, stride_ks, stride_kd, stride_kob, stride_koh, stride_kos, stride_kod,
        cos1, cos2, sin1, sin2, half_d, BACKWARD, BLOCK_H, HALF_D,
    )


# --- launcher -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeConfig:
    """Tile of heads x half features and warps, from the head count and head_dim."""

    block_h: int
    half_d: int  # padded to a power of two
    num_warps: int

    @classmethod
    def from_shape(cls, n_heads: int, head_dim: int) -> "RopeConfig":
        half_d = triton.next_power_of_2(head_dim // 2)
        block_h = min(triton.next_power_of_2(n_heads), max(1, MAX_HALF_TILE // half_d))
        num_warps = min(MAX_NUM_WARPS, max(1, block_h * half_d // (ELEMS_PER_THREAD * 32)))
        return cls(block_h, half_d, num_warps)


def _check_args(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if q.dim() != 4:
        raise ValueError(f"q must be [batch, heads, seq, head_dim], got shape {tuple(q.shape)}")
    if k.dim() != 4:
        raise ValueError(f"k must be [batch, kv_heads, seq, head_dim], got shape {tuple(k.shape)}")
    batch, _, seq, head_dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, head_dim):
        raise ValueError(f"k must share q's batch, seq and head_dim {(batch, seq, head_dim)}, got {tuple(k.shape)}")
    if head_dim % 2 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be even and at most {MAX_HEAD_DIM}, got {head_dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or t.shape[0] not in (1, batch) or tuple(t.shape[1:]) != (seq, head_dim):
            raise ValueError(f"{name} must be [{batch} or 1, {seq}, {head_dim}], got shape {tuple(t.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    if cos.dtype not in SUPPORTED_DTYPES or sin.dtype != cos.dtype:
        raise TypeError(f"cos and sin must share one of {SUPPORTED_DTYPES}, got {cos.dtype} and {sin.dtype}")
    for name, t in (("k", k), ("cos", cos), ("sin", sin)):
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    check_device(q, "q")


def rope_apply(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool = False,
    out_dtype: torch.dtype | None = None, config: RopeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel on (q, k): the forward map, or with ``backward`` its transpose (q, k are then the
    output gradients). Outputs take q's / k's layout and ``out_dtype`` (default: q's dtype promoted with cos's,
    the dtype HF's ``q * cos`` gives)."""
    _check_args(q, k, cos, sin)
    batch, n_q_heads, seq, head_dim = q.shape
    dtype = out_dtype or torch.promote_types(q.dtype, cos.dtype)
    q_out, k_out = torch.empty_like(q, dtype=dtype), torch.empty_like(k, dtype=dtype)
    if batch * seq == 0:
        return q_out, k_out
    cos, sin = cos.expand(batch, seq, head_dim), sin.expand(batch, seq, head_dim)
    cfg = config or RopeConfig.from_shape(max(n_q_heads, k.shape[1]), head_dim)
    launcher(_rope_kernel)[(batch * seq,)](
        q, k, cos, sin, q_out, k_out, seq, n_q_heads, k.shape[1], head_dim // 2,
        *q.stride(), *k.stride(), *cos.stride(), *sin.stride(), *q_out.stride(), *k_out.stride(),
        BACKWARD=backward, BLOCK_H=cfg.block_h, HALF_D=cfg.half_d, num_warps=cfg.num_warps,
    )
    return q_out, k_out


# --- torch.library ops ----------------------------------------------------------------------------------------


@library_op("fusion_advisor::rope", mutates_args={})
def rope_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_apply(q, k, cos, sin)


@library_op("fusion_advisor::rope_backward", mutates_args={})
def rope_backward_op(
    grad_q_out: torch.Tensor, grad_k_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_apply(grad_q_out, grad_k_out, cos, sin, backward=True, out_dtype=q_dtype)


def _setup_context(ctx, inputs, output):
    q, k, cos, sin = inputs
    ctx.save_for_backward(cos, sin)
    ctx.q_dtype = q.dtype


def _backward(ctx, grad_q_out, grad_k_out):
    cos, sin = ctx.saved_tensors
    grad_q, grad_k = rope_backward_op(grad_q_out, grad_k_out, cos, sin, ctx.q_dtype)
    return grad_q, grad_k, None, None


rope_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ------------------------------------------------------------------------------------------


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF ``apply_rotary_pos_emb(q, k, cos, sin)`` (unsqueeze_dim=1) for q and k in one launch.

    Args:
        q: [batch, n_q_heads, seq, head_dim] fp32/fp16/bf16, any strides (HF's transposed view included).
        k: [batch, n_kv_heads, seq, head_dim], q's dtype (grouped-query attention: fewer heads).
        cos, sin: [batch or 1, seq, head_dim], one float dtype; constants (no gradient).

    Returns:
        (q_embed, k_embed) in q's / k's layout, dtype ``promote_types(q.dtype, cos.dtype)`` like HF's
        ``q * cos + rotate_half(q) * sin``; computed in fp32 with one rounding.

    Raises:
        ValueError / TypeError: bad shape, dtype or device (message names the argument); NotImplementedError:
        cos or sin requires grad (the op gives no gradient for them).
    """
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise NotImplementedError("rope: cos and sin must not require grad (no gradient is computed for them)")
    return rope_op(q, k, cos, sin)


# --- contract -------------------------------------------------------------------------------------------------


def kernel_fn(q, k, cos, sin):
    """The public wrapper, see :func:`rope`."""
    return rope(q, k, cos, sin)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def reference_fn(q, k, cos, sin):
    """Plain PyTorch, HF ``apply_rotary_pos_emb`` with unsqueeze_dim=1."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def make_inputs(batch: int, seq: int, n_heads: int, head_dim: int, n_kv_heads: int | None = None,
                dtype: torch.dtype = torch.bfloat16, requires_grad: bool = True, hf_layout: bool = True,
                theta: float = 10000.0) -> list[torch.Tensor]:
    """[q, k, cos, sin]. ``hf_layout``: q, k are ``view(b, s, h, d).transpose(1, 2)`` of [b, s, h*d] projections
    (non-contiguous, as in HF attention), else contiguous [b, h, s, d]. cos/sin: HF's default rotary embedding
    ([1, seq, head_dim], halves equal), in q's dtype as HF returns them."""
    device = _device.default_device()
    n_kv_heads = n_kv_heads or n_heads

    def proj(h):
        if hf_layout:
            x = torch.randn(batch, seq, h * head_dim, dtype=dtype, device=device)
            x = x.requires_grad_(requires_grad).view(batch, seq, h, head_dim).transpose(1, 2)
            return x
        return torch.randn(batch, h, seq, head_dim, dtype=dtype, device=device).requires_grad_(requires_grad)

    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return [proj(n_heads), proj(n_kv_heads), emb.cos().to(dtype), emb.sin().to(dtype)]


#: ``get_inputs(size)`` sizes, ``(batch, seq, n_heads, head_dim)``.
SIZES = [(4, 2048, 32, 128)] if _device.on_gpu() else [(2, 8, 4, 16)]

#: The shapes ``verify`` runs besides ``get_inputs()`` (head_dim must be even, as rotate_half pairs its halves, so the
#: generic edge shapes do not apply): one token, a head_dim of 34 (not a power of two: a partial block), the
#: smallest head_dim (2), 1025 (batch, position) rows and 65537 of them (past CUDA's 65535 on grid axes 1 and 2).
VERIFY_SIZES = [(1, 1, 4, 16), (3, 5, 4, 34), (1, 3, 2, 2), (1, 1025, 2, 4), (1, 65537, 2, 4)]


def get_inputs(size: tuple[int, int, int, int] | None = None) -> list[torch.Tensor]:
    """``size`` = ``(batch, seq, n_heads, head_dim)``, default ``SIZES[0]``, half as many kv heads (GQA):
    GPU Llama-7B attention, 4 x 2048 tokens, 32 heads of 128, bf16, HF's transposed layout; CPU 2 x 8 tokens, 4 q
    heads / 2 kv heads of 16, fp32."""
    batch, seq, n_heads, head_dim = size or SIZES[0]
    dtype = torch.bfloat16 if _device.on_gpu() else torch.float32
    return make_inputs(batch, seq, n_heads, head_dim, n_kv_heads=max(1, n_heads // 2), dtype=dtype)


#: Llama-7B at 8192 tokens in HF's layout and contiguous, other dtypes, Llama-3-8B's GQA (8 kv heads),
#: a long sequence and a decode step.
BENCH_SHAPES: list[dict] = [
    {"batch": 4, "seq": 2048, "n_heads": 32, "head_dim": 128, "dtype": torch.bfloat16},
    {"batch": 4, "seq": 2048, "n_heads": 32, "head_dim": 128, "dtype": torch.bfloat16, "hf_layout": False},
    {"batch": 4, "seq": 2048, "n_heads": 32, "head_dim": 128, "dtype": torch.float16},
    {"batch": 4, "seq": 2048, "n_heads": 32, "head_dim": 128, "dtype": torch.float32},
    {"batch": 4, "seq": 2048, "n_heads": 32, "head_dim": 128, "n_kv_heads": 8, "dtype": torch.bfloat16},
    {"batch": 1, "seq": 8192, "n_heads": 32, "head_dim": 128, "dtype": torch.bfloat16},
    {"batch": 32, "seq": 1, "n_heads": 32, "head_dim": 128, "dtype": torch.bfloat16},
]


def bytes_moved(q, k, cos, sin) -> int:
    """q, k, cos, sin read once; q_out, k_out written once (in q's dtype, as with HF's same-dtype cos/sin)."""
    qk = (q.numel() + k.numel()) * q.element_size()
    return 2 * qk + (cos.numel() + sin.numel()) * cos.element_size()


def bytes_moved_backward(q, k, cos, sin) -> int:
    """grad_q_out, grad_k_out, cos, sin read once; grad_q, grad_k written once."""
    return bytes_moved(q, k, cos, sin)


def _pattern(q, k, cos, sin):
    # HF apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1).
    return reference_fn(q, k, cos, sin)


def _replacement(q, k, cos, sin):
    return kernel_fn(q, k, cos, sin)


ENTRY = register_kernel(KernelEntry(
    name="rope", module=__name__, op="fusion_advisor::rope", has_backward=True, max_row_elems=MAX_HEAD_DIM,
    description="HF rotate_half RoPE of q and k in one launch; matches apply_rotary_pos_emb (unsqueeze_dim=1)",
    pattern=_pattern, replacement=_replacement, example_args=((2, 2, 8, 8), (2, 2, 8, 8), (2, 8, 8), (2, 8, 8))))
