"""Time intervals, merged: how long a kind of work ran inside a range, counted once.

A trace's operators nest and overlap (a backward op inside a region inside a step, two
streams at once); the time a rank spends on something is the length of the *union* of
its intervals. :class:`Spans` gathers intervals as they stream past, folding those that
arrive in start order into the one open interval, so nested operators cost nothing to
hold; :func:`merge` turns what is left into sorted, disjoint intervals.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections.abc import Sequence

#: Sorted, disjoint intervals: starts and ends, in microseconds.
Merged = tuple[Sequence[float], Sequence[float]]
EMPTY: Merged = ((), ())


class Spans:
    """Intervals of one kind of work, gathered one at a time."""

    __slots__ = ("_end", "_ends", "_start", "_starts", "count")

    def __init__(self) -> None:
        self._starts = array("d")
        self._ends = array("d")
        self._start = 0.0
        self._end = -1.0  # no open interval
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
        self._start, self._end = start, end

    def merged(self) -> Merged:
        """The union, as sorted disjoint intervals."""
        starts, ends = self._starts, self._ends
        if self._end >= self._start:
            starts.append(self._start)
            ends.append(self._end)
            self._end = self._start - 1.0
        order = sorted(range(len(starts)), key=starts.__getitem__)
        out_s: list[float] = []
        out_e: list[float] = []
        for i in order:
            s, e = starts[i], ends[i]
            if out_e and s <= out_e[-1]:
                if e > out_e[-1]:
                    out_e[-1] = e
            else:
                out_s.append(s)
                out_e.append(e)
        self._starts, self._ends = array("d", out_s), array("d", out_e)
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
    out_s: list[float] = []
    out_e: list[float] = []
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
