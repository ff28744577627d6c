"""Regions in training code: ``prof.region(name)`` blocks and wrapped worker methods,
and the one way region methods are patched onto objects and put back (:class:`Patches`).

A continuous region is a range in whatever capture runs (see runtime.capture.ranges); a discrete
region is a capture of its own for each call. A wrapped method runs exactly once whatever
the backend does, and costs one attribute read when no capture runs. The profiler is
reached through :class:`RegionHost`, the little of it that regions need.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import CodeType, FrameType
from typing import Any, Protocol, TypeVar

from policy_engine.files.records import Status
from policy_engine.plan.plan import Plan
from policy_engine.runtime.capture.driver import Capture
from policy_engine.runtime.process.state import Slot

log = logging.getLogger("policy_engine")
F = TypeVar("F", bound=Callable[..., Any])
Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]
_get_ident = threading.get_ident
_ABSENT = object()


class RegionHost(Protocol):
    """What regions need of the role's profiler (runtime.role.profiler.RoleProfiler)."""

    plan: Plan
    slot: Slot[Capture]

    def region(self, name: str) -> AbstractContextManager[None]: ...
    def open_region(self, name: str) -> Capture | None: ...
    def close_region(self, capture: Capture, status: Status) -> None: ...


class _RegionBlock:
    """``with prof.region(name):`` in continuous mode: a range in the running capture."""

    __slots__ = ("capture", "entry", "name", "slot")

    def __init__(self, prof: RegionHost, name: str) -> None:
        self.slot = prof.slot
        self.name = name
        self.capture: Capture | None = None
        self.entry: Any = None

    def __enter__(self) -> None:
        capture = self.slot.capture
        if capture is not None:
            self.capture, self.entry = capture, capture.regions.region_enter(self.name)

    def __exit__(self, *exc: object) -> None:
        if self.entry is not None and self.capture is not None:
            self.capture.regions.region_exit(self.entry)


class _DiscreteBlock:
    """``with prof.region(name):`` in discrete mode: each call is a capture of its own."""

    __slots__ = ("capture", "inner", "name", "prof")

    def __init__(self, prof: RegionHost, name: str) -> None:
        self.prof = prof
        self.name = name
        self.capture: Capture | None = None
        self.inner: _RegionBlock | None = None

    def __enter__(self) -> None:
        self.capture = self.prof.open_region(self.name)
        if self.capture is None:
            # Joined another role's capture (or off): a range in whatever is recording.
            self.inner = _RegionBlock(self.prof, self.name)
            self.inner.__enter__()

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self.inner is not None:
            self.inner.__exit__()
        elif self.capture is not None:
            self.prof.close_region(self.capture,
                                   Status.PARTIAL if exc_type is not None else Status.COMPLETE)


def wrap_region(prof: RegionHost, name: str, fn: F) -> F:
    """``fn`` as region ``name`` of ``prof``. Continuous mode costs one attribute read when
    no capture runs; the function runs exactly once whatever the backend does."""
    if prof.plan.discrete:
        @functools.wraps(fn)
        def discrete(*args: Any, **kwargs: Any) -> Any:
            with prof.region(name):
                return fn(*args, **kwargs)
        discrete.__policy_engine__ = (prof.plan.role, prof)  # type: ignore[attr-defined]
        return discrete  # type: ignore[return-value]

    the_slot = prof.slot

    @functools.wraps(fn)
    def ranged(*args: Any, **kwargs: Any) -> Any:
        capture = the_slot.capture
        if capture is None:
            return fn(*args, **kwargs)
        home, regions = capture.home, capture.regions
        if home.ident != _get_ident() or home.pending or capture.cycle.recording:
            token = regions.region_enter(name)
            if token is None:
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                regions.region_exit(token)
        # The home thread outside recording: the region goes on the stack, so that a
        # recording that starts inside it opens its range (Regions.open_all).
        stack = regions.stack
        stack.append(name)
        depth = len(stack)
        try:
            return fn(*args, **kwargs)
        finally:
            stack.pop()
            if regions.ranges or home.pending:
                regions.home_exit(depth)
    ranged.__policy_engine__ = (prof.plan.role, prof)  # type: ignore[attr-defined]
    return ranged  # type: ignore[return-value]


def regions_on(frame: FrameType | None) -> list[str]:
    """The regions a thread is inside, outermost first, from its stack (``frame``: its
    innermost frame): the wrapped methods it is in. For a stall record, read from another
    thread while this one is stuck; ``with prof.region()`` blocks leave no frame."""
    found: list[str] = []
    while frame is not None and len(found) < 16:
        if frame.f_code in _WRAPPERS:
            name = frame.f_locals.get("name")
            if isinstance(name, str):
                found.append(name)
        frame = frame.f_back
    return found[::-1]


class Patches:
    """Methods replaced on objects (instance attributes: other instances and the class
    stay untouched), and how to put each back."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done: list[tuple[object, str, object, object]] = []

    def __bool__(self) -> bool:
        return bool(self._done)

    def replace(self, obj: object, name: str, wrap: Wrap) -> None:
        """Set ``obj.name`` to ``wrap(obj.name)`` until :meth:`restore`."""
        method = getattr(obj, name)
        previous = vars(obj).get(name, _ABSENT)
        wrapper = wrap(method)
        setattr(obj, name, wrapper)
        self._done.append((obj, name, previous, wrapper))

    def regions(self, obj: object, role: str, names: Iterable[str],
                wrap: Callable[[str], Wrap]) -> list[str]:
        """Replace each method ``name`` of ``obj`` by ``wrap(name)(method)``; a name that
        ``obj`` has no method for is warned about and skipped. Returns the names done."""
        done = []
        for name in names:
            if not callable(getattr(obj, name, None)):
                log.warning("policy-engine: role %r has region %r but %s has no such method",
                            role, name, type(obj).__name__)
                continue
            self.replace(obj, name, wrap(name))
            done.append(name)
        return done

    def restore(self) -> None:
        """Put back what was replaced, newest first; a method replaced again since (by
        someone else) is left as it is."""
        while self._done:
            obj, name, previous, wrapper = self._done.pop()
            if vars(obj).get(name) is not wrapper:
                continue
            if previous is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, previous)


# the code of the wrappers wrap_region makes (one code object for all their closures)
_WRAPPERS = frozenset(c for c in wrap_region.__code__.co_consts if isinstance(c, CodeType))


def marked(value: object, role: str) -> Any:
    """The profiler of ``role`` that wrapped ``value``, or None (not such a wrapper)."""
    marker = getattr(value, "__policy_engine__", None)
    return marker[1] if marker is not None and marker[0] == role else None
