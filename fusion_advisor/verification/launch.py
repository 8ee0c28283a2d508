"""CUDA's launch limits, enforced where the hardware does not enforce them: under Triton's CPU interpreter.

A CUDA grid holds at most 2**31 - 1 programs on axis 0 and 65,535 on axes 1 and 2 (CUDA C Programming Guide,
"Compute Capabilities", table of technical specifications: maximum x-, y- and z-dimension of a grid of thread
blocks). A kernel that puts rows on ``grid[1]`` fails on a GPU as soon as there are more than 65,535 of them, while
Triton's interpreter runs any grid: :class:`GridLimits` makes such a launch raise :class:`GridLimitError` under the
interpreter too, before any program runs, so ``verify``'s shape with more than 65,535 rows finds the bug on a CPU.
On a GPU the driver refuses the launch itself, and the mode does nothing.
"""

from __future__ import annotations

from typing import Any

#: Largest grid per axis (x, y, z) on every CUDA GPU since compute capability 3.0.
CUDA_MAX_GRID = (2**31 - 1, 65535, 65535)


class GridLimitError(RuntimeError):
    """A Triton launch whose grid exceeds :data:`CUDA_MAX_GRID` on some axis."""


def check_grid(grid: tuple[int, ...]) -> None:
    """Raise :class:`GridLimitError` when ``grid`` (up to three axes, programs per axis) exceeds CUDA's limits."""
    for axis, (n, limit) in enumerate(zip(grid, CUDA_MAX_GRID)):
        if n > limit:
            raise GridLimitError(
                f"a launch with {n} programs on grid axis {axis}: CUDA allows at most {limit} there (TRITON_RULES: "
                f"put the large dimension, rows or tokens, on grid[0], or tile it)")


class GridLimits:
    """Context manager: under ``TRITON_INTERPRET=1``, every Triton launch checks its grid with :func:`check_grid`.

    It wraps the interpreter's ``set_grid_dim`` (called once per launch with the whole grid, before the programs
    run); where the installed Triton has no such hook it does nothing and :attr:`active` is False.
    """

    def __init__(self) -> None:
        self.active = False
        self._builder: Any = None

    def __enter__(self) -> "GridLimits":
        try:
            from triton.runtime import interpreter
        except Exception:  # no Triton, or one without an interpreter: nothing to guard
            return self
        builder = getattr(interpreter, "interpreter_builder", None)
        original = getattr(builder, "set_grid_dim", None)
        if original is None or "set_grid_dim" in getattr(builder, "__dict__", {}):
            return self  # no hook, or an outer GridLimits already checks every launch
        self._builder = builder

        def checked(*grid: int) -> Any:
            check_grid(tuple(int(g) for g in grid))
            return original(*grid)

        try:
            builder.set_grid_dim = checked
        except (AttributeError, TypeError):  # a builder that takes no attributes
            return self
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.active:
            return
        try:
            del self._builder.set_grid_dim
        except AttributeError:
            pass
        self.active = False
