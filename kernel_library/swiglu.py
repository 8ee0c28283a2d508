"""SwiGLU: ``c = silu(a) * b``, the gated MLP activation of Llama / Mistral, forward and backward.

Replaces the ``swiglu`` chain of Hugging Face's ``LlamaMLP``: ``act_fn(gate_proj(x)) * up_proj(x)`` with
``act_fn = SiLU`` (Shazeer 2020, "GLU Variants Improve Transformer"). ``silu(a) = a * sigmoid(a)`` as torch's
``F.silu``; -inf gives NaN there (-inf * 0), and so it does here.

This module also holds the generic gated-unit kernels (activation picked by a constexpr) that
``kernel_library.geglu`` reuses with the tanh-GELU activation.

Layout: when ``a`` and ``b`` are contiguous the kernels see one flat row of ``numel`` elements (programs split
the elements evenly, no per-row tail); otherwise they see [n_rows, n_cols] with row and column strides, which
covers without a copy the chunks of a fused gate_up projection (``a = x[:, :I]``, ``b = x[:, I:]``), offset
views and transposed 2-D inputs. Only a leading-dim layout that cannot be flattened into one row stride (a
permuted 3-D tensor) is copied first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library._activations import gelu_tanh, gelu_tanh_grad, silu, silu_grad
from kernel_library._checks import check_operands
from kernel_library._op import launcher, library_op
from kernel_library._rows import rows_view
from kernel_library.registry import KernelEntry, register_kernel

# --- constants ------------------------------------------------------------------------------------------------

#: Largest block of elements per program. 2048 elements with 8 warps = 8 contiguous elements per thread, one
#: 16-byte vector per operand in bf16/fp16 (two in fp32); 8192 x 11008 then runs as ~44k programs. Inside the
#: 1024-4096 range that keeps H100/H200 pointwise kernels at the bandwidth roof; on the H200, 8192 x 11008 bf16 ran
#: at the copy-bandwidth roof, 1.00x torch.compile (benchmarks/results/h200/kernels/kernels_7b.md).
MAX_BLOCK_SIZE = 2048
#: Elements per thread: one 16-byte vector of a 2-byte dtype.
ELEMS_PER_THREAD = 8
#: More warps than this would leave each thread less than one 16-byte vector at MAX_BLOCK_SIZE.
MAX_NUM_WARPS = 8

#: Gate activations of the generic gated-unit kernels.
ACTIVATIONS = ("silu", "gelu_tanh")


@triton.jit
def _gate(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "silu":
        y = silu(x)
    else:
        y = gelu_tanh(x)
    return y


@triton.jit
def _gate_grad(x, ACTIVATION: tl.constexpr):
    if ACTIVATION == "silu":
        g = silu_grad(x)
    else:
        g = gelu_tanh_grad(x)
    return g


# --- kernels --------------------------------------------------------------------------------------------------


@triton.jit
def _program_cols(pid, n_col_blocks, BLOCK_SIZE: tl.constexpr):
    """Row (int64 scalar) and columns (int64 [BLOCK_SIZE]) of program ``pid``. Rows and their column blocks are
    flattened onto grid axis 0 (column blocks fastest), so neither the row count nor the blocks of one flat row
    meet the 65535 limit of grid axes 1 and 2; int64 so that ``row * stride`` and the columns of a flat row of
    more than 2**31 elements cannot overflow."""
    row = pid // n_col_blocks
    col_block = pid - row * n_col_blocks
    return row.to(tl.int64), col_block.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)


@triton.jit(do_not_specialize=["n_col_blocks"])
def _glu_fwd_kernel(
    a_ptr,  # gate input [n_rows, n_cols]
    b_ptr,  # up input [n_rows, n_cols]
    c_ptr,  # output [n_rows, n_cols]
    n_cols,  # elements per row (all elements when the flat layout is used)
    n_col_blocks,  # cdiv(n_cols, BLOCK_SIZE): programs per row
    stride_a_row,  # a: elements between rows
    stride_a_col,  # a: elements between columns
    stride_b_row,
    stride_b_col,
    stride_c_row,
    stride_c_col,
    ACTIVATION: tl.constexpr,  # "silu" or "gelu_tanh"
    BLOCK_SIZE: tl.constexpr,  # elements of one row per program
):
    row, cols = _program_cols(tl.program_id(0), n_col_blocks, BLOCK_SIZE)
    mask = cols < n_cols
    a = tl.load(a_ptr + row * stride_a_row + cols * stride_a_col, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_b_row + cols * stride_b_col, mask=mask, other=0.0).to(tl.float32)
    c = _gate(a, ACTIVATION) * b
    tl.store(c_ptr + row * stride_c_row + cols * stride_c_col, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_col_blocks"])
def _glu_bwd_kernel(
    grad_c_ptr,  # upstream gradient [n_rows, n_cols]
    a_ptr,  # gate input [n_rows, n_cols]
    b_ptr,  # up input [n_rows, n_cols]
    grad_a_ptr,  # output dL/da [n_rows, n_cols]
    grad_b_ptr,  # output dL/db [n_rows, n_cols]
    n_cols,
    n_col_blocks,
    stride_gc_row,  # grad_c: elements between rows
    stride_gc_col,  # grad_c: elements between columns
    stride_a_row,
    stride_a_col,
    stride_b_row,
    stride_b_col,
    stride_ga_row,  # grad_a: elements between rows
    stride_ga_col,
    stride_gb_row,
    stride_gb_col,
    ACTIVATION: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    # dL/da = dc * b * act'(a), dL/db = dc * act(a); written to new tensors (the inputs are never overwritten).
    row, cols = _program_cols(tl.program_id(0), n_col_blocks, BLOCK_SIZE)
    mask = cols < n_cols
    dc = tl.load(grad_c_ptr + row * stride_gc_row + cols * stride_gc_col, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + row * stride_a_row + cols * stride_a_col, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_b_row + cols * stride_b_col, mask=mask, other=0.0).to(tl.float32)
    grad_a = dc * b * _gate_grad(a, ACTIVATION)
    grad_b = dc * _gate(a, ACTIVATION)
    tl.store(grad_a_ptr + row * stride_ga_row + cols * stride_ga_col, grad_a.to(grad_a_ptr.dtype.element_ty), mask=mask)
    tl.store(grad_b_ptr + row * stride_gb_row + cols * stride_gb_col, grad_b.to(grad_b_ptr.dtype.element_ty), mask=mask)


# --- launchers ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GluConfig:
    """Block size and warps of the gated-unit kernels, from the row length they see."""

    block_size: int
    num_warps: int

    @classmethod
    def from_cols(cls, n_cols: int) -> "GluConfig":
        block_size = min(MAX_BLOCK_SIZE, triton.next_power_of_2(n_cols))
        num_warps = min(MAX_NUM_WARPS, max(1, block_size // (ELEMS_PER_THREAD * 32)))
        return cls(block_size, num_warps)


def _check_pair(a: torch.Tensor, b: torch.Tensor, name_a: str = "a", name_b: str = "b") -> None:
    if a.dim() < 1:
        raise ValueError(f"{name_a} must have at least 1 dimension [..., n_cols], got shape {tuple(a.shape)}")
    if b.shape != a.shape:
        raise ValueError(f"{name_b} must have {name_a}'s shape {tuple(a.shape)}, got {tuple(b.shape)}")
    check_operands(a, name_a, (name_b, b))


def _as_rows(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The operands as one [n_rows, n_cols] problem: a single flat row [1, numel] when all are contiguous, else
    [..., n_cols] flattened to rows (see :func:`kernel_library.bias_gelu.rows_view`)."""
    if all(t.is_contiguous() for t in tensors):
        return [t.view(1, -1) for t in tensors]
    return [rows_view(t) for t in tensors]


def _launch(kernel, tensors: list[torch.Tensor], activation: str, config: GluConfig | None) -> None:
    views = _as_rows(*tensors)
    n_rows, n_cols = views[0].shape
    cfg = config or GluConfig.from_cols(n_cols)
    n_col_blocks = triton.cdiv(n_cols, cfg.block_size)
    strides = [s for v in views for s in v.stride()]
    launcher(kernel)[(n_rows * n_col_blocks,)](
        *views, n_cols, n_col_blocks, *strides,
        ACTIVATION=activation, BLOCK_SIZE=cfg.block_size, num_warps=cfg.num_warps,
    )


def glu_forward(a: torch.Tensor, b: torch.Tensor, activation: str, config: GluConfig | None = None) -> torch.Tensor:
    """``act(a) * b`` for ``activation`` in :data:`ACTIVATIONS`; returns a contiguous tensor like ``a``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    _check_pair(a, b)
    c = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    if a.numel():
        _launch(_glu_fwd_kernel, [a, b, c], activation, config)
    return c


def glu_backward(
    grad_c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, activation: str, config: GluConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/da, dL/db) of ``act(a) * b``; both contiguous, like ``a``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    _check_pair(a, b)
    _check_pair(a, grad_c, "a", "grad_c")
    grad_a = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    grad_b = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    if a.numel():
        _launch(_glu_bwd_kernel, [grad_c, a, b, grad_a, grad_b], activation, config)
    return grad_a, grad_b


# --- torch.library ops ----------------------------------------------------------------------------------------


@library_op("fusion_advisor::swiglu", mutates_args={})
def swiglu_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return glu_forward(a, b, "silu")


@library_op("fusion_advisor::swiglu_backward", mutates_args={})
def swiglu_backward_op(grad_c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return glu_backward(grad_c, a, b, "silu")


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    return swiglu_backward_op(grad_c, a, b)


swiglu_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ------------------------------------------------------------------------------------------


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """SwiGLU ``silu(a) * b`` in one pass; differentiable in ``a`` and ``b``.

    Args:
        a: gate, [..., n_cols] fp32/fp16/bf16, any strides (``gate_proj(x)``, or ``x[..., :I]`` of a fused
            gate_up projection).
        b: up, a's shape and dtype (``up_proj(x)`` or ``x[..., I:]``).

    Returns:
        contiguous [..., n_cols] in a's dtype; ``F.silu(a) * b`` computed in fp32 with one rounding.

    Raises:
        ValueError / TypeError: shape, dtype or device mismatch (message names the argument).
    """
    return swiglu_op(a, b)


# --- contract -------------------------------------------------------------------------------------------------


def kernel_fn(a, b):
    """The public wrapper, see :func:`swiglu`."""
    return swiglu(a, b)


def reference_fn(a, b):
    """Plain PyTorch, as HF ``LlamaMLP``: ``F.silu(a) * b``."""
    return F.silu(a) * b


def make_inputs(n_rows: int, n_cols: int, dtype: torch.dtype = torch.bfloat16, requires_grad: bool = True,
                fused: bool = False) -> list[torch.Tensor]:
    """[a, b], each [n_rows, n_cols]. ``fused=True`` gives the chunks ``x[:, :n_cols]``, ``x[:, n_cols:]`` of one
    [n_rows, 2 n_cols] gate_up output (row stride 2 n_cols); gradients then flow to ``x``."""
    device = _device.default_device()
    if fused:
        x = torch.randn(n_rows, 2 * n_cols, dtype=dtype, device=device).requires_grad_(requires_grad)
        return list(x.chunk(2, dim=-1))
    return [torch.randn(n_rows, n_cols, dtype=dtype, device=device).requires_grad_(requires_grad) for _ in range(2)]


#: ``get_inputs(size)`` sizes, ``(n_rows, n_cols)``; ``verify`` derives its edge shapes from the first.
SIZES = [(8192, 11008)] if _device.on_gpu() else [(16, 1000)]


def get_inputs(size: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """``size`` = ``(n_rows, n_cols)``, default ``SIZES[0]``: GPU Llama-7B, 8192 tokens x 11008
    intermediate, bf16; CPU 16 x 1000 fp32."""
    n_rows, n_cols = size or SIZES[0]
    return make_inputs(n_rows, n_cols, torch.bfloat16 if _device.on_gpu() else torch.float32)


def hard_inputs() -> list:
    """Hard values: gates of large magnitude (x 100: ``exp(-a)`` overflows for a << 0, so silu must come out 0, not
    NaN) and the fused gate_up layout (two chunks of one tensor, row stride 2 n_cols)."""
    a, b = get_inputs()
    large = (a.detach() * 100.0).requires_grad_(True)
    return [("gates x 100", [large, b]), ("chunks of one gate_up tensor", make_inputs(*a.shape, a.dtype, fused=True))]


#: Llama-7B (11008) and Llama-3-8B (14336) intermediates at 8192 tokens, the fused gate_up chunk layout, other
#: dtypes, and prefill / decode-sized token counts.
BENCH_SHAPES: list[dict] = [
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.bfloat16, "fused": True},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.float16},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.float32},
    {"n_rows": 8192, "n_cols": 14336, "dtype": torch.bfloat16},
    {"n_rows": 2048, "n_cols": 11008, "dtype": torch.bfloat16},
    {"n_rows": 32, "n_cols": 11008, "dtype": torch.bfloat16},
]


def bytes_moved(a, b) -> int:
    """a and b read once, c written once."""
    return 3 * a.numel() * a.element_size()


def bytes_moved_backward(a, b) -> int:
    """grad_c, a, b read once; grad_a, grad_b written once."""
    return 5 * a.numel() * a.element_size()


def _pattern(gate, up):
    # HF LlamaMLP: self.act_fn(self.gate_proj(x)) * self.up_proj(x), act_fn = nn.SiLU().
    return F.silu(gate) * up


def _replacement(gate, up):
    return kernel_fn(gate, up)


ENTRY = register_kernel(KernelEntry(
    name="swiglu", module=__name__, op="fusion_advisor::swiglu", has_backward=True,
    description="silu(a) * b (SwiGLU gate of Llama MLPs); matches F.silu(a) * b",
    pattern=_pattern, replacement=_replacement, example_args=((6, 24), (6, 24))))
