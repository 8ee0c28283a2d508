"""Host time per step of a Python-loop RNN cell (cat, Linear, Tanh, Linear per step, as KernelBench's vanilla RNNs
write it), taken apart: the whole loop, each statement alone in the same loop, the captured aten graph run as
``analyze --profile`` runs it, and calibrate's tiny probes of the same classes.

Why: on the H200 a 256-step vanilla RNN ran 100 us per step where the cost model's host prices summed to 79 us
(benchmarks/results/h200/accuracy/reprofile/, seed 1), while calibrate's tight-loop probes of the same calls, mixed
the same way at tiny shapes, ran 0.66-0.87x of those prices (host/in_model_mixtures.json). This finds which
statement costs the host more than its price.

Each row: wall time of ``steps`` loop iterations (no synchronisation inside; the GPU runs far ahead of nothing: every
kernel is a few us), per step, median of 5 loops after a warm-up, synchronised after each loop. ``kernels``: device
activities per step (torch.profiler).

    python benchmarks/host/loop_step_host.py --out DIR    # writes DIR/loop_step_host.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.analyze.capture import DynamoBackend, aten_hook  # noqa: E402
from fusion_advisor.analyze.eager_entry import call_eager_entries  # noqa: E402
from fusion_advisor.analyze.profile import HostStamps, insert_stamps  # noqa: E402
from fusion_advisor.devices.host_costs import (add_probe, host_probes, measure_launch_by_class, measure_module_call_us,  # noqa: E402
                                               measure_view_us, per_op_us)
from fusion_advisor.kernel_tools.bench import device_kernels_per_call  # noqa: E402


class Cell(torch.nn.Module):
    """A vanilla RNN over ``x`` (steps, batch, input): per step cat, i2h Linear, Tanh, h2o Linear."""

    def __init__(self, inp: int, hidden: int, out: int):
        super().__init__()
        self.i2h, self.h2o, self.tanh = torch.nn.Linear(inp + hidden, hidden), torch.nn.Linear(hidden, out), torch.nn.Tanh()

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        hidden, outputs = h0, []
        for t in range(x.shape[0]):
            combined = torch.cat((x[t], hidden), dim=1)
            hidden = self.tanh(self.i2h(combined))
            outputs.append(self.h2o(hidden))
        return torch.stack(outputs, dim=0)


def rows(steps: int, batch: int, inp: int, hidden: int, out: int) -> list[dict]:
    dev, f = "cuda", dict(device="cuda", dtype=torch.float32)
    cell = Cell(inp, hidden, out).to(dev)
    x, h0 = torch.rand(steps, batch, inp, **f), torch.rand(batch, hidden, **f)
    comb, h = torch.rand(batch, inp + hidden, **f), torch.rand(batch, hidden, **f)
    xs = [x[t] for t in range(steps)]
    w, b = cell.i2h.weight, cell.i2h.bias
    wt = w.t()

    def loop(body):
        def run():
            for t in range(steps):
                body(t)
        return run

    out_list: list = []
    variants = {
        "module forward (the model)": lambda: cell(x, h0),
        "x[t]": loop(lambda t: x[t]),
        "x[t] then cat": loop(lambda t: torch.cat((x[t], h), dim=1)),
        "cat of ready views": loop(lambda t: torch.cat((xs[t], h), dim=1)),
        "i2h module (split-K addmm)": loop(lambda t: cell.i2h(comb)),
        "F.linear at i2h's shape": loop(lambda t: torch.nn.functional.linear(comb, w, b)),
        "torch.addmm at i2h's shape": loop(lambda t: torch.addmm(b, comb, wt)),
        "tanh module": loop(lambda t: cell.tanh(h)),
        "h2o module": loop(lambda t: cell.h2o(h)),
        "list append": loop(lambda t: out_list.append(t)),
    }

    def graph(stamped: bool):
        stamps = HostStamps()

        def fw(gm, example_inputs, i):
            call_eager_entries(gm, i)
            if stamped:
                insert_stamps(gm, i, stamps)
            return gm.forward

        compiled = DynamoBackend(aten_hook(fw)).compile(cell)
        compiled(x, h0)
        return lambda: compiled(x, h0)

    with torch.no_grad():
        variants["captured aten graph, plain"] = graph(False)
        variants["captured aten graph, stamped (profile's replay)"] = graph(True)
        out = []
        for name, fn in variants.items():
            per_call = per_op_us(dev, fn, 3, 5)
            per_step = per_call / steps
            kernels = device_kernels_per_call(fn, iters=2) / steps
            out.append({"variant": name, "us_per_step": round(per_step, 3), "kernels_per_step": round(kernels, 3)})
            print(f"{name:48} {per_step:8.2f} us/step  {kernels:5.2f} kernels/step", flush=True)
            out_list.clear()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    add = per_op_us("cuda", add_probe("cuda"), 2000, 5)
    module, view = measure_module_call_us("cuda"), measure_view_us("cuda")
    by = measure_launch_by_class("cuda", module, view, add)
    print(f"add {add:.2f} us, module call {module:.2f}, view {view:.2f}; cat {by.get('copy/cat')}, "
          f"addmm {by.get('matmul/addmm')}", flush=True)
    priced = by["copy/cat"] + 2 * by["matmul/addmm"] + add + 3 * module + 3 * view
    print(f"priced step (cat + 2 addmm + tanh + 3 module calls + 3 views): {priced:.2f} us", flush=True)
    probes = host_probes("cuda")
    probe_kernels = {k: device_kernels_per_call(p, iters=3) for k, p in probes.items() if k in ("copy/cat", "matmul/addmm")}
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "add_us": add, "module_us": module, "view_us": view, "by_class": by, "priced_step_us": priced,
           "probe_kernels": probe_kernels,
           "shapes": {"steps": 256, "batch": 8, "input": 1024, "hidden": 256, "output": 128},
           "rows": rows(256, 8, 1024, 256, 128)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loop_step_host.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
