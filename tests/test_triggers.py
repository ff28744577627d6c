"""Triggers and limits in one process, on the recording backend: which steps a trigger
captures, what the manifest says about it, and where a budget stops."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, apply_policy, load_policy
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.cli.main import main
from policy_engine.language.values.triggers import parse_bytes
from policy_engine.runtime.process.state import STATE
from policy_engine.runtime.triggers import step_triggers
from policy_engine.runtime.triggers.requests import write_request
from policy_engine.testing import recording_backend


class Worker:
    pass


def records(out: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records if r["event"] == event]


def closed(out: Path) -> list[tuple[list[int], str]]:
    return [(r["steps"], r["status"]) for r in records(out, "close")]


def opened(out: Path) -> list[tuple[list[int], str, str | None]]:
    return [(r["steps"], r["trigger"], r.get("request")) for r in records(out, "open")]


def settle(prof: Any) -> None:
    """Wait until the role's listener thread has read what was written so far: it reads
    requests on its own, every ``poll_seconds``; these tests step faster than it polls."""
    thread = prof._listener.thread if prof._listener is not None else None
    if thread is not None:
        assert thread.poll_now()


def run(prof: Any, steps: range, on: dict[int, Any] | None = None) -> None:
    for n in steps:
        if on and n in on:
            on[n]()
        settle(prof)
        with prof.training_step(n):
            prof.step()
    prof.close()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


def test_request_captures_the_step_asked_for(make_policy: Any, out: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    policy = make_policy(steps=[2], ranks="all", triggers={"on_demand": True, "poll_seconds": 0})
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=1, world=4))
        assert (out / "triggers").is_dir()  # the folder says someone listens
        ask = {4: lambda: write_request(str(out), role="actor", ranks=None,
                                                 step=7, count=2)}
        run(prof, range(10), ask)
    [note] = records(out, "note")
    rid = note["request"]
    assert (note["note"], note["status"], note["first"], note["last"], note["at"]) == (
        "trigger", "accepted", 7, 8, 4)
    assert opened(out) == [([2], "plan", None), ([7], "on_demand", rid),
                           ([8], "on_demand", rid)]
    assert main(["traces", str(out)]) == 0
    table = capsys.readouterr().out
    assert " 7 (on_demand) " in table and " 2 (" not in table
    traces = [r for r in records(out, "trace")]
    assert [r["trigger"] for r in traces] == ["plan", "on_demand", "on_demand"]
    assert traces[1]["path"].startswith("actor/step7/t_rank1-of-4_")


def test_next_and_merged_count(make_policy: Any, out: Path) -> None:
    policy = make_policy(steps=[], merge_steps=True,
                         triggers={"on_demand": True, "poll_seconds": 0})
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        ask = {3: lambda: write_request(str(out), role="actor", ranks=None,
                                                 step=None, count=3)}
        run(prof, range(8), ask)
    assert closed(out) == [([3, 4, 5], "complete")]
    [trace] = records(out, "trace")
    assert trace["path"].startswith("actor/step3-5/")


def test_requests_for_other_roles_ranks_or_from_before_are_ignored(
        make_policy: Any, out: Path) -> None:
    old = write_request(str(out), role="actor", ranks=None, step=None, count=1)
    policy = make_policy(steps=[], ranks="all",
                         triggers={"on_demand": True, "poll_seconds": 0})
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=1, world=4))
        ask = {1: lambda: [
            write_request(str(out), role="critic", ranks=None, step=None, count=1),
            write_request(str(out), role="actor", ranks="0,2-3", step=None, count=1),
            write_request(str(out), role="actor", ranks={"node": 1}, step=None,
                                   count=1)],
               3: lambda: write_request(str(out), role="actor", ranks="-3",
                                                 step=None, count=1)}
        run(prof, range(5), ask)
    [note] = records(out, "note")  # only the last request is for rank 1 (of 4)
    assert note["request"] != old["id"] and (note["first"], note["last"]) == (3, 3)
    assert opened(out) == [([3], "on_demand", note["request"])]


def test_a_request_for_a_step_gone_by_is_noted_as_missed(make_policy: Any, out: Path) -> None:
    policy = make_policy(steps=[], triggers={"on_demand": True, "poll_seconds": 0})
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        ask = {5: lambda: write_request(str(out), role="actor", ranks=None, step=2,
                                                 count=1)}
        run(prof, range(7), ask)
    [note] = records(out, "note")
    assert note["status"] == "missed" and "this process is at step 5" in note["message"]
    assert records(out, "open") == []


def test_each_request_is_honoured_once(make_policy: Any, out: Path) -> None:
    policy = make_policy(steps=[], triggers={"on_demand": True, "poll_seconds": 0})
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        ask = {2: lambda: write_request(str(out), role="actor", ranks=None,
                                                 step=None, count=1)}
        run(prof, range(12), ask)
    assert closed(out) == [([2], "complete")]


def test_sigusr2_captures_the_next_step(make_policy: Any, out: Path) -> None:
    policy = make_policy(steps=[], triggers={"signal": True})
    previous = signal.getsignal(signal.SIGUSR2)
    seen: list[int] = []
    signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))  # the user's own handler
    try:
        with recording_backend("torch"):
            prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
            run(prof, range(8), {4: lambda: os.kill(os.getpid(), signal.SIGUSR2)})
    finally:
        signal.signal(signal.SIGUSR2, previous)
        STATE.hooks.usr2_installed = False
    assert opened(out) == [([4], "signal", None)]
    assert seen == [signal.SIGUSR2]  # still called


def test_slow_step_captures_the_step_after_it(make_policy: Any, out: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in
                 [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 17, 18, 19, 20, 21, 30, 31, 32,
                  33, 34, 35, 45, 46, 47, 60, 61, 62])
    monkeypatch.setattr(step_triggers, "_clock", lambda: next(clock))
    policy = make_policy(steps=[], triggers={"slow_step": {"factor": 2.0, "after": 5,
                                                           "max": 2}})
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        run(prof, range(30))
    # Step 12 took 5 s (median 1 s): step 13 is captured. Step 13 is captured, so its time
    # does not count; step 17 took 9 s: step 18. Step 23 took 10 s but max is 2.
    assert opened(out) == [([13], "slow_step", None), ([18], "slow_step", None)]
    notes = records(out, "note")
    assert [(n["note"], n["step"], n["seconds"], n["median"]) for n in notes] == [
        ("slow_step", 12, 5.0, 1.0), ("slow_step", 17, 9.0, 1.0)]


def test_the_slow_step_median_is_taken_once_after_steps_are_measured_then_every_64(
        make_policy: Any, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(n * n) for n in range(100))  # step n-1 takes 2n-1 s
    monkeypatch.setattr(step_triggers, "_clock", lambda: next(clock))
    policy = make_policy(steps=[], triggers={"slow_step": {"factor": 100.0, "after": 5}})
    taken: list[int] = []
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        detector = prof._listener.slow
        median = detector.median
        for n in range(90):
            with prof.training_step(n):
                pass
            if detector.median != median:  # steps measured by now: n (step 0 is not)
                median = detector.median
                taken.append(n)
        prof.close()
    assert taken == [5, 5 + 64]
    assert detector.median == 88.0  # the last 50 of 69 steps took 39, 41, ..., 137 s
    assert detector.threshold == 100.0 * detector.median


def test_capture_limit_stops_new_captures(make_policy: Any, out: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    policy = make_policy(steps={"every": 2}, limits={"captures": 3})
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        run(prof, range(20))
    assert [steps for steps, _ in closed(out)] == [[2], [4], [6]]
    [note] = records(out, "note")
    assert note["note"] == "limit" and "limits.captures: 3" in note["message"]
    assert sum("no new capture begins" in r.message for r in caplog.records) == 1


def test_capture_limit_ends_the_cycles_of_an_endless_capture(make_policy: Any,
                                                             out: Path) -> None:
    policy = make_policy(steps="all", merge_steps=True, limits={"captures": 2},
                         schedule={"wait": 3, "active": 1, "repeat": 0},
                         name="<role>_step<step>_c<cycle>")
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        run(prof, range(1, 40))
    traces = records(out, "trace")
    assert [os.path.basename(r["path"]) for r in traces] == [
        "actor_step4_c0.rec", "actor_step8_c1.rec"]
    [close] = records(out, "close")
    assert close["status"] == "complete" and "limits.captures: 2" in close["limit"]


def test_byte_limit(make_policy: Any, out: Path) -> None:
    policy = make_policy(steps="1-10", limits={"bytes": "1B"})
    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))
        run(prof, range(12))
    assert [steps for steps, _ in closed(out)] == [[1]]  # it wrote more than one byte
    [note] = records(out, "note")
    assert "limits.bytes" in note["message"] and "limit 1B" in note["message"]


@pytest.mark.parametrize(("text", "size"), [
    ("2GiB", 2 << 30), ("500MB", 500_000_000), ("1.5 KiB", 1536), ("7", 7), (9, 9),
    ("3g", 3_000_000_000), ("1Ti", 1 << 40)])
def test_sizes(text: Any, size: int) -> None:
    assert parse_bytes(text) == size


def test_policy_blocks_reach_the_plan(tmp_path: Path) -> None:
    policy = load_policy({"version": 1, "roles": {"actor": {
        "enabled": True, "triggers": {"on_demand": True, "slow_step": True},
        "limits": {"captures": 5, "bytes": "1GiB"}}}})
    spec = policy.role("actor")
    assert spec.triggers.slow_step is not None and spec.triggers.slow_step.factor == 2.0
    assert (spec.limits.captures, spec.limits.bytes) == (5, 1 << 30)


def test_trigger_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["trigger", str(out), "--role", "actor"]) == 2
    assert "no process listens" in capsys.readouterr().err
    (out / "triggers").mkdir(parents=True)
    assert main(["trigger", str(out), "--role", "actor", "--ranks", "{tp: 0}",
                 "--steps", "12", "--count", "2"]) == 0
    [written] = list((out / "triggers").glob("*.json"))
    request = json.loads(written.read_text())
    assert (request["role"], request["ranks"], request["step"], request["count"]) == (
        "actor", {"tp": 0}, 12, 2)
    assert main(["trigger", str(out), "--role", "actor", "--ranks", "0-"]) == 2
    assert "--ranks '0-'" in capsys.readouterr().err
    assert main(["trigger", str(out), "--role", "actor", "--wait", "0.2"]) == 1
    assert "no process answered" in capsys.readouterr().err


# ------------------------------------------------------------------ validate and explain


def problems(role: dict[str, Any]) -> list[tuple[str, str]]:
    from policy_engine.language.load import analyze, read_source

    body = {"enabled": True, "name": "<role>_step<step>_rank<rank>", **role}
    result = analyze(read_source({"version": 1, "roles": {"actor": body}}, (), {}))
    return [(p.severity, p.message) for p in result.problems]


def test_validate_triggers_and_limits() -> None:
    [(severity, message)] = problems({"name": "<role>_rank<rank>", "steps": [],
                                      "triggers": {"signal": True}})
    assert severity == "error" and "triggers open captures at steps the plan does not list" \
        in message and "<step> or <timestamp>" in message
    assert problems({"steps": [], "triggers": {"on_demand": True}}) == []  # listens only
    [(severity, message)] = problems({"steps": "1-10", "limits": {"captures": 3}})
    assert severity == "warning" and "open 10 captures per process but limits.captures is 3" \
        in message
    [(_, message)] = problems({"steps": [2, 3, 4], "discrete": True, "limits": {"captures": 4},
                               "regions": ["update", "rollout"],
                               "name": "<role>_<region>_step<step>_rank<rank>"})
    assert "open 6 captures per process (2 regions a step, each call its own)" in message
    assert problems({"steps": {"every": 100}, "limits": {"captures": 3}}) == []
    assert problems({"steps": "all", "limits": {"captures": 3}}) == []
    [(_, message)] = problems({"steps": "all", "merge_steps": True,
                               "schedule": {"wait": 9, "active": 1},
                               "triggers": {"on_demand": True}})
    assert "triggers add nothing to role 'actor' from step 0 on" in message


def test_explain_stops_at_the_limit_and_names_the_triggers(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nroles:\n  actor:\n    enabled: true\n"
                    "    steps: {every: 2}\n    name: \"<role>_step<step>\"\n"
                    "    limits: {captures: 3, bytes: 2GiB}\n"
                    "    triggers: {signal: true}\n")
    assert main(["explain", str(path), "--role", "actor", "--world", "1", "--steps", "3-20",
                 "--format", "json"]) == 0
    [rank] = json.loads(capsys.readouterr().out)["ranks"]
    assert [t["name"] for t in rank["traces"]] == ["actor_step4", "actor_step6"]  # 2 was 1st
    assert rank["limits"] == {"captures": 3, "bytes": 2 << 30}
    assert main(["explain", str(path), "--role", "actor", "--world", "1"]) == 0
    text = capsys.readouterr().out
    assert "triggers also capture: SIGUSR2" in text
    assert "limits: at most 3 captures and 2.0 GiB per process" in text


def test_a_triggered_step_of_a_discrete_role_captures_each_region_call(
        make_policy: Any, out: Path) -> None:
    class Stages:
        def update_actor(self) -> None:
            pass

        def compute_log_prob(self) -> None:
            pass

    worker = Stages()
    policy = make_policy(steps=[], discrete=True, regions=["update_actor", "compute_log_prob"],
                         name="<role>_<region>_step<step>",
                         triggers={"on_demand": True, "poll_seconds": 0})
    with recording_backend("torch"):
        prof = apply_policy(worker, "actor", policy, Topology(rank=0, world=1))
        for n in range(5):
            if n == 3:
                write_request(str(out), role="actor", ranks=None, step=None, count=1)
            settle(prof)
            with prof.training_step(n):
                worker.compute_log_prob()
                worker.update_actor()
        prof.close()
    assert [(r["region"], r["steps"], r["trigger"]) for r in records(out, "open")] == [
        ("compute_log_prob", [3], "on_demand"), ("update_actor", [3], "on_demand")]


def _listener_threads(role: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.name == f"policy-engine-listener-{role}" and t.is_alive()]


def test_applying_the_same_plan_again_keeps_one_listener_thread(make_policy: Any) -> None:
    """apply_policy called again with the same plan returns the profiler the worker has,
    without building another (whose listener thread would read the same requests)."""
    policy = make_policy(steps=[], triggers={"on_demand": True, "poll_seconds": 60})
    worker = Worker()
    before = set(_listener_threads("actor"))   # an earlier test's may still be leaving
    with recording_backend("torch"):
        first = apply_policy(worker, "actor", policy, Topology(rank=0, world=1))
        for _ in range(5):
            assert apply_policy(worker, "actor", policy, Topology(rank=0, world=1)) is first
        assert len(set(_listener_threads("actor")) - before) == 1
        first.close()
