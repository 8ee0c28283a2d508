"""Tests of fusion_advisor.kernel_tools.bench and the ``bench`` command.

On this CPU-only machine the kernels run under the Triton interpreter, so the tests check the bookkeeping
(fields, timer label, iteration counts, refusal before verification passes, compile-time reporting), never
speed. Real ``torch.compile`` on CPU costs tens of seconds here, so the compile path is driven through a stand-in
``torch.compile``; the real one is exercised by the GPU-only test at the end.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fusion_advisor.kernel_tools import bench as bench_mod
from fusion_advisor.kernel_tools.bench import TIMER_CPU, BenchResult, bench_kernel, time_cpu, time_cuda
from fusion_advisor.cli import app
from fusion_advisor.errors import VerificationFailed
from fusion_advisor.kernel_tools.verify import KernelContract, load_contract

KERNELS = Path(__file__).parent / "data" / "kernels"
runner = CliRunner()

#: Small budgets keep each bench to a dozen interpreter calls.
FAST = dict(warmup_ms=1.0, rep_ms=5.0)

CONTRACT_KEYS = {"kernel_time_ms", "reference_time_ms", "speedup", "warmup_iters", "benchmark_iters",
                 "compiled_reference_time_ms", "compile_time_ms", "device", "timer"}


def test_bench_cpu_fields():
    result = bench_kernel(load_contract(KERNELS / "vector_add.py"), compile_reference=False, **FAST)
    assert isinstance(result, BenchResult)
    d = result.to_dict()
    assert CONTRACT_KEYS <= set(d)
    assert d["timer"] == TIMER_CPU == "cpu-wallclock-median"
    assert d["device"].startswith("cpu")
    assert "say nothing about GPU speed" in d["note"]
    assert d["kernel_time_ms"] > 0 and d["reference_time_ms"] > 0
    # the interpreter's time against eager CPU's: no speedup is given (a fresh user read 0.00049 as one)
    assert d["speedup"] is None and d["speedup_vs_compile"] is None and "no speedup is given" in d["note"]
    assert d["benchmark_iters"] >= bench_mod.CPU_MIN_TIMED_CALLS
    assert d["warmup_iters"] >= 2  # the first call and at least one warm-up call
    assert d["iterations"]["kernel"] == {"warmup": d["warmup_iters"], "benchmark": d["benchmark_iters"]}
    assert d["compiled_reference_time_ms"] is None and d["compile_time_ms"] is None
    assert d["compile_error"] == "skipped (--no-compile)"
    assert d["verify"]["correct"] is True and d["verify"]["seeds"] == [0]
    assert set(d["timing_spread"]) == {"kernel", "reference"}  # no compiled reference was timed
    assert all(v >= 0 for v in d["timing_spread"].values())
    json.dumps(d, allow_nan=False)


def test_bench_refuses_an_incorrect_kernel():
    with pytest.raises(VerificationFailed) as info:
        bench_kernel(load_contract(KERNELS / "broken_mask.py"), compile_reference=False, **FAST)
    assert info.value.result is not None and not info.value.result.correct
    assert "not benchmarked" in str(info.value) and "unwritten" in str(info.value)


def test_cli_bench_refuses_an_incorrect_kernel(tmp_path):
    # the JSON says it was not timed, and why, on stdout and in --json-out (a new user's script found no file)
    out = tmp_path / "bench.json"
    res = runner.invoke(app, ["bench", str(KERNELS / "broken_mask.py"), "--no-compile", "--json-out", str(out)])
    assert res.exit_code == 1
    printed = json.loads(res.stdout)
    assert printed == json.loads(out.read_text())
    assert printed["benchmarked"] is False and printed["correct"] is False and not printed["verify"]["correct"]
    assert "not benchmarked" in res.stderr and "unwritten" in res.stderr
    assert "Traceback" not in res.output


def test_cli_bench_json_out(tmp_path):
    out = tmp_path / "bench.json"
    res = runner.invoke(app, ["bench", str(KERNELS / "vector_add.py"), "--no-compile", "--warmup-ms", "1",
                              "--rep-ms", "5", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert json.loads(out.read_text()) == printed
    assert printed["timer"] == "cpu-wallclock-median"
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]


def _plain_contract() -> KernelContract:
    return KernelContract(name="plain", path=None, kernel_fn=lambda x: x * 2, reference_fn=lambda x: x + x,
                          get_inputs=lambda: [torch.randn(64)])


def test_compile_time_is_reported_apart_from_steady_state(monkeypatch):
    """A stand-in torch.compile whose first call takes 50 ms: compile_time_ms gets it, the steady state not."""

    def fake_compile(fn):
        first = [True]

        def compiled(*args):
            if first[0]:
                time.sleep(0.05)
                first[0] = False
            return fn(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    result = bench_kernel(_plain_contract(), **FAST)
    assert result.compile_error is None
    assert result.compile_time_ms >= 50
    assert result.compiled_reference_time_ms is not None and result.compiled_reference_time_ms < 50
    assert result.speedup_vs_compile is None  # a CPU's times give no speedup
    assert set(result.iterations) == {"kernel", "reference", "compiled_reference"}


def test_compile_failure_is_reported(monkeypatch):
    def failing_compile(fn):
        def compiled(*args):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found\nmore lines")

        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    d = bench_kernel(_plain_contract(), **FAST).to_dict()
    assert d["compiled_reference_time_ms"] is None and d["compile_time_ms"] is None and d["speedup_vs_compile"] is None
    assert d["compile_error"] == (
        "torch.compile(reference_fn) failed: RuntimeError: InvalidCxxCompiler: no working C++ compiler found"
    )
    assert d["kernel_time_ms"] > 0  # the eager numbers are still there


def test_time_cpu_counts_every_call():
    calls = []
    timing = time_cpu(lambda: calls.append(1), warmup_ms=0.5, rep_ms=2.0)
    assert timing.warmup_iters + timing.benchmark_iters == len(calls)
    assert timing.benchmark_iters >= bench_mod.CPU_MIN_TIMED_CALLS
    assert timing.median_ms >= 0


def _fake_do_bench(n_warmup: int, n_rep: int):
    """Calls fn the way triton.testing.do_bench does: once, 5 estimate calls, n_warmup, then n_rep timed."""

    def do_bench(fn, warmup, rep, return_mode):
        assert return_mode in ("all", "median")
        for _ in range(1 + 5 + n_warmup):
            fn()
        times = []
        for i in range(n_rep):
            fn()
            times.append(float(i + 1))
        return times if return_mode == "all" else sorted(times)[len(times) // 2]

    return do_bench


def test_time_cuda_reports_the_calls_do_bench_made():
    calls = []
    timing = time_cuda(lambda: calls.append(1), warmup_ms=25, rep_ms=100, do_bench=_fake_do_bench(7, 9))
    assert timing.benchmark_iters == 9
    assert timing.warmup_iters == 1 + 5 + 7
    assert len(calls) == timing.warmup_iters + timing.benchmark_iters
    assert timing.median_ms == 5.0  # median of 1..9
    # deciles of 1..9 (inclusive): p20 2.6, p80 7.4 -> (7.4 - 2.6) / 5
    assert timing.spread == pytest.approx(0.96)


def test_timing_spread_is_the_middle_deciles_over_the_median():
    assert bench_mod.timing_spread([1.0] * 20) == 0.0
    assert bench_mod.timing_spread([1.0, 1.0]) is None  # too few calls to say
    assert bench_mod.timing_spread([0.0] * 5) is None
    steady = [1.0] * 18 + [50.0, 60.0]  # two stalls in twenty calls do not move the middle deciles
    assert bench_mod.timing_spread(steady) == 0.0


def test_bench_json_names_noisy_timings(monkeypatch):
    """A timer whose calls spread over NOISY_TIMING_SPREAD: bench's JSON gives each spread and names the noisy
    function, and the CLI warns on stderr."""
    spreads = iter([0.02, 0.6])  # kernel steady, reference noisy

    def timer(fn, warmup_ms, rep_ms):
        fn()
        return bench_mod.Timing(1.0, 1, 10, spread=next(spreads))

    monkeypatch.setattr(bench_mod, "time_cpu", timer)
    d = bench_kernel(load_contract(KERNELS / "vector_add.py"), compile_reference=False, **FAST).to_dict()
    assert d["timing_spread"] == {"kernel": 0.02, "reference": 0.6}
    assert d["noisy_timings"] == ["reference"]

    spreads = iter([0.02, 0.6])
    result = runner.invoke(app, ["bench", str(KERNELS / "vector_add.py"), "--no-compile", "--warmup-ms", "1",
                                 "--rep-ms", "5"])
    assert result.exit_code == 0, result.output
    assert "reference's timed calls spread 60%" in result.output


def test_time_cuda_without_return_mode_all():
    def old_do_bench(fn, warmup, rep, return_mode):
        assert return_mode in ("min", "max", "mean", "median")
        fn()
        return 2.5

    timing = time_cuda(lambda: None, do_bench=old_do_bench)
    assert timing.median_ms == 2.5 and timing.warmup_iters is None and timing.benchmark_iters is None


def test_time_cuda_passes_kernel_errors_through():
    def do_bench(fn, warmup, rep, return_mode):
        fn()

    def broken():
        raise AssertionError("kernel assertion")

    with pytest.raises(AssertionError, match="kernel assertion"):
        time_cuda(broken, do_bench=do_bench)


@pytest.mark.gpu("CUDA: torch.compile of a triton_op cannot run under TRITON_INTERPRET")
def test_bench_on_gpu_with_real_compile():
    result = bench_kernel(load_contract(KERNELS / "vector_add.py"))
    d = result.to_dict()
    assert d["timer"] == bench_mod.TIMER_CUDA and d["device"].startswith("cuda")
    assert d["note"] is None
    assert d["benchmark_iters"] >= 1 and d["warmup_iters"] >= 6
    assert d["compile_error"] is None, d["compile_error"]
    assert d["compile_time_ms"] > 0 and d["compiled_reference_time_ms"] > 0
    assert d["kernel_time_ms"] > 0 and d["speedup"] > 0
    # everything was called before it was timed: nothing compiles in the steady state
    assert d["steady_state_triton_compiles"] == 0, d["steady_state_recompiles"]
    assert d["steady_state_dynamo_recompiles"] == 0, d["steady_state_recompiles"]


def test_steady_state_recompiles_are_counted_with_their_cause(monkeypatch):
    """A reference whose dynamo guard fails on its second call: the recompile lands in the timed steady state."""
    real_compile = torch.compile
    flip = [0]

    def flipping_reference(x):
        flip[0] ^= 1  # dynamo guards on flip[0]'s value: the second call fails the guard and recompiles
        return x + x

    contract = KernelContract(name="flip", path=None, kernel_fn=lambda x: x * 2, reference_fn=flipping_reference,
                              get_inputs=lambda: [torch.randn(64)])
    monkeypatch.setattr(torch, "compile", lambda fn: real_compile(fn, backend="eager", dynamic=False))
    d = bench_kernel(contract, **FAST).to_dict()
    assert d["steady_state_dynamo_recompiles"] == 1
    assert d["steady_state_triton_compiles"] is None  # the interpreter compiles nothing
    phases = d["steady_state_recompiles"]
    assert set(phases) == {"kernel", "reference", "compiled_reference"}
    assert phases["kernel"]["dynamo_compiles"] == 0 and phases["reference"]["events"] == []
    assert "not counted under the Triton interpreter" in phases["kernel"]["triton_note"]
    (event,) = phases["compiled_reference"]["events"]
    assert event["recompile"] and event["name"].startswith("flipping_reference")
    # the guard holds the value flip[0] had at the compiling call (its parity depends on how often verification
    # called the reference eagerly)
    assert re.match(r"flip\[0\] == [01] \(guard of compile ", event["cause"]), event["cause"]
    json.dumps(d, allow_nan=False)


def test_kernel_class_sorts_library_inductor_ours_and_aten():
    from fusion_advisor.kernel_tools.bench import kernel_class

    assert kernel_class("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "library"
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "library"
    assert kernel_class("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>") == "library"
    assert kernel_class("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "inductor"
    assert kernel_class("_rms_norm_fwd_kernel") == "fusion_advisor"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>") == "aten"


def test_cli_bench_refuses_sweep_only_options_without_sweep(tmp_path):
    # `bench FILE --out DIR` used to time the kernel, print JSON and write nothing to DIR, silently
    res = runner.invoke(app, ["bench", str(KERNELS / "vector_add.py"), "--no-compile", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and res.stdout == ""
    assert "--out applies to `bench --sweep` only" in " ".join(res.stderr.split())
    res = runner.invoke(app, ["bench", str(KERNELS / "vector_add.py"), "--no-compile", "--gpu", "h100"])
    assert res.exit_code == 2 and "--gpu applies to" in " ".join(res.stderr.split())


def test_cpu_timing_follows_the_clock_not_a_stalled_estimate():
    """A function whose first calls stall (a busy machine descheduling them) is still timed at its steady speed:
    the timed calls fill the budget instead of trusting an estimate from the stalls."""
    import time as _time

    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        if calls["n"] <= 3:
            _time.sleep(0.03)  # 30 ms stalls: the first call, the warm-up and the first timed call

    t = bench_mod.time_cpu(fn, warmup_ms=5.0, rep_ms=20.0)
    assert t.median_ms < 1.0 and t.benchmark_iters > 100
