"""The fused linear cross-entropy's chunk size and dW accumulation dtype, measured: time, peak memory and error.

``kernel_library.linear_cross_entropy`` computes the logits ``CHUNK_BYTES`` at a time and sums the chunks' ``dW``
products in the weight's dtype (up to ``MAX_LOW_PRECISION_CHUNKS`` chunks) or in fp32. This sweeps both, on one
GPU in one process, for the LM heads of issue 16 (bf16, 4096 tokens x hidden 4096, vocabularies 128256 and 32000,
5% of targets ignored, mean): for each chunk size and accumulator, the forward+backward (``torch.autograd.grad``
of the loss to x and W) is

- timed: ``triton.testing.do_bench`` median (L2 cleared before each repetition), beside ``torch.compile`` of the
  pattern it replaces (``F.cross_entropy(F.linear(x, W).float(), t)``, Inductor) in the same run;
- measured for peak memory: ``max_memory_allocated`` during one call minus what was allocated before it;
- judged: norm-wise relative error of the loss, dx and dW against a float64 run of ``reference_fn``, beside the
  error of the same pattern run eagerly in bf16, and the project's policy verdict
  (``fusion_advisor.tolerances.judge``).

    python benchmarks/kernels/lce_chunks.py --out DIR [--quick]

``--quick``: tiny shapes (64 x 64 x 1000; the chunk sizes scaled down with them), and without CUDA fp32 on the CPU
(kernels under ``TRITON_INTERPRET=1``), ``perf_counter`` timing and no peak memory: a smoke test.

Writes ``lce_chunks.json`` and ``lce_chunks.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.kernels.lce_liger import peak_extra_bytes  # noqa: E402
from fusion_advisor.tolerances import judge  # noqa: E402
from kernel_library import linear_cross_entropy as lce  # noqa: E402

SHAPES = [(4096, 4096, 128256), (4096, 4096, 32000)]
CHUNK_MIB = (32, 64, 128, 256, 512, 1024)
ACCUMULATORS = ("weight", "fp32")


def empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def norm_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def fwd_bwd(fn, x, w, t):
    loss = fn(x, w, t)
    dx, dw = torch.autograd.grad(loss, [x, w])
    return loss, dx, dw


def peak_extra_mib(call) -> float | None:
    """MiB allocated during one ``call`` beyond what was allocated before it (``lce_liger.peak_extra_bytes``)."""
    peak = peak_extra_bytes(call)
    return None if peak is None else peak / 2**20


def do_bench(fn) -> float:
    from triton.testing import do_bench as bench

    return bench(fn, warmup=25, rep=100, return_mode="median")


def cpu_bench(fn) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def sweep_shape(n: int, h: int, v: int, dtype: str, chunk_unit: int, bench) -> list[dict]:
    """The rows of one LM-head shape: torch.compile, then every chunk size x accumulator."""
    x, w, t, *_ = lce.make_inputs(n_tokens=n, hidden=h, vocab=v, dtype=dtype)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = [r.detach() for r in fwd_bwd(lce.reference_fn, x64, w64, t)]
    del x64, w64
    eager = [e.detach() for e in fwd_bwd(lce.reference_fn, x, w, t)]
    empty_cache()
    compiled = torch.compile(lce.ENTRY.pattern, dynamic=False,
                             backend="inductor" if torch.cuda.is_available() else "aot_eager")
    fwd_bwd(compiled, x, w, t)
    base = {"shape": f"{n} x {h} x {v}", "eager_err": [norm_error(e, r) for e, r in zip(eager, ref)]}
    compile_ms = bench(lambda: fwd_bwd(compiled, x, w, t))
    rows = [{**base, "variant": "torch.compile", "ms": compile_ms,
             "peak_mib": peak_extra_mib(lambda: fwd_bwd(compiled, x, w, t))}]
    print(json.dumps(rows[-1]), flush=True)

    def ours(a, b, c):
        return lce.linear_cross_entropy(a, b, c, loss_dtype=torch.float32)

    def call():
        return fwd_bwd(ours, x, w, t)

    for mib in CHUNK_MIB:
        for acc in ACCUMULATORS:
            lce.CHUNK_BYTES = mib * chunk_unit
            lce.MAX_LOW_PRECISION_CHUNKS = 10**9 if acc == "weight" else 0
            step = lce.chunk_rows(n, v, x.element_size())
            row = {**base, "variant": f"chunk {mib} MiB, dW in {acc}", "chunk_mib": mib, "accumulator": acc,
                   "chunk_rows": step, "chunks": -(-n // step)}
            try:
                got = [g.detach() for g in call()]
                row["err"] = [norm_error(g, r) for g, r in zip(got, ref)]
                verdicts = [judge(g, r, e, name) for g, r, e, name in zip(got, ref, eager, ("loss", "dx", "dW"))]
                row["ok"] = all(j.ok for j in verdicts)
                row["reasons"] = [j.reason for j in verdicts if not j.ok]
                del got
                row["ms"] = bench(call)
                row["peak_mib"] = peak_extra_mib(call)
                row["x_compile"] = compile_ms / row["ms"]
            except Exception as e:  # noqa: BLE001 - one variant failing (out of memory) must not stop the sweep
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    shapes, chunk_unit, dtype = (SHAPES, 1 << 20, "bfloat16") if not args.quick else \
        ([(64, 64, 1000)], 1 << 10, "bfloat16" if cuda else "float32")
    bench = do_bench if cuda else cpu_bench

    args.out.mkdir(parents=True, exist_ok=True)
    defaults = (lce.CHUNK_BYTES, lce.MAX_LOW_PRECISION_CHUNKS)
    rows: list[dict] = []
    for n, h, v in shapes:
        try:
            rows += sweep_shape(n, h, v, dtype, chunk_unit, bench)
        finally:
            lce.CHUNK_BYTES, lce.MAX_LOW_PRECISION_CHUNKS = defaults
            torch._dynamo.reset()
            empty_cache()
    meta = {"gpu": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dtype": dtype, "quick": args.quick,
            "defaults": {"CHUNK_BYTES": defaults[0], "MAX_LOW_PRECISION_CHUNKS": defaults[1]}}
    (args.out / "lce_chunks.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"Fused linear cross-entropy fwd+bwd by chunk size and dW accumulator ({meta['gpu']}, torch "
             f"{meta['torch']}, triton {meta['triton']}, {meta['date']}; {meta['dtype']}; do_bench median, L2 "
             "cleared).", "",
             "| shape | variant | chunks | ms | x compile | peak MiB | err loss | err dx | err dW | eager err dW "
             "| ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = r.get("err") or [None] * 3
        lines.append(f"| {r['shape']} | {r['variant']} | {r.get('chunks', '-')} | {r.get('ms', float('nan')):.3f} | "
                     f"{r.get('x_compile', float('nan')):.3f} | {r.get('peak_mib') or float('nan'):.0f} | "
                     + " | ".join("-" if e is None else f"{e:.2e}" for e in err)
                     + f" | {r['eager_err'][2]:.2e} | {r.get('ok', '-')} {r.get('error', '')} |")
    (args.out / "lce_chunks.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
