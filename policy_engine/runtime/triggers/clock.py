"""The job's clock: each process's offset to rank 0's clock, measured over the job's
channel (the c10d store or the Ray actor), on the listener thread.

Each rank's trace is stamped by its own host's clock, and hosts disagree (by
milliseconds under NTP, by seconds without it), so two ranks' times can be laid on one
axis only once each rank's offset to a common clock is known. Rank 0's process is that
clock (the *reference*): between its polls its listener thread looks at the store for a
*ring* and answers each with its clock's reading. Every other process measures, in
:data:`ROUNDS` rounds: it reads its clock (t1), rings (one ``compare_set`` on
:data:`BELL`, which only an empty bell takes: one ring at a time, job-wide), waits for
the answer (the reference's reading t2, on a key named after the ring), and reads its
clock again (t4). The reference read its clock between t1 and t4, so its clock at the
round's middle is t2 within half the round trip: ``offset = t2 - (t1 + t4) / 2`` with
an uncertainty of ``(t4 - t1) / 2``; the round with the shortest trip is kept. A time t
on the process's clock is ``t + offset`` on rank 0's.

A process measures when it reaches the job's channel and again after each capture it
opens (:func:`capture_opened`, one counter bump on the training thread), and writes each
reading in its manifest (a ``clock`` note: ``offset_us``, ``uncertainty_us``, ``rounds``,
``reference_rank``, ``why``; or ``error`` when no answer came). One listener of a process
measures for all its roles (:class:`Keeper`, held in runtime.process.state).

Anyone who reaches the store can write these keys, so a ring or an answer that is not
one is dropped, and every wait is bounded: a ring waits at most :data:`RING_SECONDS` for
the bell, and :data:`ANSWER_SECONDS` for its answer; a process whose rings go
unanswered :data:`GIVE_UP` times in a row stops measuring. A process rings only once the
reference has said it answers (:data:`REFERENCE`): where rank 0 profiles nothing, nobody
answers, and the others look for that key once a poll, and measure nothing. The reference
answers one ring at a time: a job of a thousand measuring processes is measured in about a
second.

``POLICY_ENGINE_TEST_CLOCK_SHIFT`` (seconds; tests only) moves this process's clock:
its readings here and its traces' timestamps (backends.base.clock_shift_ns).
"""

from __future__ import annotations

import os
import random
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

import attrs

from policy_engine.backends.base import clock_shift_ns
from policy_engine.files.layout import host_name
from policy_engine.language.values.triggers import Triggers
from policy_engine.plan.plan import Plan
from policy_engine.runtime.process.state import STATE
from policy_engine.runtime.triggers.channel import PREFIX, KeyValue

__all__ = ["ANSWER_SECONDS", "BELL", "ROUNDS", "ClockError", "Keeper", "Reading",
           "capture_opened", "measure", "now_ns", "serve", "wanted"]

#: The key a ring takes, and where its answer is written (``<token>``: the ring's own);
#: the key the reference sets once it answers (a rank rings only once it is there).
BELL = f"{PREFIX}clock/bell"
ANSWER = f"{PREFIX}clock/answer/"
REFERENCE = f"{PREFIX}clock/reference"
#: Rounds of one measurement (the shortest round trip is kept).
ROUNDS = 5
#: Seconds a ring waits for the bell (others ringing), and for the reference's answer.
RING_SECONDS = 3.0
ANSWER_SECONDS = 2.0
#: Seconds between two looks of the reference at the bell: just after a ring, and at
#: most (it looks at its listener's wake-up between two looks too).
FAST = 0.0005
SLOW = 0.1
#: Measurements without an answer, in a row, after which a process stops measuring.
GIVE_UP = 3
_TOKEN = re.compile(rb"^[0-9A-Za-z-]{1,64}$")
_ANSWER = re.compile(rb"^(\d{1,9}) (-?\d{1,20})(?: ([\w.:-]{1,160}))?$")
_NOT_NAME = re.compile(r"[^\w.:-]+")


def now_ns() -> int:
    """This process's clock, in Unix nanoseconds (moved by the test shift, if any)."""
    return time.time_ns() + clock_shift_ns()


class ClockError(Exception):
    """A measurement got no answer (why, in words)."""


@attrs.frozen
class Reading:
    """One measurement: ``offset_us`` brings this process's clock to the reference's,
    within ``uncertainty_us`` (half the shortest round trip); ``reference``: its rank."""

    offset_us: float
    uncertainty_us: float
    rounds: int
    reference: int
    #: the reference's process, ``host:pid`` (two stores, two references: verl's worker
    #: groups each have a store of their own)
    process: str | None = None


def _ring(kv: KeyValue, body: bytes) -> int:
    """Take the bell for ``body``; t1 (this clock, just before the ring that took it)."""
    deadline = time.monotonic() + RING_SECONDS
    pause = 0.001
    while True:
        t1 = now_ns()
        if kv.compare_set(BELL, b"", body) == body:
            return t1
        if time.monotonic() >= deadline:
            raise ClockError(f"the bell stayed rung by others for {RING_SECONDS:g} s")
        time.sleep(random.uniform(0, pause))
        pause = min(pause * 2, 0.05)


def measure(kv: KeyValue, rounds: int = ROUNDS) -> Reading:
    """This process's offset to the reference's clock, the best of ``rounds`` round
    trips; ClockError when a round gets no answer."""
    best: tuple[int, float, int, str | None] | None = None  # trip, offset (ns), rank, process
    for _ in range(rounds):
        token = f"{os.getpid()}-{secrets.token_hex(6)}"
        body = token.encode()
        t1 = _ring(kv, body)
        key = ANSWER + token
        if not kv.wait(key, ANSWER_SECONDS):
            raise ClockError(f"rank 0 did not answer within {ANSWER_SECONDS:g} s (does "
                             "rank 0 profile, with the job's channel?)")
        value = kv.get(key)
        t4 = now_ns()
        kv.delete(key)
        found = _ANSWER.match(value or b"")
        if found is None:
            raise ClockError("the answer is not a rank and a time")
        reference, t2 = int(found.group(1)), int(found.group(2))
        process = found.group(3).decode() if found.group(3) else None
        trip = t4 - t1
        if best is None or trip < best[0]:
            best = (trip, t2 - (t1 + t4) / 2, reference, process)
    assert best is not None  # rounds >= 1
    trip, offset, reference, process = best
    return Reading(round(offset / 1000, 3), round(trip / 2000, 3), rounds, reference, process)


def process_name() -> str:
    """This process as a reference names itself in its answers: ``host:pid``."""
    return f"{_NOT_NAME.sub('-', host_name())[:120]}:{os.getpid()}"


def serve(kv: KeyValue, rank: int, seconds: float, stop: Callable[[], bool]) -> int:
    """Answer rings for ``seconds`` (less when ``stop()`` says so); how many.

    The bell is looked at, not waited for: a store's wait that times out prints a line of
    torch's on every timeout, in the job's log. It is looked at every :data:`FAST` s
    after a ring (rings come in bursts: every rank measures after the same step's capture
    opens), the pause doubling to :data:`SLOW` s while none comes; the one late answer
    of a burst is the round trip a measurement does not keep."""
    answered = 0
    deadline = time.monotonic() + seconds
    pause = SLOW
    me = process_name()
    while not stop():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        body = kv.get(BELL)
        if body is None:
            time.sleep(min(pause, left))
            pause = min(pause * 2, SLOW)
            continue
        if _TOKEN.match(body):
            kv.set(ANSWER + body.decode(), f"{rank} {now_ns()} {me}".encode())
            answered += 1
        kv.delete(BELL)  # a ring that is none is dropped too: the bell is free again
        pause = FAST
    return answered


def capture_opened() -> None:
    """A capture opened in this process (the training thread): the keeper measures again,
    woken now."""
    keeper = STATE.clock
    if keeper is not None:
        keeper.asked += 1
        keeper.wake()


class Keeper:
    """The listener of this process that measures (or, on rank 0, answers) for all its
    roles: the first to reach the job's channel. ``note`` writes a manifest note."""

    __slots__ = ("asked", "done", "failures", "note", "rank", "wake")

    def __init__(self, rank: int, note: Callable[..., None], wake: Callable[[], None]) -> None:
        self.rank = rank
        self.note = note
        self.wake = wake
        self.asked = 0  # captures opened (bumped by the training thread)
        self.done = -1  # the count of ``asked`` last measured for (-1: not yet)
        self.failures = 0  # measurements without an answer, in a row

    @property
    def serves(self) -> bool:
        return self.rank == 0

    def due(self) -> bool:
        return not self.serves and self.failures < GIVE_UP and self.done != self.asked

    def tick(self, kv: KeyValue, kind: str) -> None:
        """On the listener thread: measure if a capture opened since the last time (or
        this is the first), and note it; the reference notes once that it is."""
        if self.serves:
            if self.done < 0:
                self.done = 0
                me = process_name()
                kv.set(REFERENCE, f"{self.rank} {me}".encode())
                self.note("clock", offset_us=0.0, uncertainty_us=0.0, rounds=0,
                          reference_rank=self.rank, reference_process=me, why="reference",
                          channel=kind, measured_at=now_ns() / 1e9)
            return
        if not self.due() or not kv.has(REFERENCE):
            return  # (no reference answers yet: looked at again at the next poll)
        why = "start" if self.done < 0 else "capture"
        self.done = self.asked
        at = now_ns() / 1e9
        try:
            reading = measure(kv)
        except ClockError as err:
            self.failures += 1
            if why == "start":
                self.done = -1  # the first measurement is tried again at the next poll
            fields: dict[str, Any] = {"error": str(err), "why": why, "channel": kind,
                                      "measured_at": at}
            if self.failures >= GIVE_UP:
                fields["error"] += f"; no more measurements after {GIVE_UP} without an answer"
            self.note("clock", **fields)
            return
        self.failures = 0
        self.note("clock", offset_us=reading.offset_us,
                  uncertainty_us=reading.uncertainty_us, rounds=reading.rounds,
                  reference_rank=reading.reference, reference_process=reading.process,
                  why=why, channel=kind, measured_at=at)


def wanted(plan: Plan, triggers: Triggers) -> bool:
    """Whether a role needs a listener for the job's clock alone: in a job of several
    ranks, where the job's channel may be reached, and no listener of this process keeps
    the clock yet."""
    return plan.world > 1 and triggers.channel != "folder" and STATE.clock is None
