"""Helpers the GPU benchmarks share: the copy-bandwidth ceiling, a shape's label, the outputs a backward starts from,
host time per call.

Each entry point (``benchmarks/<purpose>/<name>.py``) puts the repository root on ``sys.path`` and imports these as
``benchmarks.common``; the package itself never imports ``benchmarks``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from fusion_advisor.verification.trees import tensor_leaves

__all__ = ["copy_bandwidth_gbps", "float_outputs", "per_call_us", "shape_label", "tensor_leaves"]


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth of the current CUDA GPU, GB/s counting bytes read plus written (the ceiling
    memory-bound kernels face): ``triton.testing.do_bench`` median (warmup 25 ms, rep 200 ms) of copying ``nbytes``
    (1 GiB, far past L2).

    Raises:
        RuntimeError: no CUDA GPU (from the allocation).
    """
    from triton.testing import do_bench

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def float_outputs(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors of ``out`` (nested tuples and lists walked) that require grad: where a backward
    starts."""
    return [t for t in tensor_leaves(out) if t.is_floating_point() and t.requires_grad]


def shape_label(shape: dict) -> str:
    """A ``BENCH_SHAPES`` dict as one label, ``n_rows=8192,n_cols=4096,dtype=bfloat16`` (``torch.`` dropped)."""
    return ",".join(f"{k}={str(v).replace('torch.', '')}" for k, v in shape.items())


def interleaved_per_call_us(fns: dict[str, Callable[[], Any]], calls: int, repeats: int, warmup: int = 20,
                            count_drain: bool = False) -> dict[str, float]:
    """:func:`per_call_us` of several callables measured side by side: ``repeats`` rounds, each timing one loop of
    ``calls`` calls of every callable in turn (the order rotated each round), the median per callable. A host whose
    speed drifts (a shared machine: the H200 host's per-call times moved by 30-50% between minutes) then shifts all
    of them alike instead of whichever ran during a slow minute. A callable that raises is left out of the result
    (and out of later rounds)."""
    cuda = torch.cuda.is_available()
    names = list(fns)
    ok = []
    for name in names:
        try:
            for _ in range(warmup):
                fns[name]()
            ok.append(name)
        except Exception:  # noqa: BLE001 - the caller reports what is missing
            continue
    loops: dict[str, list[float]] = {n: [] for n in ok}
    for r in range(repeats):
        order = ok[r % len(ok):] + ok[:r % len(ok)] if ok else []
        for name in order:
            fn = fns[name]
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if count_drain and cuda:
                torch.cuda.synchronize()
            loops[name].append((time.perf_counter() - t0) / calls * 1e6)
    if cuda:
        torch.cuda.synchronize()
    return {n: statistics.median(v) for n, v in loops.items()}


def per_call_us(fn: Callable[[], Any], calls: int, repeats: int, warmup: int = 20, count_drain: bool = True) -> float:
    """Host time per call, us: the median over ``repeats`` loops of ``calls`` back-to-back calls of ``fn`` (after
    ``warmup`` calls). Where CUDA is present the GPU is synchronised before the first loop and after each one; with
    ``count_drain`` the loop's time includes that final synchronisation (the GPU's backlog drained), without it the
    loop is timed before it (the host's issue time alone)."""
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if count_drain and cuda:
            torch.cuda.synchronize()
        loops.append((time.perf_counter() - t0) / calls * 1e6)
        if cuda:
            torch.cuda.synchronize()
    return statistics.median(loops)


def gpu_probe_args(description: str, repeats: int, calls: int = 200) -> argparse.Namespace:
    """The command line of a host-time probe (``--out DIR --calls N --repeats N``), parsed, on a machine with a
    CUDA GPU (asserted), ``--out`` created."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=calls)
    ap.add_argument("--repeats", type=int, default=repeats)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this probe needs a CUDA GPU"
    args.out.mkdir(parents=True, exist_ok=True)
    return args

