"""Numbers as people read them: one set of formatters for the report, the rules' reasons, the terminal and diff.

Units are fixed across the tool: times in microseconds (``us``) unless a name says ``ms``/``s``; sizes in binary
units (``KiB``, ``MiB``, ``GiB``: 1024-based, as memory is allocated); bandwidth in ``GB/s`` (1e9 bytes/s, as
datasheets and ``torch.cuda`` benchmarks quote it); throughput in ``TFLOP/s`` (1e12 FLOP/s). Every formatter
takes any value: ``None``, NaN and infinities print as ``"–"`` instead of raising, so a missing number never
breaks a page.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

MISSING = "–"


def fmt_some(items: Sequence[Any], shown: int = 3) -> str:
    """The first ``shown`` items, comma-separated, and how many more: ``"a, b, c and 2 more"``."""
    extra = len(items) - shown
    return ", ".join(str(i) for i in items[:shown]) + (f" and {extra} more" if extra > 0 else "")


def is_num(x: Any) -> bool:
    """A finite int or float (``bool`` excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_int(value: Any) -> str:
    """``1234567`` -> ``"1,234,567"``; NaN/None -> ``"–"``."""
    if not is_num(value):
        return MISSING
    return f"{int(round(value)):,}"


def fmt_float(value: Any, digits: int = 2) -> str:
    """Thousands separators and ``digits`` decimals; 3 significant digits for nonzero values that would print as
    zero; NaN/None -> ``"–"``."""
    if not is_num(value):
        return MISSING
    if value != 0 and abs(value) < 0.5 * 10.0 ** -digits:
        return f"{value:.3g}"
    return f"{value:,.{digits}f}"


def _prefixed(n: float, unit: str, prefixes: tuple[str, ...], base: float) -> str:
    """``n`` in ``unit`` with the largest of ``prefixes`` (each ``base`` times the last) that keeps it at least 1:
    a whole number under ``base`` (``"512 B"``), else one decimal (``"1.5 KiB"``)."""
    if abs(n) < base:
        return f"{int(n):,} {unit}"
    for prefix in prefixes:
        n /= base
        if abs(n) < base or prefix == prefixes[-1]:
            break
    return f"{n:,.1f} {prefix}{unit}"


def fmt_bytes(value: Any) -> str:
    """Bytes in binary units: ``"512 B"``, ``"1.5 KiB"``, ``"32.0 MiB"``, ``"1.25 GiB"``."""
    return _prefixed(float(value), "B", ("Ki", "Mi", "Gi", "Ti"), 1024.0) if is_num(value) else MISSING


def mib(value: Any) -> float:
    """Bytes -> MiB (2**20 bytes); NaN for a missing value."""
    return float(value) / 2**20 if is_num(value) else float("nan")


def fmt_us(value: Any) -> str:
    """A time given in microseconds, in the unit that reads best: ``"0.42 us"``, ``"87.0 us"``, ``"1.23 ms"``,
    ``"2.5 s"``."""
    if not is_num(value):
        return MISSING
    v = float(value)
    if abs(v) >= 1e6:
        return f"{v / 1e6:,.2f} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:,.2f} ms"
    if v != 0 and abs(v) < 0.1:
        return f"{v:.2g} us"
    return f"{v:,.1f} us"


def fmt_flops(value: Any) -> str:
    """A FLOP count with a decimal prefix: ``"512 FLOP"``, ``"3.4 MFLOP"``, ``"68.7 GFLOP"``, ``"1.1 TFLOP"``."""
    return _prefixed(float(value), "FLOP", ("k", "M", "G", "T"), 1e3) if is_num(value) else MISSING


def fmt_speedup(value: Any) -> str:
    """A ratio of times as ``"1.32x"``; ``"–"`` when missing."""
    return f"{value:.2f}x" if is_num(value) else MISSING
