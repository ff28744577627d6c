"""The small parts of a role's triggers (:mod:`policy_engine.runtime.triggers`): a window
of coming steps wanted, the slow-step detector, and the throttle that keeps a flood of
requests from writing a warning and a manifest line each.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from policy_engine.language.values.triggers import SlowStep

__all__ = ["FLOOD_ACCEPTED", "FLOOD_BURST", "FLOOD_SECONDS", "MAX_PENDING", "Flood",
           "SlowSteps", "Want"]

_REFRESH = 8  # measured steps between two medians
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
    """``slow_step``: each step's time (start of one step to the start of the next) against
    ``factor`` x the median of recent steps."""

    def __init__(self, spec: SlowStep) -> None:
        self.spec = spec
        self.left = spec.max
        self.last_start = 0.0
        self.last_step = -2  # no step yet: the first one is never measured
        self.measured = 0
        self.recent: deque[float] = deque(maxlen=spec.window)
        # factor x the median of ``recent``, refreshed every few measured steps (infinite
        # until ``after`` steps are measured): a step costs a comparison, not a sort
        self.median = 0.0
        self.threshold = float("inf")

    def measure(self, n: int, now: float, captured: bool) -> float | None:
        """Step n-1's time when it was slow (None otherwise); ``now`` is step n's start."""
        slow = None
        if self.left and n == self.last_step + 1 and not captured:
            took = now - self.last_start  # one training step's time, not a profiled one
            if took > self.threshold:
                self.left -= 1
                slow = took
            self.recent.append(took)
            self.measured += 1
            if (self.measured % _REFRESH == 0 or self.measured == self.spec.after) and \
                    self.measured >= self.spec.after:
                self.median = statistics.median(self.recent)
                self.threshold = self.spec.factor * self.median
        self.last_start, self.last_step = now, n
        return slow


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
