"""benchmarks/accuracy/spec_from_calibration.py: a datasheet spec's head taken from a calibration."""

from __future__ import annotations

import yaml

from benchmarks.accuracy.spec_from_calibration import WRITTEN_AFTER_HEAD, header_from_calibration
from fusion_advisor.devices import load_spec, parse_spec, spec_mapping


def test_head_from_calibration_keeps_the_shipped_name_and_leaves_the_rescaled_fields_out(tmp_path):
    h200 = spec_mapping(load_spec("h200"))
    cal = dict(h200)
    cal.update(name="calibrated-nvidia-h100", display_name="NVIDIA H100 (calibrated)", memory_bandwidth_gbps=3000.0,
               launch_overhead_us=7.5)
    cal.pop("route_efficiency")
    cal["attention_rates"] = [{"backend": "flash", "dtype": "bf16", "seq": 512, "head_dim": 64, "tflops": 200.0}]
    for table in ("conv_rates", "matmul_rates", "reduction_rates"):  # one entry each: the test stays fast
        cal[table] = cal[table][:1]
    path = tmp_path / "calibrated.yaml"
    path.write_text(yaml.safe_dump(cal, sort_keys=False))
    head = yaml.safe_load(header_from_calibration("h100", path, reference="h200"))
    assert head["name"] == "h100" and head["display_name"] == load_spec("h100").display_name
    assert head["memory_bandwidth_gbps"] == 3000.0 and head["launch_overhead_us"] == 7.5  # measured, not datasheet
    assert not [k for k in head if k.startswith(WRITTEN_AFTER_HEAD)]  # spec_text writes those, rescaled
    assert head["route_efficiency"] == h200["route_efficiency"]
    assert "copied from the h200 spec" in head["route_efficiency_source"]
    assert "attention_rates" in cal and "attention_rates" not in head  # what the reference does not carry
    assert parse_spec(head, "head").memory_bandwidth_gbps == 3000.0  # the head alone is a spec the loader takes
    without = yaml.safe_load(header_from_calibration("h100", path))
    assert "route_efficiency" not in without and without["attention_rates"] == cal["attention_rates"]
