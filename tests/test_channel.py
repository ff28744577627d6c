"""The job's channel for triggers, in one process with a real TCPStore: ranks (profilers
of one role, each with its own listener thread) agree on one step, hostile store contents
never reach training, and a store that dies turns the channel off with one warning."""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, apply_policy
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.cli.main import main
from policy_engine.runtime.process.state import STATE
from policy_engine.runtime.triggers.channel import (
    PREFIX,
    JobChannel,
    StoreKV,
    agreed_step,
    connect_store,
)
from policy_engine.runtime.triggers.deadline import CallThread, abandoned
from policy_engine.runtime.triggers.folder import read_advert
from policy_engine.runtime.triggers.requests import request_body, write_request
from policy_engine.testing import recording_backend

dist = pytest.importorskip("torch.distributed")


class Worker:
    pass


class Served:
    """The job's TCPStore (this test holds its only reference, so it can kill it)."""

    def __init__(self) -> None:
        self.master: Any = dist.TCPStore("127.0.0.1", 0, is_master=True,
                                         wait_for_workers=False,
                                         timeout=datetime.timedelta(seconds=5))
        self.port = self.master.port
        self.kv = StoreKV(self.master)

    def kill(self) -> None:
        self.master = self.kv = None
        gc.collect()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A TCPStore serving MASTER_ADDR:MASTER_PORT, with torch.distributed initialised
    (on a file store of its own, so that the test may kill the TCPStore)."""
    served = Served()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(served.port))
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "pg"), 1), rank=0,
                            world_size=1)
    try:
        yield served
    finally:
        dist.destroy_process_group()


def notes(out: Path, **match: Any) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records if r["event"] == "note"
            and all(r.get(k) == v for k, v in match.items())]


def until(check: Any, seconds: float = 30.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s")


class Ranks:
    """``world`` profilers of role actor, made here (the main thread, for SIGUSR2), each
    training in its own thread: staggered starts, steps of ``nap`` seconds."""

    def __init__(self, policy: dict[str, Any], world: int, ranks: list[int] | None = None,
                 naps: dict[tuple[int, int], float] | None = None) -> None:
        self.stop = threading.Event()
        self.naps = naps or {}
        self.errors: list[BaseException] = []
        self.profs = [apply_policy(Worker(), "actor", policy, Topology(rank=r, world=world))
                      for r in (ranks if ranks is not None else range(world))]
        self.threads = [threading.Thread(target=self._train, args=(p, i)) for i, p in
                        enumerate(self.profs)]
        for thread in self.threads:
            thread.start()

    def _train(self, prof: Any, index: int) -> None:
        try:
            time.sleep(random.uniform(0, 0.3))
            n = 0
            while not self.stop.is_set() and n < 3000:
                with prof.training_step(n):
                    time.sleep(self.naps.get((prof.plan.rank, n), 0.02))
                n += 1
        except BaseException as err:
            self.errors.append(err)
        finally:
            prof.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        assert not self.errors


def test_agreed_step_is_past_the_fastest_rank_once_every_listener_has_seen_it() -> None:
    now = 1000.0
    reports = [{"step": 10, "time": now - 1, "rate": 4.0, "poll": 1.0},
               {"step": 30, "time": now, "rate": 5.0, "poll": 0.5},
               {"step": 99, "time": now - 3600, "rate": 5.0},  # ended long ago
               "garbage", {"step": -1, "time": now}, {"step": 5, "time": float("nan")},
               None, {"step": 10**13, "time": now}]
    # 30 + 5 steps/s x (2 x 1.0 s + 1 s) + 2
    assert agreed_step(reports, now, 0.1) == 47
    assert agreed_step([None, "x"], now, 1.0) is None
    assert agreed_step([{"step": 3, "time": now, "rate": 0.0}], now, 1.0) == 3 + 16 + 2


def test_next_through_the_store_is_one_step_on_every_rank(
        make_policy: Any, tmp_path: Path, store: Served,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all",
                         triggers={"on_demand": True, "poll_seconds": 0.1})
    with recording_backend("torch"):
        ranks = Ranks(policy, 4)
        try:
            until(lambda: JobChannel(store.kv, "actor").listeners() == 4)
            time.sleep(0.5)  # every rank has reported some progress
            assert read_advert(str(out)) == {"kind": "store",
                                             "where": f"127.0.0.1:{store.port}"}
            assert main(["trigger", str(out), "--role", "actor"]) == 0
            said = capsys.readouterr().out
            assert "through the job's store" in said and "4 listening" in said
            answers = until(lambda: len(notes(out, note="trigger")) == 4 and
                            notes(out, note="trigger"))
        finally:
            ranks.close()
    assert {a["status"] for a in answers} == {"accepted"}
    assert len({(a["first"], a["last"]) for a in answers}) == 1
    assert all(a["at"] <= a["first"] for a in answers)


def test_wait_reads_every_answer_on_the_store(make_policy: Any, tmp_path: Path, store: Served,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # every rank writes to its own folder (node-local disks): the answers travel back
    # through the store, the command is pointed at it with --store
    policies = [dict(make_policy(steps=[], ranks="all",
                                 triggers={"on_demand": True, "poll_seconds": 0.1}),
                     output_dir=str(tmp_path / f"node{r}")) for r in range(2)]
    elsewhere = tmp_path / "here"
    elsewhere.mkdir()
    with recording_backend("torch"):
        ranks = [Ranks(p, 2, ranks=[r]) for r, p in enumerate(policies)]
        try:
            until(lambda: JobChannel(store.kv, "actor").listeners() == 2)
            time.sleep(0.4)
            status = main(["trigger", str(elsewhere), "--role", "actor", "--ranks", "1",
                           "--store", f"127.0.0.1:{store.port}", "--wait", "30"])
        finally:
            for r in ranks:
                r.close()
    said = capsys.readouterr().out
    assert status == 0, said
    assert "rank 1 (pid" in said and "accepted: captures step" in said
    assert "rank 0" not in said  # not selected: it answers on the store only
    assert not notes(tmp_path / "node0", note="trigger")
    [note] = notes(tmp_path / "node1", note="trigger")
    assert note["status"] == "accepted"


def test_hostile_store_contents_never_reach_training(
        make_policy: Any, tmp_path: Path, store: Served,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all",
                         triggers={"on_demand": True, "poll_seconds": 0.05})
    client = store.kv
    job = JobChannel(client, "actor")
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        ranks = Ranks(policy, 2, ranks=[0])
        try:
            until(lambda: job.listeners() == 1)
            index = job.cursor()
            for value in (b"\xff\xfe garbage", b"[" * 5000, b"x" * 100_000, b"{}",
                          json.dumps({"id": "../../x", "role": "actor", "step": 1e400}
                                     ).encode(),
                          json.dumps({"role": "actor", "count": 10**9}).encode(),
                          json.dumps({"role": "nobody", "step": 3}).encode()):
                client.set(JobChannel.request_key(index), value)
                index += 1
            # a hole the hint says was written, then a hint that is no number at all
            client.set(f"{PREFIX}requests", str(index + 1).encode())
            client.set(f"{PREFIX}requests", b"not a number")
            client.set(f"{PREFIX}role/actor/progress/0", b"not json")  # a forged report
            _, body = request_body(role="actor", ranks=None, step=None, count=1)
            assert job.post(body) == index  # the hole is filled, the hint repaired
            assert client.get(f"{PREFIX}requests") == str(index + 1).encode()
            until(lambda: [n for n in notes(out, note="trigger")
                           if n["status"] == "accepted"], 20)
        finally:
            ranks.close()
    refused = notes(out, note="trigger", status="refused")
    assert len(refused) == 6  # six bad values; not "nobody"'s
    assert any("larger than" in n["message"] for n in refused)
    key = f"key {PREFIX}request/{index - 5}"
    assert any(key in r.getMessage() and "ignoring trigger request" in r.getMessage()
               for r in caplog.records)
    assert "the trigger listener failed" not in caplog.text


def test_a_store_that_dies_turns_the_channel_off_once(
        make_policy: Any, tmp_path: Path, store: Served,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all",
                         triggers={"on_demand": True, "poll_seconds": 0.05})
    with recording_backend("torch"), caplog.at_level(logging.WARNING, "policy_engine"):
        ranks = Ranks(policy, 2, ranks=[0])
        try:
            until(lambda: JobChannel(store.kv, "actor").listeners() == 1 and
                  read_advert(str(out)))  # on the store
            store.kill()
            # (only this store's: a job's clock an earlier test left on its own store
            # may say that of that store meanwhile)
            said = f"store at 127.0.0.1:{store.port} stopped answering"
            until(lambda: said in caplog.text)
            time.sleep(0.3)  # more polls: still one warning
            # the folder carries requests now
            write_request(str(out), role="actor", ranks=None, step=None, count=1)
            until(lambda: notes(out, note="trigger", status="accepted"))
        finally:
            ranks.close()
    gone = [r for r in caplog.records if said in r.getMessage()
            and "trigger requests now come through" in r.getMessage()]
    assert len(gone) == 1, [r.getMessage() for r in caplog.records]


def test_the_advert_is_written_before_the_listener_is_on_the_store(
        make_policy: Any, tmp_path: Path, store: Served) -> None:
    """A listener says where the job's channel is before it listens there: a command that
    finds no advert yet writes to the folder, which that listener still reads."""
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all",
                         triggers={"on_demand": True, "poll_seconds": 0.05})
    job = JobChannel(store.kv, "actor")
    with recording_backend("torch"):
        ranks = Ranks(policy, 2, ranks=[0])
        try:
            deadline = time.monotonic() + 60
            while not job.listeners():  # no pause: the first moment it is there
                assert time.monotonic() < deadline
            assert read_advert(str(out)) == {"kind": "store",
                                             "where": f"127.0.0.1:{store.port}"}
        finally:
            ranks.close()


def test_a_store_call_without_an_answer_is_given_up_at_its_deadline() -> None:
    """torch's client waits for ever on a server that accepts and never answers (as a
    stopped store does): the call is given up at its deadline, and every later call on
    that client fails at once instead of waiting again."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held: list[socket.socket] = []

    def accept() -> None:  # and never answer
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])
    threading.Thread(target=accept, daemon=True).start()
    try:
        calls = CallThread(name="test-store-call")
        with pytest.raises(TimeoutError, match=r"no answer within 0\.5 s"):
            # (torch's timeout bounds its tries to connect, not its wait for an answer)
            calls.call(connect_store, "127.0.0.1", server.getsockname()[1], 2.0,
                       seconds=0.5)
        assert abandoned()
        with pytest.raises(TimeoutError, match="an earlier call"):
            calls.call(time.sleep, 0)
    finally:  # no more connections, then none open: the call thread's call fails
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        for conn in held:
            conn.close()
    # ended before this process does (a thread left in torch's C++ at exit may abort it)
    until(lambda: not abandoned())


def test_a_signal_to_every_rank_is_one_capture_at_one_step(
        make_policy: Any, tmp_path: Path, store: Served) -> None:
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all",
                         triggers={"signal": True, "poll_seconds": 0.05})
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with recording_backend("torch"):
            ranks = Ranks(policy, 3)
            try:
                until(lambda: JobChannel(store.kv, "actor").listeners() == 3)
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGUSR2)  # every "rank" sees it
                answers = until(lambda: len(notes(out, note="trigger")) == 3 and
                                notes(out, note="trigger"))
                time.sleep(0.5)
            finally:
                ranks.close()
    finally:
        signal.signal(signal.SIGUSR2, previous)
        STATE.hooks.usr2_installed = False
    assert len(notes(out, note="trigger")) == 3  # one request, not three
    assert {(a["status"], a["trigger"]) for a in answers} == {("accepted", "signal")}
    assert len({a["first"] for a in answers}) == 1


def test_a_slow_rank_and_its_reference_capture_the_same_later_step(
        make_policy: Any, tmp_path: Path, store: Served) -> None:
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all", triggers={
        "poll_seconds": 0.05,
        "slow_step": {"factor": 4, "after": 5, "max": 1, "scope": "job", "reference": "0"}})
    with recording_backend("torch"):
        ranks = Ranks(policy, 3, naps={(2, 30): 0.6})
        try:
            answers = until(lambda: len(notes(out, note="trigger")) == 2 and
                            notes(out, note="trigger"))
            time.sleep(0.5)
        finally:
            ranks.close()
    assert sorted(a["rank"] for a in answers) == [0, 2]
    assert {(a["status"], a["trigger"]) for a in answers} == {("accepted", "slow_step")}
    assert len({a["first"] for a in answers}) == 1
    slow = answers[0]["slow"]
    assert slow["rank"] == 2 and slow["step"] == 30 and slow["seconds"] >= 0.6
    assert answers[0]["reference"] == "0"
    [seen] = notes(out, note="slow_step")
    assert seen["rank"] == 2 and seen["scope"] == "job"


def test_the_command_falls_back_to_the_folder_when_the_advertised_store_is_gone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from policy_engine.runtime.triggers.folder import advertise

    out = tmp_path / "out"
    (out / "triggers").mkdir(parents=True)
    served = Served()
    port = served.port
    served.kill()  # the job ended: its advert stays behind
    advertise(str(out), "store", f"127.0.0.1:{port}")
    assert main(["trigger", str(out), "--role", "actor"]) == 0
    said = capsys.readouterr()
    assert "does not answer" in said.err and "the request goes under triggers/" in said.err
    assert [p.suffix for p in (out / "triggers").iterdir() if p.is_file()
            and p.name != "channel"] == [".json"]
    # named on the command line, a store that does not answer is an error
    assert main(["trigger", str(out), "--role", "actor", "--store",
                 f"127.0.0.1:{port}"]) == 2
    assert "cannot reach the job's store" in capsys.readouterr().err


def test_an_advert_that_is_not_one_is_not_followed(tmp_path: Path) -> None:
    from policy_engine.runtime.triggers.folder import ADVERT

    out = tmp_path / "out"
    (out / "triggers").mkdir(parents=True)
    advert = out / "triggers" / ADVERT
    for planted in ('{"kind": "store"}', '{"kind": "nfs", "where": "x:1"}', "[" * 9000,
                    '{"kind": "store", "where": "' + "h" * 300 + ':1"}'):
        advert.write_text(planted)
        assert read_advert(str(out)) is None
    advert.unlink()
    (tmp_path / "elsewhere").write_text('{"kind": "store", "where": "127.0.0.1:1"}')
    advert.symlink_to(tmp_path / "elsewhere")  # a link is never followed
    assert read_advert(str(out)) is None


class Counted(StoreKV):
    """The store, counting its calls."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.calls = 0

    def has(self, key: str) -> bool:
        self.calls += 1
        return super().has(key)


def test_counts_come_from_the_keys_that_exist_in_a_few_calls(store: Served) -> None:
    kv = Counted(store.master)
    job = JobChannel(kv, "actor")
    kv.set(f"{PREFIX}role/actor/listeners", b"1000000000")  # forged: never read
    slots = [job.register(f'{{"n": {i}}}'.encode()) for i in range(3)]
    assert slots == [0, 1, 2]
    kv.calls = 0
    assert job.listeners() == 3 and kv.calls <= 4
    for index in range(2000):  # a long list, written by whoever
        kv.set(JobChannel.request_key(index), b"{}")
    kv.calls = 0
    assert job.cursor() == 2000 and kv.calls <= 2 * 11 + 2
    _, body = request_body(role="actor", ranks=None, step=7, count=1)
    kv.set(f"{PREFIX}requests", b"\x00garbage")
    assert job.post(body) == 2000 and job.hint() == (2001, b"2001")
    # a request without a step: the first listener's proposal is every listener's
    assert job.agree(2000, 42) == 42 and job.agree(2000, 43) == 42
    kv.set(f"{PREFIX}step/2001", b"soon")
    assert job.agree(2001, 44) is None


def test_listeners_starting_together_each_get_a_slot() -> None:
    """Many processes registering at once (a large job's ranks start together): each gets
    a slot of its own, however many lose a race for a key on the way, and the count is
    theirs. Threads stand in for the processes."""
    count = 192
    slots: list[int] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(count)
    store = Served()
    # a few client connections, each shared by many threads (a TCPStore client is
    # thread-safe): a race for a key is between the calls of two threads, whatever
    # connection they use
    clients = [connect_store("127.0.0.1", store.port) for _ in range(8)]
    jobs = [JobChannel(clients[i % len(clients)], "actor") for i in range(count)]

    def join(index: int) -> None:
        try:
            gate.wait()
            slots.append(jobs[index].register(f'{{"n": {index}}}'.encode()))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(slots) == list(range(count))
    assert JobChannel(store.kv, "actor").listeners() == count


@pytest.mark.parametrize("on_demand", [False, True])
def test_a_signal_to_every_rank_on_the_folder_is_one_request_at_one_step(
        make_policy: Any, tmp_path: Path, on_demand: bool) -> None:
    """No store: the ranks post through ``triggers/`` and read what they post there (with
    or without on_demand), and the first rank's request stands for the others' (one claim
    per signal, as on the store)."""
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all", triggers={
        "signal": True, "on_demand": on_demand, "poll_seconds": 0.05})
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with recording_backend("torch"):
            ranks = Ranks(policy, 3)
            try:
                progress = out / "triggers" / "progress"
                until(lambda: progress.is_dir() and len(
                    [p for p in os.listdir(progress) if p.startswith("actor.")]) == 3)
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGUSR2)  # every "rank" sees it
                answers = until(lambda: len(notes(out, note="trigger")) >= 3 and
                                notes(out, note="trigger"))
                time.sleep(1.0)
            finally:
                ranks.close()
    finally:
        signal.signal(signal.SIGUSR2, previous)
        STATE.hooks.usr2_installed = False
    answers = notes(out, note="trigger")
    assert len(answers) == 3, answers  # one request, not three
    assert {(a["status"], a["trigger"]) for a in answers} == {("accepted", "signal")}
    assert len({a["request"] for a in answers}) == 1
    assert len({a["first"] for a in answers}) == 1


def test_a_progress_file_is_written_when_its_step_moves_only(
        make_policy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No store: a rank's progress file under triggers/progress/ is rewritten when it has
    a new step to say, not at every poll (the republish of a process whose step stands
    still included)."""
    from policy_engine.runtime.triggers import listener_thread

    monkeypatch.setattr(listener_thread, "REPUBLISH", 0.0)  # a report due at every poll
    out = tmp_path / "out"
    policy = make_policy(steps=[], ranks="all",
                         triggers={"on_demand": True, "poll_seconds": 0.02})
    path = out / "triggers" / "progress" / "actor.0"

    def written() -> tuple[int, int]:
        found = path.stat()
        return found.st_ino, found.st_mtime_ns

    with recording_backend("torch"):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=0, world=2))
        try:
            with prof.training_step(1):
                pass
            until(lambda: path.exists() and json.loads(path.read_text())["step"] == 1)
            first = written()
            time.sleep(0.5)  # some 25 polls
            assert written() == first
            with prof.training_step(2):
                pass
            until(lambda: json.loads(path.read_text())["step"] == 2)
            assert written() != first
        finally:
            prof.close()
