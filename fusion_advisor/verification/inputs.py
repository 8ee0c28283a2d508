"""Inputs that find real bugs: fresh draws with the structure of real ones, hard values, and edge shapes.

**Structure** (:func:`structure_of`). A captured input is not noise: an additive attention mask holds 0 and
``-inf`` (or ``finfo.min``, as Hugging Face builds it), a boolean mask or an index tensor has meaning in every
element, a row of probabilities sums to 1, a one-hot row has one 1. Redrawing such a tensor as N(mean, std)
destroys it: the mean of a tensor holding ``-inf`` is ``-inf``, so a fresh "mask" masks everything. So
:func:`fresh_like` keeps these as they are and redraws only plain floating tensors, from N(mean, std) of their
finite values, with every non-finite or mask-sized (``|v| >= finfo.max / 2``) element kept in place.

**Hard values** (:func:`hard_variants`): the plain floating inputs scaled by 8 (large magnitudes: overflow of a sum
of squares, an ``exp`` without the row max subtracted), by 1e-3 (below a norm's eps) and the first one zeroed; the
structured ones left alone. A kernel file may add its own (``hard_inputs()``: fully masked rows, confident
predictions, ...; see :mod:`fusion_advisor.kernel_tools.verify`).

**Edge shapes** (:func:`edge_sizes`): from a size a kernel file's ``get_inputs(size)`` takes (``SIZES`` / ``SHAPES``:
an int, or a shape tuple whose last entry is the row width and whose leading entries are rows), the shapes where
row-wise and block-wise kernels break: one row, a width one past a power of two (a partial last block for any
power-of-two block up to it), odd widths, more than 1024 rows and more than 65,535 rows (the limit of CUDA grid
axes 1 and 2).
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from fusion_advisor.verification.poison import poison_value
from fusion_advisor.verification.trees import floating, tree_map

# --- copies -------------------------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), ``random`` and, if imported, numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)


def upcast(x: Any) -> Any:
    """A fresh float64 leaf for a floating tensor (complex128 for complex), keeping ``requires_grad``; a fresh copy
    of other tensors; anything else as is."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return x.detach().to(torch.float64).requires_grad_(x.requires_grad)
        if x.is_complex():
            return x.detach().to(torch.complex128).requires_grad_(x.requires_grad)
        return x.detach().clone()
    return x


def same_dtype_copy(x: Any) -> Any:
    """A fresh leaf copy of a tensor in its own dtype, keeping ``requires_grad``; anything else as is."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


# --- structure ----------------------------------------------------------------------------------------------

#: Structures :func:`structure_of` tells apart. Only ``PLAIN`` and ``CONSTANT`` tensors are redrawn or scaled.
PLAIN = "plain"
CONSTANT = "constant"
BOOL_MASK = "boolean mask"
INTEGER = "integers"
ADDITIVE_MASK = "additive mask"
MASK_ONLY = "mask values only"
INDICATOR = "two-valued (one-hot, 0/1 mask)"
PROBABILITIES = "probabilities"
SINGLE = "single value"
EMPTY = "empty"
OTHER = "kept as is"

#: Structures whose values are redrawn / scaled; the others are kept as they are.
REDRAWN = frozenset({PLAIN, CONSTANT})

#: A row of probabilities sums to 1 within this (relative to the dtype: rows are summed in float64).
PROBABILITY_SUM_TOL = {torch.float16: 1e-2, torch.bfloat16: 1e-2}
PROBABILITY_SUM_TOL_DEFAULT = 1e-4


def mask_values(t: torch.Tensor) -> torch.Tensor:
    """Element-wise: non-finite, or of a mask's magnitude (``|v| >= finfo(dtype).max / 2``: ``finfo.min`` and sums
    with it, as Hugging Face's additive masks hold)."""
    big = torch.finfo(t.dtype).max / 2
    return ~torch.isfinite(t) | (t.abs() >= big)


def structure_of(t: Any) -> str:
    """What a captured input holds (one of the constants above).

    Integers, bools and complex tensors are kept as they are; a floating tensor is an additive mask when its finite,
    non-mask values take at most two values and it holds mask values (``-inf``, ``finfo.min``); ``mask values
    only`` when it holds nothing else; two-valued (one-hot rows, 0/1 masks) when its values take exactly two
    values; probabilities when every value is in [0, 1] and every row (last dim, at least 2 wide) sums to 1;
    constant when it holds one value in more than one element; otherwise plain (mask values, if any, kept in place).
    """
    if not isinstance(t, torch.Tensor):
        return OTHER
    if t.numel() == 0:
        return EMPTY
    if t.dtype == torch.bool:
        return BOOL_MASK
    if t.is_complex():
        return OTHER
    if not t.is_floating_point():
        return INTEGER
    if t.numel() == 1:
        return SINGLE
    f = t.detach()
    special = mask_values(f)
    vals = f[~special]
    if vals.numel() == 0:
        return MASK_ONLY
    lo, hi = vals.min(), vals.max()
    at_most_two = not bool(((vals != lo) & (vals != hi)).any())
    if bool(special.any()):
        return ADDITIVE_MASK if at_most_two else PLAIN
    if bool(lo == hi):
        return CONSTANT
    if at_most_two:
        return INDICATOR
    if float(lo) >= 0.0 and float(hi) <= 1.0 and f.dim() >= 1 and f.shape[-1] > 1:
        tol = PROBABILITY_SUM_TOL.get(t.dtype, PROBABILITY_SUM_TOL_DEFAULT)
        if bool(((f.double().sum(-1) - 1.0).abs() <= tol).all()):
            return PROBABILITIES
    return PLAIN


def fresh_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A fresh tensor shaped like ``t`` with its structure (:func:`structure_of`).

    Plain floating tensors: N(mean, std) of their finite, non-mask values (std 1 when it is not positive), with
    each non-finite or mask-sized element kept where it was. Constant ones: N(value, 0.1 max(|value|, 1)) (a
    weight initialised to ones must not hide a kernel that ignores it). Everything else (masks, integers, index
    tensors, probabilities, one-hot rows, single values) is returned as a copy. Keeps dtype, device and
    ``requires_grad``; draws with ``gen`` (a CPU generator).
    """
    kind = structure_of(t)
    if kind not in REDRAWN:
        return t.detach().clone().requires_grad_(t.requires_grad)
    f = t.detach().double().cpu()
    special = mask_values(t.detach()).cpu()
    vals = f[~special]
    mean = float(vals.mean())
    if kind == CONSTANT:
        std = 0.1 * max(abs(mean), 1.0)
    else:
        std = float(vals.std()) if vals.numel() > 1 else 1.0
        std = std if math.isfinite(std) and std > 0 else 1.0
    noise = torch.randn(tuple(t.shape), generator=gen, dtype=torch.float64) * std + mean
    out = torch.where(special, f, noise)
    return out.to(device=t.device, dtype=t.dtype).requires_grad_(t.requires_grad)


# --- hard values --------------------------------------------------------------------------------------------

#: Hard-value cases :func:`hard_variants` derives: name -> what happens to the plain floating inputs.
HARD_CASES = {
    "hard-large": "plain floating inputs x 8 (large magnitudes)",
    "hard-tiny": "plain floating inputs x 1e-3 (below a norm's eps)",
    "hard-zeros": "the first plain floating input set to 0",
}


def _scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    special = mask_values(t.detach())
    out = torch.where(special, t.detach(), t.detach() * factor)
    return out.requires_grad_(t.requires_grad)


def hard_variants(args: Sequence[Any]) -> list[tuple[str, list[Any]]]:
    """The :data:`HARD_CASES` of ``args`` (nested lists too): ``[(name, args), ...]``; structured inputs (masks,
    integers, probabilities, ...) and mask values inside plain tensors are left as they are. A case that would
    change nothing (no plain floating input) is left out."""
    plain = [0]

    def count(x: Any) -> Any:
        if floating(x) and structure_of(x) in REDRAWN:
            plain[0] += 1
        return x

    tree_map(count, list(args))
    if not plain[0]:
        return []

    def variant(case: str) -> list[Any]:
        first = [True]

        def change(x: Any) -> Any:
            if not (floating(x) and not x.is_complex() and structure_of(x) in REDRAWN):
                return x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
            if case == "hard-large":
                return _scaled(x, 8.0)
            if case == "hard-tiny":
                return _scaled(x, 1e-3)
            if first[0]:
                first[0] = False
                return _scaled(x, 0.0)
            return x.detach().clone().requires_grad_(x.requires_grad)

        return [tree_map(change, a) for a in args]

    return [(case, variant(case)) for case in HARD_CASES]


#: The case :func:`strided_variant` makes.
STRIDED_CASE = "strided: every tensor a view at offset 1, stride 2 along its last axis"


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a non-contiguous view: elements ``1, 3, 5, ...`` of a buffer ``2 * t.shape[-1] + 1`` wide
    along the last axis (stride 2 there, storage offset 1), the buffer's other elements the poison value verify
    fills allocations with (:func:`~fusion_advisor.verification.poison.poison_value`: NaN for floating dtypes), so a
    kernel that reads its input as contiguous, or from the start of its storage, reads them. A leaf that does not
    require grad (:func:`strided_variant` sets ``requires_grad`` as ``t`` had it). A 0-d or empty ``t`` is copied
    as it is."""
    t = t.detach()
    if not _strideable(t):
        return t.clone()
    buf = torch.full((*t.shape[:-1], 2 * t.shape[-1] + 1), poison_value(t.dtype), dtype=t.dtype, device=t.device)
    view = buf[..., 1::2]
    view.copy_(t)
    return view


def _strideable(x: Any) -> bool:
    """Whether :func:`strided_copy` lays ``x`` out anew: a tensor of one or more dimensions and elements."""
    return isinstance(x, torch.Tensor) and x.dim() > 0 and x.numel() > 0


def strideable(args: Sequence[Any]) -> bool:
    """Whether :func:`strided_variant` changes ``args`` (nested lists too): some argument is :func:`_strideable`."""
    found = [False]

    def look(x: Any) -> Any:
        found[0] = found[0] or _strideable(x)
        return x

    tree_map(look, list(args))
    return found[0]


def strided_variant(args: Sequence[Any]) -> list[Any]:
    """``args`` with every tensor replaced by its :func:`strided_copy` (nested lists too; ``requires_grad`` kept):
    the layout case of ``verify`` (:data:`STRIDED_CASE`), which runs where :func:`strideable` says it changes
    something."""
    def change(x: Any) -> Any:
        return strided_copy(x).requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    return [tree_map(change, a) for a in args]


# --- edge shapes --------------------------------------------------------------------------------------------

#: Rows past which a kernel's row index must still be right (catches a grid capped at ~1000 programs).
MANY_ROWS = 1025
#: Rows past the 65,535 programs CUDA allows on grid axes 1 and 2.
HUGE_ROWS = 65537
#: Odd widths tried besides the partial last block: below one warp, and between 32 and 64.
ODD_WIDTHS = (3, 37)
#: Rows of the narrow-width shapes (a few, so several programs run).
FEW_ROWS = 5

#: Why the shape over 65,535 rows is left out under Triton's interpreter by default.
INTERPRETER_SKIP = ("not run under Triton's CPU interpreter by default: the interpreter runs each program instance "
                    "in Python (~1.5 ms each for a row-wise kernel's one per row), minutes for 65537 rows (run it "
                    "with --shapes all, or on a GPU)")


@dataclass(frozen=True)
class EdgeSize:
    """One extra size ``verify`` runs.

    Attributes:
        label: what it tests (``"one row"``, ``"partial last block"``, ...).
        size: what ``get_inputs(size)`` takes (an int or a tuple, in the file's own format).
        skip: why it is not run (``""``: it is).
    """

    label: str
    size: Any
    skip: str = ""


def rows_of(size: Any) -> int:
    """Rows of a size: the int itself, or the product of a tuple's leading entries (the last is the width)."""
    if isinstance(size, (tuple, list)):
        return math.prod(size[:-1]) if len(size) > 1 else int(size[0])
    return int(size)


def _pow2_above(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def edge_sizes(base: Any, *, interpreted: bool, huge: bool, max_row_elems: int | None = None) -> list[EdgeSize]:
    """The edge shapes derived from ``base`` (the first of a file's ``SIZES`` / ``SHAPES``), in ``base``'s format.

    For an int or a 1-tuple ``n`` (elements): 1, the :data:`ODD_WIDTHS`, the power of two at or above ``n`` plus one
    (a partial last block) and :data:`HUGE_ROWS`. For a tuple ``(*rows, width)``: one row of ``width``; a few rows
    of the power of two at or above ``width`` plus one (capped by ``max_row_elems``); a few rows of each odd width;
    :data:`MANY_ROWS` rows of width 3; :data:`HUGE_ROWS` rows of width 3 (only the first leading entry grows).

    ``interpreted``: kernels run under Triton's interpreter, where the shape over 65,535 rows is listed with
    :data:`INTERPRETER_SKIP` unless ``huge``.

    Raises:
        ValueError: ``base`` is neither an int nor a non-empty tuple of positive ints.
    """
    is_tuple = isinstance(base, (tuple, list))
    dims = tuple(int(d) for d in base) if is_tuple else (int(base),)
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"a size must be a positive int or a tuple of them, got {base!r}")
    skip_huge = INTERPRETER_SKIP if interpreted and not huge else ""
    if len(dims) == 1:
        def one_d(n: int) -> Any:
            return (n,) if is_tuple else n
        n = dims[0]
        out = [EdgeSize("one element", one_d(1))]
        out += [EdgeSize(f"odd length {w}", one_d(w)) for w in ODD_WIDTHS]
        out.append(EdgeSize("partial last block", one_d(_pow2_above(n) + 1)))
        out.append(EdgeSize("over 65535 elements", one_d(HUGE_ROWS), skip_huge))
        return out
    width = dims[-1]
    lead = len(dims) - 1

    def shape(rows: int, w: int) -> tuple[int, ...]:
        return (rows,) + (1,) * (lead - 1) + (w,)

    partial = _pow2_above(width) + 1
    if max_row_elems is not None and partial > max_row_elems:
        partial = max_row_elems - 1 if max_row_elems % 2 == 0 else max_row_elems
    out = [EdgeSize("one row", (1,) * lead + (width,))]
    if partial > 1:
        out.append(EdgeSize("partial last block", shape(3, partial)))
    out += [EdgeSize(f"odd width {w}", shape(FEW_ROWS, w)) for w in ODD_WIDTHS
            if max_row_elems is None or w <= max_row_elems]
    out.append(EdgeSize(f"{MANY_ROWS} rows", shape(MANY_ROWS, 3)))
    out.append(EdgeSize(f"{HUGE_ROWS} rows (over 65535)", shape(HUGE_ROWS, 3), skip_huge))
    return out


def explicit_sizes(sizes: Sequence[Any], *, interpreted: bool, huge: bool) -> list[EdgeSize]:
    """A file's own ``VERIFY_SIZES`` as :class:`EdgeSize`\\ s; under the interpreter one with more than 65,535 rows
    is skipped (:data:`INTERPRETER_SKIP`) unless ``huge``."""
    out = []
    for s in sizes:
        s = tuple(s) if isinstance(s, list) else s
        skip = INTERPRETER_SKIP if interpreted and not huge and rows_of(s) > 65535 else ""
        out.append(EdgeSize(f"size {s}", s, skip))
    return out
