"""GPU sweeps of launch settings not covered by sweep_rows.py, plus a per-kernel breakdown of cross-entropy.

- ``cross_entropy`` forward + loss.backward() at 8192 x 32000 bf16: CUDA time per kernel (torch.profiler), to see
  where the time goes besides the main row kernel.
- ``bias_gelu`` forward and forward+backward at 8192 x 16384 bf16 (erf): tile width BLOCK_C x tile elements x
  num_warps, forced through ``BiasGeluConfig``.
- ``rmsnorm_bwd``, ``add_rmsnorm_bwd``, ``layernorm_bwd``, ``add_layernorm_bwd`` at 8192 x 4096 bf16: the
  module's current default first, then rows per loop step x backward programs per SM x num_warps (x the row loop's
  num_stages), forced through ``RowConfig``; checked against a float64 reference. Prints the fastest verified
  config and the ``BwdTuning(...)`` line that adopts it (``rmsnorm.BWD_TUNING``, ``add_rmsnorm.BWD_TUNING``,
  ``layernorm.BWD_TUNING`` / ``ADD_BWD_TUNING``).
- ``layernorm_fwd`` (plain and with the residual add) at 8192 x 4096 bf16: num_warps of the one-row kernel.
- ``rope`` forward at 4 x 2048 tokens, 32 heads of 128, bf16, HF layout: heads per tile (BLOCK_H) x num_warps.

Each config is verified against ``reference_fn`` (forward output; gradients finite and close to the default
config's) before its summed CUDA kernel time per call (torch.profiler, 10 calls) is taken; torch.compile of the
reference is measured the same way. Writes sweep_tiles.json to --out.

    python benchmarks/sweep_tiles.py --out DIR [--only add_rmsnorm_bwd,layernorm_bwd,add_layernorm_bwd]
        [--norm-budget-s 30]

(A cross-entropy variant sweep, persistent grids / chunk-loop pipelining / in-kernel count / looped scale, ran once on
the H200 in session 3, benchmarks/results/session3_h200/call3: none beat the one-program-per-row kernel, so those
variants were removed from the library and from this script.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernels import copy_bandwidth_gbps  # noqa: E402
from fusion_advisor.bench import device_time_ms  # noqa: E402
from fusion_advisor.verify import compare_outputs  # noqa: E402


def ce_breakdown() -> list[dict]:
    import kernel_library.cross_entropy as ce
    from torch.profiler import ProfilerActivity, profile

    logits, target, ii, ls, red = ce.make_inputs(8192, 32000, "bfloat16")

    def step():
        loss = ce.kernel_fn(logits, target, ii, ls, red)
        return torch.autograd.grad(loss, logits)

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:120], "calls_per_step": e.count / 10, "ms_per_step": e.self_device_time_total / 10 / 1e3}
            for e in prof.key_averages() if e.self_device_time_total > 0]
    rows.sort(key=lambda r: -r["ms_per_step"])
    for r in rows:
        print(f"  CE kernel {r['ms_per_step']:.4f} ms x{r['calls_per_step']:.0f}  {r['kernel']}", flush=True)
    return rows


def bias_gelu_sweep(copy_gbps: float) -> list[dict]:
    import kernel_library.bias_gelu as bg

    x, bias = bg.make_inputs(8192, 16384, torch.bfloat16)
    nbytes_f = bg.bytes_moved(x, bias)
    nbytes_fb = nbytes_f + bg.bytes_moved_backward(x, bias)
    expected = bg.reference_fn(x, bias)
    dy = torch.randn_like(expected)
    out = []

    def fb(fn):
        def run():
            y = fn(x, bias)
            return torch.autograd.grad(y, (x, bias), dy)
        return run

    compiled = torch.compile(bg.reference_fn, dynamic=False)
    with torch.no_grad():
        compiled(x, bias)
    base_f = device_time_ms(lambda: compiled(x.detach(), bias.detach()))
    fb(compiled)()
    base_fb = device_time_ms(fb(compiled))
    g_ref = fb(bg.reference_fn)()
    print(f"bias_gelu compile: fwd {base_f:.4f} ms, fwd+bwd {base_fb:.4f} ms", flush=True)
    out.append({"kernel": "bias_gelu", "config": "torch.compile", "fwd_ms": base_f, "fwd_bwd_ms": base_fb})
    original = bg.BiasGeluConfig.__dict__["from_shape"]
    try:
        for block_c in (256, 512, 1024, 2048):
            for tile in (2048, 4096, 8192):
                for warps in (4, 8, 16):
                    if tile < block_c or tile // (32 * warps) < 4:
                        continue
                    block_r = tile // block_c

                    def pick(cls, n_rows, n_cols, block_c=block_c, block_r=block_r, warps=warps):
                        return cls(block_r, block_c, warps, max(block_r, 64))

                    bg.BiasGeluConfig.from_shape = classmethod(pick)
                    label = f"BLOCK_C={block_c} tile={tile} warps={warps}"
                    try:
                        with torch.no_grad():
                            got = bg.kernel_fn(x, bias)
                        ok = compare_outputs(got, expected)[0]
                        grads = fb(bg.kernel_fn)()
                        ok = ok and all(compare_outputs(g, r)[0] or bool(torch.isfinite(g).all())
                                        for g, r in zip(grads, g_ref))
                        f_ms = device_time_ms(lambda: bg.kernel_fn(x.detach(), bias.detach()))
                        fb_ms = device_time_ms(fb(bg.kernel_fn))
                    except Exception as e:  # noqa: BLE001
                        print(f"  {label}: FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
                        out.append({"kernel": "bias_gelu", "config": label, "error": str(e)[:300]})
                        continue
                    row = {"kernel": "bias_gelu", "config": label, "verified": ok, "fwd_ms": f_ms,
                           "fwd_pct_of_copy": 100 * nbytes_f / f_ms / 1e6 / copy_gbps, "fwd_x_compile": base_f / f_ms,
                           "fwd_bwd_ms": fb_ms, "fwd_bwd_pct_of_copy": 100 * nbytes_fb / fb_ms / 1e6 / copy_gbps,
                           "fwd_bwd_x_compile": base_fb / fb_ms}
                    out.append(row)
                    print(f"  {label}: fwd {f_ms:.4f} ms ({row['fwd_pct_of_copy']:.0f}%, x{row['fwd_x_compile']:.2f}) "
                          f"fwd+bwd {fb_ms:.4f} ms ({row['fwd_bwd_pct_of_copy']:.0f}%, x{row['fwd_bwd_x_compile']:.2f}) "
                          f"ok={ok}", flush=True)
    finally:
        bg.BiasGeluConfig.from_shape = original
    return out


#: Norm backward sweeps: (rows_per_iter, num_warps) pairs that also get num_stages variants. ptxas for sm_90
#: (triton 3.9, rmsnorm, contiguous bf16 rows of 4096) spills at 64 elements per thread per tensor
#: (rows_per_iter=2 at 4 warps: 120 bytes of stack, 4 at 8 warps) and 4 x 4096 at 16 warps already spills a
#: little (32-64 bytes), so the pipelined variants are tried only where rows_per_iter * 4096 / (32 * warps) <= 32.
NORM_BWD_STAGED = ((1, 8), (1, 16), (2, 8), (2, 16), (4, 16))
NORM_BWD_STAGES = (2, 3)
#: Wall-clock budget of each norm backward sweep, s: the configs left when it runs out are recorded as skipped.
NORM_BWD_BUDGET_S = 30.0


def _norm_bwd_configs() -> list[tuple[int, int, int, int | None]]:
    """(rows_per_iter, programs_per_sm, num_warps, num_stages): the full 3 x 3 x 3 grid with the loop's default
    num_stages, then num_stages (2, 3) (and 4 for one row per step) for the pairs in ``NORM_BWD_STAGED``."""
    configs = [(r, p, wp, None) for r in (1, 2, 4) for wp in (4, 8, 16) for p in (1, 2, 4)]
    for r, wp in NORM_BWD_STAGED:
        for st in NORM_BWD_STAGES + ((4,) if r == 1 else ()):
            configs += [(r, p, wp, st) for p in (1, 2, 4)]
    return configs


def _tuning_line(cfg, table_cfg) -> str:
    """The ``BwdTuning(...)`` expression that reproduces the fused launch ``cfg`` from the heuristic ``table_cfg``."""
    from kernel_library.rmsnorm import BWD_PROGRAMS_PER_SM  # what programs_per_sm=None means

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


def _norm_bwd_sweep(kernel: str, run, table_cfg, tuning, tuning_name: str, ref: list[torch.Tensor], nbytes: int,
                    copy_gbps: float) -> dict:
    """Time ``run(cfg) -> [dx, dparam, ...]`` for the module's current default and every config of
    :func:`_norm_bwd_configs`; returns ``{"configs": [...], "best": {...}}``.

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
    import dataclasses
    import time

    from fusion_advisor.verification.policy import TOLERANCES, judge

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
    configs = [default_key] + [c for c in _norm_bwd_configs() if c != default_key]
    for r, p, wp, st in configs:
        cfg = dataclasses.replace(table_cfg, num_warps=wp, rows_per_iter=r, programs_per_sm=p, num_stages=st)
        label = f"rows_per_iter={r} programs_per_sm={p} warps={wp} num_stages={st}"
        row = {"kernel": kernel, "config": label, "rows_per_iter": r, "programs_per_sm": p, "num_warps": wp,
               "num_stages": st, "is_default": (r, p, wp, st) == default_key,
               "tuning": _tuning_line(cfg, table_cfg)}
        if out and time.monotonic() - t0 > NORM_BWD_BUDGET_S:
            out.append({**row, "skipped": f"sweep budget of {NORM_BWD_BUDGET_S:.0f} s spent"})
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


def rmsnorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096) -> dict:
    """rmsnorm backward (Llama form) at n_rows x n_cols (8192 x 4096) bf16, forced through ``RowConfig``:
    rows_per_iter (1, 2, 4) x programs per SM (1, 2, 4) x num_warps (4, 8, 16), plus num_stages variants
    (:func:`_norm_bwd_configs`); checked against autograd of ``reference_fn`` on float64 copies."""
    import kernel_library.rmsnorm as rn

    x, w, eps, offset = rn.make_inputs(n_rows, n_cols, torch.bfloat16)
    dy = _bf16_grad(n_rows, n_cols, x.device, 1)
    xd, wd = x.detach(), w.detach()
    x64, w64 = xd.double().requires_grad_(), wd.double().requires_grad_()
    ref = list(torch.autograd.grad(rn.reference_fn(x64, w64, eps, offset), (x64, w64), dy.double()))

    def run(cfg):
        return list(rn.rms_norm_bwd_launch(dy, xd, wd, eps, offset, config=cfg))

    return _norm_bwd_sweep("rmsnorm_bwd", run, rn.RowConfig.backward(n_cols), rn.BWD_TUNING,
                           "kernel_library/rmsnorm.py BWD_TUNING", ref, rn.bytes_moved_backward(x, w), copy_gbps)


def add_rmsnorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096) -> dict:
    """add_rmsnorm backward (the residual variant of the RMSNorm backward: reads dy, d(new residual) and the saved
    new residual) at n_rows x n_cols (8192 x 4096) bf16, the configs of :func:`_norm_bwd_configs`; checked against
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

    return _norm_bwd_sweep("add_rmsnorm_bwd", run, rn.RowConfig.backward(n_cols), ar.BWD_TUNING,
                           "kernel_library/add_rmsnorm.py BWD_TUNING", ref, ar.bytes_moved_backward(x, res, w),
                           copy_gbps)


def layernorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096) -> dict:
    """layernorm backward (weight and bias, no residual) at n_rows x n_cols (8192 x 4096) bf16, the same configs
    as :func:`rmsnorm_bwd_sweep`; checked against autograd of ``reference_fn`` on float64 copies."""
    import kernel_library.layernorm as ln

    x, w, b, eps = ln.make_inputs(n_rows, n_cols, torch.bfloat16, requires_grad=False)
    dy = _bf16_grad(n_rows, n_cols, x.device, 1)
    leaves64 = [t.double().requires_grad_() for t in (x, w, b)]
    ref = list(torch.autograd.grad(ln.reference_fn(*leaves64, eps), leaves64, dy.double()))

    def run(cfg):
        return list(ln.layer_norm_bwd_launch(dy, x, w, b, eps, config=cfg))

    return _norm_bwd_sweep("layernorm_bwd", run, ln.RowConfig.backward(n_cols), ln.BWD_TUNING,
                           "kernel_library/layernorm.py BWD_TUNING", ref, ln.bytes_moved_backward(x, w, b), copy_gbps)


def add_layernorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096) -> dict:
    """add_layernorm backward (weight, bias and the residual's d(new residual) stream) at n_rows x n_cols
    (8192 x 4096) bf16, the configs of :func:`_norm_bwd_configs`; checked against autograd of
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

    return _norm_bwd_sweep("add_layernorm_bwd", run, ln.RowConfig.backward(n_cols), ln.ADD_BWD_TUNING,
                           "kernel_library/layernorm.py ADD_BWD_TUNING", ref,
                           ln.bytes_moved_backward(x, w, b, residual=res), copy_gbps)


def rope_sweep(copy_gbps: float) -> list[dict]:
    import kernel_library.rope as rp

    q, k, cos, sin = rp.make_inputs(4, 2048, 32, 128, dtype=torch.bfloat16)
    nbytes = rp.bytes_moved(q, k, cos, sin)
    args = [q.detach(), k.detach(), cos, sin]
    expected = rp.reference_fn(*args)
    compiled = torch.compile(rp.reference_fn, dynamic=False)
    compiled(*args)
    base = device_time_ms(lambda: compiled(*args))
    print(f"rope compile: fwd {base:.4f} ms", flush=True)
    out = [{"kernel": "rope", "config": "torch.compile", "gpu_ms": base}]
    original = rp.RopeConfig.__dict__["from_shape"]
    try:
        for block_h in (4, 8, 16, 32):
            for warps in (1, 2, 4, 8):
                def pick(cls, n_heads, head_dim, block_h=block_h, warps=warps):
                    return cls(block_h, triton.next_power_of_2(head_dim // 2), warps)

                rp.RopeConfig.from_shape = classmethod(pick)
                label = f"BLOCK_H={block_h} warps={warps}"
                try:
                    ok = compare_outputs(rp.kernel_fn(*args), expected)[0]
                    ms = device_time_ms(lambda: rp.kernel_fn(*args))
                except Exception as e:  # noqa: BLE001
                    print(f"  rope {label}: FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
                    out.append({"kernel": "rope", "config": label, "error": str(e)[:300]})
                    continue
                pct = 100 * nbytes / ms / 1e6 / copy_gbps
                out.append({"kernel": "rope", "config": label, "verified": ok, "gpu_ms": ms, "pct_of_copy": pct,
                            "x_compile": base / ms})
                print(f"  rope {label}: {ms:.4f} ms ({pct:.0f}% of copy, x{base / ms:.2f}) ok={ok}", flush=True)
    finally:
        rp.RopeConfig.from_shape = original
    return out


def layernorm_fwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096) -> list[dict]:
    """LayerNorm forward (plain and with the residual add) at 8192 x 4096 bf16: num_warps of the one-row-per-program
    kernel, forced through ``RowConfig``; the default (``RowConfig.forward``) first."""
    import kernel_library.layernorm as ln
    from kernel_library.rmsnorm import RowConfig

    out = []
    for residual in (False, True):
        x, w, b, eps, *rest = ln.make_inputs(n_rows, n_cols, torch.bfloat16, residual=residual, requires_grad=False)
        r = rest[0] if rest else None
        expected = torch.nn.functional.layer_norm((x + r if r is not None else x).double(), (n_cols,), w.double(),
                                                  b.double(), eps)
        nbytes = ln.bytes_moved(*([x, w, b, eps] + ([r] if r is not None else [])))
        name = "add_layernorm_fwd" if residual else "layernorm_fwd"
        default = RowConfig.forward(n_cols)
        for warps in dict.fromkeys((default.num_warps, 2, 4, 8, 16)):
            cfg = dataclasses.replace(default, num_warps=warps)
            label = f"warps={warps}" + (" (default)" if warps == default.num_warps else "")

            def run(cfg=cfg):
                return ln.layer_norm_fwd_launch(x, w, b, eps, residual=r, config=cfg)[0]

            ok = compare_outputs(run(), expected.to(torch.bfloat16))[0]
            ms = device_time_ms(run)
            pct = 100 * nbytes / ms / 1e6 / copy_gbps
            out.append({"kernel": name, "config": label, "verified": ok, "gpu_ms": ms, "pct_of_copy": pct})
            print(f"  {name} {label}: {ms:.4f} ms ({pct:.0f}% of copy) ok={ok}", flush=True)
    return out


def main() -> None:
    global NORM_BWD_BUDGET_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma-separated sections (default: all)")
    ap.add_argument("--norm-budget-s", type=float, default=NORM_BWD_BUDGET_S,
                    help="wall-clock budget of each norm backward sweep, s")
    args = ap.parse_args()
    NORM_BWD_BUDGET_S = args.norm_budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    copy_gbps = copy_bandwidth_gbps()
    doc = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "copy_gbps": copy_gbps,
                    "method": "summed CUDA kernel time per call (torch.profiler, 10 calls); % of the copy bandwidth "
                              "measured in this run, from each module's bytes-moved formula"}}
    only = set(args.only.split(",")) if args.only else None
    for name, fn in (("cross_entropy_breakdown", ce_breakdown),
                     ("rope", lambda: rope_sweep(copy_gbps)),
                     ("layernorm_fwd", lambda: layernorm_fwd_sweep(copy_gbps)),
                     ("bias_gelu", lambda: bias_gelu_sweep(copy_gbps)),
                     ("rmsnorm_bwd", lambda: rmsnorm_bwd_sweep(copy_gbps)),
                     ("add_rmsnorm_bwd", lambda: add_rmsnorm_bwd_sweep(copy_gbps)),
                     ("layernorm_bwd", lambda: layernorm_bwd_sweep(copy_gbps)),
                     ("add_layernorm_bwd", lambda: add_layernorm_bwd_sweep(copy_gbps))):
        if only and name not in only:
            continue
        try:
            doc[name] = fn()
        except Exception as e:  # noqa: BLE001
            doc[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
        torch.cuda.empty_cache()
        (args.out / "sweep_tiles.json").write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
