"""One window across its ranks: step times, the straggler, and what the window lacks.

The ranks of a window are added one at a time (:class:`Figures`), and only what the
window's figures need is kept of each: a few numbers per rank and step, in arrays, never
the rank's summary. So a window of 100,000 ranks is analysed in tens of megabytes.

**The straggler.** In a step bound by collectives every rank leaves the collective
together, so a rank's time inside collectives is the time it waited for the last one to
arrive, plus the transfer. The rank the others wait for is the one that waits least while
its compute is the longest, and ``median(wait) - its wait`` is how much later than the
median rank it arrived. It needs
no clock shared between hosts: only durations on each rank's own clock.

A step names a straggler when that lateness is at least :data:`LATE_SHARE` of the median
step time (and :data:`LATE_FLOOR_US`), its compute is the longest, and its compute beyond
the median rank's explains at least :data:`EXPLAINED` of the lateness (a rank that was
merely descheduled arrives late with nothing to show for it). A window names one when the
same rank is the straggler in more than half of its steps with collectives.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any, TypedDict, cast

from policy_engine.analysis.device_view import GpuTimeline
from policy_engine.analysis.matching import RankWork
from policy_engine.analysis.step_figures import FIGURES, Figure, FigureRow
from policy_engine.analysis.summary import (
    BASES,
    TIMELINE,
    Facts,
    RankEntry,
    StepRow,
    TimelineFigure,
)
from policy_engine.analysis.windows import USED_FIRST, Window

#: A step's straggler arrives at least this share of the median step time after the
#: median rank...
LATE_SHARE = 0.1
#: ...and at least this many microseconds.
LATE_FLOOR_US = 100.0
#: ...and at least this share of its lateness is compute the median rank does not do.
EXPLAINED = 0.5
#: A rank's last step shorter than this share of its median step is the empty one torch
#: opens at the last ``step()`` call and the capture's end closes at once: not a step of
#: the work (``compare`` takes no sample from it either).
TRAILING = 0.1
#: A rank's totals: each step figure summed over its steps (step_figures.py).
TOTALS = FIGURES
#: Region names, and operator names (for ``compare``), whose times a window gathers;
#: past it (a hostile summary), new names are counted, not kept.
MAX_NAMES = 4096
#: Names of collective kernels HTA does not recognise, listed per window.
MAX_LISTED = 64
#: Distinct reasons a rank could not be read, listed per window (the rest are counted).
MAX_REASONS = 64
#: Each basis a summary names, as one string (a window of 100,000 ranks names one).
_BASES = {basis: basis for basis in BASES}


class RankTotals(FigureRow):
    """A readable rank's totals and its device view over its whole trace (what
    :meth:`Figures.rows` yields)."""

    gpu_timeline: GpuTimeline | None


class _StepStraggler(TypedDict):
    """A step's straggler and how late it arrived (:meth:`_Step.straggler`)."""

    straggler: Any  # its rank, or None: no rank is named
    late_us: float | None


class StepTimes(_StepStraggler):
    """One ProfilerStep across a window's ranks: a row of its ``step_times`` (made by
    :meth:`_Step.figures`); each figure's min, median and max over the ranks."""

    step: int | None
    ranks: int
    time_us: dict[str, float] | None
    comm_us: dict[str, float] | None
    collectives: bool  # some rank spent time in collectives
    gpu_timeline: dict[TimelineFigure, dict[str, float] | None] | None


class RegionRow(TypedDict):
    """A region's time across a window's ranks (made by :meth:`Figures.region_rows`)."""

    name: str
    ranks: int
    time_us: dict[str, float] | None  # min, median and max over the ranks


class Straggler(TypedDict):
    """A window's straggler (made by :meth:`Figures.straggler`)."""

    rank: Any
    steps: list[int | None]  # the steps it is the straggler of
    of_steps: int  # the steps that hold collectives
    late_us: float
    wait_us: float | None  # its own time in collectives
    others_wait_us: dict[str, float] | None


class ReadinessNote(TypedDict):
    """What a window lacks for which analysis (made by :meth:`Figures.readiness`)."""

    code: str
    message: str
    ranks: list[int]


def spread(values: Iterable[float]) -> dict[str, float] | None:
    """min, median and max; None for no values."""
    found = sorted(values)
    if not found:
        return None
    return {"min": found[0], "median": round(statistics.median(found), 3), "max": found[-1]}


def totals(steps: list[StepRow]) -> FigureRow:
    """A rank's steps summed."""
    out = dict.fromkeys(TOTALS, 0.0)
    for row in steps:
        for key in out:
            out[key] += row.get(key) or 0.0
    # a value for each figure (TOTALS)
    return cast(FigureRow, {k: round(v, 3) for k, v in out.items()})


def without_trailing(steps: list[StepRow]) -> list[StepRow]:
    """A rank's steps less an empty last one (:data:`TRAILING`); with fewer than three
    there is no median to tell it by, and all are kept."""
    steps = list(steps)
    if len(steps) >= 3:
        rest = statistics.median(row["time_us"] for row in steps[:-1])
        if steps[-1]["time_us"] < TRAILING * rest:
            steps.pop()
    return steps


def compared_steps(steps: list[StepRow]) -> tuple[list[StepRow], int]:
    """The steps ``compare`` takes its samples from (less the trailing one, and the first
    where there are more: it carries the profiler's start and every first run), and how
    many steps the rank's region and operator totals cover (its steps less the trailing
    one)."""
    steps = without_trailing(steps)
    return (steps[1:] if len(steps) >= 2 else steps), len(steps)


class _Device:
    """The device view of many ranks: each ``gpu_timeline`` figure, one value a rank (NaN
    for a rank without one)."""

    __slots__ = ("columns", "count")

    def __init__(self) -> None:
        self.columns = {key: array("d") for key in TIMELINE}
        self.count = 0

    def add(self, found: GpuTimeline | None) -> None:
        if found is None:
            for key in TIMELINE:
                self.columns[key].append(math.nan)
            return
        self.count += 1
        for key in TIMELINE:
            self.columns[key].append(found[key])

    def get(self, i: int) -> GpuTimeline | None:
        """The ``i``-th rank's figures (None: it has none)."""
        total = self.columns["total_us"][i]
        if math.isnan(total):
            return None
        return cast(GpuTimeline, {key: self.columns[key][i] for key in TIMELINE})  # each

    def spreads(self) -> dict[TimelineFigure, dict[str, float] | None] | None:
        """Each figure's min, median and max across the ranks (None: no device work)."""
        if not self.count:
            return None
        return {key: spread(v for v in self.columns[key] if not math.isnan(v))
                for key in TIMELINE}


class _Step:
    """One ProfilerStep across the ranks: each rank's time, wait and compute in it, and
    its device view."""

    __slots__ = ("comm", "compute", "device", "ranks", "time")

    def __init__(self) -> None:
        self.ranks: list[Any] = []
        self.time, self.comm, self.compute = array("d"), array("d"), array("d")
        self.device = _Device()

    def add(self, rank: Any, row: StepRow) -> None:
        self.ranks.append(rank)
        self.time.append(row["time_us"])
        self.comm.append(row["comm_us"])
        self.compute.append(row["compute_us"])
        self.device.add(row.get("gpu_timeline"))

    def figures(self, step: int | None) -> StepTimes:
        return {"step": step, "ranks": len(self.ranks), "time_us": spread(self.time),
                "comm_us": spread(self.comm), "collectives": max(self.comm) > 0,
                **self.straggler(), "gpu_timeline": self.device.spreads()}

    def straggler(self) -> _StepStraggler:
        """The straggler of this step."""
        waits = self.comm
        if len(self.ranks) < 2 or max(waits) <= 0:
            return {"straggler": None, "late_us": None}
        median_wait = statistics.median(waits)
        least = min(waits)
        first = [i for i, w in enumerate(waits) if w == least]
        if len(first) > 1:
            return {"straggler": None, "late_us": 0.0}
        i = first[0]
        late = round(median_wait - least, 3)
        median_time = statistics.median(self.time)
        # Its own work makes it late: a rank descheduled on a busy host arrives late too,
        # but without the compute to show for it.
        extra = self.compute[i] - statistics.median(self.compute)
        named = (late >= max(LATE_FLOOR_US, LATE_SHARE * median_time)
                 and extra >= EXPLAINED * late and self.compute[i] >= max(self.compute))
        return {"straggler": self.ranks[i] if named else None, "late_us": late}


class _Compared:
    """What ``compare`` reads of a window: one sample per step (the median over the ranks
    of their n-th step), the mean step and its parts over every (rank, step), each rank's
    mean step, and each region's and operator's time per step."""

    __slots__ = ("basis", "columns", "names_left_out", "no_steps", "ops", "rank_means",
                 "ranks", "regions", "rows", "sums")

    def __init__(self) -> None:
        self.columns: list[array[float]] = []
        self.sums = dict.fromkeys(("span_us", "compute_us", "exposed_comm_us", "other_us",
                                   "idle_us"), 0.0)
        self.rows = 0
        self.ranks = 0
        self.rank_means: dict[Any, float] = {}
        self.regions: dict[tuple[str, str], float] = {}
        self.ops: dict[tuple[str, str], float] = {}
        self.names_left_out = 0
        self.basis: set[str] = set()
        self.no_steps: list[Any] = []

    def add(self, doc: RankEntry) -> None:
        steps, counted = compared_steps(doc["steps"])
        if not steps:
            self.no_steps.append(doc["rank"])
            return
        self.ranks += 1
        self.basis.add(str(doc.get("basis")))
        for i, row in enumerate(steps):
            if i == len(self.columns):
                self.columns.append(array("d"))
            self.columns[i].append(row["time_us"])
            sums = self.sums
            sums["span_us"] += row["span_us"]
            sums["compute_us"] += row["compute_us"]
            sums["exposed_comm_us"] += row["comm_us"] - row["overlap_us"]
            sums["other_us"] += row["other_us"]
            sums["idle_us"] += row["idle_us"]
        self.rows += len(steps)
        self.rank_means[doc["rank"]] = statistics.fmean(row["time_us"] for row in steps)
        per = max(counted, 1)
        for name, region in (doc.get("regions") or {}).items():
            self._name(self.regions, (name, "region"), region["time_us"] / per)
        ops = doc.get("ops")
        for op in (ops.get("top") if ops else None) or ():
            self._name(self.ops, (op["name"], op["cat"]), op["time_us"] / per)

    def _name(self, into: dict[tuple[str, str], float], key: tuple[str, str],
              value: float) -> None:
        if key in into:
            into[key] += value
        elif len(into) < MAX_NAMES:
            into[key] = value
        else:
            self.names_left_out += 1

    def samples(self) -> list[float]:
        return [statistics.median(column) for column in self.columns]

    def means(self) -> dict[str, float]:
        if not self.rows:
            return {}
        return {k: v / self.rows for k, v in self.sums.items()}

    def per_step(self, which: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
        return {k: v / max(self.ranks, 1) for k, v in which.items()}


class Figures:
    """The figures of one window, gathered one rank at a time (:meth:`add`), then
    :meth:`finish`. ``detail``: also what ``compare`` reads (:class:`_Compared`)."""

    def __init__(self, window: Window, expected: Collection[int], *,
                 detail: bool) -> None:
        self.window: Window | None = window  # None once lightened
        self.expected = expected
        self.steps: dict[Any, _Step] = {}
        self.regions: dict[str, array[float]] = {}
        self.regions_left_out = 0
        # each readable rank: its rank, basis and totals (text rows, bars, the straggler)
        self.ranks: list[Any] = []
        self.basis: list[str] = []
        self.columns = {key: array("d") for key in TOTALS}
        self.device = _Device()  # each rank's gpu_timeline over its whole trace
        self.count = 0  # ranks added, readable or not
        self.unreadable: dict[str, list[Any]] = {}
        self.reasons_left_out = 0
        self.seen: set[Any] = set()  # ranks analysed (their paths: path_of, when needed)
        #: the path of a rank's trace analysed, read back (where a second one turns up)
        self.path_of: Callable[[Any], Any] = lambda rank: None
        self.times: dict[Any, int] = {}  # rank -> its traces, where it has several
        self.twice: list[tuple[Any, str]] = []  # ranks left out, and what is said of them
        self.said: list[tuple[str, str, Iterable[Any]]] = []  # (code, message, ranks)
        self.no_steps: list[Any] = []
        self.no_info: list[Any] = []
        self.any_kernels = False
        self.any_comm = False
        self.missed: set[str] = set()
        self.missed_ranks: list[Any] = []
        self.looks: set[str] = set()
        self.silent: list[Any] = []
        self.compared = _Compared() if detail else None

    # -- adding ranks ----------------------------------------------------------------

    def add(self, doc: RankEntry) -> RankEntry:
        """A rank of the window: ``doc`` is its summary with ``rank``, ``path`` and
        ``status``, or with ``error`` saying why it has none. Returns it as the window's
        ``ranks`` list shows it (``total`` added, or ``error`` for a rank seen before)."""
        rank = doc["rank"]
        if doc.get("error"):
            self.count += 1
            self._unreadable(str(doc["error"]), rank)
            return doc
        if isinstance(rank, int):
            if rank in self.seen:  # a folder whose traces name the same rank
                used = self.path_of(rank)
                count = self.times[rank] = self.times.get(rank, 1) + 1
                return self.left_out(doc, used, f"rank {rank} has {count} traces in this "
                                     f"window: {used} is used ({USED_FIRST}); "
                                     f"{doc.get('path')} is left out of every figure")
            self.seen.add(rank)
        self.count += 1
        steps = doc["steps"]
        total = doc["total"] = totals(steps)
        self.ranks.append(rank)
        self.basis.append(_BASES.get(doc["basis"], doc["basis"]))  # each held once
        for key in TOTALS:
            self.columns[key].append(total[key])
        for row in without_trailing(steps):
            step = self.steps.get(row["step"])
            if step is None:
                step = self.steps[row["step"]] = _Step()
            step.add(rank, row)
        for name, region in (doc.get("regions") or {}).items():
            found = self.regions.get(name)
            if found is None:
                if len(self.regions) >= MAX_NAMES:
                    self.regions_left_out += 1
                    continue
                found = self.regions[name] = array("d")
            found.append(region["time_us"])
        self.device.add(doc.get("gpu_timeline"))
        self._facts(rank, doc["facts"])
        if self.compared is not None:
            self.compared.add(doc)
        return doc

    def left_out(self, doc: RankEntry, used: Any, message: str) -> RankEntry:
        """A trace of a rank whose other trace ``used`` is analysed instead: said in the
        readiness (``message``), in no figure. Returns its entry in ``ranks``."""
        self.count += 1
        rank = doc["rank"]
        self.twice.append((rank, message))
        return {"rank": rank, "path": doc.get("path"), "status": doc.get("status"),
                "error": f"another trace of rank {rank} in this window is used instead: "
                         f"{used} ({USED_FIRST})"}

    def say(self, code: str, message: str, ranks: Any) -> None:
        """Something the window's readiness says of a rank, or a list of them (``code``:
        its kind)."""
        self.said.append((code, message, ranks if isinstance(ranks, list) else [ranks]))

    def _unreadable(self, why: str, rank: Any) -> None:
        found = self.unreadable.get(why)
        if found is not None:
            found.append(rank)
        elif len(self.unreadable) < MAX_REASONS:
            self.unreadable[why] = [rank]
        else:
            self.reasons_left_out += 1

    def _facts(self, rank: Any, facts: Facts) -> None:
        if not facts["profiler_steps"]:
            self.no_steps.append(rank)
        if facts["kernels"]:
            self.any_kernels = True
        if facts["kernels"] or facts["cpu_comm_ops"]:
            self.any_comm = True
        if not facts["distributed_info"]:
            self.no_info.append(rank)
        if facts["hta_unrecognised"]:
            self.missed_ranks.append(rank)
            for name in facts["hta_unrecognised"]:
                if len(self.missed) < MAX_LISTED:
                    self.missed.add(name)
        if facts["kernels"] and facts["cpu_comm_ops"] and not facts["comm_kernels"]:
            self.silent.append(rank)
            for name in facts["looks_like_comm"]:
                if len(self.looks) < MAX_LISTED:
                    self.looks.add(name)

    # -- the window's figures ----------------------------------------------------------

    def lighten(self) -> None:
        """Keep only what the comparison of two runs reads (``compared``, the ranks and
        why any were unreadable), once the window's figures are finished."""
        self.window = None
        self.steps, self.regions = {}, {}
        self.seen = set()
        self.basis = []
        self.columns = {key: array("d") for key in TOTALS}
        self.device = _Device()

    def medians(self) -> RankWork:
        """The ranks' median region times and device idle time (what one rank's figures
        are held against, where the window is too large to keep each rank's)."""
        idle = [v for v in self.device.columns["idle_us"] if not math.isnan(v)]
        return RankWork(regions={name: statistics.median(times)
                                 for name, times in self.regions.items()},
                        idle_us=statistics.median(idle) if idle else None)

    def rows(self, *, by_rank: bool = False) -> Iterator[tuple[Any, str, RankTotals]]:
        """(rank, basis, totals) of every readable rank, in the order added (``by_rank``:
        in rank order, ranks that are no number last); the totals hold the rank's device
        view too (``gpu_timeline``, None without one)."""
        ranks = self.ranks
        order: Iterable[int] = range(len(ranks))
        if by_rank:
            order = sorted(order, key=lambda i: (not isinstance(ranks[i], int),
                                                 ranks[i] or 0))
        for i in order:
            rank = ranks[i]
            # a value for each figure (TOTALS), then its device view
            totals = cast(RankTotals, {k: self.columns[k][i] for k in TOTALS})
            totals["gpu_timeline"] = self.device.get(i)
            yield rank, self.basis[i], totals

    # The window's figures, once every rank is added: what a WindowAnalysis holds.

    def step_times(self) -> list[StepTimes]:
        """Each ProfilerStep across the ranks, in step order (the whole trace last)."""
        return [self.steps[s].figures(s) for s in
                sorted(self.steps, key=lambda s: (s is None, s if s is not None else 0))]

    def breakdown(self) -> dict[Figure, dict[str, float] | None] | None:
        """Each figure of the ranks' totals spread across the ranks (None: no rank)."""
        return {key: spread(self.columns[key]) for key in TOTALS} if self.ranks else None

    def gpu_timeline(self) -> dict[TimelineFigure, dict[str, float] | None] | None:
        """The device view of the ranks' whole traces, spread across the ranks."""
        return self.device.spreads()

    def region_rows(self) -> list[RegionRow]:
        medians = {name: statistics.median(t) for name, t in self.regions.items()}
        order = sorted(medians, key=lambda name: (-medians[name], name))[:16]
        return [{"name": name, "ranks": len(self.regions[name]),
                 "time_us": spread(self.regions[name])} for name in order]

    def straggler(self, steps: list[StepTimes]) -> Straggler | None:
        """The window's straggler: the same rank in more than half of the steps that hold
        collectives, with how late it arrives and how long it and the others wait."""
        bound = [s for s in steps if s["collectives"]]
        named = [s["straggler"] for s in bound if s["straggler"] is not None]
        if not bound or not named:
            return None
        rank = statistics.mode(named)
        mine = [s for s in bound if s["straggler"] == rank]
        if 2 * len(mine) <= len(bound):
            return None
        waits = self.columns["comm_us"]
        own = [w for r, w in zip(self.ranks, waits, strict=True) if r == rank]
        others = [w for r, w in zip(self.ranks, waits, strict=True) if r != rank]
        return {"rank": rank, "steps": [s["step"] for s in mine], "of_steps": len(bound),
                # a step that names a straggler says how late it was
                "late_us": round(statistics.median(cast(float, s["late_us"]) for s in mine), 3),
                "wait_us": own[-1] if own else None, "others_wait_us": spread(others)}

    def readiness(self) -> list[ReadinessNote]:
        """What the window lacks for which analysis, said plainly."""
        out: list[ReadinessNote] = []

        def add(code: str, message: str, who: Iterable[Any] = ()) -> None:
            out.append({"code": code, "message": message, "ranks": sorted(
                {r for r in who if isinstance(r, int)})})

        window = self.window
        if window is not None and window.get("not_analysed"):
            return out
        present = {r for r in self.ranks if isinstance(r, int)}
        missing = [r for r in self.expected if r not in present]
        missing.sort()
        if missing:
            add("ranks_missing", f"{len(missing)} rank(s) that record this role have no "
                "readable trace in this window: they are left out of every comparison",
                missing)
        for code, message, ranks in self.said:  # what reading the window's ranks showed
            add(code, message, ranks)
        for rank, message in self.twice:
            add("duplicate_rank", message, [rank])
        for why, ranks in self.unreadable.items():
            if len(ranks) == 1:
                add("unreadable", f"the trace of rank {ranks[0]} cannot be read: {why}",
                    ranks)
            else:
                add("unreadable", f"the traces of {len(ranks)} ranks cannot be read: {why}",
                    ranks)
        if self.reasons_left_out:
            add("unreadable", f"{self.reasons_left_out} more rank(s) cannot be read, for "
                f"reasons beyond the first {MAX_REASONS}")
        if not self.ranks:
            if not self.count and window is not None and window.get("other"):
                kinds = sorted({str(o.get("backend")) for o in window["other"]})
                add("no_torch_traces", f"no torch trace in this window (only "
                    f"{', '.join(kinds)} files): nothing to analyse here")
            return out
        if len(self.ranks) == 1:
            add("single_rank", "one rank only: nothing to compare it with, no straggler")
        if self.no_steps:
            add("no_profiler_steps", "no ProfilerStep rows: step time is the whole trace; "
                "per-step comparison and HTA's per-iteration analyses (straggler, critical "
                "path) need them (call prof.step() in the loop)", self.no_steps)
        if not self.any_kernels:
            add("no_kernels", "no GPU kernels (CPU-only traces): time is measured on the "
                "CPU, with no idle GPU gaps; HTA's temporal breakdown and "
                "communication/computation overlap need kernels (its temporal breakdown "
                "raises IndexError here)")
        if self.no_info:
            add("no_distributed_info", "no distributedInfo: HTA reads each trace's rank "
                "from it and cannot tell these traces apart (on-demand traces often lack "
                "it)", self.no_info)
        if self.missed:
            missed = sorted(self.missed)
            add("collective_kernels_unrecognised", "collective kernels that HTA does not "
                f"count as communication (it expects ^nccl.*Kernel): {', '.join(missed[:5])}",
                self.missed_ranks)
        if self.silent:
            names = sorted(self.looks)
            add("collective_kernels_unrecognised", "collectives run on the CPU but no GPU "
                "kernel is recognised as one (kernels named nccl*, hccl*, rccl*)"
                + (f"; kernels that look like collectives: {', '.join(names[:5])}" if names
                   else ""), self.silent)
        if not self.any_comm and len(self.ranks) > 1:
            add("no_collectives", "no collective in any rank's trace: no rank waits for "
                "another, so there is no straggler to name")
        return out
