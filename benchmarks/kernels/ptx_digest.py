"""Digest of the PTX every library kernel compiles to, on a machine without a GPU: a refactor that leaves the
digests unchanged leaves the compiled code, and so every GPU time measured on it, unchanged.

How: Triton compiles to PTX without a GPU (``ptxas`` ships with it), given a target. This script makes a stand-in
for Triton's CUDA driver that names the target (``--arch``, default sm_90: the H200) and never launches, makes every
``JITFunction.run`` a warm-up (compile only, no launch) and every autotune "benchmark" a compile of the config, then
calls each kernel module's contract (``kernel_fn(*args)``, and its backward where the inputs require grad) on the
inputs of ``get_inputs()`` (each of ``SIZES``), ``hard_inputs()`` and ``make_inputs(**shape)`` of each
``BENCH_SHAPES`` entry with its row-like and GEMM dimensions cut small (:func:`small`; row widths and vocabularies
kept, so the looped wide-row kernels compile too), all in CPU tensors. The outputs are garbage (nothing
ran); only the compiled code is read. Each jit function gets the sorted SHA-1 prefixes of the distinct PTX it compiled
to (one per specialization: dtype, constexprs, alignment), so a before/after ``--compare`` shows which functions'
code changed, which stayed, and which no input reached.

Triton's version decides the PTX: compare digests made with the same Triton (this machine's, not the H200's 3.6).

Usage (from the repository root, no GPU needed)::

    python benchmarks/kernels/ptx_digest.py --out before.json
    # ... refactor ...
    python benchmarks/kernels/ptx_digest.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import sys
import warnings
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # real JIT functions, before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class CompileOnlyDriver:
    """Triton's driver interface, as far as compiling needs it: a target, device 0, stream 0, and a "benchmarker"
    that runs the call once (a compile) and reports 1 ms, so autotuning compiles every config and keeps the first."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):
        def bench(fn, quantiles=None, **_):
            fn()
            return [1.0] * len(quantiles) if quantiles else 1.0

        return bench

    def get_empty_cache_for_benchmark(self):
        return torch.empty(0)

    def clear_cache(self, cache):
        pass


def code_of(ptx: str) -> str:
    """The PTX without its debug information (``.loc`` / ``.file`` lines, the ``$L__tmp`` labels that mark where an
    inlined helper's lines begin and end, and the ``.debug_*`` sections), which records source lines and helpers:
    a moved line or a helper function must not read as changed code."""
    keep = []
    for line in ptx.splitlines():
        stripped = line.strip()
        if stripped.startswith(".section") and ".debug" in stripped:
            break  # the debug sections close the file
        if not stripped.startswith((".loc", ".file", "$L__tmp")):
            keep.append(line)
    return "\n".join(keep)


def install(arch: int) -> dict[str, set[str]]:
    """Make Triton compile-only for ``sm_<arch>`` and the kernel checks accept CPU tensors; return the digest map
    the runs fill: jit function ``module:qualname`` -> PTX SHA-1 prefixes."""
    driver.set_active(CompileOnlyDriver(arch))
    seen: dict[str, set[str]] = {}
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None:
            digest = hashlib.sha1(code_of(kernel.asm["ptx"]).encode()).hexdigest()[:12]
            seen.setdefault(f"{self.fn.__module__}:{self.fn.__qualname__}", set()).add(digest)
        return kernel

    JITFunction.run = compile_only
    import kernel_library._checks as checks
    import kernel_library._device as device

    device.interpreted = checks.interpreted = lambda: True  # CPU tensors pass the launchers' device checks
    return seen


#: BENCH_SHAPES keys cut by :func:`small`: rows, tokens, batch and heads, and every GEMM dimension.
CUT = ("n_rows", "n_tokens", "batch", "seq", "n_heads", "M", "N", "K", "B", "H", "hidden")


def small(n: int) -> int:
    """A small stand-in for a dimension of ``n`` that Triton specializes the same way (1 stays 1; divisible by 16
    or not, as ``n`` is): ``n`` up to 64, else 16 plus ``n``'s remainder mod 16."""
    return n if n <= 64 else 16 + n % 16


def _calls(mod) -> list[tuple[str, list]]:
    calls = []
    sizes = getattr(mod, "SIZES", None)
    takes_size = len(inspect.signature(mod.get_inputs).parameters) > 0
    for size in (sizes if sizes and takes_size else [None]):
        calls.append((f"get_inputs({size})", mod.get_inputs(size) if size is not None else mod.get_inputs()))
    hard = getattr(mod, "hard_inputs", None)
    if callable(hard):
        calls += [(f"hard_inputs: {name}", args) for name, args in hard()]
    for shape in getattr(mod, "BENCH_SHAPES", []):
        cut = {k: (small(v) if k in CUT else v) for k, v in shape.items()}
        if "shape" in cut:
            cut["shape"] = (*(small(d) for d in cut["shape"][:-1]), cut["shape"][-1])
        calls.append((f"BENCH_SHAPES {cut}", mod.make_inputs(**cut)))
    return calls


def _run(mod, args: list) -> None:
    out = mod.kernel_fn(*args)
    outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    ins = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
    if outs and ins:
        torch.autograd.grad(outs, ins, [torch.ones_like(t) for t in outs], allow_unused=True)


def digest(arch: int) -> dict:
    seen = install(arch)
    from kernel_library.registry import load_all

    modules = sorted({e.module for e in load_all().values()})
    problems = []
    for name in modules:
        mod = sys.modules[name]
        for label, args in _calls(mod):
            try:
                _run(mod, args)
            except Exception as e:  # noqa: BLE001 - reported, the other calls go on
                problems.append(f"{name} {label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return {"triton": triton.__version__, "torch": torch.__version__, "arch": f"sm_{arch}",
            "kernels": {k: sorted(v) for k, v in sorted(seen.items())}, "problems": problems}


def compare(now: dict, before: dict) -> list[str]:
    """Lines naming each jit function whose PTX changed, appeared or was not reached."""
    if (now["triton"], now["arch"]) != (before["triton"], before["arch"]):
        return [f"not comparable: Triton {before['triton']} {before['arch']} vs {now['triton']} {now['arch']}"]
    lines = []
    for k in sorted(set(now["kernels"]) | set(before["kernels"])):
        a, b = before["kernels"].get(k), now["kernels"].get(k)
        if a != b:
            lines.append(f"{k}: {a} -> {b}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--compare", type=Path, help="an earlier digest: list what changed")
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (90: H100/H200)")
    opts = ap.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = digest(opts.arch)
    opts.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result['kernels'])} jit functions compiled for {result['arch']} with Triton {result['triton']}; "
          f"{len(result['problems'])} calls failed")
    for p in result["problems"]:
        print("  failed:", p)
    if opts.compare:
        changed = compare(result, json.loads(opts.compare.read_text()))
        print("\n".join(changed) if changed else f"PTX unchanged against {opts.compare}")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
