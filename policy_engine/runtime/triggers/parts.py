"""The small parts of a role's triggers on the training thread
(:mod:`policy_engine.runtime.triggers.step_triggers`): a window of coming steps wanted, the
slow-step detector, and the throttle that keeps a flood of requests from writing a
warning and a manifest line each.
"""

from __future__ import annotations

import time
from collections import deque

from policy_engine.language.values.triggers import SlowStep

__all__ = ["FLOOD_ACCEPTED", "FLOOD_BURST", "FLOOD_SECONDS", "MAX_PENDING", "MEDIAN_EVERY",
           "Flood", "SlowSteps", "Want"]

#: Steps between two medians of the slow-step detector (a sort of ``window`` steps, a
#: few microseconds, spread over this many steps).
MEDIAN_EVERY = 64
#: Windows of requests a role keeps waiting for in one process, at most (a request past
#: it is refused); they count against ``limits.captures`` as they are accepted.
MAX_PENDING = 64
#: Notes (and warnings) of one kind written per ``FLOOD_SECONDS``, at most (``accepted``:
#: ``FLOOD_ACCEPTED``); the first one after a pause says how many were left out.
FLOOD_BURST = 8
FLOOD_ACCEPTED = 64
FLOOD_SECONDS = 60.0


class Want:
    """Coming steps ``first``..``last`` to capture, and why (never a list of steps)."""

    __slots__ = ("first", "last", "merged", "rid", "why")

    def __init__(self, first: int, last: int, why: str, rid: str | None,
                 merged: bool) -> None:
        self.first, self.last, self.why, self.rid, self.merged = first, last, why, rid, merged

    def captures(self) -> int:
        """Captures the window still takes: one merged, else one per step."""
        return 1 if self.merged else max(0, self.last - self.first + 1)


class SlowSteps:
    """``slow_step``'s detector: each step's time (start of one step to the start of the
    next) against ``factor`` x the median of the last ``window`` measured steps, taken
    once ``after`` steps are measured, then every :data:`MEDIAN_EVERY` steps. The training
    thread measures every step itself (:meth:`StepTriggers.at_step
    <policy_engine.runtime.triggers.step_triggers.StepTriggers.at_step>`: a subtraction, a
    comparison and an append, inline because it runs every step); this holds what it
    measures and takes the median."""

    __slots__ = ("last_start", "last_step", "left", "median", "next_median", "recent",
                 "spec", "threshold")

    def __init__(self, spec: SlowStep) -> None:
        self.spec = spec
        self.left = spec.max  # slow steps still reported
        self.last_start = 0.0  # when the step last seen began
        self.last_step = -2  # no step yet: the first one is never measured
        # the last ``window`` measured steps' times, or ``after`` while there are fewer
        self.recent: deque[float] = deque(maxlen=max(spec.window, spec.after))
        self.median = 0.0
        self.threshold = float("inf")  # factor x median; infinite until a median is taken
        self.next_median = 0  # the step at which to look at the median again

    def take_median(self, n: int) -> None:
        """At step ``n``: the median of the recent steps and the threshold it sets, once
        ``after`` steps are measured (until then, the step when they can be)."""
        spec = self.spec
        measured = len(self.recent)
        if measured < spec.after:
            self.next_median = n + spec.after - measured
            return
        ordered = sorted(list(self.recent)[-spec.window:])
        half = len(ordered) // 2
        self.median = ordered[half] if len(ordered) % 2 else \
            (ordered[half - 1] + ordered[half]) / 2
        self.threshold = spec.factor * self.median
        self.next_median = n + MEDIAN_EVERY


class Flood:
    """At most :data:`FLOOD_BURST` notes of each kind per :data:`FLOOD_SECONDS`
    (:data:`FLOOD_ACCEPTED` of ``accepted``)."""

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[float, int, int]] = {}  # since, admitted, left out

    def admit(self, kind: str) -> int | None:
        """None: leave this one out; else how many were left out before it."""
        now = time.monotonic()
        since, admitted, left_out = self.kinds.get(kind, (now, 0, 0))
        if now - since >= FLOOD_SECONDS:
            since, admitted = now, 0
        if admitted >= (FLOOD_ACCEPTED if kind == "accepted" else FLOOD_BURST):
            self.kinds[kind] = (since, admitted, left_out + 1)
            return None
        self.kinds[kind] = (since, admitted + 1, 0)
        return left_out
