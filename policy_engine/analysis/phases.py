"""One rank's phases, gathered from its trace as the events stream past: where each
region of its roles began and ended, on the rank's own clock.

A *phase* is a named region of a role: a stage verl's plugin runs as a region
(``generate_sequences``, ``actor_update``...), a method a policy's ``regions`` wraps, a
``prof.region(name)`` block. The runtime marks each as a ``record_function`` range, a
``user_annotation`` on the CPU row, and lists the names it marked in the trace's
``policy_engine`` metadata (``region_ranges``), so that the regions are told from the other
user annotations a trace holds (the model's own, a library's). A trace without that list
(torch.profiler's own output, an older runtime) has every user annotation taken as a
phase, and says so (``named_by: trace``).

:class:`Phases` takes every event (``event(e)``) and, at the end, the trace's other
top-level keys (``result(meta)``), and returns the record :func:`problem` checks:

- ``origin_us``: an absolute time on the rank's clock (Unix microseconds: torch's
  ``baseTimeNanoseconds`` plus the trace's first timestamp), which every other time is
  relative to, so that the figures stay short and exact;
- ``span``: the trace's recorded extent ``[first, last]`` (every complete event);
- ``names`` and ``rows``: per phase ``[name, start, end, depth, lead, tail]``, in start
  order: ``depth`` 0 for a phase inside no other phase of its thread; ``lead`` and
  ``tail`` the time at its start and at its end spent in a collective or a transfer (CPU
  collective operators and process-group worker events, on any thread): a phase that
  begins by receiving, or ends waiting for its peers, shows it there;
- ``named_by``: ``policy`` (the runtime's list) or ``trace``; ``left_out``: phases past
  :data:`MAX_ROWS`, or held past :data:`MAX_HELD`, counted and not listed.

Times are the trace's own; the job's clock (each rank's measured offset to rank 0) is
applied when the summaries are read (analysis/clocks.py, analysis/timeline.py). Memory is
bounded: at most :data:`MAX_HELD` annotations are held while the trace streams past.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Mapping
from typing import Any, TypedDict

from policy_engine.analysis.chrome_trace import TraceEvent
from policy_engine.analysis.intervals import Spans, length

#: User annotations held per trace while it streams past; past it they are counted.
MAX_HELD = 100_000
#: Phases a summary lists, at most (the first in time), and distinct names.
MAX_ROWS = 512
MAX_NAMES = 256
#: Characters of a phase's name kept.
MAX_NAME = 200
#: How close to a phase's edge a collective must reach to be its lead or its tail (µs),
#: or this share of the phase's length when that is more.
EDGE_US = 1000.0
EDGE_SHARE = 0.05
#: Annotations that are no phase: the profiler's own step markers.
_MARKER = re.compile(r"^ProfilerStep\s*#")
#: Collectives and transfers on the CPU: c10d's operators, the ranges the process-group
#: backends record (gloo's worker events), torch's record of every collective's call.
_COMM = re.compile(r"^(c10d::|_?c10d_functional::|gloo:|nccl:|hccl|record_param_comms)",
                   re.IGNORECASE)
_HUGE = 1e18
_NUMBER = (int, float)
NAMED_BY = ("policy", "trace")
_COUNT_MAX = 1 << 63


class PhasesRecord(TypedDict):
    """One rank's phases as its summary holds them, made by :meth:`Phases.result`."""

    origin_us: int  # Unix µs on the rank's clock; the other times are µs after it
    span: list[float]  # [first, last]: the trace's complete events
    names: list[str]
    rows: list[list[float]]  # per phase [name index, start, end, depth, lead, tail]
    named_by: str  # "policy" (the runtime's list) or "trace"
    left_out: int


class Phases:
    """What one pass over a trace's events gathers about its phases."""

    __slots__ = ("comm", "held", "hi", "kinds", "lo", "seen")

    def __init__(self) -> None:
        self.held: list[tuple[Any, Any, float, float]] = []  # name, thread, start, end
        self.comm = Spans()
        self.kinds: dict[tuple[Any, Any], int] = {}  # (cat, name) -> 0 other, 1 phase, 2 comm
        self.lo, self.hi = math.inf, -math.inf
        self.seen = 0  # annotations past MAX_HELD

    def event(self, e: TraceEvent) -> None:
        if e.get("ph") != "X":
            return
        ts: Any = e.get("ts")
        dur: Any = e.get("dur")
        if type(ts) not in _NUMBER or type(dur) not in _NUMBER \
                or not (0 <= dur < _HUGE and -_HUGE < ts < _HUGE):
            return
        end = ts + dur
        if ts < self.lo:
            self.lo = ts
        if end > self.hi:
            self.hi = end
        key = (e.get("cat"), e.get("name"))
        try:
            kind = self.kinds.get(key)
        except TypeError:  # a name that is no string (a list): no phase, no collective
            return
        if kind is None:
            kind = _kind(*key)
            if len(self.kinds) < 65536:
                self.kinds[key] = kind
        if kind == 1:
            if len(self.held) < MAX_HELD:
                tid = e.get("tid")
                self.held.append((key[1], tid if type(tid) in (int, str) else None, ts, end))
            else:
                self.seen += 1
        elif kind == 2:
            self.comm.add(ts, end)

    def result(self, meta: Mapping[str, Any]) -> PhasesRecord | None:
        """The phases record (None: the trace holds no complete event)."""
        if self.lo > self.hi:
            return None
        listed = _listed(meta)
        held = self.held if listed is None else [h for h in self.held if h[0] in listed]
        held.sort(key=lambda h: (h[2], -h[3]))
        depth = _depths(held)
        comm = self.comm.merged()
        floor = math.floor(self.lo)
        names: dict[str, int] = {}
        rows: list[list[float]] = []
        left_out = self.seen
        for (name, _tid, start, end), d in zip(held, depth, strict=True):
            index = names.get(name)
            if index is None and len(names) < MAX_NAMES:
                index = names[name] = len(names)
            if index is None or len(rows) >= MAX_ROWS:
                left_out += 1
                continue
            lead, tail = _edges(comm, start, end)
            rows.append([index, _r(start - floor), _r(end - floor), d, _r(lead), _r(tail)])
        return {"origin_us": _origin(meta) + int(floor),
                "span": [_r(self.lo - floor), _r(self.hi - floor)],
                "names": [n[:MAX_NAME] for n in names], "rows": rows,
                "named_by": "trace" if listed is None else "policy", "left_out": left_out}


def _kind(cat: Any, name: Any) -> int:
    if type(name) is not str:
        return 0
    if _COMM.match(name):
        return 2 if cat in ("cpu_op", "user_annotation", "gpu_user_annotation") \
            or name.startswith("gloo:") else 0
    if cat == "user_annotation" and not _MARKER.match(name) and name:
        return 1
    return 0


def _listed(meta: Mapping[str, Any]) -> set[str] | None:
    """The region names the runtime marked (its metadata), or None when it lists none."""
    ours = meta.get("policy_engine")
    marked = ours.get("region_ranges") if isinstance(ours, dict) else None
    if not isinstance(marked, list):
        return None
    return {n for n in marked[:MAX_NAMES * 4] if isinstance(n, str)}


def _origin(meta: Mapping[str, Any]) -> int:
    """The trace's base time in whole microseconds (0 when it gives none: its timestamps
    are then Unix microseconds already)."""
    base = meta.get("baseTimeNanoseconds")
    if type(base) is int and 0 <= base < 1 << 63:
        return base // 1000
    return 0


def _depths(held: list[tuple[Any, Any, float, float]]) -> list[int]:
    """Each phase's depth among the phases of its thread (``held`` in start order)."""
    open_: dict[Any, list[float]] = {}  # thread -> ends of the phases open around
    out = []
    for _name, tid, start, end in held:
        stack = open_.setdefault(tid, [])
        while stack and stack[-1] <= start:
            stack.pop()
        out.append(len(stack))
        stack.append(end)
    return out


def _edges(comm: tuple[Any, Any], start: float, end: float) -> tuple[float, float]:
    """(lead, tail): the collective time that begins a phase and the one that ends it."""
    starts, ends = comm
    if not len(starts) or end <= start:
        return 0.0, 0.0
    edge = max(EDGE_US, EDGE_SHARE * (end - start))
    lead = tail = 0.0
    i = bisect_right(ends, start)  # the first collective that ends after the phase starts
    if i < len(starts) and starts[i] <= start + edge and starts[i] < end:
        lead = min(ends[i], end) - start
    j = bisect_right(starts, end) - 1  # the last collective that starts before it ends
    if j >= 0 and ends[j] >= end - edge and ends[j] > start:
        tail = end - max(starts[j], start)
    if lead + tail > end - start:  # one collective is the whole phase
        lead = tail = min(length(comm, start, end), end - start)
    return lead, tail


def _r(value: float) -> float:
    return round(value, 3)


# -- a record read back from a manifest ------------------------------------------------

def _number(v: Any) -> bool:
    t = type(v)
    return (t is float or t is int) and -_HUGE < v < _HUGE


def _count(v: Any) -> bool:
    return type(v) is int and 0 <= v < _COUNT_MAX


def problem(record: Any) -> str | None:
    """Why ``record`` (a summary's ``phases``, read from a manifest, so untrusted) is not
    what :meth:`Phases.result` returns; None when it is, or when it is absent (null)."""
    if record is None:
        return None
    if type(record) is not dict:
        return "its phases are not an object"
    origin = record.get("origin_us")
    if type(origin) is not int or not -(1 << 62) < origin < 1 << 62:
        return "its phases have no origin in whole microseconds"
    span = record.get("span")
    if type(span) is not list or len(span) != 2 or not all(map(_number, span)) \
            or span[0] > span[1]:
        return "its phases' span is not [first, last]"
    names, rows = record.get("names"), record.get("rows")
    if type(names) is not list or len(names) > MAX_NAMES or \
            not all(type(n) is str and len(n) <= MAX_NAME for n in names):
        return "its phases' names are not a list of names"
    if type(rows) is not list or len(rows) > MAX_ROWS:
        return "its phases are not a list of rows"
    for i, row in enumerate(rows):
        why = _row_problem(row, len(names), span)
        if why is not None:
            return f"phase {i} {why}"
    if record.get("named_by") not in NAMED_BY or not _count(record.get("left_out")):
        return "its phases do not say how they were named, or what was left out"
    return None


def _row_problem(row: Any, names: int, span: list[float]) -> str | None:
    if type(row) is not list or len(row) != 6:
        return "is not [name, start, end, depth, lead, tail]"
    index, start, end, depth, lead, tail = row
    if not _count(index) or index >= names:
        return "names no listed name"
    if not (_number(start) and _number(end)) or end < start:
        return "ends before it starts"
    slack = 0.01 + 1e-9 * abs(end)
    if start < span[0] - slack or end > span[1] + slack:
        return "lies outside the trace's span"
    if not _count(depth) or not (_number(lead) and _number(tail)) or lead < 0 or tail < 0 \
            or lead > end - start + slack or tail > end - start + slack:
        return "has a depth, lead or tail that is no time within it"
    return None
