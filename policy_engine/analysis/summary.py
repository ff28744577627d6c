"""One rank's trace, summed up: where each step's time went, seen two ways.

:func:`summarize` streams a torch Chrome trace once (through the one trace reader) and
returns a small JSON-ready summary (docs/analysis.md's definitions table names each
figure and its name in TraceLens, HTA and msprof-analyze):

- **the step view**, per ``ProfilerStep#N``: its wall time on the host, and what the
  device did within that time: compute, communication, both at once (overlap), other
  device work (memory copies) and idle, which sum to it. Idle here is the device waiting
  while the host works: what says a step is host-bound. Without kernels (a CPU trace) the
  host's operators are the work (c10d, gloo, nccl and hccl operators and ranges are
  communication, other operators compute).
- **the device view** (:mod:`~policy_engine.analysis.device_view`), per step and for the
  trace: TraceLens's ``gpu_timeline`` over the kernels each step launched, in its
  device-side window, and HTA's temporal breakdown and overlap.

Also its region ranges, its operators by time, its collective calls
(:mod:`~policy_engine.analysis.collectives`) and the facts the readiness checks need.
This runs in a worker process; memory holds merged intervals and a few numbers per
device event, never the events.
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, cast, get_args

from policy_engine.analysis import phases as _phases
from policy_engine.analysis.ascend import Overlap
from policy_engine.analysis.chrome_trace import TraceError, TraceEvent, TraceReader
from policy_engine.analysis.collectives import Collectives
from policy_engine.analysis.device_view import DeviceView, GpuTimeline, HtaBreakdown
from policy_engine.analysis.intervals import (
    EMPTY,
    Merged,
    Spans,
    bounds,
    breakdown,
    intersect,
    union,
)
from policy_engine.analysis.step_figures import FIGURES, FigureRow

STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)$")
#: A step number has at most this many digits (any count of steps fits in 64 bits); a
#: longer one makes the trace unreadable, not an integer of thousands of digits.
STEP_DIGITS = 18
#: CPU operators and ranges that are collectives (torch's c10d ops, the ranges the
#: process group backends record, and the one c10d wraps every collective in).
CPU_COMM = re.compile(r"(c10d::|c10d_functional::|_c10d_functional::|gloo:|nccl:|hccl|"
                      r"record_param_comms|ProcessGroup)", re.IGNORECASE)
#: GPU kernels that are collectives.
KERNEL_COMM = re.compile(r"(nccl|hccl|rccl)", re.IGNORECASE)
#: The kernels Holistic Trace Analysis counts as communication (its own pattern).
HTA_COMM = re.compile(r"^nccl.*Kernel")
#: Kernel names that look like a collective though no pattern above takes them.
LOOKS_COMM = re.compile(r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
                        r"broadcast|cross_device)", re.IGNORECASE)
CPU_WORK = frozenset({"cpu_op", "cuda_runtime", "cuda_driver"})
DEVICE_OTHER = frozenset({"gpu_memcpy", "gpu_memset"})
#: Region names kept per trace (the ones with the most time are shown).
MAX_REGIONS = 256
TOP_REGIONS = 16
#: Operator and kernel names timed per trace (past it, new names are counted only), and
#: those kept in the summary: the ones with the most time.
MAX_OPS = 4096
TOP_OPS = 48
#: ProfilerSteps a summary lists: the first ones (by start); the rest are counted
#: (``facts.steps_left_out``), so that a capture of 400,000 steps has a summary of a size
#: a manifest line holds.
MAX_SUMMARY_STEPS = 1000
MAX_NAMES = 5
#: A gzipped trace inflating past this many times its size is no trace (torch's: 10-20).
MAX_RATIO = 100
_HUGE = 1e18  # microseconds: 30,000 years; beyond it a timestamp is garbage


#: What an event is, decided once per (category, name): most names repeat thousands of
#: times in a trace, so the patterns above run once per name, not once per event.
_SKIP, _OPS, _COMM, _K_COMP, _K_COMM, _K_OTHER, _REGION, _STEP = range(8)
#: Names remembered per trace; past it (a hostile trace), events are classified afresh.
MAX_KINDS = 65536
_NUMBER = (int, float)


class _StepRowBase(FigureRow):
    """A step row's number and figures (made by :func:`summarize`)."""

    step: int | None  # N of ProfilerStep#N; None: the whole trace, which has none


class StepRow(_StepRowBase, total=False):
    """One ``ProfilerStep`` of a rank: a row of a summary's ``steps`` (made by
    :func:`summarize` and ``npu_summary.summarize_npu``)."""

    gpu_timeline: GpuTimeline | None  # the step's device view; absent on a CPU trace


class RegionTime(TypedDict):
    """A region's calls and time in one trace: a value of a summary's ``regions`` (made by
    :func:`summarize`)."""

    count: int
    time_us: float


class OpRow(TypedDict):
    """An operator or kernel name's calls and time: a row of a summary's ``ops.top`` (made
    by :func:`summarize`)."""

    cat: str
    name: str
    calls: int
    time_us: float  # inside its calls, nested calls included


class OpsTable(TypedDict):
    """A summary's ``ops`` (made by :func:`summarize`): the names with the most time, and
    how many were not timed."""

    top: list[OpRow]
    left_out: int  # calls of names past MAX_OPS (or the trimmed rows' count)


class DistributedInfo(TypedDict):
    """What a trace's ``distributedInfo`` says of its rank (made by :func:`_distributed`;
    values as the trace has them: checked where they are used)."""

    rank: Any
    world_size: Any
    backend: Any


class _FactsBase(TypedDict):
    """The counts and names every summary's ``facts`` holds (made by :func:`summarize`)."""

    events: int
    profiler_steps: int  # ProfilerStep rows in the trace, listed or not
    kernels: int  # device events (an NPU's tasks)
    comm_kernels: int
    cpu_comm_ops: int
    distributed_info: DistributedInfo | None
    hta_unrecognised: list[str]  # collective kernels HTA does not count as communication
    looks_like_comm: list[str]  # kernels no pattern takes that look like collectives
    regions_left_out: int


class Facts(_FactsBase, total=False):
    """A summary's ``facts``: what the readiness checks need (made by :func:`summarize`)."""

    steps_left_out: int  # ProfilerStep rows past the steps listed


class AscendFigures(TypedDict):
    """An NPU summary's ``ascend`` (made by ``npu_summary.summarize_npu``): msprof's
    figures, ours and its Overlap Analysis lanes read back."""

    overlap: Overlap | None
    lanes: Overlap | None


class RankSummary(TypedDict, total=False):
    """One rank's trace summed up: what :func:`summarize` returns (and a manifest's
    ``summary`` line holds); only ``error`` when the trace cannot be read, else the rest
    (``ascend`` an NPU's only; one read back may lack ``ops`` and ``phases``)."""

    error: str
    bytes: int | None  # the trace file's size (None or absent in one read back)
    basis: str  # one of BASES
    steps: list[StepRow]
    gpu_timeline: GpuTimeline | None
    hta: HtaBreakdown | None
    device_error: str | None  # why the device view gave up (its figures None)
    ascend: AscendFigures  # an NPU's summary only
    # collective_form's record (Collectives.result; read from a manifest, it is checked
    # where it is read: window_calls); in a window's rank entry, its digest
    collectives: Any
    regions: dict[str, RegionTime]
    phases: _phases.PhasesRecord | None  # what phases.Phases.result makes
    ops: OpsTable
    facts: Facts


class RankEntry(RankSummary, total=False):
    """A rank of a window as its ``ranks`` list shows it: its summary (or ``error``) with
    where it came from (made by run.py's window, ``window.Figures.add`` and
    ``window.Figures.left_out``)."""

    rank: Any  # its rank; where none is known, its trace's place in the folder
    path: str | None
    status: Any  # its manifest's capture status, as recorded
    rank_from: str  # without manifests: "distributedInfo", "name" or "order"
    total: FigureRow  # its steps summed (:func:`totals`)


def _kind(cat: str, name: str) -> int:
    if cat == "kernel":
        return _K_COMM if KERNEL_COMM.match(name) else _K_COMP
    if cat in DEVICE_OTHER:
        return _K_OTHER
    if cat in CPU_WORK or cat == "user_annotation":
        if STEP.match(name):
            return _STEP
        if CPU_COMM.match(name):
            return _COMM
        return _REGION if cat == "user_annotation" else _OPS
    return _SKIP


class _BadEvent(ValueError):
    """An event that makes the whole trace unreadable."""


class _Pass:
    """What one pass over the events gathers."""

    def __init__(self) -> None:
        self.ops, self.comm = Spans(), Spans()
        self.k_comp, self.k_comm, self.k_other = Spans(), Spans(), Spans()
        # spans by kind (the first, for _SKIP, is never added to)
        self.spans = (Spans(), self.ops, self.comm, self.k_comp, self.k_comm, self.k_other)
        self.kinds: dict[tuple[str, str], int] = {}
        # The first MAX_SUMMARY_STEPS steps by start, then by order in the trace, as a heap
        # of (-start, -order, number, end); how many there were.
        self.steps: list[tuple[float, int, int, float]] = []
        self.step_count = 0
        self.regions: dict[str, list[float]] = {}
        self.regions_left_out = 0
        self.hta_missed: set[str] = set()
        self.looks_comm: set[str] = set()
        # (category, name) -> [calls, total µs] of operators and kernels
        self.names: dict[tuple[str, str], list[float]] = {}
        self.names_left_out = 0

    def event(self, e: TraceEvent) -> None:
        if e.get("ph") != "X":
            return
        ts: Any = e.get("ts")
        dur: Any = e.get("dur")
        if type(ts) not in _NUMBER or type(dur) not in _NUMBER \
                or not (0 <= dur < _HUGE and -_HUGE < ts < _HUGE):  # no inf, no NaN
            return
        cat, name = e.get("cat"), e.get("name")
        key = (cat if type(cat) is str else "", name if type(name) is str else "")
        kind = self.kinds.get(key)
        if kind is None:
            kind = self._first(*key)
        if kind <= _K_OTHER:
            if kind:
                self.spans[kind].add(ts, ts + dur)
                timed = self.names.get(key)
                if timed is not None:
                    timed[0] += 1
                    timed[1] += dur
                elif len(self.names) < MAX_OPS:
                    self.names[key] = [1, dur]
                else:
                    self.names_left_out += 1
        elif kind == _REGION:
            self._region(key[1], dur)
        else:
            found = STEP.match(key[1])
            assert found is not None  # _kind matched it
            digits = found.group(1)
            if len(digits) > STEP_DIGITS:
                raise _BadEvent(f"a ProfilerStep row's step number has {len(digits)} digits "
                                f"(at most {STEP_DIGITS})")
            self.step_count += 1
            step = (-ts, -self.step_count, int(digits), ts + dur)
            if len(self.steps) < MAX_SUMMARY_STEPS:
                heapq.heappush(self.steps, step)
            elif step > self.steps[0]:  # starts before the latest one kept
                heapq.heapreplace(self.steps, step)

    def listed(self) -> list[tuple[int, float, float]]:
        """The steps kept, as (number, start, end), by start."""
        return [(n, -start, end) for start, _, n, end in sorted(self.steps, reverse=True)]

    def _first(self, cat: str, name: str) -> int:
        """The kind of a (category, name) not seen before; notes names for readiness."""
        kind = _kind(cat, name)
        if kind == _K_COMM and not HTA_COMM.match(name) and len(self.hta_missed) < MAX_NAMES:
            self.hta_missed.add(name)
        if kind == _K_COMP and LOOKS_COMM.search(name) and len(self.looks_comm) < MAX_NAMES:
            self.looks_comm.add(name)
        if len(self.kinds) < MAX_KINDS:
            self.kinds[(cat, name)] = kind
        return kind

    def _region(self, name: str, dur: float) -> None:
        found = self.regions.get(name)
        if found is None:
            if len(self.regions) >= MAX_REGIONS:
                self.regions_left_out += 1
                return
            found = self.regions[name] = [0, 0.0]
        found[0] += 1
        found[1] += dur


def _r(value: float) -> float:
    return round(value, 3)


def _steps(steps: list[tuple[int, float, float]], parts: tuple[Merged, Merged, Merged],
           device: dict[int | None, GpuTimeline | None]) -> list[StepRow]:
    """Each ProfilerStep's step view (its wall time on the host, and what the device, or
    on the CPU the host's operators, did within it) and its device view (``device``: the
    step's ``gpu_timeline`` by its number); one step (None) for the whole trace when
    there is no ProfilerStep row."""
    compute, comm, other = parts
    if not steps:
        whole = bounds(union(compute, comm, other))
        if whole is None:
            return []
        # breakdown() gives the other figures (span_us to idle_us: intervals.py)
        row = cast(StepRow, {"step": None, "time_us": _r(whole[1] - whole[0]),
                             **breakdown(compute, comm, other, *whole)})
        if device:
            row["gpu_timeline"] = device.get(None)
        return [row]
    rows = []
    joint = (intersect(compute, comm), union(compute, comm, other))  # once, not per step
    for number, start, end in sorted(steps, key=lambda s: s[1]):
        row = cast(StepRow, {"step": number, "time_us": _r(end - start),  # as above
                             **breakdown(compute, comm, other, start, end, joint)})
        if device:
            row["gpu_timeline"] = device.get(number)
        rows.append(row)
    return rows


def _distributed(meta: Mapping[str, Any]) -> DistributedInfo | None:
    info = meta.get("distributedInfo")
    if not isinstance(info, dict):
        return None
    return {"rank": info.get("rank"), "world_size": info.get("world_size"),
            "backend": info.get("backend")}


def summarize(path: str, *, max_bytes: int | None = None) -> RankSummary:
    """The summary of the trace at ``path``; ``{"error": ...}`` when it cannot be read
    (or holds more than ``max_bytes`` of text).
    An Ascend capture (a ``*_ascend_pt`` folder, or its ``trace_view.json``) is read by
    :func:`~policy_engine.analysis.npu_summary.summarize_npu`."""
    if os.path.isdir(path) or os.path.basename(path) == "trace_view.json":
        from policy_engine.analysis.npu_summary import summarize_npu

        # the same document, made there (npu_summary cannot import this module's shapes:
        # this module imports it)
        return cast(RankSummary, summarize_npu(path, max_bytes=max_bytes))
    p, view, calls, phases = _Pass(), DeviceView(), Collectives(), _phases.Phases()
    try:
        size = os.path.getsize(path)
        with TraceReader(path, max_bytes=max_bytes, max_ratio=MAX_RATIO) as reader:
            try:
                for event in reader.events():
                    p.event(event)
                    view.event(event)
                    calls.event(event)
                    phases.event(event)
            except _BadEvent as err:
                return {"error": f"{err}, at event {reader.count} of traceEvents"}
            meta, count = reader.meta, reader.count
    except TraceError as err:
        return {"error": str(err)}
    except OSError as err:
        return {"error": f"cannot read it: {err.strerror or err}"}
    kernels = p.k_comp.count + p.k_comm.count
    gpu = kernels > 0
    found = view.result()
    del view  # its events, before the step view's are merged
    if gpu:
        parts = (p.k_comp.merged(), p.k_comm.merged(), p.k_other.merged())
    else:
        parts = (p.ops.merged(), p.comm.merged(), EMPTY)
    device_steps: dict[int | None, GpuTimeline | None] = {
        row["step"]: row["gpu_timeline"] for row in found["steps"]} if gpu else {}
    if gpu and not p.steps:  # the trace is one step: its device view is the trace's
        device_steps[None] = found["gpu_timeline"]
    steps = _steps(p.listed(), parts, device_steps)
    regions = sorted(p.regions.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP_REGIONS]
    ops = sorted(p.names.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP_OPS]
    facts: Facts = {
        "events": count,
        "profiler_steps": p.step_count,
        "kernels": kernels,
        "comm_kernels": p.k_comm.count,
        "cpu_comm_ops": p.comm.count,
        "distributed_info": _distributed(meta),
        "hta_unrecognised": sorted(p.hta_missed),
        "looks_like_comm": sorted(p.looks_comm),
        "regions_left_out": p.regions_left_out,
    }
    if p.step_count > len(steps):
        facts["steps_left_out"] = p.step_count - len(steps)
    return {
        "bytes": size,
        "basis": "gpu" if gpu else "cpu",
        "steps": steps,
        "gpu_timeline": found["gpu_timeline"] if gpu else None,
        "hta": found["hta"] if gpu else None,
        "device_error": found["error"] if gpu else None,
        "collectives": calls.result(meta),
        "regions": {name: {"count": int(n), "time_us": _r(t)} for name, (n, t) in regions},
        "phases": phases.result(meta),
        # time inside each call, nested calls included (a stream keeps no stack)
        "ops": {"top": [{"cat": cat, "name": name, "calls": int(n), "time_us": _r(t)}
                        for (cat, name), (n, t) in ops],
                "left_out": p.names_left_out},
        "facts": facts,
    }


# -- a summary read back from a manifest ------------------------------------------------

_STEP_KEYS = FIGURES  # each a number from 0 (step_figures.py declares them)
#: The parts of a step that lie within its span (its ``time_us`` is the host's own).
_SPAN_PARTS = tuple(k for k in FIGURES if k not in ("time_us", "span_us"))
_COUNTS = ("events", "profiler_steps", "kernels", "comm_kernels", "cpu_comm_ops",
           "regions_left_out")
#: A summary read from a manifest holds at most this many steps and names.
MAX_STEPS = 100_000
#: Rounding the figures may carry (they are written to the nanosecond): a part may pass
#: its span by this much, in microseconds, plus a millionth of the span.
_SLACK = 0.01
_INT, _FLOAT = int, float


def _number(v: Any) -> bool:
    """A figure: a finite number, not negative, below :data:`_HUGE`."""
    t = type(v)
    return (t is _FLOAT or t is _INT) and 0 <= v < _HUGE


def _negative(v: Any) -> bool:
    """A number below zero (a figure that cannot be a time)."""
    t = type(v)
    return (t is _FLOAT or t is _INT) and -_HUGE < v < 0


def _count(v: Any) -> bool:
    return type(v) is _INT and 0 <= v < 1 << 63


def _names(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= MAX_STEPS and all(isinstance(x, str) for x in v)


def _step_problem(i: int, row: Any, cpu: bool) -> str | None:
    if type(row) is not dict:
        return f"step {i} is not an object"
    for key in _STEP_KEYS:
        value = row.get(key)
        if not _number(value):
            if _negative(value):
                return f"step {i}'s time is negative" if key == "time_us" else \
                    f"step {i}: a figure is negative"
            return f"step {i} lacks a figure"
    number = row.get("step")
    if number is not None and not _count(number):
        return f"step {i} has no step number"
    if cpu and abs(row["time_us"] - row["span_us"]) > _SLACK:
        return f"step {i}'s time is not its span (on the CPU they are one range)"
    why = _parts_problem(row, row["span_us"])
    return None if why is None else f"step {i}: {why}"


def _parts_problem(row: Any, span: float) -> str | None:
    """Why a breakdown (a step's, or the device's over ``span``) is not one
    :func:`_breakdown` can make: a part longer than the span, overlap longer than compute
    or communication, or parts that do not sum to the span; within rounding (each figure
    is rounded to 0.001 µs)."""
    slack = _SLACK + span * 1e-9
    for key in _SPAN_PARTS:
        if row[key] > span + slack:
            return "a part is longer than its span"
    if row["overlap_us"] > min(row["compute_us"], row["comm_us"]) + slack:
        return "its overlap is longer than its compute or its communication"
    parts = row["compute_us"] + row["comm_us"] - row["overlap_us"] + row["other_us"] \
        + row["idle_us"]
    if abs(parts - span) > slack:
        return "its parts do not sum to its span"
    return None


#: A summary's bases: GPU kernels, the host's operators, an Ascend NPU's tasks.
BASES = ("cpu", "gpu", "npu")
#: A key of TraceLens's ``gpu_timeline`` (device_view.GpuTimeline), in µs.
TimelineFigure = Literal["computation_us", "exposed_comm_us", "exposed_memcpy_us", "busy_us",
                         "idle_us", "total_us"]
TIMELINE: tuple[TimelineFigure, ...] = get_args(TimelineFigure)
if tuple(GpuTimeline.__annotations__) != TIMELINE:
    raise TypeError("summary.TimelineFigure does not name device_view.GpuTimeline's keys")
_HTA_TIMES = ("idle_us", "compute_us", "non_compute_us", "kernel_us", "comm_us",
              "overlap_us")


def _timeline_problem(found: Any) -> str | None:
    """Why a ``gpu_timeline`` read back is not one (None is none: no device work)."""
    if found is None:
        return None
    if type(found) is not dict:
        return "is not an object"
    for key in TIMELINE:
        if not _number(found.get(key)):
            return "holds a figure below zero" if _negative(found.get(key)) else \
                f"lacks {key}"
    total = found["total_us"]
    slack = _SLACK * 4 + total * 1e-9
    parts = found["computation_us"] + found["exposed_comm_us"] + found["exposed_memcpy_us"]
    if abs(parts + found["idle_us"] - total) > slack or abs(found["busy_us"] - parts) > slack:
        return "does not add up to its total"
    return None


def _hta_problem(found: Any) -> str | None:
    """Why HTA's figures read back are not numbers. They are HTA's own, quirks included:
    HTA rounds each event to whole microseconds inward, so a kernel shorter than a
    microsecond counts as a negative length, and its sums can fall below zero as HTA's
    do."""
    if found is None:
        return None
    if type(found) is not dict or not all(
            _number(v) or _negative(v) for v in (found.get(k) for k in _HTA_TIMES)):
        return "HTA's breakdown is not times"
    pct = found.get("overlap_pct")
    if pct is not None and not (_number(pct) or _negative(pct)):
        return "HTA's overlap is not a share"
    return None


def _ops_problem(ops: Any) -> str | None:
    if type(ops) is not dict or not _count(ops.get("left_out")):
        return "its operators are not an object with a count"
    top = ops.get("top")
    if type(top) is not list or len(top) > MAX_OPS:
        return "its operators are not names, counts and times"
    for o in top:
        if not (type(o) is dict and type(o.get("name")) is str and type(o.get("cat")) is str
                and _count(o.get("calls")) and _number(o.get("time_us"))):
            return "its operators are not names, counts and times"
    return None


def problem(summary: Any, *, ops: bool = True) -> str | None:
    """Why ``summary`` (read from a manifest, so untrusted) is not what :func:`summarize`
    returns, or None when every figure the analyses use is there with its type and within
    its range (times from 0, a step's parts within its span, counts from 0). ``ops``:
    check the operators too (a reader that drops them need not)."""
    if type(summary) is not dict:
        return "it is not an object"
    if summary.get("basis") not in BASES:
        return "its basis is not one of cpu, gpu, npu"
    steps = summary.get("steps")
    if type(steps) is not list or len(steps) > MAX_STEPS:
        return "its steps are not a list"
    cpu = summary["basis"] == "cpu"
    for i, row in enumerate(steps):
        why = _step_problem(i, row, cpu) or _timeline_problem(row.get("gpu_timeline"))
        if why is not None:
            return why if why.startswith("step") else f"step {i}: its gpu_timeline {why}"
    why = _timeline_problem(summary.get("gpu_timeline"))
    if why is not None:
        return f"its gpu_timeline {why}"
    why = _hta_problem(summary.get("hta"))
    if why is not None:
        return f"its device view: {why}"
    if summary.get("device_error") is not None and type(summary["device_error"]) is not str:
        return "its device_error is not text"
    ascend = summary.get("ascend")
    if ascend is not None and not (type(ascend) is dict and all(
            v is None or (type(v) is dict and all(_number(x) for x in v.values()))
            for v in (ascend.get("overlap"), ascend.get("lanes")))):
        return "its Ascend figures are not times"
    # its collective calls are checked where they are read (analysis.window_calls): a
    # record that cannot be read leaves the rank's other figures in use
    device = summary.get("device")
    if device is not None:
        if type(device) is not dict:
            return "its device breakdown is not numbers"
        for k in ("kernel_us", *_SPAN_PARTS):
            value = device.get(k)
            if not _number(value):
                return "its device breakdown: a figure is negative" if _negative(value) \
                    else "its device breakdown is not numbers"
        why = _parts_problem(device, device["kernel_us"])
        if why is not None:
            return f"its device breakdown: {why}"
    regions = summary.get("regions")
    if type(regions) is not dict or len(regions) > MAX_REGIONS:
        return "its regions are not counts and times"
    for v in regions.values():
        if not (type(v) is dict and _count(v.get("count")) and _number(v.get("time_us"))):
            return "its regions are not counts and times"
    why = _phases.problem(summary.get("phases"))
    if why is not None:
        return why
    if ops:
        why = _ops_problem(summary.get("ops", {"top": [], "left_out": 0}))
        if why is not None:
            return why
    facts = summary.get("facts")
    if type(facts) is not dict:
        return "its facts lack a count"
    for key in _COUNTS:
        if not _count(facts.get(key)):
            return "its facts lack a count"
    basis = summary["basis"]
    if (basis == "gpu" and not facts["kernels"]) or (basis == "cpu" and facts["kernels"]) \
            or facts["comm_kernels"] > facts["kernels"]:
        return "its basis and its kernel counts disagree"
    left_out = facts.get("steps_left_out", 0)
    if not _count(left_out):
        return "its steps_left_out is not a count"
    numbered = sum(1 for row in steps if row.get("step") is not None)
    if numbered + left_out != facts["profiler_steps"] or \
            len(steps) - numbered > (not numbered):
        return "its steps and its count of ProfilerStep rows disagree"
    info = facts.get("distributed_info")
    if info is not None and type(info) is not dict:
        return "its distributed_info is not an object"
    if not (_names(facts.get("hta_unrecognised")) and _names(facts.get("looks_like_comm"))):
        return "its facts' names are not lists of strings"
    if summary.get("bytes") is not None and not _count(summary.get("bytes")):
        return "its size is not a byte count"
    return None
