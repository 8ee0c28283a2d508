"""Tests of kernel_library/linear.py (fp32 ``F.linear`` as 3xTF32), under TRITON_INTERPRET on the CPU.

y and the gradients of x, w and bias are compared element by element with float64 autograd of ``F.linear`` on the
same inputs, at the fp32 tolerance plus, on a GPU, the 3xTF32 product bound of test_gemm_epilogue.py (zero under
the interpreter, whose fp32 dot is exact). Shapes: partial tiles in M, N and K, one row, a deep K; layouts:
a transposed weight (column-major storage), offset views, 3-D x. Then the wiring: both registry entries replace the
analysis' ``matmul`` item and match fp32 sites only; apply matches fp32 ``nn.Linear`` with and without bias and
meets a bf16 one neither as a site nor as a near-miss; the shipped rule routes a large fp32 GEMM to the kernel on a
GPU spec and leaves small and bf16 GEMMs to cuBLAS.
"""

import pytest
import torch
import torch.nn as nn

from fusion_advisor.tolerances import tolerance_for
from kernel_library import linear as mod
from kernel_library.registry import load_all

from kernel_asserts import DEVICE

#: Relative error of one 3xTF32 product on a GPU (see test_gemm_epilogue.py's TF32_PRODUCT_ERROR), 0 on the CPU.
PRODUCT_ERROR = 2.0**-20 if DEVICE.type == "cuda" else 0.0


def _gemm_slack(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Elementwise error bound of an fp32 GEMM beyond the table: the products' (3xTF32 on a GPU) plus the fp32
    accumulation's K * 2**-24 (Higham's gamma_K), times |x| @ |w|.T."""
    x64, w64 = x.detach().double(), w.detach().double()
    return (PRODUCT_ERROR + x.shape[-1] * 2.0**-24) * (x64.abs() @ w64.abs().t())


def _assert_close(actual, expected, slack):
    atol, rtol = tolerance_for(torch.float32)
    a, e = actual.double(), expected.double()
    bad = (a - e).abs() > atol + rtol * e.abs() + slack
    assert not bad.any(), f"{int(bad.sum())} of {a.numel()} elements off; max |err| {(a - e).abs().max():.3g}"


def _check(x, w, b):
    y = mod.kernel_fn(x, w, b)
    assert y.dtype == torch.float32 and y.shape == (*x.shape[:-1], w.shape[0]) and y.is_contiguous()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    ref = mod.reference_fn(x64, w64, b64)
    _assert_close(y, ref, _gemm_slack(x, w))
    grad = torch.randn_like(y)
    leaves = [t for t in (x, w, b) if t is not None]
    refs = [t for t in (x64, w64, b64) if t is not None]
    got = torch.autograd.grad(y, leaves, grad)
    want = torch.autograd.grad(ref, refs, grad.double())
    for g, r in zip(got, want):
        _assert_close(g, r, 0.0)  # the backward GEMMs are torch.mm's (SGEMM)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("M,N,K", [(37, 45, 70), (1, 40, 48), (5, 3, 7), (64, 33, 129)])
def test_matches_float64_with_partial_tiles(M, N, K, bias):
    x, w, b = mod.make_inputs(M, N, K, bias=bias)
    _check(x, w, b)


def test_transposed_weight_offset_views_and_3d_input():
    base = torch.randn(2, 5, 40, device=DEVICE)
    x = base[1:, 1:, 3:].requires_grad_()  # [1, 4, 37], offset view, not contiguous
    w = torch.randn(37, 45, device=DEVICE).t().requires_grad_()  # [45, 37] stored column-major
    b = torch.randn(50, device=DEVICE)[5:].requires_grad_()
    _check(x, w, b)


def test_permuted_leading_dims_are_copied_into_rows_also_on_fake_tensors():
    # nn.MultiheadAttention hands its in-projection a [seq, batch, E] permute of a [batch, seq, E] tensor; Inductor
    # traces the op on fake tensors, where a failed view() raises ValueError (not RuntimeError): the swap ran
    # eagerly on an H200 until the rows were taken with reshape
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kernel_library._rows import rows_view

    with FakeTensorMode():
        x = torch.empty(2, 16, 8).permute(1, 0, 2)  # [16, 2, 8], strides (8, 128, 1)
        assert rows_view(x).shape == (32, 8)
    base = torch.randn(2, 16, 40, device=DEVICE)
    _check(base.permute(1, 0, 2).requires_grad_(), torch.randn(24, 40, device=DEVICE).requires_grad_(),
           torch.randn(24, device=DEVICE).requires_grad_())


def test_hard_values_match_float64():
    for label, (x, w, b) in mod.hard_inputs():
        y = mod.kernel_fn(x, w, b)
        ref = mod.reference_fn(x.detach().double(), w.detach().double(), b.detach().double())
        assert not torch.isnan(y).any(), label
        _assert_close(y, ref, _gemm_slack(x, w))


def test_two_entries_replace_the_matmul_item_and_match_fp32_only():
    kernels = load_all()
    for name, has_bias in (("linear", True), ("linear_nobias", False)):
        e = kernels[name]
        assert e.replaces == "matmul" and e.match_dtypes == (torch.float32,) and e.dtypes == (torch.float32,)
        assert e.supports(torch.bfloat16, 8)[0] is False
    assert mod.bench_entry({"bias": False}) == "linear_nobias" and mod.bench_entry({}) == "linear"


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 24)
        self.fc2 = nn.Linear(24, 8, bias=False)

    def forward(self, x):
        return self.fc2(torch.sigmoid(self.fc1(x)) * 2.0)


def _sites(dtype):
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_advisor.apply import canonicalize, find_matches
    from fusion_advisor.apply.patterns import PatternLibrary

    model = _MLP().to(device=DEVICE, dtype=dtype)
    gm = make_fx(model, pre_dispatch=True)(torch.randn(4, 16, dtype=dtype, device=DEVICE))
    canonicalize(gm)
    lib = PatternLibrary.for_kernels({k: load_all()[k] for k in ("linear", "linear_nobias")})
    matches, near = find_matches(gm, lib, 0)
    return sorted(m.site.kernel for m in matches), near


def test_apply_matches_fp32_linears_with_and_without_bias():
    kernels, near = _sites(torch.float32)
    assert kernels == ["linear", "linear_nobias"]
    assert not near


def test_apply_meets_a_bf16_linear_neither_as_site_nor_as_near_miss():
    kernels, near = _sites(torch.bfloat16)
    assert kernels == [] and near == []


def _gemm_route(tmp_path, batch: int, width: int, dtype: str):
    from fusion_advisor.analyze.pipeline import analyze

    f = tmp_path / f"gemm_{batch}_{width}_{dtype}.py"
    f.write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        f"        self.fc = nn.Linear({width}, {width})\n\n"
        "    def forward(self, x):\n"
        "        return torch.sigmoid(self.fc(x))\n\n"
        "def get_model():\n"
        f"    return Model().to(torch.{dtype})\n\n"
        "def get_inputs():\n"
        f"    return [torch.randn({batch}, {width}, dtype=torch.{dtype})]\n")
    a = analyze(f, device="meta", gpu="h200")
    (gemm,) = [c for c in a.chains if c.kind == "heavy" and c.pattern == "matmul"]
    return a.decisions[gemm.id]


def test_rule_routes_large_fp32_gemms_to_the_kernel_and_leaves_the_rest_to_cublas(tmp_path):
    big = _gemm_route(tmp_path, 1024, 8192, "float32")
    assert (big.route, big.kernel, big.rule_id) == ("triton", "linear", "triton-fp32-gemm")
    assert "3xTF32" in big.reason
    small = _gemm_route(tmp_path, 128, 1024, "float32")  # 131k outputs: fewer tiles than SMs
    assert small.route == "skip" and small.rule_id == "skip-matmul-launch"  # its launch outlasts its device time
    bf16 = _gemm_route(tmp_path, 1024, 8192, "bfloat16")
    assert bf16.route == "skip" and bf16.rule_id == "skip-matmul"


def test_verify_checks_linear_nobias_without_a_bias():
    from fusion_advisor.kernel_tools.verify import load_contract, verify_kernel

    contract = load_contract("linear_nobias")
    assert contract.name == "linear_nobias" and contract.get_inputs()[2] is None
    assert all(args[2] is None for _, args in contract.hard_inputs())
    result = verify_kernel(contract)
    assert result.correct, result.failure
