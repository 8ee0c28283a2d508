"""CPU test of the selection logic of the norm-backward sweeps (fusion_advisor/kernel_tools/norm_bwd_sweep.py).

The sweeps time on a GPU (torch.profiler); here they run on the Triton interpreter at tiny shapes with a host
clock standing in for ``device_time_ms`` and torch.compile replaced by the eager function, so what is tested is
the verification of every config, the default-first order, the choice of the fastest verified config and the
tuning line printed for adoption -- not any timing.
"""

from __future__ import annotations

import time

import pytest
import torch

import fusion_advisor.kernel_tools.norm_bwd_sweep as st
import kernel_library._rows as krows
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
    monkeypatch.setattr(st, "norm_bwd_configs", lambda: configs)
    out = getattr(st, sweep)(1000.0, n_rows=9, n_cols=64)
    rows = out["configs"]
    import kernel_library.add_rmsnorm as arms
    import kernel_library.layernorm as ln

    current = (arms.BWD_TUNING if sweep == "add_rmsnorm_bwd_sweep" else ln.ADD_BWD_TUNING).apply(
        rn.RowConfig.backward(64))  # the module's default launch is timed first
    assert rows[0]["is_default"] and (rows[0]["rows_per_iter"], rows[0]["num_stages"]) == (current.rows_per_iter,
                                                                                          current.num_stages)
    assert len(rows) == 1 + len(configs) and all(r["verified"] for r in rows)
    best = out["summary"]["best"]
    assert best["gpu_ms"] == min(r["gpu_ms"] for r in rows)
    # the tuning line reproduces the best config from the heuristic one
    cfg = eval(best["tuning"], {"BwdTuning": rn.BwdTuning}).apply(rn.RowConfig.backward(64))  # noqa: S307
    assert (cfg.rows_per_iter, cfg.num_stages, cfg.num_warps) == (best["rows_per_iter"], best["num_stages"],
                                                                   best["num_warps"])
    assert (cfg.programs_per_sm or krows.BWD_PROGRAMS_PER_SM) == (best["programs_per_sm"] or krows.BWD_PROGRAMS_PER_SM)
    assert f"BWD_TUNING = {best['tuning']}" in capsys.readouterr().out


def test_norm_bwd_sweep_flags_a_wrong_config(cpu_sweep, monkeypatch):
    # a config whose dx is off must come out unverified and never be chosen
    monkeypatch.setattr(st, "norm_bwd_configs", lambda: [(2, 1, 4, 2)])
    real = rn.rms_norm_bwd_launch

    def broken(dy, x, w, eps, offset, ds=None, config=None, tuning=None):
        dx, dw = real(dy, x, w, eps, offset, ds=ds, config=config, tuning=tuning)
        return (dx * 1.5 if config is not None and config.rows_per_iter == 2 else dx), dw

    monkeypatch.setattr(rn, "rms_norm_bwd_launch", broken)
    out = st.add_rmsnorm_bwd_sweep(1000.0, n_rows=9, n_cols=64)
    assert [r["verified"] for r in out["configs"]] == [True, False]
    assert out["summary"]["best"]["is_default"]


def test_norm_bwd_sweep_stops_at_its_budget(cpu_sweep, monkeypatch):
    # the default is always timed; the configs left once the budget is spent are recorded as skipped, not dropped
    monkeypatch.setattr(st, "norm_bwd_configs", lambda: [(2, 1, 4, 2), (1, 4, 4, 3)])
    rows = st.add_rmsnorm_bwd_sweep(1000.0, n_rows=9, n_cols=64, budget_s=0.0)["configs"]
    assert rows[0]["is_default"] and "gpu_ms" in rows[0]
    assert len(rows) == 3 and all("skipped" in r and "gpu_ms" not in r for r in rows[1:])
