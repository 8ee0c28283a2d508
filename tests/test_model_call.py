"""The model's call weighed against the chains' routes (fusion_advisor/analyze/model_call.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from fusion_advisor.analyze.model_call import ChainCall, HostCalls, advised_us, call_parts, weigh_model_call
from fusion_advisor.analyze.records import Decision, Estimate

# an H100-like host: a launch 10 us, a compiled call 30, a CUDA-graph tree's replay 80 (the measured ratios of
# benchmarks/results/h100/host/compiled_call_probe.json: about 4 and 8 eager adds)
CALLS = HostCalls(launch_us=10.0, compiled_call_us=30.0, graph_replay_us=80.0)


def _est(eager: float, compiled: float, graphed: float, host: float | None = None) -> Estimate:
    return Estimate(compute_us=0.0, memory_eager_us=0.0, memory_fused_us=0.0,
                    launch_eager_us=eager if host is None else host, eager_us=eager, fused_us=compiled,
                    saving_us=eager - compiled, ridge_point=1.0, bound="launch", peak_tflops=1.0,
                    compile_us=compiled, cudagraphs_us=graphed)


def _model(routes: list[str], est: list[Estimate], graphs: list[int] | None = None, kinds: list[str] | None = None):
    chains = [SimpleNamespace(id=f"c{i}", graph_index=(graphs or [0] * len(routes))[i],
                              kind=(kinds or ["fusible"] * len(routes))[i]) for i in range(len(routes))]
    decisions = {c.id: Decision(c.id, r, "k" if r == "triton" else "", f"rule-{r}", "rules.yaml", f"why {r}",
                                "launch", f"note {r}") for c, r in zip(chains, routes, strict=True)}
    return chains, {c.id: e for c, e in zip(chains, est, strict=True)}, decisions


def test_one_launch_bound_chain_is_compiled_rather_than_replayed():
    # five launches (50 us) fused to one: compiled 30 + 10 us, replayed 80 us (the replay's host time)
    chains, est, dec = _model(["cudagraphs"], [_est(50.0, 10.0, 1.0)])
    out = weigh_model_call(chains, est, dec, CALLS)
    d = out["c0"]
    assert d.route == "torch.compile" and d.rule_id == "rule-cudagraphs"
    assert d.reason.startswith("compiled instead of replayed from CUDA graphs")
    assert "the rules' routes 80.0 us, CUDA-graph routes compiled instead 40.0 us, as written 50.0 us" in d.reason
    assert d.reason.endswith("The rule's reason for its cudagraphs route: why cudagraphs")
    assert dec["c0"].route == "cudagraphs"  # the input is not changed


def test_many_launch_bound_chains_keep_their_cuda_graph_routes():
    # twelve such chains: 12 launches compiled (120 + 30 us) against one replay (80 us)
    chains, est, dec = _model(["cudagraphs"] * 12, [_est(50.0, 10.0, 1.0)] * 12)
    assert weigh_model_call(chains, est, dec, CALLS) == dec


def test_routes_that_save_less_than_the_call_costs_are_left_as_written():
    # a GEMM left to cuBLAS (20 us) and a one-op chain compiled (10 -> 9 us): the compiled call costs 30 us
    chains, est, dec = _model(["skip", "torch.compile"], [_est(20.0, 20.0, 20.0), _est(10.0, 9.0, 2.0)])
    out = weigh_model_call(chains, est, dec, CALLS)
    assert [d.route for d in out.values()] == ["skip", "skip"]
    assert out["c0"] is dec["c0"]  # unchanged where the route was already skip
    assert out["c1"].reason.startswith("left as written: carrying the routes out costs the model's call more")
    # a CUDA-graph chain whose compiled code gains nothing is left as written when its replay does not pay
    chains, est, dec = _model(["cudagraphs", "torch.compile"], [_est(12.0, 12.0, 1.0), _est(60.0, 10.0, 2.0)])
    out = weigh_model_call(chains, est, dec, CALLS)
    assert out["c0"].route == "skip" and "Inductor's code is predicted no faster than eager" in out["c0"].reason
    assert out["c1"].route == "torch.compile"


def test_device_work_that_outlasts_the_call_hides_it():
    # a long chain: the host's part (one replay) hides under 2 ms of device time; the rules' routes stay
    chains, est, dec = _model(["cudagraphs", "skip"], [_est(50.0, 10.0, 1.0), _est(2000.0, 2000.0, 2000.0, 10.0)])
    assert weigh_model_call(chains, est, dec, CALLS) == dec
    assert advised_us([ChainCall("cudagraphs", 1.0, 50.0), ChainCall("skip", 2000.0, 10.0)], CALLS) == \
        pytest.approx(2001.0)


def test_each_graph_pays_its_own_call():
    # a replay where a graph holds a CUDA-graph chain, a compiled call where it holds another routed chain,
    # nothing where nothing is routed (a reviewer: a replay for every graph as soon as one was graphed)
    chains = [ChainCall("cudagraphs", 1.0, 50.0, graph=0), ChainCall("torch.compile", 5.0, 30.0, graph=1),
              ChainCall("skip", 5.0, 20.0, graph=2)]
    assert call_parts(chains, CALLS) == (pytest.approx(11.0), pytest.approx(80.0 + 10.0 + 30.0 + 20.0))
    assert call_parts(chains[1:], CALLS)[1] == pytest.approx(10.0 + 30.0 + 20.0)
    # torch.compile(model) compiles every graph, each a call
    many = HostCalls(10.0, 30.0, 80.0, graphs=3)
    assert call_parts(chains[1:], many, every_graph_compiled=True)[1] == pytest.approx(10.0 + 20.0 + 3 * 30.0)
    # a heavy item compiled is still called as eagerly (cuBLAS, cuDNN); a library kernel is one launch
    assert ChainCall("torch.compile", 5.0, 25.0, heavy=True).issue_us(10.0) == 25.0
    assert ChainCall("triton", 5.0, 25.0, heavy=True).issue_us(10.0) == 10.0
    # eight launch-bound chains in one graph keep their replay beside a chain left eager in another graph
    chains, est, dec = _model(["cudagraphs"] * 8 + ["skip"], [_est(50.0, 10.0, 1.0)] * 8 + [_est(20.0, 20.0, 20.0)],
                              graphs=[0] * 8 + [1])
    assert weigh_model_call(chains, est, dec, CALLS) == dec


def test_a_graph_the_rules_graph_a_chain_of_is_replayed_whole():
    # four launch-bound GEMMs left to cuBLAS between four chains routed to CUDA graphs, in one captured graph, beside
    # a GEMM of another graph (20 us) and a recurrent layer (300 us): the rules' routes pay the four GEMMs' launches
    # beside the replay (host 80 + 80 + 20 + 300 = 480 us), the compiled way 470 us, the graph replayed whole 400 us
    # (a fresh user: VanillaRNNHidden advised 1.55x against reduce-overhead's predicted 5.83x). The other graph's
    # GEMM and the recurrent layer (dynamo breaks the graph there) stay as the rules have them.
    routes = ["skip", "cudagraphs"] * 4 + ["skip", "skip"]
    est = [_est(20.0, 20.0, 2.0), _est(30.0, 10.0, 1.0)] * 4 + [_est(20.0, 20.0, 2.0), _est(300.0, 300.0, 300.0)]
    chains, est, dec = _model(routes, est, graphs=[0] * 8 + [1, 0], kinds=["heavy", "fusible"] * 4 + ["heavy"] * 2)
    chains[9].pattern = "recurrent"
    out = weigh_model_call(chains, est, dec, CALLS)
    assert [out[f"c{i}"].route for i in range(10)] == ["cudagraphs"] * 8 + ["skip", "skip"]
    assert out["c1"] is dec["c1"] and out["c8"] is dec["c8"] and out["c9"] is dec["c9"]
    why = out["c0"].reason
    assert why.startswith("replayed from CUDA graphs with the chains the rules graph in its captured graph")
    assert ("the rules' routes 480.0 us, CUDA-graph routes compiled instead 470.0 us, graphs with a replayed chain "
            "replayed whole 400.0 us, every graph replayed 460.0 us, as written 520.0 us") in why
    assert why.endswith("The rule's reason for its skip route: why skip")


def test_the_replayed_way_moves_compiled_and_eager_chains_only():
    # in one graph beside a chain the rules graph: a GEMM and a compiled chain join the replay; a library kernel
    # keeps its route (apply replays its region with the graph's, and call_parts charges it no launch there); a
    # chain a profile's measured bound decided stays as it is; a recurrent layer and what follows it in its graph
    # stay (torch.compile runs them as written)
    routes = ["skip", "torch.compile", "triton", "cudagraphs", "skip", "skip", "torch.compile"]
    est = [_est(20.0, 20.0, 2.0), _est(30.0, 10.0, 1.0), _est(30.0, 10.0, 1.0), _est(30.0, 10.0, 1.0),
           _est(20.0, 20.0, 2.0), _est(300.0, 300.0, 300.0), _est(30.0, 10.0, 1.0)]
    est[2] = dataclasses.replace(est[2], triton_us=1.0)
    chains, est, dec = _model(routes, est * 1, kinds=["heavy", "fusible", "fusible", "fusible", "heavy", "heavy",
                                                       "fusible"])
    chains[5].pattern = "recurrent"
    dec["c4"] = dataclasses.replace(dec["c4"], fixed=True)
    out = weigh_model_call(chains, est, dec, CALLS)
    assert [out[f"c{i}"].route for i in range(7)] == ["cudagraphs", "cudagraphs", "triton", "cudagraphs", "skip",
                                                      "skip", "torch.compile"]
    assert out["c2"] is dec["c2"] and out["c4"] is dec["c4"] and out["c6"] is dec["c6"]
    assert call_parts([ChainCall("triton", 1.0, 30.0), ChainCall("cudagraphs", 1.0, 30.0)], CALLS)[1] == 80.0
    # a chain a user's rule sent to torch.compile is not replayed with its graph (apply.search._region_executors):
    # it pays its launch, a compiled call, and the replay it splits in two (a reviewer)
    own = [ChainCall("torch.compile", 1.0, 30.0, fixed=True), ChainCall("cudagraphs", 1.0, 30.0)]
    assert call_parts(own, CALLS)[1] == pytest.approx(10.0 + 30.0 + 2 * 80.0)


def test_a_host_bound_model_no_rule_graphed_is_replayed_whole_on_a_gpu():
    # a fresh user: twelve Linear + ReLU layers, the GEMMs left to cuBLAS, each ReLU compiled as the GEMM's
    # epilogue; no rule graphed a chain, so the advice read "leave this model as it is" beside a predicted
    # reduce-overhead 5.16x. The rules' routes: host 12 x 20 + 12 x 10 + 30 = 390 us; replayed whole: 80 us
    chains, est, dec = _model(["skip", "torch.compile"] * 12, [_est(20.0, 20.0, 2.0), _est(15.0, 5.0, 1.0)] * 12,
                              kinds=["heavy", "fusible"] * 12)
    out = weigh_model_call(chains, est, dec, CALLS)
    assert {d.route for d in out.values()} == {"cudagraphs"}
    why = out["c0"].reason
    assert why.startswith("replayed from CUDA graphs with its whole captured graph: the host's launches set")
    assert "the rules' routes 390.0 us, every graph replayed 80.0 us, as written 420.0 us" in why
    # a spec without a replay price (a CPU spec) replays nothing
    assert weigh_model_call(chains, est, dec, dataclasses.replace(CALLS, graph_replay_us=0.0)) == dec
    # within the whole-model margin (3%) the rules' routes stay: device work of 400 us outlasts both calls
    long = [_est(20.0, 20.0, 20.0), _est(15.0, 13.0, 12.5)] * 12
    chains, est, dec = _model(["skip", "torch.compile"] * 12, long, kinds=["heavy", "fusible"] * 12)
    assert weigh_model_call(chains, est, dec, CALLS) == dec


def test_a_replayed_call_copies_the_models_inputs():
    calls = dataclasses.replace(CALLS, input_copy_us=7.0)
    graphed = [ChainCall("cudagraphs", 1.0, 50.0), ChainCall("skip", 5.0, 20.0)]
    assert call_parts(graphed, calls)[0] == pytest.approx(13.0)
    assert call_parts([ChainCall("torch.compile", 1.0, 50.0)], calls)[0] == pytest.approx(1.0)
    # H200: 2 x 1 GiB of inputs read and written at 4,000 GB/s
    spec = {"memory_bandwidth_gbps": 4000.0, "graph_replay_us": 80.0}
    assert HostCalls.from_spec(spec, 1, 2**30).input_copy_us == pytest.approx(2 * 2**30 / 4e12 * 1e6)


def test_a_library_kernel_left_as_written_drops_its_kernel_and_its_note():
    chains, est, dec = _model(["triton", "skip"], [_est(12.0, 11.0, 2.0), _est(20.0, 20.0, 20.0)])
    est["c0"] = dataclasses.replace(est["c0"], triton_us=10.0)
    out = weigh_model_call(chains, est, dec, CALLS)
    assert out["c0"].route == "skip" and out["c0"].kernel == "" and out["c0"].note == ""
    assert "CUDA-graph" not in out["c0"].reason  # no CUDA-graph route here: no replay price or way quoted
    # a CPU spec's stand-in note says where the chain would have gone
    cpu = dataclasses.replace(dec["c0"], route="torch.compile", kernel="",
                              note="on a CPU device spec the chain goes to torch.compile instead")
    out = weigh_model_call(chains, est, {**dec, "c0": cpu}, CALLS)
    assert out["c0"].route == "skip" and out["c0"].note == "on a CPU device spec torch.compile would take it instead"


def test_a_route_a_profile_decided_stays():
    chains, est, dec = _model(["cudagraphs"], [_est(50.0, 10.0, 1.0)])
    kept = {"c0": dataclasses.replace(dec["c0"], fixed=True)}
    assert weigh_model_call(chains, est, kept, CALLS) == kept
    assert weigh_model_call(chains, est, dec, CALLS)["c0"].route == "torch.compile"


def test_a_spec_without_call_costs_changes_nothing():
    chains, est, dec = _model(["cudagraphs"], [_est(50.0, 10.0, 1.0)])
    assert weigh_model_call(chains, est, dec, HostCalls(launch_us=10.0)) == dec


def test_host_calls_read_a_spec_object_or_its_dict():
    spec = {"launch_overhead_us": 5.0, "host_time_scale": 2.0, "compiled_call_us": 30.0, "graph_replay_us": 60.0}
    assert HostCalls.from_spec(spec, 0) == HostCalls(10.0, 30.0, 60.0, 1)
    assert HostCalls.from_spec(SimpleNamespace(**spec), 3) == HostCalls(10.0, 30.0, 60.0, 3)
    assert HostCalls.from_spec({"launch_overhead_us": 5.0}, 2) == HostCalls(5.0, 0.0, 0.0, 2)


def test_a_doubted_library_kernel_is_no_reason_to_leave_the_model_as_written():
    # a triton route predicted slower than eager stays a candidate (route._kernel_doubt): the rules' routes then
    # read slower than eager on the device, not for their call, and the model's call changes nothing (a level-3
    # ViT's six routes had all been left "for the host time of the call" at 16.9 ms against 16.6 ms)
    chains, est, dec = _model(["triton", "torch.compile"], [_est(4000.0, 3000.0, 3000.0), _est(100.0, 60.0, 55.0)])
    est["c0"] = dataclasses.replace(est["c0"], triton_us=4300.0)
    assert weigh_model_call(chains, est, dec, CALLS) == dec


def test_a_change_says_where_the_specs_call_costs_were_not_measured():
    from fusion_advisor.devices import load_spec

    calls = HostCalls.from_spec(load_spec("h200"), 1)  # the shipped H200 spec takes the H100 hosts' ratios
    assert calls.unmeasured == "not measured on an H200"
    assert HostCalls.from_spec(load_spec("h200").to_dict(), 1).unmeasured == calls.unmeasured
    assert HostCalls.from_spec(load_spec("h100"), 1).unmeasured == ""
    chains, est, dec = _model(["cudagraphs"], [_est(50.0, 10.0, 1.0)])
    assert "; the spec's per-call costs are not measured on an H200)" in weigh_model_call(chains, est, dec,
                                                                                           calls)["c0"].reason
    assert HostCalls.from_spec({"compiled_call_source": "measured on H100 hosts: ..."}, 1).unmeasured == ""


TINY = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range({n}))

    def forward(self, x):
        for lin in self.layers:
            x = torch.sigmoid(lin(x) * 1.5 + 0.25) - 0.1
        return x


def get_inputs():
    return [torch.randn(8, 64)]


def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("layers, route", [(1, "torch.compile"), (6, "cudagraphs")])
def test_analyze_weighs_the_call_and_quotes_the_totals_the_console_prints(tmp_path, layers, route):
    # Linear layers each followed by four pointwise ops on the H200 spec: one layer's launch-bound chain saves less
    # by a replay than the replay costs over a compiled call; six layers' chains save more
    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.report.views import predicted_totals
    from fusion_advisor.report.write import chains_frame

    path = tmp_path / "layers.py"
    path.write_text(TINY.format(n=layers))
    a = analyze(path, gpu="h200")
    fused = [d for d in a.decisions.values() if d.rule_id == "cudagraphs-launch-bound"]
    assert len(fused) == layers and {d.route for d in fused} == {route}
    totals = predicted_totals(a, chains_frame(a))
    assert totals["advised"] <= totals["compiled"] and totals["advised"] < totals["eager"]
    if route == "torch.compile":  # the way chosen is the advised total the console and report.html print
        assert f"CUDA-graph routes compiled instead {totals['advised']:.1f} us" in fused[0].reason
    else:  # the Linear layers' GEMMs are replayed with the graph they lie in
        gemms = [d for d in a.decisions.values() if d.rule_id != "cudagraphs-launch-bound"]
        assert len(gemms) == layers and {d.route for d in gemms} == {"cudagraphs"}
        assert f"graphs with a replayed chain replayed whole {totals['advised']:.1f} us" in gemms[0].reason


def test_the_model_as_written_pays_the_work_no_output_uses():
    # a fresh user: 219 us of unused work, which a routed model (dynamo) drops, had left a tiny chain as written at
    # 41.1 us while torch.compile(model) read 45.7 us for the whole model against 259.7 us as written
    chains, est, dec = _model(["cudagraphs"], [_est(35.0, 10.0, 1.0)])
    assert weigh_model_call(chains, est, dec, CALLS)["c0"].route == "skip"
    out = weigh_model_call(chains, est, dec, CALLS, unused_us=219.0)
    assert out["c0"].route == "torch.compile" and "as written 254.0 us" in out["c0"].reason


VIEWS = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(768, 512), nn.GELU(), nn.Unflatten(1, (8, 64)),
                                 nn.LayerNorm(64), nn.Flatten(), nn.Linear(512, 512), nn.SiLU(),
                                 nn.Unflatten(1, (2, 256)), nn.Flatten(), nn.Linear(512, 10), nn.Tanh())

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(16, 3, 16, 16)]


def get_init_inputs():
    return []
'''


def test_the_report_says_why_the_routes_savings_do_not_add_up_to_the_models(tmp_path):
    # a fresh user: "The advice" listed 97.4 us saved by CUDA graphs, "What it buys" 44.8 us: the replay's host
    # time, not the chains' savings, sets the model's call
    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.report.write import write_report

    path = tmp_path / "views.py"
    path.write_text(VIEWS)
    a = analyze(path, gpu="h200")
    assert {d.route for d in a.decisions.values()} == {"cudagraphs"}
    html = write_report(a, tmp_path / "out")["html"].read_text()
    assert "Chain by chain these routes save" in html and "not the chains' savings added up" in html


def test_a_copy_of_the_shipped_rules_is_weighed_as_they_are(tmp_path):
    # a reviewer: `--rules mycopy.yaml` (the shipped file copied) had fixed every chain as the user's own, and the
    # advice fell from 5.16x to 0.93x eager; a rule of the user's own still stays (test_cli_analyze's
    # test_user_rules_come_first)
    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.analyze.rules import SHIPPED_RULES

    path = tmp_path / "layers.py"
    path.write_text(TINY.format(n=6))
    copy = tmp_path / "mycopy.yaml"
    copy.write_text(Path(SHIPPED_RULES).read_text())
    plain = analyze(path, gpu="h200")
    copied = analyze(path, gpu="h200", rules_files=[copy])
    assert [d.route for d in copied.decisions.values()] == [d.route for d in plain.decisions.values()]
    assert {d.route for d in plain.decisions.values()} == {"cudagraphs"}
    assert not any(d.fixed for a in (plain, copied) for d in a.decisions.values())
    # a rule of the user's own is fixed (apply's regions keep it: Region.fixed_route), the shipped ones are not
    mine = tmp_path / "mine.yaml"
    mine.write_text("version: 1\nrules:\n  - id: mine\n    match: {kind: heavy}\n    route: torch.compile\n"
                    "    reason: x\n")
    own = analyze(path, gpu="h200", rules_files=[mine])
    assert ({(d.rule_id, d.fixed) for d in own.decisions.values()}
            == {("mine", True), ("cudagraphs-launch-bound", False)})
