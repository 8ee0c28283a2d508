"""Rates of the memory-bound eager kernels the copy bandwidth misprices, measured for ``calibrate``: the rate at
which pooling kernels read their windows (the spec's ``pool_window_gelem_s``,
:func:`fusion_advisor.analyze.roofline.pool_window_us`) and the bandwidth of PyTorch's scan kernels (``cumsum``,
``cumprod``: the spec's ``scan_bandwidth_gbps``, :func:`fusion_advisor.analyze.roofline.op_bandwidth_gbps`), how
``torch.cat``'s grid costs it per input (``cat_sweep_gbps``, ``cat_sweep_cap_bytes``), and an elementwise kernel's fixed device time
as the profiler sees it (``kernel_busy_overhead_us``)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Iterable

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


#: The scans :func:`measure_scan_gbps` times: ``torch.cumsum`` of fp32 [rows, cols] tensors along their last dim
#: (PyTorch's innermost-dim scan kernel, which KernelBench's cumsum / cumprod files run), 256 MiB to 1 GiB on a GPU:
#: its rate grows with the rows and their length.
SCAN_SHAPES = ((4096, 16384), (16384, 16384), (8192, 32768))
SCAN_SHAPES_SMALL = ((256, 4096),)


def _best_fp32_gbps(shapes: Iterable[tuple[int, ...]], build: Callable[[tuple[int, ...]], Callable[[], Any]],
                    timer: Callable[[Callable[[], Any]], Timing]) -> float:
    """The highest bandwidth (GB/s) over ``shapes`` of the call ``build(shape)`` returns, timed by ``timer``, that
    reads and writes one fp32 tensor of ``shape`` each (``2 * numel * 4`` bytes over the median time). Each shape's
    tensors are freed before the next is built."""
    best = 0.0
    for shape in shapes:
        call = build(shape)
        with torch.no_grad():
            t = timer(call)
        best = max(best, 2 * math.prod(shape) * 4 / (t.median_ms * 1e-3) / 1e9)
        del call
    return best


def _sized(row: tuple[int, ...], nbytes: int) -> tuple[int, ...]:
    """``(n, *row)`` holding about ``nbytes`` of fp32 (at least one row)."""
    return (max(1, nbytes // (math.prod(row) * 4)), *row)


def measure_scan_gbps(device: str, quick: bool, timer: Callable[[Callable[[], Any]], Timing],
                      nbytes: int = 0) -> float:
    """Bandwidth (GB/s, bytes read + written) of eager ``torch.cumsum`` along the last dim of fp32 tensors: the
    highest over :data:`SCAN_SHAPES` (on a CPU or with ``quick``, rows of 4096 holding ``nbytes``, the copy
    buffer's size, else :data:`SCAN_SHAPES_SMALL`), each timed by ``timer``: a ceiling, as the copy bandwidth is.
    On the H200 KernelBench's 32768 x 32768 cumsum ran its one scan kernel at 1908 GB/s, 45% of the copy bandwidth
    (benchmarks/results/h200/accuracy/reprofile/seed1/), and Inductor's own scan at 3323 GB/s; a 4096 x 16384 one
    at 1291 GB/s."""
    def cumsum(shape: tuple[int, ...]) -> Callable[[], Any]:
        x = torch.rand(shape, device=device, dtype=torch.float32)
        out = torch.empty_like(x)
        return lambda: torch.cumsum(x, -1, out=out)

    small = (_sized(SCAN_SHAPES_SMALL[0][1:], nbytes),) if nbytes > 0 else SCAN_SHAPES_SMALL
    return _best_fp32_gbps(SCAN_SHAPES if device == "cuda" and not quick else small, cumsum, timer)


#: The broadcast adds :func:`measure_broadcast_gbps` times: fp32 ``[N, C, H, W] + [C, 1, 1]`` (a convolution's bias
#: added apart, as KernelBench's level-2 models write it), 256 MiB to 1 GiB on a GPU.
BROADCAST_SHAPES = ((64, 64, 128, 128), (128, 128, 128, 128))
BROADCAST_SHAPES_SMALL = ((4, 16, 64, 64),)


def measure_broadcast_gbps(device: str, quick: bool, timer: Callable[[Callable[[], Any]], Timing],
                           nbytes: int = 0) -> float:
    """Bandwidth (GB/s, bytes read + written) of an eager elementwise add with a broadcast input: ``x + b`` of fp32
    ``x`` :data:`BROADCAST_SHAPES` (on a CPU or with ``quick``, ``[N, 16, 64, 64]`` holding ``nbytes``, the copy
    buffer's size, else :data:`BROADCAST_SHAPES_SMALL`) and ``b`` of ``[C, 1, 1]``, into a preallocated output, each
    timed by ``timer``: the highest, a ceiling as the copy bandwidth is. Sized as the copy is, not in cache: a new
    user's CPU calibrate timed the 1 MiB shape in its L2 at 154 GB/s against a copy of 58 (147 against 25 in the
    full run), and the spec priced a bias add 4x cheaper than a plain add measured as long. TensorIterator runs
    it in the loop that computes every operand's offset, not the vectorised contiguous one:
    on the H200 such ops inside 113 profiled KernelBench models ran at a median 2,570 GB/s against 4,250 for
    contiguous ones (benchmarks/results/h200/accuracy/memory_rates/)."""
    def add_bias(shape: tuple[int, ...]) -> Callable[[], Any]:
        x = torch.rand(shape, device=device, dtype=torch.float32)
        b = torch.rand(shape[1], 1, 1, device=device, dtype=torch.float32)
        out = torch.empty_like(x)
        return lambda: torch.add(x, b, out=out)

    small = (_sized(BROADCAST_SHAPES_SMALL[0][1:], nbytes),) if nbytes > 0 else BROADCAST_SHAPES_SMALL
    return _best_fp32_gbps(BROADCAST_SHAPES if device == "cuda" and not quick else small, add_bias, timer)


#: The concatenations :func:`measure_cat_sweep` times: one fp32 input of ``CAT_PROBE_FIRST`` channels and
#: ``CAT_PROBE_INPUTS - 1`` of 32 joined along dim 1 at batch 10 and each of these feature-map sides, as a dense block
#: joins its transition's output with its growing list of 32-channel layers (DenseNet-201: up to 33 inputs).
CAT_PROBE_SIDES = (7, 14, 28, 56)
CAT_PROBE_INPUTS = 33
CAT_PROBE_FIRST = 928


def measure_cat_sweep(device: str, copy_gbps: float, timer: Callable[[Callable[[], Any]], Timing]
                      ) -> tuple[float, float] | None:
    """How ``torch.cat``'s grid costs it per input (the spec's ``cat_sweep_gbps`` and ``cat_sweep_cap_bytes``).

    PyTorch's CUDA cat (``CatArrayBatchedCopy`` in aten/src/ATen/native/cuda/Shape.cu) launches one grid row per
    input, each as wide as the largest input needs: an input far smaller than the largest still costs the blocks
    of the largest, so joining many small feature maps to one large one runs at many times its bytes (on the H200 a
    10 x 928 x 7 x 7 map and 32 of 10 x 32 x 7 x 7: 18.8 us, its bytes 1.8 us; 32 equal inputs: 1.9 us). Each
    input then costs ``min(largest input's bytes, cap) / gbps`` beyond the bytes
    (:func:`fusion_advisor.analyze.roofline.cat_inputs_us`).

    Each of :data:`CAT_PROBE_SIDES` is timed by ``timer``; per side the time less the bytes (read and written) at
    ``copy_gbps`` over the inputs is the per-input cost. ``gbps``: the largest input's bytes over that cost at the
    smallest side (far under the cap); ``cap``: the largest per-input cost seen, in bytes at that rate. None when
    the smallest side shows no cost beyond its bytes."""
    costs = []
    for side in CAT_PROBE_SIDES:
        parts = [torch.rand(10, CAT_PROBE_FIRST, side, side, device=device)] + [
            torch.rand(10, 32, side, side, device=device) for _ in range(CAT_PROBE_INPUTS - 1)]
        nbytes = 2 * sum(p.numel() for p in parts) * 4
        with torch.no_grad():
            ms = timer(lambda parts=parts: torch.cat(parts, 1)).median_ms
        costs.append((parts[0].numel() * 4, (ms * 1e3 - nbytes / (copy_gbps * 1e3)) / CAT_PROBE_INPUTS))
        del parts
    largest, per_input_us = costs[0]
    if per_input_us <= 0:
        return None
    gbps = largest / (per_input_us * 1e3)
    return gbps, max(c for _, c in costs) * gbps * 1e3


#: Elements per operand of :func:`measure_kernel_busy_overhead_us`'s adds: sizes whose bytes take under 0.1 us, so
#: the duration is the fixed part (adds of a few MiB repeated from the L2 ran faster than their bytes at the copy
#: bandwidth: 0.35 us left over on the H200, while in models 4-16 MB kernels took ~1 us beyond their bytes).
BUSY_OVERHEAD_NUMELS = (1024, 16384, 65536)
#: How the spec's ``kernel_busy_overhead_us`` was measured (its source line).
BUSY_OVERHEAD_SOURCE = (f"torch.add(a, b, out=c) on bf16 operands of {'/'.join(map(str, BUSY_OVERHEAD_NUMELS))} "
                        "elements under torch.profiler; per size the kernel's duration less 3 x bytes at the copy "
                        "bandwidth, median over the sizes (memory_rates.measure_kernel_busy_overhead_us)")


def measure_kernel_busy_overhead_us(copy_gbps: float, iters: int = 50) -> float | None:
    """Fixed device time of an eager elementwise kernel beyond its bytes, as the profiler sees its duration (us;
    the spec's ``kernel_busy_overhead_us``): ``torch.add(a, b, out=c)`` on bf16 operands of
    :data:`BUSY_OVERHEAD_NUMELS` elements, ``iters`` calls under ``torch.profiler``; per size the kernel's device
    time per call less ``3 * bytes / copy_gbps``, the median over sizes. ``analyze --profile`` measures an op's
    busy time the same way, so this is the fixed part an eager op's predicted busy time carries; the CUDA-graph
    replay's ``elementwise_overhead_us`` also holds the gap to the next kernel (H200: 261 profiled elementwise
    kernels under 0.1 MB took a median 0.99 us, the replay 2.38 us per kernel). None without a CUDA device or
    when the profiler records no kernel."""
    from fusion_advisor.kernel_tools.bench import device_time_and_kernels

    try:
        extra = []
        for n in BUSY_OVERHEAD_NUMELS:
            a, b, c = (torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            ms, kernels = device_time_and_kernels(lambda a=a, b=b, c=c: torch.add(a, b, out=c), iters)
            if kernels <= 0:
                return None
            extra.append(ms * 1e3 / kernels - 3 * n * 2 / (copy_gbps * 1e9) * 1e6)
        return max(statistics.median(extra), 0.0)
    except RuntimeError:  # no CUDA device
        return None
