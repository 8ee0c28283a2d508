"""Kernel patterns traced once to canonical pre-dispatch graphs: what :mod:`~fusion_advisor.apply.match` looks for.

Each :class:`~kernel_library.registry.KernelEntry` carries ``pattern`` (plain torch code of the subgraph it
replaces) and its ``example_args``. :class:`PatternLibrary` traces it on those small example arguments (fp32 and bf16
variants, scalar parameters as sentinel constants) for the loose pass, and again on a site's own shapes, dtypes
and captured constants for the exact pass (cached per shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.apply.canonical import canonicalize
from fusion_advisor.analyze.capture import first_line, quiet_torch_logs

#: Float dtypes the loose pass traces each pattern in: fp32 (casts to fp32 vanish as no-ops) and bf16 (they do not).
_VARIANT_DTYPES = (torch.float32, torch.bfloat16)


# --- example arguments of the patterns ---------------------------------------------------------------------


@dataclass(frozen=True)
class _T:
    """Example tensor of a pattern argument: shape and dtype (``None``: the variant's float dtype)."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None


class _Scalar:
    """Marks a scalar parameter of a pattern (``eps``, ``scale``): traced with a sentinel, captured at a match."""


SCALAR = _Scalar()

#: Sentinel values for scalar parameters in the loose pass: unusual enough never to be a model's own constant.
_SENTINELS = (1.234567e-05, 2.345678e-05, 3.456789e-05, 4.567891e-05)

def pattern_examples(entry: Any) -> tuple[Any, ...] | None:
    """The example arguments of ``entry.pattern`` (``KernelEntry.example_args``: a shape tuple for a tensor of the
    traced float dtype, ``(shape, dtype)`` for a typed tensor, ``"scalar"`` for a scalar parameter) as
    :class:`_T` / :data:`SCALAR`; ``None`` when the kernel declares none.

    Raises:
        ValueError: an example argument of another form (the message names the kernel and the argument).
    """
    args = getattr(entry, "example_args", ())
    if not args:
        return None
    out: list[Any] = []
    for i, a in enumerate(args):
        if a == "scalar":
            out.append(SCALAR)
        elif isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], tuple) and isinstance(a[1], torch.dtype):
            out.append(_T(tuple(a[0]), a[1]))
        elif isinstance(a, tuple) and all(isinstance(d, int) for d in a):
            out.append(_T(tuple(a)))
        else:
            raise ValueError(f"kernel {entry.name!r}: example_args[{i}] = {a!r} is not a shape, (shape, dtype) or "
                             "'scalar'")
    return tuple(out)


# --- patterns -----------------------------------------------------------------------------------------------


@dataclass
class Pattern:
    """A kernel pattern traced to a canonical pre-dispatch graph."""

    entry: Any  # KernelEntry
    gm: torch.fx.GraphModule
    params: list[str]  # the pattern function's parameter names, in order
    tensor_placeholders: dict[Node, str]  # placeholder -> parameter name (tensor parameters)
    sentinels: dict[float, str]  # loose pass: sentinel literal -> scalar parameter name
    outputs: list[Node]  # flattened output nodes
    ops: list[Node]  # call_function nodes, topological order

    @property
    def n_ops(self) -> int:
        return len(self.ops)


def _pattern_params(fn: Callable) -> list[str]:
    import inspect

    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _trace_pattern(entry: Any, args: list[Any], sentinels: dict[float, str]) -> Pattern:
    """Trace ``entry.pattern(*args)`` (fake tensors, scalars as given) to a canonical pre-dispatch graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(entry.pattern, pre_dispatch=True)(*args)
    canonicalize(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    params = _pattern_params(entry.pattern)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensor_ph = {ph: params[i] for i, ph in enumerate(placeholders)
                 if i < len(params) and isinstance(args[i], torch.Tensor) and ph.users}
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = [o for o in torch.utils._pytree.tree_leaves(out_node.args[0]) if isinstance(o, Node)]
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    return Pattern(entry, gm, params, tensor_ph, sentinels, outputs, ops)


def _example_args(entry: Any, dtype: torch.dtype, fake_mode: Any) -> tuple[list[Any], dict[float, str]]:
    """Fake example arguments of ``entry.pattern`` in float dtype ``dtype``, and ``{sentinel: scalar name}``."""
    params = _pattern_params(entry.pattern)
    args: list[Any] = []
    sentinels: dict[float, str] = {}
    for i, spec in enumerate(pattern_examples(entry)):
        if isinstance(spec, _Scalar):
            value = _SENTINELS[len(sentinels)]
            sentinels[value] = params[i] if i < len(params) else f"arg{i}"
            args.append(value)
        else:
            with fake_mode:
                args.append(torch.empty(spec.shape, dtype=spec.dtype or dtype))
    return args, sentinels


class PatternLibrary:
    """Loose-pass patterns of the library kernels, traced once, and exact-pass patterns cached per site shape.

    Args:
        kernels: ``{name: KernelEntry}`` to match (entries without a pattern are listed in :attr:`problems`).
    """

    def __init__(self, kernels: dict[str, Any]):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.kernels = dict(kernels)
        self.loose: dict[str, list[Pattern]] = {}
        self.problems: dict[str, str] = {}
        self._exact: dict[Any, Pattern | str] = {}
        self._fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        for name, entry in sorted(self.kernels.items()):
            if entry.pattern is None or entry.replacement is None:
                self.problems[name] = "the kernel registers no pattern/replacement, so apply cannot swap it in"
                continue
            try:
                examples = pattern_examples(entry)
            except ValueError as e:
                self.problems[name] = f"{e}: its pattern cannot be traced"
                continue
            if examples is None:
                self.problems[name] = ("the kernel declares no example_args (KernelEntry.example_args): its pattern "
                                       "cannot be traced")
                continue
            variants: list[Pattern] = []
            seen: set[str] = set()
            try:
                for dt in _VARIANT_DTYPES:
                    args, sentinels = _example_args(entry, dt, self._fake_mode)
                    with quiet_torch_logs():
                        pat = _trace_pattern(entry, args, sentinels)
                    text = _structure(pat.gm)
                    if text not in seen:
                        seen.add(text)
                        variants.append(pat)
                missing = [n for v, n in variants[0].sentinels.items() if not _graph_has_literal(variants[0].gm, v)]
                if missing:
                    self.problems[name] = (f"scalar parameter(s) {', '.join(missing)} of the pattern do not appear "
                                           f"as constants in its traced graph: they cannot be captured from a match")
                    continue
            except Exception as e:  # a pattern that does not trace is reported, the others still match
                self.problems[name] = f"tracing its pattern raised {type(e).__name__}: {first_line(str(e))}"
                continue
            # larger variants first: a match that includes a cast hands the kernel the narrower input dtype
            self.loose[name] = sorted(variants, key=lambda v: -v.n_ops)

    @classmethod
    def for_kernels(cls, kernels: dict[str, Any]) -> "PatternLibrary":
        """A library for ``kernels``, shared between calls (tracing the patterns takes a few seconds)."""
        key = tuple(sorted((name, id(entry)) for name, entry in kernels.items()))
        lib = _LIBRARIES.get(key)
        if lib is None:
            lib = _LIBRARIES[key] = cls(kernels)
        return lib

    def exact(self, entry: Any, vals: list[Any]) -> Pattern | str:
        """The pattern traced on the site's own arguments (``vals``: fake tensors like the site's values, and the
        captured constants), or why tracing failed."""
        key = (entry.name, tuple((tuple(v.shape), tuple(v.stride()), v.dtype, str(v.device))
                                 if isinstance(v, torch.Tensor) else ("s", v) for v in vals))
        if key in self._exact:
            return self._exact[key]
        args: list[Any] = []
        for v in vals:
            if isinstance(v, torch.Tensor):
                with self._fake_mode:
                    args.append(torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype,
                                                    device=v.device))
            else:
                args.append(v)
        try:
            with quiet_torch_logs():
                result: Pattern | str = _trace_pattern(entry, args, {})
        except Exception as e:
            result = f"tracing the pattern on the site's arguments raised {type(e).__name__}: {first_line(str(e))}"
        self._exact[key] = result
        return result


_LIBRARIES: dict[tuple, PatternLibrary] = {}


def _graph_has_literal(gm: torch.fx.GraphModule, value: float) -> bool:
    found = False

    def visit(a: Any) -> Any:
        nonlocal found
        if isinstance(a, float) and a == value:
            found = True
        return a

    for n in gm.graph.nodes:
        torch.fx.node.map_aggregate((n.args, n.kwargs), visit)
    return found


def _structure(gm: torch.fx.GraphModule) -> str:
    return "\n".join(f"{n.op}:{n.target}" for n in gm.graph.nodes)


