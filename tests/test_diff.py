"""fusion-advisor diff A B (fusion_advisor/report/diff.py): chains matched across two report folders by module and
source line (not by id), changed routes, bound classes, kernels and times found, repeated layers grouped, the
table and HTML written; bad input is one clear message."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from fusion_advisor.report import diff as D
from fusion_advisor.report import write as report
from fusion_advisor.cli import app
from fusion_advisor.analyze.records import SourceLoc
from tests.test_report import make_analysis
from tests.test_report_views import layered

runner = CliRunner()


def _b_side():
    """A with a torch upgrade's kind of damage: every id shifted by a new chain at the front, the rmsnorm group
    (4 layers) no longer on the library kernel, one chain twice as slow."""
    b = layered(4)
    shifted = {c.id: f"c{int(c.id[1:]) + 100}" for c in b.chains}
    new = replace(b.chains[2], id="c0", source=SourceLoc("/home/u/model.py", 5, "z = new_op(x)"),
                  module_path="model.embed")
    b.estimates = {shifted[k]: v for k, v in b.estimates.items()}
    b.decisions = {shifted[k]: replace(v, chain_id=shifted[k]) for k, v in b.decisions.items()}
    b.chains = [new] + [replace(c, id=shifted[c.id]) for c in b.chains]
    b.estimates["c0"] = b.estimates["c102"]
    b.decisions["c0"] = replace(b.decisions["c102"], chain_id="c0")
    for cid in ("c101", "c111", "c112", "c113"):  # the rmsnorm layers: triton -> torch.compile
        b.decisions[cid] = replace(b.decisions[cid], route="torch.compile", kernel="", rule_id="rule-torch.compile")
    b.estimates["c100"] = replace(b.estimates["c100"], eager_us=b.estimates["c100"].eager_us * 2)
    b.versions = {**b.versions, "torch": "2.14.0"}
    return b


@pytest.fixture()
def folders(tmp_path):
    a, b = layered(4), _b_side()
    report.write_report(a, tmp_path / "A")
    report.write_report(b, tmp_path / "B")
    return tmp_path / "A", tmp_path / "B"


def test_chains_match_across_shifted_ids_and_changes_are_found(folders):
    d = D.diff_folders(*folders)
    changed = {r["chain_a"]: r for r in d.changed}
    # the 4 rmsnorm layers: one row, x4, route and kernel changed; matched c1 -> c101 despite the id shift
    r = changed["c1; c11; c12; c13"]
    assert r["count"] == 4 and r["chain_b"] == "c101; c111; c112; c113"
    assert "route: triton -> torch.compile" in r["changes"] and "kernel: rmsnorm -> (none)" in r["changes"]
    assert r["module"] == "model.layers.*" and r["layers"] == "0, 1, 2, 3"
    # c0 got twice as slow (eager estimate); its route did not change
    slow = changed["c0"]
    assert slow["changes"].startswith("est_eager_us:") and "route:" not in slow["changes"]
    # the new chain is only in B; nothing is only in A
    assert [r["chain_b"] for r in d.rows if r["status"] == "only in B"] == ["c0"]
    assert not [r for r in d.rows if r["status"] == "only in A"]
    # unchanged chains are matched and 'same'
    same = [r for r in d.rows if r["status"] == "same"]
    assert {r["chain_a"] for r in same} >= {"c3", "c90"}
    assert ("torch", "2.13.0", "2.14.0") in d.facts


def test_another_spec_names_the_inputs_that_move_the_predictions(tmp_path):
    # a fresh user's H200-vs-H100 diff read memory-bound chains as faster on the H100 with nothing to say why:
    # the shipped specs' host cost per op (12 vs 7.5 us)
    a, b = layered(2), layered(2)
    b.device_spec = {**b.device_spec, "name": "h100", "launch_overhead_us": 7.5, "memory_bandwidth_gbps": 3350.0}
    a.device_spec = {**a.device_spec, "launch_overhead_us": 12.0, "memory_bandwidth_gbps": 4800.0}
    report.write_report(a, tmp_path / "A")
    report.write_report(b, tmp_path / "B")
    facts = {label: (x, y) for label, x, y in D.diff_folders(tmp_path / "A", tmp_path / "B").facts}
    assert facts["spec: host time per eager op"] == ("12 us", "7.5 us")
    assert facts["spec: memory bandwidth"] == ("4,800 GB/s", "3,350 GB/s")


def test_a_folder_against_itself_has_no_change(folders):
    d = D.diff_folders(folders[0], folders[0])
    assert d.changed == [] and d.rows and all(r["status"] == "same" for r in d.rows)


def test_threshold_decides_what_a_time_change_is(folders):
    assert any("est_eager_us" in r["changes"] for r in D.diff_folders(*folders, threshold=0.1).changed)
    assert not any("est_eager_us" in r["changes"] for r in D.diff_folders(*folders, threshold=10.0).changed)


def test_cli_diff_writes_html_and_csv_and_can_fail_on_change(folders, tmp_path):
    out = tmp_path / "d"
    r = runner.invoke(app, ["diff", str(folders[0]), str(folders[1]), "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "torch: 2.13.0 (A) -> 2.14.0 (B)" in text and "route: triton -> torch.compile" in text
    html = (out / "diff.html").read_text()
    assert "route: triton -&gt; torch.compile" in html and "<script>" in html and "x4" in html
    rows = list(csv.DictReader((out / "diff.csv").open()))
    assert list(rows[0]) == list(D.DIFF_COLUMNS) and {r["status"] for r in rows} >= {"changed", "same", "only in B"}
    r = runner.invoke(app, ["diff", str(folders[0]), str(folders[1]), "--out", str(out), "--fail-on-change"])
    assert r.exit_code == 1
    r = runner.invoke(app, ["diff", str(folders[0]), str(folders[0]), "--out", str(out), "--fail-on-change"])
    assert r.exit_code == 0 and "no chain changed" in r.output
    r = runner.invoke(app, ["diff", str(folders[0]), str(folders[1]), "--out", str(out), "--top", "0"])
    assert r.exit_code == 0 and "chain(s) changed" in r.output and "┏" not in r.output  # no empty table frame


def test_fail_on_change_fails_when_the_plan_apply_chose_changed(folders, tmp_path, monkeypatch):
    """Two apply runs of one model read 'apply chose: torch.compile (A) -> eager (B)', then 'no chain changed', and
    --fail-on-change exited 0 (found by a fresh user). A folder without a plan beside one with a plan is no change
    of plan."""
    same = D.diff_folders(folders[0], folders[0])
    assert same.changed == [] and not same.plan_changed
    for chosen, fails in ((("torch.compile", "eager"), True), (("eager", "eager"), False), (("eager", "–"), False)):
        d = replace(same, facts=[*same.facts, ("apply chose", *chosen)])
        assert d.plan_changed is fails
        monkeypatch.setattr(D, "diff_folders", lambda *a, d=d, **k: d)
        r = runner.invoke(app, ["diff", str(folders[0]), str(folders[0]), "--out", str(tmp_path / "d"),
                                "--fail-on-change"])
        assert r.exit_code == (1 if fails else 0), r.output
        assert "no chain changed" in r.output


@pytest.mark.parametrize("make, message", [
    (lambda t: (t / "nope", t / "A"), "no such folder"),
    (lambda t: (t / "empty", t / "A"), "no report.json"),
])
def test_cli_diff_bad_input_is_one_message(folders, tmp_path, make, message):
    (tmp_path / "empty").mkdir()
    a, b = make(tmp_path)
    r = runner.invoke(app, ["diff", str(a), str(b), "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and message in " ".join(r.output.split()) and "Traceback" not in r.output


def test_cli_diff_never_overwrites_a_foreign_file(folders, tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "diff.html").write_text("mine")
    r = runner.invoke(app, ["diff", str(folders[0]), str(folders[1]), "--out", str(out)])
    assert r.exit_code == 2 and "did not write" in " ".join(r.output.split())
    assert (out / "diff.html").read_text() == "mine"
    r = runner.invoke(app, ["diff", str(folders[0]), str(folders[1]), "--out", str(tmp_path / "e"),
                            "--threshold", "-1"])
    assert r.exit_code == 2 and "--threshold -1" in r.output


def test_two_model_files_are_named_as_a_doubtful_pairing(tmp_path):
    """diff of two unrelated models paired chains by line number alone and exited 0 without a word (found by a
    fresh user)."""
    a, b = layered(2), layered(2)
    b.model_file = "/elsewhere/other_model.py"
    report.write_report(a, tmp_path / "A")
    report.write_report(b, tmp_path / "B")
    d = D.diff_folders(tmp_path / "A", tmp_path / "B")
    assert len(d.warnings) == 1 and "different model files" in d.warnings[0] and "other_model.py" in d.warnings[0]
    r = runner.invoke(app, ["diff", str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(tmp_path / "d")])
    assert r.exit_code == 0 and "warning: A and B analysed different model files" in " ".join(r.output.split())
    assert "different model files" in (tmp_path / "d" / "diff.html").read_text()
    assert D.diff_folders(tmp_path / "A", tmp_path / "A").warnings == []
    # two unrelated files of one name in two folders (a reviewer): told apart by path where both are absolute
    a.model_file, b.model_file = "/proj/one/model.py", "/proj/two/model.py"
    report.write_report(a, tmp_path / "A2")
    report.write_report(b, tmp_path / "B2")
    assert "/proj/two/model.py" in D.diff_folders(tmp_path / "A2", tmp_path / "B2").warnings[0]
    b.model_file = "model.py"  # typed relative in another folder: the same name is the same file
    report.write_report(b, tmp_path / "B3")
    assert D.diff_folders(tmp_path / "A2", tmp_path / "B3").warnings == []
