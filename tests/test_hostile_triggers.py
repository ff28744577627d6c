"""Whatever lies in ``<output_dir>/triggers/``, a listening process neither raises, nor
stalls, nor reads outside it: each bad file is one warning and one manifest note. A
half-written request is read again, not dropped. Requests are bounded (count, step) at
the command and at the reader, and never expanded into a list of steps."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, apply_policy
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.cli import trigger as trigger_cli
from policy_engine.cli.main import main
from policy_engine.runtime.triggers import folder as trigger_folder
from policy_engine.runtime.triggers import parts as trigger_parts
from policy_engine.runtime.triggers import requests
from policy_engine.testing import recording_backend

BOUND = 20.0  # seconds a whole run of a few steps may take, however loaded the machine


class Worker:
    pass


def records(out: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records if r["event"] == event]


def ignoring(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum("ignoring trigger request" in r.getMessage() and name in r.getMessage()
               for r in caplog.records)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


def listen(make_policy: Any, **role: Any) -> Any:
    policy = make_policy(triggers={"on_demand": True, "poll_seconds": 0}, **role)
    return apply_policy(Worker(), "actor", policy, Topology(rank=0, world=1))


def settle(prof: Any) -> None:
    """Wait until the role's listener thread has read what was written so far: it reads
    requests on its own, every ``poll_seconds``; these tests step faster than it polls."""
    thread = prof._listener.thread if prof._listener is not None else None
    if thread is not None:
        assert thread.poll_now()


def train(prof: Any, steps: range, at: dict[int, Any] | None = None) -> float:
    """Run the steps (``at[n]()`` before step n, then a poll of the listener thread); the
    seconds it took."""
    began = time.monotonic()
    for n in steps:
        if at and n in at:
            at[n]()
        settle(prof)
        with prof.training_step(n):
            prof.step()
    prof.close()
    return time.monotonic() - began


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _elsewhere(path: Path) -> None:
    real = path.parent.parent.parent / "elsewhere.json"
    real.write_text(json.dumps({"role": "actor", "step": None, "count": 1}))
    path.symlink_to(real)


def _folder(path: Path) -> None:
    path.mkdir()


def _text(body: str | bytes) -> Any:
    def plant(path: Path) -> None:
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body)
    return plant


HOSTILE = {
    "array": (_text("[]"), "expected a JSON object, got an array"),
    "number": (_text("5"), "expected a JSON object, got a number"),
    "null": (_text("null"), "expected a JSON object, got null"),
    "deep": (_text("[" * 100_000 + "]" * 100_000), "a request is at most 4096"),
    "deep-small": (_text("[" * 2000 + "]" * 2000), "nest deeper than"),
    "huge-int": (_text('{"role": "actor", "count": ' + "9" * 4000 + "}"),
                 "an integer of 4000 digits"),
    "huge-int-big": (_text('{"role": "actor", "count": ' + "9" * 5000 + "}"),
                     "a request is at most 4096"),
    "inf": (_text('{"role": "actor", "step": 1e400}'), "1e400 is out of range"),
    "nan": (_text('{"role": "actor", "count": NaN}'), "NaN is not a JSON number"),
    "role": (_text('{"role": 5}'), "role: expected a name"),
    "step": (_text('{"role": "actor", "step": -1}'), "step: expected null or a step"),
    "step-float": (_text('{"role": "actor", "step": 1.5}'), "step: expected null or a step"),
    "step-far": (_text('{"role": "actor", "step": 10000000000000000}'),
                 "step: expected null or a step"),
    "count-0": (_text('{"role": "actor", "count": 0}'), "count: expected 1 to 10000"),
    "count-bool": (_text('{"role": "actor", "count": true}'), "count: expected 1 to"),
    "count-1e9": (_text('{"role": "actor", "count": 1000000000}'), "count: expected 1 to"),
    "ranks": (_text('{"role": "actor", "ranks": [[[[1]]]]}'), "ranks: expected null"),
    "ranks-bad": (_text('{"role": "actor", "ranks": "0-"}'), "ranks '0-'"),
    "fifo": (_fifo, "it is a FIFO, not a regular file"),
    "dev-zero": (_zero, "symbolic link"),
    "link": (_elsewhere, "symbolic link"),
    "folder": (_folder, "it is a folder"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_is_one_warning_and_one_note(
        case: str, make_policy: Any, out: Path, caplog: pytest.LogCaptureFixture) -> None:
    plant, why = HOSTILE[case]
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        prof = listen(make_policy, steps=[])
        took = train(prof, range(8), {2: lambda: plant(out / "triggers" / "a.json")})
    assert took < BOUND
    assert ignoring(caplog, "a.json") == 1, [r.getMessage() for r in caplog.records]
    [note] = records(out, "note")
    assert (note["note"], note["request"], note["status"]) == ("trigger", "a", "refused")
    assert why in note["message"]
    assert records(out, "open") == []  # and nothing was captured (nor read elsewhere)


def test_a_half_written_request_is_read_again(make_policy: Any, out: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    path = out / "triggers" / "slow.json"
    text = json.dumps({"role": "actor", "step": None, "count": 1})
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        prof = listen(make_policy, steps=[])
        train(prof, range(8), {2: lambda: path.write_text(text[:12]),  # another tool's
                               5: lambda: path.write_text(text)})      # write, no rename
    assert ignoring(caplog, "slow.json") == 0
    [note] = records(out, "note")
    assert (note["status"], note["first"], note["last"]) == ("accepted", 5, 5)
    assert [(r["steps"], r["trigger"]) for r in records(out, "open")] == [([5], "on_demand")]


def test_a_request_never_finished_is_given_up_once(make_policy: Any, out: Path,
                                                   caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trigger_folder, "RETRY_SECONDS", 0.0)
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        prof = listen(make_policy, steps=[])
        train(prof, range(12), {1: lambda: (out / "triggers" / "cut.json").write_text(
            '{"role": "act')})
    assert ignoring(caplog, "cut.json") == 1
    [note] = records(out, "note")
    assert note["status"] == "refused" and "not JSON" in note["message"]


def test_requests_are_read_on_the_listener_thread_only(
        make_policy: Any, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process alone has no job: its listener thread reads the folder all the same, and
    the training thread never looks at it (a step takes what the thread queued)."""
    readers: set[str] = set()
    look = trigger_folder.RequestFolder.look

    def spied(self: Any) -> Any:
        readers.add(threading.current_thread().name)
        return look(self)

    monkeypatch.setattr(trigger_folder.RequestFolder, "look", spied)
    with recording_backend("torch"):
        prof = listen(make_policy, steps=[])
        train(prof, range(6), {3: lambda: requests.write_request(
            str(out), role="actor", ranks=None, step=None, count=1)})
        assert prof._listener.thread.poll_now() is False  # closed: it polls no more
    assert readers == {"policy-engine-listener-actor"}
    assert [(r["steps"], r["trigger"]) for r in records(out, "open")] == [([3], "on_demand")]


def test_a_listener_failure_never_reaches_training(make_policy: Any, out: Path,
                                                   caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int, name: str) -> Any:
        raise MemoryError("what a bug in the reader would look like")

    monkeypatch.setattr(trigger_folder, "read_request", broken)
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        prof = listen(make_policy, steps=[3])
        train(prof, range(8), {
            1: lambda: requests.write_request(str(out), role="actor", ranks=None, step=None,
                                              count=1),
            4: lambda: requests.write_request(str(out), role="actor", ranks=None, step=None,
                                              count=1)})
    failed = [r for r in caplog.records if "trigger listener failed" in r.getMessage()]
    assert len(failed) == 1 and "training goes on" in failed[0].getMessage()
    assert [r["steps"] for r in records(out, "close")] == [[3]]  # the plan went on


def test_counts_are_bounded_and_never_listed(make_policy: Any, out: Path) -> None:
    with pytest.raises(ValueError, match="count must be 1 to 10000"):
        requests.write_request(str(out), role="actor", ranks=None, step=None,
                               count=1_000_000_000)
    with recording_backend("torch"):
        prof = listen(make_policy, steps=[], merge_steps=True)
        took = train(prof, range(6), {2: lambda: requests.write_request(
            str(out), role="actor", ranks=None, step=None, count=requests.MAX_COUNT)})
    assert took < BOUND
    [note] = records(out, "note")
    assert (note["first"], note["last"]) == (2, 2 + requests.MAX_COUNT - 1)
    assert len(json.dumps(note)) < 1000
    [close] = records(out, "close")
    assert close["steps"] == [2, 3, 4, 5]  # one merged capture, cut short by close()


def test_a_process_honours_what_its_limits_allow(make_policy: Any, out: Path) -> None:
    with recording_backend("torch"):
        prof = listen(make_policy, steps=[], limits={"captures": 3})
        train(prof, range(20), {2: lambda: requests.write_request(
            str(out), role="actor", ranks=None, step=None, count=500)})
    accepted = [n for n in records(out, "note") if n["note"] == "trigger"]
    assert [(n["status"], n["first"], n["last"]) for n in accepted] == [("accepted", 2, 4)]
    assert "limits.captures allows 3 more" in accepted[0]["message"]
    assert [r["steps"] for r in records(out, "close")] == [[2], [3], [4]]


def test_the_listener_does_not_follow_a_linked_requests_folder(
        make_policy: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out.mkdir()
    (out / "triggers").symlink_to(elsewhere)
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        prof = listen(make_policy, steps=[])
        (elsewhere / "r.json").write_text(json.dumps({"role": "actor", "count": 1}))
        train(prof, range(5))
    assert any("cannot listen for trigger requests" in r.getMessage()
               for r in caplog.records)
    assert records(out, "open") == []
    assert sorted(os.listdir(elsewhere)) == ["r.json"]


# ------------------------------------------------------------------ the command


def test_the_command_refuses_absurd_counts_and_steps(
        out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (out / "triggers").mkdir(parents=True)
    for args, said in ((["--count", "1000000000"], "at most 10000 steps per request"),
                       (["--count", "0"], "expected a positive number of steps"),
                       (["--steps", "9" * 40], "expected a step number")):
        assert main(["trigger", str(out), "--role", "actor", *args]) == 2
        assert said in capsys.readouterr().err
    assert os.listdir(out / "triggers") == []
    assert main(["trigger", str(out), "--role", "actor", "--count", "10000"]) == 0


def test_the_command_over_the_folder_imports_no_torch(out: Path) -> None:
    """Only the store needs torch: a request written under triggers/ imports none of it."""
    (out / "triggers").mkdir(parents=True)
    script = ("import sys\nfrom policy_engine.cli.main import main\n"
              f"code = main(['trigger', {str(out)!r}, '--role', 'actor', '--steps', '3'])\n"
              "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 []", done.stdout
    assert len(os.listdir(out / "triggers")) == 1


def test_wait_counts_the_steps_of_a_long_capture_as_covered() -> None:
    """A close line of a long merged capture gives a range (``closed_steps``): the steps
    accepted inside it are covered, without listing the range."""
    process = trigger_cli._Process({"status": "accepted", "first": 4000, "last": 4002})
    process.captures["c"] = {"closed": "complete", "covered": range(1, 10**9), "steps": [1]}
    assert process.done() and process.ours()
    process.captures["c"]["covered"] = range(1, 4001)
    assert process.missing() == 2


def test_the_command_never_writes_through_a_link(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "triggers").symlink_to(elsewhere)
    assert main(["trigger", str(out), "--role", "actor"]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "symbolic link" in err
    assert os.listdir(elsewhere) == []


def test_wait_ends_when_the_plan_captured_the_step(
        make_policy: Any, out: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trigger_cli, "_SETTLE", 0.2)
    with recording_backend("torch"):
        prof = listen(make_policy, steps=[6])
        rids: list[str] = []

        def ask() -> None:
            assert main(["trigger", str(out), "--role", "actor", "--steps", "6"]) == 0
            rids.append(capsys.readouterr().out.split()[1].rstrip(":"))
        train(prof, range(10), {1: ask})
    assert [(r["steps"], r["trigger"]) for r in records(out, "open")] == [([6], "plan")]
    began = time.monotonic()
    assert trigger_cli._wait(str(out), rids[0], "actor", 30) == 0
    assert time.monotonic() - began < BOUND
    said = capsys.readouterr().out
    assert "accepted: captures step 6" in said and "complete" in said


def test_wait_says_why_it_failed(make_policy: Any, out: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with recording_backend("torch"):
        prof = listen(make_policy, steps=[])
        request: dict[str, Any] = {}
        train(prof, range(5), {1: lambda: request.update(requests.write_request(
            str(out), role="actor", ranks=None, step=100, count=1))})
    assert trigger_cli._wait(str(out), request["id"], "actor", 0.5) == 1
    err = capsys.readouterr().err
    assert "1 of the accepted steps 100 not captured" in err
    assert "has not reached them" in err


def test_wait_in_a_thread_while_training(make_policy: Any, out: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's own --wait, beside a running loop: it ends with 0 once the capture
    closed, not at its deadline."""
    monkeypatch.setattr(trigger_cli, "_SETTLE", 0.2)
    codes: list[int] = []
    with recording_backend("torch"):
        prof = listen(make_policy, steps=[])
        waiting = threading.Thread(target=lambda: codes.append(main(
            ["trigger", str(out), "--role", "actor", "--steps", "3", "--count", "2",
             "--wait", "60"])))
        began = time.monotonic()
        waiting.start()
        while not [n for n in os.listdir(out / "triggers") if requests.is_request_name(n)]:
            time.sleep(0.01)
        train(prof, range(8))
        waiting.join(BOUND + 60)
    assert codes == [0] and time.monotonic() - began < BOUND


def _far_off(out: Path, count: int) -> None:
    """``count`` valid requests for steps far ahead, each sooner than the one before."""
    for i in range(count):
        requests.write_request(str(out), role="actor", ranks=None, step=10**9 - i, count=1)


def test_a_flood_of_far_off_requests_keeps_neither_a_near_one_out_nor_the_manifest_growing(
        make_policy: Any, out: Path) -> None:
    wanted = trigger_parts.MAX_PENDING + 36
    with recording_backend("torch"):
        prof = listen(make_policy, steps=[])
        train(prof, range(20), {1: lambda: _far_off(out, wanted),
                                12: lambda: requests.write_request(
                                    str(out), role="actor", ranks=None, step=15, count=1)})
    notes = records(out, "note")
    statuses = [n["status"] for n in notes]
    # every far-off request was accepted in turn, each pushing out the one that starts
    # last: the notes are a burst of each kind, not one per request
    assert statuses.count("accepted") == trigger_parts.FLOOD_ACCEPTED
    assert statuses.count("dropped") == trigger_parts.FLOOD_BURST
    assert {n["message"] for n in notes if n["status"] == "dropped"} == {
        "64 requests of the role wait for sooner steps in this process"}
    assert [(r["steps"], r["trigger"]) for r in records(out, "open")] == [([15], "on_demand")]


def test_waiting_requests_count_against_the_limits(make_policy: Any, out: Path) -> None:
    def ask(step: int) -> Any:
        return lambda: requests.write_request(str(out), role="actor", ranks=None, step=step,
                                              count=1)

    with recording_backend("torch"):
        prof = listen(make_policy, steps=[], limits={"captures": 2})
        # one a step, so that they are read in this order: far off, then a near one
        train(prof, range(10), {1: ask(10**9), 2: ask(10**9 + 1), 3: ask(10**9 + 2),
                                4: ask(10**9 + 3), 5: ask(7)})
    notes = [(n["status"], n.get("first"), n.get("message")) for n in records(out, "note")
             if n["note"] == "trigger"]
    spent = "limits.captures is spent in this process (counting the 2 waiting)"
    assert notes == [("accepted", 10**9, None), ("accepted", 10**9 + 1, None),
                     ("refused", None, spent), ("refused", None, spent),
                     ("accepted", 7, None)]  # the windows before it come first
    assert [r["steps"] for r in records(out, "open")] == [[7]]


def test_refusals_are_noted_a_burst_per_minute_then_say_how_many_were_left_out(
        make_policy: Any, out: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trigger_parts, "FLOOD_SECONDS", 1.0)

    def bad(count: int) -> None:
        for i in range(count):
            (out / "triggers" / f"bad{i:03}-{time.monotonic_ns()}.json").write_text("[]")

    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        prof = listen(make_policy, steps=[])
        train(prof, range(12), {1: lambda: bad(40), 10: lambda: (time.sleep(1.1), bad(1))})
    refused = [n for n in records(out, "note") if n["status"] == "refused"]
    assert len(refused) == trigger_parts.FLOOD_BURST + 1
    assert [n.get("left_out") for n in refused] == [None] * trigger_parts.FLOOD_BURST + [32]
    assert ignoring(caplog, "bad") == trigger_parts.FLOOD_BURST + 1
