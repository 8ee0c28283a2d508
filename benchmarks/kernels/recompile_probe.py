"""Stack check and recompile probe on a GPU: ``doctor``, then which library kernels recompile when the token
count changes.

1. Runs every ``fusion-advisor doctor`` check (versions, torch/triton pairing, GPU, torch.compile, the Triton copy
   kernel's GB/s against the device spec) and writes ``doctor.json``.
2. Copy-kernel demo: launches :mod:`fusion_advisor.copy_kernel` under a :class:`RecompileWatch` with an aligned
   input, an odd length, an offset view (``x[1:]``) and length 1, so the report shows each specialization cause
   (checks the ``jit_post_compile_hook`` path on the installed Triton).
3. Library probe: for each kernel below, one forward+backward at ``ROWS[0]`` tokens (warm-up: compiles), then one
   per further token count, each under its own watch. A runtime int that Triton specializes (value 1, divisibility
   by 16) shows up as a compile with its argument named; an autotuned kernel keyed on the token count re-tunes.

Writes ``doctor.json``, ``recompile_probe.json`` (GPU, versions, date, setup, per kernel and token count: Triton
compiles, dynamo compiles, causes) and ``recompile_probe.md`` to ``--out``.

    python benchmarks/kernels/recompile_probe.py --out DIR [--kernels rmsnorm,gemm_epilogue]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.kernel_tools.verify import use_triton_interpreter_if_no_gpu  # noqa: E402

use_triton_interpreter_if_no_gpu()  # before any kernel module is imported

from benchmarks.common import tensor_leaves  # noqa: E402
from fusion_advisor.devices.doctor import run_doctor  # noqa: E402
from fusion_advisor.kernel_tools.recompile import RecompileWatch  # noqa: E402

ON_GPU = torch.cuda.is_available()

#: Token counts: the first is the warm-up; then 1 (Triton's constant-1 specialization), 2, 16 and 17
#: (divisibility by 16 gained and lost), 33, and a larger multiple of 16.
ROWS = [2048, 1, 2, 16, 17, 33, 4096] if ON_GPU else [8, 1, 17]

#: kernel module -> inputs for a token count (Llama-7B widths on a GPU, small on the CPU interpreter).
PROBES = {
    "rmsnorm": lambda m, n: m.make_inputs(n, 4096 if ON_GPU else 64, torch.bfloat16 if ON_GPU else torch.float32),
    "swiglu": lambda m, n: m.make_inputs(n, 11008 if ON_GPU else 64, torch.bfloat16 if ON_GPU else torch.float32),
    "softmax": lambda m, n: m.make_inputs(n, 32000 if ON_GPU else 64, "bfloat16" if ON_GPU else "float32"),
    "cross_entropy": lambda m, n: m.make_inputs(n, 32000 if ON_GPU else 64, "bfloat16" if ON_GPU else "float32"),
    "rope": lambda m, n: m.make_inputs(1, n, 32 if ON_GPU else 2, 128 if ON_GPU else 16,
                                       dtype=torch.bfloat16 if ON_GPU else torch.float32),
    "gemm_epilogue": lambda m, n: m.make_inputs(n, 4096 if ON_GPU else 32, 4096 if ON_GPU else 32,
                                                torch.bfloat16 if ON_GPU else torch.float32),
}


def _step(module, args) -> None:
    """Forward, and backward when an output requires grad."""
    out = module.kernel_fn(*args)
    outs = [t for t in tensor_leaves(out) if t.requires_grad]
    if outs:
        sum(t.float().sum() for t in outs).backward()
    if ON_GPU:
        torch.cuda.synchronize()


def copy_demo() -> dict:
    from fusion_advisor.devices import copy_kernel

    device = "cuda" if ON_GPU else "cpu"
    x = torch.randn(1 << 20, device=device)
    copy_kernel.copy(x)  # first variant: aligned, length divisible by 16
    cases = {"odd length": lambda: copy_kernel.copy(x[: (1 << 20) - 1]),
             "offset view x[1:]": lambda: copy_kernel.copy(x[1:]),
             "length 1": lambda: copy_kernel.copy(x[:1])}
    out = {}
    for name, fn in cases.items():
        with RecompileWatch(dynamo=False) as watch:
            fn()
        out[name] = watch.report.to_dict()
    return out


def probe(name: str) -> dict:
    module = importlib.import_module(f"kernel_library.{name}")
    rows: dict[str, dict] = {}
    start = time.perf_counter()
    _step(module, PROBES[name](module, ROWS[0]))  # warm-up: the first variants compile here
    warm_s = time.perf_counter() - start
    for n in ROWS[1:]:
        args = PROBES[name](module, n)
        start = time.perf_counter()
        with RecompileWatch() as watch:
            _step(module, args)
        rows[str(n)] = {**watch.report.to_dict(), "wall_s": round(time.perf_counter() - start, 3)}
    return {"warmup_rows": ROWS[0], "warmup_wall_s": round(warm_s, 3), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kernels", default=",".join(PROBES), help="comma-separated subset of " + ",".join(PROBES))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    import triton

    doctor = run_doctor()
    (a.out / "doctor.json").write_text(json.dumps(doctor.to_dict(), indent=2) + "\n")
    result = {
        "gpu": torch.cuda.get_device_name() if ON_GPU else None,
        "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "setup": f"one forward+backward per token count {ROWS[1:]} after a warm-up at {ROWS[0]}; each under "
                 "RecompileWatch (Triton jit_post_compile_hook, dynamo compilation metrics)",
        "copy_demo": copy_demo(),
        "kernels": {},
    }
    for name in [k for k in a.kernels.split(",") if k]:
        try:
            result["kernels"][name] = probe(name)
        except Exception as e:  # one kernel's failure (API change, OOM) is recorded; the others still run
            result["kernels"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print(name, json.dumps({n: r.get("triton_compiles") for n, r in result["kernels"][name].get("rows", {}).items()}),
              flush=True)
    (a.out / "recompile_probe.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    lines = [f"# Recompile probe: {result['gpu']}, torch {result['torch']}, triton {result['triton']}, {result['date']}",
             "", result["setup"], "", "| kernel | tokens | Triton compiles | dynamo compiles | causes |", "|---|---|---|---|---|"]
    for name, r in result["kernels"].items():
        if "error" in r:
            lines.append(f"| {name} | | | | error: {r['error'].splitlines()[0]} |")
            continue
        for n, w in r["rows"].items():
            causes = "; ".join(sorted({f"{e['name'].rsplit('.', 1)[-1]}: {e['cause']}" for e in w["events"]}))
            lines.append(f"| {name} | {n} | {w['triton_compiles']} | {w['dynamo_compiles']} | {causes[:600]} |")
    (a.out / "recompile_probe.md").write_text("\n".join(lines) + "\n")
    print("doctor exit code", doctor.exit_code, "| wrote", a.out)


if __name__ == "__main__":
    main()
