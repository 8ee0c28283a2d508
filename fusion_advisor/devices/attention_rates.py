"""The fused-attention rates ``calibrate`` measures on a GPU: ``F.scaled_dot_product_attention`` TFLOP/s at one
Llama-7B layer shape per dtype (the spec's ``attention_tflops``, :func:`measure_attention_tflops`) and per backend
over a grid of sequence lengths, head dims, dtypes, masks and causality (``attention_rates``,
:func:`measure_attention_rates`), FLOPs counted as ``fusion_advisor.analyze.graph`` counts attention
(:func:`attention_flops`)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from fusion_advisor.dtypes import TORCH_DTYPES
from fusion_advisor.kernel_tools.bench import Timing, time_cuda

_DTYPES = {name: TORCH_DTYPES[name] for name in ("fp32", "bf16", "fp16")}

#: (batch, heads, seq, head_dim) of the attention measurement: a Llama-7B layer at 2 x 2048 tokens (non-causal).
ATTENTION_SHAPE = (2, 32, 2048, 128)

#: The per-backend SDPA grid (:func:`measure_attention_rates`): (backend, mask, causal). ``mask``: ``""`` none,
#: ``"float"`` an additive mask ``[B, 1, S, S]`` of the q dtype (zeros). Flash and cuDNN take no mask (measured
#: causal and not: newer torch builds pick cuDNN first on sm90); efficient is measured with a mask (HF models pass
#: one) and causal without one; math with a mask (the path masked models fall to).
ATTENTION_CONFIGS = (("flash", "", False), ("flash", "", True), ("cudnn", "", False), ("cudnn", "", True),
                     ("cudnn", "float", False), ("efficient", "float", False), ("efficient", "", True),
                     ("math", "float", False))
#: Dtypes of the grid. fp16 is not timed: each backend runs it at bf16's rate (the same tensor-core kernels), so a
#: spec prices fp16 attention by the bf16 entries (:data:`fusion_advisor.devices.HALF_TWIN`). Measured over the
#: full grid (64 fp16 / bf16 pairs per GPU, 2026-12-06): fp16 over bf16 0.93-1.04, median 1.00 on the H200
#: (benchmarks/results/h200/accuracy/matmul_layouts/calibrate/calibrated.yaml) and 0.93-1.03, median 1.00 on the
#: H100 (benchmarks/results/h100/accuracy/calibrate_time/before/calibrated.yaml); leaving it out saved 64 of the grid's
#: 192 points, seconds of calibrate's minute.
ATTENTION_DTYPES = ("bf16", "fp32")
#: Compute capability from which bf16 runs on the tensor cores (Ampere): below it flash and memory-efficient
#: attention refuse or emulate bf16, so fp16, the dtype such GPUs run, is timed as well (:func:`grid_dtypes`).
NATIVE_BF16_CAPABILITY = (8, 0)
ATTENTION_SEQS = (512, 1024, 2048, 4096)
ATTENTION_HEAD_DIMS = (64, 128)
#: batch x seq of every grid point (8 x 1024 tokens: batch 16 at 512, 2 at 4096).
ATTENTION_TOKENS = 8192
#: heads x head_dim of every grid point (32 heads of 64, 16 of 128).
ATTENTION_MODEL_DIM = 2048
#: do_bench budgets of one grid point (ms), small so that the grid's points (those a backend refuses fail at once) fit
#: in calibrate's minute: at 5 / 20 ms the grid took 12.9-16.4 s of the H200's 49-60 s full calibrate (2026-12-04,
#: benchmarks/results/h200/accuracy/reprofile/reduction_tables); each point's kernel is 0.05-3 ms, so 10 ms timed
#: is still 3 or more calls.
ATTENTION_WARMUP_MS, ATTENTION_REP_MS = 3.0, 10.0


def grid_dtypes() -> tuple[str, ...]:
    """The dtypes the SDPA grid times on this GPU: :data:`ATTENTION_DTYPES`, plus fp16 below
    :data:`NATIVE_BF16_CAPABILITY` (a T4's or V100's bf16 rates would misprice its fp16 attention)."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < NATIVE_BF16_CAPABILITY:
        return ("fp16",) + ATTENTION_DTYPES
    return ATTENTION_DTYPES


def measure_attention_tflops(dtype: str, timer: Callable[[Callable[[], Any]], Timing],
                             shape: tuple[int, int, int, int] = ATTENTION_SHAPE) -> float:
    """Fused attention TFLOP/s of ``F.scaled_dot_product_attention`` (non-causal; flash / memory-efficient kernels
    on a GPU) on q, k, v of ``shape`` = (batch, heads, seq, head_dim) in ``dtype``: ``4 b h s^2 d`` FLOPs (the two
    GEMMs, as ``fusion_advisor.analyze.graph`` counts attention) over the median time.

    Raises:
        RuntimeError: no CUDA device, or SDPA fails for that dtype.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("measure_attention_tflops needs a CUDA device")
    b, h, s, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=_DTYPES[dtype], generator=gen) for _ in range(3))
    t = timer(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    return 4 * b * h * s * s * d / (t.median_ms * 1e-3) / 1e12


def attention_flops(b: int, h: int, s: int, d: int, causal: bool) -> int:
    """FLOPs of SDPA on q, k, v ``[b, h, s, d]`` as ``fusion_advisor.analyze.graph`` counts them: ``4 b h s^2 d`` (the two
    GEMMs, a multiply-add counting 2), halved when causal."""
    flops = 4 * b * h * s * s * d
    return flops // 2 if causal else flops


def measure_attention_rates(timer: Callable[[Callable[[], Any]], Timing] | None = None,
                            seqs: tuple[int, ...] = ATTENTION_SEQS, head_dims: tuple[int, ...] = ATTENTION_HEAD_DIMS,
                            dtypes: tuple[str, ...] | None = None,
                            configs: tuple[tuple[str, str, bool], ...] = ATTENTION_CONFIGS,
                            ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """SDPA TFLOP/s per backend forced with ``torch.nn.attention.sdpa_kernel`` over the grid (see the module
    docstring); default timer: ``time_cuda`` with :data:`ATTENTION_WARMUP_MS` / :data:`ATTENTION_REP_MS`; default
    dtypes: :func:`grid_dtypes`.

    Returns:
        ``(rates, not_measured)``: rates as ``attention_rates`` entries (``backend``, ``dtype``, ``seq``,
        ``head_dim``, ``causal``, ``tflops``); ``not_measured`` maps ``"backend dtype [causal]"`` to why a
        backend could not run (first refusal only).

    Raises:
        RuntimeError: no CUDA device, or no ``torch.nn.attention.sdpa_kernel``.
    """
    import warnings

    if not torch.cuda.is_available():
        raise RuntimeError("measure_attention_rates needs a CUDA device")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    members = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
               "math": "MATH"}
    timer = timer or (lambda fn: time_cuda(fn, warmup_ms=ATTENTION_WARMUP_MS, rep_ms=ATTENTION_REP_MS))
    dtypes = dtypes or grid_dtypes()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rates: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for backend, mask_kind, causal in configs:
        member = getattr(SDPBackend, members[backend], None)
        for dtype in dtypes:
            label = f"{backend} {dtype}" + (" causal" if causal else "") + (" masked" if mask_kind else "")
            if member is None:
                skipped[label] = f"this torch has no SDPBackend.{members[backend]}"
                continue
            for d in head_dims:
                for s in seqs:
                    b, h = max(1, ATTENTION_TOKENS // s), max(1, ATTENTION_MODEL_DIM // d)
                    q = k = v = mask = None
                    try:
                        gen = torch.Generator(device="cuda").manual_seed(0)
                        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=_DTYPES[dtype], generator=gen)
                                   for _ in range(3))
                        if mask_kind:
                            mask = torch.zeros(b, 1, s, s, device="cuda", dtype=_DTYPES[dtype])
                        with warnings.catch_warnings(), sdpa_kernel([member]):
                            warnings.simplefilter("ignore")
                            t = timer(lambda: sdpa(q, k, v, attn_mask=mask, is_causal=causal))
                    except (RuntimeError, NotImplementedError, ValueError) as e:  # refused, or out of memory
                        skipped.setdefault(label, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}")
                        continue
                    finally:
                        q = k = v = mask = None  # free before the next, larger point
                    rates.append({"backend": backend, "dtype": dtype, "seq": s, "head_dim": d, "causal": causal,
                                  "masked": bool(mask_kind),
                                  "tflops": round(attention_flops(b, h, s, d, causal) / (t.median_ms * 1e-3) / 1e12,
                                                  3)})
            torch.cuda.empty_cache()
    return rates, skipped
