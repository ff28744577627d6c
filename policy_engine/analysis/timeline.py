"""The step timeline: in each training step, every role's phases on every rank, on one
clock, and who waited for whom.

Each rank's summary lists its phases (analysis/phases.py: the regions its roles marked,
on the rank's own clock); :class:`Timeline` takes them a rank at a time (``add``) as the
run's windows are read, brings each to the job's clock with the rank's measured offset
(analysis/clocks.py), and files them under their training step (a window's steps: a
capture of one step; one of merged steps stays one block, said so). Ranks of one role
whose phases agree (the same phases, each within :func:`_tolerance`) share a row, so that
a step of 100,000 ranks is a few rows, and memory is bounded by :data:`MAX_STEPS`,
:data:`MAX_ROWS` and the phases a summary may list.

:meth:`Timeline.finish` answers, per step (``docs/analysis.md``, "The step timeline"):

- the step's span: from the first phase or recorded moment of any rank to the last;
- per row its phases (start, end, share of the step), and its time **busy** (in its
  phases), **waiting** and **idle**. A row waits where it is in no phase of its own, or
  in the collective or transfer a phase begins or ends with (its ``lead`` and ``tail``),
  while a row of another role is in a phase: that time is attributed to the phase of the
  other role that covers most of it. Time in no phase while no other role is in one is
  idle; a lead or tail while no other role runs is the role's own communication (busy);
- the **critical path**: from the phase that ends last, each phase's predecessor is the
  phase that ended latest before it began (its own row's previous phase, or another
  row's; a phase that begins in a collective begins, for this, when that ends), back to
  the first: the chain of phases that bounds the step;
- the roles that have phases in other steps but none in this one (``missing``): a step
  without a role's capture is named, not guessed.
"""

from __future__ import annotations

from typing import Any, TypedDict

from policy_engine.analysis.clocks import Clocks, ClockStatus
from policy_engine.analysis.format import rank_spans
from policy_engine.analysis.intervals import Merged, Spans, intersect, length
from policy_engine.analysis.summary import RankSummary
from policy_engine.analysis.windows import Window

#: Steps kept (the first in step order); rows per role and step; ranks listed per row.
MAX_STEPS = 1000
MAX_ROWS = 16
MAX_RANKS = 4096
#: Waits listed per step, spells of waiting drawn per row, and phases on a critical path.
MAX_WAITS = 32
MAX_SPELLS = 64
MAX_PATH = 64
#: Waits listed (each row's totals count every wait): from this share of the step, and
#: at least TOL_US.
LISTED_SHARE = 0.005
#: Two ranks' phases agree (share a row) when each starts and ends within this many µs
#: of the other's, or this share of the row's span, or twice their clock's uncertainty.
TOL_US = 1000.0
TOL_SHARE = 0.02


class PhaseBar(TypedDict):
    """A phase of a timeline row (made by :func:`_row_json`); times in µs from the
    step's start."""

    name: str
    start_us: float
    end_us: float
    share: float  # of the step's span
    lead_us: float  # the collective or transfer it begins with
    tail_us: float  # the one it ends with


class WaitSpell(TypedDict):
    """Where a timeline row waits, and for which phase of which role (made by
    :func:`_row_json`); times in µs from the step's start."""

    start_us: float
    end_us: float
    for_role: str
    phase: str


class TimelineRow(TypedDict):
    """Ranks of one role whose phases agree, in one step (made by :func:`_row_json`)."""

    role: str
    ranks: str  # rank spans, "0-3,8"
    rank_count: int
    colocated: bool  # roles sharing the ranks ("actor+rollout")
    span: list[float]  # [start, end] of its ranks' captures, from the step's start
    phases: list[PhaseBar]
    waiting: list[WaitSpell]
    busy_us: float
    wait_us: float
    idle_us: float
    uncertainty_us: float
    implicit: bool  # no region marked: the capture itself is its one phase


class StepWait(TypedDict):
    """One role's ranks waiting for another role's phase in a step (made by
    :meth:`Timeline._step`)."""

    role: str
    ranks: str
    for_role: str
    for_ranks: str
    phase: str
    wait_us: float
    share: float  # of the step's span
    text: str


class CriticalPhase(TypedDict):
    """A phase on a step's critical path (made by :func:`_critical`)."""

    role: str
    ranks: str
    phase: str
    start_us: float
    end_us: float


class TimelineStep(TypedDict):
    """One training step (or a capture of merged steps) laid out (made by
    :meth:`Timeline._step`)."""

    step: int | None  # None: merged steps (``steps`` lists them)
    steps: list[int]
    title: str
    start_us: float  # on the job's clock
    span_us: float
    uncertainty_us: float
    rows: list[TimelineRow]
    waits: list[StepWait]
    critical_path: list[CriticalPhase]
    missing: list[str]  # roles with phases in other steps, none in this one
    notes: list[str]


class TimelineDoc(TypedDict):
    """The step timeline (made by :meth:`Timeline.finish`; the analysis schema's
    ``timeline``)."""

    clock: ClockStatus
    steps: list[TimelineStep]
    notes: list[str]


class _Waiting(TypedDict):
    """A row's waiting in a step (made by :func:`_waits`)."""

    by: dict[tuple[str, str], tuple[float, set[int]]]  # (role, phase) -> (µs, rows)
    spells: list[tuple[float, float, tuple[str, str]]]
    wait: float
    idle: float
    busy: float


def _r(value: float) -> float:
    return round(value, 3)


def _tolerance(lo: float, hi: float, unc: float) -> float:
    return max(TOL_US, TOL_SHARE * (hi - lo), 2.0 * unc)


class _Row:
    """Ranks of one role in one step whose phases agree: one row of the timeline. Times
    are microseconds from the timeline's origin, on the job's clock."""

    __slots__ = ("count", "ends", "hi", "implicit", "label", "leads", "lo", "names",
                 "ranks", "starts", "tails", "unc")

    def __init__(self, label: str, rank: Any, names: tuple[str, ...],
                 times: list[tuple[float, float, float, float]], lo: float, hi: float,
                 unc: float, implicit: bool) -> None:
        self.label = label
        self.ranks: list[Any] = [rank]
        self.count = 1
        self.names = names
        self.starts = [t[0] for t in times]
        self.ends = [t[1] for t in times]
        self.leads = [t[2] for t in times]
        self.tails = [t[3] for t in times]
        self.lo, self.hi, self.unc = lo, hi, unc
        self.implicit = implicit

    def deviation(self, times: list[tuple[float, float, float, float]]) -> float:
        return max((max(abs(a - t[0]), abs(b - t[1]))
                    for a, b, t in zip(self.starts, self.ends, times, strict=True)),
                   default=0.0)

    def join(self, rank: Any, times: list[tuple[float, float, float, float]], lo: float,
             hi: float, unc: float) -> None:
        """One more rank in the row: the row's phases are the envelope of its ranks'."""
        self.count += 1
        if len(self.ranks) < MAX_RANKS:
            self.ranks.append(rank)
        for i, (start, end, lead, tail) in enumerate(times):
            self.starts[i] = min(self.starts[i], start)
            self.ends[i] = max(self.ends[i], end)
            self.leads[i] = max(self.leads[i], lead)
            self.tails[i] = max(self.tails[i], tail)
        self.lo, self.hi, self.unc = min(self.lo, lo), max(self.hi, hi), max(self.unc, unc)

    def phases(self) -> Merged:
        spans = Spans()
        for s, e in sorted(zip(self.starts, self.ends, strict=True)):
            spans.add(s, e)
        return spans.merged()

    def who(self) -> str:
        ranks = rank_spans(self.ranks, sep=",")
        more = f" and {self.count - len(self.ranks)} more" if self.count > len(self.ranks) \
            else ""
        word = "rank" if self.count == 1 else "ranks"
        return f"{word} {ranks}{more} ({self.label})"


class _Step:
    """What a training step (or a capture of merged steps) gathers."""

    __slots__ = ("key", "left_out", "merged", "rows")

    def __init__(self, key: tuple[int, ...]) -> None:
        self.key = key
        self.rows: dict[str, list[_Row]] = {}  # role label -> its rows
        self.left_out = 0  # ranks not drawn: more kinds of rows than MAX_ROWS
        self.merged = len(key) > 1


class Timeline:
    """The step timeline of a run, gathered a rank at a time. ``clocks``: the ranks'
    clock readings (None: each rank's times on its own clock, as they were recorded)."""

    def __init__(self, clocks: Clocks | None) -> None:
        self.clocks = clocks
        self.origin: int | None = None  # µs on the job's clock: every time is from here
        self.steps: dict[tuple[int, ...], _Step] = {}
        self.steps_left_out = 0
        self.ranks: set[int] = set()
        self.unphased = 0  # ranks whose summaries list no phases (an older runtime)
        self.nested = 0

    def add(self, window: Window, rank: Any, summary: RankSummary) -> None:
        """One rank's summary (its figures, checked) in ``window``."""
        steps = tuple(s for s in window.get("steps") or () if isinstance(s, int))
        if not steps or "error" in summary:
            return
        record = summary.get("phases")
        if record is None:
            if "phases" not in summary:
                self.unphased += 1
            return
        step = self.steps.get(steps)
        if step is None:
            if len(self.steps) >= MAX_STEPS:
                self.steps_left_out += 1
                return
            step = self.steps[steps] = _Step(steps)
        if isinstance(rank, int) and len(self.ranks) < 1 << 20:
            self.ranks.add(rank)
        origin: int = record["origin_us"]
        reading = self.clocks.offset(rank, origin / 1e6) if self.clocks is not None else None
        if self.origin is None:
            self.origin = origin + int(reading.offset_us if reading else 0)
        shift = origin - self.origin + (reading.offset_us if reading else 0.0)
        unc = reading.uncertainty_us if reading else 0.0
        names, times = [], []
        for index, start, end, depth, lead, tail in record["rows"]:
            if depth:
                self.nested += 1
                continue
            names.append(record["names"][int(index)])  # an int, checked where read
            times.append((start + shift, end + shift, lead, tail))
        lo, hi = record["span"][0] + shift, record["span"][1] + shift
        implicit = not names
        if implicit:  # no region marked: the capture itself is the role's phase
            names, times = [str(window.get("region") or window["role"])], [(lo, hi, 0.0, 0.0)]
        self._place(step, str(window["role"]), rank, tuple(names), times, lo, hi, unc, implicit)

    @staticmethod
    def _place(step: _Step, label: str, rank: Any, names: tuple[str, ...],
               times: list[tuple[float, float, float, float]], lo: float, hi: float,
               unc: float, implicit: bool) -> None:
        rows = step.rows.setdefault(label, [])
        tol = _tolerance(lo, hi, unc)
        alike = [r for r in rows if r.names == names]
        best = min(alike, key=lambda r: r.deviation(times), default=None)
        if best is not None and (best.deviation(times) <= max(tol, 2.0 * best.unc)
                                 or len(rows) >= MAX_ROWS):
            best.join(rank, times, lo, hi, unc)
        elif len(rows) < MAX_ROWS:
            rows.append(_Row(label, rank, names, times, lo, hi, unc, implicit))
        else:
            step.left_out += 1

    # -- the answers ------------------------------------------------------------------
    def finish(self) -> TimelineDoc:
        """The timeline's JSON object (``schemas/analysis.schema.json``, ``timeline``)."""
        labels: dict[str, set[tuple[int, ...]]] = {}
        for key, step in self.steps.items():
            for label in step.rows:
                labels.setdefault(label, set()).add(key)
        out = [self._step(step, labels) for _key, step in sorted(self.steps.items())]
        clock: ClockStatus = self.clocks.status(self.ranks) if self.clocks is not None else {
            "basis": "own", "reference": None, "channel": [], "unmeasured": "",
            "text": "each rank on its own clock (the measured offsets not applied)"}
        notes = []
        if self.unphased:
            notes.append(f"{self.unphased} rank summaries list no phases (written by an "
                         "older policy-engine): `analyze --from-traces` reads their traces")
        if self.steps_left_out:
            notes.append(f"only the first {MAX_STEPS} steps are laid out; "
                         f"{self.steps_left_out} more rank captures are left out")
        if self.nested:
            notes.append(f"{self.nested} phases inside other phases are not drawn (each "
                         "row shows its outermost phases)")
        return {"clock": clock, "steps": out, "notes": notes}

    def _step(self, step: _Step, labels: dict[str, set[tuple[int, ...]]]) -> TimelineStep:
        rows = [r for label in sorted(step.rows) for r in step.rows[label]]
        lo = min(r.lo for r in rows)
        hi = max(r.hi for r in rows)
        span = max(hi - lo, 0.0)
        name = f"step {step.key[0]}" if len(step.key) == 1 else \
            f"steps {step.key[0]}-{step.key[-1]}"
        waits: list[StepWait] = []
        drawn = []
        busy_of: list[Merged] = [r.phases() for r in rows]
        for i, row in enumerate(rows):
            others = [(j, k) for j, o in enumerate(rows) if o.label != row.label
                      for k in range(len(o.names))]
            found = _waits(row, busy_of[i], rows, others)
            drawn.append(_row_json(row, busy_of[i], found, lo, span))
            for (label, phase), (us, who) in sorted(found["by"].items(),
                                                    key=lambda kv: -kv[1][0]):
                ranks = [r for j in sorted(who) for r in rows[j].ranks]
                them = rank_spans(ranks, sep=",")
                word = "rank" if len(set(ranks)) == 1 else "ranks"
                waits.append({
                    "role": row.label, "ranks": rank_spans(row.ranks, sep=","),
                    "for_role": label, "for_ranks": them, "phase": phase,
                    "wait_us": _r(us), "share": _r(us / span) if span else 0.0,
                    "text": f"{row.who()} wait {100 * us / span if span else 0:.0f}% of "
                            f"{name} ({us / 1000:.1f} ms) while {word} {them} ({label}) "
                            f"run {phase}"})
        waits.sort(key=lambda w: -w["wait_us"])
        floor = max(TOL_US, LISTED_SHARE * span)  # the rows' totals count the rest
        waits = [w for w in waits if w["wait_us"] >= floor]
        notes = []
        if step.merged:
            notes.append(f"{name} are one capture: their phases are laid out together")
        if step.left_out:
            notes.append(f"{step.left_out} ranks are not drawn: their phases differ from "
                         f"every row's, past {MAX_ROWS} rows per role")
        return {
            "step": step.key[0] if len(step.key) == 1 else None, "steps": list(step.key),
            "title": name, "start_us": _r((self.origin or 0) + lo), "span_us": _r(span),
            "uncertainty_us": _r(max(r.unc for r in rows)), "rows": drawn,
            "waits": waits[:MAX_WAITS], "critical_path": _critical(rows, lo),
            "missing": sorted(label for label, keys in labels.items()
                              if step.key not in keys),
            "notes": notes}


def _waits(row: _Row, busy: Merged, rows: list[_Row],
           others: list[tuple[int, int]]) -> _Waiting:
    """A row's waiting: its gaps and its phases' collective edges where another role runs
    a phase, attributed to the one that covers most of each; the rest of its gaps idle."""
    other_spans = Spans()
    for s, e in sorted(_core(rows[j], k) for j, k in others):
        if e > s:
            other_spans.add(s, e)
    running = other_spans.merged()
    gaps = _gaps(busy, row.lo, row.hi)
    edges = []
    for s, e, lead, tail in zip(row.starts, row.ends, row.leads, row.tails, strict=True):
        if lead > 0:
            edges.append((s, min(s + lead, e)))
        if tail > 0 and (lead <= 0 or e - tail > s + lead):
            edges.append((max(e - tail, s), e))
    # each wait goes to the phase (of another role, by name) that covers most of it
    phases: dict[tuple[str, str], list[int]] = {}
    for j, k in others:
        found = phases.setdefault((rows[j].label, rows[j].names[k]), [])
        if j not in found:
            found.append(j)
    by: dict[tuple[str, str], tuple[float, set[int]]] = {}
    spells: list[tuple[float, float, tuple[str, str]]] = []  # where it waits, and for what
    gap_wait = edge_wait = 0.0
    for kind, (s, e) in [("gap", g) for g in gaps] + [("edge", x) for x in edges]:
        pieces = intersect(((s,), (e,)), running)
        covered = length(pieces)
        if covered <= 0:
            continue
        cover = {key: [j for j in js if _overlap(rows[j], key[1], s, e) > 0]
                 for key, js in phases.items()}
        target = max(cover, key=lambda key: _covered(rows, cover[key], key[1], s, e))
        total, who = by.get(target, (0.0, set()))
        by[target] = (total + covered, who | set(cover[target]))
        for lo, hi in zip(*pieces, strict=True):
            if len(spells) < MAX_SPELLS:
                spells.append((lo, hi, target))
        if kind == "gap":
            gap_wait += covered
        else:
            edge_wait += covered
    in_gaps = sum(e - s for s, e in gaps)
    return {"by": by, "spells": spells, "wait": gap_wait + edge_wait,
            "idle": max(in_gaps - gap_wait, 0.0),
            "busy": max(length(busy, row.lo, row.hi) - edge_wait, 0.0)}


def _core(row: _Row, k: int) -> tuple[float, float]:
    """Phase ``k`` of ``row`` less the collective it begins and ends with: where it runs,
    not where it waits itself (one cannot wait for a phase that is waiting)."""
    start, end = row.starts[k], row.ends[k]
    return start + row.leads[k], max(end - row.tails[k], start + row.leads[k])


def _overlap(row: _Row, name: str, s: float, e: float) -> float:
    """How long ``row`` runs phases named ``name`` (their cores) within [s, e)."""
    total = 0.0
    for k, found in enumerate(row.names):
        if found == name:
            lo, hi = _core(row, k)
            total += max(0.0, min(e, hi) - max(s, lo))
    return total


def _covered(rows: list[_Row], which: list[int], name: str, s: float, e: float) -> float:
    """How much of [s, e) the rows ``which`` run phases named ``name`` (their union)."""
    spans = Spans()
    for lo, hi in sorted(_core(rows[j], k) for j in which
                         for k, found in enumerate(rows[j].names) if found == name):
        if hi > lo:
            spans.add(lo, hi)
    return length(intersect(((s,), (e,)), spans.merged()))


def _gaps(busy: Merged, lo: float, hi: float) -> list[tuple[float, float]]:
    """Where ``busy`` leaves [lo, hi) empty."""
    out, at = [], lo
    for s, e in zip(*busy, strict=True):
        if s > at:
            out.append((at, min(s, hi)))
        at = max(at, e)
    if hi > at:
        out.append((at, hi))
    return [(s, e) for s, e in out if e > s]


def _row_json(row: _Row, busy: Merged, found: _Waiting, lo: float,
              span: float) -> TimelineRow:
    phases: list[PhaseBar] = []
    for name, s, e, lead, tail in zip(row.names, row.starts, row.ends, row.leads, row.tails,
                                      strict=True):
        phases.append({"name": name, "start_us": _r(s - lo), "end_us": _r(e - lo),
                       "share": _r((e - s) / span) if span else 0.0,
                       "lead_us": _r(lead), "tail_us": _r(tail)})
    waits: list[WaitSpell] = [{"start_us": _r(s - lo), "end_us": _r(e - lo), "for_role": label,
              "phase": phase} for s, e, (label, phase) in found["spells"]]
    return {"role": row.label, "ranks": rank_spans(row.ranks, sep=","),
            "rank_count": row.count, "colocated": "+" in row.label,
            "span": [_r(row.lo - lo), _r(row.hi - lo)], "phases": phases,
            "waiting": waits, "busy_us": _r(found["busy"]), "wait_us": _r(found["wait"]),
            "idle_us": _r(found["idle"]), "uncertainty_us": _r(row.unc),
            "implicit": row.implicit}


def _critical(rows: list[_Row], lo: float) -> list[CriticalPhase]:
    """The chain of phases that bounds the step, first to last."""
    nodes = [(j, k) for j, r in enumerate(rows) for k in range(len(r.names))]
    if not nodes:
        return []
    cur = max(nodes, key=lambda jk: (rows[jk[0]].ends[jk[1]],
                                     rows[jk[0]].ends[jk[1]] - rows[jk[0]].starts[jk[1]]))
    path = [cur]
    while len(path) < MAX_PATH:
        j, k = cur
        row = rows[j]
        start = _core(row, k)[0]  # a phase that begins waiting depends on what ends then
        # a row's phases are its ranks' envelope, agreeing within this: so may an end
        # precede a start
        tol = _tolerance(row.lo, row.hi, row.unc)
        best: tuple[float, int, tuple[int, int]] | None = None
        if k > 0:
            best = (row.ends[k - 1], 1, (j, k - 1))  # its own row wins a tie
        for jj, other in enumerate(rows):
            if other.label == row.label:  # the role's other ranks run beside it, not before
                continue
            for kk, end in enumerate(other.ends):
                if end <= start + tol and other.starts[kk] < start and \
                        (best is None or (end, 0) > best[:2]):
                    best = (end, 0, (jj, kk))
        if best is None or best[2] in path:
            break
        cur = best[2]
        path.append(cur)
    path.reverse()
    return [{"role": rows[j].label, "ranks": rank_spans(rows[j].ranks, sep=","),
             "phase": rows[j].names[k], "start_us": _r(rows[j].starts[k] - lo),
             "end_us": _r(rows[j].ends[k] - lo)} for j, k in path]


def text(timeline: TimelineDoc) -> list[str]:
    """The timeline as lines of text (``policy-engine timeline``)."""
    lines = [f"clock: {timeline['clock']['text']}"]
    for step in timeline["steps"]:
        lines.append("")
        lines.append(f"{step['title']}: {step['span_us'] / 1000:.1f} ms"
                     + (f" (clock uncertainty up to {step['uncertainty_us'] / 1000:.3f} ms)"
                        if step["uncertainty_us"] else ""))
        for row in step["rows"]:
            word = "rank" if row["rank_count"] == 1 else "ranks"
            phases = ", ".join(f"{p['name']} {p['start_us'] / 1000:.1f}-"
                               f"{p['end_us'] / 1000:.1f} ms ({100 * p['share']:.0f}%)"
                               for p in row["phases"])
            lines.append(f"  {row['role']} {word} {row['ranks']}: {phases}")
            lines.append(f"    busy {row['busy_us'] / 1000:.1f} ms, waiting "
                         f"{row['wait_us'] / 1000:.1f} ms, idle {row['idle_us'] / 1000:.1f} ms")
        for wait in step["waits"]:
            lines.append(f"  waiting: {wait['text']}")
        path = " -> ".join(f"{p['phase']} ({p['role']} {p['ranks']})"
                           for p in step["critical_path"])
        if path:
            lines.append(f"  critical path: {path}")
        for label in step["missing"]:
            lines.append(f"  no capture of {label} in this step")
        lines.extend(f"  note: {n}" for n in step["notes"])
    if not timeline["steps"]:
        lines.append("no training step with phases: the windows hold no captured step, or "
                     "their summaries list no phases")
    lines.extend(f"note: {n}" for n in timeline["notes"])
    return lines


__all__ = ["MAX_ROWS", "MAX_STEPS", "Timeline", "text"]
