"""The softmax backward's error from its saved, rounded output, on the CPU: ``dx = y * (dy - sum(y * dy))`` (the
session-32 kernel, and ``torch.softmax``'s own backward on bf16) against ``dx = y * (dy - sum(y * dy) / sum(y))``
(kernel_library/softmax.py's ``_weighted_mean``), each over the error of ``reference_fn`` (the softmax computed in
fp32, whose autograd keeps the fp32 output), all against float64.

The kernels' arithmetic is emulated in PyTorch: ``y`` is the fp32 softmax rounded to the input dtype, the gradient
is computed in fp32 and rounded once. ``--rounding nearest`` rounds as a GPU does; ``truncate`` as the Triton
interpreter casts fp32 to bf16 (the CPU tests' kernels give these figures exactly). Inputs are ``verify``'s:
``kernel_library.softmax.make_inputs`` (scores x 3) and a standard normal ``dy``, one seed per draw.

    python benchmarks/kernels/softmax_bwd_rounding.py --out DIR [--draws 100] [--widths 3 37 1000]

Writes ``softmax_bwd_rounding.json`` to ``--out``: per rounding, width and formula, the median, 90th percentile
and largest ratio of the error norm to ``reference_fn``'s.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_library import softmax as sm  # noqa: E402


def rounded(t: torch.Tensor, dtype: torch.dtype, rounding: str) -> torch.Tensor:
    """fp32 ``t`` rounded to ``dtype`` and back: to nearest even, or (bf16) by dropping the low 16 bits."""
    if rounding == "truncate":
        if dtype != torch.bfloat16:
            raise ValueError("truncation is emulated for bf16 only")
        return (t.float().contiguous().view(torch.int32) & -65536).view(torch.float32)
    return t.to(dtype).float()


def error_ratios(width: int, draws: int, dtype: torch.dtype, rounding: str) -> dict[str, list[float]]:
    """Per draw, ``||dx - dx64|| / ||dx64||`` of each formula over that of ``reference_fn``'s autograd."""
    out: dict[str, list[float]] = {"sum(y * dy)": [], "sum(y * dy) / sum(y)": []}
    for seed in range(draws):
        x, scale, mask, causal = sm.make_inputs(n_rows=5, n_cols=width, dtype=dtype, seed=seed, device="cpu")
        dy = torch.randn(5, width, generator=torch.Generator().manual_seed(1000 + seed)).to(dtype)
        x64 = x.detach().double().requires_grad_()
        torch.softmax(x64, -1).backward(dy.double())
        exact = x64.grad
        xr = x.detach().clone().requires_grad_()
        sm.reference_fn(xr, scale, mask, causal).backward(dy)
        ref_err = float((xr.grad.double() - exact).norm() / exact.norm())
        y, d = rounded(torch.softmax(x.detach().float(), -1), dtype, rounding), dy.float()
        for name, mean in (("sum(y * dy)", (y * d).sum(-1, keepdim=True)),
                           ("sum(y * dy) / sum(y)", (y * d).sum(-1, keepdim=True) / y.sum(-1, keepdim=True))):
            dx = rounded(y * (d - mean), dtype, rounding).double()
            out[name].append(float((dx - exact).norm() / exact.norm()) / ref_err)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--widths", type=int, nargs="+", default=[3, 37, 1000])
    args = ap.parse_args()
    rows = []
    for rounding in ("nearest", "truncate"):
        for width in args.widths:
            for formula, q in error_ratios(width, args.draws, torch.bfloat16, rounding).items():
                q = sorted(q)
                rows.append({"rounding": rounding, "width": width, "dtype": "bfloat16", "formula": formula,
                             "draws": len(q), "median": round(statistics.median(q), 3),
                             "p90": round(q[int(0.9 * len(q))], 3), "max": round(q[-1], 3)})
                print(f"{rounding:8s} width {width:5d} {formula:22s} error / reference_fn's: median "
                      f"{rows[-1]['median']:.2f}, p90 {rows[-1]['p90']:.2f}, max {rows[-1]['max']:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "softmax_bwd_rounding.json").write_text(json.dumps({
        "what": __doc__.splitlines()[0], "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
