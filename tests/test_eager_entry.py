"""analyze --profile's graphs call BatchNorm through eager's entry point (aten.batch_norm), same values, same op ids."""

from __future__ import annotations

import operator

import torch

from fusion_advisor.analyze.capture import DynamoBackend, aten_hook
from fusion_advisor.analyze.eager_entry import OP_ID_META, call_eager_entries
from fusion_advisor.analyze.profile import aten_schedule


class _Norms(torch.nn.Module):
    """Eval BatchNorm 1-3d and InstanceNorm (affine and not): the captured graph calls PyTorch's native ops."""

    def __init__(self):
        super().__init__()
        self.bn, self.inorm = torch.nn.BatchNorm2d(4), torch.nn.InstanceNorm2d(4, affine=True)
        self.bn1, self.bn3, self.inorm_plain = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm3d(4), torch.nn.InstanceNorm2d(4)

    def forward(self, x):
        y = self.inorm(self.bn(x)) * 2
        return y + self.inorm_plain(x) + self.bn1(x.flatten(2)).view_as(x) + self.bn3(x.unsqueeze(2)).squeeze(2)


def _graphs(model, x, rewrite: bool):
    """Run ``model`` through the profile's capture, each aten graph rewritten (or not); its graphs and output."""
    seen = {}

    def fw(gm, example_inputs, i):
        before = [n.name for n in gm.graph.nodes if "batch_norm" in str(n.target)]
        seen[i] = (gm, before, call_eager_entries(gm, i) if rewrite else 0)
        return gm.forward

    with torch.no_grad():
        out = DynamoBackend(aten_hook(fw)).compile(model)(x)
    return seen, out


def test_batch_norms_run_through_aten_batch_norm_with_the_same_values():
    torch.manual_seed(0)
    model = _Norms().eval()
    for m in (model.bn, model.bn1, model.bn3):  # running statistics away from 0 and 1, so that using them shows
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 4, 6, 6) * 3 + 1
    with torch.no_grad():
        want = model(x)
    seen, got = _graphs(model, x, rewrite=True)
    (gm, before, done), = seen.values()
    assert len(before) == 5 and done == 5
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.batch_norm.default) == 5
    assert not any("_native_batch_norm" in str(t) for t in targets)
    assert operator.getitem not in targets  # the tuples' getitems went with them
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the schedule names the op eager code calls, under the captured node's op id
    schedule = aten_schedule(gm, 0, {f"g0:{name}" for name in before})
    rewritten = [(op_id, name) for op_id, name in schedule if name == "aten::batch_norm"]
    assert sorted(op_id for op_id, _ in rewritten) == sorted(f"g0:{name}" for name in before)
    assert all(n.meta[OP_ID_META].startswith("g0:") for n in gm.graph.nodes
               if n.target is torch.ops.aten.batch_norm.default)


def test_the_rewrite_passes_cudnn_as_eager_code_does_and_leaves_other_graphs_alone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    seen, _ = _graphs(model, torch.randn(2, 4), rewrite=True)
    assert [done for _, _, done in seen.values()] == [0]
    seen, _ = _graphs(torch.nn.BatchNorm2d(3).eval(), torch.randn(1, 3, 2, 2), rewrite=True)
    (gm, _, done), = seen.values()
    bn = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.batch_norm.default)
    assert done == 1 and bn.args[-1] is torch.backends.cudnn.enabled and bn.args[5] is False


def test_a_node_whose_saved_statistics_are_read_is_left_as_captured():
    g = torch.fx.Graph()
    x, w, b, m, v = (g.placeholder(n) for n in "xwbmv")
    bn = g.call_function(torch.ops.aten._native_batch_norm_legit_no_training.default, (x, w, b, m, v, 0.1, 1e-5))
    out, mean = (g.call_function(operator.getitem, (bn, i)) for i in (0, 1))
    g.output((out, mean))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert call_eager_entries(gm, 0) == 0
    assert bn in gm.graph.nodes
