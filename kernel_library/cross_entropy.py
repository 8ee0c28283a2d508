"""Cross-entropy over logits ``[n_tokens, vocab]``, with the gradient computed in the forward pass.

One program per token row. The forward computes the row's log-sum-exp (in registers up to
:data:`MAX_SINGLE_BLOCK` columns; beyond, an online log-sum-exp over vocabulary chunks, Milakov & Gimelshein 2018),
its loss, and, when the logits need a gradient, ``dlogits`` for a unit upstream gradient, all in one launch (the
Liger-Kernel scheme) -- but into a **separate buffer the op allocates**: the input logits are never written.
The backward multiplies that buffer in place by ``grad_output`` (per row for ``reduction="none"``); rows whose
``grad_output`` is exactly 1 (``loss.backward()`` on the loss itself) are skipped on the device, so a
forward+backward writes the gradient once and reads the logits once (single block) or twice (chunked path, whose
first pass asks L2 to keep the row for the second; measured faster on the H200 all the same, see the constants).

Semantics match ``torch.nn.functional.cross_entropy(logits, target, ignore_index=..., label_smoothing=...,
reduction=...)`` with class-index targets and no class weights:

- per row ``i`` with ``t = target[i] != ignore_index``:
  ``loss_i = (1 - eps) * (lse_i - x_it) + eps * (lse_i - mean_j x_ij)``, ``lse_i = log sum_j exp(x_ij)``,
  computed as ``(lse_i - x_it) - eps / V * sum_j (x_ij - x_it)`` (shifted by ``x_it`` so 1e4-scale logits keep fp32
  accuracy); ignored rows give 0 loss and 0 gradient.
- ``"mean"`` divides the sum by the number of non-ignored rows: a batch whose rows are all ignored gives NaN, as in
  torch; ``"sum"`` sums; ``"none"`` returns the per-row losses.
- ``dlogits_ij = (softmax(x_i)_j - eps / V - (1 - eps) * [j == t]) * f`` with ``f = 1 / n_valid`` for ``"mean"``
  and 1 otherwise.
- A target outside ``[0, vocab)`` that is not ``ignore_index`` gives a NaN loss and NaN gradient row (torch raises
  an error or a device-side assert; the kernel cannot raise without a host sync).
- The loss has the logits' dtype (like torch), computed in fp32 (``loss_dtype`` can ask for float32 directly).

Backward limitation: the op's backward runs once per forward (it scales its saved buffer in place); a second
backward through the same graph (``retain_graph=True``) raises ``RuntimeError``. It is not twice differentiable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library._op import launcher, library_op
from kernel_library.registry import KernelEntry, register_kernel
from kernel_library.softmax import needs_int64_cols, online_lse_combine, online_lse_update, warps_for

# --- constants ----------------------------------------------------------------------------------------------

#: Widest vocabulary (power-of-two block) whose row is held in registers as one block (one read of the logits).
#: Measured on H200 2026-11-29, benchmarks/results/h200/kernels/sweep_rows.json (forward + loss.backward(), bf16,
#: 8192 x 32000): the single 32768-wide block took 0.674 ms at its best (32 warps; 0.684 / 0.696 ms at 16 / 8),
#: while the chunked path below took 0.603 ms (1.17x torch.compile) despite its second read of the row. So
#: vocabularies wider than 4096 take the chunked path; up to 4096 (not swept) one block stays.
MAX_SINGLE_BLOCK = 4096

#: Chunk width and warps of the chunked path. Measured on H200 2026-11-29,
#: benchmarks/results/h200/kernels/sweep_rows.json (forward + loss.backward(), bf16, n_cols specialised, per-lane online
#: pass; chunks {1024 .. 8192} x {4, 8, 16} warps): 4096 over 8 warps was fastest at V = 32000 (0.516 ms total, of which
#: 0.156 ms were autograd's zero fill of the unused gradient of the op's second output, since removed: see
#: ``_setup_context``) and at V = 128256 (2.169 ms). The per-lane accumulators (max, sum; smoothing: sum of logits) hold
#: 3 fp32 values per chunk element: 16 elements per thread here; 8192 over 4 warps (64 per thread) spilled and was the
#: slowest.
LOOP_BLOCK = 4096
LOOP_WARPS = 8

# num_warps of a single block: softmax.warps_for (about 16 elements per thread, the same reasoning as there).

#: Block of the in-place gradient-scaling kernel of the backward (a pure stream: 4096 elements over 8 warps is
#: 16 per thread).
SCALE_BLOCK = 4096

#: Block and warps of the single-program prologue (count of non-ignored targets) and epilogue (sum of row losses)
#: kernels, one launch each instead of ~5 small torch ops. One program loops over the tokens, so each loop step is a
#: memory round trip: 8192 tokens in one step of 8192 over 16 warps took 2.1 + 2.2 us against 5.2 + 5.0 us in 8
#: steps of 1024 over 4 warps (H200, fwd + loss.backward() at 8192 x 32000 bf16: 0.3534 vs 0.3599 ms; 32 warps no
#: better; benchmarks/results/h200/kernels/ce_reduce_ab.json).
REDUCE_BLOCK = 8192
REDUCE_WARPS = 16

#: log2(e) and ln(2): the kernels compute exp(v) = exp2(v * log2 e) and log(v) = log2(v) * ln 2.
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

REDUCTIONS = ("mean", "sum", "none")


# --- kernels ------------------------------------------------------------------------------------------------
# Float arguments (label_smoothing) are cast to fp32 at kernel entry. Eager Triton passes a Python float as fp32,
# but Inductor types it fp64 when torch.compile compiles these triton_ops: the smoothed loss and every gradient
# element then ran in fp64 (slower, rounded unlike eager). ``tl.cast`` rather than ``.to``: under TRITON_INTERPRET
# the argument is a plain Python float, which has no ``.to``; tl.cast also accepts a constexpr.


@triton.jit(do_not_specialize=["n_rows", "ignore_index"])
def _count_valid_kernel(
    target_ptr,  # *int64: targets [n_rows]
    target_stride,  # stride of target, in elements
    n_valid_ptr,  # *int64: output scalar, number of targets != ignore_index
    n_rows,  # number of tokens
    ignore_index,  # target value of ignored rows
    BLOCK: tl.constexpr,  # targets per iteration
):
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in tl.range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        t = tl.load(target_ptr + rows.to(tl.int64) * target_stride, mask=rows < n_rows, other=ignore_index)
        acc += (t != ignore_index).to(tl.int64)
    tl.store(n_valid_ptr, tl.sum(acc, axis=0))


@triton.jit(do_not_specialize=["n_rows"])
def _reduce_loss_kernel(
    loss_rows_ptr,  # *fp32: per-row losses [n_rows]
    n_valid_ptr,  # *int64: scalar count of non-ignored rows; read only when MEAN
    out_ptr,  # *T: output scalar loss
    n_rows,  # number of tokens
    MEAN: tl.constexpr,  # divide the sum by n_valid (NaN when n_valid == 0, as torch)
    BLOCK: tl.constexpr,  # rows per iteration
):
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # fixed order: deterministic, unlike atomics
    for start in tl.range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        acc += tl.load(loss_rows_ptr + rows, mask=rows < n_rows, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        n_valid = tl.load(n_valid_ptr).to(tl.float32)
        total = tl.where(n_valid == 0.0, float("nan"), total / tl.maximum(n_valid, 1.0))
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


# n_cols stays specialised: its divisibility by 16 lets the masked row accesses vectorise (see softmax.py).
@triton.jit(do_not_specialize=["ignore_index"])
def _cross_entropy_fwd_kernel(
    logits_ptr,  # *T: logits [n_rows, n_cols]; never written
    logits_stride_row, logits_stride_col,  # strides of the logits' row and vocabulary axes, in elements
    target_ptr,  # *int64: target class per row [n_rows]
    target_stride,  # stride of target, in elements
    dlogits_ptr,  # *T: output gradient per unit upstream gradient, contiguous [n_rows, n_cols]; unused unless COMPUTE_GRAD
    loss_ptr,  # *fp32 or *T: output per-row loss [n_rows] (0 for ignored rows), stored in the pointer's dtype
    n_valid_ptr,  # *int64: scalar, number of rows whose target != ignore_index; read only when REDUCE_MEAN
    n_cols,  # vocabulary size V
    ignore_index,  # target value whose row is ignored
    label_smoothing,  # eps in [0, 1]
    HAS_SMOOTHING: tl.constexpr,  # eps > 0 (skips the sum of logits otherwise; also avoids 0 * -inf)
    REDUCE_MEAN: tl.constexpr,  # scale the gradient by 1 / n_valid
    COMPUTE_GRAD: tl.constexpr,  # write dlogits
    SINGLE_BLOCK: tl.constexpr,  # whole row in one block (held in registers), else chunked two-pass path
    BLOCK: tl.constexpr,  # elements per block (power of two)
    COLS_I64: tl.constexpr,  # column offsets in int64
):
    label_smoothing = tl.cast(label_smoothing, tl.float32)  # see 'Float arguments' above
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * logits_stride_row
    d_row = dlogits_ptr + row * n_cols
    offs = tl.arange(0, BLOCK)
    if COLS_I64:
        offs = offs.to(tl.int64)
    t = tl.load(target_ptr + row * target_stride)

    if t == ignore_index:
        tl.store(loss_ptr + row, tl.zeros([], dtype=loss_ptr.dtype.element_ty))
        if COMPUTE_GRAD:
            zero = tl.zeros([BLOCK], dtype=dlogits_ptr.dtype.element_ty)
            for start in tl.range(0, n_cols, BLOCK):
                cols = start + offs
                tl.store(d_row + cols, zero, mask=cols < n_cols)
    else:
        in_range = (t >= 0) & (t < n_cols)
        x_t = tl.load(x_row + t * logits_stride_col, mask=in_range, other=0.0).to(tl.float32)
        if SINGLE_BLOCK:
            live = offs < n_cols
            x = tl.load(x_row + offs * logits_stride_col, mask=live, other=float("-inf"),
                        eviction_policy="evict_first").to(tl.float32)
            m = tl.max(x, axis=0)
            e = tl.exp2((x - m) * LOG2E)
            s = tl.sum(e, axis=0)
            if HAS_SMOOTHING:
                shift_sum = tl.sum(tl.where(live, x - x_t, 0.0), axis=0)
        else:
            # Pass 1: online log-sum-exp over chunks, kept per lane (softmax.online_lse_update): the loop has no
            # cross-warp reduction.
            m_lane = tl.full([BLOCK], float("-inf"), tl.float32)
            s_lane = tl.zeros([BLOCK], dtype=tl.float32)
            shift_lane = tl.zeros([BLOCK], dtype=tl.float32)
            for start in tl.range(0, n_cols, BLOCK):
                cols = start + offs
                live = cols < n_cols
                # evict_last: ask L2 to keep the row for pass 2.
                x = tl.load(x_row + cols * logits_stride_col, mask=live, other=float("-inf"),
                            eviction_policy="evict_last").to(tl.float32)
                m_lane, s_lane = online_lse_update(m_lane, s_lane, x)
                if HAS_SMOOTHING:
                    shift_lane += tl.where(live, x - x_t, 0.0)
            m, s = online_lse_combine(m_lane, s_lane)
            if HAS_SMOOTHING:
                shift_sum = tl.sum(shift_lane, axis=0)
        # lse - x_t = (m - x_t) + log(s): exact when the target is the max, so confident rows give ~0, not cancellation.
        loss = (m - x_t) + tl.log2(s) * LN2
        if HAS_SMOOTHING:
            loss = loss - (label_smoothing / n_cols) * shift_sum
        loss = tl.where(in_range, loss, float("nan"))
        tl.store(loss_ptr + row, loss.to(loss_ptr.dtype.element_ty))

        if COMPUTE_GRAD:
            factor = 1.0
            if REDUCE_MEAN:
                factor = 1.0 / tl.load(n_valid_ptr).to(tl.float32)
            smooth = label_smoothing / n_cols * factor  # subtracted from every column
            hit = (1.0 - label_smoothing) * factor  # subtracted from the target column
            bad = tl.where(in_range, 0.0, float("nan"))  # NaN row for an out-of-range target
            if SINGLE_BLOCK:
                p = e * (factor / s)
                g = p - smooth - tl.where(offs == t, hit, 0.0) + bad
                tl.store(d_row + offs, g.to(dlogits_ptr.dtype.element_ty), mask=live)
            else:
                # Pass 2: softmax_j = exp(x_j - lse), from (x_j - lse) to keep 1e4-scale logits accurate.
                lse = m + tl.log2(s) * LN2
                for start in tl.range(0, n_cols, BLOCK):
                    cols = start + offs
                    live = cols < n_cols
                    x = tl.load(x_row + cols * logits_stride_col, mask=live, other=float("-inf"),
                                eviction_policy="evict_first").to(tl.float32)
                    p = tl.exp2((x - lse) * LOG2E) * factor
                    g = p - smooth - tl.where(cols == t, hit, 0.0) + bad
                    tl.store(d_row + cols, g.to(dlogits_ptr.dtype.element_ty), mask=live)


@triton.jit
def _scale_grad_kernel(
    dlogits_ptr,  # *T: gradient buffer [n_rows, n_cols], contiguous; scaled in place
    grad_ptr,  # *T': upstream gradient of the loss, one value per row or a scalar
    grad_stride,  # stride of grad_output per row (0 for a scalar)
    n_cols,  # vocabulary size
    BLOCK: tl.constexpr,  # elements per chunk
    COLS_I64: tl.constexpr,  # column offsets in int64
):
    row = tl.program_id(0).to(tl.int64)
    g = tl.load(grad_ptr + row * grad_stride).to(tl.float32)
    if g != 1.0:  # loss.backward() passes exactly 1: nothing to move
        d_row = dlogits_ptr + row * n_cols
        offs = tl.arange(0, BLOCK)
        if COLS_I64:
            offs = offs.to(tl.int64)
        for start in tl.range(0, n_cols, BLOCK):
            cols = start + offs
            live = cols < n_cols
            d = tl.load(d_row + cols, mask=live, other=0.0).to(tl.float32)
            tl.store(d_row + cols, (d * g).to(dlogits_ptr.dtype.element_ty), mask=live)


# --- launchers ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CrossEntropyConfig:
    """Launch configuration for one token row per program.

    Attributes:
        block_size: elements per block (power of two); the whole row when ``single_block``.
        num_warps: warps per program.
        single_block: the row fits one block (read once, held in registers) instead of the chunked two-pass path.
    """

    block_size: int
    num_warps: int
    single_block: bool

    @classmethod
    def for_vocab(cls, n_cols: int) -> "CrossEntropyConfig":
        """Single block when ``next_power_of_2(n_cols) <= MAX_SINGLE_BLOCK`` (:func:`warps_for` warps), else
        :data:`LOOP_BLOCK` chunks over :data:`LOOP_WARPS` warps (the H200 sweep's choices, see the constants)."""
        block = triton.next_power_of_2(max(n_cols, 1))
        if block <= MAX_SINGLE_BLOCK:
            return cls(block, warps_for(block), True)
        return cls(LOOP_BLOCK, LOOP_WARPS, False)


def _check_args(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float, reduction: str) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"cross_entropy: logits must be a 2-D tensor [n_tokens, vocab], got "
                         f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"cross_entropy: logits must be float32, float16 or bfloat16, got {logits.dtype}")
    if logits.shape[1] == 0:
        raise ValueError("cross_entropy: logits has a vocabulary of 0 classes")
    if not isinstance(target, torch.Tensor) or target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"cross_entropy: target must be 1-D [n_tokens] = [{logits.shape[0]}], got "
                         f"{tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__}")
    if target.dtype != torch.int64:
        raise TypeError(f"cross_entropy: target must be int64 class indices, got {target.dtype}")
    if target.device != logits.device:
        raise ValueError(f"cross_entropy: target is on {target.device} but logits is on {logits.device}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _cross_entropy_fwd_launch(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                              reduction: str, compute_grad: bool, loss_dtype: Optional[torch.dtype] = None,
                              config: CrossEntropyConfig | None = None,
                              force_int64_cols: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward; returns ``(loss, dlogits)`` (``dlogits`` is empty unless ``compute_grad``).

    ``config`` and ``force_int64_cols`` exist for tests.
    """
    _check_args(logits, target, label_smoothing, reduction)
    n_rows, n_cols = logits.shape
    device = logits.device
    out_dtype = loss_dtype or logits.dtype
    if compute_grad:
        dlogits = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=device)
    else:
        dlogits = logits.new_empty(0)
    if n_rows == 0:  # torch: mean over no rows is NaN, sum is 0
        if reduction == "none":
            return torch.empty(0, dtype=out_dtype, device=device), dlogits
        return torch.full((), float("nan") if reduction == "mean" else 0.0, dtype=out_dtype, device=device), dlogits
    # "none" writes the per-row losses straight into the output; "sum"/"mean" reduce an fp32 buffer afterwards.
    if reduction == "none":
        loss_rows = torch.empty(n_rows, dtype=out_dtype, device=device)
    else:
        loss_rows = torch.empty(n_rows, dtype=torch.float32, device=device)
    # "mean": the gradient's 1 / n_valid counted on the device, without a host sync; otherwise a placeholder.
    n_valid = count_valid(target, ignore_index) if reduction == "mean" else target
    cross_entropy_rows(logits, target, loss_rows, n_valid, ignore_index, label_smoothing, reduction == "mean",
                       dlogits if compute_grad else None, config=config, force_int64_cols=force_int64_cols)
    if reduction == "none":
        return loss_rows, dlogits
    return reduce_rows(loss_rows, n_valid, reduction == "mean", out_dtype), dlogits


def count_valid(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Number of ``target`` entries != ``ignore_index``, as a 0-d int64 tensor on the target's device (no host
    sync): the divisor of ``"mean"``. ``target``: ``[n_rows]`` int64, any stride."""
    n_valid = torch.empty((), dtype=torch.int64, device=target.device)
    launcher(_count_valid_kernel)[(1,)](
        target, target.stride(0), n_valid, target.shape[0], int(ignore_index), BLOCK=REDUCE_BLOCK,
        num_warps=REDUCE_WARPS,
    )
    return n_valid


def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, loss_rows: torch.Tensor, n_valid: torch.Tensor,
                       ignore_index: int, label_smoothing: float, reduce_mean: bool,
                       dlogits: torch.Tensor | None = None, config: CrossEntropyConfig | None = None,
                       force_int64_cols: bool = False) -> None:
    """The row kernel on its own, for callers that tile the tokens (the fused linear cross-entropy) and for the
    forward of :func:`cross_entropy`.

    Args:
        logits: ``[n_rows, vocab]`` fp32/fp16/bf16, any strides.
        target: ``[n_rows]`` int64.
        loss_rows: ``[n_rows]`` output, per-row loss (0 for ignored rows), in its own dtype.
        n_valid: 0-d int64 divisor of the gradient when ``reduce_mean`` (the whole batch's count, so tiles of one
            batch scale alike).
        dlogits: where the gradient per unit upstream gradient goes, contiguous ``[n_rows, vocab]`` of the logits'
            dtype; it may be ``logits`` itself (each element is read before it is written); ``None``: no gradient.
        config, force_int64_cols: the block configuration and 64-bit column offsets, for tests.
    """
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    cfg = config or CrossEntropyConfig.for_vocab(n_cols)
    grad = dlogits is not None
    launcher(_cross_entropy_fwd_kernel)[(n_rows,)](
        logits, logits.stride(0), logits.stride(1),
        target, target.stride(0),
        dlogits if grad else logits,
        loss_rows,
        n_valid,
        n_cols, int(ignore_index), float(label_smoothing),
        HAS_SMOOTHING=label_smoothing > 0.0, REDUCE_MEAN=bool(reduce_mean), COMPUTE_GRAD=grad,
        SINGLE_BLOCK=cfg.single_block, BLOCK=cfg.block_size,
        COLS_I64=force_int64_cols or needs_int64_cols(n_cols, logits.stride(1)) or needs_int64_cols(n_cols, 1),
        num_warps=cfg.num_warps,
    )


def reduce_rows(loss_rows: torch.Tensor, n_valid: torch.Tensor, mean: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """The 0-d loss of per-row losses ``[n_rows]`` (fp32): their sum, or their mean over ``n_valid`` rows (NaN when
    0, as torch), in a fixed order (deterministic)."""
    loss = torch.empty((), dtype=out_dtype, device=loss_rows.device)
    launcher(_reduce_loss_kernel)[(1,)](
        loss_rows, n_valid, loss, loss_rows.shape[0], MEAN=bool(mean), BLOCK=REDUCE_BLOCK, num_warps=REDUCE_WARPS,
    )
    return loss


def _scale_grad_launch(dlogits: torch.Tensor, grad_output: torch.Tensor) -> None:
    """Multiply row ``i`` of ``dlogits`` in place by ``grad_output[i]`` (or the scalar ``grad_output``)."""
    if dlogits.dim() != 2 or not dlogits.is_contiguous():
        raise ValueError("cross_entropy backward: dlogits must be the contiguous [n_tokens, vocab] forward buffer")
    n_rows, n_cols = dlogits.shape
    if grad_output.dim() == 0:
        grad_stride = 0
    elif grad_output.shape == (n_rows,):
        grad_stride = grad_output.stride(0)
    else:
        raise ValueError(f"cross_entropy backward: grad_output must be a scalar or [{n_rows}], "
                         f"got {tuple(grad_output.shape)}")
    if dlogits.numel() == 0:
        return
    launcher(_scale_grad_kernel)[(n_rows,)](
        dlogits, grad_output, grad_stride, n_cols,
        BLOCK=SCALE_BLOCK, COLS_I64=needs_int64_cols(n_cols, 1), num_warps=warps_for(SCALE_BLOCK),
    )


# --- custom ops and autograd --------------------------------------------------------------------------------


@library_op("fusion_advisor::cross_entropy", mutates_args={})
def cross_entropy_op(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float,
                     reduction: str, compute_grad: bool,
                     loss_dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, dlogits per unit upstream gradient)``; see the module docstring."""
    return _cross_entropy_fwd_launch(logits, target, ignore_index, label_smoothing, reduction, compute_grad,
                                     loss_dtype)


@library_op("fusion_advisor::cross_entropy_scale_grad", mutates_args={"dlogits"})
def cross_entropy_scale_grad_op(dlogits: torch.Tensor, grad_output: torch.Tensor) -> None:
    """Backward of :func:`cross_entropy_op`: ``dlogits *= grad_output`` per row, in place; rows with exactly 1 skipped."""
    _scale_grad_launch(dlogits, grad_output)


def _setup_context(ctx, inputs, output) -> None:
    # dlogits is a non-differentiable output, but autograd still hands its backward a gradient for it, by default
    # materialised as zeros: a [n_tokens, vocab] fill per step (0.156 ms of a 0.516 ms fwd+bwd at 8192 x 32000 bf16
    # on the H200). Unused here, so not materialised.
    ctx.set_materialize_grads(False)
    ctx.compute_grad = inputs[5]
    ctx.backward_done = False
    _loss, dlogits = output
    ctx.mark_non_differentiable(dlogits)
    ctx.save_for_backward(dlogits)


def _backward(ctx, grad_loss, _grad_dlogits):
    if not ctx.compute_grad:
        raise RuntimeError("fusion_advisor::cross_entropy: backward needs the forward to run with compute_grad=True")
    if ctx.backward_done:
        raise RuntimeError("fusion_advisor::cross_entropy: a second backward through the same forward is not supported "
                           "(the backward scales its saved gradient in place); run the forward again instead of "
                           "retain_graph=True")
    ctx.backward_done = True
    (dlogits,) = ctx.saved_tensors
    if grad_loss is None:  # not materialised (see _setup_context): the loss received no gradient
        return None, None, None, None, None, None, None
    cross_entropy_scale_grad_op(dlogits, grad_loss)
    return dlogits, None, None, None, None, None, None


cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ----------------------------------------------------------------------------------------


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean", *, loss_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Cross-entropy of ``logits`` against class indices, forward and backward in Triton.

    Args:
        logits: ``[n_tokens, vocab]`` float32/float16/bfloat16, any strides, any vocab size (never modified).
        target: ``[n_tokens]`` int64 class indices in ``[0, vocab)`` or ``ignore_index``.
        ignore_index: rows with this target contribute no loss and no gradient (and are not counted by "mean").
        label_smoothing: ``eps`` in ``[0, 1]``, as ``torch.nn.functional.cross_entropy`` defines it.
        reduction: ``"mean"`` (over non-ignored rows), ``"sum"`` or ``"none"`` (``[n_tokens]``).
        loss_dtype: dtype of the returned loss; default the logits' dtype (as torch). ``torch.float32`` gives the
            fp32 loss of HF's ``cross_entropy(logits.float(), ...)`` without materialising fp32 logits.

    Returns:
        The loss (0-d, or ``[n_tokens]`` for "none"). All rows ignored with "mean": NaN (as torch).

    Formula: ``loss_i = lse_i - (1 - eps) x_{i,t_i} - eps / V sum_j x_ij``; gradient
    ``softmax(x_i) - eps / V - (1 - eps) onehot(t_i)``, computed in the forward into a buffer of the op
    (Liger-Kernel's fused scheme, without writing into the logits).

    Raises:
        ValueError: wrong ranks or sizes, vocab of 0, tensors on different devices, ``label_smoothing`` outside
            ``[0, 1]``, unknown ``reduction``.
        TypeError: logits not fp32/fp16/bf16 or target not int64.
        RuntimeError: a second backward through the same forward (see the module docstring).
    """
    _check_args(logits, target, label_smoothing, reduction)
    compute_grad = torch.is_grad_enabled() and logits.requires_grad
    loss, _ = cross_entropy_op(logits, target, int(ignore_index), float(label_smoothing), reduction, compute_grad,
                               loss_dtype)
    return loss


# --- contract -----------------------------------------------------------------------------------------------


def kernel_fn(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
              reduction: str = "mean") -> torch.Tensor:
    """The public wrapper (:func:`cross_entropy`) with ``torch.nn.functional.cross_entropy``'s arguments."""
    return cross_entropy(logits, target, ignore_index, label_smoothing, reduction)


def reference_fn(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                 reduction: str = "mean") -> torch.Tensor:
    """``torch.nn.functional.cross_entropy`` computed in ``promote_types(logits.dtype, float32)`` (float64 stays
    float64), returned in the logits' dtype: the kernel's semantics exactly."""
    acc = torch.promote_types(logits.dtype, torch.float32)
    loss = torch.nn.functional.cross_entropy(logits.to(acc), target, ignore_index=ignore_index,
                                             label_smoothing=label_smoothing, reduction=reduction)
    return loss.to(logits.dtype)


def _dtype(d) -> torch.dtype:
    return getattr(torch, d) if isinstance(d, str) else d


def make_inputs(n_tokens: int = 16, vocab: int = 1000, dtype="float32", ignore_frac: float = 0.05,
                ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                requires_grad: bool = True, seed: int = 0, device=None) -> list:
    """Arguments ``[logits, target, ignore_index, label_smoothing, reduction]`` for :func:`kernel_fn`.

    ``logits`` ``[n_tokens, vocab]`` of ``dtype`` (torch dtype or name) with std 2; about ``ignore_frac`` of the
    targets are ``ignore_index`` (HF pads shifted labels with -100).
    """
    dtype = _dtype(dtype)
    device = device or _device.default_device()
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n_tokens, vocab, generator=gen).mul_(2.0).to(dtype=dtype, device=device)
    logits.requires_grad_(requires_grad)
    target = torch.randint(0, vocab, (n_tokens,), generator=gen)
    target = target.masked_fill(torch.rand(n_tokens, generator=gen) < ignore_frac, ignore_index).to(device)
    return [logits, target, ignore_index, float(label_smoothing), reduction]


#: ``get_inputs(size)`` sizes, ``(n_tokens, vocab)``; ``verify`` derives its edge shapes from the first.
SIZES = [(8192, 32000)] if _device.on_gpu() else [(16, 1000)]


def get_inputs(size: tuple[int, int] | None = None) -> list:
    """``size`` = ``(n_tokens, vocab)``, default ``SIZES[0]``: 8192 tokens x 32000 vocab bf16 (Llama-2-7B)
    on a GPU, 16 x 1000 fp32 on the CPU; mean, 5% ignored; drawn from the seed ``verify`` set."""
    n_tokens, vocab = size or SIZES[0]
    dtype = "bfloat16" if _device.on_gpu() else "float32"
    return make_inputs(n_tokens=n_tokens, vocab=vocab, dtype=dtype, seed=torch.initial_seed())


def hard_inputs() -> list:
    """Hard values: confident predictions (the target's logit raised by 12, so p ~ 0.9999 and the true-class
    gradient p - 1 ~ -1e-4, which rounding p to bf16 before the subtraction turns into 0), logits of large
    magnitude (x 100: ``exp`` overflows unless the row max is subtracted), and label smoothing 0.1 with sum."""
    logits, target, ignore_index, _, _ = get_inputs()
    rows = torch.arange(logits.shape[0], device=logits.device)
    valid = target != ignore_index
    confident = logits.detach().clone()
    confident[rows[valid], target[valid]] += 12.0
    large = (logits.detach() * 100.0).requires_grad_(True)
    return [("confident predictions (p ~ 0.9999)", [confident.requires_grad_(True), target, ignore_index, 0.0, "mean"]),
            ("logits x 100", [large, target, ignore_index, 0.0, "mean"]),
            ("label smoothing 0.1, sum", [logits, target, ignore_index, 0.1, "sum"])]


#: GPU benchmark shapes: the reference rows (8192 tokens, V = 32000 and 128256, both chunked, bf16), other
#: common vocabularies (GPT-2 50257, Qwen2 151936, Gemma 256000) at 4096 tokens, fp32 logits, label smoothing, and a
#: decode-like few-token case.
BENCH_SHAPES: list[dict] = [
    {"n_tokens": 8192, "vocab": 32000, "dtype": "bfloat16"},
    {"n_tokens": 8192, "vocab": 128256, "dtype": "bfloat16"},
    {"n_tokens": 4096, "vocab": 50257, "dtype": "bfloat16"},
    {"n_tokens": 4096, "vocab": 151936, "dtype": "bfloat16"},
    {"n_tokens": 4096, "vocab": 256000, "dtype": "bfloat16"},
    {"n_tokens": 8192, "vocab": 32000, "dtype": "float32"},
    {"n_tokens": 8192, "vocab": 32000, "dtype": "bfloat16", "label_smoothing": 0.1},
    {"n_tokens": 64, "vocab": 128256, "dtype": "bfloat16"},
]


def bytes_moved(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                reduction: str = "mean") -> int:
    """Fewest bytes of the fused forward: read logits and targets, write the loss, and write dlogits when the logits
    require grad (the gradient is produced here, so this also is the forward+backward count for loss.backward())."""
    n_tokens = logits.shape[0]
    logit_bytes = logits.numel() * logits.element_size()
    grad_bytes = logit_bytes if logits.requires_grad else 0
    loss_bytes = (n_tokens if reduction == "none" else 1) * logits.element_size()
    return logit_bytes + grad_bytes + target.numel() * target.element_size() + loss_bytes


def bytes_moved_backward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                         label_smoothing: float = 0.0, reduction: str = "mean") -> int:
    """Bytes of the backward when ``grad_output != 1``: read grad_output, read and write dlogits in place. With
    ``grad_output == 1`` (``loss.backward()``) the kernel skips every row and moves only grad_output."""
    n_tokens = logits.shape[0]
    grad_out_bytes = (n_tokens if reduction == "none" else 1) * logits.element_size()
    return 2 * logits.numel() * logits.element_size() + grad_out_bytes


def bytes_moved_fwd_bwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                        label_smoothing: float = 0.0, reduction: str = "mean") -> int:
    """Fewest bytes of forward + ``loss.backward()``: the forward already writes dlogits and the backward, with
    ``grad_output == 1``, moves no logits, so this equals :func:`bytes_moved` with grad enabled."""
    return bytes_moved(logits, target, ignore_index, label_smoothing, reduction)


# --- registration -------------------------------------------------------------------------------------------


def _cross_entropy_pattern(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # HF ForCausalLMLoss (after the label shift): logits = logits.float();
    # nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="mean")
    return torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="mean")


def _cross_entropy_replacement(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return cross_entropy(logits, labels, -100, 0.0, "mean", loss_dtype=torch.float32)


ENTRY = register_kernel(KernelEntry(
    name="cross_entropy", module=__name__, op="fusion_advisor::cross_entropy", has_backward=True,
    description="cross-entropy with class-index targets, ignore_index, label smoothing and mean/sum/none "
                "(matches torch.nn.functional.cross_entropy); gradient written in the forward to its own buffer",
    pattern=_cross_entropy_pattern, replacement=_cross_entropy_replacement,
    example_args=((6, 40), ((6,), torch.int64))))
