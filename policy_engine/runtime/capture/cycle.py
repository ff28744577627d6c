"""The cycle a capture is warming up or recording: its number, time, name and steps.

One :class:`Cycle` per capture, changed only through its methods, which the capture's
transitions call under the slot's lock. ``recording`` is read without the lock by the
wrapped region methods (runtime.role.wrapping): a plain attribute, one read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from policy_engine.files.records import covered_steps
from policy_engine.runtime.capture.lines import timestamp

Namer = Callable[..., str]  # name(cycle=, timestamp=, at=): a cycle's file stem


class Cycle:
    """The cycle under way. ``step_per_cycle`` (Plan.step_per_cycle): ``<step>`` in its
    name is the outer step in which its first recorded inner step ends, so the name is
    provisional until then (``unnamed``), and its trace lines list the outer steps from
    that one on (``first``)."""

    __slots__ = ("first", "inner_steps", "number", "recording", "saved", "stamp", "started",
                 "stem", "step_per_cycle", "unnamed", "warming")

    def __init__(self, step_per_cycle: bool) -> None:
        self.step_per_cycle = step_per_cycle
        self.number: int | None = None  # the schedule cycle it belongs to
        self.started = time.time()
        self.stamp = ""
        self.stem = ""
        self.first = 0  # index in the capture's outer steps of the cycle's first one
        self.unnamed = False
        self.warming = False
        self.recording = False
        self.inner_steps: list[int] = []
        self.saved = 0  # cycles saved, their files written or queued

    def begin(self, number: int | None, name: Namer, steps: list[int]) -> str | None:
        """A cycle starts (warm-up or recording): fix its number, time and name. Returns
        the stem to give a backend that names its outputs at start (None: not yet)."""
        self.number = number
        self.started = time.time()
        self.stamp = timestamp()
        per_cycle = self.step_per_cycle  # then a provisional name until named()
        self.stem = name(cycle=number, timestamp=self.stamp,
                         at=steps[-1] if per_cycle else None)
        return None if per_cycle else self.stem

    def name_at(self, name: Namer, steps: list[int]) -> str:
        """The cycle's first recorded inner step ended in the current outer step: that
        step is its ``<step>``. Returns the final stem."""
        self.unnamed = False
        self.first = len(steps) - 1
        self.stem = name(cycle=self.number, timestamp=self.stamp, at=steps[-1])
        return self.stem

    def warm(self) -> None:
        self.warming = True

    def record(self) -> None:
        """Recording starts: no inner step recorded yet."""
        self.unnamed = self.step_per_cycle
        self.warming = False
        self.recording = True
        self.inner_steps = []

    def stepped(self, inner: int) -> None:
        """Inner step ``inner`` was recorded."""
        self.inner_steps.append(inner)

    def stop(self) -> None:
        """Neither warming nor recording any more (saved, discarded or failed)."""
        self.warming = self.recording = False

    def saving(self) -> int:
        """A save starts: recording stops; the cycle number to save under."""
        self.recording = False
        self.saved += 1
        return 0 if self.number is None else self.number

    def fields(self, steps: list[int], joined: list[str]) -> dict[str, Any]:
        """What a trace line says of this cycle, as it is now (a background export writes
        its lines later, from this snapshot)."""
        return {"cycle": 0 if self.number is None else self.number,
                "inner_steps": list(self.inner_steps), "start": self.started,
                **covered_steps(steps[self.first:]), "joined": list(joined)}
