"""What a change of schedule action does: the one table
:class:`~policy_engine.runtime.capture.Capture` runs its backend calls from, and the
capture's position in its schedule (:class:`Cursor`)."""

from __future__ import annotations

import itertools

from policy_engine.language.values.schedule import Action, Schedule
from policy_engine.runtime.budget import Budget

NONE, WARMUP, RECORD, SAVE = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE

# What a change of action does, in order: torch.profiler's action_map, for the engine's
# backend calls. ``None`` is "the capture just opened". A change that crosses into another
# schedule cycle first ends the old cycle (old -> NONE), then runs NONE -> new.
class Op:
    """The names of the operations the table lists: each is one method of the capture."""

    PREPARE, START, STEP = "prepare", "start", "step"
    SAVE_DONE, SAVE_CUT, DISCARD = "save_complete", "save_partial", "discard"


PREPARE, START, STEP = Op.PREPARE, Op.START, Op.STEP
SAVE_DONE, SAVE_CUT, DISCARD = Op.SAVE_DONE, Op.SAVE_CUT, Op.DISCARD
BEGIN = (START, STEP)
TABLE: dict[tuple[Action | None, Action], tuple[str, ...]] = {
    (None, NONE): (), (None, WARMUP): (PREPARE,), (None, RECORD): BEGIN, (None, SAVE): BEGIN,
    (NONE, NONE): (), (NONE, WARMUP): (PREPARE,), (NONE, RECORD): BEGIN, (NONE, SAVE): BEGIN,
    (WARMUP, NONE): (DISCARD,), (WARMUP, WARMUP): (),
    (WARMUP, RECORD): BEGIN, (WARMUP, SAVE): BEGIN,
    (RECORD, NONE): (SAVE_CUT,), (RECORD, WARMUP): (SAVE_CUT, PREPARE),
    (RECORD, RECORD): (STEP,), (RECORD, SAVE): (STEP,),
    (SAVE, NONE): (SAVE_DONE,), (SAVE, WARMUP): (SAVE_DONE, PREPARE),
    (SAVE, RECORD): (SAVE_DONE, *BEGIN), (SAVE, SAVE): (SAVE_DONE, *BEGIN),
}


def starts_recording(old: Action | None, new: Action) -> bool:
    """Whether going from ``old`` to ``new`` starts recording a cycle: one trace."""
    return START in TABLE[(old, new)]


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

    def admit(self, old: Action | None, new: Action) -> Action:
        """``new``, or NONE when it starts a cycle the budget refuses (then for good)."""
        if self.budget is not None and new is not NONE and starts_recording(old, new) and \
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
