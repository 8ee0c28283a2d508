"""Host time per eager call of a model's own convolution, norm, pooling and activation modules at the shapes the
model feeds them, beside the device activities (kernels, memsets, copies) each call issues, and calibrate's tiny
probes of the same classes (fusion_advisor.devices.host_costs.host_probes).

Why: the cost model prices a convolution's host time with one probe (a 3x3 ``nn.Conv2d`` on 2 x 8 x 8 x 8), but
inside ResNet101 cuDNN issues 1-5 device activities per convolution (layout transforms, workspace memsets) and the
profile measured the GPU idling 38% longer behind the convolutions and 3x longer behind the BatchNorms than
predicted (benchmarks/results/h200/accuracy/reprofile/). This measures whether host time per call follows the
activities it issues.

Host time of a call: ``calls`` back-to-back calls issued without synchronising (the GPU queue holds them), their
wall time over ``calls``, median of ``rounds`` rounds with a synchronisation between rounds (not timed). Activities:
torch.profiler's CUDA events (kernels, memsets, memcpys) over 3 calls, per call.

    python benchmarks/host/host_by_shape.py --out DIR MODEL.py...   # writes DIR/host_by_shape.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import per_call_us  # noqa: E402
from fusion_advisor.devices.host_costs import host_probes  # noqa: E402

LEAVES = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
          torch.nn.ConvTranspose3d, torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.ReLU,
          torch.nn.MaxPool2d, torch.nn.AvgPool2d, torch.nn.AdaptiveAvgPool2d, torch.nn.Linear, torch.nn.GroupNorm,
          torch.nn.LayerNorm)


def host_us(call) -> float:
    """Median host time per call (us) of 16 unsynchronised back-to-back calls, over 7 loops (the issue time alone:
    :func:`benchmarks.common.per_call_us` without the drain)."""
    return per_call_us(call, calls=16, repeats=7, warmup=3, count_drain=False)


def activities(call, calls: int = 3) -> tuple[float, list[str]]:
    """Device activities per call and their names (first call's)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(events) / calls, sorted({e.name[:80] for e in events})


def load_model(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    return model, inputs


def module_rows(path: Path) -> dict:
    model, inputs = load_model(path)
    seen: dict[int, tuple] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, LEAVES):
            def hook(mod, args, name=name):
                seen.setdefault(id(mod), (name, mod, tuple(a.detach() if isinstance(a, torch.Tensor) else a
                                                           for a in args)))
            hooks.append(m.register_forward_pre_hook(hook))
    with torch.no_grad():
        model(*inputs)
        for h in hooks:
            h.remove()
        rows = []
        for name, mod, args in seen.values():
            call = (lambda mod=mod, args=args: mod(*args))
            n, names = activities(call)
            rows.append({"module": name, "type": type(mod).__name__,
                         "input": list(args[0].shape) if args and isinstance(args[0], torch.Tensor) else None,
                         "host_us": host_us(call), "activities": n, "names": names})
        t0 = time.perf_counter()
        model(*inputs)
        issue = (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            model(*inputs)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 5 * 1e6
    return {"file": path.name, "modules": rows, "model_issue_us": issue, "model_wall_us": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("models", type=Path, nargs="*")
    args = ap.parse_args()
    probes = []
    with torch.no_grad():
        for key, probe in host_probes("cuda").items():
            n, names = activities(probe)
            probes.append({"class": key, "host_us": host_us(probe), "activities": n, "names": names})
            print(f"probe {key:55} {probes[-1]['host_us']:7.1f} us {n:.1f} activities", flush=True)
        x = torch.ones(1024, device="cuda")
        add = host_us(lambda: torch.add(x, 1.0))
    models = []
    for path in args.models:
        try:
            models.append(module_rows(path))
        except Exception as e:  # noqa: BLE001 - one model failing must not stop the others
            models.append({"file": path.name, "error": f"{type(e).__name__}: {e}"})
            continue
        for r in models[-1]["modules"]:
            print(f"{path.stem[:28]:28} {r['module'][:28]:28} {r['type']:14} {str(r['input']):26} "
                  f"{r['host_us']:7.1f} us {r['activities']:.1f} act", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "add_us": add, "probes": probes, "models": models}
    (args.out / "host_by_shape.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
