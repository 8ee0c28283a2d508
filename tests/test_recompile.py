"""Tests of fusion_advisor.kernel_tools.recompile: Triton specialization diffs, the compile hook, and dynamo recompiles.

No GPU here, so Triton compiles nothing: the cause-diffing logic is tested on compile infos written in the form
Triton hands its ``jit_post_compile_hook`` (``signature`` name -> type, ``constants`` path -> value,
``configs[0]`` path -> ``[["tt.divisibility", 16]]``), and the hook path on a stand-in ``JitFunctionInfo``. The
GPU test at the end provokes real recompilations (value 1, divisibility, an offset view). Dynamo runs on CPU with
``backend="eager"`` (no Inductor compile: fast).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fusion_advisor.kernel_tools import recompile as rc
from fusion_advisor.kernel_tools.recompile import (
    RecompileWatch,
    clean_guard_reason,
    diff_variants,
    explain_compile,
    record_triton_compile,
    summarize,
    variant_from_compile,
)

DIV16 = [["tt.divisibility", 16]]
SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32", "BLOCK_SIZE": "constexpr"}


def _variant(signature=None, constants=None, attrs=None, options=None):
    """A copy-kernel variant: both pointers aligned, n_rows=17, n_cols divisible by 16, BLOCK_SIZE=1024."""
    sig = dict(SIGNATURE if signature is None else signature)
    consts = {(4,): 1024} if constants is None else constants
    att = {(0,): DIV16, (1,): DIV16, (3,): DIV16} if attrs is None else attrs
    return variant_from_compile("k.copy", sig, consts, att, options or {"num_warps": 4, "num_stages": 3},
                                declared_constexpr=["BLOCK_SIZE"])


def test_variant_reads_signature_constants_and_attributes():
    v = _variant()
    assert list(v.params) == list(SIGNATURE)
    assert v.params["x_ptr"].describe() == "*fp32, 16-byte aligned"
    assert v.params["n_rows"].describe() == "i32, not divisible by 16"
    assert v.params["n_cols"].describe() == "i32, divisible by 16"
    assert v.params["BLOCK_SIZE"].describe() == "constexpr 1024"
    assert v.options == {"num_warps": 4, "num_stages": 3}


def test_same_specialization_has_no_diff():
    assert diff_variants(_variant(), _variant()) == []


def test_int_equal_to_one_is_named_with_do_not_specialize():
    one = _variant(signature={**SIGNATURE, "n_rows": "constexpr"}, constants={(2,): 1, (4,): 1024})
    causes = diff_variants(_variant(), one)
    assert len(causes) == 1
    assert causes[0].startswith("n_rows: i32, not divisible by 16 -> == 1 (specialized to the constant 1)")
    assert "do_not_specialize" in causes[0]


def test_int_divisibility_change_is_named():
    odd_cols = _variant(attrs={(0,): DIV16, (1,): DIV16})
    (cause,) = diff_variants(_variant(), odd_cols)
    assert cause.startswith("n_cols: i32, divisible by 16 -> i32, not divisible by 16")
    assert "vectorized loads" in cause


def test_pointer_alignment_from_an_offset_view_is_named():
    offset = _variant(attrs={(1,): DIV16, (3,): DIV16})
    (cause,) = diff_variants(_variant(), offset)
    assert cause.startswith("x_ptr: *fp32, 16-byte aligned -> *fp32, not 16-byte aligned")
    assert "offset view" in cause and "do_not_specialize_on_alignment" in cause


def test_dtype_int_width_constexpr_and_options():
    bf16 = _variant(signature={**SIGNATURE, "x_ptr": "*bf16", "out_ptr": "*bf16"})
    assert [c.split(":")[0] for c in diff_variants(_variant(), bf16)] == ["x_ptr", "out_ptr"]
    assert "dtype" in diff_variants(_variant(), bf16)[0]
    wide = _variant(signature={**SIGNATURE, "n_rows": "i64"})
    assert "2**31" in diff_variants(_variant(), wide)[0]
    block = _variant(constants={(4,): 2048}, options={"num_warps": 8, "num_stages": 3})
    causes = diff_variants(_variant(), block)
    assert causes[0].startswith("BLOCK_SIZE: constexpr 1024 -> constexpr 2048") and "by design" in causes[0]
    assert causes[1].startswith("num_warps: 4 -> 8")


def test_explain_picks_the_closest_earlier_variant():
    base = _variant()
    other = _variant(signature={**SIGNATURE, "x_ptr": "*bf16", "out_ptr": "*bf16"}, attrs={(0,): DIV16})
    new = _variant(attrs={(1,): DIV16, (3,): DIV16})  # base with x_ptr misaligned
    recompile, cause, changed = explain_compile(new, [other, base])
    assert recompile and len(changed) == 1 and cause == changed[0] and cause.startswith("x_ptr")
    assert explain_compile(new, []) == (False, "first compilation of k.copy in this process", [])


def _fake_compiled(variant_sig, constants, attrs, num_warps=4):
    return SimpleNamespace(src=SimpleNamespace(signature=variant_sig, constants=constants, attrs=attrs),
                           metadata=SimpleNamespace(num_warps=num_warps, num_stages=3, num_ctas=1))


def _fake_jit(cache: dict):
    """Stand-in JITFunction: device_caches[device] = (kernel_cache, ...) as in Triton 3.6 and 3.9."""
    return SimpleNamespace(device_caches={0: (cache, "target", "backend", "binder")},
                           arg_names=list(SIGNATURE), constexprs=[4])


def test_hook_compares_with_the_kernel_cache(monkeypatch):
    monkeypatch.setattr(rc, "_seen", {})
    cache = {"old": _fake_compiled(SIGNATURE, {(4,): 1024}, {(0,): DIV16, (1,): DIV16, (3,): DIV16})}
    fn = SimpleNamespace(module="k", name="copy", jit_function=_fake_jit(cache))
    new_attrs = {(0,): DIV16, (1,): DIV16}  # n_cols no longer divisible by 16
    cache["new"] = _fake_compiled(SIGNATURE, {(4,): 1024}, new_attrs)  # Triton caches it before the hook
    events: list = []
    record_triton_compile(events, "new", fn, {"signature": SIGNATURE, "constants": {(4,): 1024},
                                              "configs": [new_attrs], "device": 0, "num_warps": 4,
                                              "num_stages": 3, "num_ctas": 1})
    (e,) = events
    assert e.kind == "triton" and e.name == "k.copy" and e.recompile
    assert e.changed == (e.cause,) and e.cause.startswith("n_cols: i32, divisible by 16 -> i32, not divisible")


def test_hook_with_unreadable_info_still_counts(monkeypatch):
    monkeypatch.setattr(rc, "_seen", {})
    events: list = []
    record_triton_compile(events, "k", SimpleNamespace(module="m", name="f", jit_function=None), {})
    assert len(events) == 1 and events[0].cause.startswith("cause unknown (could not read the compile info")


def test_hook_called_by_inductor_with_a_compiled_kernel():
    """torch._inductor (TORCHINDUCTOR_RUN_JIT_POST_COMPILE_HOOK=1) passes its CompiledKernel, not a dict."""
    events: list = []
    record_triton_compile(events, "hash", SimpleNamespace(), SimpleNamespace(name="triton_poi_fused_add_0"))
    (e,) = events
    assert e.name == "triton_poi_fused_add_0" and "Inductor-generated kernel" in e.cause


def test_watch_installs_chains_and_restores_the_triton_hook(monkeypatch):
    knobs = pytest.importorskip("triton.knobs")
    monkeypatch.setattr(rc, "_interpreted", lambda: False)
    monkeypatch.setattr(rc, "_seen", {})
    calls = []

    def user_hook(**kwargs):
        calls.append(kwargs["key"])

    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", user_hook)
    fn = SimpleNamespace(module="k", name="copy", jit_function=_fake_jit({}))
    info = {"signature": SIGNATURE, "constants": {(4,): 1024}, "configs": [{}], "device": 0}
    with RecompileWatch(dynamo=False) as watch:
        assert knobs.runtime.jit_post_compile_hook is not user_hook
        knobs.runtime.jit_post_compile_hook(key="a", repr="", fn=fn, compile=info, is_manual_warmup=False,
                                            already_compiled=False)
    assert knobs.runtime.jit_post_compile_hook is user_hook and calls == ["a"]
    r = watch.report
    assert r.triton_counted and r.triton_compiles == 1 and r.events[0].recompile is False
    assert r.dynamo_compiles is None and r.dynamo_note == "not watched"


def test_triton_is_not_counted_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with RecompileWatch() as watch:
        pass
    d = watch.report.to_dict()
    assert d["triton_compiles"] is None and d["triton_note"] == rc.TRITON_INTERPRETED_NOTE
    assert "not counted under the Triton interpreter" in d["triton_note"]
    assert d["dynamo_compiles"] == 0 and d["events"] == []


def test_clean_guard_reason():
    raw = ("0/0: scale_count == 0                                   #   # <string>:4 in f\n"
           "User stack trace:\n  File \"<string>\", line 4, in f")
    assert clean_guard_reason(raw) == "scale_count == 0 (guard of compile 0/0, at <string>:4 in f)"
    assert clean_guard_reason("0/1: tensor 'x' size mismatch at index 0. expected 4, actual 8") == (
        "tensor 'x' size mismatch at index 0. expected 4, actual 8 (guard of compile 0/1)")


def _scaled(x, scale_count):
    return x * scale_count + 1


def test_dynamo_recompile_on_a_changed_int_names_the_input():
    torch._dynamo.reset()
    f = torch.compile(_scaled, backend="eager", dynamic=False)
    x = torch.randn(8)
    f(x, 0)  # first compilation, before the watch
    with RecompileWatch(triton=False) as watch:
        f(x, 0)  # cached: no compile
        f(x, 1)  # guard scale_count == 0 fails
    r = watch.report
    assert r.dynamo_compiles == 1 and r.dynamo_recompiles == 1, r.causes()
    (e,) = r.events
    assert e.kind == "dynamo" and e.recompile and e.name.startswith("_scaled (test_recompile.py:")
    assert "scale_count" in e.cause and "== 0" in e.cause


def test_dynamo_first_compile_and_shape_change():
    torch._dynamo.reset()
    f = torch.compile(_scaled, backend="eager", dynamic=False)
    with RecompileWatch(triton=False) as watch:
        f(torch.randn(4), 2)
        f(torch.randn(6), 2)
    first, second = watch.report.events
    assert not first.recompile and first.cause == "first compilation of this frame"
    assert second.recompile and "tensor 'x' size mismatch at index 0" in second.cause
    assert "expected 4, actual 6" in second.cause
    s = summarize({"a": watch.report, "b": RecompileWatch(triton=False).__enter__().report})
    assert s["dynamo_compiles"] == 2 and s["dynamo_recompiles"] == 1 and set(s["phases"]) == {"a", "b"}


@pytest.mark.gpu
def test_real_triton_recompiles_on_gpu():
    import triton
    import triton.language as tl

    @triton.jit
    def _scale_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    def launch(x, n):
        out = torch.empty_like(x)
        _scale_kernel[(triton.cdiv(max(n, 1), 256),)](x, out, n, BLOCK_SIZE=256)
        return out

    x = torch.randn(4096, device="cuda")
    launch(x, 4096)  # first variant: aligned pointers, n divisible by 16
    with RecompileWatch(dynamo=False) as watch:
        launch(x, 4096)  # cached
        launch(x, 4095)  # n no longer divisible by 16
        launch(x[1:], 4095)  # x_ptr not 16-byte aligned (out is fresh, aligned)
        launch(x, 1)  # n == 1 becomes a constant
    torch.cuda.synchronize()
    r = watch.report
    assert r.triton_compiles == 3, r.causes()
    a, b, c = r.events
    assert a.cause.startswith("n: i32, divisible by 16 -> i32, not divisible by 16"), a.cause
    assert b.cause.startswith("x_ptr: *fp32, 16-byte aligned -> *fp32, not 16-byte aligned"), b.cause
    assert c.changed and c.changed[0].startswith("n:") and "constant 1" in c.changed[0], c.cause
