"""``triggers.stall`` in the language and on the listener thread's side
(policy_engine.runtime.triggers.stall_watch), in one process: the policy's forms and their
errors; the limit (seconds, or a multiple of the median step measured between polls); a
step past it written once, and said cleared when it ends; the job's episode on a real
TCPStore (ranks that stall together make one, a process asked answers once, the roll call
names the one that did not answer); the regions a stuck thread is in; the command's
``--stall``."""

from __future__ import annotations

import datetime
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from job_env import run_cli

from policy_engine import PolicyError, Topology, apply_policy, compile_plan, load_policy
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.language.values.triggers import Stall, parse_after
from policy_engine.runtime.process import signals
from policy_engine.runtime.process.state import STATE, critical, slot
from policy_engine.runtime.role.wrapping import regions_on
from policy_engine.runtime.triggers.channel import JobChannel, StoreKV
from policy_engine.runtime.triggers.requests import parse_request
from policy_engine.runtime.triggers.stall_watch import (
    StallClock,
    StallWatch,
    answers,
    members,
    post_episode,
)
from policy_engine.testing import recording_backend


def policy(out: Path, **triggers: Any) -> dict[str, Any]:
    return {"version": 1, "output_dir": str(out), "roles": {"trainer": {
        "enabled": True, "ranks": "all", "steps": [], "triggers": triggers}}}


@pytest.mark.parametrize(("after", "seconds", "factor"), [
    (300, 300.0, None), (0.5, 0.5, None), ("10x", None, 10.0), (" 2.5X ", None, 2.5)])
def test_after_is_seconds_or_a_multiple_of_the_median_step(after: Any, seconds: Any,
                                                            factor: Any) -> None:
    assert parse_after(after) == (seconds, factor)


@pytest.mark.parametrize(("stall", "said"), [
    ({"after": "1x"}, "a multiple of the median step must be more than 1x"),
    ({"after": 0}, "after must be >= 0.1, got 0"),
    ({"after": "ten"}, "expected seconds, or a multiple of the median step such as '10x'"),
    ({"after": 5, "max": 0}, "max must be >= 1, got 0"),
    ({"afer": 5}, "afer"),
])
def test_a_wrong_stall_is_an_error_that_says_where(tmp_path: Path, stall: dict[str, Any],
                                                   said: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy(policy(tmp_path, stall=stall))
    assert said in str(err.value) and "triggers.stall" in str(err.value)


def test_the_plans_of_policies_without_stall_keep_their_hashes(tmp_path: Path) -> None:
    plain = compile_plan(load_policy(policy(tmp_path, on_demand=True)), "trainer",
                         Topology(rank=0, world=2))
    assert "stall" not in plain.to_json()["triggers"]
    watched = compile_plan(load_policy(policy(tmp_path, stall=True)), "trainer",
                           Topology(rank=0, world=2))
    assert watched.to_json()["triggers"]["stall"] == {"after": 300.0, "at_least": 10.0,
                                                      "max": 10, "job": True}
    assert watched.spec.triggers.listens and not watched.spec.triggers.any


def test_the_limit_is_a_multiple_of_the_median_step_once_measured() -> None:
    clock = StallClock(Stall(factor=10.0, at_least=1.0))
    for step, stamp in [(1, 0.0), (11, 1.0), (21, 2.0)]:  # 0.1 s a step
        clock.measure(step, stamp)
        assert clock.limit() is None  # two samples: not yet
    clock.measure(31, 3.5)  # 0.15 s a step
    assert clock.limit() == pytest.approx(1.0)  # 10 x 0.1, at least 1 s
    clock.measure(41, 23.5)  # 2 s a step
    assert clock.limit() == pytest.approx(10 * 0.125)  # the median of 0.1, 0.15, 2
    assert "10x the median step" in clock.said(clock.limit())


class Notes:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, **fields: Any) -> None:
        self.lines.append((kind, fields))


def watch(out: Path, rank: int = 0, world: int = 1, **stall: Any) -> tuple[StallWatch, Notes]:
    plan = compile_plan(load_policy(policy(out, stall=stall or {"after": 1})), "trainer",
                        Topology(rank=rank, world=world))
    notes = Notes()
    assert plan.spec.triggers.stall is not None
    return StallWatch(plan, plan.spec.triggers.stall, notes, lambda: {"region": ["fwd"]}), \
        notes


def stalls(out: Path, suffix: str = "_pid") -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "stalls").glob("*.json"))
            if suffix in p.name and not p.name.endswith(".cleared.json")]


def test_a_step_past_its_limit_is_recorded_once_and_said_cleared(tmp_path: Path) -> None:
    found, notes = watch(tmp_path, after=1)
    now = time.perf_counter()
    found.local(3, now - 0.5, 2, 0.0, threading.get_ident(), job=False)
    assert stalls(tmp_path) == []  # 0.5 s: within the limit
    assert 0.4 <= (found.wait(3, now - 0.5, 2) or 0) <= 0.5
    for _ in range(3):  # past it: one record, however many polls see it
        found.local(3, now - 2.0, 2, 0.0, threading.get_ident(), job=False)
    [made] = stalls(tmp_path)
    assert (made["why"], made["step"], made["region"]) == ("stall", 3, ["fwd"])
    assert made["running"] >= 2.0 and made["threads"][0]["training"]
    found.local(3, now - 2.0, 3, now + 4.0, threading.get_ident(), job=False)  # it ended
    [cleared] = [json.loads(p.read_text()) for p in (tmp_path / "stalls").glob("*.cleared.*")]
    assert cleared["seconds"] == pytest.approx(6.0, abs=0.01) and cleared["step"] == 3
    assert [f["status"] for _k, f in notes.lines] == ["recorded", "cleared"]


def test_at_most_max_stalls_are_recorded(tmp_path: Path) -> None:
    found, _ = watch(tmp_path, after=1, max=2)
    now = time.perf_counter()
    for step in range(1, 6):
        found.local(step, now - 5.0, step - 1, 0.0, 0, job=False)
        found.local(step, now - 5.0, step, now, 0, job=False)
    assert [r["step"] for r in stalls(tmp_path)] == [1, 2]


@pytest.fixture
def store() -> Any:
    dist = pytest.importorskip("torch.distributed")
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=5))


def test_ranks_that_stall_together_make_one_episode_and_the_silent_one_is_named(
        tmp_path: Path, store: Any) -> None:
    channel = JobChannel(StoreKV(store), "trainer")
    ranks = [watch(tmp_path, rank=r, world=3, after=1)[0] for r in range(3)]
    now = time.perf_counter()
    for w in ranks:  # each registers
        w.on_store(channel, "store", 4, now, 4, 0)
    for w in ranks[:2]:  # ranks 0 and 1 stall; rank 2 says nothing from now on
        w.local(5, now - 3.0, 4, 0.0, 0, job=True)
        w.on_store(channel, "store", 5, now - 3.0, 4, 0)
    assert [m["rank"] for m in members(channel)] == [0, 1, 2]
    episode = ranks[0].seen
    assert episode is not None and ranks[1].seen == episode  # rank 1 joined rank 0's
    assert sorted(a["rank"] for a in answers(channel, episode, 3).values()) == [0, 1]
    assert ranks[0].roll is not None and ranks[1].roll is None
    ranks[0].roll = (episode, 0.0, time.monotonic() - 9)  # its polls have gone by
    ranks[0].on_store(channel, "store", 5, now - 3.0, 4, 0)
    [roll] = stalls(tmp_path, "_rollcall_")
    assert [(m["rank"], m["answered"]) for m in roll["members"]] == \
        [(0, True), (1, True), (2, False)]
    assert len(stalls(tmp_path)) == 2  # one record per rank that stalled


def test_a_process_asked_answers_once_with_the_record_of_its_step(tmp_path: Path,
                                                                   store: Any) -> None:
    channel = JobChannel(StoreKV(store), "trainer")
    asked, _ = watch(tmp_path, rank=1, world=2, after=60)
    now = time.perf_counter()
    asked.on_store(channel, "store", 7, now - 1.0, 6, 0)  # registers
    first, began = post_episode(channel, "stall", 0, 7, None)
    assert began and first is not None
    for _ in range(3):
        asked.on_store(channel, "store", 7, now - 1.0, 6, 0)
    [made] = stalls(tmp_path)
    assert (made["why"], made["asked_by"], made["episode"]) == ("asked", 0, first.id)
    second, _ = post_episode(channel, "hand", None, None, None)  # by hand, same step
    assert second is not None
    asked.on_store(channel, "store", 7, now - 1.0, 6, 0)
    assert len(stalls(tmp_path)) == 1  # the step's record answers it
    assert answers(channel, second.id, 1)[0]["record"] == answers(channel, first.id, 1)[0][
        "record"]


def test_the_regions_a_stuck_thread_is_in_are_read_from_its_stack(tmp_path: Path) -> None:
    class Worker:
        def __init__(self) -> None:
            self.inside, self.leave = threading.Event(), threading.Event()

        def update_actor(self) -> None:
            self.inside.set()
            self.leave.wait(30)

    worker = Worker()
    prof = apply_policy(worker, "trainer", {"version": 1, "output_dir": str(tmp_path),
                                            "roles": {"trainer": {
                                                "enabled": True, "steps": [],
                                                "regions": ["update_actor"]}}})
    thread = threading.Thread(target=worker.update_actor)
    thread.start()
    try:
        assert worker.inside.wait(30)
        assert regions_on(sys._current_frames()[thread.ident]) == ["update_actor"]
    finally:
        worker.leave.set()
        thread.join()
        prof.close()


def test_a_stall_request_names_the_rank_that_asked() -> None:
    request = parse_request("r", json.dumps({"role": "*", "why": "stall", "by": 3}).encode())
    assert (request.role, request.why, request.by) == ("*", "stall", 3)


def test_trigger_stall_takes_no_role_and_needs_listeners(tmp_path: Path) -> None:
    both = run_cli("trigger", str(tmp_path), "--stall", "--role", "a", cwd=tmp_path,
                   timeout=120)
    assert both.returncode == 2 and "--stall asks every watching process" in both.stderr
    neither = run_cli("trigger", str(tmp_path), cwd=tmp_path, timeout=120)
    assert neither.returncode == 2 and "--role is required (or --stall)" in neither.stderr
    nobody = run_cli("trigger", str(tmp_path), "--stall", cwd=tmp_path, timeout=120)
    assert nobody.returncode == 2 and "no process listens for requests here" in nobody.stderr


@pytest.mark.parametrize("planted", [
    b"not json", b"x" * 10_000, b'{"id": "../../x", "time": 1}', b'{"id": "a", "time": NaN}',
    b'{"id": "future", "time": IN_AN_HOUR}'], ids=["text", "long", "id", "nan", "future"])
def test_an_episode_key_planted_in_the_store_is_not_joined(store: Any, planted: bytes) -> None:
    channel = JobChannel(StoreKV(store), "trainer")
    planted = planted.replace(b"IN_AN_HOUR", str(time.time() + 3600).encode())
    store.set("policy_engine/triggers/v1/stall/episode", planted)
    found, began = post_episode(channel, "stall", 0, 5, 60.0)
    assert began and found is not None and found.id != "future"


def test_member_keys_planted_far_apart_are_read_a_bounded_number(store: Any) -> None:
    channel = JobChannel(StoreKV(store), "trainer")
    for k in [0] + [1 << i for i in range(20)]:  # what a doubling search follows
        store.set(f"policy_engine/triggers/v1/stall/member/{k}", b"{}")
    started = time.monotonic()
    listed = members(channel)
    assert len(listed) <= 1 << 16 and time.monotonic() - started < 120


def test_a_stall_saves_the_main_threads_capture_after_its_critical_stretch(
        tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        assert signals.install_usr2() is None  # pytest's main thread: the handler is ours
        with recording_backend("torch") as rec:
            prof = apply_policy(Worker(), "trainer", {
                "version": 1, "output_dir": str(tmp_path),
                "roles": {"trainer": {"enabled": True, "steps": [5]}}})
            with prof.training_step(5):
                counted = STATE.hooks.usr2_count
                with critical():  # as a capture's own transition or a manifest line would be
                    said = signals.ask_main_thread("a stall: step 5 had run 6.0 s")
                    time.sleep(0.2)  # the signal arrives here, and waits
                    assert slot("torch").capture is not None
                assert slot("torch").capture is None  # saved as the stretch ended
                assert STATE.hooks.usr2_count == counted  # the engine's own, not a user's
            prof.close()
    finally:  # the next test of this process finds SIGUSR2 as it was
        signal.signal(signal.SIGUSR2, previous)
        STATE.hooks.usr2_installed = False
    assert said.startswith("saved partial if the main thread runs Python")
    assert rec.calls[-2][0] == "save" and not rec.violations
    closed = [r for r in scan_manifests(str(tmp_path)).records if r["event"] == "close"]
    assert [(c["status"], c["stopped_by"]) for c in closed] == \
        [("partial", "a stall: step 5 had run 6.0 s")]


class Worker:
    pass
