"""calibrate: the spec YAML it writes loads with the device-spec loader and drives analyze; unmeasured rates are
copied and labelled; a file it did not write is never overwritten."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fusion_advisor.analyze.pipeline import analyze
from fusion_advisor.devices.calibrate import MARKER, Calibration, Sizes, calibrate, closest_shipped_spec, render_spec, spec_dict
from fusion_advisor.cli import app
from fusion_advisor.devices import load_spec
from fusion_advisor.errors import CalibrationError

MLP = Path(__file__).parent / "data" / "models" / "profile_mlp.py"


@pytest.fixture(scope="module")
def cpu_spec(tmp_path_factory):
    """One quick CPU calibration written to a file: its path, its spec mapping and the measurement itself (tests
    of what calibrate does with a measurement reuse it rather than measure again: ~13 s each)."""
    import fusion_advisor.devices.calibrate as calibrate_module

    path = tmp_path_factory.mktemp("cal") / "cpu.yaml"
    steps: list[str] = []
    measured: list[Calibration] = []
    measure = calibrate_module.measure
    with pytest.MonkeyPatch.context() as mp:  # a module-scoped fixture: no monkeypatch fixture
        mp.setattr(calibrate_module, "measure", lambda *a, **k: measured.append(measure(*a, **k)) or measured[-1])
        written, data = calibrate(path, device="cpu", quick=True, progress=steps.append)
    assert written == path
    # progress: one line per measurement as it starts, numbered to the last one
    assert steps[0].startswith("copy bandwidth (cpu) (1 of ")
    n = len(steps)
    assert steps[-1].endswith(f"({n} of {n})") and any(s.startswith("matmul bf16") for s in steps)
    return path, data, measured[0]


def test_cpu_spec_loads_and_is_labelled(cpu_spec):
    path, data, _ = cpu_spec
    text = path.read_text()
    assert text.splitlines()[0] == MARKER
    spec = load_spec(str(path))
    assert spec.kind == "cpu" and spec.name.startswith("calibrated-")
    assert spec.memory_bandwidth_gbps > 0 and spec.launch_overhead_us > 0
    assert set(spec.tensor_tflops) == {"bf16", "fp16", "tf32", "fp32"}
    assert spec.sources["memory_bandwidth"].startswith("measured by fusion-advisor calibrate on ")
    assert "torch " + str(torch.__version__) in spec.sources["memory_bandwidth"]
    assert "copied from the shipped spec cpu" in spec.sources["vector_tflops"]
    assert "no TF32 on a CPU" in spec.sources["tensor_tflops"]
    # the same top-level fields as the shipped specs (plus the calibration block)
    shipped = yaml.safe_load((Path(load_spec.__code__.co_filename).parent / "cpu.yaml").read_text())
    assert set(shipped) <= set(yaml.safe_load(text))
    assert data["calibration"]["sizes"]["matmul_n"] == Sizes.for_device("cpu", quick=True).matmul_n
    assert data["calibration"]["quick"] is True  # said in the spec itself (a fresh user found only matmul_n)


def test_analyze_accepts_the_calibrated_spec(cpu_spec):
    path, data, _ = cpu_spec
    a = analyze(MLP, device="meta", gpu=str(path))
    assert a.device_spec["name"] == data["name"]
    assert a.device_spec["memory_bandwidth_gbps"] == pytest.approx(data["memory_bandwidth_gbps"])
    c0 = a.chains[0]
    assert a.estimates[c0.id].peak_tflops == pytest.approx(data["tensor_tflops"]["fp32"])


def test_never_overwrites_a_foreign_file(tmp_path, cpu_spec, monkeypatch):
    import fusion_advisor.devices.calibrate as calibrate_module

    monkeypatch.setattr(calibrate_module, "measure", lambda *a, **k: cpu_spec[2])  # the files are the question here
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\n")
    with pytest.raises(CalibrationError, match="not written by fusion-advisor calibrate"):
        calibrate(mine, device="cpu", quick=True)
    assert mine.read_text() == "name: mine\n"
    with pytest.raises(CalibrationError, match="is a directory"):
        calibrate(tmp_path, device="cpu", quick=True)
    with pytest.raises(CalibrationError, match=r"\.yaml file"):
        calibrate(tmp_path / "spec.txt", device="cpu", quick=True)
    # its own file may be replaced
    own = tmp_path / "own.yaml"
    own.write_text(cpu_spec[0].read_text().replace("launch_overhead_us:", "launch_overhead_us: 1 #"))
    calibrate(own, device="cpu", quick=True)
    assert own.read_text() == cpu_spec[0].read_text()


def test_cli_calibrate_refuses_bad_arguments_before_it_starts_measuring(tmp_path, monkeypatch):
    # a new user saw "measuring copy bandwidth, ..." before the error on a foreign --out or --device cuda without a GPU
    import fusion_advisor.devices.calibrate as calibrate_module

    def never(*a, **k):
        raise AssertionError("measured despite bad arguments")

    monkeypatch.setattr(calibrate_module, "measure", never)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    foreign = tmp_path / "mine.yaml"
    foreign.write_text("name: mine\n")
    for args, says in ((["--out", str(foreign)], "not written by fusion-advisor calibrate"),
                       (["--device", "cuda", "--out", str(tmp_path / "new.yaml")], "no CUDA GPU is available")):
        res = CliRunner().invoke(app, ["calibrate", *args])
        assert res.exit_code == 2 and says in res.output and "measuring" not in res.output, res.output



def test_an_unwritable_out_folder_is_refused_before_measuring_or_fitting(tmp_path, must_not_run, read_only_folders):
    """A read-only folder ran all of calibrate's steps (or the whole fit), then ended in "internal error:
    PermissionError" (found by a fresh user)."""
    must_not_run("fusion_advisor.devices.calibrate.measure", "measuring")
    must_not_run("fusion_advisor.devices.fit_profiles.fit_from_profiles", "the fit")
    for args in (["--device", "cpu"], ["--from-profile", str(tmp_path)]):
        res = CliRunner().invoke(app, ["calibrate", *args, "--out", str(tmp_path / "s.yaml")])
        assert res.exit_code == 2, res.output
        assert f"--out {tmp_path / 's.yaml'}: cannot write in {tmp_path}" in " ".join(res.output.split())


def _gpu_cal(name: str, copy_gbps: float = 4300.0) -> Calibration:
    return Calibration(device="cuda", device_name=name, date="2026-01-01",
                       versions={"torch": "2.11.0", "triton": "3.6.0"},
                       copy_gbps=copy_gbps, matmul_tflops={"fp32": 51.0, "tf32": 370.0, "bf16": 700.0, "fp16": 710.0},
                       matmul_notes={}, launch_us=6.5, kernel_floor_us=1.9, l2_bytes=62914560,
                       sizes=Sizes.for_device("cuda", l2_bytes=62914560), timer="do_bench median")


def test_gpu_spec_from_a_calibration():
    data = spec_dict(_gpu_cal("NVIDIA H200"))
    assert data["kind"] == "gpu" and data["calibration"]["base_spec"] == "h200"
    assert data["calibration"]["quick"] is False
    assert data["tensor_tflops"] == {"bf16": 700.0, "fp16": 710.0, "tf32": 370.0, "fp32": 51.0}
    assert data["vector_tflops"] == {k: float(v) for k, v in load_spec("h200").vector_tflops.items()}
    assert data["vector_tflops_source"] == "copied from the shipped spec h200 (not measured by calibrate)"
    assert "measured by fusion-advisor calibrate on NVIDIA H200, 2026-01-01, torch 2.11.0, triton 3.6.0" in \
        data["tensor_tflops_source"]
    assert "TF32 off" in data["tensor_tflops_source"] and "1.90 us" in data["launch_overhead_source"]
    assert data["memory_bandwidth_gbps"] == 4300.0 and data["launch_overhead_us"] == 6.5
    assert data["calibration"]["sizes"]["copy_bytes"] == max(8 * 62914560, 1 << 30)  # 8x L2, at least 1 GiB
    assert yaml.safe_load(render_spec(data)) == data
    assert "attention_tflops" not in data  # not measured: attention falls back to the matmul peak


def test_gpu_spec_records_the_measured_attention_rate():
    import dataclasses

    cal = dataclasses.replace(_gpu_cal("NVIDIA H200"), attention_tflops={"bf16": 395.25, "fp16": 401.5})
    data = spec_dict(cal)
    assert data["attention_tflops"] == {"bf16": 395.25, "fp16": 401.5}
    assert "scaled_dot_product_attention" in data["attention_tflops_source"]
    assert "(2, 32, 2048, 128)" in data["attention_tflops_source"]


def test_gpu_spec_records_the_host_time_per_compiled_call_and_graph_replay():
    import dataclasses

    from fusion_advisor.devices import parse_spec
    from fusion_advisor.devices.host_costs import CompiledCallCost

    cost = CompiledCallCost(19.5, 52.9, {"compiled": 4.0, "reduce-overhead": 8.14})
    data = spec_dict(dataclasses.replace(_gpu_cal("NVIDIA H200"), compiled_call=cost))
    assert data["compiled_call_us"] == 19.5 and data["graph_replay_us"] == 52.9
    assert "(4 adds) less one launch" in data["compiled_call_source"]
    assert "(8.14)" in data["graph_replay_source"]
    spec = parse_spec(yaml.safe_load(render_spec(data)), "calibrated.yaml")
    assert (spec.compiled_call_us, spec.graph_replay_us) == (19.5, 52.9)
    # a host twice as fast (the profile's probe at half the launch) halves both
    fast = spec.at_host_speed(spec.launch_overhead_us / 2)
    assert (fast.compiled_call_us, fast.graph_replay_us) == pytest.approx((9.75, 26.45))
    # CUDA graphs refused: the replay is not written
    alone = CompiledCallCost(16.0, None, {"compiled": 8.4})
    data = spec_dict(dataclasses.replace(_gpu_cal("NVIDIA H200"), compiled_call=alone))
    assert data["compiled_call_us"] == 16.0 and "graph_replay_us" not in data
    # a CPU calibration that measured none: the shipped cpu spec's compiled call, no replay (no CUDA graphs)
    cpu = dataclasses.replace(_gpu_cal("NVIDIA H200"), device="cpu", device_name="Some CPU")
    data = spec_dict(cpu, base=load_spec("cpu"))
    assert data["compiled_call_us"] > 0 and "graph_replay_us" not in data
    # not measured (--quick): the shipped spec's, at this host's speed, and said so
    quick = dataclasses.replace(_gpu_cal("NVIDIA H200"), not_measured={"compiled_call_us": "not measured with --quick"})
    data = spec_dict(quick)
    h200 = load_spec("h200")
    assert data["compiled_call_us"] == pytest.approx(h200.compiled_call_us * 6.5 / h200.launch_overhead_us, abs=1e-3)
    assert data["graph_replay_us"] == pytest.approx(h200.graph_replay_us * 6.5 / h200.launch_overhead_us, abs=1e-3)
    assert data["compiled_call_source"].startswith("copied from the shipped spec h200 (not measured with --quick)")


def test_closest_spec_of_an_unknown_gpu_is_by_bandwidth():
    assert closest_shipped_spec(_gpu_cal("NVIDIA L4", 250.0)).name == "l4"
    assert closest_shipped_spec(_gpu_cal("Some New GPU", 1900.0)).name == "a100"


def test_a_named_gpu_reads_its_own_spec_alone(monkeypatch):
    # the H100 and H200 specs take seconds each to read: a GPU whose name names a shipped spec reads that one only
    import fusion_advisor.devices.calibrate as cal_mod

    read = []
    monkeypatch.setattr(cal_mod, "load_spec", lambda name: read.append(name) or load_spec(name))
    assert closest_shipped_spec(_gpu_cal("NVIDIA H100 80GB HBM3")).name == "h100" and read == ["h100"]
    read.clear()
    assert closest_shipped_spec(_gpu_cal("NVIDIA A100-SXM4-80GB", 5000.0)).name == "a100" and read == ["a100"]


def test_cli_calibrate(tmp_path):
    runner = CliRunner()
    out = tmp_path / "c.yaml"
    r = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output and "GB/s" in r.output
    assert "copy bandwidth (cpu) (1 of" in r.output and "launch overhead per eager op" in r.output  # progress
    # what a CPU cannot measure is listed, each with its reason
    assert "not measured: " in r.output and "attention_tflops (GPU only" in r.output
    assert "unaligned_tensor_tflops (GPU only" in r.output
    r = runner.invoke(app, ["calibrate", "--device", "tpu", "--quick", "--out", str(tmp_path / "d.yaml")])
    assert r.exit_code == 2 and "unknown --device 'tpu'" in r.output
    if not torch.cuda.is_available():
        r = runner.invoke(app, ["calibrate", "--device", "cuda", "--out", str(tmp_path / "e.yaml")])
        assert r.exit_code == 2 and "no CUDA GPU" in r.output


def test_cpu_calibration_says_what_is_gpu_only(cpu_spec):
    path, data, _ = cpu_spec
    skipped = data["calibration"]["not_measured"]
    assert "GPU only" in skipped["attention_rates"] and "GPU only" in skipped["attention_tflops"]
    assert "attention_rates" not in data and "attention_tflops" not in data
    assert "GPU only" in skipped["kernel_busy_overhead_us"] and "kernel_busy_overhead_us" not in data
    spec = load_spec(str(path))
    assert spec.attention_rates == ()
    assert spec.strided_bandwidth_gbps == data["strided_bandwidth_gbps"] > 0  # a permuted copy runs on a CPU too
    assert "transpose(1, 2)" in spec.sources["strided_bandwidth"]
    assert spec.broadcast_bandwidth_gbps == data["broadcast_bandwidth_gbps"] > 0  # x + bias[:, None, None] too
    assert "[C, 1, 1]" in spec.sources["broadcast_bandwidth"]


def test_gpu_spec_records_attention_rates_and_strided_bandwidth():
    import dataclasses

    rates = [{"backend": "flash", "dtype": "bf16", "seq": 512, "head_dim": 128, "causal": False, "tflops": 410.5},
             {"backend": "math", "dtype": "bf16", "seq": 512, "head_dim": 64, "causal": False, "tflops": 12.25}]
    cal = dataclasses.replace(_gpu_cal("NVIDIA H200"), attention_rates=rates, strided_gbps=1612.345,
                              not_measured={"attention_rates cudnn fp32": "RuntimeError: No available kernel"})
    data = spec_dict(cal)
    assert data["attention_rates"] == rates and "sdpa_kernel" in data["attention_rates_source"]
    assert "fp16 not timed, priced by the bf16 entries" in data["attention_rates_source"]
    timed = dataclasses.replace(cal, attention_rates=rates + [dict(rates[0], dtype="fp16")])
    assert "fp16 not timed" not in spec_dict(timed)["attention_rates_source"]  # a pre-Ampere GPU times it
    assert data["strided_bandwidth_gbps"] == 1612.3
    assert data["calibration"]["not_measured"] == {"attention_rates cudnn fp32": "RuntimeError: No available kernel"}
    assert yaml.safe_load(render_spec(data)) == data
    from fusion_advisor.devices import parse_spec

    spec = parse_spec(yaml.safe_load(render_spec(data)), "x")
    assert spec.attention_peak_tflops("flash", "bf16", 512, 128) == (410.5, "rates")
    assert spec.attention_peak_tflops("math", "bf16", 4096, 64) == (12.25, "rates")
    assert spec.strided_bandwidth_gbps == 1612.3


def test_attention_flops_match_the_graph_formula():
    from fusion_advisor.devices.attention_rates import attention_flops

    assert attention_flops(2, 32, 2048, 128, False) == 4 * 2 * 32 * 2048 * 2048 * 128
    assert attention_flops(2, 32, 2048, 128, True) == 2 * 2 * 32 * 2048 * 2048 * 128


@pytest.mark.gpu
def test_measure_attention_rates_on_gpu():
    from fusion_advisor.devices.attention_rates import measure_attention_rates

    rates, skipped = measure_attention_rates(seqs=(256,), head_dims=(64,), dtypes=("bf16", "fp32"),
                                             configs=(("flash", "", False), ("math", "float", False)))
    got = {(r["backend"], r["dtype"]) for r in rates}
    assert {("flash", "bf16"), ("math", "bf16"), ("math", "fp32")} <= got
    assert all(r["tflops"] > 0 and r["seq"] == 256 and r["head_dim"] == 64 for r in rates)
    assert "flash fp32" in skipped  # flash takes fp16/bf16 only


@pytest.mark.gpu
def test_elementwise_overhead_and_unaligned_rate_on_gpu():
    from fusion_advisor.devices.calibrate import Sizes, measure_elementwise_overhead_us, measure_unaligned_matmul_tflops, timer_for

    sizes = Sizes.for_device("cuda", quick=True)
    t0 = measure_elementwise_overhead_us(3000.0, sizes, mib=(4, 16), kernels=4)
    assert t0 is not None and 0.0 <= t0 < 50.0
    from fusion_advisor.devices.memory_rates import measure_kernel_busy_overhead_us

    busy = measure_kernel_busy_overhead_us(3000.0, iters=10)  # the profiled kernel: no gap to the next one in it
    assert busy is not None and 0.0 < busy < t0 + 1.0
    assert measure_unaligned_matmul_tflops("cuda", "bf16", sizes, timer_for("cuda", sizes)) > 0


def test_quick_sizes_on_a_gpu_still_reach_the_ceilings():
    from fusion_advisor.devices.calibrate import Sizes

    s = Sizes.for_device("cuda", quick=True, l2_bytes=60 << 20)
    assert s.copy_bytes >= 4 * (60 << 20) and s.matmul_n >= 4096  # beyond L2; a matmul large enough for the peak
    assert Sizes.for_device("cpu", quick=True).copy_bytes < s.copy_bytes


def test_a_rate_far_under_the_shipped_spec_is_flagged_loudly():
    import dataclasses

    from fusion_advisor.devices.calibrate import Calibration, sanity_warnings
    from fusion_advisor.devices import load_spec

    h200 = load_spec("h200")
    fields = {f.name for f in dataclasses.fields(Calibration)}
    cal = Calibration(**{k: v for k, v in dict(
        device="cuda", device_name="NVIDIA H200", date="2026-12-01", versions={}, copy_gbps=2628.0,
        matmul_tflops={"bf16": 5.32, "fp32": 50.0}, matmul_notes={}, attention_tflops={}, attention_shape=(),
        attention_rates=(), unaligned_tflops={}, elementwise_overhead_us=None, strided_gbps=None, not_measured={},
        launch_us=10.0, kernel_floor_us=None, l2_bytes=0, timer="do_bench", sizes=None).items() if k in fields})
    warnings = sanity_warnings(cal, h200)
    assert len(warnings) == 1 and warnings[0].startswith("bf16 matmul measured 5.32 TFLOP/s, under 25% of the shipped")


def test_a_peak_far_under_the_calibrations_own_table_is_flagged_on_any_device():
    """A fresh user's quick CPU calibrate wrote an fp32 peak of 0.0062 TFLOP/s (a 256^3 matmul) beside matmul table
    entries at 0.22: the spec contradicted itself, and no check ran off a GPU."""
    import dataclasses

    from fusion_advisor.devices import MatmulRate
    from fusion_advisor.devices.calibrate import Calibration, Sizes, table_warnings

    fields = {f.name for f in dataclasses.fields(Calibration)}
    cal = Calibration(**{k: v for k, v in dict(
        device="cpu", device_name="a CPU", date="2026-12-07", versions={}, copy_gbps=20.0,
        matmul_tflops={"fp32": 0.00618, "bf16": 0.2}, matmul_notes={}, attention_tflops={}, attention_shape=(),
        attention_rates=(), unaligned_tflops={}, elementwise_overhead_us=None, strided_gbps=None, not_measured={},
        launch_us=10.0, kernel_floor_us=None, l2_bytes=0, timer="median", sizes=None,
        matmul_rates=[MatmulRate("mm", "fp32", 512, 512, 512, 1, 0.22), MatmulRate("mm", "bf16", 64, 64, 64, 1, 0.1)],
    ).items() if k in fields})
    warnings = table_warnings(cal)
    assert len(warnings) == 1 and warnings[0].startswith("fp32 matmul peak measured 0.00618 TFLOP/s, under 25% of "
                                                         "the fastest matmul this calibration timed")
    assert Sizes.for_device("cpu", quick=True).matmul_n == Sizes.for_device("cpu").matmul_n  # the full run's size


def test_pool_window_rate_is_measured_and_written(cpu_spec):
    path, data, _ = cpu_spec
    spec = load_spec(str(path))
    assert spec.pool_window_gelem_s > 0 and "max / avg pools" in spec.sources["pool_window_gelem_s"]
    probes = data["calibration"]["pool_probes"]
    assert {p["op"] for p in probes} >= {"max_pool2d", "avg_pool2d", "max_pool3d", "avg_pool1d"}
    assert all(p["time_us"] > 0 and p["window_reads"] > 0 for p in probes)


def test_the_sdpa_grid_times_fp16_only_where_bf16_is_not_native(monkeypatch):
    # sm80+: fp16 runs at bf16's rate and is priced by its entries; a T4 or V100 emulates bf16, so fp16 is timed
    from fusion_advisor.devices import attention_rates as ar

    monkeypatch.setattr(ar.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ar.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert ar.grid_dtypes() == ("bf16", "fp32")
    monkeypatch.setattr(ar.torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert ar.grid_dtypes() == ("fp16", "bf16", "fp32")


def test_a_slow_rate_keeps_its_significant_figures(cpu_spec):
    """A loaded CPU's bf16 matmul can run under 0.0005 TFLOP/s: rounded to three decimals it was 0, and the spec
    calibrate wrote failed its own loader ("a calibrate bug")."""
    import dataclasses

    _, _, cal = cpu_spec
    slow = dataclasses.replace(cal, matmul_tflops={**cal.matmul_tflops, "bf16": 0.000412})
    data = spec_dict(slow)
    assert data["tensor_tflops"]["bf16"] == 0.000412
    from fusion_advisor.devices import parse_spec

    assert parse_spec(data, "t").tensor_tflops["bf16"] == 0.000412  # the loader takes it
