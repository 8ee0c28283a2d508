"""Whether the machine's CPU is busy with other work while the tool times a model on it.

A CPU timing is only as good as the cores it gets: PyTorch's OpenMP threads (one per core by default) stall when
another process holds a core, and on a shared 2-core machine a fresh user's apply measured a tiny LayerNorm model's
eager step at 6.8-7.5 ms (0.010 ms idle), then chose torch.compile at "233x" eager. The spread of such rounds is
small (every round is slow alike), so the noise checks did not catch it. Linux only (``/proc/stat``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Seconds the CPU's use is sampled over while this process sleeps (its own use is then near zero).
SAMPLE_S = 0.25

#: Other processes holding at least this many cores' worth of CPU time make a CPU timing unreliable.
BUSY_CORES = 0.5


def _cpu_ticks(stat: Path) -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of the whole machine from ``/proc/stat``'s first line, or None where unreadable."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    values = [int(v) for v in fields[1:] if v.isdigit()]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def busy_cores(sample_s: float = SAMPLE_S, stat: Path = Path("/proc/stat")) -> float | None:
    """Cores' worth of CPU time other processes used over ``sample_s`` seconds while this one slept (0 to
    ``os.cpu_count()``), or None where ``/proc/stat`` cannot be read (not Linux)."""
    first = _cpu_ticks(stat)
    if first is None:
        return None
    time.sleep(sample_s)
    second = _cpu_ticks(stat)
    if second is None or second[1] <= first[1]:
        return None
    cores = os.cpu_count() or 1
    return cores * (second[0] - first[0]) / (second[1] - first[1])


def busy_cpu_note(device: str, sample_s: float = SAMPLE_S, stat: Path = Path("/proc/stat")) -> str:
    """A warning when ``device`` is ``"cpu"`` and other processes hold :data:`BUSY_CORES` or more of its cores
    (:func:`busy_cores`), else ``""``."""
    if device != "cpu":
        return ""
    busy = busy_cores(sample_s, stat)
    if busy is None or busy < BUSY_CORES:
        return ""
    cores = os.cpu_count() or 1
    return (f"the CPU is busy with other work: other processes used {busy:.1f} of its {cores} cores while the "
            f"timing was about to start; PyTorch's threads stall when a core is taken, so CPU times here may be many "
            f"times the idle machine's and a plan chosen on them may not hold (run on an idle machine, or set "
            f"OMP_NUM_THREADS below the free cores)")
