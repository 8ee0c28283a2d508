"""The plan: every swap decision of an ``apply`` run, in ``plan.yaml``, and the patched model rebuilt from it.

``plan.yaml`` records the model file, the options, the library versions, and per swap site its kernel, match
key (kernel, module path, source line, occurrence), match signature (input shapes/dtypes, captured constants),
chain ids, the analysis route, verification errors, timings, decision and reason; and every near-miss.

:func:`load_plan` rebuilds the patched model from it without re-verifying or re-benchmarking::

    model = get_model()                       # the same model class (weights may differ)
    fast = fusion_advisor.load_plan(model, "reports/llama/plan.yaml")
    loss = fast(input_ids, labels)            # eager rest; kernels swapped in where the plan kept them
    loss.backward()

:class:`PatchedModel` runs ``model`` through ``torch.compile`` with :class:`~fusion_advisor.apply.RewriteBackend`,
which rewrites each captured graph where a kept swap's key matches (recompiles for new shapes or grad mode match
again). The rest of the graph runs eagerly, or under Inductor with ``compile_rest=True`` (the plan records which
one apply measured faster on a GPU). Wrapping the patched model in ``torch.compile`` yourself works too: its
forward is then a graph break and the swaps stay (an outer compile would otherwise inline the model and silently
drop them); pass ``compile_rest=True`` to have the rest compiled. Recompiles follow dynamo's rules (``dynamic=False``:
one graph per input shape, up to dynamo's cache limit, after which dynamo runs the model eagerly, unpatched).
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml
from torch import nn

from fusion_advisor.apply import MatchKey, RewriteBackend
from fusion_advisor.errors import UserError

#: Format version of plan.yaml; :func:`read_plan` refuses other versions.
PLAN_VERSION = 1


class PlanError(UserError):
    """plan.yaml is missing, unreadable, of another version, or names kernels the library lacks."""


@dataclass(frozen=True)
class PlannedSwap:
    """A kept swap as the plan records it: what :class:`PatchedModel` needs to find and rewrite the site."""

    key: MatchKey
    signature: str = ""
    swap_id: str = ""


@dataclass
class Plan:
    """A parsed plan.yaml.

    Attributes:
        path: where it was read from.
        model: model name, file, convention, device, dtype at apply time.
        options: the apply options (margin, compile_rest, backward, candidates, ...).
        versions: torch, triton, python, GPU at apply time.
        swaps: every swap site's record (dicts, as written).
        kept: the kept swaps.
    """

    path: Path | None
    model: dict[str, Any]
    options: dict[str, Any]
    versions: dict[str, Any]
    swaps: list[dict[str, Any]]
    kept: list[PlannedSwap] = field(default_factory=list)

    @property
    def compile_rest(self) -> bool:
        return bool(self.options.get("compile_rest", False))


def render_plan(doc: dict[str, Any]) -> str:
    """plan.yaml text of a plan document (see :func:`fusion_advisor.apply.plan_document`)."""
    header = ("# fusion-advisor plan: every swap decision of one `apply` run.\n"
              "# Rebuild the patched model with fusion_advisor.load_plan(model, '<this file>').\n")
    return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)


def read_plan(path: str | Path) -> Plan:
    """Parse and validate plan.yaml.

    Raises:
        PlanError: missing file, invalid YAML, another format version, or a kept swap naming a kernel the
            library does not have (the message lists the known kernels).
    """
    path = Path(path)
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
    swaps = doc.get("swaps") or []
    if not isinstance(swaps, list):
        raise PlanError(f"{path}: 'swaps' must be a list")
    from kernel_library.registry import load_all

    known = load_all()
    kept: list[PlannedSwap] = []
    for i, s in enumerate(swaps):
        if not isinstance(s, dict) or "key" not in s:
            raise PlanError(f"{path}: swap #{i} has no 'key'")
        if not s.get("kept"):
            continue
        try:
            key = MatchKey.from_dict(s["key"])
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"{path}: swap {s.get('id', i)}: invalid key ({e})") from e
        if key.kernel not in known:
            raise PlanError(f"{path}: swap {s.get('id', i)} uses kernel {key.kernel!r}, which kernel_library does not "
                            f"have; known kernels: {', '.join(sorted(known)) or '(none)'}")
        kept.append(PlannedSwap(key=key, signature=str(s.get("signature", "")), swap_id=str(s.get("id", ""))))
    return Plan(path=path, model=dict(doc.get("model") or {}), options=dict(doc.get("options") or {}),
                versions=dict(doc.get("versions") or {}), swaps=swaps, kept=kept)


class PatchedModel(nn.Module):
    """``model`` with library kernels swapped in at the sites of ``swaps`` (see the module docstring).

    Args:
        model: the user's model (not modified; the wrapper holds it as ``.model``).
        swaps: the kept swaps (their keys decide which matches are rewritten).
        compile_rest: hand the rewritten graphs to Inductor instead of running them eagerly.
        kernels: ``{name: KernelEntry}`` to match; default the library's kernels named by ``swaps``.
    """

    def __init__(self, model: nn.Module, swaps: Sequence[PlannedSwap], compile_rest: bool = False,
                 kernels: dict[str, Any] | None = None):
        super().__init__()
        self.model = model
        self.swaps = list(swaps)
        self.compile_rest = compile_rest
        keys = {s.key for s in self.swaps}
        if kernels is None:
            from kernel_library.registry import load_all

            wanted = {k.kernel for k in keys}
            kernels = {n: e for n, e in load_all().items() if n in wanted}
        backend = RewriteBackend(kernels, select=lambda site: site.key in keys, compile_rest=compile_rest)
        # not attributes nn.Module registers: the compiled module would duplicate the parameters
        self.__dict__["backend"] = backend
        self.__dict__["_compiled"] = torch.compile(model, backend=backend, dynamic=False)
        self.__dict__["_outside"] = torch._dynamo.disable(self._call_compiled)

    def _call_compiled(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            # an outer torch.compile would inline the model and lose the swaps: run ours outside its graph
            return self._outside(*args, **kwargs)
        out = self._compiled(*args, **kwargs)
        if not self.__dict__.get("_checked"):
            self.__dict__["_checked"] = True
            missing = self.missing_swaps()
            if missing:
                import warnings

                warnings.warn(
                    f"{len(missing)} of {len(self.swaps)} kept swap(s) were not applied "
                    f"(see .problems()): {'; '.join(self.problems()[:3]) or 'no matching site in the model'}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return out

    def applied_swaps(self) -> list[MatchKey]:
        """Keys of the swaps rewritten into the graphs compiled so far (one entry per graph and swap)."""
        return self.backend.applied()

    def missing_swaps(self) -> list[MatchKey]:
        """Kept swaps never found in any graph compiled so far (the model changed, or it has not run yet)."""
        applied = set(self.backend.applied())
        return [s.key for s in self.swaps if s.key not in applied]

    def problems(self) -> list[str]:
        """Graphs that ran unrewritten or swaps that could not be rewritten, with the reasons."""
        out = []
        for g in self.backend.graphs:
            if g.error:
                out.append(f"graph {g.index}: {g.error} (ran unrewritten)")
            if g.compile_rest_error:
                out.append(f"graph {g.index}: Inductor failed ({g.compile_rest_error}); the rest ran eagerly")
            out += [f"graph {g.index}: {k} not rewritten: {why}" for k, why in g.skipped]
        # a missing swap's kernel refused the site it would have taken (dtype, row width, or tensors on a CPU
        # without TRITON_INTERPRET): say why, rather than leave "no matching site"
        missing = {k.kernel for k in self.missing_swaps()}
        for g in self.backend.graphs:
            for nm in getattr(g, "near_misses", ()):
                if nm.kind == "check" and nm.kernel in missing:
                    where = nm.module_path or str(nm.source)
                    text = f"graph {g.index}: at {where}: {nm.reason}"
                    if text not in out:
                        out.append(text)
        return out


def load_plan(model: nn.Module, plan: str | Path, compile_rest: bool | None = None) -> PatchedModel:
    """Rebuild the patched model of ``plan`` (a plan.yaml path) around ``model``, without re-benchmarking.

    Args:
        model: the model the plan was made for (same code; weights may differ).
        plan: path of plan.yaml.
        compile_rest: override the plan's choice of running the rest eagerly (False) or under Inductor (True).

    Raises:
        PlanError: see :func:`read_plan`.
    """
    p = read_plan(plan)
    if p.kept and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        import warnings

        warnings.warn(
            "no CUDA GPU and TRITON_INTERPRET is not set: library Triton kernels cannot run here, so the model "
            "runs unpatched; set TRITON_INTERPRET=1 before importing triton to run them (slowly) on the CPU",
            RuntimeWarning,
            stacklevel=2,
        )
    return PatchedModel(model, p.kept, compile_rest=p.compile_rest if compile_rest is None else compile_rest)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
