"""One rank's trace, summed up: where each step's time went.

:func:`summarize` streams a torch Chrome trace once (through the one trace reader) and
returns a small JSON-ready summary: per ``ProfilerStep#N`` its time and how much of it was
compute, communication, both at once (overlap), other device work (memory copies) and
idle; the same over every GPU kernel of the trace (what Holistic Trace Analysis's
temporal breakdown measures); region ranges; and the facts the readiness checks need.

Where the time goes is measured on the GPU when the trace holds kernels (kernels named
``nccl*``/``hccl*``/``rccl*`` are communication, memory copies and sets are other work,
the rest compute), else on the CPU (c10d, gloo, nccl and hccl operators and ranges are
communication, other operators compute). A kernel counts in the step in which it
starts: a step's GPU window runs from its ``ProfilerStep`` to the next one. This runs in
a worker process; memory holds merged intervals, never the events.
"""

from __future__ import annotations

import os
import re
from typing import Any

from policy_engine.analysis import phases as _phases
from policy_engine.analysis.chrome_trace import TraceError, TraceReader
from policy_engine.analysis.intervals import (
    EMPTY,
    Merged,
    Spans,
    bounds,
    intersect,
    length,
    union,
)

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
        self.steps: list[tuple[int, float, float]] = []
        self.regions: dict[str, list[float]] = {}
        self.regions_left_out = 0
        self.hta_missed: set[str] = set()
        self.looks_comm: set[str] = set()
        # (category, name) -> [calls, total µs] of operators and kernels
        self.names: dict[tuple[str, str], list[float]] = {}
        self.names_left_out = 0

    def event(self, e: dict[str, Any]) -> None:
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
            self.steps.append((int(digits), ts, ts + dur))

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


def _breakdown(compute: Merged, comm: Merged, other: Merged, lo: float,
               hi: float, joint: tuple[Merged, Merged] | None = None) -> dict[str, float]:
    """How [lo, hi) splits into compute, communication, overlap, other work and idle.
    ``joint``: compute and communication intersected, and all three united, when the
    caller made them once for many ranges."""
    span = max(hi - lo, 0.0)
    c, m = length(compute, lo, hi), length(comm, lo, hi)
    overlap, all_work = joint or (intersect(compute, comm), union(compute, comm, other))
    both = length(overlap, lo, hi)
    busy = length(all_work, lo, hi)
    return {"span_us": _r(span), "compute_us": _r(c), "comm_us": _r(m),
            "overlap_us": _r(both), "other_us": _r(max(busy - c - m + both, 0.0)),
            "idle_us": _r(max(span - busy, 0.0))}


def _r(value: float) -> float:
    return round(value, 3)


def _steps(p: _Pass, gpu: bool, parts: tuple[Merged, Merged, Merged]) -> list[dict[str, Any]]:
    """Each ProfilerStep's time and breakdown; one step (None) for the whole trace when
    there is no ProfilerStep row."""
    compute, comm, other = parts
    if not p.steps:
        whole = bounds(union(compute, comm, other))
        if whole is None:
            return []
        return [{"step": None, "time_us": _r(whole[1] - whole[0]),
                 **_breakdown(compute, comm, other, *whole)}]
    rows = []
    joint = (intersect(compute, comm), union(compute, comm, other))  # once, not per step
    steps = sorted(p.steps, key=lambda s: s[1])
    last_end = max((b[1] for b in (bounds(x) for x in parts) if b is not None),
                   default=steps[-1][2])
    for i, (number, start, end) in enumerate(steps):
        hi = end
        if gpu:  # kernels run after their launch: the step's window lasts to the next step
            hi = steps[i + 1][1] if i + 1 < len(steps) else max(end, last_end)
        rows.append({"step": number, "time_us": _r(end - start),
                     **_breakdown(compute, comm, other, start, hi, joint)})
    return rows


def _distributed(meta: dict[str, Any]) -> dict[str, Any] | None:
    info = meta.get("distributedInfo")
    if not isinstance(info, dict):
        return None
    return {k: info.get(k) for k in ("rank", "world_size", "backend")}


def summarize(path: str) -> dict[str, Any]:
    """The summary of the trace at ``path``; ``{"error": ...}`` when it cannot be read."""
    p, phases = _Pass(), _phases.Phases()
    try:
        size = os.path.getsize(path)
        with TraceReader(path, max_ratio=MAX_RATIO) as reader:
            try:
                for event in reader.events():
                    p.event(event)
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
    if gpu:
        parts = (p.k_comp.merged(), p.k_comm.merged(), p.k_other.merged())
    else:
        parts = (p.ops.merged(), p.comm.merged(), EMPTY)
    steps = _steps(p, gpu, parts)
    device = None
    if gpu:
        whole = bounds(union(*parts))
        assert whole is not None  # there are kernels
        device = _breakdown(*parts, *whole)
        device["kernel_us"] = device.pop("span_us")
    regions = sorted(p.regions.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP_REGIONS]
    ops = sorted(p.names.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP_OPS]
    return {
        "bytes": size,
        "basis": "gpu" if gpu else "cpu",
        "steps": steps,
        "device": device,
        "regions": {name: {"count": int(n), "time_us": _r(t)} for name, (n, t) in regions},
        "phases": phases.result(meta),
        # time inside each call, nested calls included (a stream keeps no stack)
        "ops": {"top": [{"cat": cat, "name": name, "calls": int(n), "time_us": _r(t)}
                        for (cat, name), (n, t) in ops],
                "left_out": p.names_left_out},
        "facts": {
            "events": count,
            "profiler_steps": len(p.steps),
            "kernels": kernels,
            "comm_kernels": p.k_comm.count,
            "cpu_comm_ops": p.comm.count,
            "distributed_info": _distributed(meta),
            "hta_unrecognised": sorted(p.hta_missed),
            "looks_like_comm": sorted(p.looks_comm),
            "regions_left_out": p.regions_left_out,
        },
    }


# -- a summary read back from a manifest ------------------------------------------------

_STEP_KEYS = ("time_us", "span_us", "compute_us", "comm_us", "overlap_us", "other_us",
              "idle_us")
#: The parts of a step that lie within its span (its ``time_us`` is the host's own).
_SPAN_PARTS = ("compute_us", "comm_us", "overlap_us", "other_us", "idle_us")
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


def _parts_problem(row: dict[str, Any], span: float) -> str | None:
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
    if summary.get("basis") not in ("cpu", "gpu"):
        return "its basis is neither cpu nor gpu"
    steps = summary.get("steps")
    if type(steps) is not list or len(steps) > MAX_STEPS:
        return "its steps are not a list"
    cpu = summary["basis"] == "cpu"
    for i, row in enumerate(steps):
        why = _step_problem(i, row, cpu)
        if why is not None:
            return why
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
    if (summary["basis"] == "gpu") != (facts["kernels"] > 0) or \
            facts["comm_kernels"] > facts["kernels"]:
        return "its basis and its kernel counts disagree"
    numbered = sum(1 for row in steps if row.get("step") is not None)
    if numbered != facts["profiler_steps"] or len(steps) - numbered > (not numbered):
        return "its steps and its count of ProfilerStep rows disagree"
    info = facts.get("distributed_info")
    if info is not None and type(info) is not dict:
        return "its distributed_info is not an object"
    if not (_names(facts.get("hta_unrecognised")) and _names(facts.get("looks_like_comm"))):
        return "its facts' names are not lists of strings"
    if summary.get("bytes") is not None and not _count(summary.get("bytes")):
        return "its size is not a byte count"
    return None
