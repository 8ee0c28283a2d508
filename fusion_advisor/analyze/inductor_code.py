"""Stage (opt-in, ``analyze --inductor-code``): the code Inductor generates for each routed chain.

For every chain routed to ``torch.compile`` or ``triton``, at most ``top`` of them by estimated saving and within
a time budget, :func:`generate` isolates the chain's ops from the captured aten graph into a standalone
GraphModule (:func:`chain_graph`: one placeholder per value the chain reads from outside, one output per member
value used outside it), builds random inputs of the recorded shapes, strides and dtypes, compiles it with
``torch.compile`` (Inductor) and captures the module Inductor writes, as ``TORCH_LOGS=output_code`` shows it
(``torch._inductor.utils.run_and_get_code``; where that helper is missing, the ``output_code`` log artifact).
The code is shown in report.html beside the source of the library kernel that replaces the chain's pattern (when
one exists, from ``kernel_library/registry.py``), and stored as ``inductor/<chain_id>.py`` in the report folder.

Where it runs:

* ``--device cuda``: on the GPU; the code is Inductor's Triton.
* ``--device cpu``: on the CPU; the code is Inductor's C++ (labelled "Inductor CPU code; on a GPU it would be
  Triton").
* ``--device meta`` (static analysis, no real tensors): the chain is compiled on the CPU with the same shapes when
  its inputs hold at most :data:`MAX_META_ELEMS` elements (C++ code, labelled as such); larger chains are
  "not generated: static analysis; rerun with --device cuda", since allocating and compiling them on the host
  would cost more than the analysis itself.

What Inductor generates for a chain cut out of its graph can differ from what it generates inside the whole
model (it may fuse across the chain's boundary); the report says so. Every failure (an op Inductor cannot take, no
C++ compiler, a chain whose ops are missing) is recorded per chain as its reason, never raised.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from fusion_advisor.analyze.records import Analysis, Chain, InductorCode

#: Chains compiled by default: the top N by estimated saving among those routed to torch.compile or triton.
DEFAULT_TOP = 5

#: Wall-clock budget for all chains, seconds; chains left when it is spent are recorded as not generated.
DEFAULT_BUDGET_S = 300.0

#: Largest total input elements compiled on the CPU for a --device meta analysis (64 MiB of fp32).
MAX_META_ELEMS = 1 << 24

#: Routes whose chains get Inductor code (a CUDA-graph route replays Inductor's fused kernels too).
CODE_ROUTES = ("torch.compile", "triton", "cudagraphs")

CPU_NOTE = "Inductor CPU code (C++); on a GPU it would be Triton"
ISOLATION_NOTE = ("the chain compiled on its own: inside the whole model Inductor may fuse it with its neighbours")


# --- isolating a chain --------------------------------------------------------------------------------------


def chain_graph(gm: torch.fx.GraphModule, node_names: Sequence[str]) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """The nodes ``node_names`` of ``gm`` as a standalone GraphModule, and the outside nodes its placeholders stand for.

    Placeholders: one per value a member reads from a non-member (in first-use order), each with the original's
    ``meta`` (so ``meta["val"]`` gives its shape, stride and dtype). Outputs: every member whose value a non-member
    (or the graph output) uses, as a tuple; the last member when none is.

    Raises:
        KeyError: a name is not a node of ``gm`` (the message lists the missing names).
        ValueError: no names given.
    """
    if not node_names:
        raise ValueError("the chain has no ops")
    by_name = {n.name: n for n in gm.graph.nodes}
    missing = [n for n in node_names if n not in by_name]
    if missing:
        raise KeyError(f"ops not in the captured graph: {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
    members = set(node_names)
    ordered = [n for n in gm.graph.nodes if n.name in members and n.op == "call_function"]
    if not ordered:
        raise ValueError("the chain has no call_function ops")
    member_set = set(ordered)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []
    for node in ordered:
        for arg in node.all_input_nodes:
            if arg not in member_set and arg not in env:
                ph = graph.placeholder(arg.name)
                ph.meta = dict(arg.meta)
                env[arg] = ph
                inputs.append(arg)
        env[node] = graph.node_copy(node, lambda a: env[a])
    outs = [n for n in ordered if any(u not in member_set for u in n.users)] or [ordered[-1]]
    graph.output(tuple(env[o] for o in outs))
    graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph), inputs


def _example(val: Any, device: torch.device) -> Any:
    """A real value like ``val`` (a fake/meta tensor, or a number) on ``device``: same shape, stride, dtype.

    The elements are drawn into a flat buffer as large as the strides reach and viewed with ``as_strided``, so
    broadcast (stride-0) and overlapping layouts come out as recorded. Floating: N(0, 1); bool: fair coin;
    integers: 0 or 1 (valid indices for any gather).
    """
    if isinstance(val, torch.Tensor):
        shape = tuple(int(s) for s in val.shape)
        stride = tuple(int(s) for s in val.stride())
        span = 1 + sum((n - 1) * st for n, st in zip(shape, stride) if n > 0) if all(shape) else 0
        if val.dtype.is_floating_point or val.dtype.is_complex:
            flat = torch.randn(span, device=device).to(val.dtype)
        elif val.dtype == torch.bool:
            flat = torch.rand(span, device=device) > 0.5
        else:
            flat = torch.randint(0, 2, (span,), device=device).to(val.dtype)
        return flat.as_strided(shape, stride)
    if isinstance(val, (int, float, bool)):
        return val
    raise TypeError(f"an input of type {type(val).__name__} (not a tensor of known shape)")


def _retarget(gm: torch.fx.GraphModule, device: torch.device) -> None:
    """Point factory ops' ``device=`` arguments (``meta`` in a static analysis) at ``device``."""
    changed = False
    for node in gm.graph.nodes:
        dev = node.kwargs.get("device")
        if isinstance(dev, (torch.device, str)) and torch.device(dev).type != device.type:
            node.kwargs = {**node.kwargs, "device": device}
            changed = True
    if changed:
        gm.recompile()


def _numel(val: Any) -> int:
    return int(val.numel()) if isinstance(val, torch.Tensor) else 0


# --- capturing Inductor's code ------------------------------------------------------------------------------


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("Output code written to"):  # a pointer to the file, not the code
            return
        head, sep, rest = text.partition("\n")
        self.records.append(rest if sep and head.strip().startswith("Output code") else text)


@contextlib.contextmanager
def _output_code_log() -> Iterator[_Collect]:
    """Collect the ``output_code`` log artifact (what ``TORCH_LOGS=output_code`` prints) while active."""
    handler = _Collect()
    names = ("torch._inductor.graph.__output_code", "torch._inductor.codecache.__output_code",
             "torch._inductor.compile_fx.__output_code")
    loggers = [logging.getLogger(n) for n in names]
    torch._logging.set_logs(output_code=True)
    propagate = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False  # collected here, not printed on the terminal as well
    try:
        yield handler
    finally:
        for lg, prop in zip(loggers, propagate):
            lg.removeHandler(handler)
            lg.propagate = prop
        torch._logging.set_logs()


def compile_and_capture(gm: torch.fx.GraphModule, inputs: list[Any]) -> str:
    """Compile ``gm`` with Inductor, run it once on ``inputs``, and return the source Inductor generated.

    Uses ``torch._inductor.utils.run_and_get_code`` (present in torch 2.0 .. 2.13), else the ``output_code`` log.

    Raises:
        RuntimeError: Inductor generated no code (e.g. the graph had only views).
        Exception: whatever ``torch.compile`` raised.
    """
    compiled = torch.compile(gm, backend="inductor", dynamic=False, fullgraph=True)
    try:
        from torch._inductor.utils import run_and_get_code
    except ImportError:
        run_and_get_code = None
    with torch.no_grad():
        if run_and_get_code is not None:
            _, codes = run_and_get_code(compiled, *inputs)
        else:
            torch._dynamo.reset()
            with _output_code_log() as log:
                compiled(*inputs)
            codes = log.records
    codes = [c for c in codes if c and c.strip()]
    if not codes:
        raise RuntimeError("Inductor generated no code for this chain")
    return "\n\n".join(codes)


def _language(code: str) -> str:
    if "@triton.jit" in code or "triton_heuristics" in code:
        return "triton"
    if "cpp_pybinding" in code or 'extern "C"' in code:
        return "c++"
    return "python"


# --- library kernel source ----------------------------------------------------------------------------------


def library_source(chain: Chain, kernel: str) -> tuple[str, str, str]:
    """``(kernel name, source file, source text)`` of the library kernel for ``chain``: the routed ``kernel``,
    else the first registered kernel that replaces the chain's pattern; empty strings when none exists."""
    try:
        from kernel_library.registry import get_kernel, kernels_for_pattern

        entry = get_kernel(kernel) if kernel else next(iter(kernels_for_pattern(chain.pattern)), None)
        if entry is None:
            return "", "", ""
        module = importlib.import_module(entry.module)
        path = inspect.getsourcefile(module) or ""
        return entry.name, path, Path(path).read_text(encoding="utf-8") if path else ""
    except Exception:  # noqa: BLE001 - a broken library never breaks the report; the kernel is just not shown
        return "", "", ""


# --- the stage ----------------------------------------------------------------------------------------------


def _target_device(analysis_device: str) -> torch.device:
    return torch.device("cuda") if analysis_device == "cuda" else torch.device("cpu")


def generate(analysis: Analysis, graphs: Sequence[torch.fx.GraphModule], top: int = DEFAULT_TOP,
             budget_s: float = DEFAULT_BUDGET_S, max_meta_elems: int = MAX_META_ELEMS) -> dict[str, InductorCode]:
    """Inductor's code for the routed chains of ``analysis`` (see the module doc), keyed by chain id.

    Args:
        analysis: the analysis (chains, estimates, decisions, device).
        graphs: the captured aten graphs the chains' op ids (``g<i>:<node>``) refer to.
        top: at most this many chains, by estimated saving (descending); 0 for none.
        budget_s: wall-clock budget in seconds; chains left when it is spent are recorded as not generated.
        max_meta_elems: on ``--device meta``, the largest total input elements compiled on the CPU.

    Returns:
        one :class:`InductorCode` per selected chain, in order of estimated saving; ``path`` is
        ``inductor/<chain_id>.py`` for generated code (written by :func:`write_files`).
    """
    routed = [c for c in analysis.chains if analysis.decisions.get(c.id) and analysis.decisions[c.id].route in CODE_ROUTES]
    routed.sort(key=lambda c: analysis.estimates[c.id].saving_us if c.id in analysis.estimates else 0.0, reverse=True)
    device = _target_device(analysis.device)
    start = time.perf_counter()
    out: dict[str, InductorCode] = {}
    for chain in routed[:max(top, 0)]:
        dec = analysis.decisions[chain.id]
        kname, kpath, ksource = library_source(chain, dec.kernel)
        base = dict(chain_id=chain.id, route=dec.route, pattern=chain.pattern, library_kernel=kname,
                    library_source=kpath, library_code=ksource)
        if time.perf_counter() - start > budget_s:
            out[chain.id] = InductorCode(status="not generated", reason=f"time budget of {budget_s:g} s spent "
                                         f"(--inductor-budget-s)", **base)
            continue
        out[chain.id] = _one(chain, graphs, analysis.device, device, max_meta_elems, base)
    return out


def _one(chain: Chain, graphs: Sequence[torch.fx.GraphModule], analysis_device: str, device: torch.device,
         max_meta_elems: int, base: dict[str, Any]) -> InductorCode:
    t0 = time.perf_counter()
    try:
        gi = chain.graph_index
        if gi >= len(graphs):
            raise KeyError(f"graph {gi} was not captured")
        names = [op_id.split(":", 1)[1] for op_id in chain.op_ids if op_id.startswith(f"g{gi}:")]
        gm, outside = chain_graph(graphs[gi], names)
    except (KeyError, ValueError) as exc:
        return InductorCode(status="failed", reason=f"chain not isolated: {exc.args[0] if exc.args else exc}", **base)
    vals = [n.meta.get("val") for n in outside]
    if analysis_device == "meta":
        n = sum(_numel(v) for v in vals)
        if n > max_meta_elems:
            return InductorCode(status="not generated", reason=(
                f"not generated: static analysis (--device meta) and the chain's inputs hold {n:,} elements, above "
                f"the {max_meta_elems:,} compiled on the CPU; rerun with --device cuda"), **base)
    try:
        _retarget(gm, device)
        torch.manual_seed(0)
        inputs = [_example(v, device) for v in vals]
        code = compile_and_capture(gm, inputs)
    except Exception as exc:  # noqa: BLE001 - every failure is the chain's reason, never a crash
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        return InductorCode(status="failed", reason=f"torch.compile failed: {type(exc).__name__}: {first}"[:500],
                            compile_s=time.perf_counter() - t0, **base)
    lang = _language(code)
    note = ISOLATION_NOTE if device.type == "cuda" else f"{CPU_NOTE}; {ISOLATION_NOTE}"
    if analysis_device == "meta":
        note = f"generated on the CPU with the analysis' shapes (static analysis had no real tensors); {note}"
    return InductorCode(status="generated", path=f"inductor/{chain.id}.py", language=lang, device=device.type,
                        note=note, compile_s=time.perf_counter() - t0, code=code, **base)


def check_dir(out_dir: Path, ours: bool) -> None:
    """Refuse to write into ``out_dir/inductor`` when it holds files and the report folder is not ours.

    Args:
        ours: whether ``out_dir`` holds an earlier fusion-advisor report (see ``report.check_out_dir``).

    Raises:
        UserError: the folder holds files fusion-advisor did not write.
    """
    from fusion_advisor.errors import UserError

    folder = Path(out_dir) / "inductor"
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not ours)):
        raise UserError(f"--out {out_dir}: {folder} holds files that fusion-advisor did not write; choose another "
                        f"directory (the tool never overwrites your files)")


def write_files(records: dict[str, InductorCode], out_dir: Path) -> list[Path]:
    """Write each generated record's code to ``out_dir / record.path`` atomically; return the paths written."""
    from fusion_advisor.files import atomic_write_bytes

    written = []
    for rec in records.values():
        if rec.status != "generated" or not rec.path:
            continue
        path = Path(out_dir) / rec.path
        path.parent.mkdir(parents=True, exist_ok=True)
        header = (f"# Inductor's code for chain {rec.chain_id} ({rec.pattern}, routed to {rec.route}), captured by "
                  f"fusion-advisor analyze --inductor-code\n# {rec.note}\n")
        atomic_write_bytes(path, (header + rec.code).encode("utf-8"))
        written.append(path)
    return written
