"""explain == run: the trace names explain predicts are the names the run writes, per rank.

Hypothesis generates policies (ranks, step sets, merge_steps, schedules with skip_first,
warm-up and repeat 0..2, discrete regions with schedules of their own, colocated roles)
and call patterns (a window of outer steps, inner steps per step); every rank then runs
the pattern through the recording backend, and the names it saved must equal, in order,
the ``traces`` explain lists for that rank.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from policy_engine import PolicyError, Topology, load_policy, profile_session
from policy_engine.plan.predict import explain
from policy_engine.runtime.profiler import RoleProfiler
from policy_engine.testing import recording_backend

NAME = "<role>[_<region>][_step<step>][_c<cycle>]_r<rank>[_<tp><dp>]"

schedules = st.one_of(st.none(), st.fixed_dictionaries({
    "skip_first": st.integers(0, 2), "skip_first_wait": st.integers(0, 1),
    "wait": st.integers(0, 2), "warmup": st.integers(0, 2), "active": st.integers(1, 3),
    "repeat": st.integers(0, 2)}))
step_items = st.one_of(
    st.integers(0, 12),
    st.tuples(st.integers(0, 12), st.integers(0, 6)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"),
    st.tuples(st.integers(0, 6), st.integers(1, 8), st.integers(2, 3)).map(
        lambda t: f"{t[0]}-{t[0] + t[1]}:{t[2]}"),
)
steps = st.one_of(st.just("all"), st.lists(step_items, min_size=1, max_size=4))
layouts = st.sampled_from([(1, None), (2, None), (4, None), (4, {"dp": 2, "tp": 2}),
                           (2, {"dp": 2}), (4, {"tp": 4})])


@st.composite
def cases(draw: Any) -> tuple[dict[str, Any], int, dict[str, int] | None, int, int, int]:
    world, mesh = draw(layouts)
    rank_choices = ["all", [0], [-1], "0-1", [0, -1]]
    if mesh:
        rank_choices += [{dim: 0} for dim in mesh] + [{dim: [0, -1]} for dim in mesh]
    discrete = draw(st.booleans())
    role: dict[str, Any] = {
        "enabled": True, "ranks": draw(st.sampled_from(rank_choices)), "steps": draw(steps),
        "merge_steps": False if discrete else draw(st.booleans()),
        "schedule": draw(schedules), "discrete": discrete, "name": NAME,
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
    hi = lo + draw(st.integers(0, 8))
    return policy, world, mesh, lo, hi, draw(st.integers(0, 6))


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


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases())
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
        with recording_backend("torch", write_files=False) as rec:
            prof = profile_session(policy, "actor", Topology(rank=rank, world=world,
                                                              local_rank=rank))
            if isinstance(prof, RoleProfiler):
                run(prof, lo, hi, inner)
        saved = [call[1] for call in rec.calls if call[0] == "save"]
        expected = [t["name"] for t in predicted[rank].get("traces", [])]
        assert saved == expected, (rank, policy_data, lo, hi, inner)
        assert predicted[rank]["profiled"] is isinstance(prof, RoleProfiler)
        assert rec.violations == []
        event("traces written" if saved else "no trace on this rank")
        if len(saved) > 1:
            event("several traces on one rank")
