"""GPU sweep of the launch configuration of the row-wise softmax and cross-entropy kernels.

For each (kernel, shape) it forces each candidate config (single block with the whole row in registers, or the
looped/online path with a given chunk) and each num_warps, verifies the output against ``reference_fn``, and
measures the summed CUDA kernel time per call with torch.profiler (forward for softmax, forward + loss.backward()
for cross-entropy), next to torch.compile(reference_fn) measured the same way. Writes sweep_rows.json/.md to --out.

    python benchmarks/kernels/sweep_rows.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import copy_bandwidth_gbps  # noqa: E402
from fusion_advisor.kernel_tools.bench import device_time_ms  # noqa: E402
from fusion_advisor.kernel_tools.verify import compare_outputs  # noqa: E402

CONFIGS = [("single", 0, w) for w in (8, 16, 32)] + [("looped", b, w) for b in (1024, 2048, 4096, 8192) for w in (4, 8, 16)]


def _force(mod, cls_name: str, method: str, kind: str, block: int, warps: int) -> None:
    cls = getattr(mod, cls_name)

    def pick(c, n_cols, *rest):
        if kind == "single":
            return c(triton.next_power_of_2(n_cols), warps, True)
        return c(block, warps, False)

    setattr(cls, method, classmethod(pick))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import kernel_library.cross_entropy as ce
    import kernel_library.softmax as sm

    copy_gbps = copy_bandwidth_gbps()
    rows = []
    cases = [
        ("softmax", sm, "RowConfig", "for_row", dict(n_rows=8192, n_cols=32000), False),
        ("softmax", sm, "RowConfig", "for_row", dict(n_rows=2048, n_cols=128256), False),
        ("cross_entropy", ce, "CrossEntropyConfig", "for_vocab", dict(n_tokens=8192, vocab=32000, dtype="bfloat16"), True),
        ("cross_entropy", ce, "CrossEntropyConfig", "for_vocab", dict(n_tokens=8192, vocab=128256, dtype="bfloat16"), True),
    ]
    for name, mod, cls_name, method, shape, backward in cases:
        original = getattr(mod, cls_name).__dict__[method]
        try:
            if name == "softmax":
                x = torch.randn(shape["n_rows"], shape["n_cols"], device="cuda", dtype=torch.bfloat16)
                inputs = [x]
                nbytes = 2 * x.numel() * x.element_size()
            else:
                inputs = mod.make_inputs(**shape)
                nbytes = mod.bytes_moved_fwd_bwd(*inputs)
            expected = mod.reference_fn(*inputs)

            def run(fn):
                if not backward:
                    with torch.no_grad():
                        return fn(*inputs)
                loss = fn(*inputs)
                (g,) = torch.autograd.grad(loss, inputs[0])
                return g

            compiled = torch.compile(mod.reference_fn, dynamic=False)
            run(compiled)
            base_ms = device_time_ms(lambda: run(compiled))
            rows.append({"kernel": name, "shape": shape, "config": "torch.compile", "gpu_ms": base_ms,
                         "gbps": nbytes / base_ms / 1e6})
            print(f"{name} {shape}: torch.compile {base_ms:.4f} ms ({nbytes / base_ms / 1e6:.0f} GB/s)", flush=True)
            for kind, block, warps in CONFIGS:
                if kind == "single" and triton.next_power_of_2(list(shape.values())[1]) > 32768:
                    continue
                _force(mod, cls_name, method, kind, block, warps)
                label = f"{kind} block={block or 'row'} warps={warps}"
                try:
                    got = run(mod.kernel_fn) if not backward else mod.kernel_fn(*inputs)
                    ok = compare_outputs(got, expected)[0] if not backward else bool(torch.isfinite(got).all())
                    ms = device_time_ms(lambda: run(mod.kernel_fn))
                except Exception as e:  # noqa: BLE001
                    print(f"  {label}: FAILED {type(e).__name__}: {str(e)[:150]}", flush=True)
                    rows.append({"kernel": name, "shape": shape, "config": label, "error": str(e)[:300]})
                    continue
                gbps = nbytes / ms / 1e6
                rows.append({"kernel": name, "shape": shape, "config": label, "verified": ok, "gpu_ms": ms,
                             "gbps": gbps, "pct_of_copy": 100 * gbps / copy_gbps, "x_compile": base_ms / ms})
                print(f"  {label}: {ms:.4f} ms {gbps:.0f} GB/s ({100 * gbps / copy_gbps:.0f}%) x{base_ms / ms:.2f} vs compile ok={ok}", flush=True)
        finally:
            setattr(getattr(mod, cls_name), method, original)
            torch.cuda.empty_cache()
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "copy_gbps": copy_gbps,
            "method": "summed CUDA kernel time per call (torch.profiler, 10 calls); GB/s from bytes-moved formulas"}
    (args.out / "sweep_rows.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    best = {}
    for r in rows:
        if "gpu_ms" in r and r["config"] != "torch.compile" and r.get("verified"):
            key = (r["kernel"], json.dumps(r["shape"]))
            if key not in best or r["gpu_ms"] < best[key]["gpu_ms"]:
                best[key] = r
    for (k, shp), r in best.items():
        print(f"BEST {k} {shp}: {r['config']} {r['gpu_ms']:.4f} ms {r['pct_of_copy']:.0f}% of copy x{r['x_compile']:.2f} vs compile")


if __name__ == "__main__":
    main()
