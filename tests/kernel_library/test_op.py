"""kernel_library._op: which path an op call takes (direct eager vs the registered torch.library op), and that both
give the same values and gradients."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kernel_library import _op
from kernel_library._op import direct_call_ok, library_op

CALLS: list[bool] = []  # per call of the implementations below: was it on the direct path?


@library_op("fusion_advisor_test::scaled_square", mutates_args={})
def scaled_square(x: torch.Tensor, scale: float) -> torch.Tensor:
    CALLS.append(getattr(_op._state, "direct", False))
    return x * x * scale


@library_op("fusion_advisor_test::scaled_square_backward", mutates_args={})
def scaled_square_backward(dy: torch.Tensor, x: torch.Tensor, scale: float) -> torch.Tensor:
    CALLS.append(getattr(_op._state, "direct", False))
    return dy * 2 * x * scale


def _setup_context(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return scaled_square_backward(dy, x, ctx.scale), None


scaled_square.register_autograd(_backward, setup_context=_setup_context)


@library_op("fusion_advisor_test::add_one_", mutates_args={"x"})
def add_one_(x: torch.Tensor) -> None:
    x.add_(1)


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


def test_eager_call_on_plain_tensors_runs_the_implementation_directly():
    x = torch.randn(5)
    assert torch.equal(scaled_square(x, 3.0), x * x * 3.0)
    assert CALLS == [True]


def test_gradient_through_the_direct_path_uses_the_ops_own_backward():
    x = torch.randn(5, requires_grad=True)
    y = scaled_square(x, 3.0)
    assert type(y.grad_fn).__name__ == "scaled_square_functionBackward"
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.allclose(g, 6.0 * x.detach())
    assert CALLS == [True, True]  # forward and backward both direct


def test_parameters_count_as_plain_tensors():
    w = torch.nn.Parameter(torch.randn(3))
    scaled_square(w, 1.0).sum().backward()
    assert CALLS == [True, True] and torch.allclose(w.grad, 2 * w.detach())


@pytest.mark.parametrize("case", ["meta", "dispatch_mode", "subclass"])
def test_calls_the_direct_path_cannot_serve_go_through_the_op(case):
    if case == "meta":
        out = scaled_square(torch.randn(4, device="meta"), 2.0)
        assert out.is_meta and out.shape == (4,)
    elif case == "dispatch_mode":
        with FlopCounterMode(display=False):
            scaled_square(torch.randn(4), 2.0)
    else:
        from torch.testing._internal.two_tensor import TwoTensor
        assert not direct_call_ok([TwoTensor(torch.randn(2), torch.randn(2))])
        return
    assert CALLS and not any(CALLS)


def test_torch_compile_traces_the_registered_op():
    x = torch.randn(6, requires_grad=True)
    compiled = torch.compile(lambda t: scaled_square(t, 0.5), backend="aot_eager", fullgraph=True)
    y = compiled(x)
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.allclose(y, 0.5 * x * x) and torch.allclose(g, x.detach())
    assert CALLS and not any(CALLS)


def test_direct_path_bumps_the_version_of_a_mutated_argument():
    x = torch.zeros(3)
    v = x._version
    add_one_(x)
    assert torch.equal(x, torch.ones(3)) and x._version > v


def test_launcher_is_the_bare_kernel_only_on_the_direct_path(monkeypatch):
    wrapped = []
    monkeypatch.setattr(torch.library, "wrap_triton", lambda k: wrapped.append(k) or ("wrapped", k))
    kernel = object()
    assert _op.launcher(kernel) == ("wrapped", kernel)
    _op._state.direct = True
    try:
        assert _op.launcher(kernel) is kernel
    finally:
        _op._state.direct = False
    assert wrapped == [kernel]


def test_differentiating_an_op_without_a_backward_fails_loudly_as_the_registered_op_does():
    # double backward: the backward op has no autograd formula of its own; a direct call would hand back a gradient
    # that silently does not depend on x
    x = torch.randn(4, requires_grad=True)
    y = scaled_square(x, 1.0)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    penalty = g.pow(2).sum() + x.sum()  # a gradient penalty: without the op, g would count as a constant
    with pytest.raises(RuntimeError, match="(?i)autograd"):
        torch.autograd.grad(penalty, x)


def test_jit_trace_records_the_registered_op():
    traced = torch.jit.trace(lambda t: scaled_square(t, 2.0), torch.randn(3))
    assert "fusion_advisor_test::scaled_square" in str(traced.graph)
    x = torch.randn(3)
    assert torch.allclose(traced(x), 2.0 * x * x)


def test_tracing_a_replacement_records_the_op_not_an_unseen_launch():
    """make_fx(pre_dispatch=True) on real tensors keeps its proxy mode where direct_call_ok cannot see it: a direct
    call would launch the kernel unseen and leave only the output's allocation in the graph (found on the H200:
    swapped models computed from uninitialised memory). registered_ops_only() makes the call take the op."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernel_library._op import registered_ops_only
    from kernel_library.registry import load_all

    entry = load_all()["swiglu"]
    a, b = torch.zeros(4, 8), torch.zeros(4, 8)
    with registered_ops_only():
        gm = make_fx(entry.replacement, pre_dispatch=True)(a, b)
    assert "fusion_advisor.swiglu.default" in [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
