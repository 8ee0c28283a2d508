"""The analyze pipeline: model file -> captured graphs -> op graph -> chains -> estimates -> decisions.

:func:`analyze` runs the stages in order and returns an :class:`~fusion_advisor.analyze.records.Analysis`; the CLI writes
the report from it. Each stage lives in its own module; this one only wires them and times them.
"""

from __future__ import annotations

import contextlib
import platform
from collections import Counter
from pathlib import Path
from dataclasses import replace
from typing import Any, Callable

import torch

from fusion_advisor.memory import available_bytes
from fusion_advisor.stages import Stage, no_progress, stage_timer
from fusion_advisor.analyze.capture import Capture, capture, unused_nodes
from fusion_advisor.analyze.chains import build_chains
from fusion_advisor.devices import DeviceSpec, load_spec, spec_file
from fusion_advisor.errors import ModelRunError
from fusion_advisor.analyze.graph import build_op_graph, unused_ops
from fusion_advisor.analyze.load import LOAD_SEED, LoadedModel, load_model
from fusion_advisor.analyze.records import Analysis, UnusedWork
from fusion_advisor.analyze.model_call import HostCalls, weigh_model_call
from fusion_advisor.analyze.roofline import eager_alone_us, estimate_all
from fusion_advisor.analyze.table_range import beyond_table_note
from fusion_advisor.units import fmt_some
from fusion_advisor.verification.trees import tensor_leaves
from fusion_advisor.analyze.route import route_all
from fusion_advisor.analyze.rules import load_rules

#: GPU name fragments -> shipped device spec, for picking a default spec on the present GPU.
_GPU_SPECS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("L4", "l4"))


def default_device() -> str:
    """``"cuda"`` when a GPU is present, else ``"meta"`` (static analysis, nothing executed)."""
    return "cuda" if torch.cuda.is_available() else "meta"


def default_spec_name() -> str:
    """The shipped spec of the present GPU when known, else ``"h200"`` (the project's reference GPU)."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for fragment, spec in _GPU_SPECS:
            if fragment in name:
                return spec
    return "h200"


def _default_spec_for(device: str, profile: bool) -> str:
    """The spec when ``--gpu`` is not given: ``"cpu"`` when profiling on a CPU (the measured times are a CPU's,
    so the estimates they are set against must be too), else :func:`default_spec_name`."""
    return "cpu" if profile and device == "cpu" else default_spec_name()


def _profile_spec_notes(device: str, profile: bool, gpu: str | None, spec: DeviceSpec) -> list[str]:
    """Warnings for the report when a CPU profile is set against a roofline (empty when nothing to say)."""
    if not (profile and device == "cpu"):
        return []
    if gpu is None:
        return [f"--profile --device cpu: the roofline is the shipped '{spec.name}' spec, a generic CPU's "
                f"order-of-magnitude assumptions ({spec.memory_bandwidth_gbps:g} GB/s, ...), not this CPU's "
                "measured rates, so predicted/measured ratios may be far from 1; for this CPU's own numbers pass "
                "--gpu SPEC.yaml from `fusion-advisor calibrate --device cpu`, for GPU advice analyse without "
                "--profile"]
    if spec.kind != "cpu":
        return [f"--profile --device cpu with --gpu {gpu}: times measured on this CPU are set against the "
                f"roofline of {spec.display_name}, so predicted/measured ratios, the 2x flags and the bound-class "
                "agreement compare two different machines"]
    return []


def versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour shapes the analysis (the tool's own is in the report header)."""
    out = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "not installed"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        out["cuda"] = str(torch.version.cuda)
    return out


def analyze(
    model_path: str | Path | None,
    device: str | None = None,
    dtype: str = "",
    gpu: str | None = None,
    rules_files: list[str | Path] | None = None,
    stage: Stage = no_progress,
    on_capture: Callable[[Capture], None] | None = None,
    profile: bool = False,
    trace: str | Path | None = None,
    profile_runs: int = 3,
) -> Analysis:
    """Analyse the model in ``model_path`` (``None``: the built-in default model).

    Args:
        model_path: model file in one of the conventions of :mod:`fusion_advisor.analyze.load`.
        device: ``"meta"``, ``"cpu"`` or ``"cuda"``; default :func:`default_device`.
        dtype: ``""``, ``"fp32"``, ``"bf16"`` or ``"fp16"`` (casts model and floating inputs).
        gpu: device-spec name or YAML path; default :func:`default_spec_name`.
        rules_files: user rules files, matched before the shipped rules.
        stage: context-manager factory called with each stage's name (the CLI shows progress with it).
        on_capture: called with the :class:`~fusion_advisor.analyze.capture.Capture` once captured (later stages that need
            the graphs themselves, such as ``--inductor-code``, keep it this way).
        profile: run the model under torch.profiler and measure every chain (:mod:`fusion_advisor.analyze.profile`);
            needs ``device`` cpu or cuda. Rules may then match the measured bound class.
        trace: with ``profile``, also write the chrome trace there (Perfetto / chrome://tracing).
        profile_runs: profiled runs (times are per run).

    Raises:
        UserError: subclasses name the file, line, rule or op at fault (see :mod:`fusion_advisor.errors`).
    """
    timings: dict[str, float] = {}
    timed = stage_timer(stage, timings)

    # Cheap checks first, so a bad option fails before a long capture.
    auto_device = device is None
    device = device or default_device()
    spec: DeviceSpec = load_spec(gpu or _default_spec_for(device, profile))
    spec_notes = _profile_spec_notes(device, profile, gpu, spec)
    rules = load_rules(rules_files or [])
    if trace is not None and not profile:
        from fusion_advisor.errors import UserError

        raise UserError("--trace writes the profiler's trace: it needs --profile")
    if profile:
        from fusion_advisor.analyze.profile import check_can_profile, check_trace_path

        check_can_profile(device)
        if trace is not None:
            check_trace_path(Path(trace))

    with timed("load"):
        loaded = _load(model_path, device, dtype, auto_device)
    with timed("capture"):
        try:
            cap = capture(loaded)
        except ModelRunError as e:
            if not (auto_device and loaded.device == "meta" and reads_values(e)):
                raise
            loaded = _on_cpu_instead(model_path, dtype, loaded, e)
            cap = capture(loaded)
    if on_capture is not None:
        on_capture(cap)
    with timed("unused"):
        unused = unused_nodes(_on_meta(loaded, model_path, dtype))
    profile_fn = None
    if profile:
        from fusion_advisor.analyze.profile import profile_model

        def profile_fn(og: Any, chains: list, estimates: dict) -> Any:
            return profile_model(loaded, cap, og.ops, chains, estimates, spec, runs=profile_runs,
                                 trace_path=Path(trace) if trace is not None else None)

    analysis = analyze_capture(loaded, cap, spec, rules, timed, notes=spec_notes, profile_fn=profile_fn,
                               unused=unused)
    analysis.timings_s = timings
    analysis.device_spec_file = spec_file(gpu) if gpu else ""
    return analysis


#: Error texts of an op that needs tensor values (nothing to read on the meta device).
_VALUE_READS = ("meta tensor", "item()", "data-dependent", "truth value", "data_ptr", "cannot be called on meta",
                "nonzero", "is not implemented for meta", "meta_nonzero", "aten::_local_scalar_dense")

#: On the CPU instead of meta only when the model's parameters and buffers take at most this share of the memory
#: available (the rest is headroom for activations and the capture).
CPU_FALLBACK_MEMORY_SHARE = 0.5


#: Error texts of a model that makes tensors on the CPU inside forward (``torch.zeros(8, 64)`` without
#: ``device=``): they meet the meta device's tensors there (a new user's attention mask,
#: ``torch.triu(torch.ones(T, T, dtype=torch.bool), 1)`` in ``masked_fill``: "Tensor on device meta is not on the
#: expected device cpu!").
_DEVICE_MIXES = ("not on the expected device meta", "device meta is not on the expected device cpu", "cpu and meta",
                 "meta and cpu")


def reads_values(e: BaseException) -> bool:
    """Whether an error says the model read a tensor's values (``.item()``, a branch on a value, ``nonzero``), or
    mixed tensors it made on the CPU with the meta device's (:func:`makes_cpu_tensors`): either runs on the CPU."""
    text = str(e).lower()
    return any(k.lower() in text for k in _VALUE_READS) or makes_cpu_tensors(e)


def makes_cpu_tensors(e: BaseException) -> bool:
    """Whether an error says the model made a tensor on the CPU that met one on the meta device (a
    ``torch.zeros(...)`` without ``device=`` inside forward)."""
    text = str(e).lower()
    return any(k in text for k in _DEVICE_MIXES)


def _load(model_path: str | Path | None, device: str, dtype: str, auto_device: bool) -> LoadedModel:
    """load_model on ``device``; on the default meta device a model whose ``__init__`` reads tensor values (a
    ``.item()`` of a ``linspace`` for drop-path rates) is built on the CPU instead, and the report says so."""
    from fusion_advisor.errors import ModelRunError

    try:
        return load_model(model_path, device=device, dtype=dtype)
    except ModelRunError as e:
        if not (auto_device and device == "meta" and reads_values(e)):
            raise
        loaded = load_model(model_path, device="cpu", dtype=dtype)
        loaded.notes.append(f"{loaded.file}: built and analysed on the CPU, not the meta device: building the "
                            f"model reads tensor values ({_first_words(e)}); shapes and costs are the same")
        return loaded


def _on_meta(loaded: LoadedModel, model_path: str | Path | None, dtype: str) -> LoadedModel | None:
    """``loaded`` when it is on the meta device, else the same model built again there (no weights, no compute:
    what :func:`fusion_advisor.analyze.capture.unused_nodes` traces); None when it cannot be built there."""
    if loaded.device == "meta":
        return loaded
    try:
        return load_model(model_path, device="meta", dtype=dtype)
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta makes no claim about unused work
        return None


def _on_cpu_instead(model_path: str | Path | None, dtype: str, meta: LoadedModel, e: BaseException) -> LoadedModel:
    """The model again on the CPU, after its run on meta read a tensor's value (a branch on ``h.mean() > 0``, a
    ``nonzero``): only when its parameters fit in memory (:data:`CPU_FALLBACK_MEMORY_SHARE`), else the error."""
    need = sum(t.numel() * t.element_size() for t in list(meta.module.parameters()) + list(meta.module.buffers()))
    have = available_bytes("cpu")
    if need > CPU_FALLBACK_MEMORY_SHARE * have:
        raise type(e)(f"{e} — it cannot be analysed on the meta device, and its {need / 2**30:.1f} GiB of weights do "
                      f"not fit in this machine's memory ({have / 2**30:.1f} GiB available) to run it on the CPU: "
                      f"analyse it on a GPU machine (--device cuda)") from e
    loaded = load_model(model_path, device="cpu", dtype=dtype)
    why = ("makes tensors on the CPU while it runs, which meet the meta device's there (give them the input's "
           "device, e.g. torch.zeros(..., device=x.device), or the model fails on a GPU too)"
           if makes_cpu_tensors(e) else
           f"reads tensor values while it runs, and where its Python branches on them, only the branches these "
           f"inputs take are analysed (made under seed {LOAD_SEED}, the same in every analysis on the CPU; a "
           f"GPU's generator draws other values)")
    loaded.notes.append(f"{loaded.file}: analysed on the CPU, not the meta device: the model {why} "
                        f"({_first_words(e)}); its weights ({need / 2**20:.0f} MiB) fit in memory")
    return loaded


def _first_words(e: BaseException, limit: int = 160) -> str:
    """The value read that sent the model to the CPU, in a few words: the error's text without the "fails on its
    own inputs" framing and the meta-device hint (the model does not fail: meta tensors hold no values)."""
    text = " ".join(str(e).split())
    text = text.replace("the model fails on its own inputs: ", "")
    text = text.split(" (on --device meta", 1)[0]
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."


#: A model whose every chain is routed SKIP is flagged when torch.compile is predicted to save at least this share.
ALL_SKIP_FLAG_SHARE = 0.05


def _all_skip_check(chains: list, estimates: dict, decisions: dict) -> list[str]:
    """A warning when every chain is routed SKIP although torch.compile's predicted time of the fusible chains
    (``Estimate.compile_us``) saves at least :data:`ALL_SKIP_FLAG_SHARE` of the model's eager time."""
    if not decisions or any(d.route != "skip" for d in decisions.values()):
        return []
    eager = sum(e.eager_us for e in estimates.values())
    gain = sum(max(e.eager_us - e.route_us("torch.compile"), 0.0) for c in chains
               if c.kind == "fusible" and (e := estimates.get(c.id)) is not None)
    if eager <= 0 or gain < ALL_SKIP_FLAG_SHARE * eager:
        return []
    return [f"every chain is routed SKIP, but torch.compile is predicted to save {gain:.1f} us of {eager:.1f} us "
            f"({gain / eager:.0%}) over eager across the model's fusible chains: check the rules (a --rules file "
            f"may be sending them to skip), or run apply, which measures torch.compile(model) whatever the routes"]


#: The products (matmul and conv ops) whose operands may differ in dtype: ``_scaled_mm`` (fp8 operands, fp32
#: scales) and ``_int_mm`` (int8 operands, int32 result).
MIXED_DTYPE_PRODUCTS = frozenset({"_scaled_mm", "_int_mm"})


#: aten ops that draw random numbers: Inductor's generated code draws from a stream of its own (Philox), so a
#: compiled variant of such a model cannot match the model as written on the same seed.
RANDOM_OPS = frozenset(("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "normal",
                        "uniform", "bernoulli", "native_dropout", "dropout", "multinomial", "exponential",
                        "rrelu_with_noise", "poisson"))


def _random_draws(ops: list) -> list[str]:
    """One warning when the captured graphs draw random numbers (a KernelBench LSTM's ``torch.randn`` initial
    state, dropout in training): apply seeds every call alike, yet compiled variants draw from Inductor's stream,
    so they differ from the model as written by the draws, and the check calls them wrong without saying why."""
    draws = [o for o in ops if o.name in RANDOM_OPS]
    if not draws:
        return []
    sites = list(dict.fromkeys(f"{o.name} at {o.source.file}:{o.source.line}" if o.source.file else o.name
                               for o in draws))
    return [f"the model draws random numbers ({len(draws)} op(s): {fmt_some(sites)}): apply seeds every call "
            f"alike, but code torch.compile generates draws from another random stream than eager's kernels, so "
            f"compiled variants differ from the model as written by the draws; to verify them, pass the random "
            f"tensors in as inputs or fix them in buffers"]


#: Matmuls priced beyond the spec's table named in warnings at most (the rest counted).
BEYOND_TABLE_LISTED = 3


def _beyond_table(ops: list, spec: DeviceSpec) -> list[str]:
    """A warning per matmul priced far beyond the spec's measured GEMM table
    (:func:`fusion_advisor.analyze.table_range.beyond_table_note`), one per source line and shape, the first
    :data:`BEYOND_TABLE_LISTED` named and the rest counted."""
    notes = list(dict.fromkeys(n for n in (beyond_table_note(o, spec) for o in ops) if n))
    extra = len(notes) - BEYOND_TABLE_LISTED
    return notes[:BEYOND_TABLE_LISTED] + ([f"{extra} more matmul(s) are priced beyond the spec's measured GEMM "
                                           f"table"] if extra > 0 else [])


def _mixed_dtype_products(ops: list) -> list[str]:
    """A warning per product (a matmul or conv op, :data:`MIXED_DTYPE_PRODUCTS` apart) whose tensor operands have
    different dtypes: eager PyTorch raises on them (``mat1 and mat2 must have the same dtype``), meta tensors do
    not, so an analysis on ``--device meta`` would describe a model that cannot run."""
    out = []
    for op in ops:
        dtypes = sorted({t.dtype for t in op.inputs if t.dtype})
        if op.category in ("matmul", "conv") and op.name not in MIXED_DTYPE_PRODUCTS and len(dtypes) > 1:
            where = f"{op.source.file}:{op.source.line}" if op.source.file else op.id
            out.append(f"{where}: {op.name} gets operands of {' and '.join(dtypes)}: PyTorch refuses mixed dtypes "
                       f"here, so the model fails when run (meta tensors do not check this); cast the inputs, or "
                       f"analyze with --device cpu to see the error")
    return out


def analyze_capture(loaded: LoadedModel, cap: Capture, spec: DeviceSpec, rules: Any,
                    timed: Callable[[str], contextlib.AbstractContextManager] | None = None,
                    notes: list[str] | None = None, profile_fn: Callable[..., Any] | None = None,
                    unused: list[torch.fx.Node] | None = None) -> Analysis:
    """The analysis stages after capture, written once for ``analyze`` and ``apply``: op graph -> chains ->
    roofline -> routes (and, with ``profile_fn(op_graph, chains, estimates) -> Profile``, the measurement and
    the routes again, since rules may match the measured bound class).

    Args:
        loaded: the loaded model; cap: its capture; spec: the device spec; rules: the :class:`RuleSet`.
        timed: context-manager factory called with each stage's name (progress and stage times).
        notes: extra warnings for the report (e.g. about the device spec).
        unused: the eager calls no output depends on (:func:`fusion_advisor.analyze.capture.unused_nodes`), priced
            into :attr:`Analysis.unused` and named in a warning.
    """
    timed = timed or no_progress
    with timed("graph"):
        og = build_op_graph(cap)
    with timed("chains"):
        chains = build_chains(og)
    with timed("route"):
        estimates = estimate_all(chains, og.ops, spec)
        decisions = route_all(chains, estimates, rules, device_kind=spec.kind)
    work = unused_work(unused or [], spec, og.ops)
    measured = None
    if profile_fn is not None:
        with timed("profile"):
            measured = profile_fn(og, chains, estimates)
        with timed("route-measured"):  # again: rules may match the measured bound class
            decisions = route_all(chains, estimates, rules, device_kind=spec.kind, measured=measured.chains)
    # the rules' verdict is what the all-skip check questions; the model's call may then leave chains as written
    all_skip = _all_skip_check(chains, estimates, decisions)
    # a route a profile's measured bound class decided stays (the roofline the weighing reads is what it overrode),
    # and so does one the user's own rule decided (a rule keeping launch-bound chains eager had been overruled)
    on_measured = {r.id for r in rules.rules if "measured_bound" in r.match} if measured is not None else set()
    users = rules.users_own()
    decisions = {i: (replace(d, fixed=True) if d.rule_id in on_measured or (d.rule_id, d.rules_file) in users
                     else d) for i, d in decisions.items()}
    input_bytes = sum(x.numel() * x.element_size() for x in tensor_leaves(loaded.inputs))
    decisions = weigh_model_call(chains, estimates, decisions,
                                 HostCalls.from_spec(spec, len({op.graph_index for op in og.ops}), input_bytes),
                                 unused_us=work.eager_us if work is not None else 0.0)
    return Analysis(
        model_name=loaded.name,
        model_file=loaded.file,
        convention=loaded.convention,
        device=loaded.device,
        dtype=loaded.dtype,
        device_spec=spec.to_dict(),
        rules_files=list(rules.files),
        capture_method=cap.method,
        graph_breaks=cap.breaks,
        warnings=(cap.warnings + loaded.notes + list(notes or []) + og.notes + _mixed_dtype_products(og.ops)
                  + _random_draws(og.ops) + _beyond_table(og.ops, spec)
                  + all_skip + ([unused_note(work, spec)] if work else [])
                  + ([] if measured is not None else [
                      f"rule {r.id} ({r.file}) matches on measured_bound, which only analyze --profile measures: "
                      f"it decided no chain here" for r in rules.profile_only()])),
        ops=og.ops,
        chains=chains,
        estimates=estimates,
        decisions=decisions,
        versions=versions(),
        profile=measured,
        input_bytes=input_bytes,
        unused=work,
    )


def _site(op: Any) -> tuple[str, tuple[int, ...]]:
    """Where an op came from and what it made: ``(file:line, first output's shape)``."""
    where = f"{Path(op.source.file).name}:{op.source.line}" if op.source.file else "?"
    return where, tuple(op.outputs[0].shape) if op.outputs else ()


def unused_work(nodes: list[torch.fx.Node], spec: DeviceSpec, captured: list[Any] = ()) -> UnusedWork | None:
    """The eager calls no output depends on, priced on ``spec`` (:func:`eager_alone_us`, each op alone: the work
    has no neighbours to overlap with that the analysis knows), their source lines costliest first; ``None`` when
    none of them launches a kernel.

    A call is left out where the captured graphs hold an op of the same line and output shape (``captured``, the
    op graph's records; each held op answers for one call): dynamo kept it, so it is used after all, in a way the
    trace's output does not show (a dataclass returned, a tensor kept on the module or in a list it owns)."""
    kept = Counter(_site(o) for o in captured if not o.is_view)
    ops, by_line = [], Counter()
    for o in unused_ops(nodes):
        site, us = _site(o), eager_alone_us(o, spec)
        if kept[site] > 0:
            kept[site] -= 1
        elif us > 0:
            ops.append(o)
            by_line[site[0]] += us
    if not ops:
        return None
    return UnusedWork(ops=len(ops), eager_us=sum(by_line.values()), flops=sum(o.flops for o in ops),
                      bytes=sum(o.bytes_read + o.bytes_written for o in ops),
                      lines=sorted(by_line, key=lambda k: -by_line[k]))


def unused_note(work: UnusedWork, spec: DeviceSpec) -> str:
    """The report's warning about :class:`UnusedWork`."""
    return (f"eager runs {work.ops} op(s) whose results nothing the model returns uses ({fmt_some(work.lines)}): "
            f"{work.eager_us:.0f} us predicted on {spec.name}, {work.flops / 1e9:.3g} GFLOP, "
            f"{work.bytes / 1e6:.3g} MB moved. torch.compile(model) and apply's dynamo-based variants drop them "
            "(dynamo removes dead code); the model as written, and a CUDA graph of it, pay for them. The chains "
            "below hold only the used work; the whole-model eager prediction adds this. Removing the code (or "
            "asking for less, e.g. need_weights=False) saves it in every variant")
