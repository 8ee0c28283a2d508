"""Host time of mixtures of eager calls against the sum of calibrate's tight-loop prices for them: which kind of
interleaving makes the host slower? Each mixture is a list of distinct modules (fresh parameters and inputs per
instance) called one after another; measured: wall time per mixture call in a loop (synchronised once per loop,
median of 5 loops); predicted: per call its class's ``launch_overhead_by_class`` entry (else the eager add's), plus
a module call where it is a module and a view per ``nn.Linear`` (its weight's ``t``).

    python benchmarks/host/in_model_mixtures.py --out DIR    # writes DIR/in_model_mixtures.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.devices.host_costs import (add_probe, HostProbe, host_probes, measure_launch_by_class,  # noqa: E402
                                               measure_module_call_us, measure_view_us, per_op_us)


def mixtures(dev: str) -> dict[str, list[tuple[str, HostProbe]]]:
    nn, f = torch.nn, dict(device=dev, dtype=torch.float32)
    x4, h = torch.randn(2, 8, 8, 8, **f), torch.randn(8, 64, **f)

    def conv_block():
        return [("conv", HostProbe(nn.Conv2d(8, 8, 3, padding=1).to(dev), (x4,))),
                ("normalization/_native_batch_norm_legit_no_training", HostProbe(nn.BatchNorm2d(8).to(dev).eval(), (x4,))),
                ("pointwise", HostProbe(nn.ReLU().to(dev), (x4,)))]

    def rnn_cell():
        return [("copy/cat", HostProbe(torch.cat, ([h, h], 1))),
                ("matmul/addmm", HostProbe(nn.Linear(128, 64).to(dev), (torch.randn(8, 128, **f),), views=1)),
                ("pointwise", HostProbe(nn.Tanh().to(dev), (h,))),
                ("matmul/addmm", HostProbe(nn.Linear(64, 32).to(dev), (h,), views=1))]

    return {
        "one class, one instance: conv x 16": [("conv", HostProbe(nn.Conv2d(8, 8, 3, padding=1).to(dev), (x4,)))] * 16,
        "one class, 16 instances: conv": [c for _ in range(16) for c in conv_block()[:1]],
        "16 conv-bn-relu blocks": [c for _ in range(16) for c in conv_block()],
        "64 conv-bn-relu blocks": [c for _ in range(64) for c in conv_block()],
        "16 rnn cells": [c for _ in range(16) for c in rnn_cell()],
        "64 rnn cells": [c for _ in range(64) for c in rnn_cell()],
        "every class x 8 (calibrate's)": [(k, p) for _ in range(8) for k, p in host_probes(dev).items()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    add = per_op_us("cuda", add_probe("cuda"), 2000, 5)
    module, view = measure_module_call_us("cuda"), measure_view_us("cuda")
    by = measure_launch_by_class("cuda", module, view, add)
    rows = []
    for name, calls in mixtures("cuda").items():
        predicted = sum(by.get(k, add) + module * p.module + view * p.views for k, p in calls)

        def mixed(calls=calls):
            for _, p in calls:
                p()

        with torch.no_grad():
            measured = per_op_us("cuda", mixed, 20, 5)
        rows.append({"mixture": name, "calls": len(calls), "measured_us": measured, "predicted_us": predicted,
                     "factor": measured / predicted})
        print(f"{name:34} {len(calls):4} calls  measured {measured:8.1f} us  predicted {predicted:8.1f}  "
              f"x{measured / predicted:.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "add_us": add, "module_us": module, "view_us": view, "by_class": by, "rows": rows}
    (args.out / "in_model_mixtures.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
