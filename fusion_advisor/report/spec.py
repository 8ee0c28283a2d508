"""The device spec as the report shows it: the header's bandwidth, launch overhead, peaks and sources, the chart's
memory roof, every field flattened (:mod:`fusion_advisor.report.write` and :mod:`fusion_advisor.report.charts` read
it from here).

A report reads the spec as the analysis stored it (a mapping); names of fields vary between specs written by hand,
so each value is the first of several keys present.
"""

from __future__ import annotations

from typing import Any

from fusion_advisor.analyze.records import Analysis
from fusion_advisor.units import is_num

# Device-spec keys read for the header and the chart's memory roof / launch overhead; the first present wins.
# (The full spec is also shown field by field, so a key missing here is still in the report.)
_BANDWIDTH_KEYS = ("bandwidth_gbps", "memory_bandwidth_gbps", "mem_bandwidth_gbps", "hbm_bandwidth_gbps",
                   "dram_bandwidth_gbps", "bandwidth_GBps", "bandwidth")
_LAUNCH_KEYS = ("launch_overhead_us", "launch_us", "kernel_launch_us", "launch_latency_us")
_SOURCE_KEYS = ("sources", "source", "references", "refs")


def flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts as ``[("a.b", value), ...]``; lists/tuples of scalars joined with ', '."""
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict):
                out.extend(flatten(v, key))
            else:
                out.append((key, v))
    elif prefix:
        out.append((prefix, d))
    return out


# --- the header --------------------------------------------------------------------------------------------


def first(d: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in d and d[k] not in (None, ""):
            return d[k]
    return None


def tflops_entries(spec: dict[str, Any]) -> list[tuple[str, float]]:
    """Every ``*tflops*`` entry of the spec, flattened: ``[("peak_tflops.bf16", 989.0), ...]``."""
    out: list[tuple[str, float]] = []
    for key, value in flatten(spec):
        if "tflop" in key.lower() and is_num(value):
            out.append((key, float(value)))
    return out


def bandwidth_gbps(analysis: Analysis) -> tuple[float | None, str]:
    """Peak memory bandwidth in GB/s from the spec, else derived from the estimates (fused_bytes / memory_fused_us).

    Returns the value and where it came from.
    """
    value = first(analysis.device_spec, _BANDWIDTH_KEYS)
    if is_num(value) and value > 0:
        return float(value), "device spec"
    for chain in analysis.chains:
        est = analysis.estimates.get(chain.id)
        if est and chain.fused_bytes > 0 and is_num(est.memory_fused_us) and est.memory_fused_us > 0:
            # bytes / us = MB/s; / 1e3 -> GB/s
            return chain.fused_bytes / est.memory_fused_us / 1e3, f"derived from the estimate of {chain.id}"
    return None, ""


def spec_view(analysis: Analysis) -> dict[str, Any]:
    """What the header shows of the device spec."""
    spec = analysis.device_spec or {}
    bw, bw_from = bandwidth_gbps(analysis)
    peaks = []
    for key, tflops in tflops_entries(spec):
        # ridge point: peak FLOP/s / bandwidth B/s = (TFLOP/s * 1e12) / (GB/s * 1e9) FLOP/byte
        ridge = tflops * 1e12 / (bw * 1e9) if bw else None
        peaks.append({"name": key, "tflops": tflops, "ridge": ridge})
    sources = first(spec, _SOURCE_KEYS)
    if isinstance(sources, dict):
        sources = [f"{k}: {v}" for k, v in flatten(sources)]
    elif isinstance(sources, (list, tuple)):
        sources = [str(s) for s in sources]
    elif sources is not None:
        sources = [str(sources)]
    return {
        "name": spec.get("name") or spec.get("device") or "(unnamed)",
        "kind": spec.get("kind") or "gpu",
        "bandwidth_gbps": bw,
        "bandwidth_from": bw_from,
        "launch_overhead_us": first(spec, _LAUNCH_KEYS),
        "peaks": peaks,
        "sources": sources or [],
        "fields": [(k, field_text(v)) for k, v in flatten(spec)],
    }


def field_text(value: Any) -> str:
    """One device-spec field as the report's field table shows it: a rate table (a list of mappings: the measured
    convolutions, matmuls, reductions, attention rates) as its entry count and the keys of its entries, not the
    entries themselves: the H200 spec's 5,000 made report.html 1.6 MB for a 216-op model. report.json keeps the
    whole spec, and the spec's file is named by its name and sources."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        keys = list(dict.fromkeys(k for v in value for k in v))
        return f"{len(value):,} entries of {', '.join(keys)} (in report.json's device_spec and the spec's file)"
    return scalar_text(value)


def scalar_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)
