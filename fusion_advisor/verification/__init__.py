"""One verification engine for every check the advisor makes: ``verify``, ``bench``, ``bench --sweep`` and ``apply``.

The modules, in the order a check uses them::

    trees.py    leaves and labels of nested arguments and outputs
    inputs.py   fresh inputs with the structure of real ones, hard values, edge shapes
    poison.py   poisoned allocations in poisoned redzones; the input-mutation check
    launch.py   CUDA's grid limits, enforced under Triton's interpreter too
    policy.py   the error policy: float64 reference, eager's own error as the scale, norm-wise and max-wise
    kernel.py   the engine: one candidate call against its float64 reference and eager computation

``fusion_advisor.kernel_tools.verify`` loads kernel contracts and runs the engine over seeds, hard values and shapes;
``fusion_advisor.apply.swaps`` runs it on each swap; ``fusion_advisor.apply.measure`` judges whole-model variants
with the same policy.
"""

from fusion_advisor.verification.kernel import CaseOutcome, KeepFloat64, ReferenceFailed, check_case
from fusion_advisor.verification.policy import Judgement, compare_outputs, judge, judge_outputs

__all__ = ["CaseOutcome", "Judgement", "KeepFloat64", "ReferenceFailed", "check_case", "compare_outputs", "judge",
           "judge_outputs"]
