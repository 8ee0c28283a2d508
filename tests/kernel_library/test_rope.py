"""Tests of kernel_library/rope.py (``fusion_advisor::rope``), run under TRITON_INTERPRET on the CPU.

q_embed / k_embed and the gradients of q and k are compared element by element with float64 autograd of
``reference_fn`` (HF ``apply_rotary_pos_emb``). cos/sin are random in most tests, so their two halves differ and
the kernel's use of all head_dim values (and the transposed backward map) is really checked; HF's own cos/sin
(equal halves) come from ``make_inputs``.

Grid: 3 dtypes x both q/k layouts (HF's ``view(b, s, h, d).transpose(1, 2)`` and contiguous [b, h, s, d]);
head_dim 2 (one pair), 34 (half of 17: masked, not a power of two) and 128 (Llama); grouped-query k (fewer
heads); more heads than one tile so the head loop runs several times; seq 1 (decode) and batch-shared vs
per-batch cos/sin.
"""

import pytest
import torch
import triton
import triton.language as tl

from kernel_library import _device
from kernel_library import rope as mod

from kernel_asserts import DEVICE, DTYPES, assert_matches


def _check(q, k, cos, sin, equal_nan=False):
    """Kernel vs float64 reference: outputs (dtype, layout, values) and dq, dk; inputs unchanged."""
    out_dtype = torch.promote_types(q.dtype, cos.dtype)
    before = [t.detach().clone() for t in (q, k, cos, sin)]
    q_out, k_out = mod.kernel_fn(q, k, cos, sin)
    assert q_out.dtype == out_dtype and q_out.shape == q.shape and k_out.shape == k.shape
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    ref_q, ref_k = mod.reference_fn(q64, k64, cos.double(), sin.double())
    assert_matches(q_out, ref_q, out_dtype, equal_nan)
    assert_matches(k_out, ref_k, out_dtype, equal_nan)
    grad_q_out, grad_k_out = torch.randn_like(q_out), torch.randn_like(k_out)
    grad_q, grad_k = torch.autograd.grad((q_out, k_out), (q, k), (grad_q_out, grad_k_out))
    ref_gq, ref_gk = torch.autograd.grad((ref_q, ref_k), (q64, k64), (grad_q_out.double(), grad_k_out.double()))
    assert grad_q.dtype == q.dtype
    assert_matches(grad_q, ref_gq, q.dtype, equal_nan)
    assert_matches(grad_k, ref_gk, q.dtype, equal_nan)
    for t, t0 in zip((q, k, cos, sin), before):
        torch.testing.assert_close(t.detach(), t0, atol=0, rtol=0, equal_nan=True)
    return q_out, k_out


def _qk(batch, seq, heads, kv_heads, head_dim, dtype=torch.float32, hf_layout=True):
    def one(h):
        if hf_layout:
            x = torch.randn(batch, seq, h * head_dim, dtype=dtype, device=DEVICE, requires_grad=True)
            return x.view(batch, seq, h, head_dim).transpose(1, 2)
        return torch.randn(batch, h, seq, head_dim, dtype=dtype, device=DEVICE, requires_grad=True)

    return one(heads), one(kv_heads)


def _cos_sin(cos_batch, seq, head_dim, dtype=torch.float32):
    shape = (cos_batch, seq, head_dim)
    return torch.randn(shape, dtype=dtype, device=DEVICE), torch.randn(shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hf_layout", [True, False], ids=["hf_transposed", "contiguous"])
@pytest.mark.parametrize("head_dim", [2, 34, 128])
def test_dtypes_layouts_head_dims(dtype, hf_layout, head_dim):
    q, k = _qk(2, 5, 4, 2, head_dim, dtype, hf_layout)
    _check(q, k, *_cos_sin(1, 5, head_dim, dtype))


def test_hf_cos_sin_and_layout_preserved():
    q, k, cos, sin = mod.make_inputs(2, 6, 4, 16, n_kv_heads=1, dtype=torch.float32)
    assert not q.is_contiguous() and cos.shape == (1, 6, 16)
    q_out, k_out = _check(q, k, cos, sin)
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()


@pytest.mark.parametrize(
    "batch,seq,heads,kv_heads,cos_batch",
    [(1, 1, 3, 3, 1), (3, 4, 5, 1, 3), (1, 3, 40, 8, 1)],
    ids=["decode_single_row", "per_batch_cos_gqa", "many_heads_gqa"],
)
def test_shapes(batch, seq, heads, kv_heads, cos_batch):
    head_dim = 64
    q, k = _qk(batch, seq, heads, kv_heads, head_dim)
    _check(q, k, *_cos_sin(cos_batch, seq, head_dim))


def test_head_loop_runs_more_than_once():
    cfg = mod.RopeConfig.from_shape(n_heads=40, head_dim=128)
    assert cfg.block_h * cfg.half_d <= mod.MAX_HALF_TILE and cfg.block_h < 40
    q, k = _qk(1, 2, 40, 40, 128)
    _check(q, k, *_cos_sin(1, 2, 128))


def test_offset_and_strided_views():
    # q offset along seq, k a head slice of a wider tensor, cos/sin transposed views of [b, d, s] storage.
    base_q = torch.randn(2, 3, 7, 16, device=DEVICE, requires_grad=True)
    base_k = torch.randn(2, 4, 6, 16, device=DEVICE, requires_grad=True)
    q, k = base_q[:, :, 1:], base_k[:, 1:3]
    cos = torch.randn(2, 16, 6, device=DEVICE).transpose(1, 2)
    sin = torch.randn(1, 16, 6, device=DEVICE).transpose(1, 2)
    assert not cos.is_contiguous()
    _check(q, k, cos, sin)
    # feature-strided q: every other element of a [.., 32] last dim
    q2 = torch.randn(2, 3, 6, 32, device=DEVICE, requires_grad=True)[..., ::2]
    _check(q2, k, cos, sin)


def test_mixed_dtypes_follow_hf_promotion():
    # bf16 q/k with fp32 cos/sin: HF's q * cos gives fp32; the gradients come back in bf16.
    q, k = _qk(1, 4, 2, 2, 16, torch.bfloat16)
    cos, sin = _cos_sin(1, 4, 16, torch.float32)
    q_out, _ = _check(q, k, cos, sin)
    assert q_out.dtype == torch.float32


def test_hard_values():
    # RoPE is linear: 1e4 stays 1e4-sized; -inf meets sin = 0 at position 0 (HF cos/sin) and gives NaN
    # (-inf * 0) in the reference and here, in the same places.
    q, k, cos, sin = mod.make_inputs(1, 3, 2, 8, dtype=torch.float32)
    q_data = q.detach().clone()
    q_data[0, 0, 1, :] = 1e4
    q_data[0, 1, 0, 2] = -float("inf")
    q = q_data.requires_grad_()
    q_out, _ = _check(q, k.detach().requires_grad_(), cos, sin, equal_nan=True)
    assert torch.isnan(q_out).any() and torch.isfinite(q_out[0, 0]).all()


def test_cos_requiring_grad_is_refused():
    q, k = _qk(1, 2, 2, 2, 8)
    cos, sin = _cos_sin(1, 2, 8)
    with pytest.raises(NotImplementedError, match="must not require grad"):
        mod.kernel_fn(q, k, cos.requires_grad_(), sin)
    with torch.no_grad():
        mod.kernel_fn(q, k, cos, sin)


def test_empty():
    q, k = _qk(2, 0, 4, 2, 8)
    q_out, k_out = mod.kernel_fn(q, k, *_cos_sin(1, 0, 8))
    assert q_out.shape == q.shape and k_out.shape == k.shape


def test_bad_inputs_name_the_argument():
    q, k = _qk(2, 3, 4, 2, 8)
    cos, sin = _cos_sin(1, 3, 8)
    with pytest.raises(ValueError, match="q must be"):
        mod.kernel_fn(q[0], k, cos, sin)
    with pytest.raises(ValueError, match="k must share"):
        mod.kernel_fn(q, k[:, :, :2], cos, sin)
    with pytest.raises(ValueError, match="head_dim must be even"):
        mod.kernel_fn(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match="cos must be"):
        mod.kernel_fn(q, k, cos[:, :2], sin)
    with pytest.raises(TypeError, match="k must have q's dtype"):
        mod.kernel_fn(q, k.detach().half(), cos, sin)


@triton.jit
def _position_probe(out_ptr, pid, seq_len, stride_b, stride_s):
    b, s = mod._position(pid, seq_len)
    tl.store(out_ptr, b * stride_b + s * stride_s)


def test_offsets_are_int64():
    # pid 2**31 - 1 with seq 2048: batch ~2**20, times a batch stride of 32 * 2048 * 128 elements.
    pid, seq, stride_b, stride_s = 2**31 - 1, 2048, 32 * 2048 * 128, 128
    out = torch.empty(1, dtype=torch.int64, device=DEVICE)
    _position_probe[(1,)](out, pid, seq, stride_b, stride_s)
    assert out.item() == (pid // seq) * stride_b + (pid % seq) * stride_s


def test_contract_and_registry():
    q, k, cos, sin = mod.get_inputs()
    assert q.requires_grad and k.requires_grad and q.device.type == DEVICE.type
    assert q.numel() < 100_000 or _device.on_gpu()  # get_inputs() gives Llama-7B shapes (bf16) on a GPU
    out = mod.kernel_fn(q, k, cos, sin)
    ref = mod.reference_fn(*(t.detach().double() for t in (q, k, cos, sin)))
    for o, r in zip(out, ref):
        assert_matches(o, r, q.dtype)
    assert mod.bytes_moved(q, k, cos, sin) == (2 * (q.numel() + k.numel()) + 2 * cos.numel()) * q.element_size()
    entry = mod.ENTRY
    assert entry.replaces == "rope" and entry.op == "fusion_advisor::rope" and entry.has_backward
    # The replacement against the pattern's exact value (evaluated in float64): in bf16 (GPU get_inputs) the pattern
    # rounds after each of its ops and cancels in q * cos + rotate_half(q) * sin, the kernel rounds once.
    pattern64 = entry.pattern(*(t.detach().double() for t in (q, k, cos, sin)))
    for r, p64 in zip(entry.replacement(q, k, cos, sin), pattern64):
        assert_matches(r, p64, q.dtype)


def test_opcheck():
    # Schema and autograd registration here; the fake-tensor and AOT-dispatch checks run the op on fake tensors,
    # which only works with compiled (GPU) Triton, not under TRITON_INTERPRET.
    utils = ("test_schema", "test_autograd_registration")
    if DEVICE.type == "cuda":
        utils += ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.fusion_advisor.rope.default, tuple(mod.make_inputs(2, 3, 4, 8, n_kv_heads=2, dtype=torch.float32)), test_utils=utils)


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
@pytest.mark.parametrize("hf_layout", [True, False])
def test_torch_compile_fullgraph(hf_layout):
    q, k, cos, sin = mod.make_inputs(2, 128, 8, 128, n_kv_heads=2, dtype=torch.bfloat16, hf_layout=hf_layout)
    compiled = torch.compile(mod.kernel_fn, fullgraph=True)
    out = compiled(q, k, cos, sin)
    grads_out = [torch.randn_like(o) for o in out]
    grads = torch.autograd.grad(out, (q, k), grads_out)
    eager = mod.kernel_fn(q, k, cos, sin)
    eager_grads = torch.autograd.grad(eager, (q, k), grads_out)
    for a, b in zip(list(out) + list(grads), list(eager) + list(eager_grads)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
