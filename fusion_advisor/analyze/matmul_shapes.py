"""The GEMM an aten matmul op runs as: its class, sizes and layout, as the spec's measured matmul table reads them
(:func:`fusion_advisor.devices.op_rates.matmul_time_us`)."""

from __future__ import annotations

import math

from fusion_advisor.analyze.op_classes import short_target
from fusion_advisor.analyze.records import OpInfo, TensorMeta

#: aten matmuls priced from the spec's ``matmul_rates``: op name -> (measured class, index of the first operand).
_MATMUL_OPERANDS = {"mm": ("mm", 0), "addmm": ("mm", 1), "bmm": ("bmm", 0), "baddbmm": ("bmm", 1)}


def matmul_problem(op: OpInfo) -> tuple[str, int, int, int, int, str, str] | None:
    """The GEMM a matmul op runs as, in :func:`fusion_advisor.devices.op_rates.matmul_time_us`'s arguments:
    ``(detail, M, N, K, batch, dtype, layout)`` (``detail`` ``mm`` or ``bmm``); None for another op or shapes it
    cannot read."""
    if op.category != "matmul":
        return None
    if short_target(op.target) == "linear" and len(op.inputs) >= 2 and len(op.inputs[1].shape) == 2:
        # aten.linear (kept whole by an export): x [..., K] times weight [N, K] transposed, one mm of numel(x) / K rows
        x, (n, k) = op.inputs[0], op.inputs[1].shape
        if k <= 0 or n <= 0 or not x.shape or x.shape[-1] != k or x.numel < k:
            return None
        return "mm", x.numel // k, n, k, 1, op.dtype, "nt"
    if short_target(op.target) == "matmul" and len(op.inputs) >= 2:
        # aten.matmul (kept whole by an export): [..., M, K] @ [K, N] as one mm of numel / K rows, or batched
        # [..., M, K] @ [..., K, N] of equal batch dims as one bmm, as torch.matmul runs them
        a, b = op.inputs[0].shape, op.inputs[1].shape
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2] or min(*a, *b) <= 0:
            return None
        layout = matmul_layout(op.inputs[1])
        if len(b) == 2:
            return "mm", math.prod(a[:-1]), b[-1], a[-1], 1, op.dtype, layout
        if tuple(a[:-2]) != tuple(b[:-2]):
            return None
        return "bmm", a[-2], b[-1], a[-1], math.prod(a[:-2]), op.dtype, layout
    if short_target(op.target) in ("mv", "addmv"):  # [M, K] @ [K] (addmv: after its bias): a matrix-vector mm
        first = 1 if short_target(op.target) == "addmv" else 0
        if len(op.inputs) < first + 2:
            return None
        a, v = op.inputs[first].shape, op.inputs[first + 1].shape
        if len(a) != 2 or len(v) != 1 or a[1] != v[0] or min(*a) <= 0:
            return None
        return "mm", a[0], 1, a[1], 1, op.dtype, "nn"
    how = _MATMUL_OPERANDS.get(short_target(op.target))
    if how is None or len(op.inputs) < how[1] + 2:
        return None
    a, b = op.inputs[how[1]].shape, op.inputs[how[1] + 1].shape
    if len(a) != len(b) or len(a) not in (2, 3) or a[-1] != b[-2]:
        return None
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    if min(batch, m, n, k) <= 0:
        return None
    return how[0], m, n, k, batch, op.dtype, matmul_layout(op.inputs[how[1] + 1])


def matmul_layout(b: TensorMeta) -> str:
    """The layout (:data:`fusion_advisor.devices.op_rates.MATMUL_LAYOUTS`) of a matmul's second operand ``b``
    (``[..., K, N]``): ``nt`` where it is not contiguous (nn.Linear's ``weight.t()``, attention's
    ``k.transpose(-2, -1)``), else ``nn``."""
    return "nn" if b.contiguous else "nt"
