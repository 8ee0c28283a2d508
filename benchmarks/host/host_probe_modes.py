"""calibrate's per-class host probes (fusion_advisor.devices.host_costs.host_probes) timed four ways in one
process, to find why their values moved 1.5x between calibrations of one day while the eager add did not
(results/h200/host/host_cost_repeats.json: conv 33.3 us in a first round, 21.8 and 21.9 after; BatchNorm 27.4, then
15.7 and 16.3; the add 6.6-6.7 throughout).

Modes, each a round over every class with the eager add before it:
- ``cold drained``: first thing in the process, as calibrate's loop times them (ops calls, synchronised once at
  the end: the wall time includes the GPU's backlog);
- ``issue only``: the loop timed before its final synchronisation (the host's time alone; 100 calls, so the launch
  queue never fills);
- ``warm drained``: after 2 s of large matmuls (the GPU at its working clocks), as calibrate times them;
- ``warm issue only``.
Each mode also records the SM clock (nvidia-smi) before it and each probe's device time per call (profiler).

    python benchmarks/host/host_probe_modes.py --out DIR    # writes DIR/host_probe_modes.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import per_call_us  # noqa: E402
from fusion_advisor.devices.host_costs import host_probes  # noqa: E402
from fusion_advisor.kernel_tools.bench import device_time_and_kernels  # noqa: E402


def sm_clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e})"


def round_of(probes, x, drained: bool, calls: int) -> dict:
    out = {"sm_clock_before": sm_clock(),
           "add": per_call_us(lambda: torch.add(x, 1.0), calls, 5, count_drain=drained)}
    for key, probe in probes.items():
        out[key] = per_call_us(probe, calls, 5, count_drain=drained)
    return out


def warm_gpu(seconds: float = 2.0) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    x = torch.ones(1024, device="cuda")
    probes = host_probes("cuda")
    rows = {}
    with torch.no_grad():
        rows["cold drained"] = round_of(probes, x, True, 500)
        rows["cold issue only"] = round_of(probes, x, False, 100)
        rows["cold drained again"] = round_of(probes, x, True, 500)
        warm_gpu()
        rows["warm drained"] = round_of(probes, x, True, 500)
        warm_gpu()
        rows["warm issue only"] = round_of(probes, x, False, 100)
        device = {}
        for key, probe in probes.items():
            ms, kernels = device_time_and_kernels(probe, iters=20)
            device[key] = {"device_us": round(ms * 1e3, 3), "activities": kernels}
    for mode, r in rows.items():
        print(f"{mode:20} {r['sm_clock_before']:32} " + " ".join(f"{k.split('/')[-1][:10]}={v:.1f}" for k, v in r.items()
                                                             if k != "sm_clock_before"), flush=True)
    print("device per call:", json.dumps(device), flush=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "rows": rows, "device_per_call": device}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_probe_modes.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
