"""The fake scheduler: ProfilerAction and a Schedule with torch_npu's positional order."""

from __future__ import annotations

import enum

__all__ = ["ProfilerAction", "Schedule"]


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class Schedule:
    """Same cycle rule as torch.profiler.schedule; note ``active`` comes second here."""

    def __init__(
        self,
        wait: int,
        active: int,
        warmup: int = 0,
        repeat: int = 0,
        skip_first: int = 0,
        skip_first_wait: int = 0,
    ) -> None:
        self.wait, self.active, self.warmup = wait, active, warmup
        self.repeat, self.skip_first, self.skip_first_wait = repeat, skip_first, skip_first_wait

    def __call__(self, step: int) -> ProfilerAction:
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait:
            step += self.wait
        period = self.wait + self.warmup + self.active
        if self.repeat and step >= self.repeat * period:
            return ProfilerAction.NONE
        phase = step % period
        if phase < self.wait:
            return ProfilerAction.NONE
        if phase < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        if phase < period - 1:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE
