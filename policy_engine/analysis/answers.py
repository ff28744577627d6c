"""What ``analyze`` answers, as typed records: the run (:class:`RunAnalysis`), each window
(:class:`WindowAnalysis`), each rank (:class:`RankAnalysis`) and each of its steps
(:class:`StepFigures`).

A window holds its figures across the ranks, and its ranks as a view over the spool they
were written to as they were read (:mod:`~policy_engine.analysis.spool`): the ranks of a
window of 100,000 are handed out one at a time, never held together.
:meth:`RunAnalysis.to_json` is the document ``policy-engine analyze --format json`` prints,
and :meth:`RunAnalysis.write_json` writes the same document as a stream.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, overload

import attrs

from policy_engine.analysis.hta import HtaAnswer, window_answer
from policy_engine.analysis.spool import RankView, Spool, dumps
from policy_engine.analysis.stalls import Stalls
from policy_engine.analysis.step_figures import Figure, FigureRow, StepFigures
from policy_engine.analysis.summary import RankEntry, TimelineFigure
from policy_engine.analysis.timeline import TimelineDoc
from policy_engine.analysis.window import (
    Figures,
    ReadinessNote,
    RegionRow,
    StepTimes,
    Straggler,
)
from policy_engine.analysis.windows import Dropped, Limit, OtherTrace, WindowWhy

#: The timeline of a run that laid none out (an analysis made without one).
_NO_TIMELINE: Mapping[str, Any] = {"clock": None, "steps": [], "notes": []}


@attrs.frozen
class RankAnalysis:
    """One rank of a window: its figures, or ``error`` saying why there are none."""

    rank: int | None
    path: str | None
    status: str | None
    error: str | None
    basis: str | None  # "gpu" (kernels) or "cpu"
    steps: tuple[StepFigures, ...]
    total: FigureRow | None

    @classmethod
    def from_doc(cls, doc: RankEntry) -> RankAnalysis:
        steps = tuple(StepFigures.from_row(row) for row in doc.get("steps") or ())
        return cls(rank=doc.get("rank"), path=doc.get("path"), status=doc.get("status"),
                   error=doc.get("error"), basis=doc.get("basis"), steps=steps,
                   total=doc.get("total"))


class Ranks(Sequence[RankAnalysis]):
    """A window's ranks, in rank order, each made when asked for."""

    def __init__(self, docs: RankView) -> None:
        self._docs = docs

    def __len__(self) -> int:
        return len(self._docs)

    @overload
    def __getitem__(self, index: int) -> RankAnalysis: ...
    @overload
    def __getitem__(self, index: slice) -> list[RankAnalysis]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [RankAnalysis.from_doc(d) for d in self._docs[index]]
        return RankAnalysis.from_doc(self._docs[index])

    def __iter__(self) -> Iterator[RankAnalysis]:
        for doc in self._docs:
            yield RankAnalysis.from_doc(doc)


#: A window's keys before its ranks, and after them, in the document's order.
HEAD = ("title", "role", "region", "steps", "cycle", "capture", "world", "why", "limits",
        "dropped", "other")
TAIL = ("step_times", "regions", "breakdown", "gpu_timeline", "straggler", "collectives",
        "readiness", "hta")


@attrs.frozen(eq=False)
class WindowAnalysis:
    """One capture window compared across its ranks."""

    title: str
    role: str
    region: str | None
    steps: tuple[Any, ...]
    cycle: int | None
    capture: int
    world: int | None
    why: WindowWhy | None
    limits: tuple[Limit, ...]
    dropped: tuple[Dropped, ...]
    other: tuple[OtherTrace, ...]
    #: each rank's JSON object (its summary, ``total``, or ``error``), in rank order
    docs: RankView = attrs.field(repr=False)
    step_times: list[StepTimes]
    regions: list[RegionRow]
    breakdown: dict[Figure, dict[str, float] | None] | None
    #: the device view across the ranks (TraceLens's gpu_timeline, each figure's spread)
    gpu_timeline: dict[TimelineFigure, dict[str, float] | None] | None
    straggler: Straggler | None
    readiness: list[ReadinessNote]
    #: the window's collective calls matched across its ranks (window_calls.py's
    #: matching_form.Matching; compare.py keeps only their means and late rank), or None
    collectives: Mapping[str, Any] | None = None
    hta: HtaAnswer | None = None
    not_analysed: str | None = None
    #: how the window was recorded, for the comparison of two runs (``detail``)
    identity: Mapping[str, Any] | None = None
    #: the figures as gathered (per-rank totals, what ``compare`` reads)
    figures: Figures | None = attrs.field(default=None, repr=False)

    @property
    def ranks(self) -> Ranks:
        """The ranks, typed, in rank order."""
        return Ranks(self.docs)

    def _head(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in HEAD}
        out["steps"] = list(self.steps)
        for k in ("limits", "dropped", "other"):
            out[k] = list(out[k])
        return out

    def _tail(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in TAIL}
        if self.not_analysed is not None:
            out["not_analysed"] = self.not_analysed
        if self.identity is not None:
            out["identity"] = self.identity
        return out

    def to_json(self) -> dict[str, Any]:
        """The window's JSON object, its ranks read into it."""
        return {**self._head(), "ranks": list(self.docs), **self._tail()}

    def write_json(self, out: IO[bytes]) -> None:
        """:meth:`to_json`, written as a stream: one rank at a time."""
        out.write(dumps(self._head())[:-1] + b',"ranks":[')
        for i, raw in enumerate(self.docs.raw()):
            out.write(b"\n" + raw if not i else b",\n" + raw)
        out.write(b"]," + dumps(self._tail())[1:])


@attrs.frozen(eq=False)
class RunAnalysis:
    """Every window analysed under ``root``, with the notes and manifest problems met."""

    version: int
    root: str
    windows: tuple[WindowAnalysis, ...]
    notes: tuple[Mapping[str, Any], ...]
    problems: tuple[str, ...]
    spool: Spool | None = attrs.field(default=None, repr=False)
    #: the stall records under ``root`` (None: it has none), answered (analysis.stalls)
    stalls: Stalls | None = None
    #: every training step's phases on one clock, who waited for whom, the critical path
    #: (analysis/timeline.py)
    timeline: TimelineDoc | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON document of the analysis (its ``version`` says which), a fresh copy."""
        return {"version": self.version, "root": self.root,
                "windows": [w.to_json() for w in self.windows],
                "notes": [dict(n) for n in self.notes], "problems": list(self.problems),
                "stalls": None if self.stalls is None else self.stalls.to_json(),
                "timeline": copy.deepcopy(dict(self.timeline or _NO_TIMELINE))}

    def write_json(self, out: IO[bytes]) -> None:
        """:meth:`to_json` as a stream, a window and a rank at a time."""
        out.write(b'{"version":' + dumps(self.version) + b',"root":' + dumps(self.root)
                  + b',"windows":[')
        for i, w in enumerate(self.windows):
            out.write(b"\n" if not i else b",\n")
            w.write_json(out)
        out.write(b'],\n"notes":' + dumps(list(self.notes)) + b',\n"problems":'
                  + dumps(list(self.problems)) + b',\n"stalls":'
                  + dumps(None if self.stalls is None else self.stalls.to_json())
                  + b',\n"timeline":' + dumps(dict(self.timeline or _NO_TIMELINE)) + b"}\n")

    def with_hta(self, root: str) -> RunAnalysis:
        """This analysis with HTA's numbers in each window that holds GPU kernels (the
        others say why not; ``root``: the folder its traces lie under)."""
        return attrs.evolve(self, windows=tuple(
            attrs.evolve(w, hta=window_answer(w.docs, root)) for w in self.windows))

    def close(self) -> None:
        """Let go of the ranks written aside (the windows' ranks cannot be read after)."""
        if self.spool is not None:
            self.spool.close()
