"""The registry as the benchmarks read it: every entry has benchmark shapes of its own, made from its module."""

import importlib

import pytest

from kernel_library.registry import entry_shapes, load_all

ENTRIES = sorted(load_all().items())


@pytest.mark.parametrize("name,entry", ENTRIES, ids=[n for n, _ in ENTRIES])
def test_every_entry_has_bench_shapes_of_its_own(name, entry):
    mod = importlib.import_module(entry.module)
    shapes = entry_shapes(name, mod)
    assert shapes, f"{name}: no BENCH_SHAPES entry exercises it"
    siblings = [n for n, e in ENTRIES if e.module == entry.module and n != name]
    for other in siblings:  # a module registering two entries gives them disjoint shapes
        assert not [s for s in shapes if s in entry_shapes(other, mod)]


def test_two_entry_modules_split_their_shapes_by_what_they_exercise():
    ln = importlib.import_module("kernel_library.layernorm")
    assert all(s.get("residual") for s in entry_shapes("add_layernorm", ln))
    assert not any(s.get("residual") for s in entry_shapes("layernorm", ln))
    sm = importlib.import_module("kernel_library.softmax")
    assert all(s.get("mask") or s.get("causal") for s in entry_shapes("masked_softmax", sm))
    assert not any(s.get("mask") or s.get("causal") for s in entry_shapes("softmax", sm))


MODULES = sorted({e.module for _, e in ENTRIES})


@pytest.mark.parametrize("module", MODULES)
def test_every_library_kernel_passes_verify(module):
    # what `fusion-advisor verify kernel_library/<name>.py` runs: several seeds, the hard values (x8, x1e-3, zeros and
    # the module's own hard_inputs()), the edge shapes of its size hooks (one row, a partial last block, odd widths,
    # 1025 rows; 65537 rows only on a GPU), poisoned outputs in redzones, gradients, the error policy against a
    # float64 reference (on the CPU interpreter here)
    from fusion_advisor.kernel_tools.verify import load_contract, verify_kernel

    contract = load_contract(module)
    result = verify_kernel(contract)
    assert result.correct, result.failure or result.details
    assert contract.sizes or contract.verify_sizes, f"{module}: no size hooks, so verify runs one shape only"
    shapes = [s for s in result.shapes if s["case"].startswith("shape ")]
    assert len(shapes) >= 4 and all(s["status"] == "passed" or s["status"].startswith("skipped") for s in shapes)
    if contract.hard_inputs is not None:
        assert any(c.startswith("hard: ") for c in result.cases)


@pytest.mark.parametrize("name, entry", [(n, e) for n, e in load_all().items() if n != e.module.rsplit(".", 1)[-1]])
def test_every_second_entry_of_a_module_is_verified_on_its_own_inputs(name, entry):
    """`fusion-advisor verify masked_softmax` (and add_layernorm) passed by checking the plain softmax's inputs,
    the only hint a note in its JSON (found by a fresh user): each such entry has a contract of its own."""
    from fusion_advisor.kernel_tools.verify import load_contract

    contract = load_contract(name)
    assert contract.name == name and "contract_for" in contract.note
    args = contract.get_inputs()
    if name == "masked_softmax":
        assert args[2] is not None and args[1] != 1.0  # a mask and a scale
        assert contract.hard_inputs() and all(a[2] is not None for _, a in contract.hard_inputs())
    if name == "add_layernorm":
        assert len(args) == 5 and args[4].shape == args[0].shape  # the residual
        assert all(len(a) == 5 for _, a in contract.hard_inputs())
