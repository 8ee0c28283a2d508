"""Accuracy of the roofline predictions against measured profiles (issue 5): bound class and chain time.

Steps:

1. ``fusion-advisor calibrate`` on the present device -> ``<out>/calibrated_spec.yaml`` (copy bandwidth, matmul
   TFLOP/s per dtype, per-op launch overhead, measured here and now).
2. ``analyze --profile --gpu calibrated_spec.yaml`` (:func:`fusion_advisor.analyze.analyze`) over

   - ``default_llama``: the built-in default model (Llama-2-7B widths, seq 2048, bf16, 2 layers);
   - ``hf_llama``, ``hf_gpt2``, ``hf_bert``: transformers models built from config objects (no download), bf16
     (Llama at Llama-2-7B widths, 2 layers, seq 2048; GPT-2 and BERT at base widths, 2 layers);
   - KernelBench-style files, fp32 as KernelBench ships them: ``kernelbench_conv_gelu.py``, ``tiny_pointwise.py``
     (a launch-bound pointwise chain, run as ``kb_small_pointwise``) and ``kb_*.py`` (GEMM + epilogue, add +
     LayerNorm + softmax);

   every file from ``tests/data/models/`` (the models the tests analyse), each in its own subprocess (a crash or
   out-of-memory in one cannot stop the others) with a time limit.
3. Per chain measured (time > 0): the predicted bound class (the roofline's, before rules) vs the measured one,
   and predicted eager time in the model (``est_in_model_us``, :func:`fusion_advisor.roofline.eager_in_model_us`)
   / measured time: the roofline's EAGER estimate, since the profiled model runs unfused, with the host running
   ahead of the GPU where it can (``est_eager_us``, the chain priced alone, is kept in the CSV).

Targets (issue 5): bound class equal for >= 95% of chains; predicted time within +-30% of measured
(``|predicted / measured - 1| <= 0.3``) for >= 80% of chains.

Writes into ``--out`` (default ``$OUT``), 4 files: ``calibrated_spec.yaml``, ``profile_accuracy.json`` (everything,
with GPU, versions, date, setup), ``profile_accuracy.md`` (confusion table, ratio distribution, worst chains) and
``profile_accuracy_chains.csv`` (one row per chain and model).

    python benchmarks/accuracy/profile_accuracy.py --out $OUT            # GPU, ~4-6 minutes on an H200
    python benchmarks/accuracy/profile_accuracy.py --out /tmp/x --smoke  # CPU: the small models, ~1 minute

(Results up to 2026-11-29, ``benchmarks/results/h200/accuracy/``, were measured with the benchmark's own copies of
the transformers files: GPT-2 at 1024 wide, 4 layers, 8 x 1024 tokens; BERT 4 layers, 16 x 512 tokens.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fusion_advisor.analyze.accuracy import (  # noqa: E402
    TARGET_BOUND_PCT,
    TARGET_TIME_PCT,
    TIME_TOLERANCE,
    by_pattern,
    chain_rows,
    fmt,
    markdown,
    off_chains,
    summarize,
)

#: Where the model files are: the tests' own (one copy of each model in the repository).
MODELS_DIR = "tests/data/models"
#: (name, model file relative to the repo root, dtype override, extra environment, run by --smoke), in run order.
#: ``--smoke`` sets FA_BENCH_SMOKE=1, which default_llama and kb_* read to shrink to CPU-test size; the transformers
#: files have one size, too large for a quick CPU run, so --smoke skips them.
MODELS = (
    ("default_llama", f"{MODELS_DIR}/default_llama.py", "", {"FUSION_ADVISOR_LLAMA_LAYERS": "2"}, True),
    ("hf_llama", f"{MODELS_DIR}/hf_llama.py", "", {}, False),
    ("hf_gpt2", f"{MODELS_DIR}/hf_gpt2.py", "bf16", {}, False),
    ("hf_bert", f"{MODELS_DIR}/hf_bert.py", "bf16", {}, False),
    ("kb_conv_gelu", f"{MODELS_DIR}/kernelbench_conv_gelu.py", "", {}, True),
    ("kb_gemm_bias_gelu_scale", f"{MODELS_DIR}/kb_gemm_bias_gelu_scale.py", "", {}, True),
    ("kb_norm_softmax", f"{MODELS_DIR}/kb_norm_softmax.py", "", {}, True),
    ("kb_small_pointwise", f"{MODELS_DIR}/tiny_pointwise.py", "", {}, True),
)
#: seconds kept for each model still to run, and the most one model may take
RESERVE_S = 25.0
MODEL_LIMIT_S = 150.0
OUT_FILES = ("calibrated_spec.yaml", "profile_accuracy.json", "profile_accuracy.md", "profile_accuracy_chains.csv")


def _versions() -> dict[str, str]:
    import torch

    out = {"torch": str(torch.__version__), "python": platform.python_version()}
    for mod in ("triton", "transformers"):
        try:
            out[mod] = str(__import__(mod).__version__)
        except ImportError:
            out[mod] = "not installed"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        out["cuda"] = str(torch.version.cuda)
    return out


# --- worker: one model in its own process ---------------------------------------------------------------------


def worker(model: str, spec: str, device: str, result: str) -> None:
    """Analyse and profile one model; write its per-chain rows and profile totals to ``result`` (JSON)."""
    from fusion_advisor.analyze.pipeline import analyze

    name, rel, dtype, _, _ = next(m for m in MODELS if m[0] == model)
    out: dict = {"model": name, "file": rel, "ok": False}
    start = time.perf_counter()
    try:
        a = analyze(ROOT / rel, device=device, dtype=dtype, gpu=spec, profile=True)
        p = a.profile
        rows = chain_rows(name, a)
        out.update(ok=True, rows=rows, profile={
            "device_name": p.device_name, "runs": p.runs, "total_us": p.total_us, "attributed_us": p.attributed_us,
            "unattributed_us": p.unattributed_us, "wall_us": p.wall_us, "eager_wall_us": p.eager_wall_us,
            "setup": p.setup, "notes": p.notes, "dispatch_us": p.dispatch_us,
            "instrumented_dispatch_us": p.instrumented_dispatch_us},
            capture=a.capture_method, graph_breaks=len(a.graph_breaks),
            timings_s=a.timings_s)
    except BaseException as e:  # noqa: BLE001 - recorded, never fatal
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        out["traceback"] = traceback.format_exc()[-3000:]
    out["wall_s"] = time.perf_counter() - start
    Path(result).write_text(json.dumps(out, default=str))


# --- driver -------------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="Output folder (default: $OUT).")
    ap.add_argument("--smoke", action="store_true",
                    help="The small models only, at tiny sizes (FA_BENCH_SMOKE=1), and a quick calibration.")
    ap.add_argument("--device", default=None, help="cuda (default with a GPU) or cpu.")
    ap.add_argument("--budget-s", type=float, default=330.0, help="Wall-clock budget of the whole run.")
    ap.add_argument("--only", action="append", default=[], help="Run only these models (repeatable).")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        # one intra-op thread: on a shared machine OpenMP threads wait for descheduled peers (milliseconds per op),
        # which no roofline models; calibrate and every worker measure the same single-thread CPU
        torch.set_num_threads(1)
    if args.worker:
        worker(args.worker, args.spec, device, args.result)
        return 0
    if not args.out:
        ap.error("--out DIR is required (or set $OUT)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.smoke:
        env["FA_BENCH_SMOKE"] = "1"

    from fusion_advisor.devices.calibrate import calibrate

    spec_path = out / OUT_FILES[0]
    t0 = time.perf_counter()
    calibrate_error = None
    try:
        spec_path, spec = calibrate(spec_path, device=device, quick=args.smoke)
    except Exception as e:  # noqa: BLE001 - fall back to the shipped spec, and say so
        from fusion_advisor.analyze.pipeline import default_spec_name
        from fusion_advisor.devices import load_spec

        calibrate_error = f"{type(e).__name__}: {e}"
        fallback = default_spec_name() if device == "cuda" else "cpu"
        spec_path, spec = fallback, load_spec(fallback).to_dict()
        spec["launch_overhead_us"] = load_spec(fallback).launch_overhead_us
        print(f"calibrate failed ({calibrate_error}); using the shipped spec {fallback}", flush=True)
    calibrate_s = time.perf_counter() - t0
    print(f"spec in {calibrate_s:.1f} s: {spec['memory_bandwidth_gbps']:,.0f} GB/s, launch "
          f"{spec['launch_overhead_us']:.2f} us, matmul {spec['tensor_tflops']}", flush=True)

    models = [m for m in MODELS if not args.only or m[0] in args.only]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, rel, _, extra_env, smoke_ok) in enumerate(models):
            if args.smoke and not smoke_ok:
                results.append({"model": name, "file": rel, "ok": False, "error": "skipped: --smoke (no small size)"})
                continue
            left = args.budget_s - (time.perf_counter() - start)
            # a model may use what is left less a reserve for each model still to run (the small ones at the end
            # take ~10-20 s: process start, capture, profile), and never more than MODEL_LIMIT_S
            limit = min(left - RESERVE_S * (len(models) - i - 1), MODEL_LIMIT_S)
            if limit < 15:
                results.append({"model": name, "file": rel, "ok": False, "error": "skipped: out of time budget"})
                continue
            result = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--spec", str(spec_path),
                   "--result", str(result), "--device", device]
            t = time.perf_counter()
            try:
                proc = subprocess.run(cmd, env={**env, **extra_env}, timeout=limit, capture_output=True, text=True)
                tail = (proc.stdout + proc.stderr)[-1500:]
            except subprocess.TimeoutExpired:
                proc, tail = None, f"timed out after {limit:.0f} s"
            if result.exists():
                r = json.loads(result.read_text())
            else:
                r = {"model": name, "file": rel, "ok": False,
                     "error": f"worker died (exit {proc.returncode if proc else 'timeout'})", "log_tail": tail}
            r["wall_s"] = time.perf_counter() - t
            if r.get("ok"):
                r["summary"] = summarize(r["rows"])
            results.append(r)
            s = r.get("summary") or {}
            print(f"{name}: {'ok' if r.get('ok') else r.get('error')} in {r['wall_s']:.0f} s; "
                  f"bound equal {fmt(s.get('bound_agree_pct'))}%, within 30% {fmt(s.get('within_30_pct'))}%",
                  flush=True)

    rows = [row for r in results if r.get("ok") for row in r["rows"]]
    summary = summarize(rows)
    import fusion_advisor.analyze.profile as fp

    doc = {
        "benchmark": "profile_accuracy",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "versions": _versions(),
        "smoke": args.smoke,
        "setup": (("CPU, 1 intra-op thread; " if device == "cpu" else "")
                  + f"calibrate (quick={args.smoke}) then analyze --profile per model in its own process; "
                  f"{fp.DEFAULT_WARMUP_RUNS} warm-up runs, {fp.DEFAULT_RUNS} profiled runs, no_grad; "
                  f"within 30% means |est_in_model_us / measured_us - 1| <= {TIME_TOLERANCE}"),
        "calibrate_s": calibrate_s,
        "calibrate_error": calibrate_error,
        "spec": spec,
        "summary": summary,
        "by_pattern": by_pattern(rows),
        "models": [{k: v for k, v in r.items() if k != "rows"} for r in results],
        "worst": off_chains(rows),
        "wall_s": time.perf_counter() - start,
    }
    (out / OUT_FILES[1]).write_text(json.dumps(doc, indent=1, default=str))
    (out / OUT_FILES[2]).write_text(markdown(doc))
    import csv

    with open(out / OUT_FILES[3], "w", newline="") as f:
        cols = list(rows[0]) if rows else ["model"]
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print(f"bound class equal {fmt(summary['bound_agree_pct'])}% (target {TARGET_BOUND_PCT:.0f}), time within 30% "
          f"{fmt(summary['within_30_pct'])}% (target {TARGET_TIME_PCT:.0f}); {doc['wall_s']:.0f} s; wrote "
          + ", ".join(str(out / n) for n in OUT_FILES), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
