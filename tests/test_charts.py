"""The report's pictures (fusion_advisor/report/charts.py): labelled ceilings, one point per group of repeated chains,
the time breakdown; hand-built analyses, no capture."""

from __future__ import annotations

import pandas as pd
import pytest

from fusion_advisor.report import charts, views
from fusion_advisor.report import write as report
from fusion_advisor.devices import load_spec
from tests.test_report import make_analysis
from tests.test_report_views import layered

PNG = b"\x89PNG\r\n\x1a\n"


def test_ceilings_are_named_by_what_serves_them():
    frame = pd.DataFrame({"kind": ["heavy", "heavy", "fusible"], "pattern": ["matmul", "attention", "rmsnorm"],
                          "dtype": ["bf16", "bf16", "bf16"]})
    ceils = charts.ceilings(load_spec("h200").to_dict(), frame, used_peaks=[790.0])
    labels = [c["label"] for c in ceils]
    # one per kind for the chains' dtype: no fp32 or tf32 line for a bf16 model, no duplicate for the used peak
    assert labels == ["vector units bf16: 134 TFLOP/s", "fused attention bf16: 607 TFLOP/s",
                      "tensor cores bf16: 790 TFLOP/s"]
    # a peak the estimates used that the spec does not name is still drawn, as "compute"
    extra = charts.ceilings({"tensor_tflops": {"bf16": 790.0}}, frame, used_peaks=[790.0, 55.0])
    assert [c["label"] for c in extra] == ["compute: 55 TFLOP/s", "tensor cores bf16: 790 TFLOP/s"]


def test_repeated_layers_are_one_point_with_their_count():
    a = layered(6)
    frame = report.chains_frame(a)
    pts = charts._points(views.chain_groups(frame))
    counts = sorted(p["count"] for p in pts)
    # c1 and its 5 copies are one group; c90 (other eager bytes, same intensity and time after routing) lands on
    # the same spot, so it joins the point rather than hiding under it
    assert 7 in counts
    merged = next(p for p in pts if p["count"] == 7)
    assert merged["groups"] == 2
    timed = int((frame["est_after_route_us"] > 0).sum())
    assert sum(counts) == timed  # every timed chain is in exactly one point


def test_roofline_and_breakdown_are_pngs_with_notes():
    a = make_analysis()
    frame = report.chains_frame(a)
    groups = views.chain_groups(frame)
    png, notes = charts.roofline_png(a, frame, groups, numbered=[groups[0]["gid"]])
    assert png.startswith(PNG)
    assert any("0 FLOPs" in n for n in notes) and any("without a positive time" in n for n in notes)
    bars = charts.breakdown_rows(frame, views.predicted_compile_series(frame))
    assert [b[0] for b in bars] == ["eager (predicted)", "torch.compile(model) (predicted)",
                                    "advised routes (predicted)"]  # no profile: no measured bar
    variants = [{"name": "eager", "ms": 2.0, "status": "correct"}, {"name": "x", "ms": 1.0, "status": "chosen"},
                {"name": "bad", "ms": 0.1, "status": "wrong"}]
    assert charts.breakdown_png(frame, views.predicted_compile_series(frame), variants).startswith(PNG)


def test_breakdown_splits_each_bar_by_route_without_losing_time():
    a = make_analysis()
    frame = report.chains_frame(a)
    compile_us = views.predicted_compile_series(frame)
    for label, series in charts.breakdown_rows(frame, compile_us):
        by_route = sum(float(series[frame["route"] == r].sum(skipna=True)) for r in set(frame["route"]))
        assert by_route == pytest.approx(float(series.sum(skipna=True))), label


def test_breakdown_draws_the_calls_host_time_beyond_the_chains():
    # a fresh user: the advised bar read 35 us beside a verdict of 67 us (a compiled call's host time)
    tiny = pd.DataFrame([{"kind": "fusible", "pattern": "pointwise", "bound": "launch", "est_eager_us": 30.0,
                          "est_compile_us": 10.0, "est_cudagraphs_us": 2.4, "launch_eager_us": 30.0,
                          "route": "torch.compile", "est_after_route_us": 10.0, "measured_us": float("nan")}])
    calls = views.HostCalls(launch_us=10.0, compiled_call_us=30.0, graph_replay_us=80.0)
    totals = {"compiled": views.predicted_model_routes(tiny, calls=calls)["torch.compile"],
              "advised": views.predicted_advised_us(tiny, calls)}
    beyond = views.call_host_beyond_chains(totals, tiny)
    assert beyond == {"compiled": pytest.approx(30.0), "advised": pytest.approx(30.0)}  # 40 us of host, 10 of device
    kept = tiny.assign(route="skip", est_after_route_us=30.0)  # as written: 30 us of device, 30 of launches
    totals = {"compiled": totals["compiled"], "advised": views.predicted_advised_us(kept, calls)}
    assert views.call_host_beyond_chains(totals, kept) == {"compiled": pytest.approx(30.0), "advised": 0.0}
    big = tiny.assign(est_eager_us=3000.0, est_compile_us=2000.0, est_after_route_us=2000.0)
    assert views.call_host_beyond_chains({"compiled": 2000.0, "advised": 2000.0}, big) == {"compiled": 0.0,
                                                                                        "advised": 0.0}
    compile_us = views.predicted_compile_series(tiny)
    plain = charts.breakdown_png(tiny, compile_us)
    drawn = charts.breakdown_png(tiny, compile_us, call_host_us={charts.COMPILE_BAR: 30.0, charts.ADVISED_BAR: 30.0})
    assert drawn.startswith(PNG) and drawn != plain
    assert charts.breakdown_png(tiny, compile_us, call_host_us={charts.ADVISED_BAR: 0.0}) == plain
    # each bar gets its own: the advised bar alone differs from both bars drawn
    assert charts.breakdown_png(tiny, compile_us, call_host_us={charts.ADVISED_BAR: 30.0}) not in (plain, drawn)
