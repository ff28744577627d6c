"""A capture that records less than its schedule plans says why (runtime.capture.shortfall), and
``with profile_session(...)`` around training steps writes only the per-step captures."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, profile_session
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.runtime.role.profiler import RoleProfiler, State
from policy_engine.testing import recording_backend

SCHEDULE = {"warmup": 1, "active": 2, "repeat": 1}


def lines(out: Path, event: str) -> list[dict[str, Any]]:
    scan = scan_manifests(str(out))
    assert scan.problems == ()
    return [r for r in scan.records if r["event"] == event]


def shortfall_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "prof.step() call" in r.getMessage()]


def loop(prof: Any, steps: range, calls: int) -> None:
    for n in steps:
        with prof.training_step(n):
            for _ in range(calls):
                prof.step()


# ---------------------------------------------------------------- nothing recorded


def test_a_capture_that_records_nothing_says_why_once(
        make_policy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A loop that never calls prof.step() under a schedule: each capture writes nothing;
    one warning names the schedule and the inner steps seen; each close line says so."""
    prof = profile_session(make_policy(steps=[2, 3], schedule=SCHEDULE), "actor", Topology())
    with recording_backend("torch") as rec, caplog.at_level(logging.WARNING, "policy_engine"):
        loop(prof, range(1, 5), calls=0)
        prof.close()
    assert [c[0] for c in rec.calls] == ["open", "prepare", "discard", "close"] * 2
    why = ("capture of step {} ended at inner step 0 (after 0 prof.step() calls); schedule "
           "{{warmup: 1, active: 2, repeat: 1}} records from inner step 1: nothing recorded")
    [warning] = shortfall_warnings(caplog)
    assert warning.startswith("policy-engine: role 'actor': " + why.format(2) + "; make as "
                              "many prof.step() calls per capture as the schedule counts")
    out = tmp_path / "out"
    assert [(c["status"], c["traces"], c["reason"]) for c in lines(out, "close")] == [
        ("complete", 1, why.format(2)), ("complete", 1, why.format(3))]
    assert [(t["path"], t["status"], t["error"]) for t in lines(out, "trace")] == [
        (None, "partial", why.format(2)), (None, "partial", why.format(3))]


def test_a_cycle_cut_short_says_why(make_policy: Any, tmp_path: Path,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """One prof.step() a step (a framework callback) under {warmup: 1, active: 2}: the
    step records inner step 1 of its 2 active ones and is saved partial, with a reason."""
    prof = profile_session(make_policy(steps=[3], schedule=SCHEDULE), "actor", Topology())
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        loop(prof, range(1, 5), calls=1)
        prof.close()
    why = ("capture of step 3 ended at inner step 1 (after 1 prof.step() call), in cycle 0 "
           "of schedule {warmup: 1, active: 2, repeat: 1}, which records inner steps 1-2: "
           "saved partial with 1 of 2 active steps")
    assert len(shortfall_warnings(caplog)) == 1 and why in shortfall_warnings(caplog)[0]
    out = tmp_path / "out"
    [trace] = lines(out, "trace")
    assert (trace["status"], trace["inner_steps"]) == ("partial", [1])
    assert [(c["status"], c["reason"]) for c in lines(out, "close")] == [("complete", why)]


def test_enough_inner_steps_or_no_schedule_say_nothing(
        make_policy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for schedule, calls in ((SCHEDULE, 3), (None, 0), (None, 1)):
        prof = profile_session(make_policy(steps=[2], schedule=schedule), "actor",
                               Topology())
        with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
            loop(prof, range(1, 4), calls=calls)
            prof.close()
    assert shortfall_warnings(caplog) == []
    assert [t["status"] for t in lines(tmp_path / "out", "trace")] == ["complete"] * 3
    assert all("reason" not in c for c in lines(tmp_path / "out", "close"))


def test_an_exception_explains_itself(make_policy: Any, tmp_path: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """A step that raises is partial because of the exception: no schedule warning."""
    prof = profile_session(make_policy(steps=[2], schedule=SCHEDULE), "actor", Topology())
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"), \
            pytest.raises(ValueError), prof.training_step(2):
        prof.step()
        raise ValueError("boom")
    assert shortfall_warnings(caplog) == []
    assert [(c["status"], "reason" in c) for c in lines(tmp_path / "out", "close")] == [
        ("partial", False)]


# ---------------------------------------------------------------- with profile_session


@pytest.mark.parametrize("schedule", [None, SCHEDULE,
                                      {"wait": 1, "active": 1, "repeat": 1}])
def test_with_block_around_training_steps_writes_only_the_steps(
        make_policy: Any, tmp_path: Path, schedule: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    """The torchtitan loop: ``with profile_session(...) as prof:`` around
    ``training_step(n)``. The session capture entering the block began is dropped at the
    first training_step (no trace, no save); only the planned steps are written."""
    policy = make_policy(steps=[2, 3], schedule=schedule, limits={"captures": 2})
    with recording_backend("torch") as rec, \
            caplog.at_level(logging.WARNING, "policy_engine"), \
            profile_session(policy, "actor", Topology()) as prof:
        loop(prof, range(1, 5), calls=3)
    saves = [c[1] for c in rec.calls if c[0] == "save"]
    assert [s.split("/")[1] for s in saves] == ["step2", "step3"]  # the budget held both
    assert [i.steps for i in rec.infos] == [(), (2,), (3,)]
    out = tmp_path / "out"
    assert [t["steps"] for t in lines(out, "trace")] == [[2], [3]]
    first = lines(out, "close")[0]
    assert (first["steps"], first["traces"], first["status"]) == ([], 0, "complete")
    assert first["reason"] == (
        "the `with` block's loop called training_step(1) before any prof.step(): per-step "
        "captures replace the whole-session capture")
    assert shortfall_warnings(caplog) == []


def test_with_block_whose_loop_steps_first_keeps_its_session_capture(
        make_policy: Any, tmp_path: Path) -> None:
    """A plain loop (prof.step() first) keeps the whole-session capture; a training_step
    later closes it and switches to per-step captures, as before."""
    with recording_backend("torch") as rec, \
            profile_session(make_policy(steps=[2]), "actor", Topology()) as prof:
        assert isinstance(prof, RoleProfiler)
        prof.step()
        assert prof._state is State.SESSION  # the first step() kept the capture
        prof.step()
        with prof.training_step(2):
            prof.step()
    assert [i.steps for i in rec.infos] == [(), (2,)]
    assert len([c for c in rec.calls if c[0] == "save"]) == 2


def test_with_block_without_any_call_records_the_block(make_policy: Any,
                                                        tmp_path: Path) -> None:
    """``with profile_session(...): train()`` with no profiler call inside records the
    whole block, as ``with torch.profiler.profile():`` does."""
    with recording_backend("torch") as rec, \
            profile_session(make_policy(steps=[2]), "actor", Topology()):
        pass
    assert [c[0] for c in rec.calls] == ["open", "start", "step", "save", "close"]
    [trace] = lines(tmp_path / "out", "trace")
    assert (trace["steps"], trace["status"]) == ([], "complete")


# ---------------------------------------------------------------- the words


@pytest.mark.parametrize(("fields", "text"), [
    ({"warmup": 1, "active": 2}, "{warmup: 1, active: 2}"),
    ({"skip_first": 2, "wait": 1, "active": 1, "repeat": 3},
     "{skip_first: 2, wait: 1, active: 1, repeat: 3}"),
    ({}, "{active: 1}"),
])
def test_schedule_text_shows_what_differs_from_torch(fields: dict[str, int],
                                                      text: str) -> None:
    from policy_engine.language.values.schedule import Schedule
    from policy_engine.runtime.capture.shortfall import schedule_text

    assert schedule_text(Schedule(**fields)) == text


@pytest.mark.parametrize(("steps", "region", "text"), [
    ([3], None, "capture of step 3"), ([3, 4, 5], None, "capture of steps 3-5"),
    ([], None, "whole-session capture"), ([2], "update", "capture of step 2 (region update)"),
    ([], "update", "capture of region update"),
])
def test_capture_text(steps: list[int], region: str | None, text: str) -> None:
    from policy_engine.runtime.capture.shortfall import capture_text

    assert capture_text(steps, region) == text


def test_a_discrete_region_names_itself(make_policy: Any, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    policy = make_policy(steps=[2], discrete=True,
                         regions={"update": {"schedule": {"wait": 1, "active": 1}}})
    prof = profile_session(policy, "actor", Topology())
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"), \
            prof.training_step(2), prof.region("update"):
        pass
    [warning] = shortfall_warnings(caplog)
    assert ("capture of step 2 (region update) ended at inner step 0 (after 0 prof.step() "
            "calls); schedule {wait: 1, active: 1} records from inner step 1") in warning
