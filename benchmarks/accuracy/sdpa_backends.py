"""Which SDPA backend torch picks, how fast each backend runs, and how fast eager ops read permuted views, on a GPU.

For the cost model's attention and layout terms (fusion_advisor/analyze/sdpa.py, fusion_advisor/analyze/roofline.py):

1. Per attention config x dtype x seq x head_dim: the backend ``torch._fused_sdp_choice`` picks, the backend
   ``fusion_advisor.sdpa.rule_backend`` (the CPU-side rule) predicts, the default SDPA call's median time, TFLOP/s
   and kernels per call (torch.profiler, at seq 1024, head_dim 128), and each backend forced with ``torch.nn.attention.sdpa_kernel``
   (median time and TFLOP/s, or why it refused). Configs:

       causal        is_causal=True, no mask (decoder LMs)
       float_mask    additive mask [B, 1, S, S] of the q dtype (HF encoders)
       fp32_mask     additive fp32 mask [B, 1, S, S] with fp16/bf16 q (a mask left in fp32)
       bool_mask     boolean mask [B, 1, S, S]
       bool_pad_mask boolean padding mask [B, 1, 1, S] expanded to [B, 1, S, S] (stride 0), q/k/v permuted (HF BERT)
       gqa           32 query heads over 8 k/v heads, enable_gqa=True, causal
       permuted      q/k/v as proj(x).view(B, S, H, D).transpose(1, 2) (the layout models pass), no mask

   FLOPs as fusion_advisor.graph counts them: 4 b h s^2 d (halved when causal); batch x seq = 8192 tokens,
   heads x head_dim = 2048.
2. Bandwidth (read + written, GB/s) of eager ops on a permuted bf16 [B, 2048, 32, 128].transpose(1, 2) view
   (> L2): copies, and each op of the RoPE chain (mul by a broadcast cos, neg of a slice, cat of the halves, add of
   a permuted and a contiguous operand), with the row-major flag of each operand; and the whole RoPE chain's time.

Writes sdpa_backends.json (setup + rows) and sdpa_backends.csv (one row per config, dtype, seq, head_dim,
provider) to --out. Under ~2 minutes on an H200.

    python benchmarks/accuracy/sdpa_backends.py --out $OUT
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.kernel_tools.bench import device_kernels_per_call, time_cuda  # noqa: E402
from fusion_advisor.devices.attention_rates import attention_flops  # noqa: E402
from fusion_advisor.analyze.sdpa import args_of, rule_backend  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CONFIGS = ("causal", "float_mask", "fp32_mask", "bool_mask", "bool_pad_mask", "gqa", "permuted")
SEQS = (512, 1024, 2048, 4096)
HEAD_DIMS = (64, 128)
TOKENS, MODEL_DIM = 8192, 2048
WARMUP_MS, REP_MS = 5.0, 15.0
BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
            "math": "MATH"}
CODES = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn",
         "MATH": "math", "ERROR": "error", "OVERRIDEABLE": "overrideable"}


def make_inputs(config: str, dtype: torch.dtype, s: int, d: int) -> tuple[dict, int, int, bool]:
    """SDPA keyword arguments for one grid point, plus (batch, query heads, causal)."""
    b, h = max(1, TOKENS // s), max(1, MODEL_DIM // d)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

    causal = config in ("causal", "gqa")
    if config in ("permuted", "bool_pad_mask"):
        q, k, v = (rnd(b, s, h, d).transpose(1, 2) for _ in range(3))
    elif config == "gqa":
        hk = max(1, h // 4)
        q, k, v = rnd(b, h, s, d), rnd(b, hk, s, d), rnd(b, hk, s, d)
    else:
        q, k, v = rnd(b, h, s, d), rnd(b, h, s, d), rnd(b, h, s, d)
    kw = dict(query=q, key=k, value=v, is_causal=causal)
    if config == "float_mask":
        kw["attn_mask"] = torch.zeros(b, 1, s, s, device="cuda", dtype=dtype)
    elif config == "fp32_mask":
        kw["attn_mask"] = torch.zeros(b, 1, s, s, device="cuda", dtype=torch.float32)
    elif config == "bool_mask":
        kw["attn_mask"] = torch.ones(b, 1, s, s, device="cuda", dtype=torch.bool)
    elif config == "bool_pad_mask":
        kw["attn_mask"] = torch.ones(b, 1, 1, s, device="cuda", dtype=torch.bool).expand(b, 1, s, s)
    if config == "gqa":
        kw["enable_gqa"] = True
    return kw, b, h, causal


def fused_choice(kw: dict) -> str:
    from torch.nn.attention import SDPBackend

    try:
        code = torch._fused_sdp_choice(kw["query"], kw["key"], kw["value"], kw.get("attn_mask"), 0.0,
                                       kw["is_causal"], scale=None, enable_gqa=kw.get("enable_gqa", False))
        return CODES.get(SDPBackend(int(code)).name, str(code))
    except Exception as e:  # noqa: BLE001 - recorded
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"


def kernels_per_call(fn, iters: int = 3) -> float | None:
    """CUDA kernels (and memsets/copies) per call of ``fn`` (:func:`fusion_advisor.bench.device_kernels_per_call`),
    None if the profiler fails."""
    try:
        return device_kernels_per_call(fn, iters)
    except Exception:  # noqa: BLE001 - optional column
        return None


def attention_rows(quick: bool) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    seqs = SEQS[:2] if quick else SEQS
    for config in CONFIGS:
        for dname, dtype in DTYPES.items():
            if config == "fp32_mask" and dname == "fp32":
                continue
            for d in HEAD_DIMS:
                for s in seqs:
                    kw, b, h, causal = make_inputs(config, dtype, s, d)
                    flops = attention_flops(b, h, s, d, causal)
                    a = args_of(kw["query"], kw["key"], kw["value"], kw.get("attn_mask"), 0.0, causal,
                                kw.get("enable_gqa", False))
                    rule, why = rule_backend(a)
                    base = dict(config=config, dtype=dname, seq=s, head_dim=d, batch=b, heads=h, causal=causal,
                                flops=flops, torch_choice=fused_choice(kw), rule_choice=rule, rule_reason=why)
                    providers = [("default", None)] + [(n, getattr(SDPBackend, m, None)) for n, m in BACKENDS.items()]
                    for name, member in providers:
                        row = dict(base, provider=name)
                        fn = lambda: sdpa(**kw)  # noqa: E731
                        try:
                            with warnings.catch_warnings():
                                warnings.simplefilter("ignore")
                                if name == "default":
                                    t = time_cuda(fn, warmup_ms=WARMUP_MS, rep_ms=REP_MS)
                                    if s == 1024 and d == 128:  # the count does not depend on the size
                                        row["kernels_per_call"] = kernels_per_call(fn)
                                elif member is None:
                                    raise RuntimeError(f"no SDPBackend.{BACKENDS[name]} in this torch")
                                else:
                                    with sdpa_kernel([member]):
                                        t = time_cuda(fn, warmup_ms=WARMUP_MS, rep_ms=REP_MS)
                            row.update(median_ms=t.median_ms, iters=t.benchmark_iters,
                                       tflops=flops / (t.median_ms * 1e-3) / 1e12)
                        except Exception as e:  # noqa: BLE001 - a refusal is a result
                            row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
                        rows.append(row)
                    del kw
                    print(f"{config:10s} {dname} d={d:3d} s={s:4d}: torch {base['torch_choice']:9s} "
                          f"rule {rule:9s} " + " ".join(
                              f"{r['provider']}={r['tflops']:.0f}" if "tflops" in r else f"{r['provider']}=x"
                              for r in rows[-len(providers):]), flush=True)
                torch.cuda.empty_cache()
    return rows


def layout_rows() -> list[dict]:
    """Eager ops on the permuted q of a Llama layer, bf16 ``[B, 2048, 32, 128].transpose(1, 2)`` with B = 8 (1 GiB,
    > L2), one by one as the roofline sees them: the ops of the RoPE chain (``q * cos + rotate_half(q) * sin``)
    and copies. GB/s from bytes read + written (``fusion_advisor.graph.tensor_meta``: broadcast dims once), with
    whether each operand is read in row-major order (``TensorMeta.contiguous``): tells apart "any permuted input
    is slow" from "only a layout change between input and output is slow"."""
    from fusion_advisor.analyze.graph import tensor_meta

    b, s, h, d = 8, 2048, 32, 128
    x = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    cos = torch.randn(b, 1, s, d, device="cuda", dtype=torch.bfloat16)  # broadcast over heads, as in RoPE
    xt = x.transpose(1, 2)  # [B, H, S, D] view, permuted: the layout of q = proj(x).view(...).transpose(1, 2)
    xc = xt.contiguous()
    half = d // 2
    cases = {
        "copy_contiguous": (lambda: dst.copy_(xc), (xc,)),
        "copy_from_transpose": (lambda: dst.copy_(xt), (xt,)),
        "contiguous_call": (lambda: xt.contiguous(), (xt,)),
        "mul_contiguous_by_cos": (lambda: xc * cos, (xc, cos)),
        "mul_transpose_by_cos": (lambda: xt * cos, (xt, cos)),
        "mul_transpose_by_transpose": (lambda: xt * xt, (xt, xt)),
        "neg_transpose_slice": (lambda: -xt[..., half:], (xt[..., half:],)),
        "cat_transpose_halves": (lambda: torch.cat((xt[..., half:], xt[..., :half]), dim=-1),
                                 (xt[..., half:], xt[..., :half])),
        "add_transpose_contiguous": (lambda: xt + xc, (xt, xc)),
    }
    rows = []
    for name, (fn, inputs) in cases.items():
        out = fn()
        metas_in = [tensor_meta(t) for t in inputs]
        nbytes = sum(m.nbytes for m in metas_in) + tensor_meta(out).nbytes
        del out
        t = time_cuda(fn, warmup_ms=10.0, rep_ms=50.0)
        rows.append(dict(case=name, shape=[b, h, s, d], dtype="bf16", bytes=nbytes, median_ms=t.median_ms,
                         gbps=nbytes / (t.median_ms * 1e-3) / 1e9,
                         inputs_row_major=[m.contiguous for m in metas_in],
                         output_row_major=tensor_meta(fn()).contiguous))
        print(f"{name:28s} {rows[-1]['gbps']:8.0f} GB/s  in row-major {rows[-1]['inputs_row_major']} "
              f"out {rows[-1]['output_row_major']}", flush=True)
    sin = cos
    rope = lambda: xt * cos + torch.cat((-xt[..., half:], xt[..., :half]), dim=-1) * sin  # noqa: E731
    t = time_cuda(rope, warmup_ms=10.0, rep_ms=50.0)
    rows.append(dict(case="rope_chain_eager_5_ops", shape=[b, h, s, d], dtype="bf16", median_ms=t.median_ms))
    print(f"rope chain (5 eager ops)     {t.median_ms * 1e3:8.1f} us", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="seq 512 and 1024 only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sdpa_backends.py needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    setup = dict(
        gpu=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()),
        torch=torch.__version__, triton=triton_version, cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(), python=platform.python_version(),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        timer=f"fusion_advisor.bench.time_cuda (do_bench median, L2 flushed; {WARMUP_MS} ms warm-up, {REP_MS} ms)",
        tokens=TOKENS, model_dim=MODEL_DIM, flops="4 b h s^2 d, halved when causal",
        has_fused_sdp_choice=hasattr(torch, "_fused_sdp_choice"),
    )
    attn = attention_rows(args.quick)
    layout = layout_rows()
    default = [r for r in attn if r["provider"] == "default"]
    agree = sum(r["torch_choice"] == r["rule_choice"] for r in default)
    setup["rule_agrees_with_torch"] = f"{agree} / {len(default)}"
    print(f"rule_backend == torch._fused_sdp_choice on {agree} / {len(default)} configs")
    (args.out / "sdpa_backends.json").write_text(json.dumps(dict(setup=setup, attention=attn, layout=layout),
                                                            indent=1))
    keys = ["config", "dtype", "seq", "head_dim", "batch", "heads", "causal", "provider", "torch_choice",
            "rule_choice", "median_ms", "iters", "tflops", "kernels_per_call", "error", "rule_reason"]
    with open(args.out / "sdpa_backends.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys + ["gpu", "torch"], extrasaction="ignore")
        w.writeheader()
        for r in attn:
            w.writerow(dict(r, gpu=setup["gpu"], torch=setup["torch"]))


if __name__ == "__main__":
    main()
