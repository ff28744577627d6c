"""One capture: a backend session driven through the schedule's actions, on one thread.

The schedule decides the action at every inner step; the backend is called only when the
action changes, through one table (:meth:`Capture.transitions`, beside the methods it
lists) of ``(previous, current) -> the capture's bound methods``, torch.profiler's
``action_map``. Between changes ``step()`` is an increment and a comparison:
``cursor.quiet_until`` is the next inner step that needs any work.

It is built from parts, each changed only by its own methods: ``cursor`` (where it is in
the schedule, :class:`Cursor`), ``cycle`` (the cycle under way, capture.cycle), ``span``
(its outer steps and roles, :class:`Span`), ``home`` (its thread, capture.home),
``regions`` (capture.ranges), ``lines`` (its manifest lines, capture.lines) and
``outcome`` (how it ended).

Threads (docs/runtime.md): a capture lives on the thread that opened it, its *home*, where
every call of a session that is not ``any_thread`` runs (kineto crashes otherwise). A
``step()`` elsewhere is counted and leaves its transition *pending* for the home thread's
next call; an ``any_thread`` session (Nsight) is driven wherever the step lands.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable

from policy_engine.backends.base import Session
from policy_engine.files.records import Status
from policy_engine.language.values.schedule import Action, Schedule
from policy_engine.runtime.capture import shortfall
from policy_engine.runtime.capture.collective_notes import CollectiveNotes
from policy_engine.runtime.capture.cycle import Cycle, Namer
from policy_engine.runtime.capture.home import Home
from policy_engine.runtime.capture.lines import Lines, Recorded, timestamp
from policy_engine.runtime.capture.ranges import Regions
from policy_engine.runtime.process.budget import Budget
from policy_engine.runtime.process.state import Slot, warn_once

log = logging.getLogger("policy_engine")

NONE, WARMUP, RECORD, SAVE = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE
#: A change of action (``None`` before: the capture just opened) and what it calls, in order.
Transitions = dict[tuple[Action | None, Action], tuple[Callable[[], None], ...]]

_NEVER = 1 << 62


class Cursor:
    """Where a capture is in its schedule. Advanced under the slot's lock by the capture
    alone; ``next(ticks)`` numbers inner steps from any thread (atomic on a count), and
    ``quiet_until`` is the next inner step that needs any work."""

    __slots__ = ("action", "budget", "exhausted", "inner", "quiet_until", "schedule", "ticks")

    def __init__(self, schedule: Schedule | None, budget: Budget | None) -> None:
        self.schedule = schedule
        self.budget = budget  # the owner's limits: each cycle that records takes from it
        self.ticks = itertools.count(1)
        self.inner = 0  # the last inner step acted on
        self.quiet_until = 0
        self.action: Action | None = None  # None: the capture just opened
        self.exhausted = False  # the budget refused a cycle: the schedule is over

    def reach(self, n: int) -> int:
        """The capture acts at inner step ``n`` now (a step that needs work)."""
        self.inner = n
        return n

    def action_at(self, step: int) -> Action:
        if self.exhausted:
            return NONE
        return RECORD if self.schedule is None else self.schedule.action(step)

    def cycle_of(self, step: int) -> int | None:
        """The schedule cycle inner step ``step`` falls in (None without a schedule)."""
        return None if self.schedule is None else self.schedule.cycle(step)

    def crosses(self, n: int, cycle: int | None) -> bool:
        """Whether reaching inner step ``n`` leaves ``cycle``, which the current action
        belongs to: the cycle ended between two calls."""
        return self.action in (WARMUP, RECORD, SAVE) and self.schedule is not None and \
            self.schedule.cycle(n) != cycle

    def admit(self, new: Action, starts: bool) -> Action:
        """``new``, or NONE when it ``starts`` a cycle (one trace) that the budget refuses
        (then for good)."""
        if self.budget is not None and new is not NONE and starts and \
                not self.budget.take():
            self.exhausted = True
            return NONE
        return new

    def arrive(self, n: int, action: Action) -> None:
        """The capture is at inner step ``n`` with ``action``: when it next needs work."""
        self.action = action
        if self.exhausted:
            self.quiet_until = _NEVER
        elif action is RECORD or action is SAVE or self.schedule is None:
            self.quiet_until = n + 1
        else:
            found = self.schedule.next_change(n)
            self.quiet_until = _NEVER if found is None else found

    def seen(self) -> int:
        """The ``prof.step()`` calls so far (the capture is ending: the count is spent)."""
        return next(self.ticks) - 1


class Span:
    """The outer steps and roles of one capture."""

    __slots__ = ("joined", "last_step", "owner", "steps")

    def __init__(self, owner: str, steps: list[int], last_step: int | None) -> None:
        self.owner = owner
        self.steps = steps
        self.last_step = last_step  # the last outer step this capture may cover (merged)
        self.joined: list[str] = []  # other roles whose steps ran inside it

    def add_step(self, n: int) -> None:
        """A merged capture goes on into outer step ``n``."""
        self.steps.append(n)

    def join(self, role: str) -> bool:
        """``role`` runs inside this capture; False when it owns it or joined already."""
        if role == self.owner or role in self.joined:
            return False
        self.joined.append(role)
        return True

    def goes_on_into(self, n: int) -> bool:
        """Whether outer step ``n`` continues this capture (merged steps)."""
        return self.steps[-1] == n - 1 and (self.last_step is None or n <= self.last_step)


class Outcome:
    """How a capture ended, or why it is ending; set by the capture alone."""

    __slots__ = ("dropped", "ended", "failure", "phase", "reason", "stopped_by")

    def __init__(self) -> None:
        self.phase = "open"  # the backend call under way, for failure messages
        self.ended = False
        self.dropped = False  # drop(): ends without a trace
        self.reason: str | None = None  # why it recorded less than planned (close line)
        self.stopped_by: str | None = None  # SIGTERM or exit ended it (close line)
        self.failure: tuple[BaseException, str] | None = None  # a backend call failed


class Capture:
    """A capture in progress. Opened and ended by its owner role, advanced by any step()."""

    __slots__ = ("cursor", "cycle", "home", "lines", "name", "notes", "on_failure",
                 "outcome", "regions", "session", "slot", "span", "transitions")

    def __init__(self, *, slot: Slot[Capture], session: Session, schedule: Schedule | None,
                 owner: str, lines: Lines, name: Namer, last_step: int | None,
                 on_failure: Callable[[BaseException, str], None],
                 step_per_cycle: bool = False, budget: Budget | None = None) -> None:
        self.slot = slot
        self.session = session
        self.name = name
        self.on_failure = on_failure
        self.span = Span(owner, list(lines.record["steps"]), last_step)
        self.cursor = Cursor(schedule, budget)
        self.cycle = Cycle(step_per_cycle)
        self.home = Home(session.any_thread)
        self.regions = Regions(slot.name, slot.lock, session, self.home, self.cycle,
                               self.catch_up)
        self.outcome = Outcome()
        self.notes = CollectiveNotes(slot.name == "torch")  # the trace's collectives
        self.lines = lines  # opened by its owner, before the session was
        lines.follow(lambda: self.cycle.fields(self.span.steps, self.span.joined))
        self.transitions = self._transitions()
        # for backends that write outside transitions (OOM dumps)
        session.set_reporter(self.lines.report, self._current_name)

    def _transitions(self) -> Transitions:
        """What each change of action calls, in order: torch.profiler's ``action_map``, for
        this capture's backend calls. A change that crosses into another schedule cycle
        first ends the old cycle (old -> NONE), then runs NONE -> new."""
        prepare, start, step, discard = self._prepare, self._start, self._step, self._discard
        done, cut = self._save_complete, self._save_partial
        begin = (start, step)
        return {
            (None, NONE): (), (None, WARMUP): (prepare,),
            (None, RECORD): begin, (None, SAVE): begin,
            (NONE, NONE): (), (NONE, WARMUP): (prepare,),
            (NONE, RECORD): begin, (NONE, SAVE): begin,
            (WARMUP, NONE): (discard,), (WARMUP, WARMUP): (),
            (WARMUP, RECORD): begin, (WARMUP, SAVE): begin,
            (RECORD, NONE): (cut,), (RECORD, WARMUP): (cut, prepare),
            (RECORD, RECORD): (step,), (RECORD, SAVE): (step,),
            (SAVE, NONE): (done,), (SAVE, WARMUP): (done, prepare),
            (SAVE, RECORD): (done, *begin), (SAVE, SAVE): (done, *begin),
        }

    def starts_recording(self, old: Action | None, new: Action) -> bool:
        """Whether going from ``old`` to ``new`` starts recording a cycle: one trace."""
        return self._start in self.transitions[(old, new)]

    # -- the schedule -------------------------------------------------------------
    def begin(self) -> bool:
        """Apply inner step 0's action. True when the backend failed."""
        with self.slot.lock:
            return self._move(0)

    # One inner step, from any thread, is ``n = next(capture.cursor.ticks)`` and, when
    # ``n >= cursor.quiet_until``, ``capture.advance(n)``: RoleProfiler.step inlines the
    # quiet path. next() on a count is atomic, so steps from several threads are never lost.

    def advance(self, n: int) -> bool:
        """Inner step ``n`` needs work. True when the backend failed in this call."""
        home = self.home
        if not home.may_call():
            home.defer(n, self.slot.name, self.span.owner)
            return False
        with self.slot.lock:
            if self.slot.capture is not self or n <= self.cursor.inner:
                return False
            failed = self._move(self.cursor.reach(home.take(n)))
        if home.end_requested is not None and not failed:
            self.end(home.end_requested)
        return failed

    def catch_up(self) -> bool:
        """On the home thread: apply what other threads left pending. True on failure."""
        if not self.home.pending or not self.home.on_home_thread():
            return False
        return self.advance(self.home.wanted)

    def _move(self, n: int) -> bool:
        """Go to inner step ``n``'s action, calling the backend as the table says.

        Runs under the slot's lock. A backend failure ends the capture as failed and
        returns True; the owner was told through ``on_failure``.
        """
        cursor = self.cursor
        new = cursor.action_at(n)
        old = cursor.action
        self.home.enter()
        try:
            if self.cycle.unnamed:
                self._name_cycle()
            if cursor.crosses(n, self.cycle.number):
                self._run(old, NONE)  # the cycle ended between two calls
                old = NONE
            new = cursor.admit(new, self.starts_recording(old, new))  # limits: no new cycle
            self._run(old, new)
        except Exception as err:
            self.home.leave()
            self._failed(err)
            return True
        finally:
            self.home.leave()
        cursor.arrive(n, new)
        return False

    def _run(self, old: Action | None, new: Action) -> None:
        for call in self.transitions[(old, new)]:
            call()

    # -- the backend calls the table lists ---------------------------------------------
    def _prepare(self) -> None:
        self.outcome.phase = "prepare"
        self._begin_cycle()
        self.session.prepare()
        self.cycle.warm()

    def _start(self) -> None:
        self.outcome.phase = "start"
        if not self.cycle.warming:
            self._begin_cycle()
        self.session.start()
        self.notes.start()
        self.cycle.record()
        self.regions.open_all()

    def _step(self) -> None:
        self.outcome.phase = "step"
        self.session.step(self.cursor.inner)
        self.cycle.stepped(self.cursor.inner)

    def _save_complete(self) -> None:
        self._save(Status.COMPLETE)

    def _save_partial(self) -> None:
        self._save(Status.PARTIAL)

    def _discard(self) -> None:
        self.outcome.phase = "discard"
        self.cycle.stop()
        self.session.discard()

    def _begin_cycle(self) -> None:
        """A cycle starts (warm-up or recording): fix its schedule cycle, time and name."""
        stem = self.cycle.begin(self.cursor.cycle_of(self.cursor.inner), self.name,
                                self.span.steps)
        if stem is not None:  # for backends naming outputs at start
            self.session.set_stem(stem)

    def _name_cycle(self) -> None:
        """The cycle's first recorded inner step ended (a step() or the end of the capture)
        in the current outer step: that step is the cycle's ``<step>``."""
        stem = self.cycle.name_at(self.name, self.span.steps)
        self.session.set_stem(stem)  # torch_npu renames its folder at save when it differs

    def _current_name(self) -> str:
        """The name of the cycle under way, or of the one the capture is at."""
        if self.cycle.stem:
            return self.cycle.stem
        return self.name(cycle=self.cursor.cycle_of(self.cursor.inner), timestamp=timestamp())

    def _save(self, status: Status) -> None:
        if self.cycle.unnamed:
            self._name_cycle()
        self.outcome.phase = "save"
        self.regions.close_all()
        number = self.cycle.saving()
        # for backends that label their own traces (torch metadata)
        self.session.note({"roles": list(self.lines.record.get("roles") or ()),
                           "capture": self.lines.id, "joined": list(self.span.joined),
                           "inner_steps": list(self.cycle.inner_steps),
                           "region_ranges": list(self.regions.marked),
                           **self.notes.facts()})
        if self.lines.exporter and self.session.saves_later:
            # the backend stops here, on this thread; the rest waits
            self.lines.export(self.session.save_later(self.cycle.stem, number), status)
            return
        failed = self.lines.record_artifacts(self.session.save(self.cycle.stem, number),
                                             status)
        if failed is not None:  # recorded; the capture fails as a whole
            raise Recorded(failed)

    # -- ending -------------------------------------------------------------------
    def add_step(self, n: int) -> None:
        """A merged capture goes on into outer step ``n``."""
        self.span.add_step(n)

    def end(self, status: Status = Status.COMPLETE, stopped_by: str | None = None) -> None:
        """Stop the capture: save a cycle that is recording, discard a warm-up.

        On a home-only session from another thread, the end is left to the home thread.
        Every capture leaves manifest lines: one that never reached a recorded step says
        so (status partial, no file); one whose save fails is recorded as failed.
        Raises what the backend raised (the owner decides: warn or raise).
        ``stopped_by``: what ended it from outside (SIGTERM, exit), for its close line.
        All under the slot's lock, which a SIGTERM handler waits for (runtime.process.signals).
        """
        home = self.home
        if not home.may_call():
            home.ask_end(status)
            warn_once(("foreign-end", self.slot.name, self.span.owner),
                      "policy-engine: the %s capture of role %r belongs to thread %r but "
                      "thread %r ended it; it ends at thread %r's next call into the "
                      "profiler (open and close a capture on one thread)", self.slot.name,
                      self.span.owner, home.name, threading.current_thread().name,
                      home.name)
            return
        if home.forked():
            return  # a forked child never drives its parent's capture
        if home.pending:
            self.catch_up()  # what other threads' steps asked for, as far as it goes
        with self.slot.lock:
            if self.outcome.ended:
                return
            self.outcome.ended = True
            self.outcome.stopped_by = stopped_by
            self.slot.release(self)
            home.enter()
            try:
                self._finish(status)
            finally:
                home.leave()

    def _finish(self, status: Status) -> None:
        outcome, cycle, session = self.outcome, self.cycle, self.session
        try:
            if cycle.recording and not outcome.dropped:
                cut_short = self.cursor.schedule is not None and self.cursor.action is not SAVE
                if cut_short and status is Status.COMPLETE:
                    outcome.reason = self._shortfall(recorded=True)
                whole = status is Status.COMPLETE and not cut_short
                self._save(Status.COMPLETE if whole else Status.PARTIAL)
            else:
                if cycle.warming or cycle.recording:  # a dropped capture discards its recording
                    outcome.phase = "discard"
                    self.regions.close_all()
                    cycle.stop()
                    session.discard()
                if not outcome.dropped and not cycle.saved and not self.lines.traces and \
                        not self.cursor.exhausted:
                    if status is Status.COMPLETE:
                        outcome.reason = self._shortfall(recorded=False)
                    self.lines.trace(None, Status.PARTIAL, error=outcome.reason or
                                     "the capture ended before its schedule recorded a step")
        except Exception as err:
            with contextlib.suppress(OSError):
                if not isinstance(err, Recorded):
                    self.lines.trace(None, Status.FAILED, error=f"{type(err).__name__}: {err}")
                self._close_line(Status.FAILED, f"{type(err).__name__}: {err}")
            outcome.phase = "close"
            with contextlib.suppress(Exception):
                session.close()
            raise
        outcome.phase = "close"
        try:
            session.close()
        finally:
            self._close_line(status)

    def _shortfall(self, *, recorded: bool) -> str | None:
        cursor, cycle = self.cursor, self.cycle
        if cursor.schedule is None:
            return None  # no schedule records every capture whole
        return shortfall.check(cursor.schedule, seen=cursor.seen(), owner=self.span.owner,
                               region=self.lines.record.get("region"), steps=self.span.steps,
                               cycle=cycle.number if recorded else None,
                               recorded=len(cycle.inner_steps) if recorded else None)

    def _close_line(self, status: Status, error: str | None = None) -> None:
        outcome = self.outcome
        self.lines.close(status, error, steps=self.span.steps, joined=self.span.joined,
                         waits=self.home.waits, stopped_by=outcome.stopped_by,
                         limited=self.cursor.exhausted, reason=outcome.reason)

    def drop(self, why: str) -> None:
        """End without a trace, discarding what was recorded; the close line says ``why``
        (``reason``). For a whole-session capture that per-step captures replace."""
        self.outcome.dropped, self.outcome.reason = True, why
        self.end(Status.COMPLETE)

    def _failed(self, error: BaseException) -> None:
        """A backend call failed: record it, release the backend as far as it lets us."""
        outcome = self.outcome
        outcome.failure = (error, outcome.phase)
        outcome.ended = True
        self.slot.release(self)
        self.cycle.stop()
        for call in (self.session.discard, self.session.close):
            # Already failing: the first error is the one reported.
            with contextlib.suppress(Exception):
                call()
        message = f"{type(error).__name__}: {error}"
        with contextlib.suppress(OSError):
            if not isinstance(error, Recorded):
                self.lines.trace(None, Status.FAILED, error=message)
            self._close_line(Status.FAILED, message)
        self.on_failure(error, outcome.phase)

    def terminate(self, why: str) -> None:
        """The process is ending (SIGTERM, exit): save what is recorded, marked partial.

        A home-only capture that belongs to another thread cannot be stopped here; its
        close line says so (status interrupted), and its thread may still end it.
        """
        home = self.home
        if self.outcome.ended:
            return
        if home.inside():
            return  # a signal inside this capture's own transition: the caller handles it
        if not home.may_call():
            message = (f"{why} while the capture belonged to thread {home.name!r}: "
                       f"{self.slot.name} can stop a profiler only on its own thread")
            with contextlib.suppress(OSError):
                self._close_line(Status.INTERRUPTED, message)
            home.ask_end(Status.PARTIAL)
            return
        try:
            self.end(Status.PARTIAL, stopped_by=why)
        except Exception as err:  # the process is ending; report and go on
            log.warning("policy-engine: could not stop the %s capture of %r: %s",
                        self.slot.name, self.span.owner, err)

    def cut_short(self, why: str) -> bool:
        """Save what the capture recorded now, partial (a stall: its training thread is
        stuck). Only on its home thread, outside its own transitions; False when that is
        not this thread (the capture stays open). Raises what the backend raised."""
        home = self.home
        if self.outcome.ended or home.inside() or not home.on_home_thread():
            return False
        self.end(Status.PARTIAL, stopped_by=why)
        return True

    def abandon(self, why: str) -> None:
        """Another thread is stuck inside the capture's transition (a SIGTERM waited for
        it long enough): its close line says so."""
        if self.outcome.ended:
            return
        thread = self.home.stuck_in()
        name = next((t.name for t in threading.enumerate() if t.ident == thread), thread)
        with contextlib.suppress(OSError):
            self._close_line(Status.INTERRUPTED, f"{why} while thread {name!r} was still in the "
                                            f"capture's {self.outcome.phase} step")

