"""Which device profiled reports are of, before they are fitted together or judged against a spec: the spec
each was analysed with (by contents), the GPU model that ran it, CPU or GPU.

Used by :mod:`fusion_advisor.devices.fit_profiles` (``calibrate --from-profile``) and the accuracy judge
(benchmarks/accuracy/judge_reports.py).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from fusion_advisor.devices import DeviceSpec
from fusion_advisor.errors import UserError
from fusion_advisor.units import fmt_some

#: A profiled report read back (:class:`fusion_advisor.devices.fit_profiles.ProfiledReport`: ``name``, ``spec``,
#: ``analysis``); typed loosely here so that this module does not import the one that imports it.
ProfiledReport = Any


def _spec_contents(spec: DeviceSpec) -> DeviceSpec:
    """``spec`` without its source notes: what two reports' specs must share to be fitted together."""
    return replace(spec, sources=None, source="")


def reports_by_spec(reports: list[ProfiledReport]) -> dict[str, list[str]]:
    """The reports' names by the spec they were analysed with, compared by contents (:func:`_spec_contents`): an
    older spec of the same name has other rates and host prices. A spec's label is its name, with ``(version n of
    m by its contents)`` where reports hold m specs of that name (n in the order the reports hold them)."""
    versions: dict[str, list[DeviceSpec]] = {}  # name -> its distinct contents, in order
    which: list[tuple[str, int]] = []
    for r in reports:
        c, seen = _spec_contents(r.spec), versions.setdefault(r.spec.name, [])
        if c not in seen:
            seen.append(c)
        which.append((r.spec.name, seen.index(c)))
    out: dict[str, list[str]] = {}
    for r, (name, i) in zip(reports, which, strict=True):
        n = len(versions[name])
        out.setdefault(name if n < 2 else f"{name} (version {i + 1} of {n} by its contents)", []).append(r.name)
    return out


#: A GPU model in a device name: a letter or two and two to four digits (H100, H200, A100, L4, RTX 4090's 4090).
_GPU_MODEL = re.compile(r"\b[a-z]{0,3}\d{1,4}[a-z]?\b")


def _gpu_models(name: str) -> set[str]:
    """The GPU model tokens of a device name (``"NVIDIA H100 80GB HBM3"`` -> ``{"h100"}``; sizes such as ``80gb``
    and memory kinds such as ``hbm3`` are not models)."""
    return {t for t in _GPU_MODEL.findall(name.lower()) if not t.endswith("gb") and not t.startswith("hbm")
            and any(c.isalpha() for c in t)}


def other_gpu_notes(reports: list[ProfiledReport], spec: DeviceSpec) -> list[str]:
    """A note per GPU that profiled some of ``reports`` whose model (:func:`_gpu_models` of its name) is not the
    spec's device's (of its ``display_name``, which calibrate sets to the GPU's own name): H100 profiles fitted
    into (or judged on) an H200 spec price one GPU's times with another's rates, which nothing else would say. No
    claim where either name holds no model token, for CPU specs or for CPU profiles."""
    models = _gpu_models(spec.display_name)
    if spec.kind != "gpu" or not models:
        return []
    by_gpu: dict[str, list[str]] = {}
    for r in reports:
        p = r.analysis.profile
        theirs = _gpu_models(p.device_name) if p is not None and p.device == "cuda" else set()
        if theirs and not theirs & models:
            by_gpu.setdefault(p.device_name, []).append(r.name)
    return [f"{len(names)} report(s) were profiled on {gpu}, not on the spec's {spec.display_name} "
            f"({fmt_some(names)}): their times are set against another GPU's rates" for gpu, names in by_gpu.items()]


def check_device_kind(reports: list[ProfiledReport], spec: DeviceSpec) -> None:
    """Raises UserError when profiles taken on a CPU would be fitted into a GPU's spec or the other way round: a
    fresh user's CPU profiles fitted with ``--base h200`` wrote an "NVIDIA H200" spec pricing a GEMM 3.2x slower
    and read 5.33x vs eager, with no warning."""
    want = "cuda" if spec.kind == "gpu" else "cpu"
    other = [r.name for r in reports if r.analysis.profile is not None and r.analysis.profile.device != want]
    if other:
        ran = "a CPU" if want == "cuda" else "a GPU"
        raise UserError(f"{len(other)} report(s) were profiled on {ran} ({fmt_some(other)}), and the spec to "
                        f"fit, {spec.name}, is {'a GPU' if want == 'cuda' else 'a CPU'}'s: their times would price it "
                        f"like that device; fit them into a spec of the device they ran on (--base "
                        f"{'cpu' if want == 'cuda' else 'h200'}, or the spec calibrate wrote there)")
