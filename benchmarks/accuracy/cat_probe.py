"""Device time of torch.cat by input count and sizes (kernel sums, L2 warm), to choose calibrate's cat probe.

    python benchmarks/accuracy/cat_probe.py
"""
import json

import torch

from fusion_advisor.kernel_tools.bench import device_time_and_kernels

rows = []
for side in (7, 14, 28, 56):
    for n in (2, 8, 16, 32, 48):
        for first in (0, 29 * 32):
            parts = ([torch.rand(10, first, side, side, device="cuda")] if first else []) + \
                [torch.rand(10, 32, side, side, device="cuda") for _ in range(n)]
            ms, k = device_time_and_kernels(lambda parts=parts: torch.cat(parts, 1), iters=5)
            nbytes = 2 * sum(p.numel() for p in parts) * 4
            rows.append({"side": side, "n": len(parts), "first_channels": first, "us": round(ms * 1e3, 2),
                         "kernels": k, "bytes_us_at_4275": round(nbytes / 4275e3, 2)})
            print(rows[-1], flush=True)
print(json.dumps(rows))
