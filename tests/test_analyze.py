"""The analyze pipeline on real models nobody on the team wrote (transformers' Llama, GPT-2, BERT, a
KernelBench-style file) and on the built-in default model, all on --device meta (fake tensors, no memory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusion_advisor.analyze.pipeline import analyze

pytest.importorskip("transformers")

MODELS = Path(__file__).parent / "data" / "models"


@pytest.fixture(scope="module")
def runs():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = analyze(None if name == "default" else MODELS / f"{name}.py", device="meta")
        return cache[name]

    return get


def _by_pattern(a, pattern):
    return [c for c in a.chains if c.pattern == pattern]


def test_hf_llama_rmsnorm_is_one_memory_bound_normalization_chain(runs):
    a = runs("hf_llama")
    norms = _by_pattern(a, "rmsnorm") + _by_pattern(a, "add_rmsnorm")
    # 2 layers x 2 norms + the final norm
    assert len(norms) == 5
    for c in norms:
        assert c.kind == "fusible"
        assert "reduction" in c.categories
        assert c.row_elems == 4096
        assert a.estimates[c.id].bound == "memory"
        # pow, mean, add(eps), rsqrt, mul, casts, weight mul: all in ONE chain
        names = {t.split(".")[1] for t in c.targets}
        assert {"pow", "mean", "rsqrt", "mul"} <= names
        assert c.fused_bytes < c.eager_bytes / 3
        # the source line points into transformers' LlamaRMSNorm
        assert "modeling_llama.py" in c.source.file


def test_hf_llama_big_linears_are_compute_bound_skip(runs):
    a = runs("hf_llama")
    # the big linears; the rotary embedding's tiny inv_freq @ positions bmm is not one of them
    mms = [c for c in a.chains if c.pattern == "matmul" and c.flops > 1e9]
    assert len(mms) == 2 * 7 + 1  # q k v o gate up down per layer + lm_head
    for c in mms:
        assert a.estimates[c.id].bound == "compute"
        assert a.decisions[c.id].route == "skip"
        assert a.decisions[c.id].rule_id == "skip-matmul"
        assert c.arithmetic_intensity > a.estimates[c.id].ridge_point


def test_hf_llama_glu_and_rope_route_to_compile(runs):
    a = runs("hf_llama")
    swiglu = _by_pattern(a, "swiglu")
    rope = _by_pattern(a, "rope")
    assert len(swiglu) == 2 and len(rope) == 4
    for c in swiglu + rope:
        assert a.decisions[c.id].route == "torch.compile"
    assert all(c.epilogue_of for c in swiglu)  # silu consumes gate_proj's output alone


def test_tiny_pointwise_chain_is_launch_bound(runs):
    a = runs("tiny_pointwise")
    fusible = [c for c in a.chains if c.kind == "fusible"]
    assert len(fusible) == 1
    c = fusible[0]
    assert c.eager_kernels >= 9
    assert a.estimates[c.id].bound == "launch"
    # the rule's CUDA-graph route; alone in its model it saves less than a replay costs over a compiled call
    d = a.decisions[c.id]
    assert d.rule_id == "cudagraphs-launch-bound" and d.route == "torch.compile"
    assert d.reason.startswith("compiled instead of replayed from CUDA graphs")
    assert a.estimates[c.id].fused_us < a.estimates[c.id].eager_us / 5


def test_gpt2_and_bert_capture_and_route(runs):
    for name, norm in (("hf_gpt2", "layernorm"), ("hf_bert", "layernorm")):
        a = runs(name)
        assert a.capture_method == "dynamo"
        patterns = {c.pattern for c in a.chains}
        assert norm in patterns or f"add_{norm}" in patterns
        assert any(c.pattern == "matmul" for c in a.chains)
        assert set(a.decisions) == {c.id for c in a.chains}
        for d in a.decisions.values():
            assert d.route in ("skip", "torch.compile", "triton", "cudagraphs") and d.reason and d.rule_id


def test_kernelbench_file(runs):
    a = runs("kernelbench_conv_gelu")
    assert a.convention == "kernelbench"
    kinds = [(c.kind, c.pattern) for c in a.chains]
    assert ("heavy", "conv") in kinds
    # softmax over channels (dim=1) is not a last-dim softmax: never routed to the row-wise softmax kernel
    soft = [c for c in a.chains if "softmax" in c.categories]
    assert soft and all(a.decisions[c.id].kernel != "softmax" for c in soft)


def test_default_model(runs):
    a = runs("default")
    assert a.convention == "builtin"
    patterns = [c.pattern for c in a.chains]
    # the loss consumes the LM head's GEMM alone: the fused linear + cross-entropy takes them together
    assert patterns.count("linear_cross_entropy") == 1 and "cross_entropy" not in patterns
    ce = _by_pattern(a, "linear_cross_entropy")[0]
    assert ce.row_elems == 32000 and ce.epilogue_of
    assert {op.category for op in a.ops if op.id in {i for c in a.chains if c.id == ce.epilogue_of
                                                     for i in c.op_ids}} == {"matmul"}
    d = a.decisions[ce.id]
    assert (d.rule_id, d.route, d.kernel) == ("triton-linear-cross-entropy", "triton", "linear_cross_entropy")
    # attention stays one opaque SDPA op (not decomposed into bmm + softmax)
    assert patterns.count("attention") == 2
    assert not any(c.pattern in ("softmax", "masked_softmax") for c in a.chains)


def test_a_capture_holding_a_small_share_of_the_forward_says_the_analysis_is_partial():
    # a new user's 35_LSTM: after "step_unsupported" dynamo ran the rest eagerly; 2 captured ops were advised
    # "leave this model as it is" with no warning
    import torch

    from fusion_advisor.analyze.capture import Capture, capture, coverage_note
    from fusion_advisor.analyze.load import load_model
    from fusion_advisor.analyze.records import PARTIAL_COVERAGE

    loaded = load_model(Path(__file__).parent / "data" / "models" / "graph_break.py", device="meta")
    full = capture(loaded)
    assert full.breaks and not any(w.startswith(PARTIAL_COVERAGE) for w in full.warnings)  # both halves captured
    no_aten = torch.fx.symbolic_trace(lambda x: x + 1)  # a graph without aten ops: nothing of the forward
    note = coverage_note(loaded, Capture(graphs=[no_aten], method="dynamo", breaks=full.breaks))
    assert note.startswith(PARTIAL_COVERAGE) and "graph_break.py:15" in note, note


def test_graph_break_is_reported_with_source_line(runs):
    a = runs("graph_break")
    assert len(a.graph_breaks) == 1
    b = a.graph_breaks[0]
    assert b.source.file.endswith("graph_break.py")
    assert b.source.line == 15
    assert "graph_break" in b.source.code
    # analysis continued after the break: the softmax after it was captured too
    assert any("softmax" in c.categories for c in a.chains)


def test_kernel_contract_file_analyses_reference_fn(runs):
    a = runs("kernel_file")
    assert a.convention == "kernel_contract"
    assert [c.pattern for c in a.chains if c.kind == "fusible"] == ["rmsnorm"]


def test_ops_have_costs_and_sources(runs):
    a = runs("default")
    mm = next(o for o in a.ops if o.target == "aten.mm.default")
    m, k = mm.inputs[0].shape
    n = mm.inputs[1].shape[1]
    assert mm.flops == 2 * m * k * n
    assert mm.bytes_read == 2 * (m * k + k * n) and mm.bytes_written == 2 * m * n
    views = [o for o in a.ops if o.category == "view"]
    assert views and all(o.bytes_read == o.bytes_written == 0 for o in views)
    assert all(o.source.file for o in a.ops if o.category == "matmul")


def test_ops_on_empty_tensors_cost_nothing(tmp_path):
    # PyTorch launches no kernel for an op on 0 elements: no launch term, no "saving" from fusing them
    model = tmp_path / "empty_rows.py"
    model.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                     "        return torch.softmax(x * 2, -1)\n\n\ndef get_inputs():\n    return [torch.randn(0, 64)]\n\n\n"
                     "def get_init_inputs():\n    return []\n")
    a = analyze(str(model))
    assert a.chains and all(a.estimates[c.id].eager_us == 0.0 for c in a.chains)
    assert all(a.estimates[c.id].saving_us == 0.0 for c in a.chains)


_KEYWORD_BLOCK = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.proj = nn.Linear(64, 64)

    def forward(self, hidden_states, attention_mask=None):
        h = self.proj(self.norm(hidden_states))
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        return torch.relu(h + hidden_states)


def get_model():
    return Block()


def get_inputs():
    return {GET_INPUTS}
'''


def test_keyword_inputs_are_passed_by_name_and_paths_name_the_users_modules(tmp_path):
    f = tmp_path / "kw_block.py"
    f.write_text(_KEYWORD_BLOCK.replace("{GET_INPUTS}", '{"attention_mask": torch.zeros(4, 32), '
                                                        '"hidden_states": torch.randn(4, 32, 64)}'))
    a = analyze(f, device="cpu")
    paths = {o.module_path for o in a.ops}
    assert {"norm", "proj"} <= paths and not any(p.startswith("fa_keyword_model") for p in paths)
    # the mask (all zeros) reached forward() by name: h * 0 leaves relu(hidden_states), the mask multiply is traced
    assert any("mul" in o.target for o in a.ops)


@pytest.mark.parametrize("inputs, message", [("{}", "got an empty dict"), ("{1: torch.ones(2)}", "keys must be")])
def test_bad_keyword_inputs_are_refused_clearly(tmp_path, inputs, message):
    from fusion_advisor.errors import UserError

    f = tmp_path / "kw_bad.py"
    f.write_text(_KEYWORD_BLOCK.replace("{GET_INPUTS}", inputs))
    with pytest.raises(UserError, match=message):
        analyze(f, device="cpu")


@pytest.mark.parametrize("name", ["default", "hf_llama", "hf_gpt2", "hf_bert", "kernelbench_conv_gelu"])
def test_reasons_quote_no_raw_byte_counts(runs, name):
    # a reason beside MiB columns once read "moves 352378880 bytes"; sizes carry a unit, counts stay short
    import re

    for d in runs(name).decisions.values():
        assert not re.search(r"\d{7,}|\d bytes\b", d.reason), (d.chain_id, d.reason)


def test_a_product_of_mixed_dtypes_is_flagged_on_meta(tmp_path):
    # meta tensors run addmm(fp32 bias, int64 x, fp32 weight) where eager raises: a new user got a clean report of a
    # model that cannot run
    model = tmp_path / "wrong_dtype.py"
    model.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                     "        self.fc = torch.nn.Linear(8, 4)\n\n    def forward(self, x):\n        return self.fc(x)\n\n\n"
                     "def get_inputs():\n    return [torch.randint(0, 5, (2, 8))]\n\n\ndef get_init_inputs():\n    return []\n")
    flagged = [w for w in analyze(str(model)).warnings if "mixed dtypes" in w]
    assert len(flagged) == 1 and flagged[0].startswith(f"{model}:10: addmm gets operands of fp32 and int64")
    for name in ("kernelbench_conv_gelu", "tiny_pointwise"):  # a convolution with bias, a pointwise model
        assert not [w for w in analyze(str(MODELS / f"{name}.py")).warnings if "mixed dtypes" in w]


def test_a_model_drawing_random_numbers_is_named(tmp_path):
    """KernelBench's LSTM draws its initial state with torch.randn in forward: apply called torch.compile "wrong"
    (a mismatch in 19 of 20 elements) without a word on why (found by a fresh user). The draw is named, with its
    line; a model without one gets no such warning."""
    model = tmp_path / "draws.py"
    model.write_text(
        "import torch\n\n\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(8, 8)\n\n"
        "    def forward(self, x):\n"
        "        h0 = torch.randn(x.shape[0], 8, device=x.device)\n"
        "        return self.lin(x) + h0\n\n\n"
        "def get_inputs():\n"
        "    return [torch.randn(4, 8)]\n\n\n"
        "def get_init_inputs():\n"
        "    return []\n")
    said = [w for w in analyze(model).warnings if "random" in w]
    assert said == [f"the model draws random numbers (1 op(s): randn at {model}:10): apply seeds every call alike, "
                    "but code torch.compile generates draws from another random stream than eager's kernels, so "
                    "compiled variants differ from the model as written by the draws; to verify them, pass the "
                    "random tensors in as inputs or fix them in buffers"]
    # every draw's line, up to three (a fresh user's read one of its three: randn_like, dropout, rand)
    model.write_text(model.read_text().replace("return self.lin(x) + h0",
                                               "return self.lin(x) + h0 + torch.rand_like(h0)"))
    said = [w for w in analyze(model).warnings if "random" in w]
    assert f"(2 op(s): randn at {model}:10, rand_like at {model}:11)" in said[0]
    model.write_text(model.read_text().replace("torch.randn(x.shape[0], 8, device=x.device)", "x * 0.5")
                     .replace(" + torch.rand_like(h0)", ""))
    assert not [w for w in analyze(model).warnings if "random" in w]
