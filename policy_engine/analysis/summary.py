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

import heapq
import os
import re
from typing import Any

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
MAX_SUMMARY_STEPS = 2000
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


class _Pass:
    """What one pass over the events gathers."""

    def __init__(self) -> None:
        self.ops, self.comm = Spans(), Spans()
        self.k_comp, self.k_comm, self.k_other = Spans(), Spans(), Spans()
        # spans by kind (the first, for _SKIP, is never added to)
        self.spans = (Spans(), self.ops, self.comm, self.k_comp, self.k_comm, self.k_other)
        self.kinds: dict[tuple[str, str], int] = {}
        # The first MAX_SUMMARY_STEPS + 1 steps by start, then by order in the trace (the
        # one after the last listed ends its window), as a heap of (-start, -order,
        # number, end); how many there were.
        self.steps: list[tuple[float, int, int, float]] = []
        self.step_count = 0
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
            self.step_count += 1
            step = (-ts, -self.step_count, int(found.group(1)), ts + dur)
            if len(self.steps) <= MAX_SUMMARY_STEPS:
                heapq.heappush(self.steps, step)
            elif step > self.steps[0]:  # starts before the latest one kept
                heapq.heapreplace(self.steps, step)

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


def _steps(p: _Pass, gpu: bool, parts: tuple[Merged, Merged, Merged],
           joint: tuple[Merged, Merged]) -> list[dict[str, Any]]:
    """Each ProfilerStep's time and breakdown (the first MAX_SUMMARY_STEPS); one step
    (None) for the whole trace when there is no ProfilerStep row."""
    compute, comm, other = parts
    if not p.steps:
        whole = bounds(joint[1])
        if whole is None:
            return []
        return [{"step": None, "time_us": _r(whole[1] - whole[0]),
                 **_breakdown(compute, comm, other, *whole, joint)}]
    rows = []
    steps = [(n, -start, end) for start, _, n, end in sorted(p.steps, reverse=True)]
    last_end = max((b[1] for b in (bounds(x) for x in parts) if b is not None),
                   default=steps[-1][2])
    for i, (number, start, end) in enumerate(steps[:MAX_SUMMARY_STEPS]):
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


def summarize(path: str, *, max_bytes: int | None = None) -> dict[str, Any]:
    """The summary of the trace at ``path``; ``{"error": ...}`` when it cannot be read
    (or holds more than ``max_bytes`` of text)."""
    p = _Pass()
    try:
        size = os.path.getsize(path)
        with TraceReader(path, max_bytes=max_bytes, max_ratio=MAX_RATIO) as reader:
            for event in reader.events():
                p.event(event)
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
    joint = (intersect(parts[0], parts[1]), union(*parts))  # once, not per step
    steps = _steps(p, gpu, parts, joint)
    device = None
    if gpu:
        whole = bounds(joint[1])
        assert whole is not None  # there are kernels
        device = _breakdown(*parts, *whole, joint)
        device["kernel_us"] = device.pop("span_us")
    regions = sorted(p.regions.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP_REGIONS]
    ops = sorted(p.names.items(), key=lambda kv: (-kv[1][1], kv[0]))[:TOP_OPS]
    return {
        "bytes": size,
        "basis": "gpu" if gpu else "cpu",
        "steps": steps,
        "device": device,
        "regions": {name: {"count": int(n), "time_us": _r(t)} for name, (n, t) in regions},
        # time inside each call, nested calls included (a stream keeps no stack)
        "ops": {"top": [{"cat": cat, "name": name, "calls": int(n), "time_us": _r(t)}
                        for (cat, name), (n, t) in ops],
                "left_out": p.names_left_out},
        "facts": {
            "events": count,
            "profiler_steps": p.step_count,
            "kernels": kernels,
            "comm_kernels": p.k_comm.count,
            "cpu_comm_ops": p.comm.count,
            "distributed_info": _distributed(meta),
            "hta_unrecognised": sorted(p.hta_missed),
            "looks_like_comm": sorted(p.looks_comm),
            "regions_left_out": p.regions_left_out,
            **({"steps_left_out": p.step_count - len(steps)}
               if p.step_count > len(steps) else {}),
        },
    }


# -- a summary read back from a manifest ------------------------------------------------

_STEP_KEYS = ("time_us", "span_us", "compute_us", "comm_us", "overlap_us", "other_us",
              "idle_us")
_COUNTS = ("events", "profiler_steps", "kernels", "comm_kernels", "cpu_comm_ops",
           "regions_left_out")
#: A summary read from a manifest holds at most this many steps and names.
MAX_STEPS = 100_000


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < _HUGE


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _names(v: Any) -> bool:
    return isinstance(v, list) and len(v) <= MAX_STEPS and all(isinstance(x, str) for x in v)


def problem(summary: Any) -> str | None:
    """Why ``summary`` (read from a manifest, so untrusted) is not what :func:`summarize`
    returns, or None when every figure the analyses use is there with its type."""
    if not isinstance(summary, dict):
        return "it is not an object"
    if summary.get("basis") not in ("cpu", "gpu"):
        return "its basis is neither cpu nor gpu"
    steps = summary.get("steps")
    if not isinstance(steps, list) or len(steps) > MAX_STEPS:
        return "its steps are not a list"
    for i, row in enumerate(steps):
        if not isinstance(row, dict) or not all(_number(row.get(k)) for k in _STEP_KEYS):
            return f"step {i} lacks a figure"
        if row.get("step") is not None and not _count(row.get("step")):
            return f"step {i} has no step number"
    device = summary.get("device")
    if device is not None and not (isinstance(device, dict)
                                   and all(_number(v) for v in device.values())):
        return "its device breakdown is not numbers"
    regions = summary.get("regions")
    if not isinstance(regions, dict) or len(regions) > MAX_REGIONS or not all(
            isinstance(v, dict) and _count(v.get("count")) and _number(v.get("time_us"))
            for v in regions.values()):
        return "its regions are not counts and times"
    ops = summary.get("ops", {"top": [], "left_out": 0})
    if not isinstance(ops, dict) or not _count(ops.get("left_out")):
        return "its operators are not an object with a count"
    ops = ops.get("top")
    if not isinstance(ops, list) or len(ops) > MAX_OPS or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str)
            and isinstance(o.get("cat"), str) and _count(o.get("calls"))
            and _number(o.get("time_us")) for o in ops):
        return "its operators are not names, counts and times"
    facts = summary.get("facts")
    if not isinstance(facts, dict) or not all(_count(facts.get(k)) for k in _COUNTS):
        return "its facts lack a count"
    if not _count(facts.get("steps_left_out", 0)):
        return "its steps_left_out is not a count"
    info = facts.get("distributed_info")
    if info is not None and not isinstance(info, dict):
        return "its distributed_info is not an object"
    if not all(_names(facts.get(k)) for k in ("hta_unrecognised", "looks_like_comm")):
        return "its facts' names are not lists of strings"
    if summary.get("bytes") is not None and not _count(summary.get("bytes")):
        return "its size is not a byte count"
    return None
