"""GPU sweeps of launch settings not covered by sweep_rows.py, plus a per-kernel breakdown of cross-entropy.

- ``cross_entropy`` forward + loss.backward() at 8192 x 32000 bf16: CUDA time per kernel (torch.profiler), to see
  where the time goes besides the main row kernel.
- ``bias_gelu`` forward and forward+backward at 8192 x 16384 bf16 (erf): tile width BLOCK_C x tile elements x
  num_warps, forced through ``BiasGeluConfig``.
- ``rmsnorm`` backward at 8192 x 4096 bf16: rows per loop step x backward programs per SM x num_warps (x the row
  loop's num_stages), forced through ``RowConfig``; checked against a float64 reference.
- ``rope`` forward at 4 x 2048 tokens, 32 heads of 128, bf16, HF layout: heads per tile (BLOCK_H) x num_warps.

Each config is verified against ``reference_fn`` (forward output; gradients finite and close to the default
config's) before its summed CUDA kernel time per call (torch.profiler, 10 calls) is taken; torch.compile of the
reference is measured the same way. Writes sweep_tiles.json to --out.

    python benchmarks/sweep_tiles.py --out DIR [--only rmsnorm_bwd]
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernels import copy_bandwidth_gbps, gpu_kernel_ms  # noqa: E402
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
    base_f = gpu_kernel_ms(lambda: compiled(x.detach(), bias.detach()))
    fb(compiled)()
    base_fb = gpu_kernel_ms(fb(compiled))
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
                        f_ms = gpu_kernel_ms(lambda: bg.kernel_fn(x.detach(), bias.detach()))
                        fb_ms = gpu_kernel_ms(fb(bg.kernel_fn))
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


#: rmsnorm backward sweep: (rows_per_iter, num_warps) pairs that also get num_stages variants. ptxas for sm_90
#: (triton 3.9, 8192 x 4096 bf16 specialisation) spills at 64 elements per thread per tensor (rows_per_iter=2 at
#: 4 warps: 120 bytes of stack, 4 at 8 warps) and 4 x 4096 at 16 warps already spills a little (32-64 bytes), so
#: the pipelined variants are tried only where rows_per_iter * 4096 / (32 * warps) <= 32.
RMS_BWD_STAGED = ((1, 8), (1, 16), (2, 8), (2, 16), (4, 16))
RMS_BWD_STAGES = (2, 3)
#: Wall-clock budget of the rmsnorm backward sweep, s: the configs left when it runs out are recorded as skipped.
RMS_BWD_BUDGET_S = 90.0


def rmsnorm_bwd_sweep(copy_gbps: float, n_rows: int = 8192, n_cols: int = 4096) -> list[dict]:
    """rmsnorm backward at n_rows x n_cols (8192 x 4096) bf16, forced through ``RowConfig``: rows_per_iter (1, 2, 4) x programs per
    SM (1, 2, 4) x num_warps (4, 8, 16) with the loop's default num_stages, plus num_stages (2, 3) for the pairs in
    ``RMS_BWD_STAGED`` (and 4 for one row per step).

    Verification (once per config, before timing): dx within the bf16 table (atol 2e-2, rtol 1.6e-2,
    fusion_advisor.tolerances) of a float64 reference (autograd of ``reference_fn`` on float64 copies, computed
    once); dweight finite and with a max error against that reference at most ``EAGER_ERROR_FACTOR`` (2x) the
    default config's own error (a different warp count or row grouping changes the fp32 summation order, so exact
    equality with the default config is not expected). Time: summed CUDA kernel time per call (torch.profiler,
    10 calls), including the dweight partial-sum reduction.
    """
    import dataclasses
    import time

    import kernel_library.rmsnorm as rn
    from fusion_advisor.tolerances import EAGER_ERROR_FACTOR, TOLERANCES

    x, w, eps, offset = rn.make_inputs(n_rows, n_cols, torch.bfloat16)
    dy = torch.randn(n_rows, n_cols, device=x.device, dtype=torch.bfloat16)
    nbytes = rn.bytes_moved_backward(x, w)
    xd, wd = x.detach(), w.detach()
    x64, w64 = xd.double().requires_grad_(), wd.double().requires_grad_()
    ref_dx, ref_dw = torch.autograd.grad(rn.reference_fn(x64, w64, eps, offset), (x64, w64), dy.double())
    atol, rtol = TOLERANCES[torch.bfloat16]

    def dw_err(dw: torch.Tensor) -> float:
        return float((dw.double() - ref_dw).abs().max())

    default = rn.RowConfig.backward(n_cols)
    _, default_dw = rn.rms_norm_bwd_launch(dy, xd, wd, eps, offset, config=default)
    default_dw_err = dw_err(default_dw)
    print(f"rmsnorm bwd default {default}: dweight max error vs float64 {default_dw_err:.4g}", flush=True)

    configs = [(r, p, wp, None) for r in (1, 2, 4) for wp in (4, 8, 16) for p in (1, 2, 4)]
    for r, wp in RMS_BWD_STAGED:
        for st in RMS_BWD_STAGES + ((4,) if r == 1 else ()):
            configs += [(r, p, wp, st) for p in (1, 2, 4)]
    out = []
    t0 = time.monotonic()
    for r, p, wp, st in configs:
        cfg = dataclasses.replace(default, num_warps=wp, rows_per_iter=r, programs_per_sm=p, num_stages=st)
        label = f"rows_per_iter={r} programs_per_sm={p} warps={wp} num_stages={st}"
        is_default = (r, p, wp, st) == (1, rn.BWD_PROGRAMS_PER_SM, default.num_warps, None)
        row = {"kernel": "rmsnorm_bwd", "config": label, "rows_per_iter": r, "programs_per_sm": p, "num_warps": wp,
               "num_stages": st, "is_default": is_default}
        if time.monotonic() - t0 > RMS_BWD_BUDGET_S:
            out.append({**row, "skipped": f"sweep budget of {RMS_BWD_BUDGET_S:.0f} s spent"})
            continue
        try:
            dx, dw = rn.rms_norm_bwd_launch(dy, xd, wd, eps, offset, config=cfg)
            dx_err = (dx.double() - ref_dx).abs()
            dx_ok = bool((dx_err <= atol + rtol * ref_dx.abs()).all())
            err = dw_err(dw)
            ok = dx_ok and bool(torch.isfinite(dw).all()) and err <= EAGER_ERROR_FACTOR * default_dw_err
            ms = gpu_kernel_ms(lambda: rn.rms_norm_bwd_launch(dy, xd, wd, eps, offset, config=cfg))
        except Exception as e:  # noqa: BLE001
            print(f"  rmsnorm bwd {label}: FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
            out.append({**row, "error": str(e)[:300]})
            continue
        pct = 100 * nbytes / ms / 1e6 / copy_gbps
        out.append({**row, "verified": ok, "dx_max_abs_err": float(dx_err.max()), "dw_max_abs_err": err,
                    "default_dw_max_abs_err": default_dw_err, "gpu_ms": ms, "pct_of_copy": pct})
        print(f"  rmsnorm bwd {label}: {ms:.4f} ms ({pct:.0f}% of copy) ok={ok} "
              f"(dx err {float(dx_err.max()):.3g}, dw err {err:.3g})", flush=True)
    print(f"rmsnorm bwd sweep: {time.monotonic() - t0:.0f} s", flush=True)
    return out


def rope_sweep(copy_gbps: float) -> list[dict]:
    import kernel_library.rope as rp

    q, k, cos, sin = rp.make_inputs(4, 2048, 32, 128, dtype=torch.bfloat16)
    nbytes = rp.bytes_moved(q, k, cos, sin)
    args = [q.detach(), k.detach(), cos, sin]
    expected = rp.reference_fn(*args)
    compiled = torch.compile(rp.reference_fn, dynamic=False)
    compiled(*args)
    base = gpu_kernel_ms(lambda: compiled(*args))
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
                    ms = gpu_kernel_ms(lambda: rp.kernel_fn(*args))
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma-separated sections (default: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy_gbps = copy_bandwidth_gbps()
    doc = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "copy_gbps": copy_gbps,
                    "method": "summed CUDA kernel time per call (torch.profiler, 10 calls); % of the copy bandwidth "
                              "measured in this run, from each module's bytes-moved formula"}}
    only = set(args.only.split(",")) if args.only else None
    for name, fn in (("cross_entropy_breakdown", ce_breakdown),
                     ("rope", lambda: rope_sweep(copy_gbps)),
                     ("bias_gelu", lambda: bias_gelu_sweep(copy_gbps)),
                     ("rmsnorm_bwd", lambda: rmsnorm_bwd_sweep(copy_gbps))):
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
