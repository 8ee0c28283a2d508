"""fp32 GEMMs on tensor cores at fp32 accuracy: the library's gemm_epilogue (3xTF32) vs cuBLAS SGEMM vs TF32.

PyTorch runs fp32 ``F.linear`` as cuBLAS SGEMM on CUDA cores unless TF32 is allowed
(``torch.backends.cuda.matmul.allow_tf32``, off by default); KernelBench and many user models are fp32. The
library's ``gemm_epilogue`` multiplies fp32 operands as three TF32 products (``tl.dot(input_precision="tf32x3")``).
Per shape (x [M, K], w [N, K], bias [N]; fp32) this measures, in one process:

- steady-state time (``triton.testing.do_bench`` median, L2 flushed between calls) of ``F.linear`` as PyTorch runs
  it (SGEMM), ``F.linear`` with TF32 allowed, and ``gemm_epilogue`` with ``act`` none and relu; TFLOP/s from 2MNK;
- the first call of ``gemm_epilogue`` (Triton compile + autotune), apart;
- each result's error against a float64 ``F.linear``: relative Frobenius error, max |err| / max |ref|, and the
  largest ratio of |err| to the bound ``|x| @ |w|.T`` (what the unit tests' elementwise bound uses).

Usage (GPU): ``python benchmarks/kernels/fp32_gemm.py --out DIR``; writes ``DIR/fp32_gemm.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from kernel_library.gemm_epilogue import gemm_epilogue  # noqa: E402

#: (M, N, K): KernelBench level-2 GEMM widths (1024 x 8192 -> 8192, 128 x 32768 -> 32768, 16384 x 4096 -> 4096,
#: 32768 x 1024 -> 4096, 2048 x 8192 -> 8192), an MLP block of level 3 and a small one where launch cost shows.
SHAPES = [(1024, 8192, 8192), (128, 32768, 32768), (16384, 4096, 4096), (32768, 4096, 1024), (2048, 8192, 8192),
          (16384, 4096, 2048), (128, 1000, 4096), (10, 2048, 2048)]


def _errors(y: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> dict:
    err = (y.double() - ref).abs()
    return {"rel_fro": float(err.norm() / ref.norm()), "max_rel": float(err.max() / ref.abs().max()),
            "max_err_over_bound": float((err / bound.clamp_min(1e-300)).max()),
            "nan": bool(torch.isnan(y).any())}


def run_shape(M: int, N: int, K: int) -> dict:
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda")
    w = torch.randn(N, K, device="cuda") / K**0.5
    b = 0.1 * torch.randn(N, device="cuda")
    ref = F.linear(x.double(), w.double(), b.double())
    bound = x.double().abs() @ w.double().abs().t() + b.double().abs()
    flop = 2 * M * N * K
    row: dict = {"M": M, "N": N, "K": K}

    torch.backends.cuda.matmul.allow_tf32 = False
    row["sgemm"] = _errors(F.linear(x, w, b), ref, bound)
    row["sgemm"]["ms"] = do_bench(lambda: F.linear(x, w, b), return_mode="median")
    torch.backends.cuda.matmul.allow_tf32 = True
    row["tf32"] = _errors(F.linear(x, w, b), ref, bound)
    row["tf32"]["ms"] = do_bench(lambda: F.linear(x, w, b), return_mode="median")
    torch.backends.cuda.matmul.allow_tf32 = False

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    y = gemm_epilogue(x, w, b, "none")
    torch.cuda.synchronize()
    row["first_call_s"] = time.perf_counter() - t0
    row["ours"] = _errors(y, ref, bound)
    row["ours"]["ms"] = do_bench(lambda: gemm_epilogue(x, w, b, "none"), return_mode="median")
    row["ours_relu_ms"] = do_bench(lambda: gemm_epilogue(x, w, b, "relu"), return_mode="median")
    row["eager_relu_ms"] = do_bench(lambda: F.relu(F.linear(x, w, b)), return_mode="median")
    for k in ("sgemm", "tf32", "ours"):
        row[k]["tflops"] = flop / (row[k]["ms"] * 1e-3) / 1e12
    row["ours_vs_sgemm"] = row["sgemm"]["ms"] / row["ours"]["ms"]
    row["ours_relu_vs_eager_relu"] = row["eager_relu_ms"] / row["ours_relu_ms"]
    return row


def _markdown(result: dict) -> str:
    lines = [f"# fp32 GEMM: gemm_epilogue (3xTF32) vs cuBLAS SGEMM vs TF32\n",
             f"{result['gpu']}, torch {result['torch']}, triton {result['triton']}, {result['date']}. "
             "do_bench medians (L2 flushed), ms; errors against float64 F.linear.\n",
             "| M x N x K | SGEMM ms (TFLOP/s) | TF32 ms | ours ms (TFLOP/s) | ours vs SGEMM | relu: ours vs eager | "
             "rel. error SGEMM / TF32 / ours | first call s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['M']} x {r['N']} x {r['K']} | {r['error']} |")
            continue
        lines.append(
            f"| {r['M']} x {r['N']} x {r['K']} | {r['sgemm']['ms']:.3f} ({r['sgemm']['tflops']:.0f}) | "
            f"{r['tf32']['ms']:.3f} | {r['ours']['ms']:.3f} ({r['ours']['tflops']:.0f}) | {r['ours_vs_sgemm']:.2f}x | "
            f"{r['ours_relu_vs_eager_relu']:.2f}x | {r['sgemm']['rel_fro']:.1e} / {r['tf32']['rel_fro']:.1e} / "
            f"{r['ours']['rel_fro']:.1e} | {r['first_call_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("fp32_gemm: needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.date.today().isoformat(), "rows": []}
    for M, N, K in SHAPES:
        try:
            row = run_shape(M, N, K)
        except Exception as e:  # noqa: BLE001 - one shape's failure is a result, the others still run
            row = {"M": M, "N": N, "K": K, "error": f"{type(e).__name__}: {e}"[:300]}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    (args.out / "fp32_gemm.json").write_text(json.dumps(result, indent=1))
    (args.out / "fp32_gemm.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
