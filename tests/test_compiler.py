"""compile_plan: frozen, hashable, JSON-able plans; mesh coordinates; off plans."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policy_engine import PolicyError, Topology, compile_plan, load_policy

POLICY: dict[str, Any] = {
    "version": 1,
    "prefix": "p",
    "mesh": {"pp": 2, "dp": 2, "tp": 2},
    "defaults": {"steps": [2, 3], "schedule": {"warmup": 1, "active": 2, "repeat": 1}},
    "roles": {
        "actor": {"enabled": True, "ranks": {"tp": 0, "dp": [0, -1]},
                  "regions": {"update_actor": {}, "compute_log_prob": {"enabled": False}}},
        "rollout": {"enabled": False},
    },
}


def test_plan_is_frozen_hashable_and_equal_for_equal_inputs() -> None:
    policy = load_policy(POLICY)
    a = compile_plan(policy, "actor", Topology(rank=2, world=8))
    b = compile_plan(load_policy(POLICY), "actor", Topology(rank=2, world=8))
    assert a == b and hash(a) == hash(b) and a.plan_hash == b.plan_hash
    assert json.loads(json.dumps(a.to_json())) == a.to_json()
    with pytest.raises(AttributeError):
        a.rank = 3  # type: ignore[misc]
    assert compile_plan(policy, "actor", Topology(rank=4, world=8)).plan_hash != a.plan_hash


@pytest.mark.parametrize(("rank", "coords", "enabled"), [
    (0, {"tp": 0, "pp": 0, "dp": 0}, True),
    (2, {"tp": 0, "pp": 0, "dp": 1}, True),
    (5, {"tp": 1, "pp": 1, "dp": 0}, False),
    (6, {"tp": 0, "pp": 1, "dp": 1}, True),
])
def test_mesh_coordinates_last_dimension_fastest(rank: int, coords: dict[str, int],
                                                 enabled: bool) -> None:
    plan = compile_plan(load_policy(POLICY), "actor", Topology(rank=rank, world=8))
    assert dict(plan.coords) == coords and plan.enabled is enabled
    if enabled:
        tp, pp, dp = coords["tp"], coords["pp"], coords["dp"]
        assert plan.capture_name(first=2, region=None, cycle=0) == (
            f"actor/step2/cycle0/p_rank{rank}-of-8_tp{tp}pp{pp}dp{dp}_pid<pid>_<timestamp>")


def test_plan_resolves_regions_and_schedule() -> None:
    plan = compile_plan(load_policy(POLICY), "actor", Topology(rank=0, world=8))
    assert [(r.name, r.enabled) for r in plan.regions] == [
        ("update_actor", True), ("compute_log_prob", False)]
    assert plan.regions[0].schedule == plan.schedule
    assert 2 in plan.steps and 4 not in plan.steps


def test_mesh_that_does_not_fit_the_world_is_a_policy_error() -> None:
    with pytest.raises(PolicyError) as info:
        compile_plan(load_policy(POLICY), "actor", Topology(rank=0, world=4))
    assert info.value.problems[0].json_path == "$.mesh"
    assert "has 8 ranks but the world has 4" in str(info.value)


def test_disabled_role_compiles_whatever_its_group_size() -> None:
    plan = compile_plan(load_policy(POLICY), "rollout", Topology(rank=1, world=2))
    assert not plan.enabled and plan.rank == 1 and plan.world == 2


def test_unnamed_role_gets_defaults() -> None:
    plan = compile_plan(load_policy(POLICY), "critic", Topology(rank=0, world=8))
    assert not plan.enabled
    on = load_policy({"version": 1, "defaults": {"enabled": True}})
    assert compile_plan(on, "critic", Topology()).enabled
