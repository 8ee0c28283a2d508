"""How the matrix-vector products of a spec's measured matmul table are priced: by the GEMM surface (each entry's
class table refitted without it) and by the matrix-vector stream model (fitted on the other entries), leave one out.

    python benchmarks/accuracy/matvec_fit.py [--spec h100 --spec h200] [--out FILE.json]

CPU only: reads the shipped specs' ``matmul_rates`` (fusion_advisor.devices.op_rates.MatvecModel,
fit_matvec_model, fit_matmul_table). Prints one line per entry and a summary per spec: median |log2(predicted /
measured)| and the share within 30%.
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
    for i, r in enumerate(rates):
        if not is_matvec(r.m, r.n):
            continue
        flops = 2.0 * r.batch * r.m * r.n * r.k
        measured = flops / (r.tflops * 1e6)
        nbytes = matmul_bytes(r.m, r.n, r.k, r.batch, r.dtype)
        others = rates[:i] + rates[i + 1:]
        pool = [p for p in matmul_pool(others, r.detail, r.dtype)]
        surface = fit_matmul_table(tuple(pool)).time_us(flops, float(r.n), float(r.k), nbytes,
                                                        not matmul_aligned(r.n, r.k, r.dtype),
                                                        matmul_point(r.m, r.n, r.k, r.batch, r.layout), r.layout)
        model = fit_matvec_model(others, bw)
        stream = model.time_us(nbytes, bw) if model else float("nan")
        rows.append({"detail": r.detail, "dtype": r.dtype, "layout": r.layout, "batch": r.batch, "m": r.m, "n": r.n,
                     "k": r.k, "bytes": nbytes, "measured_us": measured, "surface_us": surface, "stream_us": stream})
        print(f"{spec_name} {r.detail:3s} {r.dtype} {r.layout} b{r.batch:<4d} {r.m}x{r.n}x{r.k}: measured "
              f"{measured:8.1f} us, surface {surface / measured:5.2f}x, stream {stream / measured:5.2f}x", flush=True)

    def summary(key: str) -> dict:
        errs = [abs(math.log2(x[key] / x["measured_us"])) for x in rows]
        return {"median_abs_log2": round(statistics.median(errs), 3),
                "within_30pct": f"{sum(e < WITHIN for e in errs)}/{len(errs)}"}

    fitted = fit_matvec_model(rates, bw)
    out = {"spec": spec_name, "bandwidth_gbps": bw, "entries": len(rows), "surface": summary("surface_us"),
           "stream": summary("stream_us"), "fitted_on_all": asdict(fitted) if fitted else None, "rows": rows}
    print(f"{spec_name}: {len(rows)} matrix-vector entries; leave one out: surface {out['surface']}, "
          f"stream {out['stream']}; fitted on all {out['fitted_on_all']}")
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
