"""Where the spec's measured tables stop: a warning for each op priced far beyond the sizes they measured.

A table-priced op inside the table's range is priced from its neighbours; beyond it, the fitted surface carries
efficiency terms learnt on other sizes (:func:`fusion_advisor.devices.op_rates.matmul_time_us`), and the report
should say the price is an extrapolation.
"""

from __future__ import annotations

from fusion_advisor.analyze.records import OpInfo
from fusion_advisor.analyze.matmul_shapes import matmul_problem
from fusion_advisor.analyze.roofline import op_device_us, roofline_op_us
from fusion_advisor.devices import DeviceSpec
from fusion_advisor.devices.op_rates import matmul_pool

#: A matmul whose M, N, K or batch is more than this many times the largest its class and dtype measured is priced
#: beyond the spec's table (:func:`beyond_table_note`).
BEYOND_TABLE_FACTOR = 2.0

#: ... and is named only when its price is more than this many times its roofline time: a GEMM beyond the table
#: priced at its ceiling (the default model's 32000-wide LM head, at its compute floor) is no extrapolation to
#: doubt.
BEYOND_ROOFLINE_FACTOR = 2.0


def beyond_table_note(op: OpInfo, spec: DeviceSpec) -> str:
    """A warning for a matmul priced from the spec's measured table far beyond its range (a size more than
    :data:`BEYOND_TABLE_FACTOR` times the largest its class and dtype measured) at more than
    :data:`BEYOND_ROOFLINE_FACTOR` times its roofline time, naming the op, its source line, the sizes, the price
    and its share of the roofline; ``""`` otherwise.

    The fitted surface's efficiency terms were learnt inside the table: a fresh user's batched dot product
    (``einsum('bik,bik->b')``, a bmm of M = N = 1 over K = 262,144, the table's largest K 16,382) read 4.2 ms, 16
    GB/s, where its 67 MB at copy bandwidth take 16 us; nothing measured says which is nearer."""
    problem = matmul_problem(op) if spec.matmul_rates else None
    if problem is None:
        return ""
    detail, m, n, k, batch, dtype, _ = problem
    pool = matmul_pool(spec.matmul_rates, detail, dtype)
    if not pool:
        return ""
    sizes = {"M": (m, max(r.m for r in pool)), "N": (n, max(r.n for r in pool)), "K": (k, max(r.k for r in pool)),
             "batch": (batch, max(r.batch for r in pool))}
    beyond = [f"{name} {v:,} against at most {top:,}" for name, (v, top) in sizes.items()
              if v > BEYOND_TABLE_FACTOR * top]
    if not beyond:
        return ""
    t = op_device_us(op, spec)  # the price the chains carry: table, floors and any profile fit
    roofline = roofline_op_us(op, spec)
    if roofline <= 0 or t <= BEYOND_ROOFLINE_FACTOR * roofline:
        return ""
    where = f"{op.source.file}:{op.source.line}" if op.source.line else op.id
    return (f"{where}: {op.name} [{m} x {k}] @ [{k} x {n}]" + (f" x {batch}" if batch > 1 else "")
            + f" {dtype} is priced beyond the spec's measured GEMM table (" + "; ".join(beyond)
            + f" measured): est. {t:,.1f} us, {100 * roofline / t:.1f}% of its roofline, is an extrapolation, not a "
              f"measurement")
