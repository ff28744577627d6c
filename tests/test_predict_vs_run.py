"""explain == run: the trace names explain predicts are the names the run writes, per rank.

Hypothesis generates policies (ranks, step sets with periodic steps, merge_steps,
schedules with skip_first, warm-up and repeat 0..2, discrete regions with schedules of
their own, colocated roles, names with and without <cycle>)
and call patterns (a window of outer steps, inner steps per step); every rank then runs
the pattern through the recording backend, and the names it saved must equal, in order,
the ``traces`` explain lists for that rank. The loop runs bare or inside
``with profile_session(...) as prof:`` (the torchtitan way): the block's whole-session
capture gives way to the training steps and writes nothing explain does not list.
Explain's own default (``--inner-steps`` not given) is checked against a real run of
policies/torchtitan.yaml.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from policy_engine import PolicyError, Topology, load_policy, profile_session
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.plan.predict import explain
from policy_engine.runtime.process import manifest, state
from policy_engine.runtime.role.profiler import RoleProfiler
from policy_engine.testing import recording_backend

ROOT = Path(__file__).resolve().parent.parent
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
    if draw(st.booleans()):  # a colocated role: <role> names the window, every step
        policy["roles"]["ref"] = dict(role, steps=draw(steps), ranks="all")
        policy["colocate"] = [["ref", "actor"]]
    lo = draw(st.integers(0, 4))
    if draw(st.booleans()):  # a budget counts from the run's first step: run from 0
        role["limits"] = {"captures": draw(st.integers(1, 4))}
        lo = 0
    hi = lo + draw(st.integers(0, 8))
    return policy, world, mesh, lo, hi, draw(st.integers(1 if merged_cycles else 0, 6))


def run(prof: RoleProfiler, lo: int, hi: int, inner: int, in_with: bool = False) -> None:
    """The call pattern explain assumes: every step of the window, ``inner`` prof.step()
    calls in each (in each region call, in discrete mode), then close() (or the end of
    a ``with prof:`` block around it all, ``in_with``)."""
    if in_with:
        with prof:
            run(prof, lo, hi, inner)
        return
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
@given(st.one_of(cases(), cases(merged_cycles=True)), st.booleans())
def test_explain_lists_exactly_the_files_each_rank_writes(
        case: tuple[dict[str, Any], int, dict[str, int] | None, int, int, int],
        in_with: bool) -> None:
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
                run(prof, lo, hi, inner, in_with)
        state.reset()  # each rank is a process of its own (limits count per process)
        saved = [call[1] for call in rec.calls if call[0] == "save"]
        expected = [t["name"] for t in predicted[rank].get("traces", [])]
        assert saved == expected, (rank, policy_data, lo, hi, inner, in_with)
        # and the manifest lists the same, no more (a dropped session capture: no line)
        written = [line for line in lines if line.get("event") == "trace"
                   and line["path"] is not None]
        assert len(written) == len(saved)
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


@pytest.mark.parametrize("in_with", [False, True], ids=["bare loop", "inside with prof"])
def test_torchtitan_policy_explained_by_default_as_it_runs(tmp_path: Path,
                                                          in_with: bool) -> None:
    """policies/torchtitan.yaml, explained with no --inner-steps, lists the traces a
    torchtitan loop (one prof.step() per training step, steps 1-400) writes:
    iteration_100 ... iteration_400 on each rank, and the manifest says the same."""
    policy = load_policy(ROOT / "policies" / "torchtitan.yaml",
                         overrides=[f"output_dir={tmp_path}"])
    entry = explain(policy, "trainer", world=2, lo=1, hi=400)["ranks"][1]
    assert entry["inner_steps"] == 1  # derived from the plan: cycles named by their step
    predicted = [t["name"] for t in entry["traces"]]
    assert predicted == [f"iteration_{n}/rank1_trace" for n in (100, 200, 300, 400)]
    with recording_backend("torch") as rec:
        prof = profile_session(policy, "trainer", Topology(rank=1, world=2))
        assert isinstance(prof, RoleProfiler)
        block = prof if in_with else contextlib.nullcontext()
        with block:
            for step in range(1, 401):
                with prof.training_step(step):
                    prof.step()
        prof.close()
    assert [c[1] for c in rec.calls if c[0] == "save"] == predicted
    scan = scan_manifests(str(tmp_path))
    paths = [r["path"] for r in scan.records if r["event"] == "trace"]
    assert paths == [name + ".rec" for name in predicted]
    closes = [r for r in scan.records if r["event"] == "close"]
    if in_with:  # the block's session capture gave way to the steps, and says so
        assert closes[0]["traces"] == 0 and "training_step(1)" in closes[0]["reason"]
        closes = closes[1:]
    assert [c["status"] for c in closes] == ["complete"]
