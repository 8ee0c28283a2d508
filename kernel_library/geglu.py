"""GeGLU: ``c = gelu_tanh(a) * b``, the gated MLP activation of Gemma / T5 v1.1, forward and backward.

Replaces the ``geglu`` chain of Hugging Face's ``GemmaMLP``: ``act_fn(gate_proj(x)) * up_proj(x)`` with
``act_fn = gelu_pytorch_tanh`` (Shazeer 2020, "GLU Variants Improve Transformer"), i.e.
``F.gelu(a, approximate="tanh") * b``. -inf in ``a`` gives NaN there (-inf * 0), and so it does here.

The kernels are the generic gated-unit kernels of :mod:`kernel_library.swiglu` with the tanh-GELU gate
(computed as ``a * sigmoid(2 sqrt(2/pi)(a + 0.044715 a^3))``, equal to the tanh form); the same layouts apply:
one flat row when contiguous, [n_rows, n_cols] with row and column strides otherwise (gate_up chunks, offset
views, transposed 2-D inputs), a copy only for leading dims that cannot be flattened.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernel_library import _device
from kernel_library._op import library_op
from kernel_library.registry import KernelEntry, register_kernel
from kernel_library.swiglu import bytes_moved, bytes_moved_backward, glu_backward, glu_forward  # noqa: F401 (the bytes_moved pair: this module's contract, as for swiglu)
from kernel_library.swiglu import make_inputs as _glu_inputs

# --- constants ------------------------------------------------------------------------------------------------

#: The gate activation of the shared gated-unit kernels (block size and warps: see swiglu.GluConfig).
ACTIVATION = "gelu_tanh"


# --- torch.library ops ----------------------------------------------------------------------------------------


@library_op("fusion_advisor::geglu", mutates_args={})
def geglu_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return glu_forward(a, b, ACTIVATION)


@library_op("fusion_advisor::geglu_backward", mutates_args={})
def geglu_backward_op(grad_c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return glu_backward(grad_c, a, b, ACTIVATION)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_c):
    a, b = ctx.saved_tensors
    return geglu_backward_op(grad_c, a, b)


geglu_op.register_autograd(_backward, setup_context=_setup_context)


# --- public function ------------------------------------------------------------------------------------------


def geglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """GeGLU ``gelu_tanh(a) * b`` in one pass; differentiable in ``a`` and ``b``.

    Args:
        a: gate, [..., n_cols] fp32/fp16/bf16, any strides.
        b: up, a's shape and dtype.

    Returns:
        contiguous [..., n_cols] in a's dtype; ``F.gelu(a, approximate="tanh") * b`` in fp32, one rounding.

    Raises:
        ValueError / TypeError: shape, dtype or device mismatch (message names the argument).
    """
    return geglu_op(a, b)


# --- contract -------------------------------------------------------------------------------------------------


def kernel_fn(a, b):
    """The public wrapper, see :func:`geglu`."""
    return geglu(a, b)


def reference_fn(a, b):
    """Plain PyTorch, as HF ``GemmaMLP`` with ``gelu_pytorch_tanh``: ``F.gelu(a, approximate="tanh") * b``."""
    return F.gelu(a, approximate="tanh") * b


def make_inputs(n_rows: int, n_cols: int, dtype: torch.dtype = torch.bfloat16, requires_grad: bool = True,
                fused: bool = False) -> list[torch.Tensor]:
    """[a, b], each [n_rows, n_cols] (``fused=True``: chunks of one [n_rows, 2 n_cols] tensor), as swiglu's."""
    return _glu_inputs(n_rows, n_cols, dtype, requires_grad, fused)


#: ``get_inputs(size)`` sizes, ``(n_rows, n_cols)``; ``verify`` derives its edge shapes from the first.
SIZES = [(8192, 11008)] if _device.on_gpu() else [(16, 1000)]


def get_inputs(size: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """``size`` = ``(n_rows, n_cols)``, default ``SIZES[0]``: GPU 8192 tokens x 11008 (the Llama-7B width
    the anchors measure GeGLU at), bf16; CPU 16 x 1000 fp32."""
    n_rows, n_cols = size or SIZES[0]
    return make_inputs(n_rows, n_cols, torch.bfloat16 if _device.on_gpu() else torch.float32)


def hard_inputs() -> list:
    """Hard values: gates of large magnitude (x 100: erf saturates, gelu(a) must be a or 0, never NaN)."""
    a, b = get_inputs()
    return [("gates x 100", [(a.detach() * 100.0).requires_grad_(True), b])]


#: The anchor shape (8192 x 11008), Gemma-7B's intermediate (24576), the fused-chunk layout, dtypes, token counts.
BENCH_SHAPES: list[dict] = [
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.bfloat16},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.bfloat16, "fused": True},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.float16},
    {"n_rows": 8192, "n_cols": 11008, "dtype": torch.float32},
    {"n_rows": 4096, "n_cols": 24576, "dtype": torch.bfloat16},
    {"n_rows": 2048, "n_cols": 11008, "dtype": torch.bfloat16},
    {"n_rows": 32, "n_cols": 11008, "dtype": torch.bfloat16},
]


# bytes_moved / bytes_moved_backward: swiglu's (the same gated-unit traffic), imported above.


def _pattern(gate, up):
    # HF GemmaMLP: self.act_fn(self.gate_proj(x)) * self.up_proj(x), act_fn = gelu_pytorch_tanh.
    return F.gelu(gate, approximate="tanh") * up


def _replacement(gate, up):
    return kernel_fn(gate, up)


ENTRY = register_kernel(KernelEntry(
    name="geglu", module=__name__, op="fusion_advisor::geglu", has_backward=True,
    description="gelu_tanh(a) * b (GeGLU gate of Gemma MLPs); matches F.gelu(a, approximate='tanh') * b",
    pattern=_pattern, replacement=_replacement, example_args=((6, 24), (6, 24))))
