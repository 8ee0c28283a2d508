"""What report.html shows first (fusion_advisor/report/views.py): repeated layers as one group, the first screen
(the command, what the advice buys, the largest opportunities, what was left alone), and apply's results read
from a plan document, on hand-built analyses (no capture: fast)."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fusion_advisor.report import write as report
from fusion_advisor.report import views
from fusion_advisor.analyze.records import Decision
from tests.test_report import make_analysis


def layered(n_layers: int = 4):
    """make_analysis() with the rmsnorm chain c1 repeated over ``n_layers`` layers (c1 and c10.., same numbers,
    module paths model.layers.<i>) and one of them with other numbers (c90: not in the group)."""
    a = make_analysis()
    base = next(c for c in a.chains if c.id == "c1")
    extra = []
    for i in range(1, n_layers):
        cid = f"c{10 + i}"
        extra.append(replace(base, id=cid, module_path=f"model.layers.{i}"))
        a.estimates[cid] = a.estimates["c1"]
        a.decisions[cid] = replace(a.decisions["c1"], chain_id=cid)
    odd = replace(base, id="c90", module_path=f"model.layers.{n_layers}", eager_bytes=base.eager_bytes * 2)
    a.estimates["c90"] = replace(a.estimates["c1"], eager_us=a.estimates["c1"].eager_us * 2)
    a.decisions["c90"] = replace(a.decisions["c1"], chain_id="c90")
    a.chains = [*a.chains, *extra, odd]
    return a


def test_layer_pattern_and_index():
    assert views.layer_pattern("model.layers.12.mlp.up") == "model.layers.*.mlp.up"
    assert views.layer_pattern("0.conv") == "*.conv" and views.layer_pattern("") == ""
    assert views.layer_pattern("block3.fc") == "block3.fc"  # a digit inside a name is no index
    assert views.layer_index("model.layers.12.mlp") == "12" and views.layer_index("fc") == ""


def test_repeated_layers_form_one_group_with_totals():
    a = layered(4)
    frame = report.chains_frame(a)
    groups = views.chain_groups(frame)
    g = next(g for g in groups if "c1" in g["ids"])
    assert g["ids"] == ["c1", "c11", "c12", "c13"] and g["count"] == 4
    assert g["module_pattern"] == "model.layers.*" and g["layers"] == "0-3"
    assert g["totals"]["est_eager_us"] == pytest.approx(4 * a.estimates["c1"].eager_us)
    assert g["totals"]["eager_bytes"] == 4 * next(c for c in a.chains if c.id == "c1").eager_bytes
    assert views.group_title(g) == "rmsnorm x4 layers (model.layers.*)"
    # other numbers, other row; every chain is in exactly one group
    assert any(g["ids"] == ["c90"] for g in groups)
    assert sorted(c for g in groups for c in g["ids"]) == sorted(c.id for c in a.chains)


def test_two_chains_of_one_layer_are_times_not_layers():
    """Two copies on one source line of one block (KernelBench's MiniGPTBlock) are not two layers."""
    a = layered(2)
    a.chains = [replace(c, module_path="model.layers.0") if c.id == "c11" else c for c in a.chains]
    g = next(g for g in views.chain_groups(report.chains_frame(a)) if "c1" in g["ids"])
    assert g["count"] == 2 and views.group_title(g) == "rmsnorm x2 times (model.layers.*)"


def test_group_span_text():
    assert views._span(["0", "1", "2", "5", "7", "8"]) == "0-2, 5, 7-8"
    assert views._span(["", ""]) == ""


def test_first_screen_names_the_command_the_gain_and_the_opportunities(tmp_path, monkeypatch):
    monkeypatch.setattr(views, "apply_elsewhere", lambda analysis: False)  # as on a GPU machine
    a = layered(4)
    frame = report.chains_frame(a)
    groups = views.chain_groups(frame)
    v = views.verdict(a, frame, groups, None, tmp_path / "rep")
    # the command that carries the advice out, into this report's folder
    assert v["command"] == f"fusion-advisor apply /home/u/model.py --verify --dtype bf16 --out {tmp_path / 'rep'}"
    eager = frame["est_eager_us"].sum()
    advised = frame["est_after_route_us"].sum()
    assert v["pred_vs_eager"] == pytest.approx(eager / advised)
    # torch.compile(model): every fusible chain fused, heavy and other items as they are
    want = sum(min(r.est_eager_us, r.est_fused_us) if r.kind == "fusible" else r.est_eager_us
               for r in frame.itertuples() if not math.isnan(r.est_eager_us))
    assert v["pred_compile_us"] == pytest.approx(want)
    assert v["pred_vs_compile"] == pytest.approx(want / advised)
    # the largest opportunity is the rmsnorm group (4 layers), then the odd rmsnorm; skipped chains never appear
    opps = v["opportunities"]
    assert opps[0]["ids"] == ["c1", "c11", "c12", "c13"] and len(opps) <= views.TOP_OPPORTUNITIES
    assert all(o["first"]["route"] != "skip" for o in opps)
    savings = [o["saving_after_route_us"] for o in opps]
    assert savings == sorted(savings, reverse=True)
    # what was left alone, by rule, with the reason of its largest chain
    left = {e["rule_id"]: e for e in v["left_alone"]}
    assert set(left) == {"rule-skip"} and left["rule-skip"]["chains"] == 2
    assert "c0" in left["rule-skip"]["reason"]


def _frame(rows):
    cols = ["kind", "est_eager_us", "est_compile_us", "est_cudagraphs_us"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_predicted_model_route_needs_a_gain_beyond_the_margin():
    # a GEMM-bound model: fusing a small tail saves 1% -> the model as written is predicted best
    gemm = _frame([("heavy", 1000.0, 1000.0, 1000.0), ("fusible", 20.0, 10.0, 9.0)])
    r = views.predicted_model_routes(gemm)
    assert r["eager"] == pytest.approx(1020.0) and r["torch.compile"] == pytest.approx(1010.0)
    assert r["best"] == "eager"
    # a pointwise-bound model: Inductor's fusion wins
    pointwise = _frame([("heavy", 100.0, 100.0, 100.0), ("fusible", 300.0, 100.0, 95.0)])
    assert views.predicted_model_routes(pointwise)["best"] == "torch.compile"
    # a launch-bound model: many small kernels whose launches dominate -> CUDA graphs
    small = _frame([("heavy", 12.0, 12.0, 2.0)] * 20 + [("fusible", 24.0, 12.0, 1.0)] * 20)
    r = views.predicted_model_routes(small)
    assert r["reduce-overhead"] < r["torch.compile"] * 0.97 and r["best"] == "reduce-overhead"
    # a CPU spec has no CUDA graphs
    r = views.predicted_model_routes(small, gpu=False)
    assert math.isnan(r["reduce-overhead"]) and r["best"] == "torch.compile"


def test_a_compiled_call_and_a_graph_replay_cost_host_time_that_device_work_hides():
    # a fresh user: three tiny integer ops predicted 41.1 us eager and 2.4 us under CUDA graphs. One H100 measured
    # a compiled call at about 4 eager adds of host time and a reduce-overhead call at about 8
    tiny = _frame([("fusible", 30.0, 10.0, 2.4)]).assign(launch_eager_us=30.0, pattern="pointwise")
    assert views.predicted_model_routes(tiny)["best"] == "reduce-overhead"  # what was said without them
    calls = views.HostCalls(launch_us=10.0, compiled_call_us=30.0, graph_replay_us=80.0)
    r = views.predicted_model_routes(tiny, calls=calls)
    assert r["torch.compile"] == pytest.approx(40.0)  # the call, then the fused kernel's launch
    assert r["reduce-overhead"] == pytest.approx(80.0) and r["best"] == "eager"
    # each captured graph (a graph break makes two) is a compiled call and a replay of its own
    r2 = views.predicted_model_routes(tiny, calls=views.HostCalls(10.0, 30.0, 80.0, graphs=2))
    assert r2["torch.compile"] == pytest.approx(70.0) and r2["reduce-overhead"] == pytest.approx(160.0)
    # device work longer than the host's part hides it: the next call is made while the GPU runs this one
    big = _frame([("fusible", 3000.0, 1000.0, 990.0)] * 3).assign(launch_eager_us=30.0, pattern="pointwise")
    rb = views.predicted_model_routes(big, calls=calls)
    assert rb["torch.compile"] == pytest.approx(3000.0) and rb["reduce-overhead"] == pytest.approx(2970.0)
    # a CPU spec: the compiled call's cost without CUDA graphs
    assert views.predicted_model_routes(tiny, gpu=False, calls=calls)["torch.compile"] == pytest.approx(40.0)


def test_the_advice_pays_the_host_time_the_whole_model_routes_pay():
    # a fresh user's six tiny ops read 20x faster than torch.compile(model) when only the latter paid its call: the
    # advised total is floored by its own host time, priced as the whole-model routes price theirs
    tiny = _frame([("fusible", 30.0, 10.0, 2.4), ("fusible", 30.0, 10.0, 2.4)]).assign(
        launch_eager_us=30.0, route=["torch.compile", "triton"], est_after_route_us=[10.0, 9.0])
    calls = views.HostCalls(launch_us=10.0, compiled_call_us=30.0, graph_replay_us=80.0)
    # routed chains issue one launch each; apply carries routes out through dynamo: one compiled call
    assert views.predicted_advised_us(tiny, calls) == pytest.approx(10.0 + 10.0 + 30.0)
    # a chain left to eager issues its eager kernels; one replayed from CUDA graphs issues nothing more than the
    # replay, a whole reduce-overhead call (its guards included: no compiled call on top; a reviewer)
    kept = tiny.assign(route=["skip", "cudagraphs"], est_after_route_us=[30.0, 2.4])
    assert views.predicted_advised_us(kept, calls) == pytest.approx(30.0 + 80.0)
    # a compiled chain of a graph that replays another is replayed with it (apply.search._region_executors)
    both = tiny.assign(route=["torch.compile", "cudagraphs"], est_after_route_us=[10.0, 2.4])
    assert views.predicted_advised_us(both, calls) == pytest.approx(80.0)
    assert views.predicted_advised_us(kept.assign(route="skip"), calls) == pytest.approx(60.0)  # as written
    # device work longer than that: the chains' sum
    big = tiny.assign(est_after_route_us=[1000.0, 900.0])
    assert views.predicted_advised_us(big, calls) == pytest.approx(1900.0)


def test_a_scan_takes_inductors_own_scan_under_compile_and_other_unfusible_items_run_as_written():
    # est_compile_us is the roofline's price of Inductor's code: a scan lowered to its own kernel, a sort as
    # written, a convolution less its peeled bias pass; never above eager
    frame = pd.DataFrame([{"kind": "other", "pattern": "cumsum", "est_eager_us": 4500.0, "est_compile_us": 2500.0,
                           "est_cudagraphs_us": 4500.0},
                          {"kind": "other", "pattern": "sort", "est_eager_us": 100.0, "est_compile_us": 100.0,
                           "est_cudagraphs_us": 100.0},
                          {"kind": "heavy", "pattern": "conv", "est_eager_us": 900.0, "est_compile_us": 600.0,
                           "est_cudagraphs_us": 600.0},
                          {"kind": "fusible", "pattern": "gelu", "est_eager_us": 10.0, "est_compile_us": 12.0,
                           "est_cudagraphs_us": 10.0}])
    assert list(views.predicted_compile_series(frame)) == [2500.0, 100.0, 600.0, 10.0]
    assert views.predicted_model_routes(frame)["best"] == "torch.compile"
    older = frame.drop(columns=["est_compile_us"]).assign(est_fused_us=[1.0, 1.0, 1.0, 5.0])  # an older report
    assert list(views.predicted_compile_series(older)) == [4500.0, 100.0, 900.0, 5.0]


def test_command_quotes_paths_and_names_a_non_default_spec(tmp_path, monkeypatch):
    monkeypatch.setattr(views, "apply_elsewhere", lambda analysis: False)  # as on a GPU machine
    a = make_analysis()
    a.model_file = "/home/u/my model.py"
    a.device_spec = {**a.device_spec, "name": "a100"}
    a.rules_files = [{"file": "/home/u/rules mine.yaml"}, {"file": "/x/rules/default.yaml"}]
    cmd = views.apply_command(a, Path("reports/x"))
    assert cmd == ("fusion-advisor apply '/home/u/my model.py' --verify --dtype bf16 --gpu a100 "
                   "--rules '/home/u/rules mine.yaml' --out reports/x")
    a.model_file = "<builtin:llama>"
    assert views.apply_command(a, None).startswith("fusion-advisor apply --verify")
    # a spec file of the user's is named by its path, whatever its name field says: a calibrated "h200-fitted"
    # lost its --gpu, and a file named "a100" was replaced by the shipped a100
    a.model_file = "m.py"
    for name in ("h200-fitted", "a100", "h200"):
        a.device_spec, a.device_spec_file = {**a.device_spec, "name": name}, "/home/u/my spec.yaml"
        assert views.apply_command(a, None, None) == \
            "fusion-advisor apply m.py --verify --dtype bf16 --gpu '/home/u/my spec.yaml' --rules '/home/u/rules mine.yaml'"


def test_command_leaves_out_the_cpu_spec_and_reruns_a_plans_own_flags(monkeypatch):
    monkeypatch.setattr(views, "apply_elsewhere", lambda analysis: False)  # as on a GPU machine
    # a fresh user's report said "measure again (another GPU)" with --gpu cpu, the spec apply takes by itself on
    # a machine without a GPU (on a GPU it would send every kernel route to torch.compile), and without the
    # options the plan was made with
    a = make_analysis()
    a.model_file = "m.py"
    a.device_spec = {**a.device_spec, "name": "cpu"}
    assert views.apply_command(a, Path("r")) == "fusion-advisor apply m.py --verify --dtype bf16 --out r"
    flags = ["--verify", "--candidates", "all", "--budget-s", "30", "--keep-unmeasured"]
    assert views.apply_command(a, Path("r"), flags) == ("fusion-advisor apply m.py --dtype bf16 --verify "
                                                        "--candidates all --budget-s 30 --keep-unmeasured --out r")
    # a dry run's plan (no --verify): the command still verifies, as the text beside it says
    assert views.apply_command(a, Path("r"), ["--candidates", "all"]) == \
        "fusion-advisor apply m.py --dtype bf16 --verify --candidates all --out r"
    assert views.apply_command(a, Path("r"), []) == "fusion-advisor apply m.py --dtype bf16 --verify --out r"


def plan_doc(analysis, chains=("c1",)) -> dict:
    """A plan document as apply writes it (plan_document's keys), three variants timed, one swap."""
    def variant(name, status, ms, err=0.0):
        return {"name": name, "status": status, "reason": f"{name} <reason>", "baseline": name != "swaps+eager",
                "spec": {"name": name, "describe": f"how {name} runs"},
                "check": {"passed": status != "wrong", "norm_err": err, "eager_norm_err": 0.0},
                "timing": {"timer": "do_bench median (cuda)", "ms": ms, "spread": 0.01, "first_call_s": 1.5,
                           "peak_mb": 100.0, "peak_reserved_mb": 140.0, "device_ms": ms * 0.9}, "problems": []}

    return {
        "fusion_advisor_plan": 2, "tool_version": "0.2.0", "created_at": "2026-12-01T10:00:00+00:00",
        "model": {"name": analysis.model_name, "file": analysis.model_file, "device": "cuda", "dtype": "bf16"},
        "versions": {"torch": "2.13.0", "gpu": "NVIDIA H200"}, "device_spec": analysis.device_spec["name"],
        "summary": {"matches": 1, "candidates": 1, "verified": 1, "swaps_in_plan": 1, "regions": 2,
                    "variants_tried": 3, "what": "forward"},
        "chosen": {"name": "swaps+eager", "ms": 2.0, "spec": {"describe": "eager with 1 swap"}},
        "chosen_reason": "fastest correct",
        "variants": [variant("eager", "correct", 4.0), variant("torch.compile", "correct", 2.5),
                     variant("swaps+eager", "chosen", 2.0), variant("broken", "wrong", 1.0, err=0.5)],
        "regions": [{"key": "g0:model#0", "ops": 3, "chains": list(chains), "routes": {"triton": 1},
                     "predicted_fusion_gain_us": 5.0, "predicted_launch_us": 8.0, "source": "/home/u/model.py:10"}],
        "swaps": [{"id": "s0", "kernel": "rmsnorm", "pattern": "rmsnorm", "chains": list(chains),
                   "source": "/home/u/model.py:73", "code": "x", "module_path": "model.layers.0",
                   "route": {"route": "triton", "kernel": "rmsnorm", "rule": "rule-triton"},
                   "verified": True, "verification": {"max_abs_err": 1e-3},
                   "timing": {"timer": "do_bench", "eager_ms": 0.3, "compile_ms": 0.2, "kernel_ms": 0.1},
                   "decision": "kept", "reason": "faster <b>than</b> compile"}],
        "near_misses": [], "library_problems": {}, "warnings": [], "timings_s": {"capture": 1.0},
    }


def test_apply_view_measures_against_its_own_baselines():
    a = make_analysis()
    view = views.apply_view(plan_doc(a), a)
    by = {v["name"]: v for v in view["variants"]}
    chosen = by["swaps+eager"]
    assert chosen["vs_eager"] == pytest.approx(2.0) and chosen["vs_compile"] == pytest.approx(1.25)
    assert chosen["peak_mb"] == 100.0 and chosen["peak_reserved_mb"] == 140.0
    m = view["measured"]
    assert m["timed"] and m["chosen"] == "swaps+eager" and m["vs_compile"] == pytest.approx(1.25)
    assert m["device"] == "NVIDIA H200 (cuda)"
    assert view["swaps"][0]["linked"] == ["c1"] and not view["notes"]


def test_apply_view_says_when_the_plan_is_about_another_model_and_survives_junk():
    a = make_analysis()
    doc = plan_doc(a, chains=("c77",))
    doc["model"]["file"] = "/elsewhere/other.py"
    view = views.apply_view(doc, a)
    assert any("made for /elsewhere/other.py" in n for n in view["notes"])
    assert any("no swap links to a chain" in n for n in view["notes"])
    # a malformed document reads as empty, never raises
    for junk in ({}, {"variants": "x", "swaps": [1, None], "chosen": [], "model": 3}, {"variants": [{"timing": 5}]}):
        v = views.apply_view(junk, a)
        assert isinstance(v["variants"], list) and v["measured"] is None


def test_report_in_a_folder_with_apply_shows_apply(tmp_path):
    a = make_analysis()
    out = tmp_path / "rep"
    out.mkdir()
    (out / "plan.yaml").write_text("# fusion-advisor plan: test\n" + yaml.safe_dump(plan_doc(a)))
    html = report.write_report(a, out)["html"].read_text(encoding="utf-8")
    first = html[:html.index('<section id="breakdown"')]
    assert "Apply ran: the plan is ready" in first and 'load_plan(model, "plan.yaml")' in first
    assert "2.00x" in first and "1.25x" in first  # measured vs eager and vs torch.compile(model)
    section = html[html.index('<section id="apply"'):html.index('<section id="breaks"')]
    assert "Whole-model variants (4)" in section and 'href="#chain-c1"' in section
    assert "faster &lt;b&gt;than&lt;/b&gt; compile" in section  # escaped
    assert 'class="row cls-wrong"' in section


def test_a_plan_made_on_a_cpu_says_its_kernels_need_the_interpreter_and_gives_its_own_command(tmp_path):
    a = make_analysis()
    doc = plan_doc(a)
    doc["model"]["device"] = "cpu"
    doc["flags"] = ["--verify", "--candidates", "all", "--keep-unmeasured"]
    (tmp_path / "plan.yaml").write_text("# fusion-advisor plan: test\n" + yaml.safe_dump(doc))
    html = report.write_report(a, tmp_path)["html"].read_text(encoding="utf-8")
    first = html[:html.index('<section id="breakdown"')]
    assert "TRITON_INTERPRET=1" in first
    assert "--candidates all --keep-unmeasured --out" in first
    assert "The advice (predicted by the analysis, before apply measured" in first
    doc["model"]["device"] = "cuda"
    (tmp_path / "plan.yaml").write_text("# fusion-advisor plan: test\n" + yaml.safe_dump(doc))
    assert "TRITON_INTERPRET" not in report.write_report(a, tmp_path)["html"].read_text(encoding="utf-8")


@pytest.mark.parametrize("text, note", [
    ("name: mine\n", "not written by fusion-advisor"),
    ("# fusion-advisor plan\nfusion_advisor_plan: 1\nwhole_model: {}\n", "older plan format"),
    ("# fusion-advisor plan\n: [\n", "could not be read"),
])
def test_a_plan_the_report_cannot_use_is_named_not_shown(tmp_path, text, note):
    a = make_analysis()
    (tmp_path / "plan.yaml").write_text(text)
    html = report.write_report(a, tmp_path)["html"].read_text(encoding="utf-8")
    assert note in html and "apply has not run into this folder" in html


def test_report_json_round_trips_to_the_same_analysis(tmp_path):
    a = make_analysis()
    a.chains[1] = replace(a.chains[1], attention_backend="")
    report.write_report(a, tmp_path)
    b = report.load_report(tmp_path)
    assert [c for c in b.chains] == [c for c in a.chains]
    assert b.decisions == a.decisions and b.ops == a.ops and b.graph_breaks == a.graph_breaks
    for cid, e in a.estimates.items():
        assert b.estimates[cid] == e
    assert report.chains_frame(b).equals(report.chains_frame(a))


@pytest.mark.parametrize("content, message", [
    (None, "no report.json"),
    ("{not json", "cannot be read as JSON"),
    ('{"model_name": 1}', "not a report written by fusion-advisor"),
    ('{"tool_version": "0.1", "chains": 3}', "not an analysis document"),
])
def test_load_report_refuses_what_it_cannot_read(tmp_path, content, message):
    from fusion_advisor.errors import UserError

    if content is not None:
        (tmp_path / "report.json").write_text(content)
    with pytest.raises(UserError, match=message):
        report.load_report(tmp_path)


def test_the_guard_asks_file_by_file(tmp_path):
    from fusion_advisor.errors import UserError

    a = make_analysis()
    report.write_report(a, tmp_path)
    report.check_files(tmp_path, ("report.html", "report.json", "chains.csv", "plan.yaml"))  # ours, or absent
    (tmp_path / "plan.yaml").write_text("my own notes\n")
    with pytest.raises(UserError, match="plan.yaml that fusion-advisor did not write"):
        report.check_files(tmp_path, ("report.html", "plan.yaml"))
    other = tmp_path / "o"
    other.mkdir()
    (other / "report.html").write_text("<html>mine</html>")
    with pytest.raises(UserError, match="report.html"):
        report.check_out_dir(other)
    copied = tmp_path / "c"
    copied.mkdir()
    (copied / "report.html").write_text((tmp_path / "report.html").read_text())  # ours by its generator tag
    report.check_out_dir(copied)


def test_decisions_without_a_rule_and_empty_analysis_render(tmp_path):
    a = make_analysis()
    a.decisions = {k: d for k, d in a.decisions.items() if k != "c1"}
    a.decisions["c2"] = Decision("c2", "skip", "", "", "", "", "launch")
    html = report.write_report(a, tmp_path)["html"].read_text(encoding="utf-8")
    assert "Left alone, and why" in html
    e = copy.deepcopy(a)
    e.chains, e.ops, e.estimates, e.decisions = [], [], {}, {}
    html = report.write_report(e, tmp_path / "empty")["html"].read_text(encoding="utf-8")
    assert "none: no chain is routed away from eager" in html


def test_reduce_overhead_pays_for_copying_the_inputs_into_its_static_buffers():
    # one big elementwise op: CUDA graphs remove one launch, but cudagraph trees copy the input every call
    one = _frame([("fusible", 3000.0, 3000.0, 2990.0)])
    assert views.predicted_model_routes(one)["reduce-overhead"] == pytest.approx(2990.0)
    r = views.predicted_model_routes(one, calls=views.HostCalls(input_copy_us=3000.0))
    assert r["reduce-overhead"] == pytest.approx(5990.0) and r["best"] == "eager"
    a = make_analysis()
    a.input_bytes = 6 * 10**9
    a.device_spec = {**a.device_spec, "memory_bandwidth_gbps": 4000.0}
    assert views.HostCalls.of(a).input_copy_us == pytest.approx(3000.0)  # 12 GB moved at 4 TB/s


def test_the_measured_line_quotes_the_confirmation_before_the_search(tmp_path):
    # a new user read "1.46x vs torch.compile(model), measured by apply" while apply's own confirmation, in
    # interleaved rounds, had measured 1.07x: the confirmed figure comes first, the search's is labelled as such
    a = make_analysis()
    doc = plan_doc(a)
    doc["summary"].update(confirmed_against="torch.compile", confirmed_speedup=1.07)
    frame = report.chains_frame(a)
    line = views.verdict(a, frame, views.chain_groups(frame), views.apply_view(doc, a), tmp_path)["measured"][-1]
    assert line["text"].startswith("2 ms per step: confirmed 1.07x vs torch.compile in interleaved rounds; "
                                   "in the search, 2.00x vs eager, 1.25x vs torch.compile(model)")
    doc["summary"].pop("confirmed_against")
    plain = views.verdict(a, frame, views.chain_groups(frame), views.apply_view(doc, a), tmp_path)["measured"][-1]
    assert "confirmed" not in plain["text"] and "2.00x vs eager" in plain["text"]
    # the report's first screen ("What it buys") quoted the search's ratio alone (a fresh user read 1.21x there
    # where apply's console and plan.yaml said confirmed 1.14x): the confirmed one is the big number
    for against, big, search in (("torch.compile", "1.07x", "1.25x"), ("eager", "1.07x", "2.00x")):
        doc["summary"].update(confirmed_against=against, confirmed_speedup=1.07)
        (tmp_path / "plan.yaml").write_text("# fusion-advisor plan: test\n" + yaml.safe_dump(doc))
        html = report.write_report(a, tmp_path)["html"].read_text(encoding="utf-8")
        buys = html[html.index('id="buys"'):html.index('id="opportunities"')]
        label = "vs eager" if against == "eager" else "vs <code>torch.compile(model)</code>"
        assert f'<div class="big">{big}</div><div class="label">{label}, <strong>measured</strong>' in buys
        assert f"confirmed in interleaved rounds; the search read {search}" in buys


def test_the_profiled_line_predicts_the_model_as_the_cost_model_is_judged(tmp_path):
    # the line set the measured wall time beside the chains each priced alone at the spec's host speed (ResNet-101:
    # 8.82 ms, 6.58 measured on an H200) while the in-model prediction the cost model is judged on read 6.41 ms
    from fusion_advisor.analyze.records import ChainMeasurement, Profile

    a = make_analysis()
    chains = {c.id: ChainMeasurement(c.id, 100.0, 60.0, 40.0, 3.0, 1.0, 1.0, 50.0, "memory", 70.0 + i, 0.7, False)
              for i, c in enumerate(a.chains)}
    a.profile = Profile(device="cuda", device_name="NVIDIA H200 <test>", runs=3, warmup_runs=2, total_us=5000.0,
                        attributed_us=4500.0, unattributed_us=500.0, wall_us=6000.0, eager_wall_us=5200.0,
                        setup="", compared="", chains=chains)
    frame = report.chains_frame(a)
    line = views.verdict(a, frame, views.chain_groups(frame), None, tmp_path)["measured"][0]["text"]
    in_model = sum(70.0 + i for i in range(len(a.chains))) + a.unused_us
    assert f"predicted {views.fmt_us(in_model)} ({in_model / 5200.0:.2f}x the measured)" in line
    assert f"{views.fmt_us(frame['est_eager_us'].sum() + a.unused_us)} with each priced alone at the spec's host " \
           f"speed" in line
    assert "inside the model at this host's measured speed" in line
    a.profile.device = "cpu"  # a CPU profile's prediction is not scaled to the host (profile.py scales CUDA's)
    line = views.verdict(a, frame, views.chain_groups(frame), None, tmp_path)["measured"][0]["text"]
    assert "inside the model at the spec's host speed" in line


def test_the_predicted_line_names_a_whole_model_route_that_beats_the_chain_routes():
    # a model of lone launch-bound kernels: every chain skipped (1.00x), one CUDA graph over the model 6x
    routes = {"eager": 176.0, "torch.compile": 176.0, "reduce-overhead": 29.0, "best": "reduce-overhead"}
    said = views.whole_model_note(routes, 176.0)
    assert said == "; faster still, the whole model with CUDA graphs (reduce-overhead): 6.07x vs eager"
    assert views.whole_model_note(routes, 29.5) == ""  # the chain routes get there already (within the margin)
    assert views.whole_model_note({**routes, "best": "eager"}, 176.0) == ""
    nan = {"eager": 10.0, "torch.compile": 9.0, "reduce-overhead": float("nan"), "best": "torch.compile"}
    assert views.whole_model_note(nan, 10.0) == "; faster still, torch.compile(model): 1.11x vs eager"
    # a capture with graph breaks: the whole-model predictions do not price them, and say so (a fresh user's model
    # with a branch on a mean and a nonzero read 6.68x under reduce-overhead without a word on them)
    assert views.whole_model_note({**routes, "breaks": 2}, 176.0) == (
        "; faster still, the whole model with CUDA graphs (reduce-overhead): 6.07x vs eager (not pricing its 2 graph break(s) beyond "
        "each graph's call: one on a tensor's value also makes the host wait for the GPU)")


def test_the_report_says_the_whole_model_prediction_leaves_graph_breaks_unpriced(tmp_path):
    from fusion_advisor.analyze.records import GraphBreak

    a = make_analysis()
    a.graph_breaks = []
    html = report.write_report(a, tmp_path / "whole")["html"].read_text(encoding="utf-8")
    assert "graph break(s)" not in html
    a.graph_breaks = [GraphBreak(reason="generic_jump TensorVariable()", source=a.chains[0].source, graph_index=0)]
    html = report.write_report(a, tmp_path / "broken")["html"].read_text(encoding="utf-8")
    assert "; not pricing its 1 graph break(s) beyond each graph&#39;s call" in html


def test_advice_under_the_3_percent_a_route_needs_says_the_model_stays_eager():
    # a fresh user's BERT on the CPU spec: "The advice" routed 13 chains to torch.compile (183 us saved) right above
    # "predicted best route: eager", with nothing to say that 183 us of 7.96 ms is under the 3% a route needs
    a = make_analysis()
    html = report.render_html(a, "2026-12-01T00:00:00+00:00")
    assert "Together these save" not in html  # torch.compile(model) is the predicted best here
    a.estimates["c0"] = replace(a.estimates["c0"], eager_us=10_000.0, fused_us=10_000.0, compile_us=10_000.0)
    assert views.analysis_model_routes(a, report.chains_frame(a))["best"] == "eager"
    html = report.render_html(a, "2026-12-01T00:00:00+00:00")
    first = html[:html.index('id="buys"')]
    assert "under the 3% a route needs to count as faster" in first


def test_advice_the_host_time_outweighs_is_said_slower_than_eager(tmp_path):
    # a reviewer: a tiny model's advice read "Together these save -85.5 us ... under the 3% a route needs"
    a = make_analysis()
    a.device_spec = {**a.device_spec, "compiled_call_us": 1e6}  # a call far longer than the model
    html = report.write_report(a, tmp_path / "slow")["html"].read_text(encoding="utf-8")
    assert "Together these are predicted" in html and "slower than eager" in html
    assert "Together these save -" not in html
    # the page says a convolution is compiled without its bias pass on GPU specs only
    assert "without its bias pass" in html
    a.device_spec = {**a.device_spec, "kind": "cpu"}
    html = report.write_report(a, tmp_path / "cpu")["html"].read_text(encoding="utf-8")
    assert "without its bias pass" not in html


def test_torch_compile_runs_a_recurrent_layer_and_what_follows_it_as_written():
    # the analysis captures nn.LSTM with dynamo's allow_rnn on; torch.compile(model) has it off and stops there:
    # torch 2.13 compiled one graph of a Linear + sin before an LSTM and nothing after it (a reviewer). The layer
    # and the chain after it run as written, their host time beside the one graph's compiled call or replay (a
    # fresh user: a 4-step LSTM read 1.21x under reduce-overhead)
    rows = [("fusible", 30.0, 10.0, 2.4, "pointwise"), ("opaque", 70.0, 70.0, 20.0, "recurrent"),
            ("fusible", 30.0, 10.0, 2.4, "pointwise")]
    cols = ["kind", "est_eager_us", "est_compile_us", "est_cudagraphs_us", "pattern"]
    lstm = pd.DataFrame([dict(zip(cols, r, strict=True))
                         for r in rows]).assign(launch_eager_us=[30.0, 70.0, 30.0], graph_index=0)
    assert views._eager_tail(lstm).tolist() == [False, True, True]
    assert views._eager_tail(lstm.assign(graph_index=[0, 0, 1])).tolist() == [False, True, False]
    calls = views.HostCalls(launch_us=10.0, compiled_call_us=30.0, graph_replay_us=80.0)
    r = views.predicted_model_routes(lstm, calls=calls)
    assert r["torch.compile"] == pytest.approx(30.0 + 10.0 + 70.0 + 30.0)  # one call, one launch, the tail eager
    assert r["reduce-overhead"] == pytest.approx(80.0 + 70.0 + 30.0) and r["best"] == "eager"
    # a graph that begins with the layer compiles nothing: no call of its own (36_LSTMHn had read reduce-overhead
    # 81 us slower than eager on the h200 spec)
    alone = lstm.iloc[[1, 2]]
    r = views.predicted_model_routes(alone, calls=calls)
    assert r["torch.compile"] == pytest.approx(r["eager"]) and r["reduce-overhead"] == pytest.approx(r["eager"])


def test_the_advice_says_which_kernel_routes_it_counts_at_another_routes_time():
    # a fresh user read "triton add_layernorm 33.5 us" where the kernel's own estimate saved 21.4: the chain stays
    # routed to the kernel for apply to measure, and the advice counts it at torch.compile's predicted time
    a = make_analysis()
    frame = report.chains_frame(a)
    assert all(e["note"] == "" for e in views.advice(views.chain_groups(frame)))
    row = frame.index[frame["chain_id"] == "c1"][0]
    frame.loc[row, "est_triton_us"] = frame.loc[row, "est_after_route_us"] * 2.0
    triton = next(e for e in views.advice(views.chain_groups(frame)) if e["route"] == "triton")
    assert triton["note"].startswith("1 of them counted at torch.compile's or eager's time")
