"""Command-line interface: ``fusion-advisor analyze | apply | diff | verify | bench | doctor | calibrate``.

Each command is a thin shell over one pipeline stage; all user-facing errors are
:class:`fusion_advisor.errors.UserError` and print as one short message (a traceback only with ``--debug``).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, TypeVar

import typer
from rich.console import Console

from fusion_advisor.errors import UserError
from fusion_advisor.json_out import check_json_out, emit_json, write_json_atomic

T = TypeVar("T")
# soft_wrap: errors and progress lines are never hard-wrapped at the console width (80 columns without a
# terminal), so a path or a message in a CI log or a pipe stays on one line
console = Console(stderr=True, soft_wrap=True)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Which chains of a PyTorch model to fuse, how, and what it buys.",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        import fusion_advisor

        typer.echo(f"fusion-advisor {fusion_advisor.__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,  # noqa: B008
                                         help="Print fusion-advisor's version and exit.")) -> None:
    """The options taken before any command (the app's help text is Typer's ``help``, above)."""


# --- shared error handling ---------------------------------------------------------------------------------


def run_guarded(fn: Callable[[], T], debug: bool) -> T:
    """Run ``fn``; turn user errors, OOM and interrupts into one short message and a non-zero exit.

    A traceback is printed only with ``debug``. Exit codes: 2 user error, 3 out of memory, 130 interrupted,
    1 internal error.
    """
    try:
        return fn()
    except UserError as e:
        if debug:
            raise
        console.print("[bold red]error:[/] " + _escape(str(e)), highlight=False)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: no report was written or half-written")
        raise typer.Exit(130) from None
    except Exception as e:  # noqa: BLE001 - last line of defence: a short message, traceback only with --debug
        if debug:
            raise
        import torch

        if isinstance(e, torch.cuda.OutOfMemoryError):
            console.print("[bold red]error:[/] GPU out of memory: " + _escape(str(e).splitlines()[0])
                          + " — try --device meta (static analysis) or a smaller model/inputs")
            raise typer.Exit(3) from None
        console.print(f"[bold red]internal error:[/] {type(e).__name__}: " + _escape(str(e).splitlines()[0] if str(e) else "")
                      + "\n(rerun with --debug for the traceback)")
        raise typer.Exit(1) from None


def near_miss_line(near_misses: list) -> str:
    """``"N near-miss(es), e.g.: kernel: reason; ..."``, a reason shared by several chains (every layer's
    add_layernorm) said once with its count, three at most."""
    said: dict[str, int] = {}
    for n in near_misses:
        said[f"{n.kernel}: {n.reason}"] = said.get(f"{n.kernel}: {n.reason}", 0) + 1
    return f"{len(near_misses)} near-miss(es), e.g.: " + "; ".join(
        f"{text} (x{count})" if count > 1 else text for text, count in list(said.items())[:3])


def _launch_text(spec: dict) -> str:
    """The spec's host time per eager launch for the console's header: the tight-loop price, and where the spec
    scales host times inside a model (``host_time_scale``), that factor (a fresh user read "launch 12 us" while
    every pointwise op of the chains was charged 13.7; convolutions and GEMMs have prices of their own)."""
    launch = float(spec.get("launch_overhead_us") or 0.0)
    scale = float(spec.get("host_time_scale") or 1.0)
    text = f"{launch:.3g} us"
    return text if abs(scale - 1.0) < 0.005 or launch <= 0 else f"{text}, x{scale:.2f} inside a model"


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


# --- analyze ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _progress(name: str) -> Iterator[None]:
    labels = {
        "load": "loading the model and its inputs",
        "capture": "capturing graphs (dynamo + AOTAutograd)",
        "unused": "looking for work no output uses (one forward traced on meta)",
        "graph": "building the op graph",
        "chains": "cutting chains",
        "route": "estimating and routing",
        "profile": "profiling the model (warm-up, then torch.profiler)",
        "route-measured": "routing again with the measured bound classes",
        "analyze": "analysing the captured graphs (op graph, chains, roofline, rules)",
        "verify": "verifying (and on a GPU timing) the candidate swaps",
        "whole model": "checking the patched model against the original (on a GPU: timing it)",
        "swaps": "verifying the candidate swaps, one at a time (timing them where there is a GPU)",
        "swap sites": "listing the swap sites (a dry run: nothing is verified or timed)",
        "variants": "whole-model variants: each built, checked against float64, then timed",
    }
    label = labels.get(name, name)
    if _OUTER:  # a step inside a stage (apply's "variant eager: timing"): it runs where torch's noise is held back
        outer_console, status, outer_label = _OUTER[-1]
        if status is None:  # a pipe or a CI log: one indented line per step, to the stage's own stderr
            outer_console.print(f"  {_escape(label)} ...", highlight=False)
        else:
            # the stage's short name only: a spinner line wider than the terminal is cut before the step
            status.update(f"{_escape(outer_label.split(':')[0])}: {_escape(label)} ...")
        yield
        return
    # the console of this stage is bound to the stderr of now: steps inside it run while quiet_torch_logs has
    # redirected sys.stderr (apply's variants), where a lazily bound console would print into nothing
    here = Console(file=sys.stderr, soft_wrap=True)
    if here.is_terminal:
        shown: contextlib.AbstractContextManager = here.status(label + " ...")
    else:  # a pipe or a CI log: no live spinner, so one line as each stage starts
        here.print(f"{_escape(label)} ...", highlight=False)
        shown = contextlib.nullcontext(None)
    with shown as status:
        _OUTER.append((here, status, label))
        try:
            yield
        finally:
            _OUTER.pop()


#: The stages in progress, outermost first: (console, its spinner or None in a pipe, label).
_OUTER: list[tuple[Any, Any, str]] = []


@contextlib.contextmanager
def _steps(label: str) -> Iterator[Callable[[str], None]]:
    """Progress of a long stage made of steps: yields a function taking one line per step. On a terminal the
    spinner's text follows the steps; in a pipe or a CI log each step prints one line as it starts."""
    if not console.is_terminal:
        console.print(f"{_escape(label)} ...", highlight=False)
        yield lambda line: console.print(f"  {_escape(line)} ...", highlight=False)
        return
    with console.status(label + " ...") as status:
        yield lambda line: status.update(f"{_escape(label)}: {_escape(line)} ...")


@app.command()
def analyze(
    model: Optional[Path] = typer.Argument(
        None, help="Model file (KernelBench style, get_model()+get_inputs(), or a kernel file). Default: built-in Llama."
    ),
    device: Optional[str] = typer.Option(
        None, help="meta (static, nothing executed; default without GPU), cpu, or cuda (default with GPU)."
    ),
    dtype: str = typer.Option("", help="Cast the model and floating inputs: fp32, bf16 or fp16."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "--spec", help="Device spec: h200, h100, a100, l4, cpu, or a "
                                      "spec YAML path (calibrate's output, a CPU's too)."),
    rules: List[Path] = typer.Option([], "--rules", help="Extra rules YAML, matched before the shipped rules."),
    out: Optional[Path] = typer.Option(None, help="Report directory. Default: reports/<model name>/."),
    top: int = typer.Option(12, min=0, help="Chains shown in the terminal summary (by estimated saving)."),
    inductor_code: bool = typer.Option(False, "--inductor-code", help="Also capture the code Inductor generates for "
                                       "routed chains, shown beside the library kernel's source (inductor/*.py)."),
    inductor_top: int = typer.Option(5, "--inductor-top", min=0, help="With --inductor-code: chains compiled, the "
                                     "top N by estimated saving."),
    inductor_budget_s: float = typer.Option(300.0, "--inductor-budget-s", min=0.0, help="With --inductor-code: "
                                            "time budget for all chains, seconds."),
    profile: bool = typer.Option(False, "--profile", help="Run the model under torch.profiler (needs --device cpu or "
                                 "cuda) and put the measured time, GB/s, TFLOP/s and bound class next to every "
                                 "prediction."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="With --profile: also write the chrome trace here "
                                         "(open in ui.perfetto.dev or chrome://tracing)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Analyse a model: chains, bound classes, routes and reasons; writes report.html, chains.csv, ops.csv, report.json."""
    from fusion_advisor.analyze.pipeline import analyze as run_analysis
    from fusion_advisor.report.write import check_out_dir, earlier_model, earlier_report, write_report

    def job():
        from fusion_advisor.dtypes import CAST_NAMES

        if dtype and dtype not in CAST_NAMES:
            raise UserError(f"unknown --dtype {dtype!r}; choose fp32, bf16 or fp16")
        if not inductor_code and (inductor_top != 5 or inductor_budget_s != 300.0):
            raise UserError("--inductor-top and --inductor-budget-s go with --inductor-code")
        if out is not None:
            check_out_dir(out)  # before the analysis, so a bad --out fails fast
            if inductor_code:
                from fusion_advisor.analyze import inductor_code as ic

                ic.check_dir(out, ours=earlier_report(out))
        kept: list = []
        analysis = run_analysis(model, device=device, dtype=dtype, gpu=gpu, rules_files=list(rules), stage=_progress,
                                on_capture=kept.append, profile=profile, trace=trace)
        out_dir = out or Path("reports") / analysis.model_name
        if out is None:  # the default folder is known only now (it is named after the model)
            check_out_dir(out_dir)
        replaced = earlier_model(out_dir)
        if inductor_code:
            _inductor_code(analysis, kept[0].graphs, out_dir, inductor_top, inductor_budget_s)
        with console.status("writing the report ..."):
            paths = write_report(analysis, out_dir)
        return analysis, paths, replaced

    analysis, paths, replaced = run_guarded(job, debug)
    _print_summary(analysis, paths, top, replaced)


def _inductor_code(analysis, graphs, out_dir: Path, top: int, budget_s: float) -> None:
    """``analyze --inductor-code``: fill ``analysis.inductor_code`` and write inductor/<chain>.py (before the report)."""
    from fusion_advisor.analyze import inductor_code as ic
    from fusion_advisor.report.write import earlier_report

    ic.check_dir(out_dir, ours=earlier_report(out_dir))
    with console.status("generating Inductor's code for the routed chains ..."):
        analysis.inductor_code = ic.generate(analysis, graphs, top=top, budget_s=budget_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    ic.write_files(analysis.inductor_code, out_dir)


def _print_summary(analysis, paths: dict, top: int, replaced: str | None = None) -> None:
    from rich.table import Table

    from fusion_advisor.report.views import (apply_command, apply_elsewhere, matmul_peak_text, plan_mismatches,
                                             predicted_totals, whole_model_note)
    from fusion_advisor.analyze.model_call import after_route_us as counted
    from fusion_advisor.report.write import chains_frame, read_plan, replaced_note, summary_rows

    out = Console(width=None if sys.stdout.isatty() else 140)
    for b in analysis.graph_breaks:
        out.print(f"[yellow]graph break[/] at {_escape(str(b.source))}: {_escape(b.reason)}")
    for w in analysis.warnings:
        out.print(f"[yellow]warning:[/] {_escape(w)}")
    spec = analysis.device_spec
    out.print(
        f"[bold]{_escape(analysis.model_name)}[/]: {len(analysis.ops)} ops, {len(analysis.chains)} chains/items, "
        f"captured by {analysis.capture_method} on {analysis.device}; roofline of {spec['display_name']} "
        f"({spec['memory_bandwidth_gbps']:.4g} GB/s{matmul_peak_text(analysis)}, launch "
        f"{_launch_text(spec)}). "
        + ("est. times are estimates; measured times from torch.profiler." if analysis.profile else
           "All times are estimates.")
    )
    prof = analysis.profile
    if prof is not None:
        for n in prof.notes:
            out.print(f"[yellow]profile:[/] {_escape(n)}")
        flagged = sum(1 for m in prof.chains.values() if m.flagged)
        wall = (f"the plain model {prof.plain_wall_us:,.1f} us per run (no profiler); "
                if prof.plain_wall_us is not None else "")
        out.print(f"profiled on {_escape(prof.device_name)}: {wall}profiled run {prof.total_us:,.1f} us, "
                  f"{prof.attributed_us:,.1f} us attributed to chains; {flagged} chain(s) off their eager estimate "
                  f"by more than 2x" + (f"; trace: {_escape(prof.trace_file)}" if prof.trace_file else ""))
    rows = summary_rows(analysis)
    if rows:
        t = Table(title="Totals")
        for col in rows[0]:
            t.add_column(str(col), justify="right" if col not in ("group", "value", "route", "bound") else "left")
        for r in rows:
            t.add_row(*[f"{v:,.1f}" if isinstance(v, float) else str(v) for v in r.values()])
        out.print(t)
    def after_route_us(c: Any) -> float:  # as chains.csv's est_after_route_us counts it
        return counted(analysis.decisions[c.id].route, analysis.estimates[c.id])

    # ranked by what each chain's route saves (a GEMM swapped for a faster kernel saves without fusing anything)
    ranked = sorted(analysis.chains, key=lambda c: analysis.estimates[c.id].eager_us - after_route_us(c),
                    reverse=True)[:top]
    t = Table(title=f"Top {len(ranked)} chains by estimated saving on their route (est_route_saving_us in chains.csv)")
    for col, just in (("chain", "left"), ("pattern", "left"), ("bound", "left"), ("route", "left"), ("kernel", "left"),
                      ("eager us", "right"), ("after route us", "right"), ("source", "left")):
        t.add_column(col, justify=just)
    if prof is not None:
        t.add_column("measured us", justify="right")
        t.add_column("measured bound", justify="left")
    for c in ranked:
        e, d = analysis.estimates[c.id], analysis.decisions[c.id]
        src = f"{Path(c.source.file).name}:{c.source.line}" if c.source.file else "?"
        cells = [c.id, c.pattern, d.bound, d.route, d.kernel or "-", f"{e.eager_us:,.1f}", f"{after_route_us(c):,.1f}",
                 src]
        if prof is not None:
            m = prof.chains.get(c.id)
            cells += [f"{m.time_us:,.1f}" + (" !" if m.flagged else "") if m and m.time_us > 0 else "-",
                      m.bound if m else "-"]
        t.add_row(*cells)
    if ranked:  # --top 0 (or a model without chains): no empty table
        out.print(t)
    totals = predicted_totals(analysis, chains_frame(analysis))  # the numbers report.html's first screen gives
    eager, advised = totals["eager"], totals["advised"]
    if advised > 0:  # over the chains; the whole-model route (whole_model_note) also weighs the unused work
        out.print(f"predicted: {eager / advised:.2f}x vs eager, {totals['compiled'] / advised:.2f}x vs "
                  f"torch.compile(model) over the chains{whole_model_note(totals['routes'], advised)} (roofline "
                  "estimates; apply measures them)", highlight=False)
        unused = analysis.unused_us
        slower = advised - eager > 1e-9 * eager  # not rounding noise: a model left as written read "0.0 us slower"
        if slower and advised < eager + unused:  # routed: dynamo drops the work no output uses
            out.print(f"  (the advised routes are predicted {advised - eager:,.1f} us slower than eager over the "
                      f"chains, but the model as written also runs {unused:,.1f} us of work no output uses, which a "
                      "routed model, called through dynamo, drops)", highlight=False)
        elif slower:  # report.html says it beside the advice; a fresh user saw 0.52x and no word on it
            out.print(f"  (the advised routes are predicted {advised - eager:,.1f} us slower than eager: their "
                      "per-call host time, a compiled call or a CUDA-graph replay, outweighs what their chains save; "
                      "apply times the model as written too and keeps the faster)", highlight=False)
    out_dir = Path(paths["html"]).parent
    plan, _ = read_plan(out_dir)
    if plan is None:
        # apply without --gpu prices what it measures on this machine: a CPU's, with the 'cpu' spec; with --gpu it
        # routes by that GPU's spec, and still times this machine; its report goes to a folder of its own there
        elsewhere = apply_elsewhere(analysis)
        command = apply_command(analysis, out_dir)
        out.print("next: " + _escape(command), highlight=False, soft_wrap=True)  # a command to copy: unwrapped
        if elsewhere:
            how = ("routes it with the 'cpu' spec: its routes and times are this CPU's"
                   if "--gpu" not in command.split() else "times it there: its times are this CPU's")
            out.print(f"  (on this machine, without a GPU, apply runs the model on the CPU and {how}, not the GPU's "
                      f"above; it writes to a folder of its own, since in {out_dir} its report would replace this one)",
                      highlight=False)
    else:
        for note in plan_mismatches(plan, analysis, spec=False):
            out.print(f"[yellow]warning:[/] the report joins {out_dir}/plan.yaml: {_escape(note)}; run apply again "
                      f"or analyze into another --out", highlight=False)
    out.print(f"report: {paths.get('html')}  (also chains.csv, ops.csv, report.json in {out_dir}"
              + ("; with apply's results from plan.yaml" if plan is not None else "")
              + replaced_note(replaced, analysis.model_file) + ")")

# --- verify / bench -----------------------------------------------------------------------------------------
# (kernel contract commands; see fusion_advisor/kernel_tools/verify.py and fusion_advisor/kernel_tools/bench.py)

_KERNEL_ARG_HELP = (
    "Kernel file (.py) defining kernel_fn, reference_fn and get_inputs(), or a kernel_library module "
    "(rmsnorm, kernel_library.rmsnorm)."
)
_TOL_HELP = ("{} tolerance for every output and gradient, replacing the error policy: |kernel - reference| <= atol "
             "+ rtol |reference| element-wise, the reference being reference_fn in float64 (so --atol 0 --rtol 0 "
             "fails any rounding). Given alone, the other comes from the output dtype's table (atol, rtol: fp32 "
             "1e-05, 1e-05; fp16 0.01, 0.01; bf16 0.02, 0.016). Default: the error policy (each tensor's error "
             "against a float64 reference within a few times that of the reference run in the inputs' own dtype, "
             "plus a rounding floor; see verification/policy.py).")


@app.command()
def verify(
    file: str = typer.Argument(..., help=_KERNEL_ARG_HELP),
    rtol: Optional[float] = typer.Option(None, "--rtol", min=0.0, help=_TOL_HELP.format("Relative")),
    atol: Optional[float] = typer.Option(None, "--atol", min=0.0, help=_TOL_HELP.format("Absolute")),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds (fresh get_inputs() each) to verify on."),
    shapes: str = typer.Option("edges", "--shapes", help="Extra shapes, where the file's get_inputs(size) and "
                               "SIZES/SHAPES (or VERIFY_SIZES) allow: 'edges' (one row, a partial last block, odd "
                               "widths, 1025 rows; 65537 rows on a GPU), 'all' (65537 rows under the CPU interpreter "
                               "too: minutes), 'given' (get_inputs() only)."),
    json_out: Optional[Path] = typer.Option(None, "--json-out", help="Also write the JSON result to this file."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Check kernel_fn against reference_fn on fresh inputs, hard values and edge shapes (the error policy of
    fusion_advisor/verification/policy.py); print JSON {correct, max_abs_diff, max_rel_diff, details, shapes,
    worst_share_of_limit, ...}; exit 1 when incorrect, 2 when the file or its contract is unusable."""

    def job():
        from fusion_advisor.kernel_tools.verify import SHAPE_MODES, load_contract, use_triton_interpreter_if_no_gpu, verify_kernel

        if shapes not in SHAPE_MODES:
            raise UserError(f"--shapes {shapes}: choose one of {', '.join(SHAPE_MODES)}")
        check_json_out(json_out)
        use_triton_interpreter_if_no_gpu()
        def said(case: str) -> None:  # on stderr as it runs: a kernel that crashes the process names its case
            sys.stderr.write(f"verify: {case} ...\n")
            sys.stderr.flush()

        result = verify_kernel(load_contract(file), rtol=rtol, atol=atol, seeds=seeds, shapes=shapes,
                               progress=said)
        emit_json(result.to_dict(), json_out)
        return result

    result = run_guarded(job, debug)
    if debug and result.traceback:
        sys.stderr.write(result.traceback)
    if not result.correct:
        raise typer.Exit(1)


@app.command()
def bench(
    file: str = typer.Argument(..., help=_KERNEL_ARG_HELP),
    warmup_ms: float = typer.Option(25.0, "--warmup-ms", min=0.0, help="Warm-up budget per function, ms."),
    rep_ms: float = typer.Option(100.0, "--rep-ms", min=0.001, help="Timed budget per function, ms."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip timing torch.compile(reference_fn)."),
    rtol: Optional[float] = typer.Option(None, "--rtol", min=0.0, help=_TOL_HELP.format("Relative (verify step)")),
    atol: Optional[float] = typer.Option(None, "--atol", min=0.0, help=_TOL_HELP.format("Absolute (verify step)")),
    json_out: Optional[Path] = typer.Option(None, "--json-out", help="Also write the JSON result to this file."),
    sweep: bool = typer.Option(False, "--sweep", help="Sweep launch configs (SWEEP_CONFIGS or triton.autotune) over "
                               "the file's sizes (SIZES/SHAPES): table, sweep.csv, sweep.json."),
    out: Optional[Path] = typer.Option(None, "--out", help="With --sweep: output folder. Default: reports/sweep-<name>/."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "--spec", help="With --sweep: device spec for % of roofline."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Verify (one seed, the hard values and the edge shapes), then time kernel_fn, reference_fn and
    torch.compile(reference_fn); print JSON with kernel_time_ms, reference_time_ms, speedup (null on a CPU: the
    kernel's time is the Triton interpreter's), iteration counts, compile time. Exit 1 when verification fails.
    With --sweep: verify and time every launch config at every size instead (fusion_advisor/kernel_tools/sweep.py);
    exit 1 when a config fails verification at some size, or no config can be called there (a TypeError)."""
    if sweep:
        result = run_guarded(lambda: _bench_sweep(file, out, gpu, warmup_ms, rep_ms, rtol, atol, json_out), debug)
        if result.failed_sizes:  # wrong values, or no config ran: the sweep's files are written, the exit says so
            raise typer.Exit(1)
        return
    if out is not None or gpu is not None:  # sweep-only options: ignoring them would leave the user looking for files

        def refuse() -> None:
            given = [n for n, v in (("--out", out), ("--gpu", gpu)) if v is not None]
            verb = "apply" if len(given) > 1 else "applies"
            raise UserError(f"{' and '.join(given)} {verb} to `bench --sweep` only; without --sweep, bench prints one JSON result "
                            "(write it to a file with --json-out FILE)")

        run_guarded(refuse, debug)

    def job():
        from fusion_advisor.errors import VerificationFailed
        from fusion_advisor.kernel_tools.bench import bench_kernel
        from fusion_advisor.kernel_tools.verify import load_contract, use_triton_interpreter_if_no_gpu

        check_json_out(json_out)
        use_triton_interpreter_if_no_gpu()
        contract = load_contract(file)
        try:
            result = bench_kernel(contract, warmup_ms=warmup_ms, rep_ms=rep_ms, compile_reference=not no_compile,
                                  rtol=rtol, atol=atol)
        except VerificationFailed as e:  # the JSON says so too (--json-out gets a file), then the message and exit 1
            verified = e.result.to_dict() if e.result is not None else None
            emit_json({"name": contract.name, "benchmarked": False, "correct": False,
                        "why": "verification failed: a kernel that does not verify is not timed",
                        "verify": verified}, json_out)
            raise
        emit_json(result.to_dict(), json_out)
        for name in result.noisy_timings:
            console.print(f"[yellow]warning:[/] {name}'s timed calls spread {result.spreads[name]:.0%} "
                          "((p80 - p20) / median): its median and the speedups built on it are not reliable; "
                          "bench again on a quiet machine")

    run_guarded(job, debug)


# --- apply --------------------------------------------------------------------------------------------------
# (carry the routing out: swaps, regions, whole-model variants, each verified and timed; see fusion_advisor/apply/)


@app.command(name="apply")
def apply_cmd(
    model: Optional[Path] = typer.Argument(None, help="Model file (as for analyze). Default: built-in Llama."),
    verify_swaps: bool = typer.Option(False, "--verify", help="Verify and time every swap and whole-model variant "
                                      "(eager, torch.compile, CUDA graphs, library kernels, regions) and write the "
                                      "fastest correct one as the plan. Without it: find and report matches only."),
    backward: bool = typer.Option(False, "--backward", help="Also verify gradients and time forward+backward "
                                  "(the model in eval mode, as analysed: dropout off, batch norm on running "
                                  "statistics)."),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when present). apply runs the model."),
    dtype: str = typer.Option("", help="Cast the model and floating inputs: fp32, bf16 or fp16."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "--spec", help="Device spec for the analysis: h200, h100, a100, "
                                      "l4, cpu or a YAML."),
    rules: List[Path] = typer.Option([], "--rules", help="Extra rules YAML, matched before the shipped rules."),
    candidates: str = typer.Option("routed", help="routed: only chains the analysis routes to a kernel; all: every "
                                   "match (the measurement decides)."),
    kernel: List[str] = typer.Option([], "--kernel", help="Only match these library kernels (repeatable)."),
    margin: float = typer.Option(0.03, help="A swap is a candidate only if, timed alone, it beats the better of "
                                 "eager and torch.compile by this fraction."),
    budget_s: float = typer.Option(120.0, "--budget-s", help="Seconds the variant search may spend after the "
                                   "baselines (each variant compiles, is checked and timed)."),
    time_limit_s: float = typer.Option(240.0, "--time-limit-s", help="Wall seconds from the capture on after which "
                                       "apply starts no new work (swap checks stop at half of it); the baselines "
                                       "always run and the plan is written from what was measured. 0: no limit."),
    regions: bool = typer.Option(True, "--regions/--no-regions", help="Also try a different executor per region "
                                 "(one module's ops in a captured graph), kept only when the whole model gets "
                                 "faster."),
    time_rounds: int = typer.Option(3, "--time-rounds", help="Timing rounds per variant (their spread is the noise "
                                    "a win must beat)."),
    variants: List[str] = typer.Option([], "--variants", help="Only try variants whose name matches these patterns "
                                       "(repeatable; fnmatch: 'eager', 'swaps+*'); the model as written always runs. "
                                       "Default: every variant."),
    keep_unmeasured: bool = typer.Option(False, "--keep-unmeasured", help="Allow a verified variant that could not "
                                         "be timed (library kernels under the CPU interpreter) to be chosen."),
    seeds: int = typer.Option(2, min=1, help="Fresh random input draws per swap verification."),
    out: Optional[Path] = typer.Option(None, help="Output directory. Default: reports/<model name>/."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Carry the routing out on a model: library kernels swapped in, regions compiled by Inductor or replayed
    from CUDA graphs, every variant checked against float64 and timed in the whole model; the fastest correct one
    that confirms its win over the best baseline in interleaved rounds becomes plan.yaml (rebuild it with
    fusion_advisor.load_plan). Writes plan.yaml, variants.csv, swaps.csv and
    the folder's report.html (the analysis with apply's results; one report per model folder)."""
    if device != "cuda":  # before anything imports triton.language: the interpreter is chosen at import time
        from fusion_advisor.kernel_tools.verify import use_triton_interpreter_if_no_gpu

        use_triton_interpreter_if_no_gpu()
    from fusion_advisor.apply import ApplyOptions, apply, write_outputs

    def job():
        from fusion_advisor.dtypes import CAST_NAMES

        if dtype and dtype not in CAST_NAMES:
            raise UserError(f"unknown --dtype {dtype!r}; choose fp32, bf16 or fp16")
        if device is not None and device not in ("cpu", "cuda"):
            raise UserError(f"unknown --device {device!r}: apply runs the model; choose cpu or cuda")
        if out is not None:
            _check_apply_out(out)  # before the (long) apply run
        options = ApplyOptions(verify=verify_swaps, backward=backward or None, candidates=candidates, margin=margin,
                               keep_unmeasured=keep_unmeasured, seeds=seeds, kernels=tuple(kernel) or None, gpu=gpu,
                               rules_files=tuple(str(r) for r in rules), budget_s=budget_s,
                               time_limit_s=time_limit_s, regions=regions,
                               time_rounds=time_rounds, variants=tuple(variants) or None)
        options.check()
        result = apply(model, options, device=device, dtype=dtype, stage=_progress)
        out_dir = out or Path("reports") / result.model_name
        if out is None:  # the default folder is known only now (it is named after the model)
            _check_apply_out(out_dir)
        with console.status("writing plan.yaml, variants.csv, swaps.csv and the folder's report.html ..."):
            paths = write_outputs(result, out_dir)
        return result, paths

    result, paths = run_guarded(job, debug)
    _print_apply_summary(result, paths)


def _check_apply_out(out_dir: Path) -> None:
    """Refuse an --out holding files apply would write (its own, and the folder's report) that fusion-advisor
    did not write."""
    from fusion_advisor.apply.outputs import every_output_name
    from fusion_advisor.report.write import check_files

    check_files(out_dir, every_output_name())


def _print_apply_summary(result, paths: dict) -> None:
    from rich.table import Table

    from fusion_advisor.apply.outputs import speedup_line

    out = Console(width=None if sys.stdout.isatty() else 160)
    for b in result.graph_breaks:  # as analyze prints them: apply captures the same graphs
        out.print(f"[yellow]graph break[/] at {_escape(str(b.source))}: {_escape(b.reason)}")
    for w in result.warnings:
        out.print(f"[yellow]warning:[/] {_escape(w)}")
    for name, why in result.library_problems.items():
        out.print(f"[yellow]kernel {name}:[/] {_escape(why)}")
    if result.sites:
        t = Table(title=f"{len(result.sites)} swap site(s) in {result.model_name}")
        for col in ("swap", "kernel", "chain", "decision", "reason", "source"):
            t.add_column(col, overflow="fold")
        for s in result.sites:
            o = result.outcomes[s.id]
            src = f"{Path(s.source.file).name}:{s.source.line}" if s.source.file else "?"
            t.add_row(s.id, s.kernel, ",".join(s.chain_ids), o.decision, _escape(o.reason), src)
        out.print(t)
    if result.near_misses:
        out.print(_escape(near_miss_line(result.near_misses)))
    if result.variants:
        what = "forward+backward" if result.backward else "forward"
        t = Table(title=f"whole-model variants, {what} ({result.variants[0].timing.timer if result.variants[0].timing else 'not timed'})")
        for col in ("variant", "status", "ms", "spread", "first call s", "reason"):
            t.add_column(col, overflow="fold")
        for v in result.variants:
            tm = v.timing
            t.add_row(_escape(v.spec.name), v.status, f"{tm.ms:.4g}" if tm and tm.ms else "",
                      f"{tm.spread:.1%}" if tm and tm.spread is not None else "",
                      f"{tm.first_call_s:.2f}" if tm and tm.first_call_s is not None else "",
                      _escape(v.reason))
        out.print(t)
        gains = speedup_line(result)
        chosen = result.chosen.spec.name if result.chosen is not None else "the model as written"
        why = result.chosen_reason.removeprefix(f"{chosen}: ")  # the reason names the variant (for plan.yaml)
        out.print(f"plan: [bold]{_escape(chosen)}[/]" + (f" ({gains})" if gains else "") + f": {_escape(why)}")
    else:
        out.print("dry run: no variant verified or timed (add --verify to choose one)")
    rebuild = (f"rebuild with fusion_advisor.load_plan(model, '{paths['plan']}')" if result.chosen is not None else
               "no variant was chosen, so load_plan would run the model as written")
    folder = Path(paths["plan"]).parent
    report = (f"report: {paths['html']} (analysis and apply's results; also plan.yaml, variants.csv, swaps.csv in "
              f"{folder})" if "html" in paths else f"written: plan.yaml, variants.csv, swaps.csv in {folder} (no "
              f"report.html: see the warning above)")
    out.print(f"{report}; {rebuild}")


# --- diff ---------------------------------------------------------------------------------------------------
# (two report folders side by side; see fusion_advisor/report/diff.py)


@app.command()
def diff(
    a: Path = typer.Argument(..., help="Report folder A (written by analyze, perhaps apply too)."),
    b: Path = typer.Argument(..., help="Report folder B, compared with A."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for diff.html and diff.csv. Default: "
                                       "reports/diff-<A>-vs-<B>/."),
    threshold: float = typer.Option(0.10, "--threshold", help="Relative change of a time that counts as a change "
                                    "(0.1 = 10%)."),
    top: int = typer.Option(40, "--top", min=0, help="Changed rows shown on the terminal."),
    fail_on_change: bool = typer.Option(False, "--fail-on-change", help="Exit 1 when any chain changed, or the "
                                        "plan apply chose (for CI: a torch upgrade that silently breaks a fusion)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Compare two report folders (another GPU, another torch, before and after a code change): the chains whose
    route, bound class, kernel, pattern, kernel count or time changed; writes diff.html and diff.csv."""
    from fusion_advisor.report.diff import DIFF_FILES, diff_folders, terminal_table, write_diff
    from fusion_advisor.report.write import check_files

    def job():
        out_dir = out or Path("reports") / f"diff-{Path(a).resolve().name}-vs-{Path(b).resolve().name}"
        check_files(out_dir, tuple(DIFF_FILES.values()))
        d = diff_folders(a, b, threshold=threshold)
        check_files(out_dir, tuple(DIFF_FILES.values()))
        return d, write_diff(d, out_dir)

    d, paths = run_guarded(job, debug)
    show = Console(width=None if sys.stdout.isatty() else 160)
    for w in d.warnings:
        show.print(f"[yellow]warning:[/] {_escape(w)}", highlight=False)
    for label, x, y in d.facts:
        if x != y:
            show.print(f"{_escape(label)}: {_escape(x)} (A) -> {_escape(y)} (B)", highlight=False)
    if d.changed and top > 0:
        show.print(terminal_table(d, top))
    elif d.changed:  # --top 0: the count alone, no empty table
        show.print(f"{len(d.changed)} chain(s) changed ({len(d.rows)} rows compared)")
    else:
        show.print(f"no chain changed ({len(d.rows)} rows compared; times within {threshold:.0%})")
    show.print(f"diff: {paths['html']} (and {paths['csv']})", highlight=False)
    if fail_on_change and (d.changed or d.plan_changed):
        raise typer.Exit(1)


# --- doctor -------------------------------------------------------------------------------------------------
# (stack checks; see fusion_advisor/devices/doctor.py)


@app.command()
def doctor(
    json_stdout: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout instead of the table."),
    json_out: Optional[Path] = typer.Option(None, "--json-out", help="Also write the JSON result to this file."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (of checks that raised, too)."),
) -> None:
    """Check the stack: Python, torch, Triton (and whether torch pins this Triton), CUDA, the GPU, torch.compile,
    and a Triton copy kernel (verified; on a GPU its GB/s against the device spec). Exit 1 when a check that
    matters fails; each failed check says what to do."""
    from fusion_advisor.kernel_tools.verify import use_triton_interpreter_if_no_gpu

    use_triton_interpreter_if_no_gpu()  # before anything decorates a Triton kernel

    def job():
        from fusion_advisor.devices.doctor import run_doctor

        check_json_out(json_out)
        report = run_doctor(stage=_progress)
        if json_stdout:
            emit_json(report.to_dict(), json_out)
        elif json_out is not None:
            write_json_atomic(json_out, report.to_dict())
        return report

    report = run_guarded(job, debug)
    if not json_stdout:
        from fusion_advisor.devices.doctor import render, verdict

        out = Console(width=None if sys.stdout.isatty() else 160)
        out.print(render(report))
        out.print(_escape(verdict(report)))
    if debug:
        for c in report.checks:
            if c.traceback:
                sys.stderr.write(f"--- {c.name}:\n{c.traceback}")
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _bench_sweep(file: str, out: Optional[Path], gpu: Optional[str], warmup_ms: float, rep_ms: float,
                 rtol: Optional[float], atol: Optional[float], json_out: Optional[Path]) -> Any:
    """``bench --sweep``: sweep, print the table, write sweep.csv / sweep.json (see fusion_advisor/kernel_tools/sweep.py); returns
    the :class:`~fusion_advisor.kernel_tools.sweep.SweepResult`."""
    from fusion_advisor.kernel_tools.sweep import check_sweep_dir, load_hooks, run_sweep, sweep_table, write_sweep
    from fusion_advisor.kernel_tools.verify import load_contract, use_triton_interpreter_if_no_gpu

    use_triton_interpreter_if_no_gpu()
    check_json_out(json_out)  # before the sweep, as --out
    if out is not None:
        check_sweep_dir(out)  # before the sweep, so a bad --out fails fast
    hooks = load_hooks(load_contract(file))
    out_dir = out or Path("reports") / f"sweep-{hooks.name}"
    check_sweep_dir(out_dir)
    with console.status("sweeping ...") as status:
        result = run_sweep(hooks, spec_name=gpu, warmup_ms=warmup_ms, rep_ms=rep_ms, rtol=rtol, atol=atol,
                           progress=lambda line: status.update(_escape(line)))
    paths = write_sweep(result, out_dir)
    if json_out is not None:
        write_json_atomic(json_out, result.to_dict())
    show = Console(width=None if sys.stdout.isatty() else 160)
    show.print(sweep_table(result))
    for s in result.sizes:
        if result.interpreted:
            line = f"size {s.size}: no best config (interpreter times)"
        else:
            line = f"size {s.size}: best {s.best_config or '(none: every config rejected)'}"
        if s.best_time_ms is not None:
            line += f" ({s.best_time_ms:.4f} ms)"
        if s.rejected:
            line += f"; {s.rejected} rejected"
            if s.failed_verification:
                line += f" ({s.failed_verification} failed verification)"
        if s.autotune_ms is not None:
            line += f"; autotune took {s.autotune_ms:,.1f} ms and chose {s.autotune_choice or '?'}"
        elif s.autotune_error:
            line += f"; autotune: {s.autotune_error}"
        show.print(_escape(line), highlight=False)
    if result.note:
        show.print(f"[yellow]note:[/] {_escape(result.note)}")
    show.print(f"sweep: {paths['csv']}  {paths['json']}", highlight=False)
    wrong = [s.size for s in result.sizes if s.failed_verification]
    if wrong:
        show.print(f"[bold red]verification failed[/] at size(s) {', '.join(wrong)}: a config computed "
                   f"wrong values there (see the rejected rows); exit 1", highlight=False)
    none_ran = [s for s in result.failed_sizes if s not in wrong]
    if none_ran:
        first = next((r.reason for r in result.rows if r.size == none_ran[0]), "")
        show.print(f"[bold red]no config ran[/] at size(s) {', '.join(none_ran)}: every one was rejected by a "
                   f"TypeError (e.g. {_escape(first[:200])}): check that kernel_fn takes the configs' parameters "
                   f"as keyword arguments (SWEEP_CONFIGS); exit 1", highlight=False)
    return result


# --- calibrate ----------------------------------------------------------------------------------------------
# (measure the present device's roofline ceilings; see fusion_advisor/devices/calibrate.py)


@app.command()
def calibrate(
    out: Optional[Path] = typer.Option(None, "--out", help="Spec YAML to write. Default: device_spec_gpu.yaml "
                                       "(or device_spec_cpu.yaml; with --from-profile device_spec_fitted.yaml) "
                                       "here. A file calibrate did not write is never overwritten."),
    device: Optional[str] = typer.Option(None, help="cuda (default with a GPU) or cpu."),
    quick: bool = typer.Option(False, "--quick", help="Shorter budgets: fewer convolutions, matmuls and reductions "
                               "sampled, no SDPA grid; peaks still at sizes that reach the ceilings."),
    from_profile: Optional[List[Path]] = typer.Option(
        None, "--from-profile", help="Measure nothing: fit per-op-class eager times from `analyze --profile` "
        "report folders (or folders of them; repeat the flag) into the spec they were analysed with, and print the "
        "residuals before and after on a fit set and a test set."),
    test: Optional[List[Path]] = typer.Option(
        None, "--test", help="With --from-profile: report folders the fit never sees, to test it on (repeatable). "
        "Default: every third model held out (all its reports)."),
    base: Optional[str] = typer.Option(None, "--base", help="With --from-profile: the spec (name or YAML) to add "
                                       "the fits to. Default: the reports' own."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Measure copy bandwidth, matmul TFLOP/s per dtype and per-op launch overhead on this device; write a device
    spec YAML that analyze and apply take with --gpu SPEC.yaml. With --from-profile, learn each op class's eager
    time from profiled reports instead."""
    if from_profile:
        if quick or device:  # it measures nothing: refused, as --test and --base are without it
            console.print("[bold red]error:[/] --quick and --device measure; --from-profile measures nothing",
                          highlight=False)
            raise typer.Exit(2)
        _calibrate_from_profile(from_profile, test, base, out, debug)
        return
    if test or base:
        console.print("[bold red]error:[/] --test and --base go with --from-profile", highlight=False)
        raise typer.Exit(2)
    from fusion_advisor.devices.calibrate import calibrate as run_calibrate, check_out_file, checked_device, default_out

    def job():
        where = checked_device(device)  # bad arguments before the banner of a minute's measuring
        check_out_file(Path(out) if out is not None else default_out(where))
        with _steps("measuring copy bandwidth, matmul throughput and launch overhead") as step:
            return run_calibrate(out, device=device, quick=quick, progress=step)

    path, data = run_guarded(job, debug)
    t = data["tensor_tflops"]
    typer.echo(f"{data['display_name']} ({data['kind']}): copy {data['memory_bandwidth_gbps']:,.1f} GB/s "
               f"(read + write); matmul TFLOP/s " + ", ".join(f"{k} {v:,.3g}" for k, v in t.items())
               + f"; launch {data['launch_overhead_us']:.2f} us per eager op")
    skipped = data.get("calibration", {}).get("not_measured") or {}
    if skipped:
        typer.echo("not measured: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()))
    for w in data.get("calibration", {}).get("warnings") or []:
        console.print(f"[bold red]WARNING:[/] {_escape(w)}")
    typer.echo(f"wrote {path}; use it with: fusion-advisor analyze --gpu {path}")


def _calibrate_from_profile(paths: List[Path], test: Optional[List[Path]], base: Optional[str],
                            out: Optional[Path], debug: bool) -> None:
    """``calibrate --from-profile``: fit, write the spec and its residual tables, print the accuracy table."""
    from datetime import date

    from rich.table import Table

    from fusion_advisor.devices import load_spec
    from fusion_advisor.devices.calibrate import check_out_file
    from fusion_advisor.devices.fit_profiles import fit_from_profiles, summary, worse_after_fit, write_fit

    target = out or Path("device_spec_fitted.yaml")

    def job():
        check_out_file(target)  # before reading and fitting every report
        spec = load_spec(base) if base else None
        result = fit_from_profiles(paths, test or None, base=spec)
        return result, write_fit(result, target, date.today().isoformat())

    result, written = run_guarded(job, debug)
    sums = {split: summary(result, split) for split in ("fit", "test")}
    cols = [(split, when) for split in ("fit", "test") if sums[split] for when in ("before", "after")]
    whose = f"--base {base}" if base else "the reports' own, as they were analysed"
    table = Table(title=f"eager time, predicted vs measured: spec {result.base.name} ({whose}; 'before' without "
                  "profile fits) before and after the fit",
                  title_justify="left", caption=f"fit set: {len(result.fit_reports)} report(s); test set: "
                  f"{len(result.test_reports)} the fit never saw", caption_justify="left")
    table.add_column("", no_wrap=True)
    for split, when in cols:
        table.add_column(f"{split} {when}", justify="right", no_wrap=True)
    for key, label, pct in (("chains_30pct", "chains ±30%", True), ("chains_2x", "chains in 2x", True),
                            ("models_25pct", "models ±25%", True), ("bound_match", "bound = measured", True),
                            ("median_log2_error", "median |log2 err|", False)):
        cells = []
        for split, when in cols:
            v = sums[split][when][key]
            cells.append("n/a" if v != v else (f"{100 * v:.0f}%" if pct else f"{v:.2f}"))
        table.add_row(label, *cells)
    console.print(table)
    coarse = [c for c in result.classes if "/" not in c.key]
    top = ", ".join(f"{c.key} {c.median_ratio:.3g}x" for c in coarse[:8])
    typer.echo(f"fitted {len(result.classes)} op class curve(s) from {result.samples} measured op(s); measured "
               f"over roofline time, median per category: {top} (every class: {written['classes'].name})")
    for note in result.notes:  # the split, reports skipped, the host and cold host scales (or why they stay 1)
        typer.echo(note)
    for note in worse_after_fit(sums):
        console.print(f"[yellow]warning:[/] {_escape(note)}", highlight=False)
    typer.echo(f"wrote {written['spec']} and {written['residuals'].name}, {written['models'].name}, "
               f"{written['classes'].name} beside it; use it with: fusion-advisor analyze --gpu {written['spec']}")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
