"""TensorMeta layout: permuted views are told apart from contiguous tensors, broadcasts and slices; ops reading a
permuted view (RoPE on q = proj(x).view(...).transpose(1, 2)) are marked."""

from __future__ import annotations

import pytest
import torch

from fusion_advisor.analyze.pipeline import analyze
from fusion_advisor.analyze.graph import row_major_order, tensor_meta

X = torch.empty(2, 16, 4, 8)  # [B, S, H, D]

# (tensor, contiguous?, why): the grid covers each layout class the roofline distinguishes
LAYOUTS = [
    (X, True, "contiguous"),
    (X.transpose(1, 2), False, "transpose(1, 2): the [B, H, S, D] view of q/k/v"),
    (X.permute(0, 2, 3, 1), False, "permute"),
    (torch.empty(1, 16, 1, 8).expand(2, 16, 4, 8), True, "broadcast (stride-0 dims)"),
    (X[:, :8], True, "slice of the sequence"),
    (X[..., :4], True, "slice of the last dim: rows with gaps, still in order"),
    (X[1:], True, "offset view"),
    (X[..., ::2], False, "step slice: last-dim stride 2"),
    (torch.empty(4, 1, 8).transpose(0, 1), True, "a size-1 dim moved: same memory order"),
    (torch.empty(5), True, "1-D"),
    (torch.empty(()), True, "0-D"),
    (torch.empty(0, 3).t(), True, "empty"),
]


@pytest.mark.parametrize("t,want,why", LAYOUTS, ids=[c[2] for c in LAYOUTS])
def test_tensor_meta_contiguity(t, want, why):
    assert tensor_meta(t).contiguous is want, why
    assert row_major_order(tuple(t.shape), tuple(t.stride())) is want


def test_broadcast_bytes_unchanged():
    m = tensor_meta(torch.empty(1, 16, 1, 8).expand(2, 16, 4, 8))
    assert m.nbytes == 16 * 8 * 4 and m.numel == 2 * 16 * 4 * 8


def test_rope_ops_read_a_permuted_view(tmp_path):
    model = tmp_path / "rope.py"
    model.write_text(
        "import torch\n"
        "class Model(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.proj = torch.nn.Linear(256, 256, bias=False)\n"
        "    def forward(self, x, cos):\n"
        "        q = self.proj(x).view(2, 64, 4, 64).transpose(1, 2)\n"
        "        half = torch.cat((-q[..., 32:], q[..., :32]), dim=-1)\n"
        "        return q * cos + half * cos\n"
        "def get_inputs(): return [torch.randn(2, 64, 256), torch.randn(64, 64)]\n"
        "def get_init_inputs(): return []\n")
    a = analyze(model, device="meta", dtype="bf16")
    by_name = {o.target: o for o in a.ops}
    mm = next(o for o in a.ops if o.category == "matmul")
    assert mm.reads_permuted and not mm.inputs[1].contiguous  # F.linear reads W.t(): cuBLAS takes it as is
    neg = by_name["aten.neg.default"]
    assert neg.reads_permuted  # reads q[..., 32:], a slice of the permuted view
    muls = [o for o in a.ops if o.target == "aten.mul.Tensor"]
    assert muls and any(o.reads_permuted for o in muls)


def test_ops_launching_several_kernels_count_them():
    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.graph import MULTI_KERNEL_OPS, build_op_graph
    from fusion_advisor.analyze.load import LoadedModel

    class M(torch.nn.Module):
        def forward(self, ids, x):
            rolled = torch.roll(x, (1, 2), (0, 1)) + torch.roll(x, 1, 0)
            padded, cropped = torch.nn.functional.pad(x, (1, 1)), torch.nn.functional.pad(x, (-1, 0))
            filled = (x * 3).masked_fill_(x < 0, 1.0)  # in place: one kernel, though the graph reads masked_fill
            return (ids.cumsum(-1), x[ids[0]] * 2, torch.logsumexp(x, 1), x.masked_fill(x > 0, 0.0), padded,
                    rolled, cropped, filled)

    inputs = (torch.zeros(2, 16, dtype=torch.long), torch.randn(32, 8))
    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", M(), inputs, "cpu", "")))
    kernels = {o.target.split(".")[1]: o.eager_kernels for o in og.ops if o.target.startswith("aten.")}
    assert kernels["cumsum"] == MULTI_KERNEL_OPS["cumsum"] == 2 and kernels["index"] == 2 and kernels["mul"] == 1
    # amax, abs, eq, masked_fill_, sub, exp_, sum, log_, add_ (ReduceOps.cpp); clone + fill; fill + copy
    assert kernels["logsumexp"] == 9
    # the out-of-place masked_fill and a positive pad 2 each; the in-place masked_fill_ and a crop (clone) 1
    assert sorted(o.eager_kernels for o in og.ops if o.target.startswith("aten.masked_fill")) == [1, 2]
    assert sorted(o.eager_kernels for o in og.ops if o.target.startswith("aten.constant_pad_nd")) == [1, 2]
    assert sorted(o.eager_kernels for o in og.ops if o.target.startswith("aten.roll")) == [1, 2]  # one per dim


@pytest.mark.parametrize("layer, shape, window", [
    (torch.nn.MaxPool2d(3, 2, 1), (1, 2, 16, 16), 9),
    (torch.nn.AvgPool1d(8, 1, 4), (1, 2, 64), 8),  # run as avg_pool2d with a [1, 8] kernel
    (torch.nn.MaxPool3d(3, 2, 1, dilation=2), (1, 1, 16, 16, 16), 27),  # dilation spreads the window
    (torch.nn.AvgPool3d((2, 3, 1)), (1, 1, 8, 9, 8), 6),
    (torch.nn.AdaptiveAvgPool2d(4), (1, 2, 16, 16), 0),  # no kernel size: priced by its bytes
])
def test_pooling_ops_record_their_window(layer, shape, window):
    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.graph import build_op_graph
    from fusion_advisor.analyze.load import LoadedModel

    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", layer, (torch.randn(shape),), "cpu", "")))
    pools = [o for o in og.ops if "pool" in o.target]
    assert pools and pools[0].window_elems == window
    assert all(o.window_elems == 0 for o in og.ops if "pool" not in o.target)


def test_aten_linear_kept_whole_is_a_matmul_with_its_flops_and_measured_price():
    """An export keeps ``aten.linear`` whole (analyze falls back to it when dynamo captures nothing): it is a GEMM
    of numel(x) / K rows, not an "other" op of one FLOP per output (a fresh user's encoder with a float src_mask)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusion_advisor.analyze.graph import _make_op
    from fusion_advisor.analyze.roofline import measured_matmul_us
    from fusion_advisor.devices import load_spec
    from fusion_advisor.devices.op_rates import matmul_time_us

    g = torch.fx.Graph()
    x, w, b = g.placeholder("x"), g.placeholder("w"), g.placeholder("b")
    lin = g.call_function(torch.ops.aten.linear.default, (x, w, b))
    with FakeTensorMode():
        vals = (torch.empty(4, 64, 256), torch.empty(1024, 256), torch.empty(1024))
        for node, v in zip((x, w, b), vals, strict=True):
            node.meta["val"] = v
        lin.meta["val"] = torch.empty(4, 64, 1024)
    op = _make_op("g0:linear", 0, lin)
    assert op.category == "matmul" and op.flops == 2 * 4 * 64 * 1024 * 256
    h200 = load_spec("h200")
    # priced as nn.Linear runs it: B the weight's transposed view (layout nt)
    assert measured_matmul_us(op, h200) == pytest.approx(
        matmul_time_us(h200.matmul_rates, "mm", 4 * 64, 1024, 256, 1, "fp32", "nt"))
    assert measured_matmul_us(op, h200) != pytest.approx(
        matmul_time_us(h200.matmul_rates, "mm", 4 * 64, 1024, 256, 1, "fp32", "nn"))


class _Call(torch.nn.Module):
    def __init__(self, fn, *modules):
        super().__init__()
        self.fn, self.mods = fn, torch.nn.ModuleList(modules)

    def forward(self, *xs):
        return self.fn(self.mods, *xs)


@pytest.mark.parametrize("fn, modules, shapes", [
    (lambda m, x: m[0](x), [torch.nn.Conv1d(4, 6, 3)], [(2, 4, 16)]),
    (lambda m, x: m[0](x), [torch.nn.Conv2d(4, 6, 3, stride=2, groups=2)], [(2, 4, 16, 16)]),
    (lambda m, x: m[0](x), [torch.nn.Conv3d(4, 6, 3)], [(1, 4, 6, 6, 6)]),
    (lambda m, x: m[0](x), [torch.nn.ConvTranspose1d(4, 6, 3, stride=2)], [(2, 4, 16)]),
    (lambda m, x: m[0](x), [torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1)], [(2, 4, 8, 8)]),
    (lambda m, x: m[0](x), [torch.nn.ConvTranspose3d(4, 6, 3)], [(1, 4, 4, 4, 4)]),
    (lambda m, a, b: torch.matmul(a, b), [], [(3, 8, 16), (16, 5)]),
    (lambda m, a, b: a @ b, [], [(2, 3, 8, 16), (2, 3, 16, 5)]),
    (lambda m, a, b: torch.einsum("bij,bjk->bik", a, b), [], [(3, 8, 16), (3, 16, 5)]),
])
def test_ops_an_export_keeps_whole_count_their_flops(fn, modules, shapes):
    """An export keeps composite ops whole that dynamo's graphs lower (``aten.conv2d``, ``aten.conv_transpose2d``,
    ``aten.matmul``, ``aten.einsum``, ``aten.scaled_dot_product_attention``); analyze falls back to an export when
    dynamo fails (on the meta device, a ``torch.tensor(..., device=x.device)`` in forward). Each keeps the FLOPs
    ``torch.utils.flop_counter`` counts for the call run eagerly, not 0 (KernelBench level-2 ConvTranspose2d +
    Min: 0 FLOPs for a 137 GFLOP convolution, so a compute-heavy chain read as memory-bound)."""
    from torch.utils.flop_counter import FlopCounterMode

    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.graph import HEAVY, build_op_graph
    from fusion_advisor.analyze.load import LoadedModel

    model = _Call(fn, *modules).eval()
    inputs = tuple(torch.randn(s) for s in shapes)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    cap = capture(LoadedModel("m", "<test>", "test", model, inputs, "cpu", ""), methods=("export",))
    heavy = [o for o in build_op_graph(cap).ops if o.category in HEAVY]
    assert len(heavy) == 1, [o.target for o in heavy]
    assert counter.get_total_flops() > 0 and heavy[0].flops == counter.get_total_flops()


def test_exported_attention_counts_its_flops():
    """``aten.scaled_dot_product_attention`` kept whole by an export: QK^T and PV, 2 FLOPs per multiply-add (the
    flop counter counts none for the CPU kernel eager runs, so the count is written out)."""
    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.graph import build_op_graph
    from fusion_advisor.analyze.load import LoadedModel

    model = _Call(lambda m, q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    inputs = (torch.randn(2, 4, 32, 16), torch.randn(2, 4, 24, 16), torch.randn(2, 4, 24, 8))
    cap = capture(LoadedModel("m", "<test>", "test", model, inputs, "cpu", ""), methods=("export",))
    (op,) = [o for o in build_op_graph(cap).ops if o.category == "attention"]
    assert op.flops == 2 * 2 * 4 * 32 * 24 * (16 + 8)


def test_elementwise_min_and_max_are_pointwise_not_reductions():
    """``torch.min(x, y)`` is ``aten.min.other`` in an export (``aten.minimum`` in dynamo's graphs): elementwise, so
    it fuses into its neighbours' chain; ``aten.min.dim`` and ``aten.max.default`` reduce."""
    from fusion_advisor.analyze.graph import categorize

    aten = torch.ops.aten
    assert categorize(aten.min.other) == categorize(aten.max.other) == categorize(aten.minimum.default) == "pointwise"
    assert categorize(aten.min.dim) == categorize(aten.max.default) == categorize(aten.amax.default) == "reduction"


@pytest.mark.parametrize("equation, shapes, flops", [
    ("ij,jk->ik", [(4, 5), (5, 6)], 2 * 4 * 5 * 6),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 6)], 2 * 3 * 4 * 5 * 6),
    ("i,i->", [(7,), (7,)], 2 * 7),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], 2 * 2 * 3 * 4 + 2 * 2 * 4 * 5),  # left to right: (ij,jk)->ik, then kl
    ("bij,bjk->bik", [(1, 4, 5), (3, 5, 6)], 2 * 3 * 4 * 5 * 6),  # a broadcast batch
    ("...ij,...jk->...ik", [(3, 4, 5), (3, 5, 6)], 0),  # an ellipsis: not read
    ("ij,jk", [(4, 5), (5, 6)], 0),  # no output subscripts: not read
    ("ij,jk->ik", [(4, 5), (7, 6)], 0),  # sizes disagree
])
def test_einsum_flops(equation, shapes, flops):
    from fusion_advisor.analyze.graph import einsum_flops

    assert einsum_flops(equation, shapes) == flops


@pytest.mark.parametrize("shapes, how", [
    ([(3, 8, 16), (16, 5)], ("mm", 24, 5, 16, 1)),  # folded to one mm of 24 rows, as torch.matmul runs it
    ([(2, 3, 8, 16), (2, 3, 16, 5)], ("bmm", 8, 5, 16, 6)),
])
def test_exported_matmul_priced_from_the_measured_table(shapes, how):
    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.graph import build_op_graph
    from fusion_advisor.analyze.load import LoadedModel
    from fusion_advisor.analyze.roofline import measured_matmul_us
    from fusion_advisor.devices import load_spec
    from fusion_advisor.devices.op_rates import matmul_time_us

    model = _Call(lambda m, a, b: torch.matmul(a, b))
    inputs = tuple(torch.randn(s) for s in shapes)
    cap = capture(LoadedModel("m", "<test>", "test", model, inputs, "cpu", ""), methods=("export",))
    (op,) = [o for o in build_op_graph(cap).ops if o.category == "matmul"]
    assert op.target == "aten.matmul.default"
    h200 = load_spec("h200")
    cls, m, n, k, batch = how
    assert measured_matmul_us(op, h200) == pytest.approx(
        matmul_time_us(h200.matmul_rates, cls, m, n, k, batch, "fp32", "nn"))


def test_module_paths_keep_a_module_passed_as_an_argument_apart_from_selfs():
    # dynamo names a module by the forward argument that holds it: L['self'].fc is the model's, L['adapter'].fc a
    # module the caller passed in; stripping every such name made the two one key (a reviewer's finding)
    from types import SimpleNamespace

    from fusion_advisor.analyze.graph import module_path_of

    def path(p):
        return module_path_of(SimpleNamespace(meta={"nn_module_stack": {"k": (p, object)}}))

    assert path("L['self'].blocks[0].attn") == "blocks.0.attn" and path("L['self']") == ""
    assert path("L__self___fc") == "fc" and path("L['adapter'].fc") != path("L['self'].fc")


def test_a_vector_norm_reduces_the_dims_it_names_not_its_order(tmp_path):
    """linalg_vector_norm(x, ord, dim): its second argument, the order, read as the reduced dims, so NetVLAD's norm
    over dim 1 of a (2048, 512, 32) tensor was priced as a last-dim reduction at 85 us against 44 measured on the
    H200 (a reviewer)."""
    from fusion_advisor.analyze.pipeline import analyze

    path = tmp_path / "norms.py"
    path.write_text("import torch\nimport torch.nn.functional as F\n\nclass Model(torch.nn.Module):\n"
                    "    def forward(self, x):\n        return F.normalize(x, dim=1), torch.linalg.vector_norm(x, 2, dim=-1)"
                    "\n\ndef get_inputs():\n    return [torch.randn(64, 512, 32)]\n\ndef get_init_inputs():\n"
                    "    return []\n")
    a = analyze(path)
    norms = [o for o in a.ops if o.target.startswith("aten.linalg_vector_norm")]
    assert [(o.reduction_elems, o.reduces_last_dim) for o in norms] == [(512, False), (32, True)], norms


def test_matrix_vector_and_dot_products_count_their_flops(tmp_path):
    """mv, dot and addmv are not in torch's flop_registry: they counted 0 FLOPs, an arithmetic intensity of 0 and
    no compute term (a reviewer)."""
    from fusion_advisor.analyze.pipeline import analyze

    path = tmp_path / "mv.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, a, v, b):\n"
                    "        return torch.mv(a, v), torch.dot(v, v), torch.addmv(b, a, v)\n\n"
                    "def get_inputs():\n    return [torch.randn(256, 512), torch.randn(512), torch.randn(256)]\n\n"
                    "def get_init_inputs():\n    return []\n")
    ops = [o for o in analyze(path, device="cpu").ops if o.category == "matmul"]
    flops = {o.target.split(".")[1]: o.flops for o in ops}
    assert flops == {"mv": 2 * 256 * 512, "dot": 2 * 512, "addmv": 2 * 256 * 512}, flops
    empty = tmp_path / "mv0.py"  # an empty matrix: no FLOPs (a reviewer: 8192)
    empty.write_text(path.read_text().replace("torch.randn(256, 512)", "torch.randn(0, 512)").replace(
        "torch.randn(256)]", "torch.randn(0)]"))
    assert all(o.flops == 0 for o in analyze(empty, device="cpu").ops if o.target.split(".")[1] in ("mv", "addmv"))
    # and a matrix-vector product is priced as one, from the table's matrix-vector entries
    from fusion_advisor.analyze.matmul_shapes import matmul_problem
    from fusion_advisor.analyze.roofline import price_source
    from fusion_advisor.devices import load_spec

    h200 = load_spec("h200")
    for o in ops:
        if o.target.split(".")[1] in ("mv", "addmv"):
            assert matmul_problem(o) == ("mm", 256, 1, 512, 1, "fp32", "nn")
            assert price_source(o, h200).startswith("matmul table (matrix-vector stream)")


def test_an_embedding_bag_reads_the_rows_of_every_index():
    """nn.EmbeddingBag writes one row per bag but gathers a row per index: its bytes read counted the output alone,
    42x under for 4096 bags of 50 ids of 512 floats (a reviewer)."""
    import torch

    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.graph import build_op_graph
    from fusion_advisor.analyze.load import LoadedModel

    ids = torch.randint(0, 1000, (32, 10))
    for frozen in (False, True):  # frozen weights (inference) dispatch _embedding_bag_forward_only (a reviewer)
        bag = torch.nn.EmbeddingBag(1000, 64, mode="sum").eval().requires_grad_(not frozen)
        og = build_op_graph(capture(LoadedModel("m", "<test>", "test", bag, (ids,), "cpu", "")))
        (op,) = [o for o in og.ops if o.category == "embedding"]
        assert op.bytes_read >= 32 * 10 * 64 * 4 + ids.numel() * 8, op.bytes_read
        assert op.flops == 32 * 10 * 64


def test_an_op_reading_one_tensor_twice_reads_it_once():
    """`x * x` counted x's bytes twice (a reviewer): the second load of each element hits the cache."""
    import torch

    from fusion_advisor.analyze.capture import capture
    from fusion_advisor.analyze.graph import build_op_graph
    from fusion_advisor.analyze.load import LoadedModel

    class Square(torch.nn.Module):
        def forward(self, x, y):
            return x * x + y

    x, y = torch.randn(64, 128), torch.randn(64, 128)
    og = build_op_graph(capture(LoadedModel("m", "<test>", "test", Square(), (x, y), "cpu", "")))
    mul, add = [o for o in og.ops if not o.is_view]
    assert mul.bytes_read == x.nbytes and add.bytes_read == 2 * x.nbytes


def test_batch_and_group_norms_reduce_what_their_statistics_cover(tmp_path):
    """BatchNorm and GroupNorm were given the last dim's width as their rows (a reviewer): an eval BatchNorm is a
    per-channel affine map (no reduction; Inductor fuses it with a following ReLU and spatial mean into one
    reduction kernel), training BatchNorm and InstanceNorm reduce each channel over the batch and spatial dims,
    GroupNorm each sample's group over C / groups x spatial."""
    from fusion_advisor.analyze.pipeline import analyze

    path = tmp_path / "norms.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.eval_bn, self.gn, self.inorm = nn.BatchNorm2d(32), nn.GroupNorm(4, 32), nn.InstanceNorm2d(32)\n"
        "    def forward(self, x):\n"
        "        head = torch.relu(self.eval_bn(x)).mean(dim=(2, 3))\n"
        "        batch_stats = nn.functional.batch_norm(x, None, None, training=True)\n"
        "        return head, batch_stats, self.gn(x), self.inorm(x)\n\n"
        "def get_inputs():\n    return [torch.randn(8, 32, 16, 24)]\n\ndef get_init_inputs():\n    return []\n")
    a = analyze(path)
    norms = {o.module_path or o.source.line: o for o in a.ops if o.category == "normalization"}
    assert norms["eval_bn"].reduction_elems == 0  # analyze runs the model in eval mode
    train_bn = norms[10]  # the functional call's line
    assert train_bn.reduction_elems == 8 * 16 * 24 and not train_bn.reduces_last_dim
    assert norms["gn"].reduction_elems == 8 * 16 * 24  # 32 / 4 channels x 16 x 24
    assert norms["inorm"].reduction_elems == 16 * 24
    # the eval BatchNorm, its ReLU and the spatial mean: one chain, one kernel, as Inductor runs them
    head = next(c for c in a.chains if "eval_bn" in {a_op.module_path for a_op in a.ops if a_op.id in c.op_ids})
    assert {t.split(".")[1] for t in head.targets} >= {"_native_batch_norm_legit_no_training", "relu", "mean"}
    assert head.row_elems == 16 * 24


def test_reductions_of_equal_width_over_different_axes_do_not_share_a_chain(tmp_path):
    """A training BatchNorm (per channel, over batch and spatial dims) then a GroupNorm (per sample and group) read
    as one chain where the batch equalled the channels per group, both rows 3072 wide (a reviewer): Inductor needs
    the batch statistics before the groups'. A 2-D training BatchNorm reduces dim 0, not the last."""
    from fusion_advisor.analyze.pipeline import analyze

    path = tmp_path / "bn_gn.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\nclass Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.gn = nn.GroupNorm(4, 32)\n"
        "    def forward(self, x, v):\n"
        "        y = torch.relu(F.batch_norm(x, None, None, training=True))\n"
        "        return self.gn(y), F.batch_norm(v, None, None, training=True)\n\n"
        "def get_inputs():\n    return [torch.randn(8, 32, 16, 24), torch.randn(16, 64)]\n\n"
        "def get_init_inputs():\n    return []\n")
    a = analyze(path)
    rows = {o.id: o for o in a.ops if o.category == "normalization"}
    assert sorted(o.reduction_elems for o in rows.values()) == [16, 3072, 3072]
    flat = next(o for o in rows.values() if o.reduction_elems == 16)
    assert not flat.reduces_last_dim  # its statistics run over the 16 rows
    chain_of = {i: c.id for c in a.chains for i in c.op_ids}
    bn, gn = (next(i for i, o in rows.items() if t in o.target and o.reduction_elems == 3072)
              for t in ("batch_norm", "group_norm"))
    assert chain_of[bn] != chain_of[gn]
