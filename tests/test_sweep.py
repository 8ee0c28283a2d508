"""Tests of fusion_advisor.kernel_tools.sweep and ``fusion-advisor bench FILE --sweep`` (CPU: Triton interpreter).

They check the bookkeeping, never speed: every config verified before it is timed, a config that breaks masking
rejected with its reason while the sweep goes on, a config that fails to launch rejected, the best config per
size (marked on GPU times only), the autotune path, the clear message of a file without hooks, the files (CSV readable by pandas, JSON) and
the never-overwrite check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from fusion_advisor.cli import app
from fusion_advisor.errors import ContractError, UserError
from fusion_advisor.kernel_tools.sweep import (
    COLUMNS,
    CPU_LABEL,
    SizeSummary,
    SweepHooks,
    SweepRow,
    check_sweep_dir,
    load_hooks,
    mark_best,
    run_sweep,
    write_sweep,
)
from fusion_advisor.kernel_tools.verify import load_contract

KERNELS = Path(__file__).parent / "data" / "kernels"
FAST = dict(warmup_ms=0.5, rep_ms=2.0)
runner = CliRunner()


@pytest.fixture(scope="module")
def add_sweep():
    return run_sweep(load_hooks(load_contract(KERNELS / "sweep_add.py")), **FAST)


def test_sweep_table_rows_and_best(add_sweep):
    rows = {(r.size, r.config): r for r in add_sweep.rows}
    assert [s.size for s in add_sweep.sizes] == ["1024", "1031"]
    assert len(add_sweep.rows) == 2 * 3
    for r in add_sweep.rows:
        assert r.measured_on == CPU_LABEL
        assert r.bytes == 3 * int(r.size) * 4  # bytes_moved of the file, fp32
        assert r.gbps is None and r.pct_roofline is None  # not computed for interpreter times
        if r.status == "ok":
            assert r.time_ms > 0 and r.first_call_ms > 0 and r.benchmark_iters >= 3
    # interpreter times rank nothing about a GPU: no config is marked, best or not (the CSV's column is empty)
    assert all(r.best is None for r in add_sweep.rows)
    assert add_sweep.frame()["best"].isna().all()
    assert all(s.best_config == "" and s.best_time_ms is None for s in add_sweep.sizes)
    # the EVEN_N config is right where the block divides the size, and rejected where it does not
    even = "BLOCK_SIZE=256 num_warps=4 EVEN_N=True"
    assert rows[("1024", even)].status == "ok"
    bad = rows[("1031", even)]
    assert bad.status == "rejected" and bad.time_ms is None and not bad.best
    assert bad.reason.startswith("failed verification") and "MISMATCH in 7 of 1031" in bad.reason
    assert add_sweep.sizes[1].rejected == 1
    assert add_sweep.sizes[1].failed_verification == 1 and add_sweep.failed_sizes == ["1031"]  # exit 1 from the CLI
    assert CPU_LABEL in add_sweep.note and add_sweep.interpreted


def test_mark_best_takes_the_fastest_verified_row():
    def row(config, status, ms):
        return SweepRow(size="1024", config=config, status=status, time_ms=ms)

    rows = [row("a", "ok", 2.0), row("b", "rejected", None), row("c", "ok", 1.5), row("d", "ok", None)]
    summary = SizeSummary(size="1024", best_config="", best_time_ms=None, rejected=1)
    mark_best(rows, summary)
    assert [r.best for r in rows] == [False, False, True, False]
    assert (summary.best_config, summary.best_time_ms) == ("c", 1.5)
    nothing = SizeSummary(size="1024", best_config="", best_time_ms=None, rejected=1)
    rejected = [row("b", "rejected", None)]
    mark_best(rejected, nothing)
    assert nothing.best_config == "" and nothing.best_time_ms is None and rejected[0].best is None


def test_config_that_fails_to_launch_is_rejected_and_sweep_goes_on():
    contract = load_contract(KERNELS / "sweep_add.py")
    hooks = load_hooks(contract)
    hooks.configs = [{"BLOCK_SIZE": 256}, {"BLOCK_SIZE": 256, "NO_SUCH_PARAM": 1}, {"BLOCK_SIZE": 1024}]
    hooks.sizes = [1031]
    result = run_sweep(hooks, **FAST)
    status = [(r.status, r.reason.split(":")[0]) for r in result.rows]
    assert status == [("ok", ""), ("rejected", "failed to compile or launch"), ("ok", "")]
    assert "NO_SUCH_PARAM" in result.rows[1].reason
    assert result.failed_sizes == []  # a config that does not launch computes nothing wrong: not a failed size
    # but a size where no config ran at all is (a fresh user's kernel_fn took no launch parameters: exit 0 before)
    hooks.configs = [{"NO_SUCH_PARAM": 1}, {"NO_SUCH_PARAM": 2}]
    assert run_sweep(hooks, **FAST).failed_sizes == ["1031"]
    # a size no config fits (out of resources on a GPU) is not the file's fault: not a failed size (a reviewer's
    # find: every config of one very wide size rejected would have made the whole sweep exit 1)
    result = run_sweep(hooks, **FAST)
    for r in result.rows:
        r.reason = "failed to compile or launch: OutOfResources: out of resource: shared memory"
    assert result.failed_sizes == []


def test_autotune_configs_are_swept():
    hooks = load_hooks(load_contract(KERNELS / "sweep_autotune.py"))
    assert hooks.source == "triton.autotune"
    result = run_sweep(hooks, **FAST)
    assert [s.size for s in result.sizes] == ["700", "2x300"]
    assert {r.config for r in result.rows} == {"BLOCK_SIZE=128 num_warps=2 num_stages=3",
                                              "BLOCK_SIZE=512 num_warps=4 num_stages=3"}
    assert all(r.status == "ok" and r.bytes is None and r.gbps is None for r in result.rows)
    assert all("GPU timer" in s.autotune_error for s in result.sizes)  # not run on the interpreter, and said so
    assert len(hooks.autotuner.configs) == 2  # restored after forcing each config


def test_file_without_hooks_names_what_to_add():
    with pytest.raises(ContractError) as info:
        load_hooks(load_contract(KERNELS / "no_sweep_hooks.py"))
    msg = str(info.value)
    assert "nothing to sweep" in msg and "no_sweep_hooks.py" in msg
    for name in ("SWEEP_CONFIGS", "kernel_fn(*args, **config)", "triton.autotune", "get_inputs(size)", "SIZES",
                 "SHAPES", "bytes_moved"):
        assert name in msg


@pytest.mark.parametrize("sizes", ["[0, 1000]", "[-4]", "[(16, 0)]"])
def test_sizes_that_are_not_positive_are_refused_as_verify_refuses_them(tmp_path, sizes):
    """bench --sweep swept and timed a size 0 ('ok', 0.376 ms) that verify and bench refuse; -4 failed inside the
    user's get_inputs (found by a fresh user)."""
    src = (KERNELS / "sweep_add.py").read_text()
    path = tmp_path / "sized_add.py"
    path.write_text(src + f"\n\ndef get_inputs(size=None):\n    return []\n\n\nSIZES = {sizes}\n")
    with pytest.raises(ContractError, match="a size must be a positive int or a tuple of them"):
        load_hooks(load_contract(path))


def test_malformed_configs_are_refused():
    hooks = load_hooks(load_contract(KERNELS / "sweep_add.py"))
    bad = SweepHooks(**{**hooks.__dict__, "configs": [("BLOCK_SIZE", 256)]})
    with pytest.raises(ContractError, match="list of dicts"):
        bad.configs_for(1024)


def test_files_written_and_csv_readable(add_sweep, tmp_path):
    paths = write_sweep(add_sweep, tmp_path / "out")
    frame = pd.read_csv(paths["csv"])
    assert list(frame.columns) == list(COLUMNS)
    assert len(frame) == 6 and set(frame["status"]) == {"ok", "rejected"}
    assert frame["best"].isna().all()  # interpreter times: nothing ranked, the column empty
    doc = json.loads(paths["json"].read_text())
    assert doc["sweep"] == "sweep_add" and doc["interpreted"] is True and len(doc["rows"]) == 6
    assert doc["sizes"][1]["rejected"] == 1
    write_sweep(add_sweep, tmp_path / "out")  # our own files: rewritten
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "sweep.csv").write_text("mine\n")
    with pytest.raises(UserError, match="did not write"):
        check_sweep_dir(foreign)
    assert (foreign / "sweep.csv").read_text() == "mine\n"


def test_cli_bench_sweep(tmp_path):
    out = tmp_path / "sw"
    res = runner.invoke(app, ["bench", str(KERNELS / "sweep_add.py"), "--sweep", "--out", str(out),
                              "--warmup-ms", "0.5", "--rep-ms", "2"])
    # the EVEN_N config computes wrong values at 1031: the sweep goes on and writes its files, then exits 1
    assert res.exit_code == 1, res.output
    assert "CPU interpreter, not a GPU measurement" in res.output
    assert "rejected" in res.output and "no best config (interpreter times)" in res.output
    assert "best BLOCK_SIZE" not in res.output
    assert "verification failed at size(s) 1031" in res.output
    assert (out / "sweep.csv").exists() and (out / "sweep.json").exists()
    assert json.loads((out / "sweep.json").read_text())["failed_sizes"] == ["1031"]
    # every config of every size verifies: exit 0
    ok = runner.invoke(app, ["bench", str(KERNELS / "sweep_autotune.py"), "--sweep", "--out", str(tmp_path / "ok"),
                             "--warmup-ms", "0.5", "--rep-ms", "2"])
    assert ok.exit_code == 0, ok.output
    assert "verification failed" not in ok.output
    res = runner.invoke(app, ["bench", str(KERNELS / "no_sweep_hooks.py"), "--sweep", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "nothing to sweep" in res.output and "Traceback" not in res.output


def test_library_kernels_have_hooks():
    from kernel_library.sweeps import SWEEPS

    assert {"rmsnorm", "softmax", "cross_entropy", "layernorm", "swiglu", "geglu"} <= set(SWEEPS)
    hooks = load_hooks(load_contract("rmsnorm"))
    assert hooks.sizes and all(isinstance(s, tuple) for s in hooks.sizes)
    configs = hooks.configs_for(hooks.sizes[0])
    assert {"BLOCK_SIZE", "num_warps", "looped"} <= set(configs[0])
    with pytest.raises(ContractError, match="no sweep hooks"):
        load_hooks(load_contract("rope"))


def test_library_cross_entropy_sweep_verifies_loss_and_grad():
    hooks = load_hooks(load_contract("cross_entropy"))
    hooks.sizes = [(4, 600)]
    hooks.configs = [{"BLOCK_SIZE": 1024, "num_warps": 4, "single_block": True},
                     {"BLOCK_SIZE": 256, "num_warps": 4, "single_block": False},
                     {"BLOCK_SIZE": 256, "num_warps": 4, "single_block": True}]  # a block narrower than the row
    result = run_sweep(hooks, **FAST)
    assert [r.status for r in result.rows] == ["ok", "ok", "rejected"]
    assert "failed verification" in result.rows[2].reason


@pytest.mark.gpu
def test_gpu_sweep_reports_throughput_and_roofline():
    result = run_sweep(load_hooks(load_contract(KERNELS / "sweep_add.py")), spec_name="h200", **FAST)
    assert not result.interpreted and result.note == ""
    ok = [r for r in result.rows if r.status == "ok"]
    assert ok and all(r.gbps > 0 and 0 < r.pct_roofline for r in ok)
    assert all(r.measured_on.startswith("cuda") for r in result.rows)


@pytest.mark.gpu
def test_gpu_autotune_first_call_timed_apart():
    result = run_sweep(load_hooks(load_contract(KERNELS / "sweep_autotune.py")), **FAST)
    assert all(s.autotune_ms is not None and s.autotune_choice.startswith("BLOCK_SIZE=") for s in result.sizes)
