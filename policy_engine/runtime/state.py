"""Everything a process holds for profiling, in one place.

A process has one :class:`Slot` per backend name (colocated roles share it: one capture per
backend at a time), a counter that numbers captures in the manifest, the signal hooks,
and the set of one-time warnings already given. :func:`reset` puts all of it back as at
import, for tests.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from policy_engine.runtime.capture import Capture

log = logging.getLogger("policy_engine")


class Slot:
    """The one capture a backend may run in this process, and the backend object itself."""

    __slots__ = ("backend", "capture", "lock", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.capture: Capture | None = None
        self.backend: Any = None  # created on first use; tests may install their own
        # Serializes transitions of the slot's capture. Re-entrant: a transition may end
        # the capture it runs in (a failure), and a signal handler may run inside one.
        self.lock = threading.RLock()


class ProcessState:
    """What this process holds. One instance, :data:`STATE`."""

    def __init__(self) -> None:
        # Re-entrant: a SIGTERM handler runs on the main thread wherever it is, perhaps
        # while that thread holds this lock.
        self.lock = threading.RLock()
        self.slots: dict[str, Slot] = {}
        self.capture_ids = itertools.count(1)
        self.warned: set[object] = set()
        # (pid, output_dir) -> this process's manifest file (a forked child has its own)
        self.manifests: dict[tuple[int, str], str] = {}
        self.started = time.strftime("%Y%m%d%H%M%S")
        self.hooks_installed = False  # atexit
        self.sigterm_installed = False
        self.previous_sigterm: Any = signal.SIG_DFL
        self.pending_signal: int | None = None  # SIGTERM that arrived inside a transition
        self.usr2_installed = False
        self.previous_usr2: Any = signal.SIG_DFL
        self.usr2_count = 0  # SIGUSR2s received (runtime.triggers reads it)
        self.signal_hook: Callable[[], None] | None = None  # delivers it (runtime.signals)
        self.applied: dict[tuple[int, str], Any] = {}  # (id(worker), role) -> profiler
        self.exporter: Any = None  # runtime.export.Exporter, made on first use


STATE = ProcessState()


def slot(name: str) -> Slot:
    """The slot of backend ``name`` (created on first use)."""
    with STATE.lock:
        found = STATE.slots.get(name)
        if found is None:
            found = STATE.slots[name] = Slot(name)
        return found


def captures() -> list[Capture]:
    """The captures running now, one per backend at most."""
    with STATE.lock:
        return [s.capture for s in STATE.slots.values() if s.capture is not None]


def capture_id() -> str:
    """A capture's id in this process's manifest: ``<pid>-<n>``."""
    return f"{os.getpid()}-{next(STATE.capture_ids)}"


def warn_once(key: object, message: str, *args: object) -> None:
    """Log ``message`` as a warning the first time ``key`` is seen in this process."""
    with STATE.lock:
        if key in STATE.warned:
            return
        STATE.warned.add(key)
    log.warning(message, *args)


def reset() -> None:
    """Forget everything (tests): running captures are ended as partial first."""
    for capture in captures():
        try:
            capture.end("partial")
        except Exception as err:  # a test double that fails on purpose
            log.debug("reset: ending a capture failed: %r", err)
    if STATE.exporter is not None:
        STATE.exporter.flush()
    fresh = ProcessState()
    # atexit and signal handlers cannot be undone; they read STATE whenever they run.
    fresh.hooks_installed = STATE.hooks_installed
    fresh.sigterm_installed = STATE.sigterm_installed
    fresh.previous_sigterm = STATE.previous_sigterm
    fresh.signal_hook = STATE.signal_hook
    fresh.usr2_installed = STATE.usr2_installed
    fresh.previous_usr2 = STATE.previous_usr2
    fresh.usr2_count = STATE.usr2_count
    STATE.__dict__.update(fresh.__dict__)


def _after_fork() -> None:
    """A forked child (a data-loader worker) starts with no capture of its own: the
    parent's profilers are the parent's. Locks a parent thread held are made anew."""
    STATE.lock = threading.RLock()
    STATE.exporter = None  # its thread stayed in the parent
    for found in STATE.slots.values():
        found.lock = threading.RLock()
        found.capture = None


os.register_at_fork(after_in_child=_after_fork)
