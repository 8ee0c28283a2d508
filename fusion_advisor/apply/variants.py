"""Variants: a :class:`~fusion_advisor.apply.records.VariantSpec` built into a runnable model.

:class:`PlannedModel` wraps the user's model (never modified) and runs it the way its spec says:

- ``rest="as-written"`` with nothing else: the model is called directly;
- a *stock* spec (no swaps, no regions) is built with ``torch.compile`` exactly as a user writes it:
  ``torch.compile(model)``, ``torch.compile(model, mode="reduce-overhead")``, ``torch.compile(model,
  backend="cudagraphs")``, or ``torch.compile(model, options={...})`` for Inductor options (max-autotune, freezing);
- otherwise the model is compiled with :class:`~fusion_advisor.apply.backend.RewriteBackend`, which swaps the
  spec's library kernels in and runs each graph, and each region of it, with its executor.

``graphed`` runs the model as written captured whole in one CUDA graph (:class:`WholeModelGraph`, forward only).
``cudnn_benchmark`` turns ``torch.backends.cudnn.benchmark`` on around each call (restored after); apply measures
such variants in a thread of their own (``cudnn_thread``, :func:`in_cudnn_thread`), since cuDNN's plan cache would
otherwise hand the algorithms it found to every later variant.
``channels_last`` (stock specs only, forward only) runs :class:`ChannelsLast` around a copy of the model whose 4-D /
5-D weights are channels-last, for inference: the user's model is not touched, the copy takes its parameters'
values where they changed in place, and a call in training or grad mode runs the model as written. Compilation and
CUDA-graph capture happen on the first call (dynamo's rules: a new input shape or grad mode recompiles).
Inside an outer ``torch.compile`` the planned model runs outside the outer graph (a graph break), so the outer
compile cannot inline the model and silently drop the plan.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from fusion_advisor.apply.backend import RewriteBackend
from fusion_advisor.apply.records import AS_WRITTEN, MatchKey, VariantSpec
from fusion_advisor.units import fmt_some


def channels_last(t: Any) -> Any:
    """A float tensor of 4 / 5 dims in channels-last memory format (NHWC / NDHWC), anything else as it is."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        if t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        if t.dim() == 5:
            return t.contiguous(memory_format=torch.channels_last_3d)
    return t


def _contiguous(t: Any) -> Any:
    return t.contiguous() if isinstance(t, torch.Tensor) else t


_CUDNN_THREAD: concurrent.futures.ThreadPoolExecutor | None = None


def in_cudnn_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run in one worker thread kept for the process (the caller waits), with the caller's
    grad mode, inference mode, CUDA device and current stream.

    Why: cuDNN's execution-plan cache (v8 API) is thread-local and its key leaves ``benchmark`` out, so a plan
    found with ``cudnn.benchmark`` on is taken by every later call of that thread with the same convolution, shapes
    and layout, benchmark or not (``run_single_conv`` in aten/src/ATen/native/cudnn/Conv_v8.cpp looks the cache
    up before it reads the flag). Timed in one thread after a ``cudnn.benchmark`` variant, a channels-last variant
    of 78_ConvTranspose3d_Max_Max_Sum ran at 2.03 ms; rebuilt from the plan in a fresh process, at 41.5 ms (H200,
    benchmarks/results/h200/apply_models). Apply runs its ``cudnn.benchmark`` variants here, so the algorithms
    they find stay in this thread: every other variant meets cuDNN as a fresh process does.
    """
    global _CUDNN_THREAD
    if _CUDNN_THREAD is None:
        _CUDNN_THREAD = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fusion-advisor-cudnn-benchmark")
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    stream = torch.cuda.current_stream() if cuda else None

    def run() -> Any:
        with contextlib.ExitStack() as stack:
            if stream is not None:
                stack.enter_context(torch.cuda.device(stream.device))
                stack.enter_context(torch.cuda.stream(stream))
            stack.enter_context(torch.inference_mode(inference))
            stack.enter_context(torch.set_grad_enabled(grad))
            return fn(*args, **kwargs)

    return _CUDNN_THREAD.submit(run).result()


class ChannelsLast(nn.Module):
    """A copy of ``model`` (every 4-D / 5-D float parameter and buffer in channels-last memory format) called with
    its 4-D / 5-D float inputs converted to channels-last and its tensor outputs returned contiguous (a
    ``conv(x).flatten(2)`` came back in the channels-last strides, and the caller's ``.view`` raised). Inside
    ``torch.compile`` the conversions are part of the graph (Inductor writes the first kernel's input and the last
    one's output in the layouts asked).

    ``model`` is left as it is (no hook: one made it unpicklable; no layout change: converting it in place changed
    its own outputs' strides). The copy is for inference, as apply measured it: :meth:`unusable` says when a call
    must run ``model`` itself instead (training mode, grad through parameters that require it, parameters of
    another dtype, device or identity than at the copy's making; each reason once in :attr:`notes`, as
    :class:`WholeModelGraph` keeps its own), and first copies the values of ``model``'s
    parameters and buffers into the copy where a parameter changed in place since (``load_state_dict``, an EMA
    update, an optimizer's step: their version counters moved; a copy made once kept the weights of its making).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        module = copy.deepcopy(model)
        with torch.no_grad():
            for p in list(module.parameters()) + list(module.buffers()):
                p.data = channels_last(p.data)
        self.module = module
        # not submodules or attributes nn.Module registers: the user's tensors are not this module's
        self.__dict__["source"] = model
        self.__dict__["_theirs"] = list(model.parameters()) + list(model.buffers())
        self.__dict__["_mine"] = list(module.parameters()) + list(module.buffers())
        self.__dict__["_params"] = list(model.parameters())
        self.__dict__["_synced"] = self._versions()
        self.__dict__["notes"] = []

    def _versions(self) -> int:
        return sum(t._version for t in self._params)

    def unusable(self) -> bool:
        """Whether a call must run the user's model rather than the copy now (the reason added to :attr:`notes`);
        where the copy serves it, its values are brought up to date first where the model's parameters changed in
        place."""
        why = ""
        first = next(self.source.parameters(), None)  # a cast or a move reaches every parameter: the first tells
        if self.source.training:
            why = "the model is in training mode: it ran as written (the channels-last copy is for inference)"
        elif torch.is_grad_enabled() and any(p.requires_grad for p in self._params):
            why = ("grad mode with parameters that require grad: the model ran as written (gradients reach its own "
                   "parameters, not the channels-last copy's)")
        elif self._params and (first is not self._params[0] or first.dtype != self._mine[0].dtype
                               or first.device != self._mine[0].device):
            why = ("the model's parameters changed dtype, device or identity since load_plan: it ran as written "
                   "(load_plan it again)")
        if why:
            if why not in self.notes:
                self.notes.append(why)
            return True
        if self._versions() != self._synced:
            with torch.no_grad():
                for mine, theirs in zip(self._mine, self._theirs, strict=True):
                    mine.copy_(theirs)
            self.__dict__["_synced"] = self._versions()
        return False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args = torch.utils._pytree.tree_map(channels_last, args)
        kwargs = torch.utils._pytree.tree_map(channels_last, kwargs)
        return torch.utils._pytree.tree_map(_contiguous, self.module(*args, **kwargs))


class WholeModelGraph:
    """``model`` (forward only) captured whole in one CUDA graph and replayed: ``torch.cuda.graph`` as PyTorch's
    "whole network capture" recipe (docs, CUDA semantics: CUDA Graphs) writes it, for models that dynamo's CUDA-graph
    backends run without graphs (a module attribute reassigned in ``forward``, an op dynamo cannot trace) and whose
    time is host launches: a 6-layer cuDNN LSTM over 512 steps launches thousands of small kernels per call.

    The first call with a new input signature (tensor shapes, strides, dtypes and devices; other arguments by value)
    runs the model three times on a side stream (warm-up: cuDNN / cuBLAS workspaces, lazy state), then captures one
    call on static copies of the inputs. Every later call with that signature copies its tensors into those buffers,
    replays the graph and returns clones of its outputs (a graph's outputs are overwritten by the next replay).
    Calls run eagerly instead, with the reason in :attr:`notes`: another signature than the captured one, grad mode
    with anything that requires grad (a graph has no autograd), CPU tensors, or a capture that failed (host
    synchronisation, a CPU tensor inside, an op not permitted while capturing; its error in :attr:`notes`).

    Args:
        model: the user's model (not modified); called with the arguments of each call.
        warmup: eager calls on a side stream before the capture.
    """

    def __init__(self, model: Any, warmup: int = 3):
        self.model = model
        self.warmup = warmup
        self.graph: Any = None
        self.signature: Any = None
        self.static_leaves: list[Any] = []  # the captured call's arguments, flattened: the graph's input buffers
        self.static_out: Any = None
        self.notes: list[str] = []
        self._failed: set[Any] = set()

    @staticmethod
    def _signature(leaves: list[Any]) -> Any:
        return tuple(("t", tuple(a.shape), a.stride(), a.dtype, str(a.device)) if isinstance(a, torch.Tensor)
                     else ("v", type(a).__name__, repr(a)) for a in leaves)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _graphable(self, leaves: list[Any]) -> bool:
        tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
        if not tensors or any(not t.is_cuda for t in tensors):
            self._note("inputs not all CUDA tensors: ran eagerly")
            return False
        if torch.is_grad_enabled() and (any(t.requires_grad for t in tensors)
                                        or any(p.requires_grad for p in _parameters(self.model))):
            self._note("grad mode with tensors that require grad (a CUDA graph has no autograd): ran eagerly")
            return False
        return True

    def _capture(self, args: tuple, kwargs: dict, signature: Any) -> None:
        static_args, static_kwargs = torch.utils._pytree.tree_map(
            lambda a: a.detach().clone() if isinstance(a, torch.Tensor) else a, (args, kwargs))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.model(*static_args, **static_kwargs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.model(*static_args, **static_kwargs)
        self.graph, self.signature, self.static_out = graph, signature, out
        self.static_leaves = torch.utils._pytree.tree_leaves((static_args, static_kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))  # once per call: guard, signature and copy
        if not self._graphable(leaves):
            return self.model(*args, **kwargs)
        signature = self._signature(leaves)
        if signature != self.signature:
            if self.graph is not None:
                self._note("a call with other input shapes than the captured ones: ran eagerly")
                return self.model(*args, **kwargs)
            if signature in self._failed:
                return self.model(*args, **kwargs)
            try:
                self._capture(args, kwargs, signature)
            except Exception as e:  # capture refused: the model runs as written, and says why
                self._failed.add(signature)
                why = str(e).splitlines()[0][:200] if str(e) else ""
                self._note(f"CUDA graph capture failed ({type(e).__name__}: {why}): ran eagerly")
                torch.cuda.synchronize()
                return self.model(*args, **kwargs)
        for dst, src in zip(self.static_leaves, leaves):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        self.graph.replay()
        return torch.utils._pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.static_out)


def _parameters(model: Any) -> list[torch.Tensor]:
    return list(model.parameters()) if isinstance(model, nn.Module) else []


def stock_compile(model: nn.Module, executor: str, options: dict[str, Any] | None = None) -> Any:
    """``model`` compiled as a user writes it for ``executor`` (see the module docstring).

    Raises:
        ValueError: an executor with no stock form.
    """
    options = dict(options or {})
    if executor == "inductor":
        return torch.compile(model, options=options) if options else torch.compile(model)
    if executor == "inductor+cudagraphs":
        if options:
            return torch.compile(model, options={**options, "triton.cudagraphs": True})
        return torch.compile(model, mode="reduce-overhead")
    if executor == "eager+cudagraphs":
        return torch.compile(model, backend="cudagraphs")
    if executor == "eager":
        return torch.compile(model, backend="eager")
    raise ValueError(f"no stock torch.compile call for executor {executor!r}")


class PlannedModel(nn.Module):
    """``model`` run as ``spec`` says (see the module docstring).

    Args:
        model: the user's model (not modified; the wrapper holds it as ``.model``).
        spec: the variant.
        kernels: ``{name: KernelEntry}`` to match for the spec's swaps; default the library's kernels they name.
        cudnn_thread: with ``spec.cudnn_benchmark``, every call runs in :func:`in_cudnn_thread` (apply's
            measurements; a thread hop per call, some tens of us). Off, as :func:`~fusion_advisor.load_plan`
            builds it: the caller's thread.

    Raises:
        ValueError: ``spec.channels_last`` on a spec with swaps or regions, ``spec.graphed`` on one with an
            executor, swaps or regions; an executor with no stock form.
    """

    def __init__(self, model: nn.Module, spec: VariantSpec, kernels: dict[str, Any] | None = None,
                 cudnn_thread: bool = False):
        super().__init__()
        self.model = model
        self.__dict__["cudnn_thread"] = cudnn_thread and spec.cudnn_benchmark
        # not attributes nn.Module registers: the compiled module would duplicate the parameters
        self.__dict__["spec"] = spec
        self.__dict__["backend"] = None
        keys = {s.key for s in spec.swaps}
        if spec.channels_last and not spec.stock:
            raise ValueError(f"variant {spec.name!r}: channels_last is for stock variants only (swaps and regions "
                             f"are keyed by the model's own module paths)")
        if spec.graphed and not (spec.stock and spec.rest == AS_WRITTEN):
            raise ValueError(f"variant {spec.name!r}: graphed captures the model as written (no executor, swaps or "
                             f"regions)")
        target = ChannelsLast(model) if spec.channels_last else model
        self.__dict__["layout"] = target if spec.channels_last else None
        if spec.graphed:
            fn: Any = WholeModelGraph(target)
        elif spec.rest == AS_WRITTEN and spec.stock:
            fn = target
        elif spec.stock:
            fn = stock_compile(target, spec.rest, dict(spec.inductor_options))
        else:
            if spec.swaps and kernels is None:
                from kernel_library.registry import load_all

                wanted = {k.kernel for k in keys}
                kernels = {n: e for n, e in load_all().items() if n in wanted}
            executor = "eager" if spec.rest == AS_WRITTEN else spec.rest
            backend = RewriteBackend(kernels or {}, select=lambda site: site.key in keys, executor=executor,
                                     inductor_options=dict(spec.inductor_options), regions=dict(spec.regions),
                                     region_depths=dict(spec.region_depths), match=bool(spec.swaps),
                                     causal_sdpa=spec.causal_sdpa)
            self.__dict__["backend"] = backend
            fn = torch.compile(model, backend=backend, dynamic=False)
        self.__dict__["_fn"] = fn
        self.__dict__["_outside"] = torch._dynamo.disable(self._call)
        # the hot path: the compiled callable itself where nothing else must happen per call
        self.__dict__["_run"] = fn if not (spec.cudnn_benchmark or spec.swaps or spec.channels_last) else self._call

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        if self.layout is not None and self.layout.unusable():
            return self.model(*args, **kwargs)
        if self.spec.cudnn_benchmark:
            out = in_cudnn_thread(self._benchmarked, *args, **kwargs) if self.cudnn_thread else \
                self._benchmarked(*args, **kwargs)
        else:
            out = self._fn(*args, **kwargs)
        if self.spec.swaps and not self.__dict__.get("_checked"):
            self.__dict__["_checked"] = True
            missing = self.missing_swaps()
            if missing:
                warnings.warn(
                    f"{len(missing)} of {len(self.spec.swaps)} planned swap(s) were not applied (see .problems()): "
                    f"{'; '.join(self.problems()[:3]) or 'no matching site in the model'}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return out

    def _benchmarked(self, *args: Any, **kwargs: Any) -> Any:
        previous = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            return self._fn(*args, **kwargs)
        finally:
            torch.backends.cudnn.benchmark = previous

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Bypasses nn.Module.__call__'s hook machinery: a planned model has no hooks of its own, and on a
        # launch-bound model a few microseconds per call are a measurable share of the step.
        if torch.compiler.is_compiling():
            # an outer torch.compile would inline the model and lose the plan: run ours outside its graph
            return self._outside(*args, **kwargs)
        return self._run(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.__call__(*args, **kwargs)

    def applied_swaps(self) -> list[MatchKey]:
        """Keys of the swaps rewritten into the graphs compiled so far (one entry per graph and swap)."""
        return self.backend.applied() if self.backend is not None else []

    def causal_masks_folded(self) -> int:
        """Attention calls run with ``is_causal=True`` instead of their traced causal mask, in the graphs compiled
        so far (``spec.causal_sdpa``)."""
        return sum(g.causal_folded for g in self.backend.graphs) if self.backend is not None else 0

    def missing_swaps(self) -> list[MatchKey]:
        """Planned swaps never found in any graph compiled so far (the model changed, or it has not run yet)."""
        applied = set(self.applied_swaps())
        return [s.key for s in self.spec.swaps if s.key not in applied]

    def problems(self) -> list[str]:
        """Graphs that ran unrewritten or without their executor, swaps that could not be rewritten, region
        overrides not found, calls of a whole-model CUDA graph that ran eagerly, calls of a channels-last plan that
        ran the model as written: each with its reason."""
        out = list(self.layout.notes) if self.layout is not None else []
        if isinstance(self._fn, WholeModelGraph):
            return out + list(self._fn.notes)
        if self.backend is None:
            return out
        for g in self.backend.graphs:
            if g.error:
                out.append(f"graph {g.index}: {g.error} (ran unrewritten)")
            if g.executor_error:
                out.append(f"graph {g.index}: {g.executor_error}")
            out += [f"graph {g.index}: {k} not rewritten: {why}" for k, why in g.skipped]
            out += [f"graph {g.index}: {n}" for n in g.notes]
        # a missing swap's kernel refused the site it would have taken (dtype, row width, or tensors on a CPU
        # without TRITON_INTERPRET): say why, rather than leave "no matching site"
        missing_keys = self.missing_swaps()
        missing = {k.kernel for k in missing_keys}
        refused: set[tuple[str, str, str]] = set()  # (kernel, module path, file:line) of the sites a kernel refused
        for g in self.backend.graphs:
            for nm in g.near_misses:
                if nm.kind == "check" and nm.kernel in missing:
                    src = f"{Path(nm.source.file).name}:{nm.source.line}" if nm.source.file else ""
                    refused.add((nm.kernel, nm.module_path, src))
                    where = nm.module_path or str(nm.source)
                    text = f"graph {g.index}: at {where}: {nm.reason}"
                    if text not in out:
                        out.append(text)
        # a site keyed by module path and source line: the model's file renamed, or a line added above the site,
        # moves every key (a fresh user's two swaps went unapplied, and this list was empty)
        planned = {s.key for s in self.spec.swaps}
        unplanned = [m.site.key for g in self.backend.graphs for m in g.matches if m.site.key not in planned]
        for k in (missing_keys if self.backend.graphs else []):  # (before the first call nothing is found yet)
            if (k.kernel, k.module_path, k.source) in refused:  # found, and refused with its reason above (a fresh
                continue  # user read "the model has no rmsnorm site" under the sites' own "tensors on cpu")
            alike = [f for f in unplanned if f.kernel == k.kernel]
            out.append(f"planned swap {k} found no site of that key"
                       + (f"; the model's {k.kernel} sites now: {fmt_some(alike)} (a site is keyed by its module "
                          "path and file:line: run apply again after changing the model's file)" if alike
                          else f"; the model has no {k.kernel} site"))
        return out
