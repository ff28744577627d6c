"""Writing finished captures off the training thread.

When a cycle is saved, the backend stops on the training thread (kineto wants that), and
what is left (serialising the trace, gzip, fsync, the rename into place, the manifest
lines) becomes a job for this process's :class:`Exporter`: one background thread that
runs jobs in the order they came. At most ``in_flight`` exports wait or run at once;
the training thread that would queue one more waits for room, and says so once. A
capture's manifest lines after its first queued export go through the same queue, so
they stay in order: its ``close`` line comes after its ``trace`` lines.

Everything flushes at ``close()``, at interpreter exit and on SIGTERM
(:func:`flush`); a SIGTERM that arrives while the training thread queues or flushes is
handled when it is done. A process killed before a job ran leaves the capture without its
``close`` line, which ``policy-engine traces`` reports as interrupted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from policy_engine.runtime.process.state import STATE, critical, warn_once

log = logging.getLogger("policy_engine")

Job = Callable[[], None]


class Exporter:
    """A FIFO of jobs run on one daemon thread; ``in_flight`` bounds the exports."""

    def __init__(self, in_flight: int) -> None:
        self.in_flight = max(1, in_flight)
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[tuple[Job, bool]] = deque()
        self._exports = 0  # exports queued or running
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, job: Job, *, export: bool) -> None:
        """Queue ``job``; an export waits for room first (a manifest line never does).
        A critical stretch (runtime.process.state): a SIGTERM handler that flushed here would wait
        for a lock this thread holds."""
        with critical(), self._cond:
            if export and self._exports >= self.in_flight:
                warn_once(("export-wait",), "policy-engine: %d trace exports are already "
                          "being written; the training thread waits for one to finish "
                          "(larger traces than the disk keeps up with?)", self._exports)
                while self._exports >= self.in_flight:
                    self._cond.wait()
            self._jobs.append((job, export))
            self._exports += export
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="policy-engine-export")
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs:
                    # Idle: the thread ends (a later submit starts another), so that none
                    # is left waiting when the interpreter shuts down.
                    self._busy = False
                    self._thread = None
                    self._cond.notify_all()
                    return
                job, export = self._jobs.popleft()
                self._busy = True
            try:
                job()  # jobs record their own failures; this is a last resort
            except BaseException as err:
                log.warning("policy-engine: a background export failed: %r", err)
            finally:
                with self._cond:
                    self._exports -= export
                    self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job has run; False if ``timeout`` ran out first. Run on
        the export thread itself (a job that flushes), it returns at once."""
        if threading.current_thread() is self._thread:
            return not self._jobs
        deadline = None if timeout is None else time.monotonic() + timeout
        with critical(), self._cond:
            while self._jobs or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def on_thread(self) -> bool:
        """Whether the caller is the export thread (inside a job)."""
        return threading.current_thread() is self._thread

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._jobs) + self._busy


def exporter(in_flight: int) -> Exporter:
    """This process's exporter (made on first use; a larger ``in_flight`` widens it)."""
    with STATE.lock:
        found = STATE.exporter
        if not isinstance(found, Exporter):  # none yet: the slot holds nothing else
            found = Exporter(in_flight)
            STATE.exporter = found
        elif in_flight > found.in_flight:
            found.in_flight = in_flight
        return found


def flush(timeout: float | None = None) -> bool:
    """Wait for every background export of this process (close(), exit, SIGTERM)."""
    found = STATE.exporter
    return True if found is None else found.flush(timeout)
