"""The rate at which eager pooling kernels read their windows, measured for ``calibrate``: the spec's
``pool_window_gelem_s`` (:func:`fusion_advisor.analyze.roofline.pool_window_us`)."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

from fusion_advisor.kernel_tools.bench import Timing

#: The pooling layers :func:`measure_pool_window_rate` times, fp32 NCHW: (op, input shape, kernel, stride, padding).
#: Max and average, 1-3d, overlapping (stride 1) and not (stride = kernel), as KernelBench and CNNs use them.
POOL_PROBES = (
    ("max_pool2d", (16, 64, 256, 256), 3, 1, 1),
    ("max_pool2d", (16, 64, 256, 256), 3, 2, 1),
    ("max_pool2d", (16, 64, 256, 256), 2, 2, 0),
    ("avg_pool2d", (16, 64, 256, 256), 3, 1, 1),
    ("avg_pool2d", (16, 64, 256, 256), 2, 2, 0),
    ("avg_pool1d", (16, 64, 65536), 8, 1, 4),
    ("max_pool3d", (4, 16, 64, 64, 64), 3, 1, 1),
    ("avg_pool3d", (4, 16, 64, 64, 64), 2, 2, 0),
)
#: The CPU's probes shrink every input's batch to 1 (and --quick on a GPU too).
POOL_QUICK_BATCH = 1


def measure_pool_window_rate(device: str, copy_gbps: float, quick: bool,
                             timer: Callable[[Callable[[], Any]], Timing]) -> tuple[float | None, list[dict]]:
    """Rate at which eager pooling kernels read their windows (G input elements per second) and the probes'
    rows: for each of :data:`POOL_PROBES`, its time less its bytes at ``copy_gbps`` (input read, output written,
    plus the int64 indices a max pool writes) is spent on ``outputs x kernel elements`` reads; the median over the
    probes. The model it feeds: :func:`fusion_advisor.analyze.roofline.pool_window_us`. None when no probe left a
    positive remainder."""
    import torch.nn.functional as F

    rows, rates = [], []
    for name, shape, k, stride, pad in POOL_PROBES:
        if device != "cuda" or quick:
            shape = (POOL_QUICK_BATCH,) + tuple(shape[1:])
        x = torch.rand(shape, device=device, dtype=torch.float32)
        fn = getattr(F, name)
        dims = len(shape) - 2
        with torch.no_grad():
            out = fn(x, k, stride, pad)
            t_us = timer(lambda fn=fn, x=x, k=k, s=stride, p=pad: fn(x, k, s, p)).median_ms * 1e3
        per_out = 4 + (8 if name.startswith("max") else 0)  # a max pool on a GPU writes its indices too
        bytes_us = (x.numel() * 4 + out.numel() * per_out) / (copy_gbps * 1e9) * 1e6
        reads = out.numel() * k ** dims
        row = {"op": name, "shape": list(shape), "kernel": k, "stride": stride, "padding": pad,
               "time_us": round(t_us, 2), "bytes_us": round(bytes_us, 2), "window_reads": reads}
        if t_us > bytes_us:
            row["gelem_s"] = round(reads / ((t_us - bytes_us) * 1e3), 1)
            rates.append(row["gelem_s"])
        rows.append(row)
        del x, out
    return (statistics.median(rates) if rates else None), rows
