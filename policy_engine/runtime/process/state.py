"""Everything a process holds for profiling, in one place.

A process has one :class:`Slot` per backend name (colocated roles share it: one capture per
backend at a time), a counter that numbers captures in the manifest, the signal hooks,
and the set of one-time warnings already given (:func:`warn_once`, the one way anything
is said once per process). :func:`reset` puts all of it back as at import, for tests.

What the modules above this one keep here (the export thread, the summary workers, each
manifest's file, each role's spend, each applied profiler) is typed by a Protocol of what
it is asked here and by a reader of the state, so this module imports none of them; each
owner takes its own back out through one function that knows its class.

Its locks are :class:`GuardedLock`: while the main thread holds one (or is inside any
other :func:`critical` stretch), a SIGTERM handler does not act; it leaves the signal
pending, and the outermost stretch delivers it as it ends (runtime.process.signals). So the
handler never cuts a save or a manifest line in half, and never waits for the export
thread while this thread holds a lock that thread needs.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Generic, Protocol, TypeVar, Union

from policy_engine.backends.base import Backend
from policy_engine.files.records import Status

log = logging.getLogger("policy_engine")
#: A signal's disposition, as ``signal.getsignal`` gives it: a handler, or SIG_DFL/SIG_IGN.
Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, None]  # noqa: UP007


class _Depth(threading.local):
    n = 0  # how deep this thread is in critical stretches


_DEPTH = _Depth()


def enter_critical() -> None:
    """A stretch a SIGTERM must not cut starts on this thread (calls nest)."""
    _DEPTH.n += 1


def leave_critical() -> None:
    """The stretch ends; the outermost on the main thread delivers a waiting SIGTERM."""
    _DEPTH.n -= 1
    hooks = STATE.hooks
    if _DEPTH.n or (hooks.pending_signal is None and hooks.pending_stall is None) or \
            hooks.signal_hook is None:
        return
    if threading.current_thread() is threading.main_thread():  # where handlers run
        hooks.signal_hook()


def in_critical() -> bool:
    """Whether this thread is inside a critical stretch (a signal handler asks)."""
    return _DEPTH.n > 0


class critical:  # a lower-case name: it reads as a call, ``with critical():``
    """``with critical():`` marks a stretch a SIGTERM handler waits for."""

    __slots__ = ()

    def __enter__(self) -> None:
        enter_critical()

    def __exit__(self, *exc: object) -> None:
        leave_critical()


class GuardedLock:
    """A re-entrant lock whose holding is a critical stretch: a SIGTERM that arrives
    while this thread waits for it or holds it is delivered after the release."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        enter_critical()
        try:
            got = self._lock.acquire(blocking, timeout)
        except BaseException:
            leave_critical()
            raise
        if not got:
            leave_critical()
        return got

    def release(self) -> None:
        self._lock.release()
        leave_critical()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class Running(Protocol):
    """What this module and runtime.process.signals ask of a running capture (runtime.capture.driver
    builds it; this module only holds it, so it never imports it)."""

    def end(self, status: Status = ..., stopped_by: str | None = ...) -> None: ...
    def terminate(self, why: str) -> None: ...
    def abandon(self, why: str) -> None: ...
    def cut_short(self, why: str) -> bool: ...


C = TypeVar("C", bound=Running)


class Exports(Protocol):
    """The export thread (runtime.process.export.Exporter), made on first use."""

    def flush(self, timeout: float | None = ...) -> bool: ...


class Summarises(Protocol):
    """The summary workers (runtime.process.summaries.Pool), made on first use."""

    def wait(self, timeout: float | None) -> bool: ...
    def finish(self, wait: float) -> None: ...


class ManifestFile(Protocol):
    """This process's manifest under one output folder (runtime.process.manifest): the
    file its next line goes to."""

    @property
    def name(self) -> str: ...


class Spending(Protocol):
    """What one role has spent in this process, against its ``limits``
    (runtime.process.budget.Spend)."""

    cycles: int
    bytes: int


class Applied(Protocol):
    """A role's profiler on a worker (runtime.role.profiler.RoleProfiler), found again when
    the role is applied to that worker again."""

    def close(self) -> None: ...


class Restores(Protocol):
    """The methods apply_policy patched on a worker (runtime.role.wrapping.Patches)."""

    def restore(self) -> None: ...


class ClockKeeping(Protocol):
    """The listener that measures the job's clock for this process
    (runtime.triggers.clock.Keeper): told of each capture opened, and woken."""

    asked: int

    def wake(self) -> None: ...


K = TypeVar("K", bound=ClockKeeping)


class Slot(Generic[C]):
    """The one capture a backend may run in this process, and the backend object itself."""

    __slots__ = ("backend", "capture", "lock", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.capture: C | None = None
        self.backend: Backend | None = None  # created on first use; tests may install their own
        # Serializes transitions of the slot's capture, the opening of one, and its save.
        # Re-entrant: a transition may end the capture it runs in (a failure).
        self.lock = GuardedLock()

    def hold(self, capture: C) -> None:
        """``capture`` runs on this backend now (under the lock)."""
        self.capture = capture

    def release(self, capture: C) -> None:
        """``capture`` ended: the slot is free, unless another holds it already."""
        if self.capture is capture:
            self.capture = None


class Hooks:
    """The process's signal and exit hooks: installed once, never undone, so they outlive
    :func:`reset` (runtime.process.signals owns them)."""

    __slots__ = ("exit_installed", "pending_signal", "pending_stall", "previous_sigterm",
                 "previous_usr2", "signal_hook", "sigterm_installed", "stall_save",
                 "terminating", "usr2_count", "usr2_installed")

    def __init__(self) -> None:
        self.exit_installed = False  # atexit
        self.sigterm_installed = False
        self.previous_sigterm: Handler = signal.SIG_DFL
        self.pending_signal: int | None = None  # SIGTERM that arrived in a critical stretch
        self.terminating = False  # the SIGTERM handler is at work
        self.usr2_installed = False
        self.previous_usr2: Handler = signal.SIG_DFL
        self.usr2_count = 0  # SIGUSR2s received (runtime.triggers reads it)
        self.signal_hook: Callable[[], None] | None = None  # delivers it (runtime.process.signals)
        # a stall's ask of the main thread to save its captures, partial: (why, when asked)
        # as the listener thread sets it, and as it waits for a critical stretch to end
        self.stall_save: tuple[str, float] | None = None
        self.pending_stall: tuple[str, float] | None = None


class ProcessState:
    """What this process holds. One instance, :data:`STATE`."""

    def __init__(self, hooks: Hooks | None = None) -> None:
        # Re-entrant; a SIGTERM waits while the main thread holds it (GuardedLock).
        self.lock = GuardedLock()
        self.slots: dict[str, Slot[Any]] = {}
        self.capture_ids = itertools.count(1)
        self.warned: set[object] = set()
        # (pid, output_dir) -> this process's manifest there (a forked child has its own)
        self.manifests: dict[tuple[int, str], ManifestFile] = {}
        # The manifests' own lock: one line at a time, and a SIGTERM waits for the line
        # to be whole; never held while anything but a regular file is written.
        self.manifest_lock = GuardedLock()
        self.started = time.strftime("%Y%m%d%H%M%S")
        self.hooks = hooks or Hooks()
        # (id(worker), role) -> (the worker's weak reference, its profiler, its patches)
        self.applied: dict[tuple[int, str],
                           tuple[weakref.ref[Any], Applied, Restores]] = {}
        self.exporter: Exports | None = None
        self.summaries: Summarises | None = None
        self.budgets: dict[tuple[int, str], Spending] = {}  # (pid, role) -> its spend
        self.clock: ClockKeeping | None = None  # runtime.triggers.clock.Keeper: who measures


STATE = ProcessState()


def slot(name: str) -> Slot[Any]:
    """The slot of backend ``name`` (created on first use)."""
    with STATE.lock:
        found = STATE.slots.get(name)
        if found is None:
            found = STATE.slots[name] = Slot(name)
        return found


def captures() -> list[Running]:
    """The captures running now, one per backend at most."""
    with STATE.lock:
        return [s.capture for s in STATE.slots.values() if s.capture is not None]


def capture_id() -> str:
    """A capture's id in this process's manifest: ``<pid>-<n>``."""
    return f"{os.getpid()}-{next(STATE.capture_ids)}"


def warn_once(key: object, message: str, *args: object, level: int = logging.WARNING,
              logger: logging.Logger = log) -> None:
    """Log ``message`` the first time ``key`` is seen in this process: a warning on the
    ``policy_engine`` logger unless ``level`` and ``logger`` say otherwise (the verl
    plugin's lines)."""
    with STATE.lock:
        if key in STATE.warned:
            return
        STATE.warned.add(key)
    logger.log(level, message, *args)


def warned(key: object) -> bool:
    """Whether :func:`warn_once` has said ``key`` in this process."""
    return key in STATE.warned


def claim_clock(make: Callable[[], K]) -> K | None:
    """The process's clock keeper made by ``make`` and kept, when none keeps it yet (the
    first listener of a job's); None when another does."""
    with STATE.lock:
        if STATE.clock is not None:
            return None
        keeper = make()
        STATE.clock = keeper
        return keeper


def release_clock(keeper: ClockKeeping) -> None:
    """``keeper`` keeps the process's clock no more (when it did)."""
    with STATE.lock:
        if STATE.clock is keeper:
            STATE.clock = None


def reset() -> None:
    """Forget everything (tests): running captures are ended as partial first."""
    for capture in captures():
        try:
            capture.end(Status.PARTIAL)
        except Exception as err:  # a test double that fails on purpose
            log.debug("reset: ending a capture failed: %r", err)
    if STATE.exporter is not None:
        STATE.exporter.flush()
    if STATE.summaries is not None:
        STATE.summaries.finish(0.0)  # summaries still running are cut
    # atexit and signal handlers cannot be undone; they read STATE whenever they run.
    hooks = STATE.hooks
    hooks.pending_signal, hooks.terminating = None, False
    hooks.stall_save = hooks.pending_stall = None
    STATE.__dict__.update(ProcessState(hooks).__dict__)


def _after_fork() -> None:
    """A forked child (a data-loader worker) starts with no capture of its own: the
    parent's profilers are the parent's. Locks a parent thread held are made anew."""
    STATE.lock = GuardedLock()
    STATE.manifest_lock = GuardedLock()
    STATE.exporter = None  # its thread stayed in the parent
    STATE.summaries = None  # so did the summary workers
    STATE.clock = None  # and the listener thread that measures the job's clock
    for found in STATE.slots.values():
        found.lock = GuardedLock()
        found.capture = None


os.register_at_fork(after_in_child=_after_fork)
