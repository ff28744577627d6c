"""The stall record: what one process writes when a step outlives ``triggers.stall``, declared
once for the rank that writes it (runtime.process.stall_report) and the reader that checks it
(:mod:`~policy_engine.analysis.stalls`).

Three kinds of file, under ``<output_dir>/stalls/``, each a JSON object with ``kind`` and
``version``, each published whole:

- the **record** (:class:`StallRecord`, ``<time>_rank<r>_pid<p>.json``): who and where the
  process is (role, rank, step, region, inner step, the capture open), the last collective
  its training thread entered and whether it returned, torch's flight recorder's view of the
  process groups, and every thread's Python stack, the training thread's marked;
- the **clearing** (:class:`Cleared`, the record's name with ``.cleared.json``): the step the
  record was written in ended after all, so it was a slow step, not a hang;
- the **roll call** (:class:`RollCall`, ``<time>_rollcall_<episode>.json``): which processes
  the rank that saw the stall first asked for their records, and which answered.

Every bound is here, for both sides: the writer cuts what it gathers to them, and the reader
refuses a file that passes them (anyone who can write into the output folder can plant one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from policy_engine.errors import is_int

__all__ = ["CLEARED_KIND", "CLEARED_SUFFIX", "MAX_CALLS", "MAX_FILE_BYTES", "MAX_FRAMES",
           "MAX_GROUPS", "MAX_MEMBERS", "MAX_TEXT", "MAX_THREADS", "RECORD_KIND",
           "ROLL_CALL_KIND", "VERSION", "WHYS", "Call", "Cleared", "Frame",
           "Group", "Member", "RollCall", "StallRecord", "Thread", "cut"]

VERSION = 1
RECORD_KIND, CLEARED_KIND, ROLL_CALL_KIND = ("policy_engine.stall", "policy_engine.stall.cleared",
                                             "policy_engine.stall.roll_call")
CLEARED_SUFFIX = ".cleared.json"
#: Why a record was written: the process's own step outlived the limit; another rank that
#: saw a stall asked for it; someone asked by hand (SIGUSR2, ``policy-engine trigger --stall``).
WHYS = ("stall", "asked", "hand")
#: Bounds of one record: threads, frames per thread (the innermost kept), characters of any
#: text, collective calls listed, process groups, members of a roll call; the largest file
#: a reader reads.
MAX_THREADS = 64
MAX_FRAMES = 40
MAX_TEXT = 240
MAX_CALLS = 16
MAX_GROUPS = 64
MAX_MEMBERS = 1 << 16
MAX_FILE_BYTES = 2 << 20


def cut(text: Any, limit: int = MAX_TEXT) -> str:
    """``text`` as a string of at most ``limit`` characters (the end marked when cut)."""
    said = str(text)
    return said if len(said) <= limit else said[:limit - 3] + "..."


class _Bad(ValueError):
    """A field of a file under stalls/ that is not what it must be."""


def _int(v: Any) -> bool:
    return is_int(v) and -(1 << 62) < v < 1 << 62


def _number(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _get(raw: Mapping[str, Any], key: str, check: Callable[[Any], bool], what: str,
         default: Any = ..., where: str = "") -> Any:
    """``raw[key]`` checked; ``default`` when it is missing (none: it is required)."""
    if key not in raw:
        if default is ...:
            raise _Bad(f"{where}{key}: missing")
        return default
    value = raw[key]
    if not check(value):
        raise _Bad(f"{where}{key}: expected {what}")
    return value


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _list(raw: Mapping[str, Any], key: str, limit: int, where: str) -> list[Any]:
    value = raw.get(key, [])
    if not isinstance(value, list) or len(value) > limit:
        raise _Bad(f"{where}{key}: expected a list of at most {limit} items")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{where}: expected an object")
    return value


@attrs.frozen
class Frame:
    """One frame of a Python stack: file, line, function, the line's source (``code``),
    and whether it is the job's own code (``own``: not the standard library, torch or
    policy-engine)."""

    file: str
    line: int
    function: str
    code: str = ""
    own: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function,
                "code": self.code, "own": self.own}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Frame:
        raw = _object(raw, where)
        return cls(_get(raw, "file", _text, "a path", where=where + "."),
                   _get(raw, "line", _int, "a line number", where=where + "."),
                   _get(raw, "function", _text, "a name", where=where + "."),
                   _get(raw, "code", _text, "a line of code", "", where + "."),
                   _get(raw, "own", lambda v: isinstance(v, bool), "true or false", True,
                        where + "."))

    def said(self) -> str:
        """``train.py:42 in step: time.sleep(600)``."""
        code = f": {self.code}" if self.code else ""
        return f"{self.file}:{self.line} in {self.function}{code}"


@attrs.frozen
class Thread:
    """A thread's stack, innermost frame first; ``left_out``: frames past
    :data:`MAX_FRAMES`; ``training``: the thread that runs the role's training steps."""

    name: str
    ident: int
    training: bool
    daemon: bool
    frames: tuple[Frame, ...]
    left_out: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ident": self.ident, "training": self.training,
                "daemon": self.daemon, "frames": [f.to_json() for f in self.frames],
                "left_out": self.left_out}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Thread:
        raw = _object(raw, where)
        w = where + "."
        frames = _list(raw, "frames", MAX_FRAMES, w)
        return cls(_get(raw, "name", _text, "a name", where=w),
                   _get(raw, "ident", _int, "an integer", where=w),
                   _get(raw, "training", lambda v: isinstance(v, bool), "true or false",
                        where=w),
                   _get(raw, "daemon", lambda v: isinstance(v, bool), "true or false",
                        False, w),
                   tuple(Frame.from_json(f, f"{w}frames[{i}]") for i, f in enumerate(frames)),
                   _get(raw, "left_out", lambda v: _int(v) and v >= 0, "a count", 0, w))

    def innermost(self, own: bool = False) -> Frame | None:
        """The innermost frame (``own``: of the job's own code), None when there is none."""
        return next((f for f in self.frames if f.own or not own), None)


@attrs.frozen
class Call:
    """A collective call: its process ``group`` (name and description), its number in the
    group (``seq``), its ``name`` (``all_reduce``), whether it ``returned``, when it was
    issued (Unix seconds), and where the facts come from (``flight_recorder``, or
    ``stack``: the training thread is inside torch.distributed's function of that name)."""

    name: str
    returned: bool | None
    source: str
    group: str | None = None
    desc: str | None = None
    seq: int | None = None
    issued: float | None = None
    thread: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "returned": self.returned, "source": self.source,
                "group": self.group, "desc": self.desc, "seq": self.seq,
                "issued": self.issued, "thread": self.thread}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Call:
        raw = _object(raw, where)
        w = where + "."
        return cls(_get(raw, "name", _text, "a name", where=w),
                   _get(raw, "returned", _opt(lambda v: isinstance(v, bool)),
                        "true, false or null", None, w),
                   _get(raw, "source", lambda v: v in ("flight_recorder", "stack"),
                        "flight_recorder or stack", where=w),
                   _get(raw, "group", _opt(_text), "a name or null", None, w),
                   _get(raw, "desc", _opt(_text), "a description or null", None, w),
                   _get(raw, "seq", _opt(_int), "a call number or null", None, w),
                   _get(raw, "issued", _opt(_number), "a time or null", None, w),
                   _get(raw, "thread", _opt(_int), "a thread id or null", None, w))

    def key(self) -> tuple[str | None, int | None, str]:
        return self.group, self.seq, self.name


@attrs.frozen
class Group:
    """A process group as this process knows it: ``ranks`` (spans, ``0-3,8``; empty when
    unknown), and the numbers of the last call enqueued and completed in it."""

    name: str
    desc: str = ""
    ranks: str = ""
    enqueued: int | None = None
    completed: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "desc": self.desc, "ranks": self.ranks,
                "enqueued": self.enqueued, "completed": self.completed}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Group:
        raw = _object(raw, where)
        w = where + "."
        ranks = _get(raw, "ranks", lambda v: isinstance(v, str) and len(v) <= 4 * MAX_TEXT,
                     "rank spans", "", w)
        return cls(_get(raw, "name", _text, "a name", where=w),
                   _get(raw, "desc", _text, "a description", "", w), ranks,
                   _get(raw, "enqueued", _opt(_int), "a call number or null", None, w),
                   _get(raw, "completed", _opt(_int), "a call number or null", None, w))

    def members(self) -> set[int] | None:
        """The group's global ranks, None when unknown (or not spans)."""
        found: set[int] = set()
        for part in filter(None, self.ranks.split(",")):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                return None
            first, last = int(low), int(high or low)
            if last < first or last - first > MAX_MEMBERS:
                return None
            found.update(range(first, last + 1))
            if len(found) > MAX_MEMBERS:
                return None
        return found or None


def _is_why(v: Any) -> bool:
    return v in WHYS


@attrs.frozen
class StallRecord:
    """One process's stall record (the module docstring says what it holds)."""

    why: str
    role: str
    rank: int
    world: int
    pid: int
    host: str
    time: float
    episode: str | None
    asked_by: int | None
    step: int | None
    in_step: bool
    running: float | None  # seconds the step had run when the record was written
    limit: float | None  # the limit in seconds (None: asked by hand)
    limit_said: str
    region: tuple[str, ...]
    inner_step: int | None
    capture: Mapping[str, Any] | None  # {id, steps, backend, save}
    collective: Call | None
    collectives: str  # where the calls come from, or why there are none
    calls: tuple[Call, ...]
    groups: tuple[Group, ...]
    threads: tuple[Thread, ...]
    threads_left_out: int = 0
    #: the file it came from, relative to the stalls folder (set by the reader)
    name: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": RECORD_KIND, "version": VERSION, "why": self.why, "role": self.role,
                "rank": self.rank, "world": self.world, "pid": self.pid, "host": self.host,
                "time": self.time, "episode": self.episode, "asked_by": self.asked_by,
                "step": self.step, "in_step": self.in_step, "running": self.running,
                "limit": self.limit, "limit_said": self.limit_said,
                "region": list(self.region), "inner_step": self.inner_step,
                "capture": None if self.capture is None else dict(self.capture),
                "collective": None if self.collective is None else self.collective.to_json(),
                "collectives": self.collectives, "calls": [c.to_json() for c in self.calls],
                "groups": [g.to_json() for g in self.groups],
                "threads": [t.to_json() for t in self.threads],
                "threads_left_out": self.threads_left_out}

    @classmethod
    def from_json(cls, raw: Any, name: str = "") -> StallRecord:
        """The record an untrusted JSON value holds; ValueError names the first field
        that is wrong."""
        raw = _object(raw, "the record")
        _kind(raw, RECORD_KIND)
        capture = raw.get("capture")
        if capture is not None and not (isinstance(capture, dict) and len(capture) <= 8 and all(
                isinstance(k, str) and (_text(v) or _number(v) or v is None or (
                    isinstance(v, list) and len(v) <= 64 and all(map(_int, v))))
                for k, v in capture.items())):
            raise _Bad("capture: expected an object of a few fields or null")
        collective = raw.get("collective")
        region = _list(raw, "region", 16, "")
        if not all(map(_text, region)):
            raise _Bad("region: expected a list of names")
        return cls(
            why=_get(raw, "why", _is_why, f"one of {', '.join(WHYS)}"),
            role=_get(raw, "role", _text, "a role name"),
            rank=_get(raw, "rank", lambda v: _int(v) and v >= 0, "a rank"),
            world=_get(raw, "world", lambda v: _int(v) and v >= 1, "a world size"),
            pid=_get(raw, "pid", lambda v: _int(v) and v > 0, "a process id"),
            host=_get(raw, "host", _text, "a host name", ""),
            time=_get(raw, "time", _number, "a time"),
            episode=_get(raw, "episode", _opt(_text), "an id or null", None),
            asked_by=_get(raw, "asked_by", _opt(_int), "a rank or null", None),
            step=_get(raw, "step", _opt(_int), "a step or null", None),
            in_step=_get(raw, "in_step", lambda v: isinstance(v, bool), "true or false",
                         False),
            running=_get(raw, "running", _opt(_number), "seconds or null", None),
            limit=_get(raw, "limit", _opt(_number), "seconds or null", None),
            limit_said=_get(raw, "limit_said", _text, "text", ""),
            region=tuple(region),
            inner_step=_get(raw, "inner_step", _opt(_int), "a step or null", None),
            capture=capture,
            collective=None if collective is None else Call.from_json(collective,
                                                                      "collective"),
            collectives=_get(raw, "collectives", _text, "text", ""),
            calls=tuple(Call.from_json(c, f"calls[{i}]")
                        for i, c in enumerate(_list(raw, "calls", MAX_CALLS, ""))),
            groups=tuple(Group.from_json(g, f"groups[{i}]")
                         for i, g in enumerate(_list(raw, "groups", MAX_GROUPS, ""))),
            threads=tuple(Thread.from_json(t, f"threads[{i}]")
                          for i, t in enumerate(_list(raw, "threads", MAX_THREADS, ""))),
            threads_left_out=_get(raw, "threads_left_out", lambda v: _int(v) and v >= 0,
                                  "a count", 0),
            name=name)

    def training(self) -> Thread | None:
        """The training thread's stack, when it was found."""
        return next((t for t in self.threads if t.training), None)


@attrs.frozen
class Cleared:
    """The step a record was written in ended ``seconds`` after it began (at ``time``)."""

    record: str  # the record's file name
    step: int | None
    seconds: float
    time: float

    def to_json(self) -> dict[str, Any]:
        return {"kind": CLEARED_KIND, "version": VERSION, "record": self.record,
                "step": self.step, "seconds": self.seconds, "time": self.time}

    @classmethod
    def from_json(cls, raw: Any) -> Cleared:
        raw = _object(raw, "the clearing")
        _kind(raw, CLEARED_KIND)
        return cls(_get(raw, "record", _text, "a file name"),
                   _get(raw, "step", _opt(_int), "a step or null", None),
                   _get(raw, "seconds", lambda v: _number(v) and v >= 0, "seconds"),
                   _get(raw, "time", _number, "a time"))


@attrs.frozen
class Member:
    """A process asked for its record: its rank and pid, and whether it answered."""

    rank: int | None
    pid: int | None
    host: str
    answered: bool

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": self.pid, "host": self.host,
                "answered": self.answered}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Member:
        raw = _object(raw, where)
        w = where + "."
        return cls(_get(raw, "rank", _opt(lambda v: _int(v) and v >= 0), "a rank", None, w),
                   _get(raw, "pid", _opt(_int), "a process id", None, w),
                   _get(raw, "host", _text, "a host name", "", w),
                   _get(raw, "answered", lambda v: isinstance(v, bool), "true or false",
                        where=w))


@attrs.frozen
class RollCall:
    """Who the rank that saw a stall first (``by``) asked over the job's channel, and who
    answered within ``seconds`` (``channel``: the store, the Ray actor or the folder)."""

    episode: str
    by: int
    time: float
    seconds: float
    channel: str
    members: tuple[Member, ...]

    def to_json(self) -> dict[str, Any]:
        return {"kind": ROLL_CALL_KIND, "version": VERSION, "episode": self.episode,
                "by": self.by, "time": self.time, "seconds": self.seconds,
                "channel": self.channel, "members": [m.to_json() for m in self.members]}

    @classmethod
    def from_json(cls, raw: Any) -> RollCall:
        raw = _object(raw, "the roll call")
        _kind(raw, ROLL_CALL_KIND)
        members = _list(raw, "members", MAX_MEMBERS, "")
        return cls(_get(raw, "episode", _text, "an id"),
                   _get(raw, "by", lambda v: _int(v) and v >= 0, "a rank"),
                   _get(raw, "time", _number, "a time"),
                   _get(raw, "seconds", lambda v: _number(v) and v >= 0, "seconds"),
                   _get(raw, "channel", _text, "a channel"),
                   tuple(Member.from_json(m, f"members[{i}]") for i, m in enumerate(members)))


def _kind(raw: Mapping[str, Any], kind: str) -> None:
    if raw.get("kind") != kind:
        raise _Bad(f"kind: expected {kind!r}")
    version = raw.get("version")
    if not isinstance(version, int) or not _int(version) or version < 1:
        raise _Bad("version: expected a version number")
    if version > VERSION:
        raise _Bad(f"version {version}: written by a newer policy-engine (this one reads "
                   f"{VERSION})")
