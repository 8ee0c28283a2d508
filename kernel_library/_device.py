"""Small helpers shared by kernel modules: where to allocate inputs, and whether Triton is interpreted."""

from __future__ import annotations

import os

import torch


def interpreted() -> bool:
    """True when Triton runs under its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_device() -> torch.device:
    """``cuda`` when a GPU is present and Triton is not interpreted, else ``cpu``."""
    if torch.cuda.is_available() and not interpreted():
        return torch.device("cuda")
    return torch.device("cpu")


def on_gpu() -> bool:
    """True when kernels run on a real GPU (inputs from ``get_inputs()`` then use realistic shapes)."""
    return default_device().type == "cuda"
