"""What a plan writes: the captures a loop opens, the cycles each records, their names.

The runtime opens a capture at a profiled ``training_step(n)`` (merged runs stay open),
calls the backend's ``start()`` at the first recorded inner step of every schedule cycle
and ``save()`` at its end: each recorded cycle is one trace file (one nsys capture range),
named by :meth:`Plan.capture_name <policy_engine.plan.plan.Plan.capture_name>`. This
module lists them for ``explain`` (:func:`traces`, over a window of steps) and counts them
for ``nsys-args`` (:func:`count_ranges`, over every step, in closed form). Both are
checked against the runtime itself: tests/test_predict_vs_run.py, tests/test_nsys_args.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from policy_engine.language.values.schedule import Schedule
from policy_engine.language.values.steps import StepSet
from policy_engine.plan.plan import Plan


@attrs.frozen
class Trace:
    """One trace file a rank writes: its name without the backend's extension, the outer
    steps its capture covers (under ``Plan.step_per_cycle``, its cycle's own: from its
    ``<step>`` to its save, as the manifest lists them), its schedule cycle (None: no
    schedule), its region (discrete mode), and its place among the traces the process
    writes from its first step (``index``, from 0: an nsys report's number)."""

    name: str
    steps: tuple[int, ...]
    cycle: int | None
    region: str | None
    index: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "steps": list(self.steps), "cycle": self.cycle,
                "region": self.region}


def opened(plan: Plan, lo: int, hi: int) -> list[tuple[int, tuple[int, ...]]]:
    """The captures a loop over outer steps ``lo..hi`` opens: the step each opens at and
    the steps of the window it covers (several when merged)."""
    return list(_opened(plan, lo, hi))


def _opened(plan: Plan, lo: int, hi: int) -> Iterator[tuple[int, tuple[int, ...]]]:
    steps = plan.steps
    step = lo if lo in steps else steps.next_after(lo)
    while step is not None and step <= hi:
        last = plan.capture_last(step)
        end = hi if last is None else min(last, hi)
        yield step, tuple(range(step, end + 1))
        step = steps.next_after(end)


def cycles(schedule: Schedule | None, positions: int) -> Sequence[int | None]:
    """The cycles a capture visiting inner steps ``0..positions-1`` records (and saves)."""
    if positions <= 0:
        return ()
    if schedule is None:
        return (None,)
    return range(schedule.recorded_cycles(positions))


def _ended_in(position: int, steps: Sequence[int], inner: int) -> int:
    """The index in ``steps`` of the step in which inner step ``position`` of a capture
    ends: at the ``(position + 1)``-th ``prof.step()``, made in step ``position // inner``,
    or at the capture's end when no call ends it."""
    return len(steps) - 1 if inner == 0 else min(position // inner, len(steps) - 1)


def cycle_step(schedule: Schedule, cycle: int, steps: Sequence[int], inner: int) -> int:
    """The outer step in which ``cycle`` of a capture over ``steps`` starts recording,
    when each step makes ``inner`` ``prof.step()`` calls: the step in which its first
    recorded inner step ends (the runtime's ``<step>`` under ``Plan.step_per_cycle``)."""
    return steps[_ended_in(schedule.record_start(cycle), steps, inner)]


def cycle_steps(schedule: Schedule, cycle: int, steps: Sequence[int],
                inner: int) -> tuple[int, ...]:
    """The outer steps a trace line of ``cycle`` lists under ``Plan.step_per_cycle``:
    from its ``<step>`` to the step in which it is saved (its last recorded inner step
    ends, or the capture does)."""
    start = schedule.record_start(cycle)
    first = _ended_in(start, steps, inner)
    last = _ended_in(start + schedule.active - 1, steps, inner)
    return tuple(steps[first:last + 1])


def traces(plan: Plan, lo: int, hi: int, *, inner: int, region_calls: int = 1) -> list[Trace]:
    """Every trace file a loop over outer steps ``lo..hi`` writes on ``plan``'s rank, when
    each step (each region call, in discrete mode) makes ``inner`` ``prof.step()`` calls
    and each enabled region is called ``region_calls`` times a step (discrete).

    Under ``limits.captures: N`` the run records N cycles at most, counted from its
    start: the traces are those of the first N cycles from step 0 that fall in the window.
    """
    limit = plan.spec.limits.captures
    if limit is None:
        return [_at(t, i) for i, t in enumerate(_traces(plan, lo, hi, inner, region_calls))]
    first_n = itertools.islice(_traces(plan, 0, hi, inner, region_calls), limit)
    return [_at(t, i) for i, t in enumerate(first_n) if not t.steps or t.steps[-1] >= lo]


def _at(trace: Trace, index: int) -> Trace:
    return Trace(trace.name, trace.steps, trace.cycle, trace.region, index)


def _traces(plan: Plan, lo: int, hi: int, inner: int, region_calls: int) -> Iterator[Trace]:
    per_cycle = plan.step_per_cycle
    for first, steps in _opened(plan, lo, hi):
        if not plan.discrete:
            # The capture visits inner step 0 when it opens, then one per prof.step().
            for cycle in cycles(plan.schedule, inner * len(steps) + 1):
                at, covered = None, steps
                if per_cycle and plan.schedule is not None and cycle is not None:
                    at = cycle_step(plan.schedule, cycle, steps, inner)
                    covered = cycle_steps(plan.schedule, cycle, steps, inner)
                name = plan.capture_name(first=first, region=None, cycle=cycle, at=at)
                yield Trace(name, covered, cycle, None)
            continue
        for region in plan.regions:
            if not region.enabled:
                continue
            for _ in range(region_calls):
                for cycle in cycles(region.schedule, inner + 1):
                    name = plan.capture_name(first=first, region=region.name, cycle=cycle)
                    yield Trace(name, steps, cycle, region.name)


@attrs.frozen
class RangeCount:
    """Capture ranges one profiled process opens; ``total`` None when the plan cannot say."""

    total: int | None
    why: str


def cycle_ranges(schedule: Schedule | None, positions: int | None) -> int | None:
    """Capture ranges in one capture: one per schedule cycle that records.

    The interpreter calls ``start()`` at every cycle's first recorded step and ``save()``
    at its end, so each recorded cycle is one range. ``positions``: how many inner steps
    the capture visits (None: unknown).
    """
    if positions == 0:
        return 0
    if schedule is None:
        return 1
    if positions is None:
        return schedule.repeat or None
    return schedule.recorded_cycles(positions)


def _length_counts(steps: StepSet, merge: bool) -> dict[int, int] | None:
    """``{steps per capture: captures}``, computed from the runs without listing captures."""
    if not merge:
        count = steps.count()
        return None if count is None else {1: count} if count else {}
    return steps.run_lengths()


def _times(n: int | None, label: str) -> str:
    if n is None:
        return f"an unknown number of {label}"
    return f"{n} {label[:-1] if n == 1 else label}"


def count_ranges(
    plan: Plan,
    *,
    inner_steps: int | None = None,
    region_calls: int | None = None,
    plain_loop: bool = False,
) -> RangeCount:
    """The capture ranges a process on ``plan`` opens.

    ``plain_loop``: the code never calls ``training_step`` (one capture for the session).
    ``region_calls``: calls of each region per profiled step (per session in a plain loop),
    which discrete mode needs. ``inner_steps``: ``prof.step()`` calls per profiled step
    (per region call in discrete mode, per session in a plain loop).
    """
    found = _discrete(plan, inner_steps, region_calls, plain_loop) if plan.discrete \
        else _continuous(plan, inner_steps, plain_loop)
    limit, total, why = plan.spec.limits.captures, found.total, found.why
    if plan.spec.triggers.any:
        total, why = None, why + "; triggers may open more"
    if limit is not None and (total is None or total > limit):
        total, why = limit, why + f"; at most {limit} (limits.captures)"
    return RangeCount(total, why)


# A capture visits inner step 0 when it opens (training_step, a region, or entering
# `with profile_session(...) as prof:`) and one more per prof.step(). (A plain loop that
# never enters the profiler opens its capture at the first prof.step(): one step fewer.)


def _discrete(
    plan: Plan, inner_steps: int | None, region_calls: int | None, plain_loop: bool
) -> RangeCount:
    windows = 1 if plain_loop else plan.steps.count()
    regions = [r for r in plan.regions if r.enabled]
    positions = None if inner_steps is None else inner_steps + 1
    per = [cycle_ranges(r.schedule, positions) for r in regions]
    each = None if None in per else sum(p or 0 for p in per)
    total = None
    if windows is not None and region_calls is not None and each is not None:
        total = windows * region_calls * each
    where = "the session" if plain_loop else _times(windows, "profiled steps")
    why = (
        f"discrete: {where} x {_times(region_calls, 'calls')} of each of "
        f"{len(regions)} regions x their cycles"
    )
    if region_calls is None:
        why += " (give --region-calls to count them)"
    return RangeCount(total, why)


def _continuous(plan: Plan, inner_steps: int | None, plain_loop: bool) -> RangeCount:
    counts = {1: 1} if plain_loop else _length_counts(plan.steps, plan.merge_steps)
    total = None
    if counts is not None:
        per_length = {
            n: cycle_ranges(
                plan.schedule,
                None if inner_steps is None else inner_steps * n + 1,
            )
            for n in counts
        }
        if None not in per_length.values():
            total = sum((per_length[n] or 0) * times for n, times in counts.items())
    what = "merged runs of steps" if plan.merge_steps and not plain_loop else "captures"
    where = "the session" if plain_loop else _times(plan.steps.count(), "profiled steps")
    why = f"{_times(None if counts is None else sum(counts.values()), what)} in {where}"
    if plan.schedule is None:
        why += " x 1 range each (no schedule: the whole capture)"
    elif inner_steps is None:
        why += (
            " x one range per recorded schedule cycle "
            f"(repeat {plan.schedule.repeat}, assuming each capture runs them all)"
        )
    else:
        why += f" x one range per recorded schedule cycle ({inner_steps} prof.step() a step)"
    return RangeCount(total, why)
