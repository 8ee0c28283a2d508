"""What the kernel tests share: the device and dtypes they run on, and their comparisons with float64.

One tolerance table per dtype (fusion_advisor.tolerances). :func:`assert_close` never passes NaN and names the
worst element; :func:`assert_matches` lets NaN pass where the reference is NaN too (hard-value tests of the
pointwise kernels, whose reference propagates NaN); :func:`check_fwd_bwd` runs a kernel forward and backward
against float64 autograd of its reference.
"""

import torch

from fusion_advisor.verification.policy import TOLERANCES, judge
from kernel_library import _device

#: Where the kernel tests run: the GPU when there is one, else the CPU under TRITON_INTERPRET.
DEVICE = _device.default_device()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, equal_nan: bool = False) -> None:
    """``torch.testing.assert_close`` in float64 with TOLERANCES[dtype]; with ``equal_nan`` a NaN passes only
    where ``expected`` is NaN at the same element."""
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=equal_nan)


def check_fwd_bwd(kernel_fn, reference_fn, inputs: list[torch.Tensor], equal_nan: bool = False) -> torch.Tensor:
    """``kernel_fn(*inputs)`` against ``reference_fn`` of the inputs upcast to float64: the output (same dtype and
    shape as ``inputs[0]``), then the gradient of every input for one random output gradient, each within
    :func:`assert_matches`; the inputs unchanged to the bit. ``inputs`` require grad. Returns the kernel's output."""
    dtype = inputs[0].dtype
    before = [t.detach().clone() for t in inputs]
    out = kernel_fn(*inputs)
    assert out.dtype == dtype and out.shape == inputs[0].shape
    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    ref = reference_fn(*inputs64)
    assert_matches(out, ref, dtype, equal_nan)
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(ref, inputs64, grad.double())):
        assert_matches(got, want, dtype, equal_nan)
    for t, t0 in zip(inputs, before):
        torch.testing.assert_close(t.detach(), t0, atol=0, rtol=0, equal_nan=True)
    return out


def check_empty(kernel_fn, make_inputs, shapes=((0, 7), (4, 0))) -> list:
    """A kernel on empty tensors (no rows, no columns): the output has the input's shape and a backward of ones
    runs. ``make_inputs(*shape)`` gives the inputs (requiring grad). Returns ``[(inputs, grads)]`` a shape, for the
    test's own checks of the gradients."""
    seen = []
    for shape in shapes:
        inputs = list(make_inputs(*shape))
        out = kernel_fn(*inputs)
        assert out.shape == shape
        seen.append((inputs, torch.autograd.grad(out, inputs, torch.ones_like(out))))
    return seen


def pair(*shape, dtype=torch.float32) -> list[torch.Tensor]:
    """Two random tensors of ``shape`` and ``dtype`` on :data:`DEVICE`, requiring grad (a gated unit's a and b)."""
    return [torch.randn(*shape, dtype=dtype, device=DEVICE).requires_grad_() for _ in range(2)]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "output") -> None:
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
