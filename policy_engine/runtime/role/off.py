"""What a rank that profiles nothing gets: methods that do nothing, decided once.

:class:`OffProfiler` is the profiler of a rank whose plan is off; a RoleProfiler that
fails or is closed stays one object in its OFF state, whose methods hand back :data:`NULL`
here. Step numbers are checked (:func:`as_step`) where the plan is on; a rank that is off
checks nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

from policy_engine.plan.plan import Plan

F = TypeVar("F", bound=Callable[..., Any])


class _Null:
    """A context manager that does nothing, shared by every disabled call (``async with``
    too: an engine role that is off, integrations.engines)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


NULL = _Null()


def as_step(n: object) -> int:
    """``n`` as an outer step number: an int, or anything integer-like (numpy integers,
    0-d integer tensors). Anything else is a TypeError: a float or a bool is a bug."""
    if n.__class__ is int:
        return n
    if isinstance(n, bool):
        raise TypeError("training_step(n) takes an integer step number, got a bool")
    try:
        return operator.index(n)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError("training_step(n) takes an integer step number (int, numpy integer "
                        f"or 0-d integer tensor), got {type(n).__name__} {n!r:.40}") from None


class OffProfiler:
    """The profiler of a rank that profiles nothing: every method is a no-op."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def training_step(self, n: int) -> _Null:
        # No check of n here: a rank that profiles nothing pays nothing (the ranks that
        # profile raise TypeError for a step number that is not one).
        return NULL

    def step(self) -> None:
        pass

    def region(self, name: str) -> _Null:
        return NULL

    def annotate(self, name: str | None = None) -> Callable[[F], F]:
        return _identity

    def close(self) -> None:
        pass

    def __enter__(self) -> OffProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _identity(fn: F) -> F:
    return fn

