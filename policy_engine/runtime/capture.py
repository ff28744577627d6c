"""One capture: a backend session driven through the schedule's actions, on one thread.

The schedule decides the action at every inner step; the backend is called only when the
action changes, through one table (:data:`TABLE`). Between changes ``step()`` is an
increment and a comparison: ``quiet_until`` is the next inner step that needs any work.

Threads (docs/runtime.md): a capture lives on the thread that opened it, its *home*, where
every call of a session that is not ``any_thread`` runs (kineto crashes otherwise). A
``step()`` elsewhere is counted and leaves its transition *pending* for the home thread's
next call; an ``any_thread`` session (Nsight) is driven wherever the step lands.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from policy_engine.backends.base import Session
from policy_engine.language.schedule import Action, Schedule
from policy_engine.runtime import shortfall
from policy_engine.runtime.export import Exporter
from policy_engine.runtime.ranges import Region, RegionRanges
from policy_engine.runtime.records import CaptureRecords, Recorded, timestamp
from policy_engine.runtime.state import Slot, warn_once
from policy_engine.runtime.transitions import NONE, RECORD, SAVE, TABLE, WARMUP, starts_recording
from policy_engine.runtime.triggers import Budget

log = logging.getLogger("policy_engine")

_NEVER = 1 << 62
_get_ident = threading.get_ident


class Capture(RegionRanges, CaptureRecords):
    """A capture in progress. Opened and ended by its owner role, advanced by any step()."""

    def __init__(self, *, slot: Slot, session: Session, schedule: Schedule | None,
                 owner: str, capture_id: str, record: dict[str, Any],
                 name: Callable[..., str], output_dir: str, last_step: int | None,
                 on_failure: Callable[[BaseException, str], None],
                 step_per_cycle: bool = False, budget: Budget | None = None,
                 exporter: Exporter | None = None,
                 on_export_failure: Callable[[BaseException], None] | None = None) -> None:
        self.slot = slot
        self.session = session
        self.schedule = schedule
        self.owner = owner
        self.id = capture_id
        self.record = record  # identity fields of every manifest line of the capture
        self.steps: list[int] = list(record["steps"])
        self.last_step = last_step  # the last outer step this capture may cover (merged)
        self.name = name
        # Plan.step_per_cycle: <step> is the outer step in which a cycle's first recorded
        # inner step ends (_name_cycle), and trace lines list steps[cycle_from:].
        self.step_per_cycle, self.step_unknown = step_per_cycle, False
        self.cycle_from, self.cycle_timestamp = 0, ""
        self.output_dir = output_dir
        self.on_failure = on_failure
        self.budget = budget  # the owner's limits: each cycle that records takes from it
        self.exhausted = False  # the budget refused a cycle: the schedule is over
        # export: background: saves hand their writing to the exporter (runtime.export)
        self.exporter = exporter
        self.on_export_failure = on_export_failure or (lambda err: on_failure(err, "export"))
        self.queued = False
        self.saved = 0  # cycles saved, their files written or queued
        self.export_error: str | None = None  # a background export of it failed
        self.pid = os.getpid()  # a forked child never drives its parent's capture
        self.home = _get_ident()
        self.home_name = threading.current_thread().name
        self.any_thread = bool(getattr(session, "any_thread", False))
        self.joined: list[str] = []
        self.stack: list[str] = []  # regions open on the home thread, outermost first
        self.ranges: dict[int, Any] = {}  # depth in ``stack`` -> its open range
        self.others: list[Region] = []  # regions open on other threads (any_thread)
        # the schedule, advanced under the slot's lock
        self.ticks = itertools.count(1)
        self.inner = 0  # the last inner step acted on
        self.quiet_until = 0
        self.action: Action | None = None
        self.cycle: int | None = None  # the schedule cycle the current cycle belongs to
        self.warming = False
        self.recording = False
        self.cycle_steps: list[int] = []
        self.cycle_started = time.time()
        self.stem = ""
        self.traces = 0  # trace lines written
        self.phase = "open"  # the backend call under way, for failure messages
        self.busy = 0  # ident of the thread inside a transition
        self.ended = False
        self.dropped = False  # drop(): ends without a trace
        self.reason: str | None = None  # why it recorded less than planned (close line)
        self.stopped_by: str | None = None  # SIGTERM or exit ended it (close line)
        # work other threads left for the home thread
        self.pending = False
        self.wanted = 0
        self.thread_waits = 0  # transitions that waited for the home thread
        self.end_requested: str | None = None
        self._wanted_lock = threading.Lock()
        self.failure: tuple[BaseException, str] | None = None
        reporter = getattr(session, "set_reporter", None)
        if reporter is not None:  # backends that write outside transitions (OOM dumps)
            reporter(self._report, self._current_name)

    # -- the schedule -------------------------------------------------------------
    def _action_at(self, step: int) -> Action:
        if self.exhausted:
            return NONE
        return RECORD if self.schedule is None else self.schedule.action(step)

    def _next_change(self, step: int, action: Action) -> int:
        """The first inner step after ``step`` that needs a backend call."""
        if self.exhausted:
            return _NEVER
        if action is RECORD or action is SAVE or self.schedule is None:
            return step + 1
        found = self.schedule.next_change(step)
        return _NEVER if found is None else found

    def begin(self) -> bool:
        """Apply inner step 0's action. True when the backend failed."""
        with self.slot.lock:
            return self._move(0)

    # One inner step, from any thread, is ``n = next(capture.ticks)`` and, when
    # ``n >= capture.quiet_until``, ``capture.advance(n)``: RoleProfiler.step inlines the
    # quiet path. next() on a count is atomic, so steps from several threads are never lost.

    def advance(self, n: int) -> bool:
        """Inner step ``n`` needs work. True when the backend failed in this call."""
        if not self.any_thread and _get_ident() != self.home:
            self._defer(n)
            return False
        with self.slot.lock:
            if self.slot.capture is not self or n <= self.inner:
                return False
            self.inner = max(n, self.wanted)
            self.pending = False
            failed = self._move(self.inner)
        if self.end_requested is not None and not failed:
            self.end(self.end_requested)
        return failed

    def _defer(self, n: int) -> None:
        with self._wanted_lock:
            if n > self.wanted:
                self.wanted = n
            if not self.pending:
                self.pending = True
                self.thread_waits += 1
        warn_once(("deferred", self.slot.name, self.owner),
                  "policy-engine: prof.step() from thread %r reached a schedule transition of "
                  "the %s capture of role %r, which belongs to thread %r: %s starts and stops "
                  "a profiler only on the thread that started it, so the transition waits for "
                  "that thread's next call into the profiler (see docs/runtime.md, threads)",
                  threading.current_thread().name, self.slot.name, self.owner, self.home_name,
                  self.slot.name)

    def catch_up(self) -> bool:
        """On the home thread: apply what other threads left pending. True on failure."""
        if not self.pending or _get_ident() != self.home:
            return False
        return self.advance(self.wanted)

    def _move(self, n: int) -> bool:
        """Go to inner step ``n``'s action, calling the backend as :data:`TABLE` says.

        Runs under the slot's lock. A backend failure ends the capture as failed and
        returns True; the owner was told through ``on_failure``.
        """
        new = self._action_at(n)
        old = self.action
        self.busy = _get_ident()
        try:
            if self.step_unknown:
                self._name_cycle()
            if old in (WARMUP, RECORD, SAVE) and self.schedule is not None and \
                    self.schedule.cycle(n) != self.cycle:
                self._run(old, NONE)  # the cycle ended between two calls
                old = NONE
            if self.budget is not None and new is not NONE and starts_recording(old, new) and \
                    not self.budget.take():
                self.exhausted, new = True, NONE  # limits: no new cycle records
            self._run(old, new)
        except Exception as err:
            self.busy = 0
            self._failed(err)
            return True
        finally:
            self.busy = 0
        self.action = new
        self.quiet_until = self._next_change(n, new)
        return False

    def _run(self, old: Action | None, new: Action) -> None:
        for op in TABLE[(old, new)]:
            getattr(self, "_op_" + op)()

    # -- the backend calls, one per table entry ----------------------------------------
    def _op_prepare(self) -> None:
        self.phase = "prepare"
        self._begin_cycle()
        self.session.prepare()
        self.warming = True

    def _op_start(self) -> None:
        self.phase = "start"
        if not self.warming:
            self._begin_cycle()
        self.session.start()
        self.step_unknown = self.step_per_cycle
        self.warming = False
        self.recording = True
        self.cycle_steps = []
        self._open_ranges()

    def _op_step(self) -> None:
        self.phase = "step"
        self.session.step(self.inner)
        self.cycle_steps.append(self.inner)

    def _op_save_complete(self) -> None:
        self._save("complete")

    def _op_save_partial(self) -> None:
        self._save("partial")

    def _op_discard(self) -> None:
        self.phase = "discard"
        self.warming = False
        self.session.discard()

    def _begin_cycle(self) -> None:
        """A cycle starts (warm-up or recording): fix its schedule cycle, time and name."""
        self.cycle = self.schedule.cycle(self.inner) if self.schedule is not None else None
        self.cycle_started = time.time()
        self.cycle_timestamp = timestamp()
        per_cycle = self.step_per_cycle  # then a provisional name until _name_cycle()
        self.stem = self.name(cycle=self.cycle, timestamp=self.cycle_timestamp,
                              at=self.steps[-1] if per_cycle else None)
        set_stem = getattr(self.session, "set_stem", None)
        if set_stem is not None and not per_cycle:  # backends naming outputs at start
            set_stem(self.stem)

    def _name_cycle(self) -> None:
        """The cycle's first recorded inner step ended (a step() or the end of the capture)
        in the current outer step: that step is the cycle's ``<step>``."""
        self.step_unknown = False
        self.cycle_from = len(self.steps) - 1
        self.stem = self.name(cycle=self.cycle, timestamp=self.cycle_timestamp,
                              at=self.steps[-1])
        set_stem = getattr(self.session, "set_stem", None)
        if set_stem is not None:  # torch_npu renames its folder at save when it differs
            set_stem(self.stem)

    # -- ending -------------------------------------------------------------------
    def add_step(self, n: int) -> None:
        """A merged capture goes on into outer step ``n``."""
        self.steps.append(n)

    def end(self, status: str = "complete", stopped_by: str | None = None) -> None:
        """Stop the capture: save a cycle that is recording, discard a warm-up.

        On a home-only session from another thread, the end is left to the home thread.
        Every capture leaves manifest lines: one that never reached a recorded step says
        so (status partial, no file); one whose save fails is recorded as failed.
        Raises what the backend raised (the owner decides: warn or raise).
        ``stopped_by``: what ended it from outside (SIGTERM, exit), for its close line.
        All under the slot's lock, which a SIGTERM handler waits for (runtime.signals).
        """
        if not self.any_thread and _get_ident() != self.home:
            self.end_requested = status
            self.pending = True
            warn_once(("foreign-end", self.slot.name, self.owner),
                      "policy-engine: the %s capture of role %r belongs to thread %r but "
                      "thread %r ended it; it ends at thread %r's next call into the "
                      "profiler (open and close a capture on one thread)", self.slot.name,
                      self.owner, self.home_name, threading.current_thread().name,
                      self.home_name)
            return
        if self.pid != os.getpid():
            return
        if self.pending:
            self.catch_up()  # what other threads' steps asked for, as far as it goes
        with self.slot.lock:
            if self.ended:
                return
            self.ended = True
            self.stopped_by = stopped_by
            if self.slot.capture is self:
                self.slot.capture = None
            self.busy = _get_ident()
            try:
                self._finish(status)
            finally:
                self.busy = 0

    def _finish(self, status: str) -> None:
        try:
            if self.recording and not self.dropped:
                cut_short = self.schedule is not None and self.action is not SAVE
                if cut_short and status == "complete":
                    self.reason = shortfall.check(self, recorded=True)
                self._save("partial" if status != "complete" or cut_short else "complete")
            else:
                if self.warming or self.recording:  # a dropped capture discards its recording
                    self.phase = "discard"
                    self._close_ranges()
                    self.warming = self.recording = False
                    self.session.discard()
                if not self.dropped and not self.saved and not self.traces and \
                        not self.exhausted:
                    if status == "complete":
                        self.reason = shortfall.check(self, recorded=False)
                    self._trace(None, "partial", error=self.reason or
                                "the capture ended before its schedule recorded a step")
        except Exception as err:
            with contextlib.suppress(OSError):
                if not isinstance(err, Recorded):
                    self._trace(None, "failed", error=f"{type(err).__name__}: {err}")
                self._close_record("failed", f"{type(err).__name__}: {err}")
            self.phase = "close"
            with contextlib.suppress(Exception):
                self.session.close()
            raise
        self.phase = "close"
        try:
            self.session.close()
        finally:
            self._close_record(status)

    def drop(self, why: str) -> None:
        """End without a trace, discarding what was recorded; the close line says ``why``
        (``reason``). For a whole-session capture that per-step captures replace."""
        self.dropped, self.reason = True, why
        self.end("complete")

    def _failed(self, error: BaseException) -> None:
        """A backend call failed: record it, release the backend as far as it lets us."""
        self.failure = (error, self.phase)
        self.ended = True
        if self.slot.capture is self:
            self.slot.capture = None
        self.recording = self.warming = False
        for call in (self.session.discard, self.session.close):
            # Already failing: the first error is the one reported.
            with contextlib.suppress(Exception):
                call()
        message = f"{type(error).__name__}: {error}"
        with contextlib.suppress(OSError):
            if not isinstance(error, Recorded):
                self._trace(None, "failed", error=message)
            self._close_record("failed", message)
        self.on_failure(error, self.phase)

    def terminate(self, why: str) -> None:
        """The process is ending (SIGTERM, exit): save what is recorded, marked partial.

        A home-only capture that belongs to another thread cannot be stopped here; its
        close line says so (status interrupted), and its thread may still end it.
        """
        if self.ended:
            return
        if self.busy == _get_ident():
            return  # a signal inside this capture's own transition: the caller handles it
        if not self.any_thread and _get_ident() != self.home:
            message = (f"{why} while the capture belonged to thread {self.home_name!r}: "
                       f"{self.slot.name} can stop a profiler only on its own thread")
            with contextlib.suppress(OSError):
                self._close_record("interrupted", message)
            self.end_requested = "partial"
            self.pending = True
            return
        try:
            self.end("partial", stopped_by=why)
        except Exception as err:  # the process is ending; report and go on
            log.warning("policy-engine: could not stop the %s capture of %r: %s",
                        self.slot.name, self.owner, err)
