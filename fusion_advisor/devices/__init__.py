"""Device specs: the roofline ceilings (memory bandwidth, peak FLOP/s per dtype, launch overhead) of a device.

Shipped specs are YAML files beside this module (``h200``, ``h100``, ``a100``, ``l4``, ``cpu``); ``--gpu`` also takes
the path of a YAML file with the same fields. Every number carries its source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fusion_advisor.errors import DeviceSpecError

SPEC_DIR = Path(__file__).parent

_REQUIRED = ("name", "memory_bandwidth_gbps", "tensor_tflops", "vector_tflops", "launch_overhead_us")


@dataclass(frozen=True)
class DeviceSpec:
    """Roofline ceilings of one device.

    Attributes:
        name: short name (``"h200"``).
        display_name: full device name.
        memory_bandwidth_gbps: peak memory bandwidth in GB/s (1e9 bytes/s), counting bytes read plus written.
        tensor_tflops: matmul ceiling in TFLOP/s by operand dtype (``bf16``, ``fp16``, ``tf32``, ``fp32``).
        vector_tflops: elementwise/reduction ceiling in TFLOP/s by dtype.
        attention_tflops: optional, fused attention (``F.scaled_dot_product_attention``, flash / memory-efficient
            kernels) TFLOP/s by dtype, measured: these kernels reach well under the matmul peak (softmax, masking and
            the online rescaling between their two GEMMs). Attention ops without an entry use ``tensor_tflops``.
        launch_overhead_us: time per eager kernel launch (dispatch plus launch), microseconds.
        l2_bytes: L2 cache size in bytes (0 if unknown).
        kind: ``"gpu"`` or ``"cpu"``; library Triton kernels are routed to on GPU specs only.
        source: where the numbers come from; per-field sources in ``sources``.
        sources: per-field source notes.
    """

    name: str
    display_name: str
    memory_bandwidth_gbps: float
    tensor_tflops: dict[str, float]
    vector_tflops: dict[str, float]
    launch_overhead_us: float
    l2_bytes: int = 0
    kind: str = "gpu"
    source: str = ""
    sources: dict[str, str] | None = None
    attention_tflops: dict[str, float] = field(default_factory=dict)

    def peak_tflops(self, dtype: str, tensor_cores: bool, category: str = "") -> float:
        """Compute ceiling (TFLOP/s) for ``dtype`` on tensor cores (matmuls) or vector units (everything else);
        ``category="attention"`` takes :attr:`attention_tflops` when the spec has that dtype.

        Unknown dtypes fall back to the fp32 rate.
        """
        if category == "attention" and dtype in self.attention_tflops:
            return float(self.attention_tflops[dtype])
        table = self.tensor_tflops if tensor_cores else self.vector_tflops
        return float(table.get(dtype, table.get("fp32", min(table.values()))))

    def ridge_point(self, dtype: str, tensor_cores: bool, category: str = "") -> float:
        """Arithmetic intensity (FLOP/byte) where the compute and memory roofs meet."""
        return self.peak_tflops(dtype, tensor_cores, category) * 1e12 / (self.memory_bandwidth_gbps * 1e9)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a plain dict (for reports)."""
        return asdict(self)


def available_specs() -> list[str]:
    """Names of the shipped device specs."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def _parse(data: Any, origin: str) -> DeviceSpec:
    if not isinstance(data, dict):
        raise DeviceSpecError(f"{origin}: a device spec is a YAML mapping with fields {', '.join(_REQUIRED)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise DeviceSpecError(f"{origin}: missing field(s) {', '.join(missing)}")
    try:
        bw = float(data["memory_bandwidth_gbps"])
        tensor = {str(k): float(v) for k, v in dict(data["tensor_tflops"]).items()}
        vector = {str(k): float(v) for k, v in dict(data["vector_tflops"]).items()}
        attention = {str(k): float(v) for k, v in dict(data.get("attention_tflops") or {}).items()}
        launch = float(data["launch_overhead_us"])
    except (TypeError, ValueError) as e:
        raise DeviceSpecError(f"{origin}: a numeric field is not a number: {e}") from e
    if str(data.get("kind", "gpu")) not in ("gpu", "cpu"):
        raise DeviceSpecError(f"{origin}: field 'kind' must be gpu or cpu")
    if bw <= 0 or not tensor or not vector or min([*tensor.values(), *vector.values(), *attention.values()]) <= 0 \
            or launch < 0:
        raise DeviceSpecError(f"{origin}: bandwidth and TFLOP/s must be positive, launch overhead non-negative")
    sources = {k[: -len("_source")]: str(v) for k, v in data.items() if k.endswith("_source")}
    return DeviceSpec(
        name=str(data["name"]),
        display_name=str(data.get("display_name", data["name"])),
        memory_bandwidth_gbps=bw,
        tensor_tflops=tensor,
        vector_tflops=vector,
        launch_overhead_us=launch,
        l2_bytes=int(data.get("l2_bytes", 0)),
        kind=str(data.get("kind", "gpu")),
        source=str(data.get("source", "")),
        sources=sources,
        attention_tflops=attention,
    )


def parse_spec(data: Any, origin: str) -> DeviceSpec:
    """Validate a spec already read from YAML (a mapping) as :func:`load_spec` does; ``origin`` names it in errors.

    Raises:
        DeviceSpecError: missing or invalid fields.
    """
    return _parse(data, origin)


def load_spec(name_or_path: str) -> DeviceSpec:
    """Load a shipped spec by name (``"h200"``) or a spec YAML by path.

    Raises:
        DeviceSpecError: unknown name (the message lists the shipped ones), unreadable or invalid YAML.
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        origin = str(path)
    else:
        path = SPEC_DIR / f"{name_or_path.lower()}.yaml"
        origin = name_or_path
        if not path.is_file():
            raise DeviceSpecError(
                f"unknown device spec {name_or_path!r}; shipped specs: {', '.join(available_specs())}, "
                "or give the path of a spec YAML"
            )
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise DeviceSpecError(f"{origin}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise DeviceSpecError(f"{origin}: invalid YAML: {e}") from e
    return _parse(data, origin)
