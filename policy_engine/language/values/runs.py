"""Arithmetic on sets of steps kept as runs ``(start, last, stride)``: their canonical
form, their size, where a run of consecutive steps ends, and the lengths of those runs.

Nothing here walks a set member by member over a long stretch: sizes, run ends and run
lengths come from the runs themselves (inclusion-exclusion, or the pattern the runs repeat
between two run boundaries), and each query has a fixed allowance of work. An answer that
would need more than that allowance is None ("unknown"), which callers treat as "many".
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence

__all__ = [
    "ALL", "Lengths", "Run", "count", "normalize", "order", "run_end", "run_lengths", "run_text",
]

Run = tuple[int, int | None, int]  # (start, last member or None = unbounded, stride)
#: Every step.
ALL: Run = (0, None, 1)

#: Inclusion-exclusion gives up past this many distinct terms or run-by-term intersections
#: (30 overlapping strides over 10**9 steps need 2047 terms and about 61000 intersections).
_MAX_TERMS = 4096
_MAX_INTERSECTIONS = 100_000
#: Cells (bytes) of membership patterns one query may mark, members written included:
#: tens of milliseconds of C-speed work and at most 16 MiB of memory.
_CELLS = 1 << 24


def order(run: Run) -> tuple[int, float, int]:
    """The sort key of runs: by start, an endless run after the bounded ones it starts with."""
    start, stop, stride = run
    return (start, math.inf if stop is None else stop, stride)


def normalize(runs: Sequence[Run]) -> tuple[Run, ...]:
    """Canonical form of bounded runs (or ``ALL``): intervals merged, redundant runs
    dropped, sorted.

    Two sets written differently usually compare equal after this (not always: unions
    of strides can coincide in ways not worth detecting).
    """
    if ALL in runs:
        return (ALL,)
    intervals: list[list[int]] = []
    strided: set[tuple[int, int, int]] = set()
    for start, stop, stride in runs:
        assert stop is not None
        last = start + (stop - start) // stride * stride  # the last member actually hit
        if stride == 1 or start == last:
            intervals.append([start, last])
        else:
            strided.add((start, last, stride))
    intervals.sort()
    merged: list[list[int]] = []
    for lo, hi in intervals:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    los = [lo for lo, _ in merged]

    def covered(run: tuple[int, int, int]) -> bool:  # inside one merged interval
        at = bisect.bisect_right(los, run[0]) - 1
        return at >= 0 and merged[at][1] >= run[1]

    kept = [run for run in strided if not covered(run)]
    for lo, hi in merged:
        if lo < hi or not any(a <= lo <= b and (lo - a) % s == 0 for a, b, s in kept):
            kept.append((lo, hi, 1))
    return tuple(sorted(kept))


def _intersect(a: Run, b: Run) -> Run | None:
    """The common members of two bounded runs, itself a run (Chinese remainder theorem).

    A single member is always ``(m, m, 1)``, so that equal sets are equal tuples.
    """
    (a0, a1, sa), (b0, b1, sb) = a, b
    assert a1 is not None and b1 is not None
    g = math.gcd(sa, sb)
    if (b0 - a0) % g:
        return None
    period = sa // g * sb
    k = (b0 - a0) // g * pow(sa // g, -1, sb // g) % (sb // g)
    first = a0 + sa * k  # a common member, maybe below both starts
    lo, hi = max(a0, b0), min(a1, b1)
    if first < lo:
        first += -((first - lo) // period) * period
    if first > hi:
        return None
    if first + period > hi:
        return (first, first, 1)
    # The last member, not hi, so that equal sets of steps are equal tuples.
    return (first, first + (hi - first) // period * period, period)


def _count_cluster(runs: Sequence[Run]) -> int | None:
    """Size of a union of bounded runs by inclusion-exclusion; None past the term caps."""
    # Signed terms keyed by run: intersections that coincide (0-99:2 & 0-99:3 and 0-99:6)
    # merge, so the work follows the distinct intersections, not the 2**n subsets.
    terms: dict[Run, int] = {}
    work = 0
    for run in runs:
        work += len(terms)
        if work > _MAX_INTERSECTIONS:
            return None
        update = {run: 1}
        for term, coeff in terms.items():
            both = _intersect(term, run)
            if both is not None:
                update[both] = update.get(both, 0) - coeff
        for term, coeff in update.items():
            terms[term] = terms.get(term, 0) + coeff
            if not terms[term]:
                del terms[term]
        if len(terms) > _MAX_TERMS:
            return None
    return sum(coeff * _size(term) for term, coeff in terms.items())


def _size(run: Run) -> int:
    start, stop, stride = run
    assert stop is not None
    return (stop - start) // stride + 1


def _clusters(runs: Sequence[Run]) -> Iterator[list[Run]]:
    """Bounded runs sorted by start, grouped so that runs of different groups share no step."""
    reach = -1
    cluster: list[Run] = []
    for run in runs:
        assert run[1] is not None
        if cluster and run[0] > reach:
            yield cluster
            cluster = []
        cluster.append(run)
        reach = max(reach, run[1])
    if cluster:
        yield cluster


# ---- patterns between run boundaries
#
# Between two consecutive run boundaries (a start, or one past a last member) the same runs
# are active, so membership repeats with the lcm of their strides: one period, marked in a
# bytearray, describes the whole stretch however long it is. _Cells bounds that marking.


class _Cells:
    """The work allowance of one query, in cells of membership patterns."""

    def __init__(self) -> None:
        self.left = _CELLS

    def spend(self, cells: int) -> bool:
        self.left -= cells
        return self.left >= 0

    def affordable(self, active: Sequence[Run]) -> int:
        """The longest window of ``active`` that :meth:`mark` can still afford."""
        per_cell = 1.0 + sum(1.0 / stride for _, _, stride in active)
        return max(0, int(self.left / per_cell))

    def mark(self, active: Sequence[Run], at: int, size: int) -> bytearray:
        """Members of ``active`` in ``[at, at + size)`` as 1 bytes (the runs cover it)."""
        window = bytearray(size)
        spent = size
        for start, _, stride in active:
            offset = (start - at) % stride
            if offset < size:
                count = (size - 1 - offset) // stride + 1
                window[offset::stride] = b"\x01" * count
                spent += count
        self.left -= spent
        return window


def _segments(runs: Sequence[Run]) -> Iterator[tuple[int, int | None, tuple[Run, ...]]]:
    """``(first, last, active)`` for each stretch between run boundaries, in order, gaps
    included; ``last`` is None for the endless stretch of unbounded runs."""
    by_start = sorted(runs, key=order)
    by_end = sorted((stop + 1, run) for run in runs if (stop := run[1]) is not None)
    cuts = sorted({run[0] for run in runs} | {end for end, _ in by_end})
    active: set[Run] = set()
    i = j = 0
    for index, cut in enumerate(cuts):
        while i < len(by_start) and by_start[i][0] == cut:
            active.add(by_start[i])
            i += 1
        while j < len(by_end) and by_end[j][0] == cut:
            active.discard(by_end[j][1])
            j += 1
        last = cuts[index + 1] - 1 if index + 1 < len(cuts) else None
        if last is None and not active:
            return
        yield cut, last, tuple(active)


def _period(active: Sequence[Run], cap: int) -> int:
    """The lcm of the strides of ``active``, or ``cap`` when it is larger."""
    period = 1
    for _, _, stride in active:
        period = period * stride // math.gcd(period, stride)
        if period >= cap:
            return cap
    return period


def _paid(runs: Sequence[Run], cells: _Cells
          ) -> Iterator[tuple[int, int, tuple[Run, ...]] | None]:
    """``(first, length, active)`` for each stretch of a bounded union, each paid for from
    ``cells``' allowance as it comes; None, last, when the allowance is spent."""
    for first, last, active in _segments(runs):
        assert last is not None
        if not cells.spend(len(active) + 1):
            yield None
            return
        yield first, last - first + 1, active


def _count_marked(runs: Sequence[Run], cells: _Cells) -> int | None:
    """Size of a bounded union from the period of each stretch; None past the allowance."""
    total = 0
    for stretch in _paid(runs, cells):
        if stretch is None:
            return None
        first, length, active = stretch
        if not active:
            continue
        if any(stride == 1 for _, _, stride in active):
            total += length
            continue
        size = _period(active, length)
        if size > cells.affordable(active):
            return None
        window = cells.mark(active, first, size)
        full, rest = divmod(length, size)
        total += window.count(1) * full + window.count(1, 0, rest)
    return total


def _feed(carry: int, window: bytes | bytearray) -> tuple[int, list[int]]:
    """Runs of 1s of ``window`` after a run of ``carry`` that reaches its first cell: the
    runs it closes, in order, and the length of the run still open at its end."""
    pieces = window.split(b"\x00")
    if len(pieces) == 1:
        return carry + len(window), []
    closed = [carry + len(pieces[0]), *map(len, pieces[1:-1])]
    return len(pieces[-1]), [n for n in closed if n]


Lengths = list[tuple[tuple[int, ...], int]]  # (block of run lengths in order, repeats)


def _lengths(runs: Sequence[Run], cells: _Cells) -> Lengths | None:
    """Lengths of the maximal runs of consecutive members of a bounded union, in order,
    as blocks with repeat counts; None past the allowance."""
    out: Lengths = []
    carry = 0

    def close(*lengths: int) -> None:
        block = tuple(n for n in lengths if n)
        if block:
            out.append((block, 1))

    for stretch in _paid(runs, cells):
        if stretch is None:
            return None
        first, length, active = stretch
        if not active:
            close(carry)
            carry = 0
        elif any(stride == 1 for _, _, stride in active):
            carry += length
        elif len(active) == 1:  # one strided run: isolated members, whatever the stride
            start, _, stride = active[0]
            offset = (start - first) % stride
            members = 0 if offset >= length else (length - 1 - offset) // stride + 1
            head = carry + 1 if offset == 0 else 1
            if offset:
                close(carry)
            if members == 0:
                carry = 0
                continue
            tail_open = offset + (members - 1) * stride == length - 1
            if members == 1:
                carry = head if tail_open else 0
                close(0 if tail_open else head)
                continue
            close(head)
            if members > 2:
                out.append(((1,), members - 2))
            carry = 1 if tail_open else 0
            close(0 if tail_open else 1)
        else:
            size = _period(active, length)
            if size > cells.affordable(active):
                return None
            window = cells.mark(active, first, size)
            if window.find(0) < 0:  # no hole in a period: the whole stretch is members
                carry += length
                continue
            if not cells.spend(8 * window.count(0)):  # the Python side of split()
                return None
            full, rest = divmod(length, size)
            carry, block = _feed(carry, window)
            close(*block)
            if full > 1:  # every later period closes the same runs: the carry is the same
                carry, block = _feed(carry, window)
                out.append((tuple(block), full - 1))
            if rest:
                carry, block = _feed(carry, window[:rest])
                close(*block)
    close(carry)
    return out


def run_text(run: Run) -> str:
    """A run as a policy writes it: ``all``, ``7``, ``10-12``, ``100-2100:1000``; an
    endless strided run as ``every 100 from 100``."""
    start, stop, stride = run
    if stop is None:
        return "all" if run == ALL else f"every {stride} from {start}"
    if start == stop:
        return str(start)
    return f"{start}-{stop}" if stride == 1 else f"{start}-{stop}:{stride}"


def count(runs: Sequence[Run]) -> int | None:
    """How many steps the bounded runs hold (see :meth:`StepSet.count`); None past the
    allowance of work."""
    total = 0
    cells = _Cells()
    for cluster in _clusters(runs):
        if len(cluster) == 1:
            total += _size(cluster[0])
            continue
        found = _count_cluster(cluster)
        if found is None:
            found = _count_marked(cluster, cells)
        if found is None:
            return None
        total += found
    return total


def run_end(runs: Sequence[Run], first: int) -> int | None:
    """The last step of the run of consecutive steps that holds ``first`` and ``first + 1``
    (both members); see :meth:`StepSet.run_end`."""
    cells = _Cells()
    end = first  # the last step known to be in the run
    for _, hi, active in _segments(runs):
        if hi is not None and hi <= end:
            continue
        step = end + 1  # the stretch holds it: its first step is at most end + 1
        if not cells.spend(len(active) + 1):
            return None
        if not any((step - start) % stride == 0 for start, _, stride in active):
            return end
        if any(stride == 1 for _, _, stride in active):
            if hi is None:
                return None
            end = hi
            continue
        # The pattern repeats every `size` steps through the rest of the stretch. Gaps
        # are usually near, so the window grows from a small one.
        size = _period(active, _CELLS + 1 if hi is None else hi - step + 1)
        want = 1024
        while True:
            window = cells.mark(active, step, min(size, want, cells.affordable(active)))
            gap = window.find(0)
            if gap >= 0:
                return step + gap - 1
            if len(window) == size:  # a whole period, or the rest of the stretch
                break
            if len(window) < min(size, want):
                return None  # no gap within the allowance
            want *= 8
        if hi is None:
            return None  # the period has no gap: the run never ends
        end = hi
    return end


def run_lengths(runs: Sequence[Run]) -> Lengths | None:
    """Lengths of the maximal runs of consecutive steps of bounded runs, in order, as
    blocks with repeat counts; None past the allowance of work."""
    return _lengths(runs, _Cells())
