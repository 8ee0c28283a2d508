"""Executors: how the ops of one captured graph (or one region of it) run — eager, Inductor, CUDA graphs.

Each executor of :data:`~fusion_advisor.apply.records.EXECUTORS` turns an FX graph and its (fake) example inputs
into a callable, the way a ``torch.compile`` backend does:

- ``eager``: the graph's ops run as they are (vendor libraries for GEMMs and convolutions, aten kernels);
- ``inductor``: ``torch._inductor.compile_fx.compile_fx`` (AOTAutograd + Inductor), with config patches;
- ``inductor+cudagraphs``: the same with ``triton.cudagraphs`` on, as ``mode="reduce-overhead"`` sets it:
  cudagraph trees record the compiled graph once and replay it;
- ``eager+cudagraphs``: dynamo's ``cudagraphs`` backend: AOTAutograd traces the graph's aten ops, which run as
  PyTorch runs them, recorded in a CUDA graph (cudagraph trees) and replayed.

CUDA graphs need static shapes, no host synchronisation, no CPU tensors and graph-safe RNG; where a graph breaks
one of these, cudagraph trees run it without graphs and say why. :class:`CudagraphSkips` collects those reasons so
the report can state them.

Parameters are *static inputs* to cudagraph trees (not copied into the graph's buffers before each replay) only
when the graph carries dynamo's metadata (``meta["dynamo_compile_id"]``, each placeholder's ``_dynamo_source``);
a graph we build from a dynamo graph (the pre-dispatch retrace, a region) inherits it through
:func:`inherit_dynamo_metadata`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import torch
import torch.fx

from fusion_advisor.apply.records import EXECUTORS


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], executor: str,
                  inductor_options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A callable running ``gm`` with ``executor``.

    Args:
        gm: an FX graph (a dynamo graph, its pre-dispatch retrace, or a region of either).
        example_inputs: its example inputs (fake or real tensors, as dynamo hands a backend).
        executor: an :data:`~fusion_advisor.apply.records.EXECUTORS` key.
        inductor_options: Inductor config patches for the ``inductor`` executors (``{"max_autotune": True}``).

    Raises:
        ValueError: an unknown executor.
        Exception: whatever Inductor or AOTAutograd raise for this graph (the caller decides what runs instead).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
    if executor == "eager":
        return gm.forward
    if executor == "eager+cudagraphs":
        return torch._dynamo.lookup_backend("cudagraphs")(gm, list(example_inputs))
    from torch._inductor.compile_fx import compile_fx

    patches = dict(inductor_options or {})
    if executor == "inductor+cudagraphs":
        patches["triton.cudagraphs"] = True
    return compile_fx(gm, list(example_inputs), config_patches=patches or None)


def inherit_dynamo_metadata(new: torch.fx.GraphModule, dynamo_gm: torch.fx.GraphModule,
                            placeholder_sources: Sequence[torch.fx.Node | None] | None = None) -> None:
    """Copy the metadata AOTAutograd reads from a dynamo graph onto ``new``, a graph built from it.

    AOTAutograd marks a graph's parameters as static inputs for cudagraph trees only when it recognises a dynamo
    graph (``torch/_functorch/_aot_autograd/frontend_utils.py``: ``meta["dynamo_compile_id"]``,
    ``_param_name_to_source``, and per placeholder ``_dynamo_source`` plus ``meta["tensor_dict"]``); without it
    every parameter is copied into the CUDA graph's buffers before each replay.

    Args:
        new: the graph to mark.
        dynamo_gm: the dynamo graph ``new`` was built from.
        placeholder_sources: per placeholder of ``new``, the placeholder of ``dynamo_gm`` it stands for, or
            ``None`` (an intermediate value, e.g. a region's input computed by an earlier region). Default:
            ``new``'s placeholders are ``dynamo_gm``'s, in order.
    """
    if "dynamo_compile_id" not in dynamo_gm.meta:
        return
    old_ph = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    new_ph = [n for n in new.graph.nodes if n.op == "placeholder"]
    if placeholder_sources is None:
        if len(old_ph) != len(new_ph):
            return
        placeholder_sources = old_ph
    if len(placeholder_sources) != len(new_ph) or any(new.named_parameters()) or any(new.named_buffers()):
        return  # not a 1:1 lift of dynamo's placeholders: leave the graph unmarked (correct, only slower)
    for n, src in zip(new_ph, placeholder_sources):
        n._dynamo_source = getattr(src, "_dynamo_source", None) if src is not None else None
        if src is not None and "tensor_dict" in src.meta:
            n.meta["tensor_dict"] = src.meta["tensor_dict"]
    new.meta["dynamo_compile_id"] = dynamo_gm.meta["dynamo_compile_id"]
    new._param_name_to_source = dict(getattr(dynamo_gm, "_param_name_to_source", {}) or {})


class CudagraphSkips:
    """Collects why cudagraph trees ran a graph without CUDA graphs ("skipping cudagraphs due to cpu device",
    "mutated inputs", ...) while it is entered.

    Torch reports a skip through ``torch._inductor.cudagraph_utils.log_cudagraph_skip_and_bump_counter``, which
    only logs under ``TORCH_LOGS=perf_hints``; the modules that imported it get a recording wrapper for the
    duration.
    """

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self._patched: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "CudagraphSkips":
        try:
            from torch._inductor import cudagraph_utils
        except ImportError:  # a torch without cudagraph trees: nothing to record
            return self
        original = getattr(cudagraph_utils, "log_cudagraph_skip_and_bump_counter", None)
        if original is None:
            return self

        def recording(msg: str, *args: Any, **kwargs: Any) -> Any:
            text = " ".join(str(msg).split())
            if text not in self.reasons:
                self.reasons.append(text)
            return original(msg, *args, **kwargs)

        for mod in list(sys.modules.values()):
            name = getattr(mod, "__name__", "") or ""
            if name.startswith("torch.") and getattr(mod, "log_cudagraph_skip_and_bump_counter", None) is original:
                self._patched.append((mod, "log_cudagraph_skip_and_bump_counter", original))
                setattr(mod, "log_cudagraph_skip_and_bump_counter", recording)
        return self

    def __exit__(self, *exc: Any) -> None:
        for mod, attr, original in self._patched:
            setattr(mod, attr, original)
        self._patched.clear()


def reset_compiled_state() -> None:
    """Forget every compiled graph and CUDA-graph pool of this process (``torch._dynamo.reset`` and cudagraph
    trees), so the next variant compiles afresh and earlier variants' memory is freed."""
    torch._dynamo.reset()
    try:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()
    except Exception:  # a torch without cudagraph trees, or none in use
        pass
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
