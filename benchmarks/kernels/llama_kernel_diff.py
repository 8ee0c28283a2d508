"""Which GPU kernels a captured Llama-3-8B-width step runs that the model as written does not, and what they cost.

On the H200 apply's variants of ``benchmarks/kernels/llama3_8b_width_loss.py`` spent 55-58 ms per step in vendor
kernels (cuBLAS, attention) when the step ran through a dynamo capture (``torch.compile``, the captured graph
eagerly, CUDA graphs of it) against 49 ms as written (``benchmarks/results/h200/kernels/llama_advised``). This
script profiles one step of each way of running it and lists the kernels by device time, side by side:

- ``eager``: the model as written;
- ``aot_eager``: ``torch.compile(model, backend="aot_eager")``: dynamo + AOTAutograd, every aten op run eagerly
  (what apply's eager-rest variants run);
- ``inductor``: ``torch.compile(model)``.

Per provider: 3 warm-up steps, then ``torch.profiler`` over 3 steps (``device_time_by_kernel``) (forward, ``backward()``, grads set to None);
kernel time per step by name. Writes ``llama_kernel_diff.json`` (every kernel) and prints the top kernels and the
names whose time differs most between providers.

    python benchmarks/kernels/llama_kernel_diff.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.kernels import llama3_8b_width_loss as llama_file  # noqa: E402
from fusion_advisor.kernel_tools.bench import device_time_by_kernel, kernel_class  # noqa: E402

PROVIDERS = ("eager", "aot_eager", "inductor")
WARMUP, PROFILED = 3, 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="the model file's quick widths")
    args = ap.parse_args()
    if args.quick:
        os.environ["FUSION_ADVISOR_QUICK_LLAMA"] = "1"
    args.out.mkdir(parents=True, exist_ok=True)
    device = "cuda"
    model = llama_file.get_model().to(device)
    ids, labels = (t.to(device) for t in llama_file.get_inputs())
    params = [p for p in model.parameters() if p.requires_grad]
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "sdp": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                            "cudnn": torch.backends.cuda.cudnn_sdp_enabled()},
                    "providers": {}}
    for name in PROVIDERS:
        torch._dynamo.reset()
        fn = model if name == "eager" else torch.compile(model, backend=name)

        def step(fn=fn):
            fn(ids, labels).backward()
            for p in params:
                p.grad = None

        for _ in range(WARMUP):
            step()
        by_name = device_time_by_kernel(step, iters=PROFILED)
        total = sum(by_name.values())
        by_class: dict[str, float] = {}
        for k, v in by_name.items():
            by_class[kernel_class(k)] = by_class.get(kernel_class(k), 0.0) + v
        result["providers"][name] = {"device_ms": total, "by_class": by_class, "kernels": by_name}
        print(f"{name}: {total:.2f} ms device per step; by class " +
              ", ".join(f"{c} {v:.2f}" for c, v in sorted(by_class.items(), key=lambda kv: -kv[1])))
        for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]:
            print(f"   {v:8.3f} ms  [{kernel_class(k)}] {k[:150]}")
    (args.out / "llama_kernel_diff.json").write_text(json.dumps(result, indent=1))
    names = set().union(*(p["kernels"] for p in result["providers"].values()))
    rows = sorted(names, key=lambda n: -max(abs(result["providers"][a]["kernels"].get(n, 0.0) -
                                                result["providers"]["eager"]["kernels"].get(n, 0.0))
                                            for a in PROVIDERS))
    print("largest differences from eager (ms per step: " + " / ".join(PROVIDERS) + "):")
    for n in rows[:25]:
        vals = " / ".join(f"{result['providers'][a]['kernels'].get(n, 0.0):7.3f}" for a in PROVIDERS)
        print(f"   {vals}  [{kernel_class(n)}] {n[:140]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
