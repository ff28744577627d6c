"""``triggers.stall``: a step that runs past its limit, seen from the role's listener thread,
which runs while the training thread is blocked (docs/runtime.md, Stalls).

The training thread does nothing more than for the other triggers: at ``training_step(n)``'s
start it hands the listener the step and its clock (two attribute writes it makes anyway),
and at its end one more write, the step that ended. The listener thread
(:class:`StallWatch`, driven by :class:`~policy_engine.runtime.triggers.listener_thread.
ListenerThread`) looks at them at every poll, and wakes when the step under way would pass
its limit: ``after`` seconds, or ``after: Nx`` times the median step (the steps' mean time
between two polls, over the last :data:`SAMPLES` polls where the step moved; never less than
``at_least`` seconds). A step past it is a stall, and this thread

1. writes this process's stall record (runtime.process.stall_report) and a manifest note;
2. asks the main thread to save the captures it runs, partial (runtime.process.signals:
   done only when that thread still runs Python, the case of a rank stuck outside a
   collective; a thread blocked in C++ keeps its capture, which it saves as usual when the
   call returns or the process gets SIGTERM);
3. with ``job``, asks every rank for its record over the job's channel: on the store (or
   the Ray actor), the key ``stall/episode`` names the stall (claimed with a
   compare-and-set, so that ranks that stall together make one episode), every watching
   process reads it at its next poll, writes its record and answers under
   ``stall/answer/<episode>/<slot>``; the rank that claimed it writes the roll call a few
   polls later, naming the processes registered under ``stall/member/<slot>`` that did not
   answer. On the folder channel the ask is a request file (``why: stall``, role ``*``).

When the step ends after all, a clearing is written beside the record: a slow step, not a
hang. SIGUSR2 (and ``policy-engine trigger DIR --stall``) asks for records by hand. A process
writes one record per stall, however many asks reach it, and at most ``max`` stalls of its
own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from policy_engine.analysis.stall_record import Member, RollCall, StallRecord
from policy_engine.errors import is_int
from policy_engine.files.layout import host_name
from policy_engine.language.values.triggers import Stall
from policy_engine.plan.plan import Plan
from policy_engine.runtime.process import signals, stall_report
from policy_engine.runtime.process.state import STATE, warn_once
from policy_engine.runtime.triggers import folder as channel_folder
from policy_engine.runtime.triggers.channel import MAX_LISTENERS, PREFIX, JobChannel
from policy_engine.runtime.triggers.requests import (
    EVERY_ROLE,
    MAX_BYTES,
    BadRequest,
    Request,
    load_bounded,
    request_body,
)

__all__ = ["JOIN_SECONDS", "MIN_SAMPLES", "RECORDS_PER_PROCESS", "ROLL_CALL_POLLS", "SAMPLES",
           "StallClock", "StallWatch", "answers", "members", "post_episode"]

log = logging.getLogger("policy_engine")
#: Polls whose step moved that the median step is taken over, and the fewest it needs.
SAMPLES, MIN_SAMPLES = 50, 3
#: An episode begun less than this long ago (or than the limit, if longer) is the one a
#: stall seen now belongs to: ranks that stall together write one episode.
JOIN_SECONDS = 60.0
#: Polls of the asking rank's the others get to answer, and seconds on top.
ROLL_CALL_POLLS, ROLL_CALL_MARGIN = 3, 5.0
#: Episodes answered that this process remembers (a flood of asks is not a list to grow).
REMEMBERED = 16
#: Records a process writes at most, asked for or not (a flood of asks is no flood of
#: files): ``max`` bounds the stalls of its own.
RECORDS_PER_PROCESS = 100
_EPISODE = f"{PREFIX}stall/episode"
_clock = time.perf_counter


def _member_key(slot: int) -> str:
    return f"{PREFIX}stall/member/{slot}"


def _answer_key(episode: str, slot: int) -> str:
    return f"{PREFIX}stall/answer/{episode}/{slot}"


class StallClock:
    """The limit a step may run for, and the measurements the median step comes from."""

    __slots__ = ("last", "left", "samples", "spec")

    def __init__(self, spec: Stall) -> None:
        self.spec = spec
        self.samples: deque[float] = deque(maxlen=SAMPLES)
        self.last = (-1, 0.0)  # the (step, stamp) seen at the previous look
        self.left = spec.max  # stalls of its own this process still records

    def measure(self, step: int, stamp: float) -> None:
        """The training thread's step and its start as seen now: one sample of the mean
        step time when the step moved since the last look."""
        old, then = self.last
        if step > old >= 0 and stamp > then:
            self.samples.append((stamp - then) / (step - old))
        self.last = (step, stamp)

    def limit(self) -> float | None:
        """Seconds a step may run (None: not known yet, the median step is not)."""
        spec = self.spec
        if spec.seconds is not None:
            return spec.seconds
        if len(self.samples) < MIN_SAMPLES or spec.factor is None:
            return None
        return max(spec.at_least, spec.factor * statistics.median(self.samples))

    def said(self, limit: float | None) -> str:
        spec = self.spec
        if spec.seconds is not None:
            return f"{spec.seconds:g} s"
        if limit is None:
            return f"{spec.after} the median step (not measured yet)"
        median = statistics.median(self.samples)
        return (f"{spec.after} the median step ({median:.3g} s), at least "
                f"{spec.at_least:g} s: {limit:.3g} s")


class _Open:
    """A step this process wrote a record in, and which has not ended; ``stalled``: it
    ran past its limit (a record asked for in a step that then stalls is its record)."""

    __slots__ = ("path", "stalled", "stamp", "step")

    def __init__(self, step: int, stamp: float, path: str) -> None:
        self.step, self.stamp, self.path = step, stamp, path
        self.stalled = False


class _Episode:
    """An episode as the store's key says it: ``id``, who began it and when."""

    __slots__ = ("by", "id", "raw", "time", "why")

    def __init__(self, raw: bytes, value: Mapping[str, Any]) -> None:
        self.raw = raw
        self.id = str(value["id"])
        self.by = value.get("by") if isinstance(value.get("by"), int) else None
        self.time = float(value["time"])
        self.why = "hand" if value.get("why") == "hand" else "stall"


def read_episode(channel: JobChannel) -> tuple[bytes, _Episode | None]:
    """The store's episode key: its raw value (what a compare-and-set replacing it must
    name, held no longer than that), and the episode it holds (None: none)."""
    raw = channel.kv.get(_EPISODE) or b""
    if not raw or len(raw) > MAX_BYTES:
        return raw, None
    try:
        value = load_bounded(raw)
    except BadRequest:
        return raw, None
    if not isinstance(value, dict) or not isinstance(value.get("id"), str) or \
            not channel_id(value["id"]) or not isinstance(value.get("time"), (int, float)) \
            or isinstance(value.get("time"), bool):
        return raw, None
    return raw, _Episode(raw, value)


def channel_id(text: str) -> bool:
    return 0 < len(text) <= 64 and all(c.isalnum() or c in "_.-" for c in text)


def new_episode(why: str, by: int | None, step: int | None) -> tuple[str, bytes]:
    """A new episode's id and the value of the store's key."""
    eid = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(4)}"
    return eid, json.dumps({"id": eid, "by": by, "why": why, "step": step,
                            "time": time.time(), "pid": os.getpid()}).encode()


def post_episode(channel: JobChannel, why: str, by: int | None, step: int | None,
                 join: float | None) -> tuple[_Episode | None, bool]:
    """Begin an episode on the store, or join the one begun less than ``join`` seconds ago
    (None: always begin one). Returns it and whether this call began it."""
    for _ in range(4):
        raw, found = read_episode(channel)
        # an episode "from the future" (a clock far off, or a planted key) is not joined
        if found is not None and join is not None and -5.0 <= time.time() - found.time <= join:
            return found, False
        _eid, body = new_episode(why, by, step)
        if channel.kv.compare_set(_EPISODE, raw, body) == body:
            return _Episode(body, json.loads(body)), True
    return None, False


def members(channel: JobChannel) -> list[Any]:
    """The processes that watch for stalls on the store, by slot (None: not parsed); at
    most :data:`~policy_engine.runtime.triggers.channel.MAX_LISTENERS`, whatever keys
    someone planted."""
    count = min(channel.end(_member_key), MAX_LISTENERS)
    return [_json(v) for v in _gets(channel, [_member_key(s) for s in range(count)])]


def answers(channel: JobChannel, episode: str, count: int) -> dict[int, Any]:
    """The answers to ``episode`` so far, by member slot."""
    found = _gets(channel, [_answer_key(episode, s) for s in range(count)])
    return {s: a for s, v in enumerate(found) if isinstance(a := _json(v), dict)}


def _gets(channel: JobChannel, keys: list[str]) -> list[bytes | None]:
    out: list[bytes | None] = []
    for at in range(0, len(keys), 64):
        out.extend(channel.kv.gets(keys[at:at + 64]))
    return out


def _json(data: bytes | None) -> Any:
    if data is None or len(data) > MAX_BYTES:
        return None
    try:
        return load_bounded(data)
    except BadRequest:
        return None


class StallWatch:
    """A role's stall watch in this process, on its listener thread. ``where()`` is the
    role's position (runtime.role.profiler: region, inner step, the capture open);
    ``note(kind, **fields)`` writes a manifest note."""

    def __init__(self, plan: Plan, spec: Stall, note: Callable[..., None],
                 where: Callable[[], dict[str, Any]] | None) -> None:
        self.plan = plan
        self.spec = spec
        self.note = note
        self.where = where
        self.clock = StallClock(spec)
        self.open: _Open | None = None
        # (time, path, step) of the last record: the step None when it was between steps
        self.recent: tuple[float, str, int | None] | None = None
        self.answered: deque[str] = deque(maxlen=REMEMBERED)  # episodes answered
        self.posting: str | None = None  # "stall" or "hand": to ask the job for
        self.roll: tuple[str, float, float] | None = None  # (episode, due, asked at)
        self.seen: str | None = None  # the episode on the store last seen
        self.slot = -1  # this process's member slot on the store
        self.signals = STATE.hooks.usr2_count
        self.started = time.time()
        self.written = 0  # records written, of every kind

    # -- what the listener asks ------------------------------------------------------
    def wait(self, step: int, stamp: float, done: int) -> float | None:
        """Seconds until the step under way passes its limit (None: nothing to wait for)."""
        if step < 0 or done == step or self.open is not None or self.clock.left <= 0:
            return None
        limit = self.clock.limit()
        return None if limit is None else max(0.0, stamp + limit - _clock())

    def local(self, step: int, stamp: float, done: int, ended: float,
              trainer: int, job: bool) -> None:
        """A poll's own part (no channel call): a stall that cleared, SIGUSR2, and a step
        past its limit."""
        self.clock.measure(step, stamp)
        if self.open is not None:
            self._clear(step, stamp, done, ended)
        if STATE.hooks.usr2_count != self.signals:
            self.signals = STATE.hooks.usr2_count
            self.write("hand", step, stamp, done, trainer)
            self.posting = "hand" if job else None
        if (self.open is not None and self.open.stalled) or step < 0 or done == step or \
                self.clock.left <= 0:
            return
        limit = self.clock.limit()
        running = _clock() - stamp
        if limit is None or running <= limit:
            return
        self.clock.left -= 1
        if self._recently(step) is None:
            self.write("stall", step, stamp, done, trainer, limit=limit)
        if self.open is not None:
            self.open.stalled = True
        self._cut(step, running)
        self.posting = "stall" if job and self.spec.job else None

    def write(self, why: str, step: int, stamp: float, done: int, trainer: int, *,
              limit: float | None = None, episode: str | None = None,
              asked_by: int | None = None) -> str | None:
        """Write this process's record now; its path relative to the output folder (None:
        it could not be written)."""
        plan = self.plan
        self.written += 1
        if self.written > RECORDS_PER_PROCESS:
            warn_once(("stall-records", plan.role), "policy-engine: role %r: %s stall records "
                      "written by this process; no more are", plan.role, RECORDS_PER_PROCESS)
            return None
        in_step = step >= 0 and done != step
        position = self._position()
        position.update(step=None if step < 0 else step, in_step=in_step,
                        running=round(_clock() - stamp, 3) if in_step else None,
                        limit=limit, limit_said=self.clock.said(limit if why == "stall"
                                                                else self.clock.limit()))
        capture = position.get("capture")
        if isinstance(capture, dict):
            capture["save"] = _save_said(capture) if why == "stall" else "kept open"
            capture.pop("main", None)
        try:
            found = stall_report.record(why=why, identity={"role": plan.role, "rank": plan.rank,
                                                           "world": plan.world},
                                        training=trainer or None, position=position,
                                        episode=episode, asked_by=asked_by)
            path = stall_report.write_record(plan.output_dir, found)
        except Exception as err:
            warn_once(("stall-record", plan.role, type(err).__name__),
                      "policy-engine: role %r: the stall record could not be written "
                      "(%s: %s)", plan.role, type(err).__name__, err)
            return None
        rel = os.path.relpath(path, plan.output_dir)
        self.recent = (time.time(), rel, step if in_step else None)
        if in_step and (self.open is None or self.open.step != step):
            self.open = _Open(step, stamp, path)
        self._said(found, rel)
        return rel

    def _position(self) -> dict[str, Any]:
        """The role's position; what it cannot tell is said, never raised (the training
        thread moves while it is read)."""
        try:
            return dict(self.where()) if self.where is not None else {}
        except Exception as err:
            return {"capture": {"error": f"{type(err).__name__}: {err}"[:200]}}

    def _said(self, found: StallRecord, rel: str) -> None:
        """The record's warning and manifest note."""
        what = {"stall": f"step {found.step} has run {found.running} s, past "
                         f"{found.limit_said}",
                "asked": f"rank {found.asked_by} asked for it (a stall)",
                "hand": "asked for by hand"}[found.why]
        log.warning("policy-engine: role %r rank %s: stall record %s (%s)", found.role,
                    found.rank, rel, what)
        with contextlib.suppress(Exception):
            self.note("stall", status="recorded", why=found.why, record=rel,
                      step=found.step, seconds=found.running, episode=found.episode)

    def _recently(self, step: int) -> str | None:
        """The path of the record written in step ``step`` less than the join time ago
        (one record per stall, however many asks reach the process)."""
        recent = self.recent
        if recent is None or recent[2] != step or time.time() - recent[0] > self._join():
            return None
        return recent[1]

    def _join(self) -> float:
        limit = self.clock.limit()
        return max(JOIN_SECONDS, limit or 0.0)

    def _cut(self, step: int, running: float) -> None:
        """Ask the main thread to save the captures it runs, partial."""
        capture = self._position().get("capture")
        if not isinstance(capture, dict) or not capture.get("main"):
            return
        signals.ask_main_thread(f"a stall: step {step} had run {running:.1f} s")

    def _clear(self, step: int, stamp: float, done: int, ended: float) -> None:
        found = self.open
        assert found is not None
        if step == found.step and done != step:
            return  # still stalled
        if done == found.step and ended > found.stamp:
            end = ended
        elif step != found.step and stamp > found.stamp:
            end = stamp  # the next step began (its end was not seen)
        else:
            end = _clock()
        seconds = end - found.stamp
        self.open = None
        plan = self.plan
        try:
            stall_report.write_cleared(plan.output_dir, found.path, found.step, seconds)
        except Exception as err:
            warn_once(("stall-cleared", plan.role, type(err).__name__),
                      "policy-engine: role %r: a stall's clearing could not be written "
                      "(%s: %s)", plan.role, type(err).__name__, err)
        if found.stalled:
            log.warning("policy-engine: role %r rank %s: the stall at step %s cleared after "
                        "%.1f s", plan.role, plan.rank, found.step, seconds)
        with contextlib.suppress(Exception):
            self.note("stall", status="cleared", step=found.step, seconds=round(seconds, 3),
                      record=os.path.relpath(found.path, plan.output_dir))

    # -- the job's channel -----------------------------------------------------------
    def finish(self, step: int, stamp: float, done: int, ended: float) -> None:
        """The listener stops (the profiler closed): a step that ended since the last poll
        is said cleared."""
        if self.open is not None:
            self._clear(step, stamp, done, ended)

    def on_store(self, channel: JobChannel, kind: str, step: int, stamp: float, done: int,
                 trainer: int) -> None:
        """A poll's part on the store (or the Ray actor): register, post this process's
        stall, answer the episode under way, and call the roll."""
        plan = self.plan
        if self.slot < 0:
            body = json.dumps({"rank": plan.rank, "pid": os.getpid(), "host": host_name(),
                               "role": plan.role}).encode()
            self.slot = _claim(channel, body)
            old = read_episode(channel)[1]
            self.seen = None if old is None else old.id  # older ones are not for it
        if self.posting is not None:
            why, self.posting = self.posting, None
            found, began = post_episode(channel, why, plan.rank, step if step >= 0 else None,
                                        self._join() if why == "stall" else 10.0)
            if found is not None:
                self.seen = found.id
                if self.recent is not None:
                    self._answer(channel, found.id, self.recent[1], why)
                if began:
                    due = max(ROLL_CALL_POLLS * self.plan.spec.triggers.poll_seconds, 1.0)
                    self.roll = (found.id, time.monotonic() + due + ROLL_CALL_MARGIN,
                                 time.monotonic())
        found = read_episode(channel)[1]
        if found is not None and found.id != self.seen:
            self.seen = found.id
            if found.time >= self.started - 1.0 and found.id not in self.answered:
                path = self._recently(step) if done != step else None
                if path is None:
                    path = self.write("asked" if found.why == "stall" else "hand", step,
                                      stamp, done, trainer, episode=found.id,
                                      asked_by=found.by)
                if path is not None:
                    self._answer(channel, found.id, path, found.why)
        if self.roll is not None and time.monotonic() >= self.roll[1]:
            self._roll_call(channel, kind)

    def _answer(self, channel: JobChannel, episode: str, path: str, why: str) -> None:
        if episode in self.answered:
            return
        self.answered.append(episode)
        channel.kv.set(_answer_key(episode, self.slot), json.dumps(
            {"rank": self.plan.rank, "pid": os.getpid(), "host": host_name(),
             "record": path, "why": why}).encode())

    def _roll_call(self, channel: JobChannel, kind: str) -> None:
        assert self.roll is not None
        episode, _due, asked = self.roll
        self.roll = None
        listed = members(channel)
        got = answers(channel, episode, len(listed))
        rows = tuple(Member(_rank(m), _int(m, "pid"), _text(m, "host"), s in got)
                     for s, m in enumerate(listed))
        roll = RollCall(episode, self.plan.rank, time.time(),
                        round(time.monotonic() - asked, 3), kind, rows)
        try:
            stall_report.write_roll_call(self.plan.output_dir, roll)
        except Exception as err:
            warn_once(("stall-roll", self.plan.role, type(err).__name__),
                      "policy-engine: role %r: a stall's roll call could not be written "
                      "(%s: %s)", self.plan.role, type(err).__name__, err)
        silent = [m for m in rows if not m.answered]
        if silent:
            log.warning("policy-engine: stall episode %s: %s of %s watching process(es) did "
                        "not answer within %.0f s: rank(s) %s", episode, len(silent),
                        len(rows), roll.seconds, ", ".join(str(m.rank) for m in silent))
        with contextlib.suppress(Exception):
            self.note("stall", status="roll_call", episode=episode,
                      answered=len(rows) - len(silent),
                      not_answering=[m.rank for m in silent][:64])

    def on_folder(self, step: int) -> None:
        """A poll's part without the job's store: post this process's stall as a request
        file, which every watching process of the job reads."""
        if self.posting is None:
            return
        why, self.posting = self.posting, None
        # a rank's stall names the rank; a SIGUSR2 asks as the command does, by hand
        request, body = request_body(role=EVERY_ROLE, ranks=None, step=None, count=1,
                                     why="stall", by=self.plan.rank if why == "stall" else None)
        with contextlib.suppress(OSError):
            channel_folder.post_request(self.plan.output_dir, request["id"], body)
        self.answered.append(request["id"])  # its own: read back, it is not asked again

    def asked(self, request: Request, step: int, stamp: float, done: int,
              trainer: int) -> None:
        """A request file asking for records (the folder channel)."""
        if request.id in self.answered:
            return
        self.answered.append(request.id)
        if done == step or self._recently(step) is None:
            self.write("asked" if request.by is not None else "hand", step, stamp, done,
                       trainer, episode=request.id, asked_by=request.by)


def _claim(channel: JobChannel, body: bytes) -> int:
    """A member slot for this process: the first free one (a compare-and-set on its own
    key, so that two processes never take the same)."""
    index = channel.end(_member_key)
    for _ in range(64):
        if channel.kv.compare_set(_member_key(index), b"", body) == body:
            return index
        time.sleep(0.001 * (1 + secrets.randbelow(50)))
        index = channel.end(_member_key, index + 1)
    raise RuntimeError("no free stall member slot after 64 tries")


def _rank(value: Any) -> int | None:
    rank = value.get("rank") if isinstance(value, dict) else None
    return rank if is_int(rank) and rank >= 0 \
        else None


def _int(value: Any, key: str) -> int | None:
    found = value.get(key) if isinstance(value, dict) else None
    return found if is_int(found) else None


def _text(value: Any, key: str) -> str:
    found = value.get(key) if isinstance(value, dict) else None
    return found[:240] if isinstance(found, str) else ""


def _save_said(capture: Mapping[str, Any]) -> str:
    """What happens to the capture open at a stall, for the record."""
    if capture.get("main"):
        return ("asked of the main thread: saved partial if it still runs Python, else kept "
                "open (saved when its call returns, at SIGTERM or at exit)")
    return (f"kept open: it belongs to thread {capture.get('thread')!r}, and a torch "
            "profiler is stopped only on its own thread (Python reaches the main thread "
            "alone with a signal)")
