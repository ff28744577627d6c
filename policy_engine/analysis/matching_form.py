"""The JSON form of a window's collective calls matched across its ranks, declared: what
:meth:`policy_engine.analysis.matching.Matcher.result` makes (the window's
``collectives``, ``schemas/analysis.schema.json``), and each of its parts. Declared
here, beside the matching, so that ``matching.py`` stays a module one reads at a sitting.
"""

from __future__ import annotations

from typing import Any, TypedDict


class RankCalls(TypedDict, total=False):
    """A rank's figures over its matched calls: a value of a matching's ``ranks`` (made
    by ``Matcher._ranks``: a ``_RankCalls``' attributes)."""

    calls: int
    wait_us: float
    transfer_us: float
    last: int  # calls it arrived last at
    votes: int  # calls that voted it late (a clear last arrival)
    late_us: float | None  # its mean lateness (None: no matched call)
    wait_per_step_us: float  # with the window's steps only
    transfer_per_step_us: float


class ClockNote(TypedDict, total=False):
    """Which clock offsets a matching used (made by ``Matcher._clock_text``)."""

    offsets: str  # "none" or "given"
    text: str
    ranks: int  # ranks with an offset given
    uncertainty_us: float


class Unmatched(TypedDict, total=False):
    """Calls not matched, by why (made by ``Matcher._complete``)."""

    incomplete: int  # not listed by every rank of their group
    inconsistent: int  # kind or size differ across ranks
    unknown_group: int  # calls of unknown groups in different orders


class CallCounts(Unmatched, total=False):
    """A matching's calls: how many were matched, listed, not matched and why, folded
    (made by ``matching.Matcher.result``; ``table`` added by window_calls)."""

    matched: int
    listed: int
    folded: int  # calls a rank's record folded into counts, unlisted
    table: dict[str, list[Any]]  # every matched call's figures, column by column


class GroupRow(TypedDict):
    """A process group's matched calls (made by ``_CallFigures.groups``)."""

    name: str | None
    size: int | None
    calls: int
    bytes: int
    transfer_us: float
    algbw_gbps: float | None  # medians over its calls
    busbw_gbps: float | None


class CallRow(TypedDict):
    """A matched call's figures (made by ``_CallFigures.row``)."""

    group: str | None
    number: int
    kind: str
    bytes: int
    ranks: int
    last_rank: int
    last_us: float  # the last arrival, on rank 0's clock
    wait_us: float  # its ranks' waits summed
    wait_max_us: float
    transfer_us: float
    algbw_gbps: float | None
    busbw_gbps: float | None


class Cause(TypedDict, total=False):
    """Why the late rank was late, or which transfers are slowest (made by
    ``matching._cause`` and ``matching.Matcher.result``)."""

    kind: str  # "host", "work", "transfer" or "unknown"
    region: str  # kind "work": the region, or the operator, that grew
    op: str
    extra_us: float
    idle_extra_us: float  # kind "host": its device's idle time over the others' median
    late_us: float
    groups: list[str | None]  # kind "transfer": the groups, slowest first
    busbw_gbps: float | None
    text: str


class VoteTest(TypedDict):
    """How the late rank is tested (made by ``matching._vote``)."""

    test: str
    alpha: float
    floor_us: float


class LateRank(VoteTest, total=False):
    """The late rank by vote, and its cause (made by ``matching._vote``)."""

    rank: int | None  # None: no rank passed the test
    candidate: int  # the rank with the most votes above chance
    votes: int
    calls: int  # its voting calls
    expected: float  # the votes it would get by chance
    p_value: float
    ranks_tested: int
    cause: Cause


class Matching(TypedDict):
    """One window's collective calls matched across its ranks (made by
    ``matching.Matcher.result``)."""

    clock: ClockNote
    calls: CallCounts
    ranks: dict[str, RankCalls]  # by rank, as text
    late: LateRank
    groups: list[GroupRow]
    slowest_group: str | None
    worst_calls: list[CallRow]
    problems: list[str]
