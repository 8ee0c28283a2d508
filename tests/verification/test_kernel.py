"""The engine (fusion_advisor/verification/kernel.py): float64 throughout, eager as the scale, CUDA's grid limits
under the interpreter."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fusion_advisor.verification.kernel import KeepFloat64, ReferenceFailed, check_case
from fusion_advisor.verification.launch import GridLimitError, GridLimits, check_grid


def test_keep_float64_keeps_downcasts_of_float64_at_float64():
    x = torch.randn(3, dtype=torch.float64)
    with KeepFloat64() as mode:
        casts = [x.to(torch.float32), x.float(), x.half(), x.to("cpu", torch.bfloat16), x.to(dtype=torch.float32),
                 torch.softmax(x, -1, dtype=torch.float32), torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32)]
        untouched = [x.to(torch.int64), torch.zeros(2, dtype=torch.float32), x.to(torch.int32)]
    assert all(c.dtype == torch.float64 for c in casts) and mode.kept == len(casts)
    assert [u.dtype for u in untouched] == [torch.int64, torch.float32, torch.int32]


def _hf_softmax(x):
    # HF eager attention: softmax in fp32, then back to the input dtype
    return torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)


def test_reference_runs_in_float64_throughout_so_eager_error_is_visible():
    x = torch.randn(8, 64, dtype=torch.float64).float()
    out = check_case("c", _hf_softmax, _hf_softmax, [x])
    assert out.ok and out.reference == "float64"
    assert any("cast(s) to a lower precision kept at float64" in d for d in out.details)
    (label, j), = out.judgements
    assert j.eager_norm_err > 0  # eager fp32 is measured against a real float64 softmax, not against itself


def test_a_candidate_that_raises_or_mutates_fails_without_raising():
    x = torch.randn(5)

    def boom(x):
        raise RuntimeError("launch failed")

    out = check_case("c", boom, lambda x: x * 2, [x])
    assert not out.ok and "kernel_fn raised RuntimeError: launch failed" in out.failure and out.traceback

    def mutate(x):
        x.add_(1)
        return x * 2

    out = check_case("c", mutate, lambda x: x * 2, [x.clone()])
    assert not out.ok and "modified in place" in out.failure
    with pytest.raises(ReferenceFailed):
        check_case("c", lambda x: x, lambda x: 1 / 0, [x])


@triton.jit
def _axis1_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + row * BLOCK + offs, tl.load(x_ptr + row * BLOCK + offs))


def test_grid_limits_refuse_a_launch_a_gpu_would_refuse():
    check_grid((2**31 - 1, 65535, 65535))
    with pytest.raises(GridLimitError, match="65536 programs on grid axis 1"):
        check_grid((1, 65536))
    x = torch.randn(65536, 2)
    y = torch.empty_like(x)
    with GridLimits() as limits:
        assert limits.active  # tests run under TRITON_INTERPRET=1 (tests/conftest.py)
        with pytest.raises(GridLimitError):
            _axis1_kernel[(1, 65536)](x, y, BLOCK=2)
        _axis1_kernel[(1, 4)](x, y, BLOCK=2)  # within the limits: runs
    assert torch.equal(y[:4], x[:4])
    _axis1_kernel[(1, 3)](x, y, BLOCK=2)  # outside the context the interpreter is as it was
