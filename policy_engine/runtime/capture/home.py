"""The thread a capture belongs to, and the work other threads leave for it.

A capture lives on the thread that opened it, its *home* (docs/runtime.md, threads): a
session that is not ``any_thread`` is called there only (kineto crashes otherwise). A
step or an end from another thread is recorded here as *pending*, and the home thread's
next call into the profiler applies it. One :class:`Home` per capture, changed only
through its methods.
"""

from __future__ import annotations

import os
import threading

from policy_engine.files.records import Status
from policy_engine.runtime.process.state import warn_once

_get_ident = threading.get_ident


class Home:
    """The home thread of one capture and what waits for it."""

    __slots__ = ("any_thread", "busy", "end_requested", "ident", "lock", "name", "pending",
                 "pid", "waits", "wanted")

    def __init__(self, any_thread: bool) -> None:
        self.ident = _get_ident()
        self.name = threading.current_thread().name
        self.any_thread = any_thread  # the session takes calls from any thread (Nsight)
        self.pending = False  # another thread left work: read without a lock, often
        self.wanted = 0  # the furthest inner step other threads reached
        self.waits = 0  # transitions that waited for the home thread
        self.end_requested: Status | None = None  # another thread ended the capture
        self.busy = 0  # ident of the thread inside a transition
        self.lock = threading.Lock()
        self.pid = os.getpid()  # a forked child never drives its parent's capture

    def may_call(self) -> bool:
        """Whether this thread may call the session now (its home thread, or any thread
        when the session takes calls from any)."""
        return self.any_thread or _get_ident() == self.ident

    def forked(self) -> bool:
        """Whether this is a child forked since the capture opened."""
        return self.pid != os.getpid()

    def on_home_thread(self) -> bool:
        """Whether this is the capture's home thread (whatever the session allows)."""
        return _get_ident() == self.ident

    def defer(self, n: int, backend: str, owner: str) -> None:
        """Another thread reached inner step ``n``: the home thread applies it."""
        with self.lock:
            if n > self.wanted:
                self.wanted = n
            if not self.pending:
                self.pending = True
                self.waits += 1
        warn_once(("deferred", backend, owner),
                  "policy-engine: prof.step() from thread %r reached a schedule transition of "
                  "the %s capture of role %r, which belongs to thread %r: %s starts and stops "
                  "a profiler only on the thread that started it, so the transition waits for "
                  "that thread's next call into the profiler (see docs/runtime.md, threads)",
                  threading.current_thread().name, backend, owner, self.name, backend)

    def ask_end(self, status: Status) -> None:
        """Another thread (or a signal there) ends the capture: the home thread does."""
        self.end_requested = status
        self.pending = True

    def take(self, n: int) -> int:
        """The home thread acts at inner step ``n``: how far to go, nothing left pending."""
        self.pending = False
        return max(n, self.wanted)

    def enter(self) -> None:
        """This thread starts a transition (a signal handler asks who is inside)."""
        self.busy = _get_ident()

    def leave(self) -> None:
        self.busy = 0

    def inside(self) -> bool:
        """Whether this thread is inside one of the capture's transitions."""
        return self.busy == _get_ident()

    def stuck_in(self) -> int:
        """The thread inside a transition, else the home thread (a stuck capture's line)."""
        return self.busy or self.ident
