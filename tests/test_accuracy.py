"""The accuracy benchmark's arithmetic (fusion_advisor/analyze/accuracy.py): agreement, ratio distribution, the page."""

import pytest

from fusion_advisor.analyze.accuracy import by_pattern, chain_rows, markdown, off_chains, summarize

ROWS = [
    {"pattern": "rmsnorm", "predicted_bound": "memory", "measured_bound": "memory", "ratio": 1.2, "measured_us": 10.0},
    {"pattern": "rmsnorm", "predicted_bound": "launch", "measured_bound": "memory", "ratio": 0.5, "measured_us": 30.0},
    {"pattern": "gemm", "predicted_bound": "compute", "measured_bound": "compute", "ratio": 0.71, "measured_us": 60.0},
    {"pattern": "rmsnorm", "predicted_bound": "memory", "measured_bound": "", "ratio": None,
     "measured_us": 0.0},  # unmeasured
]


def test_accuracy_summary():
    s = summarize(ROWS)
    assert s["chains"] == 3 and s["bound_agree"] == 2 and s["within_30"] == 2
    assert s["confusion"]["launch"]["memory"] == 1
    assert s["within_30_time_weighted_pct"] == pytest.approx(70.0)
    assert [b["chains"] for b in s["ratio_buckets"]] == [0, 1, 2, 0, 0]
    doc = {"summary": s, "device_name": "x", "date": "d", "versions": {}, "setup": "s", "models": [], "worst": [],
           "by_pattern": [],
           "spec": {"memory_bandwidth_gbps": 1.0, "launch_overhead_us": 1.0, "tensor_tflops": {"bf16": 1.0}}}
    assert "| launch | 0 | 1 | 0 |" in markdown(doc)


def test_an_empty_run_has_no_percentages():
    s = summarize([])
    assert s["chains"] == 0 and s["bound_agree_pct"] is None and s["ratio_quantiles"]["p50"] is None


def test_off_chains_and_by_pattern_count_only_measured_chains():
    # off: the launch-vs-memory chain (ratio 0.5, other class); 0.71 is within 30%, 1.2 too; the unmeasured never
    assert [r["ratio"] for r in off_chains(ROWS)] == [0.5]
    groups = {(g["pattern"], g["predicted_bound"]): g for g in by_pattern(ROWS)}
    assert set(groups) == {("rmsnorm", "memory"), ("rmsnorm", "launch"), ("gemm", "compute")}
    assert groups[("rmsnorm", "memory")]["chains"] == 1 and groups[("rmsnorm", "launch")]["within_30"] == 0


def test_chain_rows_of_a_cpu_profile():
    from pathlib import Path

    from fusion_advisor.analyze.pipeline import analyze

    a = analyze(Path(__file__).parent / "data" / "models" / "tiny_pointwise.py", device="cpu", profile=True,
                profile_runs=1)
    rows = chain_rows("tiny", a)
    assert [r["chain"] for r in rows] == [c.id for c in a.chains] and all(r["model"] == "tiny" for r in rows)
    for r in rows:
        measured = a.profile.chains[r["chain"]]
        assert r["measured_us"] == measured.time_us and r["predicted_bound"] == a.estimates[r["chain"]].bound
        assert (r["ratio"] is None) == (measured.time_us <= 0)
    assert summarize(rows)["chains"] == sum(r["ratio"] is not None for r in rows)
