"""SDPA backend selection: the CPU-side rule follows torch's sdp_utils filters on representative configs; the graph
stage records the backend and the math path's eager kernels; torch's own choice is used only when CUDA is there."""

from __future__ import annotations

import pytest
import torch

from fusion_advisor.analyze.pipeline import analyze
from fusion_advisor.devices import load_spec
from fusion_advisor.analyze.sdpa import (BOOL_MASK_KERNELS, SdpaArgs, args_of, choose_backend, fused_kernels, math_kernels,
                                 rule_backend, torch_backend)


def _args(q=(2, 8, 128, 64), k=None, v=None, dtype="bf16", **kw) -> SdpaArgs:
    return SdpaArgs(q_shape=q, k_shape=k or q, v_shape=v or k or q, dtype=dtype, **kw)


# (config, expected backend, why): the filters of can_use_flash_attention / can_use_mem_efficient_attention
RULE_CASES = [
    (_args(), "flash", "fp16/bf16, no mask, head_dim 64"),
    (_args(dtype="fp16", is_causal=True), "flash", "causal with Lq == Lk"),
    (_args(mask="float"), "efficient", "flash takes no mask"),
    (_args(mask="bool"), "efficient", "a boolean mask too"),
    (_args(dtype="fp32"), "efficient", "flash takes no fp32"),
    (_args(q=(2, 8, 128, 256)), "flash", "head_dim 256 is flash's limit"),
    (_args(q=(2, 8, 128, 320)), "efficient", "above 256: efficient (no upper limit on CUDA)"),
    (_args(q=(2, 8, 128, 60)), "flash", "odd head_dim: flash pads it internally"),
    (_args(q=(2, 8, 128, 60), mask="float"), "math", "masked, 60 % 8 != 0: efficient refuses, math"),
    (_args(q=(2, 8, 128, 60), dtype="fp32"), "efficient", "fp32 aligns to 4: 60 is fine"),
    (_args(q=(2, 8, 128, 62), dtype="fp32"), "math", "62 % 4 != 0"),
    (_args(q=(2, 8, 16, 64), k=(2, 8, 128, 64), is_causal=True), "efficient", "flash: causal needs Lq == Lk"),
    (_args(last_dim_stride_one=False), "math", "fused kernels need last-dim stride 1"),
    (_args(q=(8, 128, 64)), "math", "fused kernels take 4-D inputs only"),
    (_args(dtype="fp64"), "math", "no fused fp64"),
    (_args(q=(2, 32, 128, 64), k=(2, 8, 128, 64)), "math", "heads differ without enable_gqa"),
    (_args(q=(2, 32, 128, 64), k=(2, 8, 128, 64), enable_gqa=True), "flash", "GQA"),
]


@pytest.mark.parametrize("args,want,why", RULE_CASES, ids=[c[2] for c in RULE_CASES])
def test_rule_backend(args, want, why):
    got, reason = rule_backend(args)
    assert got == want, f"{why}: got {got} ({reason})"
    assert (reason == "") == (want == "flash")


def test_args_of_reads_layout_and_mask():
    q = torch.empty(2, 128, 8, 64, dtype=torch.bfloat16).transpose(1, 2)  # [B, H, S, D] view, last stride 1
    a = args_of(q, q, q, torch.zeros(2, 1, 128, 128, dtype=torch.bool), 0.0, False, False)
    assert a.q_shape == (2, 8, 128, 64) and a.dtype == "bf16" and a.mask == "bool" and a.last_dim_stride_one
    a = args_of(q.transpose(-1, -2), q, q)
    assert not a.last_dim_stride_one and a.mask == ""


def test_math_kernel_count():
    # 2 scalings + 2 bmm + 5 in _safe_softmax; masks, causal, dropout, GQA and permuted operands add kernels
    assert math_kernels() == 9
    assert math_kernels("float") == 10
    assert math_kernels("bool") == 14
    assert math_kernels(is_causal=True) == 15
    assert math_kernels("float", permuted_inputs=3) == 13
    assert math_kernels(permuted_inputs=7) == 12  # at most q, k and v
    assert math_kernels(dropout_p=0.1, gqa=True) == 14


def test_torch_is_asked_only_with_cuda(monkeypatch):
    q = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16)
    if not torch.cuda.is_available():
        assert torch_backend(q, q, q) is None
        assert choose_backend(q, q, q) == ("flash", "rule")
        assert choose_backend(q, q, q, torch.zeros(16, 16)) == ("efficient", "rule")
    monkeypatch.delattr(torch, "_fused_sdp_choice", raising=False)  # a torch without it: the rule
    assert torch_backend(q, q, q) is None
    assert choose_backend(q, q, q)[1] == "rule"


@pytest.mark.gpu
def test_rule_agrees_with_torch_on_plain_configs():
    for dtype, mask, causal in ((torch.bfloat16, None, True), (torch.float16, "float", False),
                                (torch.float32, None, False)):
        q = torch.empty(2, 8, 256, 64, dtype=dtype, device="cuda")
        m = torch.zeros(2, 1, 256, 256, dtype=dtype, device="cuda") if mask else None
        picked = torch_backend(q, q, q, m, 0.0, causal)
        assert picked is not None
        if picked != "cudnn":  # newer torch prefers cuDNN on sm90+; the rule cannot see cuDNN's version
            assert picked == rule_backend(args_of(q, q, q, m, 0.0, causal))[0]


def _attention_model(tmp_path, head_dim: int, mask: str, causal: bool):
    model = tmp_path / f"attn_{head_dim}_{mask or 'none'}.py"
    mask_expr = {"": "None", "float": "torch.zeros(2, 1, 64, 64, device=x.device, dtype=x.dtype)",
                 "bool": "torch.ones(2, 1, 64, 64, device=x.device, dtype=torch.bool)"}
    model.write_text(
        "import torch, torch.nn.functional as F\n"
        "class Model(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        f"        q = x.view(2, 64, 4, {head_dim}).transpose(1, 2)\n"
        f"        m = {mask_expr[mask]}\n"
        f"        return F.scaled_dot_product_attention(q, q, q, attn_mask=m, is_causal={causal})\n"
        f"def get_inputs(): return [torch.randn(2, 64, 4 * {head_dim})]\n"
        "def get_init_inputs(): return []\n")
    a = analyze(model, device="meta", dtype="bf16")
    (op,) = [o for o in a.ops if o.category == "attention"]
    (chain,) = [c for c in a.chains if c.pattern == "attention"]
    return a, op, chain


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rule path; with CUDA torch itself answers")
@pytest.mark.parametrize("head_dim,mask,causal,want", [(64, "", True, "flash"), (64, "float", False, "efficient"),
                                                       (64, "bool", False, "efficient"), (60, "float", False, "math"),
                                                       (60, "bool", False, "math")])
def test_graph_records_the_backend(tmp_path, head_dim, mask, causal, want):
    a, op, chain = _attention_model(tmp_path, head_dim, mask, causal)
    assert op.variant == want
    if want == "math":
        # q, k, v are the permuted view of x: three reshape copies in the math path's matmuls
        assert op.eager_kernels == math_kernels(mask, causal, permuted_inputs=3) > 10
        assert chain.eager_kernels == op.eager_kernels
        est = a.estimates[chain.id]
        h200 = load_spec("h200")  # its launch overhead, at the host time a model's op costs
        assert est.launch_eager_us == pytest.approx(op.eager_kernels * 12.0 * h200.host_time_scale)
    else:
        # a boolean mask is converted to an additive one first (measured: 5 kernels with the efficient kernel)
        assert op.eager_kernels == chain.eager_kernels == fused_kernels(mask) == 1 + (mask == "bool") * BOOL_MASK_KERNELS
