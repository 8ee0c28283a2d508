"""The report's pictures, drawn with matplotlib's Agg canvas (no pyplot, no global backend switch) as PNG bytes.

* :func:`roofline_png`: the roofline (log-log: arithmetic intensity in FLOP/byte against attained FLOP/s) with
  each ceiling labelled by what serves it (memory bandwidth; vector units, tensor cores and fused attention per
  dtype), one point per group of repeated chains (its size and an ``xN`` label give the count) and the first
  screen's opportunities numbered;
* :func:`breakdown_png`: where the time goes: stacked bars of predicted eager, predicted ``torch.compile(model)``
  and predicted advised time (and measured eager time with a profile), split by route and by bound class, and,
  when apply ran, the whole-model times it measured per variant.

Colours and markers are the same in both pictures and in the page (:data:`ROUTE_COLORS`, :data:`BOUND_COLORS`).
"""

from __future__ import annotations

import io
import math
from typing import Any

import pandas as pd

from fusion_advisor.analyze.records import BOUNDS, ROUTES, Analysis
from fusion_advisor.report.spec import bandwidth_gbps, flatten  # the report's one reading of the spec
from fusion_advisor.units import is_num

#: Colour per route (skip grey, torch.compile blue, triton red, cudagraphs green); others purple.
ROUTE_COLORS = {"skip": "#8c8c8c", "torch.compile": "#1f77b4", "triton": "#d62728", "cudagraphs": "#2ca02c"}
#: Colour per bound class (for the breakdown by bound class).
BOUND_COLORS = {"compute": "#6a3d9a", "memory": "#ff7f0e", "launch": "#17becf"}
#: Marker per bound class on the roofline.
BOUND_MARKERS = {"compute": "s", "memory": "o", "launch": "^"}
OTHER_COLOR = "#9467bd"
OTHER_MARKER = "x"

#: Line style and colour per kind of compute ceiling.
CEILING_STYLES = {"tensor": ("-", "#333333"), "vector": ("--", "#555555"), "attention": ("-.", "#b5446e"),
                  "compute": (":", "#444444")}


def _ordered(present: list[str], canonical: tuple[str, ...]) -> list[str]:
    extra = sorted({p for p in present if p not in canonical and p})
    return list(canonical) + extra


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


# --- roofline ------------------------------------------------------------------------------------------------


def ceilings(spec: dict[str, Any], frame: pd.DataFrame, used_peaks: list[float]) -> list[dict[str, Any]]:
    """The compute ceilings to draw: ``{kind, dtype, tflops, label}`` per ``*tflops*`` entry of the device spec
    whose kind (tensor / vector / attention, read from the key) and dtype serve a chain of ``frame`` (tensor
    cores: matmul and conv items; attention: attention items; vector units: the rest). Peaks the estimates used
    that the spec does not name are added as "compute". Sorted by TFLOP/s."""
    heavy = set(frame.loc[frame["kind"] == "heavy", "dtype"]) if len(frame) else set()
    attention = set(frame.loc[frame["pattern"] == "attention", "dtype"]) if len(frame) else set()
    other = set(frame.loc[frame["kind"] != "heavy", "dtype"]) if len(frame) else set()
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, float]] = set()
    for key, value in flatten(spec or {}):
        low = key.lower()
        if "tflop" not in low or not is_num(value) or value <= 0 or "unaligned" in low:
            continue
        kind = ("attention" if "attention" in low else "tensor" if "tensor" in low else
                "vector" if "vector" in low else "compute")
        dtype = key.split(".")[-1] if "." in key else ""
        wanted = {"tensor": heavy, "attention": attention, "vector": other}.get(kind, heavy | other)
        if wanted and dtype and dtype not in wanted:
            continue
        if (kind, float(value)) in seen:
            continue
        seen.add((kind, float(value)))
        out.append({"kind": kind, "dtype": dtype, "tflops": float(value)})
    named = {round(c["tflops"], 3) for c in out}
    for p in used_peaks:
        if round(p, 3) not in named:
            out.append({"kind": "compute", "dtype": "", "tflops": p})
            named.add(round(p, 3))
    for c in out:
        what = {"tensor": "tensor cores", "vector": "vector units", "attention": "fused attention",
                "compute": "compute"}[c["kind"]]
        c["label"] = f"{what}{' ' + c['dtype'] if c['dtype'] else ''}: {c['tflops']:,.4g} TFLOP/s"
    return sorted(out, key=lambda c: c["tflops"])


def _points(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per group with a positive time; groups within 2% of one another (in log space) merge."""
    pts: list[dict[str, Any]] = []
    for g in groups:
        f = g["first"]
        t = f["est_after_route_us"]
        if not is_num(t) or t <= 0:
            continue
        x = float(f["arithmetic_intensity_flop_per_byte"]) if is_num(f["arithmetic_intensity_flop_per_byte"]) else 0.0
        y = float(f["flops"]) / (t * 1e-6) if is_num(f["flops"]) else 0.0
        pts.append({"x": x, "y": y, "count": g["count"], "route": f["route"], "bound": f["bound"],
                    "gid": g["gid"], "groups": 1})
    merged: list[dict[str, Any]] = []
    for p in sorted(pts, key=lambda p: (p["route"], p["bound"], p["x"], p["y"])):
        for m in merged:
            same_kind = (m["route"], m["bound"]) == (p["route"], p["bound"])
            if same_kind and _close(m["x"], p["x"]) and _close(m["y"], p["y"]):
                m["count"] += p["count"]
                m["groups"] += 1
                m.setdefault("gids", [m["gid"]]).append(p["gid"])
                break
        else:
            merged.append(dict(p))
    return merged


def _close(a: float, b: float) -> bool:
    if a <= 0 or b <= 0:
        return a <= 0 and b <= 0
    return abs(math.log10(a) - math.log10(b)) < 0.01


def roofline_png(analysis: Analysis, frame: pd.DataFrame, groups: list[dict[str, Any]],
                 numbered: list[str] | None = None) -> tuple[bytes, list[str]]:
    """The roofline as PNG bytes, and notes about what it could not show as is.

    Args:
        analysis: for the device spec (bandwidth, ceilings) and the peaks the estimates used.
        frame: the chains frame; groups: :func:`fusion_advisor.report.views.chain_groups` of it.
        numbered: group ids to number on the chart (the first screen's opportunities, in order).

    x = arithmetic intensity (FLOP per fused byte), y = FLOPs / est_after_route_us. Chains with 0 FLOPs are drawn
    on a floor line and said so in the notes.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    notes: list[str] = []
    untimed = int((~(frame["est_after_route_us"].astype(float) > 0)).sum()) if len(frame) else 0
    if untimed:
        notes.append(f"{untimed} chain(s) without a positive time estimate are not plotted.")
    pts = _points(groups)
    pos_x = [p["x"] for p in pts if p["x"] > 0]
    pos_y = [p["y"] for p in pts if p["y"] > 0]
    x_floor = min(pos_x) / 10.0 if pos_x else 1e-2
    y_floor = min(pos_y) / 10.0 if pos_y else 1e6
    zero = [p for p in pts if p["x"] <= 0 or p["y"] <= 0]
    if zero:
        n = sum(p["count"] for p in zero)
        notes.append(f"{n} chain(s) with 0 FLOPs are drawn on the dashed floor lines "
                     f"(x = {x_floor:.3g} FLOP/byte, y = {y_floor:.3g} FLOP/s).")
    for p in pts:
        p["x"] = p["x"] if p["x"] > 0 else x_floor
        p["y"] = p["y"] if p["y"] > 0 else y_floor

    fig = Figure(figsize=(11.0, 5.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")

    bw, _ = bandwidth_gbps(analysis)
    used = sorted({float(e.peak_tflops) for e in analysis.estimates.values() if is_num(e.peak_tflops)
                   and e.peak_tflops > 0})
    ceils = ceilings(analysis.device_spec or {}, frame, used)
    xs = [p["x"] for p in pts] or [1.0]
    x_lo = min(min(xs), x_floor) / 2.0
    x_ridge_max = max((c["tflops"] * 1e3 / bw for c in ceils), default=1.0) if bw else 1.0
    x_hi = max(max(xs) * 2.0, x_ridge_max * 6.0)
    top = max((c["tflops"] for c in ceils), default=0.0) * 1e12
    ys = [p["y"] for p in pts] or [1.0]
    y_lo = min(min(ys), y_floor, (bw * 1e9 * x_lo) if bw else min(ys)) / 2.0
    y_hi = max(max(ys), top or max(ys)) * 3.0
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)

    if bw:
        x_knee = (top / (bw * 1e9)) if top else x_hi
        x_end = min(x_knee, x_hi)
        ax.plot([x_lo, x_end], [bw * 1e9 * x_lo, bw * 1e9 * x_end], color="black", lw=1.6)
        # label along the memory roof, near its low end (points crowd the middle)
        lx = x_lo * (x_end / x_lo) ** 0.06
        p1 = ax.transData.transform((lx, bw * 1e9 * lx))
        p2 = ax.transData.transform((lx * 2, bw * 1e9 * lx * 2))
        angle = math.degrees(math.atan2(p2[1] - p1[1], p2[0] - p1[0]))
        ax.text(lx, bw * 1e9 * lx * 1.35, f"memory: {bw:,.0f} GB/s", rotation=angle, rotation_mode="anchor",
                fontsize=8.5, color="black", ha="left", va="bottom")
    else:
        notes.append("The device spec gives no memory bandwidth: the memory roof is not drawn.")
    above_prev, prev = False, None
    for c in sorted(ceils, key=lambda c: -c["tflops"]):
        style, color = CEILING_STYLES[c["kind"]]
        x_start = c["tflops"] * 1e3 / bw if bw else x_lo  # TFLOP/s / GB/s * 1e3 = FLOP/byte at the ridge
        y = c["tflops"] * 1e12
        ax.plot([x_start, x_hi], [y, y], color=color, lw=1.4, ls=style)
        # labels at the ceiling's left end (points of compute-bound items sit further right); a ceiling close
        # under the one above it is labelled below its line, so the two labels never overlap
        below = prev is not None and above_prev and prev / c["tflops"] < 2.0
        ax.text(x_start * 1.12, y / 1.12 if below else y * 1.12, c["label"], fontsize=8, color=color, ha="left",
                va="top" if below else "bottom")
        above_prev, prev = not below, c["tflops"]
    if zero:
        ax.axvline(x_floor, color="#bbbbbb", ls="--", lw=0.8)
        ax.axhline(y_floor, color="#bbbbbb", ls="--", lw=0.8)
        ax.annotate("0 FLOPs (floor)", (x_floor, y_floor), xytext=(4, 4), textcoords="offset points", fontsize=7,
                    color="#777777")

    placed: list[tuple[float, float]] = []  # display positions of the xN labels, so none lands on another
    for p in pts:
        ax.scatter([p["x"]], [p["y"]], s=30 + 22 * (p["count"] - 1) ** 0.75, alpha=0.8, linewidths=0.8,
                   c=ROUTE_COLORS.get(p["route"], OTHER_COLOR), marker=BOUND_MARKERS.get(p["bound"], OTHER_MARKER),
                   edgecolors="white" if p["bound"] in BOUND_MARKERS else None, zorder=3)
        if p["count"] > 1:
            px, py = ax.transData.transform((p["x"], p["y"]))
            dy = -3
            while any(abs(px - qx) < 26 and abs(py + dy - qy) < 9 for qx, qy in placed):
                dy += 9
            placed.append((px, py + dy))
            ax.annotate(f"x{p['count']}", (p["x"], p["y"]), xytext=(7, dy), textcoords="offset points", fontsize=7.5,
                        color="#333333", zorder=4)
    for i, gid in enumerate(numbered or [], start=1):
        p = next((q for q in pts if q["gid"] == gid or gid in q.get("gids", [])), None)
        if p is not None:
            ax.annotate(f"#{i}", (p["x"], p["y"]), xytext=(-4, 8), textcoords="offset points", fontsize=9,
                        fontweight="bold", color="#111111", ha="right", zorder=5)
    if not pts:
        ax.text(0.5, 0.5, "no chains to plot", transform=ax.transAxes, ha="center", va="center", color="#666666")

    ax.set_xlabel("arithmetic intensity (FLOP per byte moved by the fused chain)")
    ax.set_ylabel("attained FLOP/s (estimated, after routing)")
    name = (analysis.device_spec or {}).get("display_name") or (analysis.device_spec or {}).get("name", "")
    ax.set_title(f"Roofline of {name}" if name else "Roofline", fontsize=11)
    ax.grid(True, which="major", color="#e5e5e5", lw=0.6)

    routes_present = _ordered([p["route"] for p in pts], ())
    bounds_present = _ordered([p["bound"] for p in pts], ())
    handles = [Line2D([], [], ls="", marker="o", color=ROUTE_COLORS.get(r, OTHER_COLOR), label=f"route: {r or '?'}")
               for r in _ordered(routes_present, tuple(r for r in ROUTES if r in routes_present))]
    handles += [Line2D([], [], ls="", marker=BOUND_MARKERS.get(b, OTHER_MARKER), color="#444444",
                       label=f"{b or '?'}-bound") for b in _ordered(bounds_present, tuple(b for b in BOUNDS
                                                                                           if b in bounds_present))]
    if any(p["count"] > 1 for p in pts):
        handles.append(Line2D([], [], ls="", marker="o", color="#bbbbbb", markersize=10,
                              label="xN: N chains (repeated layers) at one point"))
    if handles:
        ax.legend(handles=handles, loc="upper left", fontsize=8, frameon=True)
    fig.tight_layout()
    return _png(fig), notes


# --- time breakdown --------------------------------------------------------------------------------------------


#: The breakdown's bars of the two predicted scenarios whose call may cost host time beyond their chains.
COMPILE_BAR = "torch.compile(model) (predicted)"
ADVISED_BAR = "advised routes (predicted)"


def breakdown_rows(frame: pd.DataFrame, compile_us: pd.Series) -> list[tuple[str, pd.Series]]:
    """The bars of the breakdown: ``(label, per-chain time in us)``, one per scenario that has numbers."""
    rows = [("eager (predicted)", frame["est_eager_us"].astype(float)),
            (COMPILE_BAR, compile_us.astype(float)),
            (ADVISED_BAR, frame["est_after_route_us"].astype(float))]
    measured = frame["measured_us"].astype(float)
    if measured.notna().any():
        rows.append(("eager (measured, --profile)", measured))
    return rows


#: The breakdown's segment for the host time a whole-model call costs beyond its chains' device time.
CALL_HOST_LABEL = "host's part of the call beyond the chains"
CALL_HOST_COLOR = "#bdbdbd"


def breakdown_png(frame: pd.DataFrame, compile_us: pd.Series, variants: list[dict[str, Any]] | None = None,
                  what: str = "forward", call_host_us: dict[str, float] | None = None) -> bytes:
    """Stacked horizontal bars: each scenario's chain time (us) split by the chains' route (left) and bound
    class (right), plus, for a scenario named in ``call_host_us`` (bar label -> us), a grey segment for the host
    time its call costs beyond the chains' device time (the totals the verdict quotes:
    :func:`fusion_advisor.report.views.predicted_totals`; a tiny model's compiled call outlasts its kernels); with
    ``variants`` (apply's rows: ``name``, ``ms``, ``status``) a panel below with each correct variant's measured
    whole-model time (ms), the chosen one marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bars = breakdown_rows(frame, compile_us)
    timed_variants = [v for v in (variants or []) if is_num(v.get("ms")) and v.get("status") not in ("wrong", "failed")]
    rows = 2 if timed_variants else 1
    height = 0.55 * len(bars) + 2.1 + (0.32 * len(timed_variants) + 1.3 if timed_variants else 0)
    fig = Figure(figsize=(11.0, height), dpi=100)
    FigureCanvasAgg(fig)
    ratios = [0.55 * len(bars) + 1.0] + ([0.32 * len(timed_variants) + 0.8] if timed_variants else [])
    gs = fig.add_gridspec(rows, 2, height_ratios=ratios)
    labels = [b[0] for b in bars]
    for col, (by, canonical, colors, title) in enumerate((
            ("route", ROUTES, ROUTE_COLORS, "by route"), ("bound", BOUNDS, BOUND_COLORS, "by bound class"))):
        ax = fig.add_subplot(gs[0, col])
        keys = [k for k in _ordered(frame[by].tolist(), canonical) if (frame[by] == k).any()]
        ypos = list(range(len(bars)))[::-1]
        left = [0.0] * len(bars)
        for key in keys:
            sel = frame[by] == key
            widths = [float(series[sel].sum(skipna=True)) for _, series in bars]
            ax.barh(ypos, widths, left=left, color=colors.get(key, OTHER_COLOR), label=key or "(none)", height=0.6)
            left = [a + b for a, b in zip(left, widths)]
        host = [max(float((call_host_us or {}).get(label, 0.0)), 0.0) for label in labels]
        if any(h > 0 for h in host):
            ax.barh(ypos, host, left=left, color=CALL_HOST_COLOR, hatch="//", label=CALL_HOST_LABEL, height=0.6)
            left = [a + b for a, b in zip(left, host, strict=True)]
            keys = [*keys, CALL_HOST_LABEL]
        xmax = max(left) if left and max(left) > 0 else 1.0
        for y, total in zip(ypos, left):
            ax.text(total + xmax * 0.01, y, f"{total:,.0f} us", va="center", fontsize=8)
        ax.set_xlim(0, xmax * 1.22)
        ax.set_yticks(ypos)
        ax.set_yticklabels(labels if col == 0 else [""] * len(labels), fontsize=8.5)
        ax.set_xlabel(f"time per {what} (us)", fontsize=8.5)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        if keys:
            ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.24 if len(bars) < 4 else -0.18),
                      ncol=min(len(keys), 4), frameon=False)
        ax.grid(True, axis="x", color="#eeeeee", lw=0.6)
        ax.set_axisbelow(True)
    if timed_variants:
        ax = fig.add_subplot(gs[1, :])
        names = [v["name"] for v in timed_variants][::-1]
        ms = [float(v["ms"]) for v in timed_variants][::-1]
        colors = ["#2ca02c" if v.get("status") == "chosen" else "#9ecae1" for v in timed_variants][::-1]
        ax.barh(range(len(names)), ms, color=colors, height=0.6)
        for y, (n, t, v) in enumerate(zip(names, ms, timed_variants[::-1])):
            ax.annotate(f"{t:.4g} ms" + ("  (chosen)" if v.get("status") == "chosen" else ""), (t, y),
                        xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=8)
        spread = max(ms) / max(min(ms), 1e-12)
        if spread > 20:  # one slow variant would flatten the others: a log axis keeps every bar readable
            ax.set_xscale("log")
            ax.set_xlim(min(ms) / 2, max(ms) * 3)
        else:
            ax.set_xlim(0, max(ms) * 1.25)
        ax.set_xlabel(f"whole model, measured by apply (ms per {what}"
                      + (", log scale)" if spread > 20 else ")"), fontsize=8.5)
        ax.set_title("whole-model variants (apply --verify)", fontsize=10)
        ax.grid(True, axis="x", color="#eeeeee", lw=0.6)
        ax.set_axisbelow(True)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return _png(fig)
