"""How the commands print ranks and sizes: rank spans (``0-3,8``) and byte sizes.

Sizes climb :mod:`policy_engine.language.values.sizes`'s ladder, which the memory plot shares.
"""

from __future__ import annotations

from collections.abc import Iterable

from policy_engine.language.values.sizes import human_bytes, size_cell

__all__ = ["complement_spans", "human_bytes", "rank_spans", "size_cell"]


def rank_spans(ranks: Iterable[object], sep: str = ",", empty: str = "") -> str:
    """``[0, 1, 2, 5, None]`` -> ``"0-2,5,?"``: runs of consecutive ranks (each once, in
    order), then ``?`` when a rank is unknown (not an int); ``empty`` when there is none."""
    known: set[int] = set()
    unknown = False
    for rank in ranks:
        if isinstance(rank, int):
            known.add(rank)
        else:
            unknown = True
    parts: list[str] = []
    start = last = None
    for rank in sorted(known):
        if last is not None and rank == last + 1:
            last = rank
            continue
        if start is not None:
            parts.append(str(start) if start == last else f"{start}-{last}")
        start = last = rank
    if start is not None:
        parts.append(str(start) if start == last else f"{start}-{last}")
    if unknown:
        parts.append("?")
    return sep.join(parts) or empty


def complement_spans(ranks: Iterable[int], world: int, empty: str = "none") -> str:
    """The ranks of ``range(world)`` not in ``ranks``, as :func:`rank_spans`."""
    chosen = set(ranks)
    return rank_spans((r for r in range(world) if r not in chosen), empty=empty)
