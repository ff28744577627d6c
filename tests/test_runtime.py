"""The runtime interpreter through the recording backend: transitions, modes, safety."""

from __future__ import annotations

import json
import logging
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine import (
    OffProfiler,
    ProfilingError,
    RoleProfiler,
    Topology,
    apply_policy,
    profile_session,
)
from policy_engine.analysis.manifests import read_manifests, scan_manifests
from policy_engine.runtime.role.profiler import State
from policy_engine.testing import recording_backend


def records(out: Path) -> list[dict[str, Any]]:
    rows = read_manifests(str(out))
    for row in rows:
        row.pop("_manifest")
    return sorted(rows, key=lambda r: r["start"])


class Worker:
    def __init__(self) -> None:
        self.calls = 0

    def update_actor(self, fail: bool = False) -> int:
        self.calls += 1
        if fail:
            raise KeyError("boom")
        return self.calls

    def compute_log_prob(self) -> str:
        return "logp"


# -- the schedule equals torch.profiler's -----------------------------------------------

def torch_cycles(fields: dict[str, int], n: int) -> list[list[int]]:
    """The inner steps each trace torch.profiler.schedule would save holds."""
    import torch.profiler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = torch.profiler.schedule(**fields)
    cycles: list[list[int]] = []
    current: list[int] | None = None
    for step in range(n):
        action = fn(step).name
        if action in ("RECORD", "RECORD_AND_SAVE"):
            if current is None:
                current = []
            current.append(step)
            if action == "RECORD_AND_SAVE":
                cycles.append(current)
                current = None
    if current is not None:  # torch saves a cycle cut short when the profiler stops
        cycles.append(current)
    return cycles


@settings(max_examples=60, deadline=None)
@given(wait=st.integers(0, 3), warmup=st.integers(0, 3), active=st.integers(1, 3),
       repeat=st.integers(0, 3), skip_first=st.integers(0, 4),
       skip_first_wait=st.integers(0, 1), n=st.integers(0, 30))
def test_recorded_steps_equal_torch_schedule(tmp_path_factory: Any, wait: int, warmup: int,
                                             active: int, repeat: int, skip_first: int,
                                             skip_first_wait: int, n: int) -> None:
    fields = dict(wait=wait, warmup=warmup, active=active, repeat=repeat,
                  skip_first=skip_first, skip_first_wait=skip_first_wait)
    out = tmp_path_factory.mktemp("sched")
    policy = {"version": 1, "output_dir": str(out),
              "roles": {"actor": {"enabled": True, "schedule": fields, "steps": [1],
                                  "name": "<role>_step<step>_c<cycle>"}}}
    with recording_backend("torch", write_files=False) as rec:
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(1):
            for _ in range(n):
                prof.step()
    rows = records(out)
    saved = [r["inner_steps"] for r in rows if r["path"]]
    assert saved == torch_cycles(fields, n + 1)
    if not saved:  # every capture leaves a line, even one that recorded nothing
        assert [(r["status"], r["path"]) for r in rows] == [("partial", None)]
    # The backend is called on transitions only: one start per cycle.
    assert sum(c[0] == "start" for c in rec.calls) == len(saved)


# -- outer steps, merge, discrete ---------------------------------------------------------

def test_only_profiled_steps_open_captures(make_policy: Any, tmp_path: Path) -> None:
    with recording_backend("torch") as rec:
        prof = profile_session(make_policy(steps=[2, 4]), "actor", Topology())
        for n in range(6):
            with prof.training_step(n):
                prof.step()
    rows = records(tmp_path / "out")
    assert [r["steps"] for r in rows] == [[2], [4]]
    assert [r["status"] for r in rows] == ["complete", "complete"]
    assert rec.actions().count(("close",)) == 2
    for row in rows:
        assert (tmp_path / "out" / row["path"]).is_file()
        assert f"step{row['steps'][0]}" in row["path"]


def test_merge_steps_makes_one_capture(make_policy: Any, tmp_path: Path) -> None:
    with recording_backend("torch"):
        prof = profile_session(make_policy(steps="2-4,7", merge_steps=True), "actor",
                               Topology())
        for n in range(9):
            with prof.training_step(n):
                prof.step()
    rows = records(tmp_path / "out")
    assert [r["steps"] for r in rows] == [[2, 3, 4], [7]]
    assert "/step2-4/" in rows[0]["path"] and "/step7/" in rows[1]["path"]


def test_discrete_regions_are_captures(make_policy: Any, tmp_path: Path) -> None:
    policy = make_policy(steps=[1], discrete=True, regions=["update_actor", "compute_log_prob"],
                         schedule={"active": 1, "repeat": 1})
    worker = Worker()
    with recording_backend("torch") as rec:
        prof = apply_policy(worker, "actor", policy, Topology())
        for n in range(3):
            with prof.training_step(n):
                worker.compute_log_prob()
                worker.update_actor()
                prof.step()
    rows = records(tmp_path / "out")
    assert [(r["region"], r["steps"]) for r in rows] == [
        ("compute_log_prob", [1]), ("update_actor", [1])]
    # Values are sanitized: "_" never appears inside one.
    assert all(f"/{r['region'].replace('_', '-')}/" in r["path"] for r in rows)
    assert [r["status"] for r in rows] == ["complete", "complete"]
    assert rec.calls.count(("open", "actor", "update_actor")) == 1


def test_session_capture_without_training_step(make_policy: Any, tmp_path: Path) -> None:
    with recording_backend("torch") as rec, \
            profile_session(make_policy(), "actor", Topology()) as prof:
        for _ in range(3):
            prof.step()
    rows = records(tmp_path / "out")
    assert len(rows) == 1 and rows[0]["steps"] == [] and "_step" not in rows[0]["path"]
    # As with torch.profiler.profile: recording from __enter__, a step marker per step().
    assert rows[0]["inner_steps"] == [0, 1, 2, 3]
    assert rec.actions()[-2:] == [("save", rows[0]["path"][: -len(".rec")], 0), ("close",)]


def test_session_capture_opens_at_first_step_without_with(make_policy: Any,
                                                           tmp_path: Path) -> None:
    with recording_backend("torch"):
        prof = profile_session(make_policy(), "actor", Topology())
        for _ in range(3):
            prof.step()
        prof.close()
    assert [r["inner_steps"] for r in records(tmp_path / "out")] == [[0, 1, 2]]


def test_discrete_region_joining_a_running_capture_is_a_range(tmp_path: Path) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path / "out"), "roles": {
        "actor": {"enabled": True, "steps": [1]},
        "ref": {"enabled": True, "steps": [1], "discrete": True,
                "regions": ["compute_log_prob"]}}}
    ref = Worker()
    with recording_backend("torch") as rec:
        a = profile_session(policy, "actor", Topology())
        r = apply_policy(ref, "ref", policy, Topology())
        with a.training_step(1), r.training_step(1):
            ref.compute_log_prob()
    assert ("range_start", "compute_log_prob") in rec.calls
    assert [(x["role"], x["joined"]) for x in records(tmp_path / "out")] == [("actor", ["ref"])]


# -- exception safety ---------------------------------------------------------------------

def test_exception_in_region_stops_capture_and_propagates(make_policy: Any,
                                                          tmp_path: Path) -> None:
    worker = Worker()
    policy = make_policy(steps=[1, 2], regions=["update_actor"])
    with recording_backend("torch") as rec:
        prof = apply_policy(worker, "actor", policy, Topology())
        err = None
        with pytest.raises(KeyError) as info, prof.training_step(1):
            try:
                worker.update_actor(fail=True)
            except KeyError as e:
                err = e
                raise
        assert info.value is err  # unchanged
        assert worker.calls == 1  # ran exactly once
        with prof.training_step(2):
            worker.update_actor()
    rows = records(tmp_path / "out")
    assert [r["status"] for r in rows] == ["partial", "complete"]
    assert ("range_start", "update_actor") in rec.calls
    assert rec.calls.count(("range_end", "update_actor")) == 2


def test_exception_in_discrete_region(make_policy: Any, tmp_path: Path) -> None:
    worker = Worker()
    policy = make_policy(steps="all", discrete=True, regions=["update_actor"])
    with recording_backend("torch"), warnings.catch_warnings():
        apply_policy(worker, "actor", policy, Topology())
        with pytest.raises(KeyError):
            worker.update_actor(fail=True)
        worker.update_actor()
    assert worker.calls == 2
    assert [r["status"] for r in records(tmp_path / "out")] == ["partial", "complete"]


# -- colocated roles ----------------------------------------------------------------------

def two_roles(tmp_path: Path) -> dict[str, Any]:
    role = {"enabled": True, "steps": [1], "schedule": {"warmup": 1, "active": 2, "repeat": 1}}
    return {"version": 1, "output_dir": str(tmp_path / "out"),
            "roles": {"actor": dict(role, regions=["update_actor"]),
                      "ref": dict(role, regions=["compute_log_prob"])}}


def test_colocated_roles_share_one_capture(tmp_path: Path) -> None:
    policy = two_roles(tmp_path)
    actor, ref = Worker(), Worker()
    with recording_backend("torch") as rec:
        a = apply_policy(actor, "actor", policy, Topology())
        r = apply_policy(ref, "ref", policy, Topology())
        with a.training_step(1), r.training_step(1):
            r.step()  # ref's step() reaches the actor's capture: warm-up -> record
            ref.compute_log_prob()
            actor.update_actor()
            a.step()
    rows = records(tmp_path / "out")
    assert len(rows) == 1
    assert rows[0]["role"] == "actor" and rows[0]["joined"] == ["ref"]
    assert rows[0]["inner_steps"] == [1, 2]
    assert rec.calls.count(("open", "actor", None)) == 1
    assert ("open", "ref", None) not in rec.calls
    assert ("range_start", "compute_log_prob") in rec.calls


def test_colocated_roles_from_two_threads(tmp_path: Path) -> None:
    policy = two_roles(tmp_path)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(role: str) -> None:
        try:
            prof = profile_session(policy, role, Topology())
            barrier.wait()
            for n in range(3):
                with prof.training_step(n):
                    for _ in range(5):
                        prof.step()
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    with recording_backend("torch") as rec:
        threads = [threading.Thread(target=run, args=(r,)) for r in ("actor", "ref")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    opens = [c for c in rec.calls if c[0] == "open"]
    starts = [c for c in rec.calls if c[0] == "start"]
    assert 1 <= len(opens) <= 2 and len(starts) <= len(opens)
    # Never two sessions at once: every open is followed by its close before the next.
    depth = 0
    for call in rec.calls:
        depth += {"open": 1, "close": -1}.get(call[0], 0)
        assert depth in (0, 1)


# -- failures -----------------------------------------------------------------------------

def test_backend_failure_warns_once_and_training_goes_on(make_policy: Any, tmp_path: Path,
                                                          caplog: Any) -> None:
    worker = Worker()
    with recording_backend("torch", fail_on="start"), caplog.at_level(logging.WARNING):
        prof = apply_policy(worker, "actor", make_policy(steps=[1, 2],
                                                         regions=["update_actor"]), Topology())
        for n in range(4):
            with prof.training_step(n):
                assert worker.update_actor() == worker.calls
                prof.step()
    messages = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(messages) == 1
    assert "role 'actor' on rank 0 failed at start" in messages[0]
    assert worker.calls == 4
    assert [r["status"] for r in records(tmp_path / "out")] == ["failed"]


def test_backend_failure_raises_with_on_error_raise(make_policy: Any) -> None:
    with recording_backend("torch", fail_on="open"):
        prof = profile_session(make_policy(on_error="raise"), "actor", Topology())
        with pytest.raises(ProfilingError, match="failed at open"), prof.training_step(0):
            pass


def test_unwritable_output_folder_warns(tmp_path: Path, caplog: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    policy = {"version": 1, "output_dir": str(blocker / "out"),
              "roles": {"actor": {"enabled": True, "steps": [0]}}}
    with recording_backend("torch"), caplog.at_level(logging.WARNING):
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(0):
            prof.step()
    assert any("failed" in r.getMessage() for r in caplog.records)


# -- off ranks ----------------------------------------------------------------------------

def test_off_rank_wraps_nothing(make_policy: Any) -> None:
    worker = Worker()
    before = worker.update_actor
    prof = apply_policy(worker, "actor", make_policy(ranks=[1], regions=["update_actor"]),
                        Topology(rank=0, world=2))
    assert isinstance(prof, OffProfiler)
    assert "update_actor" not in vars(worker)
    assert worker.update_actor == before
    assert prof.annotate("x")(Worker.update_actor) is Worker.update_actor
    with prof.training_step(1), prof.region("x"):
        prof.step()


def test_only_this_instance_is_wrapped(make_policy: Any) -> None:
    first, second = Worker(), Worker()
    prof = apply_policy(first, "actor", make_policy(regions=["update_actor"]), Topology())
    assert isinstance(prof, RoleProfiler)
    assert "update_actor" in vars(first) and "update_actor" not in vars(second)


def test_no_policy_means_off(monkeypatch: Any) -> None:
    monkeypatch.delenv("PROFILE_POLICY", raising=False)
    assert isinstance(apply_policy(Worker(), "actor"), OffProfiler)


def test_policy_from_environment(monkeypatch: Any, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles: {actor: {enabled: true, steps: [0]}}\n")
    monkeypatch.setenv("PROFILE_POLICY", str(path))
    monkeypatch.setenv("PROFILE_POLICY_SET", "roles.actor.ranks=[1]")
    assert isinstance(apply_policy(Worker(), "actor", topology=Topology()), OffProfiler)
    monkeypatch.delenv("PROFILE_POLICY_SET")
    prof = apply_policy(Worker(), "actor", topology=Topology())
    assert isinstance(prof, RoleProfiler)
    assert prof.plan.output_dir == str(tmp_path / "profiles")


def test_name_clash_gets_suffix(make_policy: Any, tmp_path: Path, caplog: Any) -> None:
    policy = make_policy(steps=[1], name="<role>_step<step>")
    with recording_backend("torch"), caplog.at_level(logging.WARNING):
        for _ in range(2):
            prof = profile_session(policy, "actor", Topology())
            with prof.training_step(1):
                prof.step()
    paths = sorted(r["path"] for r in records(tmp_path / "out"))
    assert paths == ["actor_step1.1.rec", "actor_step1.rec"]
    assert any("already exists" in r.getMessage() for r in caplog.records)
    assert json.loads(json.dumps(paths)) == paths


def test_policy_as_omegaconf_dictconfig(tmp_path: Path) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    config = omegaconf.OmegaConf.create({
        "version": 1, "output_dir": str(tmp_path / "out"),
        "roles": {"actor": {"enabled": True, "steps": [0], "regions": ["update_actor"]}}})
    worker = Worker()
    with recording_backend("torch"):
        prof = apply_policy(worker, "actor", config, Topology())
        assert isinstance(prof, RoleProfiler)
        with prof.training_step(0):
            worker.update_actor()
    assert [r["steps"] for r in records(tmp_path / "out")] == [[0]]


def test_very_long_names_fit_the_file_system(make_policy: Any, tmp_path: Path) -> None:
    policy = make_policy(steps=[0])
    policy["prefix"] = "p" * 300
    with recording_backend("torch"):
        prof = profile_session(policy, "actor", Topology())
        for _ in range(2):  # the second clashes: its suffix must fit too
            with prof.training_step(0):
                prof.step()
    rows = records(tmp_path / "out")
    assert [r["status"] for r in rows] == ["complete", "complete"]
    for row in rows:
        assert (tmp_path / "out" / row["path"]).is_file()
        assert max(len(part.encode()) for part in row["path"].split("/")) <= 255


def test_policy_warnings_are_logged_when_applied(tmp_path: Path, caplog: Any) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "ranks": [], "steps": [9]}}}
    with caplog.at_level(logging.WARNING):
        apply_policy(Worker(), "actor", policy, Topology())
    assert any("selects no rank" in r.getMessage() for r in caplog.records)


def test_steps_from_many_threads_are_all_counted(make_policy: Any, tmp_path: Path) -> None:
    # The 4000th inner step is the only one recorded: any lost step() misses it.
    policy = make_policy(steps=[0], schedule={"wait": 4000, "active": 1, "repeat": 1})
    with recording_backend("torch"):
        prof = profile_session(policy, "actor", Topology())
        with prof.training_step(0):
            threads = [threading.Thread(target=lambda: [prof.step() for _ in range(1000)])
                       for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert [r["inner_steps"] for r in records(tmp_path / "out")] == [[4000]]


def test_the_role_profiler_is_one_state_machine(make_policy: Any, tmp_path: Path) -> None:
    """Every edge of the diagram in runtime/role/profiler.py, read from ``_state``."""
    with recording_backend("torch") as rec:
        plain = profile_session(make_policy(steps=[2]), "actor", Topology())
        assert plain._state is State.NEW
        plain.step()  # NEW -> SESSION: one capture for the session
        assert plain._state is State.SESSION
        with plain.training_step(2):  # SESSION -> STEPS: the session capture completes
            assert plain._state is State.STEPS
        plain.close()  # -> OFF
        assert plain._state is State.OFF
        assert plain.training_step(3).__class__.__name__ == "_Null"
        assert plain.region("x").__class__.__name__ == "_Null"
        opened = len(rec.infos)
        plain.step()
        assert len(rec.infos) == opened  # OFF opens nothing
        with profile_session(make_policy(steps=[2]), "actor", Topology()) as kept:
            assert kept._state is State.PROVISIONAL  # NEW -> PROVISIONAL (`with prof:`)
            kept.step()
            assert kept._state is State.SESSION  # PROVISIONAL -> SESSION: kept
        assert kept._state is State.OFF
        dropped = profile_session(make_policy(steps=[2]), "actor", Topology())
        with dropped, dropped.training_step(1):  # PROVISIONAL -> STEPS: dropped
            assert dropped._state is State.STEPS
    closes = [r for r in scan_manifests(str(tmp_path / "out")).records
              if r["event"] == "close"]
    assert len(closes) == 4 and {c["status"] for c in closes} == {"complete"}
    assert [c["reason"] for c in closes if "before any prof.step()" in (
        c.get("reason") or "")] != []
