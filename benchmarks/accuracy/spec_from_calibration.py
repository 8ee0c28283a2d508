"""Ship a calibration's measured tables in a device spec, refit its op-class curves, and judge them on a test set.

1. The base: the shipped spec (``--spec``, its fits removed) plus, from a ``fusion-advisor calibrate`` YAML
   (``--calibrated``), the convolution and matmul tables (``conv_rates``, ``matmul_rates``), the elementwise
   overhead, and the host costs (``launch_overhead_by_class``, ``view_overhead_us``, ``module_call_us``) scaled
   from the calibrating machine's ``launch_overhead_us`` to the spec's (``DeviceSpec.at_host_speed``: host speed
   differs between machines with the same GPU; ``analyze --profile`` scales them again to the host it runs on).
2. ``fusion-advisor calibrate --from-profile FIT --test TEST --base BASE``: the op-class curves fitted on the fit
   reports over that base, with the accuracy before and after on both sets (its CSVs beside ``--out``).
3. ``--write``: the spec file rewritten: everything up to its ``op_time_fits`` kept as it is, then the measured
   fields above with their sources, then the fitted curves (one line each).

A spec that is still a datasheet's (``h100``) takes its head from the calibration instead
(``--header-from-calibrated``): the calibration's measured rates (copy bandwidth, matmul and attention TFLOP/s,
launch overhead, recurrent steps, pooling, L2) under the shipped spec's name; with ``--reference`` (a spec whose
accuracy was judged) only the fields that spec carries, and its ``route_efficiency`` (calibrate does not measure it).

Usage (CPU): ``python benchmarks/accuracy/spec_from_calibration.py --calibrated CAL.yaml --fit DIR --test DIR
--out OUTDIR [--conv-rates-from CAL2.yaml] [--merge-tables CAL3.yaml|PROBE.json...] [--merge-matmuls CAL4.yaml|PROBE.json...] [--reductions CAL.yaml|PROBE.json...]
[--write]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fusion_advisor.devices import SPEC_DIR, load_spec, spec_mapping  # noqa: E402
from fusion_advisor.devices.fit_profiles import without_fits  # noqa: E402
from fusion_advisor.devices.op_rates import ConvRate, MatmulRate  # noqa: E402
from fusion_advisor.devices.reduction_rates import NORM_CLASSES, ReductionRate  # noqa: E402


def reduction_table(paths: tuple[Path, ...], map_norms: tuple[Path, ...] = ()) -> tuple[ReductionRate, ...]:
    """The ``reduction_rates`` of each file of ``paths`` and then ``map_norms`` in turn (a calibrate YAML, or a
    ``table_probe.py`` JSON); of ``map_norms``' (measured before ``reduction_call`` made a spatial-1 norm input a
    ``N x C`` matrix) the BatchNorm and GroupNorm entries of spatial 1 dropped: they timed ``N x C x 1 x 1`` maps,
    which cuDNN runs up to 100x slower."""
    out: list[ReductionRate] = []
    for path in (*paths, *map_norms):
        if path.suffix == ".json":
            rates = [ReductionRate.from_dict(d) for d in json.loads(path.read_text())["reduction_rates"]]
        else:
            rates = list(load_spec(str(path)).reduction_rates)
        if path in map_norms:
            rates = [r for r in rates if not (r.op in NORM_CLASSES and r.dims[2] == 1)]
        out += rates
    return tuple(out)


def _tables(path: Path):
    """A calibrate YAML's spec, or a ``table_probe.py`` JSON's ``conv_rates`` and ``matmul_rates`` as a spec's
    (on an empty copy of the CPU spec; only its tables are read)."""
    if path.suffix != ".json":
        return load_spec(str(path))
    data = json.loads(path.read_text())
    return dataclasses.replace(load_spec("cpu"), conv_rates=tuple(ConvRate.from_dict(d) for d in data["conv_rates"]),
                               matmul_rates=tuple(MatmulRate.from_dict(d) for d in data["matmul_rates"]),
                               reduction_rates=())


def base_spec(spec_name: str, calibrated: Path, conv_from: Path | None = None, merge: tuple[Path, ...] = (),
              reductions: tuple[Path, ...] = (), map_norms: tuple[Path, ...] = (), merge_matmuls: tuple[Path, ...] = ()):
    """The shipped spec without its fits, with the calibration's tables, elementwise overhead and host costs
    (``conv_rates`` and the host cost per convolution activity from ``conv_from``'s calibration when given), the
    ``conv_rates``, ``matmul_rates`` and ``reduction_rates`` of each calibration in ``merge`` appended to its tables
    (the shipped ``reduction_rates`` kept where no calibration measured any), and the ``matmul_rates`` alone of each
    in ``merge_matmuls``; the table of ``reductions`` and
    ``map_norms`` (:func:`reduction_table`) instead where given."""
    spec = without_fits(load_spec(spec_name))
    cal = load_spec(str(calibrated)).at_host_speed(spec.launch_overhead_us)
    # the convolution table's activity counts and the host cost per activity come from the same calibration
    conv = load_spec(str(conv_from)).at_host_speed(spec.launch_overhead_us) if conv_from is not None else cal
    extra = [_tables(m) for m in merge]
    matmuls = sum((_tables(m).matmul_rates for m in merge_matmuls), ())
    return dataclasses.replace(spec, conv_rates=conv.conv_rates + sum((m.conv_rates for m in extra), ()),
                               matmul_rates=cal.matmul_rates + sum((m.matmul_rates for m in extra), ()) + matmuls,
                               reduction_rates=(reduction_table(reductions, map_norms) or cal.reduction_rates
                                                + sum((m.reduction_rates for m in extra), ()) or spec.reduction_rates),
                               elementwise_overhead_us=cal.elementwise_overhead_us,
                               kernel_busy_overhead_us=cal.kernel_busy_overhead_us or spec.kernel_busy_overhead_us,
                               launch_overhead_by_class=cal.launch_overhead_by_class,
                               view_overhead_us=cal.view_overhead_us, module_call_us=cal.module_call_us,
                               activity_host_share=conv.activity_host_share, conv_probe_kernels=conv.conv_probe_kernels,
                               scan_bandwidth_gbps=conv.scan_bandwidth_gbps,
                               cat_sweep_gbps=cal.cat_sweep_gbps or spec.cat_sweep_gbps,
                               cat_sweep_cap_bytes=cal.cat_sweep_cap_bytes or spec.cat_sweep_cap_bytes), cal


#: Calibration fields :func:`spec_text` writes after the head (rescaled or merged); the head leaves them out.
WRITTEN_AFTER_HEAD = ("elementwise_overhead", "kernel_busy_overhead", "scan_bandwidth", "cat_sweep", "view_overhead",
                      "module_call", "activity_host", "conv_probe_kernels", "launch_overhead_by_class", "conv_rates",
                      "matmul_rates", "reduction_rates", "host_time_scale", "cold_host_scale", "view_host_scale",
                      "op_time_fit")


def header_from_calibration(spec_name: str, calibrated: Path, reference: str | None = None) -> str:
    """The head of spec ``spec_name`` (its text up to the fields :func:`spec_text` writes) from a calibrate YAML:
    the measured fields of ``calibrated`` but those of :data:`WRITTEN_AFTER_HEAD`, under the shipped spec's
    ``name`` and ``display_name``. With a ``reference`` spec (one whose accuracy was judged), only the fields it
    carries, so the two predict alike, and its ``route_efficiency`` where the calibration has none (calibrate does
    not measure it; a share of the roofline, not a rate)."""
    shipped = load_spec(spec_name)
    # the file as written (its sources and calibration block too); libyaml's loader: thousands of table entries
    data = yaml.load(calibrated.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    ref = spec_mapping(load_spec(reference)) if reference else None
    head = {"name": shipped.name, "display_name": shipped.display_name}
    head.update({k: v for k, v in data.items() if k not in ("name", "display_name")
                 and not k.startswith(WRITTEN_AFTER_HEAD)
                 and (ref is None or k in ref or k.removesuffix("_source") in ref)})
    if ref and ref.get("route_efficiency") and "route_efficiency" not in head:
        head["route_efficiency"] = ref["route_efficiency"]
        head["route_efficiency_source"] = f"copied from the {reference} spec: {ref.get('route_efficiency_source', '')}"
    return yaml.safe_dump(head, sort_keys=False, width=120)


def _flow(d) -> str:
    return yaml.safe_dump(d, default_flow_style=True, width=1000).strip()


def spec_text(spec_name: str, base, cal_path: Path, cal_launch_us: float, fitted: dict, fit_note: str,
              conv_path: Path | None = None, merge: tuple[Path, ...] = (), reductions: tuple[Path, ...] = (),
              map_norms: tuple[Path, ...] = (), head: Path | None = None, merge_matmuls: tuple[Path, ...] = ()) -> str:
    """The spec file: its text (or ``head``'s) up to ``op_time_fits``, then the measured fields and the fitted
    curves."""
    lines = (head or SPEC_DIR / f"{spec_name}.yaml").read_text().splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith(("op_time_fits:", "elementwise_overhead_us:"))),
               len(lines))
    data = spec_mapping(base)
    act_sources = load_spec(str(conv_path or cal_path)).sources or {}

    def act_source(key: str) -> str:  # the convolution calibration's source line of ``key``, re-attributed
        how = (act_sources.get(key) or "").split(": ", 1)[-1]
        return f"measured by fusion-advisor calibrate ({conv_path or cal_path}): {how}"

    by = f"measured by fusion-advisor calibrate ({cal_path})"
    out = lines[:cut]
    out.append(f"elementwise_overhead_us: {round(base.elementwise_overhead_us, 3)}   # device time per eager "
               "elementwise/reduction kernel beyond its bytes")
    out.append(f'elementwise_overhead_source: "{by}: CUDA-graph replay of eager adds"')
    if base.kernel_busy_overhead_us > 0:
        out.append(f"kernel_busy_overhead_us: {round(base.kernel_busy_overhead_us, 3)}   # the same as the profiler "
                   "sees an eager kernel's duration (no gap to the next kernel)")
        out.append(f'kernel_busy_overhead_source: "{(base.sources or {}).get("kernel_busy_overhead", by)}"')
    if base.scan_bandwidth_gbps > 0:
        out.append(f"scan_bandwidth_gbps: {round(base.scan_bandwidth_gbps, 1)}   # eager cumsum / cumprod kernels")
        out.append(f'scan_bandwidth_source: "{act_source("scan_bandwidth")}"')
    if base.cat_sweep_gbps > 0:
        out.append(f"cat_sweep_gbps: {round(base.cat_sweep_gbps, 1)}   # torch.cat: each input sweeps the largest's "
                   "grid blocks, up to the cap, at this rate")
        out.append(f"cat_sweep_cap_bytes: {round(base.cat_sweep_cap_bytes)}")
        measured = (load_spec(str(cal_path)).sources or {}).get("cat_sweep")
        source = (f"{by}: {measured.split(': ', 1)[-1]}" if measured
                  else (load_spec(spec_name).sources or {}).get("cat_sweep", ""))  # the shipped spec's, kept
        out.append(f'cat_sweep_source: "{source}"')
    out.append(f"# host time beyond launch_overhead_us, {by} on a machine at {cal_launch_us:.3f} us per eager add,")
    out.append(f"# scaled to this spec's {base.launch_overhead_us:g} us; analyze --profile scales them to its host")
    out.append(f"view_overhead_us: {round(base.view_overhead_us, 3)}")
    out.append(f"module_call_us: {round(base.module_call_us, 3)}")
    if base.activity_host_share > 0:
        out.append(f"activity_host_share: {round(base.activity_host_share, 4)}   # of the conv class's host time, "
                   "per device activity of a cuDNN convolution call beyond the conv probe's")
        out.append(f"conv_probe_kernels: {round(base.conv_probe_kernels, 2)}")
        out.append(f'activity_host_source: "{act_source("activity_host")}"')
    out.append("launch_overhead_by_class:")
    out += [f"  {k}: {round(v, 2)}" for k, v in base.launch_overhead_by_class.items()]
    out.append(f'launch_overhead_by_class_source: "{by}: wall time per tiny eager call of each class, through the '
               'nn.Module that issues it where there is one, less the module call, views and launches priced apart '
               '(fusion_advisor/devices/host_costs.py host_probes), scaled as said above; view_overhead_us (the median '
               'of ten view ops as code writes them) and module_call_us (a nested module call) the same way"')
    out.append("# measured convolutions and matmuls: an op's time is a roofline fitted through its class's "
               "(op_rates.FittedTable: ConvTimeModel, locally corrected where that helps; fusion_advisor/devices/op_rates.py)")
    out.append("conv_rates:")
    out += [f"  - {_flow(r)}" for r in data["conv_rates"]]
    conv_by = f"measured by fusion-advisor calibrate ({', '.join(map(str, (conv_path or cal_path, *merge)))})"
    out.append(f'conv_rates_source: "{conv_by}: seeded random convolutions of every class (half of them drawn as a '
               'network layer, a quarter of the 2-D ones as a late CNN stage\'s), contiguous, no bias, '
               'cudnn.allow_tf32 on and cudnn.benchmark off (PyTorch\'s defaults), summed kernel durations of 3 '
               'profiled calls (L2 warm)"')
    out.append("matmul_rates:")
    out += [f"  - {_flow(r)}" for r in data["matmul_rates"]]
    with_matmuls = [m for m in merge if _tables(m).matmul_rates]  # a merged file of convolutions alone is not named
    mm_by = (f"measured by fusion-advisor calibrate ({', '.join(map(str, (cal_path, *with_matmuls)))})"
             + (f" and the matmuls of {', '.join(map(str, merge_matmuls))}" if merge_matmuls else ""))
    out.append(f'matmul_rates_source: "{mm_by}: seeded torch.mm / torch.bmm (B contiguous, nn, and in nn.Linear\'s layout, nt, where recorded), fp32 with TF32 off (PyTorch\'s default), '
               'summed kernel durations of 3 profiled calls (L2 warm)"')
    if data.get("reduction_rates"):
        out.append("# measured normalizations, softmaxes and reductions: an op's time is interpolated from its class's "
                   "entries nearest its geometry (fusion_advisor/devices/reduction_rates.py)")
        out.append("reduction_rates:")
        out += [f"  - {_flow(r)}" for r in data["reduction_rates"]]
        red_by = (f"measured by fusion-advisor calibrate and benchmarks/accuracy/table_probe.py "
                  f"({', '.join(map(str, reductions))}; and, their spatial-1 BatchNorm / GroupNorm entries dropped, "
                  f"{', '.join(map(str, map_norms)) or 'none'})" if reductions
                  else f"measured by fusion-advisor calibrate ({', '.join(map(str, (cal_path, *merge)))})")
        out.append(f'reduction_rates_source: "{red_by}: seeded fp32 F.batch_norm (eval, training), F.group_norm, '
                   'F.layer_norm, torch.softmax, torch.sum / mean / amax and torch.logsumexp calls '
                   '(reduction_rates.reduction_plan), summed kernel durations and kernel count of 3 profiled calls '
                   '(L2 warm)"')
    if fitted.get("host_time_scale", 1.0) != 1.0:
        out.append(f"host_time_scale: {fitted['host_time_scale']}   # in-model over tight-loop host time, fitted from "
                   "analyze --profile runs (see host_time_scale_source)")
        out.append(f'host_time_scale_source: "{fitted["host_time_scale_source"]} (the fit set: op_time_fits_source)"')
    if fitted.get("cold_host_scale", 1.0) != 1.0:
        out.append(f"cold_host_scale: {fitted['cold_host_scale']}   # in-model host time of an op whose aten op had not "
                   "run for many launches, over a warm op's (see cold_host_scale_source)")
        out.append(f'cold_host_scale_source: "{fitted["cold_host_scale_source"]} (the fit set: op_time_fits_source)"')
    if fitted.get("view_host_scale", 1.0) != 1.0:
        out.append(f"view_host_scale: {fitted['view_host_scale']}   # in-model host time of a view op over its "
                   "calibrated price (see view_host_scale_source)")
        out.append(f'view_host_scale_source: "{fitted["view_host_scale_source"]} (the fit set: op_time_fits_source)"')
    out.append("op_time_fits:                    # eager time per op class over the measured rates above, fitted "
               "from analyze --profile runs (see op_time_fits_source)")
    out += [f"  {k}: {_flow(f)}" for k, f in fitted["op_time_fits"].items()]
    out.append(f"op_time_fit_dtypes: {_flow(fitted['op_time_fit_dtypes'])}   # measured on these dtypes only: "
               "other ops keep the roofline and its measured rates")
    out.append(f'op_time_fits_source: "{fit_note}"')
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="h200")
    ap.add_argument("--calibrated", type=Path, required=True)
    ap.add_argument("--fit", type=Path, nargs="+", required=True, help="analyze --profile report folders to fit on")
    ap.add_argument("--test", type=Path, nargs="+", required=True, help="report folders the fit never sees")
    ap.add_argument("--out", type=Path, required=True, help="folder for base.yaml, fitted.yaml and the CSVs")
    ap.add_argument("--conv-rates-from", type=Path, default=None,
                    help="another calibrate YAML whose conv_rates to ship instead (a newer table measured on a host "
                         "whose host costs are not the ones the fit and test reports were profiled with)")
    ap.add_argument("--merge-tables", type=Path, nargs="*", default=[],
                    help="more calibrate YAMLs (or table_probe.py JSONs) whose conv_rates and matmul_rates are "
                         "appended to the tables (one calibration's random draw moved single models by up to 0.3x)")
    ap.add_argument("--merge-matmuls", type=Path, nargs="*", default=[],
                    help="more calibrate YAMLs or table_probe.py JSONs whose matmul_rates alone are appended")
    ap.add_argument("--reductions", type=Path, nargs="*", default=[],
                    help="calibrate YAMLs or table_probe.py JSONs whose reduction_rates, together, form the table")
    ap.add_argument("--reductions-map-norms", type=Path, nargs="*", default=[],
                    help="more such tables, measured when a spatial-1 norm input was a N x C x 1 x 1 map: their "
                         "spatial-1 BatchNorm / GroupNorm entries are dropped")
    ap.add_argument("--note", default="", help="op_time_fits_source text (the fit and test sets, the accuracy)")
    ap.add_argument("--header-from-calibrated", action="store_true",
                    help="the spec's head (rates, launch overhead) from the calibration, for a datasheet spec")
    ap.add_argument("--reference", default=None, help="with --header-from-calibrated: a judged spec whose fields "
                    "(and route_efficiency) the head keeps")
    ap.add_argument("--write", action="store_true", help="rewrite fusion_advisor/devices/<spec>.yaml")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    head = None
    if args.header_from_calibrated:
        head = args.out / "head.yaml"
        head.write_text(header_from_calibration(args.spec, args.calibrated, args.reference))
    base, cal = base_spec(str(head) if head else args.spec, args.calibrated, args.conv_rates_from,
                          tuple(args.merge_tables), tuple(args.reductions), tuple(args.reductions_map_norms),
                          tuple(args.merge_matmuls))
    base_path = args.out / "base.yaml"
    base_path.write_text(yaml.safe_dump(spec_mapping(base), sort_keys=False))
    cmd = [sys.executable, "-m", "fusion_advisor.cli", "calibrate", *sum((["--from-profile", str(p)]
                                                                           for p in args.fit), []),
           *sum((["--test", str(p)] for p in args.test), []), "--base", str(base_path),
           "--out", str(args.out / "fitted.yaml")]
    fitted_path = args.out / "fitted.yaml"
    if fitted_path.exists():
        fitted_path.unlink()  # calibrate never overwrites; this script owns the folder
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    (args.out / "calibrate_from_profile.txt").write_text(p.stdout + p.stderr)
    print(p.stdout[-3000:] + p.stderr[-2000:])
    if p.returncode != 0:
        return p.returncode
    if args.write:
        fitted = yaml.safe_load(fitted_path.read_text())
        text = spec_text(args.spec, base, args.calibrated, load_spec(str(args.calibrated)).launch_overhead_us,
                         fitted, args.note, args.conv_rates_from, tuple(args.merge_tables), tuple(args.reductions),
                         tuple(args.reductions_map_norms), head, tuple(args.merge_matmuls))
        (SPEC_DIR / f"{args.spec}.yaml").write_text(text)
        load_spec(args.spec)  # it must load
        print(f"wrote {SPEC_DIR / f'{args.spec}.yaml'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
