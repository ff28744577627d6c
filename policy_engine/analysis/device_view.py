"""The device view of one torch trace: TraceLens's ``gpu_timeline`` and HTA's breakdown.

:class:`DeviceView` is fed a trace's events one at a time (``event(e)``, in any order,
from the single pass that reads the trace) and answers with ``result()``. It holds a
few numbers per device event and per host launch (their times, correlation id and
kind, in flat arrays), never the events.

**Which device events count, and in which step.** A device event is a ``kernel``,
``gpu_memcpy`` or ``gpu_memset`` event. It is *launched in the trace* when a host call of
the trace (a ``cuda_runtime`` or ``cuda_driver`` event; HIP's calls use the same
categories) carries its correlation id: the link TraceLens follows along the trace's
``ac2g`` flow events. Events launched before the profiler started (their launch is not in
the trace) count nowhere, as in TraceLens. A device event counts in the step that
launched it: the host ``ProfilerStep#N`` range holding its launch (``ts <= launch <
ts + dur``, HTA's rule), whenever it ran.

**The device-side window of a step** is the span of its ``gpu_user_annotation``
``ProfilerStep#N`` rows where the trace has them (the profiler draws that band from the
step's first device event to its last), else the span of the device events the step
launched; either way widened to hold every device event the step launched, so that the
parts below always sum to the window.

**gpu_timeline** (TraceLens's ``GPUEventAnalyser.compute_metrics``, per step over the
events the step launched and its window, and for the whole trace over every event
launched in it and their span), each the length of a union of intervals, in µs:

- ``computation_us``: kernels and memsets that are not communication;
- ``exposed_comm_us``: communication (kernels and memsets whose name holds ``nccl``,
  ``rccl`` or ``cross_device_reduce``, any case) not under computation;
- ``exposed_memcpy_us``: memory copies (``gpu_memcpy``, and the ``MEMORY_COPY_*`` and
  ``__amd_rocclr_copyBuffer*`` kernels of older ROCm) under neither of the above;
- ``busy_us``: any device event; ``total_us``: the window; ``idle_us = total - busy``.

So ``computation + exposed_comm + exposed_memcpy + idle = total``.

**hta** (Holistic Trace Analysis 0.5.0's ``get_temporal_breakdown`` and
``get_comm_comp_overlap``, for the whole trace). HTA counts every device event (every
row with a stream: torch writes one on these three kinds), except that when the trace
holds more than one ``ProfilerStep`` name it keeps only those launched (by correlation)
by a host call that starts before the last ``ProfilerStep`` row does: the last step's
kernels are left out. When the trace writes its timestamps as decimals (torch does, for
nanoseconds) HTA rounds every event to whole microseconds inward (start up, end down),
and so does this view. Kernel classes by name: communication ``^nccl.*Kernel``; compute any
other name that neither holds ``Memcpy`` or ``Sync`` nor starts with ``Memset``. Then:
``kernel_us`` from the first event's start to the last one's end, ``idle_us`` its part
with no event running, ``compute_us`` the union of compute kernels, ``non_compute_us =
kernel - compute - idle``, and ``overlap_pct`` the share of communication time under
compute (``100 * |comm ∩ compute| / |comm|``, two decimals; None without communication).
"""

from __future__ import annotations

import heapq
import math
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict

from policy_engine.analysis.chrome_trace import TraceEvent
from policy_engine.analysis.intervals import (
    CHUNK,
    EMPTY,
    Merged,
    Spans,
    bounds,
    intersect,
    length,
    union,
)

STEP_NAME = re.compile(r"ProfilerStep\s*#\s*(\d+)$")
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver"})
#: TraceLens's communication names (``TraceEventUtils.is_communication_string``).
TRACELENS_COMM = re.compile(r"nccl|rccl|cross_device_reduce", re.IGNORECASE)
#: Older ROCm's copy kernels, which TraceLens counts as memory copies.
ROCM_COPY = re.compile(r"^(MEMORY_COPY_(HOST_TO_DEVICE|DEVICE_TO_HOST|DEVICE_TO_DEVICE)"
                       r"|__amd_rocclr_copyBuffer(Rect)?(Aligned)?)(\.kd)?$")
#: HTA's communication kernels, and the names it does not count as compute.
HTA_COMM = re.compile(r"^nccl.*Kernel")
HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
#: Device events and host launches held per trace (12-25 bytes each); past either, the
#: figures would be wrong, so the view says why it has none.
MAX_DEVICE_EVENTS = 1 << 23
MAX_LAUNCHES = 1 << 23
MAX_STEPS = 100_000
_MAX_NAMES = 65536  # names classified once and remembered
_HUGE = 1e18  # µs: beyond it a timestamp is garbage
_NUMBER = (int, float)

# a device event's kind: TraceLens's class in the low bits, HTA's above
_TL_COMPUTATION, _TL_COMM, _TL_MEMCPY = 0, 1, 2
_HTA_OTHER, _HTA_COMPUTE, _HTA_COMM = 0, 4, 8
_TL_MASK = 3


class GpuTimeline(TypedDict):
    """TraceLens's ``gpu_timeline``, in µs."""

    computation_us: float
    exposed_comm_us: float
    exposed_memcpy_us: float
    busy_us: float
    idle_us: float
    total_us: float


class DeviceWindow(TypedDict):
    """Where a step ran on the device; ``source`` is ``gpu_annotation`` or ``launches``."""

    start_us: float
    end_us: float
    source: str


class DeviceStep(TypedDict):
    """One ``ProfilerStep#N``: its host range, its device-side window and figures (None
    when it launched nothing and has no annotation)."""

    step: int
    host_start_us: float
    host_end_us: float
    device_events: int
    window: DeviceWindow | None
    gpu_timeline: GpuTimeline | None


class HtaBreakdown(TypedDict):
    """HTA's temporal breakdown and communication/computation overlap, in µs."""

    idle_us: float
    compute_us: float
    non_compute_us: float
    kernel_us: float
    comm_us: float
    overlap_us: float
    overlap_pct: float | None
    device_events: int


class DeviceCounts(TypedDict):
    device_events: int
    launched: int
    in_steps: int
    launches: int


class DeviceResult(TypedDict):
    """What :meth:`DeviceView.result` returns (JSON-ready). ``error`` says why the
    figures are None when the view gave up (a bound passed)."""

    gpu_timeline: GpuTimeline | None
    steps: list[DeviceStep]
    hta: HtaBreakdown | None
    counts: DeviceCounts
    error: str | None


def _r(value: float) -> float:
    return round(value, 3)


def gpu_timeline(computation: Merged, communication: Merged, memcpy: Merged,
                 window: tuple[float, float] | None = None) -> GpuTimeline | None:
    """TraceLens's figures over three merged unions; ``total_us`` is ``window`` widened
    to hold every interval (None: their span). None when there is nothing at all."""
    busy_union = union(computation, communication, memcpy)
    widened = widen(window, bounds(busy_union))
    if widened is None:
        return None
    lo, hi = widened
    comp, comm, mem = length(computation), length(communication), length(memcpy)
    exposed_comm = comm - length(intersect(communication, computation))
    exposed_mem = mem - length(intersect(memcpy, union(computation, communication)))
    busy = length(busy_union)
    return {"computation_us": _r(comp), "exposed_comm_us": _r(exposed_comm),
            "exposed_memcpy_us": _r(exposed_mem), "busy_us": _r(busy),
            "idle_us": _r(max(hi - lo - busy, 0.0)), "total_us": _r(hi - lo)}


def widen(window: tuple[float, float] | None,
          span: tuple[float, float] | None) -> tuple[float, float] | None:
    """``window`` widened to hold ``span`` (either may be None)."""
    if window is None or span is None:
        return span if window is None else window
    return min(window[0], span[0]), max(window[1], span[1])


def _kind(cat: str, name: str) -> int:
    if cat == "gpu_memcpy" or (cat == "kernel" and ROCM_COPY.match(name)):
        tl = _TL_MEMCPY
    else:
        tl = _TL_COMM if TRACELENS_COMM.search(name) else _TL_COMPUTATION
    if HTA_COMM.match(name):
        return tl | _HTA_COMM
    return tl | (_HTA_OTHER if HTA_NOT_COMPUTE.match(name) else _HTA_COMPUTE)


class _HtaUnion:
    """HTA's ``merge_kernel_intervals`` fed in start order: a new group begins where an
    interval starts after every end seen so far; a group lasts from its first start to
    its latest end (an interval that rounding emptied makes a group of negative length,
    as in HTA). ``keep``: keep the groups, as machine floats, for the overlap; else only
    their total, the first start and the last group's end."""

    def __init__(self, keep: bool = True) -> None:
        self.starts = array("d")
        self.ends = array("d")
        self.first = self.last_end = math.nan  # nan: no interval yet
        self._keep = keep
        self._sealed = False  # positive() has added the open group to those kept
        self._start = math.nan  # the open group
        self._done = 0.0  # the closed groups' lengths
        self._reach = -math.inf

    def add(self, start: float, end: float) -> None:
        if math.isnan(self.first):
            self.first = start
        elif start > self._reach:
            self._close()
        else:
            if end > self.last_end:
                self.last_end = end
            self._reach = max(self._reach, end)
            return
        self._start, self.last_end = start, end
        self._reach = max(self._reach, end)

    def _close(self) -> None:
        self._done += self.last_end - self._start
        if self._keep:
            self.starts.append(self._start)
            self.ends.append(self.last_end)

    def total(self) -> float:
        return 0.0 if math.isnan(self.first) else self._done + self.last_end - self._start

    def positive(self) -> Merged:
        """The groups of positive length, sorted and disjoint."""
        starts, ends = self.starts, self.ends
        if not self._sealed and not math.isnan(self._start):  # the open group joins them
            starts.append(self._start)
            ends.append(self.last_end)
        self._sealed = True
        if all(e > s for s, e in zip(starts, ends, strict=True)):
            return starts, ends
        kept_s, kept_e = array("d"), array("d")
        for s, e in zip(starts, ends, strict=True):
            if e > s:
                kept_s.append(s)
                kept_e.append(e)
        return kept_s, kept_e


def _in_start_order(picked: array[int], starts: array[float]) -> Iterator[int]:
    """The device events ``picked`` (``starts[k]`` is the start of ``picked[k]``) in start
    order, ties in the order picked. A chunk at a time is sorted (the only Python objects
    made, a chunk's worth), and the sorted chunks, held as machine integers, are merged."""
    n = len(starts)
    if all(starts[k] <= starts[k + 1] for k in range(n - 1)):
        yield from picked
        return
    runs = [array("q", sorted(range(lo, min(n, lo + CHUNK)), key=starts.__getitem__))
            for lo in range(0, n, CHUNK)]
    for k in heapq.merge(*runs, key=starts.__getitem__):
        yield picked[k]


class DeviceView:
    """The device view of one trace, gathered from its events; see the module's text."""

    def __init__(self) -> None:
        self._start, self._end = array("d"), array("d")
        self._corr = array("q")  # -1: none
        self._kind = array("B")
        self._launch_corr, self._launch_ts = array("q"), array("d")
        self._steps: list[tuple[int, float, float]] = []
        self._annotations: dict[int, list[float]] = {}
        self._kinds: dict[tuple[str, str], int] = {}
        self._hta_step_names: set[str] = set()
        self._hta_last_step = -math.inf
        self._float_ts = False  # HTA rounds when the trace's timestamps are fractional
        self._error: str | None = None

    def event(self, e: TraceEvent) -> None:
        """Take one event of the trace (anything that is not a well-formed complete
        event is passed over)."""
        ts: Any = e.get("ts")
        if type(ts) is not int:
            if type(ts) is float or ts is None:
                self._float_ts = True
            if type(ts) is not float:
                return
        if e.get("ph") != "X":
            return
        dur: Any = e.get("dur")
        if type(dur) not in _NUMBER or not (0 <= dur < _HUGE and -_HUGE < ts < _HUGE):
            return
        cat, name = e.get("cat"), e.get("name")
        if type(cat) is not str or type(name) is not str:
            return
        if cat in DEVICE_CATS:
            self._device(e, cat, name, ts, ts + dur)
            return
        if "ProfilerStep" in name:
            self._step(cat, name, ts, ts + dur)
        elif cat in LAUNCH_CATS:
            corr = _correlation(e)
            if corr is not None:
                if len(self._launch_corr) >= MAX_LAUNCHES:
                    self._error = f"more than {MAX_LAUNCHES:,} host launches"
                    return
                self._launch_corr.append(corr)
                self._launch_ts.append(ts)

    def _device(self, e: TraceEvent, cat: str, name: str, start: float,
                end: float) -> None:
        if len(self._start) >= MAX_DEVICE_EVENTS:
            self._error = f"more than {MAX_DEVICE_EVENTS:,} device events"
            return
        kind = self._kinds.get((cat, name))
        if kind is None:
            kind = _kind(cat, name)
            if len(self._kinds) < _MAX_NAMES:
                self._kinds[(cat, name)] = kind
        corr = _correlation(e)
        self._start.append(start)
        self._end.append(end)
        self._corr.append(-1 if corr is None else corr)
        self._kind.append(kind)

    def _step(self, cat: str, name: str, start: float, end: float) -> None:
        # HTA: any row named ProfilerStep that is not a device event marks a step
        if len(self._hta_step_names) < 2:
            self._hta_step_names.add(name)
        self._hta_last_step = max(self._hta_last_step, start)
        found = STEP_NAME.match(name)
        if found is None:
            return
        number = int(found.group(1))
        if cat == "gpu_user_annotation":
            span = self._annotations.get(number)
            if span is not None:
                span[0], span[1] = min(span[0], start), max(span[1], end)
            elif len(self._annotations) < MAX_STEPS:
                self._annotations[number] = [start, end]
        elif len(self._steps) < MAX_STEPS:
            self._steps.append((number, start, end))

    # -- the figures --------------------------------------------------------------------

    def result(self) -> DeviceResult:
        """The figures (see the module's text); call once, after the last event."""
        counts: DeviceCounts = {"device_events": len(self._start), "launched": 0,
                                "in_steps": 0, "launches": len(self._launch_corr)}
        steps = sorted(self._steps, key=lambda s: s[1])
        if self._error is not None:
            return {"gpu_timeline": None, "steps": [], "hta": None, "counts": counts,
                    "error": f"{self._error}: the device view is not computed"}
        launch_of = self._launches()
        # Per device event: its launch's host time (nan: none). What it was found from is
        # let go here (result() is called once), before the intervals below are made.
        launch_ts = array("d", (math.nan if (t := launch_of(c)) is None else t
                                for c in self._corr))
        del launch_of
        self._corr, self._launch_corr, self._launch_ts = array("q"), array("q"), array("d")
        step_starts = [s[1] for s in steps]
        whole = [Spans(), Spans(), Spans()]
        per_step: dict[int, list[Spans]] = {}
        for i, found in enumerate(launch_ts):
            if math.isnan(found):
                continue
            counts["launched"] += 1
            s, e, tl = self._start[i], self._end[i], self._kind[i] & _TL_MASK
            whole[tl].add(s, e)
            j = bisect_right(step_starts, found) - 1
            if j >= 0 and found < steps[j][2]:
                counts["in_steps"] += 1
                parts = per_step.get(j)
                if parts is None:
                    parts = per_step[j] = [Spans(), Spans(), Spans()]
                parts[tl].add(s, e)
        comp, comm, mem = (x.merged() for x in whole)
        timeline = gpu_timeline(comp, comm, mem)
        del whole, comp, comm, mem  # the figures below are made one after another
        rows = [self._step_row(step, per_step.pop(j, None)) for j, step in enumerate(steps)]
        return {"gpu_timeline": timeline, "steps": rows, "hta": self._hta(launch_ts),
                "counts": counts, "error": None}

    def _launches(self) -> Callable[[int], float | None]:
        """A lookup: correlation id -> its launch's host time (None: not in the trace)."""
        corrs, times = self._launch_corr, self._launch_ts
        if any(corrs[i] > corrs[i + 1] for i in range(len(corrs) - 1)):
            order = sorted(range(len(corrs)), key=corrs.__getitem__)
            corrs = array("q", (corrs[i] for i in order))
            times = array("d", (times[i] for i in order))

        def lookup(corr: int) -> float | None:
            if corr < 0:
                return None
            i = bisect_left(corrs, corr)
            return times[i] if i < len(corrs) and corrs[i] == corr else None
        return lookup

    def _step_row(self, step: tuple[int, float, float],
                  parts: list[Spans] | None) -> DeviceStep:
        number, host_start, host_end = step
        comp, comm, mem = (x.merged() for x in parts) if parts else (EMPTY, EMPTY, EMPTY)
        found = self._annotations.get(number)
        annotation = (found[0], found[1]) if found else None
        figures = gpu_timeline(comp, comm, mem, window=annotation)
        widened = widen(annotation, bounds(union(comp, comm, mem)))
        window: DeviceWindow | None = None
        if widened is not None:
            window = {"start_us": _r(widened[0]), "end_us": _r(widened[1]),
                      "source": "gpu_annotation" if annotation else "launches"}
        count = sum(x.count for x in parts) if parts else 0
        return {"step": number, "host_start_us": _r(host_start), "host_end_us": _r(host_end),
                "device_events": count, "window": window, "gpu_timeline": figures}

    def _hta(self, launch_ts: array[float]) -> HtaBreakdown | None:
        rnd = self._float_ts
        keep_all = len(self._hta_step_names) < 2
        last = math.ceil(self._hta_last_step) if rnd and not keep_all else self._hta_last_step
        picked = array("q")
        starts = array("d")
        for i in range(len(self._start)):
            if not keep_all:
                t = launch_ts[i]
                if math.isnan(t) or (math.ceil(t) if rnd else t) >= last:
                    continue
            picked.append(i)
            starts.append(math.ceil(self._start[i]) if rnd else self._start[i])
        if not picked:
            return None
        every, compute, comm = _HtaUnion(keep=False), _HtaUnion(), _HtaUnion()
        for i in _in_start_order(picked, starts):
            s = float(math.ceil(self._start[i])) if rnd else self._start[i]
            e = float(math.floor(self._end[i])) if rnd else self._end[i]
            every.add(s, e)
            kind = self._kind[i] & ~_TL_MASK
            if kind == _HTA_COMPUTE:
                compute.add(s, e)
            elif kind == _HTA_COMM:
                comm.add(s, e)
        picked_count = len(picked)
        del picked, starts  # before the overlap's arrays are made
        kernel = every.last_end - every.first
        idle = kernel - every.total()
        comp, comm_time = compute.total(), comm.total()
        overlap = length(intersect(compute.positive(), comm.positive()))
        return {"idle_us": _r(idle), "compute_us": _r(comp),
                "non_compute_us": _r(kernel - comp - idle), "kernel_us": _r(kernel),
                "comm_us": _r(comm_time), "overlap_us": _r(overlap),
                "overlap_pct": round(100 * overlap / comm_time, 2) if comm_time > 0 else None,
                "device_events": picked_count}


def _correlation(e: TraceEvent) -> int | None:
    args = e.get("args")
    if not isinstance(args, dict):
        return None
    corr = args.get("correlation")
    return corr if type(corr) is int and 0 <= corr < 1 << 62 else None


def device_view(events: Iterable[TraceEvent]) -> DeviceResult:
    """The device view of ``events`` (one trace's, in any order)."""
    view = DeviceView()
    for e in events:
        view.event(e)
    return view.result()
