"""Tests of fusion_advisor.kernel_tools.verify and the ``verify`` command.

Kernel files live in tests/data/kernels (vector_add: correct Triton kernel; broken_mask: leaves its last element
unwritten; no_contract: lacks reference_fn and get_inputs). Smaller contracts are built in code with plain torch
kernels, so each check (poisoning, input mutation, gradients, dtypes) is tested on a kernel that breaks only it.
Runs under TRITON_INTERPRET=1 (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fusion_advisor.cli import app
from fusion_advisor.errors import ContractError, KernelLoadError
from fusion_advisor.verification.inputs import STRIDED_CASE
from fusion_advisor.kernel_tools.verify import (
    KernelContract,
    PoisonAllocations,
    compare_outputs,
    load_contract,
    poison_value,
    verify_kernel,
)

KERNELS = Path(__file__).parent / "data" / "kernels"
runner = CliRunner()


def contract(kernel_fn, reference_fn, get_inputs, name="test") -> KernelContract:
    return KernelContract(name=name, path=None, kernel_fn=kernel_fn, reference_fn=reference_fn, get_inputs=get_inputs)


def two_vectors(n=37, dtype=torch.float32):
    return lambda: [torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)]


# --- the example kernel files -------------------------------------------------------------------------------


def test_vector_add_verifies():
    result = verify_kernel(load_contract(KERNELS / "vector_add.py"))
    assert result.correct, result.details
    assert result.seeds == [0, 1, 2]
    assert result.reference_precision == "float64"
    assert 0 <= result.max_abs_diff < 1e-5
    assert not result.backward_checked
    # The Triton op's output allocation was poisoned (the custom op was entered), once per case: the seeds, the
    # hard values (vector_add.py has no size hooks, so no extra shapes) and the strided layout (it takes any stride)
    assert result.cases == ["seed 0", "seed 1", "seed 2", "hard-large", "hard-tiny", "hard-zeros", STRIDED_CASE]
    assert sum("1 allocation(s) poisoned" in d for d in result.details) == len(result.cases)
    assert [s["status"] for s in result.shapes] == ["passed"] * len(result.cases)
    d = result.to_dict()
    assert list(d)[:4] == ["correct", "max_abs_diff", "max_rel_diff", "details"]
    json.dumps(d, allow_nan=False)
    # the policy's own measure beside the element-wise maxima (a fresh user read grad_max_rel_diff 80 beside
    # "correct: true" as a failure): the worst error over its limit, at most 1 for a correct kernel, and where
    assert 0 <= d["worst_share_of_limit"] <= 1 and d["worst_share_at"].split(": ")[0] in result.cases


def test_broken_mask_is_caught():
    result = verify_kernel(load_contract(KERNELS / "broken_mask.py"))
    assert not result.correct
    assert result.seeds == [0]  # stops at the first failing seed
    text = "\n".join(result.details)
    assert "unwritten" in text and "NaN" in text
    assert "(9972,)" in text  # the last element of 9973
    assert result.to_dict()["max_abs_diff"] is None  # inf -> null in JSON
    assert result.worst_share_of_limit > 1 and result.worst_share_at.startswith("seed 0: ")


def test_cli_verify_ok_and_json_out(tmp_path):
    out = tmp_path / "verify.json"  # the folder must exist: --json-out creates no folders
    res = runner.invoke(app, ["verify", str(KERNELS / "vector_add.py"), "--seeds", "1", "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed["correct"] is True
    assert set(printed) >= {"correct", "max_abs_diff", "max_rel_diff", "details"}
    assert json.loads(out.read_text()) == printed
    assert [p.name for p in out.parent.iterdir()] == ["verify.json"]  # no temporary file left behind
    # each case is named on stderr before it runs: a kernel that crashes the process (a store far out of bounds
    # segfaulted a fresh user's verify with nothing printed) leaves the case it crashed in on the screen
    said = [line for line in res.stderr.splitlines() if line.startswith("verify: ")]
    assert said[0] == "verify: seed 0 (get_inputs()) ..." and len(said) == len(printed["shapes"]) - sum(
        e["status"].startswith(("skipped", "not run")) for e in printed["shapes"])


def test_cli_verify_broken_exits_nonzero():
    res = runner.invoke(app, ["verify", str(KERNELS / "broken_mask.py")])
    assert res.exit_code == 1
    printed = json.loads(res.stdout)
    assert printed["correct"] is False
    assert any("unwritten" in d for d in printed["details"])
    assert "element-wise maxima" in printed["diffs_note"]  # what max_rel_diff is, beside a verdict it does not make


def test_cli_verify_explicit_tolerances_are_used():
    res = runner.invoke(app, ["verify", str(KERNELS / "vector_add.py"), "--seeds", "1", "--rtol", "0", "--atol", "0"])
    # x + y in fp32 against float64: rounding differences exist, so zero tolerance must fail.
    assert res.exit_code == 1
    printed = json.loads(res.stdout)
    assert printed["atol"] == 0 and printed["rtol"] == 0
    assert any("atol 0, rtol 0" in d for d in printed["details"])


# --- refusing unusable files --------------------------------------------------------------------------------


def _assert_clean_error(res, *fragments, code=2):
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    flat = " ".join(res.stderr.split())  # the console wraps long lines
    for fragment in fragments:
        assert fragment in flat, flat
    assert res.stdout == ""


def test_cli_missing_contract():
    path = KERNELS / "no_contract.py"
    res = runner.invoke(app, ["verify", str(path)])
    _assert_clean_error(res, str(path), "reference_fn", "get_inputs")
    assert "kernel_fn," not in res.stderr.split("not defined")[0]  # kernel_fn is there: not named as missing


def test_cli_missing_file(tmp_path):
    path = tmp_path / "nope.py"
    _assert_clean_error(runner.invoke(app, ["verify", str(path)]), str(path), "no such file")
    _assert_clean_error(runner.invoke(app, ["bench", str(path)]), str(path), "no such file")


def test_cli_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad_syntax.py"
    path.write_text("import torch\n\ndef kernel_fn(x)\n    return x\n")
    _assert_clean_error(runner.invoke(app, ["verify", str(path)]), f"{path}:3", "syntax error")


def test_cli_import_error_names_file_and_line(tmp_path):
    path = tmp_path / "raises.py"
    path.write_text("import torch\n\nraise RuntimeError('boom at import')\n")
    _assert_clean_error(runner.invoke(app, ["verify", str(path)]), f"{path}:3", "RuntimeError", "boom at import")


def test_cli_unknown_module_name():
    res = runner.invoke(app, ["verify", "no_such_kernel_xyz"])
    _assert_clean_error(res, "no_such_kernel_xyz", "no such kernel file or module", "kernel_library.no_such_kernel_xyz")


def test_cli_debug_shows_the_exception():
    res = runner.invoke(app, ["verify", str(KERNELS / "no_contract.py"), "--debug"])
    assert res.exit_code != 0
    assert isinstance(res.exception, ContractError)


def test_load_contract_module_names(tmp_path, monkeypatch):
    pkg = tmp_path / "my_kernels_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "double.py").write_text(
        "import torch\n"
        "def kernel_fn(x):\n    return x * 2\n"
        "def reference_fn(x):\n    return x + x\n"
        "def get_inputs():\n    return [torch.randn(5)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    c = load_contract("my_kernels_pkg.double")
    assert c.name == "double" and c.path == pkg / "double.py"
    assert verify_kernel(c, seeds=1).correct
    with pytest.raises(KernelLoadError, match="kernel_library kernels") as err:
        load_contract("no_such_kernel_xyz")
    listed = str(err.value).split("kernel_library kernels: ")[1].split(";")[0].split(", ")
    assert "rmsnorm" in listed and "sweeps" not in listed  # only names `verify NAME` can check
    assert "masked_softmax" in listed  # a registry entry of another module's (the list named modules alone)


def test_load_contract_imports_a_file_once():
    # Importing a file twice would register its torch.library op twice (which raises).
    a = load_contract(KERNELS / "vector_add.py")
    b = load_contract(str(KERNELS / "vector_add.py"))
    assert a.module is b.module
    assert a.name == "vector_add"


def test_get_inputs_must_return_a_list():
    c = contract(lambda x: x, lambda x: x, lambda: torch.randn(3))
    with pytest.raises(ContractError, match="get_inputs"):
        verify_kernel(c)


# --- poisoning, mutation, dtypes ----------------------------------------------------------------------------


def _all_but_last_empty_like(x):
    out = torch.empty_like(x)
    out[:-1] = x[:-1] * 2
    return out


def _all_but_last_new_empty(x):
    out = x.new_empty(x.shape)
    out[:-1] = x[:-1] * 2
    return out


def _all_but_last_empty_strided(x):
    out = torch.empty_strided(x.shape, (1,), dtype=x.dtype)
    out[:-1] = x[:-1] * 2
    return out


def _all_but_last_empty(x):
    out = torch.empty(x.shape, dtype=x.dtype)
    out[:-1] = x[:-1] * 2
    return out


@pytest.mark.parametrize(
    "kernel", [_all_but_last_empty, _all_but_last_empty_like, _all_but_last_new_empty, _all_but_last_empty_strided]
)
def test_unwritten_element_is_poisoned(kernel):
    result = verify_kernel(contract(kernel, lambda x: x * 2, lambda: [torch.randn(64)]), seeds=1)
    assert not result.correct
    assert any("unwritten" in d and "(63,)" in d for d in result.details), result.details


def test_unwritten_integer_element_shows_the_sentinel():
    def kernel(x):
        out = torch.empty(x.shape, dtype=torch.int64)
        out[:-1] = x[:-1].to(torch.int64)
        return out

    result = verify_kernel(contract(kernel, lambda x: x.to(torch.int64), lambda: [torch.arange(10)]), seeds=1)
    assert not result.correct
    assert any(str(poison_value(torch.int64)) in d and "unwritten" in d for d in result.details), result.details


def test_poison_enters_custom_ops():
    @torch.library.custom_op("fusion_advisor_tests::partial_double", mutates_args=())
    def partial_double(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        out[:-1] = x[:-1] * 2
        return out

    mode = PoisonAllocations()
    with mode:
        out = partial_double(torch.ones(8))
    assert "fusion_advisor_tests::partial_double" in mode.entered_custom_ops
    assert mode.poisoned == 1
    assert torch.isnan(out[-1]) and torch.equal(out[:-1], torch.full((7,), 2.0))
    result = verify_kernel(contract(partial_double, lambda x: x * 2, lambda: [torch.randn(8)]), seeds=1)
    assert not result.correct and any("unwritten" in d for d in result.details)


def test_mutating_kernel_is_reported():
    def kernel(x, y):
        out = x + y
        x.mul_(0.5)  # the output is right, but the caller's input is changed
        return out

    result = verify_kernel(contract(kernel, lambda x, y: x + y, two_vectors()), seeds=1)
    assert not result.correct
    assert any("input 0 (x) was modified in place by kernel_fn" in d for d in result.details), result.details
    assert not any("input 1" in d and "modified" in d for d in result.details)


def test_kernel_that_raises_is_reported_not_raised():
    def kernel(x, y):
        raise ValueError("kernel exploded")

    result = verify_kernel(contract(kernel, lambda x, y: x + y, two_vectors()), seeds=2)
    assert not result.correct
    assert any("ValueError: kernel exploded" in d for d in result.details)
    assert result.traceback is not None and "kernel exploded" in result.traceback
    # nothing was compared: the headline says so instead of "against reference_fn in n/a"
    assert "n/a" not in result.details[0]
    assert "kernel_fn raised before its outputs could be compared" in result.details[0]


def test_output_dtype_must_match_reference():
    result = verify_kernel(
        contract(lambda x: (x.float() * 2), lambda x: x * 2, lambda: [torch.randn(16, dtype=torch.bfloat16)]), seeds=1
    )
    assert not result.correct
    assert any("dtype float32, reference_fn returns bfloat16" in d for d in result.details), result.details


def test_reference_falls_back_to_input_dtype():
    def reference(x):
        if x.dtype == torch.float64:
            raise TypeError("float32 only")
        return x * 3

    result = verify_kernel(contract(lambda x: x * 3, reference, lambda: [torch.randn(16)]), seeds=2)
    assert result.correct, result.details
    assert result.reference_precision == "input dtypes"
    assert any("failed in float64" in d and "float32 only" in d for d in result.details)


def test_a_reference_that_fails_in_float64_leaves_no_tensor_in_a_reference_cycle():
    """The float64 attempt's exception, kept for its message, held check_case's frame and every tensor in it in a
    cycle the collector alone frees: on a GPU that memory (54 GiB after a 4096 x 393216 softmax's float64 copy ran
    out of memory) stayed allocated into the next checks."""
    import gc

    from fusion_advisor.verification.kernel import check_case

    def reference(x):
        if x.dtype == torch.float64:
            raise MemoryError("no room for float64")
        return x * 3

    def never(x):
        raise MemoryError("no room at all")

    from fusion_advisor.verification.kernel import ReferenceFailed

    def left_in_cycles(run) -> list[torch.Tensor]:
        """The tensors ``run`` leaves in cycles only the collector frees. Tensors alive before it are held here, so
        ones another test left behind (under pytest-xdist, fake tensors a cache lets go mid-run) are never counted."""
        gc.collect()
        alive_before = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
        gc.disable()
        try:
            run()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            return [o for o in gc.garbage if isinstance(o, torch.Tensor)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            del alive_before

    def falls_back():
        outcome = check_case("case", lambda x: x * 3, reference, [torch.randn(64, 64)])
        assert outcome.ok and outcome.reference == "input dtypes"

    def fails():  # neither the reference nor the eager computation runs (pytest.raises would keep a cycle of its own)
        try:
            check_case("case", lambda x: x * 3, never, [torch.randn(64, 64)])
        except ReferenceFailed as e:
            assert isinstance(e.original, MemoryError) and "no room at all" in str(e)
        else:
            raise AssertionError("check_case did not raise ReferenceFailed")

    assert left_in_cycles(falls_back) == []
    assert left_in_cycles(fails) == []


def test_a_kernel_that_ignores_its_inputs_strides_fails_the_strided_case():
    """A kernel reading its input as if contiguous passed every case when get_inputs returned contiguous tensors
    (a new user's kernel, wrong only for a transposed or sliced input); the strided case hands it views at offset 1
    with stride 2, the gaps NaN."""
    from fusion_advisor.verification.inputs import STRIDED_CASE, strided_copy

    def as_if_contiguous(x, w):
        dense = torch.as_strided(x, x.shape, (x.shape[1], 1), x.storage_offset())
        return torch.relu(dense) + w

    c = contract(as_if_contiguous, lambda x, w: torch.relu(x) + w, lambda: [torch.randn(8, 16), torch.randn(16)])
    result = verify_kernel(c)
    assert not result.correct and result.failure.startswith(STRIDED_CASE), result.failure
    assert [e["status"] for e in result.shapes if e["case"] != STRIDED_CASE] == ["passed"] * (len(result.shapes) - 1)
    # the failure says the usual cause and the ways out (a fresh user's read only "MISMATCH", and bench --sweep,
    # on contiguous inputs, passed the same kernel)
    from fusion_advisor.kernel_tools.verify import STRIDED_HINT

    assert f"{STRIDED_CASE}: {STRIDED_HINT}" in result.details and ".contiguous()" in STRIDED_HINT
    right = contract(lambda x, w: torch.relu(x) + w, lambda x, w: torch.relu(x) + w,
                     lambda: [torch.randn(8, 16, requires_grad=True), torch.randn(16)])
    assert verify_kernel(right).correct
    t = strided_copy(torch.arange(6.0).reshape(2, 3))
    assert t.stride() == (7, 2) and t.storage_offset() == 1 and torch.equal(t, torch.arange(6.0).reshape(2, 3))

    class Contiguous(torch.autograd.Function):  # its backward refuses what it saved: refused there too
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            if not x.is_contiguous():
                raise NotImplementedError("the backward takes contiguous x only")
            return g * 2

    refuses = contract(Contiguous.apply, lambda x: x * 2, lambda: [torch.randn(4, 8, requires_grad=True)])
    result = verify_kernel(refuses)
    assert result.correct and [e["status"] for e in result.shapes if e["case"] == STRIDED_CASE] == ["refused"]
    assert any("the backward of kernel_fn raised NotImplementedError" in d and "refused" in d for d in result.details)


def test_tuple_and_scalar_outputs():
    def kernel(x):
        return x * 2, (x.sum().item(), x.shape[0])

    def reference(x):
        return [x * 2, [x.sum(), x.shape[0]]]  # lists vs tuples, tensor vs Python float: same structure

    assert verify_kernel(contract(kernel, reference, lambda: [torch.randn(10)]), seeds=1).correct

    def kernel_bad(x):
        return x * 2, (x.sum().item() + 1.0, x.shape[0])

    bad = verify_kernel(contract(kernel_bad, reference, lambda: [torch.randn(10)]), seeds=1)
    assert not bad.correct and any("output[1][0]: MISMATCH" in d for d in bad.details), bad.details


# --- gradients ----------------------------------------------------------------------------------------------


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class _SquareWrongBackward(_Square):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x  # wrong: d(x^2)/dx is 2x


def _grad_inputs():
    return [torch.randn(4, 33, requires_grad=True)]


def test_gradients_are_checked():
    result = verify_kernel(contract(_Square.apply, lambda x: x * x, _grad_inputs), seeds=2)
    assert result.correct, result.details
    assert result.backward_checked and result.grad_max_abs_diff is not None
    assert any(d.startswith("seed 1: grad of input 0 (x): ok") for d in result.details)


def test_wrong_backward_is_caught():
    result = verify_kernel(contract(_SquareWrongBackward.apply, lambda x: x * x, _grad_inputs), seeds=2)
    assert not result.correct
    assert result.backward_checked
    assert any(d.startswith("seed 0: grad of input 0 (x): MISMATCH") for d in result.details), result.details
    assert any("worst at index" in d for d in result.details)


class _ScaleRows(torch.autograd.Function):
    """y = x * w; dw sums over many bf16 rows, so its rounding exceeds any fixed bf16 tolerance."""

    factor = 1.0

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        dw = (g.float() * x.float()).sum(0) * _ScaleRows.factor
        return g * w, dw.to(w.dtype)


def _bf16_row_inputs():
    return [torch.randn(512, 64, dtype=torch.bfloat16, requires_grad=True),
            torch.randn(64, dtype=torch.bfloat16, requires_grad=True)]


def test_low_precision_reduction_gradient_judged_against_eager_error(monkeypatch):
    ok = verify_kernel(contract(_ScaleRows.apply, lambda x, w: x * w, _bf16_row_inputs), seeds=2)
    assert ok.correct, ok.details
    monkeypatch.setattr(_ScaleRows, "factor", 1.05)  # a 5% error in dw is far beyond eager's own rounding
    bad = verify_kernel(contract(_ScaleRows.apply, lambda x, w: x * w, _bf16_row_inputs), seeds=1)
    assert not bad.correct
    # the policy: dw is judged norm-wise and max-wise against eager bf16's own error, which a 5% error exceeds
    assert any("grad of input 1 (w): MISMATCH" in d and "beyond the limits" in d for d in bad.details), bad.details


def test_kernel_without_autograd_is_reported():
    result = verify_kernel(contract(lambda x: x.detach() ** 2, lambda x: x * x, _grad_inputs), seeds=1)
    assert not result.correct
    assert any("does not require grad" in d for d in result.details), result.details


def test_unwritten_gradient_is_poisoned():
    class PartialGrad(_Square):
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            dx = torch.empty_like(x)
            dx[:, :-1] = 2 * g[:, :-1] * x[:, :-1]
            return dx

    result = verify_kernel(contract(PartialGrad.apply, lambda x: x * x, _grad_inputs), seeds=1)
    assert not result.correct
    assert any("grad of input 0 (x)" in d and "unwritten" in d for d in result.details), result.details


# --- compare_outputs ----------------------------------------------------------------------------------------


def test_compare_nan_and_inf_rules():
    nan, inf = math.nan, math.inf
    e = torch.tensor([1.0, nan, inf, -inf])
    assert compare_outputs(torch.tensor([1.0, nan, inf, -inf]), e)[0]  # same specials at the same places pass
    ok, max_abs, _, details = compare_outputs(torch.tensor([nan, nan, inf, -inf]), e)
    assert not ok and max_abs == inf and any("NaN where the reference is not" in d for d in details)
    ok, _, _, details = compare_outputs(torch.tensor([1.0, 0.0, inf, -inf]), e)
    assert not ok and any("differ in NaN/inf" in d for d in details)  # kernel finite where the reference is NaN
    assert not compare_outputs(torch.tensor([1.0, nan, -inf, -inf]), e)[0]  # wrong-signed infinity
    assert not compare_outputs(torch.tensor([1.0, nan, 1e30, -inf]), e)[0]  # finite where inf expected


def test_compare_reports_worst_index_and_values():
    expected = torch.zeros(3, 4, dtype=torch.float64)
    actual = torch.zeros(3, 4)
    actual[1, 2] = 0.5
    actual[2, 3] = 0.25
    ok, max_abs, max_rel, details = compare_outputs(actual, expected)
    assert not ok and max_abs == 0.5
    assert any("2 elements outside tolerance" in d and "(1, 2)" in d and "kernel 0.5" in d for d in details), details


def test_compare_works_a_chunk_at_a_time_and_says_the_same(monkeypatch):
    """Element-wise comparison in float64 a chunk at a time: the same verdict, counts, worst element and first
    NaN as over the whole tensor (whole-tensor float64 copies of a 1.6 G-element output ran an H100 out of memory)."""
    import fusion_advisor.verification.policy as policy

    g = torch.Generator().manual_seed(0)
    e = torch.randn(7, 13, generator=g, dtype=torch.float64)
    a = e.float().clone()
    a[1, 2], a[5, 11], a[6, 0] = a[1, 2] + 0.5, a[5, 11] + 2.0, a[6, 0] + 0.1  # the worst in a later chunk
    a[3, 3], a[4, 7] = math.nan, math.inf
    whole = compare_outputs(a, e)
    monkeypatch.setattr(policy, "JUDGE_CHUNK", 10)

    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):  # the most elements of a float64 tensor any op returns
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype == torch.float64 \
                        and t.untyped_storage().data_ptr() != e.untyped_storage().data_ptr():  # not a view of e
                    Largest.most = max(Largest.most, t.numel())
            return out

    with Largest():
        chunked = compare_outputs(a, e)
    assert Largest.most <= 10  # no float64 temporary beyond a chunk
    assert chunked == whole and not whole[0] and whole[1] == math.inf
    assert any("3 elements outside tolerance; worst at index (5, 11)" in d for d in whole[3]), whole[3]
    assert any("1 elements are NaN where the reference is not (first at index (3, 3)" in d for d in whole[3])


def test_complex_outputs_are_compared_as_real_pairs_without_a_whole_complex128_copy(monkeypatch):
    import fusion_advisor.verification.policy as policy

    g = torch.Generator().manual_seed(0)
    e = torch.randn(6, 5, generator=g, dtype=torch.complex128)
    a = e.to(torch.complex64)
    assert compare_outputs(a, e)[0] and compare_outputs(a.conj(), e.conj())[0]
    a[2, 3] += 0.5j  # the imaginary part alone off
    ok, _, _, details = compare_outputs(a, e)
    assert not ok and any("1 elements outside tolerance; worst at index (2, 3, 1)" in d for d in details), details
    assert not compare_outputs(e.real.clone(), e)[0] and compare_outputs(e.real.clone(), e.real.to(torch.complex128))[0]

    monkeypatch.setattr(policy, "JUDGE_CHUNK", 8)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):  # the most elements of a complex128 or float64 tensor any op returns
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype in (torch.complex128, torch.float64) \
                        and t.untyped_storage().data_ptr() != e.untyped_storage().data_ptr():  # not a view of e
                    Largest.most = max(Largest.most, t.numel())
            return out

    with Largest():
        chunked = compare_outputs(a, e)
    assert Largest.most <= 8 and chunked == (ok, *chunked[1:3], details)


def test_compare_tolerances_by_dtype():
    e = torch.linspace(1, 2, 50, dtype=torch.float64)
    a = (e * (1 + 5e-3)).to(torch.bfloat16)  # inside bf16's table (rtol 1.6e-2), far outside fp32's
    assert compare_outputs(a, e)[0]
    assert not compare_outputs(a, e, atol=1e-4, rtol=1e-4)[0]
    assert not compare_outputs(a.float(), e)[0]


def test_compare_structure_and_scalars():
    x = torch.ones(3)
    assert compare_outputs((x, 2), [x.double(), 2])[0]
    assert not compare_outputs((x, 2), (x, 3))[0]  # ints exact
    assert not compare_outputs((x,), (x, x))[0]
    ok, _, _, details = compare_outputs(torch.ones(3), torch.ones(4))
    assert not ok and "shape [3], reference shape [4]" in details[0]
    assert compare_outputs(1.0 + 1e-7, 1.0)[0] and not compare_outputs(1.1, 1.0)[0]
    assert compare_outputs(None, None)[0] and not compare_outputs(None, x)[0]
    assert compare_outputs(torch.empty(0, 5), torch.empty(0, 5))[0]


def test_a_store_past_the_end_of_an_output_is_caught_by_the_redzone():
    # the values are right; only the poisoned guard memory after the allocation shows the off-by-one store
    result = verify_kernel(load_contract(KERNELS / "oob_store.py"), seeds=1)
    assert not result.correct
    assert any("out-of-bounds store" in d and "1 element(s) after its end" in d for d in result.details), \
        result.details


def test_redzones_keep_allocations_aligned_and_leave_correct_kernels_alone():
    with PoisonAllocations() as mode:
        y = torch.empty(3, 5, dtype=torch.bfloat16)
        z = torch.empty_like(y).t()
    assert torch.isnan(y).all() and y.data_ptr() % 16 == 0 and z.data_ptr() % 16 == 0
    y.fill_(1.0)
    assert mode.redzone_violations() == []
    result = verify_kernel(load_contract(KERNELS / "vector_add.py"), seeds=1)
    assert result.correct, result.details


def test_registry_name_in_another_module_says_whose_contract_is_checked(monkeypatch):
    # `verify masked_softmax` checks kernel_library.softmax's contract_for('masked_softmax') (a mask and a scale),
    # and says so; a module without a contract of the entry's own runs its one contract and must say that rather
    # than print "softmax: correct" as the answer to a question about masked_softmax.
    from kernel_library import softmax

    c = load_contract("masked_softmax")
    assert c.name == "masked_softmax" and "contract_for('masked_softmax')" in c.note
    assert load_contract("softmax").note == ""
    res = runner.invoke(app, ["verify", "masked_softmax", "--seeds", "1"])
    assert res.exit_code == 0, res.output
    details = json.loads(res.stdout)["details"]
    assert details[1].startswith("note: 'masked_softmax' is registered in kernel_library.softmax")
    monkeypatch.setattr(softmax, "contract_for", lambda name: None)
    c = load_contract("masked_softmax")
    assert c.name == "softmax" and "not 'masked_softmax' on its own" in c.note


# --- the error policy on real bug classes -------------------------------------------------------------------

CE_BUG = KERNELS / "ce_bf16_grad_rounding.py"


def _ce_variant(**kw):
    c = load_contract(CE_BUG)
    return dataclasses.replace(c, kernel_fn=c.module.make_kernel(**kw))


def test_bf16_cross_entropy_that_rounds_the_true_class_gradient_is_rejected():
    c = load_contract(CE_BUG)
    torch.manual_seed(0)
    logits, target = c.get_inputs()
    (g,) = torch.autograd.grad(c.kernel_fn(logits, target), logits)
    l64 = logits.detach().double().requires_grad_(True)
    (g64,) = torch.autograd.grad(c.reference_fn(l64, target), l64)
    # the bug as reported: at p = 0.999 the true-class gradient is far from float64's -2.5e-4 (0 on a GPU, where
    # bf16 rounds to nearest; -9.8e-4 under the interpreter, which truncates) ...
    assert abs(float(g64[0, target[0]]) + 2.5e-4) < 2e-5
    assert abs(float(g[0, target[0]]) - float(g64[0, target[0]])) > 0.5 * abs(float(g64[0, target[0]]))
    # ... yet inside bf16's element-wise table (atol 2e-2): the old check passed it
    assert compare_outputs(g, g64)[0]
    result = verify_kernel(c, seeds=1)
    assert not result.correct
    assert result.failure.startswith("seed 0: grad of input 0 (logits): MISMATCH"), result.failure
    assert f"index (0, {int(target[0])})" in result.failure  # the worst element: row 0's true class


@pytest.mark.parametrize("variant,what", [({"grad_scale": 3.0, "round_before_subtract": False}, "grad of input 0"),
                                          ({"loss_scale": 0.3, "round_before_subtract": False}, "output")])
def test_scaled_bf16_cross_entropy_variants_are_rejected(variant, what):
    c = _ce_variant(**variant)
    torch.manual_seed(0)
    logits, target = c.get_inputs()
    loss = c.kernel_fn(logits, target)
    l64 = logits.detach().double().requires_grad_(True)
    ref = c.reference_fn(l64, target)
    if what == "output":  # a loss of ~0.016 x 0.3 sits inside bf16's atol of 2e-2
        assert compare_outputs(loss, ref)[0]
    else:  # gradients of ~1e-3 x 3 too
        assert compare_outputs(torch.autograd.grad(loss, logits)[0], torch.autograd.grad(ref, l64)[0])[0]
    result = verify_kernel(c, seeds=1)
    assert not result.correct and f"seed 0: {what}" in result.failure and "MISMATCH" in result.failure


def test_the_correct_bf16_cross_entropy_verifies():
    result = verify_kernel(_ce_variant(round_before_subtract=False))
    assert result.correct, result.failure
    assert result.backward_checked


# --- more than one shape ------------------------------------------------------------------------------------


def _cases_by_status(result):
    return {s["case"]: s["status"] for s in result.shapes}


def test_a_kernel_wrong_only_at_a_partial_last_block_is_rejected():
    c = load_contract(KERNELS / "partial_block_bug.py")
    assert verify_kernel(c, shapes="given").correct  # get_inputs() and SIZES: whole blocks only
    result = verify_kernel(c)
    assert not result.correct
    assert result.failure.startswith("shape partial last block: output: MISMATCH"), result.failure
    status = _cases_by_status(result)
    assert status["shape one row"] == "passed" and status["shape partial last block"] == "FAILED"
    assert next(s for s in result.shapes if s["case"] == "shape partial last block")["inputs"] == \
        "input 0 (x) [3, 257] float32"


def test_a_kernel_that_leaves_rows_past_1000_unwritten_is_rejected():
    c = load_contract(KERNELS / "rows_past_1000_bug.py")
    assert verify_kernel(c, shapes="given").correct  # get_inputs() gives 64 rows
    result = verify_kernel(c)
    assert not result.correct
    assert result.failure.startswith("shape 1025 rows: output: MISMATCH in 75 of 3075"), result.failure
    assert "first at index (1000, 0)" in result.failure and "unwritten" in result.failure


def test_rows_past_the_grid_axis_limit_run_with_shapes_all():
    c = load_contract(KERNELS / "rows_on_grid_axis1.py")
    default = verify_kernel(c, seeds=1)
    assert default.correct  # right on every shape the interpreter runs by default ...
    skipped = _cases_by_status(default)["shape 65537 rows (over 65535)"]
    assert skipped.startswith("skipped:") and "--shapes all" in skipped  # ... and it says what it left out
    assert "shape 65537 rows (over 65535)" in default.details[1]
    result = verify_kernel(c, seeds=1, shapes="all")
    assert not result.correct
    assert "GridLimitError" in result.failure and "65537 programs on grid axis 1" in result.failure
    ok = verify_kernel(load_contract(KERNELS / "sweep_add.py"), seeds=1, shapes="all")
    assert ok.correct and _cases_by_status(ok)["shape over 65535 elements"] == "passed"
    # sweep_add takes contiguous tensors only, and says so: the strided case is refused, not failed
    assert _cases_by_status(ok)[STRIDED_CASE] == "refused"
    assert any(d.startswith(f"{STRIDED_CASE}: kernel_fn raised ValueError: sweep_add: x and y must be contiguous")
               and d.endswith("refused, not a wrong answer (callers must pass the layouts it takes)")
               for d in ok.details), ok.details


def test_cli_verify_reports_the_shapes_it_ran():
    res = runner.invoke(app, ["verify", str(KERNELS / "partial_block_bug.py"), "--seeds", "1"])
    assert res.exit_code == 1
    printed = json.loads(res.stdout)
    assert {"case", "size", "inputs", "status"} <= set(printed["shapes"][0])
    assert any(s["case"] == "shape partial last block" and s["status"] == "FAILED" for s in printed["shapes"])
    res = runner.invoke(app, ["verify", str(KERNELS / "partial_block_bug.py"), "--shapes", "given"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["verify", str(KERNELS / "vector_add.py"), "--shapes", "some"])
    assert res.exit_code == 2 and "--shapes some" in res.stderr


def test_the_interpreters_float_warnings_are_quiet_but_an_integer_overflow_is_not():
    # a new user's `bench softmax` printed a bare "RuntimeWarning: overflow encountered in multiply" from Triton's
    # emulation of verify's hard values; an int32 offset wrapping ("... in scalar multiply") must still be seen
    import warnings

    from fusion_advisor.kernel_tools import verify as verify_mod

    def raised(message: str) -> bool:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            verify_mod._quiet_interpreter_arithmetic()
            warnings.warn_explicit(message, RuntimeWarning, "interpreter.py", 1, module="triton.runtime.interpreter")
        return bool(seen)

    assert not raised("overflow encountered in multiply")
    assert not raised("invalid value encountered in exp")
    assert raised("overflow encountered in scalar multiply")


def test_the_tolerance_help_quotes_the_dtype_table():
    # a fresh user's --rtol 0.1 failed on "atol 0.02" from a table the help did not mention
    import torch

    from fusion_advisor.cli import _TOL_HELP
    from fusion_advisor.verification.policy import TOLERANCES

    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        atol, rtol = TOLERANCES[dtype]
        assert f"{name} {atol:g}, {rtol:g}" in _TOL_HELP
