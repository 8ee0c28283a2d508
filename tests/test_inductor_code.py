"""Tests of fusion_advisor.analyze.inductor_code (``analyze --inductor-code``) on the CPU.

One real Inductor compile of the tiny pointwise model's chain (C++ code on the CPU, a few seconds), checked in
report.html, chains.csv, report.json and inductor/c0.py; failures (an isolating error, a compile error, the
static-analysis size cap, the time budget) are recorded per chain with their reason, never raised; the fallback
to the output_code log where run_and_get_code is missing; the never-overwrite check.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fusion_advisor.analyze import inductor_code as ic
from fusion_advisor.analyze.pipeline import analyze
from fusion_advisor.cli import app
from fusion_advisor.errors import UserError
from fusion_advisor.report.write import write_report

MODELS = Path(__file__).parent / "data" / "models"


@pytest.fixture(scope="module")
def tiny():
    kept = []
    analysis = analyze(MODELS / "tiny_pointwise.py", device="meta", on_capture=kept.append)
    return analysis, kept[0].graphs


@pytest.fixture(scope="module")
def generated(tiny):
    analysis, graphs = tiny
    return ic.generate(analysis, graphs, top=1)


def test_chain_graph_isolates_the_chain(tiny):
    analysis, graphs = tiny
    chain = analysis.chains[0]
    names = [i.split(":", 1)[1] for i in chain.op_ids]
    gm, outside = ic.chain_graph(graphs[chain.graph_index], names)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(outside) == 1 and tuple(outside[0].meta["val"].shape) == (4096,)
    x = torch.randn(4096)
    (y,) = gm(x)
    ref = x
    for _ in range(3):
        ref = torch.sigmoid(ref * 1.5 + 0.25) - 0.1
    torch.testing.assert_close(y, ref)
    with pytest.raises(KeyError, match="not in the captured graph"):
        ic.chain_graph(graphs[0], ["no_such_node"])


def test_code_captured_and_in_report(tiny, generated, tmp_path):
    analysis, _ = tiny
    rec = generated["c0"]
    assert rec.status == "generated" and rec.reason == "" and rec.path == "inductor/c0.py"
    assert rec.language == "c++" and rec.device == "cpu"
    assert "Inductor CPU code (C++); on a GPU it would be Triton" in rec.note and "static analysis" in rec.note
    assert 'extern "C"' in rec.code and ".exp()" in rec.code  # the fused sigmoid chain, as C++
    done = dataclasses.replace(analysis, inductor_code=generated)
    ic.write_files(done.inductor_code, tmp_path)
    paths = write_report(done, tmp_path)
    assert (tmp_path / "inductor" / "c0.py").read_text().startswith("# Inductor's code for chain c0")
    html = paths["html"].read_text()
    assert '<details id="inductor-c0">' in html and 'href="inductor/c0.py"' in html
    assert "extern &#34;C&#34;" in html or 'extern "C"' in html  # the code itself, escaped
    frame = pd.read_csv(paths["chains_csv"])
    assert frame.loc[frame["chain_id"] == "c0", "inductor_code"].item() == "inductor/c0.py"
    doc = json.loads(paths["json"].read_text())
    assert doc["inductor_code"]["c0"]["path"] == "inductor/c0.py" and "code" not in doc["inductor_code"]["c0"]
    # read back (apply re-renders the folder's report from report.json): the code comes from its file again
    from fusion_advisor.report.write import load_report

    back = load_report(tmp_path).inductor_code["c0"]
    assert 'extern "C"' in back.code and back.code.startswith("# Inductor's code for chain c0")


def test_failures_are_recorded_not_raised(tiny, monkeypatch, tmp_path):
    analysis, graphs = tiny
    chain = analysis.chains[0]
    broken = dataclasses.replace(chain, id="c9", op_ids=("g0:vanished",))
    extra = dataclasses.replace(analysis, chains=[chain, broken],
                                decisions={**analysis.decisions, "c9": analysis.decisions[chain.id]},
                                estimates={**analysis.estimates, "c9": analysis.estimates[chain.id]})

    def boom(gm, inputs):
        raise RuntimeError("C++ compiler not found\nmore lines")

    monkeypatch.setattr(ic, "compile_and_capture", boom)
    recs = ic.generate(extra, graphs, top=5)
    assert recs["c0"].status == "failed" and recs["c0"].reason == "torch.compile failed: RuntimeError: C++ compiler " \
                                                                  "not found"
    assert recs["c9"].status == "failed" and "chain not isolated" in recs["c9"].reason and "vanished" in recs["c9"].reason
    small = ic.generate(analysis, graphs, top=1, max_meta_elems=10)
    assert small["c0"].status == "not generated"
    assert "static analysis" in small["c0"].reason and "rerun with --device cuda" in small["c0"].reason
    assert ic.generate(analysis, graphs, top=1, budget_s=-1)["c0"].reason.startswith("time budget")
    assert ic.generate(analysis, graphs, top=0) == {}
    html = write_report(dataclasses.replace(extra, inductor_code=recs), tmp_path)["html"].read_text()
    assert "C++ compiler not found" in html


def test_output_code_log_fallback(monkeypatch):
    import torch._inductor.utils as utils

    monkeypatch.delattr(utils, "run_and_get_code")
    gm = torch.fx.symbolic_trace(lambda x: (torch.sigmoid(x * 1.7 + 0.3),))
    code = ic.compile_and_capture(gm, [torch.randn(1000)])
    assert 'extern "C"' in code and not code.startswith("Output code")


def test_library_source_for_pattern(tiny):
    analysis, _ = tiny
    norm = dataclasses.replace(analysis.chains[0], pattern="rmsnorm")
    name, path, text = ic.library_source(norm, "")
    assert name == "rmsnorm" and path.endswith("rmsnorm.py") and "@triton.jit" in text
    assert ic.library_source(analysis.chains[0], "") == ("", "", "")


def test_foreign_inductor_folder_refused(tmp_path):
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "mine.py").write_text("x = 1\n")
    with pytest.raises(UserError, match="did not write"):
        ic.check_dir(tmp_path, ours=False)
    ic.check_dir(tmp_path, ours=True)
    res = CliRunner().invoke(app, ["analyze", str(MODELS / "tiny_pointwise.py"), "--out", str(tmp_path),
                                   "--inductor-code"])
    assert res.exit_code == 2 and "did not write" in res.output
    assert (tmp_path / "inductor" / "mine.py").read_text() == "x = 1\n"


def test_meta_factory_ops_are_retargeted():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    full = graph.call_function(torch.ops.aten.full.default, ([4], 2.0), {"device": torch.device("meta"),
                                                                         "dtype": torch.float32})
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (x, full)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    ic._retarget(gm, torch.device("cpu"))
    (y,) = gm(torch.ones(4))
    assert y.device.type == "cpu" and y.tolist() == [2.0] * 4


@pytest.mark.gpu
def test_gpu_code_is_triton():
    kept = []
    analysis = analyze(MODELS / "tiny_pointwise.py", device="cuda", on_capture=kept.append)
    rec = ic.generate(analysis, kept[0].graphs, top=1)["c0"]
    assert rec.status == "generated" and rec.language == "triton" and "@triton.jit" in rec.code
