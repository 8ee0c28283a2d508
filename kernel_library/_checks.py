"""Input checks shared by the kernels' launchers: the dtypes they load and store, and where Triton can run a tensor.

Every message names the argument (``x``, ``weight``...), as the launcher contract asks.
"""

from __future__ import annotations

import torch

from kernel_library._device import interpreted

#: Dtypes the kernels load and store (inputs, weight, outputs); everything is computed in fp32.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(name: str, t: torch.Tensor, device: torch.device | None = None) -> None:
    """Raise if ``t`` (argument ``name``) has an unsupported dtype or sits on a device the kernels cannot use.

    Raises:
        TypeError: dtype not in :data:`SUPPORTED_DTYPES`.
        ValueError: ``t`` is not on ``device`` (when given), or is a CPU tensor without ``TRITON_INTERPRET=1``.
    """
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}")
    if t.device.type != "cuda" and not interpreted():
        raise ValueError(
            f"{name} is on {t.device}: the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)"
        )


def check_device(t: torch.Tensor, name: str) -> None:
    """Raise ValueError unless ``t`` is where Triton can run it: CUDA, or any device under TRITON_INTERPRET."""
    if not interpreted() and t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor (got {t.device}); CPU tensors need TRITON_INTERPRET=1")


def check_operands(x: torch.Tensor, x_name: str, *others: tuple[str, torch.Tensor | None]) -> None:
    """Raise unless ``x`` (argument ``x_name``) has a supported dtype and sits where Triton can run it, and each
    ``(name, t)`` of ``others`` (``t`` None: skipped) has ``x``'s dtype and device; checked in that order.

    Raises:
        TypeError: ``x``'s dtype not in :data:`SUPPORTED_DTYPES`, or another operand's dtype not ``x``'s.
        ValueError: another operand on another device than ``x``; ``x`` where Triton cannot run it
            (:func:`check_device`).
    """
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{x_name} must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    for name, t in others:
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise TypeError(f"{name} must have {x_name}'s dtype {x.dtype}, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} must be on {x_name}'s device {x.device}, got {t.device}")
    check_device(x, x_name)
