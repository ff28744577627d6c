"""What a policy will do on every rank of a role: the data behind ``policy-engine explain``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from policy_engine.language.model import Policy
from policy_engine.language.values.schedule import Action, Schedule
from policy_engine.plan.captures import cycle_step, opened, traces
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.placement import places
from policy_engine.plan.plan import Plan

#: Given a plan, what lists the files of one of its traces (by name and position among
#: the process's traces): ``[{"path": ..., "backend": ..., "when": ...}]``.
Files = Callable[[Plan], Callable[[str, int], list[dict[str, Any]]]]


def actions(schedule: Schedule | None, n: int) -> list[str]:
    """Action names for inner steps 0..n-1; no schedule records the whole capture."""
    if schedule is None:
        return [Action.RECORD.name] * n
    return [a.name for a in schedule.actions(n)]


def default_inner_steps(plan: Plan) -> int:
    """Inner steps whose actions explain shows: enough to run the schedule through."""
    needed = [r.schedule.steps_needed for r in plan.regions if r.schedule] if plan.discrete \
        else []
    needed.append(plan.schedule.steps_needed if plan.schedule else None)
    known = [n for n in needed if n is not None]
    return min(max([10, *known]), 200)


def default_step_calls(plan: Plan) -> int:
    """The ``prof.step()`` calls per outer step (per region call, in discrete mode) that
    explain's traces assume when ``--inner-steps`` is not given.

    One when the plan names each cycle of a merged capture by its own step
    (:attr:`Plan.step_per_cycle`: a repeating schedule or endless steps): its schedule
    counts training steps, as torchtitan's ``profile_freq`` does and as the framework
    callbacks do without gradient accumulation. Otherwise the schedule counts steps
    within each capture (mini-batches), and explain assumes enough of them to run it
    through (:func:`default_inner_steps`).
    """
    return 1 if plan.step_per_cycle else default_inner_steps(plan)


def _first_cycle_step(plan: Plan, first: int, steps: Sequence[int], inner: int) -> int | None:
    """``<step>`` of the first cycle of a merged capture opening at ``first`` that names
    each cycle by its own step (None otherwise: the capture's span), as the run names it
    if the loop goes on past the window (``steps``, the capture's steps in it)."""
    if not plan.step_per_cycle or plan.schedule is None:
        return None
    if inner <= 0:
        return cycle_step(plan.schedule, 0, steps, inner)  # the capture's end names it
    index = plan.schedule.record_start(0) // inner  # a merged capture's steps follow
    last = plan.capture_last(first)                 # each other
    return first + (index if last is None else min(index, last - first))


def rank_entry(plan: Plan, lo: int, hi: int, inner: int | None = None,
               region_calls: int = 1, files: Files | None = None) -> dict[str, Any]:
    """What ``explain`` says of one rank: the plan's place, and when it profiles, its
    steps, schedule actions, captures and every trace file (names as the run writes them,
    with ``<pid>``, ``<timestamp>``, ``<host>`` and ``<env:...>`` left as placeholders).

    ``inner``: ``prof.step()`` calls per outer step (None: :func:`default_step_calls`;
    the actions shown cover at least :func:`default_inner_steps`). ``files``: what names
    each trace's files with the backends' extensions (the CLI passes
    :func:`policy_engine.cli.explain.plan_files`; the plan layer knows no backend)."""
    entry: dict[str, Any] = {
        "rank": plan.rank,
        "profiled": plan.enabled,
        "coords": dict(plan.coords),
        "local_rank": plan.local_rank,
        "node": plan.node,
    }
    if not plan.enabled:
        return entry
    shown = default_inner_steps(plan) if inner is None else inner
    inner = default_step_calls(plan) if inner is None else inner
    regions = [r for r in plan.regions if r.enabled] if plan.discrete else [None]
    captures = [
        {"steps": list(steps), "region": region.name if region else None,
         "name": plan.capture_name(
             first=first, region=region.name if region else None,
             cycle=None if (region.schedule if region else plan.schedule) is None else 0,
             at=_first_cycle_step(plan, first, steps, inner))}
        for first, steps in opened(plan, lo, hi) for region in regions
    ]
    listed = traces(plan, lo, hi, inner=inner, region_calls=region_calls)
    name_files = None if files is None else files(plan)
    entry.update({
        "backend": plan.backend,
        "backends": list(plan.backends),
        "steps": plan.steps.within(lo, hi),
        "inner_steps": inner,
        "actions": actions(plan.schedule, shown),
        "name": captures[0]["name"] if captures else plan.capture_name(
            first=None, region=None, cycle=None),
        "captures": captures,
        "traces": [t.to_json() if name_files is None
                   else dict(t.to_json(), files=name_files(t.name, t.index)) for t in listed],
    })
    if plan.discrete:
        entry["regions"] = {r.name: actions(r.schedule, shown) for r in plan.regions
                            if r.enabled}
    if plan.spec.triggers.any:
        entry["triggers"] = plan.spec.triggers.to_json()
    limits = plan.spec.limits
    if limits.captures is not None or limits.bytes is not None:
        entry["limits"] = limits.to_json()
    if plan.spec.keep != "traces":  # its torch traces are removed once summarised
        entry["keep"] = plan.spec.keep
    return entry


def explain(policy: Policy, role: str, *, world: int, lo: int = 0, hi: int = 20,
            inner: int | None = None, local_world: int | None = None, region_calls: int = 1,
            files: Files | None = None) -> dict[str, Any]:
    """Per rank: profiled or not, coordinates, backend, steps, actions, traces. Each rank
    is placed in the mesh of ``role`` (:meth:`Policy.mesh_for`; for another mesh, pass
    ``policy.with_mesh(mesh)``, as the CLI's ``--mesh`` does)."""
    return {"role": role, "world": world,
            "ranks": list(iter_ranks(policy, role, world=world, lo=lo, hi=hi, inner=inner,
                                     local_world=local_world, region_calls=region_calls,
                                     files=files))}


def iter_ranks(policy: Policy, role: str, *, world: int, lo: int, hi: int, inner: int | None,
               local_world: int | None, region_calls: int = 1,
               files: Files | None = None) -> Iterator[dict[str, Any]]:
    """:func:`rank_entry` for every rank: each rank placed and compiled by the code the
    runtime runs (:func:`~policy_engine.plan.placement.places`,
    :func:`~policy_engine.plan.compile.compile_plan`)."""
    for place in places(policy, role, world, local_world):
        if place.topology is None:
            yield {"rank": place.rank, "profiled": False, "coords": place.coords,
                   "local_rank": place.local_rank, "node": place.node}
        else:
            yield rank_entry(compile_plan(policy, role, place.topology), lo, hi, inner,
                             region_calls, files)
