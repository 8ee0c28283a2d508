"""Device specs: shipped YAMLs load with sources; bad names and files are refused clearly."""

import pytest

from fusion_advisor.devices import available_specs, load_spec
from fusion_advisor.errors import DeviceSpecError


def test_shipped_specs():
    assert {"h200", "h100", "a100", "l4", "cpu"} <= set(available_specs())
    for name in available_specs():
        spec = load_spec(name)
        assert spec.name == name  # calibrate finds a GPU's spec by its file name (closest_shipped_spec)
        assert spec.memory_bandwidth_gbps > 0 and spec.launch_overhead_us >= 0
        assert spec.source and spec.sources.get("memory_bandwidth")


def test_h200_uses_measured_numbers():
    spec = load_spec("h200")
    assert spec.memory_bandwidth_gbps == 4275
    assert spec.attention_tflops == {"bf16": 607, "fp16": 589} and "calibrate" in spec.sources["attention_tflops"]
    assert 690 <= spec.tensor_tflops["bf16"] <= 790
    assert spec.ridge_point("bf16", tensor_cores=True) == pytest.approx(790e12 / 4275e9)


def test_unknown_and_invalid(tmp_path):
    with pytest.raises(DeviceSpecError, match="shipped specs: a100"):
        load_spec("v100")
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\nmemory_bandwidth_gbps: fast\ntensor_tflops: {bf16: 1}\nvector_tflops: {fp32: 1}\nlaunch_overhead_us: 1\n")
    with pytest.raises(DeviceSpecError, match=r"mine.yaml: memory_bandwidth_gbps must be a positive number \(GB/s, finite\), got .fast."):
        load_spec(str(bad))
    bad.write_text("name: mine\n")
    with pytest.raises(DeviceSpecError, match="missing field"):
        load_spec(str(bad))



def test_attention_rate_is_used_for_attention_only(tmp_path):
    import dataclasses

    from fusion_advisor.analyze.records import Chain, OpInfo, SourceLoc, TensorMeta
    from fusion_advisor.analyze.roofline import estimate

    q = TensorMeta(shape=(2, 32, 2048, 128), dtype="bf16", numel=16777216, nbytes=2 * 16777216)
    flops = 4 * 2 * 32 * 2048 * 2048 * 128
    op = OpInfo(id="g0:attn", graph_index=0, target="fusion_advisor_capture.attention", category="attention",
                inputs=(q, q, q), outputs=(q,), flops=flops, bytes_read=3 * 2 * q.numel, bytes_written=2 * q.numel,
                module_path="", source=SourceLoc("m.py", 1, "attn"))
    chain = Chain(id="c0", kind="heavy", op_ids=("g0:attn",), targets=(op.target,), pattern="attention",
                  categories=("attention",), dtype="bf16", eager_kernels=1, eager_bytes=8 * q.numel,
                  fused_bytes=8 * q.numel, flops=flops, numel=q.numel, row_elems=0, source=op.source, module_path="")
    h200 = dataclasses.replace(load_spec("h200"), attention_tflops={})
    measured = dataclasses.replace(h200, attention_tflops={"bf16": 395.0})
    at_peak, at_measured = estimate(chain, {op.id: op}, h200), estimate(chain, {op.id: op}, measured)
    assert at_peak.compute_us == pytest.approx(flops / 790e12 * 1e6)
    assert at_measured.compute_us == pytest.approx(flops / 395e12 * 1e6) and at_measured.eager_us > at_peak.eager_us
    assert measured.peak_tflops("bf16", True) == 790  # matmuls keep the tensor-core peak
    # no attention entry for the dtype: the matmul peak
    assert measured.attention_peak_tflops("flash", "fp16", 2048, 128)[0] == h200.tensor_tflops["fp16"]
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\n"
                    "attention_tflops: {bf16: 4}\nlaunch_overhead_us: 1\n")
    assert load_spec(str(spec)).attention_peak_tflops("flash", "bf16", 2048, 128)[0] == 4.0
    spec.write_text("name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\n"
                    "attention_tflops: {bf16: 0}\nlaunch_overhead_us: 1\n")
    with pytest.raises(DeviceSpecError, match=r"attention_tflops.bf16 must be a positive number"):
        load_spec(str(spec))
    # a number in exponent form, which PyYAML reads as text, is still a number (it loaded before NaN was refused)
    spec.write_text("name: s\nmemory_bandwidth_gbps: 3.35e3\ntensor_tflops: {bf16: 1e2}\nvector_tflops: {fp32: 1}\n"
                    "launch_overhead_us: 1\n")
    assert load_spec(str(spec)).memory_bandwidth_gbps == 3350.0 and load_spec(str(spec)).tensor_tflops["bf16"] == 100
    # NaN and infinity are refused as zero is: a NaN bandwidth read a matmul "memory-bound" and dropped its memory
    # term from every max(); an infinite launch overhead ended in "internal error: Axis limits cannot be NaN"
    for field, bad in (("memory_bandwidth_gbps: 100", "memory_bandwidth_gbps: .nan"),
                       ("launch_overhead_us: 1", "launch_overhead_us: .inf"),
                       ("vector_tflops: {fp32: 1}", "vector_tflops: {fp32: .nan}")):
        spec.write_text("name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\n"
                        "launch_overhead_us: 1\n".replace(field, bad))
        with pytest.raises(DeviceSpecError, match=rf"{field.split(':')[0]}.* number .*finite\), got (nan|inf)"):
            load_spec(str(spec))


def test_attention_rates_prefer_entries_of_the_same_mask_flag(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\n"
                    "launch_overhead_us: 1\nattention_rates:\n"
                    "  - {backend: cudnn, dtype: bf16, seq: 2048, head_dim: 128, tflops: 634}\n"
                    "  - {backend: cudnn, dtype: bf16, seq: 2048, head_dim: 128, masked: true, tflops: 333}\n")
    s = load_spec(str(spec))
    assert s.attention_peak_tflops("cudnn", "bf16", 2048, 128) == (634.0, "rates")
    assert s.attention_peak_tflops("cudnn", "bf16", 2048, 128, masked=True) == (333.0, "rates")
    spec.write_text(spec.read_text().replace("masked: true", "masked: maybe"))
    with pytest.raises(DeviceSpecError, match=r"attention_rates\[1\].masked must be true or false"):
        load_spec(str(spec))


# A hand-edited spec's optional measured fields: each bad value is refused with the file and the field named.
# The grid covers each way a YAML value goes wrong: wrong sign, not finite (.inf / .nan parse as floats), a bool or
# string where a number belongs, a scalar where a mapping belongs, and dtype names no op ever carries.
_BAD_OPTIONAL = [
    ("elementwise_overhead_us: -2", "'elementwise_overhead_us'"),
    ("elementwise_overhead_us: .nan", "'elementwise_overhead_us'"),
    ("elementwise_overhead_us: .inf", "'elementwise_overhead_us'"),
    ("elementwise_overhead_us: true", "'elementwise_overhead_us'"),
    ("elementwise_overhead_us: slow", "'elementwise_overhead_us'"),
    ("strided_bandwidth_gbps: .inf", "'strided_bandwidth_gbps'"),
    ("unaligned_tensor_tflops: {bf16: -1}", r"'unaligned_tensor_tflops.bf16'"),
    ("unaligned_tensor_tflops: {bf16: .nan}", r"'unaligned_tensor_tflops.bf16'"),
    ("unaligned_tensor_tflops: {bf16: fast}", r"'unaligned_tensor_tflops.bf16'"),
    ("unaligned_tensor_tflops: 100", "'unaligned_tensor_tflops' must be a mapping"),
    ("pool_window_gelem_s: -1", "pool_window_gelem_s"),
    ("pool_window_gelem_s: fast", "pool_window_gelem_s"),
    ("unaligned_tensor_tflops: {bfloat16: 100}", "'unaligned_tensor_tflops': unknown dtype 'bfloat16'"),
    ("attention_rates:\n  - {backend: flash, dtype: bfloat16, seq: 2048, head_dim: 128, tflops: 500}",
     r"attention_rates\[0\].dtype must be one of"),
    ("attention_rates:\n  - {backend: flash, dtype: bf16, seq: 2048, head_dim: 128, tflops: .inf}",
     r"attention_rates\[0\].tflops must be a positive number \(TFLOP/s, finite\), got inf"),
]


@pytest.mark.parametrize("line,field", _BAD_OPTIONAL)
def test_bad_optional_measured_fields_name_the_field(tmp_path, line, field):
    spec = tmp_path / "hand.yaml"
    spec.write_text("name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\n"
                    f"launch_overhead_us: 1\n{line}\n")
    with pytest.raises(DeviceSpecError, match=f"hand.yaml: .*{field}"):
        load_spec(str(spec))


def test_good_optional_measured_fields_load(tmp_path):
    spec = tmp_path / "hand.yaml"
    spec.write_text("name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\n"
                    "launch_overhead_us: 1\nelementwise_overhead_us: 0\nstrided_bandwidth_gbps: 40\n"
                    "unaligned_tensor_tflops: {bf16: 3, fp16: 3.5}\npool_window_gelem_s: 950\n")
    s = load_spec(str(spec))
    assert s.pool_window_gelem_s == 950.0 and load_spec("cpu").pool_window_gelem_s == 0.0
    assert (s.elementwise_overhead_us, s.strided_bandwidth_gbps) == (0.0, 40.0)
    assert s.unaligned_tensor_tflops == {"bf16": 3.0, "fp16": 3.5}


def test_a_spec_file_is_parsed_once_per_text(tmp_path):
    # the shipped GPU specs take seconds to build; every analysis of a process shares one parse of a file's text
    assert load_spec("h200") is load_spec("h200")
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmemory_bandwidth_gbps: 100\ntensor_tflops: {bf16: 10}\nvector_tflops: {fp32: 1}\n"
                    "launch_overhead_us: 1\n")
    first = load_spec(str(spec))
    assert load_spec(str(spec)) is first
    spec.write_text(spec.read_text().replace("100", "200"))  # same size, maybe the same timestamp: read again
    assert load_spec(str(spec)).memory_bandwidth_gbps == 200
    spec.write_text(spec.read_text().replace("launch_overhead_us: 1", "launch_overhead_us: -1"))
    with pytest.raises(DeviceSpecError):  # an invalid text is never served from an earlier parse
        load_spec(str(spec))
