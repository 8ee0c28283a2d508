"""Stage 4: cut the op graph into fusible chains and heavy items.

A *chain* is a connected set of fusible ops (pointwise, reduction, normalization, softmax, copy) that one fused
kernel can run, the way Inductor or a handwritten Triton kernel would:

- ops are joined along data edges, looking through views (views are free and belong to no chain);
- only ops at the same *level* join, the level being the number of non-fusible ops (matmul, attention, ...) on
  the longest path from the graph inputs: a kernel cannot run both before and after a matmul it feeds;
- the joined ops iterate over one space: the same number of elements ``N``, or, once the chain holds a reduction
  over rows of ``W`` elements, also per-row values (``N / W`` elements) — the shape of a row-wise kernel such
  as RMSNorm (reduce, then scale each element of the row);
- a join that would let a path leave the chain and come back (through another chain) is refused, so the chains
  can run in some order.

Heavy ops (matmul, conv, attention, embedding) and ops no fused kernel takes are routing items of their own.
A chain that alone consumes a matmul's or conv's output is marked as an epilogue candidate of it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fusion_advisor.analyze.graph import FUSIBLE, GATHERS, HEAVY, OpGraph
from fusion_advisor.analyze.records import Chain, OpInfo
from fusion_advisor.analyze.op_classes import short_target


@dataclass
class _Group:
    """A chain under construction (union-find set)."""

    members: list[str]
    level: int
    domain: int  # elements of the iteration space
    row: int = 0  # row width of reductions in the group (0: none)
    member_set: set[str] = field(default_factory=set)
    axes: str = ""  # what the rows span (_row_axes; "" without a reduction)


def _domain(op: OpInfo) -> int:
    return max([m.numel for m in op.inputs] + [m.numel for m in op.outputs] + [1])


def _row_width(op: OpInfo) -> int:
    return op.reduction_elems if op.category in ("reduction", "softmax", "normalization") else 0


def _row_axes(op: OpInfo) -> str:
    """What a reducing op's rows span, so that reductions of equal width over different axes never merge (a
    reviewer: a training BatchNorm, per channel over batch and spatial dims, and a GroupNorm, per sample and group,
    joined one chain where the batch equalled the channels per group): ``"channel"`` (BatchNorm with batch
    statistics, InstanceNorm), ``"group"`` (GroupNorm), else ``"last"`` or ``"inner"`` by whether the last dim is
    reduced; ``""`` without a row."""
    if not _row_width(op):
        return ""
    name = short_target(op.target)
    if "batch_norm" in name:
        return "channel"
    if "group_norm" in name:
        return "group"
    return "last" if op.reduces_last_dim else "inner"


def _levels(og: OpGraph) -> dict[str, int]:
    """Level of every node: the number of non-fusible ops on the longest path from the graph inputs."""
    level: dict[str, int] = {}
    for nid in _topo(og):
        best = 0
        for u in og.g.predecessors(nid):
            op = og.g.nodes[u]["op"]
            barrier = op is not None and op.category not in FUSIBLE and not op.is_view
            best = max(best, level[u] + (1 if barrier else 0))
        level[nid] = best
    return level


def _topo(og: OpGraph) -> list[str]:
    import networkx as nx

    return list(nx.topological_sort(og.g))


class _Chainer:
    def __init__(self, og: OpGraph):
        self.og = og
        self.level = _levels(og)
        self.parent: dict[str, str] = {}
        self.groups: dict[str, _Group] = {}
        for op in og.ops:
            if op.category in FUSIBLE:
                self.parent[op.id] = op.id
                self.groups[op.id] = _Group([op.id], self.level[op.id], _domain(op), _row_width(op), {op.id},
                                            _row_axes(op))

    def find(self, x: str) -> str:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def _compatible(self, a: _Group, b: _Group) -> tuple[bool, int, int]:
        """Can a and b run as one kernel? Returns (ok, domain, row) of the union."""
        if a.level != b.level:
            return False, 0, 0
        if a.row and b.row and (a.row != b.row or a.axes != b.axes):
            return False, 0, 0
        row = a.row or b.row
        if a.domain == b.domain:
            return True, a.domain, row
        big, small = (a, b) if a.domain > b.domain else (b, a)
        if row and big.domain == small.domain * row:  # per-row values of a row-wise kernel
            return True, big.domain, row
        if not small.row and big.domain % small.domain == 0:
            # a pointwise group over a slice or a broadcast of the big space (rotate_half's halves, a cos table):
            # the fused kernel computes it by indexing, as Inductor does
            return True, big.domain, row
        return False, 0, 0

    def _reaches_outside(self, src: _Group, dst: _Group) -> bool:
        """True if a path leaves ``src``, passes through ops outside src and dst, and enters ``dst``."""
        inside = src.member_set | dst.member_set
        level = src.level
        frontier = [v for m in src.members for v in self.og.data_succs(m) if v not in inside and v != "<output>"]
        seen: set[str] = set()
        while frontier:
            v = frontier.pop()
            if v in seen or self.level.get(v, -1) != level:
                continue  # paths through a barrier raise the level and never come back to this one
            seen.add(v)
            op = self.og.g.nodes[v]["op"]
            if op is None or op.category not in FUSIBLE:
                continue
            for w in self.og.data_succs(v):
                if w in dst.member_set:
                    return True
                if w not in inside and w != "<output>":
                    frontier.append(w)
        return False

    def union(self, u: str, v: str) -> None:
        ru, rv = self.find(u), self.find(v)
        if ru == rv:
            return
        a, b = self.groups[ru], self.groups[rv]
        ok, domain, row = self._compatible(a, b)
        if not ok or self._reaches_outside(a, b) or self._reaches_outside(b, a):
            return
        self.parent[rv] = ru
        a.members.extend(b.members)
        a.member_set |= b.member_set
        a.domain, a.row, a.axes = domain, row, a.axes or b.axes
        del self.groups[rv]

    def run(self) -> list[list[str]]:
        for op in self.og.ops:  # execution order, so groups grow along the data flow
            if op.id not in self.parent:
                continue
            for u, _ in self.og.data_preds(op.id):
                if u in self.parent:
                    self.union(u, op.id)
        order = {op.id: i for i, op in enumerate(self.og.ops)}
        groups = [sorted(g.members, key=order.__getitem__) for g in self.groups.values()]
        return groups


def _pattern(og: OpGraph, member_ids: list[str]) -> str:
    """Name the pattern a fusible chain implements (``"rmsnorm"``, ``"swiglu"``, ...), or a generic name."""
    ops = [og.op(m) for m in member_ids]
    names = Counter(o.name for o in ops)
    cats = {o.category for o in ops}
    has = names.__contains__
    member_set = set(member_ids)

    def residual_add() -> bool:
        """An add of two same-shaped tensors (the residual stream) feeding the normalization in the chain."""
        for o in ops:
            if o.target.startswith("aten.add.Tensor") and len(o.inputs) == 2 and o.inputs[0].shape == o.inputs[1].shape:
                if set(og.data_succs(o.id)) & member_set:
                    return True
        return False

    if has("_log_softmax") and (has("nll_loss_forward") or has("nll_loss2d_forward")):
        return "cross_entropy"
    if has("_log_softmax"):
        return "log_softmax"  # not a softmax: no library kernel computes it, so no softmax rule may take it
    if has("native_layer_norm") or has("layer_norm"):
        return "add_layernorm" if residual_add() else "layernorm"
    if has("mean") and has("rsqrt") and (has("pow") or has("mul")):
        return "add_rmsnorm" if residual_add() else "rmsnorm"
    if any(o.category == "softmax" and not o.reduces_last_dim for o in ops):
        return "softmax_not_last_dim"  # our kernels and the softmax rules assume rows along the last dim
    if has("_softmax") or has("_safe_softmax"):
        # a mask is a tensor added to the scores (an additive mask) or selected in (where / masked_fill) before the
        # softmax; a scale (mul or div by a number) is no mask, nor is an add of its output (a new user's
        # softmax(l(x)) then a + y read "masked_softmax"): such a chain is a softmax, as apply's matcher names it
        feeding, todo = set(), [o.id for o in ops if o.name in ("_softmax", "_safe_softmax")]
        while todo:  # the chain's ops the softmax reads from
            for u, _ in og.data_preds(todo.pop()):
                if u in member_set and u not in feeding:
                    feeding.add(u)
                    todo.append(u)
        masked = any((o.target.startswith("aten.add.Tensor") and len(o.inputs) == 2)
                     or o.name in ("where", "masked_fill") for o in ops if o.id in feeding)
        return "masked_softmax" if masked else "softmax"
    def bias_add(o: OpInfo) -> bool:
        """``x + bias`` feeding the chain's GELU, ``bias`` 1-D over ``x``'s last dim: the library's bias_gelu."""
        if o.name != "add" or len(o.inputs) != 2:
            return False
        x, b = sorted(o.inputs, key=lambda m: len(m.shape), reverse=True)
        feeds_gelu = any(og.op(s).name == "gelu" for s in og.data_succs(o.id) if s in member_set)
        return feeds_gelu and len(b.shape) == 1 and len(x.shape) >= 1 and b.shape[0] == x.shape[-1]

    def gated_mul() -> bool:
        """A mul of two tensors (the GLU gate); ``silu(x) * 2.0`` scales by a scalar and gates nothing."""
        return any(o.target.startswith("aten.mul.Tensor") and len(o.inputs) == 2 for o in ops)

    if has("silu") and gated_mul():
        return "swiglu"
    if has("gelu"):
        if gated_mul() and len(names) <= 3:
            return "geglu"
        if set(names) <= {"add", "gelu"} and any(bias_add(o) for o in ops):
            return "bias_gelu"  # gelu(x + bias) and nothing else: what the library kernel computes
        return "gelu"
    if has("cat") and has("neg") and has("mul") and has("add"):
        return "rope"
    if "normalization" in cats:
        return "normalization"
    if "softmax" in cats:
        return "softmax"
    if "reduction" in cats:
        return "reduction"
    if cats <= {"copy"}:
        return "copy"
    return "pointwise"


#: The aten ops the library kernel of each pattern computes (what its pattern function in kernel_library traces
#: to, dtype casts included): a chain's other ops stay as they run when apply swaps the kernel in, so its triton
#: route prices them apart (:attr:`Chain.kernel_op_ids`). Of the 82 library-named chains (13 models) in the four
#: H200 KernelBench profile sets (benchmarks/results/h200/accuracy/reprofile), 78 held such ops: a contiguous
#: clone in 70 (Swin blocks' LayerNorms), a roll in 10, a cat in 6.
_NORM_CASTS = frozenset({"_to_copy", "to"})
KERNEL_OPS: dict[str, frozenset[str]] = {
    "layernorm": frozenset({"native_layer_norm", "layer_norm"}),  # F.layer_norm: no casts
    "add_layernorm": frozenset({"native_layer_norm", "layer_norm", "add"}),
    "rmsnorm": frozenset({"pow", "mean", "add", "rsqrt", "mul", "rms_norm", "_fused_rms_norm"}) | _NORM_CASTS,
    "add_rmsnorm": frozenset({"pow", "mean", "add", "rsqrt", "mul", "rms_norm", "_fused_rms_norm"}) | _NORM_CASTS,
    "softmax": frozenset({"_softmax", "_safe_softmax"}) | _NORM_CASTS,  # a scale alone stays: no mask, no fold
    "masked_softmax": frozenset({"_softmax", "_safe_softmax", "mul", "add"}) | _NORM_CASTS,  # scale * x + mask
    "cross_entropy": frozenset({"_log_softmax", "nll_loss_forward", "nll_loss2d_forward"}) | _NORM_CASTS,
    "bias_gelu": frozenset({"add", "gelu"}),
    "swiglu": frozenset({"silu", "mul"}),
    "geglu": frozenset({"gelu", "mul"}),
}


def _kernel_part(og: OpGraph, member_ids: list[str], pattern: str) -> tuple[tuple[str, ...], int]:
    """``(kernel op ids, kernel bytes)`` of a chain named ``pattern`` (:attr:`Chain.kernel_op_ids`), ``((), 0)``
    where the pattern has no :data:`KERNEL_OPS` entry, or its kernel computes every op that launches one."""
    core_names = KERNEL_OPS.get(pattern)
    if core_names is None:
        return (), 0
    ops = [og.op(m) for m in member_ids if not og.op(m).is_view]
    core = [o.id for o in ops if o.name in core_names]
    if not core or len(core) == len(ops):
        return (), 0
    return tuple(core), _chain_bytes(og, core)[1]


def _chain_bytes(og: OpGraph, member_ids: list[str]) -> tuple[int, int, str]:
    """(eager bytes, fused bytes, I/O dtype) of a chain.

    Eager bytes: op-by-op traffic. Fused bytes: chain inputs read once plus chain outputs written once; an input
    counts at most the bytes its reading op reads (a gather reads the rows it selects, not its whole source), each
    piece of a split of it once (``g, u = h.chunk(2, -1)``: both halves; one half alone read 67 of 101 MB for a
    fused SwiGLU, a reviewer), at most the producer's whole output. Two slices of one tensor count as the larger
    (no offsets are kept to tell ``h[:, :n]`` and ``h[:, n:]`` from one slice written twice).
    I/O dtype: dtype of the largest tensor crossing the chain's boundary (what a fused kernel loads and stores).
    """
    members = set(member_ids)
    eager = 0
    reads: dict[tuple[str, str], int] = {}  # (producer, part read: the producer or a piece of a split) -> bytes
    written = 0
    io: Counter[str] = Counter()
    for m in member_ids:
        op = og.op(m)
        eager += op.bytes_read + op.bytes_written
        for u, via, meta in og.data_reads(m):
            if u not in members:
                nbytes = min(meta.nbytes, op.bytes_read)
                if op.name in GATHERS and op.outputs and op.inputs and meta == op.inputs[0]:
                    nbytes = min(nbytes, op.outputs[0].nbytes)  # the source: the elements selected
                reads[u, via] = max(reads.get((u, via), 0), nbytes)
                io[meta.dtype] += nbytes
        succs = set(og.data_succs(m))
        if succs - members or og.is_graph_output(m):
            written += sum(o.nbytes for o in op.outputs)
            for o in op.outputs:
                io[o.dtype] += o.nbytes
    # per producer: the largest read, or its distinct pieces (OpGraph.data_reads: a split's parts) summed where
    # that is more, never more than the whole output
    whole = {u: _whole_bytes(og, u) for u, _ in reads}
    largest: Counter[str] = Counter()
    partial: Counter[str] = Counter()
    for (u, via), nbytes in reads.items():
        largest[u] = max(largest[u], nbytes)
        if via != u and 0 < nbytes < whole[u]:
            partial[u] += nbytes
    per_producer = {u: min(max(largest[u], partial[u]), whole[u] or largest[u]) for u in largest}
    floating = {d: n for d, n in io.items() if d in ("fp32", "fp16", "bf16", "fp64")}
    return eager, sum(per_producer.values()) + written, max(floating, key=floating.get) if floating else ""


def _whole_bytes(og: OpGraph, node_id: str) -> int:
    """Bytes of what ``node_id`` produces: an op's outputs, a graph input's tensor (as its edges carry it)."""
    op = og.g.nodes[node_id]["op"]
    if op is not None:
        return sum(o.nbytes for o in op.outputs)
    return max((og.g.edges[node_id, v]["meta"].nbytes for v in og.g.successors(node_id)), default=0)


def _dominant_dtype(ops: list[OpInfo]) -> str:
    counts: Counter[str] = Counter()
    for o in ops:
        for m in o.outputs or o.inputs:
            if m.dtype in ("fp32", "fp16", "bf16", "fp64"):
                counts[m.dtype] += m.numel
    if not counts:
        return ops[0].dtype if ops else ""
    return counts.most_common(1)[0][0]


def build_chains(og: OpGraph) -> list[Chain]:
    """Cut ``og`` into chains (fusible groups) and single-op items (heavy and other ops), in execution order."""
    groups = _Chainer(og).run()
    group_of = {m: i for i, g in enumerate(groups) for m in g}
    order = {op.id: i for i, op in enumerate(og.ops)}

    items: list[tuple[int, list[str], str]] = []  # (first position, members, kind)
    for g in groups:
        items.append((order[g[0]], g, "fusible"))
    for op in og.ops:
        if op.id in group_of or op.is_view:
            continue
        items.append((order[op.id], [op.id], "heavy" if op.category in HEAVY else "other"))
    items.sort(key=lambda t: t[0])

    chain_of: dict[str, str] = {}
    chains: list[Chain] = []
    for idx, (_, members, kind) in enumerate(items):
        cid = f"c{idx}"
        for m in members:
            chain_of[m] = cid
        ops = [og.op(m) for m in members]
        if kind == "fusible":
            eager_bytes, fused_bytes, io_dtype = _chain_bytes(og, members)
        else:
            eager_bytes = fused_bytes = sum(o.bytes_read + o.bytes_written for o in ops)
            io_dtype = ""
        lead = next((o for o in ops if o.source.file), ops[0])
        pattern = _pattern(og, members) if kind == "fusible" else ops[0].category if kind == "heavy" else ops[0].name
        kernel_ops, kernel_bytes = _kernel_part(og, members, pattern) if kind == "fusible" else ((), 0)
        chains.append(
            Chain(
                id=cid,
                kind=kind,
                op_ids=tuple(members),
                targets=tuple(o.target for o in ops),
                pattern=pattern,
                categories=tuple(sorted({o.category for o in ops})),
                dtype=io_dtype or _dominant_dtype(ops),
                eager_kernels=sum(o.eager_kernels for o in ops),
                eager_bytes=eager_bytes,
                fused_bytes=fused_bytes,
                flops=sum(o.flops for o in ops),
                numel=max(m.numel for o in ops for m in (o.inputs + o.outputs)) if any(o.inputs or o.outputs for o in ops) else 0,
                row_elems=max((_row_width(o) for o in ops), default=0),
                source=lead.source,
                module_path=lead.module_path,
                graph_index=ops[0].graph_index,
                attention_backend=next((o.variant for o in ops if o.category == "attention" and o.variant), ""),
                kernel_op_ids=kernel_ops,
                kernel_bytes=kernel_bytes,
                out_numel=max((m.numel for o in ops for m in o.outputs), default=0),
            )
        )
    return _mark_epilogues(og, chains, chain_of)


def _mark_epilogues(og: OpGraph, chains: list[Chain], chain_of: dict[str, str]) -> list[Chain]:
    """Set ``prologue_of`` on pointwise chains whose output only a pooling op reads (:func:`_sole_pool_consumer`),
    ``epilogue_of`` on pointwise chains that alone consume a matmul's or conv's output, and on a
    cross-entropy chain that alone consumes a matmul's (the LM head), whose pattern becomes
    ``linear_cross_entropy``: one kernel can take the GEMM and the loss together, chunked, so the logits never
    exist whole."""
    from dataclasses import replace

    by_id = {c.id: c for c in chains}
    out = []
    for c in chains:
        if c.kind == "heavy" and _output_fuses(og, c):
            c = replace(c, output_fuses=True)
        if c.kind == "fusible" and c.pattern == "cross_entropy":
            head = _sole_matmul_producer(og, c)
            if head is not None:
                c = replace(c, pattern="linear_cross_entropy", epilogue_of=chain_of[head])
        if c.kind == "fusible" and set(c.categories) <= {"pointwise", "copy"}:
            pool = _sole_pool_consumer(og, c)
            if pool is not None:
                c = replace(c, prologue_of=chain_of[pool])
            members = set(c.op_ids)
            for m in c.op_ids:
                for u, _ in og.data_preds(m):
                    producer = og.g.nodes[u]["op"]
                    if producer is None or producer.category not in ("matmul", "conv"):
                        continue
                    consumers = set(og.data_succs(u))
                    if consumers <= members and not og.is_graph_output(u):
                        c = replace(c, epilogue_of=chain_of[u])
                        break
                if c.epilogue_of:
                    break
        out.append(c)
    assert len(out) == len(by_id)
    return out


def _output_fuses(og: OpGraph, chain: Chain) -> bool:
    """Whether every op reading what a heavy item computes is one Inductor writes a kernel for (a :data:`FUSIBLE`
    category, or a pool of :data:`INDUCTOR_POOLS`) and no graph output is it (:attr:`Chain.output_fuses`)."""
    consumers = []
    for m in chain.op_ids:
        if og.is_graph_output(m):
            return False
        consumers += [og.g.nodes[v]["op"] for v in og.data_succs(m) if v not in chain.op_ids]
    return bool(consumers) and all(
        op is not None and not op.is_view and (op.category in FUSIBLE or short_target(op.target) in INDUCTOR_POOLS)
        for op in consumers)


#: Pooling ops Inductor lowers to a kernel of its own (``torch/_inductor/lowering.py``), reading their input through
#: the pointwise ops that produce it; ``adaptive_*_pool3d`` and the backward ops fall back to ATen.
INDUCTOR_POOLS = frozenset({"avg_pool2d", "avg_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
                            "_adaptive_avg_pool2d", "adaptive_max_pool2d", "_low_memory_max_pool_with_offsets"})


def _sole_pool_consumer(og: OpGraph, chain: Chain) -> str | None:
    """The pooling op (:data:`INDUCTOR_POOLS`) that alone consumes what ``chain`` computes (no member is a graph
    output, every use outside the chain is that op), or ``None``."""
    members = set(chain.op_ids)
    outside: set[str] = set()
    for m in chain.op_ids:
        if og.is_graph_output(m):
            return None
        outside |= set(og.data_succs(m)) - members
    if len(outside) != 1:
        return None
    (u,) = outside
    op = og.g.nodes[u]["op"]
    return u if op is not None and op.name in INDUCTOR_POOLS else None


def _sole_matmul_producer(og: OpGraph, chain: Chain) -> str | None:
    """The matmul whose output only ``chain`` consumes (looking through views; not a graph output), or ``None``."""
    members = set(chain.op_ids)
    for m in chain.op_ids:
        for u, _ in og.data_preds(m):
            producer = og.g.nodes[u]["op"]
            if producer is None or producer.category != "matmul":
                continue
            if set(og.data_succs(u)) <= members and not og.is_graph_output(u):
                return u
    return None
