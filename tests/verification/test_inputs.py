"""Inputs with the structure of real ones, hard values and edge shapes (fusion_advisor/verification/inputs.py)."""

from __future__ import annotations

import pytest
import torch

from fusion_advisor.verification import inputs as I


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_structures_are_told_apart():
    causal = torch.full((6, 6), float("-inf")).triu(1)  # 0 / -inf, no fully masked row
    hf = torch.zeros(6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    scores = torch.randn(6, 6) + causal  # already masked scores: plain values with -inf kept in place
    probs = torch.softmax(torch.randn(4, 10), -1)
    one_hot = torch.nn.functional.one_hot(torch.arange(4), 10).float()
    assert I.structure_of(causal) == I.ADDITIVE_MASK
    assert I.structure_of(hf) == I.ADDITIVE_MASK
    assert I.structure_of(torch.full((3, 3), float("-inf"))) == I.MASK_ONLY
    assert I.structure_of(scores) == I.PLAIN
    assert I.structure_of(probs) == I.PROBABILITIES
    assert I.structure_of(one_hot) == I.INDICATOR
    assert I.structure_of(torch.ones(8)) == I.CONSTANT
    assert I.structure_of(torch.tensor([0.125])) == I.SINGLE
    assert I.structure_of(torch.rand(4, 4) > 0.5) == I.BOOL_MASK
    assert I.structure_of(torch.arange(10)) == I.INTEGER
    assert I.structure_of(torch.randn(4, 4)) == I.PLAIN


def test_fresh_inputs_keep_masks_indices_and_probabilities():
    causal = torch.full((64, 64), float("-inf")).triu(1)
    fresh = I.fresh_like(causal, _gen())
    # the mean of a tensor holding -inf is -inf: redrawn from N(mean, std), every element would be -inf
    assert torch.isinf(causal.mean())
    assert torch.equal(fresh, causal) and int(torch.isinf(fresh).all(-1).sum()) == 0  # no fully masked row
    for kept in (torch.softmax(torch.randn(4, 10), -1), torch.nn.functional.one_hot(torch.arange(4), 10).float(),
                 torch.randint(-100, 50, (16,)), torch.rand(4, 4) > 0.5):
        assert torch.equal(I.fresh_like(kept, _gen()), kept)


def test_fresh_plain_values_use_finite_statistics_and_keep_mask_values_in_place():
    scores = torch.randn(32, 32) * 3 + 5
    scores[:, -4:] = float("-inf")  # masked columns
    scores[0, 0] = torch.finfo(torch.float32).min  # an HF-style masked score
    fresh = I.fresh_like(scores, _gen())
    special = I.mask_values(scores)
    assert torch.equal(fresh[special], scores[special])
    vals = fresh[~special]
    assert torch.isfinite(vals).all() and not torch.equal(vals, scores[~special])
    assert abs(float(vals.mean()) - 5) < 0.5 and abs(float(vals.std()) - 3) < 0.5  # N(mean, std) of finite values
    weight = torch.ones(100)
    w = I.fresh_like(weight, _gen())  # a weight initialised to ones must not hide a kernel ignoring it
    assert not torch.equal(w, weight) and abs(float(w.mean()) - 1) < 0.1


def test_hard_variants_scale_only_plain_inputs():
    x = torch.randn(4, 8, requires_grad=True)
    mask = torch.full((4, 8), float("-inf")).triu(1)
    labels = torch.arange(4)
    cases = dict(I.hard_variants([x, mask, 0.5, labels]))
    assert list(cases) == list(I.HARD_CASES)
    large = cases["hard-large"]
    assert torch.equal(large[0].detach(), x.detach() * 8) and large[0].requires_grad and large[0].is_leaf
    assert torch.equal(large[1], mask) and large[2] == 0.5 and torch.equal(large[3], labels)
    assert torch.equal(cases["hard-zeros"][0].detach(), torch.zeros(4, 8))
    assert I.hard_variants([labels, mask]) == []  # nothing plain to make hard


def test_edge_sizes_cover_the_shapes_that_break_row_kernels():
    edges = I.edge_sizes((16, 1000), interpreted=False, huge=False)
    sizes = {e.label: e.size for e in edges}
    assert sizes["one row"] == (1, 1000)
    assert sizes["partial last block"] == (3, 1025)
    assert sizes["odd width 3"] == (5, 3) and sizes["odd width 37"] == (5, 37)
    assert sizes["1025 rows"] == (1025, 3)
    assert sizes["65537 rows (over 65535)"] == (65537, 3)
    assert all(not e.skip for e in edges)
    on_cpu = {e.label: e.skip for e in I.edge_sizes((16, 1000), interpreted=True, huge=False)}
    assert on_cpu["65537 rows (over 65535)"] == I.INTERPRETER_SKIP and not on_cpu["1025 rows"]
    assert not any(I.edge_sizes((16, 1000), interpreted=True, huge=True)[i].skip for i in range(6))
    assert [e.size for e in I.edge_sizes(1031, interpreted=False, huge=False)] == [1, 3, 37, 2049, 65537]
    assert I.edge_sizes((700,), interpreted=False, huge=False)[0].size == (1,)
    assert I.edge_sizes((2, 8, 64), interpreted=False, huge=False)[0].size == (1, 1, 64)  # leading dims are rows
    capped = {e.label: e.size for e in I.edge_sizes((4, 1000), interpreted=False, huge=False, max_row_elems=1000)}
    assert capped["partial last block"] == (3, 999)
    with pytest.raises(ValueError):
        I.edge_sizes((0, 4), interpreted=False, huge=False)
