"""Kernels, device time and host time of PyTorch's native transformer fast paths on a CUDA GPU, by configuration
(cost-model issue: ``fusion_advisor/analyze/composites.py`` prices ``aten._transformer_encoder_layer_fwd`` as its
parts and a measured kernel count).

For each configuration of ``nn.TransformerEncoderLayer(batch_first=True)`` (and ``nn.MultiheadAttention``), in eval
under ``torch.no_grad()`` (the fast path): the aten op the call runs, its kernels per call and their summed durations
(torch.profiler, 3 calls after warm-up) with their names, and the host time per call (median of 5 loops of 50 calls,
not synchronised inside a loop: the host runs ahead while the GPU is not the bottleneck), and that host time in
eager adds (``torch.add`` on 4 x 4096 bf16, the spec's ``launch_overhead_us`` probe) timed in loops interleaved with
the module's.

    python benchmarks/accuracy/native_layer_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path

import torch

CONFIGS = [  # (batch, seq, embed, heads, ffn, norm_first, activation, dtype)
    (10, 2, 128, 4, 512, False, "relu", torch.float32),     # KernelBench's ConvolutionalVisionTransformer
    (2, 197, 512, 8, 2048, False, "relu", torch.float32),   # ViT-like
    (2, 197, 768, 12, 3072, False, "gelu", torch.float32),
    (2, 197, 768, 12, 3072, True, "gelu", torch.float32),
    (8, 128, 512, 8, 2048, False, "relu", torch.bfloat16),
    (32, 64, 256, 4, 1024, False, "relu", torch.float32),
]


def probe(module: torch.nn.Module, args: tuple) -> dict:
    with torch.no_grad():
        for _ in range(5):
            module(*args)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                module(*args)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        ops = collections.Counter(e.name for e in prof.events()
                                  if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::_"))
        names = collections.Counter(e.name[:60] for e in kernels)
        a = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
        loops, adds = [], []
        for _ in range(7):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(50):
                module(*args)
            loops.append((time.perf_counter() - t) / 50 * 1e6)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200):
                torch.add(a, a)
            adds.append((time.perf_counter() - t) / 200 * 1e6)
            torch.cuda.synchronize()
    host, add = statistics.median(loops), statistics.median(adds)
    return {"kernels_per_call": len(kernels) / 3, "kernel_us_per_call": sum(e.device_time for e in kernels) / 3,
            "host_us_per_call": host, "add_us": add, "host_adds_per_call": host / add, "aten_ops": dict(ops),
            "kernel_names": dict(names)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for b, s, e, h, f, norm_first, act, dtype in CONFIGS:
        layer = torch.nn.TransformerEncoderLayer(e, h, f, dropout=0.0, activation=act, batch_first=True,
                                                 norm_first=norm_first, device="cuda", dtype=dtype).eval()
        x = torch.randn(b, s, e, device="cuda", dtype=dtype)
        mha = torch.nn.MultiheadAttention(e, h, batch_first=True, device="cuda", dtype=dtype).eval()
        for kind, mod, call in (("encoder_layer", layer, (x,)), ("mha", mha, (x, x, x))):
            r = probe(mod, call)
            r.update(kind=kind, batch=b, seq=s, embed=e, heads=h, ffn=f, norm_first=norm_first, activation=act,
                     dtype=str(dtype).replace("torch.", ""))
            rows.append(r)
            print(f"{kind:14s} b{b} s{s} e{e} h{h} f{f} nf={norm_first} {act} {r['dtype']}: "
                  f"{r['kernels_per_call']:.1f} kernels, {r['kernel_us_per_call']:.1f} us busy, "
                  f"{r['host_us_per_call']:.1f} us host = {r['host_adds_per_call']:.1f} adds of {r['add_us']:.2f} us")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (args.out / "native_layer_probe.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
