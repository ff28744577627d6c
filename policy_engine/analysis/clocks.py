"""The job's clock as the manifests record it: each rank's offset to the reference rank's
clock, from its ``clock`` notes (runtime/triggers/clock.py measures them).

A rank measures when it reaches the job's channel and after each capture it opens; a
time ``t`` on its clock is ``t + offset`` on the reference's (rank 0's). :class:`Clocks`
gathers the notes a line at a time and keeps, per rank, the first reading and the last
:data:`KEPT` (so that a run of 100,000 ranks and thousands of captures is held in a few
megabytes); :meth:`Clocks.offset` gives a rank's reading nearest a time on its own clock.
A rank without a reading gets offset 0, and :meth:`Clocks.status` says which ranks those
are: on one host they share rank 0's clock anyway; across hosts their times may be off
by the hosts' clock difference.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple, TypedDict, cast

from policy_engine.analysis.format import rank_spans
from policy_engine.errors import is_int
from policy_engine.files.records import ABSENT, Line

#: Readings kept per rank besides its first.
KEPT = 15
#: How far two clocks may drift apart, in µs per second (100 ppm: a quartz clock's worst
#: under NTP), when a reading is chosen for a time it was not taken at.
DRIFT = 100.0
#: Ranks whose failures are kept (the message of the last), and their message's length.
MAX_FAILED = 64
MAX_ERROR = 300


class Offset(NamedTuple):
    """A rank's clock reading: ``offset_us`` within ``uncertainty_us``, measured at
    ``at`` (Unix seconds on the rank's clock; None when the note does not say)."""

    offset_us: float
    uncertainty_us: float
    at: float | None


NONE = Offset(0.0, 0.0, None)


class ClockReference(TypedDict):
    """A reference some ranks measured against (``ClockStatus.references``)."""

    process: str  # the reference's ``host:pid``
    ranks: str  # rank spans, "0-3,8"


class ClockFailure(TypedDict):
    """A rank whose clock could not be measured, and why (``ClockStatus.failed``)."""

    rank: int
    error: str


class _ClockBase(TypedDict):
    """What every clock status says (made by :meth:`Clocks.status`)."""

    basis: str  # "measured", "partial", "none"; "own": offsets not applied (timeline)
    reference: int | None  # the rank whose clock the times are on
    channel: list[str]  # the job channels the ranks measured through
    unmeasured: str  # rank spans of the ranks without a reading
    text: str


class ClockStatus(_ClockBase, total=False):
    """What the clock of a set of ranks rests on (made by :meth:`Clocks.status`)."""

    uncertainty_us: float  # the worst reading's; absent when no rank measured one
    references: list[ClockReference]  # several references (two stores, two rank 0s)
    failed: list[ClockFailure]


class _Rank:
    __slots__ = ("first", "last", "process")

    def __init__(self, first: Offset, process: str | None) -> None:
        self.first = first
        self.last: deque[Offset] = deque(maxlen=KEPT)
        self.process = process  # the reference it measured against (``host:pid``)


class Clocks:
    """Every rank's clock readings, gathered a note at a time."""

    def __init__(self) -> None:
        self.ranks: dict[int, _Rank] = {}
        self.reference: int | None = None
        self.channels: set[str] = set()
        self.failed: dict[int, str] = {}  # rank -> its last failure
        self.failures = 0

    def add(self, line: Line) -> None:
        """One ``clock`` note (read through files/records, so its fields are checked)."""
        rank = line.rank
        if not is_int(rank) or rank < 0:
            return
        channel = line.more.get("channel")
        if isinstance(channel, str) and len(self.channels) < 4:
            self.channels.add(channel[:16])
        offset, unc = line.offset_us, line.uncertainty_us
        if offset is ABSENT or unc is ABSENT:
            error = line.error if isinstance(line.error, str) else "no reading"
            self.failures += 1
            if rank in self.failed or len(self.failed) < MAX_FAILED:
                self.failed[rank] = error[:MAX_ERROR]
            return
        if line.more.get("why") == "reference" and self.reference is None:
            self.reference = rank
        at = line.measured_at if line.measured_at is not ABSENT else None
        reading = Offset(float(offset), float(unc), at)
        process = line.more.get("reference_process")
        process = process[:MAX_ERROR] if isinstance(process, str) else None
        found = self.ranks.get(rank)
        if found is None:
            self.ranks[rank] = _Rank(reading, process)
        else:
            found.last.append(reading)
            found.process = found.process or process

    def offset(self, rank: Any, at: float | None = None) -> Offset | None:
        """Rank ``rank``'s reading for ``at`` (its own clock, Unix seconds): the most
        certain once :data:`DRIFT` since it was taken is counted (its most certain, without
        ``at``); None when it has none."""
        found = self.ranks.get(rank) if isinstance(rank, int) else None
        if found is None:
            return None
        every = [found.first, *found.last]
        if at is None or all(r.at is None for r in every):
            return min(every, key=lambda r: r.uncertainty_us)
        # the most certain once the drift since (or until) each reading is counted
        return min((r for r in every if r.at is not None),
                   key=lambda r: r.uncertainty_us + DRIFT * abs(r.at - at))  # type: ignore[operator]

    def offsets(self, ranks: Any, at: float | None = None) -> dict[int, tuple[float, float]]:
        """``{rank: (offset_us, uncertainty_us)}`` of the ``ranks`` that measured one, for
        a time ``at`` (Unix seconds): what analysis/matching.py's ``Matcher`` takes to lay
        the ranks' collective calls on rank 0's clock."""
        found = {}
        for rank in ranks:
            reading = self.offset(rank, at)
            if reading is not None:
                found[rank] = (reading.offset_us, reading.uncertainty_us)
        return found

    def status(self, ranks: Any) -> ClockStatus:
        """What the clock of ``ranks`` (those a figure lays on one axis) rests on: every
        rank measured, some, or none, and the words that say so."""
        ranks = sorted({r for r in ranks if isinstance(r, int)})
        measured = [r for r in ranks if r in self.ranks]
        missing = [r for r in ranks if r not in self.ranks]
        reference = 0 if self.reference is None else self.reference
        basis = "none" if not measured else "partial" if missing else "measured"
        # its text is added below on either branch (after uncertainty_us, in that order)
        out = cast(ClockStatus, {"basis": basis, "reference": reference,
                                 "channel": sorted(self.channels),
                                 "unmeasured": rank_spans(missing, sep=",", empty="")})
        if basis == "none":
            out["text"] = ("no rank measured its clock (no job channel: the c10d store or "
                           "the Ray actor): offsets are 0, each rank's times are its own "
                           "host's clock; ranks on different hosts may be off by their "
                           "hosts' clock difference")
        else:
            worst = max((self.offset(r) or NONE).uncertainty_us for r in measured)
            out["uncertainty_us"] = round(worst, 3)
            out["text"] = (f"times on rank {reference}'s clock, each rank's measured offset "
                           f"applied (uncertainty up to {worst / 1000:.3f} ms)")
            if missing:
                out["text"] += (f"; ranks {rank_spans(missing)} measured none (offset 0: "
                                "their host's clock is taken as rank "
                                f"{reference}'s)")
        by_reference: dict[str, list[int]] = {}
        for r in measured:
            process = self.ranks[r].process
            if process is not None:
                by_reference.setdefault(process, []).append(r)
        if len(by_reference) > 1:  # two stores (verl's worker groups), two rank 0s
            out["references"] = [{"process": p, "ranks": rank_spans(rs, sep=",")}
                                 for p, rs in list(by_reference.items())[:8]]
            out["text"] += (f"; but the ranks measured against {len(by_reference)} "
                            "different references (each job's store has its own rank 0): "
                            + "; ".join(f"ranks {rank_spans(rs)} against {p}"
                                        for p, rs in list(by_reference.items())[:8])
                            + ", whose clocks are not compared with each other")
        failed = [(r, self.failed[r]) for r in missing if r in self.failed]
        if failed:
            out["failed"] = [{"rank": r, "error": e} for r, e in failed[:8]]
        return out
