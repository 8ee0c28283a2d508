"""What class an op belongs to, as the cost model and the fits key it: its aten op's short name, a convolution's
geometry class, the class keys from most specific to coarsest, whether it launches a kernel at all.

Shared by the roofline (:mod:`fusion_advisor.analyze.roofline`), the host costs it charges and the profile fits
(:mod:`fusion_advisor.devices.fit_profiles`); it reads op records alone, no device spec.
"""

from __future__ import annotations

from fusion_advisor.analyze.records import OpInfo
from fusion_advisor.devices.op_rates import ConvGeometry


def short_target(target: str) -> str:
    """``"aten.native_group_norm.default"`` -> ``"native_group_norm"``."""
    parts = target.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "aten" else (parts[-2] if len(parts) >= 2 else target)


def conv_detail(op: OpInfo) -> str:
    """Geometry class of a convolution op (:attr:`fusion_advisor.devices.op_rates.ConvGeometry.detail`):
    ``conv<d>d``, ``_transpose`` when its output has more spatial positions than its input (a transposed
    convolution), ``_depthwise`` when each group holds one input channel, ``_grouped`` when groups > 1 otherwise.
    ``"conv"`` when the op has no input/weight/output shapes."""
    if len(op.inputs) < 2 or not op.outputs:
        return "conv"
    geom = ConvGeometry.from_shapes(op.inputs[0].shape, op.inputs[1].shape, op.outputs[0].shape)
    return "conv" if geom is None else geom.detail


def op_class_keys(op: OpInfo) -> tuple[str, ...]:
    """The classes an op's fitted eager time may come from, most specific first: ``category/detail/dtype``,
    ``category/detail``, ``category`` (detail: :func:`conv_detail` for convolutions, the SDPA backend for
    attention, the cell for a recurrent op, else the aten op's name: ``normalization/native_group_norm/fp32``)."""
    if op.category == "conv":
        detail = conv_detail(op)
    elif op.category in ("attention", "recurrent"):
        detail = op.variant or op.category
    else:
        detail = short_target(op.target)
    return (f"{op.category}/{detail}/{op.dtype}", f"{op.category}/{detail}", op.category)


def launches(op: OpInfo) -> bool:
    """Whether ``op`` launches a kernel when run eagerly: not when every output is empty (0 elements)."""
    return not op.outputs or any(o.numel > 0 for o in op.outputs)


def has_bias(op: OpInfo) -> bool:
    """A convolution with a bias operand (aten.convolution's third input, not empty)."""
    return len(op.inputs) > 2 and op.inputs[2].numel > 0
