"""explain == run: the trace names explain predicts are the names the run writes, per rank.

Hypothesis generates policies (ranks, step sets with periodic steps, merge_steps,
schedules with skip_first, warm-up and repeat 0..2, discrete regions with schedules of
their own, colocated roles, names with and without <cycle>)
and call patterns (a window of outer steps, inner steps per step); every rank then runs
the pattern through the recording backend, and the names it saved must equal, in order,
the ``traces`` explain lists for that rank.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from policy_engine import PolicyError, Topology, load_policy, profile_session
from policy_engine.plan.predict import explain
from policy_engine.runtime import manifest
from policy_engine.runtime.profiler import RoleProfiler
from policy_engine.testing import recording_backend

NAME = "<role>[_<region>][_step<step>][_c<cycle>]_r<rank>[_<tp><dp>]"
#: Without <cycle>: merged captures whose schedule repeats tell their cycles apart by
#: <step>, which then renders each cycle's own outer step.
NAME_NO_CYCLE = "<role>[_<region>][_step<step>]_r<rank>[_<tp><dp>]"

schedule_maps = st.fixed_dictionaries({
    "skip_first": st.integers(0, 2), "skip_first_wait": st.integers(0, 1),
    "wait": st.integers(0, 2), "warmup": st.integers(0, 2), "active": st.integers(1, 3),
    "repeat": st.integers(0, 2)})
schedules = st.one_of(st.none(), schedule_maps)
step_items = st.one_of(
    st.integers(0, 12),
    st.tuples(st.integers(0, 12), st.integers(0, 6)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"),
    st.tuples(st.integers(0, 6), st.integers(1, 8), st.integers(2, 3)).map(
        lambda t: f"{t[0]}-{t[0] + t[1]}:{t[2]}"),
)
periodic = st.builds(
    lambda every, start, until: {"every": every, **start, **until},
    st.integers(1, 4),
    st.one_of(st.just({}), st.integers(0, 6).map(lambda n: {"from": n})),
    st.one_of(st.just({}), st.integers(6, 14).map(lambda n: {"until": n})))
steps = st.one_of(st.just("all"), periodic,
                  st.lists(st.one_of(step_items, periodic), min_size=1, max_size=4))
layouts = st.sampled_from([(1, None), (2, None), (4, None), (4, {"dp": 2, "tp": 2}),
                           (2, {"dp": 2}), (4, {"tp": 4})])


@st.composite
def cases(draw: Any, merged_cycles: bool = False
          ) -> tuple[dict[str, Any], int, dict[str, int] | None, int, int, int]:
    """A policy, its layout and a call pattern. ``merged_cycles``: only merged captures
    with a schedule (each cycle a trace, ``<step>`` the cycle's own step)."""
    world, mesh = draw(layouts)
    rank_choices = ["all", [0], [-1], "0-1", [0, -1]]
    if mesh:
        rank_choices += [{dim: 0} for dim in mesh] + [{dim: [0, -1]} for dim in mesh]
    discrete = False if merged_cycles else draw(st.booleans())
    role: dict[str, Any] = {
        "enabled": True, "ranks": draw(st.sampled_from(rank_choices)), "steps": draw(steps),
        "merge_steps": merged_cycles or (False if discrete else draw(st.booleans())),
        "schedule": draw(schedule_maps if merged_cycles else schedules),
        "discrete": discrete,
        "name": draw(st.sampled_from([NAME, NAME_NO_CYCLE])),
    }
    if discrete:
        names = draw(st.lists(st.sampled_from(["update", "rollout", "score"]), min_size=1,
                              max_size=2, unique=True))
        role["regions"] = {name: draw(st.one_of(
            st.just({}), st.fixed_dictionaries({"schedule": schedules}),
            st.just({"enabled": False}))) for name in names}
    policy: dict[str, Any] = {"version": 1, "output_dir": "/nonexistent-never-written",
                              "roles": {"actor": role}}
    if mesh:
        policy["mesh"] = mesh
    if draw(st.booleans()):  # a colocated role whose steps decide the names' <role>
        policy["roles"]["ref"] = dict(role, steps=draw(steps), ranks="all")
        policy["colocate"] = [["ref", "actor"]]
    lo = draw(st.integers(0, 4))
    if draw(st.booleans()):  # a budget counts from the run's first step: run from 0
        role["limits"] = {"captures": draw(st.integers(1, 4))}
        lo = 0
    hi = lo + draw(st.integers(0, 8))
    return policy, world, mesh, lo, hi, draw(st.integers(1 if merged_cycles else 0, 6))


def run(prof: RoleProfiler, lo: int, hi: int, inner: int) -> None:
    """The call pattern explain assumes: every step of the window, ``inner`` prof.step()
    calls in each (in each region call, in discrete mode), then close()."""
    regions = [r.name for r in prof.plan.regions if r.enabled]
    for n in range(lo, hi + 1):
        with prof.training_step(n):
            if not prof.plan.discrete:
                for _ in range(inner):
                    prof.step()
                continue
            for name in regions:
                with prof.region(name):
                    for _ in range(inner):
                        prof.step()
    prof.close()


def _appending_to(lines: list[dict[str, Any]]) -> Any:
    """A ``manifest.append`` that keeps the lines in ``lines``."""
    return lambda _folder, line: lines.append(line)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.one_of(cases(), cases(merged_cycles=True)))
def test_explain_lists_exactly_the_files_each_rank_writes(
        case: tuple[dict[str, Any], int, dict[str, int] | None, int, int, int]) -> None:
    policy_data, world, _, lo, hi, inner = case  # the mesh is in the policy
    try:
        policy = load_policy(policy_data)
    except PolicyError:
        assume(False)  # names that validate cannot prove unique: not a policy that runs
        return
    predicted = explain(policy, "actor", world=world, lo=lo, hi=hi, inner=inner)["ranks"]
    for rank in range(world):
        lines: list[dict[str, Any]] = []
        with recording_backend("torch", write_files=False) as rec, \
                mock.patch.object(manifest, "append", _appending_to(lines)):
            prof = profile_session(policy, "actor", Topology(rank=rank, world=world,
                                                              local_rank=rank))
            if isinstance(prof, RoleProfiler):
                run(prof, lo, hi, inner)
        saved = [call[1] for call in rec.calls if call[0] == "save"]
        expected = [t["name"] for t in predicted[rank].get("traces", [])]
        assert saved == expected, (rank, policy_data, lo, hi, inner)
        if isinstance(prof, RoleProfiler) and prof.plan.step_per_cycle:
            # each trace line lists its cycle's own steps, as explain does
            listed = [line["steps"] for line in lines
                      if line.get("event") == "trace" and line["path"] is not None]
            assert listed == [t["steps"] for t in predicted[rank]["traces"]]
        assert predicted[rank]["profiled"] is isinstance(prof, RoleProfiler)
        assert rec.violations == []
        event("traces written" if saved else "no trace on this rank")
        if len(saved) > 1:
            event("several traces on one rank")
            if isinstance(prof, RoleProfiler) and prof.plan.step_per_cycle:
                event("several cycles of merged captures named by their own step")
