"""Every library op under ``torch.compile(dynamic=True)``: its fake implementation must take symbolic sizes.

Dynamo marks a size dynamic after the first recompile, so a compiled region holding a library op meets a symbolic
width as soon as the model sees a second shape (the H200 run of ``test_softmax.py::test_torch_compile_fullgraph``
found ``SoftmaxConfig.for_row`` hashing a ``SymInt`` in its cache). A launcher's Python (config choice, grid,
int64 checks) runs on those sizes; it may specialise on them (a guard) but must not fail.

A traced Triton launch cannot run under ``TRITON_INTERPRET`` (wrap_triton reads data pointers there), so on the CPU
each module's ``launcher`` is replaced by one that skips the launch when it sees a fake tensor and launches as
usual otherwise, and the backend is ``eager``: Dynamo runs each op's fake implementation on symbolic sizes, then
the compiled function's real call is checked against the eager call on two widths. (``aot_eager`` would trace the
op's implementation into Triton kernel nodes, which the interpreter cannot record.)
"""

import importlib

import pytest
import torch
from torch._subclasses.fake_tensor import is_fake

from fusion_advisor.kernel_tools.verify import load_contract, shape_plan
from kernel_library import _op
from kernel_library.registry import load_all
from tests.kernel_library.kernel_asserts import assert_close

MODULES = sorted({e.module for e in load_all().values()})
KERNEL_MODULES = sorted({*MODULES, "kernel_library._rows"})


class _SkipFakeLaunch:
    """``launcher(kernel)[grid](*args, **meta)`` that does nothing when an argument is a fake tensor."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **meta):
            if any(isinstance(a, torch.Tensor) and is_fake(a) for a in args):
                return None
            return _op.launcher(self.kernel)[grid](*args, **meta)
        return launch


@pytest.fixture
def fake_launches_skipped(monkeypatch):
    if torch.cuda.is_available():  # a GPU traces the launch for real: nothing to replace
        return
    for name in KERNEL_MODULES:
        mod = importlib.import_module(name)
        if hasattr(mod, "launcher"):
            monkeypatch.setattr(mod, "launcher", _SkipFakeLaunch)


def _two_widths(contract):
    """Two of verify's edge sizes with different last (width) entries, smallest first."""
    sizes, widths = [], set()
    for s in shape_plan(contract):
        width = s.size[-1] if isinstance(s.size, tuple) else s.size
        if not s.skip and width not in widths and (not isinstance(s.size, tuple) or max(s.size) <= 1100):
            sizes.append(s.size)
            widths.add(width)
    return sizes[:2]


@pytest.mark.parametrize("module", MODULES)
def test_compiled_with_dynamic_shapes(module, fake_launches_skipped):
    contract = load_contract(module)
    sizes = _two_widths(contract)
    assert len(sizes) == 2, f"{module}: verify's edge sizes give fewer than two widths"
    torch._dynamo.reset()
    compiled = torch.compile(contract.kernel_fn, backend="eager", dynamic=True, fullgraph=True)
    for size in sizes:
        args = contract.get_inputs(size)
        got, want = compiled(*args), contract.kernel_fn(*args)
        for g, w in zip(*(o if isinstance(o, (tuple, list)) else (o,) for o in (got, want))):
            if isinstance(w, torch.Tensor):
                assert g.shape == w.shape
                assert_close(g, w.double(), w.dtype)
