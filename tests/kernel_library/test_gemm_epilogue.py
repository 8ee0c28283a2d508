"""Tests of kernel_library/gemm_epilogue.py (``fusion_advisor::gemm_epilogue``), under TRITON_INTERPRET on the CPU.

y and the gradients of x, w and bias are compared element by element with float64 autograd of ``reference_fn``
(``act(F.linear(x, w, bias))``) on the same inputs. Gradients in fp16/bf16 get an extra elementwise slack of one
unit roundoff times the sum of |terms| of their GEMM: dL/dz is stored in that dtype before dx = dz @ w and
dw = dz.T @ x, as in torch's own autograd, whose bf16 dw fails the plain table against float64 too (37 of
131072 elements at M=37, thousands at M=2048).

fp32 uses the fp32 tolerance plus, on a GPU, an elementwise 3xTF32 bound: ``tl.dot`` multiplies fp32 as three TF32
products there, so z = x @ w.T is off by up to TF32_PRODUCT_ERROR * (|x| @ |w|.T), a bound that grows with K like
the bf16 gradients' one; it is carried through the activation (to y) and its derivative (to dL/dz, then dx, dw, dbias).
Under the interpreter fp32 dots are exact and the bound is zero.

Grid: every activation x with/without bias x 3 dtypes at M, N, K = 37, 45, 70 (none a multiple of the 32-wide
interpreter block or of the GPU blocks); then sizes 1 and 17, a 1000-wide N and a 4097-deep K, and the layouts:
transposed x and w (nn.Linear weights stored column-major), offset views, 3-D x, a strided bias.
"""

import functools

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fusion_advisor.tolerances import tolerance_for
from kernel_library import _device, _gemm
from kernel_library import gemm_epilogue as mod

from kernel_asserts import DEVICE, DTYPES


#: Unit roundoff of the dtype that dL/dz is stored in between the epilogue and the two backward GEMMs.
UNIT_ROUNDOFF = {torch.float32: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}

#: Relative error bound of one product in an fp32 ``tl.dot`` on the GPU, which runs as 3xTF32
#: (``FP32_DOT_PRECISION``): hi*hi + hi*lo + lo*hi of TF32 halves keeps ~21 mantissa bits per product, under 2**-20
#: of its magnitude; measured on the H200, max |err| / (|x| @ |w|.T) was 4.4e-8 to 1.0e-7 (2**-23.3 at worst,
#: benchmarks/results/h200/kernels/fp32_gemm.json), SGEMM's own 2.5e-8 to 4.4e-7. Zero under TRITON_INTERPRET,
#: whose fp32 dot is exact.
TF32_PRODUCT_ERROR = 2.0**-20 if DEVICE.type == "cuda" else 0.0


@functools.lru_cache(maxsize=None)
def _derivative_bounds(activation: str) -> tuple[float, float | None]:
    """(max |act'|, max |act''|) over the reals, from a float64 grid on [-30, 30] plus 1%: how far an error in z
    moves act(z) and act'(z). relu: (1, None), its derivative jumps at 0 (handled where it is used)."""
    if activation == "relu":
        return 1.0, None
    z = torch.linspace(-30.0, 30.0, 600_001, dtype=torch.float64, requires_grad=True)
    (d1,) = torch.autograd.grad(mod.reference_activation(z, activation).sum(), z, create_graph=True)
    if not d1.requires_grad:  # "none": act' == 1
        return 1.0, 0.0
    (d2,) = torch.autograd.grad(d1.sum(), z)
    return 1.01 * d1.abs().max().item(), 1.01 * d2.abs().max().item()


def _assert_close(actual, expected, dtype, equal_nan=False, slack=None):
    """assert_close with the dtype's tolerance, plus an elementwise ``slack`` (float64) where given."""
    atol, rtol = tolerance_for(dtype)
    if slack is None:
        torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=equal_nan)
        return
    a, e = actual.double(), expected.double()
    ok = ((a - e).abs() <= atol + rtol * e.abs() + slack) | (a == e)
    if equal_nan:
        ok |= a.isnan() & e.isnan()
    if not ok.all():
        i = tuple((~ok).nonzero()[0].tolist())
        raise AssertionError(
            f"{int((~ok).sum())} of {ok.numel()} elements outside atol + rtol*|ref| + slack; first at {i}: "
            f"{a[i].item()} vs {e[i].item()} (slack {slack[i].item():.3g})"
        )


def _inputs(M, N, K, dtype=torch.float32, bias=True):
    x = torch.randn(M, K, device=DEVICE).to(dtype).requires_grad_()
    w = (torch.randn(N, K, device=DEVICE) / max(K, 1) ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(N, device=DEVICE).to(dtype).requires_grad_() if bias else None
    return x, w, b


def _check(x, w, bias, activation, equal_nan=False):
    """Kernel vs float64 reference: y, dx, dw, dbias; inputs unchanged. Returns the kernel's y."""
    dtype = x.dtype
    tensors = [t for t in (x, w, bias) if t is not None]
    before = [t.detach().clone() for t in tensors]
    y = mod.kernel_fn(x, w, bias, activation)
    assert y.dtype == dtype and y.shape == (*x.shape[:-1], w.shape[0])
    ref_inputs = [t.detach().double().requires_grad_() for t in tensors]
    x64, w64 = ref_inputs[:2]
    z = F.linear(x64, w64, ref_inputs[2] if bias is not None else None)
    ref = mod.reference_activation(z, activation)
    n_rows = y.numel() // max(1, w.shape[0])
    x2, w_abs = x64.detach().abs().reshape(n_rows, x.shape[-1]), w64.detach().abs()
    # fp32 on a GPU: z = x @ w.T + bias in TF32, off by up to z_err; act(z) moves by at most max|act'| * z_err.
    tf32 = TF32_PRODUCT_ERROR if dtype == torch.float32 else 0.0
    z_err = (tf32 * (x2 @ w_abs.t())).reshape(y.shape)
    d1_max, d2_max = _derivative_bounds(activation)
    _assert_close(y, ref, dtype, equal_nan, slack=d1_max * z_err if tf32 else None)
    grad = torch.randn_like(y)
    grads = torch.autograd.grad(y, tensors, grad)
    *ref_grads, dz = torch.autograd.grad(ref, [*ref_inputs, z], grad.double())
    # dL/dz is rounded to the dtype before dx = dz @ w and dw = dz.T @ x (as in torch's own low-precision
    # autograd), so each of their terms carries up to one unit roundoff: the error bound is u * sum |terms|.
    u = UNIT_ROUNDOFF[dtype]
    dz = dz.detach().abs().reshape(n_rows, w.shape[0])
    # TF32 (fp32 on a GPU): the backward recomputes z, so dL/dz = dy * act'(z) is off by |dy| * max|act''| * z_err,
    # or by all of |dy| where relu's derivative may flip (|z| within z_err of 0); "none" recomputes nothing. The
    # plain GEMMs of dx and dw are torch.mm's, with TF32 only where torch allows it.
    if activation == "none" or not tf32:
        dz_err = torch.zeros_like(dz)
    elif d2_max is None:
        dz_err = grad.double().abs().reshape(n_rows, -1) * (z.detach().abs() <= z_err).double().reshape(n_rows, -1)
    else:
        dz_err = grad.double().abs().reshape(n_rows, -1) * d2_max * z_err.reshape(n_rows, -1)
    u_mm = TF32_PRODUCT_ERROR if DEVICE.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 and tf32 else 0.0
    dz_bound = (u + u_mm) * dz + dz_err
    slacks = [(dz_bound @ w_abs).reshape(x.shape), dz_bound.t() @ x2, u * dz.sum(0) + dz_err.sum(0)]
    for g, r, slack in zip(grads, ref_grads, slacks):
        _assert_close(g, r, dtype, equal_nan, slack=torch.nan_to_num(slack, nan=0.0))
    for t, t0 in zip(tensors, before):
        torch.testing.assert_close(t.detach(), t0, atol=0, rtol=0, equal_nan=True)
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", mod.ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_activations_dtypes(dtype, activation, bias):
    _check(*_inputs(37, 45, 70, dtype, bias), activation)


@pytest.mark.parametrize(
    "M,N,K",
    [(1, 45, 70), (37, 1, 70), (37, 45, 1), (17, 17, 17), (3, 1000, 17), (2, 3, 4097), (5, 4, 0)],
    ids=["single_row", "single_col", "k1", "all17", "n1000", "k4097", "k0"],
)
def test_sizes(M, N, K):
    _check(*_inputs(M, N, K), "gelu")


@pytest.mark.parametrize(
    "make",
    [
        lambda x, w, b: (x.t().contiguous().t(), w, b),  # x column-major
        lambda x, w, b: (x, w.t().contiguous().t(), b),  # w column-major ([K, N] storage)
        lambda x, w, b: (x[1:], w, b),  # offset rows of x
        lambda x, w, b: (x[:, 3:], w[:, 3:], b),  # offset K: unaligned starts, row strides 70
        lambda x, w, b: (x[:36].view(4, 9, 70), w, b),  # 3-D x [batch, seq, K]
        lambda x, w, b: (x, w[::2], b[::2]),  # strided w rows and bias
    ],
    ids=["x_transposed", "w_transposed", "offset_rows", "offset_k", "x_3d", "strided_w_bias"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layouts(make, dtype):
    x, w, b = _inputs(37, 90, 70, dtype)
    _check(*make(x, w, b), "silu")


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_hard_values(activation):
    # Pre-activations of +-1e4 saturate every activation; -inf in the bias gives relu 0 and, as in torch, NaN for
    # gelu / gelu_tanh / silu (-inf * 0), in the same places. Values stay inside fp16's range.
    x, w, _ = _inputs(6, 5, 16)
    bias = torch.tensor([1e4, -1e4, 0.0, -float("inf"), 2.0], device=DEVICE)
    for dtype in DTYPES:
        xd, wd, bd = (t.detach().to(dtype).requires_grad_() for t in (x, w, bias))
        y = _check(xd, wd, bd, activation, equal_nan=True)
        assert torch.isfinite(y[:, [0, 1, 2, 4]]).all()
        assert (y[:, 3] == 0).all() if activation == "relu" else torch.isnan(y[:, 3]).all()


def test_empty():
    x, w, b = _inputs(0, 5, 8)
    y = mod.kernel_fn(x, w, b, "gelu")
    assert y.shape == (0, 5)
    grad_x, grad_w, grad_b = torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
    assert grad_x.shape == (0, 8) and not grad_w.any() and not grad_b.any()
    assert mod.kernel_fn(*_inputs(4, 0, 8)[:2]).shape == (4, 0)


def test_bad_inputs_name_the_argument():
    x, w, b = (t.detach() for t in _inputs(4, 6, 8))
    with pytest.raises(ValueError, match="w must be"):
        mod.kernel_fn(x, w.t(), b)
    with pytest.raises(ValueError, match="bias must be"):
        mod.kernel_fn(x, w, b[:5])
    with pytest.raises(TypeError, match="w must have x's dtype"):
        mod.kernel_fn(x, w.half(), b)
    with pytest.raises(ValueError, match="activation must be"):
        mod.kernel_fn(x, w, b, "tanh")


@pytest.mark.skipif(not _device.interpreted(), reason="on a GPU the autotuner has its candidates to choose from")
def test_single_config_under_interpreter():
    # The CPU interpreter must never benchmark autotune candidates.
    assert len(mod._gemm_epilogue_kernel.configs) == 1


@triton.jit
def _tile_probe(m_ptr, n_ptr, pid, M, N, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                GROUP_M: tl.constexpr):
    offs_m, offs_n = _gemm.grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    tl.store(m_ptr + tl.arange(0, BLOCK_M), offs_m * stride_m)
    tl.store(n_ptr + tl.arange(0, BLOCK_N), offs_n)


def _tile_of(pid, M, N, bm, bn, group):
    m = torch.empty(bm, dtype=torch.int64, device=DEVICE)
    n = torch.empty(bn, dtype=torch.int64, device=DEVICE)
    _tile_probe[(1,)](m, n, pid, M, N, 1, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=group)
    return m[0].item() // bm, n[0].item() // bn


def test_grouped_order_covers_every_tile_once():
    M, N, bm, bn, group = 100, 70, 16, 16, 4  # 7 x 5 tiles, the last group of rows partial
    tiles = [_tile_of(pid, M, N, bm, bn, group) for pid in range(7 * 5)]
    assert sorted(tiles) == [(i, j) for i in range(7) for j in range(5)]
    assert tiles[:4] == [(0, 0), (1, 0), (2, 0), (3, 0)]  # a group walks down one column tile first


def test_offsets_are_int64():
    # A tile near row 2**31 - 64 of a 2**31 - 1 row problem, times a row stride of 4096.
    M, N, bm, bn, stride_m = 2**31 - 1, 64, 64, 64, 4096
    pid = (M // bm - 1) * 1  # one column tile: pid == row tile
    m = torch.empty(bm, dtype=torch.int64, device=DEVICE)
    n = torch.empty(bn, dtype=torch.int64, device=DEVICE)
    _tile_probe[(1,)](m, n, pid, M, N, stride_m, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=1)
    assert m.tolist() == [(pid * bm + i) * stride_m for i in range(bm)]


def test_contract_and_registry():
    x, w, b, activation = mod.get_inputs()
    assert x.requires_grad and activation == "gelu" and x.device.type == DEVICE.type
    assert x.numel() < 100_000 or _device.on_gpu()  # get_inputs() gives an 8192 x 4096 -> 16384 GEMM on a GPU
    ref = mod.reference_fn(x.detach().double(), w.detach().double(), b.detach().double(), activation)
    _assert_close(mod.kernel_fn(x, w, b, activation), ref, x.dtype)
    M, K = x.shape
    N = w.shape[0]
    assert mod.flops(x, w, b, activation) == 2 * M * N * K
    assert mod.bytes_moved(x, w, b, activation) == (M * K + N * K + M * N + N) * x.element_size()
    entry = mod.ENTRY
    assert entry.replaces == "gemm_epilogue" and entry.op == "fusion_advisor::gemm_epilogue" and entry.has_backward
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    torch.testing.assert_close(entry.pattern(xd, wd, bd), F.gelu(F.linear(xd, wd, bd)))
    torch.testing.assert_close(entry.replacement(xd, wd, bd), mod.kernel_fn(xd, wd, bd, "gelu"))


def test_opcheck():
    # Schema and autograd registration here; the fake-tensor and AOT-dispatch checks run the op on fake tensors,
    # which only works with compiled (GPU) Triton, not under TRITON_INTERPRET.
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE.type == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fusion_advisor.gemm_epilogue.default, tuple(mod.make_inputs(5, 6, 7, torch.float32, activation="silu")), test_utils=utils)


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_torch_compile_fullgraph(activation):
    x, w, b = _inputs(300, 260, 200, torch.bfloat16)
    compiled = torch.compile(mod.kernel_fn, fullgraph=True)
    y = compiled(x, w, b, activation)
    grad = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), grad)
    eager = mod.kernel_fn(x, w, b, activation)
    eager_grads = torch.autograd.grad(eager, (x, w, b), grad)
    torch.testing.assert_close(y, eager, atol=0, rtol=0)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=0, rtol=0)
