"""Tests of kernel_library/cross_entropy.py against torch.nn.functional.cross_entropy in float64.

Grid choice: few token rows (the interpreter runs each program in Python); vocab widths 1, 17, 1000 take the
single-block path, 4097 (one past its limit) and 65537 the chunked online path at its real block size (65537: 2 rows),
and a forced small-block config runs the chunked path at small widths for every reduction / smoothing / ignore
combination.
"""

from __future__ import annotations

import pytest
import torch

from kernel_library import _device
from kernel_library import cross_entropy as ce
from kernel_library.registry import get_kernel

from kernel_asserts import DEVICE, DTYPES, assert_close

REDUCTIONS = ("mean", "sum", "none")
#: A chunked config with a tiny block, so that a few hundred classes take several online log-sum-exp chunks.
CHUNKED = ce.CrossEntropyConfig(block_size=64, num_warps=2, single_block=False)


def make(n_tokens, vocab, dtype=torch.float32, std=2.0, seed=0, ignore_rows=(1,), ignore_index=-100):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n_tokens, vocab, generator=gen) * std).to(dtype=dtype, device=DEVICE)
    target = torch.randint(0, vocab, (n_tokens,), generator=gen)
    for r in ignore_rows:
        if r < n_tokens:
            target[r] = ignore_index
    return logits, target.to(DEVICE)


def reference(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", grad_output=None):
    """float64 loss and gradient from torch autograd."""
    x64 = logits.detach().double().requires_grad_()
    loss = ce.reference_fn(x64, target, ignore_index, label_smoothing, reduction)
    g = torch.ones_like(loss) if grad_output is None else grad_output.double()
    loss.backward(g)
    return loss.detach(), x64.grad


def check(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", config=None, grad_output=None):
    """Kernel loss and gradient against the float64 reference, via the public op or a forced config."""
    dtype = logits.dtype
    ref_loss, ref_grad = reference(logits, target, ignore_index, label_smoothing, reduction, grad_output)
    if config is None:
        x = logits.detach().clone().requires_grad_()
        loss = ce.kernel_fn(x, target, ignore_index, label_smoothing, reduction)
        loss.backward(torch.ones_like(loss) if grad_output is None else grad_output)
        grad = x.grad
    else:
        loss, grad = ce._cross_entropy_fwd_launch(logits, target, ignore_index, label_smoothing, reduction, True,
                                                  config=config)
        if grad_output is not None:
            ce._scale_grad_launch(grad, grad_output)
    assert loss.dtype == dtype and grad.dtype == dtype
    assert_close(loss, ref_loss, dtype, "loss")
    assert_close(grad, ref_grad, dtype, "dlogits")


# --- widths, dtypes, reductions ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 17, 1000, 4097])
def test_vocab_widths(vocab, dtype):
    check(*make(4, vocab, dtype))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("config", [None, CHUNKED], ids=["single", "chunked"])
def test_reductions_and_label_smoothing(reduction, label_smoothing, config):
    check(*make(5, 300, ignore_rows=(0, 3)), -100, label_smoothing, reduction, config=config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_65537_chunked(dtype):
    assert not ce.CrossEntropyConfig.for_vocab(65537).single_block
    logits, target = make(2, 65537, dtype, ignore_rows=())
    target[1] = 65536  # last class: the tail of the last chunk
    check(logits, target, label_smoothing=0.1)


def test_single_token():
    check(*make(1, 1000, ignore_rows=()))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_upstream_gradient_scales(reduction):
    logits, target = make(6, 200)
    g = torch.tensor(0.37, device=DEVICE) if reduction != "none" else torch.linspace(-2, 2, 6, device=DEVICE)
    if reduction == "none":
        g[2] = 1.0  # a row the backward kernel skips
    check(logits, target, reduction=reduction, grad_output=g)
    check(logits, target, reduction=reduction, grad_output=g, config=CHUNKED)


def test_loss_times_constant_and_expanded_grad():
    logits, target = make(4, 100)
    x = logits.clone().requires_grad_()
    (3.0 * ce.kernel_fn(x, target, reduction="none")).sum().backward()  # grad_output expanded with stride 0
    assert_close(x.grad, 3.0 * reference(logits, target, reduction="sum")[1], torch.float32, "dlogits")


# --- hard values ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [None, CHUNKED], ids=["single", "chunked"])
def test_confident_predictions(dtype, config):
    logits = torch.zeros(3, 500, dtype=dtype, device=DEVICE)
    target = torch.tensor([7, 499, 0], device=DEVICE)
    logits[0, 7] = 1e4  # target 1e4 above every other logit
    logits[1, 499] = 1e4
    logits[1, :100] = -1e4
    logits[2, 0] = 1e4 if dtype != torch.float16 else 6e4
    logits[2, 1:] = -1e4 if dtype != torch.float16 else -6e4
    for ls in (0.0, 0.1):
        loss, grad = ce._cross_entropy_fwd_launch(logits, target, -100, ls, "none", True, config=config)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
        if ls == 0.0:
            assert (loss.double().abs() < 1e-6).all()
        check(logits, target, -100, ls, "none", config=config)


@pytest.mark.parametrize("config", [None, CHUNKED], ids=["single", "chunked"])
def test_neg_inf_logits(config):
    logits, target = make(4, 300, ignore_rows=())
    logits[0, ::2] = float("-inf")
    target[0] = 1
    logits[1, :200] = float("-inf")  # whole chunks of -inf before the first finite logit
    target[1] = 250
    check(logits, target, config=config)
    # With label smoothing the mean of log-probabilities is -inf: torch gives inf, so does the kernel.
    loss, _ = ce._cross_entropy_fwd_launch(logits, target, -100, 0.1, "none", True, config=config)
    ref = ce.reference_fn(logits.double(), target, -100, 0.1, "none")
    assert torch.equal(torch.isinf(loss), torch.isinf(ref)) and torch.isinf(loss[:2]).all()
    assert_close(loss[2:], ref[2:], torch.float32)


# --- ignore_index and invalid targets ------------------------------------------------------------------------


@pytest.mark.parametrize("ignore_index", [-100, -1, 0, 5])
def test_custom_ignore_index(ignore_index):
    logits, target = make(6, 50, ignore_rows=(1, 4), ignore_index=ignore_index)
    for reduction in REDUCTIONS:
        check(logits, target, ignore_index, 0.2, reduction)


@pytest.mark.parametrize("config", [None, CHUNKED], ids=["single", "chunked"])
def test_fully_ignored_batch(config):
    logits, target = make(3, 200, ignore_rows=(0, 1, 2))
    x = logits.clone().requires_grad_()
    if config is None:
        mean = ce.kernel_fn(x, target)
        mean.backward()
        grad = x.grad
    else:
        mean, grad = ce._cross_entropy_fwd_launch(logits, target, -100, 0.0, "mean", True, config=config)
    # torch returns NaN for the mean over zero tokens; so does the kernel (documented), with a zero gradient.
    assert torch.isnan(mean) and torch.isnan(torch.nn.functional.cross_entropy(logits, target))
    assert torch.equal(grad, torch.zeros_like(grad))
    check(logits, target, reduction="sum", config=config)
    check(logits, target, reduction="none", config=config)


def test_out_of_range_target_gives_nan():
    logits, target = make(4, 30, ignore_rows=())
    target[1], target[2] = 30, -3
    loss, grad = ce._cross_entropy_fwd_launch(logits, target, -100, 0.0, "none", True)
    assert torch.isnan(loss[1:3]).all() and torch.isnan(grad[1:3]).all()
    keep = torch.tensor([0, 3], device=DEVICE)
    assert_close(loss[keep], ce.reference_fn(logits[keep].double(), target[keep], reduction="none"), torch.float32)
    assert torch.isnan(ce.kernel_fn(logits, target))  # mean over rows including a bad one


# --- layouts, inputs, autograd rules -------------------------------------------------------------------------


def test_transposed_and_offset_views():
    base, _ = make(64, 40)
    gen = torch.Generator().manual_seed(1)

    def targets(n, vocab):
        t = torch.randint(0, vocab, (n,), generator=gen)
        t[n // 2] = -100
        return t.to(DEVICE)

    for x in (base.t(), base[1:41].t()[:, :35], base.t()[:, 3:43], base[5:, 2:], base[::2], base[:, ::3]):
        # transposed (vocab stride 40), transposed + offset, offset with row stride 40 != vocab, strided rows/columns
        assert not x.is_contiguous()
        check(x, targets(*x.shape), label_smoothing=0.1)
    strided_target = torch.stack([targets(64, 40)] * 2, 1)[:, 0]  # target with stride 2
    check(base, strided_target, reduction="none")


def test_inputs_not_modified():
    logits, target = make(5, 300)
    x = logits.clone().requires_grad_()
    t0 = target.clone()
    loss = ce.kernel_fn(x, target, -100, 0.1, "mean")
    loss.backward()
    assert torch.equal(x.detach(), logits) and torch.equal(target, t0)
    assert x.grad.data_ptr() != x.data_ptr()


def test_second_backward_raises():
    logits, target = make(3, 40)
    x = logits.clone().requires_grad_()
    loss = ce.kernel_fn(x, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_no_grad_forward_skips_gradient_buffer():
    logits, target = make(4, 100)
    with torch.no_grad():
        loss = ce.kernel_fn(logits.clone().requires_grad_(), target)
    assert_close(loss, reference(logits, target)[0], torch.float32)
    _, grad = ce.cross_entropy_op(logits, target, -100, 0.0, "mean", False, None)
    assert grad.numel() == 0


def test_non_leaf_logits_gradient_flows():
    h = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, 50, device=DEVICE)
    target = torch.tensor([1, 2, -100, 49], device=DEVICE)
    ce.kernel_fn(h @ w, target, label_smoothing=0.1).backward()
    h64 = h.detach().double().requires_grad_()
    ce.reference_fn(h64 @ w.double(), target, label_smoothing=0.1).backward()
    assert_close(h.grad, h64.grad, torch.float32, "dh")


def test_int64_column_offsets():
    assert not ce.needs_int64_cols(128256, 1)
    assert ce.needs_int64_cols(128256, 20000)  # transposed [20000 tokens, 128256] view: 128255 * 20000 > 2**31
    logits, target = make(20, 30)
    for cfg in (None, CHUNKED):
        loss, grad = ce._cross_entropy_fwd_launch(logits.t().contiguous().t(), target, -100, 0.1, "sum", True,
                                                  config=cfg, force_int64_cols=True)
        ref_loss, ref_grad = reference(logits, target, -100, 0.1, "sum")
        assert_close(loss, ref_loss, torch.float32)
        assert_close(grad, ref_grad, torch.float32, "dlogits")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_batch(reduction):
    logits = torch.empty(0, 10, device=DEVICE, requires_grad=True)
    target = torch.empty(0, dtype=torch.int64, device=DEVICE)
    loss = ce.kernel_fn(logits, target, reduction=reduction)
    ref = torch.nn.functional.cross_entropy(logits.detach(), target, reduction=reduction)
    assert loss.shape == ref.shape and (torch.equal(loss, ref) or (torch.isnan(loss) and torch.isnan(ref)))
    loss.sum().backward()
    assert logits.grad.shape == (0, 10)


def test_loss_dtype_float32_for_bf16_logits():
    logits, target = make(4, 300, torch.bfloat16)
    loss = ce.cross_entropy(logits, target, loss_dtype=torch.float32)
    assert loss.dtype == torch.float32
    ref = torch.nn.functional.cross_entropy(logits.double(), target)
    assert abs(loss.item() - ref.item()) < 1e-5 * (1 + abs(ref.item()))  # fp32 accuracy, not bf16 rounding


def test_errors():
    logits, target = make(3, 10)
    with pytest.raises(ValueError, match="2-D"):
        ce.kernel_fn(logits[None], target)
    with pytest.raises(TypeError, match="logits must be"):
        ce.kernel_fn(logits.double(), target)
    with pytest.raises(TypeError, match="int64"):
        ce.kernel_fn(logits, target.int())
    with pytest.raises(ValueError, match="target must be 1-D"):
        ce.kernel_fn(logits, target[:2])
    with pytest.raises(ValueError, match="label_smoothing"):
        ce.kernel_fn(logits, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction"):
        ce.kernel_fn(logits, target, reduction="avg")
    with pytest.raises(ValueError, match="vocabulary of 0"):
        ce.kernel_fn(logits[:, :0], target)


# the H200 sweep's choices (see cross_entropy.py's constants): vocabularies wider than 4096 are chunked, 4096
# columns per chunk over 8 warps
@pytest.mark.parametrize("vocab, config", [(32000, (4096, 8, False)), (128256, (4096, 8, False)),
                                           (4097, (4096, 8, False)), (4096, (4096, 8, True)), (1, (1, 1, True))])
def test_config_heuristic(vocab, config):
    assert ce.CrossEntropyConfig.for_vocab(vocab) == ce.CrossEntropyConfig(*config)


def test_contract_and_registry():
    args = ce.get_inputs()
    logits = args[0]
    assert logits.requires_grad and logits.device.type == DEVICE.type and (logits.numel() < 1e5 or _device.on_gpu())
    assert_close(ce.kernel_fn(*args), ce.reference_fn(logits.detach().double(), *args[1:]), logits.dtype)
    n, v = logits.shape
    assert ce.bytes_moved(*args) == 2 * n * v * logits.element_size() + n * 8 + logits.element_size()
    assert ce.bytes_moved_backward(*args) == 2 * n * v * logits.element_size() + logits.element_size()
    entry = get_kernel("cross_entropy")
    assert entry.replaces == "cross_entropy" and entry.has_backward
    xb, tb = make(6, 200, torch.bfloat16)
    got, want = entry.replacement(xb, tb), entry.pattern(xb, tb)
    assert got.dtype == want.dtype == torch.float32
    assert_close(got, want, torch.float32)


# --- GPU only ------------------------------------------------------------------------------------------------


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("vocab", [32000, 128256])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_torch_compile_fullgraph(vocab, reduction):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    logits, target = make(64, vocab, torch.bfloat16, ignore_rows=(0, 5))
    x = logits.clone().requires_grad_()
    fn = torch.compile(ce.kernel_fn, fullgraph=True)
    loss = fn(x, target, -100, 0.1, reduction)
    g = torch.full_like(loss, 0.5)
    loss.backward(g)
    ref_loss, ref_grad = reference(logits, target, -100, 0.1, reduction, g)
    assert_close(loss, ref_loss, torch.bfloat16)
    assert_close(x.grad, ref_grad, torch.bfloat16, "dlogits")
    assert torch.equal(x.detach(), logits)


@pytest.mark.gpu
def test_gpu_llama_shape():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    logits, target, ignore_index, ls, reduction = ce.make_inputs(n_tokens=512, vocab=128256, dtype="bfloat16")
    check(logits.detach(), target, ignore_index, ls, reduction)


def test_backward_does_not_fill_a_gradient_for_the_internal_buffer():
    # dlogits is an output of the op that the user never sees: autograd must not materialise a [n_tokens, vocab]
    # zero gradient for it in the backward (a full extra write of the logits' size per step)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.big = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if isinstance(out, torch.Tensor) and out.numel() >= 16 * 50 and ("fill" in name or "zero" in name):
                self.big.append(str(func))
            return out

    logits, target, *rest = ce.make_inputs(16, 50, "float32")
    loss = ce.kernel_fn(logits, target, *rest)
    with Allocations() as mode:
        loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert mode.big == [], f"the backward filled full-size tensors: {mode.big}"
