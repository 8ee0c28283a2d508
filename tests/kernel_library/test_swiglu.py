"""Tests of kernel_library/swiglu.py (``fusion_advisor::swiglu``), run under TRITON_INTERPRET on the CPU.

Every output is compared element by element with ``reference_fn`` evaluated in float64 on the same (upcast)
inputs, with the tolerance of the kernel's dtype; gradients with float64 autograd of the reference.

Grid: all three dtypes x widths 1 (degenerate row), 17 (under one block, odd), 1000 (not a power of two) and 4097
(one past a power of two: the masked tail of a second block); 3 rows, plus one single-row case. Layouts cover
both kernel paths: the flat contiguous one and the [rows, cols] strided one (gate_up chunks, offset views,
a transpose, a broadcast, and a permuted 3-D tensor that must be copied). The grid, layout, hard-value, empty and
bad-input tests run GeGLU too (``GATED``): it is the same kernels with the tanh-GELU gate.
"""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library import geglu, swiglu
from kernel_library import swiglu as mod

from kernel_asserts import DEVICE, DTYPES, assert_matches, check_empty, check_fwd_bwd, pair


#: The layout tests run both gated units: GeGLU (kernel_library/geglu.py) is these kernels with the tanh-GELU gate.
GATED = pytest.mark.parametrize("unit", [swiglu, geglu], ids=["swiglu", "geglu"])


def _check(a, b, equal_nan=False, unit=mod):
    """Forward and backward of the kernel on (a, b) against float64 autograd of the reference; inputs unchanged."""
    return check_fwd_bwd(unit.kernel_fn, unit.reference_fn, [a, b], equal_nan)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_cols", [1, 17, 1000, 4097])
@GATED
def test_dtypes_and_widths(dtype, n_cols, unit):
    _check(*pair(3, n_cols, dtype=dtype), unit=unit)


@GATED
def test_single_row_and_1d(unit):
    _check(*pair(1, 1536), unit=unit)
    _check(*pair(300), unit=unit)


@GATED
def test_fused_gate_up_chunks(unit):
    # a = x[:, :I], b = x[:, I:] of one gate_up projection: row stride 2I, no copy; gradients reach x.
    a, b = unit.make_inputs(5, 1000, torch.bfloat16, fused=True)
    assert not a.is_contiguous() and a.stride(0) == 2000
    _check(a, b, unit=unit)


@pytest.mark.parametrize(
    "make",
    [
        lambda x, y: (x[1:], y[:-1]),  # offset rows (contiguous views with a storage offset)
        lambda x, y: (x[:, 3:], y[:, :-3]),  # offset columns: row stride 40, 37 columns, unaligned start
        lambda x, y: (x.t(), y.t()),  # transposed: column stride 40
        lambda x, y: (x.t(), y.t().contiguous()),  # one transposed, one contiguous: strided path for both
        lambda x, y: (x, y[0:1].expand_as(y)),  # broadcast b: row stride 0
    ],
    ids=["offset_rows", "offset_cols", "transposed", "mixed", "expanded"],
)
@GATED
def test_strided_views(make, unit):
    # Separate sources for a and b: gradients are compared per input, so a and b must not alias.
    x = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    y = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    _check(*make(x, y), unit=unit)


@GATED
def test_3d_contiguous_and_permuted(unit):
    _check(*pair(2, 3, 50), unit=unit)
    # Leading dims that cannot be flattened into one row stride are copied first; results still match.
    x = torch.randn(3, 2, 50, device=DEVICE, requires_grad=True)
    _check(x.transpose(0, 1), x.transpose(0, 1) * 2, unit=unit)


@GATED
def test_hard_values(unit):
    # silu(-inf) and gelu_tanh(-inf) are NaN in torch (-inf * 0) and here; +-1e4 saturate both gates.
    # Products stay inside fp16's range (65504) so that fp16 can be checked against the float64 reference.
    a = torch.tensor([[1e4, -1e4, 0.0, -float("inf"), float("inf"), 5.0, -80.0, 1.0]], device=DEVICE).requires_grad_()
    b = torch.tensor([[2.0, 3.0, 1e4, 1.0, 1.0, -1e4, 1e4, -1.0]], device=DEVICE).requires_grad_()
    out = unit.kernel_fn(a, b)
    assert torch.isnan(out[0, 3]) and torch.isnan(unit.reference_fn(a, b)[0, 3])
    assert torch.isfinite(out[0, [0, 1, 2, 5, 6, 7]]).all()
    for dtype in DTYPES:
        _check(a.detach().to(dtype).requires_grad_(), b.detach().to(dtype).requires_grad_(), equal_nan=True,
               unit=unit)


@GATED
def test_empty(unit):
    for inputs, grads in check_empty(unit.kernel_fn, pair):
        assert [g.shape for g in grads] == [t.shape for t in inputs]


@GATED
def test_bad_inputs_name_the_argument(unit):
    a = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="b must have a's shape"):
        unit.kernel_fn(a, torch.randn(4, 9, device=DEVICE))
    with pytest.raises(TypeError, match="b must have a's dtype"):
        unit.kernel_fn(a, a.half())
    with pytest.raises(TypeError, match="a must be one of"):
        unit.kernel_fn(a.long(), a.long())
    with pytest.raises(ValueError, match="at least 1 dimension"):
        unit.kernel_fn(torch.tensor(1.0, device=DEVICE), torch.tensor(2.0, device=DEVICE))


@triton.jit
def _offsets_probe(out_ptr, pid, n_col_blocks, stride_row, stride_col, BLOCK_SIZE: tl.constexpr):
    row, cols = mod._program_cols(pid, n_col_blocks, BLOCK_SIZE)
    tl.store(out_ptr + tl.arange(0, BLOCK_SIZE), row * stride_row + cols * stride_col)


@pytest.mark.parametrize(
    "pid,n_col_blocks,stride_row,stride_col",
    [
        (2**31 - 2, 3, 3 * 2**20, 1),  # row ~7e8 times a 3M row stride: passes 2**31 by far
        (2**30 + 5, 2**30 + 7, 0, 1),  # one flat row: columns past 2**31
        (123_456, 1000, 7, 2**21),  # a transposed operand: column index times a large column stride
    ],
)
def test_offsets_are_int64(pid, n_col_blocks, stride_row, stride_col):
    block = 16
    out = torch.empty(block, dtype=torch.int64, device=DEVICE)
    _offsets_probe[(1,)](out, pid, n_col_blocks, stride_row, stride_col, BLOCK_SIZE=block)
    row, col_block = divmod(pid, n_col_blocks)
    expected = [row * stride_row + (col_block * block + i) * stride_col for i in range(block)]
    assert out.tolist() == expected


def test_config_heuristic():
    assert mod.GluConfig.from_cols(11008 * 8192) == mod.GluConfig(2048, 8)
    assert mod.GluConfig.from_cols(1000) == mod.GluConfig(1024, 4)
    assert mod.GluConfig.from_cols(17) == mod.GluConfig(32, 1)


@pytest.mark.parametrize("unit, gate", [(swiglu, F.silu), (geglu, lambda a: F.gelu(a, approximate="tanh"))],
                         ids=["swiglu", "geglu"])
def test_contract_and_registry(unit, gate):
    args = unit.get_inputs()
    assert all(t.requires_grad for t in args) and args[0].device.type == DEVICE.type
    assert args[0].numel() < 100_000 or _device.on_gpu()  # get_inputs() gives Llama-7B shapes on a GPU
    ref = unit.reference_fn(*(t.detach().double() for t in args))
    assert_matches(unit.kernel_fn(*args), ref, args[0].dtype)
    assert unit.bytes_moved(*args) == 3 * args[0].numel() * args[0].element_size()
    entry = unit.ENTRY
    name = entry.name
    assert entry.replaces == name and entry.op == f"fusion_advisor::{name}" and entry.has_backward
    a, b = (t.detach() for t in args)
    torch.testing.assert_close(entry.pattern(a, b), gate(a) * b)
    torch.testing.assert_close(entry.replacement(a, b), unit.kernel_fn(a, b))


@GATED
def test_opcheck(unit):
    # Schema and autograd registration here; the fake-tensor and AOT-dispatch checks run the op on fake tensors,
    # which only works with compiled (GPU) Triton, not under TRITON_INTERPRET.
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE.type == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
    op = getattr(torch.ops.fusion_advisor, unit.ENTRY.name).default
    torch.library.opcheck(op, tuple(unit.make_inputs(4, 40, torch.float32, fused=True)), test_utils=utils)


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("fused", [False, True])
@GATED
def test_torch_compile_fullgraph(fused, unit):
    a, b = unit.make_inputs(64, 1000, torch.bfloat16, fused=fused)
    compiled = torch.compile(unit.kernel_fn, fullgraph=True)
    out = compiled(a, b)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (a, b), grad)
    eager = unit.kernel_fn(a, b)
    eager_grads = torch.autograd.grad(eager, (a, b), grad)
    torch.testing.assert_close(out, eager, atol=0, rtol=0)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=0, rtol=0)
