"""Host (CPU) cost per call of a library kernel's launch path, layer by layer, on a GPU.

At a small shape the GPU work per call (a few us) is shorter than the host's, so N back-to-back calls timed with
``time.perf_counter`` (one synchronize before and after the loop) measure host time per call. Layers, for
``rmsnorm`` (forward: 17 kernel arguments):

    raw_jit        _rms_norm_fwd_kernel[grid](...)                 Triton's JIT launch alone
    wrap_triton    torch.library.wrap_triton(kernel)[grid](...)    plus the HOP wrapper (eager: a pass-through)
    launch_fn      rms_norm_fwd_launch(...)                        plus allocation and launch config
    op_no_grad     torch.ops.fusion_advisor.rms_norm, no_grad      plus the custom-op dispatcher
    bwd_op_no_grad torch.ops.fusion_advisor.rms_norm_backward, no_grad   the backward op alone, no autograd engine
    public_grad    rms_norm(x, w) with requires_grad inputs         plus the autograd node (register_autograd)
    fwd_bwd        public_grad + torch.autograd.grad
    eager_ref      transformers' LlamaRMSNorm forward, eager          (7 aten ops), with requires_grad
    eager_fwd_bwd  eager_ref + torch.autograd.grad
    compiled_ref   torch.compile(reference_fn), with requires_grad
    compiled_fwd_bwd compiled_ref + torch.autograd.grad
    torch_add      x + 1: one aten op, the floor

and cProfiles of ``public_grad`` and ``fwd_bwd`` (top functions by own time). Writes launch_overhead.json to --out.

    python benchmarks/host/launch_overhead.py --out DIR
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

from benchmarks.host.host_overhead import per_call_us, profile_top  # noqa: E402

N_CALLS = 2000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--cols", type=int, default=4096)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import kernel_library.rmsnorm as rn

    x = torch.randn(args.rows, args.cols, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(args.cols, device="cuda", dtype=torch.bfloat16)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = torch.empty_like(x)
    cfg = rn.RowConfig.forward(args.cols)
    kernel_args = (y, y, x, x, w, y.stride(0), y.stride(1), y.stride(0), y.stride(1), x.stride(0), x.stride(1),
                   x.stride(0), x.stride(1), w.stride(0), args.cols, 1e-6, 0.0)
    meta = dict(HAS_RESIDUAL=False, GEMMA=False, BLOCK_SIZE=cfg.block_size, num_warps=cfg.num_warps)
    grid = (args.rows,)
    compiled = torch.compile(rn.reference_fn, dynamic=False)

    def fwd_bwd(fn):
        def run():
            out = fn(xg, wg, 1e-6)
            return torch.autograd.grad(out, (xg, wg), torch.ones_like(out))
        return run

    layers = {
        "raw_jit": lambda: rn._rms_norm_fwd_kernel[grid](*kernel_args, **meta),
        "wrap_triton": lambda: torch.library.wrap_triton(rn._rms_norm_fwd_kernel)[grid](*kernel_args, **meta),
        "launch_fn": lambda: rn.rms_norm_fwd_launch(x, w, 1e-6, 0.0),
        "op_no_grad": lambda: torch.ops.fusion_advisor.rms_norm(x, w, 1e-6, 0.0),
        "bwd_op_no_grad": lambda: torch.ops.fusion_advisor.rms_norm_backward(x, x, w, 1e-6, 0.0),
        "public_grad": lambda: rn.rms_norm(xg, wg, 1e-6),
        "fwd_bwd": fwd_bwd(rn.rms_norm),
        "eager_ref": lambda: rn._hf_llama_rmsnorm(xg, wg, 1e-6),
        "eager_fwd_bwd": fwd_bwd(rn._hf_llama_rmsnorm),
        "compiled_ref": lambda: compiled(xg, wg, 1e-6),
        "compiled_fwd_bwd": fwd_bwd(compiled),
        "torch_add": lambda: x + 1,
    }
    results = {}
    for name, fn in layers.items():
        if name in ("op_no_grad", "bwd_op_no_grad"):
            with torch.no_grad():
                results[name] = per_call_us(fn, N_CALLS, 5)
        else:
            results[name] = per_call_us(fn, N_CALLS, 5)
        print(f"{name:18s} {results[name]:8.1f} us/call", flush=True)

    profiles = {}
    for name in ("public_grad", "fwd_bwd"):
        profiles[name] = profile_top(layers[name], N_CALLS, n=30)
        print(profiles[name][:6000], flush=True)

    meta_doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                "python": sys.version.split()[0],
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "shape": [args.rows, args.cols], "dtype": "bfloat16", "calls_per_round": N_CALLS,
                "method": "host us per call: perf_counter over N back-to-back calls, median of 5 rounds, "
                          "synchronised before and after each round (GPU work per call is shorter than the host's)"}
    (args.out / "launch_overhead.json").write_text(json.dumps(
        {"meta": meta_doc, "host_us_per_call": results, "cprofile": profiles}, indent=1))


if __name__ == "__main__":
    main()
