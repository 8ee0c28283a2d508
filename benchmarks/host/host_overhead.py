"""Host (CPU) time per call of every kernel_library op against eager PyTorch and torch.compile, on tiny inputs.

The kernels' GPU time at Llama-7B shapes is in ``benchmarks/kernels/compare.py``; this measures the other half of a
call in an eager model: the Python, dispatcher and launch work before the GPU sees the kernel. Providers: ``triton``
(the library op as users call it: eager calls with plain tensors skip the dispatcher, ``kernel_library._op``),
``triton_op`` (the same kernels, every call through the registered ``torch.library`` op), ``eager``
(``reference_fn``) and ``compile`` (``torch.compile(reference_fn)``). Each provider runs ``--calls``
times back to back on inputs a few rows high (the GPU finishes each launch before the host issues the next one, so
the loop's wall time per call is the host time): forward under ``torch.no_grad()``, and forward + backward
(``torch.autograd.grad``) where the op has one. The median of ``--repeats`` loops is reported in us per call, with a
cProfile of the library's forward for the first shape of each kernel (where the host time goes).

    python benchmarks/host/host_overhead.py --out DIR [--kernels rmsnorm,cross_entropy] [--calls 200] [--repeats 7]

Writes ``host_overhead.json`` and ``host_overhead.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import json
import platform
import pstats
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import float_outputs, per_call_us, shape_label, tensor_leaves  # noqa: E402
from kernel_library import _op  # noqa: E402
from kernel_library.registry import entry_shapes, load_all  # noqa: E402

#: Tiny sizes replacing the 7B shapes' sizes (the host work is the same; the GPU work must stay below it).
TINY = {"n_rows": 8, "n_tokens": 8, "batch": 1, "seq": 8, "M": 64, "N": 256, "K": 256}


def tiny_shape(shape: dict) -> dict:
    """``shape`` with its row-count and matmul sizes shrunk to :data:`TINY` (widths kept: they pick the kernel)."""
    return {k: TINY.get(k, v) for k, v in shape.items()}


def profile_top(fn, calls: int, n: int = 14, sort: str = "tottime") -> str:
    """cProfile of ``calls`` calls of ``fn``, the ``n`` entries first by ``sort`` (own time by default)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats(sort).print_stats(n)
    return buf.getvalue()


def _call(fn, inputs: list, leaves: list, mode: str):
    """A no-argument callable: ``fn(*inputs)`` under no_grad (``fwd``), or forward + ``autograd.grad`` to
    ``leaves`` with unit output gradients (``fwd+bwd``)."""
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fn(*inputs)
        return call
    grads = [torch.ones_like(o) for o in float_outputs(fn(*inputs))]

    def call():
        outs = float_outputs(fn(*inputs))
        return torch.autograd.grad(outs, leaves, grads[: len(outs)], allow_unused=True)
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kernels", default="", help="comma-separated kernel names (default: all)")
    ap.add_argument("--shapes", type=int, default=2, help="BENCH_SHAPES entries per kernel (default 2)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = {k for k in args.kernels.split(",") if k}
    rows, profiles = [], {}
    for name, entry in sorted(load_all().items()):
        if wanted and name not in wanted:
            continue
        mod = importlib.import_module(entry.module)
        seen = set()
        for shape in entry_shapes(name, mod):
            small = tiny_shape(shape)
            label = shape_label(small)
            if label in seen:
                continue
            seen.add(label)
            if len(seen) > args.shapes:
                break
            inputs = mod.make_inputs(**small)
            leaves = [t for t in tensor_leaves(inputs) if t.is_floating_point() and t.requires_grad]
            torch._dynamo.reset()
            compiled = torch.compile(mod.reference_fn, dynamic=False)
            providers = {"triton": mod.kernel_fn, "triton_op": mod.kernel_fn, "eager": mod.reference_fn,
                         "compile": compiled}
            for mode in (["fwd", "fwd+bwd"] if entry.has_backward and leaves else ["fwd"]):
                row = {"kernel": name, "shape": label, "mode": mode}
                for provider, fn in providers.items():
                    # triton_op: the same kernels with every call through the registered torch.library op
                    _op.DIRECT_EAGER = provider != "triton_op"
                    try:
                        call = _call(fn, inputs, leaves, mode)
                        row[f"{provider}_us"] = per_call_us(call, args.calls, args.repeats)
                    except Exception as e:  # noqa: BLE001 - one provider failing must not stop the run
                        row[f"{provider}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    if provider == "triton" and mode == "fwd" and name not in profiles:
                        profiles[name] = profile_top(call, args.calls)
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "calls": args.calls, "repeats": args.repeats,
    }
    (args.out / "host_overhead.json").write_text(json.dumps({"meta": meta, "rows": rows, "profiles": profiles},
                                                            indent=1))
    lines = [f"Host time per call, us (median of {args.repeats} loops of {args.calls} back-to-back calls on tiny "
             f"inputs; {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}).", "",
             "triton: the library op, eager calls direct (kernel_library._op); triton_op: every call through the "
             "registered torch.library op.", "",
             "| kernel | shape | mode | triton us | triton_op us | eager us | compile us |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['mode']} | {r.get('triton_us', float('nan')):.1f} | "
                     f"{r.get('triton_op_us', float('nan')):.1f} | "
                     f"{r.get('eager_us', float('nan')):.1f} | {r.get('compile_us', float('nan')):.1f} |")
    lines += ["", "## cProfile of each library forward (own time)", ""]
    for k, text in profiles.items():
        lines += [f"### {k}", "", "```", text.strip(), "```", ""]
    (args.out / "host_overhead.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
