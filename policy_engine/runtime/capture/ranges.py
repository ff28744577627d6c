"""Regions of a running capture, and the ranges the backend marks them with.

The home thread's open regions are a stack (``stack``, outermost first; ``ranges`` holds
the open range of each depth), cheap enough for every wrapped call. Regions on other
threads are tracked only when the session takes calls from any thread: torch records the
home thread alone, so a range elsewhere would show nothing. Ranges exist only while the
capture records: a region already open when recording starts gets its range then, and
every range still open when a cycle is saved is closed first. The names of the ranges a
cycle marked (:attr:`Regions.marked`) go into its trace's metadata, so that a reader tells
the regions (the phases of a step) from the other user annotations of the trace.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from policy_engine.backends.base import Session
from policy_engine.runtime.capture.cycle import Cycle
from policy_engine.runtime.capture.home import Home
from policy_engine.runtime.process.state import GuardedLock, warn_once

log = logging.getLogger("policy_engine")
#: Region names a cycle's metadata lists at most (a region's name is the policy's or the
#: code's: a few per role).
MAX_MARKED = 256
_get_ident = threading.get_ident


class Region:
    """A region call in progress while a capture runs; ``range`` is its open range."""

    __slots__ = ("name", "range", "thread")

    def __init__(self, name: str, thread: int) -> None:
        self.name = name
        self.thread = thread
        self.range: Any = None


class Regions:
    """The regions open while one capture runs, and their ranges. Changed here, under
    the slot's lock, except the home thread's own ``stack``: a wrapped method on the home
    thread outside recording pushes and pops it directly (runtime.role.wrapping), the one
    place where a region costs no call."""

    __slots__ = ("backend", "catch_up", "cycle", "home", "lock", "marked", "others",
                 "ranges", "session", "stack")

    def __init__(self, backend: str, lock: GuardedLock, session: Session, home: Home,
                 cycle: Cycle, catch_up: Callable[[], object]) -> None:
        self.backend = backend
        self.lock = lock  # the slot's
        self.session = session
        self.home = home
        self.cycle = cycle  # ranges exist while it records
        self.catch_up = catch_up  # applies what other threads left for the home thread
        self.stack: list[str] = []  # regions open on the home thread, outermost first
        self.ranges: dict[int, Any] = {}  # depth in ``stack`` -> its open range
        self.others: list[Region] = []  # regions open on other threads (any_thread)
        self.marked: dict[str, None] = {}  # names of the ranges this cycle opened, in order

    def region_enter(self, name: str) -> int | Region | None:
        """A region call starts on this thread; its range opens now if recording, else
        when recording starts. Returns what :meth:`region_exit` takes (None: nothing)."""
        tid = _get_ident()
        if tid == self.home.ident:
            if self.home.pending:
                self.catch_up()
            self.stack.append(name)
            depth = len(self.stack)
            if self.cycle.recording:
                with self.lock:
                    self._open_home(depth, depth)
            return depth
        if not self.home.any_thread:
            return None
        entry = Region(name, tid)
        self.others.append(entry)
        if self.cycle.recording:
            with self.lock:
                self._open_range(entry)
        return entry

    def region_exit(self, token: int | Region) -> None:
        if isinstance(token, int):
            self.stack.pop()
            self.home_exit(token)
            return
        with self.lock:
            if token in self.others:
                self.others.remove(token)
            self._close_range(token)

    def home_exit(self, depth: int) -> None:
        """After a home-thread region at ``depth`` left the stack: close its range, and
        apply what other threads left pending."""
        if self.ranges:
            with self.lock:
                for key in sorted((k for k in self.ranges if k >= depth), reverse=True):
                    self._end_range(self.ranges.pop(key), self.stack[key - 1]
                                    if key <= len(self.stack) else "region")
        if self.home.pending:
            self.catch_up()

    def _start_range(self, name: str) -> Any:
        try:
            rng = self.session.range(name)
            rng.__enter__()
        except Exception as err:
            warn_once(("range", self.backend, name),
                      "policy-engine: range %r could not open: %s", name, err)
            return None
        if len(self.marked) < MAX_MARKED:
            self.marked[name] = None
        return rng

    @staticmethod
    def _end_range(rng: Any, name: str) -> None:
        try:
            rng.__exit__(None, None, None)
        except Exception as err:
            log.warning("policy-engine: range %r could not close: %s", name, err)

    def _open_home(self, low: int, high: int) -> None:
        for depth in range(low, high + 1):
            if depth not in self.ranges:
                rng = self._start_range(self.stack[depth - 1])
                if rng is not None:
                    self.ranges[depth] = rng

    def _open_range(self, entry: Region) -> None:
        if entry.range is None:
            entry.range = self._start_range(entry.name)

    def _close_range(self, entry: Region) -> None:
        rng, entry.range = entry.range, None
        if rng is not None:
            self._end_range(rng, entry.name)

    def open_all(self) -> None:
        """Recording starts: ranges for the regions already open, outermost first (on
        the home thread; on every thread when the session takes calls from any)."""
        if self.home.may_call():
            self._open_home(1, len(self.stack))
        for entry in list(self.others):
            self._open_range(entry)

    def close_all(self) -> None:
        for entry in reversed(list(self.others)):
            self._close_range(entry)
        if self.ranges and self.home.may_call():
            for depth in sorted(self.ranges, reverse=True):
                name = self.stack[depth - 1] if depth <= len(self.stack) else "region"
                self._end_range(self.ranges.pop(depth), name)
