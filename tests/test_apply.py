"""apply_policy and profile_session as a user meets them: no silent misuse, no false alarm."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from policy_engine import (
    OffProfiler,
    PolicyError,
    RoleProfiler,
    Topology,
    apply_policy,
    profile_session,
)
from policy_engine.analysis.manifests import read_manifests
from policy_engine.testing import recording_backend


class Worker:
    def update_actor(self) -> int:
        self.prof.step()
        return 1

    prof: Any


@pytest.mark.parametrize("n", [np.int64(2), np.int32(2), torch.tensor(2), 2])
def test_integer_like_steps_are_steps(make_policy: Any, tmp_path: Path, n: Any) -> None:
    with recording_backend("torch") as rec:
        prof = profile_session(make_policy(steps=[2]), "actor", Topology())
        with prof.training_step(n):
            prof.step()
    assert rec.infos[0].steps == (2,)
    assert [r["steps"] for r in read_manifests(str(tmp_path / "out"))] == [[2]]


@pytest.mark.parametrize("n", [2.0, "2", True, torch.tensor(2.0), None])
def test_other_step_numbers_are_a_type_error(make_policy: Any, n: Any) -> None:
    prof = profile_session(make_policy(steps=[2]), "actor", Topology(rank=0, world=2))
    assert isinstance(prof, RoleProfiler)
    with pytest.raises(TypeError, match="integer step number"):
        prof.training_step(n)
    prof.close()
    with pytest.raises(TypeError, match="integer step number"):
        prof.training_step(n)  # still, once closed


def test_unknown_role_close_to_a_named_one_is_an_error(make_policy: Any) -> None:
    with pytest.raises(PolicyError, match=r"role 'actr' is not in the policy \(did you mean "
                                          r"'actor'\?\)"):
        apply_policy(Worker(), "actr", make_policy())


def test_unnamed_role_gets_the_defaults(make_policy: Any) -> None:
    policy = make_policy()
    assert isinstance(apply_policy(Worker(), "reward", policy), OffProfiler)
    policy["defaults"] = {"enabled": True, "torch": {"activities": ["cpu"]}}
    assert isinstance(apply_policy(Worker(), "reward", policy), RoleProfiler)


def test_applying_twice_is_idempotent(make_policy: Any) -> None:
    policy = make_policy(steps=[1], regions=["update_actor"])
    worker = Worker()
    with recording_backend("torch") as rec:
        first = apply_policy(worker, "actor", policy, Topology())
        wrapped = worker.update_actor
        second = apply_policy(worker, "actor", policy, Topology())
        assert second is first and worker.update_actor is wrapped
        worker.prof = first
        with first.training_step(1):
            worker.update_actor()
    assert [c for c in rec.calls if c[0] == "range_start"] == [("range_start", "update_actor")]


def test_applying_another_plan_replaces_the_first(make_policy: Any) -> None:
    worker = Worker()
    original = worker.update_actor
    with recording_backend("torch") as rec:
        first = apply_policy(worker, "actor", make_policy(steps=[1], regions=["update_actor"]),
                             Topology())
        second = apply_policy(worker, "actor", make_policy(steps=[2], regions=["update_actor"]),
                              Topology())
        assert second is not first
        assert worker.update_actor.__wrapped__ == original  # wrapped once, not twice
        worker.prof = second
        with second.training_step(2):
            worker.update_actor()
        first.step()  # closed: does nothing
    assert [c for c in rec.calls if c[0] == "range_start"] == [("range_start", "update_actor")]


def test_step_after_close_opens_nothing(make_policy: Any, tmp_path: Path) -> None:
    with recording_backend("torch") as rec:
        prof = profile_session(make_policy(), "actor", Topology())
        prof.step()
        prof.close()
        for _ in range(3):
            prof.step()
        with prof.training_step(1):
            pass
    assert [c[0] for c in rec.calls].count("open") == 1


def test_broken_override_in_the_environment_turns_profiling_off(
        make_policy: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.actor.stepz=[5]")
    with caplog.at_level(logging.WARNING, "policy_engine"):
        prof = apply_policy(Worker(), "actor", make_policy())
    assert isinstance(prof, OffProfiler)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["policy-engine: PROFILE_POLICY_SET[1]: roles.actor.stepz=[5]: error: "
                      "unknown key 'stepz' (did you mean 'steps'?) (at $.roles.actor.stepz)"]


def test_broken_policy_from_code_still_raises(make_policy: Any) -> None:
    policy = make_policy(stepz=[5])
    with pytest.raises(PolicyError, match="unknown key 'stepz'"):
        apply_policy(Worker(), "actor", policy)


def test_no_mesh_warning_only_when_it_is_true(make_policy: Any, caplog: Any) -> None:
    policy = make_policy(ranks={"tp": 0})
    with caplog.at_level(logging.WARNING, "policy_engine"):
        prof = apply_policy(Worker(), "actor", policy,
                            Topology(coords={"tp": 0}, sizes={"tp": 1}))
    assert isinstance(prof, RoleProfiler)
    assert not [r for r in caplog.records if "mesh" in r.getMessage()]
    with caplog.at_level(logging.WARNING, "policy_engine"):
        prof = apply_policy(Worker(), "critic", dict(policy, roles={
            "critic": policy["roles"]["actor"]}), Topology())
    assert isinstance(prof, OffProfiler)
    [warning] = [r.getMessage() for r in caplog.records if "coordinate" in r.getMessage()]
    assert "role 'critic' selects ranks by tp, but this process has no such coordinate" \
        in warning
