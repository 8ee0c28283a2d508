"""``fusion-advisor diff A B``: two report folders side by side (another GPU, another torch version, before and
after a code change): the chains whose route, bound class, kernel, pattern, kernel count or time changed.

Each folder holds what ``analyze`` (and perhaps ``apply``) wrote: report.json (the analysis) and, when apply ran,
plan.yaml (its measured whole-model times). Chains are matched across the two analyses, not by id (an extra op
early in the graph shifts every id after it):

1. by the module that issued the chain, the source line (file name and line number) and its occurrence among
   the chains of that module and line;
2. the chains left, by module, pattern and occurrence (a code change that moved lines).

A matched pair is *changed* when its route, bound class, kernel, pattern or eager kernel count differs, or when a
time (estimated eager, estimated after routing, measured with --profile) differs by more than ``threshold``
(relative). Chains only in A or only in B are listed as such. Repeated layers with the same change are one row
("x32 layers"). Times in us.

:func:`diff_folders` computes the :class:`Diff`; :func:`render_html` and :func:`render_csv` render it;
:func:`write_diff` writes diff.html and diff.csv atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from fusion_advisor.files import csv_text
from fusion_advisor.report.views import layer_index, layer_pattern
from fusion_advisor.units import fmt_us, is_num

#: Files written by :func:`write_diff`.
DIFF_FILES = {"html": "diff.html", "csv": "diff.csv"}

#: Default relative change of a time that counts as a change (10%).
DEFAULT_THRESHOLD = 0.10

#: Columns compared for equality (besides the times).
COMPARED = ("route", "bound", "kernel", "pattern", "eager_kernels")
#: Times compared with the threshold (us).
TIMES = ("est_eager_us", "est_after_route_us", "measured_us")

#: diff.csv columns and what each holds.
DIFF_COLUMNS: dict[str, str] = {
    "status": "'changed', 'only in A', 'only in B' or 'same'.",
    "count": "Chains in the row (repeated layers with the same change share a row).",
    "chain_a": "Chain id(s) in A ('; '-separated), empty when only in B.",
    "chain_b": "Chain id(s) in B, empty when only in A.",
    "module": "Module path of the chain, layer indices as '*' when the row holds several layers.",
    "layers": "Layer indices of the row's chains.",
    "source": "file:line of the chain (A's, else B's).",
    "changes": "What differs, 'field: A -> B', '; '-separated.",
    **{f"{c}_a": f"{c} in A." for c in COMPARED},
    **{f"{c}_b": f"{c} in B." for c in COMPARED},
    **{f"{t}_a": f"{t} in A, summed over the row's chains (us)." for t in TIMES},
    **{f"{t}_b": f"{t} in B, summed over the row's chains (us)." for t in TIMES},
}


@dataclass
class Side:
    """One folder: its analysis' chains frame and headline numbers."""

    folder: Path
    name: str
    model_file: str
    frame: pd.DataFrame
    facts: dict[str, str]
    totals: dict[str, float]


@dataclass
class Diff:
    """The comparison of two folders.

    Attributes:
        a, b: the two sides.
        rows: one dict per row (keys :data:`DIFF_COLUMNS`), changed rows first, then only-in-A, only-in-B, same.
        threshold: the relative time change that counts (see the module docstring).
        facts: ``(label, A, B)`` of the runs (model, device spec, versions, totals), the differing ones marked.
        warnings: what makes the pairing doubtful (two different model files).
    """

    a: Side
    b: Side
    rows: list[dict[str, Any]]
    threshold: float
    facts: list[tuple[str, str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] != "same"]

    @property
    def plan_changed(self) -> bool:
        """Whether the plans apply chose differ (both folders hold one): ``--fail-on-change`` fails on it too (two
        runs read 'apply chose: torch.compile (A) -> eager (B)', then 'no chain changed', and exited 0)."""
        return any(label == "apply chose" and x != y and "–" not in (x, y) for label, x, y in self.facts)


def _side(folder: Path) -> Side:
    from fusion_advisor.report.write import chains_frame, load_report, read_plan
    from fusion_advisor.report.views import apply_view, predicted_compile_us

    analysis = load_report(folder)
    frame = chains_frame(analysis)
    spec = analysis.device_spec or {}
    facts = {
        "model": f"{analysis.model_name} ({analysis.model_file})",
        "device spec": str(spec.get("display_name") or spec.get("name") or "?"),
        **_spec_facts(spec),
        "dtype": analysis.dtype or "as the file makes it",
        "chains": str(len(analysis.chains)),
        **{k: str(v) for k, v in analysis.versions.items()},
    }
    totals = {"predicted eager": float(frame["est_eager_us"].sum(skipna=True)),
              "predicted advised": float(frame["est_after_route_us"].sum(skipna=True)),
              "predicted torch.compile(model)": predicted_compile_us(frame)}
    if analysis.profile is not None:  # the plain model's wall time, as the report's headline (not the profiled run)
        totals["measured eager (--profile)"] = float(analysis.profile.model_eager_us)
    plan, _ = read_plan(folder)
    if plan is not None:
        view = apply_view(plan, analysis)
        for v in view["variants"]:
            if is_num(v["ms"]) and v["name"] in ("eager", "torch.compile"):
                totals[f"measured {v['name']} (apply)"] = v["ms"] * 1e3
        if view["measured"] is not None:
            # one row whatever each side chose (the choice is a fact row of its own)
            totals["measured plan (apply)"] = view["measured"]["chosen_ms"] * 1e3
            facts["apply chose"] = view["measured"]["chosen"]
    return Side(folder=Path(folder), name=analysis.model_name, model_file=analysis.model_file, frame=frame,
                facts=facts, totals=totals)


#: Device spec inputs the diff names beside the predicted times they move: (label, spec field, unit).
SPEC_FACTS = (("spec: memory bandwidth", "memory_bandwidth_gbps", "GB/s"),
              ("spec: host time per eager op", "launch_overhead_us", "us"),
              ("spec: in-model host time scale", "host_time_scale", "x"))


def _spec_facts(spec: dict[str, Any]) -> dict[str, str]:
    """The :data:`SPEC_FACTS` of a report's device spec: another spec moves every prediction, e.g. an H100 spec's
    smaller host cost per op (7.5 against the H200's 12 us) predicts launch-bound chains faster there."""
    out = {}
    for label, key, unit in SPEC_FACTS:
        v = spec.get(key)
        if is_num(v) and float(v) > 0:
            out[label] = f"{float(v):,.4g} {unit}" if unit != "x" else f"{float(v):.4g}x"
    return out


def _file_line(source: str) -> str:
    """``/a/b/llama.py:134`` -> ``llama.py:134`` (folders differ between machines; file and line do not)."""
    return str(source or "").replace("\\", "/").rsplit("/", 1)[-1]


def match_chains(a: pd.DataFrame, b: pd.DataFrame) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Pairs of row positions ``(i in a, j in b)`` of the same chain, and the rows only in a / only in b (see the
    module docstring for the two passes)."""
    def keyed(frame: pd.DataFrame, key) -> dict[tuple, list[int]]:
        out: dict[tuple, list[int]] = {}
        for i, row in enumerate(frame.to_dict("records")):
            out.setdefault(key(row), []).append(i)
        return out

    pairs: list[tuple[int, int]] = []
    left_a, left_b = set(range(len(a))), set(range(len(b)))
    for key in (lambda r: (r["graph_index"], r["module_path"], _file_line(r["source"])),
                lambda r: (r["module_path"], r["pattern"])):
        ka = keyed(a.iloc[sorted(left_a)].reset_index(drop=True), key) if left_a else {}
        kb = keyed(b.iloc[sorted(left_b)].reset_index(drop=True), key) if left_b else {}
        ia, ib = sorted(left_a), sorted(left_b)
        for k, rows_a in ka.items():
            rows_b = kb.get(k, [])
            for x, y in zip(rows_a, rows_b):  # occurrence by occurrence, in chain order
                pairs.append((ia[x], ib[y]))
                left_a.discard(ia[x])
                left_b.discard(ib[y])
    return sorted(pairs), sorted(left_a), sorted(left_b)


def _changes(ra: dict[str, Any], rb: dict[str, Any], threshold: float) -> list[str]:
    out = []
    for c in COMPARED:
        if str(ra[c]) != str(rb[c]):
            out.append(f"{c}: {ra[c] or '(none)'} -> {rb[c] or '(none)'}")
    for t in TIMES:
        x, y = ra[t], rb[t]
        if is_num(x) and is_num(y):
            base = max(abs(x), abs(y), 1e-9)
            if abs(x - y) / base > threshold:
                out.append(f"{t}: {fmt_us(x)} -> {fmt_us(y)}")
        elif is_num(x) != is_num(y) and t != "measured_us":
            out.append(f"{t}: {fmt_us(x)} -> {fmt_us(y)}")
    return out


def diff_folders(a: Path, b: Path, threshold: float = DEFAULT_THRESHOLD) -> Diff:
    """Compare the report folders ``a`` and ``b``.

    Raises:
        UserError: a folder without a fusion-advisor report.json, one that does not parse, or a negative
            threshold.
    """
    from fusion_advisor.errors import UserError

    if not (threshold >= 0):
        raise UserError(f"--threshold {threshold}: must be 0 or more (a relative change: 0.1 = 10%)")
    for folder in (a, b):
        if not Path(folder).is_dir():
            raise UserError(f"{folder}: no such folder (give two folders written by `fusion-advisor analyze`)")
    sa, sb = _side(Path(a)), _side(Path(b))
    pairs, only_a, only_b = match_chains(sa.frame, sb.frame)
    ra, rb = sa.frame.to_dict("records"), sb.frame.to_dict("records")
    raw: list[dict[str, Any]] = []
    for i, j in pairs:
        changes = _changes(ra[i], rb[j], threshold)
        raw.append({"status": "changed" if changes else "same", "a": ra[i], "b": rb[j], "changes": changes})
    raw += [{"status": "only in A", "a": ra[i], "b": None, "changes": ["only in A"]} for i in only_a]
    raw += [{"status": "only in B", "a": None, "b": rb[j], "changes": ["only in B"]} for j in only_b]
    rows = _grouped(raw)
    order = {"changed": 0, "only in A": 1, "only in B": 2, "same": 3}
    rows.sort(key=lambda r: (order[r["status"]], -_weight(r)))
    facts = []
    for k in dict.fromkeys([*sa.facts, *sb.facts]):
        facts.append((k, sa.facts.get(k, "–"), sb.facts.get(k, "–")))
    for k in dict.fromkeys([*sa.totals, *sb.totals]):
        facts.append((k, fmt_us(sa.totals.get(k)), fmt_us(sb.totals.get(k))))
    warnings = []
    if sa.model_file and sb.model_file and not _same_file(sa.model_file, sb.model_file):
        warnings.append(f"A and B analysed different model files ({sa.model_file}, {sb.model_file}): chains are "
                        f"paired by module, source line and pattern, which in two files may be different code")
    return Diff(a=sa, b=sb, rows=rows, threshold=threshold, facts=facts, warnings=warnings)


def _same_file(a: str, b: str) -> bool:
    """Whether two recorded model files are one file: by path where both were recorded absolute (two unrelated
    ``model.py`` files differ), else by file name (a relative path may have been typed from another folder)."""
    if Path(a).is_absolute() and Path(b).is_absolute():
        return Path(a) == Path(b)
    return Path(a).name == Path(b).name


def _weight(row: dict[str, Any]) -> float:
    vals = [row.get(f"{t}_{s}") for t in ("est_eager_us",) for s in ("a", "b")]
    return max([v for v in vals if is_num(v)] or [0.0])


def _grouped(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of one status, module (layer indices as ``*``), source line and change text merged ("x32 layers")."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in raw:
        ref = r["a"] or r["b"]
        # the change text without numbers that differ per layer would over-merge; keep it exact
        key = (r["status"], layer_pattern(str(ref["module_path"] or "")), _file_line(ref["source"]),
               "; ".join(r["changes"]), ref["pattern"])
        groups.setdefault(key, []).append(r)
    out = []
    for key, members in groups.items():
        first = members[0]
        ref = first["a"] or first["b"]
        row: dict[str, Any] = {
            "status": first["status"], "count": len(members),
            "chain_a": "; ".join(m["a"]["chain_id"] for m in members if m["a"]),
            "chain_b": "; ".join(m["b"]["chain_id"] for m in members if m["b"]),
            "module": key[1] if len(members) > 1 else str(ref["module_path"] or ""),
            "layers": ", ".join(x for x in (layer_index(str((m["a"] or m["b"])["module_path"] or "")) for m in members)
                                if x),
            "source": _file_line(ref["source"]), "changes": "; ".join(first["changes"]) if first["status"] != "same"
            else "",
        }
        for side in ("a", "b"):
            rec = first[side]
            for c in COMPARED:
                row[f"{c}_{side}"] = rec[c] if rec is not None else ""
            for t in TIMES:
                vals = [m[side][t] for m in members if m[side] is not None and is_num(m[side][t])]
                row[f"{t}_{side}"] = float(sum(vals)) if vals else float("nan")
        out.append(row)
    return out


# --- rendering -------------------------------------------------------------------------------------------------


def render_csv(d: Diff) -> str:
    """diff.csv: every row (changed and same), columns :data:`DIFF_COLUMNS`."""
    return csv_text(({k: ("" if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in d.rows),
                    DIFF_COLUMNS)


def render_html(d: Diff, generated_at: str | None = None) -> str:
    """diff.html: the two runs' facts and every changed row, self-contained (the report's CSS and script)."""
    import fusion_advisor
    from fusion_advisor.report.write import _template
    from fusion_advisor.report.views import route_class

    return _template("diff.html.j2").render(
        d=d, tool_version=fusion_advisor.__version__,
        generated_at=generated_at or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        route_class=route_class, columns=DIFF_COLUMNS, times=TIMES,
        statuses=sorted({r["status"] for r in d.rows}),
    )


def write_diff(d: Diff, out_dir: Path) -> dict[str, Path]:
    """Write diff.html and diff.csv into ``out_dir`` (created if missing), each atomically, rendered in memory
    first (a rendering error writes nothing). The caller checks ``out_dir`` first
    (:func:`fusion_advisor.report.write.check_files`)."""
    from fusion_advisor.files import atomic_write_bytes

    contents = {"html": render_html(d).encode("utf-8"), "csv": render_csv(d).encode("utf-8")}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key in ("csv", "html"):
        paths[key] = out_dir / DIFF_FILES[key]
        atomic_write_bytes(paths[key], contents[key])
    return paths


def terminal_table(d: Diff, top: int = 40) -> Any:
    """A rich Table of the changed rows (at most ``top``)."""
    from rich.table import Table

    t = Table(title=f"{len(d.changed)} changed row(s) of {len(d.rows)}: {d.a.folder} (A) vs {d.b.folder} (B)")
    for col, just in (("status", "left"), ("A", "left"), ("B", "left"), ("pattern", "left"), ("module", "left"),
                      ("source", "left"), ("what changed", "left"), ("est. eager A -> B", "right")):
        t.add_column(col, justify=just, overflow="fold")
    for r in d.changed[:top]:
        pattern = r["pattern_a"] or r["pattern_b"]
        count = f" x{r['count']}" if r["count"] > 1 else ""
        t.add_row(r["status"], _ids(r["chain_a"]), _ids(r["chain_b"]), f"{pattern}{count}", r["module"],
                  r["source"], r["changes"], f"{fmt_us(r['est_eager_us_a'])} -> {fmt_us(r['est_eager_us_b'])}")
    return t


def _ids(text: str) -> str:
    ids = [x for x in text.split("; ") if x]
    return ids[0] + (f" ..{ids[-1]}" if len(ids) > 1 else "") if ids else "-"
