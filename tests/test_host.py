"""fusion_advisor.host: a CPU busy with other work is named before the tool times a model on it."""

from __future__ import annotations

import itertools

from fusion_advisor import host


def _stat(tmp_path, lines):
    """A /proc/stat stand-in whose first line reads each of ``lines`` in turn."""
    path = tmp_path / "stat"
    turns = itertools.cycle(lines)

    class Stat(type(path)):
        def read_text(self, *a, **k):
            return next(turns)

    return Stat(path)


def test_other_processes_holding_cores_are_named(tmp_path, monkeypatch):
    """A fresh user's apply on a 2-core machine, one core taken by another process, measured a 0.010 ms model at
    7.5 ms and chose torch.compile at '233x' eager, with a spread of 0.4% and no warning."""
    monkeypatch.setattr(host, "_cpus", lambda: {0, 1})
    # per CPU: user nice system idle iowait irq softirq steal guest; cpu0 fully busy over the window, cpu1 idle
    busy = _stat(tmp_path, ["cpu 0 0 0 0\ncpu0 1000 0 0 1000 0 0 0 0 0\ncpu1 0 0 0 2000 0 0 0 0 0",
                            "cpu 0 0 0 0\ncpu0 1100 0 0 1000 0 0 0 0 50\ncpu1 0 0 0 2100 0 0 0 0 0"])
    assert host.busy_cores(0.0, busy, {0, 1}) == 1.0  # guest time (inside user time) is not counted twice
    note = host.busy_cpu_note("cpu", 0.0, busy, threads=2)
    assert note.startswith("the CPU is busy with other work: other processes used 1.0 of its 2 cores")
    # one thread fits in the core left free (OMP_NUM_THREADS=1, the note's own remedy): no warning
    assert host.busy_cpu_note("cpu", 0.0, busy, threads=1) == ""
    assert host.busy_cpu_note("cuda", 0.0, busy, threads=2) == ""  # GPU timings are the GPU's
    # a container allowed cpu1 alone: another tenant on cpu0 is not its business
    assert host.busy_cores(0.0, busy, {1}) == 0.0
    monkeypatch.setattr(host, "_cpus", lambda: {1})
    assert host.busy_cpu_note("cpu", 0.0, busy) == ""
    idle = _stat(tmp_path, ["cpu0 1000 0 0 1000 0\ncpu1 0 0 0 1000 0", "cpu0 1010 0 0 1090 0\ncpu1 0 0 0 1100 0"])
    assert host.busy_cores(0.0, idle, {0, 1}) == 0.1
    assert host.busy_cores(0.0, tmp_path / "missing", {0}) is None  # not Linux: no claim
    assert host.busy_cpu_note("cpu", 0.0, tmp_path / "missing") == ""
