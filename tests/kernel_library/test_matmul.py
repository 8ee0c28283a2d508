"""Tests of kernel_library/matmul.py (fp32 ``torch.matmul`` / ``torch.bmm`` as 3xTF32), under TRITON_INTERPRET on
the CPU.

c and the gradients of a and b are compared element by element with float64 autograd of ``torch.matmul`` on the
same inputs, at the fp32 tolerance plus the GEMM error bound (3xTF32 products on a GPU, zero under the interpreter,
and fp32 accumulation over K). Layouts: attention's transposed [B, H, T, D] views, a broadcast batch, a 2-D ``b``
under a batched ``a`` (one GEMM over the rows), a 2-D ``a`` under a batched ``b``, five dims, offset views, and
batches past the per-launch limit. Then the wiring: apply finds the scores and output products of a hand-written
attention and the ``bmm`` of ``nn.MultiheadAttention`` in fp32, not in bf16, and not below the size floor.
"""

import pytest
import torch
import torch.nn as nn

from fusion_advisor.tolerances import tolerance_for
from kernel_library import matmul as mod
from kernel_library.registry import load_all

from kernel_asserts import DEVICE

#: Relative error of one 3xTF32 product on a GPU (test_gemm_epilogue.py's TF32_PRODUCT_ERROR), 0 on the CPU.
PRODUCT_ERROR = 2.0**-20 if DEVICE.type == "cuda" else 0.0


def _assert_close(actual, expected, slack):
    atol, rtol = tolerance_for(torch.float32)
    a, e = actual.double(), expected.double()
    assert a.shape == e.shape
    bad = (a - e).abs() > atol + rtol * e.abs() + slack
    assert not bad.any(), f"{int(bad.sum())} of {a.numel()} elements off; max |err| {(a - e).abs().max():.3g}"


def _slack(a, b):
    """Elementwise GEMM error bound: (products' error + K * 2**-24) * |a| @ |b|."""
    return (PRODUCT_ERROR + a.shape[-1] * 2.0**-24) * torch.matmul(a.detach().double().abs(),
                                                                    b.detach().double().abs())


def _check(a, b, fn=mod.kernel_fn, ref_fn=torch.matmul):
    c = fn(a, b)
    a64 = a.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    ref = ref_fn(a64, b64)
    assert c.dtype == a.dtype and c.is_contiguous()
    _assert_close(c, ref, _slack(a, b))
    grad = torch.randn_like(c)
    got = torch.autograd.grad(c, (a, b), grad)
    want = torch.autograd.grad(ref, (a64, b64), grad.double())
    for g, r, name in zip(got, want, "ab"):
        assert g.shape == r.shape, name
        _assert_close(g, r, 1e-5 * r.abs().max())


@pytest.mark.parametrize("B,H,M,N,K", [(2, 3, 37, 41, 24), (1, 1, 1, 40, 48), (2, 2, 5, 3, 7), (3, 2, 33, 65, 70)])
@pytest.mark.parametrize("transposed_b", [True, False])
def test_attention_layouts_match_float64(B, H, M, N, K, transposed_b):
    a, b = mod.make_inputs(B, H, M, N, K, transposed_b=transposed_b)
    assert not a.is_contiguous() or H == 1  # q.transpose(1, 2) of one head is contiguous
    _check(a, b)


@pytest.mark.parametrize("sa,sb", [
    ((2, 3, 9, 16), (1, 3, 16, 5)),  # broadcast outer batch
    ((4, 9, 16), (16, 5)),  # 2-D b: one GEMM over a's 36 rows
    ((9, 16), (4, 16, 5)),  # 2-D a broadcast over b's batch
    ((2, 2, 2, 5, 8), (2, 2, 2, 8, 3)),  # three batch axes, folded into two
    ((3, 1, 7, 8), (1, 2, 8, 6)),  # both broadcast
])
def test_broadcast_batches_match_float64(sa, sb):
    a = torch.randn(sa, device=DEVICE, requires_grad=True)
    b = torch.randn(sb, device=DEVICE, requires_grad=True)
    _check(a, b)


def test_offset_views_and_bmm():
    base = torch.randn(5, 20, 30, device=DEVICE)
    a = base[1:, 2:, 3:19].requires_grad_()  # [4, 18, 16], offset, not contiguous
    b = torch.randn(4, 9, 16, device=DEVICE).transpose(1, 2).requires_grad_()  # [4, 16, 9], column-major
    _check(a, b, fn=lambda x, y: load_all()["bmm"].replacement(x, y), ref_fn=torch.bmm)


def test_batches_past_one_launch_are_sliced(monkeypatch):
    monkeypatch.setattr(mod, "MAX_BATCH_PER_LAUNCH", 3)
    a = torch.randn(4, 2, 5, 6, device=DEVICE, requires_grad=True)  # 8 products, 3 outer entries per launch... 1
    b = torch.randn(4, 2, 6, 7, device=DEVICE, requires_grad=True)
    _check(a, b)


def test_empty_and_k0():
    a = torch.randn(2, 0, 4, device=DEVICE)
    assert mod.kernel_fn(a, torch.randn(2, 4, 3, device=DEVICE)).shape == (2, 0, 3)
    z = mod.kernel_fn(torch.randn(2, 3, 0, device=DEVICE), torch.randn(2, 0, 5, device=DEVICE))
    assert z.shape == (2, 3, 5) and not z.any()


def test_hard_values_match_float64():
    for label, (a, b) in mod.hard_inputs():
        c = mod.kernel_fn(a, b)
        ref = torch.matmul(a.detach().double(), b.detach().double())
        assert not torch.isnan(c).any(), label
        _assert_close(c, ref, _slack(a, b))


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="at least 2-D"):
        mod.kernel_fn(torch.randn(4, device=DEVICE), torch.randn(4, 3, device=DEVICE))
    with pytest.raises(ValueError, match="last dim"):
        mod.kernel_fn(torch.randn(2, 4, device=DEVICE), torch.randn(5, 3, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        mod.kernel_fn(torch.randn(2, 4, device=DEVICE), torch.randn(4, 3, device=DEVICE).double())


def test_opcheck():
    # the fake-tensor and AOT-dispatch checks need compiled (GPU) Triton, not TRITON_INTERPRET
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE.type == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fusion_advisor.matmul.default, tuple(mod.make_inputs(2, 2, 9, 7, 8)),
                          test_utils=utils)


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
def test_torch_compile_fullgraph():
    a, b = mod.make_inputs(4, 4, 300, 260, 64)
    c = torch.compile(mod.kernel_fn, fullgraph=True)(a, b)
    grad = torch.randn_like(c)
    grads = torch.autograd.grad(c, (a, b), grad)
    eager = mod.kernel_fn(a, b)
    torch.testing.assert_close(c, eager, atol=0, rtol=0)
    for g, e in zip(grads, torch.autograd.grad(eager, (a, b), grad)):
        torch.testing.assert_close(g, e, atol=0, rtol=0)


class _Attention(nn.Module):
    """Hand-written attention as KernelBench's MinGPT files write it."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / (C // self.heads) ** 0.5), dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, C)


def _sites(model, x):
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_advisor.apply import canonicalize, find_matches
    from fusion_advisor.apply.patterns import PatternLibrary

    gm = make_fx(model, pre_dispatch=True)(x)
    canonicalize(gm)
    lib = PatternLibrary.for_kernels({k: load_all()[k] for k in ("matmul", "bmm")})
    matches, near = find_matches(gm, lib, 0)
    return sorted(m.site.kernel for m in matches), near


def test_apply_finds_both_attention_products_in_fp32_only():
    x = torch.randn(32, 256, 64, device=DEVICE)  # outputs: 8.4M scores, 524k of att @ v
    assert _sites(_Attention().to(DEVICE), x)[0] == ["matmul", "matmul"]
    kernels, near = _sites(_Attention().to(DEVICE, torch.bfloat16), x.bfloat16())
    assert kernels == [] and near == []


def test_apply_leaves_small_products_to_cublas_as_near_misses():
    kernels, near = _sites(_Attention().to(DEVICE), torch.randn(2, 16, 64, device=DEVICE))
    assert kernels == []
    assert near and all("extra_check" in n.reason for n in near)


def test_apply_finds_multihead_attentions_bmm():
    mha = nn.MultiheadAttention(32, 4).to(DEVICE)
    x = torch.randn(512, 4, 32, device=DEVICE)  # [seq, batch, E]: 16 x 512 x 512 weights
    kernels, _ = _sites(lambda t: mha(t, t, t)[0], x)
    assert "bmm" in kernels


def test_entries_replace_the_matmul_item_and_match_fp32_only():
    kernels = load_all()
    for name in ("matmul", "bmm"):
        e = kernels[name]
        assert e.replaces == "matmul" and e.match_dtypes == (torch.float32,)
        assert e.supports(torch.bfloat16, 8)[0] is False


def test_rule_routes_a_large_fp32_batched_product_to_this_kernel_not_linear(tmp_path):
    from fusion_advisor.analyze.pipeline import analyze

    f = tmp_path / "bmm_model.py"
    f.write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def forward(self, a, b):\n"
        "        return torch.relu(a @ b)\n\n"
        "def get_inputs():\n"
        "    return [torch.randn(8, 1024, 256), torch.randn(8, 256, 1024)]\n\n"
        "def get_init_inputs():\n"
        "    return []\n")
    a = analyze(f, device="meta", gpu="h200")
    (gemm,) = [c for c in a.chains if c.kind == "heavy" and c.pattern == "matmul"]
    d = a.decisions[gemm.id]
    assert (d.route, d.kernel, d.rule_id) == ("triton", "matmul", "triton-fp32-gemm"), (gemm.targets, d)
