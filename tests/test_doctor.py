"""Tests of fusion_advisor.devices.doctor and the ``doctor`` command.

On this CPU-only machine the copy kernel runs under the Triton interpreter and no bandwidth is measured. A real
torch.compile costs ~7 s on CPU, so one test runs it for real and the others use a stand-in ``torch.compile``.
Failures are provoked on purpose (torch.compile raising, a mismatched Triton pin, a check that raises) to check
that each is reported with its advice and a non-zero exit, and that the other checks still run.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from fusion_advisor.devices import doctor as doc
from fusion_advisor.cli import app
from fusion_advisor.devices.doctor import (
    CHECKS,
    FAIL,
    OK,
    WARN,
    check_copy_kernel,
    check_triton,
    run_doctor,
    spec_for_gpu,
    triton_pins,
)

runner = CliRunner()
STATUSES = {"ok", "warn", "fail", "info"}
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU (interpreter) path")


def _fast_compile(fn, **kwargs):
    """Stand-in torch.compile: the function itself (the real one costs ~7 s on this CPU)."""
    return fn


def _failing_compile(fn, **kwargs):
    def compiled(*args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found in torch._inductor.cpp_builder\nmore")

    return compiled


@cpu_only
def test_copy_kernel_verified_under_the_interpreter():
    c = check_copy_kernel()
    assert c.status == OK, c.summary
    assert c.details["verified"] is True and c.details["bandwidth_gbps"] is None
    assert c.summary.startswith("verified bit-exact under the Triton interpreter")
    assert "no GPU found, so no bandwidth was measured" in c.summary


@cpu_only
def test_copy_kernel_without_gpu_and_interpreter_off(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    c = check_copy_kernel()
    assert c.status == FAIL and c.matters and "TRITON_INTERPRET=1" in c.advice


@cpu_only
def test_cli_doctor_real_compile_table():
    res = runner.invoke(app, ["doctor"])
    assert res.exit_code == 0, res.output
    for name in CHECKS:
        assert name in res.stdout
    assert "works on cpu" in res.stdout and "verified bit-exact" in res.stdout
    assert "no GPU found" in res.stdout
    assert "all checks that matter passed" in res.stdout


def test_cli_doctor_json_shape(monkeypatch, tmp_path):
    monkeypatch.setattr(torch, "compile", _fast_compile)
    out = tmp_path / "doctor.json"
    res = runner.invoke(app, ["doctor", "--json", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert json.loads(out.read_text()) == d
    assert set(d) == {"ok", "exit_code", "created_at", "checks"} and d["ok"] is True and d["exit_code"] == 0
    assert [c["name"] for c in d["checks"]] == list(CHECKS)
    for c in d["checks"]:
        assert set(c) == {"name", "status", "matters", "summary", "advice", "details"}
        assert c["status"] in STATUSES and isinstance(c["summary"], str) and c["summary"]
    by_name = {c["name"]: c for c in d["checks"]}
    assert by_name["torch"]["details"]["version"] == torch.__version__
    assert by_name["triton copy kernel"]["details"]["verified"] is True


def test_cli_doctor_json_out_keeps_the_table(monkeypatch, tmp_path):
    monkeypatch.setattr(torch, "compile", _fast_compile)
    out = tmp_path / "d.json"
    res = runner.invoke(app, ["doctor", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    assert "fusion-advisor doctor" in res.stdout and json.loads(out.read_text())["ok"] is True


def test_failing_compile_is_reported_with_advice_and_exit_1(monkeypatch):
    monkeypatch.setattr(torch, "compile", _failing_compile)
    res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 1, res.output
    by_name = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    c = by_name["torch.compile"]
    assert c["status"] == "fail" and c["matters"] is True
    assert "InvalidCxxCompiler" in c["summary"]
    if not torch.cuda.is_available():
        assert "install a C++ compiler" in c["advice"]
    assert by_name["triton copy kernel"]["status"] == "ok"  # the other checks still ran
    assert "Traceback" not in res.output


def test_mismatched_triton_fails_the_run(monkeypatch):
    monkeypatch.setattr(torch, "compile", _fast_compile)
    monkeypatch.setattr(doc, "torch_requirements", lambda: ["triton==0.0.1"])
    res = runner.invoke(app, ["doctor"])
    assert res.exit_code == 1
    assert "does not match" in res.stdout and "pip install 'triton==0.0.1'" in res.stdout
    assert "1 check(s) failed: triton" in res.stdout


@pytest.mark.parametrize("requirements, installed, status, text", [
    (["triton==3.6.0"], ("triton", "3.6.0", ""), OK, "known-good pairing"),
    (["pytorch-triton==3.6.0+git5261b273"], ("pytorch-triton", "3.6.0+git5261b273", ""), OK, "known-good"),
    (["triton==3.6.0"], ("triton", "3.6.0+gitabc", ""), OK, "known-good"),  # PEP 440: == ignores local parts
    (["triton==3.6.0"], ("triton", "3.9.0", ""), FAIL, "does not match"),
    ([], ("triton", "3.9.0", ""), WARN, "unknown pairing"),
    (["triton==3.6.0"], (None, None, ""), FAIL, "not installed"),
    (["triton==3.6.0"], ("triton", "3.6.0", "ImportError: libcuda.so.1"), FAIL, "does not import"),
])
def test_triton_pairing(requirements, installed, status, text):
    c = check_triton(requirements, installed)
    assert c.status == status and text in c.summary, c.summary
    assert c.matters == (status != WARN)
    if status == FAIL:
        assert "pip install" in c.advice


def test_triton_pins_evaluate_markers():
    reqs = ["filelock", "triton==3.6.0; platform_system == 'NoSuchOS'", "triton==3.5.0",
            "pytorch-triton==3.6.0+git1; extra == 'foo'", "sympy>=1.13.3"]
    assert triton_pins(reqs) == [("triton", "==3.5.0")]


def test_a_check_that_raises_does_not_stop_the_others(monkeypatch):
    def broken():
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setitem(CHECKS, "gpu", broken)
    report = run_doctor(only=["python", "gpu", "torch"])
    assert [c.name for c in report.checks] == ["python", "torch", "gpu"]
    gpu = report.checks[2]
    assert gpu.status == FAIL and gpu.summary == "the check raised RuntimeError: boom"
    assert "Traceback" in gpu.traceback and report.exit_code == 1
    res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    res = runner.invoke(app, ["doctor", "--json", "--debug"])
    assert "Traceback" in res.stderr and "RuntimeError: boom" in res.stderr


def test_unknown_check_name():
    with pytest.raises(ValueError, match="unknown check.*known: python"):
        run_doctor(only=["nope"])


@pytest.mark.parametrize("name, spec", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L4", "l4"),
                                        ("NVIDIA L40S", None), ("NVIDIA GeForce RTX 4090", None)])
def test_spec_for_gpu(name, spec):
    found = spec_for_gpu(name)
    assert (found.name if found else None) == spec


@pytest.mark.gpu
def test_doctor_on_gpu():
    report = run_doctor()
    by_name = {c.name: c for c in report.checks}
    assert report.exit_code == 0, [c.summary for c in report.failed]
    assert by_name["gpu"].details["sm_count"] > 0
    copy = by_name["triton copy kernel"]
    assert copy.details["verified"] is True and copy.details["bandwidth_gbps"] > 0
    assert copy.details["input_bytes"] >= doc.L2_MULTIPLE * copy.details["l2_bytes"] - 4
    if by_name["gpu"].details["device_spec"]:
        assert copy.details["percent_of_spec"] > 0
