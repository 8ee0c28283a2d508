"""The YAML rule engine: load, validate and match routing rules.

A rules file::

    version: 1
    name: default
    rules:
      - id: skip-matmul                 # unique id, recorded on every chain it decides
        description: Lone GEMMs go to cuBLAS.
        match:                          # every condition must hold; an absent one matches anything
          kind: [heavy]
          categories_any: [matmul]
        route: skip                     # skip | torch.compile | triton | cudagraphs
        kernel: auto                    # triton routes: a kernel_library name, or auto (the kernel that
                                        #   replaces the chain's pattern)
        bound: memory                   # optional: override the roofline's bound class
        reason: "{pattern}: AI {arithmetic_intensity:.0f} FLOP/B vs ridge {ridge_point:.0f}"

``measured_bound`` matches the bound class measured by ``analyze --profile`` (:mod:`fusion_advisor.analyze.profile`); a
chain without a measurement never matches it, so rules using it change nothing in a static analysis.

Rules are tried in order, first match wins; the user's ``--rules`` files come before the shipped ones, so they
can override them. Match conditions are listed in :data:`CONDITIONS`; the fields a reason template may cite in
:data:`TEMPLATE_FIELDS`.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from fusion_advisor.errors import RulesError
from fusion_advisor.analyze.records import BOUNDS, ROUTES, Chain, ChainMeasurement, Estimate
from fusion_advisor.analyze.sdpa import BACKENDS as SDPA_BACKENDS
from fusion_advisor.dtypes import COMPLEX_NAMES, FLOAT_NAMES
from fusion_advisor.units import fmt_bytes, fmt_flops, mib


def _shipped_rules() -> Path:
    """rules/default.yaml: beside the package in a checkout, package data (fusion_advisor.shipped_rules) when installed."""
    in_checkout = Path(__file__).resolve().parents[2] / "rules" / "default.yaml"
    if in_checkout.is_file():
        return in_checkout
    from importlib.resources import files

    return Path(str(files("fusion_advisor.shipped_rules") / "default.yaml"))


SHIPPED_RULES = _shipped_rules()
SCHEMA_VERSION = 1


def _features(chain: Chain, est: Estimate, measured: ChainMeasurement | None = None) -> dict[str, Any]:
    """The chain features rules match on and reason templates cite.

    Measured features (``measured_bound``, ``measured_us``) come from ``analyze --profile``; without a measurement
    ``measured_bound`` is ``""`` (no ``measured_bound`` condition matches it) and ``measured_us`` is NaN.
    """
    has = measured is not None and measured.time_us > 0
    return {
        "measured_bound": measured.bound if has else "",
        "measured_us": measured.time_us if has else float("nan"),
        "id": chain.id,
        "kind": chain.kind,
        "pattern": chain.pattern,
        "categories": set(chain.categories),
        "dtype": chain.dtype,
        "bound": est.bound,
        "eager_kernels": chain.eager_kernels,
        "numel": chain.numel,
        "out_numel": chain.out_numel,
        "row_elems": chain.row_elems,
        "flops": chain.flops,
        "eager_bytes": chain.eager_bytes,
        "fused_bytes": chain.fused_bytes,
        "bytes_saved": chain.bytes_saved,
        "arithmetic_intensity": chain.arithmetic_intensity,
        "ridge_point": est.ridge_point,
        "eager_us": est.eager_us,
        "fused_us": est.fused_us,
        "saving_us": est.saving_us,
        "compute_us": est.compute_us,
        "compile_us": est.route_us("torch.compile"),
        "triton_us": est.route_us("triton"),
        "cudagraphs_us": est.route_us("cudagraphs"),
        "memory_fused_us": est.memory_fused_us,
        "launch_eager_us": est.launch_eager_us,
        "peak_tflops": est.peak_tflops,
        "epilogue": bool(chain.epilogue_of),
        "epilogue_of": chain.epilogue_of,
        "prologue_of": chain.prologue_of,
        "module_path": chain.module_path,
        "attention_backend": chain.attention_backend,
        # the same numbers in the units a reader expects (a reason never quotes a raw byte count)
        "eager_size": fmt_bytes(chain.eager_bytes),
        "fused_size": fmt_bytes(chain.fused_bytes),
        "saved_size": fmt_bytes(chain.bytes_saved),
        "eager_mib": mib(chain.eager_bytes),
        "fused_mib": mib(chain.fused_bytes),
        "saved_mib": mib(chain.bytes_saved),
        "gflop": chain.flops / 1e9,
        "work": fmt_flops(chain.flops),
        # the roofline's time over the estimate: how near the chain runs to its ceiling (a table-priced GEMM of a
        # shape cuBLAS runs badly far below 100)
        "roofline_pct": 100.0 * max(est.compute_us, est.memory_fused_us) / est.eager_us if est.eager_us > 0 else 0.0,
    }


#: Fields a reason template may cite. Sizes: ``eager_size`` / ``fused_size`` / ``saved_size`` are text with a
#: binary unit ("336.0 MiB", :func:`fusion_advisor.units.fmt_bytes`), ``*_mib`` the same in MiB (float);
#: ``eager_bytes`` / ``fused_bytes`` / ``bytes_saved`` are raw byte counts (for conditions and CSVs: the shipped
#: reasons quote the sized ones). ``gflop``: FLOPs / 1e9; ``work``: the FLOPs as text with a decimal prefix
#: ("524.3 kFLOP", :func:`fusion_advisor.units.fmt_flops`: a tiny GEMM read "0.000 GFLOP"). Times are us,
#: ``peak_tflops`` TFLOP/s. ``roofline_pct``: the roofline's time (the larger of ``compute_us`` and
#: ``memory_fused_us``) as a percentage of ``eager_us``.
#: ``attention_backend``: the SDPA backend of an attention item (``flash``, ``efficient``, ``cudnn``, ``math``; ``""``
#: for other items).
TEMPLATE_FIELDS = (
    "id", "kind", "pattern", "dtype", "bound", "eager_kernels", "numel", "row_elems", "flops", "eager_bytes",
    "fused_bytes", "bytes_saved", "arithmetic_intensity", "ridge_point", "eager_us", "fused_us", "saving_us",
    "compute_us", "memory_fused_us", "launch_eager_us", "peak_tflops", "epilogue", "epilogue_of", "prologue_of",
    "module_path",
    "compile_us", "triton_us", "cudagraphs_us",
    "kernel", "route", "measured_bound", "measured_us", "attention_backend", "eager_size", "fused_size",
    "saved_size", "eager_mib", "fused_mib", "saved_mib", "gflop", "work", "roofline_pct",
)


def _one_of(values: Any) -> list[Any]:
    return list(values) if isinstance(values, (list, tuple)) else [values]


#: condition name -> (expected YAML type, predicate(features, value)).
CONDITIONS: dict[str, tuple[type | tuple[type, ...], Callable[[dict[str, Any], Any], bool]]] = {
    "kind": ((str, list), lambda f, v: f["kind"] in _one_of(v)),
    "pattern": ((str, list), lambda f, v: f["pattern"] in _one_of(v)),
    "categories_any": ((str, list), lambda f, v: bool(f["categories"] & set(_one_of(v)))),
    "categories_all": ((str, list), lambda f, v: set(_one_of(v)) <= f["categories"]),
    "bound": ((str, list), lambda f, v: f["bound"] in _one_of(v)),
    "measured_bound": ((str, list), lambda f, v: f["measured_bound"] in _one_of(v)),
    "dtype": ((str, list), lambda f, v: f["dtype"] in _one_of(v)),
    "min_kernels": (int, lambda f, v: f["eager_kernels"] >= v),
    "max_kernels": (int, lambda f, v: f["eager_kernels"] <= v),
    "min_elements": (int, lambda f, v: f["numel"] >= v),
    "max_elements": (int, lambda f, v: f["numel"] <= v),
    "min_out_elements": (int, lambda f, v: f["out_numel"] >= v),
    "max_out_elements": (int, lambda f, v: f["out_numel"] <= v),
    "min_row_elems": (int, lambda f, v: f["row_elems"] >= v),
    "max_row_elems": (int, lambda f, v: f["row_elems"] <= v),
    "min_intensity": ((int, float), lambda f, v: f["arithmetic_intensity"] >= v),
    "max_intensity": ((int, float), lambda f, v: f["arithmetic_intensity"] <= v),
    "intensity_vs_ridge": (str, lambda f, v: (f["arithmetic_intensity"] > f["ridge_point"]) == (v == "above")),
    "min_bytes_saved": (int, lambda f, v: f["bytes_saved"] >= v),
    "min_saving_us": ((int, float), lambda f, v: f["saving_us"] >= v),
    "min_compile_speedup": ((int, float), lambda f, v: f["compile_us"] > 0 and f["eager_us"] >= v * f["compile_us"]),
    "epilogue": (bool, lambda f, v: f["epilogue"] == v),
    "attention_backend": ((str, list), lambda f, v: f["attention_backend"] in _one_of(v)),
}

_RULE_FIELDS = ("id", "description", "match", "route", "kernel", "bound", "reason")


def _number_hint(x: float, expected: type | tuple[type, ...]) -> str:
    """How to write ``x`` so that YAML 1.1 reads it as the number a condition of type ``expected`` takes."""
    if expected is int:
        return f"write {int(x)}" if x.is_integer() else "this condition takes a whole number"
    return f"write {x:.1e} (a dot and a signed exponent)"


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _known_patterns() -> frozenset[str]:
    from kernel_library.registry import KNOWN_PATTERNS

    generic = {"pointwise", "reduction", "normalization", "softmax", "log_softmax", "copy", "gelu",
               "softmax_not_last_dim",
               "matmul", "conv", "attention", "embedding", "recurrent"}
    return frozenset(KNOWN_PATTERNS) | generic


def _library_kernels() -> frozenset[str]:
    """Names of the kernel_library kernels a triton rule may name (imports the library once)."""
    from kernel_library.registry import load_all

    return frozenset(load_all())


def _is_aten_op(name: Any) -> bool:
    """Items no fused kernel takes are named after their aten op (``cumsum``, ``index``...)."""
    import torch

    return isinstance(name, str) and hasattr(torch.ops.aten, name)


#: allowed values of the enumerated match conditions (typos would otherwise never match, silently).
_ALLOWED_VALUES: dict[str, frozenset[str]] = {
    "kind": frozenset({"fusible", "heavy", "other"}),
    "dtype": frozenset(FLOAT_NAMES) | COMPLEX_NAMES,
    "categories_any": frozenset({"pointwise", "reduction", "normalization", "softmax", "matmul", "conv", "attention",
                                 "view", "copy", "embedding", "recurrent", "other"}),
    "categories_all": frozenset({"pointwise", "reduction", "normalization", "softmax", "matmul", "conv",
                                 "attention", "view", "copy", "embedding", "recurrent", "other"}),
    "pattern": _known_patterns(),
    "attention_backend": frozenset(SDPA_BACKENDS),
}


@dataclass(frozen=True)
class Rule:
    """One validated routing rule.

    Attributes:
        id: unique id within all loaded rules.
        description: what the rule is for.
        match: condition name -> value (see :data:`CONDITIONS`).
        route: one of :data:`fusion_advisor.analyze.records.ROUTES`.
        kernel: library kernel name or ``"auto"`` for triton routes, ``""`` otherwise.
        bound: bound-class override, or ``""`` to keep the roofline's.
        reason: ``str.format`` template over :data:`TEMPLATE_FIELDS`.
        file: the rules file it came from.
    """

    id: str
    description: str
    match: dict[str, Any]
    route: str
    kernel: str
    bound: str
    reason: str
    file: str

    def matches(self, features: dict[str, Any]) -> bool:
        """True when every condition of the rule holds for ``features``."""
        return all(CONDITIONS[name][1](features, value) for name, value in self.match.items())


def _is_shipped(file: str) -> bool:
    """Whether a rule's ``file`` is the shipped rules file, by resolved path (``--rules rules/default.yaml`` too)."""
    return Path(file).resolve() == Path(SHIPPED_RULES).resolve()


@dataclass(frozen=True)
class RuleSet:
    """Rules in match order, plus the files (with name and version) they came from."""

    rules: tuple[Rule, ...]
    files: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def users_own(self) -> frozenset[tuple[str, str]]:
        """``(rule id, file)`` of the rules the user's own files (``--rules``) add: not the shipped file's (paths
        compared resolved: ``--rules rules/default.yaml`` is the shipped file), and not a copy of a shipped rule
        (same id, match, route, kernel and bound: a copy of the shipped file decides nothing of its own)."""
        shipped = {r.id: r for r in self.rules if _is_shipped(r.file)}

        def same(r: Rule, s: Rule | None) -> bool:
            return s is not None and (r.match, r.route, r.kernel, r.bound) == (s.match, s.route, s.kernel, s.bound)

        return frozenset((r.id, r.file) for r in self.rules
                         if not _is_shipped(r.file) and not same(r, shipped.get(r.id)))

    def profile_only(self) -> list[Rule]:
        """The user's rules (not the shipped file's) that match on ``measured_bound``: without ``--profile`` they
        match no chain."""
        return [r for r in self.rules if "measured_bound" in r.match and not _is_shipped(r.file)]

    def first_match(self, chain: Chain, est: Estimate,
                    measured: ChainMeasurement | None = None) -> tuple[Rule | None, dict[str, Any]]:
        """The first rule matching ``chain`` (or ``None``), and the chain's features (``measured``: its profiled
        measurement, when there is one)."""
        features = _features(chain, est, measured)
        for rule in self.rules:
            if rule.matches(features):
                return rule, features
        return None, features


def _check_template(template: str, where: str) -> None:
    try:
        names = [fname for _, fname, _, _ in string.Formatter().parse(template) if fname]
    except ValueError as e:
        raise RulesError(f"{where}: field 'reason': bad template: {e}") from e
    unknown = sorted({n.split(".")[0].split("[")[0] for n in names} - set(TEMPLATE_FIELDS))
    if unknown:
        raise RulesError(
            f"{where}: field 'reason': unknown placeholder(s) {', '.join(unknown)}; known: {', '.join(TEMPLATE_FIELDS)}"
        )
    text_fields = {"id", "kind", "pattern", "dtype", "bound", "epilogue_of", "prologue_of", "module_path", "kernel",
                   "route", "measured_bound", "attention_backend", "eager_size", "fused_size", "saved_size", "work"}
    int_fields = {"eager_kernels", "numel", "row_elems", "flops", "eager_bytes", "fused_bytes", "bytes_saved"}
    sample = {k: ("x" if k in text_fields else False if k == "epilogue" else 1 if k in int_fields else 1.5)
              for k in TEMPLATE_FIELDS}
    try:
        template.format(**sample)
    except (ValueError, IndexError, KeyError) as e:
        raise RulesError(f"{where}: field 'reason': the template does not render: {e}") from e


def _parse_rule(raw: Any, index: int, file: str) -> Rule:
    if not isinstance(raw, dict):
        raise RulesError(f"{file}: rule #{index + 1}: a rule is a mapping with fields {', '.join(_RULE_FIELDS)}")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise RulesError(f"{file}: rule #{index + 1}: field 'id': missing or not a string")
    where = f"{file}: rule {rid!r}"
    for key in raw:
        if key not in _RULE_FIELDS:
            raise RulesError(f"{where}: unknown field {key!r}; known fields: {', '.join(_RULE_FIELDS)}")
    route = raw.get("route")
    if route not in ROUTES:
        raise RulesError(f"{where}: field 'route': {route!r} is not one of {', '.join(ROUTES)}")
    match = raw.get("match")
    match = {} if match is None else match  # an absent match matches every chain; an empty list is a mistake
    if not isinstance(match, dict):
        raise RulesError(f"{where}: field 'match': must be a mapping of conditions")
    for name, value in match.items():
        if name not in CONDITIONS:
            raise RulesError(f"{where}: field 'match.{name}': unknown condition; known: {', '.join(CONDITIONS)}")
        expected = CONDITIONS[name][0]
        if isinstance(value, bool) and expected is not bool:
            ok = False
        else:
            ok = isinstance(value, expected)
        if not ok:
            names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
            hint = ""
            if isinstance(value, str) and _reads_as_number(value):  # YAML 1.1 reads 1e8 (no dot) as text
                hint = f" (YAML reads {value} as text: {_number_hint(float(value), expected)})"
            raise RulesError(f"{where}: field 'match.{name}': expected {names}, got {value!r}{hint}")
        if name == "intensity_vs_ridge" and value not in ("above", "below"):
            raise RulesError(f"{where}: field 'match.intensity_vs_ridge': must be 'above' or 'below'")
        if name in ("bound", "measured_bound") and any(b not in BOUNDS for b in _one_of(value)):
            raise RulesError(f"{where}: field 'match.{name}': values must be among {', '.join(BOUNDS)}")
        allowed = _ALLOWED_VALUES.get(name)
        if allowed is not None:
            bad = [v for v in _one_of(value) if v not in allowed and not (name == "pattern" and _is_aten_op(v))]
            if bad:
                raise RulesError(
                    f"{where}: field 'match.{name}': unknown value(s) {', '.join(map(repr, bad))}; "
                    f"known: {', '.join(sorted(allowed))}" + (" or an aten op name" if name == "pattern" else "")
                )
    kernel = raw.get("kernel", "")
    if route == "triton" and not (isinstance(kernel, str) and kernel):
        raise RulesError(f"{where}: field 'kernel': a triton route needs a kernel name (or 'auto')")
    if route != "triton" and kernel:
        raise RulesError(f"{where}: field 'kernel': only triton routes name a kernel")
    if route == "triton" and kernel != "auto":
        known = _library_kernels()
        if kernel not in known:
            raise RulesError(f"{where}: field 'kernel': {kernel!r} is not a kernel_library kernel; known: "
                             f"{', '.join(sorted(known))} (or 'auto')")
    bound = raw.get("bound", "") or ""
    if bound and bound not in BOUNDS:
        raise RulesError(f"{where}: field 'bound': {bound!r} is not one of {', '.join(BOUNDS)}")
    reason = raw.get("reason", "")
    if not isinstance(reason, str) or not reason.strip():
        raise RulesError(f"{where}: field 'reason': missing; every rule must say why")
    _check_template(reason, where)
    description = raw.get("description", "")
    return Rule(id=rid, description=str(description), match=dict(match), route=route, kernel=kernel or "",
                bound=bound, reason=reason.strip(), file=file)


def load_rules_file(path: str | Path) -> tuple[list[Rule], dict[str, Any]]:
    """Parse and validate one rules file; return its rules and ``{"file", "name", "version", "rules"}``.

    Raises:
        RulesError: unreadable file, invalid YAML (with line), wrong schema version, or invalid rules (the
            message names the file, the rule id and the field of each invalid rule's first problem, a line each).
    """
    path = Path(path)
    file = str(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise RulesError(f"{file}: cannot read rules file: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise RulesError(f"{file}{line}: invalid YAML: {getattr(e, 'problem', None) or e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise RulesError(f"{file}: a rules file is a mapping with 'version: {SCHEMA_VERSION}' and a 'rules' list")
    version = data.get("version")
    if version != SCHEMA_VERSION:
        raise RulesError(f"{file}: field 'version': {version!r} is not supported (this tool reads version {SCHEMA_VERSION})")
    # every rule checked, each one's first problem said: a file with several mistakes is mended in one go (a fresh
    # user met them one run at a time)
    rules, problems = [], []
    for i, raw in enumerate(data["rules"]):
        try:
            rules.append(_parse_rule(raw, i, file))
        except RulesError as e:
            problems.append(str(e))
    if problems:
        raise RulesError("\n".join(problems) if len(problems) == 1 else
                         f"{len(problems)} invalid rules:\n" + "\n".join(problems))
    info = {"file": file, "name": str(data.get("name", path.stem)), "version": version, "rules": len(rules)}
    return rules, info


def load_rules(extra: list[str | Path] | None = None, shipped: str | Path | None = SHIPPED_RULES) -> RuleSet:
    """The user's rules files (``extra``, in order) followed by the shipped rules.

    Raises:
        RulesError: any file is invalid, or two rules share an id.
    """
    rules: list[Rule] = []
    files: list[dict[str, Any]] = []
    for path in [*(extra or []), *([shipped] if shipped else [])]:
        file_rules, info = load_rules_file(path)
        rules.extend(file_rules)
        files.append(info)
    seen: dict[str, str] = {}
    for r in rules:
        if r.id in seen and seen[r.id] == r.file:
            raise RulesError(f"{r.file}: rule {r.id!r}: field 'id': duplicate id")
        seen.setdefault(r.id, r.file)
    return RuleSet(rules=tuple(rules), files=tuple(files))


def render_reason(rule: Rule, features: dict[str, Any], **extra: Any) -> str:
    """The rule's reason template filled with the chain's features (and ``extra`` fields such as kernel)."""
    values = {**features, "kernel": rule.kernel, "route": rule.route, **extra}
    try:
        return rule.reason.format(**values)
    except (KeyError, ValueError, IndexError) as e:  # validated at load; a format spec can still misfit a value
        return f"{rule.reason} (could not render: {e})"
