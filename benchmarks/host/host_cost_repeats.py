"""calibrate's host costs measured three times back to back in one process on the GPU (eager add, nn.Module call,
view op, per op class: fusion_advisor.devices.host_costs), to see how far they move between measurements.

    python benchmarks/host/host_cost_repeats.py --out DIR    # writes DIR/host_cost_repeats.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.devices.host_costs import (add_probe, measure_launch_by_class, measure_module_call_us,  # noqa: E402
                                               measure_view_us, per_op_us)


def measure_once() -> dict:
    """One round of every host cost calibrate measures (us)."""
    add = per_op_us("cuda", add_probe("cuda"), 2000, 5)
    module = measure_module_call_us("cuda")
    view = measure_view_us("cuda")
    return {"add": add, "module": module, "view": view, "by": measure_launch_by_class("cuda", module, view, add)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds = []
    for _ in range(args.rounds):
        rounds.append(measure_once())
        print(json.dumps(rounds[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": rounds}
    (args.out / "host_cost_repeats.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
