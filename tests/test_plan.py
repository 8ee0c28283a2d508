"""plan.yaml and ``fusion_advisor.load_plan``: the patched model rebuilt from the plan, without re-benchmarking."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import yaml

import fusion_advisor
from fusion_advisor.apply import ApplyOptions, MatchKey, apply, write_outputs
from fusion_advisor.load import load_model
from fusion_advisor.plan import PLAN_VERSION, PatchedModel, PlanError, PlannedSwap, read_plan

MODEL = textwrap.dedent("""
    import torch
    from fusion_advisor.models.llama import LlamaConfig, get_model as _get_model, get_inputs as _get_inputs

    CFG = LlamaConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, vocab_size=256,
                      seq_len=16, dtype=torch.float32)

    def get_model():
        torch.manual_seed(0)
        return _get_model(CFG)

    def get_inputs():
        torch.manual_seed(1)
        return _get_inputs(CFG)
""")

KERNELS = ("add_rmsnorm", "rmsnorm", "cross_entropy")


def _plan(tmp: Path, device: str):
    """apply --verify of the tiny built-in Llama on ``device``, plan written; returns (plan path, model file, result)."""
    model = tmp / "tiny_llama.py"
    model.write_text(MODEL)
    options = ApplyOptions(verify=True, candidates="all", keep_unmeasured=True, seeds=0, kernels=KERNELS)
    result = apply(model, options, device=device)
    paths = write_outputs(result, tmp / "out")
    return paths["plan"], model, result


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The plan made on the CPU (Triton's interpreter)."""
    return _plan(tmp_path_factory.mktemp("plan"), "cpu")


@pytest.fixture(scope="module")
def planned_cuda(tmp_path_factory):
    """The plan made on the GPU (on a GPU machine apply refuses --device cpu unless TRITON_INTERPRET=1 was set
    before Triton was imported, so the GPU test cannot share the CPU fixture)."""
    return _plan(tmp_path_factory.mktemp("plan_cuda"), "cuda")


def _fresh(model_file: Path):
    loaded = load_model(model_file, device="cpu")
    return loaded.module, loaded.inputs


def test_plan_records_every_decision(planned):
    path, model_file, result = planned
    doc = yaml.safe_load(path.read_text())
    assert doc["fusion_advisor_plan"] == PLAN_VERSION
    assert doc["model"]["file"] == str(model_file) and doc["model"]["name"] == "tiny_llama"
    assert doc["options"]["margin"] == 0.03 and doc["options"]["compile_rest"] is False
    assert {"torch", "triton", "python"} <= set(doc["versions"])
    assert len(doc["swaps"]) == len(result.sites) == 10  # 5 rmsnorm (4 inside add+RMSNorm), 4 add_rmsnorm, 1 CE
    for s in doc["swaps"]:
        assert {"id", "kernel", "key", "signature", "chains", "ops", "source", "route", "verified", "decision",
                "reason", "kept"} <= set(s)
        assert s["key"]["kernel"] == s["kernel"] and s["signature"].startswith(s["kernel"] + "(")
    kept = [s for s in doc["swaps"] if s["kept"]]
    assert sorted(s["kernel"] for s in kept) == ["add_rmsnorm"] * 4 + ["cross_entropy", "rmsnorm"]
    assert all(s["verified"] for s in kept)
    assert doc["whole_model"]["passed"] is True
    assert read_plan(path).kept and len(read_plan(path).kept) == len(kept)


def test_load_plan_rebuilds_the_patched_model(planned):
    path, model_file, result = planned
    model, inputs = _fresh(model_file)
    patched = fusion_advisor.load_plan(model, path)
    assert isinstance(patched, fusion_advisor.PatchedModel)
    out = patched(*inputs)
    kept = sorted(str(s.key) for s in result.kept)
    assert sorted(map(str, patched.applied_swaps())) == kept
    assert patched.missing_swaps() == [] and patched.problems() == []
    ref_model, _ = _fresh(model_file)  # same weights (the file seeds them), never patched
    ref = ref_model(*inputs)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # training works through the kernels' own backward
    out.backward()
    ref.backward()
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    # the wrapper holds the user's model once: state_dict keys are the model's, prefixed
    assert set(patched.state_dict()) == {f"model.{k}" for k in model.state_dict()}


def test_patched_model_under_an_outer_torch_compile_keeps_the_swaps(planned):
    path, model_file, _ = planned
    model, inputs = _fresh(model_file)
    patched = fusion_advisor.load_plan(model, path)
    compiled = torch.compile(patched, backend="eager")
    with torch.no_grad():
        out = compiled(*inputs)
        ref = model(*inputs)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert patched.applied_swaps(), "the outer compile inlined the model and dropped the swaps"


def test_patched_model_recompiles_for_new_shapes_and_matches_again(planned):
    path, model_file, _ = planned
    model, _ = _fresh(model_file)
    patched = fusion_advisor.load_plan(model, path)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = patched(ids, ids)
        ref = model(ids, ids)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert patched.missing_swaps() == []


def test_a_kept_swap_missing_from_the_model_is_reported(planned):
    path, model_file, _ = planned
    model, inputs = _fresh(model_file)
    ghost = PlannedSwap(MatchKey("rmsnorm", "layers.7.input_layernorm", "llama.py:61", 0))
    patched = PatchedModel(model, read_plan(path).kept + [ghost])
    with torch.no_grad():
        patched(*inputs)
    assert patched.missing_swaps() == [ghost.key]


def test_read_plan_errors(tmp_path, planned):
    with pytest.raises(PlanError, match="no such plan file"):
        read_plan(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("swaps: [\n")
    with pytest.raises(PlanError, match="not valid YAML"):
        read_plan(bad)
    bad.write_text("swaps: []\n")
    with pytest.raises(PlanError, match="not a fusion-advisor plan"):
        read_plan(bad)
    doc = yaml.safe_load(planned[0].read_text())
    doc["fusion_advisor_plan"] = PLAN_VERSION + 1
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanError, match="plan format version"):
        read_plan(bad)
    doc["fusion_advisor_plan"] = PLAN_VERSION
    kept = next(s for s in doc["swaps"] if s["kept"])
    kept["key"]["kernel"] = "warp_speed"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanError, match="kernel 'warp_speed'.*known kernels: add_layernorm"):
        read_plan(bad)


@pytest.mark.gpu
def test_load_plan_with_inductor_for_the_rest(planned_cuda):
    path, model_file, _ = planned_cuda
    loaded = load_model(model_file, device="cuda")
    patched = fusion_advisor.load_plan(loaded.module, path, compile_rest=True)
    out = patched(*loaded.inputs)
    assert not patched.problems(), patched.problems()
    torch.testing.assert_close(out, loaded.module(*loaded.inputs), rtol=1e-4, atol=1e-4)


def test_unapplied_swaps_are_warned(tmp_path, monkeypatch):
    """A plan whose swaps cannot run here must not pass silently as a patched model."""
    import warnings as _w

    import torch

    from fusion_advisor.plan import load_plan

    plan = tmp_path / "plan.yaml"  # never read: read_plan is replaced below
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from fusion_advisor import plan as plan_mod

    fake = plan_mod.Plan(path=None, model={}, options={"compile_rest": False}, versions={}, swaps=[], kept=[object()])
    monkeypatch.setattr(plan_mod, "read_plan", lambda p: fake)
    monkeypatch.setattr(plan_mod, "PatchedModel", lambda model, kept, compile_rest: model)
    with _w.catch_warnings(record=True) as caught:
        _w.simplefilter("always")
        load_plan(torch.nn.Linear(2, 2), plan)
    assert any("runs unpatched" in str(c.message) for c in caught)


def test_a_swap_not_applied_says_why(planned, monkeypatch):
    # No GPU and no TRITON_INTERPRET: every kernel refuses the CPU tensors. The warning and problems() must
    # say so, not "no matching site in the model" (the sites are there).
    import kernel_library._device

    monkeypatch.setattr(kernel_library._device, "interpreted", lambda: False)
    path, model_file, _ = planned
    model, inputs = _fresh(model_file)
    patched = fusion_advisor.load_plan(model, path)
    with pytest.warns(RuntimeWarning, match="needs CUDA"):
        patched(*inputs)
    assert patched.missing_swaps()
    assert any("cannot take this site: tensors on cpu" in p for p in patched.problems()), patched.problems()


KEYWORD_MODEL = MODEL.replace('''def get_inputs():
    torch.manual_seed(1)
    return _get_inputs(CFG)''', '''def get_inputs():
    torch.manual_seed(1)
    input_ids, labels = _get_inputs(CFG)
    return {"labels": labels, "input_ids": input_ids}  # keyword inputs, not in forward()'s order''')
assert KEYWORD_MODEL != MODEL


def test_keyword_inputs_apply_and_load_plan_on_the_users_model(tmp_path):
    """get_inputs() returning a dict: the model is called as model(**inputs); swap sites name the user's modules
    (no wrapper in their paths), so the plan patches the user's own model, called with keywords."""
    from fusion_advisor.load import KeywordCall

    model = tmp_path / "kw_llama.py"
    model.write_text(KEYWORD_MODEL)
    loaded = load_model(model, device="cpu")
    assert isinstance(loaded.module, KeywordCall) and loaded.module.names == ("labels", "input_ids")
    options = ApplyOptions(verify=True, candidates="all", keep_unmeasured=True, seeds=0, kernels=("rmsnorm",))
    result = apply(model, options, device="cpu")
    paths = write_outputs(result, tmp_path / "out")
    kept = [s for s in yaml.safe_load(paths["plan"].read_text())["swaps"] if s["kept"]]
    assert kept and all(not s["key"]["module_path"].startswith("fa_keyword_model") for s in kept)
    assert any(s["key"]["module_path"].endswith("norm") for s in kept)
    user = load_model(model, device="cpu").module.fa_keyword_model
    inputs = dict(zip(loaded.module.names, loaded.inputs))
    patched = fusion_advisor.load_plan(user, paths["plan"])
    out = patched(**inputs)
    assert not patched.problems(), patched.problems()
    torch.testing.assert_close(out, user(**inputs), rtol=1e-4, atol=1e-4)
