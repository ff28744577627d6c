"""What a policy will do on every rank of a role: the data behind ``policy-engine explain``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from policy_engine.language.mesh import DIMS, coords_from_mesh
from policy_engine.language.model import Policy
from policy_engine.language.naming import LATE_FIELDS
from policy_engine.language.schedule import Action, Schedule
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.plan import Plan
from policy_engine.plan.topology import Topology


def capture_runs(plan: Plan, lo: int, hi: int) -> list[tuple[int, int | None]]:
    """The captures that open in outer steps ``lo..hi``: (first, last) step of each."""
    runs: list[tuple[int, int | None]] = []
    covered = lo - 1
    for step in plan.steps.within(lo, hi):
        if step <= covered:
            continue
        last = plan.capture_last(step)
        runs.append((step, last))
        covered = hi if last is None else last
    return runs


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


def _capture_specs(plan: Plan, lo: int, hi: int) -> list[dict[str, Any]]:
    """Each capture in the window: its steps, region, and the values its name needs."""
    out = []
    for first, last in capture_runs(plan, lo, hi):
        label = plan.capture_label(first)
        steps = list(range(first, (hi if last is None else min(last, hi)) + 1))
        regions = [r for r in plan.regions if r.enabled] if plan.discrete else [None]
        for region in regions:
            schedule = region.schedule if region is not None else plan.schedule
            out.append({"steps": steps, "region": region.name if region else None,
                        "step": label, "cycle": 0 if schedule is not None else None})
    return out


def _named(specs: list[dict[str, Any]], name: Any) -> list[dict[str, Any]]:
    return [{"steps": c["steps"], "region": c["region"],
             "name": name(step=c["step"], region=c["region"], cycle=c["cycle"])}
            for c in specs]


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
    captures = _named(_capture_specs(plan, lo, hi), plan.example_name)
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
    # Plain arithmetic per rank. One Plan is compiled, for the first rank that profiles;
    # every other profiled rank differs from it only in its place, so its entry is that
    # one with the names rendered again. This keeps 65536 ranks near a second.
    sizes = Topology.for_rank(0, world, mesh or None, local_world).selector_sizes()
    base: dict[str, Any] | None = None
    specs: list[dict[str, Any]] = []
    template = spec.template.bind({"prefix": policy.prefix, "role": role, "world": world,
                                   "backend": spec.backend})
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
        if base is None:
            plan = compile_plan(policy, role, Topology.for_rank(rank, world, mesh or None,
                                                                local_world))
            base = rank_entry(plan, lo, hi,
                              inner if inner is not None else default_inner_steps(plan))
            specs = _capture_specs(plan, lo, hi)
            yield base
            continue
        place = {"rank": rank, "local_rank": local_rank, "node": node, **coords}

        def name(place: dict[str, Any] = place, **fields: Any) -> str:
            return template.render({**place, **fields}, placeholders=LATE_FIELDS)

        captures = _named(specs, name)
        yield dict(base, rank=rank, coords=coords, local_rank=local_rank, node=node,
                   captures=captures,
                   name=captures[0]["name"] if captures else name(step=None))
