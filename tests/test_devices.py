"""Device specs: shipped YAMLs load with sources; bad names and files are refused clearly."""

import pytest

from fusion_advisor.devices import available_specs, load_spec
from fusion_advisor.errors import DeviceSpecError


def test_shipped_specs():
    assert {"h200", "h100", "a100", "l4", "cpu"} <= set(available_specs())
    for name in available_specs():
        spec = load_spec(name)
        assert spec.memory_bandwidth_gbps > 0 and spec.launch_overhead_us >= 0
        assert spec.source and spec.sources.get("memory_bandwidth")


def test_h200_uses_measured_numbers():
    spec = load_spec("h200")
    assert spec.memory_bandwidth_gbps == 4275
    assert 690 <= spec.tensor_tflops["bf16"] <= 790
    assert spec.ridge_point("bf16", tensor_cores=True) == pytest.approx(790e12 / 4275e9)


def test_unknown_and_invalid(tmp_path):
    with pytest.raises(DeviceSpecError, match="shipped specs: a100"):
        load_spec("v100")
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\nmemory_bandwidth_gbps: fast\ntensor_tflops: {bf16: 1}\nvector_tflops: {fp32: 1}\nlaunch_overhead_us: 1\n")
    with pytest.raises(DeviceSpecError, match="mine.yaml: a numeric field"):
        load_spec(str(bad))
    bad.write_text("name: mine\n")
    with pytest.raises(DeviceSpecError, match="missing field"):
        load_spec(str(bad))
