"""Tests of kernel_library/add_rmsnorm.py (residual add + Llama RMSNorm) against float64 autograd.

Grid choice: few rows (interpreted programs are slow); widths 17 (single row, ragged), 1000 and 4097 (one past a
power of two) and a 3-D input, in every dtype, forward and backward with gradients flowing into both outputs;
the looped kernels at small widths through a forced small-block config; strided layouts and hard values on a few
shapes only, since the kernels are rmsnorm's (tested in depth in test_rmsnorm.py) with HAS_RESIDUAL=True.
"""

from __future__ import annotations

import pytest
import torch

from kernel_library import _device
from kernel_library import add_rmsnorm as arms
from kernel_library import rmsnorm as rms
from kernel_library.registry import get_kernel
from kernel_asserts import DEVICE, DTYPES, assert_close, assert_row_sum_grad_close

SHAPES = ((1, 17), (3, 1000), (2, 4097), (2, 3, 64))
EPS = 1e-6
#: rows for the looped-kernel tests: more than the backward grid has programs, so that some programs accumulate
#: several rows into their dweight partial sums
LOOP_ROWS = rms.bwd_programs(10**6, DEVICE) + 3


def make(shape, dtype, seed=0):
    """x, residual of ``shape`` and weight [shape[-1]] in ``dtype``, leaves with requires_grad."""
    n_rows = 1
    for d in shape[:-1]:
        n_rows *= d
    x, r, w, _ = arms.make_inputs(n_rows, shape[-1], dtype, requires_grad=False, device=DEVICE, seed=seed)
    return x.view(shape).requires_grad_(), r.view(shape).requires_grad_(), w.requires_grad_()


def f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_()


def eager_dweight(x, r, w, dy, ds=None) -> torch.Tensor:
    """Eager PyTorch's dweight in the inputs' own dtypes: autograd of reference_fn on copies of x, residual and w,
    with upstream gradients dy (normed) and ds (new residual; None when only normed is used)."""
    xe, r_e, we = (t.detach().clone().requires_grad_() for t in (x, r, w))
    y, s = arms.reference_fn(xe, r_e, we, EPS)
    outs, grads = ((y, s), (dy, ds)) if ds is not None else ((y,), (dy,))
    return torch.autograd.grad(outs, we, grads)[0]


def randn_like(t: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=t.device).manual_seed(seed)
    return torch.randn(t.shape, generator=gen, device=t.device).to(t.dtype)


def check_fwd_bwd(x, r, w, dtype, use_residual_grad=True):
    """(normed, new_residual) and (dx, dresidual, dweight) against autograd of reference_fn in float64."""
    y, s = arms.kernel_fn(x, r, w, EPS)
    x64, r64, w64 = f64(x), f64(r), f64(w)
    y64, s64 = arms.reference_fn(x64, r64, w64, EPS)
    assert s.dtype == x.dtype and y.dtype == torch.promote_types(x.dtype, w.dtype)
    assert_close(y, y64, dtype, "normed")
    assert_close(s, s64, dtype, "new_residual")
    dy = randn_like(y, 1)
    ds = randn_like(s, 2) if use_residual_grad else None
    if use_residual_grad:
        grads = torch.autograd.grad((y, s), (x, r, w), (dy, ds))
        grads64 = torch.autograd.grad((y64, s64), (x64, r64, w64), (dy.double(), ds.double()))
    else:  # only the normed output is used: autograd hands the backward a zero d(new_residual)
        grads = torch.autograd.grad(y, (x, r, w), dy)
        grads64 = torch.autograd.grad(y64, (x64, r64, w64), dy.double())
    for name, g, g64 in zip(("dx", "dresidual"), grads, grads64):
        assert_close(g, g64, dtype, name)
    assert_row_sum_grad_close(grads[2], grads64[2], dtype, "dweight", lambda: eager_dweight(x, r, w, dy, ds))


# --- forward and backward over dtypes and widths --------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_reference(dtype, shape):
    x, r, w = make(shape, dtype)
    check_fwd_bwd(x, r, w, dtype)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_only_normed_output_used(dtype):
    x, r, w = make((4, 300), dtype)
    check_fwd_bwd(x, r, w, dtype, use_residual_grad=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ("contiguous", "transposed"))
def test_looped_kernels(dtype, layout):
    """Forced 16-wide chunks: the looped kernels write s, read it back, and add d(new_residual) to dx."""
    n_cols = 45
    if layout == "contiguous":
        x, r, w = (t.detach() for t in make((LOOP_ROWS, n_cols), dtype))
        ds = randn_like(x, 2)
    else:
        xt, rt, _ = (t.detach() for t in make((n_cols, LOOP_ROWS), dtype))
        w = make((1, n_cols), dtype)[2].detach()
        x, r, ds = xt.t(), rt.t(), randn_like(xt, 2).t()
    cfg = rms.RowConfig.forward(n_cols, max_fused_block=16)
    y, s = rms.rms_norm_fwd_launch(x, w, EPS, 0.0, residual=r, config=cfg)
    x64, r64, w64 = f64(x), f64(r), f64(w)
    y64, s64 = arms.reference_fn(x64, r64, w64, EPS)
    assert_close(y, y64, dtype, "normed (looped)")
    assert_close(s, s64, dtype, "new_residual (looped)")
    dy = randn_like(y, 1)
    d_s, dw = rms.rms_norm_bwd_launch(dy, s, w, EPS, 0.0, ds=ds, config=cfg)
    dx64, dr64, dw64 = torch.autograd.grad((y64, s64), (x64, r64, w64), (dy.double(), ds.double()))
    assert_close(d_s, dx64, dtype, "dx (looped)")
    assert_close(d_s, dr64, dtype, "dresidual (looped)")
    assert_row_sum_grad_close(dw, dw64, dtype, "dweight (looped)", lambda: eager_dweight(x, r, w, dy, ds))


# --- layouts and hard values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ("offset rows", "transposed residual", "column slices"))
def test_strided_inputs(case):
    x, r, w = (t.detach() for t in make((6, 70), torch.float32))
    if case == "offset rows":
        x, r = x[1:], r[:-1]
    elif case == "transposed residual":
        r = make((70, 6), torch.float32, seed=5)[1].detach().t()
    else:
        x = make((6, 73), torch.float32)[0].detach()[:, 3:]
        r = make((6, 72), torch.float32)[1].detach()[:, :70]
    check_fwd_bwd(x.requires_grad_(), r.requires_grad_(), w.requires_grad_(), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_magnitudes_and_cancellation(dtype):
    """|x|, |residual| ~ 1e4 with residual ~ -x in one row: s is rounded to the input dtype before the norm,
    as HF does, and a nearly cancelled row still normalises (checked against float64 on the rounded s)."""
    x, r, w = (t.detach() for t in make((3, 129), dtype))
    x = (x.float() * 1e4).to(dtype)
    r = (r.float() * 1e4).to(dtype)
    r[1] = (-x[1].float() + torch.randn(129, device=DEVICE)).to(dtype)
    check_fwd_bwd(x.requires_grad_(), r.requires_grad_(), w.requires_grad_(), dtype)


# --- semantics -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_is_transformers_decoder_layer(dtype):
    """reference_fn is the Llama decoder layer's ``residual + hidden_states`` then LlamaRMSNorm, bit for bit."""
    llama_mod = pytest.importorskip("transformers.models.llama.modeling_llama")
    x, r, w = (t.detach() for t in make((32, 96), dtype))
    norm = llama_mod.LlamaRMSNorm(96, eps=EPS).to(device=DEVICE, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        hidden = r + x
        y_ref, s_ref = arms.reference_fn(x, r, w, EPS)
        assert torch.equal(s_ref, hidden) and torch.equal(y_ref, norm(hidden))
        y, s = arms.kernel_fn(x, r, w, EPS)
        if not (dtype == torch.bfloat16 and _device.interpreted()):  # the interpreter truncates fp32->bf16
            assert torch.equal(s, hidden)
        assert_close(s, hidden, dtype, "new_residual vs HF")
        assert_close(y, norm(hidden), dtype, "normed vs HF")
        if dtype != torch.float32 and not (dtype == torch.bfloat16 and _device.interpreted()):
            # rounded where HF rounds (s, then the normalised row): nearly every element bit-identical
            same = (y == norm(hidden)).float().mean().item()
            assert same >= 0.99, f"only {same:.3f} of normed elements bit-identical to HF"


def test_mixed_weight_dtype():
    """bf16 activations, fp32 weight: normed is fp32 (HF promotion), new_residual bf16, dweight fp32."""
    x, r, _ = make((3, 130), torch.bfloat16)
    w = (1.0 + 0.1 * torch.randn(130, device=DEVICE)).requires_grad_()
    y, s = arms.kernel_fn(x, r, w, EPS)
    y_ref, s_ref = arms.reference_fn(x.detach(), r.detach(), w.detach(), EPS)
    assert y.dtype == y_ref.dtype == torch.float32 and s.dtype == torch.bfloat16
    assert_close(y, y_ref, torch.bfloat16, "normed")  # HF rounds to bf16 inside
    _, _, dw = torch.autograd.grad((y, s), (x, r, w), (torch.ones_like(y), torch.ones_like(s)))
    assert dw.dtype == torch.float32


def test_empty_input():
    x = torch.empty((0, 32), device=DEVICE, requires_grad=True)
    r = torch.empty((0, 32), device=DEVICE, requires_grad=True)
    w = torch.ones(32, device=DEVICE, requires_grad=True)
    y, s = arms.kernel_fn(x, r, w)
    assert y.shape == s.shape == (0, 32)
    (y.sum() + s.sum()).backward()
    assert x.grad.shape == r.grad.shape == (0, 32) and torch.equal(w.grad, torch.zeros(32, device=DEVICE))


def test_inputs_not_modified():
    x, r, w = make((4, 100), torch.bfloat16)
    before = [t.detach().clone() for t in (x, r, w)]
    y, s = arms.kernel_fn(x, r, w)
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    dy0, ds0 = dy.clone(), ds.clone()
    torch.autograd.grad((y, s), (x, r, w), (dy, ds))
    assert all(torch.equal(t, b) for t, b in zip((x, r, w), before))
    assert torch.equal(dy, dy0) and torch.equal(ds, ds0)


def test_errors_name_the_argument():
    x, r, w = make((2, 8), torch.float32)
    with pytest.raises(ValueError, match="^residual must have x's shape"):
        arms.kernel_fn(x, r[:1], w)
    with pytest.raises(TypeError, match="^residual must have x's dtype"):
        arms.kernel_fn(x, r.detach().half(), w)
    with pytest.raises(ValueError, match="^weight must be 1-D"):
        arms.kernel_fn(x, r, w[:3])
    with pytest.raises(TypeError, match="^x has dtype"):
        arms.kernel_fn(x.detach().double(), r.detach().double(), w)


def test_contract_and_registry():
    args = arms.get_inputs()
    x, r, w = args[:3]
    if not _device.on_gpu():
        assert x.numel() < 1e5
    assert x.requires_grad and r.requires_grad and w.requires_grad
    for got, ref, name in zip(arms.kernel_fn(*args), arms.reference_fn(*args), ("normed", "new_residual")):
        assert_close(got, ref, x.dtype, f"kernel_fn(*get_inputs()) {name}")
    assert arms.bytes_moved(*args) == x.numel() * 4 * 2 + w.numel() * 2  # bf16: read x, r; write y, s; read w
    assert arms.bytes_moved_backward(*args) == x.numel() * 4 * 2 + 2 * w.numel() * 2
    entry = get_kernel("add_rmsnorm")
    assert entry.replaces == "add_rmsnorm" and entry.has_backward and entry.module == arms.__name__
    assert hasattr(torch.ops.fusion_advisor, "add_rms_norm")
    assert hasattr(torch.ops.fusion_advisor, "add_rms_norm_backward")
    with torch.no_grad():
        for p, ref in zip(entry.pattern(x, r, w, 1e-5), arms.reference_fn(x, r, w, 1e-5)):
            assert torch.equal(p, ref)
        for got, p in zip(entry.replacement(x, r, w, 1e-5), entry.pattern(x, r, w, 1e-5)):
            assert_close(got, p, x.dtype, "replacement vs pattern")


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
def test_compiled_matches_eager():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, r, w, eps = arms.make_inputs(256, 4096, torch.bfloat16, device="cuda")
    dy, ds = torch.randn_like(x), torch.randn_like(x)

    def fwd_bwd(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, r, w)]
        y, s = fn(*leaves)
        torch.autograd.backward((y, s), (dy, ds))
        return y, s, *(t.grad for t in leaves)

    eager = fwd_bwd(lambda a, b, c: arms.kernel_fn(a, b, c, eps))
    compiled = fwd_bwd(torch.compile(lambda a, b, c: arms.kernel_fn(a, b, c, eps), fullgraph=True))
    # the same Triton kernels run in both; Inductor may reorder the final dweight sum
    for name, e, c in zip(("normed", "new_residual", "dx", "dresidual"), eager[:4], compiled[:4]):
        assert torch.equal(c, e), name
    assert_close(compiled[4], eager[4], torch.bfloat16, "dweight compiled vs eager")


# --- the backward's module-level tuning (BWD_TUNING, swept by benchmarks/kernels/sweep_tiles.py --only add_rmsnorm_bwd)


def test_default_backward_config_carries_the_module_tuning():
    # the residual backward's default launch is RowConfig.backward with add_rmsnorm.BWD_TUNING applied (not the plain
    # RMSNorm's tuning): the measured overrides reach the launch
    cfg = rms.default_bwd_config(4096, residual=True, tuning=arms.BWD_TUNING)
    assert cfg == arms.BWD_TUNING.apply(rms.RowConfig.backward(4096))
    assert cfg.num_stages == arms.BWD_TUNING.num_stages


@pytest.mark.parametrize("tuning", [rms.BwdTuning(num_stages=3), rms.BwdTuning(num_stages=2, rows_per_iter=2,
                                                                                programs_per_sm=1, num_warps=8)],
                         ids=["stages3", "stages2-rows2-pps1-w8"])
def test_backward_tuning_switch(monkeypatch, tuning):
    # the one-line switch reaches the launch (num_stages / rows per step / programs / warps) and stays correct;
    # LOOP_ROWS rows make every program loop over several rows (blocks), the last one partial
    launched = []
    real = rms.rms_norm_bwd_launch

    def spy(*args, **kwargs):
        launched.append(kwargs.get("tuning"))
        return real(*args, **kwargs)

    monkeypatch.setattr(arms, "BWD_TUNING", tuning)
    monkeypatch.setattr(arms, "rms_norm_bwd_launch", spy)
    assert rms.default_bwd_config(300, residual=True, tuning=tuning) == tuning.apply(rms.RowConfig.backward(300))
    for dtype in (torch.float32, torch.bfloat16):
        x, r, w = make((LOOP_ROWS, 300), dtype)
        check_fwd_bwd(x, r, w, dtype)
    assert launched and all(t == tuning for t in launched)


def test_tuning_leaves_the_looped_backward_alone():
    looped = rms.RowConfig.backward(40, max_fused_block=16)
    assert rms.BwdTuning(num_stages=3, rows_per_iter=2).apply(looped) == looped
