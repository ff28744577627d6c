"""Whether a name tells apart the ranks a selector picks, proven on boxes of the mesh's
coordinates, never rank by rank: a world of 10**11 ranks costs what 8 cost.

A rank's name shows some of its coordinates (the ``shown`` dimensions, in mesh order);
two selected ranks clash when they agree on every shown one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from policy_engine.language.values.ranks import Box, intersect

#: Boxes of selected ranks compared pair by pair at most (half a million pairs).
MAX_BOXES = 1000
#: Past MAX_BOXES, the selected ranks are listed one by one when there are this few.
MAX_LISTED = 100_000


def _weights(sizes: Sequence[int]) -> list[int]:
    """Ranks per index of each dimension (the last varies fastest)."""
    return [math.prod(sizes[at + 1:]) for at in range(len(sizes))]


def box_size(box: Box) -> int:
    return math.prod(sum(hi - lo + 1 for lo, hi in ivs) for ivs in box)


def clash(boxes: Sequence[Box], sizes: Sequence[int],
          shown: Sequence[int]) -> tuple[int, int] | None:
    """The pair of selected ranks a walk over the ranks in order reports first: B the
    smallest rank that shows the same coordinates as an earlier one, A the smallest rank
    that shows them. None when no two selected ranks agree on every shown dimension.

    Two ranks of one box clash when the box spans more than one point off the shown
    dimensions; ranks of two boxes when their shown coordinates meet and their hidden ones
    differ. Rank = shown part + hidden part, so each pair of boxes gives its smallest B in
    constant time: at the least common shown point, the least two distinct hidden points.
    """
    weights = _weights(sizes)
    hidden = [at for at in range(len(sizes)) if at not in shown]
    # Per box: least rank, least and second hidden part, shown intervals, outer bounds.
    facts = []
    for box in boxes:
        least_hidden = sum(box[at][0][0] * weights[at] for at in hidden)
        second = None
        for at in reversed(hidden):  # the innermost hidden dimension with two indices
            (lo, hi), *rest = box[at]
            if hi > lo or rest:
                second = least_hidden + ((lo + 1 if hi > lo else rest[0][0]) - lo) * weights[at]
                break
        seen = tuple(box[at] for at in shown)
        least = least_hidden + sum(ivs[0][0] * weights[at]
                                   for at, ivs in zip(shown, seen, strict=True))
        # The outermost shown dimension's bounds reject most pairs of boxes at once.
        low, high = (seen[0][0][0], seen[0][-1][1]) if seen else (0, 0)
        facts.append((least, least_hidden, second, seen, low, high))
    facts.sort(key=lambda fact: fact[0])
    best: tuple[int, tuple[int, ...]] | None = None  # (B, the coordinates it shows)
    for j, (least, one, two, seen, low, high) in enumerate(facts):
        if best is not None and least >= best[0]:
            break  # every pair from here on has a B of at least `least`
        for _, other_one, other_two, other_seen, other_low, other_high in facts[: j + 1]:
            if other_low > high or low > other_high:
                continue
            common = tuple(intersect(a, b) for a, b in zip(seen, other_seen, strict=True))
            if not all(common):
                continue
            if one != other_one:
                extra = max(one, other_one)
            else:  # the same least hidden point: one side must take its second
                options = [x for x in (two, other_two) if x is not None]
                if not options:
                    continue
                extra = min(options)
            point = tuple(ivs[0][0] for ivs in common)
            rank = extra + sum(c * weights[at] for at, c in zip(shown, point, strict=True))
            if best is None or rank < best[0]:
                best = (rank, point)
    if best is None:
        return None
    rank, point = best
    base = sum(c * weights[at] for at, c in zip(shown, point, strict=True))
    first = min(base + fact[1] for fact in facts
                if all(any(lo <= c <= hi for lo, hi in ivs)
                       for ivs, c in zip(fact[3], point, strict=True)))
    return first, rank


def clash_listed(boxes: Sequence[Box], sizes: Sequence[int],
                 shown: Sequence[int]) -> tuple[int, int] | None:
    """What :func:`clash` returns, by listing the selected ranks (a few only)."""
    weights = _weights(sizes)
    shows: dict[int, tuple[int, ...]] = {}
    for box in boxes:
        axes = [[i for lo, hi in ivs for i in range(lo, hi + 1)] for ivs in box]
        for coords in itertools.product(*axes):
            rank = sum(c * w for c, w in zip(coords, weights, strict=True))
            shows[rank] = tuple(coords[at] for at in shown)
    first: dict[tuple[int, ...], int] = {}
    for rank in sorted(shows):
        if shows[rank] in first:
            return first[shows[rank]], rank
        first[shows[rank]] = rank
    return None
