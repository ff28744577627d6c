"""The policy's ``steps`` value: a set of outer training steps, kept as arithmetic runs.

:meth:`StepSet.parse` raises :class:`SelectorError` with a sub-path inside the value;
callers prepend the value's own JSON path and file position.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import attrs

from policy_engine._selector_base import Path, SelectorError, _is_int, _kind

__all__ = ["StepSet"]

Run = tuple[int, int | None, int]  # (start, last member or None = unbounded, stride)

_STEP_TOKEN = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+)(?:\s*:\s*([0-9]+))?)?")
_NEGATIVE = re.compile(r"-\s*[0-9]+")
_ALL: Run = (0, None, 1)


def _step_run(token: str, path: Path) -> Run:
    token = token.strip()
    match = _STEP_TOKEN.fullmatch(token)
    if match is None:
        if _NEGATIVE.fullmatch(token):
            raise SelectorError(f"step {token} is negative", path)
        raise SelectorError(f"malformed step range {token!r} (expected N, A-B or A-B:S)", path)
    start = int(match[1])
    stop = start if match[2] is None else int(match[2])
    stride = 1 if match[3] is None else int(match[3])
    if stop < start:
        raise SelectorError(f"range {start}-{stop} is reversed", path)
    if stride <= 0:
        raise SelectorError(f"stride must be > 0 in {token!r}", path)
    return (start, stop, stride)


def _step_item(value: object, path: Path, runs: list[Run]) -> None:
    if _is_int(value):
        if value < 0:
            raise SelectorError(f"step {value} is negative", path)
        runs.append((value, value, 1))
    elif isinstance(value, str):
        if value.strip() == "all":
            runs.append(_ALL)
        else:
            runs.extend(_step_run(token, path) for token in value.split(","))
    else:
        raise SelectorError(
            f"a step must be a number or a range string like '10-12' or '0-100:10', "
            f"got {_kind(value)}",
            path,
        )


def _normalize(runs: Sequence[Run]) -> tuple[Run, ...]:
    """Canonical form: intervals merged, redundant runs dropped, sorted.

    Two sets written differently usually compare equal after this (not always: unions
    of strides can coincide in ways not worth detecting).
    """
    if _ALL in runs:
        return (_ALL,)
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
    kept = [run for run in strided if not any(lo <= run[0] and run[1] <= hi for lo, hi in merged)]
    for lo, hi in merged:
        if lo < hi or not any(a <= lo <= b and (lo - a) % s == 0 for a, b, s in kept):
            kept.append((lo, hi, 1))
    return tuple(sorted(kept))


def _intersect(a: Run, b: Run) -> Run | None:
    """The common members of two bounded runs, itself a run (Chinese remainder theorem)."""
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
    # The last member, not hi, so that equal sets of steps are equal tuples.
    return (first, first + (hi - first) // period * period, period)


def _count_cluster(runs: Sequence[Run]) -> int:
    # Inclusion-exclusion kept as signed terms keyed by run: intersections that coincide
    # (0-99:2 & 0-99:3 and 0-99:6) merge, so the work follows the distinct intersections,
    # not the 2**n subsets.
    terms: dict[Run, int] = {}
    for run in runs:
        update = {run: 1}
        for term, coeff in terms.items():
            both = _intersect(term, run)
            if both is not None:
                update[both] = update.get(both, 0) - coeff
        for term, coeff in update.items():
            terms[term] = terms.get(term, 0) + coeff
            if not terms[term]:
                del terms[term]
    return sum(coeff * _size(term) for term, coeff in terms.items())


def _size(run: Run) -> int:
    start, stop, stride = run
    assert stop is not None
    return (stop - start) // stride + 1


def _count_union(runs: Sequence[Run]) -> int:
    """Size of a union of bounded runs sorted by start, without expanding them."""
    total, reach = 0, -1
    cluster: list[Run] = []
    for run in runs:
        assert run[1] is not None
        if cluster and run[0] > reach:  # disjoint from everything before: count apart
            total += _count_cluster(cluster)
            cluster = []
        cluster.append(run)
        reach = max(reach, run[1])
    return total + _count_cluster(cluster)


def _run_text(run: Run) -> str:
    start, stop, stride = run
    if stop is None:
        return "all"
    if start == stop:
        return str(start)
    return f"{start}-{stop}" if stride == 1 else f"{start}-{stop}:{stride}"


@attrs.frozen
class StepSet:
    """A set of outer training steps (ints >= 0), kept as arithmetic runs, never expanded.

    Build it with :meth:`parse`. ``runs`` is the canonical tuple of
    ``(start, last, stride)``; ``last`` is None only for ``all``.
    """

    runs: tuple[Run, ...] = attrs.field(converter=_normalize)

    @classmethod
    def parse(cls, value: object) -> StepSet:
        """Parse ``all``, an int, ``"10-12"``, ``"100-2100:1000"``, ``"1,3,5-7"`` or a list."""
        runs: list[Run] = []
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                _step_item(item, (index,), runs)
        elif _is_int(value) or isinstance(value, str):
            _step_item(value, (), runs)
        else:
            raise SelectorError(
                f"steps must be 'all', a step number, a range string or a list of them, "
                f"got {_kind(value)}"
            )
        return cls(runs)

    @property
    def is_all(self) -> bool:
        """Every step."""
        return self.runs == (_ALL,)

    @property
    def is_empty(self) -> bool:
        """No step at all (``[]``)."""
        return not self.runs

    @property
    def is_bounded(self) -> bool:
        """Finitely many steps."""
        return all(stop is not None for _, stop, _ in self.runs)

    def __contains__(self, step: object) -> bool:
        if not _is_int(step):
            return False
        for start, stop, stride in self.runs:
            if start <= step and (stop is None or step <= stop) and (step - start) % stride == 0:
                return True
        return False

    def count(self) -> int | None:
        """How many steps; None when unbounded."""
        if not self.is_bounded:
            return None
        return _count_union(self.runs)

    def first(self) -> int | None:
        """The smallest step, None when empty."""
        return self.runs[0][0] if self.runs else None

    def last(self) -> int | None:
        """The largest step, None when empty or unbounded.

        With :meth:`first` and :meth:`count` this tells whether the set is one unbroken
        run (``count() == last() - first() + 1``) without expanding it.
        """
        if not self.runs or not self.is_bounded:
            return None
        return max(stop for _, stop, _ in self.runs if stop is not None)

    def next_after(self, step: int) -> int | None:
        """The smallest member greater than ``step``, None when there is none."""
        best: int | None = None
        for start, stop, stride in self.runs:
            candidate = start if step < start else start + ((step - start) // stride + 1) * stride
            if (stop is None or candidate <= stop) and (best is None or candidate < best):
                best = candidate
        return best

    def within(self, lo: int, hi: int) -> list[int]:
        """The members in ``[lo, hi]``, sorted; only that window is expanded."""
        found: set[int] = set()
        for start, stop, stride in self.runs:
            first = start if lo <= start else start - (start - lo) // stride * stride
            last = hi if stop is None else min(stop, hi)
            found.update(range(first, last + 1, stride))
        return sorted(found)

    def to_json(self) -> list[int | str]:
        """A compact list that :meth:`parse` reads back: ``["all"]``, ``[2, 3, "10-20:5"]``."""
        return [run[0] if run[0] == run[1] else _run_text(run) for run in self.runs]

    def __str__(self) -> str:
        return ",".join(_run_text(run) for run in self.runs) if self.runs else "none"
