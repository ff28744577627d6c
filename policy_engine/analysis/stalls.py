"""The answer to a hung job: the stall records under a run folder, read as hostile, grouped
into episodes, and said as which ranks wait in which collective, which ranks never reached
it and where each of them is, and which ranks did not answer.

Files come from :mod:`~policy_engine.analysis.stall_record` (one record per process and
stall, clearings, roll calls). Anyone who can write into the output folder can plant one, so
each is read without following links, at most
:data:`~policy_engine.analysis.stall_record.MAX_FILE_BYTES`, and checked field by field; at
most :data:`MAX_FILES` files are read (the newest by name). A file that is not one is a
problem of the answer, never a failure of the command.

**Episodes.** Records belong together when they name the same episode (the store's key
that asked them) or were written within :data:`EPISODE_SECONDS` (or the stall limit, if
longer) of the episode's first record: ranks that stall together write within a few polls.

**The answer** of an episode, per process group: the calls that ranks wait in (a call the
training thread entered and that did not return: the flight recorder's group and number,
else the collective's name on the stack), the members of the group that are not in it and
where they are (their training thread's innermost frame of the job's own code, and the
collective they are in when it is another one), and the ranks that did not answer the roll
call, or left no record. A stall whose steps all ended is said as cleared, with how long
they ran: a slow step, not a hang.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict, final

import attrs

from policy_engine.analysis.format import rank_spans
from policy_engine.analysis.stall_record import (
    CLEARED_SUFFIX,
    MAX_FILE_BYTES,
    Call,
    Cleared,
    RollCall,
    StallRecord,
)
from policy_engine.files.layout import STALLS_DIR

__all__ = ["EPISODE_SECONDS", "MAX_FILES", "Episode", "Stalls", "read_stalls",
           "stalls_text"]

#: Files of the stalls folder read at most (the newest by name: names start with a time).
MAX_FILES = 4096
#: Records written within this long of an episode's first belong to it.
EPISODE_SECONDS = 120.0
#: Episodes answered in full (the newest); older ones are counted.
MAX_EPISODES = 8
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


# -- the answer, as the JSON document says it ---------------------------------------------

class FrameAt(TypedDict):
    """A frame of a rank's training thread: where it is."""

    file: str
    line: int
    function: str


class _Thread(TypedDict):
    thread: str  # the training thread's name


class ThreadAt(_Thread, total=False):
    """Where a rank's training thread is (:func:`_where`): its innermost frame of the
    job's own code (else its innermost), and the innermost when that is elsewhere; no
    frame where the thread had none."""

    file: str
    line: int
    function: str
    code: str  # the line's source
    own: bool  # whether the frame is the job's own code
    inside: FrameAt  # the innermost frame, where it is not the one above


class SaidCall(TypedDict):
    """A collective call as the answer says it (:func:`_said_call`)."""

    name: str
    group: str | None
    desc: str | None  # the group's description
    seq: int | None  # its number in the group
    source: str  # flight_recorder, or stack


class ReturnedCall(SaidCall):
    """A rank's last collective call, and whether it returned."""

    returned: bool | None


class CodePlace(TypedDict):
    """A line of the job's code, and the waiting ranks whose training thread is there."""

    file: str
    line: int
    function: str
    code: str
    ranks: list[int]


@final  # no other keys: ``_at`` tells it from a ThreadAt by ``inside``
class WaitPlace(CodePlace):
    """A :class:`CodePlace` with its ``file:line``."""

    at: str


# ``in`` is a keyword: the key is declared the functional way
_InCall = TypedDict("_InCall", {"in": "SaidCall | None"})


class NotReached(_InCall):
    """A member of a call's group that is not in it (``in``: the other call it is in),
    and where it is."""

    rank: int
    where: ThreadAt | None
    last: ReturnedCall | None  # its last call, returned (when it is in none)
    cleared: float | None  # seconds its step took, where it ended after all


class WaitedCall(SaidCall):
    """A call that ranks wait in, and the members of its group that are not in it."""

    ranks: list[int]
    where: list[WaitPlace]  # the first few places the waiting ranks are at
    members: str | None  # the group's ranks as spans (None: unknown)
    not_reached: list[NotReached]


class RankState(TypedDict):
    """A rank's record of the episode, as the answer says it."""

    rank: int
    pid: int
    host: str
    role: str
    why: str  # stall, asked or hand (stall_record.WHYS)
    step: int | None
    in_step: bool
    running: float | None  # seconds its step had run
    limit: str  # the stall limit, in words
    region: list[str]
    inner_step: int | None
    capture: Mapping[str, Any] | None  # the capture open (checked: a few fields)
    collective: ReturnedCall | None
    collectives_from: str  # where its calls come from, or why there are none
    where: ThreadAt | None
    cleared: float | None  # seconds its step took, where it ended after all
    record: str  # its file, under stalls/


class RollCallSaid(TypedDict):
    """An episode's roll call: who asked, how long it waited, over what, and how many."""

    by: int
    seconds: float
    channel: str
    members: int


class EpisodeAnswer(TypedDict):
    """One stall episode, answered (:func:`_answer`)."""

    episode: str | None
    time: float  # its first record's (Unix seconds)
    world: int | None
    status: str  # stalled, cleared or asked
    collectives: list[WaitedCall]
    not_answering: list[int]  # ranks the roll call asked that did not answer
    no_record: list[int]  # ranks of the world with no record
    roll_call: RollCallSaid | None
    ranks: list[RankState]


class StallsAnswer(TypedDict):
    """The stalls of a run, as ``analyze``'s document says them (:meth:`Stalls.to_json`)."""

    episodes: list[EpisodeAnswer]  # the newest MAX_EPISODES
    more_episodes: int  # older ones, counted
    problems: list[str]
    files: int


@attrs.frozen
class Episode:
    """One stall across the job: its records (one per process, the newest kept when a
    process wrote more), their clearings, its roll call, and the answer."""

    id: str | None
    first: float
    records: tuple[StallRecord, ...]
    cleared: dict[str, Cleared]
    roll_call: RollCall | None

    def answer(self) -> EpisodeAnswer:
        """The episode as the JSON document says it (see :func:`_answer`)."""
        return _answer(self)


@attrs.frozen
class Stalls:
    """What the stalls folder of a run holds: its episodes, newest first, and the files
    that could not be read (``problems``)."""

    episodes: tuple[Episode, ...]
    problems: tuple[str, ...]
    files: int

    def to_json(self) -> StallsAnswer:
        return {"episodes": [e.answer() for e in self.episodes[:MAX_EPISODES]],
                "more_episodes": max(0, len(self.episodes) - MAX_EPISODES),
                "problems": list(self.problems[:64]), "files": self.files}


def _read(fd: int, name: str) -> Any:
    """The JSON value of file ``name`` of the folder ``fd``; ValueError says why not."""
    try:
        file = os.open(name, _FLAGS, dir_fd=fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ValueError("a symbolic link (not followed)") from None
        raise ValueError(err.strerror or str(err)) from None
    try:
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        data = os.read(file, MAX_FILE_BYTES + 1)
    finally:
        os.close(file)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        return json.loads(data, parse_constant=_refuse)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"not JSON ({str(err)[:80]})") from None


def _refuse(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def read_stalls(root: str) -> Stalls | None:
    """The stalls under the run folder ``root``; None when it has no stalls folder."""
    path = os.path.join(root, STALLS_DIR)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    problems: list[str] = []
    records: list[StallRecord] = []
    cleared: dict[str, Cleared] = {}
    rolls: list[RollCall] = []
    try:
        names = sorted((n for n in os.listdir(fd) if n.endswith(".json")
                        and not n.startswith(".")), reverse=True)
        if len(names) > MAX_FILES:
            problems.append(f"{len(names)} files under {STALLS_DIR}/: the newest {MAX_FILES} "
                            "are read")
        for name in names[:MAX_FILES]:
            try:
                value = _read(fd, name)
                kind = value.get("kind") if isinstance(value, dict) else None
                if name.endswith(CLEARED_SUFFIX):
                    found = Cleared.from_json(value)
                    cleared[found.record] = found
                elif kind == "policy_engine.stall.roll_call":
                    rolls.append(RollCall.from_json(value))
                else:
                    records.append(StallRecord.from_json(value, name))
            except (ValueError, TypeError, KeyError) as err:
                problems.append(f"{STALLS_DIR}/{name}: {str(err)[:200]}")
    finally:
        os.close(fd)
    return Stalls(_episodes(records, cleared, rolls), tuple(problems), len(names))


def _episodes(records: list[StallRecord], cleared: dict[str, Cleared],
              rolls: list[RollCall]) -> tuple[Episode, ...]:
    records.sort(key=lambda r: r.time)
    groups: list[list[StallRecord]] = []
    ids: list[set[str]] = []
    for r in records:
        near = max(EPISODE_SECONDS, r.limit or 0.0)
        for group, named in zip(groups, ids, strict=True):
            # one stall per process an episode: its next record is another stall
            again = any((x.host, x.pid) == (r.host, r.pid) for x in group)
            if (r.episode is not None and r.episode in named) or (
                    not again and r.time - group[0].time <= near):
                group.append(r)
                if r.episode is not None:
                    named.add(r.episode)
                break
        else:
            groups.append([r])
            ids.append({r.episode} if r.episode is not None else set())
    out = []
    for group, named in zip(groups, ids, strict=True):
        latest: dict[tuple[str, int], StallRecord] = {}
        for r in group:  # one per process: its stall's own record before one asked for
            key = (r.host, r.pid)
            old = latest.get(key)
            if old is None or (old.why != "stall" and r.why == "stall"):
                latest[key] = r
        # the roll call that asked for these records: by its episode, else asked (its time
        # less the time it waited) within the episode's first records' reach
        near = max([EPISODE_SECONDS] + [r.limit or 0.0 for r in group])
        roll = next((c for c in rolls if c.episode in named), None) or next(
            (c for c in rolls if -5.0 <= c.time - c.seconds - group[0].time <= near), None)
        mine = {r.name: cleared[r.name] for r in latest.values() if r.name in cleared}
        out.append(Episode(min(named) if named else None, group[0].time,
                           tuple(sorted(latest.values(), key=lambda r: (r.rank, r.pid))),
                           mine, roll))
    return tuple(sorted(out, key=lambda e: -e.first))


def _where(r: StallRecord) -> ThreadAt | None:
    """Where a rank's training thread is: its innermost frame of the job's own code (and
    the innermost frame, when that is elsewhere)."""
    thread = r.training()
    if thread is None:
        return None
    own, inner = thread.innermost(own=True), thread.innermost()
    out: ThreadAt = {"thread": thread.name}
    shown = own or inner  # no frame of the job's own: where it is, whoever's code
    if shown is not None:
        out["file"], out["line"], out["function"] = shown.file, shown.line, shown.function
        out["code"], out["own"] = shown.code, shown.own
    if inner is not None and inner is not shown:
        out["inside"] = {"file": inner.file, "line": inner.line, "function": inner.function}
    return out


def _waiting(r: StallRecord) -> Call | None:
    """The collective a rank's training thread is in: entered and not returned."""
    call = r.collective
    return call if call is not None and call.returned is False else None


def _members(records: Iterable[StallRecord], group: str | None) -> set[int] | None:
    """The ranks of process group ``group`` as the records know them (None: unknown)."""
    for r in records:
        for g in r.groups:
            if g.name == group:
                found = g.members()
                if found is not None:
                    return found
    return None


def _said_call(call: Call) -> SaidCall:
    return {"name": call.name, "group": call.group, "desc": call.desc, "seq": call.seq,
            "source": call.source}


def _answer(e: Episode) -> EpisodeAnswer:
    records = e.records
    by_rank = {r.rank: r for r in records}
    world = max((r.world for r in records), default=0)
    waits: dict[tuple[Any, ...], list[StallRecord]] = {}
    for r in records:
        call = _waiting(r)
        if call is not None and r.name not in e.cleared:
            waits.setdefault(call.key(), []).append(r)
    collectives: list[WaitedCall] = []
    for _key, waiting in sorted(waits.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        call = _waiting(waiting[0])
        assert call is not None
        members = _members(records, call.group)
        expected = members if members is not None else set(range(world))
        absent: list[NotReached] = []
        for rank in sorted(expected - {r.rank for r in waiting}):
            late = by_rank.get(rank)
            if late is None:
                continue  # said below: no record
            other = _waiting(late)
            last = late.collective
            absent.append({
                "rank": rank, "where": _where(late),
                "in": None if other is None else _said_call(other),
                "last": None if last is None or other is not None else {
                    **_said_call(last), "returned": last.returned},
                "cleared": e.cleared[late.name].seconds if late.name in e.cleared else None})
        places: dict[str, CodePlace] = {}
        for r in waiting:
            w = _where(r)
            if w is not None and "file" in w:
                place = places.setdefault(f"{w['file']}:{w['line']}", {
                    "file": w["file"], "line": w["line"], "function": w["function"],
                    "code": w["code"], "ranks": []})
                place["ranks"].append(r.rank)
        collectives.append({**_said_call(call), "ranks": sorted(r.rank for r in waiting),
                            "where": [{"at": at, **place}
                                      for at, place in list(places.items())[:8]],
                            "members": None if members is None else rank_spans(members),
                            "not_reached": absent})
    roll = e.roll_call
    silent = sorted({m.rank for m in roll.members if not m.answered and m.rank is not None}) \
        if roll is not None else []
    answered = {r.rank for r in records}
    no_record = sorted(set(range(world)) - answered - set(silent)) if world else []
    ranks: list[RankState] = []
    for r in records:
        c = e.cleared.get(r.name)
        ranks.append({"rank": r.rank, "pid": r.pid, "host": r.host, "role": r.role,
                      "why": r.why, "step": r.step, "in_step": r.in_step,
                      "running": r.running, "limit": r.limit_said, "region": list(r.region),
                      "inner_step": r.inner_step, "capture": r.capture,
                      "collective": None if r.collective is None else {
                          **_said_call(r.collective), "returned": r.collective.returned},
                      "collectives_from": r.collectives, "where": _where(r),
                      "cleared": None if c is None else c.seconds, "record": r.name})
    stepping = [r for r in records if r.in_step]
    # records asked for by hand only are no stall; a stall is cleared once every step
    # its records were written in has ended
    status = "asked" if all(r.why == "hand" for r in records) or not stepping else \
        "cleared" if all(r.name in e.cleared for r in stepping) else "stalled"
    return {"episode": e.id, "time": e.first, "world": world or None, "status": status,
            "collectives": collectives, "not_answering": silent, "no_record": no_record,
            "roll_call": None if roll is None else {
                "by": roll.by, "seconds": roll.seconds, "channel": roll.channel,
                "members": len(roll.members)},
            "ranks": ranks}


def _at(where: ThreadAt | WaitPlace | None) -> str:
    if not where:
        return "where unknown (its training thread was not found)"
    if "file" not in where:
        return f"where unknown (thread {where.get('thread')!r} had no Python frame)"
    code = f": {where['code']}" if where.get("code") else ""
    deeper = ""
    if "inside" in where:  # a thread's innermost frame, where it is not the one shown
        inside = where["inside"]
        deeper = f" (inside {inside['function']} at {os.path.basename(inside['file'])}:" \
                 f"{inside['line']})"
    return f"at {where['file']}:{where['line']} in {where['function']}{code}{deeper}"


def _call_words(call: SaidCall) -> str:
    group = call.get("group")
    if group is None:
        return f"{call['name']} (group and number unknown: from its stack)"
    desc = f" {call['desc']!r}" if call.get("desc") else ""
    return f"{call['name']} (group {group}{desc}, call {call.get('seq')})"


def stalls_text(found: StallsAnswer) -> list[str]:
    """The stalls part of ``analyze``'s text: the newest episode in full, first."""
    lines: list[str] = []
    for n, e in enumerate(found["episodes"]):
        head = {"stalled": "STALL", "cleared": "stall (cleared)",
                "asked": "stall records asked for by hand"}[e["status"]]
        # a record may say it is in its step and name none (null): no step to show
        steps = sorted({step for r in e["ranks"] if r["in_step"]
                        and (step := r["step"]) is not None})
        at = f" at step {', '.join(map(str, steps[:8]))}" if steps else ""
        limits = sorted({r["limit"] for r in e["ranks"] if r["why"] == "stall"})
        past = f" (past {limits[0]})" if len(limits) == 1 else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))
        lines.append(f"== {head}{at}{past}: {len(e['ranks'])} record(s)"
                     + (f" of {e['world']} rank(s)" if e["world"] else "")
                     + f", from {when}" + (f" (episode {e['episode']})" if e["episode"]
                                           else ""))
        if e["status"] == "cleared":
            took = [f"rank {r['rank']} after {r['cleared']:.1f} s" for r in e["ranks"]
                    if r["cleared"] is not None]
            lines.append("  a slow step, not a hang: cleared " + "; ".join(took[:8]))
        for c in e["collectives"]:
            where = _at(c["where"][0]) if len(c["where"]) == 1 else "; ".join(
                f"{w['at']} (ranks {rank_spans(w['ranks'])})" for w in c["where"]) or \
                "where unknown"
            lines.append(f"  ranks {rank_spans(c['ranks'])} wait in {_call_words(c)} "
                         f"{where if len(c['where']) == 1 else 'at ' + where}")
            for a in c["not_reached"]:
                if a["in"] is not None:
                    what = f"is in {_call_words(a['in'])} instead"
                elif a["cleared"] is not None:
                    what = f"was late: its step ended after {a['cleared']:.1f} s"
                else:
                    what = "never reached it"
                last = a.get("last")
                after = f" (its last call there: {last['seq']}, returned)" if last and \
                    last.get("group") == c.get("group") and last.get("seq") is not None \
                    else ""
                lines.append(f"  rank {a['rank']} {what}{after}: {_at(a['where'])}")
        if not e["collectives"]:
            for r in e["ranks"][:16]:
                state = f"cleared after {r['cleared']:.1f} s" if r["cleared"] is not None \
                    else "in a collective" if (call := r["collective"]) is not None \
                    and call["returned"] is False \
                    else "not in a collective"
                lines.append(f"  rank {r['rank']} step {r['step']}: {state}: {_at(r['where'])}")
        if e["not_answering"]:
            roll = e["roll_call"]
            seconds, channel = (0.0, "channel") if roll is None else (roll["seconds"],
                                                                      roll["channel"])
            lines.append(f"  NOT ANSWERING: rank(s) {rank_spans(e['not_answering'])} "
                         f"(no answer within {seconds:.0f} s over the job's {channel})")
        if e["no_record"]:
            lines.append(f"  no record from rank(s) {rank_spans(e['no_record'])} (they do "
                         "not watch for stalls, or did not answer)")
        if n == 0 and len(found["episodes"]) > 1:
            lines.append(f"  ({len(found['episodes']) - 1} earlier episode(s) below)")
        lines.append("")
    if found.get("more_episodes"):
        lines.append(f"{found['more_episodes']} older stall episode(s) not shown")
    for p in found.get("problems") or ():
        lines.append(f"warning: {p}")
    return lines
