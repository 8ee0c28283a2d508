"""The gain of each route, predicted honestly: torch.compile and library kernels priced at the share of the roofline
their code reaches on the chain's kind (the spec's measured route_efficiency), CUDA graphs without the launch floor;
a model routed all-SKIP while torch.compile is predicted to gain is flagged."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from fusion_advisor.analyze.pipeline import analyze
from fusion_advisor.devices import load_spec, parse_spec
from fusion_advisor.errors import DeviceSpecError

MODELS = Path(__file__).parent / "data" / "models"
SOFTMAX = textwrap.dedent("""
    import torch

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)

    def get_inputs():
        return [torch.randn(8192, 32000, dtype=torch.bfloat16)]

    def get_init_inputs():
        return []
""")


@pytest.fixture(scope="module")
def softmax_analysis(tmp_path_factory):
    path = tmp_path_factory.mktemp("sm") / "softmax.py"
    path.write_text(SOFTMAX)
    return analyze(path)


def test_compile_and_library_routes_get_their_measured_share_of_the_roofline(softmax_analysis):
    a = softmax_analysis
    (chain,) = [c for c in a.chains if c.kind == "fusible"]
    est = a.estimates[chain.id]
    h200 = load_spec("h200")
    assert h200.efficiency("torch.compile", chain.pattern) == 0.43
    # memory-bound: the fused kernel's memory term over the route's share of copy bandwidth
    assert est.compile_us == pytest.approx(est.memory_fused_us / 0.43, rel=0.02)
    assert est.triton_us == pytest.approx(est.memory_fused_us / h200.efficiency("triton", chain.pattern), rel=0.02)
    assert est.fused_us < est.triton_us < est.compile_us < est.eager_us
    d = a.decisions[chain.id]
    assert d.route == "triton" and f"torch.compile {est.compile_us:.1f} us" in d.reason


def _softmax_of(tmp_path, expression: str):
    """The analysis of SOFTMAX with its softmax call replaced by ``expression``, its one chain and that chain's
    estimate, and the h200 spec."""
    path = tmp_path / "variant.py"
    path.write_text(SOFTMAX.replace("torch.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)", expression))
    a = analyze(path)
    (chain,) = a.chains
    return a, chain, a.estimates[chain.id], load_spec("h200")


def test_a_lone_kernel_the_library_replaces_is_priced_at_its_share_of_the_memory_roofline(tmp_path):
    """A lone wide-row softmax routed to the library kernel was priced at 100% of copy bandwidth (its 0.79 taken
    as a share of the compute roofline, meant for the fp32 GEMM alone): faster than the same kernel fused into a
    longer chain. Found by a reviewer."""
    a, chain, est, h200 = _softmax_of(tmp_path, "torch.softmax(x, dim=-1)")
    assert chain.kind == "fusible" and chain.eager_kernels == 1 and a.decisions[chain.id].route == "triton"
    share = h200.efficiency("triton", "softmax")
    assert share < 1.0
    assert est.triton_us == pytest.approx(est.memory_fused_us / share + h200.elementwise_overhead_us, rel=0.01)
    assert est.compile_us == est.eager_us  # Inductor's lone softmax is eager's kernel


def test_a_library_kernel_computing_part_of_a_chain_leaves_the_rest_as_written(tmp_path):
    """softmax(x * 0.125 + 1.0): the library's softmax folds no scale and no scalar add, so apply's swap leaves the
    multiply and the add as eager kernels. The chain was priced as if the kernel ran all of it (a reviewer's
    'layernorm' chain of eight ops read 69 -> 7.5 us); priced honestly, torch.compile (one fused kernel) is
    predicted faster."""
    a, chain, est, h200 = _softmax_of(tmp_path, "torch.softmax(x * 0.125 + 1.0, dim=-1)")
    softmax = [i for i in chain.op_ids if i.endswith("_softmax")]
    assert chain.pattern == "softmax" and chain.kernel_op_ids == tuple(softmax)
    assert chain.kernel_bytes == chain.fused_bytes  # the softmax reads one tensor and writes one, as the chain does
    kernel_us = chain.kernel_bytes / (h200.memory_bandwidth_gbps * 1e3) / h200.efficiency("triton", "softmax") \
        + h200.elementwise_overhead_us
    assert est.triton_us > kernel_us + 100.0  # plus the multiply and the add, each a pass over 1 GB
    assert est.compile_us < est.triton_us < est.eager_us
    # the route stays, a candidate apply measures (its candidates are the chains routed to a kernel, and the
    # kernel's share was measured at other shapes); the note gives the doubt (a reviewer: rerouting the chain to
    # torch.compile removed the swap from apply's search on 50 Swin chains, and routed lone kernels at 0 us saved)
    d = a.decisions[chain.id]
    assert (d.rule_id, d.route, d.kernel) == ("triton-softmax", "triton", "softmax")
    assert d.note == (f"predicted slower than torch.compile here ({est.triton_us:.1f} us against "
                      f"{est.compile_us:.1f} us; the kernel computes 1 op(s) of the chain, the rest run as written): "
                      f"kept as a candidate, apply measures the swap and keeps it only where it wins")


def test_the_advice_counts_a_doubted_kernel_at_eagers_time(tmp_path):
    """A lone LayerNorm on h100 stayed routed to the library kernel (a candidate apply measures) while predicted
    slower than eager, and the headline read "0.76x vs eager" (found by a fresh user): apply keeps a swap only
    where it measures faster, so the advice counts the chain at the faster of the two."""
    from fusion_advisor.report.write import chains_frame

    a, chain, est, _ = _softmax_of(tmp_path, "torch.softmax(x, dim=-1)")
    slower = dataclasses.replace(est, triton_us=est.eager_us * 1.5, compile_us=est.eager_us * 1.2)
    a.estimates[chain.id] = slower
    row = chains_frame(a).iloc[0]
    assert row["route"] == "triton" and row["est_triton_us"] == pytest.approx(slower.triton_us)
    assert row["est_after_route_us"] == pytest.approx(est.eager_us) and row["est_route_saving_us"] == 0
    # torch.compile predicted faster than the kernel (SwinMLP's LayerNorm chains, the kernel computing the
    # LayerNorm alone between window copies: the advice read 0.99x vs torch.compile(model)): counted at its time
    a.estimates[chain.id] = dataclasses.replace(slower, compile_us=est.eager_us * 0.5)
    row = chains_frame(a).iloc[0]
    assert row["route"] == "triton" and row["est_after_route_us"] == pytest.approx(est.eager_us * 0.5)


def test_the_fp32_gemm_kernels_rate_prices_fp32_gemms_alone(tmp_path):
    """The 3xTF32 kernel's 1.16 share of the fp32 peak priced a bf16 GEMM at 916 TFLOP/s on a 790 TFLOP/s spec
    (found by a fresh user): the library's GEMMs take fp32 alone."""
    path = tmp_path / "mm.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n"
                    "        return a @ b\n\ndef get_inputs():\n    return [torch.randn(4096, 4096), "
                    "torch.randn(4096, 4096)]\n\ndef get_init_inputs():\n    return []\n")
    for dtype, faster in (("fp32", True), ("bf16", False)):
        a = analyze(path, dtype=dtype)
        (chain,) = a.chains
        est = a.estimates[chain.id]
        assert (est.triton_us < est.eager_us) is faster and est.triton_us >= est.compute_us * (0.8 if faster else 1)


def test_a_library_kernel_without_a_measured_share_claims_no_edge_over_inductor():
    """The shipped H200 priced the linear cross-entropy forward, never measured, at the roofline: the default
    model's first opportunity read triton 33.1 us against torch.compile's 36.5, while the kernel's one measurement
    (forward and backward) ran 0.94-0.97x torch.compile (a fresh user)."""
    h200 = load_spec("h200")
    assert not h200.measured_efficiency("triton", "linear_cross_entropy")
    assert h200.efficiency("triton", "linear_cross_entropy") == h200.efficiency("torch.compile", "linear_cross_entropy")
    assert h200.measured_efficiency("triton", "softmax") and \
        h200.efficiency("triton", "softmax") > h200.efficiency("torch.compile", "softmax")


def test_a_spec_without_measured_shares_prices_routes_at_the_roofline():
    spec = dataclasses.replace(load_spec("h200"), route_efficiency={})
    assert spec.efficiency("torch.compile", "softmax") == 1.0 and spec.efficiency("triton", "rmsnorm") == 1.0


@pytest.mark.parametrize("table, message", [
    ({"inductor": {"softmax": 0.5}}, "unknown route 'inductor'"),
    ({"torch.compile": {"softmax": 2.0}}, "at most 1.5"),
    ({"torch.compile": {"softmax": -1}}, "positive number"),
    ({"torch.compile": 0.5}, "must map chain patterns"),
])
def test_bad_route_efficiency_is_refused_naming_the_field(table, message):
    base = {"name": "x", "memory_bandwidth_gbps": 1000, "tensor_tflops": {"bf16": 100}, "vector_tflops": {"bf16": 10},
            "launch_overhead_us": 5, "route_efficiency": table}
    with pytest.raises(DeviceSpecError, match=message):
        parse_spec(base, "spec.yaml")


def test_cuda_graph_route_drops_the_launch_floor():
    a = analyze(MODELS / "tiny_pointwise.py")
    (chain,) = [c for c in a.chains if c.kind == "fusible"]
    est = a.estimates[chain.id]
    # the rule routes it to CUDA graphs; one chain's replay saves less than a replay costs over a compiled call, so
    # the model's call compiles it (test_model_call.py)
    assert a.decisions[chain.id].rule_id == "cudagraphs-launch-bound"
    assert a.decisions[chain.id].route == "torch.compile"
    assert est.cudagraphs_us < est.compile_us <= est.eager_us  # the fused kernel's launch is gone in a graph
    assert est.route_us("cudagraphs") == est.cudagraphs_us and est.route_us("skip") == est.eager_us
    # but not its fixed device time: a tiny chain was once 0.1 us in a graph (a 337x "speed-up" over eager)
    from fusion_advisor.analyze.roofline import GRAPH_KERNEL_FLOOR_US

    assert est.cudagraphs_us >= GRAPH_KERNEL_FLOOR_US


def test_a_model_routed_all_skip_is_flagged_when_compile_is_predicted_to_gain(tmp_path):
    rules = tmp_path / "skip_all.yaml"
    rules.write_text("version: 1\nname: skip-all\nrules:\n  - id: skip-everything\n    match: {}\n    route: skip\n"
                     "    reason: \"left alone\"\n")
    path = tmp_path / "softmax.py"
    path.write_text(SOFTMAX)
    a = analyze(path, rules_files=[rules])
    assert all(d.route == "skip" for d in a.decisions.values())
    assert any(w.startswith("every chain is routed SKIP, but torch.compile is predicted to save") for w in a.warnings)
    assert not any(w.startswith("every chain is routed SKIP") for w in analyze(path).warnings)


def test_the_fp32_gemm_kernels_route_never_predicts_more_than_its_best_measured_speedup():
    """At its compute roofline alone the 3xTF32 kernel read 2.97x eager on a K = 32 bmm (measured 0.97x), and 1.85x
    on a host-bound 197-wide attention bmm (0.28x measured wall)."""
    from fusion_advisor.analyze.records import Chain, OpInfo, SourceLoc, TensorMeta
    from fusion_advisor.analyze.roofline import LIBRARY_GEMM_BEST_SPEEDUP, estimate
    from fusion_advisor.devices import load_spec

    spec = load_spec("h200")
    for b, m, n, k in ((8, 4096, 4096, 32), (80, 197, 197, 64), (1, 8192, 8192, 8192)):
        a_, b_ = TensorMeta((b, m, k), "fp32", b * m * k, 4 * b * m * k), TensorMeta((b, k, n), "fp32", b * k * n,
                                                                                    4 * b * k * n)
        out = TensorMeta((b, m, n), "fp32", b * m * n, 4 * b * m * n)
        op = OpInfo("g0:bmm", 0, "aten.bmm.default", "matmul", (a_, b_), (out,), 2 * b * m * n * k,
                    a_.nbytes + b_.nbytes, out.nbytes, "", SourceLoc("m.py", 1, "q @ k"))
        chain = Chain("c0", "heavy", (op.id,), (op.target,), "matmul", ("matmul",), "fp32", 1,
                      op.bytes_read + op.bytes_written, op.bytes_read + op.bytes_written, op.flops, out.numel, 0,
                      op.source, "", out_numel=out.numel)
        est = estimate(chain, {op.id: op}, spec)
        assert est.eager_us / est.triton_us <= LIBRARY_GEMM_BEST_SPEEDUP * (1 + 1e-9), (b, m, n, k)
    assert est.eager_us / est.triton_us > 1.3  # a large fp32 GEMM: the kernel's measured gain stands


def test_a_fused_kernels_launch_floor_is_priced_at_the_host_scale_of_the_eager_launches_it_replaces(tmp_path):
    """The fused kernel's floor was the bare launch overhead while each eager op paid it times the spec's in-model
    host_time_scale: two tiny ops read 27.4 -> 12.0 us, a saving beyond one in-model launch (a reviewer)."""
    path = tmp_path / "tiny.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                    "        return torch.relu(x * 2.0)\n\ndef get_inputs():\n    return [torch.randn(64)]\n\n"
                    "def get_init_inputs():\n    return []\n")
    a = analyze(path)
    h200 = load_spec("h200")
    assert h200.host_time_scale > 1.0
    (chain,) = [c for c in a.chains if c.kind == "fusible"]
    est = a.estimates[chain.id]
    one_launch = h200.launch_overhead_us * h200.host_time_scale
    assert est.compile_us == pytest.approx(one_launch) and est.eager_us == pytest.approx(2 * one_launch, rel=0.05)


def _conv_model(tmp_path, tail: str, bias: bool = True) -> Path:
    path = tmp_path / f"conv_{abs(hash((tail, bias)))}.py"
    path.write_text(textwrap.dedent(f"""
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(8, 64, 3, bias={bias})

            def forward(self, x):
                return {tail}

        def get_inputs():
            return [torch.rand(32, 8, 128, 128)]

        def get_init_inputs():
            return []
    """))
    return path


def test_inductor_peels_a_convolutions_bias_off_into_the_kernel_reading_it(tmp_path):
    """Inductor calls cuDNN without the bias and adds it in the Triton kernel that reads the output next
    (torch/_inductor/kernel/conv.py: "peel off the bias, cudnn is slower with it"): torch.compile(model) of
    KernelBench's convolution files was predicted a median 1.46x slow with the eager bias pass kept."""
    from fusion_advisor.report import views
    from fusion_advisor.report.write import chains_frame

    def conv_chain(a):
        return next(c for c in a.chains if "conv" in c.categories)

    h200 = load_spec("h200")
    a = analyze(_conv_model(tmp_path, "torch.relu(self.conv(x)) * 2.0"), gpu="h200")
    plain = analyze(_conv_model(tmp_path, "torch.relu(self.conv(x)) * 2.0", bias=False), gpu="h200")
    est, twin = a.estimates[conv_chain(a).id], plain.estimates[conv_chain(plain).id]
    # compiled, the biased convolution costs what the same convolution without a bias costs eagerly
    assert est.compile_us == pytest.approx(twin.eager_us, rel=1e-6) and est.compile_us < est.eager_us
    assert est.cudagraphs_us == pytest.approx(twin.eager_us, rel=1e-6)
    assert twin.compile_us == twin.eager_us  # nothing to peel
    # torch.compile(model) takes it, and so does the advice (rule compile-conv-bias): left to cuDNN, the advice had
    # read slower than torch.compile(model) on 49 of 51 level-2 KernelBench files with a convolution; the bias-free
    # twin stays with cuDNN
    frame = chains_frame(a)
    row = frame.index[frame["chain_id"] == conv_chain(a).id][0]
    assert views.predicted_compile_series(frame)[row] == pytest.approx(est.compile_us)
    d, d_twin = a.decisions[conv_chain(a).id], plain.decisions[conv_chain(plain).id]
    assert (d.route, d.rule_id) == ("torch.compile", "compile-conv-bias") and "without it" in d.reason
    assert (d_twin.route, d_twin.rule_id) == ("skip", "skip-conv")
    totals = views.predicted_totals(a, frame)
    assert totals["advised"] <= totals["compiled"] * 1.001
    # nothing pointwise reads the output alone (the model returns it): the add is a kernel of its own
    bare = analyze(_conv_model(tmp_path, "self.conv(x)"), gpu="h200")
    out = next(o for o in bare.ops if o.category == "conv").outputs[0].nbytes
    own_add = 2 * out / (h200.memory_bandwidth_gbps * 1e9) * 1e6 / h200.efficiency("torch.compile", "pointwise")
    assert bare.estimates[conv_chain(bare).id].compile_us == pytest.approx(twin.eager_us + own_add, rel=1e-6)
    # a softmax reading it: Inductor adds the bias in the softmax's kernel, as in a pointwise one (a reviewer: only a
    # pointwise consumer had counted)
    soft = analyze(_conv_model(tmp_path, "torch.softmax(self.conv(x), dim=1)"), gpu="h200")
    assert conv_chain(soft).output_fuses and not conv_chain(bare).output_fuses
    assert soft.estimates[conv_chain(soft).id].compile_us == pytest.approx(twin.eager_us, rel=1e-6)
    # a CPU spec (Inductor's CPU convolution keeps its bias): as written
    cpu = analyze(_conv_model(tmp_path, "torch.relu(self.conv(x)) * 2.0"), gpu="cpu")
    assert cpu.estimates[conv_chain(cpu).id].compile_us == cpu.estimates[conv_chain(cpu).id].eager_us


def test_a_host_bound_convolution_saves_nothing_by_losing_its_bias(tmp_path):
    """cuDNN is called as eagerly under torch.compile: a convolution whose host time outlasts its device time keeps
    it, and torch.compile(model) still issues it at its class's host cost, not one launch (a reviewer: ten tiny
    biased 1x1 convolutions read faster compiled than eager, their bias-free twins slower)."""
    from fusion_advisor.report import views
    from fusion_advisor.report.write import chains_frame

    path = tmp_path / "tiny_convs.py"
    path.write_text(textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.convs = torch.nn.ModuleList(torch.nn.Conv2d(8, 8, 1) for _ in range(4))

            def forward(self, x):
                for conv in self.convs:
                    x = conv(x)
                return x

        def get_inputs():
            return [torch.rand(1, 8, 8, 8)]

        def get_init_inputs():
            return []
    """))
    a = analyze(path, gpu="h200")
    convs = [c for c in a.chains if "conv" in c.categories]
    assert len(convs) == 4 and all(a.estimates[c.id].compile_us == a.estimates[c.id].eager_us for c in convs)
    routes = views.analysis_model_routes(a, chains_frame(a))
    assert routes["torch.compile"] >= routes["eager"] and routes["best"] != "torch.compile"


def test_a_pool_inductor_lowers_is_not_called_unfusible(tmp_path):
    """A fresh user: 35_Conv2d's subtract + hardswish chain was priced as read through the max pool (its
    prologue_of) while the pool's own reason said "not fusible by Inductor or our kernels"."""
    path = tmp_path / "pool.py"
    path.write_text(textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.nn.functional.max_pool2d(torch.relu(x - 0.5), 2)

        def get_inputs():
            return [torch.rand(16, 32, 64, 64)]

        def get_init_inputs():
            return []
    """))
    a = analyze(path, gpu="h200")
    pool = next(c for c in a.chains if c.pattern.startswith("max_pool2d"))
    feeder = next(c for c in a.chains if c.prologue_of == pool.id)
    d = a.decisions[pool.id]
    assert (d.rule_id, d.route) == ("skip-pool", "skip") and "not fusible" not in d.reason
    assert "reads its input through the pointwise ops before it" in d.reason and feeder.id != pool.id
