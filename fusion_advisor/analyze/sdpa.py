"""Which ``F.scaled_dot_product_attention`` backend torch runs for an attention op, and what that backend costs eagerly.

SDPA on a CUDA device dispatches at run time to one of four kernels (``torch.nn.attention.SDPBackend``):
``flash`` (FlashAttention-2, one kernel), ``efficient`` (xFormers/CUTLASS memory-efficient attention, one kernel,
takes masks), ``cudnn`` (cuDNN's fused attention) or ``math`` (the composite ``_scaled_dot_product_attention_math``:
a dozen eager kernels that materialise the ``[.., Lq, Lk]`` score matrix). Their speed differs by 10x and more, so
the roofline costs each attention op at the rate of the backend that actually runs
(:meth:`fusion_advisor.devices.DeviceSpec.attention_peak_tflops`).

How the backend is found (:func:`choose_backend`):

- **torch** — CUDA available: empty CUDA tensors with the op's shapes, strides and dtypes are handed to
  ``torch._fused_sdp_choice`` (the function SDPA itself calls; present in torch 2.11 and 2.13), so the answer
  includes everything torch checks (GPU architecture, cuDNN version, runtime enable flags);
- **rule** — otherwise (a CPU or meta analysis for a GPU spec), :func:`rule_backend`, a transcription of
  ``select_sdp_backend`` and the ``can_use_*`` filters of ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``
  (pytorch/pytorch main, 2026; the same filters as torch 2.11) for sm80-sm121 GPUs with torch's default priority
  order flash > efficient > math. Limits: it cannot see the cuDNN version, and newer torch builds put cuDNN first
  on sm90/sm100 when cuDNN > 9.15 (``check_prefer_cudnn_attention``); pointer alignment (storage offsets) is assumed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from fusion_advisor.dtypes import dtype_name

#: Backend names stored in ``OpInfo.variant`` for attention ops (lower-case ``SDPBackend`` members).
BACKENDS = ("flash", "efficient", "cudnn", "math")

_SDP_NAMES = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn",
              "MATH": "math"}

#: Largest total bytes of the empty CUDA tensors built to ask torch (bigger ops use the rule).
MAX_PROBE_BYTES = 1 << 30

#: aten attention ops whose name fixes the backend (captures that did not keep SDPA opaque).
BACKEND_OF_TARGET = {
    "_scaled_dot_product_flash_attention": "flash",
    "_flash_attention_forward": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_efficient_attention_forward": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
}


@dataclass(frozen=True)
class SdpaArgs:
    """Layout facts of one SDPA call that backend selection depends on (no data).

    Attributes:
        q_shape, k_shape, v_shape: sizes of query ``[B, H, Lq, E]``, key ``[B, Hk, Lk, E]``, value
            ``[B, Hk, Lk, Ev]`` (fused kernels need exactly 4 dims).
        dtype: q/k/v dtype name (``"bf16"``, ``"fp16"``, ``"fp32"``, ...).
        last_dim_stride_one: q, k and v each have stride 1 in their last dim (a size-1 last dim counts as 1).
        mask: ``""`` no mask, ``"bool"`` a boolean mask, ``"float"`` an additive float mask.
        dropout_p: dropout probability.
        is_causal: the causal flag.
        enable_gqa: grouped-query attention allowed (``Hk`` divides ``H``).
    """

    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    dtype: str
    last_dim_stride_one: bool = True
    mask: str = ""
    dropout_p: float = 0.0
    is_causal: bool = False
    enable_gqa: bool = False


def _heads_ok(a: SdpaArgs) -> bool:
    """``check_batch_size_and_num_heads_dense``: same batch; same heads, or GQA with Hk dividing H."""
    q, k, v = a.q_shape, a.k_shape, a.v_shape
    if not (q[0] == k[0] == v[0]):
        return False
    if q[1] == k[1] == v[1]:
        return True
    return a.enable_gqa and k[1] == v[1] and k[1] > 0 and q[1] % k[1] == 0


def _layout_reasons(a: SdpaArgs) -> list[str]:
    """The checks flash and memory-efficient attention share: last-dim stride 1, nonzero lengths, batch/heads."""
    out = []
    if not a.last_dim_stride_one:
        out.append("last-dim stride != 1")
    if min(a.q_shape[-2], a.k_shape[-2]) == 0:
        out.append("zero sequence length")
    if not _heads_ok(a):
        out.append("batch/heads mismatch")
    return out


def flash_reasons(a: SdpaArgs) -> list[str]:
    """Why the flash kernel cannot run ``a`` on sm80-sm121 (empty: it can), from ``can_use_flash_attention``:
    fp16/bf16 only, no attn_mask, q/k/v head dims equal and <= 256 (dense inputs: other sizes are padded inside
    the kernel, not refused), causal only with Lq == Lk, 4-D dense inputs with last-dim stride 1, nonzero lengths."""
    out = []
    if len(a.q_shape) != 4 or len(a.k_shape) != 4 or len(a.v_shape) != 4:
        return ["q, k, v must be 4-D"]
    if a.dtype not in ("fp16", "bf16"):
        out.append(f"dtype {a.dtype} (flash takes fp16/bf16)")
    if a.mask:
        out.append("an attn_mask is given")
    e = a.q_shape[-1]
    if not (e == a.k_shape[-1] == a.v_shape[-1]) or e > 256:
        out.append(f"head dims {a.q_shape[-1]}/{a.k_shape[-1]}/{a.v_shape[-1]} (must be equal and <= 256)")
    if a.is_causal and a.q_shape[-2] != a.k_shape[-2]:
        out.append("is_causal with Lq != Lk")
    return out + _layout_reasons(a)


def efficient_reasons(a: SdpaArgs) -> list[str]:
    """Why the memory-efficient kernel cannot run ``a`` on sm80-sm121 (empty: it can), from
    ``can_use_mem_efficient_attention``: fp16/bf16/fp32, masks allowed, q and k head dims equal, q and v head dims
    multiples of the GEMM alignment (``minimum_gemm_alignment``: 8 elements for fp16/bf16, 4 for fp32 on sm80+),
    no upper head-dim limit on CUDA, 4-D dense inputs with last-dim stride 1, nonzero lengths."""
    if len(a.q_shape) != 4 or len(a.k_shape) != 4 or len(a.v_shape) != 4:
        return ["q, k, v must be 4-D"]
    out = []
    if a.dtype not in ("fp16", "bf16", "fp32"):
        out.append(f"dtype {a.dtype} (efficient takes fp16/bf16/fp32)")
    align = 8 if a.dtype in ("fp16", "bf16") else 4
    e, ev = a.q_shape[-1], a.v_shape[-1]
    if e != a.k_shape[-1] or e <= 0 or ev <= 0 or e % align or ev % align:
        out.append(f"head dims {e}/{a.k_shape[-1]}/{ev} (q == k, q and v multiples of {align})")
    return out + _layout_reasons(a)


def rule_backend(a: SdpaArgs) -> tuple[str, str]:
    """The backend torch's default order (flash > efficient > math) picks for ``a`` on an sm80-sm121 GPU, and why
    (the reasons the faster backends were refused). See the module docstring for the source and its limits."""
    flash = flash_reasons(a)
    if not flash:
        return "flash", ""
    eff = efficient_reasons(a)
    if not eff:
        return "efficient", f"flash refused: {'; '.join(flash)}"
    return "math", f"flash refused: {'; '.join(flash)}; efficient refused: {'; '.join(eff)}"


def torch_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> str | None:
    """Ask torch which backend SDPA runs for these (real or fake) tensors' shapes, strides and dtypes on the current
    CUDA device: ``torch._fused_sdp_choice`` on empty CUDA tensors of the same sizes and strides (storage offset 0:
    pointer alignment is assumed, as in :func:`rule_backend`). ``None`` when CUDA or that
    function is unavailable, the tensors are too large to probe (:data:`MAX_PROBE_BYTES`) or torch refuses them."""
    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None or not torch.cuda.is_available():
        return None
    tensors = [t for t in (q, k, v, mask) if t is not None]
    try:
        total = sum(_span_bytes(t) for t in tensors)
        if total > MAX_PROBE_BYTES:
            return None
        probe = [torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cuda")
                 for t in tensors]
        pq, pk, pv = probe[:3]
        pm = probe[3] if mask is not None else None
        with warnings.catch_warnings():  # torch warns why each backend was refused before raising: not ours
            warnings.simplefilter("ignore")
            try:
                code = choice(pq, pk, pv, pm, float(dropout_p), bool(is_causal), scale=scale,
                              enable_gqa=bool(enable_gqa))
            except TypeError:  # a torch without enable_gqa
                code = choice(pq, pk, pv, pm, float(dropout_p), bool(is_causal), scale=scale)
        from torch.nn.attention import SDPBackend

        return _SDP_NAMES.get(SDPBackend(int(code)).name)
    except (RuntimeError, ValueError, TypeError, ImportError):
        return None


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes spanned by ``t``'s elements from its first one (fake tensors' storage cannot be read)."""
    if t.numel() == 0:
        return 0
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return int(span) * t.element_size()


def args_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
            dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False) -> SdpaArgs:
    """:class:`SdpaArgs` of (fake or real) tensors."""

    def last_ok(t: torch.Tensor) -> bool:
        return t.dim() == 0 or t.shape[-1] == 1 or t.stride(-1) == 1

    mask_kind = "" if mask is None else "bool" if mask.dtype == torch.bool else "float"
    return SdpaArgs(q_shape=tuple(int(s) for s in q.shape), k_shape=tuple(int(s) for s in k.shape),
                    v_shape=tuple(int(s) for s in v.shape),
                    dtype=dtype_name(q.dtype),
                    last_dim_stride_one=all(last_ok(t) for t in (q, k, v)), mask=mask_kind,
                    dropout_p=float(dropout_p or 0.0), is_causal=bool(is_causal), enable_gqa=bool(enable_gqa))


def choose_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                   dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> tuple[str, str]:
    """``(backend, how)`` for one SDPA call: ``how`` is ``"torch"`` when torch itself was asked
    (:func:`torch_backend`), else ``"rule"`` (:func:`rule_backend`)."""
    picked = torch_backend(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
    if picked is not None:
        return picked, "torch"
    return rule_backend(args_of(q, k, v, mask, dropout_p, is_causal, enable_gqa))[0], "rule"


#: Kernels SDPA runs on a boolean attn_mask before any backend (``convert_boolean_attn_mask`` turns it into an
#: additive float mask, then the fused path aligns/expands it): measured, 5 kernels per efficient-attention call with
#: a boolean ``[B, 1, S, S]`` mask on our H200, torch 2.11 (the hf_llama and hf_gpt2 attention rows of
#: benchmarks/results/h200/accuracy/profile_accuracy_chains.csv, ``measured_kernels``), that
#: is 1 attention kernel + 4.
BOOL_MASK_KERNELS = 4


def fused_kernels(mask: str = "") -> int:
    """Eager kernels of a fused SDPA backend (flash, efficient, cuDNN): 1, plus :data:`BOOL_MASK_KERNELS` for a
    boolean mask."""
    return 1 + (BOOL_MASK_KERNELS if mask == "bool" else 0)


def math_kernels(mask: str = "", is_causal: bool = False, dropout_p: float = 0.0, gqa: bool = False,
                 permuted_inputs: int = 0) -> int:
    """Eager kernels of SDPA's math backend (``at::_scaled_dot_product_attention_math`` on CUDA), counted from its
    source (``aten/src/ATen/native/transformers/attention.cpp``):

    - ``q * sqrt(scale)`` and ``k^T * sqrt(scale)``: 2;
    - ``matmul(q, k^T)`` and ``matmul(attn, v)``: 2 bmm, plus one copy per q/k/v operand in a permuted layout
      (``permuted_inputs``), which the 4-D ``matmul`` cannot fold into a bmm without ``reshape`` copying it;
    - ``_safe_softmax``: softmax, ``eq(-inf)``, ``all`` over the row, a zero scalar, ``where``: 5;
    - an attn_mask: ``attn.add_(mask)``: 1; a boolean mask is first converted to an additive one:
      +:data:`BOOL_MASK_KERNELS`;
    - ``is_causal``: ``ones(L, S).tril()`` then the boolean conversion: +5, and its add: +1 (when no mask is given);
    - dropout: random mask and scaling: +3; GQA: ``repeat_interleave`` of k and v: +2.
    """
    n = 2 + 2 + 5 + min(max(permuted_inputs, 0), 3)
    if mask:
        n += 1 + (BOOL_MASK_KERNELS if mask == "bool" else 0)
    if is_causal:
        n += 5 + (0 if mask else 1)
    if dropout_p > 0:
        n += 3
    if gqa:
        n += 2
    return n


#: Passes over the ``[.., Lq, Lk]`` score matrix in the math backend, in elements of the q dtype: bmm writes it (1),
#: the mask add reads and writes it (2), softmax reads and writes it (2), ``eq`` reads it (1, its bool output is
#: counted as 0.5), ``where`` reads and writes it (2), the second bmm reads it (1).
MATH_SCORE_PASSES = 9.5


def math_score_bytes(q_shape: tuple[int, ...], k_shape: tuple[int, ...], itemsize: int, mask: bool) -> int:
    """Bytes the math backend moves through its score matrix ``[B, H, Lq, Lk]`` (:data:`MATH_SCORE_PASSES`, less the
    2 passes of the mask add when there is no mask): the memory floor the fused kernels avoid."""
    if len(q_shape) < 2 or len(k_shape) < 2:
        return 0
    rows = 1
    for s in q_shape[:-1]:
        rows *= int(s)
    scores = rows * int(k_shape[-2])
    passes = MATH_SCORE_PASSES - (0 if mask else 2)
    return int(scores * itemsize * passes)
