"""Whole-model measurement: every variant checked against a float64 reference and timed inside the whole model.

:class:`ModelHarness` holds what every variant of one model is judged by:

- **input sets**: the example inputs, and ``fresh-<seed>`` sets from the file's own ``get_inputs()`` called again
  under another seed (:attr:`~fusion_advisor.analyze.load.LoadedModel.make_inputs`), so masks, labels and index tensors
  keep the structure the user's code gives them;
- **the float64 reference**: a float64 copy of the model run on float64 copies of each input set, once, in float64
  throughout (:class:`~fusion_advisor.verification.kernel.KeepFloat64`: the model's own ``.float()`` casts stay
  float64; as written where that raises);
- **the eager outputs**: the model as written, in its own dtypes, on each input set, once.

A variant passes (:meth:`ModelHarness.check`) when every output (and, with ``backward``, every parameter
gradient of a fixed random projection of the outputs) passes :func:`fusion_advisor.tolerances.judge`: no further
from float64 than eager is, times the policy's factors, plus a floor of the dtype's rounding. Where no float64
copy can run (the model refuses float64, or it does not fit), variants are judged against eager at the dtype's
tolerance and the check says so. Full-precision outputs must also agree with the model as written element by
element within :data:`AGREEMENT_TOLERANCE` (:func:`agrees_with_eager`). The RNG is seeded identically before every
call, so a model that draws random numbers is compared with itself; if the model as written disagrees with its
float64 copy by more than :data:`REFERENCE_SANITY` (norm-wise), the reference is not trusted either and the same
fallback applies.

Timing (:meth:`ModelHarness.time`): one step is a forward under ``torch.no_grad()`` (or forward + backward to the
parameters), timed in rounds: on a GPU each round is a ``triton.testing.do_bench`` median (CUDA events, L2
flushed), on a CPU a wall-clock median (:func:`fusion_advisor.kernel_tools.bench.time_cpu`, labelled as such). The rounds'
spread is the measurement's noise. First-call time (compile, capture) is taken apart; peak memory and GPU kernel
time (torch.profiler) are taken once, after the timed rounds.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Sequence

import torch

from fusion_advisor.apply.records import NOISY_SPREAD, TIMER_CPU, TIMER_GPU, VariantCheck, VariantTiming
from fusion_advisor.errors import ModelRunError
from fusion_advisor.memory import available_bytes, gib, release_cuda_memory, tensor_bytes
from fusion_advisor.units import fmt_some
from fusion_advisor.analyze.capture import first_line
from fusion_advisor.verification.inputs import same_dtype_copy, upcast
from fusion_advisor.verification.kernel import KeepFloat64
from fusion_advisor.verification.policy import JUDGE_CHUNK, as_tensor, compare_outputs, judge, tolerance_for
from fusion_advisor.verification.trees import leaves, tensor_leaves, tree_map

__all__ = ["CALL_SEED", "REFERENCE_SANITY", "ModelHarness", "reference_sanity", "scalarize", "summarize_rounds",
           "tensor_leaves"]

#: Seed set before every model call of a check, so that a model drawing random numbers draws the same ones.
CALL_SEED = 1234

#: The model as written must land within this norm-wise error of its float64 copy for the copy to serve as the
#: reference (a larger gap means the model is ill-conditioned or draws random numbers the copy draws otherwise);
#: a 16-bit tensor within :data:`REFERENCE_SANITY_ULPS` of its dtype's eps (:func:`reference_sanity`).
REFERENCE_SANITY = 0.05

#: The sanity bound of a low-precision tensor, in units of its dtype's eps: 16 bf16 eps is 0.125. A bf16 training
#: step's own rounding exceeds 0.05 on some gradients (H200, the Llama-3-8B-width step of issue 16: layer 3's
#: q_proj weight gradient 0.0551 norm-wise from float64, which once sent every variant to the fallback against the
#: model as written), while a model that draws random numbers (dropout) lands ~0.3 or more from its copy.
REFERENCE_SANITY_ULPS = 16

#: Element-wise agreement a full-precision output (fp32, fp64) must also keep with the model as written: ``|x - e|
#: <= atol + rtol |e|``, KernelBench's check of a candidate model (atol = rtol = 1e-2). The float64 policy judges
#: accuracy; this bounds how far an output may move from what the user's own model returns. The two differ on
#: ill-conditioned outputs, where eager itself is far from float64 element by element and any reordering lands
#: elsewhere (KernelBench's Mamba2 files: exp of cumulative sums; torch.compile passes the norm-wise policy there and
#: fails this). Half-precision outputs are left to the float64 policy: an element of a fused bf16 computation may
#: move a few of bf16's 2**-8 ulps from eager's without being any less accurate.
AGREEMENT_TOLERANCE = (1e-2, 1e-2)

#: The share of the device's free memory that apply's own copies may take: a fresh input set, the float64 copy of
#: the model and its inputs. What does not fit is left out with a note (the checks run on the example inputs; the
#: variants are judged against the model as written), so a model with large inputs is not killed mid-run by the
#: OOM killer, which prints nothing (a new user's KernelBench level-1 file with 6.4 GiB of fp32 inputs).
MEMORY_SHARE = 0.5

#: A step this long (ms) or longer is timed one call per round: its own length dwarfs the timer's and the
#: scheduler's noise (microseconds to milliseconds), while the usual rounds (a do_bench-style round of at least
#: :data:`MIN_TIMED_CALLS` calls, after an untimed one) cost minutes. A new user's
#: 13_DenseNet121TransitionLayer takes 8-14 s per call on a 2-core CPU: eager alone took about 150 s of timing.
LONG_CALL_MS = 1000.0

#: Default per-round do_bench budget (ms of warm-up, ms of timed calls).
ROUND_WARMUP_MS = 10.0
ROUND_REP_MS = 60.0

#: Timed calls per round at least: do_bench times ``rep / estimate`` calls, one for a model slower than the budget,
#: and the median of one call is noise (on the H200 a 50 ms GRU's single-call rounds spread 30%:
#: benchmarks/results/h200/apply_models/README.md). A round's budget grows to this many calls of the untimed
#: round's median.
MIN_TIMED_CALLS = 5


def scalarize(out: Any, cache: dict[Any, torch.Tensor]) -> torch.Tensor:
    """A scalar to differentiate: a fixed random projection of every float output that requires grad.

    Raises:
        RuntimeError: no output requires grad, with what the outputs are.
    """
    total = None
    ts = tensor_leaves(out)
    for i, t in enumerate(ts):
        if t.is_floating_point() and t.requires_grad:
            key = (i, tuple(t.shape), str(t.device))
            w = cache.get(key)
            if w is None:
                gen = torch.Generator().manual_seed(777 + i)
                w = cache[key] = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.device)
            term = (t.float() * w).sum()
            total = term if total is None else total + term
    if total is None:
        what = (f"{len(ts)} tensor(s), none requiring grad" if ts else
                f"no tensors found in a {type(out).__name__}")
        raise RuntimeError(f"nothing to differentiate: the model's output holds {what} (with --backward the "
                           f"parameters must require grad and the output must depend on them)")
    return total


@dataclasses.dataclass
class _Run:
    """One call's results: ``(label, tensor)`` for every output and (with backward) every parameter gradient."""

    tensors: list[tuple[str, torch.Tensor]]
    mutated_inputs: tuple[int, ...] = ()  # positions of tensor inputs the call changed in place
    structure: tuple[str, ...] = ()  # the output's tensors and numbers by label (output[0], output['logits'])


#: Minor page faults per step of a CPU variant from which apply says its CPU timings depend on the process: 4,096
#: faults map 16 MiB (4 KiB pages) afresh every call. A new user's three pointwise ops on 64 MiB tensors took 49,155
#: faults per call in a plain loop (150 ms) and about 17,500 inside apply's timing (55 ms), so eager and
#: torch.compile ranked one way in apply (18.6 vs 41.6 ms) and the other in a fresh process (136 vs 45): glibc
#: returns large freed blocks to the OS, and whether the next call maps them again depends on the allocator's state.
PAGE_FAULTS_PER_STEP = 4096

PAGE_FAULT_NOTE_START = "on this CPU the model's steps page-fault"


def _minor_faults() -> int | None:
    """The process's minor page faults so far (``getrusage``), or None where the platform does not count them."""
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def page_fault_note(faults: int, wall_ms: float, step_ms: float) -> str:
    """A note where a CPU variant's timed rounds page-faulted :data:`PAGE_FAULTS_PER_STEP` times or more per step
    (``faults`` over ``wall_ms`` of rounds whose steps took ``step_ms``), else ``""``."""
    if wall_ms <= 0 or step_ms <= 0:
        return ""
    per_step = faults / wall_ms * step_ms
    if per_step < PAGE_FAULTS_PER_STEP:
        return ""
    return (f"{PAGE_FAULT_NOTE_START} (about {per_step:,.0f} minor faults per step: its large tensors' memory is "
            f"returned to the OS and mapped again on every call): a step's time then depends on the process's "
            f"allocator state, and these CPU times and ratios may not hold in another process (on a model of three "
            f"pointwise ops over 64 MiB tensors eager read 18.6 ms here and 136 ms in a fresh one); time on a GPU, "
            f"whose caching allocator keeps its memory")


class ModelHarness:
    """The model, its input sets, its eager outputs and float64 reference: shared by every variant's check and
    timing (see the module docstring).

    Args:
        loaded: the :class:`~fusion_advisor.analyze.load.LoadedModel`.
        backward: check parameter gradients and time forward + backward.
        fresh_sets: fresh input sets besides the example inputs.
        tf32: fp32 products may run in TF32 under PyTorch's present settings (the model has convolutions and
            ``torch.backends.cudnn.allow_tf32`` is on, the default, or matmuls and
            ``torch.backends.cuda.matmul.allow_tf32``): fp32 outputs get the TF32 floor
            (:func:`fusion_advisor.tolerances.error_floor`), since the model as written may take a TF32 kernel
            on another run or GPU and torch.compile's choices do.
    """

    def __init__(self, loaded: Any, backward: bool, fresh_sets: int = 1, tf32: bool = False):
        self.loaded = loaded
        self.tf32 = tf32
        self.model: torch.nn.Module = loaded.module
        self.backward = backward
        self.device = loaded.device
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad] if backward else []
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        floats = [p.dtype for p in self.model.parameters() if p.is_floating_point()]
        #: the coarsest floating dtype of the parameters (None without any): the precision the model computes in
        self.compute_dtype = max(floats, key=lambda d: torch.finfo(d).eps) if floats else None
        self.sets: list[tuple[str, list[Any]]] = [("example", list(loaded.inputs))]
        self.memory_notes: list[str] = []
        self.input_bytes = tensor_bytes(loaded.inputs)
        self.model_bytes = tensor_bytes([*self.model.parameters(), *self.model.buffers()])
        if self.device == "cuda":
            # what the earlier stages left (the swap checks' float64 copies) freed before free memory is counted:
            # KernelBench's 6 GiB softmax found 0.6 GiB free of an 80 GB card after its swap check
            release_cuda_memory()
        free = available_bytes(self.device)  # the model and its example inputs already hold theirs
        # the copy of the inputs each call gets must fit beside them, or the first eager call is killed
        if self.input_bytes > 0.9 * free:
            raise ModelRunError(
                f"{loaded.file}: the model's inputs take {gib(self.input_bytes)} (beside {gib(self.model_bytes)} of "
                f"weights), and every call gets a copy of them (so that a model changing an input in place cannot "
                f"change the next call's), but only {gib(free)} is free on {self.device}: make get_inputs() "
                f"smaller, or apply on a machine with more memory")
        for s in range(fresh_sets):
            if self.input_bytes * (s + 2) > MEMORY_SHARE * free:  # the new set(s) and the per-call copy
                self.memory_notes.append(
                    f"no fresh input set: the inputs take {gib(self.input_bytes)}, and another set would pass "
                    f"{MEMORY_SHARE:.0%} of the {gib(free)} free on {self.device}; variants are checked on the "
                    f"example inputs only")
                break
            fresh = self._fresh(s)
            if fresh is not None:
                self.sets.append((f"fresh-{s}", fresh))
        self._eager: dict[str, _Run] | None = None
        #: the model's buffers its forward changed in place (names), found on its first eager calls
        self.mutated_buffers: list[str] = []
        self._reference: dict[str, _Run] | None = None
        self.reference_note = ""
        self._cache: dict[Any, torch.Tensor] = {}

    def _fresh(self, seed: int) -> list[Any] | None:
        make = getattr(self.loaded, "make_inputs", None)
        if make is None:
            return None
        try:
            return list(make(2000 + seed))
        except Exception:  # a get_inputs() that cannot run twice: the example inputs alone are checked
            return None

    # --- running ----------------------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], xs: Sequence[Any], params: Sequence[torch.Tensor] | None = None,
            names: Sequence[str] | None = None) -> _Run:
        """``fn(*xs)`` (seeded RNG), its outputs detached and cloned, and with backward the gradients of
        :func:`scalarize` with respect to ``params`` (default the model's)."""
        params = self.params if params is None else params
        names = self.param_names if names is None else names
        # every call gets its own copy of the inputs: a model that changes an input in place (x.mul_(2)) must not
        # hand the next variant different inputs (a new user's model made the model as written look "wrong")
        ins = _own_copy(xs)
        torch.manual_seed(CALL_SEED)
        with torch.set_grad_enabled(self.backward):
            out = fn(*ins)
        # every tensor and Python number of the output, by label: a variant returning another number (loss.item(),
        # a count) fails as a tensor would, and one returning the same values under other labels fails too
        results = [(label, t) for label, x in leaves(out, "output") if (t := as_tensor(x)) is not None]
        tensors = [(f"output {i}", t.detach().clone()) for i, (_, t) in enumerate(results)]
        structure = tuple(label for label, _ in results)
        if self.backward:
            grads = torch.autograd.grad(scalarize(out, self._cache), list(params), allow_unused=True)
            tensors += [(f"grad {n}", g.detach().clone()) for n, g in zip(names, grads) if g is not None]
        mutated = tuple(i for i, (a, b) in enumerate(zip(xs, ins)) if _changed(a, b))
        # what the call left in each input it changed is a result too: the caller sees it
        tensors += [(f"input {i} after the call{label}", t.detach().clone())
                    for i in mutated for label, t in leaves(ins[i], "") if isinstance(t, torch.Tensor)]
        return _Run(tensors, mutated, structure)

    def notes(self) -> list[str]:
        """What the model as written does that limits its check: it changes an input or a buffer in place, leaves
        nothing to compare (no tensor or number returned, no input changed), or returns only NaN / inf floats on
        its example inputs (each one line, for the report)."""
        out = list(self.memory_notes)
        example = self.eager().get("example")
        mutated = self.mutated_inputs()
        if mutated:
            out.append(f"the model changes its input(s) {', '.join(str(i) for i in mutated)} in place: every check "
                       f"and timing call gets a fresh copy of the inputs, and a plan runs on whatever it is given")
        if self.mutated_buffers:
            out.append(f"the model changes its buffer(s) {fmt_some(self.mutated_buffers)} when called: where they "
                       f"reach the outputs, each "
                       f"call sees other values and no variant (the model as written included) can match the calls "
                       f"before it; keep the state out of forward (or reset it) for apply to check the variants")
        if example is not None:
            floats = [t for label, t in example.tensors if label.startswith("output") and t.is_floating_point()]
            if not example.tensors:
                out.append("the model returns no tensor or number and changes no input: variants are checked for "
                           "running, not for values")
            elif floats and all(not torch.isfinite(t).any() for t in floats):
                out.append("every output of the model as written is NaN or inf on its example inputs: the check "
                           "cannot tell a right variant from a wrong one")
        return out

    def mutated_inputs(self) -> list[int]:
        """Positions of the inputs the model as written changes in place, on any input set (sorted)."""
        return sorted({i for r in self.eager().values() for i in r.mutated_inputs})

    def eager(self) -> dict[str, _Run]:
        """The model as written on every input set (computed once).

        Raises:
            ModelRunError: the model as written fails there (with backward: its backward, e.g. through a custom op
                without an autograd formula, which capture's forward-only run cannot see).
        """
        if self._eager is None:
            # each buffer and its version counter (an in-place write bumps it; nothing is copied)
            before = {n: (b, b._version) for n, b in self.model.named_buffers()}
            try:
                self._eager = {name: self.run(self.model, xs) for name, xs in self.sets}
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as e:  # the user's model, not ours: one clear message, not an internal error
                step = "forward + backward (--backward)" if self.backward else "forward"
                raise ModelRunError(f"{self.loaded.file}: the model fails its {step} on its own inputs: "
                                    f"{type(e).__name__}: {first_line(str(e), 400)}") from e
            buffers = dict(self.model.named_buffers())
            self.mutated_buffers = [n for n, (b, v) in before.items()
                                    if n in buffers and (buffers[n] is not b or b._version != v)]
        return self._eager

    def reference(self) -> dict[str, _Run] | None:
        """The float64 copy of the model on every input set (computed once), or ``None`` with
        :attr:`reference_note` saying why there is none."""
        if self._reference is not None or self.reference_note:
            return self._reference
        need = self.float64_bytes()
        free = available_bytes(self.device)
        if need > MEMORY_SHARE * free:
            self.reference_note = (f"no float64 copy of the model: it and its inputs and outputs would take about "
                                   f"{gib(need)}, over {MEMORY_SHARE:.0%} of the {gib(free)} free on {self.device}")
            return None
        try:
            model64 = copy.deepcopy(self.model).to(torch.float64)
        except Exception as e:  # a model that cannot be copied or cast
            self.reference_note = f"no float64 copy of the model ({type(e).__name__}: {first_line(str(e), 160)})"
            return None
        named = [(n, p) for n, p in model64.named_parameters() if p.requires_grad] if self.backward else []
        ref: dict[str, _Run] | None = None
        failure, out_of_memory = "", False
        # float64 throughout (the model's own .float() / dtype=torch.float32 casts kept at float64), then, for a
        # model whose casts matter to it (mixed-dtype ops), float64 as written
        for casts in (KeepFloat64, contextlib.nullcontext):
            if failure:  # the first attempt's tensors, held by its handler's frames until now, freed before the second
                release_cuda_memory()
            try:
                with casts():
                    ref = {name: self.run(model64, [tree_map(upcast, x) for x in xs], [p for _, p in named],
                                          [n for n, _ in named]) for name, xs in self.sets}
            except Exception as e:  # an op without float64 support, out of memory, ...
                failure = f"{type(e).__name__}: {first_line(str(e), 160)}"
                out_of_memory = isinstance(e, torch.cuda.OutOfMemoryError)
            if ref is not None or out_of_memory:  # a second float64 run would need as much memory
                break
        del model64, named
        if ref is None:
            release_cuda_memory()
            self.reference_note = f"the float64 copy of the model does not run ({failure})"
            return None
        eager = self.eager()
        for name, run in ref.items():
            for (label, r), (_, e) in zip(run.tensors, eager[name].tensors):
                if not e.is_floating_point():
                    continue
                j = judge(e, r, None, label)
                bound = reference_sanity(e.dtype)
                if j.norm_err > bound:
                    self.reference_note = (f"the model as written is {j.norm_err:.3g} norm-wise from its float64 "
                                           f"copy on {name} {label} (over {bound:g}: ill-conditioned, or it draws "
                                           f"random numbers): the float64 copy is not used")
                    return None
        self._reference = ref
        return ref

    def float64_bytes(self) -> int:
        """Bytes the float64 reference holds at its peak, roughly: the model's weights, one input set upcast and
        the copy its call gets, and the outputs (and gradients) of every set, all in float64. Activations are not
        counted: the share :data:`MEMORY_SHARE` leaves them the rest."""
        weights = tensor_bytes([*self.model.parameters(), *self.model.buffers()], itemsize=8)
        inputs = max((tensor_bytes(xs, itemsize=8) for _, xs in self.sets), default=0)
        outputs = sum(tensor_bytes([t for _, t in run.tensors], itemsize=8) for run in self.eager().values())
        return weights + 2 * inputs + outputs

    # --- checking ---------------------------------------------------------------------------------------------

    def check(self, fn: Callable[..., Any]) -> VariantCheck:
        """Judge ``fn`` (a variant of the model) on every input set; never raises for the variant's own failure."""
        eager = self.eager()
        ref = self.reference()
        what = "float64 copy of the model" + ("; fp32 products may run in TF32 (PyTorch's settings): TF32 floor"
                                               if self.tf32 else "")
        out = VariantCheck(passed=True, reference=what if ref is not None else
                           f"the model as written at the dtype tolerance: {self.reference_note}")
        worst_ratio = -1.0
        for name, xs in self.sets:
            out.input_sets.append(name)
            got, out_of_memory = None, False
            try:
                got = self.run(fn, xs)
            except Exception as e:  # the variant raised: it fails, with the reason
                out.passed = False
                out.details.append(f"{name}: raised {type(e).__name__}: {first_line(str(e))}")
                out_of_memory = isinstance(e, torch.cuda.OutOfMemoryError)
            if got is None:
                if out_of_memory:  # out of the handler, whose exception held the variant's frames
                    release_cuda_memory()
                return out
            e_run = eager[name]
            if got.mutated_inputs != e_run.mutated_inputs:
                out.passed = False
                out.details.append(f"{name}: changes input(s) {list(got.mutated_inputs)} in place where the model as "
                                   f"written changes {list(e_run.mutated_inputs)}")
                return out
            if got.structure != e_run.structure:
                out.passed = False
                out.details.append(f"{name}: returns {fmt_some(list(got.structure), 4)} where the model as written "
                                   f"returns {fmt_some(list(e_run.structure), 4)}")
                return out
            if len(got.tensors) != len(e_run.tensors):
                out.passed = False
                out.details.append(f"{name}: {len(got.tensors)} tensors where the model as written gives "
                                   f"{len(e_run.tensors)}")
                return out
            for i, ((label, g), (_, e)) in enumerate(zip(got.tensors, e_run.tensors)):
                is_output, label = label.startswith("output"), f"{name} {label}"
                if g.dtype != e.dtype:
                    ok, line = False, f"{label}: {g.dtype} where the model as written returns {e.dtype}"
                elif not (g.is_floating_point() or g.is_complex()):
                    # integers and bools (argmax, a mask, a count): the model as written's, element by element,
                    # or the float64 copy's where they differ (a near-tie a more accurate variant rounds the other
                    # way); float64 alone failed the model as written on the comparisons fp32 rounds
                    ok, line = _exact_result(g, e, ref[name].tensors[i][1] if ref is not None else None, label)
                    if not out.worst or not ok:
                        out.worst = line
                elif ref is not None:
                    j = judge(g, ref[name].tensors[i][1], e, label, tf32=self.tf32)
                    ok, line = j.ok, j.reason
                    ratio = j.norm_err / j.limit_norm if j.limit_norm > 0 else (0.0 if j.norm_err == 0 else 1e9)
                    ratio = max(ratio, j.max_err / j.limit_max if j.limit_max > 0 else ratio)
                    if ratio > worst_ratio:
                        worst_ratio, out.worst = ratio, line
                        out.norm_err, out.eager_norm_err = j.norm_err, j.eager_norm_err
                else:
                    ok, line = _close_to_eager(g, e, label, self.compute_dtype)
                    if not out.worst or not ok:
                        out.worst = line
                if ok and ref is not None and is_output:
                    ok, agreement = agrees_with_eager(g, e, label)
                    if ok:
                        ok, agreement = no_gross_elements(g, ref[name].tensors[i][1], e, label)
                    line = line if ok else agreement
                if not ok:
                    out.passed = False
                    out.details.append(line)
        if out.passed:
            out.details.append(f"{sum(len(r.tensors) for r in eager.values())} tensors on "
                               f"{', '.join(out.input_sets)}: every one passed; worst: {out.worst}")
        return out

    # --- timing -----------------------------------------------------------------------------------------------

    def step(self, fn: Callable[..., Any], xs: Sequence[Any] | None = None) -> Callable[[], Any]:
        """One timed step of ``fn`` on the example inputs: forward under no_grad, or forward + backward. A model
        that changes an input in place gets a fresh copy of the inputs every step (the copy timed with it, the same
        for every variant): on one copy the writes would pile up over the timed calls (``x.mul_(2)`` reaching inf),
        and the sets the checks run on stay as drawn."""
        src = list(self.loaded.inputs) if xs is None else list(xs)
        args: Callable[[], list[Any]] = (lambda: _own_copy(src)) if self.mutated_inputs() else (lambda: src)
        if not self.backward:
            def fwd() -> Any:
                with torch.no_grad():
                    return fn(*args())
            return fwd
        params = list(self.params)

        def fwd_bwd() -> Any:
            return torch.autograd.grad(scalarize(fn(*args()), self._cache), params, allow_unused=True)
        return fwd_bwd

    @property
    def timer(self) -> str:
        return TIMER_GPU if self.device == "cuda" else TIMER_CPU

    def first_call(self, fn: Callable[..., Any]) -> float:
        """Seconds of ``fn``'s first step (compilation and capture included)."""
        return self.one_call_ms(fn) / 1e3

    def time_round(self, fn: Callable[..., Any], warmup_ms: float = ROUND_WARMUP_MS,
                   rep_ms: float = ROUND_REP_MS) -> float:
        """One timing round of ``fn``'s step: its median, ms."""
        from fusion_advisor.kernel_tools.bench import time_cpu, time_cuda

        step = self.step(fn)
        if self.device == "cuda":
            return time_cuda(step, warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms
        return time_cpu(step, warmup_ms=warmup_ms, rep_ms=rep_ms).median_ms

    def one_call_ms(self, fn: Callable[..., Any]) -> float:
        """Wall time of one step of ``fn`` (ms), the device synchronised before and after."""
        step = self.step(fn)
        _sync(self.device)
        start = time.perf_counter()
        step()
        _sync(self.device)
        return (time.perf_counter() - start) * 1e3

    def round_timer(self, fn: Callable[..., Any]) -> Callable[[], float]:
        """After one untimed call and (for a step under :data:`LONG_CALL_MS`) one untimed round of ``fn``, a
        function timing one more round, ms: :meth:`time_round` over at least :data:`MIN_TIMED_CALLS` calls of the
        untimed round's median, or one call (:meth:`one_call_ms`) of a long step. :meth:`time` and the search's
        confirmation time their rounds with it: the confirmation once timed each round of a 57 ms Llama step as one
        call (do_bench's 60 ms budget) and read 60.4 ms, spread 13.7%, for a variant its search and a standalone run
        had measured at 56.8 and 57.2 ms."""
        if self.one_call_ms(fn) >= LONG_CALL_MS:
            return lambda: self.one_call_ms(fn)
        rep_ms = max(ROUND_REP_MS, MIN_TIMED_CALLS * self.time_round(fn))
        return lambda: self.time_round(fn, rep_ms=rep_ms)

    def time(self, fn: Callable[..., Any], rounds: int, timing: VariantTiming | None = None) -> VariantTiming:
        """One untimed round, then ``rounds`` timing rounds of ``fn`` (after its first call; each at least
        :data:`MIN_TIMED_CALLS` calls of the untimed round's median), then peak memory and GPU kernel time. A step
        of :data:`LONG_CALL_MS` or more is timed one call per round instead (its wall time, the device
        synchronised), after one untimed call. The
        untimed round absorbs what a first round after the first call still pays (lazy initialisation, a recompile
        for the timing loop's grad mode): on a CPU a new user saw rounds of [43.96, 0.273, 0.273] ms, a spread of
        15972% that rejected every region change after it. Rounds that spread over :data:`NOISY_SPREAD` are timed
        once more (:func:`should_time_again`, :func:`quieter_sets`): the quieter set is kept (the faster where the
        two sets' medians disagree beyond the noise), the other goes to ``discarded_rounds_ms``, and the spread
        given is the larger of the kept set's and the two sets' medians' disagreement."""
        from fusion_advisor.kernel_tools.recompile import RecompileWatch

        timing = timing or VariantTiming(timer=self.timer)
        timing.timer = self.timer
        try:
            one_round = self.round_timer(fn)
            faults, start = _minor_faults(), time.perf_counter()
            with RecompileWatch() as watch:
                for _ in range(rounds):
                    timing.rounds_ms.append(one_round())
                summarize_rounds(timing)
                if should_time_again([timing.rounds_ms]):
                    kept, other, spread = quieter_sets([timing.rounds_ms], [[one_round() for _ in range(rounds)]])
                    timing.rounds_ms, timing.discarded_rounds_ms = kept[0], other[0]
                    summarize_rounds(timing)
                    timing.spread = spread
            timing.steady_state_recompiles = watch.report.to_dict()
            if self.device == "cuda":
                self._memory_and_device_time(fn, timing)
            elif faults is not None and timing.ms:
                note = page_fault_note(_minor_faults() - faults, (time.perf_counter() - start) * 1e3, timing.ms)
                if note and not any(n.startswith(PAGE_FAULT_NOTE_START) for n in self.memory_notes):
                    self.memory_notes.append(note)
        except Exception as e:  # a variant that fails while timed (out of memory, ...) has no number
            timing.ms = None
            timing.error = f"{type(e).__name__}: {first_line(str(e))}"
            out_of_memory = isinstance(e, torch.cuda.OutOfMemoryError)
        else:
            out_of_memory = False
        if out_of_memory:  # out of the handler, whose exception held the timed frames
            release_cuda_memory()
        return timing

    def _memory_and_device_time(self, fn: Callable[..., Any], timing: VariantTiming) -> None:
        from fusion_advisor.kernel_tools.bench import device_time_by_kernel, kernel_class

        step = self.step(fn)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the reserved peak is this variant's, not what earlier ones left cached
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        timing.peak_mb = torch.cuda.max_memory_allocated() / 2**20
        timing.peak_reserved_mb = torch.cuda.max_memory_reserved() / 2**20
        try:
            by_kernel = device_time_by_kernel(step, iters=3)
        except Exception:  # the profiler unavailable: wall time stands alone
            return
        timing.device_ms = sum(by_kernel.values())
        for name, ms in by_kernel.items():
            cls = kernel_class(name)
            timing.device_ms_by_class[cls] = timing.device_ms_by_class.get(cls, 0.0) + ms


def _own_copy(xs: Sequence[Any]) -> list[Any]:
    """``xs`` with every tensor cloned, inside lists, tuples, mappings and dataclasses too (``requires_grad``
    kept; :func:`~fusion_advisor.verification.trees.tree_map`): inputs a call may change in place."""
    return [tree_map(same_dtype_copy, x) for x in xs]


def _changed(before: Any, after: Any) -> bool:
    """Whether a call changed an input in place, or a tensor inside it (NaN equal to NaN)."""
    was, now = leaves(before, ""), leaves(after, "")
    if len(was) != len(now):  # a list input the call appended to
        return True
    for (_, a), (_, b) in zip(was, now, strict=True):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        a, b = a.detach(), b.detach()
        if a.shape != b.shape or a.dtype != b.dtype:
            return True
        if a.is_floating_point() or a.is_complex():
            if not torch.allclose(a, b, rtol=0, atol=0, equal_nan=True):
                return True
        elif not torch.equal(a, b):
            return True
    return False


def _exact_result(g: torch.Tensor, e: torch.Tensor, r: torch.Tensor | None, label: str) -> tuple[bool, str]:
    """An integer or bool result ``g`` against the model as written's ``e`` and the float64 copy's ``r``: each
    element equal to one of them (``r`` ``None``: to ``e``). The line says how many are equal to neither."""
    if g.shape != e.shape:
        return False, f"{label}: shape {list(g.shape)} where the model as written gives {list(e.shape)}"
    off = g != e
    if r is not None and r.shape == g.shape:
        off &= g != r.to(device=g.device, dtype=g.dtype)
    n = int(off.sum())
    if n:
        at = tuple(int(i) for i in off.nonzero()[0])
        return False, (f"{label}: {n} of {g.numel()} elements equal neither the model as written's nor the float64 "
                       f"copy's ({g.dtype}: exact; first at index {at}: {g[at].item()} where the model as written "
                       f"gives {e[at].item()})")
    also = " or the float64 copy's" if r is not None else ""
    return True, f"{label}: equal to the model as written's{also} ({g.dtype})"


def summarize_rounds(timing: VariantTiming) -> None:
    """``timing.ms`` (median of the rounds) and ``timing.spread`` (:func:`rounds_spread`) from ``rounds_ms``."""
    if not timing.rounds_ms:
        return
    timing.ms = float(statistics.median(timing.rounds_ms))
    timing.spread = rounds_spread(timing.rounds_ms)


def rounds_spread(rounds_ms: list[float]) -> float:
    """``(max - min) / median`` of round times (0.0 for none or a median of 0)."""
    if not rounds_ms:
        return 0.0
    median = statistics.median(rounds_ms)
    return (max(rounds_ms) - min(rounds_ms)) / median if median > 0 else 0.0


#: Rounds are timed a second time only for steps under this (ms): a round is :data:`MIN_TIMED_CALLS` calls or
#: :data:`ROUND_REP_MS` at least, so a second set of a 100 ms step's rounds costs about 1.5 s more per variant, a
#: 900 ms step's 13 s, which neither ``--budget-s``'s estimate nor the time limit foresees.
RETIME_BELOW_MS = 100.0


def should_time_again(sets: list[list[float]]) -> bool:
    """Whether rounds timed together (one set per variant, interleaved where several) are timed once more: some
    set of two or more rounds spreads over :data:`NOISY_SPREAD` and every step is under :data:`RETIME_BELOW_MS`
    (and under :data:`LONG_CALL_MS`: a step timed one call per round is never timed again, whatever the two are
    set to)."""
    below = min(RETIME_BELOW_MS, LONG_CALL_MS)
    noisy = any(len(r) > 1 and rounds_spread(r) > NOISY_SPREAD for r in sets)
    return noisy and all(r and statistics.median(r) < below for r in sets)


def quieter_sets(first: list[list[float]], again: list[list[float]]
                 ) -> tuple[list[list[float]], list[list[float]], float]:
    """Of two timings of the same variants (one list of round times per variant in each), the one to keep, the
    other, and the spread to report: the larger of the kept timing's worst spread and the worst disagreement between
    a variant's two medians (``(high - low) / low``).

    Kept: where the medians agree within :data:`NOISY_SPREAD`, the quieter set (by its noisiest variant's spread: a
    stall in one round leaves the medians together and the second set quiet); where they do not, the faster set (the
    lower geometric mean of its medians): other work only ever slows a round down, and a new user's eager rounds
    [0.0195, 0.0192, 7.66] then [7.638, 7.629, 7.661] ms on a 2-core machine shared with other jobs kept the quiet
    second set, and apply planned torch.compile at "194x" eager, twice eager's time when timed again. Either way
    the disagreement keeps the figure noisy (rounds [195, 83.6, 159] then [242, 189, 216] ms: medians 159 and 216,
    36%, where the kept set alone read 24.6%)."""
    def worst(sets: list[list[float]]) -> float:
        return max(rounds_spread(r) for r in sets)

    def log_medians(sets: list[list[float]]) -> float:
        return sum(math.log(max(statistics.median(r), 1e-12)) for r in sets)

    disagreement = 0.0
    for a, b in zip(first, again, strict=True):
        lo, hi = sorted((statistics.median(a), statistics.median(b)))
        disagreement = max(disagreement, (hi - lo) / lo if lo > 0 else 0.0)
    if disagreement > NOISY_SPREAD:
        second = log_medians(again) < log_medians(first)
    else:
        second = worst(again) < worst(first)
    kept, other = (again, first) if second else (first, again)
    return kept, other, max(worst(kept), disagreement)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def agrees_with_eager(g: torch.Tensor, e: torch.Tensor, label: str) -> tuple[bool, str]:
    """Whether a full-precision output ``g`` stays within :data:`AGREEMENT_TOLERANCE` of the model as written's
    ``e`` element by element (NaN where it is NaN); ``(True, "")`` for other dtypes. The line names how many
    elements do not and, from :func:`~fusion_advisor.verification.policy.compare_outputs`, the worst one."""
    if not (g.is_floating_point() and g.dtype in (torch.float32, torch.float64)) or g.shape != e.shape:
        return True, ""
    atol, rtol = AGREEMENT_TOLERANCE
    n_off = int((~torch.isclose(g, e, atol=atol, rtol=rtol, equal_nan=True)).sum())  # the outputs' dtype: no copies
    if not n_off:
        return True, ""
    worst = compare_outputs(g, e, atol=atol, rtol=rtol, label=label)[3][1:]  # after its MISMATCH line
    return False, (f"{label}: as close to float64 as the model as written, but {n_off} of {g.numel()} elements "
                   f"differ from the model as written by more than atol {atol:g} + rtol {rtol:g} "
                   f"({'; '.join(worst)}; the reference is the model as written): an ill-conditioned output, which "
                   f"this variant computes in another order; not chosen, so the plan returns what the model as "
                   f"written returns")


#: Share of a 16-bit output's elements (at least one) that may be grossly off (:func:`no_gross_elements`) before the
#: variant fails. The norm-wise and max-wise limits see a tensor as a whole: a confident classifier's bf16
#: probabilities with every one but the top of each row zeroed passed them (7,992 of 8,000 elements off, a
#: reviewer's finding), since the small elements weigh nothing in the norm or the max. torch.compile's bf16 outputs
#: of twelve small models on a CPU (softmax, log-softmax, LayerNorm, RMSNorm, a GELU MLP, attention, cumsum,
#: reductions, a residual LayerNorm, SiLU, a Frobenius norm, a convolution + GroupNorm) had none.
GROSS_ELEMENT_SHARE = 1e-3
#: An element is grossly off when its error exceeds this share of its float64 value ...
GROSS_RELATIVE = 0.5
#: ... and this multiple of the model as written's error there, its float64 value above its dtype's eps times the
#: tensor's root-mean-square (smaller elements are cancellation's, where any order of summation may miss by more).
GROSS_OVER_EAGER = 8.0


def no_gross_elements(g: torch.Tensor, r: torch.Tensor, e: torch.Tensor, label: str) -> tuple[bool, str]:
    """Whether a 16-bit floating output ``g`` keeps all but :data:`GROSS_ELEMENT_SHARE` of its elements (at least
    one) within :data:`GROSS_RELATIVE` of the float64 ``r`` wherever the model as written's ``e`` is
    :data:`GROSS_OVER_EAGER` times closer and ``|r|`` is above eps times ``r``'s root-mean-square; ``(True, "")`` for
    other dtypes. Computed in chunks of :data:`~fusion_advisor.verification.policy.JUDGE_CHUNK` elements."""
    if g.dtype not in (torch.float16, torch.bfloat16) or g.shape != r.shape or g.shape != e.shape or not g.numel():
        return True, ""
    flat_g, flat_r, flat_e = g.reshape(-1), r.reshape(-1), e.reshape(-1)
    rms = float(torch.linalg.vector_norm(flat_r.double())) / flat_g.numel() ** 0.5
    floor = torch.finfo(g.dtype).eps * rms
    gross = 0
    for a in range(0, flat_g.numel(), JUDGE_CHUNK):
        rc = flat_r[a:a + JUDGE_CHUNK].to(device=g.device, dtype=torch.float64)
        dg = (flat_g[a:a + JUDGE_CHUNK].double() - rc).abs()
        de = (flat_e[a:a + JUDGE_CHUNK].double() - rc).abs()
        bad = (rc.abs() > floor) & (dg > GROSS_RELATIVE * rc.abs()) & (dg > GROSS_OVER_EAGER * de)
        gross += int(bad.sum())
    if gross <= max(1, GROSS_ELEMENT_SHARE * g.numel()):
        return True, ""
    return False, (f"{label}: within the tensor's norm-wise and max-wise limits, but {gross} of {g.numel()} elements "
                   f"are over {GROSS_RELATIVE:.0%} off float64 where the model as written is {GROSS_OVER_EAGER:g}x "
                   f"closer (elements below eps x the tensor's RMS not counted): small elements the tensor's norm "
                   f"does not see")


def reference_sanity(dtype: torch.dtype) -> float:
    """The largest norm-wise error from float64 at which a tensor of ``dtype`` from the model as written still lets
    the float64 copy serve as the reference: :data:`REFERENCE_SANITY`, or :data:`REFERENCE_SANITY_ULPS` eps of a
    coarser dtype."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return max(REFERENCE_SANITY, REFERENCE_SANITY_ULPS * eps)


def _close_to_eager(g: torch.Tensor, e: torch.Tensor, label: str,
                    compute_dtype: torch.dtype | None = None) -> tuple[bool, str]:
    """Fallback without a float64 reference: within the element-wise tolerance of the model as written
    (:func:`fusion_advisor.verification.policy.compare_outputs`), NaN where it is. The tolerance is the coarser of
    the output's dtype and ``compute_dtype`` (the model's parameters'): a bf16 model's fp32 loss carries bf16's
    error, and fp32's 1e-5 failed the model's own ops replayed from a CUDA graph (1.7e-5 apart on the H200)."""
    if g.shape != e.shape or g.dtype != e.dtype:
        return False, f"{label}: {g.dtype}{list(g.shape)} where the model as written gives {e.dtype}{list(e.shape)}"
    atol = rtol = None
    if g.is_floating_point() and compute_dtype is not None and compute_dtype.is_floating_point \
            and torch.finfo(compute_dtype).eps > torch.finfo(g.dtype).eps:
        atol, rtol = tolerance_for(compute_dtype)
    ok, max_abs, _, lines = compare_outputs(g, e, atol=atol, rtol=rtol, label=label)
    if not ok:
        return False, "; ".join(lines) + " (against the model as written)"
    what = "dtype tolerance" if atol is None else f"{compute_dtype} tolerance (the model's parameters)"
    return True, f"{label}: within the {what} of the model as written (max abs diff {max_abs:.3g})"
