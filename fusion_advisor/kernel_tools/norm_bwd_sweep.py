"""The norm backward launch sweeps: every config verified against float64, the fastest verified one, its tuning line.

The fused backward of ``kernel_library.rmsnorm`` (shared by add_rmsnorm) and ``kernel_library.layernorm`` (and
add_layernorm) takes a ``RowConfig`` (rows per loop step, programs per SM, warps, the row loop's ``num_stages``); each
module adopts its measured best as a ``BwdTuning`` over the width heuristic (``rmsnorm.BWD_TUNING``,
``add_rmsnorm.BWD_TUNING``, ``layernorm.BWD_TUNING`` / ``ADD_BWD_TUNING``). These sweeps time the module's current
default first, then every config of :func:`norm_bwd_configs`, verify each one before it counts, and print the
``BwdTuning(...)`` line that adopts the fastest. ``benchmarks/kernels/sweep_tiles.py --only rmsnorm_bwd,...`` runs
them on a GPU (8192 x 4096 bf16); ``tests/test_norm_bwd_sweep.py`` runs the selection on the CPU interpreter at tiny
sizes.

Times: :func:`fusion_advisor.kernel_tools.bench.device_time_ms` (summed CUDA kernel time per call, torch.profiler, 10 calls), ms;
``pct_of_copy``: the module's backward bytes-moved formula over the time, as % of ``copy_gbps`` (GB/s, read + write).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import torch

from fusion_advisor.kernel_tools.bench import device_time_ms
from fusion_advisor.verification.policy import TOLERANCES, judge

if TYPE_CHECKING:
    from kernel_library._rows import RowConfig


#: Norm backward sweeps: (rows_per_iter, num_warps) pairs that also get num_stages variants. ptxas for sm_90
#: (triton 3.9, rmsnorm, contiguous bf16 rows of 4096) spills at 64 elements per thread per tensor
#: (rows_per_iter=2 at 4 warps: 120 bytes of stack, 4 at 8 warps) and 4 x 4096 at 16 warps already spills a
#: little (32-64 bytes), so the pipelined variants are tried only where rows_per_iter * 4096 / (32 * warps) <= 32.
NORM_BWD_STAGED = ((1, 8), (1, 16), (2, 8), (2, 16), (4, 16))
NORM_BWD_STAGES = (2, 3)
#: Wall-clock budget of each norm backward sweep, s: the configs left when it runs out are recorded as skipped.
NORM_BWD_BUDGET_S = 30.0


def norm_bwd_configs() -> list[tuple[int, int, int, int | None]]:
    """(rows_per_iter, programs_per_sm, num_warps, num_stages): the full 3 x 3 x 3 grid with the loop's default
    num_stages, then num_stages (2, 3) (and 4 for one row per step) for the pairs in ``NORM_BWD_STAGED``."""
    configs = [(r, p, wp, None) for r in (1, 2, 4) for wp in (4, 8, 16) for p in (1, 2, 4)]
    for r, wp in NORM_BWD_STAGED:
        for st in NORM_BWD_STAGES + ((4,) if r == 1 else ()):
            configs += [(r, p, wp, st) for p in (1, 2, 4)]
    return configs


def tuning_line(cfg: "RowConfig", table_cfg: "RowConfig") -> str:
    """The ``BwdTuning(...)`` expression that reproduces the fused launch ``cfg`` from the heuristic ``table_cfg``."""
    from kernel_library._rows import BWD_PROGRAMS_PER_SM  # what programs_per_sm=None means

    fields = []
    if cfg.num_stages is not None:
        fields.append(f"num_stages={cfg.num_stages}")
    if cfg.rows_per_iter != 1:
        fields.append(f"rows_per_iter={cfg.rows_per_iter}")
    if cfg.programs_per_sm is not None and cfg.programs_per_sm != BWD_PROGRAMS_PER_SM:
        fields.append(f"programs_per_sm={cfg.programs_per_sm}")
    if cfg.num_warps != table_cfg.num_warps:
        fields.append(f"num_warps={cfg.num_warps}")
    return f"BwdTuning({', '.join(fields)})"


def sweep_norm_bwd(kernel: str, run, table_cfg, tuning, tuning_name: str, ref: list[torch.Tensor], nbytes: int,
                   copy_gbps: float, budget_s: float = NORM_BWD_BUDGET_S) -> dict:
    """Time ``run(cfg) -> [dx, dparam, ...]`` for the module's current default and every config of
    :func:`norm_bwd_configs`; returns ``{"configs": [...], "summary": {"tuning_name", "default", "best",
    "speedup_vs_default"}}``. ``copy_gbps``: the copy bandwidth (GB/s) the ``pct_of_copy`` of each row is taken of;
    ``budget_s``: wall-clock seconds after which the configs left are recorded as skipped (at least one is timed).

    ``table_cfg``: ``RowConfig.backward`` for the width (the heuristic before tuning); ``tuning``: the module's
    current ``BwdTuning`` (named ``tuning_name``, e.g. ``kernel_library/add_rmsnorm.py BWD_TUNING``), whose config
    is timed first as the default. ``ref``: float64 [dx, dparam, ...] computed once. A config is verified when dx
    is within the bf16 table (atol 2e-2, rtol 1.6e-2, fusion_advisor.verification.policy) of ``ref[0]`` and every
    parameter gradient passes the error policy (:func:`fusion_advisor.verification.policy.judge`) with the heuristic
    config's own gradient as the eager scale: finite, within 2x its norm-wise and 4x its max-wise error against
    float64 (another warp count or row grouping changes the fp32 summation order: no bitwise equality).
    Time: summed CUDA kernel time per call (torch.profiler, 10 calls), partial-sum reductions included.
    ``best``: the fastest verified config, the default's time, and the ``BwdTuning`` line that selects it (printed).
    """
    atol, rtol = TOLERANCES[torch.bfloat16]

    def param_errs(grads: list[torch.Tensor]) -> list[float]:
        return [float((g.double() - r).abs().max()) for g, r in zip(grads[1:], ref[1:])]

    base_grads = run(table_cfg)
    base_errs = param_errs(base_grads)
    default_cfg = tuning.apply(table_cfg)
    default_key = (default_cfg.rows_per_iter, default_cfg.programs_per_sm, default_cfg.num_warps,
                   default_cfg.num_stages)
    print(f"{kernel} heuristic {table_cfg}, current default {default_cfg}: parameter-gradient max errors vs "
          f"float64 {base_errs}", flush=True)
    out = []
    t0 = time.monotonic()
    configs = [default_key] + [c for c in norm_bwd_configs() if c != default_key]
    for r, p, wp, st in configs:
        cfg = dataclasses.replace(table_cfg, num_warps=wp, rows_per_iter=r, programs_per_sm=p, num_stages=st)
        label = f"rows_per_iter={r} programs_per_sm={p} warps={wp} num_stages={st}"
        row = {"kernel": kernel, "config": label, "rows_per_iter": r, "programs_per_sm": p, "num_warps": wp,
               "num_stages": st, "is_default": (r, p, wp, st) == default_key,
               "tuning": tuning_line(cfg, table_cfg)}
        if out and time.monotonic() - t0 > budget_s:
            out.append({**row, "skipped": f"sweep budget of {budget_s:.0f} s spent"})
            continue
        try:
            grads = run(cfg)
            dx_err = (grads[0].double() - ref[0]).abs()
            dx_ok = bool((dx_err <= atol + rtol * ref[0].abs()).all())
            errs = param_errs(grads)
            ok = dx_ok and all(judge(g, r, b, "dparam").ok for g, r, b in zip(grads[1:], ref[1:], base_grads[1:]))
            ms = device_time_ms(lambda: run(cfg))
        except Exception as e:  # noqa: BLE001
            print(f"  {kernel} {label}: FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
            out.append({**row, "error": str(e)[:300]})
            continue
        pct = 100 * nbytes / ms / 1e6 / copy_gbps
        out.append({**row, "verified": ok, "dx_max_abs_err": float(dx_err.max()), "dparam_max_abs_err": errs,
                    "heuristic_dparam_max_abs_err": base_errs, "gpu_ms": ms, "pct_of_copy": pct})
        print(f"  {kernel} {label}: {ms:.4f} ms ({pct:.0f}% of copy) ok={ok} "
              f"(dx err {float(dx_err.max()):.3g}, dparam err {', '.join(f'{e:.3g}' for e in errs)})", flush=True)
    print(f"{kernel} sweep: {time.monotonic() - t0:.0f} s", flush=True)
    timed = [r for r in out if r.get("verified")]
    default_row = next((r for r in out if r["is_default"] and "gpu_ms" in r), None)
    best = min(timed, key=lambda r: r["gpu_ms"]) if timed else None
    summary = {"tuning_name": tuning_name, "default": default_row, "best": best}
    if best and default_row:
        summary["speedup_vs_default"] = default_row["gpu_ms"] / best["gpu_ms"]
        print(f"{kernel} BEST {best['config']}: {best['gpu_ms']:.4f} ms ({best['pct_of_copy']:.0f}% of copy) vs "
              f"default {default_row['gpu_ms']:.4f} ms ({default_row['pct_of_copy']:.0f}%), "
              f"x{summary['speedup_vs_default']:.2f}; to adopt: {tuning_name} = {best['tuning']}", flush=True)
    return {"configs": out, "summary": summary}


def _bf16_grad(n_rows: int, n_cols: int, device, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(n_rows, n_cols, device=device, generator=gen).to(torch.bfloat16)


def rmsnorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096,
                      budget_s: float = NORM_BWD_BUDGET_S) -> dict:
    """rmsnorm backward (Llama form) at n_rows x n_cols (8192 x 4096) bf16, forced through ``RowConfig``:
    rows_per_iter (1, 2, 4) x programs per SM (1, 2, 4) x num_warps (4, 8, 16), plus num_stages variants
    (:func:`norm_bwd_configs`); checked against autograd of ``reference_fn`` on float64 copies."""
    import kernel_library.rmsnorm as rn

    x, w, eps, offset = rn.make_inputs(n_rows, n_cols, torch.bfloat16)
    dy = _bf16_grad(n_rows, n_cols, x.device, 1)
    xd, wd = x.detach(), w.detach()
    x64, w64 = xd.double().requires_grad_(), wd.double().requires_grad_()
    ref = list(torch.autograd.grad(rn.reference_fn(x64, w64, eps, offset), (x64, w64), dy.double()))

    def run(cfg):
        return list(rn.rms_norm_bwd_launch(dy, xd, wd, eps, offset, config=cfg))

    return sweep_norm_bwd("rmsnorm_bwd", run, rn.RowConfig.backward(n_cols), rn.BWD_TUNING,
                          "kernel_library/rmsnorm.py BWD_TUNING", ref, rn.bytes_moved_backward(x, w), copy_gbps,
                          budget_s)


def add_rmsnorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096,
                          budget_s: float = NORM_BWD_BUDGET_S) -> dict:
    """add_rmsnorm backward (the residual variant of the RMSNorm backward: reads dy, d(new residual) and the saved
    new residual) at n_rows x n_cols (8192 x 4096) bf16, the configs of :func:`norm_bwd_configs`; checked against
    autograd of ``add_rmsnorm.reference_fn`` on float64 copies (gradient of x, which residual shares; dweight)."""
    import kernel_library.add_rmsnorm as ar
    import kernel_library.rmsnorm as rn

    x, res, w, eps = [t.detach() if isinstance(t, torch.Tensor) else t
                      for t in ar.make_inputs(n_rows, n_cols, torch.bfloat16)]
    s = res + x  # the saved new residual, rounded to bf16 as the forward stores it
    dy, dres = _bf16_grad(n_rows, n_cols, x.device, 1), _bf16_grad(n_rows, n_cols, x.device, 2)
    leaves64 = [t.double().requires_grad_() for t in (x, res, w)]
    y64, s64 = ar.reference_fn(*leaves64, eps)
    gx, _gres, gw = torch.autograd.grad((y64, s64), leaves64, (dy.double(), dres.double()))
    ref = [gx, gw]

    def run(cfg):
        return list(rn.rms_norm_bwd_launch(dy, s, w, eps, 0.0, ds=dres, config=cfg))

    return sweep_norm_bwd("add_rmsnorm_bwd", run, rn.RowConfig.backward(n_cols), ar.BWD_TUNING,
                          "kernel_library/add_rmsnorm.py BWD_TUNING", ref, ar.bytes_moved_backward(x, res, w),
                          copy_gbps, budget_s)


def layernorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096,
                        budget_s: float = NORM_BWD_BUDGET_S) -> dict:
    """layernorm backward (weight and bias, no residual) at n_rows x n_cols (8192 x 4096) bf16, the same configs
    as :func:`rmsnorm_bwd_sweep`; checked against autograd of ``reference_fn`` on float64 copies."""
    import kernel_library.layernorm as ln

    x, w, b, eps = ln.make_inputs(n_rows, n_cols, torch.bfloat16, requires_grad=False)
    dy = _bf16_grad(n_rows, n_cols, x.device, 1)
    leaves64 = [t.double().requires_grad_() for t in (x, w, b)]
    ref = list(torch.autograd.grad(ln.reference_fn(*leaves64, eps), leaves64, dy.double()))

    def run(cfg):
        return list(ln.layer_norm_bwd_launch(dy, x, w, b, eps, config=cfg))

    return sweep_norm_bwd("layernorm_bwd", run, ln.RowConfig.backward(n_cols), ln.BWD_TUNING,
                          "kernel_library/layernorm.py BWD_TUNING", ref, ln.bytes_moved_backward(x, w, b), copy_gbps,
                          budget_s)


def add_layernorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096,
                            budget_s: float = NORM_BWD_BUDGET_S) -> dict:
    """add_layernorm backward (weight, bias and the residual's d(new residual) stream) at n_rows x n_cols
    (8192 x 4096) bf16, the configs of :func:`norm_bwd_configs`; checked against autograd of
    ``layernorm.reference_fn(..., residual=)`` on float64 copies (gradient of x, which residual shares; dw; db)."""
    import kernel_library.layernorm as ln

    x, w, b, eps, res = ln.make_inputs(n_rows, n_cols, torch.bfloat16, residual=True, requires_grad=False)
    s = res + x
    dy, dres = _bf16_grad(n_rows, n_cols, x.device, 1), _bf16_grad(n_rows, n_cols, x.device, 2)
    leaves64 = [t.double().requires_grad_() for t in (x, w, b, res)]
    y64, s64 = ln.reference_fn(*leaves64[:3], eps, residual=leaves64[3])
    gx, gw, gb, _gres = torch.autograd.grad((y64, s64), leaves64, (dy.double(), dres.double()))
    ref = [gx, gw, gb]

    def run(cfg):
        return list(ln.layer_norm_bwd_launch(dy, s, w, b, eps, ds=dres, config=cfg))

    return sweep_norm_bwd("add_layernorm_bwd", run, ln.RowConfig.backward(n_cols), ln.ADD_BWD_TUNING,
                          "kernel_library/layernorm.py ADD_BWD_TUNING", ref,
                          ln.bytes_moved_backward(x, w, b, residual=res), copy_gbps, budget_s)
