"""Regions of a running capture, and the ranges the backend marks them with.

The home thread's open regions are a stack (``stack``, outermost first; ``ranges`` holds
the open range of each depth), cheap enough for every wrapped call. Regions on other
threads are tracked only when the session takes calls from any thread: torch records the
home thread alone, so a range elsewhere would show nothing. Ranges exist only while the
capture records: a region already open when recording starts gets its range then, and
every range still open when a cycle is saved is closed first.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from policy_engine.backends.base import Session
from policy_engine.runtime.state import Slot, warn_once

log = logging.getLogger("policy_engine")
_get_ident = threading.get_ident


class Region:
    """A region call in progress while a capture runs; ``range`` is its open range."""

    __slots__ = ("name", "range", "thread")

    def __init__(self, name: str, thread: int) -> None:
        self.name = name
        self.thread = thread
        self.range: Any = None


class RegionRanges:
    """The region half of :class:`~policy_engine.runtime.capture.Capture`."""

    slot: Slot
    session: Session
    home: int
    any_thread: bool
    pending: bool
    recording: bool
    stack: list[str]
    ranges: dict[int, Any]
    others: list[Region]

    def catch_up(self) -> bool:
        raise NotImplementedError

    def region_enter(self, name: str) -> int | Region | None:
        """A region call starts on this thread; its range opens now if recording, else
        when recording starts. Returns what :meth:`region_exit` takes (None: nothing)."""
        tid = _get_ident()
        if tid == self.home:
            if self.pending:
                self.catch_up()
            self.stack.append(name)
            depth = len(self.stack)
            if self.recording:
                with self.slot.lock:
                    self._open_home(depth, depth)
            return depth
        if not self.any_thread:
            return None
        entry = Region(name, tid)
        self.others.append(entry)
        if self.recording:
            with self.slot.lock:
                self._open_range(entry)
        return entry

    def region_exit(self, token: int | Region) -> None:
        if isinstance(token, int):
            self.stack.pop()
            self.home_exit(token)
            return
        with self.slot.lock:
            if token in self.others:
                self.others.remove(token)
            self._close_range(token)

    def home_exit(self, depth: int) -> None:
        """After a home-thread region at ``depth`` left the stack: close its range, and
        apply what other threads left pending."""
        if self.ranges:
            with self.slot.lock:
                for key in sorted((k for k in self.ranges if k >= depth), reverse=True):
                    self._end_range(self.ranges.pop(key), self.stack[key - 1]
                                    if key <= len(self.stack) else "region")
        if self.pending:
            self.catch_up()

    def _start_range(self, name: str) -> Any:
        try:
            rng = self.session.range(name)
            rng.__enter__()
        except Exception as err:
            warn_once(("range", self.slot.name, name),
                      "policy-engine: range %r could not open: %s", name, err)
            return None
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

    def _open_ranges(self) -> None:
        """Recording starts: ranges for the regions already open, outermost first (on
        the home thread; on every thread when the session takes calls from any)."""
        if self.any_thread or _get_ident() == self.home:
            self._open_home(1, len(self.stack))
        for entry in list(self.others):
            self._open_range(entry)

    def _close_ranges(self) -> None:
        for entry in reversed(list(self.others)):
            self._close_range(entry)
        if self.ranges and (self.any_thread or _get_ident() == self.home):
            for depth in sorted(self.ranges, reverse=True):
                name = self.stack[depth - 1] if depth <= len(self.stack) else "region"
                self._end_range(self.ranges.pop(depth), name)
