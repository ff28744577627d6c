"""The example policies in ``policies/`` are valid, strict-clean and compile on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_engine import Topology, compile_plan, load_policy
from policy_engine.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
POLICIES = sorted((ROOT / "policies").glob("*.yaml"))
WORLD = 8


@pytest.fixture(params=POLICIES, ids=[p.name for p in POLICIES])
def policy_path(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_there_are_example_policies() -> None:
    assert {p.name for p in POLICIES} >= {"verl_ppo.yaml", "megatron_3d.yaml",
                                          "ascend_npu.yaml", "nsight_rollout.yaml",
                                          "verl_hybrid.yaml"}


def test_verl_hybrid_places_the_rollout_in_its_own_mesh() -> None:
    """The actor is FSDP over dp=8; the rollout's own mesh {dp: 4, tp: 2} selects the first
    tp rank of each inference engine on the same 8 ranks."""
    policy = load_policy(ROOT / "policies" / "verl_hybrid.yaml", strict=True)
    assert list(policy.mesh_for("rollout").items()) == [("dp", 4), ("tp", 2)]
    assert dict(policy.mesh_for("actor")) == {"dp": 8}
    chosen = {role: [rank for rank in range(WORLD) if compile_plan(
        policy, role, Topology(rank=rank, world=WORLD)).enabled]
        for role in ("actor", "ref", "rollout")}
    assert chosen == {"actor": [0, 7], "ref": [0], "rollout": [0, 2, 4, 6]}


def test_validates_with_the_cli(policy_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--strict", str(policy_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{policy_path}: valid"
    # without a world, at most a note that the ranks were not checked against one
    assert all(": note: ranks of " in line for line in out[:-1])


def test_validates_with_a_world(policy_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--strict", "--world", str(WORLD), str(policy_path)]) == 0
    assert capsys.readouterr().out == f"{policy_path}: valid\n"


def test_points_editors_at_the_schema(policy_path: Path) -> None:
    first = policy_path.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../schemas/profile_policy.schema.json"
    assert (policy_path.parent / "../schemas/profile_policy.schema.json").is_file()


def test_compiles_on_every_rank(policy_path: Path) -> None:
    policy = load_policy(policy_path, strict=True)
    assert policy.role_names
    for role in policy.role_names:
        plans = [compile_plan(policy, role, Topology(rank=rank, world=WORLD))
                 for rank in range(WORLD)]
        if policy.role(role).enabled:
            assert any(plan.enabled for plan in plans), role
            names = {plan.capture_name(first=1, region=None, cycle=None)
                     for plan in plans if plan.enabled}
            assert len(names) == sum(plan.enabled for plan in plans), role  # unique per rank
        else:
            assert not any(plan.enabled for plan in plans), role


def test_explains_every_role(policy_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for role in load_policy(policy_path).role_names:
        assert main(["explain", str(policy_path), "--role", role, "--world", str(WORLD)]) == 0
        assert capsys.readouterr().out.startswith(f"role {role}, world {WORLD}")
