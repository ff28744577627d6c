"""One home each: the placement of a simulated world, the mesh a role is placed in, what
an unknown role gets, the plan that counts a role's traces, and how ranks and sizes print."""

from __future__ import annotations

from typing import Any

import pytest

from policy_engine import Topology, load_policy
from policy_engine.analysis.format import complement_spans, rank_spans, size_cell
from policy_engine.language.values.mesh import DIMS, effective_mesh
from policy_engine.language.values.ranks import RankSelector
from policy_engine.language.values.sizes import human_bytes
from policy_engine.plan.captures import count_ranges
from policy_engine.plan.compile import counting_plan, selects
from policy_engine.plan.placement import places
from policy_engine.plan.plan import Plan, RegionPlan

MESHED: dict[str, Any] = {
    "version": 1,
    "mesh": {"pp": 2, "dp": 4, "tp": 2},
    "roles": {
        "actor": {"enabled": True, "ranks": {"tp": 0, "dp": [0, -1]}},
        "rollout": {"enabled": True, "mesh": {"dp": 8, "tp": 2}, "ranks": [{"tp": -1}, 3]},
        "local": {"enabled": True, "ranks": {"local_rank": [0, -1], "node": 1}},
        "plain": {"enabled": True, "ranks": "1-4,-1"},
        "off": {"enabled": False, "ranks": "all"},
    },
}


@pytest.mark.parametrize("local_world", [None, 4])
@pytest.mark.parametrize("role", ["actor", "rollout", "local", "plain", "off", "unnamed"])
def test_places_decide_as_one_topology_per_rank_does(role: str,
                                                      local_world: int | None) -> None:
    policy = load_policy(MESHED)
    mesh = policy.mesh_for(role)
    spec = policy.role(role)
    placed = list(places(policy, role, 16, local_world))
    assert [p.rank for p in placed] == list(range(16))
    for place in placed:
        topo = Topology.for_rank(place.rank, 16, mesh, local_world)
        assert place.coords == {d: topo.coords[d] for d in DIMS if d in topo.coords}
        assert list(place.coords) == [d for d in DIMS if d in topo.coords]
        assert (place.local_rank, place.node) == (topo.local_rank, topo.node)
        assert (place.topology == topo) is selects(spec, topo)
        assert place.topology is None or place.topology == topo


def test_places_without_a_mesh_and_a_mesh_that_does_not_fit() -> None:
    policy = load_policy({"version": 1, "roles": {"a": {"enabled": True, "ranks": [0, -1]}}})
    assert [p.rank for p in places(policy, "a", 5) if p.topology] == [0, 4]
    assert all(p.coords == {} for p in places(policy, "a", 5))
    with pytest.raises(ValueError, match="has 16 ranks but the world has 8"):
        list(places(load_policy(MESHED), "actor", 8))


def test_the_mesh_precedence_is_cli_then_role_then_top_level() -> None:
    assert effective_mesh({"dp": 2}, {"tp": 2}, {"pp": 2}) == {"dp": 2}
    assert effective_mesh(None, {"tp": 2}, {"pp": 2}) == {"tp": 2}
    assert effective_mesh(None, {}, {"pp": 2}) == {"pp": 2}
    assert effective_mesh(None, None, None) == {}
    policy = load_policy(MESHED)
    assert dict(policy.mesh_for("rollout")) == {"dp": 8, "tp": 2}
    assert dict(policy.mesh_for("actor")) == {"pp": 2, "dp": 4, "tp": 2}
    assert dict(policy.with_mesh({"dp": 16}).mesh_for("rollout")) == {"dp": 16}


def test_a_role_that_writes_the_defaults_mesh_again_is_pointed_at_itself() -> None:
    policy = load_policy({"version": 1, "defaults": {"mesh": {"dp": 4}},
                          "roles": {"same": {"mesh": {"dp": 4}}, "taken": {}}})
    assert policy.mesh_path("same") == "$.roles.same.mesh"
    assert policy.mesh_path("taken") == "$.defaults.mesh"
    assert policy.with_mesh({"dp": 4}).mesh_path("same") == "$.mesh"


def test_what_an_unknown_role_gets_is_said_in_one_place() -> None:
    policy = load_policy(MESHED)
    assert policy.unknown_role("actor") is None
    assert policy.unknown_role("actr") == " (did you mean 'actor'?)"
    assert policy.unknown_role("reward") == ""


def test_the_counting_plan_is_a_profiled_process_placed_nowhere() -> None:
    policy = load_policy({"version": 1, "roles": {"r": {
        "enabled": True, "steps": [2, 5], "discrete": True,
        "schedule": {"warmup": 1, "active": 2},
        "regions": {"gen": {"schedule": {"active": 1}}, "upd": {}}}}})
    spec = policy.role("r")
    by_hand = Plan(spec, 0, 1, True, spec.template, regions=tuple(
        RegionPlan(r.name, r.enabled, r.schedule if r.own_schedule else spec.schedule)
        for r in spec.regions))
    plan = counting_plan(spec)
    assert plan == by_hand
    assert count_ranges(plan, region_calls=1) == count_ranges(by_hand, region_calls=1)


@pytest.mark.parametrize(("ranks", "kwargs", "text"), [
    ([0, 1, 2, 5, None], {}, "0-2,5,?"),
    ([5, 2, 1, 0, 1], {"sep": ", "}, "0-2, 5"),
    ([], {"empty": "none"}, "none"),
    ([None], {"empty": "-"}, "?"),
    ([7], {}, "7"),
])
def test_rank_spans(ranks: list[int | None], kwargs: dict[str, str], text: str) -> None:
    assert rank_spans(ranks, **kwargs) == text


def test_complement_spans() -> None:
    assert complement_spans([0, 5, 6], 10) == "1-4,7-9"
    assert complement_spans(range(4), 4) == "none"


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (3 << 20, "3.0 MiB"),
    (5 << 30, "5.0 GiB"), (2 << 40, "2.0 TiB"), (None, "-"), (True, "-"), ("9", "-")])
def test_size_cell_climbs_to_tib(n: object, text: str) -> None:
    assert size_cell(n) == text


def test_both_size_styles_share_one_ladder() -> None:
    assert human_bytes(2 << 40) == "2 TiB" and size_cell(2 << 40) == "2.0 TiB"
    assert human_bytes(1 << 60).endswith(" TiB") and size_cell(1 << 60).endswith(" TiB")


@pytest.mark.parametrize("value", [
    "all", [], 0, -1, -9, "0-3,8,-2", "2-100", {"tp": -1}, {"tp": "all", "dp": [0, -5]},
    [{"pp": 1, "tp": 0}, "5-6"], {"local_rank": [0, -1]}, {"node": -1, "tp": 1}, {"ep": 0}])
@pytest.mark.parametrize("local_world", [None, 4])
def test_the_matcher_answers_as_matches_does(value: object, local_world: int | None) -> None:
    selector = RankSelector.parse(value)
    mesh = {"pp": 2, "dp": 4, "tp": 2}
    sizes = Topology.for_rank(0, 16, mesh, local_world).selector_sizes()
    match = selector.matcher(16, sizes)
    for rank in range(20):  # past the world too: what the sizes do not cover
        coords = Topology.for_rank(rank % 16, 16, mesh, local_world).selector_coords()
        assert match(rank, coords) is selector.matches(rank, 16, coords, sizes), rank
