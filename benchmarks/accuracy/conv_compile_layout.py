"""Where torch.compile's speed on a convolution model comes from: eager, torch.compile as shipped, and
torch.compile with Inductor's layout optimisation off (no channels-last conversion), each a do_bench median in one
process, per KernelBench file given. The roofline prices the compiled convolution as eager less its peeled bias
pass (fusion_advisor.analyze.roofline._peeled_bias_change_us); what remains between that and the measured compile
time is the channels-last layout and Inductor's other choices.

    python benchmarks/accuracy/conv_compile_layout.py --out DIR FILE.py [FILE.py ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("files", type=Path, nargs="+")
    args = ap.parse_args()
    from triton.testing import do_bench
    import torch._inductor.config as inductor_config

    from fusion_advisor.analyze.load import load_model

    rows = []
    for f in args.files:
        loaded = load_model(f, device="cuda")  # the file's model in eval mode and its inputs, as analyze loads them
        model, inputs = loaded.module, loaded.inputs
        row = {"file": f.stem}
        with torch.no_grad():
            row["eager_ms"] = do_bench(lambda m=model, xs=inputs: m(*xs), warmup=50, rep=300)
            for name, layout in (("compile_ms", True), ("compile_no_layout_opt_ms", False)):
                torch._dynamo.reset()
                inductor_config.layout_optimization = layout
                compiled = torch.compile(model)
                compiled(*inputs)
                row[name] = do_bench(lambda c=compiled, xs=inputs: c(*xs), warmup=50, rep=300)
            inductor_config.layout_optimization = True
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conv_compile_layout.json").write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
