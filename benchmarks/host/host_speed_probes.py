"""Which probe reads the host speed a model's eager Python runs at? In each of N fresh processes: the plain eager
wall time of each model, the launch's add loop (the profile's dispatch probe) and a model-like loop (a module
calling a child module whose forward runs a Linear, a cat and a tanh on tiny tensors), interleaved in rounds.

Why: the seed-1 accuracy set, profiled on one H200 host, ran VanillaRNNHidden at 28.0 ms with the add at 9.0 us;
fresh CLI runs on another host ran it at 14.2-14.4 ms with the add at 7.5-10.6 us, and one forked run at 23.7 ms
with 11.45 us (benchmarks/results/h200/host/fork_vs_fresh.json): the add did not follow the model. A probe whose
ratio to the model holds across processes is one the analysis could scale host prices by.

    python benchmarks/host/host_speed_probes.py --out DIR --processes 8 FILE.py...   # DIR/host_speed_probes.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _child(files: list[str], rounds: int, dev: str) -> dict:
    import torch

    from fusion_advisor.devices.host_costs import add_probe, per_op_us
    from fusion_advisor.kernel_tools.bench import sync_device

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 16)

        def forward(self, x, h):
            return torch.tanh(self.lin(torch.cat([x, h], 1)))

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.step = Step()

        def forward(self, x, h):
            return self.step(x, h)

    outer = Outer().to(dev)
    x, h = torch.randn(4, 16, device=dev), torch.randn(4, 16, device=dev)
    like = lambda: outer(x, h)  # noqa: E731
    add = add_probe(dev)
    models = []
    for f in files:
        spec = importlib.util.spec_from_file_location(Path(f).stem, f)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        m = mod.Model(*mod.get_init_inputs()).to(dev).eval()
        inputs = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in mod.get_inputs()]
        models.append((Path(f).stem, m, inputs))
    out = {"add_us": [], "model_like_us": [], **{name: [] for name, _, _ in models}}
    with torch.no_grad():
        for _, m, inputs in models:
            for _ in range(3):
                m(*inputs)
        sync_device(dev)
        for _ in range(rounds):
            out["add_us"].append(per_op_us(dev, add, 2000, 1))
            out["model_like_us"].append(per_op_us(dev, like, 1000, 1))
            for name, m, inputs in models:
                times = []
                for _ in range(3):
                    sync_device(dev)
                    t0 = time.perf_counter()
                    m(*inputs)
                    sync_device(dev)
                    times.append((time.perf_counter() - t0) * 1e6)
                out[name].append(statistics.median(times))
    return {k: round(statistics.median(v), 2) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.files, args.rounds, args.device)))
        return
    rows = []
    for i in range(args.processes):
        p = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--device",
                            args.device, *args.files], capture_output=True, text=True, cwd=ROOT)
        row = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-400:]}
        rows.append(row)
        print(i, row, flush=True)
    import torch

    summary = {}
    ok = [r for r in rows if "error" not in r]
    for name in (k for k in (ok[0] if ok else {}) if k not in ("add_us", "model_like_us")):
        for probe in ("add_us", "model_like_us"):
            ratios = [r[name] / r[probe] for r in ok]
            summary[f"{name} / {probe}"] = {"median": round(statistics.median(ratios), 1),
                                            "spread max/min": round(max(ratios) / min(ratios), 3)}
        walls = [r[name] for r in ok]
        summary[f"{name} wall us"] = {"median": round(statistics.median(walls), 1),
                                      "spread max/min": round(max(walls) / min(walls), 3)}
    print(json.dumps(summary, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_speed_probes.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "torch": torch.__version__,
         "date": datetime.date.today().isoformat(),
         "what": __doc__.split("\n\n")[0], "files": args.files, "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
