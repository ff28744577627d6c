"""What a policy will do on every rank of a role: the data behind ``policy-engine explain``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .compiler import compile_plan
from .model import Policy
from .plan import Plan
from .schedule import Action, Schedule
from .selectors import StepSet
from .topology import DIMS, Topology, coords_from_mesh


def capture_runs(steps: StepSet, lo: int, hi: int, merge: bool) -> list[tuple[int, int]]:
    """The captures outer steps ``lo..hi`` make: (first, last) step of each."""
    runs: list[tuple[int, int]] = []
    for step in steps.within(lo, hi):
        if merge and runs and runs[-1][1] == step - 1:
            runs[-1] = (runs[-1][0], step)
        else:
            runs.append((step, step))
    return runs


def step_label(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def actions(schedule: Schedule | None, n: int) -> list[str]:
    """Action names for inner steps 0..n-1; no schedule records the whole capture."""
    if schedule is None:
        return [Action.RECORD.name] * n
    return [a.name for a in schedule.actions(n)]


def default_inner_steps(plan: Plan) -> int:
    needed = [r.schedule.steps_needed for r in plan.regions if r.schedule] if plan.discrete \
        else []
    needed.append(plan.schedule.steps_needed if plan.schedule else None)
    known = [n for n in needed if n is not None]
    return min(max([10, *known]), 200)


def _captures(plan: Plan, lo: int, hi: int) -> list[dict[str, Any]]:
    out = []
    cycle = 0 if plan.schedule is not None else None
    for first, last in capture_runs(plan.steps, lo, hi, plan.merge_steps):
        label = step_label(first, last)
        regions = [r for r in plan.regions if r.enabled] if plan.discrete else [None]
        for region in regions:
            region_cycle = (0 if region.schedule is not None else None) if region else cycle
            out.append({
                "steps": list(range(first, last + 1)),
                "region": region.name if region else None,
                "name": plan.example_name(step=label, region=region.name if region else None,
                                          cycle=region_cycle),
            })
    return out


def rank_entry(plan: Plan, lo: int, hi: int, inner: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": plan.rank,
        "profiled": plan.enabled,
        "coords": dict(plan.coords),
        "local_rank": plan.local_rank,
        "node": plan.node,
    }
    if not plan.enabled:
        return entry
    captures = _captures(plan, lo, hi)
    entry.update({
        "backend": plan.backend,
        "steps": plan.steps.within(lo, hi),
        "actions": actions(plan.schedule, inner),
        "name": captures[0]["name"] if captures else plan.example_name(),
        "captures": captures,
    })
    if plan.discrete:
        entry["regions"] = {r.name: actions(r.schedule, inner) for r in plan.regions
                            if r.enabled}
    return entry


def explain(policy: Policy, role: str, *, world: int, mesh: Mapping[str, int] | None = None,
            lo: int = 0, hi: int = 20, inner: int | None = None,
            local_world: int | None = None) -> dict[str, Any]:
    """Per rank: profiled or not, coordinates, backend, steps, actions, example name."""
    return {"role": role, "world": world,
            "ranks": list(iter_ranks(policy, role, world=world, mesh=mesh, lo=lo, hi=hi,
                                     inner=inner, local_world=local_world))}


def iter_ranks(policy: Policy, role: str, *, world: int, mesh: Mapping[str, int] | None,
               lo: int, hi: int, inner: int | None,
               local_world: int | None) -> Iterator[dict[str, Any]]:
    mesh = dict(mesh or policy.mesh)
    spec = policy.role(role)
    # Plain arithmetic per rank; a Topology and a Plan only for ranks that profile, which
    # keeps 65536 ranks well under a second.
    sizes = Topology.for_rank(0, world, mesh or None, local_world).selector_sizes()
    for rank in range(world):
        at = coords_from_mesh(rank, mesh) if mesh else {}
        coords = {dim: at[dim] for dim in DIMS if dim in at}  # the order plans and names use
        local_rank, node = (rank % local_world, rank // local_world) if local_world \
            else (rank, 0)
        selector = dict(coords, local_rank=local_rank, node=node)
        if not spec.enabled or not spec.ranks.matches(rank, world, selector, sizes):
            yield {"rank": rank, "profiled": False, "coords": coords,
                   "local_rank": local_rank, "node": node}
            continue
        plan = compile_plan(policy, role, Topology.for_rank(rank, world, mesh or None,
                                                            local_world))
        yield rank_entry(plan, lo, hi, inner if inner is not None else default_inner_steps(plan))
