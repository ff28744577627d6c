"""The inner-step schedule of a capture: ``torch.profiler.schedule`` without torch.

A capture advances one *inner step* per ``prof.step()`` call. :class:`Schedule` says what
the profiler does at each inner step, with the fields and semantics of
``torch.profiler.schedule`` exactly, so every backend (torch, mstx, nsight) records the
same steps a plain torch profiler would. The CLI uses it too, which is why this module
must not import torch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from policy_engine.errors import describe, is_int

__all__ = ["FIELDS", "Action", "Schedule", "ScheduleError"]


class Action(enum.Enum):
    """What the profiler does at one inner step (names as ``torch.profiler.ProfilerAction``)."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class ScheduleError(ValueError):
    """A schedule field is invalid; ``path`` names the field (``("active",)``), or ``()``."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def _check_count(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    # bool is an int subclass; `active: true` is surely a mistake, not 1.
    if not is_int(value):
        raise ScheduleError(
            f"schedule field '{attribute.name}' must be an integer, got {describe(value)}",
            (attribute.name,),
        )
    minimum = attribute.metadata["minimum"]
    if value < minimum:
        raise ScheduleError(
            f"schedule field '{attribute.name}' must be >= {minimum}, got {value}",
            (attribute.name,),
        )


def _count(default: int, minimum: int) -> Any:
    """A field of the schedule: an int of at least ``minimum`` (the schema reads both)."""
    return attrs.field(default=default, validator=_check_count, metadata={"minimum": minimum})


@attrs.frozen
class Schedule:
    """``torch.profiler.schedule(skip_first=, skip_first_wait=, wait=, warmup=, active=, repeat=)``.

    After ``skip_first`` steps, cycles of ``wait`` + ``warmup`` + ``active`` steps follow;
    the last active step of each cycle saves a trace. ``repeat`` bounds the number of
    cycles (0 = until the capture ends). A non-zero ``skip_first_wait`` drops the ``wait``
    phase of the first cycle only.
    """

    skip_first: int = _count(0, minimum=0)
    skip_first_wait: int = _count(0, minimum=0)
    wait: int = _count(0, minimum=0)
    warmup: int = _count(0, minimum=0)
    active: int = _count(1, minimum=1)
    repeat: int = _count(0, minimum=0)

    # Precomputed so that action() is a handful of integer comparisons on the hot path.
    _shift: int = attrs.field(init=False, repr=False, eq=False, hash=False)
    _period: int = attrs.field(init=False, repr=False, eq=False, hash=False)
    _record_from: int = attrs.field(init=False, repr=False, eq=False, hash=False)
    _limit: int = attrs.field(init=False, repr=False, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        period = self.wait + self.warmup + self.active
        # torch subtracts skip_first, then adds wait when skip_first_wait is set: shifting
        # the first cycle left by its wait phase. Later cycles keep their full wait.
        shift = -self.skip_first + (self.wait if self.skip_first_wait else 0)
        object.__setattr__(self, "_shift", shift)
        object.__setattr__(self, "_period", period)
        object.__setattr__(self, "_record_from", self.wait + self.warmup)
        # torch tests `step / num_steps >= repeat`; for integers that is
        # `step >= repeat * num_steps`, which needs no float division. 0 = unbounded.
        object.__setattr__(self, "_limit", self.repeat * period)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> Schedule:
        """A schedule from a policy's ``schedule:`` mapping, whose keys the schema checked;
        missing fields take their defaults. ``skip_first_wait`` may be a boolean."""
        values = dict(mapping)
        if isinstance(values.get("skip_first_wait"), bool):
            values["skip_first_wait"] = int(values["skip_first_wait"])
        return cls(**values)

    def to_json(self) -> dict[str, int]:
        """Every field, in ``torch.profiler.schedule`` keyword form."""
        return {name: getattr(self, name) for name in FIELDS}

    @property
    def period(self) -> int:
        """Steps in one full cycle: ``wait + warmup + active``."""
        return self._period

    @property
    def cycles(self) -> int | None:
        """Traces saved in an unbounded run: ``repeat``, or None when it repeats forever."""
        return self.repeat or None

    @property
    def steps_needed(self) -> int | None:
        """Inner steps needed to finish every cycle (the last one saves), None if unbounded."""
        if not self.repeat:
            return None
        return self._limit - self._shift

    def action(self, step: int) -> Action:
        """The action at inner step ``step`` (0-based), equal to torch's schedule function."""
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        if step < self.skip_first:
            return Action.NONE
        step += self._shift
        if self._limit and step >= self._limit:
            return Action.NONE
        phase = step % self._period
        if phase < self.wait:
            return Action.NONE
        if phase < self._record_from:
            return Action.WARMUP
        if phase < self._period - 1:
            return Action.RECORD
        return Action.RECORD_AND_SAVE

    def cycle(self, step: int) -> int | None:
        """0-based index of the repeat cycle ``step`` falls in (wait and warmup included).

        None for steps inside ``skip_first`` and after the last cycle.
        """
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        if step < self.skip_first:
            return None
        index = (step + self._shift) // self._period
        if self.repeat and index >= self.repeat:
            return None
        return index

    def next_change(self, step: int) -> int | None:
        """The first inner step after ``step`` whose action needs a backend call.

        ``step + 1`` when ``step`` records (every recorded step is one); else the first
        later step whose action differs from the action at ``step``; None when it never
        changes again (after the last cycle of a bounded ``repeat``). Constant time,
        however long the phases are.
        """
        action = self.action(step)
        if action in (Action.RECORD, Action.RECORD_AND_SAVE):
            return step + 1
        if action is Action.WARMUP:
            # Warm-up always runs into the active phase of the same cycle, and the repeat
            # limit falls on a cycle boundary, never inside it.
            return step + self._record_from - (step + self._shift) % self._period
        # NONE: the next step that is not NONE, i.e. the next warm-up or active phase.
        nxt = max(step + 1, self.skip_first)
        shifted = nxt + self._shift
        if self._limit and shifted >= self._limit:
            return None
        phase = shifted % self._period
        return nxt if phase >= self.wait else nxt + self.wait - phase

    def record_start(self, cycle: int) -> int:
        """The inner step at which cycle ``cycle`` (0-based) starts recording: its first
        active step. Constant time."""
        if cycle < 0:
            raise ValueError(f"cycle must be non-negative, got {cycle}")
        return cycle * self._period + self._record_from - self._shift

    def recorded_cycles(self, steps: int) -> int:
        """How many cycles record at least one of the inner steps ``0 .. steps - 1``.

        Constant time: the capture ranges a capture of ``steps`` inner steps opens.
        """
        if steps <= self.skip_first:
            return 0
        shifted = steps - 1 + self._shift  # the last step, on the cycles' clock
        if self._limit:
            shifted = min(shifted, self._limit - 1)
        # Cycle 0 begins at `wait` or 0 on that clock, never after its warm-up, so every
        # cycle before the last step's records in full; the last step's cycle records
        # once its active phase is reached.
        cycle, phase = divmod(shifted, self._period)
        return cycle + (1 if phase >= self._record_from else 0)

    def actions(self, n: int) -> tuple[Action, ...]:
        """The actions of the first ``n`` inner steps."""
        return tuple(self.action(step) for step in range(n))


#: The schedule's fields, in ``torch.profiler.schedule``'s order.
FIELDS: tuple[str, ...] = tuple(field.name for field in attrs.fields(Schedule) if field.init)
