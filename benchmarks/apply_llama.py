"""GPU benchmark of ``fusion-advisor apply`` on Llama models: advised vs eager vs torch.compile(model).

Configurations (run in this order, each in its own subprocess so that a crash, a hang or an out-of-memory in
one cannot take the others down):

- ``hf-llama-fwdbwd`` / ``hf-llama-fwd``: transformers ``LlamaForCausalLM`` from a realistic config (hidden 4096,
  intermediate 11008, 32 heads, vocab 32000, 4 layers), bf16, batch 2 x seq 2048, loss from labels (ANCHORS.md's
  training-step setup);
- ``default-fwd`` / ``default-fwdbwd``: the built-in default model (``fusion_advisor.models.llama``: 2 layers of
  Llama-2-7B widths, seq 2048, bf16).

Per configuration the worker runs ``apply`` (``--candidates all --verify``, margin 3%; ``--backward`` for the
fwdbwd ones): every swap verified, then timed against its chain eagerly and under torch.compile
(``triton.testing.do_bench`` medians). Then the whole model is timed (steady-state do_bench median of one step;
first call, i.e. compilation, apart; ``torch.cuda.max_memory_allocated`` over three steps) as

- ``eager``: the model as written;
- ``compile``: ``torch.compile(model)`` (Inductor, default mode);
- ``advised-eager-rest``: the kept swaps, the rest of each graph eager (``load_plan`` default);
- ``advised-compile-rest``: the kept swaps, the rest under Inductor (``--compile-rest``).

Results: ``<out>/<config>.json`` per configuration, rewritten after every stage (a configuration stopped by the
time budget keeps what it measured), and ``<out>/apply_llama.json`` with all of them plus GPU, versions, date
and the speedups of the best advised variant vs eager and vs torch.compile. Any failure is recorded, never fatal.
The whole run stays under ``--budget-s`` (default 450 s, 7.5 minutes): the first configuration may use half of it,
the others share what is left; a worker that runs out of time is killed and keeps what it saved, and a worker
skips (and records) whole-model variants it no longer has the time to compile.

    python benchmarks/apply_llama.py --out benchmarks/results/apply_llama_h200 [--budget-s 450] [--only hf-llama-fwdbwd]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Run order: the training step first (the project's target), then the rest.
CONFIGS = ("hf-llama-fwdbwd", "default-fwd", "hf-llama-fwd", "default-fwdbwd")

#: Share of the budget the first configuration (the training step, the project's target) may use when several
#: run; the others share what is left. A 4-layer model spends most of its time compiling (dynamo, Inductor).
FIRST_SHARE = 0.5

#: Seconds a worker needs after a stage to still start the next one (stages are skipped, and said so, below it).
STAGE_RESERVE_S = {"compile": 60.0, "advised-eager-rest": 25.0, "advised-compile-rest": 60.0}

HF_LLAMA_FILE = textwrap.dedent("""
    \"\"\"transformers LlamaForCausalLM, realistic widths, 4 layers, bf16, batch 2 x 2048 with labels (loss).\"\"\"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    CONFIG = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=4, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, use_cache=False)
    BATCH, SEQ = 2, 2048


    class WithLoss(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, labels):
            return self.model(input_ids=input_ids, labels=labels).loss


    def get_model():
        torch.manual_seed(0)
        cfg = LlamaConfig(**CONFIG)
        cfg._attn_implementation = "sdpa"
        return WithLoss(LlamaForCausalLM(cfg).to(torch.bfloat16))


    def get_inputs():
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=g)
        return [ids, ids.clone()]
""")


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "triton", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # a missing library is recorded, not fatal
            out[mod] = f"unavailable ({type(e).__name__})"
    try:
        import torch

        out["cuda"] = str(torch.version.cuda)
        out["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    except Exception as e:
        out["gpu"] = f"unknown ({type(e).__name__})"
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                           timeout=10).stdout.strip()
    except Exception:
        out["git_commit"] = ""
    return out


def _dump(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _clean(x):
    """NaN/inf -> None, recursively (JSON without NaN)."""
    import math

    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


# --- worker: one configuration ------------------------------------------------------------------------------


def worker(config: str, out_dir: Path, deadline: float) -> None:
    import torch

    from fusion_advisor import swaps as sw
    from fusion_advisor.apply import ApplyOptions, apply, write_outputs
    from fusion_advisor.plan import PatchedModel, PlannedSwap

    path = out_dir / f"{config}.json"
    state: dict = {"config": config, "status": "running", "stages": {}, "errors": {}}

    def save() -> None:
        _dump(path, _clean(state))

    def left() -> float:
        return deadline - time.time()

    model_name, mode = config.rsplit("-", 1)
    backward = mode == "fwdbwd"
    state.update(model=model_name, what="forward+backward" if backward else "forward")
    save()
    if model_name == "hf-llama":
        model_file: Path | None = out_dir / "hf_llama_4l.py"
        model_file.write_text(HF_LLAMA_FILE)
    else:
        model_file = None  # the built-in default model

    t0 = time.time()
    options = ApplyOptions(verify=True, backward=backward, candidates="all", margin=0.03, seeds=1,
                           bench_model=False)
    try:
        result = apply(model_file, options, device="cuda")
    except Exception as e:
        state["status"] = "failed"
        state["errors"]["apply"] = f"{type(e).__name__}: {e}"
        state["traceback"] = traceback.format_exc()[-4000:]
        save()
        return
    state["stages"]["apply_s"] = time.time() - t0
    paths = write_outputs(result, out_dir / f"{config}-report")
    state["report"] = {k: str(v) for k, v in paths.items()}
    state["swaps"] = [
        {"id": s.id, "kernel": s.kernel, "signature": s.signature, "decision": result.outcomes[s.id].decision,
         "reason": result.outcomes[s.id].reason,
         "eager_ms": getattr(result.outcomes[s.id].timing, "eager_ms", None),
         "compile_ms": getattr(result.outcomes[s.id].timing, "compile_ms", None),
         "kernel_ms": getattr(result.outcomes[s.id].timing, "kernel_ms", None),
         "eager_gpu_ms": getattr(result.outcomes[s.id].timing, "eager_gpu_ms", None),
         "compile_gpu_ms": getattr(result.outcomes[s.id].timing, "compile_gpu_ms", None),
         "kernel_gpu_ms": getattr(result.outcomes[s.id].timing, "kernel_gpu_ms", None)}
        for s in result.sites]
    state["kept"] = [str(s.key) for s in result.kept]
    wm = result.whole_model
    state["whole_model_check"] = None if wm is None else {
        "passed": wm.passed, "max_abs_err": wm.max_abs_err, "max_rel_err": wm.max_rel_err,
        "grad_max_abs_err": wm.grad_max_abs_err, "reference": wm.reference, "details": wm.details}
    state["warnings"] = result.warnings
    save()

    # whole-model timings, one variant at a time, saved after each
    import torch._dynamo

    loaded_model, inputs = result.loaded.module, result.loaded.inputs
    params = [p for p in loaded_model.parameters() if p.requires_grad]
    planned = [PlannedSwap(s.key, s.signature, s.id) for s in result.kept]
    variants = {
        "eager": lambda: loaded_model,
        "compile": lambda: torch.compile(loaded_model),
        "advised-eager-rest": lambda: PatchedModel(loaded_model, planned, compile_rest=False),
        "advised-compile-rest": lambda: PatchedModel(loaded_model, planned, compile_rest=True),
    }
    state["variants"] = {}
    for name, make in variants.items():
        if left() < STAGE_RESERVE_S.get(name, 10.0):
            state["variants"][name] = {"error": f"skipped: {left():.0f} s left of the time budget"}
            save()
            continue
        torch._dynamo.reset()
        timing = sw.time_model_variant(make, inputs, backward, params)
        state["variants"][name] = {"ms": timing.ms, "first_call_s": timing.first_call_s, "peak_mb": timing.peak_mb,
                                   "device_ms": timing.device_ms, "device_ms_by_class": timing.device_ms_by_class,
                                   "error": timing.error or None}
        save()
    v = state["variants"]
    eager, comp = (v.get("eager") or {}).get("ms"), (v.get("compile") or {}).get("ms")
    advised = {n: (v.get(n) or {}).get("ms") for n in ("advised-eager-rest", "advised-compile-rest")}
    best_name = min((n for n in advised if advised[n]), key=lambda n: advised[n], default=None)
    best = advised[best_name] if best_name else None
    state["summary"] = {
        "best_advised": best_name, "best_advised_ms": best, "eager_ms": eager, "compile_ms": comp,
        "speedup_vs_eager": eager / best if eager and best else None,
        "speedup_vs_compile": comp / best if comp and best else None,
        "n_swaps_kept": len(planned),
    }
    state["status"] = "done"
    save()


# --- parent: all configurations within the budget -----------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the JSON results and reports")
    ap.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget of the whole run, seconds")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CONFIGS)}")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    if args.worker:
        worker(args.worker, args.out, args.deadline)
        return

    start = time.time()
    deadline = start + args.budget_s
    configs = [c for c in CONFIGS if not args.only or c in args.only.split(",")]
    summary: dict = {
        "benchmark": "apply_llama",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "budget_s": args.budget_s,
        "configs": {},
    }
    if not summary["versions"].get("gpu") or summary["versions"]["gpu"] in ("none",):
        summary["error"] = "no CUDA GPU: this benchmark measures GPU time only"
        _dump(args.out / "apply_llama.json", summary)
        print(json.dumps(summary, indent=1))
        return
    for i, config in enumerate(configs):
        left = deadline - time.time() - 5.0  # keep a few seconds to write the summary
        share = left / (len(configs) - i)
        if i == 0 and len(configs) > 1:
            share = max(share, FIRST_SHARE * left)
        if share < 30.0:
            summary["configs"][config] = {"status": "skipped", "error": f"time budget: {left:.0f} s left"}
            continue
        cfg_deadline = time.time() + share - 3.0
        cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(args.out), "--worker", config,
               "--deadline", str(cfg_deadline)]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=share)
            status = "exit 0" if proc.returncode == 0 else f"exit {proc.returncode}"
            tail = (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:  # run() has killed the worker; what it saved stays
            status = f"killed: exceeded its {share:.0f} s share of the budget"
            tail = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                           for x in (e.stdout, e.stderr))[-3000:]
        record: dict = {}
        per_config = args.out / f"{config}.json"
        if per_config.is_file():
            try:
                record = json.loads(per_config.read_text())
            except json.JSONDecodeError as e:
                record = {"error": f"unreadable {per_config.name}: {e}"}
        record["process"] = status
        record["wall_s"] = time.time() - t0
        if status != "exit 0":
            record["output_tail"] = tail
        summary["configs"][config] = record
        _dump(args.out / "apply_llama.json", _clean(summary))
    summary["wall_s"] = time.time() - start
    _dump(args.out / "apply_llama.json", _clean(summary))
    brief = {c: (r.get("summary") or r.get("error") or r.get("process")) for c, r in summary["configs"].items()}
    print(json.dumps({"wall_s": summary["wall_s"], "gpu": summary["versions"].get("gpu"), "results": brief},
                     indent=1, default=str))


if __name__ == "__main__":
    main()
