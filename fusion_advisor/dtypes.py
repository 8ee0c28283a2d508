"""The one table of dtype names: ``torch.bfloat16`` <-> ``"bf16"``, as records, reports, rules, device specs and
``--dtype`` spell them.

Every stage that turns a dtype into a name or back reads it from here (the graph's tensor metadata, the SDPA rule,
the rule engine's allowed values, routing's kernel check, ``--dtype``, calibrate's measurements).
"""

from __future__ import annotations

import torch

#: torch dtype -> short name; a dtype missing here is named by torch without its ``torch.`` prefix.
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
    torch.complex64: "c64",
}
#: short name -> torch dtype (the inverse of :data:`DTYPE_NAMES`).
TORCH_DTYPES: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPE_NAMES.items()}
#: the floating-point names a chain's dtype, a rule's ``dtype`` condition and a library kernel deal in.
FLOAT_NAMES: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp64")
#: the names of complex dtypes, as :func:`dtype_name` gives them.
COMPLEX_NAMES: frozenset[str] = frozenset(DTYPE_NAMES.get(d, str(d).replace("torch.", ""))
                                          for d in (torch.complex32, torch.complex64, torch.complex128))
#: what ``--dtype`` casts a model to (analyze, apply), in the order the error message lists them.
CAST_NAMES: tuple[str, ...] = ("fp32", "bf16", "fp16")


def dtype_name(dtype: torch.dtype) -> str:
    """Short dtype name used in records and reports (``torch.bfloat16`` -> ``"bf16"``)."""
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def float_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a floating-point name of :data:`FLOAT_NAMES`, else None (``"int64"``, ``"tf32"``)."""
    return TORCH_DTYPES[name] if name in FLOAT_NAMES else None


def float_itemsize(name: str, default: int = 4) -> int:
    """Bytes per element of a floating-point name of :data:`FLOAT_NAMES` (``"bf16"`` -> 2), else ``default``."""
    dtype = float_dtype(name)
    return dtype.itemsize if dtype is not None else default
