"""The Python host time of library ops per call, Triton's launch replaced by a no-op (runs on a CPU).

What the library's own code costs on the host before and after the launch: argument checks, the direct-path test
(``kernel_library._op.direct_call_ok``), the launch configuration, allocations, autograd's Function for
forward+backward. The kernel launch itself is stubbed out (each module's ``launcher`` returns an object whose
``[grid](...)`` does nothing), so the numbers need no GPU and say nothing about Triton's or the driver's share
(``host_overhead.py`` measures the whole call on a GPU). Tiny CPU tensors (4 x 256 fp32); per row: median over
``--repeats`` loops of ``--calls`` back-to-back calls, microseconds per call; ``torch.softmax`` and
``torch.empty`` as yardsticks of this host's speed.

    python benchmarks/host/python_overhead.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels' device checks accept CPU tensors

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import per_call_us  # noqa: E402
import kernel_library._rows as rows  # noqa: E402
import kernel_library.layernorm as layernorm  # noqa: E402
import kernel_library.rmsnorm as rmsnorm  # noqa: E402
import kernel_library.softmax as softmax  # noqa: E402


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_launches() -> None:
    """Every launch of the measured modules does nothing (their ``launcher`` names are rebound)."""
    for module in (softmax, rmsnorm, layernorm, rows):
        module.launcher = lambda kernel: _NoLaunch()


def cases() -> dict:
    x = torch.randn(4, 256)
    xg = torch.randn(4, 256, requires_grad=True)
    w = torch.ones(256, requires_grad=True)
    b = torch.zeros(256, requires_grad=True)
    g = torch.ones(4, 256)
    return {
        "softmax fwd": (False, lambda: softmax.softmax(x)),
        "softmax fwd+bwd": (True, lambda: torch.autograd.grad(softmax.softmax(xg), (xg,), g)),
        "rmsnorm fwd": (False, lambda: rmsnorm.rms_norm(x, w.detach(), 1e-6)),
        "rmsnorm fwd+bwd": (True, lambda: torch.autograd.grad(rmsnorm.rms_norm(xg, w, 1e-6), (xg, w), g)),
        "layernorm fwd": (False, lambda: layernorm.layer_norm(x, w.detach(), b.detach(), 1e-5)),
        "layernorm fwd+bwd": (True, lambda: torch.autograd.grad(layernorm.layer_norm(xg, w, b, 1e-5), (xg, w, b), g)),
        "torch.softmax fwd (yardstick)": (False, lambda: torch.softmax(x, -1)),
        "torch.empty (yardstick)": (False, lambda: torch.empty(x.shape, dtype=x.dtype)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    stub_launches()
    rows_us = {}
    for name, (grad, fn) in cases().items():
        with torch.set_grad_enabled(grad):
            rows_us[name] = per_call_us(fn, args.calls, args.repeats, warmup=200)
        print(f"{name:32s} {rows_us[name]:8.2f} us", flush=True)
    doc = {"meta": {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
                    "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
                    "what": "us per call, Triton launch stubbed out, 4 x 256 fp32 CPU tensors"},
           "us_per_call": rows_us}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
