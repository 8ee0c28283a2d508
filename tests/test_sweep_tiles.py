"""CPU test of the selection logic of benchmarks/sweep_tiles.py's norm-backward and cross-entropy sweeps.

The sweeps time on a GPU (torch.profiler); here they run on the Triton interpreter at tiny shapes with a host
clock standing in for ``device_time_ms`` and torch.compile replaced by the eager function, so what is tested is
the verification of every config, the default-first order, the choice of the fastest verified config and the
tuning line printed for adoption -- not any timing.
"""

from __future__ import annotations

import time

import pytest
import torch

import benchmarks.sweep_tiles as st
import kernel_library.cross_entropy as ce
import kernel_library.rmsnorm as rn


def _host_ms(fn, iters: int = 10) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


@pytest.fixture
def cpu_sweep(monkeypatch):
    monkeypatch.setattr(st, "device_time_ms", _host_ms)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)


@pytest.mark.parametrize("sweep", ["add_rmsnorm_bwd_sweep", "add_layernorm_bwd_sweep"])
def test_norm_bwd_sweep_picks_a_verified_config_and_prints_its_tuning(cpu_sweep, monkeypatch, capsys, sweep):
    configs = [(1, 1, 4, None), (2, 1, 4, 2), (1, 4, 4, 3)]
    monkeypatch.setattr(st, "_norm_bwd_configs", lambda: configs)
    out = getattr(st, sweep)(1000.0, n_rows=9, n_cols=64)
    rows = out["configs"]
    assert rows[0]["is_default"] and (rows[0]["rows_per_iter"], rows[0]["num_stages"]) == (1, None)
    assert len(rows) == 1 + len(configs) and all(r["verified"] for r in rows)
    best = out["summary"]["best"]
    assert best["gpu_ms"] == min(r["gpu_ms"] for r in rows)
    # the tuning line reproduces the best config from the heuristic one
    cfg = eval(best["tuning"], {"BwdTuning": rn.BwdTuning}).apply(rn.RowConfig.backward(64))  # noqa: S307
    assert (cfg.rows_per_iter, cfg.num_stages, cfg.num_warps) == (best["rows_per_iter"], best["num_stages"],
                                                                   best["num_warps"])
    assert (cfg.programs_per_sm or rn.BWD_PROGRAMS_PER_SM) == (best["programs_per_sm"] or rn.BWD_PROGRAMS_PER_SM)
    assert f"BWD_TUNING = {best['tuning']}" in capsys.readouterr().out


def test_norm_bwd_sweep_flags_a_wrong_config(cpu_sweep, monkeypatch):
    # a config whose dx is off must come out unverified and never be chosen
    monkeypatch.setattr(st, "_norm_bwd_configs", lambda: [(2, 1, 4, 2)])
    real = rn.rms_norm_bwd_launch

    def broken(dy, x, w, eps, offset, ds=None, config=None, tuning=None):
        dx, dw = real(dy, x, w, eps, offset, ds=ds, config=config, tuning=tuning)
        return (dx * 1.5 if config is not None and config.rows_per_iter == 2 else dx), dw

    monkeypatch.setattr(rn, "rms_norm_bwd_launch", broken)
    out = st.add_rmsnorm_bwd_sweep(1000.0, n_rows=9, n_cols=64)
    assert [r["verified"] for r in out["configs"]] == [True, False]
    assert out["summary"]["best"]["is_default"]


def test_cross_entropy_sweep_old_path_first_and_tuning_line(cpu_sweep, monkeypatch, capsys):
    monkeypatch.setattr(st, "CE_VOCABS", (300, 70))
    monkeypatch.setattr(st, "CE_PROGRAMS_PER_SM", (None, 1))
    monkeypatch.setattr(st, "CE_NUM_STAGES", (None, 2))
    monkeypatch.setattr(st, "CE_CHUNKS", ((ce.LOOP_BLOCK, ce.LOOP_WARPS), (64, 2)))
    monkeypatch.setattr(ce, "MAX_SINGLE_BLOCK", 64)  # the chunked path at these tiny vocabularies
    original = ce.TUNING
    out = st.cross_entropy_sweep(1000.0, n_tokens=6)
    assert ce.TUNING is original  # restored
    for vocab in ("300", "70"):
        rows = out["shapes"][vocab]
        assert rows[0]["config"] == "torch.compile" and rows[1]["is_default"]
        timed = [r for r in rows[1:] if "gpu_ms" in r]
        # stage A (2 x 2 x 2), then B on the best of A: 3 variants if it is persistent (count x scale grid), else 1
        assert len(timed) in (8 + 1, 8 + 3) and all(r["verified"] for r in timed)
    line = out["summary"]["tuning_line"]
    tuning = eval(line.split(" = ", 1)[1], {"CrossEntropyTuning": ce.CrossEntropyTuning})  # noqa: S307
    assert repr(tuning) == out["summary"]["best"]
    assert line in capsys.readouterr().out
