"""Does the host time of an eager op depend on what the process did before? The tiny eager add (calibrate's
launch probe, ``analyze --profile``'s dispatch probe) timed in one process after each step of what a profiling
worker does.

Why: in the accuracy sets' profiles (one worker process analysing and profiling 33-40 KernelBench files in turn,
benchmarks/results/h200/accuracy/reprofile/) the first file's dispatch probe read 8.3-8.4 us and the later files'
10-21 us, and a 256-step Python RNN ran 132 us per step in the worker against 73 in a fresh process
(host/loop_step_host.json).

    python benchmarks/host/process_state_host.py --out DIR FILE.py...   # writes DIR/process_state_host.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.devices.host_costs import add_probe, per_op_us  # noqa: E402


def add_us() -> float:
    return round(per_op_us("cuda", add_probe("cuda"), 2000, 5), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args()
    rows = []

    def note(step: str) -> None:
        t = add_us()
        rows.append({"after": step, "add_us": t, "gc_objects": len(gc.get_objects()),
                     "cuda_reserved_mib": round(torch.cuda.memory_reserved() / 2**20)})
        print(f"{step:60} add {t:6.2f} us  objects {rows[-1]['gc_objects']:8d}  "
              f"reserved {rows[-1]['cuda_reserved_mib']} MiB", flush=True)

    note("fresh process, CUDA started")
    big = [torch.empty(2**28, device="cuda") for _ in range(4)]
    note("4 GiB allocated")
    del big
    note("freed (cached)")
    torch.cuda.empty_cache()
    note("empty_cache")
    from fusion_advisor.analyze.pipeline import analyze
    from fusion_advisor.report.write import write_report
    note("fusion_advisor imported")
    for i, f in enumerate(args.files):
        with torch.no_grad():
            a = analyze(f, device="cuda", gpu="h200", profile=True)
        write_report(a, Path("/tmp") / f"process_state_r{i}")
        note(f"analyze --profile {f.name} (report held)")
        del a
        gc.collect()
        note("  report dropped, gc.collect")
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        note("  dynamo reset, empty_cache")
    gc.freeze()
    note("gc.freeze")
    gc.disable()
    note("gc disabled")
    gc.enable()
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "files": [str(f) for f in args.files], "rows": rows}
    (args.out / "process_state_host.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
