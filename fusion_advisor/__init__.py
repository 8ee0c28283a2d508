"""fusion-advisor: which chains of a PyTorch model to fuse, how, and what it buys; then a faster model.

Pipeline stages, passing the typed records of :mod:`fusion_advisor.analyze.records` (analyze) and
:mod:`fusion_advisor.apply.records` (apply):

    load -> capture -> graph -> chains -> roofline -> rules/route -> report
                                          \\-> apply: swaps, regions, variants (verified, timed) -> plan

See README.md for the commands. ``fusion_advisor.load_plan(model, "plan.yaml")`` rebuilds the model ``fusion-advisor
apply`` chose (imported lazily, so ``import fusion_advisor`` stays light).
"""

__version__ = "0.2.0"

__all__ = ["__version__", "load_plan", "PlannedModel", "PlanError"]


def __getattr__(name: str):
    if name in ("load_plan", "PlannedModel"):
        from fusion_advisor import apply

        return getattr(apply, name)
    if name == "PlanError":  # what load_plan raises on a plan it cannot use
        from fusion_advisor.apply.plan import PlanError

        return PlanError
    raise AttributeError(f"module 'fusion_advisor' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the lazily imported ones too (``dir(fusion_advisor)`` listed none of them)."""
    return sorted(set(globals()) | set(__all__))
