"""A role's ``limits:`` in this process: capture cycles begun and bytes written.

The budget belongs to the role and the process, not to a profiler object: every
profiler of a role in one process (``apply_policy`` or ``profile_session`` called again)
draws from one :class:`Spend`, kept in :data:`~policy_engine.runtime.process.state.STATE`.

With background export a trace's bytes are known only once the export thread has written
it. So an export counts as *in flight* from the save that queued it until it is written,
and a cycle about to begin under ``limits.bytes`` first waits for the role's exports in
flight (at most :data:`EXPORT_WAIT` seconds): the budget is then passed by at most the
one trace under way, as in sync mode.

``limits.bytes`` counts what stays on disk: a trace removed once its summary is written
(``keep: summaries``, runtime.process.summaries) gives its bytes back, and a role that had
reached the limit may begin captures again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from policy_engine.language.values.triggers import Limits
from policy_engine.runtime.process.state import STATE

log = logging.getLogger("policy_engine")

#: How long a cycle about to begin waits for the role's exports still being written
#: before it counts them as spending the bytes budget.
EXPORT_WAIT = 60.0


class Spend:
    """What one role has spent in this process, shared by every profiler of the role."""

    __slots__ = ("bytes", "cond", "cycles", "freed", "in_flight", "noted")

    def __init__(self) -> None:
        self.cycles = 0
        self.bytes = 0
        self.freed = 0  # how many times bytes were given back (traces removed)
        self.in_flight = 0  # background exports queued or being written
        self.cond = threading.Condition(threading.Lock())
        self.noted: set[str] = set()  # limits already warned about and noted


def spend_of(role: str) -> Spend:
    """The role's spend in this process (a forked child starts its own)."""
    key = (os.getpid(), role)
    with STATE.lock:
        found = STATE.budgets.get(key)
        if not isinstance(found, Spend):  # none yet: the slot holds nothing else
            found = Spend()
            STATE.budgets[key] = found
        return found


class Budget:
    """A profiler's view of its role's ``limits``: its own limits, the role's spend."""

    def __init__(self, limits: Limits, note: Callable[..., None], role: str) -> None:
        self.limits = limits
        self.note = note
        self.role = role
        self.spend = spend_of(role)
        self.spent_why: str | None = None
        self.spent_at = 0  # spend.freed when the budget was found spent

    def captures_left(self) -> int | None:
        """Capture cycles the limits still allow (None: no limit on them)."""
        if self.limits.captures is None:
            return None
        return 0 if self.spent_why is not None else \
            max(0, self.limits.captures - self.spend.cycles)

    def room(self) -> bool:
        """Whether another capture cycle may begin (the first refusal warns and notes)."""
        if self.spent_why is not None and not self._given_back():
            return False
        why = self._spent()
        if why is None:
            return True
        self.spent_why, self.spent_at = why, self.spend.freed
        spend = self.spend
        with spend.cond:
            first = why not in spend.noted
            spend.noted.add(why)
        if first:
            log.warning("policy-engine: role %r reached %s: no new capture begins in this "
                        "process", self.role, why)
            self.note("limit", message=f"{why}: no new capture begins")
        return False

    def _given_back(self) -> bool:
        """Whether bytes came back since ``limits.bytes`` was found spent (traces removed
        after their summaries): then the budget is looked at again."""
        why = self.spent_why
        if why is None or not why.startswith("limits.bytes") or \
                self.spent_at == self.spend.freed:
            return False
        self.spent_why = None
        return True

    def _spent(self) -> str | None:
        limits, spend = self.limits, self.spend
        if limits.captures is not None and spend.cycles >= limits.captures:
            return f"limits.captures: {limits.captures} captures recorded"
        if limits.bytes is None:
            return None
        limit = limits.bytes
        with spend.cond:
            if spend.in_flight and spend.bytes < limit:
                # Their sizes decide whether another cycle fits: wait for them.
                spend.cond.wait_for(lambda: not spend.in_flight or spend.bytes >= limit,
                                    timeout=EXPORT_WAIT)
            if spend.bytes >= limit:
                return f"limits.bytes: {spend.bytes} bytes written (limit {limits.bytes_text})"
            if spend.in_flight:
                return (f"limits.bytes: {spend.bytes} bytes written and {spend.in_flight} "
                        f"trace(s) still being written after {EXPORT_WAIT:g} s (limit "
                        f"{limits.bytes_text})")
        return None

    def take(self) -> bool:
        """A capture cycle is about to begin: False when the budget is spent."""
        if not self.room():
            return False
        with self.spend.cond:
            self.spend.cycles += 1
        return True

    def give_back(self) -> None:
        """A cycle that began was dropped without a trace (the provisional whole-session
        capture of ``with profile_session(...)``, runtime.role.profiler): it spent nothing."""
        with self.spend.cond:
            self.spend.cycles = max(0, self.spend.cycles - 1)

    def wrote(self, size: int | None) -> None:
        """A file of ``size`` bytes was written (from any thread)."""
        if size:
            spend = self.spend
            with spend.cond:
                spend.bytes += size
                spend.cond.notify_all()

    def freed(self, size: int | None) -> None:
        """A file of ``size`` bytes that counted was removed (from any thread)."""
        if size:
            spend = self.spend
            with spend.cond:
                spend.bytes = max(0, spend.bytes - size)
                spend.freed += 1
                spend.cond.notify_all()

    def carry(self, job: Callable[[], None]) -> Callable[[], None]:
        """``job``, a background export of this role, counted in flight from now until
        it has run."""
        spend = self.spend
        with spend.cond:
            spend.in_flight += 1

        def run() -> None:
            try:
                job()
            finally:
                with spend.cond:
                    spend.in_flight -= 1
                    spend.cond.notify_all()
        return run
