"""GPU benchmark of every kernel_library kernel against eager PyTorch and torch.compile, in one run.

For each registered kernel and each shape in its module's ``BENCH_SHAPES``:

1. verify first: the kernel's output (and gradients, for ops with a backward) against ``reference_fn`` on the
   same inputs, with the dtype tolerance of ``fusion_advisor.tolerances``; a shape that fails is not timed;
2. time forward, and forward+backward where the op has one, for three providers: ``triton`` (``kernel_fn``),
   ``eager`` (``reference_fn``) and ``compile`` (``torch.compile(reference_fn)``), each with
   ``triton.testing.do_bench`` (median; it clears L2 by writing a 256 MB buffer before every repetition, so
   inputs are never served from L2); compile time (first call, synchronised) is reported apart;
3. GB/s from the module's bytes-moved formula (``bytes_moved``; plus ``bytes_moved_backward`` for fwd+bwd, or
   ``bytes_moved_fwd_bwd`` where the module defines it), and % of the copy bandwidth measured in the same run.

Writes ``kernels.json`` (one row per kernel, shape, mode, provider) and ``kernels.md`` to ``--out``.

    python benchmarks/kernels/compare.py --out DIR [--kernels rmsnorm,softmax] [--max-shapes N]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import copy_bandwidth_gbps, float_outputs, shape_label, tensor_leaves  # noqa: E402
from fusion_advisor.kernel_tools.bench import device_time_by_kernel  # noqa: E402
from fusion_advisor.verification.kernel import ReferenceFailed, check_case  # noqa: E402
from kernel_library.registry import entry_shapes, load_all  # noqa: E402


def _fwd_bwd(fn, args, grads, leaves):
    """Forward then backward to the input leaves (autograd.grad: nothing accumulates into .grad between reps)."""
    def run():
        out = fn(*args)
        outs = float_outputs(out)
        return torch.autograd.grad(outs, leaves, grads[: len(outs)], allow_unused=True)

    return run


def bench_kernel(name: str, entry, copy_gbps: float, max_shapes: int, rows: list, log) -> None:
    mod = importlib.import_module(entry.module)
    shapes = entry_shapes(name, mod)[:max_shapes]
    for shape in shapes:
        label = shape_label(shape)
        try:
            args = mod.make_inputs(**shape)
        except Exception as e:  # noqa: BLE001
            log(f"{name} {label}: make_inputs failed: {e}")
            continue
        leaves = [t for t in tensor_leaves(args) if t.is_floating_point() and t.requires_grad]
        # 1. verify on this very shape with the verification engine (float64 reference, the error policy of
        #    fusion_advisor/verification/policy.py, poisoned allocations; gradients where the kernel has a backward)
        grad_args = None if entry.has_backward else [False] * len(args)
        try:
            outcome = check_case(label, mod.kernel_fn, mod.reference_fn, args, grad_args=grad_args,
                                 path=Path(mod.__file__))
        except ReferenceFailed as e:
            log(f"{name} {label}: the reference does not run: {e}")
            continue
        verified, details = outcome.ok, ([outcome.failure] if outcome.failure else []) + outcome.details
        log(f"{name} {label}: verified={verified} max_abs={outcome.max_abs_diff:.3g}")
        if not verified:
            rows.append({"kernel": name, "shape": label, "verified": False, "details": details[:5]})
            continue
        modes = [("fwd", None)]
        if entry.has_backward and leaves:
            outs = float_outputs(mod.reference_fn(*args))
            # a scalar output is a loss: loss.backward() passes 1, as training does
            modes.append(("fwd+bwd", [torch.ones_like(o) if o.dim() == 0 else torch.randn_like(o) for o in outs]))
        for mode, grads in modes:
            if mode == "fwd":
                nbytes = mod.bytes_moved(*args)
            elif hasattr(mod, "bytes_moved_fwd_bwd"):
                nbytes = mod.bytes_moved_fwd_bwd(*args)
            else:
                nbytes = mod.bytes_moved(*args) + mod.bytes_moved_backward(*args)
            times = {}
            for provider in ("triton", "eager", "compile"):
                fn = {"triton": mod.kernel_fn, "eager": mod.reference_fn}.get(provider)
                compile_s = None
                try:
                    if provider == "compile":
                        torch._dynamo.reset()
                        fn = torch.compile(mod.reference_fn, dynamic=False)
                    call = _fwd_bwd(fn, args, grads, leaves) if mode == "fwd+bwd" else fn
                    t0 = time.perf_counter()
                    if mode == "fwd":
                        with torch.no_grad():
                            call(*args)
                    else:
                        call()
                    torch.cuda.synchronize()
                    first_call_s = time.perf_counter() - t0
                    if provider in ("compile", "triton"):
                        compile_s = first_call_s
                    if mode == "fwd":
                        def timed(call=call):
                            with torch.no_grad():
                                return call(*args)
                    else:
                        timed = call
                    ms = do_bench(timed, warmup=25, rep=100, return_mode="median")
                    # GPU time without host overhead: kernel time per call from the profiler, per kernel
                    by_kernel = device_time_by_kernel(timed)
                    gpu_ms = sum(by_kernel.values())
                except Exception as e:  # noqa: BLE001 - one provider failing must not stop the run
                    log(f"{name} {label} {mode} {provider}: FAILED {type(e).__name__}: {str(e)[:200]}")
                    rows.append({"kernel": name, "shape": label, "mode": mode, "provider": provider,
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    continue
                times[provider] = ms
                gbps = nbytes / (ms * 1e-3) / 1e9
                rows.append({
                    "kernel": name, "shape": label, "mode": mode, "provider": provider, "verified": True,
                    "median_ms": ms, "bytes_moved": nbytes, "gbps": gbps, "pct_of_copy": 100 * gbps / copy_gbps,
                    "gpu_kernel_ms": gpu_ms,
                    "gpu_gbps": nbytes / (gpu_ms * 1e-3) / 1e9 if gpu_ms else None,
                    "first_call_s": compile_s,
                    "gpu_kernel_ms_by_kernel": by_kernel,
                })
                if provider == "triton":
                    log("    triton kernels (ms per call): " + ", ".join(f"{k} {v:.4f}" for k, v in by_kernel.items()))
            for r in rows:
                if r.get("kernel") == name and r.get("shape") == label and r.get("mode") == mode and "median_ms" in r:
                    r["speedup_vs_eager"] = times.get("eager", float("nan")) / r["median_ms"]
                    r["speedup_vs_compile"] = times.get("compile", float("nan")) / r["median_ms"]
            gtimes = {r["provider"]: r.get("gpu_kernel_ms") for r in rows
                      if r.get("kernel") == name and r.get("shape") == label and r.get("mode") == mode and "median_ms" in r}
            for r in rows:
                if r.get("kernel") == name and r.get("shape") == label and r.get("mode") == mode and r.get("gpu_kernel_ms"):
                    if gtimes.get("eager"):
                        r["gpu_speedup_vs_eager"] = gtimes["eager"] / r["gpu_kernel_ms"]
                    if gtimes.get("compile"):
                        r["gpu_speedup_vs_compile"] = gtimes["compile"] / r["gpu_kernel_ms"]
            t, e, c = times.get("triton"), times.get("eager"), times.get("compile")
            gt, gc = gtimes.get("triton"), gtimes.get("compile")
            if gt:
                log(f"  {mode:8} gpu-kernel time: triton {gt:.4f} ms ({nbytes / gt / 1e6:.0f} GB/s, {100 * nbytes / gt / 1e6 / copy_gbps:.0f}%)"
                    f"  eager {gtimes.get('eager') or float('nan'):.4f}  compile {gc or float('nan'):.4f}"
                    f"  -> x{(gc or float('nan')) / gt:.2f} vs compile")
            if t:
                log(f"  {mode:8} triton {t:.4f} ms ({nbytes / t / 1e6:.0f} GB/s, {100 * nbytes / t / 1e6 / copy_gbps:.0f}% of copy)"
                    f"  eager {e or float('nan'):.4f}  compile {c or float('nan'):.4f}"
                    f"  -> x{(e or float('nan')) / t:.2f} vs eager, x{(c or float('nan')) / t:.2f} vs compile")
        del args
        torch.cuda.empty_cache()


def markdown(rows: list, copy_gbps: float) -> str:
    lines = [f"Copy bandwidth measured in this run: {copy_gbps:.0f} GB/s (read + write).", "",
             "Wall: do_bench median (host overhead included, L2 cleared before each rep). "
             "GPU: summed CUDA kernel time per call from torch.profiler (no host overhead or idle gaps; L2 warm).", "",
             "| kernel | shape | mode | triton ms | GB/s | % copy | eager ms | compile ms | x eager | x compile "
             "| GPU triton ms | GPU GB/s | GPU % copy | GPU x eager | GPU x compile | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    index = {}
    for r in rows:
        if "median_ms" in r:
            index.setdefault((r["kernel"], r["shape"], r["mode"]), {})[r["provider"]] = r
    for (k, s, m), p in index.items():
        t = p.get("triton")
        if not t:
            continue
        e, c = p.get("eager", {}), p.get("compile", {})
        lines.append(
            f"| {k} | {s} | {m} | {t['median_ms']:.4f} | {t['gbps']:.0f} | {t['pct_of_copy']:.0f} | "
            f"{e.get('median_ms', float('nan')):.4f} | {c.get('median_ms', float('nan')):.4f} | "
            f"{t.get('speedup_vs_eager', float('nan')):.2f} | {t.get('speedup_vs_compile', float('nan')):.2f} | "
            f"{t.get('gpu_kernel_ms') or float('nan'):.4f} | {t.get('gpu_gbps') or float('nan'):.0f} | "
            f"{100 * (t.get('gpu_gbps') or float('nan')) / copy_gbps:.0f} | "
            f"{t.get('gpu_speedup_vs_eager', float('nan')):.2f} | {t.get('gpu_speedup_vs_compile', float('nan')):.2f} | "
            f"{c.get('first_call_s') or float('nan'):.2f} |"
        )
    failed = [r for r in rows if r.get("verified") is False or "error" in r]
    if failed:
        lines += ["", "Not timed or failed:", ""] + [
            f"- {r.get('kernel')} {r.get('shape', '')} {r.get('mode', '')} {r.get('provider', '')}: "
            f"{r.get('error') or r.get('details')}" for r in failed]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kernels", default="", help="comma-separated kernel names (default: all)")
    ap.add_argument("--max-shapes", type=int, default=100)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = open(args.out / "kernels.log", "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    copy_gbps = copy_bandwidth_gbps()
    log(f"copy bandwidth {copy_gbps:.0f} GB/s on {torch.cuda.get_device_name()}")
    meta = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "copy_bandwidth_gbps": copy_gbps,
        "method": "triton.testing.do_bench median (warmup 25 ms, rep 100 ms, L2 cleared before each rep); "
                  "GB/s = bytes_moved formula of each module / median time; compile time = first call, synchronised",
    }
    rows: list = []
    wanted = {k for k in args.kernels.split(",") if k}
    for name, entry in sorted(load_all().items()):
        if wanted and name not in wanted:
            continue
        try:
            bench_kernel(name, entry, copy_gbps, args.max_shapes, rows, log)
        except Exception as e:  # noqa: BLE001
            log(f"{name}: FAILED {type(e).__name__}: {e}\n{traceback.format_exc()}")
            rows.append({"kernel": name, "error": f"{type(e).__name__}: {e}"})
        (args.out / "kernels.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        (args.out / "kernels.md").write_text(markdown(rows, copy_gbps))
    print(markdown(rows, copy_gbps))


if __name__ == "__main__":
    main()
