"""A/B on the GPU: cross-entropy forward + ``loss.backward()`` device time per kernel, for the count/reduce kernels'
block (targets or losses per loop step) and warps (:data:`kernel_library.cross_entropy.REDUCE_BLOCK` over
``REDUCE_WARPS``). Session 4 ran it with the session-3 default, 1024 over 4 warps (8 loop steps over 8192 tokens);
8192 over 16 warps, one step, was adopted.

    python benchmarks/kernels/ce_reduce_ab.py --out DIR [--n-tokens 8192 --vocab 32000]

Writes ``ce_reduce_ab.json`` (per config: ms per kernel, from torch.profiler, and the do_bench median) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kernel_library.cross_entropy as ce  # noqa: E402
from fusion_advisor.kernel_tools.bench import device_time_by_kernel  # noqa: E402

CONFIGS = [(1024, 4), (2048, 4), (4096, 8), (8192, 16), (8192, 32)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-tokens", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logits, target = ce.make_inputs(n_tokens=args.n_tokens, vocab=args.vocab, dtype="bfloat16")[:2]

    def fwd_bwd():
        loss = ce.kernel_fn(logits, target)
        return torch.autograd.grad(loss, [logits])

    rows = []
    for rounds in range(2):  # two rounds, interleaved: drift between configs shows as round-to-round spread
        for block, warps in CONFIGS:
            ce.REDUCE_BLOCK, ce.REDUCE_WARPS = block, warps
            loss = ce.kernel_fn(logits, target)
            ref = torch.nn.functional.cross_entropy(logits.detach().double(), target)
            assert abs(float(loss) - float(ref)) <= 1e-2 * abs(float(ref)), (block, warps, float(loss), float(ref))
            by_kernel = device_time_by_kernel(fwd_bwd, iters=20)
            ms = do_bench(fwd_bwd, warmup=25, rep=100, return_mode="median")
            row = {"round": rounds, "block": block, "warps": warps, "gpu_ms": sum(by_kernel.values()),
                   "by_kernel_ms": by_kernel, "do_bench_ms": ms}
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n_tokens": args.n_tokens,
            "vocab": args.vocab, "dtype": "bfloat16"}
    (args.out / "ce_reduce_ab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
