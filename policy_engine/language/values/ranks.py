"""The policy's ``ranks`` value: which ranks of a role profile, by number or coordinates.

:meth:`RankSelector.parse` raises :class:`SelectorError` with a sub-path inside the value;
callers prepend the value's own JSON path and file position.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs

from policy_engine.errors import describe, did_you_mean, is_int
from policy_engine.language.values.selector import (
    Path,
    SelectorError,
    _bounded_int,
    _number,
)

__all__ = ["DIMENSIONS", "Box", "Intervals", "RankSelector", "intersect"]

#: Sorted, disjoint, non-adjacent inclusive intervals of indices along one dimension.
Intervals = tuple[tuple[int, int], ...]
#: A product set of a mesh's coordinate space: the indices allowed along each dimension,
#: in mesh order. Every dimension holds at least one index.
Box = tuple[Intervals, ...]

#: Coordinate dimensions a rank mapping may name, in the order messages list them.
DIMENSIONS = ("tp", "pp", "dp", "cp", "ep", "local_rank", "node")
# Known from the launcher on every rank, so they never need to be in the mesh.
_PROCESS_DIMS = frozenset({"local_rank", "node"})

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


def _words(dim: str) -> tuple[str, str]:
    """How a too-large number of ``dim`` is named: ("rank", "ranks"), ("tp", "indices")."""
    return ("rank", "ranks") if dim == _RANK else (dim, "indices")


def _spans(value: object, dim: str, path: Path) -> list[_Span]:
    if is_int(value):
        _bounded_int(value, *_words(dim), path)
        return [_Span(value, value, path)]
    if not isinstance(value, str):
        raise SelectorError(
            f"{dim} must be 'all', an index, a range string or a list of them, "
            f"got {describe(value)}",
            path,
        )
    spans = []
    for raw in value.split(","):
        token = raw.strip()
        if _INDEX_TOKEN.fullmatch(token):
            index = _number(token, *_words(dim), path)
            spans.append(_Span(index, index, path))
        elif match := _RANGE_TOKEN.fullmatch(token):
            lo, hi = _number(match[1], *_words(dim), path), _number(match[2], *_words(dim), path)
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
            hint = (
                did_you_mean(str(key), DIMENSIONS) or f" (expected one of {', '.join(DIMENSIONS)})"
            )
            raise SelectorError(
                f"unknown dimension {str(key)!r}{hint}",
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
        if is_int(value) or isinstance(value, (str, Mapping)):
            return cls((_clause(value, ()),))
        raise SelectorError(
            "ranks must be 'all', a rank number, a range string, a mapping of dimensions "
            f"or a list of them, got {describe(value)}"
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
        return any(all(axis.hits(rank, world) if axis.dim == _RANK else
                       axis.hits(coords.get(axis.dim), sizes.get(axis.dim)) for axis in axes)
                   for axes in self.clauses)

    def matcher(self, world: int, sizes: Mapping[str, int]
                ) -> Callable[[int, Mapping[str, int]], bool]:
        """``matcher(world, sizes)(rank, coords)`` is ``matches(rank, world, coords, sizes)``,
        faster for many ranks (explain places 65,536)."""
        # Each axis: its answers for the indices below its size, worked out at once.
        clauses = [[(axis, size, {i for lo, hi in _indices(axis, size, size or 0)
                                  for i in range(lo, hi + 1)}, size or 0) for axis in axes
                    for size in [world if axis.dim == _RANK else sizes.get(axis.dim)]]
                   for axes in self.clauses]

        def match(rank: int, coords: Mapping[str, int]) -> bool:
            for axes in clauses:
                for axis, size, inside, below in axes:
                    index = rank if axis.dim == _RANK else coords.get(axis.dim)
                    if not (index in inside if index is not None and 0 <= index < below
                            else axis.hits(index, size)):
                        break
                else:
                    return True
            return False
        return match

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

    def boxes(self, world: int, mesh: Mapping[str, int] | None) -> list[Box]:
        """The ranks selected in a world of one node, as boxes of the mesh's coordinates.

        One node, as validate simulates it: ``local_rank`` is the rank and ``node`` is 0
        (their sizes unknown, so negative indices on them match nothing). Without a mesh
        the space has one dimension, the rank. ``mesh`` must cover ``world`` exactly. The
        boxes may overlap; their union is what :meth:`matches` selects. A plain rank range
        takes at most two boxes per dimension whatever the sizes, so the number of boxes
        grows with the selector's text, never with the world.
        """
        space = dict(mesh) if mesh else {_RANK: world}
        sizes = list(space.values())
        out: list[Box] = []
        for axes in self.clauses:
            allowed = _clause_sets(axes, space, world)
            if allowed is None:
                continue
            per_dim, ranks = allowed
            pieces: list[list[tuple[int, int]]] = [[(0, n - 1) for n in sizes]]
            if ranks is not None:
                pieces = [box for lo, hi in ranks for box in _decompose(lo, hi, sizes)]
            for piece in pieces:
                box = tuple(intersect(((lo, hi),), per_dim[d]) for d, (lo, hi) in enumerate(piece))
                if all(box):
                    out.append(box)
        return out

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


def _merge(intervals: list[tuple[int, int]]) -> Intervals:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The indices in both (two sorted interval lists, merged in one pass)."""
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _indices(axis: _Axis, size: int | None, bound: int) -> Intervals:
    """The indices ``axis`` allows in ``[0, bound)``; ``size`` resolves negative ones."""
    if axis.spans is None:
        return ((0, bound - 1),)
    found: list[tuple[int, int]] = []
    for span in axis.spans:
        if span.lo < 0:
            if size is not None and 0 <= size + span.lo < bound:
                found.append((size + span.lo, size + span.lo))
        elif span.lo < bound:
            found.append((span.lo, min(span.hi, bound - 1)))
    return _merge(found)


def _clause_sets(
    axes: tuple[_Axis, ...], space: Mapping[str, int], world: int
) -> tuple[list[Intervals], Intervals | None] | None:
    """What one clause allows: indices per dimension of ``space`` and, when it names
    ranks (plain or local_rank, which is the rank on one node), the rank intervals.
    None when it selects nothing."""
    per_dim: list[Intervals] = [((0, n - 1),) for n in space.values()]
    dims = list(space)
    ranks: Intervals | None = None
    for axis in axes:
        if axis.dim in (_RANK, "local_rank"):
            # A negative local_rank needs the node size, unknown here: it matches nothing.
            found = _indices(axis, world if axis.dim == _RANK else None, world)
            ranks = found if ranks is None else intersect(ranks, found)
        elif axis.dim == "node":
            found = _indices(axis, None, 1)
        elif axis.dim in space:
            at = dims.index(axis.dim)
            found = intersect(per_dim[at], _indices(axis, space[axis.dim], space[axis.dim]))
            per_dim[at] = found
        else:
            found = ()  # a dimension the mesh lacks: no rank has that coordinate
        if not found:
            return None
    return per_dim, ranks


def _decompose(lo: int, hi: int, sizes: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Ranks ``lo..hi`` of a mixed-radix space (outermost size first, the last varying
    fastest) as boxes of one interval per dimension, in rank order: at most two boxes per
    dimension, a ragged start and end around a middle of whole blocks."""
    if not sizes:
        return [[]]
    block = math.prod(sizes[1:])  # ranks per index of the outermost dimension
    first, lo_rest = divmod(lo, block)
    last, hi_rest = divmod(hi, block)
    if first == last:
        return [[(first, first), *box] for box in _decompose(lo_rest, hi_rest, sizes[1:])]
    head: list[list[tuple[int, int]]] = []
    tail: list[list[tuple[int, int]]] = []
    if lo_rest:
        head = [[(first, first), *box] for box in _decompose(lo_rest, block - 1, sizes[1:])]
        first += 1
    if hi_rest != block - 1:
        tail = [[(last, last), *box] for box in _decompose(0, hi_rest, sizes[1:])]
        last -= 1
    middle = [[(first, last), *((0, n - 1) for n in sizes[1:])]] if first <= last else []
    return head + middle + tail
