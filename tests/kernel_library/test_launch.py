"""The library's direct Triton launch (kernel_library._launch): JIT twice per call key (compile, then a checked
launch), the compiled kernel's launcher after; everything it cannot vouch for stays on the JIT."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from kernel_library import _launch


def _body(x_ptr, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
    pass


class _Compiled:
    """A compiled kernel stand-in: its launcher records every call."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.function, self.packed_metadata = object(), object()

    def run(self, *call):
        self.calls.append(call)

    def launch_metadata(self, grid, stream, *args):
        return {"grid": grid, "n_args": len(args)}


class _FakeJIT:
    """What ``JITFunction.run`` does at launch, without a GPU: bind, pick the compiled kernel, call its launcher."""

    def __init__(self, kernel, constexprs=True, transform=None, hooks=(None, None)):
        self.kernel, self.constexprs, self.transform, self.hooks = kernel, constexprs, transform, hooks
        self.compiled: dict[tuple, _Compiled] = {}
        self.jit_calls = 0

    def __call__(self, *args, grid, warmup, **kw):
        self.jit_calls += 1
        bound = []
        for i, p in enumerate(self.kernel.params):
            v = args[i] if i < len(args) else kw.get(p.name, p.default)
            if p.is_constexpr and not self.constexprs:
                continue
            bound.append(self.transform(v) if self.transform else v)
        ck = self.compiled.setdefault((len(args), args[1]), _Compiled())
        grid = grid(dict(zip(self.kernel.arg_names, args))) if callable(grid) else grid
        g = tuple(grid) + (1,) * (3 - len(grid))
        enter, leave = self.hooks
        md = None if enter is None else ck.launch_metadata(grid, 1234, *bound)
        ck.run(*g, 1234, ck.function, ck.packed_metadata, md, enter, leave, *bound)
        return ck


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(_launch, "_device_and_stream", lambda: (0, 1234))
    monkeypatch.setattr(_launch, "_launch_hooks", lambda: (None, None))
    k = JITFunction(_body)
    k.run = _FakeJIT(k)
    return k


def _launch3(launcher, x, n=8):
    for _ in range(3):
        launcher[(4,)](x, n, 0.5, BLOCK=16)


def test_a_key_goes_direct_on_its_third_call_with_the_arguments_the_jit_bound(kernel):
    x = torch.zeros(8)
    launcher = _launch.cached_launcher(kernel)
    assert isinstance(launcher, _launch.CachedLauncher) and _launch.cached_launcher(kernel) is launcher
    _launch3(launcher, x)
    ck = kernel.run.compiled[(3, 8)]
    assert kernel.run.jit_calls == 2  # compile, then the checked launch
    assert len(ck.calls) == 3 and ck.calls[2] == ck.calls[1]  # the direct call is the JIT's, argument for argument
    assert ck.calls[2][:4] == (4, 1, 1, 1234) and ck.calls[2][9] is x
    launcher[(4,)](x, 9, 0.5, BLOCK=16)  # another int value: another key, through the JIT
    assert kernel.run.jit_calls == 3


def test_a_launcher_without_the_constexprs_is_called_without_them(kernel):
    kernel.run = _FakeJIT(kernel, constexprs=False)
    x = torch.zeros(8)
    _launch3(_launch.cached_launcher(kernel), x)
    ck = kernel.run.compiled[(3, 8)]
    assert kernel.run.jit_calls == 2 and ck.calls[2] == ck.calls[1] and len(ck.calls[2]) == 9 + 3


def test_a_launch_the_check_does_not_match_stays_on_the_jit(kernel):
    kernel.run = _FakeJIT(kernel, transform=lambda v: v * 2 if type(v) is int else v)
    launcher = _launch.cached_launcher(kernel)
    for _ in range(4):
        launcher[(4,)](torch.zeros(8), 8, 0.5, BLOCK=16)
    assert kernel.run.jit_calls == 4
    (entry,) = launcher.entries.values()
    assert entry.state == _launch._JIT and "bound arguments" in entry.why


@pytest.mark.parametrize("case", ["callable grid", "off", "other type", "pre-run hook"])
def test_what_the_direct_launch_cannot_vouch_for_takes_the_jit(kernel, monkeypatch, case):
    grid, arg = (4,), 0.5
    if case == "callable grid":
        grid = lambda meta: (4,)  # noqa: E731
    elif case == "off":
        monkeypatch.setattr(_launch, "FAST_LAUNCH", False)
    elif case == "other type":
        arg = torch.tensor(0.5).numpy()  # a numpy scalar: the JIT's business
    else:
        kernel.pre_run_hooks.append(lambda *a, **k: None)
    launcher = _launch.CachedLauncher(kernel)
    for _ in range(4):
        launcher[grid](torch.zeros(8), 8, arg, BLOCK=16)
    assert kernel.run.jit_calls == 4


def test_launch_hooks_are_passed_on_with_the_launch_metadata(kernel, monkeypatch):
    def enter(md):
        pass

    hooks = (enter, None)
    monkeypatch.setattr(_launch, "_launch_hooks", lambda: hooks)
    kernel.run = _FakeJIT(kernel, hooks=hooks)
    x = torch.zeros(8)
    _launch3(_launch.cached_launcher(kernel), x)
    ck = kernel.run.compiled[(3, 8)]
    assert kernel.run.jit_calls == 2 and ck.calls[2] == ck.calls[1]
    assert ck.calls[2][6] == {"grid": (4,), "n_args": 5} and ck.calls[2][7] is enter
    hooks = (None, None)  # unset again: the direct launch passes none, as the JIT would
    _launch.cached_launcher(kernel)[(4,)](x, 8, 0.5, BLOCK=16)
    assert kernel.run.jit_calls == 2 and ck.calls[3][6:9] == (None, None, None)


def test_a_misaligned_tensor_is_another_key(kernel):
    base = torch.zeros(64)
    launcher = _launch.cached_launcher(kernel)
    _launch3(launcher, base[:8])
    launcher[(4,)](base[1:9], 8, 0.5, BLOCK=16)  # 4 bytes in: not 16-byte aligned
    assert kernel.run.jit_calls == 3


def test_the_interpreter_and_other_launchables_are_returned_as_they_are():
    @triton.jit
    def k(x_ptr):
        pass

    if not isinstance(k, JITFunction):  # TRITON_INTERPRET=1: an InterpretedFunction
        assert _launch.cached_launcher(k) is k
    obj = object()
    assert _launch.cached_launcher(obj) is obj


@pytest.mark.gpu("a CUDA GPU: the compiled kernel's launcher")
@pytest.mark.parametrize("op", ["softmax", "rmsnorm"])
def test_library_ops_go_direct_on_the_gpu_and_match_the_jit(op, monkeypatch):
    from kernel_library import rmsnorm, softmax

    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fn = (lambda: softmax.kernel_fn(x)) if op == "softmax" else (lambda: rmsnorm.kernel_fn(x, w, 1e-6))
    g = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)

    def step():
        out = fn()
        return [out.detach()] + [t.detach() for t in torch.autograd.grad(out, [x, w] if op == "rmsnorm" else [x], g)]

    monkeypatch.setattr(_launch, "FAST_LAUNCH", False)
    want = step()
    monkeypatch.setattr(_launch, "FAST_LAUNCH", True)
    for _ in range(3):
        got = step()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    states = [e.state for lau in _launch._launchers.values() for e in lau.entries.values()]
    assert _launch._FAST in states, [e.why for lau in _launch._launchers.values() for e in lau.entries.values()]


def test_an_empty_hook_chain_gets_no_launch_metadata_but_is_passed_on(kernel, monkeypatch):
    from triton import knobs

    chain = knobs.HookChain()
    monkeypatch.setattr(_launch, "_launch_hooks", lambda: (chain, chain))
    kernel.run = _FakeJIT(kernel, hooks=(chain, chain))  # the JIT builds metadata for any hook object
    x = torch.zeros(8)
    _launch3(_launch.cached_launcher(kernel), x)
    ck = kernel.run.compiled[(3, 8)]
    assert kernel.run.jit_calls == 2
    assert ck.calls[2][6] is None and ck.calls[2][7] is chain and ck.calls[2][9:] == ck.calls[1][9:]


def test_a_float_argument_is_keyed_by_type_and_an_int_by_value(kernel):
    x = torch.zeros(8)
    launcher = _launch.cached_launcher(kernel)
    _launch3(launcher, x)
    launcher[(4,)](x, 8, 0.25, BLOCK=16)  # another float: the same key, direct, with the new value
    ck = kernel.run.compiled[(3, 8)]
    assert kernel.run.jit_calls == 2 and ck.calls[3][11] == 0.25
    launcher[(4,)](x, 8, 0.25, BLOCK=32)  # another meta value: another key
    assert kernel.run.jit_calls == 3


def test_positional_ints_bools_floats_and_none_are_each_their_own_key():
    """An int is keyed bare (host time): it must still differ from a bool, a float and None in the same place."""
    x = torch.zeros(8)
    keys = {_launch._call_key(0, (), (x, v), {}) for v in (1, True, 0, False, 1.0, None, "1")}
    assert len(keys) == 7
    assert _launch._call_key(0, (), (x, 1), {}) == _launch._call_key(0, (), (x, 1), {})


def test_keys_beyond_the_cap_take_the_jit(kernel, monkeypatch):
    monkeypatch.setattr(_launch, "MAX_KEYS", 2)
    launcher = _launch.cached_launcher(kernel)
    x = torch.zeros(8)
    for n in (1, 2, 3, 3, 3):
        launcher[(4,)](x, n, 0.5, BLOCK=16)
    assert len(launcher.entries) == 2 and launcher.bypassed["too many call keys"] == 3


def _body_constexpr_first(BLOCK: tl.constexpr, x_ptr, n):
    pass


@pytest.mark.parametrize("constexprs", [False, True])
def test_a_constexpr_by_position_stays_on_the_jit(monkeypatch, constexprs):
    monkeypatch.setattr(_launch, "_device_and_stream", lambda: (0, 1234))
    monkeypatch.setattr(_launch, "_launch_hooks", lambda: (None, None))
    k = JITFunction(_body_constexpr_first)
    k.run = _FakeJIT(k, constexprs=constexprs)
    launcher = _launch.CachedLauncher(k)
    x = torch.zeros(8)
    for _ in range(4):
        launcher[(4,)](16, x, 8)
    (entry,) = launcher.entries.values()
    assert entry.state == _launch._JIT and "constexpr" in entry.why and k.run.jit_calls == 4


def test_no_key_holds_a_tensor(kernel):
    import weakref

    launcher = _launch.cached_launcher(kernel)
    x = torch.zeros(8)
    _launch3(launcher, x)
    for ck in kernel.run.compiled.values():
        ck.calls.clear()  # the stand-in launcher's record of its calls
    ref = weakref.ref(x)
    del x
    assert ref() is None  # the call keys keep dtypes and alignments, not the tensors


def test_meta_values_are_keyed_by_type_and_exact_bits_and_odd_arguments_take_the_jit(kernel):
    x = torch.zeros(8)
    launcher = _launch.cached_launcher(kernel)
    calls = [dict(BLOCK=16, FLAG=True), dict(BLOCK=16, FLAG=1), dict(BLOCK=16.0), dict(BLOCK=0.0), dict(BLOCK=-0.0)]
    keys = {_launch._call_key(0, (), (x, 8, 0.5), meta) for meta in calls}
    assert len(keys) == len(calls)  # True vs 1, 16 vs 16.0, 0.0 vs -0.0: each its own key
    for _ in range(3):
        launcher[(4,)](x, (8,), 0.5, BLOCK=16)  # a tuple argument: the JIT's business
    assert launcher.bypassed["an argument of another type"] == 3 and not launcher.entries


def test_an_exit_hook_alone_still_gets_the_launch_metadata(kernel, monkeypatch):
    from triton import knobs

    empty, exit_hook = knobs.HookChain(), knobs.HookChain()
    exit_hook.add(lambda md: None)
    monkeypatch.setattr(_launch, "_launch_hooks", lambda: (empty, exit_hook))
    kernel.run = _FakeJIT(kernel, hooks=(empty, exit_hook))
    _launch3(_launch.cached_launcher(kernel), torch.zeros(8))
    ck = kernel.run.compiled[(3, 8)]
    assert kernel.run.jit_calls == 2 and ck.calls[2][6] == ck.calls[1][6] is not None


def test_the_jits_global_state_is_in_the_key_and_changed_globals_raise_as_in_the_jit(kernel, monkeypatch):
    x = torch.zeros(8)
    launcher = _launch.cached_launcher(kernel)
    _launch3(launcher, x)
    monkeypatch.setattr(_launch, "_jit_state", lambda: (True, None, None))  # e.g. TRITON_DEBUG turned on
    launcher[(4,)](x, 8, 0.5, BLOCK=16)
    assert kernel.run.jit_calls == 3  # a new key: the JIT compiles the debug kernel
    monkeypatch.setattr(_launch, "_jit_state", lambda: None)  # a stages-inspection hook: always the JIT
    launcher[(4,)](x, 8, 0.5, BLOCK=16)
    assert kernel.run.jit_calls == 4
    monkeypatch.undo()
    monkeypatch.setattr(_launch, "_device_and_stream", lambda: (0, 1234))
    monkeypatch.setattr(_launch, "_launch_hooks", lambda: (None, None))
    scope = {"LIMIT": 1}
    kernel.used_global_vals[("LIMIT", id(scope))] = (1, scope)
    launcher[(4,)](x, 8, 0.5, BLOCK=16)  # direct, the global unchanged
    scope["LIMIT"] = 2
    with pytest.raises(RuntimeError, match="Global variable LIMIT has changed"):
        launcher[(4,)](x, 8, 0.5, BLOCK=16)


def test_a_launcher_read_while_another_thread_watched_it_is_not_kept(kernel, monkeypatch):
    x = torch.zeros(8)
    launcher = _launch.cached_launcher(kernel)
    launcher[(4,)](x, 8, 0.5, BLOCK=16)
    ck = kernel.run.compiled[(3, 8)]
    real = ck.run
    ck.run = lambda *call: real(*call)  # another thread's watcher when this check reads the launcher

    class OtherThreadDone:  # ... and restored by the time this check holds the lock
        def __enter__(self):
            del ck.run

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(_launch, "_verify_lock", OtherThreadDone())
    launcher[(4,)](x, 8, 0.5, BLOCK=16)
    (entry,) = launcher.entries.values()
    assert entry.state == _launch._JIT and "changed while it was checked" in entry.why
    assert ck.run == real and "run" not in vars(ck)  # nothing of either watcher left behind
