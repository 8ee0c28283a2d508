"""Host time of eager PyTorch beyond one launch per kernel, measured for ``calibrate``: per view op, per
``nn.Module`` call, and per call of the op classes whose calls cost the host more than an elementwise add (cuDNN and
cuBLAS set up each call). The spec's ``view_overhead_us``, ``module_call_us`` and ``launch_overhead_by_class``
(:func:`fusion_advisor.analyze.roofline.op_launch_us`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from fusion_advisor.kernel_tools.bench import sync_device


def per_op_us(device: str, body: Callable[[], Any], ops: int, repeats: int) -> float:
    """Median wall time per call of ``body`` (us) over ``repeats`` loops of ``ops`` calls after one warm-up loop,
    synchronised once per loop."""
    import statistics
    import time

    times = []
    for i in range(repeats + 1):
        sync_device(device)
        start = time.perf_counter()
        for _ in range(ops):
            body()
        sync_device(device)
        if i:
            times.append((time.perf_counter() - start) / ops * 1e6)
    return float(statistics.median(times))


class _AddOne(torch.nn.Module):
    """The module whose call :func:`measure_module_call_us` times: one ``x + 1``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.add(x, 1.0)


def measure_view_us(device: str, ops: int = 2000, numel: int = 1024, repeats: int = 5) -> float:
    """Host time of one eager view op (us): ``x.view(-1)`` of a tiny tensor, ``ops`` calls in a loop (a view
    launches no kernel; this is the dispatcher's cost of making the alias); ``ops`` calls on ``numel`` elements."""
    x = torch.ones(numel, device=device)
    return per_op_us(device, lambda: x.view(-1), ops, repeats)


def measure_module_call_us(device: str, ops: int = 2000, numel: int = 1024, repeats: int = 5) -> float:
    """Host time of entering one ``nn.Module`` call (us): a module whose forward is one ``x + 1``, called
    ``ops`` times in a loop, less the same loop of the bare ``torch.add`` (0 when not above it)."""
    x = torch.ones(numel, device=device)
    module = _AddOne().to(device)
    called = per_op_us(device, lambda: module(x), ops, repeats)
    bare = per_op_us(device, lambda: torch.add(x, 1.0), ops, repeats)
    return max(called - bare, 0.0)


def _host_probes(device: str) -> dict[str, Callable[[], Any]]:
    """One tiny call per op class whose host cost :func:`measure_launch_by_class` measures, through the aten
    overload the captured graphs call (their key: :func:`fusion_advisor.analyze.roofline.op_class_keys`)."""
    aten = torch.ops.aten
    f = dict(device=device, dtype=torch.float32)
    x4, x2 = torch.randn(2, 8, 8, 8, **f), torch.randn(16, 64, **f)
    w, b = torch.randn(8, 8, 3, 3, **f), torch.randn(8, **f)
    a, m = torch.randn(16, 16, **f), torch.randn(4, 16, 16, **f)
    c8, bias64 = torch.ones(8, **f), torch.zeros(64, **f)
    rm, rv = torch.zeros(8, **f), torch.ones(8, **f)
    return {
        "conv": lambda: aten.convolution.default(x4, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        "matmul/mm": lambda: aten.mm.default(a, a),
        "matmul/addmm": lambda: aten.addmm.default(a[0], a, a),
        "matmul/bmm": lambda: aten.bmm.default(m, m),
        "normalization/_native_batch_norm_legit_no_training":
            lambda: aten._native_batch_norm_legit_no_training.default(x4, c8, b, rm, rv, 0.1, 1e-5),
        "normalization/_native_batch_norm_legit":
            lambda: aten._native_batch_norm_legit.default(x4, c8, b, rm.clone(), rv.clone(), True, 0.1, 1e-5),
        "normalization/native_layer_norm": lambda: aten.native_layer_norm.default(x2, [64], bias64 + 1, bias64, 1e-5),
        "normalization/native_group_norm": lambda: aten.native_group_norm.default(x4, c8, b, 2, 8, 64, 4, 1e-5),
        "softmax": lambda: aten._softmax.default(x2, -1, False),
        "reduction": lambda: aten.sum.dim_IntList(x2, [-1]),
        "other/max_pool2d_with_indices": lambda: aten.max_pool2d_with_indices.default(x4, [2, 2], [2, 2]),
        "other/avg_pool2d": lambda: aten.avg_pool2d.default(x4, [2, 2], [2, 2]),
        "copy/cat": lambda: aten.cat.default([x2, x2]),
        "copy/clone": lambda: aten.clone.default(x2),
    }


def measure_launch_by_class(device: str, ops: int = 500, repeats: int = 3) -> dict[str, float]:
    """Host time per eager call (us) of each op class of :func:`_host_probes`: ``ops`` tiny calls in a loop,
    synchronised once per loop, median of ``repeats`` loops (a tiny call's device time is below its host time, so
    the loop runs at the host's pace). The spec's ``launch_overhead_by_class``."""
    out = {}
    for key, call in _host_probes(device).items():
        try:
            out[key] = round(per_op_us(device, call, ops, repeats), 3)
        except (RuntimeError, TypeError):  # an overload this torch build lacks: that class keeps the default
            continue
    return out
