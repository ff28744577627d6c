"""The job's clock (runtime/triggers/clock.py) over a real TCPStore: a round trip to the
reference and back, the best of several with its uncertainty; rings that are none dropped;
no reference, no answer within its bound; what a process notes; the test setting that
moves a process's clock, in its readings and in its torch traces; and the notes read back
(analysis/clocks.py)."""

from __future__ import annotations

import datetime
import gzip
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine.analysis.clocks import Clocks
from policy_engine.backends.base import TEST_CLOCK_SHIFT, clock_shift_ns
from policy_engine.files.records import from_json, note_line
from policy_engine.runtime.triggers import clock
from policy_engine.runtime.triggers.channel import StoreKV, connect_store
from policy_engine.runtime.triggers.deadline import BoundedKV, CallThread
from policy_engine.runtime.triggers.ray_actor import _Keys

dist = pytest.importorskip("torch.distributed")


class Job:
    """A TCPStore, and a reference answering on a thread of its own until stopped."""

    def __init__(self) -> None:
        self.master: Any = dist.TCPStore("127.0.0.1", 0, is_master=True,
                                         wait_for_workers=False,
                                         timeout=datetime.timedelta(seconds=10))
        self.stopped = threading.Event()
        self.answered = 0
        self.thread: threading.Thread | None = None

    def client(self) -> BoundedKV:
        return BoundedKV(connect_store("127.0.0.1", self.master.port), CallThread())

    def serve(self) -> None:
        kv = self.client()
        clock.Keeper(0, lambda *a, **f: None, lambda: None).tick(kv, "store")  # says it is

        def run() -> None:
            while not self.stopped.is_set():
                self.answered += clock.serve(kv, 0, 0.5, self.stopped.is_set)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(10)


@pytest.fixture
def job() -> Iterator[Job]:
    found = Job()
    yield found
    found.stop()


def test_a_rank_measures_its_offset_to_the_reference(job: Job) -> None:
    job.serve()
    reading = clock.measure(job.client())
    # one host, one clock: the offset is within the uncertainty (plus a scheduler's slice
    # on a loaded machine), and the uncertainty is half the best round trip
    assert reading.reference == 0 and reading.rounds == clock.ROUNDS
    assert reading.process == clock.process_name()  # host:pid of the reference
    assert 0 < reading.uncertainty_us < 200_000
    assert abs(reading.offset_us) <= reading.uncertainty_us + 20_000
    job.stop()
    assert job.answered == clock.ROUNDS
    assert not StoreKV(job.master).has(clock.BELL)  # the bell is free again


def test_without_a_reference_a_ring_gets_no_answer_within_its_bound(job: Job) -> None:
    began = time.monotonic()
    with pytest.raises(clock.ClockError, match=r"rank 0 did not answer within 2 s"):
        clock.measure(job.client())
    assert time.monotonic() - began < clock.ANSWER_SECONDS + 5


def test_a_ring_that_is_none_is_dropped_and_the_bell_freed(job: Job) -> None:
    kv = job.client()
    kv.set(clock.BELL, b"../../etc/passwd")
    job.serve()
    deadline = time.monotonic() + 10
    while kv.has(clock.BELL) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kv.has(clock.BELL) and job.answered == 0
    assert clock.measure(kv).reference == 0  # and the next rings are answered


def test_a_ring_held_by_another_for_too_long_is_given_up(job: Job,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "RING_SECONDS", 0.5)
    kv = job.client()
    kv.set(clock.BELL, b"someone-else")  # and no reference to free it
    with pytest.raises(clock.ClockError, match=r"the bell stayed rung by others for 0\.5 s"):
        clock.measure(kv)


def test_a_keeper_notes_each_reading_and_stops_after_failures(job: Job) -> None:
    notes: list[dict[str, Any]] = []
    keeper = clock.Keeper(3, lambda kind, **f: notes.append({"note": kind, **f}), lambda: None)
    kv = job.client()
    began = time.monotonic()
    keeper.tick(kv, "store")  # no reference has said it answers: no ring, nothing noted
    assert notes == [] and time.monotonic() - began < 1.0
    kv.set(clock.REFERENCE, b"0 1")  # one that said so, and went away
    for _ in range(clock.GIVE_UP + 1):  # each try fails, then it stops trying
        keeper.tick(kv, "store")
    assert len(notes) == clock.GIVE_UP and all("error" in n for n in notes)
    assert notes[-1]["error"].endswith("no more measurements after 3 without an answer")
    assert [n["why"] for n in notes] == ["start"] * 3  # the first is tried again
    job.serve()
    keeper.failures = 0
    keeper.tick(kv, "store")
    keeper.asked += 1  # a capture opened
    keeper.tick(kv, "store")
    keeper.tick(kv, "store")  # nothing new: nothing measured
    good = notes[clock.GIVE_UP:]
    assert [n["why"] for n in good] == ["start", "capture"]
    assert all(n["reference_rank"] == 0 and n["rounds"] == 5 and n["channel"] == "store"
               for n in good)


def test_the_reference_notes_and_says_that_it_is_one(job: Job) -> None:
    notes: list[dict[str, Any]] = []
    keeper = clock.Keeper(0, lambda kind, **f: notes.append(f), lambda: None)
    kv = job.client()
    keeper.tick(kv, "store")
    keeper.tick(kv, "store")
    assert [(n["why"], n["offset_us"], n["uncertainty_us"]) for n in notes] == [
        ("reference", 0.0, 0.0)]
    assert kv.get(clock.REFERENCE) is not None


def test_the_test_setting_moves_this_processs_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_CLOCK_SHIFT, "2")
    assert clock_shift_ns() == 2_000_000_000
    assert clock.now_ns() - time.time_ns() == pytest.approx(2e9, abs=1e8)
    for bad in ("x", "nan", "1e9"):
        monkeypatch.setenv(TEST_CLOCK_SHIFT, bad)
        assert clock_shift_ns() == 0


@pytest.mark.parametrize("gz", [False, True])
def test_the_test_setting_moves_a_torch_traces_base_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool) -> None:
    import torch

    from policy_engine.backends.torch import _write_trace

    def profiled() -> Any:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            torch.ones(4).sum()
        return p.profiler

    def base(path: Path) -> int:
        opener: Any = gzip.open if gz else open
        with opener(path, "rt") as f:
            found: int = json.load(f)["baseTimeNanoseconds"]
        return found

    plain, moved = tmp_path / "a", tmp_path / "b"
    for path in (plain, moved):
        path.touch()
    _write_trace(profiled(), str(plain), gz=gz)
    monkeypatch.setenv(TEST_CLOCK_SHIFT, "-1.5")
    _write_trace(profiled(), str(moved), gz=gz)
    # kineto's base time is its own round number: the same for both, less the shift
    assert base(moved) - base(plain) == -1_500_000_000


def test_clock_notes_are_checked_and_read_per_rank() -> None:
    def line(**fields: Any) -> Any:
        return from_json(note_line({"role": "x", "rank": fields.pop("rank")}, note="clock",
                                   **fields))
    with pytest.raises(ValueError, match="uncertainty_us: expected a number of "
                                         "microseconds, not negative"):
        line(rank=1, offset_us=1.0, uncertainty_us=-1.0)
    with pytest.raises(ValueError, match="offset_us: expected a number"):
        line(rank=1, offset_us="soon", uncertainty_us=1.0)
    clocks = Clocks()
    clocks.add(line(rank=0, offset_us=0.0, uncertainty_us=0.0, why="reference",
                    measured_at=100.0))
    clocks.add(line(rank=1, offset_us=-2e6, uncertainty_us=900.0, measured_at=102.0))
    clocks.add(line(rank=1, offset_us=-2.001e6, uncertainty_us=100.0, measured_at=500.0))
    clocks.add(line(rank=2, error="rank 0 did not answer within 2 s", measured_at=100.0))
    # the reading for a time: the most certain once the drift since it is counted
    assert clocks.offset(1, 101.0).offset_us == -2e6  # type: ignore[union-attr]
    assert clocks.offset(1, 499.0).offset_us == -2.001e6  # type: ignore[union-attr]
    assert clocks.offset(2) is None
    assert clocks.offsets([0, 1, 2], 101.0) == {0: (0.0, 0.0), 1: (-2e6, 900.0)}
    status = clocks.status([0, 1, 2])
    assert (status["basis"], status["unmeasured"]) == ("partial", "2")
    assert status["failed"] == [{"rank": 2, "error": "rank 0 did not answer within 2 s"}]


def test_ranks_measured_against_two_references_are_said_to_be(tmp_path: Path) -> None:
    """Two stores (verl's worker groups each have one), two rank 0s: their ranks' offsets
    are to different clocks, and the status says which ranks measured against which."""
    clocks = Clocks()
    for rank, process in ((1, "a:10"), (2, "a:10"), (3, "b:20")):
        clocks.add(from_json(note_line({"role": "x", "rank": rank}, note="clock",
                                       offset_us=5.0, uncertainty_us=1.0,
                                       reference_process=process)))
    status = clocks.status([1, 2, 3])
    assert status["references"] == [{"process": "a:10", "ranks": "1-2"},
                                    {"process": "b:20", "ranks": "3"}]
    assert "measured against 2 different references" in status["text"]
    assert "references" not in clocks.status([1, 2])


def test_the_ray_actor_deletes_a_key() -> None:
    keys = _Keys()
    keys.set("k", b"value")
    keys.delete("k")
    keys.delete("never")
    assert keys.get(["k"]) == [None] and keys.held == 0
