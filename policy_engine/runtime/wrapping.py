"""Regions in training code: ``prof.region(name)`` blocks and wrapped worker methods.

A continuous region is a range in whatever capture runs (see runtime.ranges); a discrete
region is a capture of its own for each call. A wrapped method runs exactly once whatever
the backend does, and costs one attribute read when no capture runs.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from policy_engine.runtime.capture import Capture

if TYPE_CHECKING:
    from policy_engine.runtime.profiler import RoleProfiler

F = TypeVar("F", bound=Callable[..., Any])
_get_ident = threading.get_ident


class _RegionBlock:
    """``with prof.region(name):`` in continuous mode: a range in the running capture."""

    __slots__ = ("capture", "entry", "name", "slot")

    def __init__(self, prof: RoleProfiler, name: str) -> None:
        self.slot = prof._slot
        self.name = name
        self.capture: Capture | None = None
        self.entry: Any = None

    def __enter__(self) -> None:
        capture = self.slot.capture
        if capture is not None:
            self.capture, self.entry = capture, capture.region_enter(self.name)

    def __exit__(self, *exc: object) -> None:
        if self.entry is not None and self.capture is not None:
            self.capture.region_exit(self.entry)


class _DiscreteBlock:
    """``with prof.region(name):`` in discrete mode: each call is a capture of its own."""

    __slots__ = ("capture", "inner", "name", "prof")

    def __init__(self, prof: RoleProfiler, name: str) -> None:
        self.prof = prof
        self.name = name
        self.capture: Capture | None = None
        self.inner: _RegionBlock | None = None

    def __enter__(self) -> None:
        self.capture = self.prof._open_region(self.name)
        if self.capture is None:
            # Joined another role's capture (or off): a range in whatever is recording.
            self.inner = _RegionBlock(self.prof, self.name)
            self.inner.__enter__()

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self.inner is not None:
            self.inner.__exit__()
        elif self.capture is not None:
            self.prof._close(self.capture, "partial" if exc_type is not None else "complete")


def wrap_region(prof: RoleProfiler, name: str, fn: F) -> F:
    """``fn`` as region ``name`` of ``prof``. Continuous mode costs one attribute read when
    no capture runs; the function runs exactly once whatever the backend does."""
    if prof.plan.discrete:
        @functools.wraps(fn)
        def discrete(*args: Any, **kwargs: Any) -> Any:
            with prof.region(name):
                return fn(*args, **kwargs)
        discrete.__policy_engine__ = (prof.plan.role, prof)  # type: ignore[attr-defined]
        return discrete  # type: ignore[return-value]

    the_slot = prof._slot

    @functools.wraps(fn)
    def ranged(*args: Any, **kwargs: Any) -> Any:
        capture = the_slot.capture
        if capture is None:
            return fn(*args, **kwargs)
        if capture.home != _get_ident() or capture.pending or capture.recording:
            token = capture.region_enter(name)
            if token is None:
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                capture.region_exit(token)
        # The home thread outside recording: the region goes on the stack, so that a
        # recording that starts inside it opens its range (Capture._open_ranges).
        stack = capture.stack
        stack.append(name)
        depth = len(stack)
        try:
            return fn(*args, **kwargs)
        finally:
            stack.pop()
            if capture.ranges or capture.pending:
                capture.home_exit(depth)
    ranged.__policy_engine__ = (prof.plan.role, prof)  # type: ignore[attr-defined]
    return ranged  # type: ignore[return-value]
