"""The cost model against measured profiles: per-chain rows, agreement, the time-ratio distribution, the page.

``benchmarks/accuracy/profile_accuracy.py`` runs ``analyze --profile`` over a set of models on a GPU and hands every
profiled chain to these functions; the arithmetic lives here so it is tested on the CPU. A chain's *ratio* is the
roofline's eager time in the model over its measured time (``ChainMeasurement.ratio``: predicted / measured, no
unit); it is *within* the target when ``|ratio - 1| <= TIME_TOLERANCE``. Bound classes are ``compute``, ``memory``
and ``launch`` (the roofline's class before rules against ``analyze --profile``'s measured one).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

#: Bound classes compared, in the confusion table's order.
BOUNDS = ("compute", "memory", "launch")
#: Targets of issue 5, %: bound class equal for >= 95% of chains, predicted time within +-30% for >= 80%.
TARGET_BOUND_PCT = 95.0
TARGET_TIME_PCT = 80.0
#: Largest ``|predicted / measured - 1|`` counted as within the target (30%).
TIME_TOLERANCE = 0.3
#: Ratio buckets (predicted / measured, [from, to)) of the distribution.
BUCKETS = ((0.0, 0.5), (0.5, 0.7), (0.7, 1.3), (1.3, 2.0), (2.0, math.inf))


def chain_rows(model: str, analysis: Any) -> list[dict[str, Any]]:
    """One row per chain of a profiled ``analysis`` (:class:`fusion_advisor.analyze.pipeline.Analysis` with ``profile``):
    ids, pattern, sizes (elements, bytes, FLOPs), predicted and measured bound class, the roofline's times and the
    measured ones (us), ratio, achieved GB/s and TFLOP/s, % of the roofline bound, source line and device kernels.
    Unmeasured chains (time 0) carry ``None`` for the ratio and rates.

    Raises:
        AttributeError: ``analysis.profile`` is ``None`` (the analysis was not profiled).
    """
    p = analysis.profile
    rows = []
    for c in analysis.chains:
        m, e, d = p.chains[c.id], analysis.estimates[c.id], analysis.decisions[c.id]
        rows.append({
            "model": model, "chain": c.id, "kind": c.kind, "pattern": c.pattern, "dtype": c.dtype,
            "eager_kernels": c.eager_kernels, "measured_kernels": m.kernels, "numel": c.numel,
            "eager_bytes": c.eager_bytes, "flops": c.flops,
            "predicted_bound": e.bound, "measured_bound": m.bound, "routed_bound": d.bound, "rule": d.rule_id,
            "est_eager_us": e.eager_us, "est_in_model_us": m.predicted_us, "measured_us": m.time_us,
            "measured_busy_us": m.busy_us, "measured_idle_us": m.idle_us,
            "ratio": m.ratio if m.time_us > 0 else None,
            "achieved_gbps": m.achieved_gbps if m.time_us > 0 else None,
            "achieved_tflops": m.achieved_tflops if m.time_us > 0 else None,
            "pct_of_roofline": m.pct_of_roofline if m.time_us > 0 else None,
            "source": f"{Path(c.source.file).name}:{c.source.line}" if c.source.file else "",
            "kernel_names": "; ".join(k[:80] for k in m.kernel_names[:8]),
        })
    return rows


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def summarize(rows: list[dict]) -> dict:
    """Confusion table, agreement and the ratio distribution over the chains of ``rows`` (:func:`chain_rows`) that
    have a finite ratio and a measured time.

    Returns ``chains``, ``bound_agree`` (+ ``_pct``), ``within_30`` (+ ``_pct`` and ``_time_weighted_pct``: the
    share of measured time in chains within :data:`TIME_TOLERANCE`), ``confusion`` (``[predicted][measured]``
    counts), ``ratio_quantiles`` (p10..p90), ``ratio_buckets`` (:data:`BUCKETS`) and ``targets``; percentages are
    ``None`` when no chain was measured.
    """
    measured = [r for r in rows if _finite(r.get("ratio")) and r["measured_us"] > 0]
    confusion = {p: {m: 0 for m in BOUNDS} for p in BOUNDS}
    for r in measured:
        if r["predicted_bound"] in confusion and r["measured_bound"] in BOUNDS:
            confusion[r["predicted_bound"]][r["measured_bound"]] += 1
    n = len(measured)
    agree = sum(confusion[b][b] for b in BOUNDS)
    within = [r for r in measured if abs(r["ratio"] - 1.0) <= TIME_TOLERANCE]
    total_time = sum(r["measured_us"] for r in measured)
    ratios = sorted(r["ratio"] for r in measured)

    def q(f: float) -> float | None:
        return ratios[min(int(f * len(ratios)), len(ratios) - 1)] if ratios else None

    buckets = [{"from": lo, "to": hi if math.isfinite(hi) else None,
                "chains": sum(1 for x in ratios if lo <= x < hi)} for lo, hi in BUCKETS]
    return {
        "chains": n,
        "bound_agree": agree,
        "bound_agree_pct": 100.0 * agree / n if n else None,
        "within_30": len(within),
        "within_30_pct": 100.0 * len(within) / n if n else None,
        "within_30_time_weighted_pct": (100.0 * sum(r["measured_us"] for r in within) / total_time
                                        if total_time else None),
        "confusion": confusion,
        "ratio_quantiles": {"p10": q(0.1), "p25": q(0.25), "p50": q(0.5), "p75": q(0.75), "p90": q(0.9)},
        "ratio_buckets": buckets,
        "targets": {"bound_agree_pct": TARGET_BOUND_PCT, "within_30_pct": TARGET_TIME_PCT},
    }


def fmt(x: Any, digits: int = 1) -> str:
    """``x`` with thousands separators and ``digits`` decimals; a dash for ``None`` or a non-finite float."""
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:,.{digits}f}"


def markdown(doc: dict) -> str:
    """The benchmark's page: device, versions, setup, the spec's rates, the result against the targets, the
    confusion table, the ratio distribution, per model, per pattern and the worst 25 chains.

    ``doc`` holds ``summary`` (:func:`summarize`), ``device_name``, ``date``, ``versions``, ``setup``, ``spec`` (a
    device spec dict: ``memory_bandwidth_gbps``, ``launch_overhead_us``, ``tensor_tflops``; ``name`` and
    ``calibrate_error`` when calibration failed), ``models`` (per model: ``model``, optional ``summary``,
    ``profile``, ``wall_s``, ``error``), ``by_pattern`` (:func:`by_pattern`) and ``worst`` (:func:`off_chains`).

    Raises:
        KeyError: ``doc`` lacks one of those keys.
    """
    s = doc["summary"]
    lines = [
        "# Profile accuracy: roofline predictions vs measured chains",
        "",
        f"{doc['device_name']}, {doc['date']}; " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()),
        "",
        f"Setup: {doc['setup']}",
        "",
        (f"Spec: shipped {doc['spec'].get('name')} (calibrate failed: {doc['calibrate_error']}) ("
         if doc.get("calibrate_error") else "Spec: calibrated here (")
        + f"{doc['spec']['memory_bandwidth_gbps']:,.0f} GB/s copy, launch "
        f"{doc['spec']['launch_overhead_us']:.2f} us per eager op, matmul TFLOP/s "
        + ", ".join(f"{k} {v:,.1f}" for k, v in doc["spec"]["tensor_tflops"].items()) + ").",
        "",
        "Compared: predicted EAGER chain time in the model (est_in_model_us: each op its own kernel, the host issuing "
        "one op per launch overhead, ahead of the GPU where it can) vs the measured unfused run; predicted bound = "
        "the roofline's class before rules.",
        "",
        "## Result",
        "",
        f"- bound class equal: **{s['bound_agree']} / {s['chains']} = {fmt(s['bound_agree_pct'])}%** "
        f"(target >= {TARGET_BOUND_PCT:.0f}%)",
        f"- time within +-30%: **{s['within_30']} / {s['chains']} = {fmt(s['within_30_pct'])}%** "
        f"(target >= {TARGET_TIME_PCT:.0f}%); weighted by measured time: {fmt(s['within_30_time_weighted_pct'])}%",
        "",
        "## Confusion table (rows: predicted, columns: measured)",
        "",
        "| predicted \\ measured | " + " | ".join(BOUNDS) + " |",
        "|---|" + "---:|" * len(BOUNDS),
    ]
    for p in BOUNDS:
        lines.append(f"| {p} | " + " | ".join(str(s["confusion"][p][m]) for m in BOUNDS) + " |")
    lines += ["", "## predicted / measured chain time", "",
              "| ratio | chains |", "|---|---:|"]
    for b in s["ratio_buckets"]:
        hi = "inf" if b["to"] is None else f"{b['to']:g}"
        lines.append(f"| [{b['from']:g}, {hi}) | {b['chains']} |")
    qs = s["ratio_quantiles"]
    lines += ["", "Quantiles: " + ", ".join(f"{k} {fmt(v, 2)}" for k, v in qs.items()), "",
              "## Per model", "",
              "| model | chains | bound equal % | within 30 % | profiled us/run | attributed % | wall us (instr.) | "
              "wall us (plain) | wall s | error |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for m in doc["models"]:
        ms = m.get("summary") or {}
        p = m.get("profile") or {}
        att = 100.0 * p["attributed_us"] / p["total_us"] if p.get("total_us") else None
        lines.append(f"| {m['model']} | {ms.get('chains', 0)} | {fmt(ms.get('bound_agree_pct'))} | "
                     f"{fmt(ms.get('within_30_pct'))} | {fmt(p.get('total_us'))} | {fmt(att)} | "
                     f"{fmt(p.get('wall_us'))} | {fmt(p.get('eager_wall_us'))} | {fmt(m.get('wall_s'))} | "
                     f"{m.get('error', '')} |")
    lines += ["", "## By pattern and predicted bound", "",
              "| pattern | predicted bound | chains | bound equal | within 30% | median ratio |",
              "|---|---|---:|---:|---:|---:|"]
    for g in doc["by_pattern"]:
        lines.append(f"| {g['pattern']} | {g['predicted_bound']} | {g['chains']} | {g['bound_agree']} | "
                     f"{g['within_30']} | {fmt(g['median_ratio'], 2)} |")
    lines += ["", "## Chains off by more than 30% or with another bound class (largest measured time first, 25 shown)",
              "", "| model | chain | pattern | kernels | predicted bound | measured bound | est. in model us "
              "| measured us | busy us | idle us | ratio | source | device kernels |",
              "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in doc["worst"][:25]:
        lines.append(f"| {r['model']} | {r['chain']} | {r['pattern']} | {r['eager_kernels']} | {r['predicted_bound']} "
                     f"| {r['measured_bound']} | {fmt(r['est_in_model_us'], 2)} | {fmt(r['measured_us'], 2)} | "
                     f"{fmt(r['measured_busy_us'], 2)} | {fmt(r['measured_idle_us'], 2)} | {fmt(r['ratio'], 2)} | "
                     f"{r['source']} | {r.get('kernel_names', '')[:120]} |")
    return "\n".join(lines) + "\n"


def _measured(rows: list[dict]) -> list[dict]:
    return [r for r in rows if _finite(r.get("ratio")) and r["measured_us"] > 0]


def off_chains(rows: list[dict]) -> list[dict]:
    """The measured chains off by more than :data:`TIME_TOLERANCE` or with another bound class, largest measured
    time first."""
    off = [r for r in _measured(rows)
           if abs(r["ratio"] - 1.0) > TIME_TOLERANCE or r["predicted_bound"] != r["measured_bound"]]
    return sorted(off, key=lambda r: r["measured_us"], reverse=True)


def by_pattern(rows: list[dict]) -> list[dict]:
    """Per (pattern, predicted bound) of the measured chains, most chains first: chains, bound agreements, chains
    within :data:`TIME_TOLERANCE` and the median ratio (the upper median for an even count)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in _measured(rows):
        groups.setdefault((r["pattern"], r["predicted_bound"]), []).append(r)
    out = []
    for (pattern, bound), rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ratios = sorted(r["ratio"] for r in rs)
        out.append({"pattern": pattern, "predicted_bound": bound, "chains": len(rs),
                    "bound_agree": sum(r["predicted_bound"] == r["measured_bound"] for r in rs),
                    "within_30": sum(abs(r["ratio"] - 1.0) <= TIME_TOLERANCE for r in rs),
                    "median_ratio": ratios[len(ratios) // 2]})
    return out
