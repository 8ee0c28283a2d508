"""plan.yaml and ``fusion_advisor.load_plan``: the chosen model rebuilt from the plan, without re-measuring."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import fusion_advisor
from fusion_advisor.apply import (
    PLAN_VERSION, ApplyOptions, MatchKey, PlanError, PlannedModel, PlannedSwap, VariantSpec, apply, read_plan,
    write_outputs,
)
from fusion_advisor.analyze.load import load_model

MODEL = (Path(__file__).parent / "data" / "models" / "tiny_llama.py").read_text()

KERNELS = ("add_rmsnorm", "rmsnorm", "cross_entropy")

#: The model as written and the swap variants (tests/test_variants.py covers the search itself).
SWAP_VARIANTS = ("eager", "swaps+eager*")


def _plan(tmp: Path, device: str):
    """apply --verify of the tiny built-in Llama on ``device``, plan written; returns (plan path, model file, result)."""
    model = tmp / "tiny_llama.py"
    model.write_text(MODEL)
    options = ApplyOptions(verify=True, candidates="all", keep_unmeasured=True, seeds=0, kernels=KERNELS,
                           variants=SWAP_VARIANTS if device == "cpu" else None, budget_s=60)
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
    assert doc["options"]["margin"] == 0.03 and doc["options"]["variants"] == list(SWAP_VARIANTS)
    assert {"torch", "triton", "python"} <= set(doc["versions"])
    assert len(doc["swaps"]) == len(result.sites) == 10  # 5 rmsnorm (4 inside add+RMSNorm), 4 add_rmsnorm, 1 CE
    for s in doc["swaps"]:
        assert {"id", "kernel", "key", "signature", "chains", "ops", "source", "route", "verified", "decision",
                "reason", "kept"} <= set(s)
        assert s["key"]["kernel"] == s["kernel"] and s["signature"].startswith(s["kernel"] + "(")
    kept = [s for s in doc["swaps"] if s["kept"]]
    assert sorted(s["kernel"] for s in kept) == ["add_rmsnorm"] * 4 + ["cross_entropy", "rmsnorm"]
    assert all(s["verified"] for s in kept)
    chosen = doc["chosen"]
    assert chosen["name"] == "swaps+eager" and chosen["spec"]["rest"] == "eager"
    assert sorted(s["key"]["kernel"] for s in chosen["spec"]["swaps"]) == sorted(s["kernel"] for s in kept)
    variants = {v["name"]: v for v in doc["variants"]}
    assert variants["swaps+eager"]["status"] == "chosen" and variants["swaps+eager"]["check"]["passed"]
    assert variants["eager"]["baseline"] and variants["eager"]["timing"]["ms"] > 0
    assert read_plan(path).chosen.swaps and len(read_plan(path).chosen.swaps) == len(kept)


def test_load_plan_rebuilds_the_chosen_model(planned):
    path, model_file, result = planned
    model, inputs = _fresh(model_file)
    patched = fusion_advisor.load_plan(model, path)
    assert isinstance(patched, fusion_advisor.PlannedModel) and patched.spec.name == "swaps+eager"
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


def test_load_plan_rebuilds_another_correct_variant_by_name(planned):
    path, model_file, _ = planned
    model, inputs = _fresh(model_file)
    as_written = fusion_advisor.load_plan(model, path, variant="eager")
    assert as_written.spec.name == "eager" and not as_written.spec.swaps
    torch.testing.assert_close(as_written(*inputs), _fresh(model_file)[0](*inputs))
    with pytest.raises(PlanError, match=r"variant 'nope' is not in it; the plan's correct variants: 'eager' \("):
        fusion_advisor.load_plan(model, path, variant="nope")


def test_load_plan_warns_when_the_model_is_not_the_one_the_plan_was_made_for(planned):
    # a new user rebuilt one model from another model's plan.yaml and was told nothing
    import warnings

    path, model_file, _ = planned
    assert yaml.safe_load(path.read_text())["model"]["signature"]["class"] == "LlamaForCausalLM"
    model, _ = _fresh(model_file)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fusion_advisor.load_plan(model, path)  # the same model, other weights would do too: no warning
    with pytest.warns(RuntimeWarning, match=r"made for a LlamaForCausalLM with \d+ parameters and buffers, this is a Linear "
                                            r"with 2: the plan's swaps and regions may not fit"):
        fusion_advisor.load_plan(torch.nn.Linear(4, 4), path)
    model.float().to(torch.float64)
    with pytest.warns(RuntimeWarning, match="whose names, shapes or dtypes differ"):
        fusion_advisor.load_plan(model, path)


def test_load_plan_warns_when_the_model_file_changed_since_apply(tmp_path):
    """Swaps and regions are keyed by file:line: an edited file may put other code under them."""
    import warnings

    model_file = tmp_path / "mlp.py"
    model_file.write_text(
        "import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(8, 8)\n\n    def forward(self, x):\n        return torch.relu(self.fc(x))\n"
        "\n\ndef get_inputs():\n    return [torch.randn(4, 8)]\n\n\ndef get_init_inputs():\n    return []\n")
    result = apply(model_file, ApplyOptions(verify=True, variants=("eager",), time_rounds=1), device="cpu")
    path = write_outputs(result, tmp_path / "out")["plan"]
    assert len(yaml.safe_load(path.read_text())["model"]["source_sha256"]) == 16
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the same file: nothing to say
        fusion_advisor.load_plan(_fresh(model_file)[0], path)
    # a model built fresh is in training mode, and apply checked the plan in eval mode: said (a fresh user's
    # Dropout model differed by 0.377 in training mode, with nothing said)
    with pytest.warns(RuntimeWarning, match="the model is in training mode, and apply checked and timed this plan "
                                            "in eval mode"):
        fusion_advisor.load_plan(_fresh(model_file)[0].train(), path)
    model_file.write_text("# a line added above the model\n" + model_file.read_text())
    # a stock plan has no swaps or regions keyed by lines: the warning says the measured code changed
    with pytest.warns(RuntimeWarning, match=r"mlp.py changed since apply made this plan from it .*: the choice was "
                                            r"measured on the code as it was"):
        fusion_advisor.load_plan(_fresh(model_file)[0], path)


def test_a_plan_made_with_dtype_tells_a_model_of_another_dtype_to_cast():
    """A fresh user's fp32 model, loaded with the plan apply --dtype bf16 made for it, was told its names, shapes or
    dtypes differ and to run apply for a plan of its own."""
    from fusion_advisor.apply.plan import dtype_hint

    assert dtype_hint("bf16", torch.nn.Linear(2, 2)) == (
        "the plan was made with --dtype bf16 and this model's parameters are fp32: cast the model and its inputs "
        "first (model.to(torch.bfloat16))")
    assert dtype_hint("bf16", torch.nn.Linear(2, 2).to(torch.bfloat16)) == ""
    assert dtype_hint("", torch.nn.Linear(2, 2)) == "" and dtype_hint(None, torch.nn.ReLU()) == ""


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
    spec = read_plan(path).chosen
    patched = PlannedModel(model, VariantSpec(spec.name, spec.rest, swaps=spec.swaps + (ghost,)))
    with torch.no_grad():
        patched(*inputs)
    assert patched.missing_swaps() == [ghost.key]
    # the plan keyed the site by file:line, and the model's file may have moved it: name the sites there are
    said = [p for p in patched.problems() if p.startswith(f"planned swap {ghost.key} found no site of that key")]
    assert len(said) == 1 and "the model's rmsnorm sites now: rmsnorm@" in said[0], patched.problems()
    assert "run apply again after changing the model's file" in said[0]


def test_read_plan_errors(tmp_path, planned):
    with pytest.raises(PlanError, match="no such plan file"):
        read_plan(tmp_path / "nope.yaml")
    # a fresh user passed apply's folder: it is read from there, and a folder without a plan says so
    assert read_plan(planned[0].parent).chosen.name == read_plan(planned[0]).chosen.name
    with pytest.raises(PlanError, match="is a folder without a plan.yaml"):
        read_plan(tmp_path)
    import fusion_advisor

    assert fusion_advisor.PlanError is PlanError  # what load_plan's docstring says it raises, importable
    assert {"load_plan", "PlannedModel", "PlanError"} <= set(dir(fusion_advisor))  # lazy, yet listed
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
    doc["chosen"]["spec"]["swaps"][0]["key"]["kernel"] = "warp_speed"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanError, match="kernel 'warp_speed'.*known kernels: add_layernorm"):
        read_plan(bad)
    doc["chosen"]["spec"]["rest"] = "hyperdrive"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanError, match="unknown executor 'hyperdrive'"):
        read_plan(bad)
    doc["fusion_advisor_plan"] = 1
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanError, match="run apply again"):
        read_plan(bad)
    # cut short: YAML cut at a line still parses (a fresh user's plan cut to 62 lines rebuilt a swap-free model)
    text = planned[0].read_text()
    bad.write_text(text[:text.index("\nvariants:")])
    with pytest.raises(PlanError, match="the plan is cut short"):
        read_plan(bad)
    doc = yaml.safe_load(text)
    doc["chosen"]["spec"]["swaps"] = doc["chosen"]["spec"]["swaps"][:-1]
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(PlanError, match=r"lists \d+ swap\(s\) where the plan's summary counts"):
        read_plan(bad)
    assert read_plan(planned[0]).chosen.swaps  # the whole file reads
    bad.write_text(text[:text.index("\ncolumns:")])  # plans of the format made before the columns glossary
    assert read_plan(bad).chosen.swaps


@pytest.mark.gpu
def test_load_plan_on_the_gpu_rebuilds_the_measured_choice(planned_cuda):
    path, model_file, result = planned_cuda
    doc = yaml.safe_load(path.read_text())
    names = [v["name"] for v in doc["variants"]]
    assert names[:3] == ["eager", "torch.compile", "torch.compile reduce-overhead"]
    chosen = result.chosen
    assert chosen is not None and chosen.correct and chosen.ms is not None
    best_baseline = min(v.ms for v in result.variants if v.baseline and v.correct and v.ms is not None)
    assert chosen.ms <= best_baseline * 1.05, (chosen.spec.name, chosen.ms, best_baseline)
    loaded = load_model(model_file, device="cuda")
    planned = fusion_advisor.load_plan(loaded.module, path)
    with torch.no_grad():
        out = planned(*loaded.inputs)
        ref = loaded.module(*loaded.inputs)
    assert not planned.problems(), planned.problems()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_unapplied_swaps_are_warned(tmp_path, monkeypatch):
    """A plan whose swaps cannot run here must not pass silently as a patched model."""
    import warnings as _w

    import torch

    from fusion_advisor.apply import plan as plan_mod

    plan = tmp_path / "plan.yaml"  # never read: read_plan is replaced below
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    key = MatchKey("rmsnorm", "norm", "llama.py:1", 0)
    fake = plan_mod.Plan(path=None, model={}, options={}, versions={},
                         chosen=VariantSpec("swaps+eager", "eager", swaps=(PlannedSwap(key),)))
    monkeypatch.setattr(plan_mod, "read_plan", lambda p: fake)
    monkeypatch.setattr(plan_mod, "PlannedModel", lambda model, spec: model)
    load_plan = plan_mod.load_plan
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
    # and not, beside it, that the model has no such site (a fresh user read both for the same site)
    assert not any("found no site of that key" in p for p in patched.problems()), patched.problems()
    # but a planned swap of the same kernel and module whose line moved is still named (a reviewer: keyed on the
    # module alone, a refused site silenced it)
    import dataclasses

    from fusion_advisor.apply import PlannedModel, read_plan

    spec = read_plan(path).chosen
    first = spec.swaps[0]
    ghost = dataclasses.replace(first, key=dataclasses.replace(first.key, source=first.key.source.rsplit(":", 1)[0]
                                                               + ":999"))
    model, inputs = _fresh(model_file)
    moved = PlannedModel(model, dataclasses.replace(spec, swaps=tuple(spec.swaps) + (ghost,)))
    with pytest.warns(RuntimeWarning):
        moved(*inputs)
    assert any(p.startswith(f"planned swap {ghost.key} found no site") for p in moved.problems()), moved.problems()


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
    from fusion_advisor.analyze.load import KeywordCall

    model = tmp_path / "kw_llama.py"
    model.write_text(KEYWORD_MODEL)
    loaded = load_model(model, device="cpu")
    assert isinstance(loaded.module, KeywordCall) and loaded.module.names == ("labels", "input_ids")
    options = ApplyOptions(verify=True, candidates="all", keep_unmeasured=True, seeds=0, kernels=("rmsnorm",),
                           variants=SWAP_VARIANTS)
    result = apply(model, options, device="cpu")
    paths = write_outputs(result, tmp_path / "out")
    kept = [s for s in yaml.safe_load(paths["plan"].read_text())["swaps"] if s["kept"]]
    assert kept and all(not s["key"]["module_path"].startswith("fa_keyword_model") for s in kept)
    assert any(s["key"]["module_path"].endswith("norm") for s in kept)
    user = load_model(model, device="cpu").module.fa_keyword_model
    inputs = dict(zip(loaded.module.names, loaded.inputs))
    # the plan names the user's model, not the wrapper: rebuilding it on that model warns of nothing (a new user
    # was told "the plan was made for a KeywordCall ..., this is a GPT2LMHeadModel")
    assert yaml.safe_load(paths["plan"].read_text())["model"]["signature"]["class"] == type(user).__qualname__
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        patched = fusion_advisor.load_plan(user, paths["plan"])
    out = patched(**inputs)
    assert not patched.problems(), patched.problems()
    torch.testing.assert_close(out, user(**inputs), rtol=1e-4, atol=1e-4)
