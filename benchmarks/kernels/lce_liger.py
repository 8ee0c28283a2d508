"""Issue 16 on one GPU, in one process: kernel_library against eager PyTorch, torch.compile and Liger-Kernel, and a
Llama-3-8B-width training step.

Part ``kernels`` (bf16 on a GPU). Chains, each written as transformers writes it (the kernel's registered
``pattern``) and swapped for ours as ``apply`` swaps it (the registered ``replacement``):

- softmax forward, 8192 x 32000 and 4096 x 128256: ``softmax(x, -1, dtype=float32).to(x.dtype)``;
- cross-entropy forward+backward, 4096 x 128256 and 4096 x 32000: ``F.cross_entropy(logits.float(), t)``
  (5% of the targets -100, mean);
- RMSNorm forward+backward, 8192 x 4096: transformers' ``LlamaRMSNorm.forward``;
- LayerNorm forward+backward, 8192 x 4096: ``F.layer_norm`` with weight and bias;
- fused linear + cross-entropy forward+backward, (tokens, hidden, vocab) = (4096, 4096, 128256) and
  (4096, 4096, 32000): ``F.cross_entropy(F.linear(x, W).float(), t)`` (gradients to x and W).

Providers: ``eager`` (the pattern), ``compile`` (``torch.compile(pattern, dynamic=False)``, Inductor), ``liger``
(Liger-Kernel's functional API, which calls its autograd Functions directly:
``liger_kernel.transformers.functional.liger_softmax / liger_cross_entropy / liger_rms_norm`` (its ``LigerRMSNorm``
defaults: llama casting, ``in_place=True``) ``/ liger_layer_norm / liger_fused_linear_cross_entropy`` (its
defaults: ``accum_dtype=None``, as the Llama patch calls it)) and ``ours`` (the replacement:
``kernel_library.softmax / cross_entropy (loss_dtype=float32) / rmsnorm / layernorm /
linear_cross_entropy (loss_dtype=float32)``). For each chain and provider, in this order:

1. **verify**: the provider's outputs and, for forward+backward, its gradients to every floating input are judged
   against a float64 run of the module's ``reference_fn`` on float64 copies of the same inputs, by the error
   policy of ``fusion_advisor.verification.policy.judge`` (norm-wise and max-wise error relative to the tensor's
   scale, each within K x the eager provider's own error + a dtype floor); the errors (norm-wise, max-wise, max
   abs, max rel) are recorded per tensor. Upstream gradients: 1 for a scalar loss, a fixed N(0, 1) draw for a
   tensor. Every provider is timed whether or not it passes; the row says which. The first call (Inductor
   compilation, Triton JIT) is timed apart as ``first_call_s``.
2. **peak memory** (forward+backward rows): ``torch.cuda.max_memory_allocated`` during one call minus what was
   allocated just before it, so the inputs (and anything else alive) are excluded; the returned gradients count.
3. **wall**: ``triton.testing.do_bench`` median (warmup 25 ms, rep 100 ms; it clears L2 by writing 256 MB before
   every repetition) of the whole call: the forward under ``torch.no_grad()``, or the forward and
   ``torch.autograd.grad`` of the outputs to the inputs (what ``.backward()`` on fresh leaves computes, with
   nothing accumulating into ``.grad`` between repetitions). Host time shows up here whenever the host is slower
   than the GPU.
4. **device** (``graph_ms``): the same call captured in one ``torch.cuda.CUDAGraph`` (three warm-up calls on a
   side stream first, as the PyTorch CUDA-graph docs prescribe) and its replays timed with the same ``do_bench``:
   GPU time with the host's Python, autograd and launch work removed. A call that synchronises the host (found by
   running it once under ``torch.cuda.set_sync_debug_mode("error")``; Liger's cross-entropies call ``.item()``)
   cannot be captured: the row records why instead.

GB/s (and % of the device-to-device copy bandwidth measured in the same run) use each module's bytes-moved
formula; the fused linear cross-entropy reports TFLOP/s from its FLOP formula (6 N H V for forward+backward).

**Host time per call** (``host`` table): the same chains on tiny inputs (4 rows x 256; linear cross-entropy 4 x 256
x 256) where the GPU work is negligible: wall time of ``--host-calls`` back-to-back calls without synchronising,
divided by the number of calls, the median of ``--host-repeats`` such loops (synchronised between loops; the
providers' loops interleaved round by round, ``benchmarks.common.interleaved_per_call_us``), for the
forward (``torch.no_grad()``) and forward+backward (``torch.autograd.grad``, unit upstream gradients). Providers:
eager, liger (as above), ``liger-dispatch`` (``liger_kernel.functional.*``, the implementation dispatcher that
``LigerLayerNorm`` goes through) and ours. Liger's cross-entropies synchronise (``.item()``) inside each call, so
their host time includes waiting for the (tiny) GPU work.

Part ``llama``: ``transformers.LlamaForCausalLM`` from a ``LlamaConfig`` at Llama-3-8B widths (hidden 4096, 4
layers, 32 heads over 8 key/value heads, intermediate 14336, vocabulary 128256, untied LM head, ``sdpa``
attention, ``use_cache=False``, train mode), bf16 weights from one seeded initialisation (built once; every
provider loads the same state dict into a fresh model), batch 2 x 2048 tokens, ``labels = input_ids``; one step is
the forward, ``.loss.backward()`` and ``zero_grad(set_to_none=True)``. Providers: ``eager``; ``compile``
(``torch.compile(model)``); ``ours-lce`` (the decoder as written, then the LM head and loss as one
``kernel_library.linear_cross_entropy.linear_cross_entropy(hidden, lm_head.weight, shift_labels,
loss_dtype=float32)``, with ``shift_labels`` built exactly as transformers 5.17's ``ForCausalLMLoss`` builds them:
labels padded on the right with -100, then ``[..., 1:]``); ``ours-lce+compile`` (that model under
``torch.compile``); ``advised`` (``fusion_advisor.load_plan(WithLoss(model), --plan)``, only with ``--plan``, and
``advised:NAME`` for each ``--plan-variant NAME``, another variant apply found correct; the
plan made by ``fusion-advisor apply benchmarks/kernels/llama3_8b_width_loss.py --verify --backward``, the model
file this part takes its config and ``WithLoss`` from); ``liger`` (``apply_liger_kernel_to_llama(rope=True,
cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True, model=model)``; run last, and the
module-level names it patches in ``modeling_llama`` are restored afterwards). Per provider: the first step's time
(compilation included) apart, 3 warm-up steps in all, then the median of 10 steps, each timed by wall clock between
``torch.cuda.synchronize()`` calls; peak memory = ``max_memory_allocated`` and ``max_memory_reserved`` over the timed
steps after ``reset_peak_memory_stats`` (weights and gradients included; the reserved peak holds CUDA graphs' pools,
which the allocated one does not), judged on the larger of the two ratios to compile's; the loss of the first step and its difference from
eager's. The issue's targets are computed: the advised step (and, for reference, ours-lce / ours-lce+compile) at
least 1.05x faster than ``compile`` with peak memory at most 0.7x of ``compile``'s.

Every chain, provider, table and part is wrapped: a failure (Liger missing, out of memory) is recorded as an error
string and the rest still runs. ``--quick`` shrinks every shape (kernels 64 x 512, llama 2 layers of hidden 64) for
a smoke test; without CUDA (``TRITON_INTERPRET=1`` on a CPU) it runs in fp32, times with ``time.perf_counter``,
compiles with the ``aot_eager`` backend (unless ``--compile-backend`` says otherwise) and skips CUDA graphs and
peak memory.

    python benchmarks/kernels/lce_liger.py --out DIR [--parts kernels,llama] [--plan PATH] [--quick]

Writes ``lce_liger.json`` (``meta`` plus one block per part; rewritten after every chain and provider) and
``lce_liger.md`` (one table per part) to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import (copy_bandwidth_gbps, float_outputs, interleaved_per_call_us,  # noqa: E402
                               tensor_leaves)
from benchmarks.kernels import llama3_8b_width_loss as llama_file  # noqa: E402
from fusion_advisor.verification.policy import judge  # noqa: E402
from kernel_library import _device  # noqa: E402

DEVICE = _device.default_device()
ON_CUDA = DEVICE.type == "cuda"
GiB, MiB = float(1 << 30), float(1 << 20)

# --- shapes ---------------------------------------------------------------------------------------------------

#: Benchmark shapes per op: (rows, cols) or, for linear_cross_entropy, (tokens, hidden, vocab).
SHAPES = {
    "softmax": [(8192, 32000), (4096, 128256)],
    "cross_entropy": [(4096, 128256), (4096, 32000)],
    "rmsnorm": [(8192, 4096)],
    "layernorm": [(8192, 4096)],
    "linear_cross_entropy": [(4096, 4096, 128256), (4096, 4096, 32000)],
}
QUICK_SHAPES = {"softmax": [(64, 512)], "cross_entropy": [(64, 512)], "rmsnorm": [(64, 256)],
                "layernorm": [(64, 256)], "linear_cross_entropy": [(64, 64, 512)]}
#: Tiny shapes for host time per call: the GPU work is a few microseconds, far below the host's.
HOST_SHAPES = {"softmax": (4, 256), "cross_entropy": (4, 256), "rmsnorm": (4, 256), "layernorm": (4, 256),
               "linear_cross_entropy": (4, 256, 256)}

LLAMA, QUICK_LLAMA = llama_file.FULL, llama_file.QUICK  # the widths of the model file apply makes the plan on

KERNEL_PROVIDERS = ("eager", "compile", "liger", "ours")
HOST_PROVIDERS = ("eager", "liger", "liger-dispatch", "ours")
LLAMA_PROVIDERS = ("eager", "compile", "ours-lce", "ours-lce+compile", "advised", "liger")


# --- small helpers --------------------------------------------------------------------------------------------

class Log:
    """Progress lines to stdout (flushed) and to ``lce_liger.log``."""

    def __init__(self, path: Path):
        self.file = open(path, "w")

    def __call__(self, msg: str) -> None:
        print(msg, flush=True)
        self.file.write(msg + "\n")
        self.file.flush()


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:400]}"


def sync() -> None:
    if ON_CUDA:
        torch.cuda.synchronize()


def free_memory() -> None:
    gc.collect()
    if ON_CUDA:
        torch.cuda.empty_cache()


def loss_of(out: Any) -> torch.Tensor:
    """The loss in what a model or a Liger function returns: a tensor, ``.loss``, ``["loss"]`` or element 0."""
    if isinstance(out, torch.Tensor):
        return out
    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, dict):
        return out["loss"]
    return out[0]


def wall_ms(fn: Callable[[], Any], quick: bool) -> float:
    """``do_bench`` median on a GPU (L2 cleared before each repetition); ``perf_counter`` median elsewhere."""
    if ON_CUDA:
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    times = []
    for _ in range(2 if quick else 5):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def first_call_s(fn: Callable[[], Any]) -> tuple[Any, float]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def synchronises(call: Callable[[], Any]) -> str:
    """``""``, or why ``call`` cannot be captured: it synchronises the host (under sync debug mode "error")."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        return ""
    except RuntimeError as e:
        return f"the call synchronises the host, which a CUDA graph cannot hold ({error_text(e)})"
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def graph_replay_ms(call: Callable[[], Any], quick: bool) -> tuple[float | None, str]:
    """``(ms, "")``: ``do_bench`` median of replays of ``call`` captured in one CUDA graph (warmed up on a side
    stream first), or ``(None, why not)``."""
    if not ON_CUDA:
        return None, "no CUDA device"
    why = synchronises(call)
    if why:
        return None, why
    graph, static = None, None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = call()
        return wall_ms(graph.replay, quick), ""
    except Exception as e:  # noqa: BLE001 - a capture that fails is a result, not a crash
        try:
            torch.cuda.synchronize()
        except Exception as e2:  # noqa: BLE001
            return None, f"capture failed: {error_text(e)}; the device then reported {error_text(e2)}"
        return None, f"capture failed: {error_text(e)}"
    finally:
        del graph, static
        free_memory()


def peak_extra_bytes(call: Callable[[], Any]) -> int | None:
    """Most bytes allocated during one ``call`` beyond what was allocated before it (GPU only)."""
    if not ON_CUDA:
        return None
    free_memory()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def cell(text: str, width: int = 160) -> str:
    """``text`` fit for one markdown table cell: one line, no pipes, at most ``width`` characters."""
    return " ".join(str(text).split())[:width].replace("|", "/")


# --- Liger ----------------------------------------------------------------------------------------------------

@dataclass
class Liger:
    """Liger-Kernel's functional modules, or why they are missing."""

    functional: Any = None  # liger_kernel.transformers.functional
    dispatch: Any = None  # liger_kernel.functional
    version: str | None = None
    error: str = ""


def load_liger() -> Liger:
    lg = Liger()
    try:
        lg.version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        pass
    try:
        lg.functional = importlib.import_module("liger_kernel.transformers.functional")
    except Exception as e:  # noqa: BLE001 - Liger missing or broken: every liger row records this
        lg.error = f"liger_kernel does not import: {error_text(e)}"
        return lg
    try:
        lg.dispatch = importlib.import_module("liger_kernel.functional")
    except Exception as e:  # noqa: BLE001
        lg.error = f"liger_kernel.functional does not import: {error_text(e)}"
    return lg


# --- the chains -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One chain: the kernel_library module, how to make its inputs (the pattern's arguments), Liger's two ways."""

    module: str  # kernel_library module; its ENTRY's pattern is eager, its replacement ours
    title: str
    backward: bool  # the benchmark row is forward+backward
    arg_names: tuple[str, ...]
    make: Callable[[tuple, torch.dtype, bool], list]  # (shape, dtype, requires_grad) -> the pattern's arguments
    liger: Callable[[Any], Callable]  # liger_kernel.transformers.functional -> fn(*args)
    liger_dispatch: Callable[[Any], Callable]  # liger_kernel.functional -> fn(*args)
    flops_bound: bool = False  # report TFLOP/s (the module's flops) instead of GB/s

    @property
    def mod(self):
        return importlib.import_module(f"kernel_library.{self.module}")

    def label(self, shape: tuple) -> str:
        return " x ".join(str(s) for s in shape)


def _softmax_inputs(shape, dtype, grad):
    from kernel_library import softmax

    return softmax.make_inputs(n_rows=shape[0], n_cols=shape[1], dtype=dtype, requires_grad=grad)[:1]


def _ce_inputs(shape, dtype, grad):
    from kernel_library import cross_entropy

    return cross_entropy.make_inputs(n_tokens=shape[0], vocab=shape[1], dtype=dtype, requires_grad=grad)[:2]


def _rms_inputs(shape, dtype, grad):
    from kernel_library import rmsnorm

    return rmsnorm.make_inputs(shape[0], shape[1], dtype, requires_grad=grad)[:3]


def _ln_inputs(shape, dtype, grad):
    from kernel_library import layernorm

    return layernorm.make_inputs(shape[0], shape[1], dtype, requires_grad=grad)[:4]


def _lce_inputs(shape, dtype, grad):
    from kernel_library import linear_cross_entropy

    return linear_cross_entropy.make_inputs(n_tokens=shape[0], hidden=shape[1], vocab=shape[2], dtype=dtype,
                                            requires_grad=grad)[:3]


OPS = [
    Op("softmax", "softmax fwd", False, ("x",), _softmax_inputs,
       lambda lf: lambda x: lf.liger_softmax(x),
       lambda ld: lambda x: ld.softmax(x)),
    Op("cross_entropy", "cross-entropy fwd+bwd", True, ("logits", "target"), _ce_inputs,
       lambda lf: lambda logits, t: lf.liger_cross_entropy(logits, t),
       lambda ld: lambda logits, t: loss_of(ld.cross_entropy(logits, t))),
    Op("rmsnorm", "RMSNorm fwd+bwd", True, ("x", "weight", "eps"), _rms_inputs,
       lambda lf: lambda x, w, eps: lf.liger_rms_norm(x, w, eps),
       lambda ld: lambda x, w, eps: ld.rms_norm(x, w, eps)),
    Op("layernorm", "LayerNorm fwd+bwd", True, ("x", "weight", "bias", "eps"), _ln_inputs,
       lambda lf: lambda x, w, b, eps: lf.liger_layer_norm(x, w, b, eps),
       lambda ld: lambda x, w, b, eps: ld.layer_norm(x, w, b, eps)),
    Op("linear_cross_entropy", "linear+cross-entropy fwd+bwd", True, ("x", "weight", "target"), _lce_inputs,
       lambda lf: lambda x, w, t: lf.liger_fused_linear_cross_entropy(x, w, t),
       lambda ld: lambda x, w, t: loss_of(ld.fused_linear_cross_entropy(x, w, t)), flops_bound=True),
]


def provider_fn(op: Op, provider: str, liger: Liger, backend: str) -> Callable:
    """The callable ``provider`` runs for ``op`` (raises when Liger is missing)."""
    entry = op.mod.ENTRY
    if provider == "eager":
        return entry.pattern
    if provider == "ours":
        return entry.replacement
    if provider == "compile":
        torch._dynamo.reset()
        return torch.compile(entry.pattern, dynamic=False, backend=backend)
    if provider in ("liger", "liger-dispatch"):
        lib = liger.functional if provider == "liger" else liger.dispatch
        if lib is None:
            raise RuntimeError(liger.error or "liger_kernel is not installed")
        return op.liger(lib) if provider == "liger" else op.liger_dispatch(lib)
    raise ValueError(provider)


def fresh(args: list, dtype: torch.dtype | None = None) -> list:
    """New leaf copies of the tensor arguments (``dtype`` for floating ones), requires_grad as the originals."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            t = a.detach().to(dtype=dtype if (dtype and a.is_floating_point()) else a.dtype, copy=True)
            out.append(t.requires_grad_(a.requires_grad))
        else:
            out.append(a)
    return out


def grad_leaves(args: list) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point() and a.requires_grad]


class UpstreamGrads:
    """The gradients fed to every provider's outputs: 1 for a 0-d output, a fixed N(0, 1) draw otherwise
    (drawn on the CPU, seeded per output index, so every provider and the float64 run get the same values)."""

    def __init__(self):
        self.cache: dict[tuple, torch.Tensor] = {}

    def __call__(self, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        grads = []
        for i, o in enumerate(outs):
            key = (i, tuple(o.shape))
            if key not in self.cache:
                g = (torch.ones(()) if o.dim() == 0 else
                     torch.randn(o.shape, generator=torch.Generator().manual_seed(1000 + i)))
                self.cache[key] = g.to(o.device)
            grads.append(self.cache[key].to(dtype=o.dtype, copy=True))  # a copy: Liger may write into it
        return grads


def run_once(fn: Callable, args: list, backward: bool, upstream: UpstreamGrads) -> tuple[list, list]:
    """``(outputs, gradients to grad_leaves(args))`` of one call, detached."""
    if not backward:
        with torch.no_grad():
            out = fn(*args)
        return [t.detach() for t in tensor_leaves(out) if t.is_floating_point()], []
    outs = float_outputs(fn(*args))
    grads = torch.autograd.grad(outs, grad_leaves(args), upstream(outs), allow_unused=True)
    return [o.detach() for o in outs], list(grads)


def timed_call(fn: Callable, args: list, backward: bool, upstream: UpstreamGrads) -> Callable[[], Any]:
    """The no-argument call that is timed: the forward under no_grad, or forward + autograd.grad to the leaves."""
    if not backward:
        def call():
            with torch.no_grad():
                return fn(*args)
        return call
    leaves = grad_leaves(args)
    grads = upstream(float_outputs(fn(*args)))

    def call():
        outs = float_outputs(fn(*args))
        return torch.autograd.grad(outs, leaves, grads[: len(outs)], allow_unused=True)
    return call


def judge_all(outs: list, grads: list, ref: tuple[list, list], eager: tuple[list, list] | None,
              grad_names: list[str]) -> dict:
    """The policy's verdict on every output and gradient, against float64, with eager's error as the scale."""
    tensors, ok = [], True
    pairs = [(f"output {i}", a, r, eager[0][i] if eager and i < len(eager[0]) else None)
             for i, (a, r) in enumerate(zip(outs, ref[0]))]
    pairs += [(f"grad of {n}", a, r, eager[1][i] if eager and i < len(eager[1]) else None)
              for i, (n, a, r) in enumerate(zip(grad_names, grads, ref[1]))]
    if len(outs) != len(ref[0]) or len(grads) != len(ref[1]):
        ok = False
        tensors.append({"label": "structure", "ok": False,
                        "reason": f"{len(outs)} outputs / {len(grads)} gradients, float64 has "
                                  f"{len(ref[0])} / {len(ref[1])}"})
    for label, a, r, e in pairs:
        if a is None or r is None:
            good = a is None and r is None
            ok &= good
            tensors.append({"label": label, "ok": good, "reason": "missing" if not good else "both None"})
            continue
        j = judge(a, r, e, label)
        ok &= j.ok
        tensors.append({"label": label, "ok": j.ok, "dtype": str(a.dtype).replace("torch.", ""),
                        "norm_err": j.norm_err, "max_err": j.max_err, "eager_norm_err": j.eager_norm_err,
                        "max_abs": j.max_abs_diff, "max_rel": j.max_rel_diff, "reason": j.reason})

    def worst(prefix: str) -> float | None:
        return max((t.get("norm_err") or 0.0 for t in tensors if t["label"].startswith(prefix)), default=None)

    return {"ok": bool(ok), "out_norm_err": worst("output"), "grad_norm_err": worst("grad"), "tensors": tensors}


def work(op: Op, args: list) -> tuple[str, float]:
    """``("GB/s", bytes)`` from the module's bytes-moved formulas, or ``("TFLOP/s", flops)``."""
    mod = op.mod
    if op.flops_bound:
        return "TFLOP/s", float(mod.flops(*args))
    if not op.backward:
        return "GB/s", float(mod.bytes_moved(*args))
    if hasattr(mod, "bytes_moved_fwd_bwd"):
        return "GB/s", float(mod.bytes_moved_fwd_bwd(*args))
    return "GB/s", float(mod.bytes_moved(*args) + mod.bytes_moved_backward(*args))


def rate(unit: str, amount: float, ms: float | None) -> float | None:
    if not ms:
        return None
    return amount / (ms * 1e-3) / (1e9 if unit == "GB/s" else 1e12)


# --- part 1: kernels ------------------------------------------------------------------------------------------

@dataclass
class Ctx:
    """What every part needs: options, Liger, the log, and a way to write the results so far."""

    args: argparse.Namespace
    liger: Liger
    log: Log
    dtype: torch.dtype
    backend: str
    save: Callable[[], None]


def bench_provider(ctx: Ctx, op: Op, shape: tuple, provider: str, args: list, ref, eager_result,
                   upstream: UpstreamGrads, unit: str, amount: float, copy_gbps: float | None) -> tuple[dict, Any]:
    """One row: verify, peak memory, wall and CUDA-graph time of ``provider`` on ``op`` at ``shape``."""
    quick = ctx.args.quick
    row: dict[str, Any] = {"op": op.module, "chain": op.title, "shape": op.label(shape),
                           "mode": "fwd+bwd" if op.backward else "fwd", "provider": provider}
    if provider.startswith("liger"):
        row["api"] = "liger_kernel.transformers.functional"
    fn = provider_fn(op, provider, ctx.liger, ctx.backend)
    # 1. verify (the first call: compilation and Triton JIT timed apart)
    vargs = fresh(args)
    (outs, grads), row["first_call_s"] = first_call_s(lambda: run_once(fn, vargs, op.backward, upstream))
    names = [n for n, a in zip(op.arg_names, args)
             if isinstance(a, torch.Tensor) and a.is_floating_point() and a.requires_grad]
    result = (outs, grads) if provider == "eager" else None
    row["verify"] = judge_all(outs, grads, ref, result or eager_result, names)  # eager: its own error is the scale
    del outs, grads
    # 2-4. peak memory, wall, CUDA-graph replay, on fresh copies of the inputs
    targs = fresh(args)
    call = timed_call(fn, targs, op.backward, upstream)
    if op.backward:
        peak = peak_extra_bytes(call)
        row["peak_extra_mib"] = None if peak is None else peak / MiB
    row["wall_ms"] = wall_ms(call, quick)
    row["graph_ms"], row["graph_error"] = graph_replay_ms(call, quick)
    row["unit"] = unit
    row["wall_rate"], row["graph_rate"] = rate(unit, amount, row["wall_ms"]), rate(unit, amount, row["graph_ms"])
    if unit == "GB/s" and copy_gbps:
        row["graph_pct_of_copy"] = 100 * (row["graph_rate"] or 0.0) / copy_gbps if row["graph_rate"] else None
        row["wall_pct_of_copy"] = 100 * row["wall_rate"] / copy_gbps
    v = row["verify"]
    ctx.log(f"  {provider:8} verified={v['ok']} err out {fmt(v['out_norm_err'], '.2e')} grad "
            f"{fmt(v['grad_norm_err'], '.2e')} | wall {row['wall_ms']:.4f} ms | graph {fmt(row['graph_ms'])} ms"
            + (f" ({row['graph_error'][:90]})" if row["graph_error"] else "")
            + (f" | peak +{row['peak_extra_mib']:.0f} MiB" if row.get("peak_extra_mib") is not None else "")
            + f" | first call {row['first_call_s']:.2f} s")
    return row, result


def bench_chain(ctx: Ctx, op: Op, shape: tuple, copy_gbps: float | None, rows: list) -> None:
    ctx.log(f"{op.title} {op.label(shape)} ({ctx.dtype}):")
    args = op.make(shape, ctx.dtype, op.backward)
    upstream = UpstreamGrads()
    unit, amount = work(op, args)
    # the float64 reference: the module's reference_fn (it keeps float64) on float64 copies
    ref = run_once(op.mod.reference_fn, fresh(args, torch.float64), op.backward, upstream)
    eager_result = None
    for provider in KERNEL_PROVIDERS:
        try:
            row, result = bench_provider(ctx, op, shape, provider, args, ref, eager_result, upstream, unit, amount,
                                         copy_gbps)
            eager_result = result if provider == "eager" else eager_result
        except Exception as e:  # noqa: BLE001 - one provider failing must not stop the others
            ctx.log(f"  {provider:8} FAILED {error_text(e)}")
            row = {"op": op.module, "chain": op.title, "shape": op.label(shape),
                   "mode": "fwd+bwd" if op.backward else "fwd", "provider": provider, "error": error_text(e)}
            if not provider.startswith("liger"):
                row["traceback"] = traceback.format_exc()[-2000:]
        rows.append(row)
        free_memory()
        ctx.save()
    del ref, eager_result, args
    free_memory()


def bench_host(ctx: Ctx, rows: list) -> None:
    """Host time per call on tiny inputs, forward and forward+backward, eager / liger / liger-dispatch / ours."""
    quick = ctx.args.quick
    calls, repeats = (5, 2) if quick else (ctx.args.host_calls, ctx.args.host_repeats)
    warmup = 2 if quick else 20
    for op in OPS:
        shape = HOST_SHAPES[op.module]
        args = op.make(shape, ctx.dtype, True)
        upstream = UpstreamGrads()
        for mode in ("fwd", "fwd+bwd"):
            row: dict[str, Any] = {"op": op.module, "chain": op.title.split(" fwd")[0], "shape": op.label(shape),
                                   "mode": mode}
            timed = {}
            for provider in HOST_PROVIDERS:
                try:
                    fn = provider_fn(op, provider, ctx.liger, ctx.backend)
                    timed[provider] = timed_call(fn, fresh(args), mode == "fwd+bwd", upstream)
                    timed[provider]()  # fails here, not inside the interleaved rounds
                except Exception as e:  # noqa: BLE001
                    timed.pop(provider, None)
                    row[f"{provider}_error"] = error_text(e)
            for provider, us in interleaved_per_call_us(timed, calls, repeats, warmup).items():
                row[f"{provider}_us"] = us
            if row.get("ours_us") and row.get("liger_us"):
                row["ours_over_liger"] = row["ours_us"] / row["liger_us"]
            rows.append(row)
            ctx.log(f"host {op.module:21} {mode:8} " + "  ".join(
                f"{p} {fmt(row.get(f'{p}_us'), '.1f')}" for p in HOST_PROVIDERS) + " us")
            ctx.save()
        del args
        free_memory()


def kernel_targets(rows: list, host: list) -> list[dict]:
    """The issue's kernel targets, computed: LCE faster than Liger (fwd+bwd wall), norms no slower than Liger's,
    host time per call no higher than Liger's."""
    by = {(r["op"], r["shape"], r["provider"]): r for r in rows if "wall_ms" in r}
    out = []
    for (op_name, shape, provider), r in by.items():
        if provider != "ours" or op_name not in ("linear_cross_entropy", "rmsnorm", "layernorm"):
            continue
        lig = by.get((op_name, shape, "liger"))
        target = {"target": f"{op_name} {shape} fwd+bwd wall: ours "
                            + ("faster than" if op_name == "linear_cross_entropy" else "no slower than") + " Liger",
                  "ours_ms": r["wall_ms"], "liger_ms": lig["wall_ms"] if lig else None}
        if lig:
            ratio = lig["wall_ms"] / r["wall_ms"]
            target["liger_over_ours"] = ratio
            target["met"] = ratio > 1.0 if op_name == "linear_cross_entropy" else ratio >= 1.0
        out.append(target)
    for h in host:
        if h.get("ours_us") is not None:
            t = {"target": f"host per call {h['op']} {h['mode']}: ours <= Liger", "ours_us": h["ours_us"],
                 "liger_us": h.get("liger_us")}
            if h.get("liger_us"):
                t["met"] = h["ours_us"] <= h["liger_us"]
            out.append(t)
    return out


def run_kernels(ctx: Ctx, result: dict) -> None:
    shapes = QUICK_SHAPES if ctx.args.quick else SHAPES
    copy_gbps = None
    if ON_CUDA:
        try:
            copy_gbps = copy_bandwidth_gbps()
            ctx.log(f"copy bandwidth {copy_gbps:.0f} GB/s")
        except Exception as e:  # noqa: BLE001
            ctx.log(f"copy bandwidth: FAILED {error_text(e)}")
    result.update({"copy_gbps": copy_gbps, "rows": [], "host": [], "targets": []})
    for op in OPS:
        for shape in shapes[op.module]:
            try:
                bench_chain(ctx, op, shape, copy_gbps, result["rows"])
            except Exception as e:  # noqa: BLE001 - e.g. the inputs or the float64 reference do not fit
                ctx.log(f"{op.title} {op.label(shape)}: FAILED {error_text(e)}")
                result["rows"].append({"op": op.module, "chain": op.title, "shape": op.label(shape),
                                       "error": error_text(e), "traceback": traceback.format_exc()[-2000:]})
                free_memory()
            ctx.save()
    try:
        bench_host(ctx, result["host"])
    except Exception as e:  # noqa: BLE001
        ctx.log(f"host: FAILED {error_text(e)}")
        result["host_error"] = error_text(e)
    result["targets"] = kernel_targets(result["rows"], result["host"])
    for t in result["targets"]:
        ctx.log(f"target: {t['target']}: {'met' if t.get('met') else 'NOT met' if 'met' in t else 'n/a'}")


# --- part 2: a Llama-3-8B-width training step -----------------------------------------------------------------

WithLoss = llama_file.WithLoss


def shift_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """transformers 5.17 ``ForCausalLMLoss``: pad the labels on the right with ``ignore_index``, drop the first
    column (position i predicts token i + 1; the last position of every sequence is ignored)."""
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:]


class OursLCE(torch.nn.Module):
    """The decoder as written; the LM head and the loss as one kernel_library ``linear_cross_entropy`` (logits never
    materialised), on exactly the rows and targets ``ForCausalLMLoss`` uses, loss in fp32 as HF's."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from kernel_library.linear_cross_entropy import linear_cross_entropy

        hidden = self.model.model(input_ids=input_ids).last_hidden_state
        return linear_cross_entropy(hidden, self.model.lm_head.weight, shift_labels(labels), ignore_index=-100,
                                    loss_dtype=torch.float32)


def llama_config(quick: bool):
    """The step's ``LlamaConfig``: the model file's (:mod:`benchmarks.kernels.llama3_8b_width_loss`)."""
    return llama_file.llama_config(quick)


def build_model(cfg, dtype: torch.dtype, state: dict | None = None) -> torch.nn.Module:
    """A fresh ``LlamaForCausalLM`` on the device in ``dtype``, train mode, with ``state`` loaded when given."""
    from transformers import LlamaForCausalLM

    with torch.device(DEVICE):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype)
    if state is not None:
        model.load_state_dict(state)
    free_memory()
    return model.train()


@dataclass
class Step:
    """How a provider runs: ``loss(input_ids, labels)``, what to undo afterwards, notes for the row."""

    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    restore: Callable[[], None] = lambda: None
    info: Callable[[], dict] = lambda: {}


def _liger_step(model, ctx: Ctx) -> Step:
    if ctx.liger.functional is None:
        raise RuntimeError(ctx.liger.error or "liger_kernel is not installed")
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    names = ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP")
    saved = {n: getattr(modeling_llama, n) for n in names}
    saved_forward = modeling_llama.LlamaForCausalLM.forward

    def restore():
        for n, v in saved.items():
            setattr(modeling_llama, n, v)
        modeling_llama.LlamaForCausalLM.forward = saved_forward

    try:
        apply_liger_kernel_to_llama(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True,
                                    swiglu=True, model=model)
    except Exception:
        restore()
        raise
    return Step(lambda ids, labels: loss_of(model(input_ids=ids, labels=labels)), restore,
                lambda: {"api": "liger_kernel.transformers.apply_liger_kernel_to_llama(model=...)"})


def _advised_step(model, ctx: Ctx, variant: str | None = None) -> Step:
    import fusion_advisor

    planned = fusion_advisor.load_plan(WithLoss(model), ctx.args.plan, variant=variant)

    def info():
        return {"plan": str(ctx.args.plan), "variant": planned.spec.name,
                "applied_swaps": [str(k) for k in planned.applied_swaps()],
                "missing_swaps": [str(k) for k in planned.missing_swaps()], "problems": planned.problems()[:10]}
    return Step(lambda ids, labels: loss_of(planned(ids, labels)), info=info)


def step_for(provider: str, model, ctx: Ctx) -> Step:
    backend = ctx.backend
    if provider == "eager":
        return Step(lambda ids, labels: model(input_ids=ids, labels=labels).loss)
    if provider == "compile":
        compiled = torch.compile(model, backend=backend)
        return Step(lambda ids, labels: compiled(input_ids=ids, labels=labels).loss)
    if provider == "ours-lce":
        return Step(OursLCE(model))
    if provider == "ours-lce+compile":
        return Step(torch.compile(OursLCE(model), backend=backend))
    if provider == "advised":
        return _advised_step(model, ctx)
    if provider.startswith("advised:"):  # another variant of the plan (--plan-variant)
        return _advised_step(model, ctx, provider.split(":", 1)[1])
    if provider == "liger":
        return _liger_step(model, ctx)
    raise ValueError(provider)


def bench_step(ctx: Ctx, provider: str, cfg, state: dict, ids: torch.Tensor, labels: torch.Tensor) -> dict:
    quick = ctx.args.quick
    warmup, steps = (2, 2) if quick else (3, ctx.args.llama_steps)
    torch._dynamo.reset()
    model = build_model(cfg, ctx.dtype, state)
    run = step_for(provider, model, ctx)
    row: dict[str, Any] = {"provider": provider}

    def one_step():
        loss = run.loss(ids, labels)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss

    try:
        loss0, row["first_step_s"] = first_call_s(one_step)
        row["loss_step0"] = float(loss0.detach().float())
        del loss0
        for _ in range(warmup - 1):
            one_step()
        sync()
        if ON_CUDA:
            # weights, inputs and anything a previous provider left behind: should be ~weights_gib
            row["allocated_before_gib"] = torch.cuda.memory_allocated() / GiB
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            sync()
            t0 = time.perf_counter()
            one_step()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        row["step_ms"] = statistics.median(times)
        row["step_ms_all"] = times
        row["peak_gib"] = torch.cuda.max_memory_allocated() / GiB if ON_CUDA else None
        # CUDA graphs' private pools hold their memory outside max_memory_allocated after capture (a graphed step
        # once read 3.58 GiB, its weights alone): the reserved peak counts them
        row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GiB if ON_CUDA else None
        row.update(run.info())
    finally:
        run.restore()
    ctx.log(f"llama {provider:17} step {row['step_ms']:.2f} ms | peak {fmt(row['peak_gib'], '.2f')} GiB | "
            f"loss {row['loss_step0']:.6f} | first step {row['first_step_s']:.1f} s")
    return row


def peak_ratio(row: dict, comp: dict) -> float | None:
    """The larger of the allocated-peak and reserved-peak ratios of ``row`` to ``comp`` (None when unmeasured): a
    CUDA-graphed step's pool memory shows in the reserved peak only, a caching allocator's slack in it too."""
    ratios = [row[k] / comp[k] for k in ("peak_gib", "peak_reserved_gib") if row.get(k) and comp.get(k)]
    return max(ratios) if ratios else None


def llama_targets(rows: list) -> list[dict]:
    """Each candidate against ``compile``: speed-up (>= 1.05x wanted) and peak-memory ratio (<= 0.7x wanted)."""
    by = {r["provider"]: r for r in rows if "step_ms" in r}
    comp = by.get("compile")
    out = []
    names = ["advised"] + [p for p in by if p.startswith("advised:")] + ["ours-lce", "ours-lce+compile", "liger"]
    for name in names:
        r = by.get(name)
        if not (r and comp):
            continue
        t = {"provider": name, "speedup_vs_compile": comp["step_ms"] / r["step_ms"],
             "peak_ratio_vs_compile": peak_ratio(r, comp)}
        t["speed_met"] = t["speedup_vs_compile"] >= 1.05
        t["memory_met"] = t["peak_ratio_vs_compile"] is not None and t["peak_ratio_vs_compile"] <= 0.7
        t["is_issue_target"] = name == "advised"
        out.append(t)
    return out


def run_llama(ctx: Ctx, result: dict) -> None:
    sizes = QUICK_LLAMA if ctx.args.quick else LLAMA
    cfg = llama_config(ctx.args.quick)
    result.update({"config": dict(sizes, dtype=str(ctx.dtype), attn_implementation="sdpa", use_cache=False,
                                  tie_word_embeddings=False), "rows": [], "targets": []})
    torch.manual_seed(0)
    model = build_model(cfg, ctx.dtype)
    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    result["weights_gib"] = sum(v.numel() * v.element_size() for v in state.values()) / GiB
    del model
    free_memory()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, sizes["vocab_size"], (sizes["batch"], sizes["seq"]), generator=gen).to(DEVICE)
    labels = ids.clone()
    wanted = [p for p in ctx.args.llama_providers.split(",") if p]
    extra = [f"advised:{v}" for v in ctx.args.plan_variant] if ctx.args.plan else []
    order = [p for p in LLAMA_PROVIDERS if p in wanted]
    at = order.index("advised") + 1 if "advised" in order else len(order)
    for provider in order[:at] + extra + order[at:]:  # Liger's patch still last
        if provider == "advised" and not ctx.args.plan:
            result["rows"].append({"provider": provider, "skipped": "no --plan given"})
            continue
        if provider == "ours-lce+compile" and _device.interpreted():
            result["rows"].append({"provider": provider, "skipped": "torch.compile of a library triton_op cannot run "
                                                                    "under TRITON_INTERPRET"})
            continue
        ctx.log(f"llama {provider}: building and running ...")
        try:
            result["rows"].append(bench_step(ctx, provider, cfg, state, ids, labels))
        except Exception as e:  # noqa: BLE001 - e.g. out of memory, Liger missing, a plan for another model
            ctx.log(f"llama {provider}: FAILED {error_text(e)}")
            result["rows"].append({"provider": provider, "error": error_text(e),
                                   "traceback": traceback.format_exc()[-2000:]})
        torch._dynamo.reset()  # the provider's model and compiled graphs are gone with bench_step's frame
        free_memory()
        ctx.save()
    eager = next((r for r in result["rows"] if r["provider"] == "eager" and "loss_step0" in r), None)
    for r in result["rows"]:
        if eager and "loss_step0" in r:
            r["loss_abs_diff_vs_eager"] = abs(r["loss_step0"] - eager["loss_step0"])
    result["targets"] = llama_targets(result["rows"])
    for t in result["targets"]:
        ctx.log(f"target{' (issue)' if t['is_issue_target'] else ''}: {t['provider']} "
                f"{t['speedup_vs_compile']:.3f}x vs compile (>= 1.05: {'met' if t['speed_met'] else 'NOT met'}), "
                f"peak {fmt(t['peak_ratio_vs_compile'], '.3f')}x of compile's "
                f"(<= 0.7: {'met' if t['memory_met'] else 'NOT met'})")


# --- markdown -------------------------------------------------------------------------------------------------

def _speedup(other: dict, ours: dict) -> str:
    return f"{other['wall_ms'] / ours['wall_ms']:.2f}x" if other.get("wall_ms") and ours.get("wall_ms") else "-"


def md_kernels(res: dict) -> list[str]:
    if "error" in res and not res.get("rows"):
        return [f"Part failed: {res['error']}", ""]
    lines = ["Wall: do_bench median of the whole call (host included, L2 cleared). Graph: do_bench median of CUDA-graph "
             "replays of the same call (device time). ok: outputs and gradients within the error policy against "
             "float64 (err: worst norm-wise relative error of outputs / gradients). Peak: MiB allocated during one "
             "fwd+bwd call beyond the inputs.", "",
             f"Copy bandwidth in this run: {fmt(res.get('copy_gbps'), '.0f')} GB/s.", "",
             "| chain | shape | " + " | ".join(f"{p} wall ms | {p} graph ms" for p in KERNEL_PROVIDERS)
             + " | ours vs liger (wall) | ours vs compile (wall) | ours graph rate |",
             "|---|---|" + "---|---|" * len(KERNEL_PROVIDERS) + "---|---|---|"]
    index: dict[tuple, dict] = {}
    for r in res.get("rows", []):
        index.setdefault((r["chain"], r["shape"]), {})[r.get("provider", "")] = r
    for (chain, shape), p in index.items():
        cells = []
        for name in KERNEL_PROVIDERS:
            r = p.get(name, {})
            cells += [fmt(r.get("wall_ms")) + ("" if r.get("verify", {}).get("ok", True) else " (not ok)"),
                      fmt(r.get("graph_ms")) if r.get("graph_ms") else ("n/c" if r.get("graph_error") else "-")]
        ours, lig, comp = p.get("ours", {}), p.get("liger", {}), p.get("compile", {})
        rate_cell = (f"{ours['graph_rate']:.0f} {ours['unit']}" if ours.get("graph_rate") else "-")
        if ours.get("graph_pct_of_copy"):
            rate_cell += f" ({ours['graph_pct_of_copy']:.0f}% of copy)"
        lines.append(f"| {chain} | {shape} | " + " | ".join(cells) + f" | {_speedup(lig, ours)} | {_speedup(comp, ours)} | {rate_cell} |")
    lines += ["", "n/c: not capturable (see below). Verification, memory, first call:", "",
              "| chain | shape | provider | ok | err out | err grad | peak MiB | first call s | note |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        v = r.get("verify", {})
        note = r.get("error") or r.get("graph_error") or ""
        lines.append(f"| {r['chain']} | {r['shape']} | {r.get('provider', '')} | {v.get('ok', '-')} | "
                     f"{fmt(v.get('out_norm_err'), '.2e')} | {fmt(v.get('grad_norm_err'), '.2e')} | "
                     f"{fmt(r.get('peak_extra_mib'), '.0f')} | {fmt(r.get('first_call_s'), '.2f')} | "
                     f"{cell(note)} |")
    host = res.get("host", [])
    if host or res.get("host_error"):
        lines += ["", "### Host time per call (tiny inputs, us; median of loops of back-to-back calls)", "",
                  "| chain | shape | mode | " + " | ".join(f"{p} us" for p in HOST_PROVIDERS) + " | ours / liger |",
                  "|---|---|---|" + "---|" * len(HOST_PROVIDERS) + "---|"]
        for h in host:
            lines.append(f"| {h['chain']} | {h['shape']} | {h['mode']} | "
                         + " | ".join(fmt(h.get(f"{p}_us"), ".1f") if f"{p}_us" in h else "err"
                                      for p in HOST_PROVIDERS)
                         + f" | {fmt(h.get('ours_over_liger'), '.2f')} |")
        if res.get("host_error"):
            lines.append(f"\nHost table failed: {res['host_error']}")
    if res.get("targets"):
        lines += ["", "### Targets", ""]
        for t in res["targets"]:
            state = "met" if t.get("met") else ("NOT met" if "met" in t else "n/a (no Liger number)")
            lines.append(f"- {t['target']}: {state}")
    return lines + [""]


def md_llama(res: dict) -> list[str]:
    if "error" in res and not res.get("rows"):
        return [f"Part failed: {res['error']}", ""]
    c = res.get("config", {})
    lines = [f"LlamaForCausalLM, hidden {c.get('hidden_size')}, {c.get('num_hidden_layers')} layers, "
             f"{c.get('num_attention_heads')}/{c.get('num_key_value_heads')} heads, intermediate "
             f"{c.get('intermediate_size')}, vocab {c.get('vocab_size')}, {c.get('dtype')}, batch {c.get('batch')} x "
             f"{c.get('seq')} tokens; weights {fmt(res.get('weights_gib'), '.2f')} GiB. Step: forward + "
             "loss.backward() + zero_grad, median of the timed steps; peak: max_memory_allocated (and "
             "max_memory_reserved, which holds CUDA graphs' pools) over them; x compile's peak: the larger of the two "
             "ratios.", "",
             "| provider | step ms | x compile | peak GiB | peak reserved GiB | x compile's peak | loss step 0 | abs "
             "diff vs eager | first step s | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    comp = next((r for r in res.get("rows", []) if r["provider"] == "compile" and "step_ms" in r), None)
    for r in res.get("rows", []):
        speed = f"{comp['step_ms'] / r['step_ms']:.3f}" if comp and r.get("step_ms") else "-"
        mem = fmt(peak_ratio(r, comp), ".3f") if comp else "-"
        note = r.get("error") or r.get("skipped") or (
            f"applied {len(r['applied_swaps'])} swaps, missing {len(r['missing_swaps'])}" if "applied_swaps" in r
            else "")
        lines.append(f"| {r['provider']} | {fmt(r.get('step_ms'), '.2f')} | {speed} | {fmt(r.get('peak_gib'), '.2f')} "
                     f"| {fmt(r.get('peak_reserved_gib'), '.2f')} | {mem} | {fmt(r.get('loss_step0'), '.6f')} | {fmt(r.get('loss_abs_diff_vs_eager'), '.2e')} | "
                     f"{fmt(r.get('first_step_s'), '.1f')} | {cell(note)} |")
    if res.get("targets"):
        lines += ["", "### Targets (vs torch.compile: speed >= 1.05x, peak memory <= 0.7x)", ""]
        for t in res["targets"]:
            lines.append(f"- {t['provider']}{' (the issue target)' if t['is_issue_target'] else ' (reference)'}: "
                         f"{t['speedup_vs_compile']:.3f}x ({'met' if t['speed_met'] else 'NOT met'}), peak "
                         f"{fmt(t['peak_ratio_vs_compile'], '.3f')}x ({'met' if t['memory_met'] else 'NOT met'})")
    return lines + [""]


def markdown(doc: dict) -> str:
    m = doc["meta"]
    lines = ["# Issue 16: kernel_library vs eager / torch.compile / Liger-Kernel, and a Llama-3-8B-width step", "",
             f"{m['gpu']}; torch {m['torch']}, triton {m['triton']}, transformers {m['transformers']}, "
             f"liger-kernel {m['liger_kernel']}, Python {m['python']}; {m['date']}; dtype {m['dtype']}; "
             f"compile backend {m['compile_backend']}" + ("; --quick" if m["quick"] else "") + ".", ""]
    if m.get("liger_error"):
        lines += [f"Liger: {cell(m['liger_error'], 400)}", ""]
    if "kernels" in doc:
        lines += ["## Kernels vs peers", ""] + md_kernels(doc["kernels"])
    if "llama" in doc:
        lines += ["## Llama-3-8B-width training step", ""] + md_llama(doc["llama"])
    return "\n".join(lines) + "\n"


# --- main -----------------------------------------------------------------------------------------------------

def meta_block(ctx: Ctx) -> dict:
    try:
        import transformers

        tf_version = transformers.__version__
    except Exception as e:  # noqa: BLE001
        tf_version = f"not importable ({error_text(e)})"
    return {
        "gpu": torch.cuda.get_device_name() if ON_CUDA else f"none ({platform.processor() or platform.machine()})",
        "torch": torch.__version__, "triton": triton.__version__, "transformers": tf_version,
        "liger_kernel": ctx.liger.version, "liger_error": ctx.liger.error, "cuda": torch.version.cuda,
        "python": platform.python_version(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dtype": str(ctx.dtype).replace("torch.", ""), "compile_backend": ctx.backend, "quick": ctx.args.quick,
        "device": str(DEVICE), "argv": sys.argv[1:],
        "method": __doc__,
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="kernels,llama", help="comma-separated: kernels, llama")
    ap.add_argument("--plan", type=Path, default=None, help="plan.yaml for the 'advised' Llama provider")
    ap.add_argument("--plan-variant", action="append", default=[],
                    help="also time this variant of --plan (a provider 'advised:NAME'; repeatable)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test (also on a CPU)")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend (default inductor; aot_eager for --quick without CUDA)")
    ap.add_argument("--llama-providers", default=",".join(LLAMA_PROVIDERS))
    ap.add_argument("--llama-steps", type=int, default=10)
    ap.add_argument("--host-calls", type=int, default=200)
    ap.add_argument("--host-repeats", type=int, default=9)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "lce_liger.log")
    backend = args.compile_backend or ("inductor" if ON_CUDA or not args.quick else "aot_eager")
    dtype = torch.bfloat16 if ON_CUDA else torch.float32
    doc: dict[str, Any] = {}

    def save() -> None:
        (args.out / "lce_liger.json").write_text(json.dumps(doc, indent=1, default=str))
        (args.out / "lce_liger.md").write_text(markdown(doc))

    ctx = Ctx(args, load_liger(), log, dtype, backend, save)
    doc["meta"] = meta_block(ctx)
    log(f"{doc['meta']['gpu']}: torch {torch.__version__}, triton {triton.__version__}, transformers "
        f"{doc['meta']['transformers']}, liger {ctx.liger.version} {ctx.liger.error}; dtype {dtype}, compile "
        f"backend {backend}")
    parts = {"kernels": run_kernels, "llama": run_llama}
    for name in [p for p in args.parts.split(",") if p]:
        if name not in parts:
            log(f"unknown part {name!r}; known: {', '.join(parts)}")
            continue
        t0 = time.perf_counter()
        doc[name] = {}
        try:
            parts[name](ctx, doc[name])
        except Exception as e:  # noqa: BLE001 - one part failing must not stop the next
            log(f"part {name}: FAILED {error_text(e)}\n{traceback.format_exc()}")
            doc[name]["error"] = error_text(e)
            free_memory()
        doc[name]["part_s"] = time.perf_counter() - t0
        log(f"part {name}: {doc[name]['part_s']:.0f} s")
        save()
    save()
    print(markdown(doc), flush=True)


if __name__ == "__main__":
    main()
