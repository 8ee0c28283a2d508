"""Fused linear + cross-entropy: the LM head's GEMM and the loss, chunked over tokens so the logits never exist whole.

At today's vocabularies the logits are the largest tensor of a training step: 2 x 2048 tokens x 128256 classes are
1 GiB in bf16, and the loss path holds several copies (the fp32 upcast HF's ``ForCausalLMLoss`` makes, its
gradient). This op computes, for each chunk of ``C`` token rows (Liger-Kernel's fused linear cross-entropy, Hsu et
al. 2024; Apple's Cut Cross-Entropy, Wijmans et al. 2024, goes further and never writes a chunk either):

1. ``logits_c = x_c @ W^T (+ b)`` in ``x``'s dtype (cuBLAS), and with ``softcap > 0``
   ``logits_c = softcap * tanh(logits_c / softcap)`` in fp32 (Gemma 2's final logit soft-capping);
2. the cross-entropy row kernel of :mod:`kernel_library.cross_entropy`: each row's loss and, when a gradient is
   needed, the gradient per unit upstream gradient (``softmax - eps / V - (1 - eps) onehot``, over the whole batch's
   ``n_valid`` for ``"mean"``), written over the chunk's own logits buffer (each element is read before written);
   with soft-capping, times ``1 - tanh^2``;
3. ``dx_c = dlogits_c @ W``, ``dW += dlogits_c^T @ x_c`` (accumulated in fp32, cast to ``W``'s dtype at the end),
   ``db += sum_rows(dlogits_c)``.

So the forward returns the loss and, for ``"mean"`` / ``"sum"``, the gradients for a unit upstream gradient; the
backward scales them by ``grad_output`` (0-d). For ``"none"`` every row has its own upstream gradient, which a
precomputed ``dW`` cannot take: the forward computes no gradient and the backward recomputes the chunks with the
row gradients (``fusion_advisor::linear_cross_entropy_backward``).

Memory: one chunk of logits (:data:`CHUNK_BYTES`) instead of ``N x V``, plus ``dW`` in the weight's dtype while the
gradient accumulates (in fp32, ``V x H x 4`` bytes, beyond :data:`MAX_LOW_PRECISION_CHUNKS` chunks; see
:func:`dw_accumulate_dtype`). Semantics: ``torch.nn.functional.cross_entropy(linear(x, W, b).float(), target,
ignore_index=..., label_smoothing=..., reduction=...)`` with class-index targets (soft-capped first when asked).
"""

from __future__ import annotations

from typing import Optional

import torch

from kernel_library import _device
from kernel_library._checks import SUPPORTED_DTYPES
from kernel_library._op import library_op
from kernel_library.cross_entropy import REDUCTIONS, count_valid, cross_entropy_rows, reduce_rows
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ----------------------------------------------------------------------------------------------

#: Bytes of one chunk of logits: the peak the loss path adds to the step instead of ``N x V``. Measured on the H200
#: (``benchmarks/results/h200/kernels/lce_chunks.md``, 4096 x 4096 x 128256 bf16, forward+backward, dW in bf16):
#: 32 MiB chunks 46.4 ms / 1097 MiB of peak, 128 MiB 23.7 ms / 1285, 256 MiB 21.6 ms / 1535, 512 MiB 20.4 ms / 2036
#: (torch.compile: 19.7 ms / 2036). 256 MiB: 4 chunks of 1024 rows at that vocabulary, within 10% of compile's time
#: at 0.75x its memory; each halving below it costs more time than it saves memory.
CHUNK_BYTES = 256 << 20

#: Rows per chunk are rounded down to a multiple of this (tensor-core tiles of the chunk's GEMMs), when above it.
ROW_ALIGN = 64


#: Most chunks whose ``dW`` products are summed in the weight's own dtype (see :func:`dw_accumulate_dtype`). On the
#: H200 (``benchmarks/results/h200/kernels/lce_chunks.md``, bf16, 4096 tokens x hidden 4096): dW's norm-wise error
#: against float64 was 1.01-1.02x eager's at vocabulary 128256 for 4-32 chunks, and at 32000 1.31x for 4 chunks,
#: 1.41x for 8 (the policy allows 2x); fp32 accumulation stayed at 1.00x.
MAX_LOW_PRECISION_CHUNKS = 8


def dw_accumulate_dtype(weight_dtype: torch.dtype, n_chunks: int) -> torch.dtype:
    """The dtype ``dW`` accumulates in over ``n_chunks`` token chunks: the weight's own for up to
    :data:`MAX_LOW_PRECISION_CHUNKS` chunks, else fp32.

    Every chunk's product is one GEMM with beta = 1 (``dW += dlogits_c^T x_c``): cuBLAS sums the chunk's rows and the
    ``dW`` it reads in fp32 and rounds once to ``dW``'s dtype. So a 16-bit ``dW`` takes one rounding per chunk, as
    autograd's own ``.grad`` accumulation of a 16-bit parameter takes one per use (and Liger-Kernel's fused linear
    cross-entropy one per chunk, its default). An fp32 accumulator costs ``V x H x 4`` bytes (2 GiB at Llama-3's LM
    head), read and written once per chunk, and a cast at the end: on the H200 that was 3289 MiB of peak and 25.1 ms
    for 4096 x 4096 x 128256 against torch.compile's 2036 MiB and 20.5 ms
    (``benchmarks/results/h200/kernels/lce_liger.md``, 2026-12-02); in the weight's dtype 1535 MiB and 21.6 ms
    (``lce_chunks.md``). Beyond the bound the roundings add up, and fp32 is worth its memory."""
    if weight_dtype == torch.float32 or n_chunks > MAX_LOW_PRECISION_CHUNKS:
        return torch.float32
    return weight_dtype


def chunk_rows(n_rows: int, vocab: int, itemsize: int, chunk_bytes: int | None = None) -> int:
    """Token rows per chunk: as many as fit ``chunk_bytes`` (default :data:`CHUNK_BYTES`) of logits (at least 1, at
    most ``n_rows``), rounded down to a multiple of :data:`ROW_ALIGN` when larger."""
    budget = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    rows = max(1, min(n_rows, budget // max(vocab * itemsize, 1)))
    return rows - rows % ROW_ALIGN if rows > ROW_ALIGN else rows


def _chunk_plan(x: torch.Tensor, weight: torch.Tensor, softcap: float) -> tuple[int, torch.dtype]:
    """``(rows per chunk, dW's accumulation dtype)`` for ``x`` [N, H] against ``weight`` [V, H]: the chunks hold
    logits of ``x``'s dtype, or fp32 when soft-capped (:func:`chunk_rows`), and dW accumulates as
    :func:`dw_accumulate_dtype` says for that many chunks."""
    n_rows = x.shape[0]
    step = chunk_rows(n_rows, weight.shape[0], 4 if softcap > 0 else x.element_size())
    return step, dw_accumulate_dtype(weight.dtype, -(-n_rows // step))


# --- helpers ------------------------------------------------------------------------------------------------


def _check_args(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                label_smoothing: float, reduction: str, softcap: float) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"linear_cross_entropy: x must be 2-D [n_tokens, hidden], got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"linear_cross_entropy: weight must be [vocab, hidden] = [V, {x.shape[1]}], got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.shape[0] == 0:
        raise ValueError("linear_cross_entropy: weight has a vocabulary of 0 classes")
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype != x.dtype:
        raise TypeError(f"linear_cross_entropy: x and weight must share one of float32/float16/bfloat16, got "
                        f"{x.dtype} and {weight.dtype}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype):
        raise ValueError(f"linear_cross_entropy: bias must be [{weight.shape[0]}] of {x.dtype}, got "
                         f"{tuple(bias.shape)} {bias.dtype}")
    if not isinstance(target, torch.Tensor) or target.shape != (x.shape[0],) or target.dtype != torch.int64:
        raise ValueError(f"linear_cross_entropy: target must be int64 [n_tokens] = [{x.shape[0]}], got "
                         f"{tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__}")
    if len({t.device for t in (x, weight, target) + ((bias,) if bias is not None else ())}) != 1:
        raise ValueError("linear_cross_entropy: x, weight, target (and bias) must be on one device")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"linear_cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"linear_cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if softcap < 0:
        raise ValueError(f"linear_cross_entropy: softcap must be 0 (off) or positive, got {softcap}")


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    """``acc = a @ b`` (``first``) or ``acc += a @ b``, in place, as one GEMM writing ``acc`` (beta = 1 after the
    first): no product of ``acc``'s size is made, and ``acc`` is read and written once per chunk. ``acc`` is in
    ``a``'s dtype or fp32; an fp32 ``acc`` of 16-bit operands on a GPU is written by the GEMM itself
    (``out_dtype=float32``), elsewhere the operands are upcast.

    Why in place: the first H200 run of ``benchmarks/kernels/lce_liger.py`` (4096 x 4096 x 128256 bf16,
    2026-12-01) measured 4291 MiB of peak memory for this op against torch.compile's 2036: the former
    ``dw += torch.mm(..., out_dtype=float32)`` allocated a second fp32 dW (2.1 GB at that vocabulary) per chunk."""
    if acc.dtype == a.dtype:
        if first:
            torch.mm(a, b, out=acc)
        else:
            acc.addmm_(a, b)
        return
    if a.is_cuda:
        try:
            if first:
                torch.mm(a, b, out_dtype=torch.float32, out=acc)
            else:
                torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            return
        except (TypeError, RuntimeError, NotImplementedError):  # a torch without mm.dtype_out
            pass
    if first:
        torch.mm(a.float(), b.float(), out=acc)
    else:
        acc.addmm_(a.float(), b.float())


def _chunk_logits(x_c: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  softcap: float) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(logits, d logits / d pre-cap logits)`` of one chunk: ``x_c @ W^T (+ b)`` in ``x``'s dtype, soft-capped in
    fp32 (the derivative ``1 - tanh^2`` kept, as the row kernel overwrites the logits with the gradient)."""
    logits = torch.addmm(bias, x_c, weight.t()) if bias is not None else x_c @ weight.t()
    if softcap <= 0:
        return logits, None
    t = torch.tanh(logits.float() / softcap)
    return t * softcap, 1.0 - t * t


def _chunk_grads(dlogits: torch.Tensor, dcap: Optional[torch.Tensor], x_c: torch.Tensor, weight: torch.Tensor,
                 dw: torch.Tensor, db: Optional[torch.Tensor], first: bool) -> torch.Tensor:
    """Chunk gradients: ``dW (+)= dlogits^T x_c`` (``=`` on the ``first`` chunk) and ``db += sum(dlogits)`` (fp32),
    return ``dx_c``."""
    if dcap is not None:
        dlogits = (dlogits * dcap).to(x_c.dtype)
    _accumulate_mm(dw, dlogits.t(), x_c, first)
    if db is not None:
        db += dlogits.sum(0, dtype=torch.float32)
    return dlogits @ weight


def _forward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
             ignore_index: int, label_smoothing: float, reduction: str, softcap: float, compute_grad: bool,
             loss_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, ...]:
    _check_args(x, weight, target, bias, label_smoothing, reduction, softcap)
    n_rows, vocab = x.shape[0], weight.shape[0]
    out_dtype = loss_dtype or x.dtype
    grad = compute_grad and reduction != "none"
    step, acc_dtype = _chunk_plan(x, weight, softcap)
    # each output a tensor of its own, the empty ones too: a custom op's outputs may not alias one another (torch.compile
    # and every functionalising trace reject the op otherwise; an inference call returns three empties)
    dx = torch.empty_like(x) if grad else x.new_empty(0)
    db = torch.zeros(vocab, dtype=torch.float32, device=x.device) if grad and bias is not None else x.new_empty(0)
    if n_rows == 0:
        dw = torch.zeros_like(weight) if grad else x.new_empty(0)
        if reduction == "none":
            return torch.empty(0, dtype=out_dtype, device=x.device), dx, dw, db
        loss = torch.full((), float("nan") if reduction == "mean" else 0.0, dtype=out_dtype, device=x.device)
        return loss, dx, dw, db.to(bias.dtype) if grad and bias is not None else db
    dw = torch.empty(weight.shape, dtype=acc_dtype, device=x.device) if grad else x.new_empty(0)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    n_valid = count_valid(target, ignore_index) if reduction == "mean" else loss_rows
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        x_c = x[start:end]
        logits, dcap = _chunk_logits(x_c, weight, bias, softcap)
        cross_entropy_rows(logits, target[start:end], loss_rows[start:end], n_valid, ignore_index, label_smoothing,
                           reduction == "mean", dlogits=logits if grad else None)
        if grad:
            dx[start:end] = _chunk_grads(logits, dcap, x_c, weight, dw, db if bias is not None else None,
                                         start == 0)
    if reduction == "none":
        loss = loss_rows.to(out_dtype)
    else:
        loss = reduce_rows(loss_rows, n_valid, reduction == "mean", out_dtype)
    return loss, dx, dw.to(weight.dtype) if grad else dw, db.to(bias.dtype) if grad and bias is not None else db


def _backward_rows(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                   grad_rows: torch.Tensor, ignore_index: int, label_smoothing: float,
                   softcap: float) -> tuple[torch.Tensor, ...]:
    """Gradients of ``sum_i grad_rows[i] * loss_i`` (``reduction="none"``): the chunks recomputed, each row's gradient
    scaled by its upstream gradient before the GEMMs."""
    n_rows, vocab = x.shape[0], weight.shape[0]
    if n_rows == 0:
        return torch.empty_like(x), torch.zeros_like(weight), torch.zeros_like(bias) if bias is not None \
            else x.new_empty(0)
    dx = torch.empty_like(x)
    step, acc_dtype = _chunk_plan(x, weight, softcap)
    dw = torch.empty(weight.shape, dtype=acc_dtype, device=x.device)
    db = torch.zeros(vocab, dtype=torch.float32, device=x.device) if bias is not None else None
    scratch = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        x_c = x[start:end]
        logits, dcap = _chunk_logits(x_c, weight, bias, softcap)
        cross_entropy_rows(logits, target[start:end], scratch[start:end], scratch, ignore_index, label_smoothing,
                           False, dlogits=logits)
        g = grad_rows[start:end].to(torch.float32)[:, None]
        scale = g if dcap is None else g * dcap
        dx[start:end] = _chunk_grads((logits * scale).to(x.dtype), None, x_c, weight, dw, db, start == 0)
    return dx, dw.to(weight.dtype), db.to(bias.dtype) if bias is not None else x.new_empty(0)


# --- custom ops and autograd --------------------------------------------------------------------------------


def _fake_forward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                  ignore_index: int, label_smoothing: float, reduction: str, softcap: float, compute_grad: bool,
                  loss_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs' shapes and dtypes of :func:`_forward` (for tracing: the op is opaque to torch.compile)."""
    grad = compute_grad and reduction != "none"
    loss = x.new_empty((x.shape[0],) if reduction == "none" else (), dtype=loss_dtype or x.dtype)
    dx = torch.empty_like(x) if grad else x.new_empty(0)
    dw = torch.empty_like(weight) if grad else x.new_empty(0)
    db = torch.empty_like(bias) if grad and bias is not None else x.new_empty(0)
    return loss, dx, dw, db


def _fake_backward(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                   grad_rows: torch.Tensor, ignore_index: int, label_smoothing: float,
                   softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs' shapes and dtypes of :func:`_backward_rows`."""
    return (torch.empty_like(x), torch.empty_like(weight),
            torch.empty_like(bias) if bias is not None else x.new_empty(0))


# Opaque to torch.compile (``fake=``): the chunk loop's in-place dW accumulation, traced into and functionalised,
# held up to 3.2 GB more in the H200 Llama step (see kernel_library._op.library_op).
@library_op("fusion_advisor::linear_cross_entropy", mutates_args={}, fake=_fake_forward)
def linear_cross_entropy_op(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                            ignore_index: int, label_smoothing: float, reduction: str, softcap: float,
                            compute_grad: bool, loss_dtype: Optional[torch.dtype]
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, dx, dW, db)``: the loss and, for mean / sum with ``compute_grad``, the gradients for a unit upstream
    gradient (empty tensors otherwise); see the module docstring."""
    return _forward(x, weight, target, bias, ignore_index, label_smoothing, reduction, softcap, compute_grad,
                    loss_dtype)


@library_op("fusion_advisor::linear_cross_entropy_backward", mutates_args={}, fake=_fake_backward)
def linear_cross_entropy_backward_op(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                                     bias: Optional[torch.Tensor], grad_rows: torch.Tensor, ignore_index: int,
                                     label_smoothing: float, softcap: float
                                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dW, db)`` of ``reduction="none"`` for per-row upstream gradients ``grad_rows`` ``[n_tokens]``."""
    return _backward_rows(x, weight, target, bias, grad_rows, ignore_index, label_smoothing, softcap)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, target, bias, ignore_index, label_smoothing, reduction, softcap, compute_grad, _ = inputs
    _loss, dx, dw, db = output
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(dx, dw, db)
    ctx.has_bias = bias is not None
    ctx.precomputed = bool(compute_grad) and reduction != "none"
    ctx.args = (int(ignore_index), float(label_smoothing), float(softcap))
    if ctx.precomputed:
        ctx.save_for_backward(dx, dw, db)
    else:
        ctx.save_for_backward(x, weight, target, bias if bias is not None else x.new_empty(0))


def _backward(ctx, grad_loss, *_unused):
    none = (None,) * 10
    if grad_loss is None:  # the loss received no gradient
        return none
    if ctx.precomputed:
        # scaled in place: a copy of dW (1 GiB at Llama-3's LM head) would be made while the forward's activations
        # are all still alive, at the step's peak. The saved tensors' versions change, so a second backward
        # through the same graph (retain_graph=True) raises instead of scaling twice.
        dx, dw, db = ctx.saved_tensors
        g = grad_loss.to(torch.float32)
        return (dx.mul_(g), dw.mul_(g), None, db.mul_(g) if ctx.has_bias else None) + none[4:]
    x, weight, target, bias = ctx.saved_tensors
    if grad_loss.dim() == 0:
        raise RuntimeError("fusion_advisor::linear_cross_entropy: the forward ran without compute_grad=True, so "
                           "its gradients were not computed; run it with the inputs requiring grad")
    dx, dw, db = linear_cross_entropy_backward_op(x, weight, target, bias if ctx.has_bias else None, grad_loss,
                                                  *ctx.args)
    return (dx, dw, None, db if ctx.has_bias else None) + none[4:]


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ----------------------------------------------------------------------------------------


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, ignore_index: int = -100, label_smoothing: float = 0.0,
                         reduction: str = "mean", softcap: float = 0.0, *,
                         loss_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Cross-entropy of ``x @ weight^T (+ bias)`` against class indices, the logits never materialised whole.

    Args:
        x: ``[..., hidden]`` float32/float16/bfloat16 (the LM head's input); flattened to ``[n_tokens, hidden]``.
        weight: ``[vocab, hidden]`` of ``x``'s dtype; any vocabulary size.
        target: ``[...]`` int64 class indices in ``[0, vocab)`` or ``ignore_index``, as many as ``x`` has rows.
        bias: optional ``[vocab]``.
        ignore_index: rows with this target give no loss and no gradient and are not counted by ``"mean"``.
        label_smoothing: ``eps`` in ``[0, 1]``, as ``torch.nn.functional.cross_entropy`` defines it.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[n_tokens]``).
        softcap: ``s > 0`` soft-caps the logits to ``s * tanh(logits / s)`` first (Gemma 2); 0: off.
        loss_dtype: dtype of the returned loss; default ``x``'s (``torch.float32`` gives HF's fp32 loss).

    Returns:
        The loss (0-d, or ``[n_tokens]`` for ``"none"``).

    Raises:
        ValueError / TypeError: shapes, dtypes or devices that do not fit, ``label_smoothing`` outside ``[0, 1]``,
        an unknown ``reduction``, a negative ``softcap``.
    """
    x2 = x.reshape(-1, x.shape[-1])
    t = target.reshape(-1)
    compute_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                or (bias is not None and bias.requires_grad))
    loss, *_ = linear_cross_entropy_op(x2, weight, t, bias, int(ignore_index), float(label_smoothing), reduction,
                                       float(softcap), compute_grad, loss_dtype)
    return loss


# --- contract -----------------------------------------------------------------------------------------------


def kernel_fn(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor] = None,
              ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
              softcap: float = 0.0) -> torch.Tensor:
    """The public function (:func:`linear_cross_entropy`), the loss in ``x``'s dtype."""
    return linear_cross_entropy(x, weight, target, bias, ignore_index, label_smoothing, reduction, softcap)


def reference_fn(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                 softcap: float = 0.0) -> torch.Tensor:
    """Plain PyTorch: the logits materialised, upcast to fp32 (fp64 stays fp64), soft-capped, cross-entropy."""
    logits = torch.nn.functional.linear(x, weight, bias)
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(acc)
    if softcap > 0:
        logits = torch.tanh(logits / softcap) * softcap
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                             ignore_index=ignore_index, label_smoothing=label_smoothing,
                                             reduction=reduction)
    return loss.to(x.dtype)


def make_inputs(n_tokens: int = 16, hidden: int = 32, vocab: int = 300, dtype="float32", bias: bool = False,
                ignore_frac: float = 0.05, ignore_index: int = -100, label_smoothing: float = 0.0,
                reduction: str = "mean", softcap: float = 0.0, requires_grad: bool = True, seed: int = 0,
                device=None) -> list:
    """Arguments ``[x, weight, target, bias, ignore_index, label_smoothing, reduction, softcap]`` for
    :func:`kernel_fn`: ``x`` ``[n_tokens, hidden]`` of std 1, ``weight`` ``[vocab, hidden]`` of std
    ``1 / sqrt(hidden)`` (logits of std ~1, as an LM head's), about ``ignore_frac`` of the targets ignored."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    device = device or _device.default_device()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, hidden, generator=gen).to(dtype=dtype, device=device).requires_grad_(requires_grad)
    w = (torch.randn(vocab, hidden, generator=gen) / hidden ** 0.5).to(dtype=dtype, device=device)
    w.requires_grad_(requires_grad)
    b = (torch.randn(vocab, generator=gen) * 0.1).to(dtype=dtype, device=device).requires_grad_(requires_grad) \
        if bias else None
    target = torch.randint(0, vocab, (n_tokens,), generator=gen)
    target = target.masked_fill(torch.rand(n_tokens, generator=gen) < ignore_frac, ignore_index).to(device)
    return [x, w, target, b, ignore_index, float(label_smoothing), reduction, float(softcap)]


#: ``(n_tokens, hidden, vocab)``: Llama-3-8B's LM head on a GPU, a tiny one on the CPU.
SIZES = [(4096, 4096, 128256)] if _device.on_gpu() else [(16, 32, 300)]

#: Shapes ``fusion-advisor verify`` runs besides ``SIZES[0]``: one token; a vocabulary one past the row kernel's
#: single block (4097: its chunked path) and odd ones; odd hidden widths; several chunks' worth of tokens (1025);
#: over 65535 tokens (the row kernel's grid axis 0; skipped under the interpreter unless asked for).
VERIFY_SIZES = [(1, 8, 50), (3, 8, 4097), (5, 3, 37), (4, 37, 3), (1025, 4, 3), (65537, 2, 3)]


def get_inputs(size: tuple[int, int, int] | None = None) -> list:
    """``size`` = ``(n_tokens, hidden, vocab)``, default ``SIZES[0]``: 4096 x 4096 x 128256 bf16 on a GPU, 16 x 32
    x 300 fp32 on the CPU; mean, 5% ignored; drawn from the seed ``verify`` set."""
    n_tokens, hidden, vocab = size or SIZES[0]
    dtype = "bfloat16" if _device.on_gpu() else "float32"
    return make_inputs(n_tokens=n_tokens, hidden=hidden, vocab=vocab, dtype=dtype, seed=torch.initial_seed())


def hard_inputs() -> list:
    """Hard values: confident predictions (a weight row aligned with each token's input, so p ~ 1 and the true
    class's gradient p - 1 is tiny), inputs of large magnitude (logits x 30: ``exp`` overflows unless the row max is
    subtracted), label smoothing with "sum", soft-capping with a bias, and "none" with every row's own gradient."""
    x, w, t, b, ignore_index, _, _, _ = get_inputs()
    confident_w = w.detach().clone()
    valid = t != ignore_index
    confident_w[t[valid]] += 12.0 * x.detach()[valid] / x.detach()[valid].norm(dim=-1, keepdim=True).clamp_min(1e-6)
    big = (x.detach() * 30.0).requires_grad_(True)
    bias = (torch.randn(w.shape[0], generator=torch.Generator().manual_seed(5)) * 0.1).to(x.dtype).to(x.device)
    return [("confident predictions", [x, confident_w.requires_grad_(True), t, None, ignore_index, 0.0, "mean", 0.0]),
            ("inputs x 30", [big, w, t, None, ignore_index, 0.0, "mean", 0.0]),
            ("label smoothing 0.1, sum", [x, w, t, None, ignore_index, 0.1, "sum", 0.0]),
            ("soft-capping 2.0 with a bias", [x, w, t, bias.requires_grad_(True), ignore_index, 0.0, "mean", 2.0]),
            ("reduction none", [x, w, t, None, ignore_index, 0.0, "none", 0.0])]


#: GPU benchmark shapes (kwargs of :func:`make_inputs`): the LM head of a Llama-3-8B-width training step (2 x 2048
#: tokens, hidden 4096, vocabulary 128256) and of Llama-2 (32000), bf16; the issue's comparison with Liger's.
BENCH_SHAPES: list[dict] = [
    {"n_tokens": 4096, "hidden": 4096, "vocab": 128256, "dtype": "bfloat16"},
    {"n_tokens": 4096, "hidden": 4096, "vocab": 32000, "dtype": "bfloat16"},
]


def flops(x, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0, reduction="mean", softcap=0.0) -> int:
    """FLOPs of the forward GEMM (``2 N H V``); the gradient GEMMs add ``4 N H V`` when inputs require grad."""
    n = 2 * x.shape[0] * x.shape[1] * weight.shape[0]
    return n * 3 if (x.requires_grad or weight.requires_grad) else n


def bytes_moved(x, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0, reduction="mean",
                softcap=0.0) -> int:
    """Fewest bytes: read x, W, targets; with gradients write dx and dW (the logits never leave a chunk)."""
    io = x.numel() * x.element_size() + weight.numel() * weight.element_size() + target.numel() * 8
    if x.requires_grad or weight.requires_grad:
        io += x.numel() * x.element_size() + weight.numel() * weight.element_size()
    return io


# --- registration -------------------------------------------------------------------------------------------


def _linear_cross_entropy_pattern(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # HF causal-LM head and loss: logits = lm_head(hidden); ForCausalLMLoss: logits.float().view(-1, vocab);
    # nn.functional.cross_entropy(logits, shift_labels, ignore_index=-100, reduction="mean")
    logits = torch.nn.functional.linear(hidden, weight)
    return torch.nn.functional.cross_entropy(logits.float().view(-1, weight.shape[0]), labels, ignore_index=-100,
                                             reduction="mean")


def _linear_cross_entropy_replacement(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return linear_cross_entropy(hidden, weight, labels, None, -100, 0.0, "mean", 0.0, loss_dtype=torch.float32)


ENTRY = register_kernel(KernelEntry(
    name="linear_cross_entropy", module=__name__, op="fusion_advisor::linear_cross_entropy", has_backward=True,
    description="LM-head linear + cross-entropy chunked over tokens (the logits never materialised whole); "
                "mean/sum/none, ignore_index, label smoothing, soft-capping; dx, dW, db in the forward",
    pattern=_linear_cross_entropy_pattern, replacement=_linear_cross_entropy_replacement,
    example_args=((2, 3, 16), (40, 16), ((6,), torch.int64))))
