"""The error policy (fusion_advisor/verification/policy.py): per tensor, norm-wise and max-wise, against float64,
with eager's own error as the scale and the dtype's rounding as the floor; NaN never passes.

Each test builds a case where one half of the policy decides, so a policy missing that half would fail it.
"""

from __future__ import annotations

import math

import pytest
import torch

from fusion_advisor.verification.policy import (
    ERROR_FLOOR_ULPS, NORM_ERROR_FACTOR, compare_outputs, error_floor, judge, judge_outputs, sqnr_db,
)


def _rounded(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return ref.to(dtype)


def test_small_values_are_judged_at_their_own_scale_not_by_an_absolute_tolerance():
    # a loss of ~0.016 off by 70% and gradients of ~1e-3 three times too large: inside bf16's atol of 2e-2
    ref = torch.tensor(0.0159, dtype=torch.float64)
    assert compare_outputs(torch.tensor(0.0048, dtype=torch.bfloat16), ref)[0]  # the element-wise table is blind
    bad = judge(torch.tensor(0.0048, dtype=torch.bfloat16), ref, ref.to(torch.bfloat16), "loss")
    assert not bad.ok and bad.norm_err > 0.6
    g = torch.randn(4, 1000, dtype=torch.float64) * 1e-3
    assert compare_outputs((3 * g).to(torch.bfloat16), g)[0]
    assert not judge((3 * g).to(torch.bfloat16), g, g.to(torch.bfloat16), "grad").ok
    assert judge(g.to(torch.bfloat16), g, g.to(torch.bfloat16), "grad").ok  # rounded like eager: passes


def test_one_element_where_eager_is_exact_is_not_the_verdict():
    # Qwen2's RMSNorm gradient: the kernel's largest error equals eager's, but sits where eager is exact
    torch.manual_seed(0)
    ref = torch.randn(2048, dtype=torch.float64)
    eager = ref.float()
    eager[7] = eager[7] + 2.6e-5  # eager's own worst element
    kernel = ref.float()
    kernel[1] = kernel[1] + 2.8e-5  # the kernel's worst, where eager happens to be exact
    assert not compare_outputs(kernel, ref)[0] and not compare_outputs(kernel, eager)[0]  # the element rule
    j = judge(kernel, ref, eager, "grad of weight")
    assert j.ok, j.reason
    assert "index (1,)" in j.worst  # the report still names the worst element


def test_one_wild_element_fails_the_max_wise_check_in_a_large_tensor():
    ref = torch.randn(100_000, dtype=torch.float64)
    kernel = ref.to(torch.bfloat16)
    kernel[123] += 2.0  # norm-wise within bf16's limits (one element of 1e5), max-wise 2 / ~4.5
    j = judge(kernel, ref, ref.to(torch.bfloat16), "out")
    assert j.norm_err < j.limit_norm and j.max_err > j.limit_max and not j.ok


def test_nan_and_inf_must_match_float64():
    ref = torch.tensor([1.0, math.inf, -math.inf, math.nan], dtype=torch.float64)
    assert judge(ref.float(), ref, ref.float()).ok
    for bad in ([math.nan, math.inf, -math.inf, math.nan], [1.0, -math.inf, -math.inf, math.nan],
                [1.0, math.inf, -math.inf, 0.0], [1.0, 3e38, -math.inf, math.nan]):
        j = judge(torch.tensor(bad), ref, ref.float())
        assert not j.ok and j.misplaced == 1
    j = judge(torch.tensor([math.nan, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64), None)
    assert j.nan_misplaced == 1 and "index (0,)" in j.first_misplaced


def test_floors_follow_the_dtype_and_tf32():
    assert error_floor(torch.float32) == (ERROR_FLOOR_ULPS[torch.float32][0] * torch.finfo(torch.float32).eps,
                                          ERROR_FLOOR_ULPS[torch.float32][1] * torch.finfo(torch.float32).eps)
    assert error_floor(torch.float32, tf32=True)[0] > error_floor(torch.float32)[0]
    assert error_floor(torch.bfloat16)[0] == torch.finfo(torch.bfloat16).eps
    # an exact eager computation does not demand exactness: a few ulps pass, a few thousand do not
    ref = torch.randn(1000, dtype=torch.float64)
    assert judge((ref * (1 + 4e-7)).float(), ref, ref.float()).ok
    assert not judge((ref * (1 + 1e-4)).float(), ref, ref.float()).ok


def test_eager_error_scales_the_limit():
    ref = torch.randn(10_000, dtype=torch.float64)
    eager = (ref * (1 + 1e-3 * torch.randn_like(ref))).float()  # eager itself 1e-3 off
    e_norm = judge(eager, ref, None).norm_err
    ok = (ref * (1 + 1.5e-3 * torch.randn_like(ref))).float()
    bad = (ref * (1 + 3e-3 * torch.randn_like(ref))).float()
    assert judge(ok, ref, eager).ok
    j = judge(bad, ref, eager)
    assert not j.ok and j.norm_err > NORM_ERROR_FACTOR * e_norm


def test_integer_outputs_are_exact_and_shapes_must_agree():
    assert judge(torch.tensor([1, 2]), torch.tensor([1, 2]), None).ok
    assert not judge(torch.tensor([1, 3]), torch.tensor([1, 2]), None).ok
    assert not judge(torch.ones(3), torch.ones(4, dtype=torch.float64), None).ok


def test_sqnr_is_torchaos_compute_error():
    ref = torch.randn(1000, dtype=torch.float64)
    noisy = ref + 0.01 * torch.randn_like(ref)
    expected = 20 * math.log10(float(ref.norm()) / float((noisy - ref).norm()))
    assert abs(sqnr_db(noisy, ref) - expected) < 1e-9
    assert sqnr_db(ref, ref) == math.inf


def test_judge_outputs_walks_structures_and_names_leaves():
    x = torch.randn(5, dtype=torch.float64)
    v = judge_outputs((x.float(), [2, None]), [x, (2, None)], (x.float(), [2, None]))
    assert v.ok and len(v.lines) == 3
    v = judge_outputs((x.float() * 2, [2, None]), [x, (2, None)], (x.float(), [2, None]))
    assert not v.ok and v.failures[0].startswith("output[0]: MISMATCH")
    v = judge_outputs((x.float(),), (x, x), None)
    assert not v.ok and "kernel returns" in v.failures[0]
    # explicit tolerances compare element-wise
    v = judge_outputs(x.float() + 1e-3, x, None, atol=1e-2, rtol=0.0)
    assert v.ok and "atol 0.01" in v.lines[0]


def test_a_tensor_judged_in_chunks_gets_the_verdict_it_gets_whole(monkeypatch):
    """judge reduces its float64 work chunk by chunk (JUDGE_CHUNK elements: bounded GPU memory for outputs of
    GBs); the verdict, errors, maxima, worst element and SQNR must not depend on where the chunks fall."""
    import dataclasses

    import fusion_advisor.verification.policy as policy

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(7, 13, dtype=torch.float64, generator=g) * 3
    ref[2, 5] = 0.0
    ref[4, 1] = math.inf
    ref[6, 12] = math.nan
    eager = ref.float()
    near = (ref * (1 + 1e-7 * torch.randn(7, 13, dtype=torch.float64, generator=g))).float()
    far = near.clone()
    far[5, 3] += 0.5  # the worst element sits in a later chunk
    nan_late = near.clone()
    nan_late[6, 0] = math.nan  # misplaced NaN in the last chunk
    zero_ref = torch.zeros(5, 3, dtype=torch.float64)
    cases = [(near, ref, eager), (far, ref, eager), (far.t(), ref.t(), None), (nan_late, ref, eager),
             (zero_ref.float() + 1e-3, zero_ref, zero_ref.float())]
    whole = [policy.judge(c, r, e) for c, r, e in cases]
    assert [j.ok for j in whole] == [True, False, False, False, False]
    for chunk in (1, 4, 10):
        monkeypatch.setattr(policy, "JUDGE_CHUNK", chunk)
        for (c, r, e), w in zip(cases, whole, strict=True):
            j = policy.judge(c, r, e)
            for f in dataclasses.fields(w):
                got, want = getattr(j, f.name), getattr(w, f.name)
                if isinstance(want, float) and math.isfinite(want):
                    assert got == pytest.approx(want, rel=1e-12), f.name
                else:
                    assert got == want, f.name

