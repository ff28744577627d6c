"""A role's own ``mesh``: verl's hybrid engine lays the same ranks out one way for the
actor (FSDP, dp=8) and another for the rollout (dp=4, tp=2). Validate, explain, nsys-args
and compile_plan place each role in its own mesh; live coordinates still win."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from policy_engine import PolicyError, Topology, compile_plan, load_policy
from policy_engine.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
HYBRID = ROOT / "policies" / "verl_hybrid.yaml"

# Line numbers below count from the "version: 1" line as line 1.
BASE = """\
version: 1
mesh: {dp: 8}
roles:
  actor:
    enabled: true
    ranks: {dp: [0, -1]}
    steps: [2]
  rollout:
    enabled: true
    mesh: {dp: 4, tp: 2}
    ranks: {tp: 0}
    steps: [2]
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


# ---------------------------------------------------------------- the model


def test_a_role_mesh_replaces_the_defaults_mesh_whole() -> None:
    policy = load_policy({
        "version": 1, "mesh": {"dp": 8},
        "defaults": {"mesh": {"pp": 2, "dp": 4}},
        "roles": {"rollout": {"mesh": {"dp": 4, "tp": 2}}, "actor": {},
                  "critic": {"mesh": {}}},
    })
    # Replaced, not merged: no pp from defaults, and the rollout's order kept.
    assert list(policy.mesh_for("rollout").items()) == [("dp", 4), ("tp", 2)]
    assert list(policy.mesh_for("actor").items()) == [("pp", 2), ("dp", 4)]
    assert list(policy.mesh_for("unnamed").items()) == [("pp", 2), ("dp", 4)]
    assert dict(policy.mesh_for("critic")) == {"dp": 8}  # {}: the top-level mesh
    assert policy.mesh_path("rollout") == "$.roles.rollout.mesh"
    assert policy.mesh_path("actor") == "$.defaults.mesh"
    assert policy.mesh_path("critic") == "$.mesh"
    replaced = policy.with_mesh({"tp": 8})
    assert {dict(replaced.mesh_for(r))["tp"] for r in ("rollout", "actor", "x")} == {8}


# ---------------------------------------------------------------- validate


CASES: dict[str, tuple[str, tuple[str, ...], list[str]]] = {
    "size against the top-level mesh": (
        BASE.replace("{dp: 4, tp: 2}", "{dp: 4, tp: 4}"), (),
        ["p.yaml:10:11: error: mesh dp=4,tp=4 of role 'rollout' has 16 ranks but the world "
         "has 8 (the size of the top-level mesh dp=8) (at $.roles.rollout.mesh)"]),
    "size against --world": (
        BASE.replace("mesh: {dp: 8}\n", ""), ("--world", "16"),
        ["p.yaml:5:12: warning: ranks select by dp but neither the policy nor the role has "
         "a mesh: these "
         "coordinates must come from a DeviceMesh or Megatron at run time, else no rank of "
         "role 'actor' is profiled (at $.roles.actor.ranks)",
         "p.yaml:9:11: error: mesh dp=4,tp=2 of role 'rollout' has 8 ranks but the world "
         "has 16 (at $.roles.rollout.mesh)"]),
    "unknown dimension": (
        BASE.replace("tp: 2}", "tq: 2}"), (),
        ["p.yaml:10:19: error: unknown mesh dimension 'tq' (did you mean 'tp'?) "
         "(at $.roles.rollout.mesh.tq)"]),
    "size zero": (
        BASE.replace("tp: 2}", "tp: 0}"), (),
        ["p.yaml:10:23: error: tp must be >= 1, got 0 (at $.roles.rollout.mesh.tp)"]),
    "a dimension only the top-level mesh has": (
        BASE.replace("mesh: {dp: 8}", "mesh: {dp: 4, tp: 2}")
            .replace("{dp: 4, tp: 2}\n    ranks: {tp: 0}", "{dp: 8}\n    ranks: {tp: 0}"), (),
        ["p.yaml:11:17: error: dimension 'tp' is not in the mesh (mesh: dp) "
         "(at $.roles.rollout.ranks.tp)"]),
    "out of range in the role's mesh": (
        BASE.replace("ranks: {tp: 0}", "ranks: {tp: 2}"), (),
        ["p.yaml:11:17: error: tp 2 is out of range (tp has 2) (at $.roles.rollout.ranks.tp)"]),
    "names proven unique in the role's mesh": (
        BASE + "    name: <role>_<tp><dp>_<pp>\n" + "    ranks: all\n", (),
        []),  # filled in below: the role mesh's coordinates tell every rank apart
    "names that repeat in the role's mesh": (
        BASE.replace("ranks: {tp: 0}", "ranks: all") + "    name: <role>_<dp>\n", (),
        ["p.yaml:13:11: error: the name cannot tell apart ranks 0 and 1 of role 'rollout'; "
         "add <rank> (at $.roles.rollout.name)"]),
    "defaults.mesh, once for every role that takes it": (
        BASE.replace("roles:\n", "defaults:\n  mesh: {dp: 2, tp: 2}\nroles:\n"), (),
        ["p.yaml:4:9: error: mesh dp=2,tp=2 of role 'actor' and any role not named under "
         "roles has 4 ranks but the world has 8 (the size of the top-level mesh dp=8) "
         "(at $.defaults.mesh)"]),
    "--mesh replaces the role's mesh": (
        BASE, ("--mesh", "dp=2,tp=4"),
        ["p.yaml:2:7: warning: --mesh dp=2,tp=4 replaces the policy's mesh dp=8 (at $.mesh)",
         "p.yaml:10:11: warning: --mesh dp=2,tp=4 replaces the mesh dp=4,tp=2 of role "
         "'rollout' (at $.roles.rollout.mesh)"]),
    "colocated on different meshes with coordinates in the name": (
        BASE + "colocate: [[actor, rollout]]\n", (),
        ["p.yaml:10:11: error: colocated roles 'actor' and 'rollout' share torch captures but "
         "lay out their ranks on different meshes (dp=8 and dp=4,tp=2) while the name shows "
         "coordinates: one capture has one name; give them one mesh, or drop "
         "<tp><pp><dp><cp><ep> from the name (at $.roles.rollout.mesh)"]),
    "colocated on different meshes, names without coordinates": (
        BASE.replace("roles:\n", "defaults: {name: '<role>_step<step>_rank<rank>'}\nroles:\n")
        + "colocate: [[actor, rollout]]\n", (), []),
}
CASES["names proven unique in the role's mesh"] = (
    BASE.replace("ranks: {tp: 0}", "ranks: all") + "    name: <role>_<tp><dp>\n", (), [])


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_places_each_role_in_its_mesh(case: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    text, extra, expected = CASES[case]
    monkeypatch.chdir(tmp_path)
    write(tmp_path, text)
    code, lines, _ = run(capsys, "validate", "p.yaml", *extra)
    problems = [line for line in lines if not line.startswith("p.yaml: ")]
    assert problems == expected
    assert code == (1 if any(": error: " in line for line in expected) else 0)


def test_a_role_in_its_mesh_is_checked_when_the_top_level_mesh_is_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, BASE.replace("ranks: {tp: 0}", "ranks: {tp: 5}"))
    code, lines, _ = run(capsys, "validate", path, "--world", "8")
    assert code == 1
    assert lines[0].endswith("error: tp 5 is out of range (tp has 2) "
                             "(at $.roles.rollout.ranks.tp)")


# ---------------------------------------------------------------- explain, nsys-args


def test_explain_shows_the_rollouts_coordinates(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run(capsys, "explain", str(HYBRID), "--role", "rollout", "--steps", "2")
    assert code == 0
    assert lines[0] == "role rollout, world 8, outer steps 2-2"
    named = [line.strip() for line in lines if line.startswith("    rank ")]
    assert [line.split(":")[0] for line in named] == [
        "rank 0 (tp0dp0)", "rank 2 (tp0dp1)", "rank 4 (tp0dp2)", "rank 6 (tp0dp3)"]
    assert named[1].endswith("_rank2-of-8_tp0dp1_pid<pid>_<timestamp>")
    assert main(["explain", str(HYBRID), "--role", "rollout", "--format", "json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert [entry["coords"] for entry in ranks] == [
        {"tp": rank % 2, "dp": rank // 2} for rank in range(8)]
    assert main(["explain", str(HYBRID), "--role", "actor", "--format", "json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert [entry["coords"] for entry in ranks] == [{"dp": rank} for rank in range(8)]
    assert [entry["rank"] for entry in ranks if entry["profiled"]] == [0, 7]


def test_explain_mesh_option_replaces_the_roles_mesh(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(HYBRID), "--role", "rollout", "--mesh", "dp=2,tp=4",
                 "--format", "json"]) == 0
    out, err = capsys.readouterr()
    ranks = json.loads(out)["ranks"]
    assert [entry["rank"] for entry in ranks if entry["profiled"]] == [0, 4]
    assert "replaces the mesh dp=4,tp=2 of role 'rollout'" in err


def test_explain_without_a_world_takes_the_roles_mesh(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, BASE.replace("mesh: {dp: 8}\n", ""))
    code, lines, _ = run(capsys, "explain", path, "--role", "rollout")
    assert code == 0 and lines[0].startswith("role rollout, world 8,")
    assert main(["explain", path, "--role", "actor"]) == 2  # no mesh: --world needed
    assert "give --world N" in capsys.readouterr().err


def test_nsys_args_places_the_role_in_its_mesh(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, BASE.replace("    steps: [2]\n", "    steps: [2]\n    backend: nsys\n"))
    code, lines, _ = run(capsys, "nsys-args", path, "--role", "rollout", "--format", "json")
    assert code == 0
    data = json.loads("\n".join(lines))
    assert (data["profiled_ranks"], data["unprofiled_ranks"]) == ("0,2,4,6", "1,3,5,7")
    assert "_tp0dp1_" in data["ranks"]["2"]["reports"][0]


# ---------------------------------------------------------------- compile_plan


def test_compile_plan_places_each_role_in_its_mesh(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, BASE))
    rollout = compile_plan(policy, "rollout", Topology(rank=2, world=8))
    actor = compile_plan(policy, "actor", Topology(rank=2, world=8))
    assert (dict(rollout.coords), rollout.enabled) == ({"dp": 1, "tp": 0}, True)
    assert (dict(actor.coords), actor.enabled) == ({"dp": 2}, False)
    assert "_rank2-of-8_tp0dp1_" in rollout.capture_name(first=2, region=None, cycle=None)
    assert compile_plan(policy, "actor", Topology(rank=7, world=8)).enabled


def test_a_role_mesh_that_does_not_cover_the_world_names_itself(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, BASE.replace("mesh: {dp: 8}\n", "")))
    with pytest.raises(PolicyError) as caught:
        compile_plan(policy, "rollout", Topology(rank=0, world=16))
    [problem] = caught.value.problems
    assert problem.json_path == "$.roles.rollout.mesh"
    assert "mesh dp=4,tp=2 has 8 ranks but the world has 16" in problem.message


@pytest.mark.parametrize(("actor_ranks", "taking_part"), [("{dp: 1}", ("rollout",)),
                                                          ("{dp: 2}", ("actor", "rollout"))])
def test_colocated_peers_are_placed_in_their_own_mesh(tmp_path: Path, actor_ranks: str,
                                                      taking_part: tuple[str, ...]) -> None:
    """Rank 2 is the actor's dp2 and the rollout's dp1: the actor takes part in the
    rollout's captures there when its own coordinates select it (the name is the whole
    window's either way)."""
    text = (BASE.replace("roles:\n", "defaults: {name: '<role>_step<step>_rank<rank>'}\nroles:\n")
            .replace("{dp: [0, -1]}", actor_ranks) + "colocate: [[actor, rollout]]\n")
    policy = load_policy(write(tmp_path, text))
    explicit = compile_plan(policy, "rollout", Topology(rank=2, world=8))
    simulated = compile_plan(policy, "rollout", Topology.for_rank(2, 8, {"dp": 4, "tp": 2}))
    # Live coordinates from the rollout's DeviceMesh are the rollout's, not the actor's.
    live = compile_plan(policy, "rollout", attrs.evolve(
        Topology.for_rank(2, 8, {"dp": 4, "tp": 2}), source="device_mesh"))
    for plan in (explicit, simulated, live):
        assert plan.roles_for(2) == taking_part
        assert plan.capture_name(first=2, region=None, cycle=None) == "actor+rollout_step2_rank2"


@pytest.fixture
def fake_world() -> Iterator[Callable[[int, int], Any]]:
    """One rank of a world in this process, with torch's ``fake`` process group."""
    pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(rank: int, world: int) -> Any:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        return dist

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_roles_device_mesh_wins_over_its_policy_mesh(
        tmp_path: Path, fake_world: Callable[[int, int], Any]) -> None:
    """verl's rollout device mesh, ("dp", "infer_tp") of (2, 4), against a policy that
    says dp=4, tp=2: at run time the live mesh decides."""
    from torch.distributed.device_mesh import init_device_mesh

    fake_world(5, 8)
    live = Topology.from_device_mesh(init_device_mesh("cpu", (2, 4),
                                                      mesh_dim_names=("dp", "infer_tp")))
    policy = load_policy(write(tmp_path, BASE))
    plan = compile_plan(policy, "rollout", live)
    assert dict(plan.coords) == {"dp": 1, "tp": 1}  # the file alone would say dp 2, tp 1
    assert not plan.enabled
    assert compile_plan(policy, "rollout", Topology(rank=5, world=8)).coords == {"dp": 2,
                                                                                 "tp": 1}
