"""Host time of the autograd engine's backward on a GPU: a C++ node vs a Python ``autograd.Function`` node, with the
engine's per-device worker threads on (default) and off (``torch.autograd.set_multithreading_enabled(False)``: the
backward runs on the calling thread).

Why: on the H200 host a library op's forward + backward took 340-870 us of host time against 55-125 us for its
forward alone (``benchmarks/results/h200/host/host_overhead.md``); this separates the engine's cost of a Python node
from the op's own backward work (the backward op called directly, no engine).

    python benchmarks/host/autograd_probe.py --out DIR

Writes ``autograd_probe.json``: host us per call (median of loops of back-to-back calls on 8 x 4096 bf16), and
cProfiles of the library LayerNorm's forward + backward run on the calling thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.host.host_overhead import per_call_us, profile_top  # noqa: E402
from kernel_library import layernorm  # noqa: E402


class _Double(torch.autograd.Function):
    """y = 2 x with a Python backward (one aten op each way)."""

    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _triton_copy(g: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(g)
    _copy_kernel[(triton.cdiv(g.numel(), 1024),)](g, out, g.numel(), BLOCK=1024)
    return out


def _function_with_launches(n_launches: int, n_allocs: int = 0) -> type[torch.autograd.Function]:
    """y = 2 x whose Python backward makes ``n_allocs`` torch.empty allocations and ``n_launches`` Triton launches
    (a copy each) before returning 2 g."""

    def backward(ctx, g):
        for _ in range(n_allocs):
            torch.empty_like(g)
        for _ in range(n_launches):
            g = _triton_copy(g)
        return g * 2

    return type(f"Launches{n_launches}", (torch.autograd.Function,),
                {"forward": staticmethod(lambda ctx, x: x * 2), "backward": staticmethod(backward)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfiles")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.ones_like(x)

    def grad_of(f, leaves):
        return lambda: torch.autograd.grad(f(), leaves, g)

    cases = {
        "eager_mul_fwd": lambda: x * 2,
        "eager_mul_fwd_bwd": grad_of(lambda: x * 2, [x]),
        "function_mul_fwd": lambda: _Double.apply(x),
        "function_mul_fwd_bwd": grad_of(lambda: _Double.apply(x), [x]),
        **{f"function_{k}_triton_launches_fwd_bwd": grad_of(lambda f=_function_with_launches(k): f.apply(x), [x])
           for k in (1, 2, 4)},
        "function_4_allocations_fwd_bwd": grad_of(lambda f=_function_with_launches(0, 4): f.apply(x), [x]),
        "eager_layer_norm_fwd_bwd": grad_of(lambda: torch.nn.functional.layer_norm(x, (4096,), w, b), [x, w, b]),
        "library_layer_norm_fwd": lambda: layernorm.layer_norm(x, w, b),
        "library_layer_norm_fwd_bwd": grad_of(lambda: layernorm.layer_norm(x, w, b), [x, w, b]),
        "library_layer_norm_backward_op": lambda: layernorm._layer_norm_backward_op(g, x.detach(), w.detach(),
                                                                                    b.detach(), 1e-5),
    }
    rows = {}
    for threads in (True, False):
        torch.autograd.set_multithreading_enabled(threads)
        for name, fn in cases.items():
            key = f"{name}{'' if threads else '_no_worker_threads'}"
            rows[key] = per_call_us(fn, args.calls, 7)
            print(f"{key}: {rows[key]:.1f} us", flush=True)
    # the whole fwd+bwd on the calling thread, so that cProfile sees the backward too
    profiles = {}
    with torch.autograd.set_multithreading_enabled(False):
        for sort in () if args.no_profile else ("tottime", "cumulative"):
            profiles[sort] = profile_top(cases["library_layer_norm_fwd_bwd"], args.calls, n=35, sort=sort)
            print(profiles[sort], flush=True)
    torch.autograd.set_multithreading_enabled(True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": sys.version.split()[0]}
    (args.out / "autograd_probe.json").write_text(json.dumps({"meta": meta, "host_us_per_call": rows,
                                                               "cprofile_library_layer_norm_fwd_bwd": profiles},
                                                              indent=1))


if __name__ == "__main__":
    main()
