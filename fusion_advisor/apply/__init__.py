"""apply: carry the routing out on the user's model, verified and measured, and write the plan.

The passes, in the order :mod:`~fusion_advisor.apply.pipeline` runs them::

    patterns.py   kernel patterns traced once to canonical pre-dispatch graphs
    canonical.py  the canonical graph form patterns and models are matched in
    match.py      loose + exact matching, near-misses with reasons
    rewrite.py    matches replaced by the kernels' custom ops; a match cut out as a subgraph
    backend.py    the torch.compile backend: retrace -> match -> rewrite -> executor
    executors.py  eager, Inductor, CUDA graphs (aten or Inductor) for a graph
    regions.py    a graph cut into module regions, each with its own executor
    swaps.py      each swap checked by the verification engine (float64, the error policy) and timed alone
    measure.py    the whole model: float64 reference, eager outputs, checks and timing of a variant
    variants.py   a variant spec built into a runnable model (PlannedModel)
    search.py     baselines, candidates and regions tried; the fastest correct one chosen and confirmed
    plan.py       plan.yaml read back; load_plan rebuilds the chosen variant
    outputs.py    plan.yaml, variants.csv, swaps.csv and the folder's report.html
    records.py    the records the passes hand each other
    pipeline.py   apply / apply_module: the passes in order
"""

from fusion_advisor.apply.backend import RewriteBackend, to_aten_graph, to_analysis_graph
from fusion_advisor.apply.canonical import canonicalize
from fusion_advisor.apply.match import find_matches
from fusion_advisor.apply.outputs import OUTPUT_FILES, plan_document, write_outputs
from fusion_advisor.apply.pipeline import apply, apply_module
from fusion_advisor.apply.plan import PLAN_VERSION, Plan, PlanError, load_plan, read_plan
from fusion_advisor.apply.records import (
    ApplyOptions, ApplyResult, MatchKey, NearMiss, PlannedSwap, Region, RegionKey, SwapSite, VariantOutcome,
    VariantSpec,
)
from fusion_advisor.apply.rewrite import extract_subgraph, rewrite
from fusion_advisor.apply.variants import PlannedModel

__all__ = [
    "ApplyOptions", "ApplyResult", "MatchKey", "NearMiss", "OUTPUT_FILES", "PLAN_VERSION", "Plan", "PlanError",
    "PlannedModel", "PlannedSwap", "Region", "RegionKey", "RewriteBackend", "SwapSite", "VariantOutcome",
    "VariantSpec", "apply", "apply_module", "canonicalize", "extract_subgraph", "find_matches", "load_plan",
    "plan_document", "read_plan", "rewrite", "to_analysis_graph", "to_aten_graph", "write_outputs",
]
