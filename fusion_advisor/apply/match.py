"""Matching the kernels' patterns in a captured graph, never by node names: loose pass, exact pass, near-misses.

1. *loose*: the pattern traced on small example arguments (fp32 and bf16 variants) is matched backwards from
   its output over op targets and data edges, commutative ``add``/``mul`` in either order; constants are
   ignored except the pattern's scalar parameters (``eps``), which are traced with sentinel values and captured
   from the model's constant at that place (a tensor there instead is a near-miss: "eps is not a constant").
2. *exact*: the pattern is traced again on the site's own shapes, dtypes and captured constants and must match
   the same nodes with every constant equal (reduction dims, casts, slice bounds).

Intermediate values used outside the match, unsupported dtypes (``KernelEntry.supports``), a failing
``KernelEntry.extra_check`` or a device the kernel cannot run on make the site a **near-miss** with its reason.
Every match and near-miss is recorded with its op ids, chain ids, module path and source line.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.fx
from torch.fx import Node

from fusion_advisor.apply.canonical import node_value, normalized_args
from fusion_advisor.apply.patterns import Pattern, PatternLibrary
from fusion_advisor.apply.records import MatchKey, NearMiss, SwapSite
from fusion_advisor.analyze.capture import first_line, source_of
from fusion_advisor.analyze.graph import module_path_of, tensor_meta
from fusion_advisor.analyze.records import SourceLoc
from fusion_advisor.verification.trees import tensor_leaves

#: A loose-pass failure is reported as a near-miss when at least this share of the pattern's ops matched.
NEAR_MISS_MIN_SHARE = 0.6

#: Ops matched in either argument order.
_COMMUTATIVE = frozenset({torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor})


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


def _op_name(n: Node) -> str:
    """The op a node calls (``_to_copy``, ``_softmax``), or its kind (``placeholder``) when it calls none."""
    if n.op != "call_function":
        return n.op
    target = n.target
    return target._schema.name.split("::")[-1] if isinstance(target, torch._ops.OpOverload) else getattr(
        target, "__name__", str(target))


def _describe_node(n: Any) -> str:
    return f"{n.name} ({_op_name(n)})" if isinstance(n, Node) else repr(n)


class _Matcher:
    """Backtracking subgraph matcher of one pattern against one graph (see the module docstring)."""

    def __init__(self, pattern: Pattern, by_target: dict[Any, list[Node]], strict: bool):
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
                if not isinstance(gn, Node) or not isinstance(node_value(gn), torch.Tensor):
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
            attempt.fail(st, f"the pattern expects a {_op_name(pn)} op here; the model has a {_op_name(gn)} op "
                             f"({gn.name})")
            return
        st2 = st.copy()
        st2.nmap[pn] = gn
        st2.rmap[gn] = pn
        pa, ga = normalized_args(pn), normalized_args(gn)
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


# --- finding matches in one graph ---------------------------------------------------------------------------


@dataclass
class Match:
    """A match with its runtime data: node map, bindings, and the site record."""

    site: SwapSite
    pattern: Pattern  # the exact pattern
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
            verdict = entry.extra_check(*vals)
            if isinstance(verdict, str):  # a refusal with its reason, "" for none
                return verdict
            if not verdict:
                return "the kernel's extra_check refused these shapes/dtypes"
        except Exception as e:
            return f"the kernel's extra_check raised {type(e).__name__}: {first_line(str(e))}"
    return ""


def _dtype_matches(entry: Any, anchor: Node) -> bool:
    """Whether ``anchor``'s output dtype is one ``entry.match_dtypes`` lets the kernel meet (any when it is None,
    or when the node carries no tensor value)."""
    wanted = getattr(entry, "match_dtypes", None)
    val = anchor.meta.get("val")
    return wanted is None or not isinstance(val, torch.Tensor) or val.dtype in wanted


def find_matches(gm: torch.fx.GraphModule, library: PatternLibrary, graph_index: int,
                 site_counter: Iterator[int] | None = None) -> tuple[list[Match], list[NearMiss]]:
    """All matches of the library's patterns in canonical graph ``gm``, and the near-misses.

    Matches may overlap (an ``rmsnorm`` inside an ``add_rmsnorm``); :func:`rewrite` applies non-overlapping ones.
    """
    site_counter = site_counter if site_counter is not None else itertools.count()
    by_target: dict[Any, list[Node]] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            by_target.setdefault(n.target, []).append(n)
    matches: list[Match] = []
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
                if anchor in found or not _dtype_matches(entry, anchor):
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


def _confirm(gm: torch.fx.GraphModule, library: PatternLibrary, entry: Any, loose: Pattern, st: _State,
             anchor: Node, gi: int, by_target: dict[Any, list[Node]]) -> tuple[Match | None, NearMiss | None]:
    """Exact pass at a loose match: retrace the pattern on the site's values and match every constant."""
    src, mod = _site_loc(anchor)
    ph_by_name = {name: ph for ph, name in loose.tensor_placeholders.items()}
    vals: list[Any] = []
    for p in loose.params:
        if p in ph_by_name:
            vals.append(node_value(st.binds[ph_by_name[p]]))
        elif p in st.scalars:
            vals.append(st.scalars[p])
        else:  # a parameter the pattern does not use
            vals.append(None)
    op_ids = tuple(f"g{gi}:{n.name}" for n in _topo_sorted(gm, list(st.rmap)))

    def miss(reason: str, kind: str) -> NearMiss:
        return NearMiss(entry.name, entry.replaces, gi, op_ids, (), src, mod, reason, kind)

    exact = library.exact(entry, vals)
    if isinstance(exact, str):  # the kernel's own refusal, where it has one, says more than the trace's error
        why = _check_site(entry, vals)
        return None, (miss(f"{entry.name} cannot take this site: {why}", "check") if why else miss(exact, "structure"))
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
    inputs = tuple((p, tensor_meta(node_value(n))) for p, n in zip([p for p in exact.params if p in ph_by_name_exact], binds))
    site = SwapSite(
        id="", kernel=entry.name, pattern=entry.replaces, graph_index=gi,
        key=MatchKey(entry.name, mod, f"{Path(src.file).name}:{src.line}" if src.file else ""),
        op_ids=op_ids, chain_ids=(), source=src, module_path=mod, inputs=inputs,
        scalars={k: float(v) for k, v in st.scalars.items()},
        outputs=tuple(tensor_meta(t) for o in out_nodes for t in tensor_leaves(node_value(o))), n_ops=len(exact.ops),
    )
    return Match(site, exact, dict(st2.nmap), binds, args_template, out_nodes, gm), None


