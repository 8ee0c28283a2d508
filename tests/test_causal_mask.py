"""Attention given a causal mask the trace materialised runs with is_causal=True (fusion_advisor.apply.causal_mask)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusion_advisor.apply import VariantSpec
from fusion_advisor.apply.causal_mask import causal_mask_sites, fold_causal_masks, is_causal_mask
from fusion_advisor.apply.records import AS_WRITTEN
from fusion_advisor.apply.variants import PlannedModel


class Attention(torch.nn.Module):
    """Scores from a projection; the mask built as transformers builds it under tracing (``arange`` comparisons of
    query and key positions), or from the input (``mask="input"``), or a sliding window (``mask="window"``)."""

    def __init__(self, mask: str = "causal", width: int = 16):
        super().__init__()
        self.proj = torch.nn.Linear(width, 3 * width)
        self.mask = mask

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.proj(x).view(b, n, 3, 2, -1).permute(2, 0, 3, 1, 4)
        qi, ki = torch.arange(n)[:, None], torch.arange(n)[None, :]
        if self.mask == "causal":
            m = (ki <= qi)[None, None].expand(b, 1, n, n)
        elif self.mask == "float":
            m = torch.zeros(n, n).masked_fill(ki > qi, float("-inf"))
        elif self.mask == "window":
            m = ((ki <= qi) & (qi - ki < 3))[None, None]
        else:  # read from the input: not a constant
            m = (ki <= qi)[None, None] & (x[:, None, :, :1] > -100).expand(b, 1, n, n)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum(1)


def _graph(model, x):
    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=grab)(x)
    torch._dynamo.reset()
    return graphs[0]


def test_is_causal_mask_takes_top_left_causal_masks_only():
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    assert is_causal_mask(keep, 5, 5) and is_causal_mask(keep[None, None].expand(2, 1, 5, 5), 5, 5)
    additive = torch.zeros(5, 5).masked_fill(~keep, float("-inf"))
    assert is_causal_mask(additive, 5, 5)
    assert is_causal_mask(torch.zeros(5, 5).masked_fill(~keep, torch.finfo(torch.float32).min), 5, 5)
    assert not is_causal_mask(additive.masked_fill(~keep, -1e4), 5, 5)  # a finite penalty is not a mask
    assert not is_causal_mask(keep, 5, 6)  # top-left and bottom-right alignment differ when lengths differ
    assert not is_causal_mask(torch.ones(5, 5, dtype=torch.bool), 5, 5)
    assert not is_causal_mask(keep.clone().index_fill_(0, torch.tensor([4]), False), 5, 5)
    assert not is_causal_mask(keep.int(), 5, 5)


@pytest.mark.parametrize("kind", ["causal", "float"])
def test_a_constant_causal_mask_is_folded_and_the_result_kept(kind):
    torch.manual_seed(0)
    model, x = Attention(kind), torch.randn(2, 8, 16)
    gm, inputs = _graph(model, x)
    before = gm(*inputs)
    assert len(causal_mask_sites(gm)) == 1
    assert fold_causal_masks(gm) == 1
    (sdpa,) = [n for n in gm.graph.nodes if n.target is torch._C._nn.scaled_dot_product_attention]
    assert sdpa.kwargs.get("attn_mask") is None and sdpa.kwargs.get("is_causal") is True
    assert not [n for n in gm.graph.nodes if n.target is torch.arange]  # the mask's nodes went with it
    torch.testing.assert_close(gm(*inputs), before, rtol=1e-5, atol=1e-5)
    spec = VariantSpec("eager +causal-sdpa", "eager", causal_sdpa=True)
    planned = PlannedModel(model, spec)
    torch.testing.assert_close(planned(x), model(x), rtol=1e-5, atol=1e-5)
    assert planned.causal_masks_folded() == 1 and not spec.stock
    assert VariantSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("kind", ["window", "input"])
def test_other_masks_are_left_alone(kind):
    model, x = Attention(kind), torch.randn(2, 8, 16)
    gm, _ = _graph(model, x)
    assert causal_mask_sites(gm) == [] and fold_causal_masks(gm) == 0
    planned = PlannedModel(model, VariantSpec("eager +causal-sdpa", "eager", causal_sdpa=True))
    torch.testing.assert_close(planned(x), model(x), rtol=1e-5, atol=1e-5)
    assert planned.causal_masks_folded() == 0


def test_old_plans_read_without_the_flag():
    assert VariantSpec.from_dict({"name": "eager", "rest": AS_WRITTEN}).causal_sdpa is False


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, use_cache=False,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def test_transformers_traced_causal_mask_is_found_and_a_padding_mask_is_not():
    # under dynamo transformers materialises its causal mask (masking_utils); with a padding mask from the inputs
    # the mask reads an input and must stay
    model = _tiny_llama()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    counts = {}

    def backend(name):
        def count(gm, example_inputs):
            counts[name] = len(causal_mask_sites(gm))
            return gm.forward
        return count

    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(model, backend=backend("causal"))(input_ids=ids)
        padding = torch.ones(2, 16, dtype=torch.long)
        padding[0, :3] = 0
        torch._dynamo.reset()
        torch.compile(model, backend=backend("padded"))(input_ids=ids, attention_mask=padding)
    torch._dynamo.reset()
    assert counts == {"causal": 2, "padded": 0}


@pytest.mark.gpu
def test_gpu_folded_attention_matches_on_cuda_in_bf16():
    model = _tiny_llama().to("cuda", torch.bfloat16)
    ids = torch.randint(0, 256, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    planned = PlannedModel(model, VariantSpec("eager +causal-sdpa", "eager", causal_sdpa=True))
    with torch.no_grad():
        got, want = planned(input_ids=ids).logits, model(input_ids=ids).logits
    assert planned.causal_masks_folded() == 2
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


class InPlaceMasks(torch.nn.Module):
    """A causal mask changed in place after it was built: padding from an input, or a window cut with ``triu_``."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, q, keep):
        n = q.shape[-2]
        i = torch.arange(n)
        m = (i[None, :] <= i[:, None])[None, None].repeat(q.shape[0], 1, 1, 1)
        if self.how == "padding":
            m.masked_fill_(~keep[:, None, None, :], False)
            m.diagonal(dim1=-2, dim2=-1).fill_(True)
        else:
            m.triu_(-2)
        return F.scaled_dot_product_attention(q, q, q, attn_mask=m)


@pytest.mark.parametrize("how", ["padding", "window"])
def test_a_mask_changed_in_place_after_it_was_built_is_not_folded(how):
    # found by a review: the mask node as built was causal, the mask attention read was not (padding from an input)
    q, keep = torch.randn(2, 2, 8, 4), torch.ones(2, 8, dtype=torch.bool)
    gm, _ = _graph_of(InPlaceMasks(how), q, keep)
    assert causal_mask_sites(gm) == []


class CountingAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, q, side):
        n = q.shape[-2]
        i = torch.arange(n)
        self.count.add_(1)  # in-place updates whose results nothing reads
        side.add_(1)
        return F.scaled_dot_product_attention(q, q, q, attn_mask=i[None, :] <= i[:, None])


def test_folding_removes_the_masks_nodes_only():
    # found by a review: dead-code elimination after the fold removed a step counter's add_ and an input's update
    model, q, side = CountingAttention(), torch.randn(1, 2, 4, 8), torch.zeros(3)
    gm, inputs = _graph_of(model, q, side)
    assert fold_causal_masks(gm) == 1
    count, side_in = (t for t in inputs if t.shape in ((), (3,)))
    before = (float(count), side_in.clone())
    gm(*inputs)
    assert float(count) == before[0] + 1 and torch.equal(side_in, before[1] + 1)
    assert not [n for n in gm.graph.nodes if n.target is torch.arange]


def test_a_mask_too_large_to_check_is_never_built(monkeypatch):
    from fusion_advisor.apply import causal_mask

    gm, _ = _graph_of(Attention("causal"), torch.randn(2, 8, 16))
    monkeypatch.setattr(causal_mask, "MAX_MASK_ELEMENTS", 10)
    monkeypatch.setattr(causal_mask, "constant_value", lambda *a: pytest.fail("the mask was built"))
    assert causal_mask_sites(gm) == []


def _graph_of(model, *args):
    graphs = []

    def grab(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=grab, dynamic=False)(*args)
    torch._dynamo.reset()
    return graphs[0]


def _causal(n):
    i = torch.arange(n)
    return i[None, :] <= i[:, None]


class Tricky(torch.nn.Module):
    """Masks a second review broke the fold with: written by an op that reads them, or built with random numbers."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, q):
        n = q.shape[-2]
        if self.how == "inplace_kwarg":  # F.relu(x, inplace=True) is a call_function with inplace=True
            m = torch.zeros(n, n).masked_fill(~_causal(n), float("-inf"))
            F.hardtanh(m, -1.0, 1.0, inplace=True)
        elif self.how == "set_":  # y.set_(m) makes y the mask; y.fill_ then changes it
            m = _causal(n)
            y = torch.empty(0, dtype=torch.bool)
            y.set_(m)
            y.fill_(True)
        elif self.how == "foreach":
            m = torch.zeros(n, n).masked_fill(~_causal(n), float("-inf"))
            torch._foreach_zero_([m])
        else:  # random: still exactly causal, but folding would remove the draw and shift every later one
            m = _causal(n) & (torch.rand(n, n) < 2)
        return F.dropout(F.scaled_dot_product_attention(q, q, q, attn_mask=m), 0.5)


@pytest.mark.parametrize("how", ["inplace_kwarg", "set_", "foreach", "random"])
def test_masks_written_by_ops_that_read_them_or_drawn_randomly_are_not_folded(how):
    gm, _ = _graph_of(Tricky(how), torch.randn(1, 2, 6, 4))
    assert causal_mask_sites(gm) == []


def test_a_mask_shared_by_calls_of_other_lengths_is_judged_per_call():
    class Shared(torch.nn.Module):
        def forward(self, short, long):
            m = torch.ones(1, 1, dtype=torch.bool)  # causal for one query over one key, not for L x L
            return (F.scaled_dot_product_attention(short, short, short, attn_mask=m).sum()
                    + F.scaled_dot_product_attention(long, long, long, attn_mask=m).sum())

    gm, _ = _graph_of(Shared(), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 6, 4))
    (site,) = causal_mask_sites(gm)
    assert _shape_of(site.args[0]) == (1, 2, 1, 4)


def _shape_of(node):
    val = node.meta.get("val", node.meta.get("example_value"))
    return tuple(val.shape)
