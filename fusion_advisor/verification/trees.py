"""Walking nested arguments and outputs: the leaves of tuples, lists, dicts and model outputs, and maps over them.

A kernel returns a tensor, a Python number, ``None`` or (nested) tuples / lists / dicts of them; a model may return a
Hugging Face ``ModelOutput`` (a mapping), a dataclass or an object with ``to_tuple()``. Every check of
:mod:`fusion_advisor.verification` walks them the same way, so a list and a tuple of the same leaves are the same
structure, and every leaf gets a label (``output[1][0]``, ``input 0 (x)``) that messages name.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Callable

import torch


def leaves(obj: Any, label: str) -> list[tuple[str, Any]]:
    """``(label, leaf)`` pairs of a nested value, in a fixed order.

    Lists and tuples are walked by position (``label[i]``), mappings by key (``label['k']``), dataclass instances by
    field and objects with ``to_tuple()`` (Hugging Face outputs that are not mappings) by position; anything else
    (tensors, numbers, strings, ``None``) is a leaf.
    """
    if isinstance(obj, (list, tuple)):
        return [pair for i, v in enumerate(obj) for pair in leaves(v, f"{label}[{i}]")]
    if isinstance(obj, Mapping):
        return [pair for k, v in obj.items() for pair in leaves(v, f"{label}[{k!r}]")]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [pair for f in dataclasses.fields(obj) for pair in leaves(getattr(obj, f.name), f"{label}.{f.name}")]
    to_tuple = getattr(obj, "to_tuple", None)
    if callable(to_tuple) and not isinstance(obj, torch.Tensor):
        return leaves(to_tuple(), label)
    return [(label, obj)]


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """The tensors among :func:`leaves` of ``obj``, in the same order."""
    return [x for _, x in leaves(obj, "") if isinstance(x, torch.Tensor)]


def input_leaves(args: list[Any], labels: list[str]) -> list[tuple[str, Any]]:
    """:func:`leaves` of every argument, each under its own label."""
    return [pair for arg, lab in zip(args, labels) for pair in leaves(arg, lab)]


def tree_map(fn: Callable[[Any], Any], obj: Any) -> Any:
    """``obj`` with ``fn`` applied to every leaf of its lists, tuples (namedtuples too), mappings and dataclass
    instances, each rebuilt as its own type: a mapping is a shallow copy with its values replaced (an
    ``OrderedDict``, a ``defaultdict`` and its factory, a ``UserDict`` such as Hugging Face's ``BatchEncoding``), a
    dataclass ``dataclasses.replace`` of its init fields. The containers :func:`leaves` walks, so a copy made with
    it holds no tensor of the original (objects walked through ``to_tuple()`` alone are leaves here)."""
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(tree_map(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(tree_map(fn, v) for v in obj)
    if isinstance(obj, Mapping):
        try:
            out = copy.copy(obj)
            for k in obj:
                out[k] = tree_map(fn, obj[k])
            return out
        except TypeError:  # a read-only mapping: a plain dict of its items
            return {k: tree_map(fn, v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: tree_map(fn, getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return fn(obj)


def floating(x: Any) -> bool:
    """Whether ``x`` is a floating-point or complex tensor."""
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def dtype_text(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


def describe(x: Any) -> str:
    """``tensor [3, 4] bfloat16``, ``tuple of 2``, or the type's name."""
    if isinstance(x, torch.Tensor):
        return f"tensor {list(x.shape)} {dtype_text(x.dtype)}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__


def first_true(mask: torch.Tensor) -> tuple[int, int]:
    """``(count, flat index of the first)`` of a boolean tensor's True elements, ``(0, -1)`` when there are none."""
    flat = mask.reshape(-1)
    n = int(flat.sum())
    return n, (int(flat.nonzero()[0, 0]) if n else -1)


def unravel(flat: int, shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """The index in ``shape`` of flat (row-major) position ``flat``."""
    idx = []
    for size in reversed(tuple(shape)):
        idx.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(idx))
