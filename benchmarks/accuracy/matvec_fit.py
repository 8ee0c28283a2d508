"""How the matrix-vector products of a spec's measured matmul table are priced: by the GEMM surface (each entry's
class table refitted without its shape) and as the analysis prices them (the matrix-vector stream fitted on the other
entries of the dtype, where it has enough; else the surface), leaving each shape out.

    python benchmarks/accuracy/matvec_fit.py [--spec h100 --spec h200] [--out FILE.json]

CPU only: reads the shipped specs' ``matmul_rates`` (fusion_advisor.devices.op_rates.MatvecModel,
fit_matvec_model, fit_matmul_table). Prints one line per entry and a summary per spec and dtype: median
|log2(predicted / measured)| and the share within 30%.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fusion_advisor.devices import load_spec  # noqa: E402
from fusion_advisor.devices.op_rates import (fit_matmul_table, fit_matvec_model, is_matvec, matmul_bytes,  # noqa: E402
                                             matmul_point, matmul_pool, matmul_aligned)

WITHIN = math.log2(1.3)


def judge(spec_name: str) -> dict:
    spec = load_spec(spec_name)
    rates, bw = spec.matmul_rates, spec.memory_bandwidth_gbps
    rows = []
    for r in rates:
        if not is_matvec(r.m, r.n):
            continue
        flops = 2.0 * r.batch * r.m * r.n * r.k
        measured = flops / (r.tflops * 1e6)
        nbytes = matmul_bytes(r.m, r.n, r.k, r.batch, r.dtype)
        # every entry of this shape left out (a table may hold one shape twice)
        shape = (r.detail, r.dtype, r.layout, r.batch, r.m, r.n, r.k)
        others = [o for o in rates if (o.detail, o.dtype, o.layout, o.batch, o.m, o.n, o.k) != shape]
        pool = [p for p in matmul_pool(others, r.detail, r.dtype)]
        surface = fit_matmul_table(tuple(pool)).time_us(flops, float(r.n), float(r.k), nbytes,
                                                        not matmul_aligned(r.n, r.k, r.dtype),
                                                        matmul_point(r.m, r.n, r.k, r.batch, r.layout), r.layout)
        model = fit_matvec_model(others, bw, r.dtype)  # as the analysis prices it: the dtype's own entries
        stream = model.time_us(nbytes, bw) if model else surface  # too few of the dtype: the surface
        rows.append({"detail": r.detail, "dtype": r.dtype, "layout": r.layout, "batch": r.batch, "m": r.m, "n": r.n,
                     "k": r.k, "bytes": nbytes, "measured_us": measured, "surface_us": surface, "stream_us": stream})
        print(f"{spec_name} {r.detail:3s} {r.dtype} {r.layout} b{r.batch:<4d} {r.m}x{r.n}x{r.k}: measured "
              f"{measured:8.1f} us, surface {surface / measured:5.2f}x, stream {stream / measured:5.2f}x", flush=True)

    def summary(key: str, dtype: str | None = None) -> dict:
        errs = [abs(math.log2(x[key] / x["measured_us"])) for x in rows if dtype in (None, x["dtype"])]
        return {"entries": len(errs), "median_abs_log2": round(statistics.median(errs), 3) if errs else None,
                "within_30pct": f"{sum(e < WITHIN for e in errs)}/{len(errs)}"}

    dtypes = sorted({x["dtype"] for x in rows})
    fitted = {d: fit_matvec_model(rates, bw, d) for d in dtypes}
    out = {"spec": spec_name, "bandwidth_gbps": bw, "entries": len(rows),
           "surface": summary("surface_us"), "priced": summary("stream_us"),
           "by_dtype": {d: {"surface": summary("surface_us", d), "priced": summary("stream_us", d),
                            "stream_fitted_on_all": asdict(fitted[d]) if fitted[d] else None} for d in dtypes},
           "rows": rows}
    print(f"{spec_name}: {len(rows)} matrix-vector entries, each shape left out: surface {out['surface']}, "
          f"as priced (the stream where its dtype has enough entries) {out['priced']}; by dtype {out['by_dtype']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", action="append", default=None)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = [judge(s) for s in (args.spec or ["h100", "h200"])]
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
