"""Tests of kernel_library/layernorm.py against torch.nn.functional.layer_norm in float64.

Grid choice: few rows (interpreted programs are slow); widths 17 (single row, ragged), 1000, 4097 (one past a power
of two) and a 3-D input, in every dtype, with and without the affine parameters and with and without the fused
residual add, forward and backward; weight-only / bias-only on one shape; the looped (Welford) kernels at small
widths through a forced small-block config; a large-mean input where a sum / sum-of-squares variance would fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from kernel_library import _device
from kernel_library import layernorm as ln
from kernel_library.registry import get_kernel
from kernel_asserts import DEVICE, DTYPES, assert_close, assert_row_sum_grad_close

SHAPES = ((1, 17), (3, 1000), (2, 4097), (2, 3, 64))
EPS = 1e-5
#: rows for the looped-kernel tests: more than the backward grid has programs, so that some programs accumulate
#: several rows into their dweight partial sums
LOOP_ROWS = ln.bwd_programs(10**6, DEVICE) + 3


def make(shape, dtype, weight=True, bias=True, residual=False, seed=0):
    """[x, weight | None, bias | None, residual | None] in ``dtype``, leaves with requires_grad."""
    n_rows = 1
    for d in shape[:-1]:
        n_rows *= d
    args = ln.make_inputs(n_rows, shape[-1], dtype, residual=True, requires_grad=False, device=DEVICE, seed=seed)
    x, w, b, _, r = args
    return (
        x.view(shape).requires_grad_(),
        w.requires_grad_() if weight else None,
        b.requires_grad_() if bias else None,
        r.view(shape).requires_grad_() if residual else None,
    )


def f64(t):
    return None if t is None else t.detach().double().requires_grad_()


def eager_grads(x, w, b, r, grad_outs, eps=EPS) -> dict[str, torch.Tensor]:
    """Eager PyTorch's gradients in the inputs' own dtypes (autograd of reference_fn on copies of x, weight, bias,
    residual, those that are not None), by name: dx, dweight, dbias, dresidual."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, w, b, r)]
    out = ln.reference_fn(*leaves[:3], eps, residual=leaves[3])
    outs = out if r is not None else (out,)
    names = [n for n, t in zip(("dx", "dweight", "dbias", "dresidual"), leaves) if t is not None]
    return dict(zip(names, torch.autograd.grad(outs, [t for t in leaves if t is not None], grad_outs)))


def randn_like(t: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=t.device).manual_seed(seed)
    return torch.randn(t.shape, generator=gen, device=t.device).to(t.dtype)


def check_fwd_bwd(x, w, b, r, dtype, eps=EPS):
    """Outputs and gradients of every tensor argument against autograd of reference_fn in float64."""
    out = ln.kernel_fn(x, w, b, eps, residual=r)
    x64, w64, b64, r64 = (f64(t) for t in (x, w, b, r))
    ref = ln.reference_fn(x64, w64, b64, eps, residual=r64)
    outs, refs = (out, ref) if r is not None else ((out,), (ref,))
    for name, o, o64 in zip(("y", "new_residual"), outs, refs):
        assert o.dtype == x.dtype
        assert_close(o, o64, dtype, name)
    grad_outs = [randn_like(o, 1 + i) for i, o in enumerate(outs)]
    names = [n for n, t in zip(("dx", "dweight", "dbias", "dresidual"), (x, w, b, r)) if t is not None]
    leaves = [t for t in (x, w, b, r) if t is not None]
    leaves64 = [t for t in (x64, w64, b64, r64) if t is not None]
    grads = torch.autograd.grad(outs, leaves, grad_outs)
    grads64 = torch.autograd.grad(refs, leaves64, [g.double() for g in grad_outs])
    for name, leaf, g, g64 in zip(names, leaves, grads, grads64):
        assert g.dtype == leaf.dtype, name
        if name in ("dweight", "dbias"):
            assert_row_sum_grad_close(g, g64, dtype, name, lambda n=name: eager_grads(x, w, b, r, grad_outs, eps)[n])
        else:
            assert_close(g, g64, dtype, name)


# --- forward and backward over dtypes, widths, affine and residual ---------------------------------------------


@pytest.mark.parametrize("residual", (False, True), ids=("plain", "residual"))
@pytest.mark.parametrize("affine", (True, False), ids=("affine", "no-affine"))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_reference(dtype, shape, affine, residual):
    x, w, b, r = make(shape, dtype, weight=affine, bias=affine, residual=residual)
    check_fwd_bwd(x, w, b, r, dtype)


@pytest.mark.parametrize("residual", (False, True), ids=("plain", "residual"))
@pytest.mark.parametrize("params", ("weight only", "bias only"))
def test_weight_or_bias_alone(params, residual):
    x, w, b, r = make((3, 200), torch.float32, weight=params == "weight only", bias=params == "bias only",
                      residual=residual)
    check_fwd_bwd(x, w, b, r, torch.float32)


@pytest.mark.parametrize("residual", (False, True), ids=("plain", "residual"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_looped_kernels(dtype, residual):
    """Forced 16-wide chunks: Welford statistics, normalise pass, three-pass backward with partial-sum updates."""
    n_cols = 45
    x, w, b, r = (None if t is None else t.detach() for t in make((LOOP_ROWS, n_cols), dtype, residual=residual))
    cfg = ln.RowConfig.forward(n_cols, max_fused_block=16)
    y, s = ln.layer_norm_fwd_launch(x, w, b, EPS, residual=r, config=cfg)
    x64, w64, b64, r64 = (f64(t) for t in (x, w, b, r))
    ref = ln.reference_fn(x64, w64, b64, EPS, residual=r64)
    y64, s64 = ref if residual else (ref, None)
    assert_close(y, y64, dtype, "y (looped)")
    dy = randn_like(y, 1)
    ds = randn_like(y, 2) if residual else None
    dx, dw, db = ln.layer_norm_bwd_launch(dy, s if residual else x, w, b, EPS, ds=ds, config=cfg)
    if residual:
        assert_close(s, s64, dtype, "new_residual (looped)")
        grads64 = torch.autograd.grad((y64, s64), (x64, w64, b64, r64), (dy.double(), ds.double()))
        assert_close(dx, grads64[3], dtype, "dresidual (looped)")
    else:
        grads64 = torch.autograd.grad(y64, (x64, w64, b64), dy.double())
    assert_close(dx, grads64[0], dtype, "dx (looped)")
    grad_outs = (dy, ds) if residual else (dy,)
    for name, g, g64 in zip(("dweight", "dbias"), (dw, db), grads64[1:3]):
        eager = lambda n=name: eager_grads(x, w, b, r, grad_outs)[n]  # noqa: E731
        assert_row_sum_grad_close(g, g64, dtype, f"{name} (looped)", eager)


def test_looped_kernels_strided():
    """The looped kernels honour every stride: transposed x, residual and gradients, strided parameters."""
    n_cols = 45
    x, _, _, r = make((n_cols, LOOP_ROWS), torch.float32, weight=False, bias=False, residual=True)
    x, r = x.detach().t(), r.detach().t()
    _, w, b, _ = make((1, 2 * n_cols), torch.float32)
    w, b = w.detach()[::2], b.detach()[1::2]
    cfg = ln.RowConfig.forward(n_cols, max_fused_block=16)
    y, s = ln.layer_norm_fwd_launch(x, w, b, EPS, residual=r, config=cfg)
    x64, w64, b64, r64 = (f64(t) for t in (x, w, b, r))
    y64, s64 = ln.reference_fn(x64, w64, b64, EPS, residual=r64)
    assert_close(y, y64, torch.float32, "y (looped, strided)")
    dy = torch.randn((n_cols, LOOP_ROWS), device=DEVICE).t()
    ds = torch.randn((n_cols, LOOP_ROWS), device=DEVICE).t()
    dx, dw, db = ln.layer_norm_bwd_launch(dy, s.t().contiguous().t(), w, b, EPS, ds=ds, config=cfg)
    grads64 = torch.autograd.grad((y64, s64), (x64, w64, b64), (dy.double(), ds.double()))
    for name, g, g64 in zip(("dx", "dweight", "dbias"), (dx, dw, db), grads64):
        assert_close(g, g64, torch.float32, f"{name} (looped, strided)")


def test_more_rows_than_backward_programs():
    """Each backward program loops over several rows and the per-program partial sums are reduced."""
    n_rows = ln.bwd_programs(10**6, torch.device(DEVICE)) * 2 + 3
    x, w, b, _ = make((n_rows, 40), torch.float32)
    check_fwd_bwd(x, w, b, None, torch.float32)


# --- backward with several rows per loop step (RowConfig.rows_per_iter) ------------------------------------
# As in test_rmsnorm: 1 and 3 rows leave the last [rows_per_iter, BLOCK_SIZE] block partly masked; 17 rows at
# programs_per_sm=1 (4 programs on the CPU grid) make programs loop over several blocks, the last one partial.


def ln_bwd_with(dy, x, w, b, ds=None, **fields):
    """``layer_norm_bwd_launch`` with the default backward RowConfig of x's width, ``fields`` replaced."""
    cfg = dataclasses.replace(ln.RowConfig.backward(x.shape[-1]), **fields)
    return ln.layer_norm_bwd_launch(dy, x, w, b, EPS, ds=ds, config=cfg)


def check_rows_per_iter(x, w, b, dtype, rows_per_iter, residual=False, **fields):
    """(dx, dw, db) at ``rows_per_iter`` against float64 autograd of reference_fn and against one row per step
    (``x`` plays the normalised input s when ``residual``: dx then also carries ds)."""
    x64, w64, b64 = (f64(t) for t in (x, w, b))
    y64 = ln.reference_fn(x64, w64, b64, EPS)
    dy = randn_like(x, 3)
    ds = randn_like(x, 4) if residual else None
    got = ln_bwd_with(dy, x, w, b, ds, rows_per_iter=rows_per_iter, **fields)
    one = ln_bwd_with(dy, x, w, b, ds, rows_per_iter=1, **fields)
    names = [n for n, t in zip(("dx", "dweight", "dbias"), (x, w, b)) if t is not None]
    leaves64 = [t for t in (x64, w64, b64) if t is not None]
    grads64 = dict(zip(names, torch.autograd.grad(y64, leaves64, dy.double())))
    if residual:
        grads64["dx"] = grads64["dx"] + ds.double()
    what = f"rows_per_iter={rows_per_iter}"
    for name, g, g1 in zip(("dx", "dweight", "dbias"), got, one):
        if name == "dx":
            assert_close(g, grads64[name], dtype, f"dx ({what})")
        elif name in grads64:
            eager = lambda n=name: eager_grads(x, w, b, None, (dy,))[n]  # noqa: E731
            assert_row_sum_grad_close(g, grads64[name], dtype, f"{name} ({what})", eager)
        else:
            assert g.numel() == 0, name
        assert_close(g, g1, dtype, f"{name} ({what} vs 1)")


@pytest.mark.parametrize("n_cols", (17, 1000))
@pytest.mark.parametrize("n_rows", (1, 3, 17))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("rows_per_iter", (2, 4))
def test_backward_rows_per_iter(rows_per_iter, dtype, n_rows, n_cols):
    x, w, b, _ = (None if t is None else t.detach() for t in make((n_rows, n_cols), dtype))
    check_rows_per_iter(x, w, b, dtype, rows_per_iter, programs_per_sm=1)


@pytest.mark.parametrize("params", ("none", "weight only", "bias only"))
@pytest.mark.parametrize("rows_per_iter", (2, 4))
def test_backward_rows_per_iter_params_and_residual(rows_per_iter, params):
    """HAS_WEIGHT / HAS_BIAS off, with the residual's gradient added to dx, several blocks per program."""
    x, w, b, _ = (None if t is None else t.detach() for t in make((17, 300), torch.float32,
                                                                    weight=params == "weight only",
                                                                    bias=params == "bias only"))
    check_rows_per_iter(x, w, b, torch.float32, rows_per_iter, residual=True, programs_per_sm=1)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("rows_per_iter", (2, 4))
def test_backward_rows_per_iter_wide_row_stages(rows_per_iter, dtype):
    """4097 columns (fused 8192-wide block) with a nonzero mean per row (x_hat centred row by row within the
    block), default grid, with a num_stages hint on the row loop."""
    x, w, b, _ = (None if t is None else t.detach() for t in make((5, 4097), dtype))
    x = (x.float() + torch.arange(5, device=DEVICE).float()[:, None]).to(dtype)
    check_rows_per_iter(x, w, b, dtype, rows_per_iter, num_stages=2)


def test_looped_backward_ignores_rows_per_iter():
    """The looped (wide-row) backward stays one row per step whatever rows_per_iter says."""
    x, w, b = (t.detach() for t in make((LOOP_ROWS, 40), torch.bfloat16)[:3])
    dy = randn_like(x, 1)
    looped = ln.RowConfig.backward(40, max_fused_block=16)
    assert looped.looped
    one = ln.layer_norm_bwd_launch(dy, x, w, b, EPS, config=looped)
    four = ln.layer_norm_bwd_launch(dy, x, w, b, EPS, config=dataclasses.replace(looped, rows_per_iter=4))
    assert all(torch.equal(g1, g4) for g1, g4 in zip(one, four))


# --- layouts and hard values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ("row offset x[1:]", "column slice x[:, 3:]", "transposed x.t()",
                                  "strided weight and bias", "transposed residual"))
def test_strided_inputs(case):
    x, w, b, r = (t.detach() for t in make((6, 70), torch.float32, residual=True))
    r = None
    if case == "row offset x[1:]":
        x = x[1:]
    elif case == "column slice x[:, 3:]":
        x = make((6, 73), torch.float32)[0].detach()[:, 3:]
    elif case == "transposed x.t()":
        x = make((70, 6), torch.float32)[0].detach().t()
    elif case == "strided weight and bias":
        _, w2, b2, _ = make((1, 140), torch.float32)
        w, b = w2.detach()[::2], b2.detach()[1::2]
    else:
        r = make((70, 6), torch.float32, residual=True)[3].detach().t()
    check_fwd_bwd(x.requires_grad_(), w.requires_grad_(), b.requires_grad_(),
                  None if r is None else r.requires_grad_(), torch.float32)


def test_expanded_output_gradient():
    """``y.sum().backward()`` hands the backward a stride-0 (expanded) dy."""
    x, w, b, _ = make((4, 33), torch.float32)
    ln.kernel_fn(x, w, b).sum().backward()
    x64, w64, b64 = f64(x), f64(w), f64(b)
    ln.reference_fn(x64, w64, b64).sum().backward()
    for name, g, g64 in (("dx", x.grad, x64.grad), ("dweight", w.grad, w64.grad), ("dbias", b.grad, b64.grad)):
        assert_close(g, g64, torch.float32, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitudes(dtype):
    """|x| ~ 1e4 (fp16: squares overflow unless computed in fp32)."""
    x, w, b, _ = make((3, 257), dtype)
    x = (x.detach().float() * 1e4).to(dtype).requires_grad_()
    check_fwd_bwd(x, w, b, None, dtype)


@pytest.mark.parametrize("path", ("fused", "looped"))
def test_large_mean_is_accurate(path):
    """x = 1000 + N(0, 1) in fp32: the mean itself rounds to 6e-5, so no fp32 LayerNorm beats ~3e-5; allow 4 ulps
    of the mean (2.4e-4). A sum / sum-of-squares variance is off by ~0.3 here (catastrophic cancellation)."""
    n_cols = 1000
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = 1000.0 + torch.randn((4, n_cols), generator=gen, device=DEVICE)
    w, b = torch.ones(n_cols, device=DEVICE), torch.zeros(n_cols, device=DEVICE)
    cfg = ln.RowConfig.forward(n_cols, max_fused_block=64) if path == "looped" else None
    y, _ = ln.layer_norm_fwd_launch(x, w, b, EPS, config=cfg)
    ref = F.layer_norm(x.double(), (n_cols,), w.double(), b.double(), EPS)
    err = (y.double() - ref).abs().max().item()
    assert err <= 4 * 2.0**-14, f"max error {err:.3g} (fp32 ulp of 1000 is {2.0**-14:.3g})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_row_gives_bias(dtype):
    """A constant row has zero variance: rstd = 1/sqrt(eps), x - mean = 0, so y = bias exactly."""
    x, w, b, _ = make((3, 100), dtype)
    x = x.detach().clone()
    x[1] = 3.0
    y = ln.kernel_fn(x, w.detach(), b.detach())
    assert torch.equal(y[1], b.detach())
    check_fwd_bwd(x.requires_grad_(), w, b, None, dtype)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf, 0 * inf
def test_inf_input_gives_nan_like_torch():
    """An inf makes the row's mean and variance non-finite: torch returns a NaN row; so must the kernel
    (NaN positions compared explicitly; other rows must match)."""
    x, w, b, _ = (None if t is None else t.detach() for t in make((2, 50), torch.float32))
    x = x.clone()
    x[0, 7] = float("inf")
    y = ln.kernel_fn(x, w, b)
    ref = F.layer_norm(x.double(), (50,), w.double(), b.double(), EPS)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.isnan(y[0]).all()
    assert_close(y[1], ref[1], torch.float32, "y (finite row)")


# --- semantics -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_fp32_params_with_half_input(dtype):
    """fp32 weight/bias with fp16/bf16 x (torch's mixed-dtype layer_norm): output in x's dtype, grads per leaf."""
    x, _, _, _ = make((3, 130), dtype)
    w = (1.0 + 0.1 * torch.randn(130, device=DEVICE)).requires_grad_()
    b = (0.1 * torch.randn(130, device=DEVICE)).requires_grad_()
    y = ln.kernel_fn(x, w, b)
    assert y.dtype == ln.reference_fn(x.detach(), w.detach(), b.detach()).dtype == dtype
    check_fwd_bwd(x, w, b, None, dtype)


def test_matches_nn_layernorm_module():
    x, _, _, _ = make((4, 96), torch.float32)
    mod = torch.nn.LayerNorm(96, eps=1e-6).to(DEVICE)
    with torch.no_grad():
        mod.weight.normal_()
        mod.bias.normal_()
        assert_close(ln.kernel_fn(x, mod.weight, mod.bias, 1e-6), mod(x), torch.float32, "vs nn.LayerNorm")


def test_empty_input():
    for residual in (None, torch.empty((0, 16), device=DEVICE, requires_grad=True)):
        x = torch.empty((0, 16), device=DEVICE, requires_grad=True)
        w = torch.ones(16, device=DEVICE, requires_grad=True)
        b = torch.zeros(16, device=DEVICE, requires_grad=True)
        out = ln.kernel_fn(x, w, b, residual=residual)
        outs = out if residual is not None else (out,)
        assert all(o.shape == (0, 16) for o in outs)
        sum(o.sum() for o in outs).backward()
        assert x.grad.shape == (0, 16)
        zeros = torch.zeros(16, device=DEVICE)
        assert torch.equal(w.grad, zeros) and torch.equal(b.grad, zeros)


def test_inputs_not_modified():
    x, w, b, r = make((4, 100), torch.bfloat16, residual=True)
    before = [t.detach().clone() for t in (x, w, b, r)]
    y, s = ln.kernel_fn(x, w, b, residual=r)
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    dy0, ds0 = dy.clone(), ds.clone()
    torch.autograd.grad((y, s), (x, w, b, r), (dy, ds))
    assert all(torch.equal(t, t0) for t, t0 in zip((x, w, b, r), before))
    assert torch.equal(dy, dy0) and torch.equal(ds, ds0)


def test_errors_name_the_argument():
    x, w, b, r = make((2, 8), torch.float32, residual=True)
    with pytest.raises(ValueError, match="^weight must be 1-D"):
        ln.kernel_fn(x, w[:3], b)
    with pytest.raises(ValueError, match="^bias must be 1-D"):
        ln.kernel_fn(x, w, b[:3])
    with pytest.raises(TypeError, match="^x has dtype"):
        ln.kernel_fn(x.detach().double(), w, b)
    with pytest.raises(ValueError, match="^residual must have x's shape"):
        ln.kernel_fn(x, w, b, residual=r[:1])
    with pytest.raises(TypeError, match="^residual must have x's dtype"):
        ln.kernel_fn(x, w, b, residual=r.detach().half())


def test_contract_and_registry():
    args = ln.get_inputs()
    x, w, b = args[:3]
    if not _device.on_gpu():
        assert x.numel() < 1e5
    assert x.requires_grad and w.requires_grad and b.requires_grad
    assert_close(ln.kernel_fn(*args), ln.reference_fn(*args), x.dtype, "kernel_fn(*get_inputs())")
    assert ln.bytes_moved(*args) == x.numel() * 2 * 2 + 2 * w.numel() * 2  # bf16: x, y; weight, bias
    assert ln.bytes_moved_backward(*args) == x.numel() * 3 * 2 + 3 * w.numel() * 2  # dy, x, dx; w, dw, db
    fused = ln.make_inputs(4, 64, torch.bfloat16, residual=True, device=DEVICE)
    assert ln.bytes_moved(*fused) == 4 * 64 * 4 * 2 + 2 * 64 * 2
    for name, replaces, op in (("layernorm", "layernorm", "layer_norm"), ("add_layernorm", "add_layernorm",
                                                                           "add_layer_norm")):
        entry = get_kernel(name)
        assert entry.replaces == replaces and entry.has_backward and entry.module == ln.__name__
        assert entry.op == f"fusion_advisor::{op}" and hasattr(torch.ops.fusion_advisor, op)
        assert hasattr(torch.ops.fusion_advisor, f"{op}_backward")
    with torch.no_grad():
        plain, add = get_kernel("layernorm"), get_kernel("add_layernorm")
        assert torch.equal(plain.pattern(x, w, b, 1e-5), ln.reference_fn(x, w, b, 1e-5))
        assert_close(plain.replacement(x, w, b, 1e-5), plain.pattern(x, w, b, 1e-5), x.dtype, "replacement")
        r = torch.randn(x.shape, device=x.device).to(x.dtype)
        for p, ref in zip(add.pattern(x, r, w, b, 1e-5), ln.reference_fn(x, w, b, 1e-5, residual=r)):
            assert torch.equal(p, ref)
        for got, p in zip(add.replacement(x, r, w, b, 1e-5), add.pattern(x, r, w, b, 1e-5)):
            assert_close(got, p, x.dtype, "add replacement")


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("residual", (False, True), ids=("plain", "residual"))
def test_compiled_matches_eager(residual):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    args = ln.make_inputs(256, 4096, torch.bfloat16, residual=residual, device="cuda")
    tensors = [args[0], args[1], args[2]] + ([args[4]] if residual else [])
    eps = args[3]
    grads_out = [torch.randn_like(args[0]) for _ in range(2 if residual else 1)]

    def call(x, w, b, *r):
        return ln.kernel_fn(x, w, b, eps, residual=r[0] if r else None)

    def fwd_bwd(fn):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*leaves)
        outs = out if residual else (out,)
        torch.autograd.backward(outs, grads_out)
        return list(outs), [t.grad for t in leaves]

    outs_e, grads_e = fwd_bwd(call)
    outs_c, grads_c = fwd_bwd(torch.compile(call, fullgraph=True))
    # the same Triton kernels run in both: outputs and dx are bit-identical; Inductor may reorder the final
    # dweight / dbias sums
    for e, c in zip(outs_e, outs_c):
        assert torch.equal(c, e)
    assert torch.equal(grads_c[0], grads_e[0])
    for name, e, c in zip(("dweight", "dbias", "dresidual"), grads_e[1:], grads_c[1:]):
        assert_close(c, e, torch.bfloat16, f"{name} compiled vs eager")


# --- the backward's module-level tunings (BWD_TUNING / ADD_BWD_TUNING, swept by benchmarks/kernels/sweep_tiles.py) --


@pytest.mark.parametrize("residual", (False, True), ids=("plain", "residual"))
def test_backward_tuning_switch(monkeypatch, residual):
    # each switch reaches its own launch (the plain backward BWD_TUNING, the residual one ADD_BWD_TUNING) and the
    # gradients stay correct with pipelining, two rows per step, one program per SM (programs loop, last block
    # partial) and other warps
    tuning = ln.BwdTuning(num_stages=2, rows_per_iter=2, programs_per_sm=1, num_warps=8)
    monkeypatch.setattr(ln, "ADD_BWD_TUNING" if residual else "BWD_TUNING", tuning)
    seen = []
    real = ln.bwd_programs

    def spy(n_rows, device, rows_per_iter=1, programs_per_sm=None):
        seen.append((rows_per_iter, programs_per_sm))
        return real(n_rows, device, rows_per_iter, programs_per_sm)

    monkeypatch.setattr(ln, "bwd_programs", spy)
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b, r = make((LOOP_ROWS, 300), dtype, residual=residual)
        check_fwd_bwd(x, w, b, r, dtype)
    assert seen and all(s == (2, 1) for s in seen)
