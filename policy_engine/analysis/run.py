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
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any, cast

from policy_engine.analysis.answers import RunAnalysis, WindowAnalysis
from policy_engine.analysis.chrome_trace import declared_size
from policy_engine.analysis.clocks import Clocks
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.format import size_cell
from policy_engine.analysis.manifests import Scan, load_summary
from policy_engine.analysis.matching import RankWork
from policy_engine.analysis.spool import Places, RankView, Spool
from policy_engine.analysis.stalls import read_stalls
from policy_engine.analysis.summary import RankEntry, RankSummary, problem, summarize
from policy_engine.analysis.timeline import Timeline
from policy_engine.analysis.window import Figures
from policy_engine.analysis.window_calls import WORK_RANKS, WindowCalls, digest, work_of
from policy_engine.analysis.windows import (
    Entry,
    Index,
    Source,
    Window,
    absent,
    describe,
    from_folders,
    from_manifests,
    inside,
    read_index,
    readable,
)
from policy_engine.errors import did_you_mean, printable
from policy_engine.files.records import SummaryLine, SummaryStatus

#: The analysis document's version: 2 added the device view (``gpu_timeline``, ``hta``),
#: the ``npu`` basis, ``collectives``, ``stalls`` and ``timeline``, and made a GPU step's
#: span its time on the host.
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


def _chosen(windows: list[Window], role: str | None, step: int | None,
            root: str) -> list[Window]:
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


def _summary(path: str, cap: int | None = None) -> RankSummary:
    """:func:`summarize` of one trace, or its rank's ``error`` when summarising it raises:
    a trace is untrusted, and one that trips a fault of the reader is that rank's problem
    (said with the exception's type and message), not the end of the whole command."""
    try:
        return summarize(path, max_bytes=cap)
    except MemoryError:
        return {"error": "out of memory while reading it"}
    except Exception as err:  # the last line of defence: summarize returns its errors
        return {"error": f"reading it failed unexpectedly: {type(err).__name__}: "
                         f"{printable(str(err), 300)}"}


def summaries(files: list[str], jobs: int,
              limits: tuple[int, int] | None = None) -> list[RankSummary]:
    """:func:`summarize` of every file, in order, over ``jobs`` worker processes;
    ``limits``: the most text read of one trace and of all of them (bytes)."""
    with _Readers(jobs, limits) as readers:
        return list(readers.map(files))


def _text_size(path: str) -> int | None:
    """The text a trace holds: a plain file's size, a gzip's trailer (None where it
    cannot be trusted, or the file is not one to read: the reader says why)."""
    declared = declared_size(path)
    if declared is not None:
        return declared
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or os.pread(fd, 2, 0) == b"\x1f\x8b":
            return None
        return info.st_size
    except OSError:
        return None
    finally:
        os.close(fd)


class _Readers:
    """Traces summed up over ``jobs`` worker processes (started when first needed), each
    reading at most ``limits[0]`` bytes of text and all together ``limits[1]``."""

    def __init__(self, jobs: int, limits: tuple[int, int] | None = None) -> None:
        self.jobs = jobs
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.limits = limits
        self.left = limits[1] if limits else 0

    def allot(self, files: list[str]) -> list[int | str | None]:
        """What each trace may read (bytes of text) so that none reads more than the
        limit and all together no more than the total, in order, before any is read
        (they are read at once); or why one is not read. A trace's size is its gzip
        trailer's or the file's (a trailer that lies is stopped at what it said); a trace
        of unknown size may use what is left."""
        if self.limits is None:
            return [None] * len(files)
        limit, total = self.limits
        caps: list[int | str | None] = []
        for path in files:
            size = _text_size(path)
            if size is not None and size > limit:
                caps.append(f"not read: it is {size_cell(size)} of text, over the "
                            f"{size_cell(limit)} read of one trace (--max-trace-mb)")
                continue
            need = min(limit, self.left) if size is None else size
            if need > self.left or self.left <= 0:
                caps.append(f"not read: the traces before it used up the "
                            f"{size_cell(total)} read in all (--max-total-mb)")
                continue
            self.left -= need
            caps.append(need)
        return caps

    def __enter__(self) -> _Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def map(self, files: list[str]) -> Iterator[RankSummary]:
        """:func:`_summary` of each file, in order, within the limits. A worker that dies
        (killed for its memory, say) loses the traces it held: they are read again one at
        a time, each in a worker of its own, so that only the trace that ends its worker
        again is unreadable, and says so."""
        caps = self.allot(files)
        todo = [(f, cap) for f, cap in zip(files, caps, strict=True) if not isinstance(cap, str)]
        done = self._map([f for f, _ in todo], [cap for _, cap in todo])
        for cap in caps:
            yield {"error": cap} if isinstance(cap, str) else next(done)

    def _map(self, files: list[str], caps: list[int | None]) -> Iterator[RankSummary]:
        if self.jobs <= 1 or len(files) <= 1:
            yield from map(_summary, files, caps)
            return
        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(max_workers=self.jobs)
        # Small traces go to workers in batches: 4,096 ranks cost a few round trips each.
        chunk = max(1, min(64, len(files) // (self.jobs * 4)))
        done = 0
        try:
            for found in self.pool.map(_summary, files, caps, chunksize=chunk):
                yield found
                done += 1
        except BrokenProcessPool:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
            yield from map(_alone, files[done:], caps[done:])


def _alone(path: str, cap: int | None) -> RankSummary:
    """:func:`_summary` in a worker of its own; the trace is unreadable if it ends it."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        try:
            return pool.submit(_summary, path, cap).result()
        except BrokenProcessPool as err:
            return {"error": "the process reading it ended abruptly "
                             f"({type(err).__name__}: {err})"}


def _expected(windows: list[Window]) -> dict[tuple[Any, Any], dict[str, set[int]]]:
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
            w: Window) -> Collection[int]:
    """The ranks window ``w`` should have: a range where they run without a gap (a window
    of 100,000 ranks holds no set of them)."""
    by_role = expected.get((w["role"], w["region"]), {})
    found = [by_role.get(role, set()) for role in w.get("holds") or (w["role"],)]
    return _compact(found[0] if len(found) == 1 else set().union(*found))


def _compact(ranks: set[int]) -> Collection[int]:
    """``ranks`` as a range where they run from the least to the greatest without a gap."""
    if ranks:
        first, last = min(ranks), max(ranks)
        if last - first + 1 == len(ranks):
            return range(first, last + 1)
    return ranks


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


def _figures(line: SummaryLine, detail: bool, causes: bool = True
             ) -> RankSummary | str:
    """The figures of a summary line, or why they cannot be used (``detail``: with its
    operators, checked; else without them, unless ``causes`` and it lists collective
    calls: a late rank's cause is read from its operators too)."""
    if line.status != SummaryStatus.COMPLETE:
        return f"its summary line says {line.status}"
    found: Any = line.summary
    ops = detail or (causes and isinstance(found, dict)
                     and found.get("collectives") is not None)
    why = problem(found, ops=ops)
    if why is not None:
        return why
    # problem() found it a summary's figures, each with its type
    figures = cast(RankSummary, dict(found))
    if not ops:
        figures.pop("ops", None)
    return figures


def _chosen_summary(entry: Entry, detail: bool, readable: Callable[[], bool],
                    causes: bool = True
                    ) -> tuple[RankSummary | None, str | None, list[tuple[str, str]]]:
    """From the summary lines of one trace (one, as its rank writes them): the figures to
    use; why a complete summary is refused; and what the window's readiness says (code,
    message). A summary that cannot be used is passed over for the trace where it can be
    read (``readable``, asked only then). Lines that differ are not chosen between where
    the trace can be read instead; where it cannot, the first usable one is used, and
    that is said."""
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
    usable: list[tuple[RankSummary, Source]] = []
    for line, source in lines:
        found = _figures(line, detail, causes)
        if isinstance(found, dict):
            usable.append((found, source))
        elif line.status == SummaryStatus.COMPLETE:
            refused = refused or found
    if len(lines) > 1:
        twice = f"its trace has {len(lines)} summary lines that differ"
        if readable():
            return None, None, [("duplicate_rank", f"{twice}: the trace is read instead")]
        if usable:
            return usable[0][0], None, [("duplicate_rank", (
                f"{twice}, and the trace is not there to read: the first usable one "
                f"({_where(usable[0][1])}) is used"))]
        return None, refused, [("duplicate_rank", f"{twice}; none can be used")]
    if usable:
        return usable[0][0], None, []
    if refused is not None and readable():
        return None, refused, [("summary_refused", f"its summary cannot be used ({refused}): "
                                "the trace is read instead")]
    return None, refused, []


class _Window:
    """One window analysed: its ranks read, added to its figures and spooled."""

    def __init__(self, w: Window, want: Collection[int], spool: Spool, *,
                 manifests: bool, detail: bool, timeline: Timeline,
                 clocks: Clocks | None = None) -> None:
        self.w = w
        self.timeline = timeline
        self.spool = spool
        self.manifests = manifests
        self.detail = detail
        # window.py takes the window as an open dict until it takes a Window
        self.figures = Figures(w, want, detail=detail)
        self.figures.path_of = self._path_of
        # the calls laid on rank 0's clock by each rank's measured offset (its most
        # certain reading), where the ranks measured one
        self.calls = WindowCalls(None if clocks is None else clocks.offsets(
            e.rank for e in w["traces"]))
        self.places = Places()  # where each rank's line lies in the spool
        self.by_order: list[int] = []  # ranks numbered by their trace's place

    def add(self, entry: Entry, index: int, summary: RankSummary) -> None:
        rank = entry.rank
        doc: RankEntry = {"rank": rank, "path": entry.path, "status": entry.status}
        if not self.manifests:  # no manifest: the trace says its rank, or its name does
            facts = summary.get("facts")
            info: Mapping[str, Any] = (facts.get("distributed_info") if facts else None) or {}
            if isinstance(info.get("rank"), int):
                rank, doc["rank_from"] = info["rank"], "distributedInfo"
                world = info.get("world_size")
                self.w["world"] = self.w["world"] or (world if isinstance(world, int)
                                                      else None)
            elif rank is not None:
                doc["rank_from"] = "name"
            else:
                rank, doc["rank_from"] = index, "order"
                self.by_order.append(index)
            doc["rank"] = rank
        self.timeline.add(self.w, rank, summary)
        doc.update(cast(RankEntry, summary))  # a summary's keys are its entry's (its base)
        doc = self.figures.add(doc)
        if not doc.get("error"):
            self.calls.add(doc["rank"], doc)
        if "collectives" in doc:  # the calls are the window's, matched: the rank keeps a digest
            doc["collectives"] = digest(doc["collectives"])
        if not self.detail:  # the comparison of two runs reads them; analyze shows none
            doc.pop("ops", None)
        self.places.append(doc["rank"], *self.spool.add(doc))

    def run(self, readers: _Readers, root: str) -> None:
        pending: list[tuple[int, Entry]] = []
        causes = len(self.w["traces"]) <= WORK_RANKS  # operators kept for the cause
        for entry, message in self.w.get("twice") or ():
            used = next((e.path for e in self.w["traces"] if e.rank == entry.rank), None)
            self.places.append(entry.rank, *self.spool.add(self.figures.left_out(
                {"rank": entry.rank, "path": entry.path, "status": entry.status}, used,
                message)))
        for index, entry in enumerate(self.w["traces"]):
            if entry.summary is None:
                pending.append((index, entry))
                continue
            file = os.path.join(root, entry.path) if entry.path else ""
            known: list[bool] = []

            def there(file: str = file, known: list[bool] = known) -> bool:
                if not known:  # resolved only where the summary cannot be used
                    known.append(bool(file) and inside(file, root) and readable(file))
                return known[0]

            found, refused, said = _chosen_summary(entry, self.detail, there, causes)
            for code, message in said:
                self.figures.say(code, f"rank {entry.rank}: {message}", entry.rank)
            if found is not None:
                self.add(entry, index, found)
            elif there():
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
        if self.by_order:
            self.figures.say("ranks_by_order", "no distributedInfo and no rank in the file "
                             "names: these ranks are the traces' places in the folder's "
                             "sorted list", self.by_order)
        # read: where each rank's summary lay is let go (a window of 100,000 ranks holds
        # its figures from here on, not their places in the manifests)
        self.w["traces"] = []

    def _doc_of(self, rank: Any) -> RankEntry | None:
        """Rank ``rank``'s entry (the first written), read back."""
        place = next((p for p in self.places if p[0] == rank), None)
        return None if place is None else RankView(self.spool, [place])[0]

    def _path_of(self, rank: Any) -> Any:
        doc = self._doc_of(rank)
        return None if doc is None else doc.get("path")

    def _work_of(self, rank: int) -> RankWork | None:
        """Rank ``rank``'s figures for a cause, read back from its entry."""
        doc = self._doc_of(rank)
        return None if doc is None or doc.get("error") else work_of(doc, ops=False)

    def finish(self) -> WindowAnalysis:
        w = self.w
        for rank, why in self.calls.unreadable:
            self.figures.say("collectives_unreadable", f"rank {rank}: its collective calls "
                             f"cannot be read: {why}", rank)
        figures = self.figures
        steps = figures.step_times()
        return WindowAnalysis(
            title=describe(w), role=w["role"], region=w["region"], steps=tuple(w["steps"]),
            cycle=w["cycle"], capture=w["capture"], world=w["world"], why=w["why"],
            limits=tuple(w["limits"]), dropped=tuple(w["dropped"]), other=tuple(w["other"]),
            docs=RankView(self.spool, self.places), figures=figures, step_times=steps,
            regions=figures.region_rows(), breakdown=figures.breakdown(),
            gpu_timeline=figures.gpu_timeline(), straggler=figures.straggler(steps),
            readiness=figures.readiness(),
            collectives=self.calls.result(len(steps), own=self._work_of,
                                          others=figures.medians),
            not_analysed=w.get("not_analysed"),
            identity=(w.get("identity") or {}) if self.detail else None)


def analyze_run(root: str, *, role: str | None = None, step: int | None = None,
                jobs: int = 1, max_traces: int | None = None, from_traces: bool = False,
                scan: Scan | None = None, index: Index | None = None,
                detail: bool = False, limits: tuple[int, int] | None = None,
                own_clocks: bool = False) -> RunAnalysis:
    """The analysis of every capture window under ``root`` that ``role`` and ``step``
    choose. AnalysisError when nothing is chosen. ``max_traces``: read whole windows, oldest
    first, while their traces fit in it (the first one always); the others say only why
    they exist, with ``not_analysed`` saying why not more. A trace whose rank summarised
    it (a ``summary`` line in its manifest) is not read, unless ``from_traces``: its
    figures are the summary's, and the trace need not be there. ``scan``: the manifests
    under ``root``, when the caller read them already (or ``index``: what the windows need
    of them, gathered already); ``detail``: each window keeps what
    the comparison of two runs reads (operators, how it was recorded); ``limits``: the
    most text read of one trace and of all (bytes), a trace past them reading as an
    error; ``own_clocks``: the timeline lays each rank on its own clock (the measured
    offsets not applied)."""
    if not os.path.isdir(root):
        raise AnalysisError(f"{root} is not a folder")
    if index is None:
        index = read_index(root, from_traces=from_traces, scan=scan)
    windows, problems, notes = from_manifests(root, from_traces=from_traces, index=index)
    timeline = Timeline(None if own_clocks else index.clocks)
    stalls = read_stalls(root)  # a hung job may have written nothing else
    manifests = bool(windows or problems)
    if not manifests:
        windows, passed_over = from_folders(root)
        problems = problems + passed_over
    if not windows and stalls is None:
        raise AnalysisError(f"no traces under {root} (a policy-engine output folder has "
                            "manifests/*.manifest.jsonl; any other folder, Chrome trace "
                            "files (*.json, *.json.gz) or torch_npu's *_ascend_pt folders)"
                            + (f"; passed over: {'; '.join(problems[:3])}" if problems
                               else ""))
    expected = _expected(windows)
    for w in windows:
        w.pop("holders", None)  # read: each rank's roles (a window of 100,000 ranks)
    windows = _chosen(windows, role, step, root) if windows else []
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
    with _Readers(jobs, limits) as readers:
        for w in windows:
            want = _wanted(expected, w) if manifests else set()
            one = _Window(w, want, spool, manifests=manifests, detail=detail,
                          timeline=timeline, clocks=None if own_clocks else index.clocks)
            one.run(readers, root)
            out.append(one.finish())
    return RunAnalysis(version=VERSION, root=os.path.abspath(root), windows=tuple(out),
                       notes=tuple(notes), problems=tuple(problems), spool=spool,
                       stalls=stalls, timeline=timeline.finish())



def analyze(root: str, **options: Any) -> dict[str, Any]:
    """The document of :func:`analyze_run` (``policy-engine analyze --format json``)."""
    result = analyze_run(root, **options)
    with contextlib.closing(result):
        return result.to_json()
