"""Time intervals, merged: how long a kind of work ran inside a range, counted once.

A trace's operators nest and overlap (a backward op inside a region inside a step, two
streams at once); the time a rank spends on something is the length of the *union* of
its intervals. :class:`Spans` gathers intervals as they stream past, folding those that
arrive in start order into the one open interval, so nested operators cost nothing to
hold; :meth:`Spans.merged` gives the union as sorted, disjoint intervals.

A trace of a gigabyte holds millions of intervals that do not fold (kernels one after
another), so they are held as machine floats (``array('d')``, 16 bytes an interval), never
as Python objects: every :data:`CHUNK` intervals gathered are sorted and merged into a
run of their own (the only Python objects made, a chunk's worth), and runs of like size
are merged with each other as they come, so that at most a logarithmic number of runs is
held. Intervals of one kind mostly arrive in time order, so a run mostly starts after
the one before it ends, and merging the two is a copy.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

#: Sorted, disjoint intervals: starts and ends, in microseconds.
Merged = tuple[Sequence[float], Sequence[float]]
EMPTY: Merged = ((), ())
#: Intervals gathered before they are sorted into a run of their own.
CHUNK = 1 << 16

#: Sorted, disjoint intervals as machine floats: starts and ends.
_Run = tuple["array[float]", "array[float]"]


class Spans:
    """Intervals of one kind of work, gathered one at a time."""

    __slots__ = ("_end", "_ends", "_given", "_runs", "_start", "_starts", "count")

    def __init__(self) -> None:
        self._starts = array("d")  # gathered since the last run was made, unsorted
        self._ends = array("d")
        self._runs: list[_Run] = []  # each sorted and disjoint; larger ones first
        self._start = 0.0
        self._end = -1.0  # no open interval
        self._given: array[float] | None = None  # the starts merged() handed out
        self.count = 0

    def add(self, start: float, end: float) -> None:
        self.count += 1
        if self._start <= start <= self._end:  # inside or touching the open interval
            if end > self._end:
                self._end = end
            return
        if self._end >= self._start:
            self._starts.append(self._start)
            self._ends.append(self._end)
            if len(self._starts) >= CHUNK:
                self._settle()
        self._start, self._end = start, end

    def _settle(self) -> None:
        """Sort what was gathered into a run, and merge runs of like size."""
        run = _sorted_run(self._starts, self._ends)
        self._starts, self._ends = array("d"), array("d")
        runs = self._runs
        runs.append(run)
        while len(runs) > 1 and len(runs[-2][0]) <= 2 * len(runs[-1][0]):
            later = runs.pop()
            runs[-1] = _merge(runs[-1], later, shared=runs[-1][0] is self._given)

    def merged(self) -> Merged:
        """The union, as sorted disjoint intervals (``array('d')`` each)."""
        if self._end >= self._start:
            self._starts.append(self._start)
            self._ends.append(self._end)
            self._end = self._start - 1.0
        if self._starts:
            self._settle()
        runs = self._runs
        while len(runs) > 1:
            later = runs.pop()
            runs[-1] = _merge(runs[-1], later, shared=runs[-1][0] is self._given)
        if not runs:
            return array("d"), array("d")
        self._given = runs[0][0]  # a later merge makes new arrays, never grows these
        return runs[0]


def _sorted_run(starts: array[float], ends: array[float]) -> _Run:
    """The union of at most a chunk of intervals, sorted and disjoint."""
    out_s, out_e = array("d"), array("d")
    last = -1
    for i in sorted(range(len(starts)), key=starts.__getitem__):
        s, e = starts[i], ends[i]
        if last >= 0 and s <= out_e[last]:
            if e > out_e[last]:
                out_e[last] = e
        else:
            out_s.append(s)
            out_e.append(e)
            last += 1
    return out_s, out_e


def _merge(a: _Run, b: _Run, *, shared: bool) -> _Run:
    """The union of two runs: ``a`` held by :class:`Spans` alone (the later run ``b``
    always is) unless ``shared``; a run held by nobody else may be grown in place."""
    (a_s, a_e), (b_s, b_e) = a, b
    if not b_s or not a_s:
        return (a_s, a_e) if a_s else (b_s, b_e)
    if b_s[0] < a_s[0]:
        (a_s, a_e), (b_s, b_e) = (b_s, b_e), (a_s, a_e)
        shared = False  # the first run is now b
    # a starts first: its intervals that end before b starts stay as they are, and when
    # that is all of them (a chunk of later events), the union is both, one after the
    # other: a grown by b where no caller holds a, else a copy
    i = bisect_left(a_e, b_s[0])
    if i == len(a_s):
        if shared:
            return a_s + b_s, a_e + b_e
        a_s.extend(b_s)
        a_e.extend(b_e)
        return a_s, a_e
    out_s, out_e = a_s[:i], a_e[:i]
    n_a, n_b, j = len(a_s), len(b_s), 0
    while i < n_a and j < n_b:
        if a_s[i] <= b_s[j]:
            s, e = a_s[i], a_e[i]
            i += 1
        else:
            s, e = b_s[j], b_e[j]
            j += 1
        if out_e and s <= out_e[-1]:
            if e > out_e[-1]:
                out_e[-1] = e
        else:
            out_s.append(s)
            out_e.append(e)
    # One run is left: its first intervals may join the last one; the rest, disjoint
    # among themselves and later, are a copy.
    rest_s, rest_e, k = (a_s, a_e, i) if i < n_a else (b_s, b_e, j)
    while k < len(rest_s) and rest_s[k] <= out_e[-1]:
        if rest_e[k] > out_e[-1]:
            out_e[-1] = rest_e[k]
        k += 1
    out_s.extend(rest_s[k:])
    out_e.extend(rest_e[k:])
    return out_s, out_e


def union(*parts: Merged) -> Merged:
    """The union of merged interval lists."""
    spans = Spans()
    for s, e in heapq.merge(*(zip(starts, ends, strict=True) for starts, ends in parts)):
        spans.add(s, e)
    return spans.merged()


def intersect(a: Merged, b: Merged) -> Merged:
    """Where both merged lists are busy."""
    (a_s, a_e), (b_s, b_e) = a, b
    i = j = 0
    out_s, out_e = array("d"), array("d")
    while i < len(a_s) and j < len(b_s):
        lo, hi = max(a_s[i], b_s[j]), min(a_e[i], b_e[j])
        if lo < hi:
            out_s.append(lo)
            out_e.append(hi)
        if a_e[i] < b_e[j]:
            i += 1
        else:
            j += 1
    return out_s, out_e


def length(merged: Merged, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """How long ``merged`` is busy between ``lo`` and ``hi``."""
    starts, ends = merged
    total = 0.0
    i = bisect_right(ends, lo)  # the first interval that ends after lo
    while i < len(starts) and starts[i] < hi:
        s, e = max(starts[i], lo), min(ends[i], hi)
        if e > s:
            total += e - s
        i += 1
    return total


def bounds(merged: Merged) -> tuple[float, float] | None:
    """The first start and the last end, or None when empty."""
    starts, ends = merged
    return (starts[0], ends[-1]) if len(starts) else None


def breakdown(compute: Merged, comm: Merged, other: Merged, lo: float,
               hi: float, joint: tuple[Merged, Merged] | None = None) -> dict[str, float]:
    """How [lo, hi) splits into compute, communication, overlap, other work and idle.
    ``joint``: compute and communication intersected, and all three united, when the
    caller made them once for many ranges."""
    span = max(hi - lo, 0.0)
    c, m = length(compute, lo, hi), length(comm, lo, hi)
    overlap, all_work = joint or (intersect(compute, comm), union(compute, comm, other))
    both = length(overlap, lo, hi)
    busy = length(all_work, lo, hi)
    return {"span_us": _round(span), "compute_us": _round(c), "comm_us": _round(m),
            "overlap_us": _round(both), "other_us": _round(max(busy - c - m + both, 0.0)),
            "idle_us": _round(max(span - busy, 0.0))}


def _round(value: float) -> float:
    return round(value, 3)
