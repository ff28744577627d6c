"""The policy's ``steps`` and ``ranks`` values: parsing, membership and checks.

Both parsers take the raw policy value and raise :class:`SelectorError` with a sub-path
inside that value; callers prepend the value's own JSON path and file position.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeGuard

import attrs

__all__ = ["DIMENSIONS", "RankSelector", "SelectorError", "StepSet"]

Path = tuple[str | int, ...]
Run = tuple[int, int | None, int]  # (start, last member or None = unbounded, stride)

#: Coordinate dimensions a rank mapping may name, in the order messages list them.
DIMENSIONS = ("tp", "pp", "dp", "cp", "ep", "local_rank", "node")
# Known from the launcher on every rank, so they never need to be in the mesh.
_PROCESS_DIMS = frozenset({"local_rank", "node"})


class SelectorError(ValueError):
    """A malformed ``steps`` or ``ranks`` value; ``path`` locates it inside the value."""

    def __init__(self, message: str, path: Path = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __repr__(self) -> str:
        return f"SelectorError({self.message!r}, path={self.path!r})"


def _kind(value: object) -> str:
    """How an error message names the type of a bad value, in policy-file words."""
    for kind, label in ((bool, "a boolean"), (float, "a fractional number"), (str, "a string")):
        if isinstance(value, kind):
            return label
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, but `steps: true` is a mistake, not step 1.
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------- steps

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


# ---------------------------------------------------------------- ranks
#
# Tokens of a rank string are split on ",". A token that is an optional "-" followed by
# digits is one index ("-1" = the last); a "-" between two digit groups is an inclusive
# range ("0-3"). Range bounds are never negative, so every token reads one way only:
# "-1" is a single index, "0-3" a range, and "-3--1" or "2--1" are errors.

_INDEX_TOKEN = re.compile(r"-?[0-9]+")
_RANGE_TOKEN = re.compile(r"([0-9]+)\s*-\s*([0-9]+)")
_RANK = "rank"  # the pseudo-dimension of plain rank numbers; users cannot name it


@attrs.frozen
class _Span:
    lo: int  # negative only when lo == hi: an index counted from the end
    hi: int
    path: Path = attrs.field(eq=False)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"

    def hits(self, index: int, size: int | None) -> bool:
        if self.lo < 0:
            return size is not None and index == size + self.lo
        return self.lo <= index <= self.hi


@attrs.frozen
class _Axis:
    """Indices along one dimension; ``spans`` None means every index."""

    dim: str
    spans: tuple[_Span, ...] | None
    path: Path = attrs.field(eq=False)

    def hits(self, index: int | None, size: int | None) -> bool:
        if index is None:
            return False
        return self.spans is None or any(span.hits(index, size) for span in self.spans)

    def to_json(self) -> int | str | list[int | str]:
        if self.spans is None:
            return "all"
        items: list[int | str] = [s.lo if s.lo == s.hi else str(s) for s in self.spans]
        if self.dim == _RANK:
            return items[0] if len(items) == 1 else ",".join(map(str, self.spans))
        return items[0] if len(items) == 1 else items


def _spans(value: object, dim: str, path: Path) -> list[_Span]:
    if _is_int(value):
        return [_Span(value, value, path)]
    if not isinstance(value, str):
        raise SelectorError(
            f"{dim} must be 'all', an index, a range string or a list of them, got {_kind(value)}",
            path,
        )
    spans = []
    for raw in value.split(","):
        token = raw.strip()
        if _INDEX_TOKEN.fullmatch(token):
            spans.append(_Span(int(token), int(token), path))
        elif match := _RANGE_TOKEN.fullmatch(token):
            lo, hi = int(match[1]), int(match[2])
            if hi < lo:
                raise SelectorError(f"range {lo}-{hi} is reversed", path)
            spans.append(_Span(lo, hi, path))
        else:
            raise SelectorError(
                f"malformed {dim} range {token!r} (expected N, -N or A-B with A, B >= 0)", path
            )
    return spans


def _axis(value: object, dim: str, path: Path) -> _Axis:
    if isinstance(value, str) and value.strip() == "all":
        return _Axis(dim, None, path)
    if not isinstance(value, (list, tuple)):
        return _Axis(dim, tuple(_spans(value, dim, path)), path)
    spans: list[_Span] = []
    for index, item in enumerate(value):
        if isinstance(item, str) and item.strip() == "all":
            return _Axis(dim, None, path)
        spans.extend(_spans(item, dim, (*path, index)))
    return _Axis(dim, tuple(spans), path)


def _clause(value: object, path: Path) -> tuple[_Axis, ...]:
    """One alternative of a ranks value: the axes that must all match (``()`` = all)."""
    if isinstance(value, str) and value.strip() == "all":
        return ()
    if not isinstance(value, Mapping):
        return (_axis(value, _RANK, path),)
    if not value:
        raise SelectorError("a ranks mapping needs at least one dimension", path)
    axes = []
    for key, item in value.items():
        if key not in DIMENSIONS:
            close = difflib.get_close_matches(str(key), DIMENSIONS, n=1)
            hint = f", did you mean '{close[0]}'?" if close else ""
            raise SelectorError(
                f"unknown dimension {str(key)!r}{hint} (known: {', '.join(DIMENSIONS)})",
                (*path, key if isinstance(key, (str, int)) else str(key)),
            )
        axes.append(_axis(item, key, (*path, key)))
    return tuple(axes)


@attrs.frozen
class RankSelector:
    """Which ranks of a role profile: a union of clauses, each a conjunction of axes.

    Build it with :meth:`parse`. Equality is structural: ``"0,1"`` and ``"0-1"`` select the
    same ranks but are different selectors.
    """

    clauses: tuple[tuple[_Axis, ...], ...]

    @classmethod
    def parse(cls, value: object) -> RankSelector:
        """Parse ``all``, an int (``-1`` = last), ``"0-3,8,-1"``, a mapping of dimensions
        (``{tp: 0, dp: [0, -1]}``, all must match) or a list of these (any may match)."""
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                if isinstance(item, (list, tuple)):
                    raise SelectorError(
                        "a ranks list item must be 'all', a rank, a range string or a "
                        "mapping, got a list",
                        (index,),
                    )
            return cls(tuple(_clause(item, (index,)) for index, item in enumerate(value)))
        if _is_int(value) or isinstance(value, (str, Mapping)):
            return cls((_clause(value, ()),))
        raise SelectorError(
            "ranks must be 'all', a rank number, a range string, a mapping of dimensions "
            f"or a list of them, got {_kind(value)}"
        )

    @property
    def is_all(self) -> bool:
        """Written to select every rank (``all`` somewhere in the union)."""
        return () in self.clauses

    @property
    def selects_nothing(self) -> bool:
        """Selects no rank whatever the world: ``[]``, or only clauses like ``{tp: []}``."""
        return all(any(axis.spans == () for axis in axes) for axes in self.clauses)

    def matches(
        self, rank: int, world: int, coords: Mapping[str, int], sizes: Mapping[str, int]
    ) -> bool:
        """Whether ``rank`` is selected, given its ``coords`` and the ``sizes`` of each dimension.

        A negative index needs the size of its dimension (``world`` for plain ranks); when
        the size is unknown, or the rank has no coordinate on a named dimension, that axis
        matches nothing.
        """
        for axes in self.clauses:
            if all(
                axis.hits(rank, world)
                if axis.dim == _RANK
                else axis.hits(coords.get(axis.dim), sizes.get(axis.dim))
                for axis in axes
            ):
                return True
        return False

    def check(self, world: int | None, sizes: Mapping[str, int] | None) -> list[SelectorError]:
        """Problems once the world size or the mesh is known (None: not known, not checked).

        ``sizes`` is the mesh; it may also carry sizes for ``local_rank`` and ``node``,
        which are always allowed.
        """
        return [
            problem
            for axes in self.clauses
            for axis in axes
            for problem in _axis_problems(axis, world, sizes)
        ]

    def to_json(self) -> object:
        """A value :meth:`parse` reads back to an equal selector."""
        items = [_clause_json(axes) for axes in self.clauses]
        return items[0] if len(items) == 1 else items

    def __str__(self) -> str:
        if not self.clauses:
            return "none"
        data = self.to_json()
        return data if isinstance(data, str) else json.dumps(data)


def _clause_json(axes: tuple[_Axis, ...]) -> object:
    if not axes:
        return "all"
    if axes[0].dim == _RANK:
        return axes[0].to_json()
    return {axis.dim: axis.to_json() for axis in axes}


def _axis_problems(
    axis: _Axis, world: int | None, sizes: Mapping[str, int] | None
) -> Iterator[SelectorError]:
    if axis.dim == _RANK:
        size, where = world, f"for world {world}"
    elif sizes is not None and axis.dim not in sizes:
        if axis.dim not in _PROCESS_DIMS:
            mesh = ", ".join(dim for dim in sizes if dim not in _PROCESS_DIMS) or "empty"
            yield SelectorError(
                f"dimension {axis.dim!r} is not in the mesh (mesh: {mesh})", axis.path
            )
        return
    else:
        size = None if sizes is None else sizes.get(axis.dim)
        where = f"({axis.dim} has {size})"
    if size is None or axis.spans is None:
        return
    for span in axis.spans:
        if span.hi >= size or span.lo < -size:
            yield SelectorError(f"{axis.dim} {span} is out of range {where}", span.path)
