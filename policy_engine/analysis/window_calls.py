"""One window's collective calls, gathered rank by rank from the ranks' summaries and
matched across them (:mod:`~policy_engine.analysis.matching`): who arrived last at each
call, how long every rank waited for it, how long the transfer then took, and at what
bandwidth; the late rank by vote, with its cause.

:class:`WindowCalls` takes each rank's summary as the window reads it (``add``) and keeps
its calls (a few numbers per call, columnar) and what the cause is read from: its regions'
times, its operators' (in a window of at most :data:`WORK_RANKS` ranks) and its device's
idle time. A rank's own summary keeps only a digest of its calls (:func:`digest`): the
calls themselves are the window's, matched.
"""

from __future__ import annotations

from typing import Any

from policy_engine.analysis.collective_form import FormError, read
from policy_engine.analysis.matching import Matcher, RankWork

#: Windows of more ranks than this give the cause from regions only (each rank's operators
#: would cost a few kilobytes of the window's memory).
WORK_RANKS = 4096


def digest(found: Any) -> dict[str, Any] | None:
    """What a rank's entry says of its calls (its summary's record without the calls)."""
    if not isinstance(found, dict):
        return None
    calls = found.get("calls") or {}
    listed = len(calls.get("start") or ()) if isinstance(calls, dict) else 0
    return {"source": found.get("source"), "clock": found.get("clock"),
            "numbered": found.get("numbered"), "total": found.get("total"),
            "listed": listed, "capped": bool(found.get("capped")),
            "groups": len(found.get("groups") or ())}


class WindowCalls:
    """A window's calls, rank by rank, then matched (``result``)."""

    def __init__(self, offsets: dict[int, tuple[float, float]] | None = None) -> None:
        self.matcher = Matcher(offsets)
        self.work: dict[int, RankWork] = {}
        self.ranks = 0
        self.unreadable: list[tuple[Any, str]] = []

    def add(self, rank: Any, summary: dict[str, Any]) -> None:
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
        regions = {name: float(r["time_us"]) for name, r in
                   (summary.get("regions") or {}).items()}
        ops: dict[str, float] = {}
        if self.ranks <= WORK_RANKS:
            for op in (summary.get("ops") or {}).get("top") or ():
                ops[op["name"]] = ops.get(op["name"], 0.0) + float(op["time_us"])
        timeline = summary.get("gpu_timeline")
        idle = float(timeline["idle_us"]) if isinstance(timeline, dict) else None
        self.work[rank] = RankWork(regions=regions, ops=ops, idle_us=idle)

    def result(self, steps: int) -> dict[str, Any] | None:
        """The window's matching (JSON-ready), or None when no rank listed a call."""
        if not self.ranks:
            return None
        found = self.matcher.result(self.work, steps=steps or None)
        found["calls"]["table"] = self.matcher.calls()
        return found
