"""The analysis of a run folder: every window chosen, every rank's summary read (or its
trace summed up in a process pool) and added to its window's figures one at a time.

:func:`analyze_run` returns the :class:`~policy_engine.analysis.answers.RunAnalysis`;
:func:`analyze` the document ``policy-engine analyze --format json`` prints
(``schemas/analysis.schema.json`` describes it), which
:meth:`~policy_engine.analysis.answers.RunAnalysis.write_json` also writes as a stream.
Each trace is read by one worker, once, as a stream; a worker hands back a summary of a
few kilobytes. Each rank's summary is added to its window's figures and written aside
(:mod:`~policy_engine.analysis.spool`), never held: memory grows with the windows, not
with the ranks.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from policy_engine.analysis.answers import RunAnalysis, WindowAnalysis
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.manifests import Scan, load_summary
from policy_engine.analysis.spool import RankView, Spool
from policy_engine.analysis.summary import problem, summarize
from policy_engine.analysis.timeline import Timeline
from policy_engine.analysis.window import Figures
from policy_engine.analysis.windows import (
    Entry,
    Index,
    Source,
    absent,
    describe,
    from_folders,
    from_manifests,
    inside,
    read_index,
)
from policy_engine.errors import did_you_mean, printable
from policy_engine.files.records import SummaryLine

#: The document's version: 2 added ``timeline``.
VERSION = 2
#: Steps listed in a message about the steps a run captured; the rest are counted.
LISTED_STEPS = 32


def _steps_said(steps: list[int]) -> str:
    """The captured steps for a message: runs joined (``1-40, 45``), at most
    :data:`LISTED_STEPS` of them, the rest counted."""
    runs: list[tuple[int, int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    said = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:LISTED_STEPS]]
    if len(runs) > LISTED_STEPS:
        said.append(f"... ({len(runs) - LISTED_STEPS} more runs, to step {steps[-1]})")
    return ", ".join(said)


def _chosen(windows: list[dict[str, Any]], role: str | None, step: int | None,
            root: str) -> list[dict[str, Any]]:
    if role is not None:
        roles = sorted({w["role"] for w in windows})
        # Every window that holds the role: its family's name, or a role taking part
        # on one of its ranks (folders without manifests: the name's parts).
        windows = [w for w in windows if role == w["role"] or all(
            part in (w.get("holds") or w["role"].split("+")) for part in role.split("+"))]
        if not windows:
            raise AnalysisError(f"no role {role!r} under {root}: it holds "
                                f"{', '.join(map(printable, roles)) or 'no traces'}"
                                f"{did_you_mean(role, roles)}")
    if step is not None:
        every = windows
        windows = [w for w in windows if step in w["steps"]]
        if not windows:
            steps = sorted({s for w in every for s in w["steps"] if isinstance(s, int)})
            raise AnalysisError(f"no capture window covers step {step}; the steps captured "
                                f"are {_steps_said(steps) or 'none (whole sessions)'}")
    return windows


def _summary(path: str) -> dict[str, Any]:
    """:func:`summarize` of one trace, or its rank's ``error`` when summarising it raises:
    a trace is untrusted, and one that trips a fault of the reader is that rank's problem
    (said with the exception's type and message), not the end of the whole command."""
    try:
        return summarize(path)
    except MemoryError:
        return {"error": "out of memory while reading it"}
    except Exception as err:  # the last line of defence: summarize returns its errors
        return {"error": f"reading it failed unexpectedly: {type(err).__name__}: "
                         f"{printable(str(err), 300)}"}


def summaries(files: list[str], jobs: int) -> list[dict[str, Any]]:
    """:func:`summarize` of every file, in order, over ``jobs`` worker processes."""
    with _Readers(jobs) as readers:
        return list(readers.map(files))


class _Readers:
    """Traces summed up over ``jobs`` worker processes (started when first needed)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None

    def __enter__(self) -> _Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def map(self, files: list[str]) -> Iterator[dict[str, Any]]:
        """:func:`_summary` of each file, in order. A worker that dies (killed for its
        memory, say) loses the traces it held: they are read again one at a time, each in
        a worker of its own, so that only the trace that ends its worker again is
        unreadable, and says so."""
        if self.jobs <= 1 or len(files) <= 1:
            yield from map(_summary, files)
            return
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(max_workers=self.jobs)
        # Small traces go to workers in batches: 4,096 ranks cost a few round trips each.
        chunk = max(1, min(64, len(files) // (self.jobs * 4)))
        done = 0
        try:
            for found in self.pool.map(_summary, files, chunksize=chunk):
                yield found
                done += 1
        except BrokenProcessPool:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
            yield from map(_alone, files[done:])


def _alone(path: str) -> dict[str, Any]:
    """:func:`_summary` in a worker of its own; the trace is unreadable if it ends it."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        try:
            return pool.submit(_summary, path).result()
        except BrokenProcessPool as err:
            return {"error": "the process reading it ended abruptly "
                             f"({type(err).__name__}: {err})"}


def _expected(windows: list[dict[str, Any]]) -> dict[tuple[Any, Any], dict[str, set[int]]]:
    """Per role (family) and region, and per role of it, every rank that recorded (or
    tried to record) a window holding that role: a window without one of them that holds
    one of its roles is missing that rank. (verl's rollout, on rank 0 only, expects no
    other rank in a window of its own; a window of the actor expects every actor rank.)"""
    seen: dict[tuple[Any, Any], dict[str, set[int]]] = {}
    for w in windows:
        by_role = seen.setdefault((w["role"], w["region"]), {})
        holders = w.get("holders") or {}
        torch_failed = [d for d in w["dropped"] if d.get("backend") in (None, "torch")]
        ranks = [e.rank for e in w["traces"]] + [
            item.get("rank") for item in (*w["skipped"], *torch_failed)]
        for rank in ranks:
            if isinstance(rank, int):
                for role in holders.get(rank) or (w["role"],):
                    by_role.setdefault(role, set()).add(rank)
    return seen


def _wanted(expected: dict[tuple[Any, Any], dict[str, set[int]]],
            w: dict[str, Any]) -> set[int]:
    by_role = expected.get((w["role"], w["region"]), {})
    return set().union(*(by_role.get(role, set()) for role in w.get("holds") or (w["role"],)))


def _where(source: Source) -> str:
    """Where a summary line lies, for a message."""
    if isinstance(source, SummaryLine):
        return "the one read first"
    return f"line {source.line} of {os.path.basename(source.file)}"


def _line_of(source: Source) -> SummaryLine | str:
    """A summary line the index kept (its place, read again; or the line), or why it
    cannot be read."""
    if isinstance(source, SummaryLine):
        return source
    try:
        return load_summary(source)
    except ValueError as err:
        return f"its summary line could not be read again: {err}"


def _figures(line: SummaryLine, detail: bool) -> dict[str, Any] | str:
    """The figures of a summary line, or why they cannot be used (``detail``: with its
    operators, checked; else without them)."""
    if line.status != "complete":
        return f"its summary line says {line.status}"
    found: Any = line.summary
    why = problem(found, ops=detail)
    if why is not None:
        return why
    figures: dict[str, Any] = dict(found)
    if not detail:
        figures.pop("ops", None)
    return figures


def _chosen_summary(entry: Entry, detail: bool, readable: bool
                    ) -> tuple[dict[str, Any] | None, str | None, list[tuple[str, str]]]:
    """From the summary lines of one trace (one, as its rank writes them): the figures to
    use; why a complete summary is refused; and what the window's readiness says (code,
    message). A summary that cannot be used is passed over for the trace where it can be
    read (``readable``). Lines that differ are not chosen between where the trace can be
    read instead; where it cannot, the first usable one is used, and that is said."""
    sources = entry.summary if isinstance(entry.summary, tuple) else (entry.summary,)
    lines: list[tuple[SummaryLine, Source]] = []  # those that differ
    refused = None
    for source in sources:
        if source is None:
            continue
        line = _line_of(source)
        if isinstance(line, str):
            refused = refused or line
        elif all((line.status, line.summary) != (x.status, x.summary) for x, _ in lines):
            lines.append((line, source))
    usable: list[tuple[dict[str, Any], Source]] = []
    for line, source in lines:
        found = _figures(line, detail)
        if isinstance(found, dict):
            usable.append((found, source))
        elif line.status == "complete":
            refused = refused or found
    if len(lines) > 1:
        twice = f"its trace has {len(lines)} summary lines that differ"
        if readable:
            return None, None, [("duplicate_rank", f"{twice}: the trace is read instead")]
        if usable:
            return usable[0][0], None, [("duplicate_rank", (
                f"{twice}, and the trace is not there to read: the first usable one "
                f"({_where(usable[0][1])}) is used"))]
        return None, refused, [("duplicate_rank", f"{twice}; none can be used")]
    if usable:
        return usable[0][0], None, []
    if refused is not None and readable:
        return None, refused, [("summary_refused", f"its summary cannot be used ({refused}): "
                                "the trace is read instead")]
    return None, refused, []


class _Window:
    """One window analysed: its ranks read, added to its figures and spooled."""

    def __init__(self, w: dict[str, Any], want: set[int], spool: Spool, *, manifests: bool,
                 detail: bool, timeline: Timeline) -> None:
        self.w = w
        self.timeline = timeline
        self.spool = spool
        self.manifests = manifests
        self.detail = detail
        self.figures = Figures(w, want, detail=detail)
        self.places: list[tuple[Any, int, int]] = []

    def add(self, entry: Entry, index: int, summary: dict[str, Any]) -> None:
        rank = entry.rank
        info = (summary.get("facts") or {}).get("distributed_info") or {}
        if rank is None and not self.manifests:  # no manifest: the trace says its rank
            rank = info.get("rank") if isinstance(info.get("rank"), int) else index
            self.w["world"] = self.w["world"] or info.get("world_size")
        self.timeline.add(self.w, rank, summary)
        doc = {"rank": rank, "path": entry.path, "status": entry.status, **summary}
        doc = self.figures.add(doc)
        if not self.detail:  # the comparison of two runs reads them; analyze shows none
            doc.pop("ops", None)
        self.places.append((doc["rank"], *self.spool.add(doc)))

    def run(self, readers: _Readers, root: str) -> None:
        pending: list[tuple[int, Entry]] = []
        for entry, message in self.w.get("twice") or ():
            used = next((e.path for e in self.w["traces"] if e.rank == entry.rank), None)
            self.places.append((entry.rank, *self.spool.add(self.figures.left_out(
                {"rank": entry.rank, "path": entry.path, "status": entry.status}, used,
                message))))
        for index, entry in enumerate(self.w["traces"]):
            if entry.summary is None:
                pending.append((index, entry))
                continue
            file = os.path.join(root, entry.path) if entry.path else ""
            readable = bool(file) and inside(file, root) and os.path.isfile(file)
            found, refused, said = _chosen_summary(entry, self.detail, readable)
            for code, message in said:
                self.figures.say(code, f"rank {entry.rank}: {message}", entry.rank)
            if found is not None:
                self.add(entry, index, found)
            elif readable:
                pending.append((index, entry._replace(file=file)))  # read the trace instead
            else:
                why = ("outside the folder analysed: not read" if file and not inside(
                    file, root) else absent(file) if file else "no file is named")
                if refused:  # the summary was there: say why it is not used
                    why = (f"its summary cannot be used ({refused}), and the trace cannot "
                           f"be read instead: {why}")
                self.add(entry, index, {"error": why})
        files = [str(e.file) for _i, e in pending]
        for (index, entry), summary in zip(pending, readers.map(files), strict=True):
            self.add(entry, index, summary)
        for s in self.w["skipped"]:
            self.add(Entry(s["rank"], s["path"], None, None, None), -1, {"error": s["why"]})

    def finish(self) -> WindowAnalysis:
        w = self.w
        figures = self.figures.finish()
        return WindowAnalysis(
            title=describe(w), role=w["role"], region=w["region"], steps=tuple(w["steps"]),
            cycle=w["cycle"], capture=w["capture"], world=w["world"], why=w["why"],
            limits=tuple(w["limits"]), dropped=tuple(w["dropped"]), other=tuple(w["other"]),
            docs=RankView(self.spool, self.places), figures=self.figures, **figures,
            not_analysed=w.get("not_analysed"),
            identity=(w.get("identity") or {}) if self.detail else None)


def analyze_run(root: str, *, role: str | None = None, step: int | None = None,
                jobs: int = 1, max_traces: int | None = None, from_traces: bool = False,
                scan: Scan | None = None, index: Index | None = None,
                detail: bool = False, own_clocks: bool = False) -> RunAnalysis:
    """The analysis of every capture window under ``root`` that ``role`` and ``step``
    choose. AnalysisError when nothing is chosen. ``max_traces``: read whole windows, oldest
    first, while their traces fit in it (the first one always); the others say only why
    they exist, with ``not_analysed`` saying why not more. A trace whose rank summarised
    it (a ``summary`` line in its manifest) is not read, unless ``from_traces``: its
    figures are the summary's, and the trace need not be there. ``scan``: the manifests
    under ``root``, when the caller read them already (or ``index``: what the windows need
    of them, gathered already); ``detail``: each window keeps what
    the comparison of two runs reads (operators, how it was recorded); ``own_clocks``:
    the timeline lays each rank on its own clock (the measured offsets not applied)."""
    if not os.path.isdir(root):
        raise AnalysisError(f"{root} is not a folder")
    if index is None:
        index = read_index(root, from_traces=from_traces, scan=scan)
    windows, problems, notes = from_manifests(root, from_traces=from_traces, index=index)
    timeline = Timeline(None if own_clocks else index.clocks)
    manifests = bool(windows or problems)
    if not manifests:
        windows = from_folders(root)
    if not windows:
        raise AnalysisError(f"no traces under {root} (a policy-engine output folder has "
                            "manifests/*.manifest.jsonl; a torch.profiler folder has "
                            "*.pt.trace.json[.gz] files)")
    expected = _expected(windows)
    windows = _chosen(windows, role, step, root)
    left = max_traces
    for nth, w in enumerate(windows):
        if left is not None and nth and len(w["traces"]) > left:
            w["not_analysed"] = (f"not analysed here: over the {max_traces} traces read "
                                 "(policy-engine analyze DIR reads every window)")
            w["traces"], w["skipped"], left = [], [], 0
        elif left is not None:
            left -= len(w["traces"])
    spool = Spool()
    out = []
    with _Readers(jobs) as readers:
        for w in windows:
            want = _wanted(expected, w) if manifests else set()
            one = _Window(w, want, spool, manifests=manifests, detail=detail,
                          timeline=timeline)
            one.run(readers, root)
            out.append(one.finish())
    return RunAnalysis(version=VERSION, root=os.path.abspath(root), windows=tuple(out),
                       notes=tuple(notes), problems=tuple(problems), spool=spool,
                       timeline=timeline.finish())



def analyze(root: str, **options: Any) -> dict[str, Any]:
    """The document of :func:`analyze_run` (``policy-engine analyze --format json``)."""
    result = analyze_run(root, **options)
    with contextlib.closing(result):
        return result.to_json()
