"""A model zoo as users bring it: the most used transformers families, each built from the family's default config
with only the sizes shrunk (the KV cache left on, as the default config sets it), analysed on the meta device (the
default without a GPU) and on the CPU. Every one must write a report without a traceback.

torchvision / timm classics are not in the zoo: PyPI's torchvision does not import beside the CPU build of torch
this project's CI installs ("operator torchvision::nms does not exist"), and timm needs torchvision.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from fusion_advisor.analyze.pipeline import analyze
from fusion_advisor.report.write import write_report

sys.path.insert(0, str(Path(__file__).parent / "data" / "models"))
import zoo  # noqa: E402


#: Families also analysed on the CPU: one per kind of architecture (a decoder LM, a mixture of experts, sliding-window
#: attention, GPT-2's Conv1D, two encoder-decoders, an encoder, a windowed vision model). The CPU path runs the same
#: capture on real values; every family on both devices had cost the suite about two CPU-minutes more.
ON_CPU = ("llama", "mixtral", "gemma3", "gpt2", "t5", "whisper", "bert", "swin")


@pytest.mark.parametrize("family, device", [(f, "meta") for f in zoo.FAMILIES] + [(f, "cpu") for f in ON_CPU])
def test_family_from_its_default_config_is_analysed(family, device, tmp_path):
    path = tmp_path / f"{family}.py"
    path.write_text(zoo.model_file_text(family))
    start = time.perf_counter()
    analysis = analyze(path, device=None if device == "meta" else device)  # meta: the default device here
    paths = write_report(analysis, tmp_path / "out")
    seconds = time.perf_counter() - start
    print(f"\n{family} on {device}: {seconds:.1f} s, {len(analysis.ops)} ops, {len(analysis.chains)} chains, "
          f"captured by {analysis.capture_method}")
    assert paths["html"].is_file() and analysis.chains
    assert analysis.device == device
    config = getattr(zoo.build(family)[0], "config", None)
    if getattr(config, "use_cache", False):  # the default config turns the cache on: analysed without, and said so
        assert any("use_cache=False" in w for w in analysis.warnings), analysis.warnings


MODELS = Path(__file__).parent / "data" / "models"


@pytest.mark.parametrize("name, why", [
    ("value_branch", "reads tensor values while it runs"),
    ("init_reads_values", "building the model reads tensor values"),
    ("moe_nonzero", "reads tensor values while it runs"),
    ("cpu_tensor_in_forward", "makes tensors on the CPU while it runs"),  # a torch.zeros without device=
    ("cpu_mask_in_forward", "makes tensors on the CPU while it runs"),  # a causal mask built without device=
])
def test_a_model_that_needs_values_is_analysed_on_the_cpu_by_default(name, why):
    """On the default (meta) device a model that reads values is built or run on the CPU, and the report says so;
    asked for meta explicitly, it gets the error with what to do."""
    analysis = analyze(MODELS / f"{name}.py")
    assert analysis.device == "cpu" and analysis.chains
    assert any("not the meta device" in w and why in w for w in analysis.warnings), analysis.warnings
    from fusion_advisor.errors import UserError

    with pytest.raises(UserError, match="meta"):
        analyze(MODELS / f"{name}.py", device="meta")


def test_data_dependent_sizes_are_costed_with_a_stated_assumption():
    analysis = analyze(MODELS / "moe_nonzero.py", device="cpu")
    notes = [w for w in analysis.warnings if w.startswith("data-dependent size")]
    assert notes and all("costed as" in w and "upper bound" in w for w in notes), analysis.warnings
    assert {"linear", "index_add"} <= {op.target.split(".")[1] for op in analysis.ops if op.target.startswith("aten.")}
    assert not any(op.target.startswith("aten.sym_size") and op.eager_kernels and op.category != "view"
                   for op in analysis.ops)  # reading a size launches no kernel


def test_keyword_inputs_training_mode_note_reads_the_users_module(tmp_path):
    """get_model() returns the model in eval mode and get_inputs() a dict: no "training mode" note (the check once
    read the keyword-call wrapper, a fresh module in training mode, not the user's)."""
    path = tmp_path / "kw.py"
    path.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.lin = torch.nn.Linear(8, 8); self.drop = torch.nn.Dropout(0.1)\n"
        "    def forward(self, x, scale):\n"
        "        return self.drop(self.lin(x)) * scale\n"
        "def get_model():\n"
        "    return M().eval()\n"
        "def get_inputs():\n"
        "    return {'x': torch.randn(2, 8), 'scale': torch.ones(1)}\n")
    from fusion_advisor.analyze.load import load_model

    loaded = load_model(path, device="cpu")
    assert not any("training mode" in n for n in loaded.notes), loaded.notes
    train = path.read_text().replace("return M().eval()", "return M()")
    path.write_text(train)
    assert any("training mode" in n for n in load_model(path, device="cpu").notes)


def test_every_load_makes_the_same_weights_and_inputs_and_leaves_the_callers_random_state(monkeypatch, tmp_path):
    # a fresh user's model branching on h.mean() > 0 was cut into other chains on a second run: the analysis
    # followed whichever branch that run's random inputs took
    from fusion_advisor.analyze.load import load_model

    def reseeds_every_gpu(seed):  # torch.manual_seed's way: a caller's GPU streams (a reviewer)
        raise AssertionError("load_model reseeded every GPU's generator")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", reseeds_every_gpu)
    path = tmp_path / "unseeded.py"  # value_branch.py seeds itself
    path.write_text("import torch\n"
                    "def get_model():\n    return torch.nn.Linear(16, 16)\n"
                    "def get_inputs():\n    return [torch.randn(8, 16)]\n")
    torch.default_generator.manual_seed(123)
    state = torch.random.get_rng_state()
    a, b = (load_model(path, device="cpu") for _ in range(2))
    assert torch.equal(torch.random.get_rng_state(), state)
    for x, y in zip(a.inputs, b.inputs, strict=True):
        assert torch.equal(x, y)
    for p, q in zip(a.module.parameters(), b.module.parameters(), strict=True):
        assert torch.equal(p, q)
    monkeypatch.undo()
    analysis = analyze(MODELS / "value_branch.py")
    assert any("only the branches these inputs take are analysed (made under seed 0" in w
               for w in analysis.warnings), analysis.warnings
