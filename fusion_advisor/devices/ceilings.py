"""The ceilings ``calibrate`` measures first, on sizes that reach them (:class:`Sizes`): copy bandwidth, the
square-matmul peak per dtype (aligned and not), the permuted-read copy, the host time per tiny eager op, and the
device time per back-to-back kernel replayed from a CUDA graph (the kernel floor, and an elementwise kernel's fixed
time beyond its bytes). The timers here are shared with the rate tables (:func:`kernel_timer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from fusion_advisor.devices.host_costs import add_probe, per_op_us
from fusion_advisor.devices.rate_sampling import TABLE_KERNEL_CALLS
from fusion_advisor.dtypes import TORCH_DTYPES
from fusion_advisor.kernel_tools.bench import Timing, device_time_and_kernels, time_cpu, time_cuda

#: the dtypes measured, by name (:mod:`fusion_advisor.dtypes`); tf32 is fp32 storage on TF32 tensor cores.
MEASURED_DTYPES = {**{name: TORCH_DTYPES[name] for name in ("fp32", "bf16", "fp16")}, "tf32": torch.float32}



@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one calibration.

    Attributes:
        copy_bytes: bytes of each copy buffer (source and destination).
        matmul_n: side of the square matmuls.
        launch_ops: tiny ops issued in the launch-overhead loop.
        launch_numel: elements of the tiny tensor.
        warmup_ms, rep_ms: timer budgets per measurement (ms).
    """

    copy_bytes: int
    matmul_n: int
    launch_ops: int = 2000
    launch_numel: int = 1024
    warmup_ms: float = 25.0
    rep_ms: float = 100.0

    @classmethod
    def for_device(cls, device: str, quick: bool = False, l2_bytes: int = 0) -> "Sizes":
        """Defaults for ``device``: buffers at 8x L2 (at least 1 GiB) and n = 8192 on a GPU; 256 MiB and n = 1024 on
        a CPU. ``quick``: shorter budgets, and on a GPU buffers of 4x L2 (at least 256 MiB) and n = 4096, sizes that
        still reach the ceilings (a 16 MiB copy stays in an H200's 60 MiB L2 and a 256^3 matmul runs at a hundredth
        of the tensor-core peak: a quick spec measured that way was 5 to 17 times off); on a CPU copy buffers of
        64 MiB (at 16 MiB a new user's quick CPU copy ran in cache at 2.3x the full run's rate) and n = 1024."""
        if quick and device == "cuda":
            return cls(copy_bytes=max(4 * l2_bytes, 256 << 20), matmul_n=4096, launch_ops=300, warmup_ms=5.0,
                       rep_ms=20.0)
        if quick:  # a 256^3 CPU matmul ran at 1/17 of the 1024^3 one's rate (a fresh user): the full run's size
            return cls(copy_bytes=64 << 20, matmul_n=1024, launch_ops=300, warmup_ms=5.0, rep_ms=20.0)
        if device == "cuda":
            return cls(copy_bytes=max(8 * l2_bytes, 1 << 30), matmul_n=8192)
        return cls(copy_bytes=256 << 20, matmul_n=1024, rep_ms=200.0)


def timer_for(device: str, sizes: Sizes) -> Callable[[Callable[[], Any]], Timing]:
    """The ceilings' timer on ``device``: ``time_cuda`` (do_bench median, L2 flushed) on a GPU, ``time_cpu`` on a CPU,
    at ``sizes``' warm-up and timed budgets (ms)."""
    if device == "cuda":
        return lambda fn: time_cuda(fn, warmup_ms=sizes.warmup_ms, rep_ms=sizes.rep_ms)
    return lambda fn: time_cpu(fn, warmup_ms=sizes.warmup_ms, rep_ms=sizes.rep_ms)


def kernel_timer(fn: Callable[[], Any]) -> Timing:
    """The GPU timer of the convolution and matmul tables, the memory-kernel probes and the recurrent step: the summed durations of the kernels of one
    call over :data:`TABLE_KERNEL_CALLS` profiled calls (L2 warm, no host time), as ``analyze --profile`` measures an
    op inside a model."""
    ms, kernels = device_time_and_kernels(fn, iters=TABLE_KERNEL_CALLS)
    return Timing(ms, None, None, kernels)


def measure_copy_gbps(device: str, sizes: Sizes, timer: Callable[[Callable[[], Any]], Timing]) -> float:
    """Copy bandwidth in GB/s: ``2 * nbytes`` (read + write) over the median time of ``dst.copy_(src)``."""
    n = sizes.copy_bytes // 4
    src = torch.ones(n, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    return 2 * n * 4 / (t.median_ms * 1e-3) / 1e9


def measure_matmul_tflops(device: str, dtype: str, sizes: Sizes,
                          timer: Callable[[Callable[[], Any]], Timing]) -> float:
    """Matmul TFLOP/s of ``torch.mm`` on ``n x n`` operands of ``dtype`` (``2 n^3`` FLOPs over the median time).

    ``fp32`` runs with TF32 off and ``tf32`` with it on (GPU); the previous setting is restored.

    Raises:
        RuntimeError: the device cannot run a matmul of that dtype.
    """
    # a CPU runs fp16 products in a slow fallback (~1 GFLOP/s): at n / 4 it is measured in well under a second
    n = sizes.matmul_n // 4 if device == "cpu" and dtype == "fp16" else sizes.matmul_n
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=MEASURED_DTYPES[dtype], generator=gen)
    b = torch.randn(n, n, device=device, dtype=MEASURED_DTYPES[dtype], generator=gen)
    out = torch.empty(n, n, device=device, dtype=MEASURED_DTYPES[dtype])
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        t = timer(lambda: torch.mm(a, b, out=out))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12


def measure_unaligned_matmul_tflops(device: str, dtype: str, sizes: Sizes,
                                    timer: Callable[[Callable[[], Any]], Timing]) -> float:
    """Matmul TFLOP/s of ``torch.mm`` of ``[n, n] x [n, n - 1]`` operands of ``dtype``: output columns (and the
    second operand's leading dimension) not a multiple of 16 bytes, as in GPT-2's 50257-column vocabulary
    projection; ``2 n^2 (n - 1)`` FLOPs over the median time.

    Raises:
        RuntimeError: the device cannot run a matmul of that dtype.
    """
    # a CPU runs fp16 products in a slow fallback (~1 GFLOP/s): at n / 4 it is measured in well under a second
    n = sizes.matmul_n // 4 if device == "cpu" and dtype == "fp16" else sizes.matmul_n
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=MEASURED_DTYPES[dtype], generator=gen)
    b = torch.randn(n, n - 1, device=device, dtype=MEASURED_DTYPES[dtype], generator=gen)
    out = torch.empty(n, n - 1, device=device, dtype=MEASURED_DTYPES[dtype])
    t = timer(lambda: torch.mm(a, b, out=out))
    return 2 * n * n * (n - 1) / (t.median_ms * 1e-3) / 1e12


def measure_strided_copy_gbps(device: str, sizes: Sizes, timer: Callable[[Callable[[], Any]], Timing]) -> float:
    """Bandwidth (GB/s) of an eager copy reading a permuted view: ``dst.copy_(x.transpose(1, 2))`` with x a bf16
    ``[B, 2048, 32, 128]`` tensor (B so that x is about ``sizes.copy_bytes``, at least 1) and dst a contiguous
    ``[B, 32, 2048, 128]``: ``2 * nbytes`` (read + written) over the median time. The layout of
    ``proj(x).view(B, S, H, D).transpose(1, 2)`` feeding RoPE or a ``.contiguous()``."""
    s, h, d = 2048, 32, 128
    b = max(1, sizes.copy_bytes // (s * h * d * 2))
    x = torch.ones(b, s, h, d, device=device, dtype=torch.bfloat16)
    dst = torch.empty(b, h, s, d, device=device, dtype=torch.bfloat16)
    view = x.transpose(1, 2)
    t = timer(lambda: dst.copy_(view))
    return 2 * x.numel() * 2 / (t.median_ms * 1e-3) / 1e9


def measure_launch_us(device: str, sizes: Sizes, repeats: int = 5) -> float:
    """Wall time per tiny eager op (``y = x + 1`` on ``launch_numel`` fp32 elements), us: ``launch_ops`` ops issued
    in a loop, synchronised once at the end; the median of ``repeats`` loops after one warm-up loop
    (:func:`fusion_advisor.devices.host_costs.add_probe`)."""
    return per_op_us(device, add_probe(device, sizes.launch_numel), sizes.launch_ops, repeats)


def _graph_replay_ms(body: Callable[[], Any], sizes: Sizes) -> float:
    """Median ms per replay of a CUDA graph capturing ``body()`` (run once first on a side stream, as capture needs),
    timed with ``time_cuda``: the device time of ``body``'s kernels with no host cost between them.

    Raises:
        RuntimeError: CUDA graphs unavailable, or ``body`` fails.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    torch.cuda.synchronize()
    return time_cuda(graph.replay, warmup_ms=sizes.warmup_ms, rep_ms=sizes.rep_ms).median_ms


def measure_kernel_floor_us(sizes: Sizes) -> float | None:
    """GPU device time per back-to-back tiny kernel: ``launch_ops`` tiny adds captured in a CUDA graph, replayed and
    timed with CUDA events (us). ``None`` when CUDA graphs are unavailable."""
    try:
        x = torch.ones(sizes.launch_numel, device="cuda")
        ops = min(sizes.launch_ops, 1000)

        def adds() -> None:
            for _ in range(ops):
                x.add_(0.0)

        return _graph_replay_ms(adds, sizes) * 1e3 / ops
    except Exception:  # noqa: BLE001 - an optional extra; the spec does not need it
        return None


#: Bytes per operand and kernels per CUDA graph of :func:`measure_elementwise_overhead_us`.
ELEMENTWISE_MIB = (4, 16, 64)
ELEMENTWISE_KERNELS = 8


def measure_elementwise_overhead_us(copy_gbps: float, sizes: Sizes, mib: tuple[int, ...] = ELEMENTWISE_MIB,
                                    kernels: int = ELEMENTWISE_KERNELS) -> float | None:
    """Fixed device time per eager elementwise kernel beyond its bytes at copy bandwidth (us): ``torch.add(a, b,
    out=c)`` on bf16 operands of ``mib`` MiB each, ``kernels`` adds on distinct buffers (more than the L2 holds)
    captured in a CUDA graph and replayed (no host cost); per size ``time per kernel - 3 * bytes / copy_gbps``,
    the median over sizes. It is the ramp-up and tail of a bandwidth-bound kernel (H200: a 33 MB add or
    LayerNorm takes ~4 us more than its bytes at copy bandwidth; a DtoD memcpy does not). ``None`` when CUDA graphs
    are unavailable."""
    import statistics

    try:
        extra = []
        for m in mib:
            n = (m << 20) // 2
            bufs = [tuple(torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    for _ in range(kernels)]

            def adds(bufs: list[tuple[torch.Tensor, ...]] = bufs) -> None:
                for a, b, c in bufs:
                    torch.add(a, b, out=c)

            per_kernel_us = _graph_replay_ms(adds, sizes) * 1e3 / kernels
            extra.append(per_kernel_us - 3 * (m << 20) / (copy_gbps * 1e9) * 1e6)
            del bufs, adds  # free this size's buffers before the next, larger one
        torch.cuda.empty_cache()
        return max(statistics.median(extra), 0.0)
    except Exception:  # noqa: BLE001 - an optional extra; the spec does not need it
        return None
