"""Chain cutting on small hand-written modules with known answers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fusion_advisor.analyze.capture import capture
from fusion_advisor.analyze.chains import build_chains
from fusion_advisor.analyze.graph import build_op_graph
from fusion_advisor.analyze.load import LoadedModel


def _chains(module: nn.Module, *inputs: torch.Tensor):
    with torch.device("meta"):
        module = module.to("meta")
    loaded = LoadedModel("m", "<test>", "test", module, tuple(x.to("meta") for x in inputs), "meta", "")
    og = build_op_graph(capture(loaded))
    return og, build_chains(og)


class Pointwise(nn.Module):
    def forward(self, x):
        return torch.relu(x * 2 + 1)


def test_pointwise_chain_bytes():
    og, chains = _chains(Pointwise(), torch.randn(256, 1024))
    (c,) = chains
    nbytes = 256 * 1024 * 4
    assert c.kind == "fusible" and c.eager_kernels == 3
    assert c.fused_bytes == 2 * nbytes  # x read once, y written once
    assert c.eager_bytes == 6 * nbytes  # each op reads and writes the full tensor
    assert c.bytes_saved == 4 * nbytes


class IntFloorDiv(nn.Module):
    def forward(self, x):
        return (x * 3 + 1) // 2


def test_floor_divide_joins_the_pointwise_chain():
    # torch does not tag aten.floor_divide pointwise; it is element-wise all the same
    _, chains = _chains(IntFloorDiv(), torch.randint(0, 100, (64, 64)))
    (c,) = chains
    assert c.kind == "fusible" and c.eager_kernels == 3


class Residual(nn.Module):
    """Two pointwise regions joined by a matmul: the residual add must not join the first region."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        h = torch.sigmoid(x) * x
        return h + torch.relu(self.lin(h)) * 2


def test_chains_never_span_a_matmul():
    og, chains = _chains(Residual(), torch.randn(32, 64))
    kinds = [(c.kind, c.pattern) for c in chains]
    assert kinds[1] == ("heavy", "matmul")
    first, last = chains[0], chains[-1]
    assert first.kind == last.kind == "fusible"
    assert not set(first.op_ids) & set(last.op_ids)
    # the add that reads h is after the matmul: it belongs to the last chain, with relu and the scale
    assert any("add" in t for t in last.targets) and any("relu" in t for t in last.targets)
    assert last.epilogue_of == chains[1].id  # relu consumes the matmul's output alone


class RowNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(512))

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + 1e-6))


def test_row_reduction_joins_per_row_ops():
    og, chains = _chains(RowNorm(), torch.randn(8, 512))
    (c,) = chains
    assert c.pattern == "rmsnorm" and c.row_elems == 512
    names = sorted(t.split(".")[1] for t in c.targets)
    assert names == ["add", "mean", "mul", "mul", "pow", "rsqrt"]


class TwoReductions(nn.Module):
    def forward(self, x):
        return x.sum(-1, keepdim=True) + x.sum(0)  # rows of 16 and columns of 8: not one row-wise kernel


def test_reductions_over_different_rows_split():
    og, chains = _chains(TwoReductions(), torch.randn(8, 16))
    sums = [c for c in chains if any("sum" in t for t in c.targets)]
    assert len(sums) == 2


class Attn(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2


def test_sdpa_stays_one_heavy_op():
    q = torch.randn(1, 4, 128, 64)
    og, chains = _chains(Attn(), q, q, q)
    assert [(c.kind, c.pattern) for c in chains][0] == ("heavy", "attention")
    att = chains[0]
    assert att.flops == 2 * 4 * 128 * 128 * (64 + 64) // 2  # causal: the masked half is skipped


class _ScaledActivations(nn.Module):
    """silu / gelu times a scalar: no gate tensor, so neither is a GLU (swiglu / geglu kernels take two tensors)."""

    def forward(self, x, a, b):
        return (torch.nn.functional.silu(x) * 2.0,
                torch.nn.functional.gelu(x, approximate="tanh") * 0.5,
                torch.nn.functional.silu(a) * b)


def test_scalar_scaled_activation_is_not_a_glu():
    x, a, b = torch.randn(8, 64), torch.randn(8, 64), torch.randn(8, 64)
    patterns = sorted(c.pattern for c in _chains(_ScaledActivations(), x, a, b)[1])
    assert "geglu" not in patterns
    assert patterns.count("swiglu") == 1  # silu(a) * b alone


class _AttnThenMerge(nn.Module):
    """SDPA, then the heads merged back: ``out.transpose(1, 2).contiguous().view(B, S, H * D)``."""

    def forward(self, q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b, h, s, d = out.shape
        return out.transpose(1, 2).contiguous().view(b, s, h * d)


def test_heads_merge_after_fused_attention_copies_nothing():
    # the fused GPU kernels write token-major memory: merging the heads back is free (no copy kernel), as on the GPU
    q = torch.randn(2, 4, 128, 64, dtype=torch.bfloat16)
    og, chains = _chains(_AttnThenMerge(), q, q, q)
    assert [c.pattern for c in chains] == ["attention"]
    # the math backend (fp64 here: no fused kernel takes it) returns heads-major memory: the merge is a copy
    q64 = q.double()
    og, chains = _chains(_AttnThenMerge(), q64, q64, q64)
    assert [c.pattern for c in chains] == ["attention", "copy"]


def test_opaque_attention_returns_the_layout_its_fake_promises():
    from fusion_advisor.analyze.capture import _attention, _attention_fake

    for dtype in (torch.bfloat16, torch.float64):
        q = torch.randn(2, 4, 16, 8, dtype=dtype)
        real = _attention(q, q, q, None, 0.0, True)
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            fq = mode.from_tensor(q)
            fake = _attention_fake(fq, fq, fq, None, 0.0, True)
        assert real.stride() == fake.stride(), dtype
        torch.testing.assert_close(real, F.scaled_dot_product_attention(q, q, q, is_causal=True))


class _ScaledSoftmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x * 0.125, dim=-1)


class _MaskedSoftmax(nn.Module):
    def forward(self, x, mask):
        return torch.softmax(x * 0.125 + mask, dim=-1)


class _WhereSoftmax(nn.Module):
    def forward(self, x, keep):
        return torch.softmax(torch.where(keep, x, torch.full_like(x, -1e4)), dim=-1)


class _SoftmaxThenAdd(nn.Module):
    def forward(self, x, y):
        a = torch.softmax(x, dim=-1)
        return a * y, (a + y).sum(-1)


def test_masked_softmax_needs_a_mask():
    # a scale is no mask: apply's matcher names such a site "softmax", and the analysis must agree
    x = torch.randn(2, 4, 64, 64)
    assert [c.pattern for c in _chains(_ScaledSoftmax(), x)[1]] == ["softmax"]
    assert [c.pattern for c in _chains(_MaskedSoftmax(), x, torch.randn(2, 1, 64, 64))[1]] == ["masked_softmax"]
    patterns = [c.pattern for c in _chains(_WhereSoftmax(), x, torch.rand(2, 1, 64, 64) > 0.5)[1]]
    assert "masked_softmax" in patterns
    # an add of the softmax's output is no mask (a new user's chain of softmax, mul, add, sum read masked_softmax)
    assert "softmax" in [c.pattern for c in _chains(_SoftmaxThenAdd(), x, torch.randn_like(x))[1]]


def test_attention_items_carry_their_sdpa_backend():
    q = torch.randn(1, 4, 256, 64, dtype=torch.bfloat16)
    og, chains = _chains(_AttnThenMerge(), q, q, q)
    att = [c for c in chains if c.pattern == "attention"]
    assert len(att) == 1 and att[0].attention_backend in ("flash", "efficient", "cudnn")
    assert all(c.attention_backend == "" for c in chains if c.pattern != "attention")


class ConvReluPool(nn.Module):
    """relu feeds max_pool2d alone (Inductor reads the pool's input through it); the tanh's output is also returned,
    so it feeds more than the pool."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        y = F.max_pool2d(torch.relu(self.conv(x)), 2)
        z = torch.tanh(y)
        return F.avg_pool2d(z, 2), z


def test_a_pointwise_chain_read_only_by_a_pool_is_its_prologue():
    from fusion_advisor.analyze.roofline import estimate
    from fusion_advisor.devices import load_spec

    og, chains = _chains(ConvReluPool(), torch.randn(2, 4, 32, 32))
    by_pattern = {}
    for c in chains:
        by_pattern.setdefault(c.pattern, []).append(c)
    relu, tanh = by_pattern["pointwise"]
    pool = next(c for c in chains if c.id == relu.prologue_of)
    assert "max_pool2d_with_indices" in pool.pattern and relu.epilogue_of  # the conv's epilogue and the pool's prologue
    assert tanh.prologue_of == ""  # z is returned too: the pool is not its only reader
    ops = {o.id: o for o in og.ops}
    e_relu, e_tanh = (estimate(c, ops, load_spec("h200")) for c in (relu, tanh))
    assert e_relu.compile_us == e_relu.compute_us < e_relu.eager_us  # its memory pass goes into the pool's kernel
    assert e_tanh.compile_us == e_tanh.eager_us  # a single kernel of its own, as under eager


class _BiasGelu(nn.Module):
    def __init__(self, extra: bool):
        super().__init__()
        self.bias, self.extra = nn.Parameter(torch.zeros(64)), extra

    def forward(self, x):
        y = x + self.bias
        if self.extra:  # KernelBench's ConvTranspose2d_Add_Min_GELU_Multiply: min and a scale around the GELU
            y = torch.minimum(y, torch.zeros(()))
        y = F.gelu(y)
        return y * 2.0 if self.extra else y


def test_bias_gelu_names_only_the_chain_the_library_kernel_computes():
    """gelu(x + bias) alone is ``bias_gelu`` (the library kernel's pattern, which the rules may route to it); with a
    min and a scale in the chain the kernel cannot replace it, so it is a ``gelu`` chain; so are gelu(x) + bias (the
    add after the GELU) and gelu(x + y) with y as large as x (the kernel takes a 1-D bias over the last dim)."""
    x = torch.randn(8, 64)
    assert [c.pattern for c in _chains(_BiasGelu(extra=False), x)[1]] == ["bias_gelu"]
    assert [c.pattern for c in _chains(_BiasGelu(extra=True), x)[1] if c.kind == "fusible"] == ["gelu"]
    bias = torch.randn(64)
    assert [c.pattern for c in _chains(_Call(lambda t, b: F.gelu(t) + b), x, bias)[1]] == ["gelu"]
    assert [c.pattern for c in _chains(_Call(lambda t, y: F.gelu(t + y)), x, torch.randn(8, 64))[1]] == ["gelu"]
    assert [c.pattern for c in _chains(_Call(lambda t, b: F.gelu(t + b)), x, bias)[1]] == ["bias_gelu"]



def test_log_softmax_is_not_a_softmax_chain():
    """A lone log_softmax (KernelBench's 24_LogSoftmax) is ``log_softmax``: the softmax rules route ``softmax``
    chains to the library's softmax kernel, which does not compute it; with nll_loss it is ``cross_entropy``."""
    x = torch.randn(8, 4096)
    assert [c.pattern for c in _chains(_Call(lambda t: torch.log_softmax(t, -1)), x)[1]] == ["log_softmax"]
    assert [c.pattern for c in _chains(_Call(lambda t: torch.softmax(t, -1)), x)[1]] == ["softmax"]


class _Call(nn.Module):
    """A module whose forward is ``fn`` of its inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class Gathers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(100_000, 256))

    def forward(self, idx):
        rows = self.table[idx] + torch.index_select(self.table, 0, idx)
        return rows + torch.gather(self.table, 0, idx.view(-1, 1).expand(-1, 256))


def test_gathers_read_the_rows_they_select_and_fuse_with_their_consumers():
    """A fresh user's index_select, table[idx] and gather of 16 rows from a 4 GB table each read the whole table
    (960 us on the H200 for 64 KiB), and were called "not fusible by Inductor" (its code indexes them inside one
    fused kernel)."""
    og, chains = _chains(Gathers(), torch.zeros(16, dtype=torch.long))
    gathers = [o for o in og.ops if o.name in ("index", "index_select", "gather")]
    assert len(gathers) == 3
    out, index = 16 * 256 * 4, 16 * 8
    for o in gathers:
        assert o.category == "copy" and o.bytes_written == out
        assert o.bytes_read == out + (index if o.name != "gather" else 16 * 8)  # gather's expanded index: 16 int64
    (c,) = [c for c in chains if c.kind == "fusible"]
    assert {o.id for o in gathers} <= set(c.op_ids)
    assert c.fused_bytes == out + index + out  # the rows selected, the indices once, the output: not 100 MB


class MaskAndComplex(nn.Module):
    def forward(self, x, mask, z):
        return x[mask] * 2, z * z


def test_a_boolean_mask_index_and_complex_ops_fuse_with_nothing():
    """A boolean mask's output size depends on its values; Inductor runs ops on complex tensors as eager calls
    (a fresh user's complex multiply was routed to torch.compile for a saving that does not exist)."""
    from fusion_advisor.analyze.graph import _make_op

    g = torch.fx.Graph()  # dynamo breaks its graph at a mask: the aten op as an export would record it
    x, mask = g.placeholder("x"), g.placeholder("mask")
    node = g.call_function(torch.ops.aten.index.Tensor, (x, [mask]))
    x.meta["val"], mask.meta["val"] = torch.empty(64, 8), torch.empty(64, dtype=torch.bool)
    node.meta["val"] = torch.empty(40, 8)
    assert _make_op("g0:index", 0, node).category == "other"
    by_ints = g.call_function(torch.ops.aten.index.Tensor, (x, [g.placeholder("ids")]))
    by_ints.args[1][0].meta["val"], by_ints.meta["val"] = torch.empty(5, dtype=torch.long), torch.empty(5, 8)
    assert _make_op("g0:index_1", 0, by_ints).category == "copy"
    inputs = (torch.randn(64, 8), torch.ones(64, dtype=torch.bool), torch.randn(32, dtype=torch.complex64))
    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", MaskAndComplex(), inputs, "cpu", "")))
    complex_mul = [o for o in og.ops if o.name == "mul" and o.dtype == "c64"]
    assert complex_mul and all(o.category == "other" for o in complex_mul)


class ChunkedGate(nn.Module):
    def forward(self, h):
        g, u = h.chunk(2, -1)
        return F.silu(g) * u


class SameSliceTwice(nn.Module):
    def forward(self, h):
        return h[:, :64] * 2 + torch.sigmoid(h[:, :64])


class RotateFirstThird(nn.Module):  # rotary on q of a fused QKV: slices of one piece of a split
    def forward(self, qkv):
        q, k, v = qkv.chunk(3, -1)
        return q * 2 + torch.cat((-q[:, 32:], q[:, :32]), -1)


def test_a_fused_chain_reads_each_piece_of_a_split_input_once():
    """A fused SwiGLU over one projection's chunk(2) halves counted one half of its input (67 of 101 MB at 2048 x
    8192; a reviewer); counting every view node instead read one slice written twice twice, and rotary's halves of
    q on top of q (a second reviewer): the pieces of a split are summed, any other view reads the piece it is of."""
    nbytes = 32 * 128 * 4
    _, (gate,) = _chains(ChunkedGate(), torch.randn(32, 128))
    assert gate.fused_bytes == nbytes + nbytes // 2  # both halves read, the half-width product written
    _, (twice,) = _chains(SameSliceTwice(), torch.randn(32, 128))
    assert twice.fused_bytes == nbytes // 2 + nbytes // 2
    _, chains = _chains(RotateFirstThird(), torch.randn(32, 192))
    (rope,) = [c for c in chains if c.kind == "fusible"]
    assert rope.fused_bytes == 2 * nbytes // 2, rope  # q read once (a third of qkv), the output written
    _, (pw,) = _chains(Pointwise(), torch.randn(32, 128))
    assert pw.fused_bytes == 2 * nbytes  # one input read by several ops: once
