"""Whether the machine's CPU is busy with other work while the tool times a model on it.

A CPU timing is only as good as the cores it gets: PyTorch's OpenMP threads (one per core by default) stall when
another process holds a core, and on a shared 2-core machine a fresh user's apply measured a tiny LayerNorm model's
eager step at 6.8-7.5 ms (0.010 ms idle), then chose torch.compile at "233x" eager. The spread of such rounds is
small (every round is slow alike), so the noise checks did not catch it. Linux only (``/proc/stat``), over the
CPUs this process may run on (``os.sched_getaffinity``: a container's cores, not the whole host's).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Seconds the CPU's use is sampled over while this process sleeps (its own use is then near zero).
SAMPLE_S = 0.25

#: Other processes holding at least this many cores' worth of CPU time make a CPU timing unreliable.
BUSY_CORES = 0.5

#: Why a ratio measured while other processes held the CPU's cores is not to be quoted, and how apply's headline
#: marks it (the report's template prints "not reliable" before the reason).
BUSY_CPU_REASON = "the CPU was busy with other work while timed"
BUSY_CPU_MARK = f"not reliable: {BUSY_CPU_REASON}"


def _cpus() -> set[int] | None:
    """The CPUs this process may run on (its affinity, a container's cpuset), or None where not known."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cpu_ticks(stat: Path, cpus: set[int] | None) -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of ``cpus`` (the ``cpuN`` lines of ``/proc/stat``; all of them for None), or None
    where unreadable. Busy: user, nice, system, irq, softirq; total adds idle, iowait and steal (guest time is
    inside user time already)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    seen = False
    for line in lines:
        fields = line.split()
        if not fields or not fields[0].startswith("cpu") or fields[0] == "cpu" or len(fields) < 5:
            continue
        try:
            cpu, values = int(fields[0][3:]), [int(v) for v in fields[1:9]]
        except ValueError:
            continue
        if cpus is not None and cpu not in cpus:
            continue
        values += [0] * (8 - len(values))
        user, nice, system, idle, iowait, irq, softirq, steal = values
        busy += user + nice + system + irq + softirq
        total += user + nice + system + irq + softirq + idle + iowait + steal
        seen = True
    return (busy, total) if seen else None


def _core_count(cpus: set[int] | None) -> int:
    """How many CPUs ``cpus`` holds (this machine's count where the affinity is not known)."""
    return len(cpus) if cpus else (os.cpu_count() or 1)


def busy_cores(sample_s: float = SAMPLE_S, stat: Path = Path("/proc/stat"), cpus: set[int] | None = None
               ) -> float | None:
    """Cores' worth of CPU time other processes used, over ``sample_s`` seconds while this one slept, on the CPUs
    this process may run on (``cpus``, default its affinity: a container's own cores, not the host's), or None
    where ``/proc/stat`` cannot be read (not Linux)."""
    cpus = _cpus() if cpus is None else cpus
    first = _cpu_ticks(stat, cpus)
    if first is None:
        return None
    time.sleep(sample_s)
    second = _cpu_ticks(stat, cpus)
    if second is None or second[1] <= first[1]:
        return None
    return _core_count(cpus) * (second[0] - first[0]) / (second[1] - first[1])


def busy_cpu_note(device: str, sample_s: float = SAMPLE_S, stat: Path = Path("/proc/stat"),
                  threads: int | None = None) -> str:
    """A warning when ``device`` is ``"cpu"`` and other processes hold :data:`BUSY_CORES` or more of its cores
    (:func:`busy_cores`) and PyTorch's intra-op threads (``threads``, default ``torch.get_num_threads()``) are
    more than the cores left free, else ``""``: threads that fit in the free cores do not stall (a user who set
    ``OMP_NUM_THREADS=1`` on a 2-core machine, one core taken, was still warned)."""
    if device != "cpu":
        return ""
    cpus = _cpus()
    busy = busy_cores(sample_s, stat, cpus)
    if busy is None or busy < BUSY_CORES:
        return ""
    cores = _core_count(cpus)
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    if threads <= cores - busy:
        return ""
    return (f"the CPU is busy with other work: other processes used {busy:.1f} of its {cores} cores while the "
            f"timing was about to start; PyTorch's threads stall when a core is taken, so CPU times here may be many "
            f"times the idle machine's and a plan chosen on them may not hold (run on an idle machine, or set "
            f"OMP_NUM_THREADS below the free cores)")
