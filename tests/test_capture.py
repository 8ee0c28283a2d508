"""Capture keeps attention opaque: SDPA and nn.MultiheadAttention stay one attention op with their projections."""

import torch
from torch import nn

from fusion_advisor.capture import _mha_as_sdpa


def test_mha_rewrite_matches_torch():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(64, 4, batch_first=False).eval()
    q, k, v = torch.randn(10, 3, 64), torch.randn(12, 3, 64), torch.randn(12, 3, 64)
    mask = torch.rand(10, 12) > 0.7
    for attn_mask in (None, mask, torch.randn(10, 12)):
        args = (q, k, v, 64, 4, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
                mha.out_proj.weight, mha.out_proj.bias)
        with torch.no_grad():
            want, _ = torch.nn.functional.multi_head_attention_forward(*args, training=False, need_weights=False,
                                                                       attn_mask=attn_mask)
            got, weights = _mha_as_sdpa(*args, training=False, need_weights=False, attn_mask=attn_mask)
        assert weights is None
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_mha_analysed_as_one_attention_op(tmp_path):
    from fusion_advisor.analyze import analyze

    model = tmp_path / "mha.py"
    model.write_text(
        "import torch, torch.nn as nn\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.a = nn.MultiheadAttention(1024, 16, batch_first=True)\n"
        "    def forward(self, x):\n"
        "        return self.a(x, x, x, need_weights=False)[0]\n"
        "def get_inputs(): return [torch.randn(4, 2048, 1024)]\n"
        "def get_init_inputs(): return []\n"
    )
    a = analyze(model, device="meta", dtype="bf16")
    patterns = [c.pattern for c in a.chains]
    assert patterns.count("attention") == 1
    assert "softmax" not in patterns and "masked_softmax" not in patterns
    assert patterns.count("matmul") >= 2  # the in- and out-projections stay library GEMMs
