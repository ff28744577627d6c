"""An Ascend capture's device view: torch_npu's ``trace_view.json`` read into the figures
of :mod:`policy_engine.analysis.device_view`, with its own Overlap Analysis as a check.

torch_npu writes ``<name>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json`` when a
capture is analysed (``analysis: true``, or ``torch_npu.profiler.profiler.analyse``
afterwards, with ``export_type`` text): a Chrome trace whose timestamps are strings of
microseconds (``"1704161511420306.491"``, read exactly here: a float64 holds such a
number only to a quarter of a microsecond). Its processes, named by ``process_name``
rows: the host (``ProfilerStep#N`` and the operators), ``CANN``, ``Ascend Hardware`` (one
lane per stream: the device's tasks), ``HCCL`` (collectives: lanes named
``Communication`` hold the operators, the others their tasks) and ``Overlap Analysis``
(lanes ``Computing``, ``Communication``, ``Communication(Not Overlapped)``, ``Free``,
which msprof computes from the same tasks).

Figures, each the length of a union of intervals, in µs (msprof-analyze's names):

- ``computing_us``: Ascend Hardware tasks other than memory copies (``MEMCPY_ASYNC``,
  which msprof counts as neither computing nor communication);
- ``communication_us``: the HCCL process's communication operators;
- ``communication_not_overlapped_us``: communication not under computing;
- ``free_us``: from the first computing or communication interval to the last, the time
  with neither.

``gpu_timeline`` is TraceLens's six figures over the same intervals (computation =
computing, communication, memory copies), as for a CUDA trace; ``lanes`` sums the
Overlap Analysis rows by name, as torch_npu's ``step_trace_time.csv`` does. A task counts
in the step whose host ``ProfilerStep#N`` launched it (the ``async_npu`` flow from the
host operator to the task); a task no flow reaches (HCCL's, copies CANN issues itself)
counts in the step whose device window (its launched tasks' span) holds its start.
"""

from __future__ import annotations

import os
import re
from array import array
from bisect import bisect_right
from typing import Any, TypedDict

from policy_engine.analysis.chrome_trace import TraceError, TraceEvent, TraceReader
from policy_engine.analysis.device_view import STEP_NAME, DeviceWindow, GpuTimeline, gpu_timeline
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.intervals import Merged, Spans, bounds, intersect, length, union

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TRACE_VIEW = "trace_view.json"
HARDWARE, OVERLAP = "Ascend Hardware", "Overlap Analysis"
COMM_PROCESSES = frozenset({"HCCL", "Communication"})
LANES = ("Computing", "Communication", "Communication(Not Overlapped)", "Free")
MEMCPY_TASK = re.compile(r"^MEMCPY_ASYNC", re.IGNORECASE)
_TIME = re.compile(r"\s*(-?)(\d{1,20})(?:\.(\d{0,12}))?\s*$")
#: Processes, threads, tasks and flows held per trace; past them the view gives up.
MAX_NAMES = 4096
MAX_INTERVALS = 1 << 23
MAX_FLOWS = 1 << 22
MAX_STEPS = 100_000
_PLAIN, _MEMCPY = 0, 1  # a task's kind; lanes are 2 + their index in LANES
_Key = int | str | None  # a pid, tid or flow id
_HUGE = 1e18


class Overlap(TypedDict):
    """msprof's step trace figures (ours from the tasks, or its lanes read back)."""

    computing_us: float
    communication_us: float
    communication_not_overlapped_us: float
    free_us: float


class AscendStep(TypedDict):
    """One ``ProfilerStep#N`` of an Ascend capture (:meth:`AscendView.result`'s ``steps``)."""

    step: int
    host_start_us: float
    host_end_us: float
    device_events: int
    window: DeviceWindow | None
    gpu_timeline: GpuTimeline | None
    overlap: Overlap | None  # ours, from the step's tasks
    lanes: Overlap | None  # msprof's Overlap Analysis rows in the step's window


class AscendResult(TypedDict):
    """What :meth:`AscendView.result` returns (JSON-ready)."""

    gpu_timeline: GpuTimeline | None
    overlap: Overlap | None
    lanes: Overlap | None
    steps: list[AscendStep]
    device_events: int
    error: str | None


def find_trace_view(path: str) -> str:
    """The ``trace_view.json`` of ``path``: the file itself, or the one inside an
    ``*_ascend_pt`` folder (``ASCEND_PROFILER_OUTPUT/trace_view.json``) or inside
    ``ASCEND_PROFILER_OUTPUT``. Raises AnalysisError saying what is there instead."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise AnalysisError(f"{path}: no such file or folder")
    for inside in (os.path.join(OUTPUT_DIR, TRACE_VIEW), TRACE_VIEW):
        found = os.path.join(path, inside)
        if os.path.isfile(found):
            return found
    output = os.path.join(path, OUTPUT_DIR)
    if os.path.isdir(output) and any(n.endswith(".db") for n in os.listdir(output)):
        why = (f"{OUTPUT_DIR} holds only the database export (export_type db); the "
               f"figures are read from {TRACE_VIEW} (export_type text)")
    elif any(n.startswith("PROF_") for n in os.listdir(path)):
        why = ("the capture was not analysed: run torch_npu.profiler.profiler.analyse() "
               "on the folder (or record with analysis: true)")
    else:
        why = "it is not a torch_npu *_ascend_pt folder"
    raise AnalysisError(f"{path}: no {OUTPUT_DIR}/{TRACE_VIEW} in it; {why}")


class _Clock:
    """Timestamps as microseconds after the first whole microsecond seen, so that a
    string's digits are kept exactly and a float's as well as it holds them."""

    def __init__(self) -> None:
        self.base: int | None = None

    def read(self, value: Any) -> float | None:
        if type(value) is str:
            found = _TIME.match(value)
            if found is None:
                return None
            sign, whole, part = found.groups()
            units = int(whole)
            fraction = float("0." + part) if part else 0.0
            if sign:
                units, fraction = -units, -fraction
        elif type(value) in (int, float) and -_HUGE < value < _HUGE:
            units = int(value // 1)
            fraction = value - units
        else:
            return None
        if self.base is None:
            self.base = units
        return float(units - self.base) + fraction

    def absolute(self, value: float) -> float:
        return round((self.base or 0) + value, 3)


def _key(value: Any) -> _Key:
    """A pid, tid or flow id as a key (anything else in a hostile file: None)."""
    return value if type(value) in (int, str) else None


def _duration(value: Any) -> float | None:
    if type(value) in (int, float):
        return float(value) if 0 <= value < _HUGE else None
    if type(value) is str and _TIME.match(value) and not value.lstrip().startswith("-"):
        return float(value)
    return None


class AscendView:
    """One ``trace_view.json``'s figures, gathered from its events (any order)."""

    def __init__(self) -> None:
        self.clock = _Clock()
        self._process: dict[_Key, str] = {}
        self._thread: dict[tuple[_Key, _Key], str] = {}
        # (pid, tid) -> starts, ends, kinds of the rows on it that have no category
        self._rows: dict[tuple[_Key, _Key], tuple[array[float], array[float], array[int]]] = {}
        self._count = 0
        self._steps: list[tuple[int, float, float]] = []
        self._flow_from: dict[_Key, float] = {}  # flow id -> host time
        self._flow_to: dict[tuple[_Key, _Key, float], _Key] = {}  # (pid, tid, task's ts) -> id
        self._error: str | None = None
        #: after result(): computing, communication and memory copies as merged intervals,
        #: and the host's ProfilerStep rows (number, start, end), on the trace's own clock
        self.merged: tuple[Merged, Merged, Merged] | None = None
        self.host_steps: list[tuple[int, float, float]] = []

    def event(self, e: TraceEvent) -> None:
        """Take one event of the trace."""
        ph = e.get("ph")
        if ph == "M":
            self._meta(e)
            return
        if ph not in ("X", "s", "f"):
            return
        start = self.clock.read(e.get("ts"))
        if start is None:
            return
        cat, name = e.get("cat"), e.get("name")
        pid, tid = _key(e.get("pid")), _key(e.get("tid"))
        if ph != "X":
            flow = _key(e.get("id"))
            if cat != "async_npu" or flow is None:
                return
            if len(self._flow_from) + len(self._flow_to) >= MAX_FLOWS:
                self._error = f"more than {MAX_FLOWS:,} flows from the host"
            elif ph == "s":
                self._flow_from[flow] = start
            else:
                self._flow_to[(pid, tid, start)] = flow
            return
        dur = _duration(e.get("dur"))
        if dur is None or type(name) is not str:
            return
        if cat is not None:  # the host's rows carry one; the device's and lanes' do not
            found = STEP_NAME.match(name)
            if found and len(self._steps) < MAX_STEPS:
                self._steps.append((int(found.group(1)), start, start + dur))
            return
        if pid is None:
            return
        known = self._process.get(pid)
        if known is not None and known != HARDWARE and known != OVERLAP \
                and known not in COMM_PROCESSES:
            return
        if self._count >= MAX_INTERVALS:
            self._error = f"more than {MAX_INTERVALS:,} device rows"
            return
        key = (pid, tid)
        rows = self._rows.get(key)
        if rows is None:
            if len(self._rows) >= MAX_NAMES:
                self._error = f"more than {MAX_NAMES:,} device lanes"
                return
            rows = self._rows[key] = (array("d"), array("d"), array("B"))
        kind = _MEMCPY if MEMCPY_TASK.match(name) else _PLAIN
        if name in LANES:
            kind = 2 + LANES.index(name)
        rows[0].append(start)
        rows[1].append(start + dur)
        rows[2].append(kind)
        self._count += 1

    def _meta(self, e: TraceEvent) -> None:
        args = e.get("args")
        label = args.get("name") if isinstance(args, dict) else None
        if type(label) is not str:
            return
        pid, tid = _key(e.get("pid")), _key(e.get("tid"))
        if pid is None:
            return
        if e.get("name") == "process_name" and len(self._process) < MAX_NAMES:
            self._process[pid] = label
        elif e.get("name") == "thread_name" and len(self._thread) < MAX_NAMES:
            self._thread[(pid, tid)] = label

    # -- the figures --------------------------------------------------------------------

    def result(self) -> AscendResult:
        """The figures (see the module's text); call once, after the last event."""
        if self._error is not None:
            return {"gpu_timeline": None, "overlap": None, "lanes": None, "steps": [],
                    "device_events": self._count, "error": f"{self._error}: not computed"}
        comm_lanes = {key for key in self._rows if self._process.get(key[0]) in COMM_PROCESSES
                      and "Communication" in self._thread.get(key, "")}
        steps = sorted(self._steps, key=lambda s: s[1])
        # each device row: (which of compute / comm / memcpy, start, end, its launch)
        tasks: list[tuple[int, float, float, float | None]] = []
        lanes: list[tuple[int, float, float]] = []
        for (pid, tid), (starts, ends, kinds) in self._rows.items():
            process = self._process.get(pid)
            for s, e, kind in zip(starts, ends, kinds, strict=True):
                if process == OVERLAP and kind >= 2:
                    lanes.append((kind - 2, s, e))
                elif process == HARDWARE:
                    part = 2 if kind == _MEMCPY else 0
                    tasks.append((part, s, e, self._launch(pid, tid, s)))
                elif process in COMM_PROCESSES and (
                        (pid, tid) in comm_lanes or not comm_lanes):
                    tasks.append((1, s, e, self._launch(pid, tid, s)))
        whole = [Spans(), Spans(), Spans()]
        for part, s, e, _ in tasks:
            whole[part].add(s, e)
        comp, comm, mem = (x.merged() for x in whole)
        self.merged = (comp, comm, mem)
        self.host_steps = steps
        return {"gpu_timeline": gpu_timeline(comp, comm, mem), "overlap": _overlap(comp, comm),
                "lanes": _lanes(lanes), "steps": self._step_rows(steps, tasks, lanes),
                "device_events": len(tasks), "error": None}

    def _launch(self, pid: _Key, tid: _Key, start: float) -> float | None:
        flow = self._flow_to.get((pid, tid, start))
        return None if flow is None else self._flow_from.get(flow)

    def _step_rows(self, steps: list[tuple[int, float, float]],
                   tasks: list[tuple[int, float, float, float | None]],
                   lanes: list[tuple[int, float, float]]) -> list[AscendStep]:
        starts = [s[1] for s in steps]
        parts: list[list[Spans]] = [[Spans(), Spans(), Spans()] for _ in steps]
        unlaunched: list[tuple[int, float, float]] = []
        for part, s, e, launch in tasks:
            j = bisect_right(starts, launch) - 1 if launch is not None else -1
            if j >= 0 and launch is not None and launch < steps[j][2]:
                parts[j][part].add(s, e)
            else:
                unlaunched.append((part, s, e))
        windows = [bounds(union(*(x.merged() for x in p))) for p in parts]
        for part, s, e in unlaunched:  # into the step whose device window holds it
            for j, held in enumerate(windows):
                if held is not None and held[0] <= s <= held[1]:
                    parts[j][part].add(s, e)
                    break
        rows: list[AscendStep] = []
        for j, (number, host_start, host_end) in enumerate(steps):
            comp, comm, mem = (x.merged() for x in parts[j])
            span = bounds(union(comp, comm, mem))
            window: DeviceWindow | None = None
            in_window: list[tuple[int, float, float]] = []
            if span is not None:
                window = {"start_us": self.clock.absolute(span[0]),
                          "end_us": self.clock.absolute(span[1]), "source": "launches"}
                in_window = [lane for lane in lanes if span[0] <= lane[1] < span[1]]
            rows.append({"step": number, "host_start_us": self.clock.absolute(host_start),
                         "host_end_us": self.clock.absolute(host_end),
                         "device_events": sum(x.count for x in parts[j]), "window": window,
                         "gpu_timeline": gpu_timeline(comp, comm, mem),
                         "overlap": _overlap(comp, comm),
                         "lanes": _lanes(in_window) if in_window else None})
        return rows


def _r(value: float) -> float:
    return round(value, 3)


def _overlap(computing: Merged, communication: Merged) -> Overlap | None:
    both = union(computing, communication)
    span = bounds(both)
    if span is None:
        return None
    comm = length(communication)
    return {"computing_us": _r(length(computing)), "communication_us": _r(comm),
            "communication_not_overlapped_us": _r(
                comm - length(intersect(communication, computing))),
            "free_us": _r(span[1] - span[0] - length(both))}


def _lanes(lanes: list[tuple[int, float, float]]) -> Overlap | None:
    if not lanes:
        return None
    sums = [0.0] * len(LANES)
    for index, s, e in lanes:
        sums[index] += e - s
    computing, communication, not_overlapped, free = (_r(x) for x in sums)
    return {"computing_us": computing, "communication_us": communication,
            "communication_not_overlapped_us": not_overlapped, "free_us": free}


def read_ascend(path: str) -> AscendResult:
    """The figures of the capture at ``path`` (a ``trace_view.json``, or a folder holding
    one: see :func:`find_trace_view`). Raises AnalysisError when there is none; a file
    that cannot be read gives ``error``."""
    found = find_trace_view(path)
    view = AscendView()
    try:
        with TraceReader(found) as reader:
            for event in reader.events():
                view.event(event)
    except TraceError as err:
        return {"gpu_timeline": None, "overlap": None, "lanes": None, "steps": [],
                "device_events": 0, "error": f"{found}: {err}"}
    return view.result()
