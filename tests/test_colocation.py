"""``colocate:``: what validate refuses, and how shared captures are named at run time."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from policy_engine import (
    PolicyError,
    Topology,
    apply_policy,
    compile_plan,
    load_policy,
    profile_session,
)
from policy_engine.analysis.manifests import read_manifests, scan_manifests
from policy_engine.language.rules.colocation import window_roles
from policy_engine.testing import recording_backend


def policy(out: Path | str, colocate: Any = (("actor", "ref"),), **roles: Any) -> dict[str, Any]:
    base = {"enabled": True, "steps": [2, 3], "torch": {"activities": ["cpu"]},
            "name": "<role>[_step<step>]"}
    body = {"rollout": dict(base), "actor": dict(base), "ref": dict(base)}
    for name, extra in roles.items():
        body[name] = {**body.get(name, base), **extra}
    return {"version": 1, "output_dir": str(out), "roles": body,
            "colocate": [list(g) for g in colocate]}


def messages(data: dict[str, Any]) -> list[str]:
    try:
        loaded = load_policy(data)
    except PolicyError as err:
        return [p.render() for p in err.problems]
    return [p.render() for p in loaded.warnings]


def test_a_valid_group(tmp_path: Path) -> None:
    assert messages(policy(tmp_path)) == []


@pytest.mark.parametrize(("roles", "expected"), [
    ({"ref": {"discrete": True, "regions": ["x"]}},
     "<mapping>: error: colocated roles 'actor' and 'ref' share torch captures but differ "
     "in mode (False and True): one capture has one mode (at $.roles.ref.discrete)"),
    ({"ref": {"schedule": {"warmup": 1, "active": 2, "repeat": 1}}},
     "<mapping>: error: colocated roles 'actor' and 'ref' share torch captures but differ in "
     "schedule (none and {warmup: 1, active: 2, repeat: 1}): one capture has one schedule "
     "(at $.roles.ref.schedule)"),
    ({"ref": {"torch": {"activities": ["cpu"], "record_shapes": True}}},
     "<mapping>: error: colocated roles 'actor' and 'ref' share torch captures but differ in "
     "their torch settings: one capture has one profiler configuration (at $.roles.ref.torch)"),
    ({"ref": {"backend": "mstx"}},
     "<mapping>: error: colocated roles 'actor' (torch) and 'ref' (mstx) cannot share a "
     "process: torch.profiler and torch_npu's profiler drive the same framework profiler, "
     "one at a time (at $.colocate[0])"),
    ({"actor": {"merge_steps": True}, "ref": {"merge_steps": True, "steps": [3, 4]}},
     "<mapping>: error: colocated roles 'actor' and 'ref' merge steps into shared torch "
     "captures but profile different steps (2-3 and 3-4): one merged capture covers one run "
     "of steps (at $.roles.ref.steps)"),
])
def test_what_cannot_share_a_capture(tmp_path: Path, roles: dict[str, Any],
                                     expected: str) -> None:
    assert expected in messages(policy(tmp_path, **roles))


def test_group_mistakes(tmp_path: Path) -> None:
    found = messages(policy(tmp_path, colocate=[["actor", "ref"], ["ref", "rollout"],
                                                ["actr", "rollout"]]))
    assert "<mapping>: error: role 'ref' is in colocate groups 0 and 1: a role runs in one " \
           "process group (at $.colocate[1][0])" in found
    assert "<mapping>: warning: colocated role 'actr' is not under roles (did you mean " \
           "'actor'?): it gets the defaults (at $.colocate[2][0])" in found


def test_disabled_or_other_backend_roles_do_not_conflict(tmp_path: Path) -> None:
    assert messages(policy(tmp_path, ref={"enabled": False, "schedule": {"active": 1}})) == []
    found = messages(policy(tmp_path, colocate=[["actor", "rollout"]],
                            rollout={"backend": "nsight", "schedule": {"active": 1}}))
    assert not [m for m in found if "error" in m]


def run_colocated(out: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    with recording_backend("torch"):
        actor = profile_session(data, "actor", Topology())
        ref = profile_session(data, "ref", Topology())
        for n in (1, 2, 3):
            with ref.training_step(n), actor.training_step(n):  # ref opens, whoever it is
                actor.step()
        actor.close()
        ref.close()
    return sorted(read_manifests(str(out)), key=lambda r: r["start"])


def test_shared_capture_names_every_role_in_policy_order(tmp_path: Path) -> None:
    rows = run_colocated(tmp_path, policy(tmp_path, colocate=[["ref", "actor"]]))
    assert [r["path"] for r in rows] == ["actor+ref_step2.rec", "actor+ref_step3.rec"]
    assert [(r["role"], r["joined"]) for r in rows] == [("ref", ["actor"])] * 2
    opens = [r for r in scan_manifests(str(tmp_path)).records if r["event"] == "open"]
    assert [o["roles"] for o in opens] == [["actor", "ref"]] * 2


def test_participants_follow_each_roles_steps_and_the_name_stays(tmp_path: Path) -> None:
    """The name is the window's (the group), the same at every step; the manifest says
    which roles took part in each capture."""
    rows = run_colocated(tmp_path, policy(tmp_path, ref={"steps": [3]}))
    assert [r["path"] for r in rows] == ["actor+ref_step2.rec", "actor+ref_step3.rec"]
    assert [r["roles"] for r in rows] == [["actor"], ["actor", "ref"]]


def test_undeclared_colocation_warns_once_with_the_line_to_add(tmp_path: Path,
                                                                caplog: Any) -> None:
    with caplog.at_level(logging.WARNING, "policy_engine"):
        rows = run_colocated(tmp_path, policy(tmp_path, colocate=()))
    assert [r["path"] for r in rows] == ["ref_step2.rec", "ref_step3.rec"]
    warnings = [r.getMessage() for r in caplog.records if "colocate" in r.getMessage()]
    assert warnings == ["policy-engine: roles 'ref' and 'actor' share this process and its "
                        "torch capture, but the policy does not say so: add `colocate: "
                        "[[ref, actor]]` so that validate checks them and explain names their "
                        "traces"]


def test_a_role_of_the_group_that_is_off_on_this_rank_is_left_out(tmp_path: Path) -> None:
    """It takes no part there, yet the capture keeps the window's name: every rank of a
    step writes into one folder."""
    name = "<role>/step<step>/rank<rank>"
    data = policy(tmp_path, ref={"ranks": [1], "name": name},
                  actor={"ranks": "all", "name": name}, rollout={"name": name})
    names = {}
    for rank in (0, 1):
        prof = apply_policy(object(), "actor", data, Topology(rank=rank, world=2))
        prof.close()  # (its listener thread, the job's clock, ends with it)
        assert prof.plan.roles_for(2) == (("actor",) if rank == 0 else ("actor", "ref"))
        names[rank] = prof.plan.capture_name(first=2, region=None, cycle=None)
    assert names == {0: "actor+ref/step2/rank0", 1: "actor+ref/step2/rank1"}
    prof = apply_policy(object(), "ref", data, Topology(rank=0, world=2))
    assert not prof.plan.enabled


@pytest.mark.parametrize(("roles", "window"), [
    ({}, ("rollout", "actor", "ref")),  # as `roles:` lists them
    ({"ref": {"enabled": False}}, ("rollout", "actor")),
    ({"rollout": {"backend": "nsight", "schedule": {"active": 1}}}, ("actor", "ref")),
    ({"rollout": {"steps": [5]}, "ref": {"steps": [9]}}, ("rollout", "actor", "ref")),
])
def test_the_window_is_the_enabled_group_on_the_backend(tmp_path: Path, roles: dict[str, Any],
                                                        window: tuple[str, ...]) -> None:
    """Steps never change it (ranks neither: the test above); being disabled or on another
    backend does."""
    loaded = load_policy(policy(tmp_path, colocate=[["rollout", "ref", "actor"]], **roles))
    assert window_roles(loaded, "actor") == window
    plan = compile_plan(loaded, "actor", Topology(rank=3, world=8))
    assert plan.capture_name(first=2, region=None, cycle=None) == "+".join(window) + "_step2"
    assert window_roles(load_policy(policy(tmp_path, colocate=())), "ref") == ("ref",)


def test_the_window_name_must_tell_apart_the_ranks_of_all_its_roles(tmp_path: Path) -> None:
    """Each role alone selects one rank, but they share one name: rank 0's actor and rank
    1's ref would both write actor+ref_step2."""
    def data(ref_ranks: list[int], name: str = "<role>[_step<step>]") -> dict[str, Any]:
        found = policy(tmp_path, actor={"ranks": [0], "name": name},
                       ref={"ranks": ref_ranks, "name": name}, rollout={"name": name})
        found["mesh"] = {"dp": 2}
        return found

    assert messages(data([1])) == [
        "<mapping>: error: the name cannot tell apart ranks 0 and 1 of colocated roles "
        "'actor' and 'ref', which share one name on every rank ('actor+ref'); add <rank> "
        "(at $.colocate[0])"]
    assert messages(data([0])) == []  # one rank: one name
    assert messages(data([1], "<role>[_step<step>]_<dp>")) == []  # dp0 and dp1
    unknown = data([1])
    del unknown["mesh"]  # no world to prove it against: <rank> is needed
    assert "select different ranks but share one name ('actor+ref' on every rank)" in \
        messages(unknown)[0]
