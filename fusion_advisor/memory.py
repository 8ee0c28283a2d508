"""How much memory a device has free, and how much a set of tensors takes: the checks that keep ``analyze`` and
``apply`` from being killed by the kernel's OOM killer (a process that is killed prints nothing: a new user's
``apply`` on a KernelBench level-1 file with 6.4 GiB of fp32 inputs died at 23.5 GiB resident, mid-run, with no
message and no plan)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Iterable

import torch


def release_cuda_memory() -> None:
    """Free what unreachable objects still hold on the GPU and hand PyTorch's unused cached segments back to the
    driver: ``gc.collect()``, then ``torch.cuda.empty_cache()``. A caught exception's traceback keeps the frames it
    passed through, and their tensors, in a reference cycle only the collector frees, so call it after the
    ``except`` block, not inside it (there the exception is still alive): on an H100 a float64 check that ran out
    of memory left 54 GiB allocated that reference counting alone never freed."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def available_bytes(device: str | torch.device = "cpu") -> int:
    """Free memory of ``device`` in bytes: ``MemAvailable`` of /proc/meminfo for the CPU (and meta); for a CUDA
    device what the driver has free (``torch.cuda.mem_get_info``) plus what PyTorch's caching allocator holds
    reserved but unused (it hands that out again without asking the driver: after a float64 check of a 6 GiB
    softmax the driver saw 0.6 GiB free on an idle 80 GB card); a very large number when it cannot be read."""
    kind = torch.device(device).type
    if kind == "cuda":
        try:
            dev = torch.device(device)
            # reserved blocks not in use, less the unused tails of split blocks (no large allocation fits there)
            split = torch.cuda.memory_stats(dev).get("inactive_split_bytes.all.current", 0)
            cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev) - split
            return int(torch.cuda.mem_get_info(dev)[0]) + max(int(cached), 0)
        except Exception:  # no CUDA runtime to ask
            return 1 << 62
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


def tensor_bytes(xs: Iterable[Any], itemsize: int | None = None) -> int:
    """Bytes the tensors in ``xs`` take (other objects count 0); with ``itemsize``, what their floating-point ones
    would take at that element size (8: their float64 copies), the others as they are."""
    total = 0
    for x in xs:
        if isinstance(x, torch.Tensor):
            size = itemsize if itemsize is not None and x.is_floating_point() else x.element_size()
            total += x.numel() * size
    return total


def gib(n: int) -> str:
    """``n`` bytes as GiB text, e.g. ``"6.4 GiB"``."""
    return f"{n / 2**30:.1f} GiB"
