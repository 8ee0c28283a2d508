"""benchmarks/apply/apply_models.py --combine: the last run of a file wins, the rest is kept, each row says its run."""

import json

import pytest

from benchmarks.apply.apply_models import combine


def _run(path, date, budget, rows):
    meta = {"gpu": "G", "torch": "t", "triton": "tr", "date": date, "rounds": 3, "budget_s": budget,
            "what": "forward under torch.no_grad()"}
    results = [{"file": f"kb/level2/{name}.py", "name": name, "level": "level2", "apply_s": 1.0,
                "eval": {"variants": {"eager": {"ms": 2.0, "correct_at_1e-2": True, "spread": 0.0},
                                      "plan": {"ms": plan_ms, "correct_at_1e-2": True, "spread": 0.0}}}}
               for name, plan_ms in rows]
    path.write_text(json.dumps({"meta": meta, "results": results}))
    return path


def test_last_run_of_a_file_wins_and_the_replaced_record_is_kept(tmp_path):
    a = _run(tmp_path / "a.json", "d1", 45.0, [("1_A", 1.0), ("2_B", 2.0)])
    b = _run(tmp_path / "b.json", "d2", 120.0, [("1_A", 0.5)])
    combine([f"first={a}", f"second={b}"], tmp_path / "out")
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = {r["name"]: r for r in doc["results"]}
    assert rows["1_A"]["eval"]["variants"]["plan"]["ms"] == 0.5 and rows["1_A"]["device_call"] == "second"
    assert rows["2_B"]["device_call"] == "first"
    assert [r["device_call"] for r in doc["superseded"]] == ["first"]
    assert doc["summary"]["level2"]["files"] == 2
    assert doc["summary"]["level2"]["plan_vs_best_baseline_geomean"] == pytest.approx(2.0)  # geomean of 2/0.5 and 2/2
    assert doc["meta"]["budget_s"] == "120 / 45" and set(doc["meta"]["combined_from"]) == {"first", "second"}
    assert "| 1_A |" in (tmp_path / "out" / "results.md").read_text()


def test_a_source_that_is_not_label_equals_path_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="LABEL=PATH"):
        combine([str(tmp_path / "missing.json")], tmp_path / "out")
