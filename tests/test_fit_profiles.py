"""calibrate --from-profile: op-class curves fitted from profiled reports.

One real CPU profile of the small MLP gives the reports' structure (ops, chains, spec); its measured times are then
replaced by known laws (matmuls 3x their roofline, everything else 2x) so that the fit has a right answer: the
curves must recover the laws, the residuals on held-out reports must fall to ~0, and analyze with the fitted spec
must price the ops by them. Plus: the curve itself, the op classes, the spec field's validation, and the errors a
user meets (no profile, mixed specs, a file not ours)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fusion_advisor.analyze.pipeline import analyze
from fusion_advisor.cli import app
from fusion_advisor.devices import AttentionRate, OpTimeFit, load_spec, parse_spec, spec_fields, spec_mapping
from fusion_advisor.errors import DeviceSpecError, UserError
from fusion_advisor.devices.fit_profiles import fit_curve, fit_from_profiles, read_report, summary, write_fit
from fusion_advisor.analyze.records import (NOT_THE_MODELS_TIMES, ChainMeasurement, NodeMeasurement, OpInfo,
                                            SourceLoc, TensorMeta)
from fusion_advisor.report.write import render_json
from fusion_advisor.analyze.op_classes import op_class_keys
from fusion_advisor.analyze.roofline import eager_in_model_us, estimate_all, roofline_op_us

MLP = Path(__file__).parent / "data" / "models" / "profile_mlp.py"
LAW = {"matmul": 3.0}  # measured busy time over the roofline time, by category; every other op: 2x
OTHER = 2.0


@pytest.fixture(scope="module")
def profiled():
    return analyze(MLP, device="cpu", gpu="cpu", profile=True)


def _with_law(analysis, law=LAW, other=OTHER, idle_us=1.0):
    """``analysis`` with every op's measured busy time ``law[category] * roofline`` and chains summed from them."""
    spec = parse_spec(spec_fields(analysis.device_spec), "test")
    prof = analysis.profile
    nodes = {}
    for op in analysis.ops:
        if op.id in prof.nodes:
            busy = law.get(op.category, other) * roofline_op_us(op, spec)
            nodes[op.id] = NodeMeasurement(op.id, busy + idle_us, busy, idle_us, 1.0)
    predicted = eager_in_model_us(analysis.chains, analysis.ops, spec)
    chains = {}
    for c in analysis.chains:
        ms = [nodes[i] for i in c.op_ids if i in nodes]
        busy, idle = sum(m.busy_us for m in ms), sum(m.idle_us for m in ms)
        t = busy + idle
        chains[c.id] = ChainMeasurement(c.id, t, busy, idle, float(len(ms)), 0.0, 0.0, 0.0, "memory",
                                        predicted[c.id], predicted[c.id] / t if t else math.nan, False)
    total = sum(m.time_us for m in chains.values())
    # the times are the law's now: the real run's word on its own times (a busy CI machine's) no longer holds
    notes = [n for n in prof.notes if NOT_THE_MODELS_TIMES not in n]
    prof = dataclasses.replace(prof, nodes=nodes, chains=chains, total_us=total, attributed_us=total,
                               unattributed_us=0.0, eager_wall_us=total, notes=notes)
    return dataclasses.replace(analysis, profile=prof)


def _write(analysis, folder: Path, model: str | None = None) -> Path:
    """``analysis`` written as a report folder, as a model of its own (named ``model``, else the folder's name):
    reports of one model are split together (fit_profiles.model_key)."""
    folder.mkdir(parents=True)
    analysis = dataclasses.replace(analysis, model_name=model or folder.name)
    (folder / "report.json").write_text(render_json(analysis, "2026-12-01T00:00:00Z"), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def reports(profiled, tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    lawful = _with_law(profiled)
    fit = [_write(lawful, root / "fit" / f"m{i}") for i in range(4)]
    test = [_write(lawful, root / "test" / f"t{i}") for i in range(2)]
    return root, fit, test


def test_the_fit_recovers_known_laws_and_the_test_set_agrees(reports, monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    root, _, _ = reports
    shrunk = fit_from_profiles([root / "fit"], [root / "test"]).spec.op_time_fits
    assert 10.0 < shrunk["matmul/addmm"](10.0) < 30.0  # a few ops per class: pulled toward no correction
    # a category fitted on one aten op alone (addmm) gets no curve of its own; one of several (add, gelu, mul) does
    assert "matmul" not in shrunk and "pointwise" in shrunk
    monkeypatch.setattr(fp, "SHRINK_SAMPLES", 0.0)  # the fit itself recovers the laws exactly
    result = fit_from_profiles([root / "fit"], [root / "test"])
    assert result.fit_reports == ("m0", "m1", "m2", "m3") and result.test_reports == ("t0", "t1")
    fits = result.spec.op_time_fits
    assert fits["matmul/addmm"](10.0) == pytest.approx(30.0, rel=1e-6)
    assert fits["pointwise"](10.0) == pytest.approx(20.0, rel=1e-6)
    test = summary(result, "test")
    # before: the plain roofline is 2-3x too fast; after: every chain within 30 %, every model within 25 %
    assert test["before"]["chains_30pct"] < 0.5
    assert test["after"]["chains_30pct"] == 1.0 and test["after"]["models_25pct"] == 1.0
    assert test["after"]["median_log2_error"] < test["before"]["median_log2_error"]


def test_every_third_report_is_held_out_without_a_test_set(reports):
    root, _, _ = reports
    result = fit_from_profiles([root / "fit"])
    assert result.fit_reports == ("m0", "m1", "m3") and result.test_reports == ("m2",)
    assert "every third" in result.notes[0]


def test_analyze_with_the_fitted_spec_prices_ops_by_the_curves(reports, profiled, tmp_path, monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    monkeypatch.setattr(fp, "SHRINK_SAMPLES", 0.0)  # exact laws: the unshrunk fit recovers them
    root, _, _ = reports
    result = fit_from_profiles([root / "fit"], [root / "test"])
    paths = write_fit(result, tmp_path / "fitted.yaml", "2026-12-01")
    spec = load_spec(str(paths["spec"]))
    assert spec.name.endswith("-fitted") and spec.op_time_fits.keys() == result.spec.op_time_fits.keys()
    data = yaml.safe_load(paths["spec"].read_text())
    assert data["fit"]["test_set"] == ["t0", "t1"] and data["fit"]["accuracy"]["test"]["after"]["chains_30pct"] == 1
    again = analyze(MLP, device="cpu", gpu=str(paths["spec"]))
    plain = estimate_all(profiled.chains, profiled.ops, result.base)
    heavy = [c for c in again.chains if c.categories == ("matmul",)]
    assert heavy, "the MLP has matmul items"
    for c in heavy:
        assert again.estimates[c.id].eager_us == pytest.approx(3.0 * plain[c.id].eager_us, rel=0.02)
    for name in ("residuals", "models", "classes"):
        assert paths[name].is_file() and paths[name].stat().st_size > 0


def test_a_power_law_is_fitted_when_sizes_span_enough():
    r = [0.5 * 2 ** i for i in range(10)]
    fit = fit_curve(r, [5.0 * x ** 0.7 for x in r])
    assert fit.exponent == pytest.approx(0.7, abs=1e-3) and fit.scale == pytest.approx(5.0, rel=1e-3)
    # beyond the fitted range the curve continues proportionally from its end
    assert fit(2 * max(r)) == pytest.approx(2 * fit(max(r)))
    narrow = fit_curve([1.0, 1.5, 2.0], [3.0, 4.5, 6.0])
    assert narrow.exponent == 1.0 and narrow.scale == pytest.approx(3.0)


def _conv(x, w, out, dtype="fp32"):
    def meta(shape):
        n = math.prod(shape)
        return TensorMeta(tuple(shape), dtype, n, 4 * n)
    return OpInfo(id="g0:c", graph_index=0, target="aten.convolution.default", category="conv",
                  inputs=(meta(x), meta(w)), outputs=(meta(out),), flops=1, bytes_read=1, bytes_written=1,
                  module_path="", source=SourceLoc("m.py", 1, "conv"))


@pytest.mark.parametrize("x,w,out,want", [
    ((8, 16, 32, 32), (32, 16, 3, 3), (8, 32, 30, 30), "conv/conv2d/fp32"),
    ((8, 16, 8, 16, 16), (16, 32, 3, 3, 3), (8, 32, 17, 33, 33), "conv/conv3d_transpose/fp32"),
    ((8, 16, 32, 32), (16, 1, 3, 3), (8, 16, 32, 32), "conv/conv2d_depthwise/fp32"),
    ((8, 16, 32, 32), (32, 4, 3, 3), (8, 32, 32, 32), "conv/conv2d_grouped/fp32"),
])
def test_convolutions_are_classed_by_geometry(x, w, out, want):
    assert op_class_keys(_conv(x, w, out))[0] == want


def test_fits_apply_only_to_the_dtypes_they_were_measured_on(reports):
    root, _, _ = reports
    result = fit_from_profiles([root / "fit"], [root / "test"])
    dtypes = result.spec.op_time_fit_dtypes
    assert dtypes and all(d in ("fp32", "bf16", "fp16") for d in dtypes)
    spec = dataclasses.replace(load_spec("h200"), op_time_fits={"conv": OpTimeFit(3.0, 1.0, 1.0, 100.0, 7)},
                               op_time_fit_dtypes=("fp32",))
    fp32, bf16 = _conv((8, 16, 32, 32), (32, 16, 3, 3), (8, 32, 30, 30)), _conv((8, 16, 32, 32), (32, 16, 3, 3),
                                                                             (8, 32, 30, 30), "bf16")
    assert spec.op_time_fit(op_class_keys(fp32), "fp32") is not None
    assert spec.op_time_fit(op_class_keys(bf16), "bf16") is None  # a curve learnt on fp32 never reprices bf16
    again = parse_spec(spec_mapping(spec), "round trip")
    assert again.op_time_fit_dtypes == ("fp32",)
    with pytest.raises(DeviceSpecError, match="op_time_fit_dtypes"):
        parse_spec({**spec_mapping(spec), "op_time_fit_dtypes": "fp32"}, "bad.yaml")


def test_spec_field_round_trips_and_bad_entries_are_refused():
    base = load_spec("h200")
    spec = dataclasses.replace(base, op_time_fits={"conv": OpTimeFit(2.0, 0.9, 1.0, 100.0, 7)})
    again = parse_spec(spec_mapping(spec), "round trip")
    assert again.op_time_fits == spec.op_time_fits and again.tensor_tflops == base.tensor_tflops
    # a calibrated spec's measured SDPA rates come back too (a tuple of them once failed the loader's list check)
    rate = AttentionRate(backend="flash", dtype="bf16", seq=1024, head_dim=64, causal=True, tflops=300.0)
    assert parse_spec(spec_mapping(dataclasses.replace(base, attention_rates=(rate,))), "t").attention_rates == (rate,)
    data = spec_mapping(base)
    for bad, match in (({"conv": {"scale": 2.0, "exponent": 3.0}}, "slope must lie"),
                       ({"conv": {"scale": 2.0, "slope": 1.0}}, "unknown key"),
                       ({"conv": {"exponent": 1.0}}, "at least 'scale'"),
                       ({"conv": {"scale": -1.0}}, "positive number"),
                       ({"conv": {"scale": 1.0, "min_us": 5.0, "max_us": 1.0}}, "max_us")):
        with pytest.raises(DeviceSpecError, match=match):
            parse_spec({**data, "op_time_fits": bad}, "bad.yaml")


def test_reports_without_a_profile_or_of_two_specs_are_refused(profiled, tmp_path):
    plain = _write(dataclasses.replace(profiled, profile=None), tmp_path / "plain")
    with pytest.raises(UserError, match="no measured times"):
        read_report(plain)
    with pytest.raises(UserError, match="no such folder"):
        fit_from_profiles([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no report.json"):
        fit_from_profiles([tmp_path / "empty"])
    with pytest.raises(UserError, match="no measured times"):
        fit_from_profiles([tmp_path])  # a folder of report folders: 'plain' is found and refused
    # beside a profiled report, one analysed without --profile is skipped and named
    _write(_with_law(profiled), tmp_path / "mixed" / "profiled")
    _write(dataclasses.replace(profiled, profile=None), tmp_path / "mixed" / "plain")
    _write(_with_law(profiled), tmp_path / "mixed" / "profiled2")
    _write(_with_law(profiled), tmp_path / "mixed" / "profiled3")
    result = fit_from_profiles([tmp_path / "mixed"])
    assert any("skipped" in n and "plain" in n for n in result.notes)
    other = dict(profiled.device_spec, name="other")
    _write(dataclasses.replace(_with_law(profiled), device_spec=other), tmp_path / "a" / "x")
    _write(_with_law(profiled), tmp_path / "a" / "y")
    with pytest.raises(UserError, match="different device specs") as err:
        fit_from_profiles([tmp_path / "a"])
    assert "other: x" in str(err.value)  # which folder used which spec (a fresh user could not tell)


def test_a_model_profiled_twice_is_never_both_fitted_and_tested(profiled, tmp_path):
    """A reviewer gave two profile runs of the same files: every third folder was held out, and 20 of the 21
    held-out models had their other run in the fit set, reported as "the fit never saw". The split is by model."""
    from fusion_advisor.devices.fit_profiles import split_reports

    lawful = _with_law(profiled)
    for day in ("mon", "tue"):
        for m in ("a", "b", "c", "d", "e", "f"):
            _write(lawful, tmp_path / day / f"{day}_{m}", model=m)
    reports = [read_report(f) for f in sorted((tmp_path / "mon").iterdir()) + sorted((tmp_path / "tue").iterdir())]
    fit, held, how = split_reports(reports, None)
    fitted, tested = {r.analysis.model_name for r in fit}, {r.analysis.model_name for r in held}
    assert tested == {"c", "f"} and not fitted & tested and len(held) == 4
    assert how == "every third model in name order held out: 2 of 6 (4 of 12 reports)"
    # a --test set holding another run of a fitted model: that report is fitted only, and the note says so
    _write(lawful, tmp_path / "wed" / "again_a", model="a")
    _write(lawful, tmp_path / "wed" / "new_g", model="g")
    result = fit_from_profiles([tmp_path / "mon"], [tmp_path / "wed"])
    assert result.test_reports == ("new_g",)
    assert "1 of it profile a model the fit set holds too (again_a)" in result.notes[0]


def test_reports_of_one_spec_name_but_other_contents_are_not_fitted_together(profiled, tmp_path):
    """An older "h200" (no host costs, no tables) beside the current one: the fit read an older report's times
    against the newer spec (copy/cat fitted 55.7x). Specs are compared by contents, names kept in the message."""
    lawful = _with_law(profiled)
    older = dict(lawful.device_spec, memory_bandwidth_gbps=lawful.device_spec["memory_bandwidth_gbps"] / 2)
    _write(dataclasses.replace(lawful, device_spec=older), tmp_path / "a" / "old")
    _write(lawful, tmp_path / "a" / "new")
    name = lawful.device_spec["name"]
    with pytest.raises(UserError, match=rf"different device specs \({name} \(version 1 of 2 by its contents\): "
                                        rf"new; {name} \(version 2 of 2 by its contents\): old\)"):
        fit_from_profiles([tmp_path / "a"])
    # the same contents with other source notes are one spec
    renoted = dict(lawful.device_spec, source="written on another day")
    _write(dataclasses.replace(lawful, device_spec=renoted), tmp_path / "b" / "x")
    _write(lawful, tmp_path / "b" / "y")
    _write(lawful, tmp_path / "b" / "z")
    assert fit_from_profiles([tmp_path / "b"]).fit_reports


def test_profiles_of_another_gpu_than_the_specs_are_named(profiled, tmp_path):
    """--base h200 over H100 profiles wrote an "h200-fitted" spec without a word (found by a reviewer)."""
    from fusion_advisor.devices.fit_profiles import other_gpu_notes

    def on(gpu: str, folder: str):
        prof = dataclasses.replace(_with_law(profiled).profile, device="cuda", device_name=gpu)
        return read_report(_write(dataclasses.replace(profiled, profile=prof), tmp_path / folder))

    h100, h200 = on("NVIDIA H100 80GB HBM3", "a"), on("NVIDIA H200", "b")
    for name in ("h200", "h200-fitted", "calibrated-whatever"):  # the device is the display name's, not the name's
        spec = dataclasses.replace(load_spec("h200"), name=name)
        assert other_gpu_notes([h100, h200], spec) == [
            "1 report(s) were profiled on NVIDIA H100 80GB HBM3, not on the spec's NVIDIA H200 SXM (141 GB HBM3e) "
            "(a): their times are set against another GPU's rates"]
    assert other_gpu_notes([h100], load_spec("h100")) == [] and other_gpu_notes([h100], load_spec("cpu")) == []
    # a calibrated spec of the same GPU, whatever it is called (a reviewer: 'calibrated-nvidia-h100-80gb-hbm3' read
    # as the device 'calibrated'); an A10 is not an A100; a name without a model token makes no claim
    mine = dataclasses.replace(load_spec("h100"), name="calibrated-nvidia-h100-80gb-hbm3",
                               display_name="NVIDIA H100 80GB HBM3")
    assert other_gpu_notes([h100], mine) == []
    a10 = dataclasses.replace(load_spec("a100"), display_name="NVIDIA A10")
    assert len(other_gpu_notes([on("NVIDIA A100-SXM4-40GB", "c")], a10)) == 1
    assert other_gpu_notes([on("NVIDIA GeForce RTX 4090", "d")], load_spec("h200")) == []


def test_cli_prints_the_table_and_never_overwrites_a_file_not_ours(reports, tmp_path):
    root, _, _ = reports
    runner = CliRunner()
    out = tmp_path / "fitted.yaml"
    res = runner.invoke(app, ["calibrate", "--from-profile", str(root / "fit"), "--test", str(root / "test"),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "chains ±30%" in res.output and "test after" in res.output and "test set: 2 the fit never saw" in res.output
    # which spec 'before' is: the reports' own or --base's (a fresh user's two runs both read "spec h200 before")
    assert "the reports' own, as they were analysed" in " ".join(res.output.split())
    assert out.is_file()
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\n")
    res = runner.invoke(app, ["calibrate", "--from-profile", str(root / "fit"), "--out", str(mine)])
    assert res.exit_code != 0 and "not written by fusion-advisor calibrate" in res.output
    assert mine.read_text() == "name: mine\n"
    res = runner.invoke(app, ["calibrate", "--test", str(root / "test")])
    assert res.exit_code == 2 and "--from-profile" in res.output


def test_graph_calls_come_from_the_profile_and_a_fitted_spec_is_not_mistaken_for_repeats(profiled, tmp_path):
    from fusion_advisor.devices.fit_profiles import _graph_calls

    lawful = _with_law(profiled)
    assert lawful.profile.graph_calls == {"0": 1.0}  # recorded by analyze --profile
    assert _graph_calls(lawful, parse_spec(spec_fields(lawful.device_spec), "t")) == {0: 1.0}
    twice = dataclasses.replace(lawful, profile=dataclasses.replace(lawful.profile, graph_calls={"0": 2.0}))
    assert _graph_calls(twice, parse_spec(spec_fields(twice.device_spec), "t")) == {0: 2.0}
    # a report of before the field, analysed with a spec holding fits (all ops 3x): inferred with the fits, the
    # stored prediction is one call's; without them (the bug) it read as 3 calls per run
    spec = parse_spec(spec_fields(lawful.device_spec), "t")
    fitted = dataclasses.replace(spec, op_time_fits={k: OpTimeFit(scale=3.0) for k in
                                                     ("matmul", "pointwise", "copy", "normalization", "other")})
    stored = eager_in_model_us(lawful.chains, lawful.ops, fitted)
    chains = {cid: dataclasses.replace(m, predicted_us=stored[cid]) for cid, m in lawful.profile.chains.items()}
    old = dataclasses.replace(lawful, device_spec=fitted.to_dict(),
                              profile=dataclasses.replace(lawful.profile, chains=chains, graph_calls={}))
    folder = _write(old, tmp_path / "old")
    assert read_report(folder).graph_calls == {0: 1.0}
    # the ratio is read as calls only where the chains agree on a whole number: a pricing change since the report
    # (every chain's stored prediction 4.6x, or ratios that disagree) is one call, not 5 (a one-op cumsum read 5)
    for factors in ({cid: 4.6 for cid in stored}, {cid: 2.0 + i for i, cid in enumerate(stored)}):
        drifted = {cid: dataclasses.replace(m, predicted_us=stored[cid] * factors[cid])
                   for cid, m in lawful.profile.chains.items()}
        doc = dataclasses.replace(old, profile=dataclasses.replace(old.profile, chains=drifted))
        assert _graph_calls(doc, fitted) == {0: 1.0}
    looped = {cid: dataclasses.replace(m, predicted_us=stored[cid] * 3.01) for cid, m in lawful.profile.chains.items()}
    doc = dataclasses.replace(old, profile=dataclasses.replace(old.profile, chains=looped))
    assert _graph_calls(doc, fitted) == {0: 3.0}


def test_classes_priced_from_a_measured_table_keep_one_factor():
    from fusion_advisor.devices.fit_profiles import OpSample, fit_op_times

    r = [1.0, 3.0, 10.0, 30.0, 100.0, 300.0]
    ts = [10.0 * x ** 0.6 for x in r]  # a curve a slope would follow
    free = fit_op_times([OpSample("m", f"o{i}", ("conv/conv2d/fp32", "conv/conv2d", "conv"), x, t)
                         for i, (x, t) in enumerate(zip(r, ts))])
    rated = fit_op_times([OpSample("m", f"o{i}", ("conv/conv2d/fp32", "conv/conv2d", "conv"), x, t, True)
                          for i, (x, t) in enumerate(zip(r, ts))])
    assert free[0].fit.exponent < 1.0 and all(c.fit.exponent == 1.0 for c in rated)


def test_a_memory_bound_op_beyond_the_fitted_sizes_keeps_the_microseconds_l2_saved_not_the_ratio():
    from fusion_advisor.analyze.roofline import _op_time_us

    fit = OpTimeFit(scale=0.8, exponent=1.0, min_us=1.0, max_us=20.0, samples=9)  # in-model ops partly in L2
    assert fit(10.0, bounded_gain=True) == pytest.approx(8.0)  # inside the fitted range: the measured ratio
    assert fit(3000.0) == pytest.approx(2400.0)  # a table correction scales
    assert fit(3000.0, bounded_gain=True) == pytest.approx(2996.0)  # the 4 us the largest fitted op saved
    slow = OpTimeFit(scale=1.5, exponent=1.0, min_us=1.0, max_us=20.0)
    assert slow(3000.0, bounded_gain=True) == pytest.approx(4500.0)  # a loss fitted up to 20 us still scales
    # a loss fitted on small ops alone is their kernels' fixed time: the microseconds carry on, not the ratio (an
    # H200 clamp_min fit of 1 us ops priced a 10 ms op at 1.36x its roofline)
    tiny = OpTimeFit(scale=1.36, exponent=1.0, min_us=0.88, max_us=1.03)
    assert tiny(1.0, bounded_gain=True) == pytest.approx(1.36)
    assert tiny(10000.0, bounded_gain=True) == pytest.approx(10000.0 + 0.36 * 1.03)
    assert tiny(10000.0) == pytest.approx(13600.0)  # a table correction (not bounded_gain) scales
    n = 4096 * 393216
    x = TensorMeta((4096, 393216), "fp32", n, 4 * n)
    op = OpInfo("g0:n0", 0, "aten.hardtanh.default", "pointwise", (x,), (x,), n, 4 * n, 4 * n, "",
                SourceLoc("m.py", 1, "F.hardtanh(x)"))
    spec = load_spec("h200")
    roof = roofline_op_us(op, spec)
    fitted = dataclasses.replace(spec, op_time_fits={"pointwise/hardtanh": fit})
    assert _op_time_us(op, fitted) == pytest.approx(roof - 4.0)


def test_a_model_is_judged_by_its_plain_wall_time_not_the_attributed_total(profiled):
    from fusion_advisor.devices.fit_profiles import model_eager_us

    prof = profiled.profile
    stamped_slow = dataclasses.replace(prof, total_us=1.8 * prof.eager_wall_us)
    assert model_eager_us(stamped_slow) == prof.eager_wall_us > 0
    unmeasured = dataclasses.replace(prof, eager_wall_us=0.0)
    assert model_eager_us(unmeasured) == prof.total_us


def _host_timed(lawful, spec):
    """``lawful`` with every launching op's measured host time 1.5x its price on ``spec`` (views before it
    included), the graph's first op's 9x."""
    from fusion_advisor.analyze.op_classes import launches
    from fusion_advisor.analyze.roofline import op_host_us, view_host_us

    nodes, pending, first = dict(lawful.profile.nodes), 0.0, True
    for op in lawful.ops:
        if op.is_view:
            pending += view_host_us(op, spec)
            continue
        if op.id in nodes and launches(op):
            nodes[op.id] = dataclasses.replace(nodes[op.id], host_us=(9.0 if first else 1.5)
                                               * (op_host_us(op, spec) + pending))
            first = False
        pending = 0.0 if launches(op) else pending
    return dataclasses.replace(lawful, profile=dataclasses.replace(lawful.profile, nodes=nodes))


def test_the_host_time_scale_is_fitted_from_ops_the_gpu_waited_for(profiled, tmp_path, monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    spec = parse_spec(spec_fields(profiled.device_spec), "test")
    lawful = _with_law(profiled)
    timed = _host_timed(lawful, spec)
    nodes = timed.profile.nodes
    fit = [_write(timed, tmp_path / "fit" / f"m{i}") for i in range(4)]
    monkeypatch.setattr(fp, "MIN_HOST_SAMPLES", 1)
    monkeypatch.setattr(fp, "MIN_MODEL_HOST_SAMPLES", 1)
    monkeypatch.setattr(fp, "SHRINK_SAMPLES", 0.0)
    scale, n = fp.fit_host_time_scale([read_report(f) for f in fit], fp.without_fits(spec))
    assert scale == pytest.approx(1.5) and n > 0  # the graph's first op (its entry) is left out
    monkeypatch.setattr(fp, "SHRINK_SAMPLES", 5.0)  # four models: 4/9 of the way in log space
    assert fp.fit_host_time_scale([read_report(f) for f in fit], spec)[0] == pytest.approx(1.5 ** (4 / 9))
    result = fit_from_profiles([tmp_path / "fit"])
    assert result.spec.host_time_scale == pytest.approx(1.5 ** (3 / 8), abs=1e-4)  # three of four fitted on
    waited = {op_id: dataclasses.replace(m, idle_us=0.0) for op_id, m in nodes.items()}
    idle = dataclasses.replace(lawful, profile=dataclasses.replace(lawful.profile, nodes=waited))
    assert fp.host_samples(read_report(_write(idle, tmp_path / "busy")), spec) == []  # the GPU never waited


def test_a_host_time_scale_prices_every_eager_host_term(profiled):
    from fusion_advisor.analyze.roofline import op_host_us, view_host_us

    spec = parse_spec(spec_fields(profiled.device_spec), "test")
    scaled = dataclasses.replace(spec, host_time_scale=2.0)
    op = next(o for o in profiled.ops if not o.is_view)
    assert op_host_us(op, scaled) == pytest.approx(2.0 * op_host_us(op, spec))
    view = next((o for o in profiled.ops if o.is_view and "getitem" not in o.target), None)
    if view is not None:
        assert view_host_us(view, scaled) == pytest.approx(2.0 * view_host_us(view, spec))
    text = parse_spec({**spec_mapping(spec), "host_time_scale": 1.25}, "t")
    assert text.host_time_scale == 1.25 and "host_time_scale" not in spec_mapping(spec)  # 1: not written
    with pytest.raises(DeviceSpecError, match="host_time_scale"):
        parse_spec({**spec_mapping(spec), "host_time_scale": 0}, "t")


def test_a_class_of_sub_nanosecond_roofline_times_is_written_loadable(reports):
    from fusion_advisor.devices.fit_profiles import fitted_spec_data

    root, _, _ = reports
    result = fit_from_profiles([root / "fit"], [root / "test"])
    tiny = dataclasses.replace(result.classes[0], fit=dataclasses.replace(result.classes[0].fit, min_us=4e-5,
                                                                          max_us=6e-5))
    data = fitted_spec_data(dataclasses.replace(result, classes=(tiny, *result.classes[1:])), "2026-12-03")
    assert data["op_time_fits"][tiny.key]["min_us"] == 4e-5 and data["op_time_fits"][tiny.key]["max_us"] == 6e-5


def test_each_host_bound_model_has_one_vote_in_the_host_time_scale(monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    # one model with 300 ops at 2x its price, three with 12 ops at 1.2x: pooled, the big model would decide
    samples = {"big": [(20.0, 10.0)] * 300, "a": [(12.0, 10.0)] * 12, "b": [(12.0, 10.0)] * 12,
               "c": [(12.0, 10.0)] * 12, "tiny": [(90.0, 10.0)] * 3}
    monkeypatch.setattr(fp, "host_samples", lambda rep, spec: samples[rep])
    monkeypatch.setattr(fp, "SHRINK_SAMPLES", 0.0)
    scale, n = fp.fit_host_time_scale(list(samples), None)
    assert scale == pytest.approx(1.2) and n == 336  # the median of 2.0, 1.2, 1.2, 1.2; "tiny" has too few to vote
    monkeypatch.setattr(fp, "SHRINK_SAMPLES", 4.0)  # four voters: half the way to 1 in log space
    assert fp.fit_host_time_scale(list(samples), None)[0] == pytest.approx(1.2 ** 0.5)
    assert fp.fit_host_time_scale(["tiny"], None) is None  # no model with enough ops to vote
    assert fp.fit_host_time_scale(["a", "tiny"], None) is None  # one voter, but 12 ops: under MIN_HOST_SAMPLES
    monkeypatch.setattr(fp, "MIN_HOST_SAMPLES", 1)
    assert fp.fit_host_time_scale(["tiny"], None) is None  # few ops needed, but still nobody to vote


def test_measured_bound_classes_are_judged_against_the_judged_specs_ceilings(profiled, tmp_path):
    """The compute-or-memory part of a measured class holds no time (FLOPs over the peak against bytes over the
    bandwidth): a report recorded against one spec's ceilings is reclassified against the spec it is judged on."""
    from fusion_advisor.devices.fit_profiles import measured_bounds, residuals

    rep = read_report(_write(_with_law(profiled, idle_us=0.0), tmp_path / "r"))  # every chain recorded "memory"
    spec = parse_spec(spec_fields(profiled.device_spec), "test")
    fast_memory = dataclasses.replace(spec, memory_bandwidth_gbps=1e12)
    slow_memory = dataclasses.replace(spec, memory_bandwidth_gbps=1e-6)
    with_flops = {c.id for c in rep.analysis.chains if c.flops > 0 and c.id in rep.analysis.profile.chains}
    assert with_flops
    assert {measured_bounds(rep, fast_memory)[cid] for cid in with_flops} == {"compute"}
    assert set(measured_bounds(rep, slow_memory).values()) == {"memory"}
    rows, _ = residuals(rep, "test", fast_memory, fast_memory)
    assert {r.measured_bound for r in rows if r.chain_id in with_flops} == {"compute"}  # not the recorded class


def test_the_cold_host_scale_is_fitted_from_the_cold_ops_one_vote_per_model(monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    # cold ops at 3x their warm price in two models, 2x in a third, 2.5x twice in a fourth
    samples = {"a": [(30.0, 10.0)], "b": [(30.0, 10.0)], "c": [(20.0, 10.0)], "d": [(25.0, 10.0)] * 2, "none": []}
    monkeypatch.setattr(fp, "host_samples", lambda rep, spec, cold=False: samples[rep] if cold else [])
    monkeypatch.setattr(fp, "COLD_SHRINK_MODELS", 0.0)
    scale, ops, models = fp.fit_cold_host_scale(list(samples), None)
    assert (ops, models) == (5, 4) and scale == pytest.approx(math.exp((math.log(2.5) + math.log(3.0)) / 2))
    monkeypatch.setattr(fp, "COLD_SHRINK_MODELS", 4.0)  # four models: half the way to 1 in log space
    assert fp.fit_cold_host_scale(list(samples), None)[0] == pytest.approx(scale ** 0.5)
    assert fp.fit_cold_host_scale(["a", "b", "none"], None) is None  # two models with a cold op: too few


def test_host_samples_split_warm_and_cold_ops(profiled, tmp_path, monkeypatch):
    import fusion_advisor.analyze.roofline as rf
    import fusion_advisor.devices.fit_profiles as fp

    spec = parse_spec(spec_fields(profiled.device_spec), "test")
    rep = read_report(_write(_host_timed(_with_law(profiled), spec), tmp_path / "m"))
    warm = fp.host_samples(rep, spec)
    assert warm and fp.host_samples(rep, spec, cold=True) == []  # a small model runs every aten op within 64 launches
    monkeypatch.setattr(rf, "COLD_REUSE_LAUNCHES", 0)  # every op cold
    assert fp.host_samples(rep, spec, cold=True) == warm and fp.host_samples(rep, spec) == []


def test_a_cold_host_scale_is_read_written_and_removed_with_the_fits(profiled):
    from fusion_advisor.devices.fit_profiles import without_fits

    spec = parse_spec(spec_fields(profiled.device_spec), "test")
    cold = parse_spec({**spec_mapping(spec), "cold_host_scale": 2.5}, "t")
    assert cold.cold_host_scale == 2.5 and spec_mapping(cold)["cold_host_scale"] == 2.5
    assert "cold_host_scale" not in spec_mapping(spec) and without_fits(cold).cold_host_scale == 1.0
    with pytest.raises(DeviceSpecError, match="cold_host_scale"):
        parse_spec({**spec_mapping(spec), "cold_host_scale": -1}, "t")


def test_fit_from_profiles_fits_the_cold_scale_over_the_fitted_host_scale_and_writes_it(reports, monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    seen = []
    monkeypatch.setattr(fp, "fit_host_time_scale", lambda reps, spec: (1.25, 40))
    monkeypatch.setattr(fp, "fit_cold_host_scale",
                        lambda reps, spec: seen.append(spec.host_time_scale) or (2.5, 7, 3))
    root, _, _ = reports
    result = fp.fit_from_profiles([root / "fit"], [root / "test"])
    assert seen == [1.25] and result.spec.cold_host_scale == 2.5 and result.spec.host_time_scale == 1.25
    assert any(n.startswith("cold host scale 2.500 from 7 op(s) of 3 model(s)") for n in result.notes)
    data = fp.fitted_spec_data(result, "2026-12-06")
    assert data["cold_host_scale"] == 2.5 and "fit_cold_host_scale" in data["cold_host_scale_source"]
    monkeypatch.setattr(fp, "fit_cold_host_scale", lambda reps, spec: None)
    plain = fp.fit_from_profiles([root / "fit"], [root / "test"])
    assert plain.spec.cold_host_scale == 1.0 and "cold_host_scale" not in fp.fitted_spec_data(plain, "2026-12-06")
    assert any(n.startswith("cold host scale 1: fewer than") for n in plain.notes)


def test_cpu_profiles_say_why_no_host_scale_is_fitted(reports):
    """CPU profiles read "no model with 8 or more ops the GPU waited for" (found by a fresh user): on a CPU each op's
    measured time holds its own host time, and the note says that instead."""
    root, _, _ = reports
    notes = fit_from_profiles([root / "fit"], [root / "test"]).notes
    assert "host, view host and cold host scales 1: the fit set's profiles ran on a CPU, where each op's measured " \
           "time holds its own host time (no GPU waits for the host)" in notes
    assert not any("GPU waited for" in n for n in notes)


def test_without_fits_drops_the_fitted_fields_sources(profiled):
    from fusion_advisor.devices.fit_profiles import without_fits

    spec = parse_spec({**spec_mapping(parse_spec(spec_fields(profiled.device_spec), "t")), "host_time_scale": 1.2,
                       "host_time_scale_source": "fitted", "cold_host_scale": 2.0, "cold_host_scale_source": "fitted"},
                      "t")
    plain = without_fits(spec)
    assert "host_time_scale" not in plain.sources and "cold_host_scale" not in plain.sources
    assert "host_time_scale_source" not in spec_mapping(plain) and "cold_host_scale_source" not in spec_mapping(plain)


def test_a_models_prediction_adds_the_eager_work_no_output_uses(profiled, tmp_path):
    """The model as written runs the work no output uses (``Analysis.unused``) and no chain holds it: the model's
    residual adds its eager time, the chains' residuals do not change."""
    from fusion_advisor.analyze.records import UnusedWork
    from fusion_advisor.devices import load_spec
    from fusion_advisor.devices.fit_profiles import read_report, residuals

    spec = load_spec("h200")
    rep = read_report(_write(profiled, tmp_path / "plain"))
    rows, model = residuals(rep, "test", spec, spec)
    dead = dataclasses.replace(rep, analysis=dataclasses.replace(
        rep.analysis, unused=UnusedWork(ops=1, eager_us=1234.5, flops=0, bytes=8, lines=["m.py:3"])))
    rows2, model2 = residuals(dead, "test", spec, spec)
    assert model2.before_us == pytest.approx(model.before_us + 1234.5)
    assert model2.after_us == pytest.approx(model.after_us + 1234.5)
    assert [r.after_us for r in rows2] == [r.after_us for r in rows]


def test_the_view_host_scale_is_fitted_from_ops_after_views_one_vote_per_model(monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    # (measured, own price, views' price): views at 2x their price in one model, 2 ** 1.5 in another; a third
    # model's ops follow no view; a fourth has too few ops to vote
    def ops(scale, n=12):
        return [(10.0 + scale * v, 10.0, v) for v in (2.0, 4.0, 6.0)] * (n // 3)

    samples = {"a": ops(2.0), "b": ops(2 ** 1.5), "plain": [(12.0, 10.0, 0.0)] * 30, "few": ops(8.0, n=3)}
    monkeypatch.setattr(fp, "_waited_ops", lambda rep, spec, cold=False: samples[rep])
    monkeypatch.setattr(fp, "VIEW_SHRINK_MODELS", 0.0)
    scale, n, models = fp.fit_view_host_scale(list(samples), None)
    assert (n, models) == (24, 2) and scale == pytest.approx(2 ** 1.25)  # the median of the two votes, in log
    monkeypatch.setattr(fp, "VIEW_SHRINK_MODELS", 2.0)  # two voters: half the way to 1 in log space
    assert fp.fit_view_host_scale(list(samples), None)[0] == pytest.approx(2 ** 0.625)
    assert fp.fit_view_host_scale(["plain", "few"], None) is None  # nobody votes


def test_a_view_host_scale_prices_views_alone_and_is_read_written_and_removed_with_the_fits(profiled):
    from fusion_advisor.analyze.roofline import op_host_us, view_host_us
    from fusion_advisor.devices.fit_profiles import without_fits

    spec = dataclasses.replace(parse_spec(spec_fields(profiled.device_spec), "test"), view_overhead_us=2.0)
    scaled = dataclasses.replace(spec, view_host_scale=3.0)
    view = OpInfo(id="v", graph_index=0, target="aten.view.default", category="view", inputs=(), outputs=(), flops=0,
                  bytes_read=0, bytes_written=0, module_path="", source=SourceLoc("", 0, ""))
    op = next(o for o in profiled.ops if not o.is_view)
    assert view_host_us(view, scaled) == pytest.approx(3.0 * view_host_us(view, spec)) and view_host_us(view, spec) > 0
    assert op_host_us(op, scaled) == op_host_us(op, spec)
    text = parse_spec({**spec_mapping(spec), "view_host_scale": 1.75}, "t")
    assert text.view_host_scale == 1.75 and spec_mapping(text)["view_host_scale"] == 1.75
    assert "view_host_scale" not in spec_mapping(spec) and without_fits(text).view_host_scale == 1.0
    with pytest.raises(DeviceSpecError, match="view_host_scale"):
        parse_spec({**spec_mapping(spec), "view_host_scale": 0}, "t")


def test_the_host_and_view_scales_are_fitted_in_turn_and_written(reports, monkeypatch):
    import fusion_advisor.devices.fit_profiles as fp

    seen = []

    def host(reps, spec):
        seen.append(("host", spec.view_host_scale))
        return (1.25, 40)

    def view(reps, spec):
        seen.append(("view", spec.host_time_scale))
        return (2.0, 30, 2)

    monkeypatch.setattr(fp, "fit_host_time_scale", host)
    monkeypatch.setattr(fp, "fit_view_host_scale", view)
    root, _, _ = reports
    result = fp.fit_from_profiles([root / "fit"], [root / "test"])
    # each fit over the other's last value: the host time scale prices the views before an op too
    assert seen == [("host", 1.0), ("view", 1.25)] + [("host", 2.0), ("view", 1.25)] * (fp.HOST_FIT_ROUNDS - 1)
    assert result.spec.view_host_scale == 2.0 and result.spec.host_time_scale == 1.25
    assert any(n.startswith("view host scale 2.000 from 30 op(s) after a view of 2 model(s)") for n in result.notes)
    data = fp.fitted_spec_data(result, "2026-12-06")
    assert data["view_host_scale"] == 2.0 and "fit_view_host_scale" in data["view_host_scale_source"]


def test_cpu_profiles_are_not_fitted_into_a_gpus_spec(reports):
    """A fresh user's CPU profiles fitted with --base h200 wrote an "NVIDIA H200" spec whose fits priced a GEMM 3.2x
    slower, and a model read 5.33x vs eager, with no warning."""
    root, fit, _ = reports
    with pytest.raises(UserError, match=r"were profiled on a CPU .* the spec to fit, h200, is a GPU's"):
        fit_from_profiles(fit, base=load_spec("h200"))
    assert fit_from_profiles(fit, base=load_spec("cpu")).spec.op_time_fits  # their own device's spec fits


def test_a_fit_that_prices_its_sets_worse_than_its_base_is_warned():
    """calibrate --from-profile wrote fits that tested worse than their base (88% -> 74% chains within 30%; a fresh
    user's busy-CPU profiles 3.78 -> 4.20 median |log2 error|) without a word."""
    from fusion_advisor.devices.fit_profiles import worse_after_fit

    def split(before, after):
        return {"before": {"median_log2_error": before, "chains_30pct": 0.88},
                "after": {"median_log2_error": after, "chains_30pct": 0.74}}

    notes = worse_after_fit({"fit": split(0.3, 0.2), "test": split(0.25, 0.4)})
    assert notes == ["on the test set the fit prices chains worse than the spec without profile fits (the "
                     "'before' column: median |log2 error| 0.25 -> 0.40, chains within 30% 88% -> 74%): profiles "
                     "unlike the models you will analyse, or too few of them; the spec is written, but the base "
                     "may serve better"]
    assert worse_after_fit({"fit": split(0.3, 0.2), "test": {}}) == []


def test_measuring_options_with_from_profile_are_refused(reports):
    """calibrate --from-profile --quick exited 0, --quick ignored (a fresh user)."""
    root, fit, _ = reports
    for flag in (["--quick"], ["--device", "cpu"]):
        r = CliRunner().invoke(app, ["calibrate", "--from-profile", str(fit[0]), *flag])
        assert r.exit_code == 2 and "--from-profile measures nothing" in r.output, r.output


def test_a_profile_whose_ops_took_far_longer_than_the_model_is_left_out_of_the_fit(profiled, tmp_path):
    """A reviewer's busy 2-core profile (ops 30x the plain model's wall time) was fitted: pointwise at 885x."""
    lawful = _with_law(profiled)
    busy = dataclasses.replace(lawful, profile=dataclasses.replace(
        lawful.profile, notes=[*lawful.profile.notes, f"the profiled ops took 30x ...; {NOT_THE_MODELS_TIMES} (...)"]))
    for i in range(4):
        _write(lawful, tmp_path / "fit" / f"m{i}")
    _write(busy, tmp_path / "fit" / "busy")
    result = fit_from_profiles([tmp_path / "fit"])
    assert "busy" not in result.fit_reports + result.test_reports
    assert any(n.startswith("left out (their profiles say their per-op times are not the model's") and "busy" in n
               for n in result.notes), result.notes
    with pytest.raises(UserError, match="every profiled report says its per-op times are not the model's"):
        fit_from_profiles([tmp_path / "fit" / "busy"])
