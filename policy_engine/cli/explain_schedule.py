"""What ``explain --inner-steps N`` warns of: captures whose schedule N ``prof.step()``
calls cut short, in the words the run itself uses (:mod:`policy_engine.runtime.capture.shortfall`).

A capture that makes ``seen`` calls ends at inner step ``seen``: it saves a partial trace
when that step records without saving, and writes nothing when no step up to it records.
A capture the window (``--steps``) ends before its own last step is not judged.
"""

from __future__ import annotations

from collections.abc import Iterator

from policy_engine.language.model import Policy
from policy_engine.language.values.schedule import Action, Schedule
from policy_engine.plan.captures import opened
from policy_engine.plan.compile import region_plans
from policy_engine.plan.plan import Plan
from policy_engine.runtime.capture.shortfall import cut_short, nothing_recorded


def shortfall(schedule: Schedule, seen: int, steps: tuple[int, ...],
              region: str | None) -> str | None:
    """Why a capture over ``steps`` that makes ``seen`` calls records less than its
    schedule plans; None when it records every cycle it reaches."""
    if schedule.action(seen) is Action.RECORD:
        cycle = schedule.cycle(seen) or 0
        recorded = seen - schedule.record_start(cycle) + 1
        return cut_short(schedule, seen, cycle, recorded, steps, region)
    if schedule.recorded_cycles(seen + 1) == 0:
        return nothing_recorded(schedule, seen, steps, region)
    return None


def _found(policy: Policy, role: str, world: int, lo: int, hi: int,
           inner: int) -> Iterator[str]:
    spec = policy.role(role)
    plan = Plan.off(spec, 0, world)  # captures and schedules are the role's, not a rank's
    regions = [r for r in region_plans(spec) if r.enabled and r.schedule is not None]
    for first, _ in opened(plan, lo, hi):
        last = plan.capture_last(first)
        if last is None or last > hi:
            continue
        steps = tuple(range(first, last + 1))
        if not spec.discrete and spec.schedule is not None:
            text = shortfall(spec.schedule, inner * len(steps), steps, None)
            if text:
                yield text
        for region in regions if spec.discrete else ():
            assert region.schedule is not None
            text = shortfall(region.schedule, inner, steps, region.name)
            if text:
                yield text


def warnings(policy: Policy, role: str, world: int, lo: int, hi: int,
             inner: int) -> list[str]:
    """The first capture in steps ``lo..hi`` that ``inner`` calls per step (per region
    call, discrete) cut short, with how many more there are; empty when none is."""
    found = list(_found(policy, role, world, lo, hi, inner))
    if not found:
        return []
    more = (f" (and {len(found) - 1} more capture(s) in steps {lo}-{hi})"
            if len(found) > 1 else "")
    return [f"role {role!r}, --inner-steps {inner}: {found[0]}{more}"]
