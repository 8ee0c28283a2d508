"""The YAML rule engine: validation names file, rule id and field; first match wins; templates render numbers."""

from __future__ import annotations

import pytest

from fusion_advisor.errors import RulesError
from fusion_advisor.analyze.records import Chain, Estimate, SourceLoc
from fusion_advisor.analyze.route import route_chain
from fusion_advisor.analyze.rules import SHIPPED_RULES, load_rules, load_rules_file


def _chain(**kw) -> Chain:
    base = dict(id="c0", kind="fusible", op_ids=("g0:a", "g0:b"), targets=("aten.a", "aten.b"), pattern="softmax",
                categories=("softmax",), dtype="bf16", eager_kernels=2, eager_bytes=4000, fused_bytes=1000,
                flops=500, numel=1000, row_elems=32000, source=SourceLoc("m.py", 3, "x"), module_path="")
    base.update(kw)
    return Chain(**base)


def _est(bound="memory", **kw) -> Estimate:
    base = dict(compute_us=0.1, memory_fused_us=1.0, memory_eager_us=4.0, launch_eager_us=24.0, eager_us=30.0,
                fused_us=12.0, saving_us=18.0, ridge_point=185.0, bound=bound, peak_tflops=790.0)
    base.update(kw)
    return Estimate(**base)


def _write(tmp_path, body: str):
    p = tmp_path / "r.yaml"
    p.write_text(body)
    return p


def test_shipped_rules_are_valid():
    rules, info = load_rules_file(SHIPPED_RULES)
    assert info["version"] == 1 and len(rules) >= 10
    assert len({r.id for r in rules}) == len(rules)
    assert rules[-1].match == {}  # a catch-all closes the list


@pytest.mark.parametrize(
    "body, fragment",
    [
        ("version: 1\nrules:\n  - id: a\n    route: nowhere\n    reason: x\n", "rule 'a': field 'route'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: {colour: red}\n    reason: x\n", "field 'match.colour'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: {min_kernels: two}\n    reason: x\n", "field 'match.min_kernels': expected int"),
        ("version: 1\nrules:\n  - id: a\n    route: triton\n    reason: x\n", "field 'kernel'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    reason: 'AI {intensity}'\n", "unknown placeholder(s) intensity"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n", "field 'reason'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    reason: x\n    speed: fast\n", "unknown field 'speed'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: {bound: slow}\n    reason: x\n", "field 'match.bound'"),
        ("version: 2\nrules: []\n", "field 'version'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    reason: '{pattern:.2f}'\n", "does not render"),
        ("rules: [\n", "invalid YAML"),
        ("version: 1\nrules:\n  - route: skip\n    reason: x\n", "rule #1: field 'id'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: {pattern: layernrom}\n    reason: x\n",
         "field 'match.pattern': unknown value(s) 'layernrom'"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: {dtype: bfloat16}\n    reason: x\n",
         "field 'match.dtype': unknown value(s) 'bfloat16'"),
        ("version: 1\nrules:\n  - id: a\n    route: triton\n    kernel: rmsnrom\n    reason: x\n",
         "field 'kernel': 'rmsnrom' is not a kernel_library kernel"),
        # a fresh user's `match: []` matched every chain; `1e8` (YAML 1.1 text) read as "expected int, got '1e8'"
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: []\n    reason: x\n",
         "field 'match': must be a mapping of conditions"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: {min_bytes_saved: 1e8}\n    reason: x\n",
         "got '1e8' (YAML reads 1e8 as text: write 100000000)"),
        ("version: 1\nrules:\n  - id: a\n    route: skip\n    match: {max_intensity: 1e-3}\n    reason: x\n",
         "got '1e-3' (YAML reads 1e-3 as text: write 1.0e-03 (a dot and a signed exponent))"),
    ],
)
def test_invalid_rules_name_file_rule_and_field(tmp_path, body, fragment):
    path = _write(tmp_path, body)
    with pytest.raises(RulesError) as e:
        load_rules_file(path)
    assert str(path) in str(e.value)
    assert fragment in str(e.value)


def test_every_invalid_rule_of_a_file_is_named_at_once(tmp_path):
    # a fresh user mended a file of several mistakes one run at a time
    path = _write(tmp_path, "version: 1\nrules:\n  - id: a\n    route: nowhere\n    reason: x\n"
                            "  - id: ok\n    route: skip\n    reason: x\n"
                            "  - id: b\n    route: skip\n    match: {colour: red}\n    reason: x\n")
    with pytest.raises(RulesError) as e:
        load_rules_file(path)
    lines = str(e.value).splitlines()
    assert lines[0] == "2 invalid rules:" and len(lines) == 3
    assert "rule 'a': field 'route'" in lines[1] and "rule 'b': field 'match.colour'" in lines[2]


def test_missing_rules_file(tmp_path):
    with pytest.raises(RulesError, match="cannot read rules file"):
        load_rules([tmp_path / "nope.yaml"])


def test_first_match_wins_and_user_rules_come_first(tmp_path):
    user = _write(tmp_path, "version: 1\nrules:\n  - id: mine\n    match: {pattern: softmax}\n    route: skip\n"
                            "    reason: 'row {row_elems}, AI {arithmetic_intensity:.1f}'\n")
    rules = load_rules([user])
    d = route_chain(_chain(), _est(), rules, kernels={})
    assert (d.rule_id, d.route) == ("mine", "skip")
    assert d.reason == "row 32000, AI 0.5"


def test_triton_route_falls_back_when_kernel_missing():
    rules = load_rules([])
    d = route_chain(_chain(), _est(), rules, kernels={})
    assert d.rule_id == "triton-softmax"
    assert d.route == "torch.compile"
    assert "not in kernel_library yet" in d.note


def test_triton_route_checks_kernel_constraints():
    import torch

    from kernel_library.registry import KernelEntry

    narrow = KernelEntry(name="softmax_small", module="x", replaces="softmax", dtypes=(torch.float32,), max_row_elems=1024)
    rules = load_rules([])
    d = route_chain(_chain(), _est(), rules, kernels={"softmax_small": narrow})
    assert d.route == "torch.compile" and "dtype" in d.note
    ok = KernelEntry(name="softmax_any", module="x", replaces="softmax")
    d = route_chain(_chain(), _est(), rules, kernels={"softmax_any": ok})
    assert (d.route, d.kernel) == ("triton", "softmax_any")


def test_a_rule_naming_another_patterns_kernel_falls_back(tmp_path):
    # a fresh user's rule sent every matmul to kernel: rmsnorm, and the report priced the GEMM on it (1.1 ms saved)
    from kernel_library.registry import KernelEntry

    user = _write(tmp_path, "version: 1\nrules:\n  - id: all-rms\n    match: {}\n    route: triton\n"
                            "    kernel: rmsnorm\n    reason: r\n")
    kernels = {"rmsnorm": KernelEntry(name="rmsnorm", module="x", replaces="rmsnorm")}
    d = route_chain(_chain(pattern="matmul"), _est(), load_rules([user]), kernels=kernels)
    assert (d.route, d.kernel) == ("torch.compile", "")
    assert d.note == "kernel 'rmsnorm' replaces rmsnorm chains and this chain is a matmul; falling back to torch.compile"
    d = route_chain(_chain(pattern="rmsnorm"), _est(), load_rules([user]), kernels=kernels)
    assert (d.route, d.kernel) == ("triton", "rmsnorm")


def test_bound_condition_and_override(tmp_path):
    user = _write(tmp_path, "version: 1\nrules:\n  - id: launchy\n    match: {bound: [launch]}\n    route: torch.compile\n"
                            "    bound: memory\n    reason: r\n")
    rules = load_rules([user], shipped=None)
    assert route_chain(_chain(), _est(bound="launch"), rules, {}).bound == "memory"
    assert route_chain(_chain(), _est(bound="memory"), rules, {}).rule_id == "(none)"


def test_shipped_reasons_quote_sizes_with_units():
    # "one row-wise kernel 50339840" read as a kernel number, and "352378880 bytes" beside columns in MiB: the
    # shipped reasons quote the sized fields ({fused_size}: "48.0 MiB"), never a raw byte count
    import re

    rules, _ = load_rules_file(SHIPPED_RULES)
    for r in rules:
        assert not re.search(r"\{(eager_bytes|fused_bytes|bytes_saved|flops)[^}]*\}", r.reason), (r.id, r.reason)
    rules = load_rules([])
    for chain in (_chain(pattern="rmsnorm", eager_bytes=352378880, fused_bytes=50339840),
                  _chain(kind="heavy", pattern="embedding", categories=("embedding",), eager_kernels=1,
                         eager_bytes=33570816, fused_bytes=33570816)):
        reason = route_chain(chain, _est(), rules, {}).reason
        assert not re.search(r"\d{6,}", reason), reason
    assert "336.1 MiB" in route_chain(_chain(pattern="rmsnorm", eager_bytes=352378880), _est(), rules, {}).reason


def test_no_shipped_rule_cites_a_file_outside_the_repository():
    # the rules once cited "ANCHORS", notes that are not in the repository; every file they cite must exist
    import re
    from pathlib import Path

    text = SHIPPED_RULES.read_text()
    assert "ANCHORS" not in text
    root = Path(SHIPPED_RULES).resolve().parent.parent
    cited = set(re.findall(r"(?:benchmarks|fusion_advisor|kernel_library)/[\w./-]+\.(?:md|py|json|yaml|csv)", text))
    assert cited, "the shipped rules cite their measurements"
    for path in cited:
        assert (root / path).is_file(), path


def _attention(backend: str, kernels: int) -> Chain:
    return _chain(kind="heavy", pattern="attention", categories=("attention",), attention_backend=backend,
                  eager_kernels=kernels, row_elems=0)


@pytest.mark.parametrize("backend,kernels,rule,says,never", [
    ("flash", 1, "skip-attention", "one fused flash attention kernel", "math"),
    ("efficient", 5, "skip-attention-mask", "5 kernels in all", "one fused"),
    ("math", 12, "skip-attention-math", "12 eager kernels", "one fused"),
    ("", 1, "skip-attention-unknown", "could not be told", "fused"),
])
def test_attention_reason_follows_the_backend_and_kernel_count(backend, kernels, rule, says, never):
    # "runs as one fused flash-attention kernel" beside eager_kernels = 5 contradicted the tool's own numbers
    d = route_chain(_attention(backend, kernels), _est(bound="compute"), load_rules([]), {})
    assert (d.rule_id, d.route) == (rule, "skip")
    assert says in d.reason and never not in d.reason


def test_attention_backend_condition_is_validated(tmp_path):
    bad = _write(tmp_path, "version: 1\nrules:\n  - id: a\n    route: skip\n    match: {attention_backend: flesh}\n"
                           "    reason: x\n")
    with pytest.raises(RulesError, match="field 'match.attention_backend': unknown value"):
        load_rules([bad], shipped=None)


def test_single_kernel_epilogue_is_not_nothing_to_fuse():
    # GELU after fc1 (epilogue_of set): one kernel alone, but it reads back the GEMM's whole output; Inductor fuses
    # it with its neighbours, so "nothing to fuse" was wrong
    gelu = _chain(pattern="gelu", categories=("pointwise",), eager_kernels=1, row_elems=0, epilogue_of="c3")
    d = route_chain(gelu, _est(), load_rules([]), {})
    assert (d.rule_id, d.route) == ("compile-epilogue", "torch.compile")
    assert "epilogue of c3" in d.reason and "nothing to fuse" not in d.reason
    lone = route_chain(_chain(pattern="gelu", categories=("pointwise",), eager_kernels=1, row_elems=0), _est(),
                       load_rules([]), {})
    assert lone.rule_id == "skip-single-kernel" and "nothing to fuse" in lone.reason
    # an out-of-place masked_fill after a GEMM is two eager kernels (clone, fill) but one op: still an epilogue
    # where Inductor's kernel is not predicted 10% faster alone (it fell to skip-default, found by a reviewer)
    fill = _chain(pattern="masked_fill", categories=("pointwise",), eager_kernels=2, row_elems=0, epilogue_of="c3",
                  eager_bytes=4000, fused_bytes=4000)
    d = route_chain(fill, _est(eager_us=167.8, compile_us=159.4), load_rules([]), {})
    assert (d.rule_id, d.route) == ("compile-epilogue", "torch.compile")


@pytest.mark.parametrize("dtype,rule,route", [("fp32", "compile-bias-gelu-fp32", "torch.compile"),
                                              ("bf16", "triton-bias-gelu", "triton")])
def test_bias_gelu_goes_to_the_library_kernel_only_where_it_measured_faster(dtype, rule, route):
    from kernel_library.registry import load_all

    chain = _chain(pattern="bias_gelu", categories=("elementwise",), dtype=dtype, row_elems=11008)
    d = route_chain(chain, _est(), load_rules([]), kernels=load_all())
    assert (d.rule_id, d.route) == (rule, route)


def test_gpu_only_routes_fall_back_to_torch_compile_on_a_cpu_spec(tmp_path):
    user = _write(tmp_path, "version: 1\nrules:\n  - id: graphs\n    match: {pattern: softmax}\n    route: cudagraphs\n"
                            "    reason: 'launch-bound'\n")
    rules = load_rules([user])
    on_gpu = route_chain(_chain(), _est(), rules, kernels={})
    on_cpu = route_chain(_chain(), _est(), rules, kernels={}, device_kind="cpu")
    assert (on_gpu.route, on_gpu.note) == ("cudagraphs", "")
    assert on_cpu.route == "torch.compile" and on_cpu.rule_id == "graphs" and "CUDA graphs" in on_cpu.note
    triton_on_cpu = route_chain(_chain(), _est(), load_rules([]), kernels={}, device_kind="cpu")
    assert triton_on_cpu.rule_id == "triton-softmax" and triton_on_cpu.route == "torch.compile"
    # where torch.compile is predicted to save nothing (one kernel, nothing to fuse), the stand-in is skip: a fresh
    # user's CPU report read "routed to torch.compile", 0 us saved, and "nothing left alone"
    alone = route_chain(_chain(), _est(fused_us=30.0, compile_us=30.0), load_rules([]), kernels={},
                        device_kind="cpu")
    assert (alone.rule_id, alone.route) == ("triton-softmax", "skip")
    assert alone.reason.startswith("left as written: torch.compile, the stand-in for the rule's triton route on "
                                   "this spec, is predicted at 30.0 us against eager's 30.0 us")
    assert "The rule's reason for its triton route" in alone.reason and "target GPUs" in alone.note
    # left as written, its note no longer says the chain goes to torch.compile (a fresh user read skip and "goes to
    # torch.compile instead" in one line)
    assert "goes to torch.compile" not in alone.note and "torch.compile would take it instead" in alone.note
    assert "the chain goes to torch.compile instead" in triton_on_cpu.note  # routed there, it does


@pytest.mark.parametrize("compile_us,route", [(40.0, "skip"), (30.2, "torch.compile"), (12.0, "torch.compile")])
def test_a_route_predicted_slower_than_eager_leaves_the_chain_as_written(compile_us, route):
    """A reviewer's H100 analysis routed a mean + add to torch.compile with the reason "(est. 664.4 -> 799.4 us)":
    the advice promised a loss. Slower by more than the rounding share: skip, both times and the rule's reason
    given; the same time (nothing measured says better) or faster: routed."""
    chain = _chain(pattern="reduction", categories=("reduction", "pointwise"), row_elems=0)
    d = route_chain(chain, _est(compile_us=compile_us), load_rules([]), kernels={})
    assert d.rule_id == "compile-fusible-chain" and d.route == route
    if route == "skip":
        assert d.reason.startswith("left as written: torch.compile is predicted slower than eager here (40.0 us "
                                   "against 30.0 us")
        assert "The rule's reason for its torch.compile route: memory-bound chain of 2 kernels" in d.reason


def test_a_library_kernel_predicted_slower_stays_a_candidate_with_a_note():
    """Skipped or rerouted, a doubted kernel left apply's search (its candidates are the chains routed to a kernel):
    the route stays and the note says which route is predicted faster."""
    from kernel_library.registry import load_all

    d = route_chain(_chain(), _est(compile_us=35.0, triton_us=40.0), load_rules([]), kernels=load_all())
    assert (d.rule_id, d.route, d.kernel) == ("triton-softmax", "triton", "softmax")
    assert d.note == ("predicted slower than eager here (40.0 us against 30.0 us): kept as a candidate, apply "
                      "measures the swap and keeps it only where it wins")
    assert route_chain(_chain(), _est(triton_us=5.0), load_rules([]), kernels=load_all()).note == ""


@pytest.mark.parametrize("bound,rule,route", [("launch", "cudagraphs-native-layer", "cudagraphs"),
                                              ("compute", "skip-unfusible", "skip")])
def test_a_launch_bound_native_encoder_layer_goes_to_cuda_graphs(bound, rule, route):
    """nn.TransformerEncoderLayer's fast path is one opaque op: "not fusible" holds, "nothing to gain" does not
    where its host time is the ceiling (analyze/composites.py prices 9-13 kernels behind 16.5 launches)."""
    layer = _chain(kind="other", pattern="_transformer_encoder_layer_fwd", categories=("other",),
                   targets=("aten._transformer_encoder_layer_fwd.default",), op_ids=("g0:l",), eager_kernels=9)
    d = route_chain(layer, _est(bound), load_rules([]), kernels={})
    assert (d.rule_id, d.route) == (rule, route)
    if route == "cudagraphs":
        assert "9 kernels issued by one native call" in d.reason


@pytest.mark.parametrize("row_elems, rule, route", [(32000, "triton-softmax-lone", "triton"),
                                                     (1024, "skip-single-kernel", "skip")])
def test_a_lone_wide_row_softmax_goes_to_the_library_kernel(row_elems, rule, route):
    """One eager softmax kernel is not a one-pass one: over wide rows the library's ran 1.45-1.83x torch.compile
    (whose lone softmax is eager's speed); over short rows the lone kernel is left alone."""
    from kernel_library.registry import load_all

    lone = _chain(eager_kernels=1, op_ids=("g0:a",), targets=("aten._softmax",), row_elems=row_elems)
    d = route_chain(lone, _est(), load_rules([]), kernels=load_all())
    assert (d.rule_id, d.route) == (rule, route)


def test_a_launch_bound_recurrent_layer_goes_to_a_cuda_graph_and_a_device_bound_one_is_left():
    rnn = _chain(kind="heavy", pattern="recurrent", categories=("recurrent",), eager_kernels=1, row_elems=0,
                 op_ids=("g0:lstm",), targets=("fusion_advisor_capture.recurrent",))
    assert route_chain(rnn, _est(bound="launch"), load_rules([]), {}).route == "cudagraphs"
    assert route_chain(rnn, _est(bound="compute"), load_rules([]), {}).rule_id == "skip-recurrent"


def test_every_match_condition_is_documented_in_the_shipped_rules_header():
    # a fresh user found the condition names only in an error message, and no units
    from fusion_advisor.analyze.rules import CONDITIONS

    header = "".join(line for line in SHIPPED_RULES.read_text().splitlines(keepends=True) if line.startswith("#"))
    missing = [c for c in CONDITIONS if not any(c in part for part in header.replace("/", " ").split())]
    assert not missing, f"undocumented match conditions: {missing}"


@pytest.mark.parametrize("compile_us, route", [(10.0, "torch.compile"), (40.0, "skip")])
def test_a_scan_goes_to_torch_compile_where_inductors_scan_kernel_is_predicted_faster(compile_us, route):
    """A fresh user's masked cumsum read "cumsum is not fusible by Inductor" beside a whole-model prediction of
    torch.compile 1.51x eager: on a GPU Inductor lowers scans to a Triton kernel of its own (ir.Scan)."""
    scan = _chain(kind="other", pattern="cumsum", categories=("other",), targets=("aten.cumsum.default",),
                  op_ids=("g0:cumsum",), dtype="fp32")
    d = route_chain(scan, _est(compile_us=compile_us), load_rules([]), kernels={})
    assert (d.rule_id, d.route) == ("compile-scan", route)
    assert "Inductor lowers cumsum to a Triton scan kernel of its own on a GPU" in d.reason


def test_ops_on_complex_tensors_say_why_they_fuse_with_nothing():
    mul = _chain(kind="other", pattern="mul", categories=("other",), targets=("aten.mul.Tensor",),
                 op_ids=("g0:mul",), dtype="c64")
    d = route_chain(mul, _est(), load_rules([]), kernels={})
    assert (d.rule_id, d.route) == ("skip-complex", "skip")
    assert d.reason.startswith("mul on c64 tensors: Inductor runs ops on complex tensors as eager calls")
    # a complex scan too: Inductor falls back for complex inputs before it looks at the scan
    scan = _chain(kind="other", pattern="cumsum", categories=("other",), targets=("aten.cumsum.default",),
                  op_ids=("g0:cumsum",), dtype="c64")
    assert route_chain(scan, _est(compile_us=10.0), load_rules([]), kernels={}).rule_id == "skip-complex"


def test_a_scan_predicted_no_faster_compiled_stays_as_written():
    """On a CPU spec Inductor calls ATen's scan (no SCAN feature): compile-scan predicted 1342.2 -> 1342.2 us and
    still routed the chain to torch.compile."""
    scan = _chain(kind="other", pattern="cumsum", categories=("other",), targets=("aten.cumsum.default",),
                  op_ids=("g0:cumsum",), dtype="fp32")
    d = route_chain(scan, _est(compile_us=30.0), load_rules([]), kernels={}, device_kind="cpu")
    assert (d.rule_id, d.route) == ("compile-scan", "skip")
    assert d.reason.startswith("left as written: torch.compile is predicted no faster than eager here (30.0 us")


def test_a_gemm_reason_says_how_near_its_roofline_it_runs():
    """"vendor GEMMs run near their ceiling" stood beside a bmm priced at 0.4% of its roofline."""
    gemm = _chain(kind="heavy", pattern="matmul", categories=("matmul",), targets=("aten.bmm.default",),
                  op_ids=("g0:bmm",), dtype="fp32")
    d = route_chain(gemm, _est(compute_us=0.5, memory_fused_us=16.0, eager_us=4000.0, launch_eager_us=12.0),
                    load_rules([]), kernels={})
    assert d.rule_id == "skip-matmul" and "est. 4000.0 us at 0% of its roofline" in d.reason
    d = route_chain(gemm, _est(compute_us=90.0, memory_fused_us=16.0, eager_us=100.0, launch_eager_us=12.0,
                               bound="compute"), load_rules([]), kernels={})
    assert "at 90% of its roofline: left to the vendor library" in d.reason


@pytest.mark.parametrize("out_numel, intensity_flops, rule", [
    (128 * 1000, 55 * 4000, "skip-matmul"),  # nn.Linear 128 x 1000 x 4096: the weight is the largest tensor
    (4096 * 4096, 16 * 4000, "skip-matmul"),  # an attention bmm of K = 32 (16 FLOP/B: measured 0.97x)
    (4096 * 4096, 35 * 4000, "triton-fp32-gemm"),  # K = 96 (35 FLOP/B: measured 1.34x)
])
def test_the_fp32_gemm_kernel_takes_many_output_tiles_and_a_long_enough_k(out_numel, intensity_flops, rule):
    """A reviewer: the rule's 2M floor tested the chain's largest tensor, an nn.Linear's weight, so 128 x 1000 x
    4096 (measured 0.94x) was routed at a predicted 1.56x; and a K = 32 bmm read 2.97x where 0.97x was measured."""
    gemm = _chain(kind="heavy", pattern="matmul", categories=("matmul",), targets=("aten.mm.default",),
                  op_ids=("g0:mm",), dtype="fp32", numel=4096 * 4096, out_numel=out_numel,
                  flops=intensity_flops, fused_bytes=4000, eager_bytes=4000)
    d = route_chain(gemm, _est("compute", triton_us=10.0), load_rules([]), kernels={})
    assert d.rule_id == rule


@pytest.mark.parametrize("compile_us, rule, route", [(37.3, "compile-multi-kernel-op", "torch.compile"),
                                                     (240.0, "skip-default", "skip")])
def test_one_op_of_several_eager_kernels_goes_to_torch_compile_where_predicted_faster(compile_us, rule, route):
    """A lone logsumexp (nine eager kernels, one under Inductor) read "no rule found a gain" beside a predicted
    247.0 -> 37.3 us under torch.compile (found by a fresh user): its bytes, counted once, showed nothing saved."""
    lse = _chain(pattern="reduction", categories=("reduction",), targets=("aten.logsumexp.default",),
                 op_ids=("g0:logsumexp",), dtype="fp32", eager_kernels=9, eager_bytes=4000, fused_bytes=4000)
    d = route_chain(lse, _est(eager_us=247.0, compile_us=compile_us), load_rules([]), kernels={})
    assert (d.rule_id, d.route) == (rule, route)
    if route != "skip":
        assert d.reason.startswith("reduction: eager runs it as 9 kernels, Inductor as one")
        assert "247.0 -> 37.3 us" in d.reason
