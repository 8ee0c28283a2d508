"""Tests of fusion_advisor/report/write.py on a hand-built Analysis (no capture, no torch graphs: fast).

The synthetic analysis covers every route (skip / torch.compile / triton) and every bound class
(compute / memory / launch), a chain with 0 FLOPs (drawn at the chart's floor), a chain without an estimate or
decision, an op in no chain, a site-packages source path, a graph break, a warning and user strings with HTML in
them (``<script>``) that the page must escape.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from fusion_advisor.errors import UserError

import fusion_advisor
from fusion_advisor import files
from fusion_advisor.report import write as report
from fusion_advisor.analyze.records import (
    Analysis,
    Chain,
    Decision,
    Estimate,
    GraphBreak,
    OpInfo,
    SourceLoc,
    TensorMeta,
)

SCRIPT_CODE = 'y = x * 2  # "<script>alert(1)</script>" & more'
SITE_FILE = "/usr/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py"
BW_GBPS = 4800.0
LAUNCH_US = 4.0


def _meta(shape: tuple[int, ...], dtype: str = "bf16") -> TensorMeta:
    numel = math.prod(shape)
    return TensorMeta(shape=shape, dtype=dtype, numel=numel, nbytes=numel * 2)


def _op(op_id: str, target: str, category: str, ins, outs, flops: int = 0, src: SourceLoc | None = None) -> OpInfo:
    view = category == "view"
    return OpInfo(
        id=op_id, graph_index=int(op_id[1]), target=target, category=category, inputs=tuple(ins), outputs=tuple(outs),
        flops=flops, bytes_read=0 if view else sum(m.nbytes for m in ins),
        bytes_written=0 if view else sum(m.nbytes for m in outs), module_path="model.layers.0",
        source=src or SourceLoc("/home/u/model.py", 10, "h = self.proj(x)"),
    )


def _chain(cid: str, kind: str, pattern: str, op_ids, *, flops: int, eager_bytes: int, fused_bytes: int,
           kernels: int, src: SourceLoc, graph: int = 0, epilogue_of: str = "") -> Chain:
    return Chain(
        id=cid, kind=kind, op_ids=tuple(op_ids), targets=tuple(f"aten.{o.split(':')[1]}.default" for o in op_ids),
        pattern=pattern, categories=("pointwise",), dtype="bf16", eager_kernels=kernels, eager_bytes=eager_bytes,
        fused_bytes=fused_bytes, flops=flops, numel=2048 * 4096, row_elems=4096 if pattern == "rmsnorm" else 0,
        source=src, module_path="model.layers.0", epilogue_of=epilogue_of, graph_index=graph,
    )


def _estimate(chain: Chain, bound: str, peak_tflops: float) -> Estimate:
    """Roofline numbers consistent with BW_GBPS / LAUNCH_US (bytes / (GB/s * 1e3) = us)."""
    compute_us = chain.flops / (peak_tflops * 1e6)
    mem_eager = chain.eager_bytes / (BW_GBPS * 1e3)
    mem_fused = chain.fused_bytes / (BW_GBPS * 1e3)
    launch = chain.eager_kernels * LAUNCH_US
    eager = max(compute_us, mem_eager) + launch
    fused = max(compute_us, mem_fused) + LAUNCH_US
    saving = max(eager - fused, 0.0) if chain.kind == "fusible" and chain.eager_kernels > 1 else 0.0
    return Estimate(compute_us=compute_us, memory_eager_us=mem_eager, memory_fused_us=mem_fused, launch_eager_us=launch,
                    eager_us=eager, fused_us=fused, saving_us=saving, ridge_point=peak_tflops * 1e3 / BW_GBPS,
                    bound=bound, peak_tflops=peak_tflops)


def make_analysis(n_extra_chains: int = 0) -> Analysis:
    """4 chains (c0 heavy/compute/skip, c1 rmsnorm/memory/triton, c2 pointwise/launch/torch.compile, c3 zero-FLOP
    copy/memory/skip), c4 without estimate or decision, plus ``n_extra_chains`` pointwise chains for size tests."""
    x, w = _meta((2048, 4096)), _meta((4096,))
    small = _meta((64,), "fp32")
    site = SourceLoc(SITE_FILE, 73, "variance = hidden_states.pow(2).mean(-1, keepdim=True)")
    script = SourceLoc("/home/u/model.py", 42, SCRIPT_CODE)
    ops = [
        _op("g0:mm", "aten.mm.default", "matmul", [x, _meta((4096, 4096))], [x], flops=2 * 2048 * 4096 * 4096),
        _op("g0:pow_1", "aten.pow.Tensor_Scalar", "pointwise", [x], [x], flops=2048 * 4096, src=site),
        _op("g0:mean", "aten.mean.dim", "reduction", [x], [_meta((2048, 1))], flops=2048 * 4096, src=site),
        _op("g0:mul", "aten.mul.Tensor", "pointwise", [x, w], [x], flops=2048 * 4096, src=site),
        _op("g0:view", "aten.view.default", "view", [x], [_meta((2048, 64, 64))]),  # in no chain
        _op("g1:mul_1", "aten.mul.Tensor", "pointwise", [small], [small], flops=64, src=script),
        _op("g1:add", "aten.add.Tensor", "pointwise", [small], [small], flops=64, src=script),
        _op("g1:clone", "aten.clone.default", "copy", [x], [x], flops=0),
        _op("g1:neg", "aten.neg.default", "pointwise", [x], [x], flops=2048 * 4096),
    ]
    xb = x.nbytes
    chains = [
        _chain("c0", "heavy", "matmul", ["g0:mm"], flops=ops[0].flops, eager_bytes=3 * xb, fused_bytes=3 * xb,
               kernels=1, src=ops[0].source),
        _chain("c1", "fusible", "rmsnorm", ["g0:pow_1", "g0:mean", "g0:mul"], flops=3 * 2048 * 4096,
               eager_bytes=6 * xb, fused_bytes=2 * xb, kernels=3, src=site, epilogue_of="c0"),
        _chain("c2", "fusible", "pointwise", ["g1:mul_1", "g1:add"], flops=128, eager_bytes=4 * small.nbytes,
               fused_bytes=2 * small.nbytes, kernels=2, src=script, graph=1),
        _chain("c3", "other", "copy", ["g1:clone"], flops=0, eager_bytes=2 * xb, fused_bytes=2 * xb, kernels=1,
               src=SourceLoc(), graph=1),
        _chain("c4", "fusible", "pointwise", ["g1:neg"], flops=2048 * 4096, eager_bytes=2 * xb, fused_bytes=2 * xb,
               kernels=1, src=ops[8].source, graph=1),
    ]
    for i in range(n_extra_chains):
        chains.append(_chain(f"c{5 + i}", "fusible", "pointwise", ["g1:mul_1", "g1:add"], flops=2048 * 4096 * (i % 7),
                             eager_bytes=(4 + i % 5) * xb, fused_bytes=2 * xb, kernels=2 + i % 3,
                             src=SourceLoc(f"/home/u/very/long/path/to/model_{i % 13}.py", i, f"y{i} = f(x{i}) * g(x{i})"),
                             graph=1))
    bounds = {"c0": ("compute", 989.0), "c1": ("memory", 67.0), "c2": ("launch", 67.0), "c3": ("memory", 67.0)}
    bounds.update({c.id: (("memory", "launch", "compute")[i % 3], 67.0) for i, c in enumerate(chains[5:])})
    estimates = {cid: _estimate(next(c for c in chains if c.id == cid), b, p) for cid, (b, p) in bounds.items()}
    routes = {"c0": ("skip", ""), "c1": ("triton", "rmsnorm"), "c2": ("torch.compile", ""), "c3": ("skip", "")}
    routes.update({c.id: (("skip", "torch.compile", "triton")[i % 3], "k") for i, c in enumerate(chains[5:])})
    decisions = {
        cid: Decision(chain_id=cid, route=r, kernel=k if r == "triton" else "", rule_id=f"rule-{r}",
                      rules_file="rules/default.yaml", reason=f"{r} because <b>{cid}</b> is {bounds[cid][0]}-bound",
                      bound=bounds[cid][0], note="fallback <i>note</i>" if cid == "c2" else "")
        for cid, (r, k) in routes.items()
    }
    return Analysis(
        model_name="TinyLlama <test>", model_file="/home/u/model.py", convention="kernelbench", device="meta",
        dtype="bf16",
        device_spec={"name": "H200 <sxm>", "bandwidth_gbps": BW_GBPS, "launch_overhead_us": LAUNCH_US,
                     "peak_tflops": {"tensor": {"bf16": 989.0}, "vector": {"bf16": 67.0, "fp32": 67.0}},
                     "sources": ["NVIDIA H200 datasheet", "measured copy kernel"]},
        rules_files=[{"path": "rules/default.yaml", "version": 3}],
        capture_method="dynamo",
        graph_breaks=[GraphBreak(reason="call to print() <builtin>", source=SourceLoc("/home/u/model.py", 30,
                                                                                       "print(x.shape)"), graph_index=0)],
        warnings=["export failed: <dynamic shape> & stuff"],
        ops=ops, chains=chains, estimates=estimates, decisions=decisions,
        timings_s={"load": 0.12, "capture": 1.5, "report": 0.3},
        versions={"torch": "2.13.0", "triton": "3.6.0"},
    )


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Analysis, dict[str, Path]]:
    analysis = make_analysis()
    return analysis, report.write_report(analysis, tmp_path_factory.mktemp("rep") / "nested" / "out")


# --- files and CSVs -----------------------------------------------------------------------------------------


def test_files_exist_and_no_temp_left(written):
    _, paths = written
    assert set(paths) == {"html", "chains_csv", "ops_csv", "json"}
    assert {p.name for p in paths.values()} == {"report.html", "chains.csv", "ops.csv", "report.json"}
    for p in paths.values():
        assert p.is_file() and p.stat().st_size > 0
    out_dir = paths["html"].parent
    assert sorted(os.listdir(out_dir)) == sorted(p.name for p in paths.values())


def test_chains_csv(written):
    analysis, paths = written
    df = pd.read_csv(paths["chains_csv"], keep_default_na=False, na_values=[""])
    assert list(df.columns) == list(report.CHAIN_COLUMNS)
    assert list(df["chain_id"]) == [c.id for c in analysis.chains]
    by_id = df.set_index("chain_id")
    # bytes are raw integers, not human units
    assert by_id.loc["c1", "eager_bytes"] == analysis.chains[1].eager_bytes
    assert by_id.loc["c1", "bytes_saved"] == analysis.chains[1].eager_bytes - analysis.chains[1].fused_bytes
    assert by_id.loc["c1", "op_ids"] == "g0:pow_1 g0:mean g0:mul"
    # site-packages path shortened, others kept
    assert by_id.loc["c1", "source"] == "transformers/models/llama/modeling_llama.py:73"
    assert by_id.loc["c2", "source"] == "/home/u/model.py:42"
    assert by_id.loc["c2", "code"] == SCRIPT_CODE
    # time after routing: fused for fusing routes, eager for skip
    est = analysis.estimates
    assert by_id.loc["c0", "est_after_route_us"] == pytest.approx(est["c0"].eager_us)
    assert by_id.loc["c1", "est_after_route_us"] == pytest.approx(est["c1"].fused_us)
    assert by_id.loc["c2", "est_after_route_us"] == pytest.approx(est["c2"].fused_us)
    # what the route saves: the figure analyze's top chains rank by (a new user filtered on est_saving_us, the
    # fused roofline's saving, 0 for a GEMM, and dropped the top chain of the table)
    assert by_id.loc["c0", "est_route_saving_us"] == 0.0
    assert by_id.loc["c1", "est_route_saving_us"] == pytest.approx(est["c1"].eager_us - est["c1"].fused_us)
    assert by_id.loc["c1", "arithmetic_intensity_flop_per_byte"] == pytest.approx(analysis.chains[1].arithmetic_intensity)
    assert {"compute", "memory", "launch"} <= set(df["bound"].dropna())
    # c4 has neither estimate nor decision: empty strings / NaN, not a crash
    assert math.isnan(by_id.loc["c4", "est_eager_us"]) and pd.isna(by_id.loc["c4", "route"])


def test_ops_csv(written):
    analysis, paths = written
    df = pd.read_csv(paths["ops_csv"], keep_default_na=False)
    assert list(df.columns) == list(report.OP_COLUMNS)
    assert len(df) == len(analysis.ops)
    by_id = df.set_index("op_id")
    assert by_id.loc["g0:mul", "chain_id"] == "c1"
    assert by_id.loc["g0:view", "chain_id"] == ""  # in no chain
    assert by_id.loc["g0:mul", "input_shapes"] == "[2048, 4096]; [4096]"
    assert by_id.loc["g0:mean", "output_shapes"] == "[2048, 1]"
    assert by_id.loc["g0:mm", "bytes_read"] == 2048 * 4096 * 2 + 4096 * 4096 * 2


def test_frames_empty_analysis_have_columns():
    a = make_analysis()
    a.chains, a.ops, a.estimates, a.decisions = [], [], {}, {}
    assert list(report.chains_frame(a).columns) == list(report.CHAIN_COLUMNS)
    assert list(report.ops_frame(a).columns) == list(report.OP_COLUMNS)


# --- JSON ---------------------------------------------------------------------------------------------------


def _strict_json(text: str):
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=reject)


def test_json(written):
    analysis, paths = written
    doc = _strict_json(paths["json"].read_text(encoding="utf-8"))
    assert doc["tool_version"] == fusion_advisor.__version__
    assert doc["columns"]["chains"] == report.CHAIN_COLUMNS
    assert doc["columns"]["ops"] == report.OP_COLUMNS
    assert "T" in doc["generated_at"]
    assert [c["id"] for c in doc["chains"]] == [c.id for c in analysis.chains]
    assert doc["chains"][1]["op_ids"] == ["g0:pow_1", "g0:mean", "g0:mul"]
    assert doc["decisions"]["c1"]["kernel"] == "rmsnorm"
    assert doc["graph_breaks"][0]["source"]["line"] == 30


def test_json_nan_becomes_null(tmp_path):
    a = make_analysis()
    a.timings_s["broken"] = float("nan")
    a.device_spec["odd"] = (float("inf"), Path("/x"))
    paths = report.write_report(a, tmp_path)
    doc = _strict_json(paths["json"].read_text(encoding="utf-8"))
    assert doc["timings_s"]["broken"] is None
    assert doc["device_spec"]["odd"] == [None, "/x"]


# --- HTML ---------------------------------------------------------------------------------------------------


def test_html_self_contained_and_escaped(written):
    analysis, paths = written
    html = paths["html"].read_text(encoding="utf-8")
    # nothing fetched from elsewhere: no http(s) or protocol-relative src/href, no @import / url(), no scripts
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"@import|url\(", html, re.I)
    # one inline script (sorting, filters, groups), nothing it could load or send
    scripts = re.findall(r"<script[^>]*>", html, re.I)
    assert scripts == ["<script>"]
    script = html[html.index("<script>"):html.index("</script>")]
    assert not re.search(r"fetch\(|XMLHttpRequest|import\(|\.src\s*=|WebSocket", script)
    assert "<link" not in html.lower()
    assert 'src="data:image/png;base64,' in html
    # user strings are escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;c1&lt;/b&gt;" in html and "<b>c1</b>" not in html
    assert "TinyLlama &lt;test&gt;" in html and "H200 &lt;sxm&gt;" in html
    for chain in analysis.chains:
        assert f">{chain.id}<" in html
    # header facts, sections
    for text in ("kernelbench", "dynamo", "rules/default.yaml", "version 3", "NVIDIA H200 datasheet", "torch 2.13.0",
                 "4,800 GB/s", "989.0", "capture", "call to print() &lt;builtin&gt;", "/home/u/model.py:30",
                 "export failed: &lt;dynamic shape&gt; &amp; stuff", "transformers/models/llama/modeling_llama.py:73",
                 "NOT measurements", "0 FLOPs", "have no estimate"):
        assert text in html, text
    for col in list(report.CHAIN_COLUMNS) + list(report.OP_COLUMNS):
        assert f"<code>{col}</code>" in html, col


def test_html_chains_sorted_by_the_saving_of_their_route(written):
    """Ranked by the saving of fusing, a fresh user's 3xTF32 GEMM saving 159 us on its route sat below a 21 us chain
    with "0.0" in the saving column, whose numbers did not add up (eager 195.9, saving 146.3, after route 112.1): the
    rows rank by, and show, est. eager - est. after route, as the terminal's top chains do."""
    analysis, paths = written
    html = paths["html"].read_text(encoding="utf-8")
    section = html[html.index('<section id="chains"'):html.index('<section id="apply"')]
    order = re.findall(r'<td class="mono ids" id="chain-(c\d+)">', section)
    frame = report.chains_frame(analysis).set_index("chain_id")
    route_saving = (frame["est_eager_us"] - frame["est_after_route_us"]).fillna(-1.0)
    assert sorted(order) == sorted(c.id for c in analysis.chains)  # no repeated layers here: one row each
    savings = [route_saving[c] for c in order]
    assert savings == sorted(savings, reverse=True)
    gemm = {"saving_after_route_us": 158.6, "totals": {"est_saving_us": 0.0, "est_eager_us": 441.7}}
    small = {"saving_after_route_us": 20.9, "totals": {"est_saving_us": 146.3, "est_eager_us": 195.9}}
    assert report._sorted_groups([small, gemm]) == [gemm, small]  # not by the saving of fusing
    cells = re.search(r'id="chain-' + order[0] + r'">.*?</tr>', section).group(0)
    nums = [float(x.replace(",", "")) for x in re.findall(r'<td class="num">([\d,.]+)</td>', cells)]
    eager, saving, after = frame.loc[order[0], "est_eager_us"], route_saving[order[0]], frame.loc[order[0],
                                                                                                 "est_after_route_us"]
    assert [round(eager, 1), round(saving, 1), round(after, 1)] == [n for n in nums if n in (
        round(eager, 1), round(saving, 1), round(after, 1))][:3]


def test_html_no_graph_breaks_says_none(tmp_path):
    a = make_analysis()
    a.graph_breaks, a.warnings = [], []
    a.chains = [c for c in a.chains if c.id != "c4"]  # no report notes either
    html = report.write_report(a, tmp_path)["html"].read_text(encoding="utf-8")
    breaks = html[html.index('id="breaks"'):html.index('id="warnings"')]
    warns = html[html.index('id="warnings"'):html.index('id="columns"')]
    assert "<p>none</p>" in breaks and "<p>none</p>" in warns


def test_html_empty_analysis(tmp_path):
    a = make_analysis()
    a.chains, a.ops, a.estimates, a.decisions, a.graph_breaks = [], [], {}, {}, []
    paths = report.write_report(a, tmp_path)
    assert "no chains" not in paths["chains_csv"].read_text()  # header only
    assert "Chains (0)" in paths["html"].read_text(encoding="utf-8")


def test_html_size_3000_chains(tmp_path):
    """A big model's page stays a reasonable size (every chain listed)."""
    a = make_analysis(n_extra_chains=3000)
    paths = report.write_report(a, tmp_path)
    size = paths["html"].stat().st_size
    assert size < 5 * 1024 * 1024, f"report.html is {size / 2**20:.1f} MiB"
    assert len(pd.read_csv(paths["chains_csv"])) == len(a.chains)


def test_html_lists_a_specs_rate_tables_by_their_size(tmp_path):
    """The shipped GPU specs hold thousands of measured rates: report.html names their count, report.json keeps them
    (an analysis of a 216-op model wrote a 1.6 MB page, 1.35 MB of it the spec's tables, before)."""
    from fusion_advisor.devices import load_spec

    a = make_analysis()
    a.device_spec = load_spec("h200").to_dict()
    paths = report.write_report(a, tmp_path)
    html = paths["html"].read_text(encoding="utf-8")
    n = len(a.device_spec["conv_rates"])
    assert n > 1000 and f"{n:,} entries of detail, dtype, c_in" in html
    assert paths["html"].stat().st_size < 400 * 1024
    assert len(json.loads(paths["json"].read_text())["device_spec"]["conv_rates"]) == n


# --- summary ------------------------------------------------------------------------------------------------


def test_summary_rows():
    a = make_analysis()
    rows = report.summary_rows(a)
    assert all(set(r) == set(report.SUMMARY_COLUMNS) for r in rows)
    by = {(r["group"], r["key"]): r for r in rows}
    est = a.estimates
    assert by["route", "triton"]["chains"] == 1
    assert by["route", "triton"]["eager_us"] == pytest.approx(est["c1"].eager_us)
    assert by["route", "triton"]["after_route_us"] == pytest.approx(est["c1"].fused_us)
    assert by["route", "skip"]["chains"] == 2 and by["route", "skip"]["saving_us"] == pytest.approx(0.0)
    assert by["route", ""]["chains"] == 1  # c4 has no decision
    assert by["bound", "memory"]["chains"] == 2
    total = by["total", "all"]
    assert total["chains"] == len(a.chains)
    assert total["eager_us"] == pytest.approx(sum(e.eager_us for e in est.values()))
    assert total["saving_us"] == pytest.approx(est["c1"].eager_us - est["c1"].fused_us
                                               + est["c2"].eager_us - est["c2"].fused_us)
    route_total = sum(r["saving_us"] for r in rows if r["group"] == "route")
    bound_total = sum(r["saving_us"] for r in rows if r["group"] == "bound")
    assert route_total == pytest.approx(total["saving_us"]) and bound_total == pytest.approx(total["saving_us"])


# --- atomic writes ------------------------------------------------------------------------------------------


class _Boom(Exception):
    pass


@pytest.mark.parametrize("exc", [_Boom, KeyboardInterrupt], ids=["error", "interrupt"])
@pytest.mark.parametrize("existing", [True, False], ids=["old-file", "no-old-file"])
def test_atomic_write_interrupted(tmp_path, monkeypatch, exc, existing):
    """Fail after the data is in the temp file but before it replaces the target: the target is untouched."""
    target = tmp_path / "report.html"
    if existing:
        target.write_text("old complete report")
    seen = []

    def failing_fsync(fd):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))  # the temp file exists, mid-write
        raise exc("disk gone")

    monkeypatch.setattr(files.os, "fsync", failing_fsync)
    with pytest.raises(exc):
        report.atomic_write_bytes(target, b"new report " * 10000)
    monkeypatch.undo()
    assert seen and any(n.endswith(".tmp") for n in seen[0])
    if existing:
        assert target.read_text() == "old complete report"
    else:
        assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == (["report.html"] if existing else [])


def test_write_report_interrupted_keeps_old_files(tmp_path, monkeypatch):
    a = make_analysis()
    paths = report.write_report(a, tmp_path)
    before = {k: p.read_bytes() for k, p in paths.items()}
    real_replace = os.replace
    calls = []

    def replace_then_fail(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # first file replaced, second fails
            raise OSError("interrupted")
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace_then_fail)
    a.model_name = "changed"
    with pytest.raises(UserError, match="cannot write .* there: interrupted"):  # the OSError, named for --out
        report.write_report(a, tmp_path)
    monkeypatch.undo()
    # every file is either the complete old or the complete new version; no temp files remain
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths.values())
    after = {k: p.read_bytes() for k, p in paths.items()}
    changed = [k for k in paths if after[k] != before[k]]
    assert len(changed) <= 1
    assert after["html"] == before["html"] and after["json"] == before["json"]
    for k in changed:
        if k.endswith("csv"):
            pd.read_csv(paths[k])


def test_render_error_writes_nothing(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("template bug")

    monkeypatch.setattr(report, "render_html", broken)
    with pytest.raises(RuntimeError):
        report.write_report(make_analysis(), tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


# --- helpers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, text", [(0, "0 B"), (1023, "1,023 B"), (1024, "1.0 KiB"), (3 * 2**20, "3.0 MiB"),
                                         (int(1.5 * 2**30), "1.5 GiB"), (float("nan"), "–")])
def test_fmt_bytes(value, text):
    assert report.fmt_bytes(value) == text


@pytest.mark.parametrize("value, digits, text", [(1234567.891, 1, "1,234,567.9"), (0.12, 3, "0.120"), (0.0, 2, "0.00"),
                                                 (1.28e-7, 3, "1.28e-07"), (-2.5, 1, "-2.5"), (None, 2, "–")])
def test_fmt_float(value, digits, text):
    assert report.fmt_float(value, digits) == text


def test_short_path():
    assert report.short_path(SITE_FILE) == "transformers/models/llama/modeling_llama.py"
    assert report.short_path("C:\\py\\Lib\\site-packages\\torch\\nn\\f.py") == "torch/nn/f.py"
    assert report.short_path("/home/u/model.py") == "/home/u/model.py"



@pytest.mark.parametrize("refused", ["mkdir", "write"])
def test_a_folder_that_cannot_be_written_is_a_user_error_not_an_internal_one(tmp_path, monkeypatch, refused):
    """/proc and /sys pass the permission check and refuse the write: a message naming --out, not a traceback."""
    from fusion_advisor.errors import UserError
    from fusion_advisor.report import write

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    if refused == "mkdir":
        monkeypatch.setattr(Path, "mkdir", refuse)
        want = "cannot write the report there: Permission denied"
    else:
        monkeypatch.setattr(write, "atomic_write_bytes", refuse)
        want = "cannot write chains.csv there: Permission denied"
    with pytest.raises(UserError, match=f"--out .*{want}"):
        write.write_report(make_analysis(), tmp_path / "out")


def test_ops_csv_says_what_each_op_is_priced_at_and_by_what(tmp_path):
    """A fresh user could not split a chain's est_eager_us into its ops, nor tell a GEMM was priced from the
    measured table (2,897 us where compute_us said 2,051)."""
    import pandas as pd

    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.analyze.roofline import estimate
    from fusion_advisor.devices import load_spec
    from fusion_advisor.report.write import write_report

    a = analyze(Path(__file__).parent / "data" / "models" / "profile_mlp.py", gpu="h200")
    ops = pd.read_csv(write_report(a, tmp_path / "r")["ops_csv"], keep_default_na=False)
    gemms = ops[ops["category"] == "matmul"]
    assert len(gemms) and all(p.startswith("matmul table") for p in gemms["priced_by"])
    assert (ops[ops["category"] == "view"]["est_device_us"] == 0).all()
    by_id = {o.id: o for o in a.ops}
    spec = load_spec("h200")
    for c in a.chains:  # each chain's eager estimate is its ops' max(device, host), summed
        rows = ops[ops["chain_id"] == c.id]
        want = sum(max(d, h) for d, h in zip(rows["est_device_us"], rows["est_host_us"], strict=True) if d > 0 or h > 0)
        assert estimate(c, by_id, spec).eager_us == pytest.approx(want, rel=1e-6)


def test_ops_csv_charges_no_host_time_to_an_op_that_launches_nothing(tmp_path):
    """A reviewer: ops on empty tensors carried 13.7 us of host time in ops.csv where the chain estimates charge
    none, so a chain's est_eager_us (14.0) was not its ops' sum (41.4)."""
    from fusion_advisor.analyze.records import OpInfo, SourceLoc, TensorMeta
    from fusion_advisor.devices import load_spec
    from fusion_advisor.report.write import _op_row

    empty = TensorMeta((2, 0, 128), "fp32", 0, 0)
    op = OpInfo("g0:mul", 0, "aten.mul.Tensor", "pointwise", (empty, empty), (empty,), 0, 0, 0, "",
                SourceLoc("m.py", 1, "x * y"))
    row = _op_row(op, "c0", load_spec("h200"))
    assert row["est_device_us"] == 0 and row["est_host_us"] == 0 and row["priced_by"] == ""
