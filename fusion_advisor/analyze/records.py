"""Typed records passed between pipeline stages.

Each stage takes records from the one before and returns its own; no stage reaches into another's internals.

    load.LoadedModel -> capture.Capture -> graph.OpGraph (OpInfo per node) -> chains.Chain
        -> route.Decision (rules.Rule, devices.DeviceSpec, cost.Estimate) -> report
    profile.Profile (NodeMeasurement per op, ChainMeasurement per chain; ``analyze --profile``) -> route, report
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorMeta:
    """Shape and storage facts of one tensor value (from fake-tensor propagation; no data).

    Attributes:
        shape: sizes per dimension.
        dtype: short dtype name (``"bf16"``, ``"fp32"``, ``"int64"``, ...).
        numel: number of elements of the logical tensor.
        nbytes: bytes the tensor's elements occupy in memory, counting broadcast (stride-0) dims once.
        contiguous: the layout an elementwise kernel reads at copy speed: the dims that move in memory (size > 1,
            stride != 0) have strides in decreasing order and the innermost one has stride 1. True for contiguous
            tensors, broadcasts (stride-0 dims) and offset/slice views of a contiguous tensor (``x[:, :64]``);
            False for permuted views (``transpose``, ``permute``, ``.mT``) and step slices (``x[..., ::2]``),
            which eager TensorIterator kernels read far below copy bandwidth. Default True (records written
            before the field existed).
    """

    shape: tuple[int, ...]
    dtype: str
    numel: int
    nbytes: int
    contiguous: bool = True


@dataclass(frozen=True)
class SourceLoc:
    """Where an op came from in Python source: ``file:line`` plus the code on that line."""

    file: str = ""
    line: int = 0
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "?"


@dataclass(frozen=True)
class GraphBreak:
    """A point where dynamo stopped capturing and ran Python eagerly.

    Attributes:
        reason: dynamo's reason, one line.
        source: the user's source line where the break happened (innermost frame in user code).
        graph_index: index of the graph that ended at this break.
    """

    reason: str
    source: SourceLoc
    graph_index: int


def aten_name(target: str) -> str:
    """An op target's base name: ``"aten.mm.default"`` -> ``"mm"``; other targets as they are."""
    return target.split(".")[1] if target.startswith("aten.") else target


@dataclass(frozen=True)
class OpInfo:
    """One node of the op graph: an aten op with its cost facts.

    Attributes:
        id: unique id ``"g<graph>:<node name>"``.
        graph_index: index of the captured graph the node belongs to.
        target: aten overload name, e.g. ``"aten.mm.default"``.
        category: one of :data:`fusion_advisor.analyze.graph.CATEGORIES`.
        inputs: tensor inputs in argument order.
        outputs: tensor outputs.
        flops: floating-point operations (multiply and add counted separately, as torch.utils.flop_counter does).
        bytes_read: bytes read from memory if the op runs as its own kernel (views: 0).
        bytes_written: bytes written if the op runs as its own kernel (views: 0).
        module_path: dotted path of the nn.Module that issued the op (``"model.layers.0.mlp"``), ``""`` at top level.
        source: the Python line that issued the op.
        reduction_elems: for reductions/normalizations/softmax, elements reduced per output (the row width), else 0.
        reduces_last_dim: False when a reduction runs over another dim than the last (e.g. softmax over channels).
        variant: for attention ops, the ``F.scaled_dot_product_attention`` backend torch runs on a GPU (``"flash"``,
            ``"efficient"``, ``"cudnn"``, ``"math"``; :mod:`fusion_advisor.analyze.sdpa`); for recurrent ops the cell
            (``"lstm"``, ``"gru"``, ``"rnn_tanh"``, ``"rnn_relu"``); for a native encoder layer its head count
            (``"heads=8"``, :mod:`fusion_advisor.analyze.composites`); ``""`` for other ops or unknown.
        eager_kernels: kernels the op launches when run eagerly: 1, except composite paths (SDPA's math backend:
            :func:`fusion_advisor.analyze.sdpa.math_kernels`; the native encoder layer,
            :data:`fusion_advisor.analyze.composites.ENCODER_LAYER_KERNELS`; aten ops run as several kernels:
            :func:`fusion_advisor.analyze.graph.eager_kernel_count`, logsumexp's nine) and ops on empty tensors
            (still 1 here; the roofline skips them).
        sequential_steps: recurrent ops: the cell steps that run one after another (layers x directions x sequence
            length: :func:`fusion_advisor.analyze.graph.recurrent_geometry`); 0 for other ops.
        window_elems: pooling ops with a kernel size (max / avg pool 1-3d): the input elements each output reads
            (the product of the kernel size; :func:`fusion_advisor.analyze.graph.pool_window`); 0 for other ops.
    """

    id: str
    graph_index: int
    target: str
    category: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    flops: int
    bytes_read: int
    bytes_written: int
    module_path: str
    source: SourceLoc
    reduction_elems: int = 0
    reduces_last_dim: bool = True
    variant: str = ""
    eager_kernels: int = 1
    sequential_steps: int = 0
    window_elems: int = 0

    @property
    def name(self) -> str:
        """The target's base name (:func:`aten_name`): ``"mm"`` for ``"aten.mm.default"``."""
        return aten_name(self.target)

    @property
    def reads_permuted(self) -> bool:
        """True when a tensor input is in a permuted/strided layout (:attr:`TensorMeta.contiguous` False)."""
        return any(not m.contiguous for m in self.inputs)

    @property
    def reads_broadcast(self) -> bool:
        """True when a tensor input has fewer elements than the largest output (a bias of ``[C, 1, 1]`` added to
        ``[N, C, H, W]``, a 0-dim tensor, a mask of ``[1, 1, T, T]``): the op broadcasts it."""
        out = max((m.numel for m in self.outputs), default=0)
        return any(m.numel < out for m in self.inputs)

    @property
    def is_view(self) -> bool:
        """True for ops that move no data (views and metadata-only ops)."""
        return self.category == "view"

    @property
    def dtype(self) -> str:
        """dtype of the first output, or of the first input when there is no tensor output."""
        metas = self.outputs or self.inputs
        return metas[0].dtype if metas else ""


@dataclass(frozen=True)
class Chain:
    """A routing item: a fusible chain of ops, or a heavy op (matmul, conv, attention, ...) on its own.

    Attributes:
        id: ``"c<index>"`` in topological order.
        kind: ``"fusible"`` (pointwise/reduction/normalization/softmax ops that one fused kernel can run),
            ``"heavy"`` (a library op: matmul, conv, attention, embedding) or ``"other"`` (an op no fused kernel takes).
        op_ids: ids of the member ops (views included), topological order.
        targets: aten op names of the member ops that launch a kernel (views excluded).
        pattern: recognised pattern (``"rmsnorm"``, ``"softmax"``, ...), else a generic name (``"pointwise"``,
            ``"matmul"``, ...).
        categories: categories present among member ops, sorted.
        dtype: dominant dtype of the chain's data.
        eager_kernels: kernels launched when run op by op (views launch none).
        eager_bytes: bytes moved op by op (sum over member ops of read + written).
        fused_bytes: bytes moved by one fused kernel (chain inputs read once, chain outputs written once).
        flops: floating-point operations of all member ops.
        numel: elements of the chain's largest tensor.
        row_elems: row width of the chain's reductions (0 when the chain has none).
        source: source line of the first op that launches a kernel.
        module_path: module of that op.
        epilogue_of: id of the heavy chain whose output this chain alone consumes (an epilogue candidate), or ``""``.
        prologue_of: id of the pooling item that alone consumes this pointwise chain's output, or ``""``: Inductor
            lowers pooling to its own kernel and reads the pool's input through the chain's ops, so under
            torch.compile the chain makes no memory pass of its own.
        graph_index: captured graph the chain lives in.
        attention_backend: for an attention item, the SDPA backend its op runs (``OpInfo.variant``: ``"flash"``,
            ``"efficient"``, ``"cudnn"``, ``"math"``), else ``""``.
        kernel_op_ids: for a chain named for a library kernel's pattern that holds other ops too (a contiguous
            clone, a roll, a cat beside a LayerNorm), the ops the kernel computes
            (:data:`fusion_advisor.analyze.chains.KERNEL_OPS`); the others stay as they run when apply swaps the
            kernel in. Empty when the kernel would compute the whole chain, or the pattern has no kernel.
        kernel_bytes: bytes the kernel moves over :attr:`kernel_op_ids` (their inputs read once, outputs written
            once); 0 when :attr:`kernel_op_ids` is empty.
        out_numel: elements of the largest tensor the chain's ops write (a GEMM's output tiles come from it; the
            largest tensor of an nn.Linear, :attr:`numel`, is often its weight); 0 in reports written before it.
        output_fuses: for a heavy item, every op that reads its output is one Inductor writes a kernel for (a
            pointwise, reduction, normalization or softmax op, or a pool it lowers) and no graph output is it:
            what Inductor takes out of the library call (a convolution's bias) joins that kernel.
    """

    id: str
    kind: str
    op_ids: tuple[str, ...]
    targets: tuple[str, ...]
    pattern: str
    categories: tuple[str, ...]
    dtype: str
    eager_kernels: int
    eager_bytes: int
    fused_bytes: int
    flops: int
    numel: int
    row_elems: int
    source: SourceLoc
    module_path: str
    epilogue_of: str = ""
    graph_index: int = 0
    prologue_of: str = ""
    attention_backend: str = ""
    kernel_op_ids: tuple[str, ...] = ()
    kernel_bytes: int = 0
    out_numel: int = 0
    output_fuses: bool = False

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of the fused chain (``flops / fused_bytes``), 0 when it moves no bytes."""
        return self.flops / self.fused_bytes if self.fused_bytes else 0.0

    @property
    def bytes_saved(self) -> int:
        """Bytes that fusing saves (``eager_bytes - fused_bytes``, never negative)."""
        return max(self.eager_bytes - self.fused_bytes, 0)


@dataclass(frozen=True)
class Estimate:
    """Roofline estimate of one chain on a device spec. Times in microseconds (us).

    Attributes:
        compute_us: FLOPs over the peak FLOP/s that serves the chain (tensor cores for matmuls, else vector units).
        memory_eager_us: eager bytes over peak memory bandwidth.
        memory_fused_us: fused bytes over peak memory bandwidth.
        launch_eager_us: host time issuing the chain's eager kernels (``roofline.op_host_us`` summed: each op's
            class launch cost per kernel at the spec's in-model host scale, a convolution's device activities).
        eager_us: estimated eager time: per op ``max(compute, memory, launch)`` summed.
        fused_us: estimated time as one fused kernel: ``max(compute, memory_fused, launch)``.
        saving_us: ``eager_us - fused_us`` (0 for heavy and single-kernel items).
        ridge_point: FLOP/byte where the device's compute and memory ceilings meet, for the chain's dtype/unit.
        bound: ``"compute"``, ``"memory"`` or ``"launch"``.
        peak_tflops: the compute ceiling used (TFLOP/s).
        compile_us, triton_us: the fused kernel at the share of the roofline Inductor's code, or the library
            kernel, reaches on this kind of chain (the spec's measured ``route_efficiency``; 1.0 where unmeasured,
            i.e. ``fused_us``); a chain with nothing to fuse keeps ``eager_us``.
        cudagraphs_us: replayed from a CUDA graph with Inductor's code inside: ``compile_us`` without the launch
            floor (a single-kernel item: its device time without the launch gap).
    """

    compute_us: float
    memory_eager_us: float
    memory_fused_us: float
    launch_eager_us: float
    eager_us: float
    fused_us: float
    saving_us: float
    ridge_point: float
    bound: str
    peak_tflops: float
    compile_us: float | None = None
    triton_us: float | None = None
    cudagraphs_us: float | None = None

    def route_us(self, route: str) -> float:
        """The predicted time of the chain on ``route`` (``skip``: its eager time; a route without its own
        estimate: ``fused_us`` where it fuses, else ``eager_us``)."""
        value = {"torch.compile": self.compile_us, "triton": self.triton_us,
                 "cudagraphs": self.cudagraphs_us}.get(route, self.eager_us)
        if value is None or value != value:
            return self.fused_us if route in ("torch.compile", "triton") else self.eager_us
        return value


#: Where a chain can go (the rules' ``route`` field): leave it to eager / vendor libraries, compile it with
#: Inductor, swap in a library Triton kernel, or replay it from a CUDA graph (launch-bound work).
ROUTES = ("skip", "torch.compile", "triton", "cudagraphs")

#: How the capture's warning begins when its graphs hold under half of the forward's aten calls
#: (:func:`fusion_advisor.analyze.capture.coverage_note`); the report's first screen repeats that warning.
PARTIAL_COVERAGE = "the analysis covers only part of the model"

#: How a CPU profile's note ends when its ops took far longer than the plain model (the profiler's cost, a busy
#: CPU): ``calibrate --from-profile`` leaves such reports out (:mod:`fusion_advisor.devices.fit_profiles`).
NOT_THE_MODELS_TIMES = "these per-op times are not the model's"

#: Bound classes of the roofline.
BOUNDS = ("compute", "memory", "launch")


@dataclass(frozen=True)
class Decision:
    """Where one chain goes and why.

    Attributes:
        chain_id: the chain decided.
        route: one of :data:`ROUTES`.
        kernel: library kernel name for ``"triton"`` routes, else ``""``.
        rule_id: id of the rule that decided (first match wins).
        rules_file: file the rule came from.
        reason: the rule's reason template rendered with the chain's numbers.
        bound: bound class after the rule (rules may override the roofline's class).
        note: extra remark, e.g. a fallback because the named kernel is not in the library.
        fixed: the route stays as its rule decided, whatever the model's call weighs
            (:func:`fusion_advisor.analyze.model_call.weigh_model_call`) and however apply groups its regions
            (:func:`fusion_advisor.apply.search`): a rule of the user's own decided it
            (:meth:`fusion_advisor.analyze.rules.RuleSet.users_own`), or a rule on a profile's measured bound class.
    """

    chain_id: str
    route: str
    kernel: str
    rule_id: str
    rules_file: str
    reason: str
    bound: str
    note: str = ""
    fixed: bool = False


@dataclass(frozen=True)
class InductorCode:
    """The code Inductor generates for one routed chain (``analyze --inductor-code``; fusion_advisor.analyze.inductor_code).

    Attributes:
        chain_id, route, pattern: the chain and where it was routed.
        status: ``"generated"``, ``"not generated"`` (over the cap, the budget, or too large for a static
            analysis) or ``"failed"``.
        reason: why there is no code, else ``""``.
        path: the code's file relative to the report folder (``inductor/<chain_id>.py``), ``""`` without code.
        language: ``"triton"`` (GPU), ``"c++"`` (CPU) or ``"python"``.
        device: where it was compiled (``"cuda"``, ``"cpu"``).
        note: how to read it (CPU code, chain compiled in isolation, ...).
        compile_s: wall time of compiling and running the chain once, seconds.
        library_kernel: the library kernel that replaces the chain's pattern, ``""`` when none.
        library_source: that kernel module's source file, ``""`` when none.
        code, library_code: the texts (in the HTML and the files, left out of report.json).
    """

    chain_id: str
    route: str
    pattern: str
    status: str
    reason: str = ""
    path: str = ""
    language: str = ""
    device: str = ""
    note: str = ""
    compile_s: float = 0.0
    library_kernel: str = ""
    library_source: str = ""
    code: str = field(default="", repr=False)
    library_code: str = field(default="", repr=False)


@dataclass(frozen=True)
class NodeMeasurement:
    """Measured time of one op-graph node (one aten op), per model run, from a profiled run.

    Attributes:
        op_id: the op's id (``"g<graph>:<node name>"``).
        time_us: ``busy_us + idle_us``: the time the op held the device, per run (us).
        busy_us: on a GPU, summed durations of the device kernels (and memcpy/memset) the op launched; on a CPU,
            the profiled duration of its top-level aten op less that of an op doing no work (the probe's median:
            the profiler's own cost plus dispatch) (us, per run).
        idle_us: on a GPU, device idle time waiting for this op to be issued (the profiled kernels replayed on a
            plain run's host timeline, or the device gap before each kernel, capped by the host time issuing the
            op); on a CPU, the plain (unprofiled) host cost of one eager op, measured by the probe (us, per run).
        kernels: device kernels (GPU) or top-level aten CPU ops (CPU) the op ran, per run.
        kernel_names: GPU: the distinct device kernels it ran, longest total time first (names as the profiler
            gives them); empty on a CPU.
        host_us: GPU, dynamo captures: host time issuing the op in the plain stamped runs (since the previous op
            that launched kernels, views between included), scaled as its idle time is (us, per run); 0 where not
            measured.
    """

    op_id: str
    time_us: float
    busy_us: float
    idle_us: float
    kernels: float
    kernel_names: tuple[str, ...] = ()
    host_us: float = 0.0


@dataclass(frozen=True)
class ChainMeasurement:
    """Measured time of one chain (or heavy item), run unfused (eagerly, op by op), next to its prediction.

    Attributes:
        chain_id: the chain measured.
        time_us: sum of its ops' :attr:`NodeMeasurement.time_us`, per run (us).
        busy_us: sum of its ops' busy time (us).
        idle_us: sum of its ops' idle time (us).
        kernels: kernels (GPU) or aten ops (CPU) it ran, per run.
        achieved_gbps: the chain's eager bytes over ``time_us`` (GB/s, 1e9 bytes/s).
        achieved_tflops: the chain's FLOPs over ``time_us`` (TFLOP/s).
        pct_of_roofline: the roofline's pure device time (per op ``max(flops/peak, bytes/bandwidth)`` summed, no
            launch term) over ``time_us``, in percent: 100 means the chain ran at the roofline bound.
        bound: measured bound class: ``"launch"`` when ``idle_us > busy_us``, else ``"compute"`` or ``"memory"``
            by which ceiling the chain's busy time comes closer to (FLOP/s over peak vs bytes/s over bandwidth);
            ``""`` when nothing was measured.
        predicted_us: the prediction it is compared with: the chain's eager time inside the model (device plus the
            host's idle time, :func:`fusion_advisor.analyze.roofline.in_model_times`) at the profiled host's measured
            speed, per run (times its graph's calls), since the profiled model runs unfused.
        ratio: ``predicted_us / time_us`` (NaN when nothing was measured).
        flagged: prediction and measurement differ by more than 2x (ratio above 2 or below 0.5).
        kernel_names: GPU: the distinct device kernels its ops ran, longest total time first; empty on a CPU.
        host_us: GPU: sum of its ops' :attr:`NodeMeasurement.host_us`, the host time issuing them (us, per run);
            0 where not measured.
    """

    chain_id: str
    time_us: float
    busy_us: float
    idle_us: float
    kernels: float
    achieved_gbps: float
    achieved_tflops: float
    pct_of_roofline: float
    bound: str
    predicted_us: float
    ratio: float
    flagged: bool
    kernel_names: tuple[str, ...] = ()
    host_us: float = 0.0


@dataclass
class Profile:
    """What a profiled run of the model measured (``analyze --profile``).

    Attributes:
        device: ``"cuda"`` or ``"cpu"``.
        device_name: the GPU's or CPU's name.
        runs: profiled runs; every time is per run (the mean over runs).
        warmup_runs: runs made before profiling (compilation of the instrumented graphs, caches, clocks).
        total_us: profiled total per run: on a GPU, every device kernel's duration plus the idle time charged to
            kernels (attributed or not); on a CPU, the wall time of the captured graphs' execution (us).
        attributed_us: the part of ``total_us`` attributed to op-graph nodes (us).
        unattributed_us: ``total_us - attributed_us``: kernels launched outside any tagged node (graph-break code,
            untagged view ops) and, on a CPU, Python glue between nodes (us).
        wall_us: wall time of one instrumented run under the profiler, host side (us).
        eager_wall_us: wall time per run of the plain model without profiler or tags, for comparison: the median of
            three loops of back-to-back runs (us).
        setup: how it was measured, one line.
        compared: which prediction the measured time is compared with (the roofline's eager time).
        trace_file: chrome trace written (``--trace``), or ``""``.
        nodes: measurement per op id.
        chains: measurement per chain id.
        notes: caveats found on the way (graph mismatch, recompiles, kernels not attributed).
        dispatch_us: host time per tiny eager op, plain (the probe; comparable to the spec's launch overhead): the
            median of probes taken before and after the plain wall time and after the stamped replay (us).
        dispatch_samples_us: each of those probes, in the order taken (us): their spread is how far the host's
            speed moved within the process while the model was timed; empty in reports written before it was kept.
        instrumented_dispatch_us: the same op wrapped and tagged as the graphs' ops, under the profiler (us).
        graph_calls: calls per run of each captured graph, keyed by its index as a string (JSON keys): more than
            1 where dynamo reuses a graph (a graph break inside a loop over layers); empty in reports written
            before it was recorded.
    """

    device: str
    device_name: str
    runs: int
    warmup_runs: int
    total_us: float
    attributed_us: float
    unattributed_us: float
    wall_us: float
    eager_wall_us: float
    setup: str
    compared: str
    trace_file: str = ""
    nodes: dict[str, NodeMeasurement] = field(default_factory=dict)
    chains: dict[str, ChainMeasurement] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dispatch_us: float = 0.0
    dispatch_samples_us: list[float] = field(default_factory=list)
    instrumented_dispatch_us: float = 0.0
    graph_calls: dict[str, float] = field(default_factory=dict)

    @property
    def plain_wall_us(self) -> float | None:
        """:attr:`eager_wall_us` where it was measured (a finite time above 0), else None (us)."""
        wall = self.eager_wall_us
        return wall if wall > 0 and math.isfinite(wall) else None

    @property
    def model_eager_us(self) -> float:
        """The model's measured eager time per run (us): its plain wall time where measured, else the profiled
        total (:func:`fusion_advisor.devices.fit_profiles.model_eager_us` says why the total is the fallback only)."""
        wall = self.plain_wall_us
        return wall if wall is not None else self.total_us


@dataclass(frozen=True)
class UnusedWork:
    """Work one eager forward runs whose result nothing the model returns or changes depends on
    (:func:`fusion_advisor.analyze.capture.unused_nodes`): the model as written pays for it (and a CUDA graph
    captured of it, apply's ``torch.cuda.graph`` variant), dynamo's graphs (so ``torch.compile(model)``, its CUDA
    graphs, and apply's dynamo-based variants) do not run it.

    Attributes:
        ops: the kernel-launching ops (aten calls) of that work.
        eager_us: their eager time on the spec, each op alone (:func:`fusion_advisor.analyze.roofline.eager_alone_us`).
        flops, bytes: their FLOPs and the bytes they read and write.
        lines: the user's source lines they come from (``file:line``), costliest first.
    """

    ops: int
    eager_us: float
    flops: int
    bytes: int
    lines: list[str] = field(default_factory=list)


@dataclass
class Analysis:
    """Everything ``analyze`` found, ready for the report.

    Attributes:
        model_name: name of the analysed model.
        model_file: path of the model file, or ``"<builtin:...>"``.
        convention: how the model file was read (``"kernelbench"``, ``"get_model"``, ``"kernel_contract"``, ``"builtin"``).
        device: where shapes were propagated (``"meta"``, ``"cpu"``, ``"cuda"``).
        dtype: dtype override applied, or ``""``.
        device_spec: the device spec, as a dict.
        device_spec_file: the absolute path of the spec YAML given with ``--gpu`` when it was a file of the user's
            (``devices.spec_file``), ``""`` for a shipped spec and in reports written before it was recorded.
        rules_files: rules files used, in order, with their versions.
        capture_method: how graphs were captured (``"dynamo"``, ``"export"``, ``"symbolic_trace"``).
        graph_breaks: graph breaks with their reasons.
        warnings: non-fatal problems met on the way.
        ops: every op.
        chains: every chain / heavy item.
        estimates: estimate per chain id.
        decisions: decision per chain id.
        timings_s: wall time per pipeline stage in seconds.
        versions: library versions.
        inductor_code: Inductor's code per chain id, when asked for (``analyze --inductor-code``), else empty.
        profile: measured times when run with ``--profile``, else ``None``.
        input_bytes: bytes of the model's tensor inputs (the example inputs), which CUDA-graph replay through
            ``torch.compile(mode="reduce-overhead")`` copies into its static input buffers on every call; 0 in
            reports written before it was recorded.
        unused: work the eager forward runs for nothing (:class:`UnusedWork`), ``None`` when there is none, when it
            was not looked for (a model that cannot be built on the meta device, a recurrent layer, a forward the
            tracer could not follow) or in reports written before.
    """

    model_name: str
    model_file: str
    convention: str
    device: str
    dtype: str
    device_spec: dict[str, Any]
    rules_files: list[dict[str, Any]]
    capture_method: str
    graph_breaks: list[GraphBreak]
    warnings: list[str]
    ops: list[OpInfo]
    chains: list[Chain]
    estimates: dict[str, Estimate]
    decisions: dict[str, Decision]
    timings_s: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    inductor_code: dict[str, InductorCode] = field(default_factory=dict)
    profile: Profile | None = None
    input_bytes: int = 0
    unused: UnusedWork | None = None
    device_spec_file: str = ""

    @property
    def unused_us(self) -> float:
        """Eager time (us) of the work no output uses (:attr:`unused`), which only the model as written pays; 0
        when there is none or it was not looked for."""
        return self.unused.eager_us if self.unused is not None else 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Analysis":
        """The analysis of a :meth:`to_dict` document (report.json): every record rebuilt from its fields, keys
        the records do not have ignored (report.json adds ``columns``, ``summary``, ...), ``null`` numbers read
        as NaN (JSON has no NaN) and Inductor code texts empty (they are files).

        Raises:
            ValueError: ``d`` is not such a document (a required field missing or of the wrong type).
        """
        try:
            return _build(cls, d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not an analysis document: {type(e).__name__}: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the whole analysis (Inductor code texts left out: they are files)."""
        d = asdict(self)
        for rec in d["inductor_code"].values():
            rec.pop("code", None)
            rec.pop("library_code", None)
        for c, chain in zip(d["chains"], self.chains):
            c["arithmetic_intensity"] = chain.arithmetic_intensity
            c["bytes_saved"] = chain.bytes_saved
        return d


def _build(tp: Any, value: Any) -> Any:
    """``value`` (parsed JSON) as an instance of the annotation ``tp``: dataclasses field by field, ``tuple[X,
    ...]``, ``list[X]``, ``dict[str, X]``, ``X | None``, and the scalars (``None`` as NaN for floats)."""
    import dataclasses
    import types
    import typing

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{tp.__name__}: expected a mapping, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _build(hints[f.name], value[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise KeyError(f"{tp.__name__}.{f.name}")
        return tp(**kwargs)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        item = args[0] if args else Any
        items = [_build(item, v) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"expected a mapping, got {type(value).__name__}")
        item = args[1] if len(args) == 2 else Any
        return {str(k): _build(item, v) for k, v in value.items()}
    if tp is float:
        return float("nan") if value is None else float(value)
    if tp is int:
        return int(value)
    if tp is bool:
        return bool(value)
    if tp is str:
        return "" if value is None else str(value)
    return value
