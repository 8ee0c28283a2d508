"""Progress and wall time of a pipeline's stages, shared by ``analyze`` and ``apply``.

A *stage* callback is a context-manager factory called with each stage's name (the CLI shows a spinner with it);
:func:`stage_timer` wraps one so that each stage's wall time (seconds) lands in a dict as well.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

Stage = Callable[[str], contextlib.AbstractContextManager]


@contextlib.contextmanager
def no_progress(_: str) -> Iterator[None]:
    """A stage callback that shows nothing."""
    yield


def stage_timer(stage: Stage, timings: dict[str, float]) -> Stage:
    """A stage callback that runs ``stage(name)`` and records the stage's wall time in ``timings[name]`` (s)."""

    @contextlib.contextmanager
    def timed(name: str) -> Iterator[None]:
        start = time.perf_counter()
        with stage(name):
            yield
        timings[name] = time.perf_counter() - start

    return timed
