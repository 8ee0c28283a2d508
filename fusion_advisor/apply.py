"""Stage 7: swap library kernels into the user's model — match, rewrite, and the ``apply`` pipeline.

Where the rewrite happens, and why
----------------------------------
The model is captured with ``torch.compile`` and a custom backend (as :mod:`fusion_advisor.capture` does). The
backend turns each dynamo graph into a **pre-dispatch aten graph** (``make_fx(..., pre_dispatch=True)``): aten
ops *above* autograd, with grad-mode changes (``torch.no_grad`` blocks) kept as ``_set_grad_enabled`` nodes.
Kernel patterns are matched there and each match is replaced by a call of the kernel's ``torch.library`` custom
op (``fusion_advisor::*``). The rewritten graph is then run as it is (every aten op and every custom op has its
autograd formula, so forward *and* backward work, and the custom op's backward is the kernel's own), or handed
to Inductor (``compile_fx``: AOTAutograd + Inductor) with ``compile_rest=True``.

Why not ``torch._inductor.pattern_matcher`` on AOTAutograd's graphs: its ``fwd_only`` patterns only see
inference graphs, and ``joint_fwd_bwd`` patterns must match the *joint* forward+backward graph that the
partitioner and decompositions produce — a graph whose shape changes between torch versions, and in which a
custom op with ``register_autograd`` is already differentiated, not one opaque node. Rewriting before
AOTAutograd gives one mechanism for inference and training, keeps the kernel's backward, and depends only on
``make_fx(pre_dispatch=True)``, ``node.meta["val"]``, ``stack_trace`` and ``nn_module_stack``, all present and
unchanged in torch 2.11 and 2.13 (tested here on 2.13 only: no 2.11 on this machine). ``meta["from_node"]``
(used to link matches to analysis chains) is newer; without it the link falls back to module path and source
line. The matcher is our own (~200 lines), so a failed match can say *where* and *why* it failed (a near-miss),
which Inductor's matcher cannot.

Matching (never by node names)
------------------------------
Each :class:`~kernel_library.registry.KernelEntry` carries ``pattern`` (plain torch code of the subgraph it
replaces) and ``replacement``. Patterns are traced to pre-dispatch aten graphs like the model. Both graphs are
first **canonicalised** the same way (:func:`canonicalize`): no-op dtype casts (``x.to(torch.float32)`` of an
fp32 tensor, which returns ``x`` itself) are removed, a dtype cast whose only user is a reshape is moved after
the reshape (``x.float().view(-1, V)`` == ``x.view(-1, V).float()``; how causal-LM heads feed the loss), and a
softmax ``dtype`` argument equal to the input's dtype is dropped.

Two passes per site:

1. *loose*: the pattern traced on small example arguments (fp32 and bf16 variants) is matched backwards from
   its output over op targets and data edges, commutative ``add``/``mul`` in either order; constants are
   ignored except the pattern's scalar parameters (``eps``), which are traced with sentinel values and captured
   from the model's constant at that place (a tensor there instead is a near-miss: "eps is not a constant").
2. *exact*: the pattern is traced again on the site's own shapes, dtypes and captured constants and must match
   the same nodes with every constant equal (reduction dims, casts, slice bounds).

Intermediate values used outside the match, unsupported dtypes (``KernelEntry.supports``), a failing
``KernelEntry.extra_check`` or a device the kernel cannot run on make the site a **near-miss** with its reason.
Every match and near-miss is recorded with its op ids, chain ids, module path and source line.

The pipeline (:func:`apply`)
---------------------------
capture (dynamo + :class:`RewriteBackend`, recording each match's real inputs and outputs on the model's example
inputs) -> analysis (graph, chains, roofline, routes of the same capture; chains are linked to matches through
``meta["from_node"]``) -> candidates (``routed``: chains the analysis routes to the kernel; ``all``: every match)
-> verify each and, on a GPU, time it (:mod:`fusion_advisor.swaps`) -> keep the verified winners, larger swaps
first, never two overlapping -> whole-model check of the patched model against the original (a kernel whose swaps
break it is dropped; a swap that cannot be rewritten is not kept) -> on a GPU, time eager, ``torch.compile(model)``
and the advised model with an eager and an Inductor rest; the plan takes the faster advised variant, and runs the
better of eager / torch.compile with no swap when the advised model loses to it -> :func:`write_outputs`
(swaps.csv, swaps.html, plan.yaml; :mod:`fusion_advisor.plan` rebuilds the patched model from the plan).

Public API: :func:`apply` / :func:`apply_module` -> :class:`ApplyResult`, :func:`write_outputs`,
:class:`RewriteBackend`, and the pass functions :func:`canonicalize`, :func:`find_matches`, :func:`rewrite`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.capture import first_line, quiet_torch_logs, user_loc, source_of
from fusion_advisor.graph import module_path_of, tensor_meta
from fusion_advisor.records import GraphBreak, SourceLoc, TensorMeta

# --- constants ----------------------------------------------------------------------------------------------

#: Candidate policies: ``routed`` tries a kernel only where the analysis routes the chain to it; ``all`` tries
#: every match (the measurement decides).
CANDIDATE_POLICIES = ("routed", "all")

#: Float dtypes the loose pass traces each pattern in: fp32 (casts to fp32 vanish as no-ops) and bf16 (they do not).
_VARIANT_DTYPES = (torch.float32, torch.bfloat16)

#: A loose-pass failure is reported as a near-miss when at least this share of the pattern's ops matched.
NEAR_MISS_MIN_SHARE = 0.6

#: Ops matched in either argument order.
_COMMUTATIVE = frozenset({torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor})

#: ``aten.to`` overloads; they return their input itself when nothing changes (a no-op the canonicaliser drops).
_TO_OPS = frozenset({torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout, torch.ops.aten.to.device,
                     torch.ops.aten.to.other})
#: Pure dtype casts that may be moved after a reshape.
_CAST_OPS = frozenset({torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default})
#: Reshapes a dtype cast may be moved behind.
_RESHAPE_OPS = frozenset({torch.ops.aten.view.default, torch.ops.aten.reshape.default,
                          torch.ops.aten._unsafe_view.default})
#: Ops with a ``dtype`` argument that changes nothing when it equals the input's dtype.
_DTYPE_ARG_OPS = frozenset({torch.ops.aten.softmax.int, torch.ops.aten.log_softmax.int})
#: Ops whose result never requires grad.
_NO_GRAD_OPS = frozenset({torch.ops.aten.detach.default})


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

_N, _D, _I, _V, _H, _S, _HD = 6, 16, 24, 40, 2, 8, 8  # rows, hidden, intermediate, vocab, heads, seq, head dim

#: Example arguments of each chain pattern's ``KernelEntry.pattern`` (small; only the graph structure matters,
#: the exact pass retraces at the model's shapes). A kernel whose pattern name is missing here is reported as
#: "cannot trace its pattern", never silently skipped.
PATTERN_EXAMPLES: dict[str, tuple[Any, ...]] = {
    "rmsnorm": (_T((2, 3, _D)), _T((_D,)), SCALAR),
    "add_rmsnorm": (_T((2, 3, _D)), _T((2, 3, _D)), _T((_D,)), SCALAR),
    "layernorm": (_T((2, 3, _D)), _T((_D,)), _T((_D,)), SCALAR),
    "add_layernorm": (_T((2, 3, _D)), _T((2, 3, _D)), _T((_D,)), _T((_D,)), SCALAR),
    "swiglu": (_T((_N, _I)), _T((_N, _I))),
    "geglu": (_T((_N, _I)), _T((_N, _I))),
    "bias_gelu": (_T((_N, _I)), _T((_I,))),
    "cross_entropy": (_T((_N, _V)), _T((_N,), torch.int64)),
    "softmax": (_T((2, _H, _S, _S)),),
    "masked_softmax": (_T((2, _H, _S, _S)), _T((2, 1, _S, _S)), SCALAR),
    "rope": (_T((2, _H, _S, _HD)), _T((2, _H, _S, _HD)), _T((2, _S, _HD)), _T((2, _S, _HD))),
    "gemm_epilogue": (_T((_N, _D)), _T((_I, _D)), _T((_I,))),
}


# --- records ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatchKey:
    """What identifies a swap site across captures (recompiles, a later :func:`fusion_advisor.load_plan`).

    Attributes:
        kernel: library kernel name.
        module_path: dotted path of the nn.Module that issued the pattern's last op (``layers.0.input_layernorm``).
        source: ``file name:line`` of that op.
        occurrence: index among the graph's matches of this kernel with the same module path and source.
    """

    kernel: str
    module_path: str
    source: str
    occurrence: int = 0

    def __str__(self) -> str:
        return f"{self.kernel}@{self.module_path or '<top>'}:{self.source}#{self.occurrence}"

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "module_path": self.module_path, "source": self.source,
                "occurrence": self.occurrence}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MatchKey":
        return cls(str(d["kernel"]), str(d.get("module_path", "")), str(d.get("source", "")),
                   int(d.get("occurrence", 0)))


@dataclass(frozen=True)
class SwapSite:
    """One match of a kernel's pattern in a captured graph: a candidate swap.

    Attributes:
        id: ``"s<index>"`` in the order found.
        kernel: library kernel name; ``pattern``: the chain pattern it replaces.
        graph_index: captured graph the match lives in.
        key: :class:`MatchKey` (how the plan finds the site again).
        op_ids: ids ``"g<graph>:<node>"`` of the matched ops in apply's pre-dispatch graphs.
        chain_ids: analysis chains that hold those ops.
        source, module_path: where the pattern's last op comes from.
        inputs: ``(parameter name, TensorMeta)`` of the pattern's tensor arguments.
        scalars: the pattern's scalar parameters as captured from the model's constants (``{"eps": 1e-6}``).
        outputs: metas of the replaced values.
        n_ops: ops replaced.
        route, route_kernel, route_rule: the analysis decision of the chain (the first chain routed to a kernel).
        candidate: whether the swap is tried (verified and benchmarked) under the candidate policy.
        candidate_reason: why or why not.
    """

    id: str
    kernel: str
    pattern: str
    graph_index: int
    key: MatchKey
    op_ids: tuple[str, ...]
    chain_ids: tuple[str, ...]
    source: SourceLoc
    module_path: str
    inputs: tuple[tuple[str, TensorMeta], ...]
    scalars: dict[str, float]
    outputs: tuple[TensorMeta, ...]
    n_ops: int
    route: str = ""
    route_kernel: str = ""
    route_rule: str = ""
    candidate: bool = False
    candidate_reason: str = ""

    @property
    def signature(self) -> str:
        """Kernel plus input shapes/dtypes and scalars: sites with equal signatures time the same."""
        ins = ",".join(f"{m.dtype}{list(m.shape)}" for _, m in self.inputs)
        sc = ",".join(f"{k}={v:g}" for k, v in sorted(self.scalars.items()))
        return f"{self.kernel}({ins}{';' + sc if sc else ''})"


@dataclass(frozen=True)
class NearMiss:
    """A place that almost matched a kernel's pattern, with the reason it did not.

    Attributes:
        kernel: the kernel whose pattern nearly matched; ``pattern``: its chain pattern.
        graph_index: captured graph.
        op_ids: ops that did match (or the chain's ops for a chain-level near-miss).
        chain_ids: analysis chains holding them.
        source, module_path: of the op where matching started.
        reason: why it is not a match.
        kind: ``"structure"`` (ops or edges differ), ``"constant"`` (a constant differs or is computed at run
            time), ``"check"`` (dtype, row width, device or the kernel's extra_check), ``"chain"`` (the analysis
            found a chain of this pattern that nothing matched).
    """

    kernel: str
    pattern: str
    graph_index: int
    op_ids: tuple[str, ...]
    chain_ids: tuple[str, ...]
    source: SourceLoc
    module_path: str
    reason: str
    kind: str


@dataclass
class GraphRecord:
    """What :class:`RewriteBackend` saw and did for one dynamo graph.

    Attributes:
        index: order in which dynamo handed the graph over.
        graph: the canonicalised pre-dispatch aten graph *before* rewriting (kept only when ``keep_graphs``).
        sites: matches, with their runtime data (node maps) in :attr:`matches`.
        near_misses: near-misses found in this graph.
        applied: keys of the swaps rewritten into the graph that runs.
        skipped: ``(key, reason)`` of selected swaps that could not be rewritten.
        error: an exception that stopped matching or rewriting (the graph then runs unrewritten).
        analysis_graph: the decomposed aten graph the analysis stages read (only when ``analyze``).
    """

    index: int
    graph: torch.fx.GraphModule | None = None
    matches: list["_Match"] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    applied: list[MatchKey] = field(default_factory=list)
    skipped: list[tuple[MatchKey, str]] = field(default_factory=list)
    error: str = ""
    analysis_graph: torch.fx.GraphModule | None = None
    input_requires_grad: list[bool] = field(default_factory=list)
    grad_enabled: bool = True
    compile_rest_error: str = ""


# --- patterns -----------------------------------------------------------------------------------------------


@dataclass
class _Pattern:
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


def _trace_pattern(entry: Any, args: list[Any], sentinels: dict[float, str]) -> _Pattern:
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
    return _Pattern(entry, gm, params, tensor_ph, sentinels, outputs, ops)


def _example_args(entry: Any, dtype: torch.dtype, fake_mode: Any) -> tuple[list[Any], dict[float, str]]:
    """Fake example arguments of ``entry.pattern`` in float dtype ``dtype``, and ``{sentinel: scalar name}``."""
    params = _pattern_params(entry.pattern)
    args: list[Any] = []
    sentinels: dict[float, str] = {}
    for i, spec in enumerate(PATTERN_EXAMPLES[entry.replaces]):
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
        self.loose: dict[str, list[_Pattern]] = {}
        self.problems: dict[str, str] = {}
        self._exact: dict[Any, _Pattern | str] = {}
        self._fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        for name, entry in sorted(self.kernels.items()):
            if entry.pattern is None or entry.replacement is None:
                self.problems[name] = "the kernel registers no pattern/replacement, so apply cannot swap it in"
                continue
            if entry.replaces not in PATTERN_EXAMPLES:
                self.problems[name] = (f"no example arguments for pattern '{entry.replaces}' in "
                                       f"fusion_advisor.apply.PATTERN_EXAMPLES: its pattern cannot be traced")
                continue
            variants: list[_Pattern] = []
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

    def exact(self, entry: Any, vals: list[Any]) -> _Pattern | str:
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
                result: _Pattern | str = _trace_pattern(entry, args, {})
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


# --- canonicalisation ---------------------------------------------------------------------------------------


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, Node) else n


def _is_noop_to(node: Node) -> bool:
    """``aten.to`` that returns its input itself (same dtype, device, layout; no copy, no memory format)."""
    if node.op != "call_function" or node.target not in _TO_OPS:
        return False
    src, out = _val(node.args[0]) if node.args else None, _val(node)
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    norm = _normalized(node)
    if norm.get("copy") or norm.get("memory_format") not in (None, torch.preserve_format):
        return False
    return src.dtype == out.dtype and src.device == out.device and src.layout == out.layout


def _pure_cast_dtype(node: Node) -> torch.dtype | None:
    """The target dtype of a cast that changes nothing but the dtype, else ``None``."""
    if node.op != "call_function" or node.target not in _CAST_OPS:
        return None
    norm = _normalized(node)
    if node.target is torch.ops.aten.to.dtype:
        if norm.get("copy") or norm.get("non_blocking") or norm.get("memory_format") not in (None, torch.preserve_format):
            return None
        return norm.get("dtype")
    extra = {k: v for k, v in norm.items() if k not in ("self", "dtype") and v not in (None, False)}
    src, out = _val(node.args[0]), _val(node)
    if extra.keys() - {"layout", "device"} or not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    if out.device != src.device or out.layout != src.layout:
        return None
    return norm.get("dtype")


def canonicalize(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Rewrite ``gm`` in place into the canonical form patterns are matched in; return counts per rewrite.

    - ``noop_casts``: ``aten.to`` nodes that return their input itself are removed (uses point at the input);
    - ``casts_after_reshape``: ``view(cast(x, d), s)`` with the cast used only there becomes
      ``cast(reshape(x, s), d)`` — the same values (a cast is elementwise), and the cast moves fewer bytes;
    - ``redundant_dtype_args``: ``softmax(x, dim, dtype=x.dtype)`` becomes ``softmax(x, dim)`` (also log_softmax).

    Ends with ``graph.lint()`` and ``recompile()``.
    """
    counts = {"noop_casts": 0, "casts_after_reshape": 0, "redundant_dtype_args": 0}
    graph = gm.graph
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _DTYPE_ARG_OPS:
            norm = _normalized(node)
            src = _val(norm.get("self"))
            if norm.get("dtype") is not None and isinstance(src, torch.Tensor) and norm["dtype"] == src.dtype:
                node.args, node.kwargs = (norm["self"], norm["dim"]), {}
                counts["redundant_dtype_args"] += 1
    for node in list(graph.nodes):
        if _is_noop_to(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            counts["noop_casts"] += 1
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _RESHAPE_OPS or not node.args:
            continue
        cast = node.args[0]
        if not isinstance(cast, Node) or len(cast.users) != 1:
            continue
        dtype = _pure_cast_dtype(cast)
        src = cast.args[0] if cast.args else None
        if dtype is None or not isinstance(src, Node) or not isinstance(_val(src), torch.Tensor):
            continue
        shape = node.args[1]
        with graph.inserting_before(node):
            reshaped = graph.call_function(torch.ops.aten.reshape.default, (src, shape))
            recast = graph.call_function(cast.target, (reshaped,) + tuple(cast.args[1:]), dict(cast.kwargs))
        src_val = _val(src)
        try:
            with _fake_mode_of(src_val):
                reshaped.meta["val"] = src_val.reshape(shape)
        except Exception:  # a shape the fake tensor refuses: leave this pair alone
            graph.erase_node(recast)
            graph.erase_node(reshaped)
            continue
        for k in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node"):
            if k in node.meta:
                reshaped.meta[k] = node.meta[k]
            if k in cast.meta:
                recast.meta[k] = cast.meta[k]
        recast.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(recast)
        graph.erase_node(node)
        graph.erase_node(cast)
        counts["casts_after_reshape"] += 1
    graph.lint()
    gm.recompile()
    return counts


def _fake_mode_of(val: Any) -> contextlib.AbstractContextManager:
    mode = getattr(val, "fake_mode", None)
    return mode if mode is not None else contextlib.nullcontext()


# --- matching -----------------------------------------------------------------------------------------------


def _normalized(node: Node) -> dict[str, Any]:
    """Arguments of ``node`` by schema name with defaults filled (positional and keyword forms compare equal)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        out: dict[str, Any] = {}
        args = list(node.args)
        for i, a in enumerate(target._schema.arguments):
            if i < len(args) and not a.kwarg_only:
                out[a.name] = args[i]
            elif a.name in node.kwargs:
                out[a.name] = node.kwargs[a.name]
            elif a.has_default_value():
                out[a.name] = a.default_value
            else:
                out[a.name] = None
        return out
    out = {f"arg{i}": a for i, a in enumerate(node.args)}
    out.update(node.kwargs)
    return out


@dataclass
class _State:
    nmap: dict[Node, Node]  # pattern node -> graph node
    rmap: dict[Node, Node]  # graph node -> pattern node
    binds: dict[Node, Node]  # pattern placeholder -> graph node
    scalars: dict[str, Any]

    def copy(self) -> "_State":
        return _State(dict(self.nmap), dict(self.rmap), dict(self.binds), dict(self.scalars))


@dataclass
class _Attempt:
    """Deepest failure of a match attempt (for near-miss reasons)."""

    depth: int = -1
    reason: str = ""
    kind: str = "structure"
    matched: list[Node] = field(default_factory=list)

    def fail(self, st: _State, reason: str, kind: str = "structure") -> None:
        depth = len(st.nmap)
        if depth > self.depth:
            self.depth, self.reason, self.kind, self.matched = depth, reason, kind, list(st.rmap)


def _describe_node(n: Any) -> str:
    if not isinstance(n, Node):
        return repr(n)
    target = n.target
    name = target._schema.name.split("::")[-1] if isinstance(target, torch._ops.OpOverload) else getattr(
        target, "__name__", str(target))
    return f"{n.name} ({name})" if n.op == "call_function" else f"{n.name} ({n.op})"


class _Matcher:
    """Backtracking subgraph matcher of one pattern against one graph (see the module docstring)."""

    def __init__(self, pattern: _Pattern, by_target: dict[Any, list[Node]], strict: bool):
        self.p = pattern
        self.by_target = by_target
        self.strict = strict

    def run(self, anchor: Node, attempt: _Attempt) -> _State | None:
        for st in self._outputs(0, anchor, _State({}, {}, {}, {}), attempt):
            ok, reason, kind = self._validate(st)
            if ok:
                return st
            attempt.fail(st, reason, kind)
        return None

    def _outputs(self, i: int, anchor: Node, st: _State, attempt: _Attempt) -> Iterator[_State]:
        outs = self.p.outputs
        if i == len(outs):
            yield st
            return
        po = outs[i]
        if po in st.nmap or po.op == "placeholder":
            yield from self._outputs(i + 1, anchor, st, attempt)
            return
        cands = [anchor] if i == 0 else [g for g in self.by_target.get(po.target, []) if g not in st.rmap]
        for g in cands:
            for st2 in self._node(po, g, st, attempt):
                yield from self._outputs(i + 1, anchor, st2, attempt)

    def _node(self, pn: Node, gn: Any, st: _State, attempt: _Attempt) -> Iterator[_State]:
        if pn.op == "placeholder":
            bound = st.binds.get(pn)
            if bound is None:
                if not isinstance(gn, Node) or not isinstance(_val(gn), torch.Tensor):
                    attempt.fail(st, f"pattern input '{self.p.tensor_placeholders.get(pn, pn.name)}' must be a "
                                     f"tensor; the model passes {_describe_node(gn)}")
                    return
                st2 = st.copy()
                st2.binds[pn] = gn
                yield st2
            elif bound is gn:
                yield st
            else:
                attempt.fail(st, f"pattern input '{self.p.tensor_placeholders.get(pn, pn.name)}' is used twice; the "
                                 f"model passes {_describe_node(bound)} and {_describe_node(gn)}")
            return
        if not isinstance(gn, Node):
            attempt.fail(st, f"pattern op {_describe_node(pn)} where the model has the constant {gn!r}")
            return
        if pn in st.nmap:
            if st.nmap[pn] is gn:
                yield st
            else:
                attempt.fail(st, f"pattern value {_describe_node(pn)} is one value; the model computes it twice "
                                 f"({_describe_node(st.nmap[pn])}, {_describe_node(gn)})")
            return
        if gn in st.rmap:
            attempt.fail(st, f"{_describe_node(gn)} would stand for two pattern ops")
            return
        if gn.op != "call_function" or gn.target != pn.target:
            attempt.fail(st, f"pattern expects {_describe_node(pn).split(' ', 1)[1]} here; the model has "
                             f"{_describe_node(gn)}")
            return
        st2 = st.copy()
        st2.nmap[pn] = gn
        st2.rmap[gn] = pn
        pa, ga = _normalized(pn), _normalized(gn)
        if pa.keys() != ga.keys():
            attempt.fail(st2, f"{_describe_node(gn)}: arguments differ from the pattern's")
            return
        names = list(pa)
        orders = [ga]
        if pn.target in _COMMUTATIVE and len(names) >= 2:
            swapped = dict(ga)
            swapped[names[0]], swapped[names[1]] = ga[names[1]], ga[names[0]]
            orders.append(swapped)
        for g_args in orders:
            yield from self._args([(pa[k], g_args[k], k) for k in names], 0, gn, st2, attempt)

    def _args(self, items: list[tuple[Any, Any, str]], i: int, gn: Node, st: _State,
              attempt: _Attempt) -> Iterator[_State]:
        if i == len(items):
            yield st
            return
        pa, ga, name = items[i]
        for st2 in self._value(pa, ga, st, attempt, gn, name):
            yield from self._args(items, i + 1, gn, st2, attempt)

    def _value(self, pa: Any, ga: Any, st: _State, attempt: _Attempt, gn: Node, name: str) -> Iterator[_State]:
        if isinstance(pa, Node):
            yield from self._node(pa, ga, st, attempt)
            return
        if isinstance(pa, (list, tuple)) and any(isinstance(x, Node) for x in pa):
            if not isinstance(ga, (list, tuple)) or len(ga) != len(pa):
                attempt.fail(st, f"{_describe_node(gn)}: argument '{name}' differs in length from the pattern's")
                return
            yield from self._args([(p, g, name) for p, g in zip(pa, ga)], 0, gn, st, attempt)
            return
        # pa is a constant of the pattern
        param = self.p.sentinels.get(pa) if isinstance(pa, float) else None
        if param is not None:
            if isinstance(ga, Node):
                attempt.fail(st, f"'{param}' is not a constant in the model: {_describe_node(gn)} takes it from "
                                 f"{_describe_node(ga)}, computed at run time", "constant")
                return
            if isinstance(ga, bool) or not isinstance(ga, (int, float)):
                attempt.fail(st, f"'{param}' should be a number; the model has {ga!r}", "constant")
                return
            if param in st.scalars and st.scalars[param] != ga:
                attempt.fail(st, f"'{param}' takes two values in the model ({st.scalars[param]!r}, {ga!r})", "constant")
                return
            st2 = st.copy()
            st2.scalars[param] = ga
            yield st2
            return
        if isinstance(ga, Node) or (isinstance(ga, (list, tuple)) and any(isinstance(x, Node) for x in ga)):
            attempt.fail(st, f"{_describe_node(gn)}: argument '{name}' is the constant {pa!r} in the pattern but "
                             f"computed at run time in the model ({_describe_node(ga)})", "constant")
            return
        if self.strict and not _literal_equal(pa, ga):
            attempt.fail(st, f"{_describe_node(gn)}: argument '{name}' is {ga!r} in the model, {pa!r} in the pattern",
                         "constant")
            return
        yield st

    def _validate(self, st: _State) -> tuple[bool, str, str]:
        missing = [p for p in self.p.ops if p not in st.nmap]
        if missing:
            return False, f"pattern ops {', '.join(_describe_node(p) for p in missing)} not reached", "structure"
        outs = set(self.p.outputs)
        for pn, gn in st.nmap.items():
            if pn in outs:
                continue
            for user in gn.users:
                if user not in st.rmap:
                    return (False, f"intermediate value {_describe_node(gn)} is also used outside the pattern, by "
                                   f"{_describe_node(user)}: replacing the pattern would lose it", "structure")
        unbound = [name for ph, name in self.p.tensor_placeholders.items() if ph not in st.binds]
        if unbound:
            return False, f"pattern inputs {', '.join(unbound)} not bound", "structure"
        lost = [n for n in self.p.sentinels.values() if n not in st.scalars]
        if lost:
            return False, f"scalar parameters {', '.join(lost)} not found in the model", "constant"
        return True, "", ""


def _literal_equal(a: Any, b: Any) -> bool:
    """Constants equal for the exact pass: sequences elementwise, numbers by value (``2 == 2.0``), bools and
    other constants (dtypes, devices, strings, None) by type and value."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_literal_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    return type(a) is type(b) and a == b


# --- requires-grad and grad-mode propagation ----------------------------------------------------------------


def grad_flags(gm: torch.fx.GraphModule, input_requires_grad: Sequence[bool],
               grad_enabled: bool) -> tuple[dict[Node, bool], dict[Node, bool]]:
    """Per node: whether its value requires grad at run time, and whether grad mode is on when it runs.

    ``make_fx`` drops ``requires_grad`` from ``meta["val"]``; this recomputes it from the inputs' flags, the
    grad-mode nodes (``_set_grad_enabled``) and the rule that a floating result of a differentiable op on a
    tensor that requires grad requires grad.
    """
    rg: dict[Node, bool] = {}
    mode: dict[Node, bool] = {}
    placeholders = iter(input_requires_grad)
    enabled = grad_enabled
    for n in gm.graph.nodes:
        mode[n] = enabled
        if n.op == "placeholder":
            rg[n] = bool(next(placeholders, False))
            continue
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            enabled = bool(n.args[0]) if n.args else enabled
            rg[n] = False
            continue
        if n.op != "call_function" or n.target in _NO_GRAD_OPS or not enabled:
            rg[n] = False
            continue
        ins: list[Node] = []
        torch.fx.node.map_arg((n.args, n.kwargs), lambda a: ins.append(a) or a)
        val = _val(n)
        floating = any(t.is_floating_point() or t.is_complex() for t in _tensors(val))
        rg[n] = floating and any(rg.get(a, False) for a in ins)
    return rg, mode


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)


# --- finding matches in one graph ---------------------------------------------------------------------------


@dataclass
class _Match:
    """A match with its runtime data: node map, bindings, and the site record."""

    site: SwapSite
    pattern: _Pattern  # the exact pattern
    nmap: dict[Node, Node]
    binds: list[Node]  # graph nodes bound to the pattern's tensor parameters, in parameter order
    args_template: list[Any]  # pattern arguments: graph nodes for tensors, values for scalars
    out_nodes: list[Node]  # graph nodes of the pattern's outputs (flattened)
    gm: torch.fx.GraphModule


def _site_loc(node: Node) -> tuple[SourceLoc, str]:
    return (source_of(node) if node.meta.get("stack_trace") else SourceLoc()), module_path_of(node)


def _check_site(entry: Any, vals: list[Any]) -> str:
    """Why the kernel cannot take the matched arguments (dtype, row width, device, extra_check), or ``""``."""
    from kernel_library._device import interpreted

    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    floats = [t for t in tensors if t.is_floating_point()]
    if floats:
        x = floats[0]
        ok, why = entry.supports(x.dtype, int(x.shape[-1]) if x.dim() else 1)
        if not ok:
            return why
    for t in tensors:
        if t.device.type != "cuda" and not (t.device.type == "cpu" and interpreted()):
            return f"tensors on {t.device}: the Triton kernel needs CUDA (or TRITON_INTERPRET=1 for CPU tensors)"
    if entry.extra_check is not None:
        try:
            if not entry.extra_check(*vals):
                return "the kernel's extra_check refused these shapes/dtypes"
        except Exception as e:
            return f"the kernel's extra_check raised {type(e).__name__}: {first_line(str(e))}"
    return ""


def find_matches(gm: torch.fx.GraphModule, library: PatternLibrary, graph_index: int,
                 site_counter: Iterator[int] | None = None) -> tuple[list[_Match], list[NearMiss]]:
    """All matches of the library's patterns in canonical graph ``gm``, and the near-misses.

    Matches may overlap (an ``rmsnorm`` inside an ``add_rmsnorm``); :func:`rewrite` applies non-overlapping ones.
    """
    site_counter = site_counter if site_counter is not None else itertools.count()
    by_target: dict[Any, list[Node]] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            by_target.setdefault(n.target, []).append(n)
    matches: list[_Match] = []
    near: list[NearMiss] = []
    for name, variants in library.loose.items():
        entry = library.kernels[name]
        anchors: dict[Node, _Attempt] = {}
        found: set[Node] = set()
        seen_sets: set[frozenset[Node]] = set()
        for pat in variants:
            if not pat.outputs or pat.outputs[0].op != "call_function":
                continue
            matcher = _Matcher(pat, by_target, strict=False)
            for anchor in by_target.get(pat.outputs[0].target, []):
                if anchor in found:
                    continue
                attempt = anchors.setdefault(anchor, _Attempt())
                st = matcher.run(anchor, attempt)
                if st is None:
                    continue
                found.add(anchor)
                m, miss = _confirm(gm, library, entry, pat, st, anchor, graph_index, by_target)
                if m is not None:
                    nodes = frozenset(m.nmap.values())
                    if nodes not in seen_sets:  # a symmetric pattern (RoPE's q and k) matches twice from two anchors
                        seen_sets.add(nodes)
                        matches.append(m)
                elif miss is not None:
                    near.append(miss)
        n_ops = max(v.n_ops for v in variants)
        for anchor, attempt in anchors.items():
            if anchor in found or attempt.depth < max(2, math.ceil(NEAR_MISS_MIN_SHARE * n_ops)):
                continue
            src, mod = _site_loc(anchor)
            near.append(NearMiss(name, entry.replaces, graph_index,
                                 tuple(f"g{graph_index}:{n.name}" for n in _topo_sorted(gm, attempt.matched)), (),
                                 src, mod, attempt.reason, attempt.kind))
    # keys: occurrence among (kernel, module path, source) in this graph
    seen: dict[tuple[str, str, str], int] = {}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    matches.sort(key=lambda m: (order[m.out_nodes[0]], m.site.kernel))
    for m in matches:
        k = (m.site.key.kernel, m.site.key.module_path, m.site.key.source)
        occ = seen.get(k, 0)
        seen[k] = occ + 1
        m.site = replace(m.site, key=replace(m.site.key, occurrence=occ), id=f"s{next(site_counter)}")
    return matches, near


def _topo_sorted(gm: torch.fx.GraphModule, nodes: Sequence[Node]) -> list[Node]:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return sorted((n for n in nodes if n in order), key=order.__getitem__)


def _confirm(gm: torch.fx.GraphModule, library: PatternLibrary, entry: Any, loose: _Pattern, st: _State,
             anchor: Node, gi: int, by_target: dict[Any, list[Node]]) -> tuple[_Match | None, NearMiss | None]:
    """Exact pass at a loose match: retrace the pattern on the site's values and match every constant."""
    src, mod = _site_loc(anchor)
    ph_by_name = {name: ph for ph, name in loose.tensor_placeholders.items()}
    vals: list[Any] = []
    for p in loose.params:
        if p in ph_by_name:
            vals.append(_val(st.binds[ph_by_name[p]]))
        elif p in st.scalars:
            vals.append(st.scalars[p])
        else:  # a parameter the pattern does not use
            vals.append(None)
    op_ids = tuple(f"g{gi}:{n.name}" for n in _topo_sorted(gm, list(st.rmap)))

    def miss(reason: str, kind: str) -> NearMiss:
        return NearMiss(entry.name, entry.replaces, gi, op_ids, (), src, mod, reason, kind)

    exact = library.exact(entry, vals)
    if isinstance(exact, str):
        return None, miss(exact, "structure")
    attempt = _Attempt()
    st2 = _Matcher(exact, by_target, strict=True).run(anchor, attempt)
    if st2 is None:
        return None, miss(f"matches the pattern's ops but not its exact form at these shapes/dtypes: {attempt.reason}",
                          attempt.kind if attempt.kind != "structure" else "constant")
    if set(st2.rmap) != set(st.rmap):
        return None, miss("the exact pattern covers other ops than the loose one", "structure")
    why = _check_site(entry, vals)
    if why:
        return None, miss(f"{entry.name} cannot take this site: {why}", "check")
    ph_by_name_exact = {name: ph for ph, name in exact.tensor_placeholders.items()}
    args_template: list[Any] = []
    binds: list[Node] = []
    for p, v in zip(exact.params, vals):
        if p in ph_by_name_exact:
            node = st2.binds[ph_by_name_exact[p]]
            args_template.append(node)
            binds.append(node)
        else:
            args_template.append(v)
    out_nodes = [st2.nmap[o] if o.op != "placeholder" else st2.binds[o] for o in exact.outputs]
    inputs = tuple((p, tensor_meta(_val(n))) for p, n in zip([p for p in exact.params if p in ph_by_name_exact], binds))
    site = SwapSite(
        id="", kernel=entry.name, pattern=entry.replaces, graph_index=gi,
        key=MatchKey(entry.name, mod, f"{Path(src.file).name}:{src.line}" if src.file else ""),
        op_ids=op_ids, chain_ids=(), source=src, module_path=mod, inputs=inputs,
        scalars={k: float(v) for k, v in st.scalars.items()},
        outputs=tuple(tensor_meta(t) for o in out_nodes for t in _tensors(_val(o))), n_ops=len(exact.ops),
    )
    return _Match(site, exact, dict(st2.nmap), binds, args_template, out_nodes, gm), None


# --- rewriting ----------------------------------------------------------------------------------------------


def _real_like(val: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A real zero tensor with ``val``'s shape, strides, dtype and device (for tracing a replacement)."""
    t = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=val.device)
    with torch.no_grad():
        t.zero_()
    return t.requires_grad_(requires_grad and (t.is_floating_point() or t.is_complex()))


def trace_replacement(m: _Match, requires_grad: dict[Node, bool], grad_mode: bool) -> torch.fx.GraphModule:
    """``m``'s kernel replacement traced to a pre-dispatch graph (it calls the ``fusion_advisor::`` custom op).

    Traced on real zero tensors, not fake ones: a ``triton_op``'s fake implementation runs its Python body, and
    under ``TRITON_INTERPRET=1`` that launches the interpreter, which cannot take fake tensors. The tensors carry
    the ``requires_grad`` the values have at run time, and grad mode is that of the site, because a replacement
    may branch on them (the cross-entropy kernel computes its gradient in the forward only when needed).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import make_fx

    with unset_fake_temporarily():
        args = [_real_like(_val(a), requires_grad.get(a, False)) if isinstance(a, Node) else a
                for a in m.args_template]
        with torch.set_grad_enabled(grad_mode), quiet_torch_logs():
            return make_fx(m.pattern.entry.replacement, pre_dispatch=True)(*args)


def rewrite(gm: torch.fx.GraphModule, matches: Sequence[_Match], input_requires_grad: Sequence[bool],
            grad_enabled: bool) -> tuple[list[_Match], list[tuple[_Match, str]]]:
    """Replace each match in ``gm`` by its kernel's custom op; larger matches first, overlaps skipped.

    Returns ``(applied, skipped)`` with a reason per skipped match. Ends with ``graph.lint()``, ``recompile()``.
    """
    applied: list[_Match] = []
    skipped: list[tuple[_Match, str]] = []
    taken: dict[Node, _Match] = {}
    replaced: dict[Node, Node] = {}  # output node of an applied match -> the node that now computes it
    rg, mode = grad_flags(gm, input_requires_grad, grad_enabled)
    for m in sorted(matches, key=lambda m: -m.site.n_ops):
        nodes = set(m.nmap.values())
        clash = next((taken[n] for n in nodes if n in taken), None)
        if clash is not None:
            skipped.append((m, f"overlaps {clash.site.kernel} swap {clash.site.id} ({clash.site.key})"))
            continue
        modes = {mode[n] for n in nodes}
        if len(modes) != 1:
            skipped.append((m, "the pattern spans a grad-mode change"))
            continue
        # inputs produced by an earlier swap (one add_rmsnorm's residual feeds the next) now come from its op
        live = replace(m, args_template=[replaced.get(a, a) if isinstance(a, Node) else a for a in m.args_template],
                       binds=[replaced.get(b, b) for b in m.binds])
        try:
            rgm = trace_replacement(live, rg, modes.pop())
            new_outs = _inline(gm, live, rgm)
        except Exception as e:  # a kernel whose replacement fails to trace is skipped, the rest continues
            skipped.append((m, f"rewriting raised {type(e).__name__}: {first_line(str(e))}"))
            continue
        for old, new in zip(m.out_nodes, new_outs):
            if isinstance(new, Node):
                replaced[old] = new
                rg[new] = rg.get(old, False)
                mode[new] = mode.get(old, grad_enabled)
        for n in nodes:
            taken[n] = m
        applied.append(m)
    gm.graph.lint()
    gm.recompile()
    return applied, skipped


def _inline(gm: torch.fx.GraphModule, m: _Match, rgm: torch.fx.GraphModule) -> list[Any]:
    """Insert ``rgm``'s ops for match ``m`` into ``gm``, reroute the outputs' users, erase the matched ops;
    return the new output values (nodes), aligned with ``m.out_nodes``."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    mapped = set(m.nmap.values())
    inputs = [a for a in m.args_template if isinstance(a, Node)]
    last_input = max((order[a] for a in inputs), default=-1)
    users = [u for o in m.out_nodes for u in o.users if u not in mapped]
    first_user = min((order[u] for u in users), default=len(order))
    if last_input >= first_user:
        raise RuntimeError("no place in the graph where all inputs exist and no output is used yet")
    anchor = m.out_nodes[0]
    before = next(n for n in graph.nodes if order[n] == first_user) if first_user < len(order) else None
    rph = [n for n in rgm.graph.nodes if n.op == "placeholder"]
    env: dict[Node, Any] = dict(zip(rph, m.args_template))
    ctx = graph.inserting_before(before) if before is not None else graph.inserting_before(
        next(n for n in graph.nodes if n.op == "output"))
    results: list[Any] = []
    inserted: list[Node] = []
    try:
        with ctx:
            for n in rgm.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "output":
                    results = torch.utils._pytree.tree_leaves(torch.fx.node.map_arg(n.args[0], lambda a: env[a]))
                    continue
                if n.op == "get_attr":
                    raise RuntimeError("the traced replacement holds constants (get_attr); cannot inline it")
                new = graph.node_copy(n, lambda a: env[a])
                inserted.append(new)
                for k in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                    if k in anchor.meta:
                        new.meta[k] = anchor.meta[k]
                new.meta["val"] = _fakeify(n.meta.get("val"), _val(anchor))
                env[n] = new
        if len(results) != len(m.out_nodes):
            raise RuntimeError(f"replacement returns {len(results)} values, the pattern {len(m.out_nodes)}")
        for old, new in zip(m.out_nodes, results):
            old_val, new_val = _val(old), _val(new) if isinstance(new, Node) else new
            if not (isinstance(old_val, torch.Tensor) and isinstance(new_val, torch.Tensor)):
                raise RuntimeError("replacement and pattern outputs are not both tensors")
            if old_val.dtype != new_val.dtype or tuple(old_val.shape) != tuple(new_val.shape):
                raise RuntimeError(f"replacement output {tuple(new_val.shape)} {new_val.dtype} differs from the "
                                   f"pattern's {tuple(old_val.shape)} {old_val.dtype}")
    except Exception:  # leave the graph as it was: no half-inserted replacement runs
        for n in reversed(inserted):
            graph.erase_node(n)
        raise
    for old, new in zip(m.out_nodes, results):
        old.replace_all_uses_with(new)
    for n in reversed(list(graph.nodes)):
        if n in mapped and not n.users:
            graph.erase_node(n)
    return results


def _fakeify(val: Any, like: Any) -> Any:
    """``val`` (real tensors from the replacement trace) as fake tensors of ``like``'s fake mode."""
    mode = getattr(like, "fake_mode", None)
    if mode is None:
        return None

    def conv(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            with mode:
                return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
        return t

    return torch.utils._pytree.tree_map(conv, val)


# --- the backend --------------------------------------------------------------------------------------------


Selector = Callable[[SwapSite], bool]


class RewriteBackend:
    """A ``torch.compile`` backend that swaps library kernels into every graph dynamo hands it.

    Per graph: dynamo graph -> pre-dispatch aten graph (``make_fx``) -> :func:`canonicalize` ->
    :func:`find_matches` -> :func:`rewrite` of the matches ``select`` accepts -> run the graph eagerly, or
    Inductor's ``compile_fx`` when ``compile_rest``. Any failure in matching or rewriting is recorded in the
    graph's :class:`GraphRecord` and the graph runs unrewritten: the model never breaks because of a swap.

    Args:
        kernels: ``{name: KernelEntry}`` to match; default every registered kernel.
        select: which matches to rewrite (default: none, i.e. find only).
        compile_rest: hand the rewritten graph to Inductor.
        record_values: on the first call of each graph, record the values of every matched input and output
            (:attr:`values`), for verification on the model's real inputs.
        analyze: also trace the decomposed aten graph the analysis stages read (:attr:`GraphRecord.analysis_graph`).
        keep_graphs: keep a copy of each canonical graph before rewriting.
    """

    def __init__(self, kernels: dict[str, Any] | None = None, select: Selector | None = None,
                 compile_rest: bool = False, record_values: bool = False, analyze: bool = False,
                 keep_graphs: bool = False, library: PatternLibrary | None = None):
        if library is None:
            from kernel_library.registry import load_all

            library = PatternLibrary.for_kernels(kernels if kernels is not None else load_all())
        self.library = library
        self.select = select or (lambda site: False)
        self.compile_rest = compile_rest
        self.record_values = record_values
        self.analyze = analyze
        self.keep_graphs = keep_graphs
        self.graphs: list[GraphRecord] = []
        self.breaks: list[GraphBreak] = []
        self.values: dict[int, dict[str, Any]] = {}  # graph index -> node name -> recorded value
        self._sites = itertools.count()

    # dynamo calls this
    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        index = len(self.graphs)
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and getattr(reason, "graph_break", False):
            self.breaks.append(GraphBreak(reason=first_line(reason.reason),
                                          source=user_loc(getattr(reason, "user_stack", None)), graph_index=index))
        record = GraphRecord(index=index)
        self.graphs.append(record)
        record.grad_enabled = torch.is_grad_enabled()
        record.input_requires_grad = [bool(getattr(x, "requires_grad", False)) for x in example_inputs]
        try:
            aten = to_aten_graph(gm, example_inputs)
        except Exception as e:  # not traceable to aten: run dynamo's graph as it is
            record.error = f"tracing to aten failed: {type(e).__name__}: {first_line(str(e))}"
            return gm.forward
        try:
            canonicalize(aten)
            if self.keep_graphs:
                record.graph = _copy_graph_module(aten)
            if self.analyze:
                try:
                    record.analysis_graph = to_analysis_graph(aten, example_inputs)
                except Exception as e:  # the analysis loses this graph's chains; matching goes on
                    record.error = f"decomposing for the analysis failed: {type(e).__name__}: {first_line(str(e))}"
            matches, near = find_matches(aten, self.library, index, self._sites)
            record.matches, record.near_misses = matches, near
            if self.record_values:
                return self._recording_runner(aten, record, index)
            selected = [m for m in matches if self.select(m.site)]
            runnable = aten
            if selected:
                # rewrite a copy, so that a failure half-way leaves ``aten`` intact to run unrewritten
                runnable = _copy_graph_module(aten)
                again, _ = find_matches(runnable, self.library, index, itertools.count())
                keys = {m.site.key for m in selected}
                applied, skipped = rewrite(runnable, [m for m in again if m.site.key in keys],
                                           record.input_requires_grad, record.grad_enabled)
                record.applied = [m.site.key for m in applied]
                record.skipped = [(m.site.key, why) for m, why in skipped]
        except Exception as e:  # a bug or an unexpected graph: record it, run the canonical graph unrewritten
            record.error = f"{type(e).__name__}: {first_line(str(e))}"
            record.applied = []
            runnable = aten
        if self.compile_rest:
            try:
                from torch._inductor.compile_fx import compile_fx

                return compile_fx(runnable, example_inputs)
            except Exception as e:  # Inductor failed on this graph: run it eagerly and say so
                record.compile_rest_error = f"{type(e).__name__}: {first_line(str(e))}"
        return runnable.forward

    def _recording_runner(self, aten: torch.fx.GraphModule, record: GraphRecord, index: int) -> Callable[..., Any]:
        wanted: set[str] = set()
        for m in record.matches:
            wanted.update(n.name for n in m.binds)
            wanted.update(n.name for n in m.out_nodes)
        store = self.values.setdefault(index, {})

        class _Recorder(torch.fx.Interpreter):
            def run_node(self, n: Node) -> Any:
                out = super().run_node(n)
                if n.name in wanted and n.name not in store:
                    store[n.name] = torch.utils._pytree.tree_map(
                        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)
                return out

        def run(*args: Any) -> Any:
            if len(store) < len(wanted):
                return _Recorder(aten).run(*args)
            return aten(*args)

        return run

    # summaries
    def sites(self) -> list[SwapSite]:
        return [m.site for g in self.graphs for m in g.matches]

    def applied(self) -> list[MatchKey]:
        return [k for g in self.graphs for k in g.applied]


def _copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with its own graph (node meta copied), sharing ``gm``'s attributes."""
    new_graph = torch.fx.Graph()
    out_value = new_graph.graph_copy(gm.graph, {})
    new_graph.output(out_value)
    return torch.fx.GraphModule(gm, new_graph)


def to_aten_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
    """A dynamo graph traced to a pre-dispatch aten graph on fake copies of ``example_inputs``.

    Node meta (``stack_trace``, ``nn_module_stack``) is carried over; ``meta["val"]`` holds fake tensors.
    """
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with torch.fx.traceback.preserve_node_meta(), quiet_torch_logs():
        fake = [fake_mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor)
                and not isinstance(x, torch._subclasses.FakeTensor) else x for x in example_inputs]
        with fake_mode:
            return make_fx(torch.fx.Interpreter(gm).run, pre_dispatch=True)(*fake)


def to_analysis_graph(aten: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
    """The pre-dispatch graph decomposed to the aten ops the analysis stages know (``linear`` -> ``mm``, ...).

    Each node's ``meta["from_node"]`` names the pre-dispatch node it came from (torch >= 2.6), which links the
    analysis chains to the matches.
    """
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with torch.fx.traceback.preserve_node_meta(), quiet_torch_logs():
        fake = [fake_mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor)
                and not isinstance(x, torch._subclasses.FakeTensor) else x for x in example_inputs]
        with fake_mode, torch.no_grad():
            return make_fx(torch.fx.Interpreter(aten).run)(*fake)


def origin_of(node: Node) -> str:
    """Name of the pre-dispatch node an analysis-graph node came from (``meta["from_node"]``), or ``""``."""
    src = node.meta.get("from_node")
    if not src:
        return ""
    first = src[0]
    return getattr(first, "name", "") or ""


# --- subgraph extraction (for verification) -----------------------------------------------------------------


def extract_subgraph(m: _Match) -> torch.fx.GraphModule:
    """The matched ops of the user's graph as a GraphModule ``f(*tensor_inputs) -> outputs`` (one per output,
    a tuple when several), inputs in the pattern's parameter order."""
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    for i, b in enumerate(m.binds):
        if b not in env:
            ph = graph.placeholder(f"in{i}_{b.name}")
            ph.meta = dict(b.meta)
            env[b] = ph
    order = {n: i for i, n in enumerate(m.gm.graph.nodes)}
    for n in sorted(m.nmap.values(), key=order.__getitem__):
        env[n] = graph.node_copy(n, lambda a: env[a])
    outs = [env[o] for o in m.out_nodes]
    graph.output(outs[0] if len(outs) == 1 else tuple(outs))
    graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph)


# --- the apply pipeline -------------------------------------------------------------------------------------


@dataclass
class ApplyOptions:
    """Options of :func:`apply` (the CLI's flags).

    Attributes:
        verify: verify (and on a GPU benchmark) each candidate; without it apply only finds and reports matches.
        backward: also verify gradients and time forward+backward; ``None``: when the model is in training mode.
        candidates: ``"routed"`` (only chains the analysis routes to the kernel) or ``"all"`` (every match).
        margin: keep a swap only when it beats the better of eager and torch.compile by this fraction.
        compile_rest: run the rest of each rewritten graph under Inductor instead of eagerly (forced). Without
            it the rest runs eagerly on a CPU; on a GPU both are timed and the faster one, checked again against
            the original, goes into the plan (compiling is not always a win).
        keep_unmeasured: keep verified swaps that could not be timed (no GPU).
        seeds: fresh random input draws per swap verification.
        kernels: restrict matching to these kernel names (default: every library kernel).
        gpu: device spec for the analysis (``h200``, ...); default the present GPU's, else h200.
        rules_files: user rules files, matched before the shipped rules.
        bench_model: on a GPU, time the whole model eager / torch.compile / advised.
    """

    verify: bool = False
    backward: bool | None = None
    candidates: str = "routed"
    margin: float = 0.03
    compile_rest: bool = False
    keep_unmeasured: bool = False
    seeds: int = 2
    kernels: tuple[str, ...] | None = None
    gpu: str | None = None
    rules_files: tuple[str, ...] = ()
    bench_model: bool = True

    def check(self) -> None:
        """Raise :class:`~fusion_advisor.errors.UserError` on an invalid option (before any long work)."""
        from fusion_advisor.errors import UserError

        if self.candidates not in CANDIDATE_POLICIES:
            raise UserError(f"unknown --candidates {self.candidates!r}; choose {' or '.join(CANDIDATE_POLICIES)}")
        if not (0.0 <= self.margin < 1.0) or math.isnan(self.margin):
            raise UserError(f"--margin {self.margin}: must be in [0, 1) (0.03 keeps swaps at least 3% faster)")
        if self.seeds < 0:
            raise UserError(f"--seeds {self.seeds}: must be 0 or more")

    def to_dict(self) -> dict[str, Any]:
        return {"verify": self.verify, "backward": self.backward, "candidates": self.candidates,
                "margin": self.margin, "compile_rest": self.compile_rest, "keep_unmeasured": self.keep_unmeasured,
                "seeds": self.seeds, "kernels": list(self.kernels) if self.kernels else None, "gpu": self.gpu,
                "rules_files": [str(r) for r in self.rules_files], "bench_model": self.bench_model}


@dataclass
class ApplyResult:
    """Everything one ``apply`` run found and decided.

    Attributes:
        model_name, model_file, convention, device, dtype: as loaded.
        options: the options; ``backward``: whether gradients were verified / timed.
        sites: every match (:class:`SwapSite`); ``outcomes``: decision per site id.
        near_misses: places that almost matched, with reasons.
        analysis: the analysis of apply's own capture (chains, estimates, routes).
        whole_model: the patched-vs-original check (``None`` when nothing was kept).
        whole_model_bench: eager / torch.compile / advised timings (GPU only).
        graph_breaks, warnings: as captured; ``library_problems``: kernels that cannot be matched, and why.
        versions, timings_s: library versions; wall time per stage.
        compile_rest: how the plan runs the rest of each graph (Inductor or eager), and ``rest_reason`` why.
        patched: the patched model (in memory only), or ``None``.
        loaded: the :class:`~fusion_advisor.load.LoadedModel` (model and example inputs; in memory only).
    """

    model_name: str
    model_file: str
    convention: str
    device: str
    dtype: str
    options: ApplyOptions
    backward: bool
    sites: list[SwapSite]
    outcomes: dict[str, Any]
    near_misses: list[NearMiss]
    analysis: Any
    whole_model: Any = None
    whole_model_bench: Any = None
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    library_problems: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    compile_rest: bool = False
    rest_reason: str = ""
    patched: Any = None
    loaded: Any = None

    @property
    def kept(self) -> list[SwapSite]:
        return [s for s in self.sites if self.outcomes[s.id].kept]


@contextlib.contextmanager
def _no_progress(_: str) -> Iterator[None]:
    yield


def apply(model_path: str | Path | None, options: ApplyOptions | None = None, device: str | None = None,
          dtype: str = "", stage: Callable[[str], contextlib.AbstractContextManager] = _no_progress) -> ApplyResult:
    """Run ``apply`` on a model file (``None``: the built-in default model); see :func:`apply_module`.

    Args:
        device: ``"cpu"`` or ``"cuda"`` (default: cuda when present). ``meta`` is refused: apply runs the model.
        dtype: ``""``, ``"fp32"``, ``"bf16"`` or ``"fp16"``.

    Raises:
        UserError: bad options, a model file that cannot be loaded or run, no capturable graph.
    """
    from fusion_advisor.errors import UserError
    from fusion_advisor.load import load_model

    options = options or ApplyOptions()
    options.check()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "meta":
        raise UserError("apply runs the model to verify swaps on real values: use --device cpu or cuda, not meta")
    from kernel_library._device import interpreted

    if device == "cpu" and not interpreted():
        raise UserError("on --device cpu the Triton kernels run only in Triton's interpreter: set TRITON_INTERPRET=1 "
                        "before triton is first imported (the fusion-advisor command does this without a GPU)")
    # cheap checks first, so that a bad option fails before a long model load
    from fusion_advisor.analyze import default_spec_name
    from fusion_advisor.devices import load_spec
    from fusion_advisor.rules import load_rules

    _library_for(options)
    load_spec(options.gpu or default_spec_name())
    load_rules(list(options.rules_files))
    with stage("load"):
        loaded = load_model(model_path, device=device, dtype=dtype)
    return apply_module(loaded, options, stage)


def _library_for(options: ApplyOptions) -> dict[str, Any]:
    from fusion_advisor.errors import UserError
    from kernel_library.registry import load_all

    every = load_all()
    if not options.kernels:
        return dict(every)
    unknown = [k for k in options.kernels if k not in every]
    if unknown:
        raise UserError(f"unknown kernel(s) {', '.join(unknown)}; known kernels: {', '.join(sorted(every))}")
    return {k: every[k] for k in options.kernels}


def apply_module(loaded: Any, options: ApplyOptions | None = None,
                 stage: Callable[[str], contextlib.AbstractContextManager] = _no_progress) -> ApplyResult:
    """Find, verify, time and keep kernel swaps in ``loaded`` (a :class:`~fusion_advisor.load.LoadedModel`).

    Stages: capture (dynamo + :class:`RewriteBackend`, recording each match's real inputs) -> analysis (graph,
    chains, roofline, routes of the capture) -> candidates -> verify + benchmark each (``options.verify``) ->
    keep winners (non-overlapping) -> whole-model check (and GPU benchmark) of the patched model.
    """
    from fusion_advisor.analyze import default_spec_name, versions
    from fusion_advisor.devices import load_spec
    from fusion_advisor.rules import load_rules

    options = options or ApplyOptions()
    options.check()
    kernels = _library_for(options)
    spec = load_spec(options.gpu or default_spec_name())
    rules = load_rules(list(options.rules_files))
    backward = options.backward if options.backward is not None else bool(loaded.module.training)
    timings: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        with stage(name):
            yield
        timings[name] = time.perf_counter() - start

    with timed("capture"):
        backend = _capture(loaded, kernels, backward)
    with timed("analyze"):
        analysis = _analyze(loaded, backend, spec, rules)
        sites, near = _link(backend, analysis, options)
    matches = {m.site.id: m for g in backend.graphs for m in g.matches}
    with timed("verify"):
        outcomes = _verify_all(sites, matches, backend, kernels, options, backward, stage)
    result = ApplyResult(
        model_name=loaded.name, model_file=loaded.file, convention=loaded.convention, device=loaded.device,
        dtype=loaded.dtype, options=options, backward=backward, sites=sites, outcomes=outcomes, near_misses=near,
        analysis=analysis, graph_breaks=list(backend.breaks), library_problems=dict(backend.library.problems),
        versions=versions(), timings_s=timings, loaded=loaded,
    )
    result.warnings += [f"graph {g.index}: {g.error}" for g in backend.graphs if g.error]
    with timed("whole model"):
        _whole_model(result, loaded, kernels)
    return result


def _capture(loaded: Any, kernels: dict[str, Any], backward: bool) -> RewriteBackend:
    from fusion_advisor.capture import run_eagerly
    from fusion_advisor.errors import CaptureError

    backend = RewriteBackend(kernels, record_values=True, analyze=True)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(loaded.module, backend=backend, dynamic=False)
        with torch.set_grad_enabled(backward), warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            compiled(*loaded.inputs)
    except Exception as e:
        run_eagerly(loaded)  # the model's own failure gets the model's message
        raise CaptureError(f"{loaded.file}: capturing the model with torch.compile failed: {type(e).__name__}: "
                           f"{first_line(str(e))}") from e
    finally:
        torch._dynamo.reset()
    if not backend.graphs:
        raise CaptureError(f"{loaded.file}: dynamo captured no graph (the whole forward ran eagerly)")
    return backend


def _analyze(loaded: Any, backend: RewriteBackend, spec: Any, rules: Any) -> Any:
    """The analysis stages (graph, chains, roofline, routes) on the capture's decomposed graphs."""
    from fusion_advisor.analyze import versions
    from fusion_advisor.capture import Capture
    from fusion_advisor.chains import build_chains
    from fusion_advisor.graph import build_op_graph
    from fusion_advisor.records import Analysis
    from fusion_advisor.roofline import estimate_all
    from fusion_advisor.route import route_all

    graphs = []
    warns: list[str] = []
    for g in backend.graphs:
        if g.analysis_graph is None:
            warns.append(f"graph {g.index} could not be decomposed for the analysis; its chains are missing")
            graphs.append(torch.fx.GraphModule(torch.nn.Module(), _empty_graph()))
        else:
            graphs.append(g.analysis_graph)
    og = build_op_graph(Capture(graphs=graphs, method="dynamo", breaks=list(backend.breaks)))
    chains = build_chains(og)
    estimates = estimate_all(chains, og.ops, spec)
    decisions = route_all(chains, estimates, rules)
    return Analysis(
        model_name=loaded.name, model_file=loaded.file, convention=loaded.convention, device=loaded.device,
        dtype=loaded.dtype, device_spec=spec.to_dict(), rules_files=list(rules.files), capture_method="dynamo",
        graph_breaks=list(backend.breaks), warnings=warns, ops=og.ops, chains=chains, estimates=estimates,
        decisions=decisions, versions=versions(),
    )


def _empty_graph() -> torch.fx.Graph:
    g = torch.fx.Graph()
    g.output(())
    return g


def _link(backend: RewriteBackend, analysis: Any, options: ApplyOptions) -> tuple[list[SwapSite], list[NearMiss]]:
    """Chain ids, routes and candidacy of every site; near-misses with chain ids, filtered and completed."""
    chain_of_op = {op_id: c.id for c in analysis.chains for op_id in c.op_ids}
    by_origin: dict[tuple[int, str], set[str]] = {}
    by_loc: dict[tuple[int, str, str, int], set[str]] = {}
    linked = False
    for g in backend.graphs:
        if g.analysis_graph is None:
            continue
        for n in g.analysis_graph.graph.nodes:
            cid = chain_of_op.get(f"g{g.index}:{n.name}")
            if cid is None:
                continue
            src = origin_of(n)
            if src:
                linked = True
                by_origin.setdefault((g.index, src), set()).add(cid)
            loc = source_of(n) if n.meta.get("stack_trace") else SourceLoc()
            by_loc.setdefault((g.index, module_path_of(n), loc.file, loc.line), set()).add(cid)
    node_locs: dict[tuple[int, str], tuple[str, str, int]] = {}
    if not linked:  # torch without from_node provenance: link by module path and source line
        for g in backend.graphs:
            if g.graph is not None:
                for n in g.graph.nodes:
                    loc = source_of(n) if n.meta.get("stack_trace") else SourceLoc()
                    node_locs[(g.index, n.name)] = (module_path_of(n), loc.file, loc.line)

    def chains_of(gi: int, op_ids: Sequence[str]) -> tuple[str, ...]:
        counts: dict[str, int] = {}
        for op_id in op_ids:
            name = op_id.split(":", 1)[1]
            found = by_origin.get((gi, name), set()) if linked else by_loc.get((gi, *node_locs.get((gi, name), ("", "", 0))), set())
            for c in found:
                counts[c] = counts.get(c, 0) + 1
        return tuple(sorted(counts, key=lambda c: (-counts[c], int(c[1:]) if c[1:].isdigit() else 0)))

    sites: list[SwapSite] = []
    for g in backend.graphs:
        for m in g.matches:
            s = m.site
            chain_ids = chains_of(g.index, s.op_ids)
            decs = [analysis.decisions[c] for c in chain_ids if c in analysis.decisions]
            routed = next((d for d in decs if d.route == "triton" and d.kernel == s.kernel), None)
            main = routed or next((d for d in decs if d.route == "triton"), decs[0] if decs else None)
            route_text = (f"chain {main.chain_id} -> {main.route}{'/' + main.kernel if main.kernel else ''} "
                          f"(rule {main.rule_id})") if main else "no analysis chain linked to these ops"
            if options.candidates == "all":
                candidate, why = True, f"tried (--candidates all); analysis: {route_text}"
            elif routed is not None:
                candidate, why = True, f"analysis routes {route_text}"
            else:
                candidate, why = False, (f"not tried: analysis routes {route_text}; --candidates all tries every "
                                         f"match")
            s = replace(s, chain_ids=chain_ids, route=main.route if main else "", route_kernel=main.kernel if main
                        else "", route_rule=main.rule_id if main else "", candidate=candidate, candidate_reason=why)
            m.site = s
            sites.append(s)

    matched_ops = {op for s in sites for op in s.op_ids}
    near: list[NearMiss] = []
    seen: set[tuple[str, tuple[str, ...], str]] = set()
    for g in backend.graphs:
        for nm in g.near_misses:
            if nm.kind != "check" and nm.op_ids and set(nm.op_ids) <= matched_ops:
                continue  # a partial match of ops another kernel's match already covers
            key = (nm.kernel, nm.op_ids, nm.reason)
            if key in seen:
                continue
            seen.add(key)
            near.append(replace(nm, chain_ids=chains_of(g.index, nm.op_ids)))
    # chains the analysis names after a kernel's pattern that no match and no near-miss covers
    by_pattern: dict[str, list[str]] = {}
    for name, entry in backend.library.kernels.items():
        by_pattern.setdefault(entry.replaces, []).append(name)
    covered = {c for s in sites for c in s.chain_ids} | {c for nm in near for c in nm.chain_ids}
    for c in analysis.chains:
        if c.kind != "fusible" or c.pattern not in by_pattern or c.id in covered:
            continue
        names = by_pattern[c.pattern]
        problems = [f"{k}: {backend.library.problems[k]}" for k in names if k in backend.library.problems]
        reason = (f"the analysis found a {c.pattern} chain ({len(c.targets)} ops) but no op sequence in it matches "
                  f"the pattern of {', '.join(names)}" + (f" ({'; '.join(problems)})" if problems else ""))
        near.append(NearMiss(names[0], c.pattern, c.graph_index, tuple(c.op_ids), (c.id,), c.source, c.module_path,
                             reason, "chain"))
    return sites, near


def _values_for(backend: RewriteBackend, m: _Match) -> tuple[list[Any] | None, list[Any] | None]:
    vals = backend.values.get(m.site.graph_index, {})
    args: list[Any] = []
    for a in m.args_template:
        if isinstance(a, Node):
            if a.name not in vals:
                return None, None
            args.append(vals[a.name])
        else:
            args.append(a)
    outs = []
    for o in m.out_nodes:
        if o.name not in vals:
            return args, None
        outs.extend(t for t in _tensors(vals[o.name]))
    return args, outs


def _verify_and_time(s: SwapSite, m: _Match, entry: Any, args: list[Any], outs: list[Any], rg: list[bool],
                     first: tuple[str, Any] | None, options: ApplyOptions, backward: bool,
                     timing_cache: dict[str, Any]) -> Any:
    """Verify one candidate swap (only on its captured inputs when ``first``, an earlier site of the same signature,
    passed the fresh and hard-value cases), time it when verified, and decide; returns its ``SwapOutcome``."""
    from fusion_advisor import swaps as sw

    try:
        ver = sw.verify_swap(entry, extract_subgraph(m), args, m.pattern.params, backward, options.seeds, outs,
                             requires_grad=rg, captured_only=first is not None)
    except Exception as e:  # a bug in verification itself must not keep the swap, nor stop the others
        ver = sw.SwapVerification(False, reason=f"verification raised {type(e).__name__}: {first_line(str(e))}")
    if first is not None:
        first_id, first_ver = first
        ver.details.append(f"fresh and hard-value cases: passed on {first_id} (same signature)")
        ver.cases += [f"{c} (on {first_id})" for c in first_ver.cases[1:]]
    timing = None
    if ver.verified:
        cache_key = f"{s.signature}|{backward}|{rg}"
        try:
            timing = timing_cache.get(cache_key) or sw.bench_swap(entry, extract_subgraph(m), args, backward, rg)
            timing_cache[cache_key] = timing
        except Exception as e:  # a kernel that fails (or runs out of memory) while timed is rejected
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            return sw.SwapOutcome(s.id, sw.REJECTED, f"timing raised {type(e).__name__}: {first_line(str(e))}",
                                  ver, None)
    decision, reason = sw.decide(ver, timing, options.margin, options.keep_unmeasured)
    return sw.SwapOutcome(s.id, decision, reason, ver, timing)


def _verify_all(sites: list[SwapSite], matches: dict[str, _Match], backend: RewriteBackend,
                kernels: dict[str, Any], options: ApplyOptions, backward: bool,
                stage: Callable[[str], contextlib.AbstractContextManager] = _no_progress) -> dict[str, Any]:
    from fusion_advisor import swaps as sw

    outcomes: dict[str, Any] = {}
    timing_cache: dict[str, Any] = {}
    by_signature: dict[str, tuple[str, Any]] = {}  # signature -> (first site id, its verification)
    flags: dict[int, dict[Node, bool]] = {}  # graph index -> node -> requires grad in the model
    for g in backend.graphs:
        if g.matches:
            flags[g.index] = grad_flags(g.matches[0].gm, g.input_requires_grad, g.grad_enabled)[0] if backward else {}
    n_candidates = sum(1 for x in sites if x.candidate)
    n_seen = 0
    for s in sites:
        if not s.candidate:
            outcomes[s.id] = sw.SwapOutcome(s.id, sw.NOT_TRIED, s.candidate_reason)
            continue
        if not options.verify:
            outcomes[s.id] = sw.SwapOutcome(s.id, sw.NOT_VERIFIED, "not verified: dry run (add --verify)")
            continue
        n_seen += 1
        m = matches[s.id]
        entry = kernels[s.kernel]
        args, outs = _values_for(backend, m)
        if args is None:
            outcomes[s.id] = sw.SwapOutcome(s.id, sw.REJECTED, "verification impossible: the site's inputs were not "
                                                               "recorded during the forward pass")
            continue
        rg = [flags[s.graph_index].get(a, False) if isinstance(a, Node) else False for a in m.args_template]
        # fresh and hard-value inputs behave alike at every site of one signature: once they passed at one site,
        # the others are verified on their own captured inputs only
        sig = f"{s.signature}|{rg}"
        first = by_signature.get(sig)
        with stage(f"verifying and timing swap {s.id} ({s.kernel}, {n_seen} of {n_candidates})"):
            outcomes[s.id] = _verify_and_time(s, m, entry, args, outs, rg, first, options, backward, timing_cache)
        if first is None and outcomes[s.id].verification is not None and outcomes[s.id].verification.verified:
            by_signature[sig] = (s.id, outcomes[s.id].verification)
    # kept swaps must not overlap: larger ones first
    taken: dict[str, SwapSite] = {}
    for s in sorted((s for s in sites if outcomes[s.id].kept), key=lambda s: -s.n_ops):
        clash = next((taken[o] for o in s.op_ids if o in taken), None)
        if clash is not None:
            o = outcomes[s.id]
            # the overlap decides; what the swap earned alone follows, so the reason never reads "kept ... not kept"
            o.decision, o.reason = sw.NOT_KEPT, (f"not kept: overlaps kept swap {clash.id} ({clash.kernel}), the larger "
                                                 f"one; on its own: {o.reason.replace('kept because', 'would be kept as')}")
            continue
        for o in s.op_ids:
            taken[o] = s
    return outcomes


def _whole_model(result: ApplyResult, loaded: Any, kernels: dict[str, Any]) -> None:
    """Check the patched model against the original; drop kernels that break it; time it on a GPU."""
    from fusion_advisor import swaps as sw
    from fusion_advisor.plan import PatchedModel, PlannedSwap

    kept = result.kept
    result.compile_rest = result.options.compile_rest
    result.rest_reason = ("--compile-rest: Inductor runs the rest of each graph" if result.options.compile_rest
                          else "the rest of each graph runs eagerly (not timed against Inductor without a GPU)")
    if not kept:
        return

    def build(sites: list[SwapSite], compile_rest: bool | None = None) -> Any:
        torch._dynamo.reset()
        planned = [PlannedSwap(s.key, s.signature, s.id) for s in sites]
        rest = result.options.compile_rest if compile_rest is None else compile_rest
        return PatchedModel(loaded.module, planned, compile_rest=rest, kernels=kernels)

    def check(patched: Any) -> Any:
        with warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            c = sw.check_whole_model(loaded.module, patched, loaded.inputs, result.backward)
        c.swaps_applied = sorted({str(k) for k in patched.applied_swaps()})
        return c

    patched = build(kept)
    try:
        chk = check(patched)
    except Exception as e:
        chk = sw.WholeModelCheck(passed=False, details=[f"the patched model raised {type(e).__name__}: "
                                                        f"{first_line(str(e))}"])
    if not chk.passed:
        # find a kernel whose swaps break the whole model: drop one kernel at a time
        culprit = None
        for kernel in sorted({s.kernel for s in kept}):
            rest = [s for s in kept if s.kernel != kernel]
            if not rest:
                continue
            try:
                trial = build(rest)
                c2 = check(trial)
            except Exception:
                continue
            if c2.passed:
                culprit, patched, chk = kernel, trial, c2
                break
        for s in kept:
            if culprit is None or s.kernel == culprit:
                o = result.outcomes[s.id]
                o.decision = sw.REJECTED
                o.reason = (f"{o.reason}; rejected: the whole patched model disagrees with the original"
                            + (f" with the {culprit} swaps, and agrees without them" if culprit else ""))
        if culprit is None:
            result.whole_model = chk
            result.patched = None
            return
    # a kept swap the patched model's graphs do not contain is not kept (its replacement failed to trace, ...)
    why_not = {k: why for g in patched.backend.graphs for k, why in g.skipped}
    for s in result.kept:
        if s.key not in set(patched.applied_swaps()):
            o = result.outcomes[s.id]
            o.decision = sw.NOT_KEPT
            o.reason = (f"{o.reason}; not kept: it could not be rewritten into the model's graph: "
                        f"{why_not.get(s.key, 'the site was not found again when the patched model was compiled')}")
    result.warnings += [p for p in patched.problems() if " not rewritten: " not in p]
    if not result.kept:  # nothing could be rewritten: the "patched" model is the original
        return
    result.whole_model = chk
    result.patched = patched
    if not (result.options.bench_model and loaded.device == "cuda"):
        return
    final = result.kept
    advised = {"advised-compile-rest": lambda: build(final, True)}
    if not result.options.compile_rest:
        advised = {"advised-eager-rest": lambda: build(final, False), **advised}
    bench = sw.bench_whole_model(loaded.module, advised, loaded.inputs, result.backward)
    result.whole_model_bench = bench
    if bench.chosen == "advised-compile-rest" and not result.options.compile_rest:
        # Inductor won: check that the Inductor-compiled rest agrees too before the plan keeps it
        try:
            inductor = build(final, True)
            chk2 = check(inductor)
        except Exception as e:
            chk2 = sw.WholeModelCheck(passed=False, details=[f"raised {type(e).__name__}: {first_line(str(e))}"])
        failed = [p for p in inductor.problems() if "Inductor failed" in p]
        if failed:
            chk2 = sw.WholeModelCheck(passed=False, details=failed)
        if chk2.passed:
            result.compile_rest, result.patched = True, inductor
            result.rest_reason = (f"measured: Inductor for the rest {bench.ms('advised-compile-rest'):.4g} ms vs "
                                  f"eager {bench.ms('advised-eager-rest') or float('nan'):.4g} ms")
        else:
            bench.chosen = "advised-eager-rest" if bench.ms("advised-eager-rest") is not None else ""
            result.rest_reason = (("Inductor for the rest could not be used: " if failed else
                                   "Inductor for the rest was faster but disagrees with the original model: ")
                                  + "; ".join(chk2.details[:3]))
    elif bench.chosen == "advised-eager-rest":
        result.rest_reason = (f"measured: eager rest {bench.ms('advised-eager-rest'):.4g} ms vs Inductor "
                              f"{bench.ms('advised-compile-rest') or float('nan'):.4g} ms "
                              f"({bench.variants['advised-compile-rest'].error or 'slower'})")
    # never slower than the better of eager and torch.compile(model): otherwise the plan runs that instead
    bases = {n: bench.ms(k) for n, k in (("eager", "eager"), ("torch.compile", "compile")) if bench.ms(k) is not None}
    if bases:
        base = min(bases, key=bases.__getitem__)
        advised_ms = bench.advised_ms
        if advised_ms is None or advised_ms > bases[base]:
            what = f"{advised_ms:.4g} ms" if advised_ms is not None else "not timed"
            for s in result.kept:
                o = result.outcomes[s.id]
                o.decision = sw.NOT_KEPT
                o.reason = (f"{o.reason}; not kept: the whole advised model ({what}) is slower than {base} of the "
                            f"whole model ({bases[base]:.4g} ms)")
            result.compile_rest = base == "torch.compile"
            result.rest_reason = (f"measured: {base} of the whole model ({bases[base]:.4g} ms) beats the advised "
                                  f"model ({what}); the plan keeps no swap and runs "
                                  + ("the model under Inductor" if result.compile_rest else "the model eagerly"))
            result.patched = None


# --- outputs ------------------------------------------------------------------------------------------------


def plan_document(result: ApplyResult) -> dict[str, Any]:
    """The plan.yaml document: every decision of ``result`` (see :mod:`fusion_advisor.plan`)."""
    import fusion_advisor
    from fusion_advisor.plan import PLAN_VERSION, now_iso
    from fusion_advisor.report import jsonable
    from kernel_library.registry import KERNELS

    def swap_doc(s: SwapSite) -> dict[str, Any]:
        o = result.outcomes[s.id]
        v, t = o.verification, o.timing
        entry = KERNELS.get(s.kernel)
        return {
            "id": s.id, "kernel": s.kernel, "kernel_module": getattr(entry, "module", ""),
            "op": getattr(entry, "op", ""), "pattern": s.pattern, "key": s.key.to_dict(), "signature": s.signature,
            "graph": s.graph_index, "chains": list(s.chain_ids), "ops": list(s.op_ids),
            "source": f"{s.source.file}:{s.source.line}" if s.source.file else "", "code": s.source.code,
            "module_path": s.module_path,
            "inputs": [{"name": n, "shape": list(m.shape), "dtype": m.dtype} for n, m in s.inputs],
            "scalars": dict(s.scalars),
            "route": {"route": s.route, "kernel": s.route_kernel, "rule": s.route_rule},
            "candidate": s.candidate,
            "verified": None if v is None else bool(v.verified),
            "verification": None if v is None else {
                "cases": v.cases, "reference": v.reference, "max_abs_err": v.max_abs_err, "max_rel_err": v.max_rel_err,
                "backward_checked": v.backward_checked, "grad_max_abs_err": v.grad_max_abs_err,
                "grad_max_rel_err": v.grad_max_rel_err, "failure": v.reason or None},
            "timing": None if t is None else {
                "timer": t.timer, "what": t.what, "eager_ms": t.eager_ms, "compile_ms": t.compile_ms,
                "kernel_ms": t.kernel_ms, "compile_time_ms": t.compile_time_ms, "eager_gpu_ms": t.eager_gpu_ms,
                "compile_gpu_ms": t.compile_gpu_ms, "kernel_gpu_ms": t.kernel_gpu_ms, "note": t.note or None,
                "steady_state_recompiles": t.steady_state_recompiles},
            "decision": o.decision, "reason": o.reason, "kept": o.kept,
        }

    def near_doc(n: NearMiss) -> dict[str, Any]:
        return {"kernel": n.kernel, "pattern": n.pattern, "kind": n.kind, "reason": n.reason, "graph": n.graph_index,
                "chains": list(n.chain_ids), "ops": list(n.op_ids),
                "source": f"{n.source.file}:{n.source.line}" if n.source.file else "", "module_path": n.module_path}

    wm = result.whole_model
    bench = result.whole_model_bench
    doc = {
        "fusion_advisor_plan": PLAN_VERSION,
        "tool_version": fusion_advisor.__version__,
        "created_at": now_iso(),
        "model": {"name": result.model_name, "file": result.model_file, "convention": result.convention,
                  "device": result.device, "dtype": result.dtype},
        "options": {**result.options.to_dict(), "backward": result.backward, "compile_rest": result.compile_rest},
        "versions": dict(result.versions),
        "device_spec": result.analysis.device_spec.get("name", ""),
        "rules_files": result.analysis.rules_files,
        "summary": {"matches": len(result.sites), "candidates": sum(s.candidate for s in result.sites),
                    "verified": sum(1 for o in result.outcomes.values() if o.verification and o.verification.verified),
                    "kept": len(result.kept), "near_misses": len(result.near_misses)},
        "whole_model": None if wm is None else {
            "passed": wm.passed, "reference": wm.reference, "input_sets": wm.input_sets,
            "max_abs_err": wm.max_abs_err, "max_rel_err": wm.max_rel_err, "grad_max_abs_err": wm.grad_max_abs_err,
            "grad_max_rel_err": wm.grad_max_rel_err, "swaps_applied": wm.swaps_applied, "details": wm.details},
        "whole_model_bench": None if bench is None else bench.to_dict(),
        "rest": {"mode": "inductor" if result.compile_rest else "eager", "reason": result.rest_reason},
        "library_problems": dict(result.library_problems),
        "swaps": [swap_doc(s) for s in result.sites],
        "near_misses": [near_doc(n) for n in result.near_misses],
        "graph_breaks": [{"reason": b.reason, "source": str(b.source), "graph": b.graph_index}
                         for b in result.graph_breaks],
        "warnings": list(result.warnings),
        "timings_s": dict(result.timings_s),
    }
    return _plain(jsonable(doc))


def _plain(obj: Any) -> Any:
    """Subclasses of str/int/float (``torch.__version__`` is a ``TorchVersion``) as the plain types YAML writes."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None:
        return obj
    for t in (str, int, float):
        if isinstance(obj, t) and type(obj) is not t:
            return t(obj)
    return obj


#: Files written by :func:`write_outputs`, by key.
OUTPUT_FILES = {"swaps_csv": "swaps.csv", "swaps_html": "swaps.html", "plan": "plan.yaml"}


def write_outputs(result: ApplyResult, out_dir: str | Path) -> dict[str, Path]:
    """Write swaps.csv, swaps.html and plan.yaml into ``out_dir``.

    Everything is rendered in memory first; each file is then written atomically
    (:func:`fusion_advisor.report.atomic_write_bytes`) with Ctrl-C held back until all three are in place, so an
    interrupt leaves either the previous files or the new ones, never a half-written report.
    """
    from fusion_advisor import swaps as sw
    from fusion_advisor.plan import render_plan
    from fusion_advisor.report import atomic_write_bytes

    out_dir = Path(out_dir)
    rows = sw.swaps_rows(result.sites, result.outcomes)
    doc = plan_document(result)
    near_rows = [{"kernel": n["kernel"], "kind": n["kind"], "reason": n["reason"], "chains": n["chains"],
                  "source": n["source"], "module_path": n["module_path"]} for n in doc["near_misses"]]
    header = [("model", f"{result.model_name} ({result.model_file})"), ("device", result.device),
              ("dtype", result.dtype or "as the file makes it"), ("backward verified/timed", str(result.backward)),
              ("options", ", ".join(f"{k}={v}" for k, v in result.options.to_dict().items())),
              ("versions", ", ".join(f"{k} {v}" for k, v in result.versions.items())),
              ("summary", ", ".join(f"{k}: {v}" for k, v in doc["summary"].items()))]
    notes = []
    if not any(o.timing and o.timing.kernel_ms is not None for o in result.outcomes.values()):
        notes.append("No swap was timed: " + sw.NOT_MEASURED_NOTE + ".")
    notes += [f"kernel {k}: {v}" for k, v in result.library_problems.items()]
    notes += [f"warning: {w}" for w in result.warnings]
    whole = None
    if doc["whole_model"]:
        whole = {k: v for k, v in doc["whole_model"].items() if k != "details"}
        whole["details"] = doc["whole_model"]["details"]
        bench = doc["whole_model_bench"]
        if bench:
            whole.update({f"bench {k}": v for k, v in bench.items() if k != "variants"})
            for name, v in (bench.get("variants") or {}).items():
                line = (f"{v['ms']:.4g} ms, first call {v['first_call_s']:.3g} s, peak {v['peak_mb']:.0f} MiB"
                        if v.get("ms") is not None else v.get("error"))
                if v.get("device_ms") is not None:
                    split = ", ".join(f"{c} {ms:.3g}" for c, ms in sorted(v["device_ms_by_class"].items(),
                                                                          key=lambda kv: -kv[1]))
                    line += f"; GPU kernel time {v['device_ms']:.4g} ms ({split})"
                whole[f"bench {name}"] = line
        whole["rest of each graph"] = f"{doc['rest']['mode']}: {doc['rest']['reason']}"
    contents = {
        "swaps_csv": sw.render_swaps_csv(rows).encode("utf-8"),
        "swaps_html": sw.render_swaps_html(f"fusion-advisor apply: {result.model_name}", header, rows, near_rows,
                                           whole, notes).encode("utf-8"),
        "plan": render_plan(doc).encode("utf-8"),
    }
    if out_dir.exists() and not out_dir.is_dir():
        from fusion_advisor.errors import UserError

        raise UserError(f"--out {out_dir}: exists and is not a directory")
    model_file = Path(result.model_file).resolve() if not result.model_file.startswith("<") else None
    paths = {k: out_dir / name for k, name in OUTPUT_FILES.items()}
    if model_file is not None and any(p.resolve() == model_file for p in paths.values()):
        from fusion_advisor.errors import UserError

        raise UserError(f"--out {out_dir}: would overwrite the model file {model_file}")
    out_dir.mkdir(parents=True, exist_ok=True)
    with _sigint_deferred():
        for key, path in paths.items():
            atomic_write_bytes(path, contents[key])
    return paths


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) until the block ends, then raise KeyboardInterrupt if one came."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda *a: received.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt
