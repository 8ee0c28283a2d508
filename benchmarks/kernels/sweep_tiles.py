"""GPU sweeps of launch settings not covered by sweep_rows.py, plus a per-kernel breakdown of cross-entropy.

- ``cross_entropy`` forward + loss.backward() at 8192 x 32000 bf16: CUDA time per kernel (torch.profiler), to see
  where the time goes besides the main row kernel.
- ``bias_gelu`` forward and forward+backward at 8192 x 16384 bf16 (erf): tile width BLOCK_C x tile elements x
  num_warps, forced through ``BiasGeluConfig``.
- ``rmsnorm_bwd``, ``add_rmsnorm_bwd``, ``layernorm_bwd``, ``add_layernorm_bwd`` at 8192 x 4096 bf16: the
  module's current default first, then rows per loop step x backward programs per SM x num_warps (x the row loop's
  num_stages), forced through ``RowConfig``; checked against a float64 reference. Prints the fastest verified
  config and the ``BwdTuning(...)`` line that adopts it (``rmsnorm.BWD_TUNING``, ``add_rmsnorm.BWD_TUNING``,
  ``layernorm.BWD_TUNING`` / ``ADD_BWD_TUNING``); the sweeps and their selection are
  ``fusion_advisor/norm_bwd_sweep.py`` (tested on the CPU).
- ``layernorm_fwd`` (plain and with the residual add) at 8192 x 4096 bf16: num_warps of the one-row kernel.
- ``rope`` forward at 4 x 2048 tokens, 32 heads of 128, bf16, HF layout: heads per tile (BLOCK_H) x num_warps.

Each config is verified against ``reference_fn`` (forward output; gradients finite and close to the default
config's) before its summed CUDA kernel time per call (torch.profiler, 10 calls) is taken; torch.compile of the
reference is measured the same way. Writes sweep_tiles.json to --out.

    python benchmarks/kernels/sweep_tiles.py --out DIR [--only add_rmsnorm_bwd,layernorm_bwd,add_layernorm_bwd]
        [--norm-budget-s 30]

(A cross-entropy variant sweep, persistent grids / chunk-loop pipelining / in-kernel count / looped scale, ran once on
the H200 (2026-11-29, key ``cross_entropy`` of benchmarks/results/h200/kernels/sweep_tiles_norm_bwd.json): none beat
the one-program-per-row kernel, so those variants were removed from the library and from this script.)
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import copy_bandwidth_gbps  # noqa: E402
from fusion_advisor.kernel_tools.bench import device_time_ms  # noqa: E402
from fusion_advisor.kernel_tools.norm_bwd_sweep import (  # noqa: E402
    NORM_BWD_BUDGET_S,
    add_layernorm_bwd_sweep,
    add_rmsnorm_bwd_sweep,
    layernorm_bwd_sweep,
    rmsnorm_bwd_sweep,
)
from fusion_advisor.kernel_tools.verify import compare_outputs  # noqa: E402


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
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma-separated sections (default: all)")
    ap.add_argument("--norm-budget-s", type=float, default=NORM_BWD_BUDGET_S,
                    help="wall-clock budget of each norm backward sweep, s")
    args = ap.parse_args()
    budget_s = args.norm_budget_s
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
                     ("rmsnorm_bwd", lambda: rmsnorm_bwd_sweep(copy_gbps, budget_s=budget_s)),
                     ("add_rmsnorm_bwd", lambda: add_rmsnorm_bwd_sweep(copy_gbps, budget_s=budget_s)),
                     ("layernorm_bwd", lambda: layernorm_bwd_sweep(copy_gbps, budget_s=budget_s)),
                     ("add_layernorm_bwd", lambda: add_layernorm_bwd_sweep(copy_gbps, budget_s=budget_s))):
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
