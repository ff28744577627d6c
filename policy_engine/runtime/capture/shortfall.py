"""Why a capture recorded less than its schedule plans, in words a user can act on.

A schedule counts ``prof.step()`` calls. A capture that ends before its schedule reaches
a recorded inner step writes nothing, and one that ends mid-cycle saves a partial trace;
both are legal, and both usually mean that the code makes fewer ``prof.step()`` calls per
capture than the schedule assumes (a framework callback makes one per optimizer step).
The capture says so once at run time and on its manifest ``close`` line (``reason``).
"""

from __future__ import annotations

from collections.abc import Sequence

from policy_engine.language.values.schedule import FIELDS, Schedule
from policy_engine.runtime.process.state import warn_once


def schedule_text(schedule: Schedule) -> str:
    """``{warmup: 1, active: 2}``: the fields that differ from torch's defaults, in the
    policy's own spelling."""
    defaults = Schedule()
    shown = [f"{name}: {getattr(schedule, name)}" for name in FIELDS
             if name == "active" or getattr(schedule, name) != getattr(defaults, name)]
    return "{" + ", ".join(shown) + "}"


def capture_text(steps: Sequence[int], region: str | None) -> str:
    """``capture of step 3``, ``capture of steps 3-5``, ``whole-session capture``,
    ``capture of region update`` (a discrete region's call outside training steps)."""
    if not steps:
        return "whole-session capture" if region is None else f"capture of region {region}"
    if len(steps) == 1:
        what = f"capture of step {steps[0]}"
    else:
        what = f"capture of steps {steps[0]}-{steps[-1]}"
    return what if region is None else f"{what} (region {region})"


def _ended(seen: int) -> str:
    calls = "1 prof.step() call" if seen == 1 else f"{seen} prof.step() calls"
    return f"ended at inner step {seen} (after {calls})"


def nothing_recorded(schedule: Schedule, seen: int, steps: Sequence[int],
                     region: str | None) -> str:
    """The capture ended after ``seen`` ``prof.step()`` calls, before its schedule's
    first recorded inner step."""
    return (f"{capture_text(steps, region)} {_ended(seen)}; schedule "
            f"{schedule_text(schedule)} records from inner step {schedule.record_start(0)}: "
            "nothing recorded")


def cut_short(schedule: Schedule, seen: int, cycle: int | None, recorded: int,
              steps: Sequence[int], region: str | None) -> str:
    """The capture ended after ``seen`` ``prof.step()`` calls in the middle of ``cycle``,
    having recorded ``recorded`` of its active inner steps."""
    start = schedule.record_start(cycle or 0)
    span = f"{start}" if schedule.active == 1 else f"{start}-{start + schedule.active - 1}"
    return (f"{capture_text(steps, region)} {_ended(seen)}, in cycle "
            f"{cycle or 0} of schedule {schedule_text(schedule)}, which records inner steps "
            f"{span}: saved partial with {recorded} of {schedule.active} active steps")


def check(schedule: Schedule, *, seen: int, owner: str, region: str | None,
          steps: Sequence[int], cycle: int | None, recorded: int | None) -> str | None:
    """At the end of a capture of role ``owner`` (which ended normally, not from an
    exception or a signal) after ``seen`` ``prof.step()`` calls: why its schedule recorded
    nothing (``recorded`` None) or cut cycle ``cycle`` short after ``recorded`` active
    inner steps. Warns once per role and region per process; the capture puts the text on
    its close line (``reason``)."""
    if recorded is not None:
        text = cut_short(schedule, seen, cycle, recorded, steps, region)
    else:
        text = nothing_recorded(schedule, seen, steps, region)
    warn_once(("shortfall", owner, region, recorded is not None),
              "policy-engine: role %r: %s; %s (said once per process; each capture's manifest "
              "close line says it as `reason`)", owner, text, ADVICE)
    return text


ADVICE = ("make as many prof.step() calls per capture as the schedule counts (a framework "
          "callback makes one per optimizer step), merge steps (merge_steps: true), or drop "
          "the schedule to record each capture whole")
