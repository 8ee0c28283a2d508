"""fusion-advisor: which chains of a PyTorch model to fuse, how, and what it buys.

Pipeline stages, one module each, passing the typed records of :mod:`fusion_advisor.records`:

    load -> capture -> graph -> chains -> route (rules, devices) -> report
                                         \\-> apply -> swaps (verify, bench) -> plan

See README.md for the commands. ``fusion_advisor.load_plan(model, "plan.yaml")`` rebuilds a model patched by
``fusion-advisor apply`` (imported lazily, so ``import fusion_advisor`` stays light).
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load_plan", "PatchedModel"]


def __getattr__(name: str):
    if name in ("load_plan", "PatchedModel"):
        from fusion_advisor import plan

        return getattr(plan, name)
    raise AttributeError(f"module 'fusion_advisor' has no attribute {name!r}")
