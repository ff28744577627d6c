"""One window's collective calls, gathered rank by rank from the ranks' summaries and
matched across them (:mod:`~policy_engine.analysis.matching`): who arrived last at each
call, how long every rank waited for it, how long the transfer then took, and at what
bandwidth; the late rank by vote, with its cause.

:class:`WindowCalls` takes each rank's summary as the window reads it (``add``) and keeps
its calls (a few numbers per call, columnar). The cause is read from the ranks' figures:
in a window of at most :data:`WORK_RANKS` ranks each rank's regions, operators and device
idle time are kept; in a larger one, the late rank's own (read back from its entry) are
held against the other ranks' medians, which the window's figures gather anyway, so that
memory does not grow with the ranks. A rank's own summary keeps only a digest of its
calls (:func:`digest`): the calls themselves are the window's, matched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from policy_engine.analysis.collective_form import FormError, read
from policy_engine.analysis.matching import Matcher, RankWork
from policy_engine.analysis.matching_form import Matching
from policy_engine.analysis.summary import RankSummary

#: Windows of more ranks than this give the cause from regions only (each rank's operators
#: would cost a few kilobytes of the window's memory).
WORK_RANKS = 4096


class CallsDigest(TypedDict):
    """What a rank's entry in a window says of its collective calls (made by
    :func:`digest`); the first four as its record has them (read, not checked)."""

    source: Any  # where the calls were read from ("nccl", "gloo"...)
    clock: Any  # "device" or "host"
    numbered: Any  # how calls are numbered in their group ("order"...)
    total: Any  # calls in the trace, listed or folded
    listed: int
    capped: bool
    groups: int


def digest(found: Any) -> CallsDigest | None:
    """What a rank's entry says of its calls (its summary's record without the calls)."""
    if not isinstance(found, dict):
        return None
    calls = found.get("calls") or {}
    listed = len(calls.get("start") or ()) if isinstance(calls, dict) else 0
    return {"source": found.get("source"), "clock": found.get("clock"),
            "numbered": found.get("numbered"), "total": found.get("total"),
            "listed": listed, "capped": bool(found.get("capped")),
            "groups": len(found.get("groups") or ())}


def work_of(summary: RankSummary, ops: bool = True) -> RankWork:
    """A rank's figures the cause of its lateness is read from."""
    regions = {name: float(r["time_us"]) for name, r in
               (summary.get("regions") or {}).items()}
    times: dict[str, float] = {}
    if ops:
        found = summary.get("ops")
        for op in (found.get("top") if found else None) or ():
            times[op["name"]] = times.get(op["name"], 0.0) + float(op["time_us"])
    timeline = summary.get("gpu_timeline")
    idle = float(timeline["idle_us"]) if isinstance(timeline, dict) else None
    return RankWork(regions=regions, ops=times, idle_us=idle)


class WindowCalls:
    """A window's calls, rank by rank, then matched (``result``)."""

    def __init__(self, offsets: dict[int, tuple[float, float]] | None = None) -> None:
        self.matcher = Matcher(offsets)
        self.work: dict[int, RankWork] | None = {}  # None past WORK_RANKS ranks
        self.ranks = 0
        self.unreadable: list[tuple[Any, str]] = []

    def add(self, rank: Any, summary: RankSummary) -> None:
        """Rank ``rank``'s summary (checked): its calls, and its figures for the cause."""
        found = summary.get("collectives")
        if found is None or not isinstance(rank, int):
            return
        try:
            table = read(found)
        except FormError as err:
            self.unreadable.append((rank, str(err)))
            return
        if not len(table.start):
            return
        self.ranks += 1
        self.matcher.add(rank, table)
        if self.work is not None:
            if self.ranks > WORK_RANKS:
                self.work = None  # the others' medians stand in for them (result)
            else:
                self.work[rank] = work_of(summary)

    def result(self, steps: int, *, own: Callable[[int], RankWork | None],
               others: Callable[[], RankWork]) -> Matching | None:
        """The window's matching (JSON-ready), or None when no rank listed a call. In a
        window past WORK_RANKS ranks the cause holds the late rank's figures (``own``,
        read back) against the other ranks' medians (``others``)."""
        if not self.ranks:
            return None
        work = self.work
        if work is None:  # find the late rank first (the matching is kept), then why
            late = self.matcher.result({}, steps=steps or None)["late"].get("rank")
            mine = own(late) if late is not None else None
            work = {} if mine is None or late is None else {late: mine, -1: others()}
        found = self.matcher.result(work, steps=steps or None)
        found["calls"]["table"] = self.matcher.calls()
        return found
