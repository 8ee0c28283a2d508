"""The plan: every decision of an ``apply`` run in ``plan.yaml``, and the chosen model rebuilt from it.

``plan.yaml`` records the model file, the options, the library versions and GPU, every whole-model variant apply
tried (its spec, check against float64, steady-state time and spread, first-call time, peak memory, status and
reason), the chosen variant and why, the regions of the captured graphs, and per swap site its kernel, match key,
verification, timings, decision and reason, and every near-miss.

:func:`load_plan` rebuilds the chosen variant around the user's model without re-verifying or re-timing::

    model = get_model()                       # the same model class (weights may differ)
    fast = fusion_advisor.load_plan(model, "reports/llama/plan.yaml")
    with torch.no_grad():                     # as apply timed it (without --backward)
        out = fast(*inputs)                   # compiles / captures on the first call, as apply did

The rebuilt model is a :class:`~fusion_advisor.apply.variants.PlannedModel`: compilation and CUDA-graph capture
happen lazily on its first call (with the warm-up cudagraph trees do themselves); a torch, Triton or GPU other
than the plan's is reported with a warning, since the measured choice may not hold there.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import inspect
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from fusion_advisor.apply.records import AS_WRITTEN, VariantSpec
from fusion_advisor.apply.variants import PlannedModel
from fusion_advisor.dtypes import TORCH_DTYPES, dtype_name
from fusion_advisor.errors import UserError

#: Format version of plan.yaml; :func:`read_plan` refuses other versions (1: swaps only, before variants).
PLAN_VERSION = 2


class PlanError(UserError):
    """plan.yaml is missing, unreadable, of another version, or names kernels the library lacks."""


@dataclass
class Plan:
    """A parsed plan.yaml.

    Attributes:
        path: where it was read from.
        model: model name, file, convention, device, dtype at apply time.
        options: the apply options.
        versions: torch, triton, python, GPU at apply time.
        chosen: the chosen variant (the model as written when apply chose nothing).
        chosen_reason: why.
        variants, swaps: every variant's and every swap site's record (dicts, as written).
    """

    path: Path | None
    model: dict[str, Any]
    options: dict[str, Any]
    versions: dict[str, Any]
    chosen: VariantSpec
    chosen_reason: str = ""
    variants: list[dict[str, Any]] = field(default_factory=list)
    swaps: list[dict[str, Any]] = field(default_factory=list)


def render_plan(doc: dict[str, Any]) -> str:
    """plan.yaml text of a plan document (:func:`fusion_advisor.apply.outputs.plan_document`)."""
    header = ("# fusion-advisor plan: every variant and swap decision of one `apply` run.\n"
              "# Rebuild the chosen model with fusion_advisor.load_plan(model, '<this file>').\n")
    return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)


def read_plan(path: str | Path) -> Plan:
    """Parse and validate plan.yaml.

    ``path``: plan.yaml, or the folder apply wrote it into.

    Raises:
        PlanError: missing file (or a folder without one), invalid YAML, another format version, a malformed
            chosen variant, a file cut short or whose chosen swaps disagree with its summary, or a swap naming a
            kernel the library does not have (the message lists the known kernels).
    """
    path = Path(path)
    if path.is_dir() and (path / "plan.yaml").is_file():  # the report folder apply wrote into
        path = path / "plan.yaml"
    if path.is_dir():
        raise PlanError(f"{path}: is a folder without a plan.yaml; give the plan.yaml apply wrote")
    if not path.is_file():
        raise PlanError(f"{path}: no such plan file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise PlanError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(doc, dict) or "fusion_advisor_plan" not in doc:
        raise PlanError(f"{path}: not a fusion-advisor plan (no 'fusion_advisor_plan' key)")
    if doc["fusion_advisor_plan"] != PLAN_VERSION:
        raise PlanError(f"{path}: plan format version {doc['fusion_advisor_plan']!r}; this fusion-advisor reads "
                        f"version {PLAN_VERSION}: run apply again")
    chosen_doc = doc.get("chosen")
    if chosen_doc is None:
        spec = VariantSpec("eager", AS_WRITTEN, why="apply chose no variant")
    else:
        if not isinstance(chosen_doc, dict) or not isinstance(chosen_doc.get("spec"), dict):
            raise PlanError(f"{path}: 'chosen' must hold a 'spec' mapping")
        try:
            spec = VariantSpec.from_dict(chosen_doc["spec"])
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{path}: the chosen variant's spec is invalid: {e}") from e
    _check_complete(path, doc, spec, chosen_doc is not None)
    _check_kernels(path, spec)
    swaps = doc.get("swaps") or []
    if not isinstance(swaps, list):
        raise PlanError(f"{path}: 'swaps' must be a list")
    return Plan(path=path, model=dict(doc.get("model") or {}), options=dict(doc.get("options") or {}),
                versions=dict(doc.get("versions") or {}), chosen=spec,
                chosen_reason=str((chosen_doc or {}).get("reason", "")), variants=list(doc.get("variants") or []),
                swaps=swaps)


#: The last section every plan of this format holds (:func:`fusion_advisor.apply.outputs.plan_document` writes it
#: after the variants, swaps and warnings; the ``columns`` glossary after it came later): a plan without it was cut
#: short.
LAST_SECTION = "timings_s"


def _check_complete(path: Path, doc: dict[str, Any], spec: VariantSpec, chosen: bool) -> None:
    """Raises PlanError when plan.yaml was cut short (no :data:`LAST_SECTION`) or its chosen variant holds
    another number of swaps than its summary counts: YAML cut at a line still parses, and a fresh user's plan cut
    to 62 lines rebuilt a swap-free model, cut to 74 one of its two swaps, with no word."""
    if LAST_SECTION not in doc:
        raise PlanError(f"{path}: the plan is cut short (its last section, {LAST_SECTION!r}, is missing): restore "
                        f"the file or run apply again")
    summary = doc.get("summary")
    counted = summary.get("swaps_in_plan") if isinstance(summary, dict) else None
    if chosen and isinstance(counted, int) and counted != len(spec.swaps):
        raise PlanError(f"{path}: the chosen variant lists {len(spec.swaps)} swap(s) where the plan's summary "
                        f"counts {counted}: the file was edited or cut; restore it or run apply again")


def _check_kernels(path: Path, spec: VariantSpec) -> None:
    """Raises PlanError when a swap of ``spec`` names a kernel the library does not have."""
    from kernel_library.registry import load_all

    known = load_all()
    for s in spec.swaps:
        if s.key.kernel not in known:
            raise PlanError(f"{path}: swap {s.swap_id or s.key} uses kernel {s.key.kernel!r}, which kernel_library "
                            f"does not have; known kernels: {', '.join(sorted(known)) or '(none)'}")


def variant_spec(plan: Plan, name: str) -> VariantSpec:
    """The spec of the variant called ``name`` in ``plan``, one apply found correct (checked against float64).

    Raises:
        PlanError: no such variant, or it was not correct (wrong, failed, skipped, not timed); the message lists
            the correct ones with their time and peak memory.
    """
    correct = [v for v in plan.variants if v.get("status") in ("correct", "chosen")]
    found = next((v for v in plan.variants if v.get("name") == name), None)
    if found is None or found not in correct:
        def line(v: dict[str, Any]) -> str:
            t = v.get("timing") or {}
            ms, peak = t.get("ms"), t.get("peak_mb")
            return (f"{v.get('name')!r}" + (f" ({ms:.4g} ms" if ms is not None else " (not timed")
                    + (f", peak {peak:.0f} MiB)" if peak is not None else ")"))
        why = "is not in it" if found is None else f"was {found.get('status', 'not correct')}"
        raise PlanError(f"{plan.path}: variant {name!r} {why}; the plan's correct variants: "
                        f"{', '.join(line(v) for v in correct) or '(none)'}")
    try:
        spec = VariantSpec.from_dict(found["spec"])
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"{plan.path}: variant {name!r}'s spec is invalid: {e}") from e
    _check_kernels(plan.path, spec)
    return spec


def version_differences(plan_versions: dict[str, Any]) -> list[str]:
    """What differs between the plan's torch / Triton / GPU and this process's (``"torch 2.11.0 -> 2.13.0"``)."""
    from fusion_advisor.analyze.pipeline import versions

    now = versions()
    out = []
    for key in ("torch", "triton", "gpu", "cuda"):
        then = plan_versions.get(key)
        if then is not None and str(now.get(key, "none")) != str(then):
            out.append(f"{key} {then} -> {now.get(key, 'none')}")
    return out


def model_signature(model: nn.Module) -> dict[str, Any]:
    """What identifies the model a plan was made for, whatever its weights: its class, how many parameters and
    buffers it holds, and a digest of their names, shapes and dtypes (SHA-1 prefix). Recorded in plan.yaml's
    ``model.signature``; :func:`load_plan` warns when the model it is given differs."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    text = "\n".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in sorted(tensors, key=lambda x: x[0]))
    return {"class": type(model).__qualname__, "tensors": len(tensors),
            "digest": hashlib.sha1(text.encode()).hexdigest()[:16]}


def source_digest(path: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of a model file's bytes, recorded in plan.yaml's ``model.source_sha256``;
    ``""`` where the file cannot be read (the built-in model)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def source_difference(recorded: Any, model: nn.Module, keyed: bool = True) -> str:
    """A line when the file ``model``'s class is defined in is the plan's model file (by name) and its bytes
    changed since apply read it (``model.source_sha256``), else ``""``. ``keyed``: the plan has swaps or regions,
    which are keyed by source lines (an edited file may put other code under them); else the line says only that
    the code apply measured changed."""
    if not isinstance(recorded, dict) or not recorded.get("source_sha256") or not recorded.get("file"):
        return ""
    try:
        src = inspect.getsourcefile(type(model))
    except TypeError:  # a class without a source file
        return ""
    if not src or Path(src).name != Path(str(recorded["file"])).name:
        return ""
    now = source_digest(src)
    if not now or now == recorded["source_sha256"]:
        return ""
    why = ("the plan's swaps and regions are keyed by its source lines and may now meet other code, or none" if keyed
           else "the choice was measured on the code as it was")
    return f"{src} changed since apply made this plan from it (its SHA-256 differs): {why}; run apply again"


def signature_difference(recorded: Any, model: nn.Module) -> str:
    """How ``model`` differs from the signature a plan recorded (:func:`model_signature`), ``""`` when it does not
    or the plan recorded none (plans written before the signature existed)."""
    if not isinstance(recorded, dict) or not recorded.get("digest"):
        return ""
    now = model_signature(model)
    if now["digest"] == recorded.get("digest"):
        return ""
    return (f"the plan was made for a {recorded.get('class', '?')} with {recorded.get('tensors', '?')} parameters "
            f"and buffers, this is a {now['class']} with {now['tensors']}"
            + ("" if now["class"] != recorded.get("class") or now["tensors"] != recorded.get("tensors")
               else " whose names, shapes or dtypes differ"))


def dtype_hint(recorded: Any, model: nn.Module) -> str:
    """What to do when the plan was made with ``--dtype`` (``recorded``: ``"bf16"``) and ``model``'s floating
    parameters are of another dtype: cast it and its inputs; ``""`` otherwise (a fresh user's fp32 model, loaded
    with its bf16 plan, was told its names, shapes or dtypes differ and to run apply for a plan of its own)."""
    want = TORCH_DTYPES.get(str(recorded or ""))
    have = next((t.dtype for t in model.parameters() if t.is_floating_point()), None)
    if want is None or have is None or have == want:
        return ""
    return (f"the plan was made with --dtype {recorded} and this model's parameters are {dtype_name(have)}: cast "
            f"the model and its inputs first (model.to({want}))")


def load_plan(model: nn.Module, plan: str | Path, variant: str | None = None) -> PlannedModel:
    """Rebuild the chosen variant of ``plan`` (a plan.yaml path) around ``model``, without re-verifying or
    re-timing; compilation and capture happen on its first call. ``model`` is not modified: a channels-last plan
    runs a copy in that layout for inference, which takes ``model``'s weights where they change in place
    (``load_state_dict``), and runs ``model`` itself in training or grad mode. Warns where ``model`` is in training
    mode while the plan was made forward only (apply checks and times in eval mode).

    Args:
        model: the model the plan was made for (same code; weights may differ; a warning when its class,
            parameter names, shapes or dtypes differ from the plan's ``model.signature``).
        plan: path of plan.yaml, or of the folder apply wrote it into.
        variant: another variant apply found correct, by name (``"swaps+eager"``), instead of the chosen one: e.g.
            the one of lowest peak memory (plan.yaml and variants.csv give each variant's time and peak).

    Raises:
        PlanError (``fusion_advisor.PlanError``): no plan.yaml there, one that does not parse or is not a plan,
            of another format version, cut short, or whose chosen swaps disagree with its summary
            (``fusion_advisor.apply.plan.read_plan``); a ``variant`` the plan does not hold as correct
            (``fusion_advisor.apply.plan.variant_spec``).
    """
    p = read_plan(plan)
    if variant is not None:
        p.chosen = variant_spec(p, variant)
    edited = source_difference(p.model, model, keyed=bool(p.chosen.swaps or p.chosen.regions))
    if edited:
        warnings.warn(f"{plan}: {edited}", RuntimeWarning, stacklevel=2)
    other = signature_difference(p.model.get("signature"), model)
    if other:
        cast = dtype_hint(p.model.get("dtype"), model)
        warnings.warn(f"{plan}: {other}: " + (cast if cast else "the plan's swaps and regions may not fit this "
                                               "model; run apply on this model for a plan of its own"),
                      RuntimeWarning, stacklevel=2)
    if model.training and not p.options.get("backward"):
        warnings.warn(f"{plan}: the model is in training mode, and apply checked and timed this plan in eval mode "
                      f"(dropout off, batch norm on running statistics): call model.eval() for the model it measured",
                      RuntimeWarning, stacklevel=2)
    diffs = version_differences(p.versions)
    if diffs:
        warnings.warn(f"{plan}: the plan was measured with another stack ({'; '.join(diffs)}); its choice "
                      f"({p.chosen.name}) may not be the fastest here: run apply again to re-measure",
                      RuntimeWarning, stacklevel=2)
    if p.chosen.swaps and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        warnings.warn(
            "no CUDA GPU and TRITON_INTERPRET is not set: library Triton kernels cannot run here, so the model "
            "runs unpatched; set TRITON_INTERPRET=1 before importing triton to run them (slowly) on the CPU",
            RuntimeWarning,
            stacklevel=2,
        )
    return PlannedModel(model, p.chosen)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
