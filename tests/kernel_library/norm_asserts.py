"""Assertions shared by the normalization kernels' tests (rmsnorm, add_rmsnorm, layernorm).

One tolerance table per dtype (fusion_advisor.tolerances); NaN never passes; a mismatch names the worst element.
"""

import torch

from fusion_advisor.verification.policy import TOLERANCES, judge


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Every element within TOLERANCES[dtype]; NaN never passes; the report names the worst element."""
    atol, rtol = TOLERANCES[dtype]
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert not torch.isnan(a).any(), f"{what}: {int(torch.isnan(a).sum())} NaN in the kernel output"
    err = (a - e).abs()
    bad = ~(err <= atol + rtol * e.abs())
    if bad.any():
        idx = tuple(int(i) for i in torch.nonzero(bad)[0]) if err.isnan().any() else tuple(
            int(i) for i in torch.nonzero(err == err.max())[0]
        )
        raise AssertionError(
            f"{what} ({dtype}): {int(bad.sum())}/{bad.numel()} elements off; worst at {idx}: "
            f"got {a[idx].item():.8g}, expected {e[idx].item():.8g} (atol {atol}, rtol {rtol})"
        )


def assert_row_sum_grad_close(actual, expected, dtype: torch.dtype, what: str, eager) -> None:
    """A gradient summed over rows (dweight, dbias) against float64: within TOLERANCES[dtype], or, in fp16/bf16,
    within the error policy of fusion_advisor.verification.policy against eager PyTorch's own gradient in the same
    dtype (``eager()`` computes it: autograd of reference_fn on the low-precision inputs): norm-wise within 2x and
    max-wise within 4x eager's own error against float64, plus the dtype's floor.
    The Llama form rounds the normalised row to x's dtype before the weight multiply, as HF does (the float64
    reference of upcast inputs does not); summed over the rows those roundings grow like sqrt(n_rows), beyond any
    fixed table: on the H200 (267 rows in the looped tests) bf16 dweight missed the table on a few elements."""
    try:
        assert_close(actual, expected, dtype, what)
    except AssertionError as table_miss:
        if dtype not in (torch.float16, torch.bfloat16):
            raise
        verdict = judge(actual.detach().cpu(), expected.detach().cpu(), eager().detach().cpu(), what)
        if not verdict.ok:  # NaN fails
            raise AssertionError(f"{table_miss}; and by the error policy: {verdict.reason}") from None
