"""Stage 2: capture the model as aten-level torch.fx graph(s).

Methods, tried in order:

1. ``dynamo``: ``torch.compile`` with a recording backend; AOTAutograd lowers each dynamo graph to aten ops with
   fake-tensor values in ``node.meta["val"]``. Graph breaks are recorded with dynamo's reason and the user's line,
   and capture continues past them (the code between graphs runs eagerly and is not analysed). Attention and
   cuDNN recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) are kept one opaque op each, as they run on a GPU.
2. ``export``: ``torch.export.export(strict=False)`` (one graph, no breaks allowed).
3. ``symbolic_trace``: ``torch.fx.symbolic_trace`` then ``make_fx`` to aten ops.

Everything runs under ``torch.no_grad()``: the forward pass is analysed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import os
import re
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx

from fusion_advisor.devices.op_rates import RECURRENT_CELLS
from fusion_advisor.errors import CaptureError, ModelRunError
from fusion_advisor.analyze.load import LoadedModel
from fusion_advisor.analyze.records import PARTIAL_COVERAGE, GraphBreak, SourceLoc

METHODS = ("dynamo", "export", "symbolic_trace")


def _token_major_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                        dropout_p: float, is_causal: bool, enable_gqa: bool) -> bool:
    """Whether SDPA's output is laid out token-major on a GPU: ``[B, Lq, H, Ev]`` memory seen as ``[B, H, Lq, Ev]``
    (a transposed view). The fused kernels (flash, memory-efficient, cuDNN) write it so; the math backend (a
    batched matmul) returns a contiguous ``[B, H, Lq, Ev]``. Decided by :func:`fusion_advisor.analyze.sdpa.rule_backend`
    on the tensors' metadata alone, so the fake and the real op agree; 4-D inputs only."""
    if q.dim() != 4:
        return False
    from fusion_advisor.analyze.sdpa import args_of, rule_backend

    return rule_backend(args_of(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa))[0] != "math"


def _token_major_empty(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, h, lq, _ = q.shape
    return q.new_empty((b, lq, h, v.shape[-1])).transpose(1, 2)


def _out_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> tuple[int, ...]:
    """SDPA's output shape ``[*batch, Lq, Ev]``: the leading (batch, head) dims of q, k and v broadcast against
    each other, as eager SDPA's math path broadcasts them (learned queries ``[1, H, Lq, E]`` shared over a
    batch of keys ``[B, H, S, E]`` give ``[B, H, Lq, Ev]``); with ``enable_gqa`` the head dim is q's."""
    leads = [tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2])]
    if enable_gqa and q.dim() >= 3:
        leads[1:] = [(*t[:-1], q.shape[-3]) if len(t) else t for t in leads[1:]]
    return (*torch.broadcast_shapes(*leads), q.shape[-2], v.shape[-1])


@torch.library.custom_op("fusion_advisor_capture::attention", mutates_args=())
def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` kept as one opaque op while lowering to aten.

    Without it, AOTAutograd decomposes SDPA into bmm + softmax on meta and CPU tensors (its math path), although
    on a GPU it runs as one flash/efficient-attention kernel. q ``[..., Lq, E]``, k ``[..., S, E]``,
    v ``[..., S, Ev]`` -> ``[..., Lq, Ev]``, in the layout the GPU backend writes (:func:`_token_major_output`:
    token-major for the fused kernels, so a following ``transpose(1, 2).contiguous()`` is a plain copy, as it is
    on the GPU); a result in another layout is copied into it.
    """
    kwargs = {"enable_gqa": True} if enable_gqa else {}
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kwargs
    )
    if _token_major_output(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa):
        if out.transpose(1, 2).is_contiguous():
            return out
        return _token_major_empty(q, v).copy_(out)
    return out if out.is_contiguous() else out.contiguous()


@_attention.register_fake
def _attention_fake(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if _token_major_output(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa):
        return _token_major_empty(q, v)
    return q.new_empty(_out_shape(q, k, v, enable_gqa))


_SDPA_TARGETS = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}


def _mha_as_sdpa(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
                 add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
                 need_weights=True, attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None,
                 k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
                 is_causal=False):
    """``F.multi_head_attention_forward`` as in-projection matmul, one opaque attention op, out-projection.

    Dynamo keeps ``nn.MultiheadAttention``'s functional call whole and AOTAutograd would lower it to its math path
    (bmm + softmax), although on a GPU it runs as a fused attention kernel. The cases this does not cover
    (attention weights returned, bias_k/v, zero attention, separate projections, static k/v, a key padding mask)
    fall through to the original function. Shapes: query ``[L, N, E]``, key/value ``[S, N, E]`` -> ``[L, N, E]``.
    """
    F = torch.nn.functional
    if (need_weights or bias_k is not None or bias_v is not None or add_zero_attn or use_separate_proj_weight
            or static_k is not None or static_v is not None or key_padding_mask is not None or query.dim() != 3):
        return F.multi_head_attention_forward(
            query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
            add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=training,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=use_separate_proj_weight, q_proj_weight=q_proj_weight,
            k_proj_weight=k_proj_weight, v_proj_weight=v_proj_weight, static_k=static_k, static_v=static_v,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    head_dim = embed_dim // num_heads
    w_q, w_k, w_v = in_proj_weight.chunk(3)
    b_q, b_k, b_v = in_proj_bias.chunk(3) if in_proj_bias is not None else (None, None, None)
    # [L, N, E] -> [N, heads, L, head_dim]
    q = F.linear(query, w_q, b_q).view(tgt_len, bsz, num_heads, head_dim).permute(1, 2, 0, 3)
    k = F.linear(key, w_k, b_k).view(src_len, bsz, num_heads, head_dim).permute(1, 2, 0, 3)
    v = F.linear(value, w_v, b_v).view(src_len, bsz, num_heads, head_dim).permute(1, 2, 0, 3)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:  # MHA: True = masked out; SDPA: True = keep
            attn_mask = ~attn_mask
        if attn_mask.dim() == 3:
            attn_mask = attn_mask.view(bsz, num_heads, tgt_len, src_len)
    out = torch.ops.fusion_advisor_capture.attention(
        q, k, v, attn_mask, dropout_p if training else 0.0, bool(is_causal and attn_mask is None))
    out = out.permute(2, 0, 1, 3).reshape(tgt_len * bsz, embed_dim)
    return F.linear(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, embed_dim), None


#: The calls dynamo records for a recurrent layer stack of each cell of
#: :data:`fusion_advisor.devices.op_rates.RECURRENT_CELLS` (``torch.lstm(input, (h0, c0), params, has_biases,
#: num_layers, dropout, train, bidirectional, batch_first)`` and the same with one ``hx`` for the others) when it
#: traces ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` (``torch._dynamo.config.allow_rnn``).
_CELL_FN = {cell: getattr(torch, cell) for cell in RECURRENT_CELLS}
_CELL_OF = {fn: cell for cell, fn in _CELL_FN.items()}


@torch.library.custom_op("fusion_advisor_capture::recurrent", mutates_args=())
def _recurrent(cell: str, x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor], has_biases: bool,
               num_layers: int, dropout: float, train: bool, bidirectional: bool, batch_first: bool
               ) -> list[torch.Tensor]:
    """A cuDNN recurrent layer stack (``cell``: ``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``) kept as one opaque op
    while lowering to aten: without it AOTAutograd unrolls it into per-step matmuls on meta and CPU tensors,
    although on a GPU it runs as cuDNN's RNN kernels. ``x`` ``[seq, batch, input]`` (``batch_first``: ``[batch,
    seq, input]``), ``hx`` ``[h0]`` (LSTM ``[h0, c0]``) ``[layers * directions, batch, hidden]``; returns
    ``[output, h_n]`` (LSTM ``[output, h_n, c_n]``)."""
    h = tuple(hx) if cell == "lstm" else hx[0]
    out = _CELL_FN[cell](x, h, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return [t.clone() for t in out]  # a custom op's outputs may not alias its inputs


@_recurrent.register_fake
def _recurrent_fake(cell, x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    hidden = hx[0].shape[-1]
    dirs = 2 if bidirectional else 1
    out = x.new_empty((*x.shape[:-1], dirs * hidden))
    return [out, *(h.new_empty(h.shape) for h in hx)]


def _recurrent_call(cell: str) -> Callable[..., Any]:
    """The replacement of a ``torch.<cell>`` node: the same arguments and results, through the opaque op."""
    def call(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        hx = list(hx) if isinstance(hx, (tuple, list)) else [hx]
        return tuple(torch.ops.fusion_advisor_capture.recurrent(
            cell, x, hx, list(params), has_biases, num_layers, dropout, train, bidirectional, batch_first))

    call.__name__ = f"{cell}_as_one_op"
    return call


def _is_sequence_call(node: torch.fx.Node) -> bool:
    """A ``torch.<cell>`` node with a padded input (9 arguments, ``hx`` a tuple or a 3-D tensor), not the
    packed-sequence overload (its second argument the 1-D ``batch_sizes``)."""
    if len(node.args) != 9 or node.kwargs:
        return False
    hx = node.args[1]
    if isinstance(hx, (tuple, list)):
        return True
    val = hx.meta.get("example_value") if isinstance(hx, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 3


def keep_attention_opaque(gm: torch.fx.GraphModule) -> int:
    """Rewrite SDPA (and ``nn.MultiheadAttention``'s functional) calls, and the ``torch.<cell>`` calls of
    recurrent layers, in a dynamo graph so that each stays one opaque op through AOTAutograd; return how
    many were rewritten."""
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA_TARGETS:
            node.target = torch.ops.fusion_advisor_capture.attention.default
            count += 1
        elif node.op == "call_function" and node.target is torch.nn.functional.multi_head_attention_forward:
            node.target = _mha_as_sdpa
            count += 1
        elif node.op == "call_function" and node.target in _CELL_OF and _is_sequence_call(node):
            node.target = _recurrent_call(_CELL_OF[node.target])
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


@dataclass
class Capture:
    """Captured aten graphs of one model.

    Attributes:
        graphs: aten-level GraphModules in execution order; every node with a tensor result has ``meta["val"]``.
        method: the method that produced them (one of :data:`METHODS`).
        breaks: graph breaks (dynamo only).
        warnings: why earlier methods failed, and other non-fatal notes.
    """

    graphs: list[torch.fx.GraphModule]
    method: str
    breaks: list[GraphBreak] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def first_line(text: str, limit: int = 300) -> str:
    """``text`` as one line (whitespace collapsed), cut to ``limit`` characters at a word boundary with "..." (for
    error messages)."""
    line = " ".join(str(text).strip().split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 3]
    return (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2:] else cut) + "..."


def failure_text(e: BaseException) -> str:
    """``"Type: message"`` of an exception on one line, and of the exception that caused it (the innermost of its
    ``__cause__`` chain) where that is another: dynamo wraps the error that stopped it, and the wrapper's message,
    cut to one line, ends before the cause ("... got...")."""
    text = f"{type(e).__name__}: {first_line(str(e))}"
    root, seen = e, {id(e)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:
        root = root.__cause__
        seen.add(id(root))
    if root is not e:
        return f"{text} (caused by {type(root).__name__}: {first_line(str(root), 200)})"
    # dynamo's fake-tensor failures carry their cause in the message ("...): got AssertionError('...')"), which
    # the cut to one line may have dropped
    message = " ".join(str(e).split())
    cause = re.search(r"\bgot (\w+(?:Error|Exception)\(.*)", message)
    cut = len(first_line(message)) < len(message)
    return f"{text} (caused by {first_line(cause.group(1), 200)})" if cause and cut else text


def user_loc(stack: list[traceback.FrameSummary] | None) -> SourceLoc:
    """Innermost frame of ``stack`` outside torch itself."""
    if not stack:
        return SourceLoc()
    frames = [f for f in stack if "/torch/" not in f.filename.replace("\\", "/")] or list(stack)
    f = frames[-1]
    return SourceLoc(file=f.filename, line=f.lineno or 0, code=(f.line or "").strip())


#: What a :class:`DynamoBackend` hands each dynamo graph to: ``(graph, example_inputs, graph_index) -> callable``.
GraphHook = Callable[[torch.fx.GraphModule, list[Any], int], Callable[..., Any]]


class DynamoBackend:
    """The tool's one ``torch.compile`` backend: numbers the graphs dynamo hands it, records each graph break with
    dynamo's reason and the user's line, and hands every graph to a hook that decides what runs.

    analyze (:func:`capture`) and ``--profile`` hook :func:`aten_hook` in (the graph lowered to aten ops by
    AOTAutograd, attention kept one op); apply's ``RewriteBackend`` hooks in its matcher, rewriter and executors.
    So the three stages number graphs and graph breaks the same way, and a chain named by graph index in one is
    the same graph in the others.

    Args:
        on_graph: the hook, called once per dynamo graph with its index in call order (0, 1, ...).

    Attributes:
        breaks: the graph breaks seen so far; ``graph_index`` is the index of the graph that ended at the break.
        graph_count: how many graphs dynamo has handed over.
    """

    def __init__(self, on_graph: GraphHook):
        self.on_graph = on_graph
        self.breaks: list[GraphBreak] = []
        self.graph_count = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        index = self.graph_count
        self.graph_count += 1
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and getattr(reason, "graph_break", False):
            self.breaks.append(GraphBreak(reason=first_line(reason.reason),
                                          source=user_loc(getattr(reason, "user_stack", None)), graph_index=index))
        return self.on_graph(gm, example_inputs, index)

    def compile(self, model: torch.nn.Module, recurrent: bool = False) -> Callable[..., Any]:
        """``model`` compiled with this backend (static shapes, graph breaks allowed), after a dynamo reset so that
        no earlier compilation's cache answers for it. ``recurrent``: dynamo traces ``nn.LSTM`` / ``nn.GRU`` /
        ``nn.RNN`` into the graph (``torch._dynamo.config.allow_rnn``, set at every call: a recompile traces
        again) instead of breaking the graph around them."""
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=self, dynamic=False, fullgraph=False)
        if not recurrent:
            return compiled

        def run(*args: Any, **kwargs: Any) -> Any:
            with torch._dynamo.config.patch(allow_rnn=True):
                return compiled(*args, **kwargs)

        return run


def aten_hook(on_aten: GraphHook) -> GraphHook:
    """A :class:`DynamoBackend` hook that keeps attention one op (:func:`keep_attention_opaque`), lowers the graph
    to aten ops with AOTAutograd and calls ``on_aten(aten_graph, example_inputs, graph_index)`` for the forward
    (and, in grad mode, the backward) graph, which runs what ``on_aten`` returns."""
    from torch._dynamo.backends.common import aot_autograd

    def hook(gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable[..., Any]:
        keep_attention_opaque(gm)

        def lowered(aten: torch.fx.GraphModule, aten_inputs: list[Any]) -> Callable[..., Any]:
            return on_aten(aten, aten_inputs, index)

        return aot_autograd(fw_compiler=lowered, bw_compiler=lowered)(gm, example_inputs)

    return hook


def _capture_dynamo(model: torch.nn.Module, inputs: tuple[Any, ...], recurrent: bool = True) -> Capture:
    graphs: list[torch.fx.GraphModule] = []

    def collect(gm: torch.fx.GraphModule, example_inputs: list[Any], index: int) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    from torch._dynamo.utils import counters

    backend = DynamoBackend(aten_hook(collect))
    compiled = backend.compile(model, recurrent=recurrent)
    seen = dict(counters["unimplemented"])  # message -> count: a retry (meta, then cpu) repeats the messages
    with torch.no_grad():
        compiled(*inputs)
    torch._dynamo.reset()
    if not graphs:
        why = skipped_frame_reason([m for m, n in counters["unimplemented"].items() if n > seen.get(m, 0)])
        raise CaptureError("dynamo captured no graph (the whole forward ran eagerly)" + (f": {why}" if why else ""))
    return Capture(graphs=graphs, method="dynamo", breaks=backend.breaks)


def skipped_frame_reason(messages: list[str]) -> str:
    """Why dynamo ran a whole forward eagerly, from its ``counters["unimplemented"]`` messages of the run: the first
    break's title, after its user line where dynamo's message carries one (``"m.py:16: Data-dependent
    branching"``; a ``Tensor.item()`` break's does not), and, where dynamo skipped the frame for a
    break inside a loop, that ``torch.compile(model)`` runs the whole forward eagerly; ``""`` without a message. A
    fresh user's loop with a data-dependent ``if`` read only "no method could capture the model"."""
    messages = [m.strip() for m in messages if m.strip()]
    if not messages:
        return ""
    first = messages[0]
    where = re.search(r'File "([^"]+)", line (\d+)', first)
    said = (f"{where.group(1)}:{where.group(2)}: " if where else "") + first.splitlines()[0].strip()
    if any("graph break in loop" in m or "frame skipped" in m for m in messages):
        said += (" inside a loop: dynamo skips the whole forward there (a graph break in a loop is not supported), "
                 "so torch.compile(model) runs it eagerly")
    return said


def _capture_export(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Capture:
    with torch.no_grad():
        ep = torch.export.export(model, tuple(inputs), strict=False)
        ep = ep.run_decompositions({})
    return Capture(graphs=[ep.graph_module], method="export")


def _capture_symbolic(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Capture:
    from torch.fx.experimental.proxy_tensor import make_fx

    traced = torch.fx.symbolic_trace(model)
    with torch.no_grad(), torch.fx.traceback.preserve_node_meta():
        gm = make_fx(torch.fx.Interpreter(traced).run)(*inputs)
    return Capture(graphs=[gm], method="symbolic_trace")


_CAPTURERS = {"dynamo": _capture_dynamo, "export": _capture_export, "symbolic_trace": _capture_symbolic}


#: Added to a failed ``.view`` (GPU-only code: a view of SDPA's output that only its GPU layout allows).
VIEW_HINT = (" (if this view follows F.scaled_dot_product_attention: on a GPU the fused kernels return its output "
             "token-major, so `.transpose(1, 2).view(...)` works there, but on a CPU or meta device the output is "
             "heads-major and the view fails; use .reshape(...), which copies nothing where the view would work)")


def run_eagerly(loaded: LoadedModel) -> None:
    """Run the model on its inputs; raise :class:`ModelRunError` naming the user's line if it fails."""
    try:
        with torch.no_grad():
            loaded.module(*loaded.inputs)
    except Exception as e:
        frames = traceback.extract_tb(e.__traceback__)
        user = [f for f in frames if "/torch/" not in f.filename and "fusion_advisor" not in f.filename]
        where = f"{user[-1].filename}:{user[-1].lineno}" if user else loaded.file
        hint = " (on --device meta nothing runs for real: ops that read tensor values need --device cpu or cuda)"
        text = str(e).lower()
        data_dependent = any(k in text for k in ("meta", "item()", "data-dependent", "truth value", "data_ptr",
                                                 "cannot be called on", "nonzero"))
        if "view size is not compatible" in text or "cannot view a tensor" in text:
            hint = VIEW_HINT
        elif not (loaded.device == "meta" and data_dependent):
            hint = ""
        raise ModelRunError(
            f"{where}: the model fails on its own inputs: {type(e).__name__}: {first_line(str(e), 400)}" + hint
        ) from e


def capture(loaded: LoadedModel, methods: tuple[str, ...] = METHODS, recurrent: bool = True) -> Capture:
    """Capture ``loaded.module`` on ``loaded.inputs`` as aten graphs, trying ``methods`` in order.

    ``recurrent``: dynamo keeps each ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` in the graph as one opaque op
    (:func:`_recurrent`); False breaks the graph around them, as ``torch.compile(model)`` and apply's own
    backend do (apply captures that way, so that its graphs and the analysis's are numbered alike).

    Raises:
        ModelRunError: the model fails when run eagerly on its own inputs.
        CaptureError: the model runs but no method could capture it (the message gives each method's reason).
    """
    failures: list[str] = []
    for method in methods:
        try:
            with warnings.catch_warnings(), quiet_torch_logs():
                warnings.simplefilter("ignore")
                result = (_capture_dynamo(loaded.module, loaded.inputs, recurrent) if method == "dynamo"
                          else _CAPTURERS[method](loaded.module, loaded.inputs))
        except Exception as e:  # each capture method fails in its own ways; try the next
            failures.append(f"{method}: {failure_text(e)}")
            if method == methods[0]:
                run_eagerly(loaded)  # a model that fails on its own inputs gets that message, not a capture one
            continue
        result.warnings = [f"capture by {f}" for f in failures] + result.warnings
        if result.breaks:
            note = coverage_note(loaded, result)
            if note:
                result.warnings.insert(0, note)
        return result
    raise CaptureError(f"{loaded.file}: no method could capture the model:\n  " + "\n  ".join(failures))


def unused_nodes(loaded: LoadedModel | None) -> list[torch.fx.Node]:
    """The aten calls one eager forward makes whose results nothing the model returns or changes depends on: work
    eager runs for nothing, which dynamo drops from its graphs (so ``torch.compile(model)`` never runs it). A value
    computed and discarded (``out, _ = attn(x, x, x)``: ``nn.MultiheadAttention`` averages its attention weights
    over the heads whether or not they are used; a state the forward computes but does not return).

    The forward is traced whole by ``make_fx`` on the meta device, before dispatch (``pre_dispatch``: the calls as
    the code makes them, ``aten.linear``, ``aten.matmul``, SDPA, none eliminated, nothing computed or held in
    memory; traced after dispatch, SDPA's math decomposition on meta left two dead casts of its own in the built-in
    model); a node is used when the output or an impure node (in-place, random, side effects:
    :meth:`torch.fx.Node.is_impure`) depends on it. Empty for a model not on the meta device (``None`` too: the
    pipeline builds the model again there, :func:`fusion_advisor.analyze.pipeline._on_meta`; a real trace would
    hold every intermediate tensor), for a model holding an ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` (the trace would
    unroll it step by step: KernelBench's 6-layer, 512-step LSTM took 275 s) and when the trace fails
    (data-dependent control flow, Python the tracer cannot follow): no claim then."""
    if loaded is None or loaded.device != "meta" \
            or any(isinstance(m, torch.nn.RNNBase) for m in loaded.module.modules()):
        return []
    import inspect

    from torch.fx.experimental.proxy_tensor import make_fx

    params = inspect.signature(make_fx).parameters  # the user's lines and modules, where this torch records them
    meta = {k: True for k in ("record_stack_traces", "record_module_stack") if k in params}
    try:
        with torch.no_grad(), warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            gm = make_fx(loaded.module, tracing_mode="real", pre_dispatch=True, **meta)(*loaded.inputs)
    except Exception:  # a trace that fails makes no claim
        return []
    roots = [n for n in gm.graph.nodes if n.op == "output" or (n.op == "call_function" and n.is_impure())]
    used: set[torch.fx.Node] = set()
    while roots:
        node = roots.pop()
        if node not in used:
            used.add(node)
            roots.extend(node.all_input_nodes)
    return [n for n in gm.graph.nodes if n.op == "call_function" and n not in used and not _no_work(n)]


#: Calls that allocate and compute nothing (a kernel's scratch buffer: BatchNorm's reserve space).
_ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty"})


def _no_work(node: torch.fx.Node) -> bool:
    """An element taken from a multi-output call (the call itself is what runs) or an allocation."""
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.name.split("::")[-1] in _ALLOCATIONS


#: Below this share of the forward's aten calls in the captured graphs, the report says the analysis is partial.
MIN_COVERAGE = 0.5


def coverage_note(loaded: LoadedModel, cap: Capture) -> str:
    """A warning when the captured graphs hold fewer than :data:`MIN_COVERAGE` of the aten calls one eager forward
    makes (a graph break after which dynamo ran the rest of the frame eagerly: a new user's 35_LSTM was analysed as
    its two ``torch.randn`` calls and advised to be left alone); ``""`` otherwise, or when the eager count fails."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    count = _Count()
    try:
        with torch.no_grad(), count, warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore")
            loaded.module(*loaded.inputs)
    except Exception:  # no count, no claim
        return ""
    captured = sum(1 for g in cap.graphs for n in g.graph.nodes
                   if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload))
    if count.n == 0 or captured >= MIN_COVERAGE * count.n:
        return ""
    first = cap.breaks[0]
    where = f" at {Path(first.source.file).name}:{first.source.line}" if first.source.file else ""
    return (f"{PARTIAL_COVERAGE}: the captured graphs hold {captured} aten ops where one "
            f"eager forward makes {count.n} aten calls; after the graph break{where} ({first.reason}) the rest "
            f"ran outside any graph, unanalysed, so the advice and predictions below are about the captured part "
            f"only")


@contextlib.contextmanager
def quiet_torch_logs():
    """Silence dynamo's own logging of graph breaks and recompiles while capturing (we report them ourselves)."""
    loggers = [logging.getLogger(n) for n in ("torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch",
                                              "torch._subclasses", "torch")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


#: Prefixes of lines native code writes to the process's stderr that are noise to a user: libkineto (the
#: profiler behind torch.profiler) prints ``USDT:<date> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start``
#: (and ``profiler_stop``) at every profile, whatever KINETO_LOG_LEVEL says (torch 2.13).
NATIVE_NOISE = ("USDT:",)


@contextlib.contextmanager
def quiet_native_stderr(drop: tuple[str, ...] = NATIVE_NOISE):
    """Hold back what native code writes to file descriptor 2 while the block runs; afterwards pass every line
    on to stderr except those starting with one of ``drop``.

    Python's ``sys.stderr`` object is left alone (``contextlib.redirect_stderr`` cannot catch C++ writes); fd 2 is
    pointed at a temporary file and restored on exit, errors included. Where fd 2 cannot be duplicated (no real
    stderr, e.g. under some test runners) the block runs unfiltered.
    """
    import sys
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as held:
        try:
            os.dup2(held.fileno(), 2)
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [ln for ln in held.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not ln.startswith(drop)]
            if kept:
                os.write(2, "".join(kept).encode("utf-8"))


def source_of(node: torch.fx.Node) -> SourceLoc:
    """The innermost user-code line in ``node.meta["stack_trace"]``, or an empty :class:`SourceLoc`."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return SourceLoc()
    lines = trace.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        text = lines[i].strip()
        if text.startswith('File "'):
            try:
                file = text[6 : text.index('"', 6)]
                line = int(text.split(", line ")[1].split(",")[0])
            except (ValueError, IndexError):
                continue
            if "/torch/" in file.replace("\\", "/"):
                continue
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return SourceLoc(file=file, line=line, code=code)
    return SourceLoc()


def short_path(file: str) -> str:
    """``file`` shortened for display: site-packages paths from the package name on."""
    p = file.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1]
    try:
        return str(Path(p).resolve().relative_to(Path.cwd()))
    except ValueError:
        return p
