"""Are grouped transposed convolutions a rate class of their own? (issue 13)

calibrate's tables sample transposed convolutions without groups and no convolution with dilation
(:func:`fusion_advisor.devices.rate_sampling.sample_plan`); the table prices a grouped transposed one as an ungrouped
one of its channels per group. On the H200 KernelBench's level1_75 (a 2-D transposed convolution, groups 4, dilation
(2, 1)) ran 7.0 ms in 8 kernels against 1.14 ms priced. This times pairs that differ in one thing only -- groups 1 vs
G at equal channels per group, dilation 1 vs 2 -- with calibrate's GPU timer (summed kernel durations, L2 warm) and
counts their kernels, to tell whether groups, dilation or both leave cuDNN's fast path.

    python benchmarks/accuracy/grouped_transpose_probe.py --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fusion_advisor.devices.calibrate import kernel_timer
from fusion_advisor.devices.op_rates import ConvGeometry

#: (dims, batch, channels per group in, out, spatial, kernel, stride, padding): KernelBench-sized transposed layers.
CASES = [
    (2, 16, 8, 16, (128, 256), (3, 5), (2, 3), (1, 2)),
    (2, 16, 16, 16, (64, 64), (3, 3), (2, 2), (1, 1)),
    (2, 8, 32, 32, (32, 32), (4, 4), (2, 2), (1, 1)),
    (3, 8, 8, 8, (16, 32, 32), (3, 3, 3), (2, 2, 2), (1, 1, 1)),
    (3, 4, 16, 16, (16, 16, 16), (3, 5, 7), (2, 2, 2), (1, 2, 3)),
]
GROUPS = (1, 2, 4, 8)
DILATIONS = (1, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions
    rows, start = [], time.perf_counter()
    for dims, batch, cin_g, cout_g, spatial, kernel, stride, padding in CASES:
        for groups in GROUPS:
            for dilation in DILATIONS:
                x = torch.randn(batch, cin_g * groups, *spatial, device="cuda")
                w = torch.randn(cin_g * groups, cout_g, *kernel, device="cuda")
                fn = getattr(F, f"conv_transpose{dims}d")
                opts = dict(stride=stride, padding=padding, groups=groups, dilation=dilation)
                call = lambda x=x, w=w, fn=fn, opts=opts: fn(x, w, **opts)  # noqa: E731
                try:
                    y = call()
                    geom = ConvGeometry.from_shapes(tuple(x.shape), tuple(w.shape), tuple(y.shape))
                    t = kernel_timer(call)
                except RuntimeError as e:
                    rows.append({"dims": dims, "groups": groups, "dilation": dilation, "error": str(e)[:200]})
                    continue
                us = t.median_ms * 1e3
                rows.append({"dims": dims, "batch": batch, "c_in_per_group": cin_g, "c_out_per_group": cout_g,
                             "spatial": spatial, "kernel": kernel, "stride": stride, "padding": padding,
                             "groups": groups, "dilation": dilation, "detail": geom.detail if geom else "",
                             "gflop": geom.flops / 1e9 if geom else 0.0, "time_us": round(us, 2),
                             "tflops": round(geom.flops / (us * 1e6), 3) if geom else 0.0,
                             "kernels": t.kernels_per_call})
                print(rows[-1], flush=True)
                del x, w, y
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d"),
            "wall_s": round(time.perf_counter() - start, 1), "timer": "summed kernel durations (kernel_timer)"}
    args.out.write_text(json.dumps({**info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
