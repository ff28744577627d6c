"""One rank's collective calls, gathered from its trace as the events stream past.

:class:`Collectives` takes every event (``event(e)``) and, at the end, the trace's other
top-level keys (``result(meta)``), and returns the record collective_form.py describes:
per call its process group (name, ranks), its number within the group, the collective's
kind, bytes and dtype, the host time it was issued and when it ran. Where the calls come
from, in order of preference:

- **NCCL kernels (GPU)** whose args carry ``Collective name``, ``In/Out msg nelems``,
  ``dtype``, ``Process Group Name/Description/Ranks``, ``Group size`` and, from torch
  2.6 on, ``Seq``: start and end on the device; the host issue time is the
  ``record_param_comms`` operator with the same ``External id``.
- **record_param_comms (CPU side) joined to bare NCCL kernels** (older torch, kernels
  without those args) by ``External id``.
- **HCCL (NPU)**: torch_npu's ``hcom_*`` tasks, the group from their thread's name
  (``Group <name> Communication``) or a ``group_name`` arg, bytes from ``count`` and
  ``data_type``; no host issue time.
- **gloo (CPU)**: under torch 2.13 a gloo trace has no ``record_param_comms``; the call
  runs as ``gloo:<op>`` on one of its process group's worker threads (start and end, on
  the host clock) after ``c10d::<op>_`` issued it on the calling thread, and neither
  names the group or (without ``record_shapes``) the sizes. The runtime notes each
  call's group, sequence number and bytes from torch's flight recorder while a capture
  is open (runtime/capture/collective_notes.py), in the trace's ``policy_engine``
  metadata; each worker event is paired with the first pending call of its group of the
  same kind issued before it started (a worker thread serves one group, in the order its
  calls were issued). Without notes the calls are the worker events themselves, in an
  unknown group (``name`` null), numbered in the order they ran.

A call's number is torch's sequence number where one is known (``numbered: seq``), else
its place among its group's calls in the trace (``order``): ranks whose captures cover
the same steps number the same calls alike. Memory is bounded: at most MAX_HELD events of
each kind are held (past it, calls are counted only), and the record lists MAX_CALLS
calls, folding the rest per (group, kind, bytes) with their count and time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from policy_engine.analysis.chrome_trace import TraceEvent
from policy_engine.analysis.collective_form import (
    MAX_CALLS,
    MAX_FOLDED,
    MAX_GROUPS,
    MAX_LABELS,
    MAX_PROBLEMS,
    MAX_RANK,
    MAX_TEXT,
    P2P,
    CallTable,
    CollectiveRecord,
    Group,
    dtype_bytes,
    normal_name,
    rank_runs,
)

#: Events of each kind held per trace; past it a call is counted, not listed.
MAX_HELD = 200_000
#: Names classified once per trace and remembered (a hostile trace gets them afresh).
MAX_KINDS = 65536
#: A worker event may start this much before the issue time it is paired with (µs): the
#: flight recorder stamps a call a few µs after c10d's operator begins.
TOLERANCE_US = 100.0
#: Pending calls of a group looked at for a worker event's kind (a group's calls run in
#: issue order, two worker threads at most at once).
LOOKAHEAD = 8
_HUGE = 1e18
_NUMBER = (int, float)
_INTS = re.compile(r"-?\d+")
_GROUP_THREAD = re.compile(r"^Group\s+(.+?)\s+Communication", re.IGNORECASE)

_SKIP, _KERNEL, _PARAMS, _C10D, _GLOO, _HCCL = range(6)


def _kind(cat: str, name: str) -> int:
    low = name.lower()
    if cat == "kernel":
        return _KERNEL if low.startswith(("nccl", "rccl")) else _SKIP
    if name == "record_param_comms":
        return _PARAMS
    if low.startswith("c10d::"):
        return _C10D if cat == "cpu_op" else _SKIP
    if low.startswith("gloo:"):
        return _GLOO
    if low.startswith("hcom_"):
        return _HCCL
    return _SKIP


def _text(v: Any) -> str:
    return v[:MAX_TEXT] if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 1 << 53 else None


def _bytes(args: Mapping[str, Any]) -> tuple[str, int]:
    """(dtype, bytes) of a call from torch's args: the larger of its input and output
    elements times the element size (NCCL-tests' size)."""
    dtype = _text(args.get("dtype"))
    size = dtype_bytes(dtype) or 0
    n = max(_int(args.get("In msg nelems")) or 0, _int(args.get("Out msg nelems")) or 0)
    return dtype, n * size


def _ranks(args: Mapping[str, Any]) -> tuple[int | None, list[list[int]] | None]:
    """(size, runs) of the group torch's args describe; ``Process Group Ranks`` is text
    ("[0, 1]", cut with "..." for large groups) or a list."""
    size = _int(args.get("Group size"))
    raw = args.get("Process Group Ranks")
    ranks: list[int] | None = None
    if isinstance(raw, str) and "..." not in raw and len(raw) < 8 * MAX_RANK:
        ranks = [int(x) for x in _INTS.findall(raw)]
    elif isinstance(raw, list) and all(_int(x) is not None for x in raw):
        ranks = list(raw)
    start, stride = _int(args.get("Global rank start")), _int(args.get("Global rank stride"))
    if not ranks and size and start is not None and stride:
        ranks = [start + k * stride for k in range(min(size, MAX_RANK))]
    if not ranks or (size is not None and len(ranks) != size) or len(ranks) > MAX_RANK:
        return size, None
    return size if size is not None else len(ranks), rank_runs(sorted(ranks))


class Collectives:
    """What one pass over a trace's events gathers about its collectives."""

    def __init__(self) -> None:
        self.kinds: dict[tuple[str, str], int] = {}
        # (group key, number, kind, dtype, bytes, issue, start, end, External id)
        self.kernels: list[tuple[Any, ...]] = []
        self.bare: list[tuple[int | None, float, float, str]] = []  # ext, start, end, kind
        self.params: dict[int, tuple[Any, ...]] = {}  # External id -> (ts, key, number...)
        self.host: list[tuple[float, str]] = []  # c10d operators: (ts, kind)
        self.workers: list[tuple[float, float, str, int, int]] = []  # ts, end, kind, tid, B
        self.hccl: list[tuple[Any, ...]] = []
        self.threads: dict[tuple[Any, Any], str] = {}
        self.groups: dict[Any, tuple[str | None, str, Mapping[str, Any]]] = {}
        self.seen = 0  # collective events past MAX_HELD
        self.p2p = 0

    # -- the stream -----------------------------------------------------------------
    def event(self, e: TraceEvent) -> None:
        ph = e.get("ph")
        if ph == "M":
            self._meta_event(e)
            return
        if ph != "X":
            return
        cat, name = e.get("cat"), e.get("name")
        key = (cat if type(cat) is str else "", name if type(name) is str else "")
        kind = self.kinds.get(key)
        if kind is None:
            kind = _kind(*key)
            if len(self.kinds) < MAX_KINDS:
                self.kinds[key] = kind
        if kind == _SKIP:
            return
        ts: Any = e.get("ts")
        dur: Any = e.get("dur")
        if type(ts) not in _NUMBER or type(dur) not in _NUMBER \
                or not (0 <= dur < _HUGE and -_HUGE < ts < _HUGE):
            return
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        if kind == _KERNEL:
            self._kernel(key[1], ts, ts + dur, args)
        elif kind == _PARAMS:
            self._params(ts, args)
        elif kind == _C10D:
            self._held(self.host, (ts, normal_name(key[1])))
        elif kind == _GLOO:
            tid = e.get("tid")
            self._held(self.workers, (ts, ts + dur, normal_name(key[1]),
                                      tid if type(tid) is int else -1, _shape_bytes(args)))
        else:
            self._hccl(e, key[1], ts, ts + dur, args)

    def _held(self, into: list[Any], item: Any) -> None:
        if len(into) < MAX_HELD:
            into.append(item)
        else:
            self.seen += 1

    def _meta_event(self, e: TraceEvent) -> None:
        args = e.get("args")
        if e.get("name") == "thread_name" and isinstance(args, dict) \
                and len(self.threads) < MAX_KINDS:
            self.threads[(e.get("pid"), e.get("tid"))] = _text(args.get("name"))

    def _group_key(self, args: Mapping[str, Any]) -> Any:
        name, desc = _text(args.get("Process Group Name")), \
            _text(args.get("Process Group Description"))
        key = (name, desc, str(args.get("Process Group Ranks"))[:MAX_TEXT],
               args.get("Group size"))
        if key not in self.groups and len(self.groups) < MAX_GROUPS:
            self.groups[key] = (name or None, desc, args)
        return key

    def _kernel(self, name: str, ts: float, end: float, args: Mapping[str, Any]) -> None:
        ext = _int(args.get("External id"))
        coll = args.get("Collective name")
        if not isinstance(coll, str):  # a kernel without torch's args: joined later
            self._held(self.bare, (ext, ts, end, normal_name(name)))
            return
        kind = normal_name(coll)
        if kind in P2P:
            self.p2p += 1
            return
        dtype, size = _bytes(args)
        self._held(self.kernels, (self._group_key(args), _int(args.get("Seq")), kind, dtype,
                                  size, math.nan, ts, end, ext))

    def _params(self, ts: float, args: Mapping[str, Any]) -> None:
        ext = _int(args.get("External id"))
        coll = args.get("Collective name")
        if ext is None or not isinstance(coll, str) or coll.lower() == "wait":
            return
        kind = normal_name(coll)
        if kind in P2P:
            return  # counted from its kernel
        dtype, size = _bytes(args)
        if len(self.params) < MAX_HELD:
            self.params[ext] = (ts, self._group_key(args), _int(args.get("Seq")), kind,
                                dtype, size)

    def _hccl(self, e: TraceEvent, name: str, ts: float, end: float,
              args: Mapping[str, Any]) -> None:
        thread = self.threads.get((e.get("pid"), e.get("tid")), "")
        found = _GROUP_THREAD.match(thread)
        group = found.group(1) if found else _text(args.get("group_name")) or None
        kind = normal_name(name)
        if kind in P2P:
            self.p2p += 1
            return
        dtype = _text(args.get("data_type"))
        size = (_int(args.get("count")) or 0) * (dtype_bytes(dtype) or 0)
        self._held(self.hccl, (group, kind, dtype, size, ts, end))

    # -- the record -----------------------------------------------------------------
    def result(self, meta: Mapping[str, Any] | None = None) -> CollectiveRecord:
        """The record (collective_form.py) of what the events held; ``meta``: the trace's
        top-level keys other than its events (the runtime's notes, the process groups
        torch lists in ``distributedInfo``, ``baseTimeNanoseconds``)."""
        table = CallTable()
        meta = meta if isinstance(meta, Mapping) else {}
        calls: list[tuple[Any, ...]]  # (group index, number, kind, dtype, bytes, issue,
        #                               start, end)
        if self.kernels:
            calls = self._from_kernels(table)
        elif self.bare:
            calls = self._from_params(table) if self.params else self._from_bare(table)
        elif self.hccl:
            calls = self._from_hccl(table)
        elif self.workers or self.host:
            calls = _CpuCalls(self, meta, table).calls()
        else:
            calls = []
        if self.workers and table.source in ("nccl", "record_param_comms", "hccl"):
            table.problems.append(f"{len(self.workers)} gloo calls beside the device's are "
                                  "not listed: the record holds one backend's calls")
        if not calls:
            table.groups = []
        _number(calls, table)
        _fill(table, calls, self.seen, self.p2p)
        return table.to_json()

    def _table_group(self, table: CallTable, key: Any, index: dict[Any, int]) -> int | None:
        found = index.get(key)
        if found is None and key in self.groups and len(table.groups) < MAX_GROUPS:
            name, desc, args = self.groups[key]
            size, runs = _ranks(args)
            table.groups.append(Group(name, desc, size, runs))
            found = index[key] = len(table.groups) - 1
        return found

    def _from_kernels(self, table: CallTable) -> list[tuple[Any, ...]]:
        table.source, table.clock = "nccl", "device"
        index: dict[Any, int] = {}
        out = []
        for key, number, kind, dtype, size, _, start, end, ext in self.kernels:
            g = self._table_group(table, key, index)
            if g is None:
                self.seen += 1
                continue
            host = self.params.get(ext) if ext is not None else None
            out.append((g, number, kind, dtype, size, host[0] if host else math.nan,
                        start, end))
        return out

    def _from_params(self, table: CallTable) -> list[tuple[Any, ...]]:
        table.source, table.clock = "record_param_comms", "device"
        index: dict[Any, int] = {}
        out, missing = [], 0
        kernels = {ext: (start, end) for ext, start, end, _ in self.bare if ext is not None}
        for ext, (ts, key, number, kind, dtype, size) in self.params.items():
            times = kernels.get(ext)
            g = self._table_group(table, key, index)
            if times is None or g is None:
                missing += 1
                continue
            out.append((g, number, kind, dtype, size, ts, *times))
        if missing:
            table.problems.append(f"{missing} record_param_comms operators launched no "
                                  "kernel the trace holds: not listed")
        return out

    def _from_bare(self, table: CallTable) -> list[tuple[Any, ...]]:
        """NCCL kernels without torch's args and no record_param_comms to name them
        (older torch): each a call of an unknown group and size, its kind from its name."""
        table.source, table.clock = "nccl", "device"
        table.groups.append(Group(None))
        out = []
        for _, start, end, kind in self.bare:
            if kind in P2P:
                self.p2p += 1
            else:
                out.append((0, None, kind, "", 0, math.nan, start, end))
        if out:
            table.problems.append("the NCCL kernels carry no collective args: group and "
                                  "bytes unknown")
        return out

    def _from_hccl(self, table: CallTable) -> list[tuple[Any, ...]]:
        table.source, table.clock = "hccl", "device"
        index: dict[str | None, int] = {}
        out = []
        for group, kind, dtype, size, start, end in self.hccl:
            g = index.get(group)
            if g is None:
                if len(table.groups) >= MAX_GROUPS:
                    self.seen += 1
                    continue
                table.groups.append(Group(group))
                g = index[group] = len(table.groups) - 1
            out.append((g, None, kind, dtype, size, math.nan, start, end))
        return out


def _shape_bytes(args: Mapping[str, Any]) -> int:
    """The input's bytes from ``Input Dims`` and ``Input type`` (record_shapes), else 0."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not (isinstance(dims, list) and isinstance(types, list)) or len(dims) > 64:
        return 0
    total = 0
    for shape, dtype in zip(dims, types, strict=False):
        size = dtype_bytes(dtype) if isinstance(dtype, str) else None
        if size is None or not isinstance(shape, list) or len(shape) > 16:
            continue
        n = 1
        for d in shape:
            if _int(d) is None:
                break
            n *= d
        else:
            total += n * size
    return total if total < 1 << 53 else 0


class _CpuCalls:
    """gloo's calls: the runtime's notes (or, without them, c10d's operators) paired with
    the worker events that ran them (module docstring)."""

    def __init__(self, found: Collectives, meta: Mapping[str, Any], table: CallTable) -> None:
        self.found, self.table = found, table
        table.source, table.clock = "gloo", "host"
        notes = _notes(meta)
        # per group: its pending calls in issue order, (issue, kind, number, dtype, bytes)
        self.pending: list[list[tuple[float, str, int | None, str, int]]] = []
        if notes is not None:
            self._from_notes(notes, meta)
        else:
            table.source = "c10d" if found.host else "gloo"
            table.groups.append(Group(None))
            self.pending.append([(ts, kind, None, "", 0) for ts, kind in
                                 sorted(found.host) if kind not in P2P])

    def _from_notes(self, notes: list[Any], meta: Mapping[str, Any]) -> None:
        base = meta.get("baseTimeNanoseconds")
        base = base if type(base) is int and 0 <= base < 1 << 63 else None
        configs = _pg_configs(meta)
        index: dict[tuple[str, str], int] = {}
        for row in notes:
            name, desc, seq, op, size, dtype, created = row
            g = index.get((name, desc))
            if g is None:
                if len(self.table.groups) >= MAX_GROUPS:
                    continue
                gsize, runs = configs.get(name, (None, None))
                self.table.groups.append(Group(name, desc, gsize, runs))
                self.pending.append([])
                g = index[(name, desc)] = len(self.table.groups) - 1
            issue = (created - base) / 1000 if base is not None else math.nan
            self.pending[g].append((issue, normal_name(op), seq, dtype, size))
        for calls in self.pending:
            calls.sort(key=lambda c: (c[2] if c[2] is not None else 0, c[0]))
        if base is None:
            self.table.problems.append("the trace has no baseTimeNanoseconds: the calls' "
                                       "issue times are unknown")

    def calls(self) -> list[tuple[Any, ...]]:
        """Each worker event paired with its call: the first pending call of the same kind
        of the group its thread serves. A thread's group is known once one of its events
        had a single candidate; until then an event with several takes the call issued
        nearest its start (an idle thread starts its call as soon as it is issued), and
        says nothing of its thread."""
        bound: dict[int, int] = {}
        heads = [0] * len(self.pending)
        used = [bytearray(len(p)) for p in self.pending]
        out: list[tuple[Any, ...]] = []
        unpaired = 0
        for ts, end, kind, tid, shape in sorted(self.found.workers):
            if kind in P2P:
                continue
            found: list[tuple[float, int, int]] = []
            for g in ([bound[tid]] if tid in bound else range(len(self.pending))):
                i = self._candidate(g, heads[g], used[g], kind, ts)
                if i is not None:
                    found.append((abs(ts - self.pending[g][i][0]), g, i))
            if not found:
                unpaired += 1
                if self.table.groups[0].name is None and len(self.pending) == 1:
                    out.append((0, None, kind, "", shape, math.nan, ts, end))
                continue
            _, g, i = min(found)
            if len(found) == 1:
                bound.setdefault(tid, g)
            used[g][i] = 1
            while heads[g] < len(used[g]) and used[g][heads[g]]:
                heads[g] += 1
            issue, _, seq, dtype, size = self.pending[g][i]
            out.append((g, seq, kind, dtype, size or shape, issue, ts, end))
        left = sum(len(u) - sum(u) for u in used)
        if self.table.groups and self.table.groups[0].name is not None:
            if unpaired:
                self.table.problems.append(f"{unpaired} gloo worker events matched no "
                                           "noted call: not listed")
            if left:
                self.table.problems.append(f"{left} noted calls ran on no worker thread "
                                           "the trace holds: not listed")
        return out

    def _candidate(self, g: int, head: int, used: bytearray, kind: str,
                   ts: float) -> int | None:
        calls = self.pending[g]
        seen = 0
        for i in range(head, len(calls)):
            if used[i]:
                continue
            issue, k = calls[i][0], calls[i][1]
            if not math.isnan(issue) and issue > ts + TOLERANCE_US:
                return None  # issued after the event began: later calls are later still
            if k == kind:
                return i
            seen += 1
            if seen >= LOOKAHEAD:
                return None
        return None


def _notes(meta: Mapping[str, Any]) -> list[tuple[str, str, int | None, str, int, str, int]] \
        | None:
    """The runtime's notes of the capture's calls (``policy_engine.collectives.calls``:
    rows ``[group name, group description, seq, op, bytes, dtype, issued ns]``), checked;
    None when the trace has none."""
    engine = meta.get("policy_engine")
    notes = engine.get("collectives") if isinstance(engine, dict) else None
    rows = notes.get("calls") if isinstance(notes, dict) else None
    if not isinstance(rows, list):
        return None
    out = []
    for row in rows[:MAX_HELD]:
        if not (isinstance(row, list) and len(row) == 7):
            continue
        name, desc, seq, op, size, dtype, created = row
        if isinstance(name, str) and isinstance(desc, str) and isinstance(op, str) \
                and isinstance(dtype, str) and _int(size) is not None \
                and type(created) is int and 0 <= created < 1 << 63:
            out.append((name[:MAX_TEXT], desc[:MAX_TEXT], _int(seq), op[:MAX_TEXT], size,
                        dtype[:MAX_TEXT], created))
    return out


def _pg_configs(meta: Mapping[str, Any]) -> dict[str, tuple[int | None, Any]]:
    """Group name -> (size, runs) from the ``pg_config`` torch writes in
    ``distributedInfo``."""
    info = meta.get("distributedInfo")
    configs = info.get("pg_config") if isinstance(info, dict) else None
    out: dict[str, tuple[int | None, Any]] = {}
    if not isinstance(configs, list):
        return out
    for pg in configs[:MAX_GROUPS]:
        if not isinstance(pg, dict) or not isinstance(pg.get("pg_name"), str):
            continue
        ranks = pg.get("ranks")
        if isinstance(ranks, list) and len(ranks) <= MAX_RANK \
                and all(_int(r) is not None for r in ranks):
            runs = rank_runs(sorted(ranks)) if ranks else None
            out[pg["pg_name"]] = (len(ranks) if runs is not None else _int(pg.get("pg_size")),
                                  runs)
        else:
            out[pg["pg_name"]] = (_int(pg.get("pg_size")), None)
    return out


def _number(calls: list[tuple[Any, ...]], table: CallTable) -> None:
    """Sort ``calls`` by start and give each its number: the sequence number where every
    call of its group has one, else its place among its group's calls."""
    calls.sort(key=lambda c: c[6])
    with_seq = {c[0] for c in calls if c[1] is not None}
    without = {c[0] for c in calls if c[1] is None}
    counters: dict[int, int] = {}
    for i, c in enumerate(calls):
        if c[0] in without:
            counters[c[0]] = counters.get(c[0], 0) + 1
            calls[i] = (c[0], counters[c[0]], *c[2:])
    table.numbered = "seq" if with_seq and not without else "order"
    if with_seq and without:
        table.problems.append("some groups' calls carry no sequence number: numbered in "
                              "the order they ran")


def _label(labels: list[str], index: dict[str, int], value: str) -> int:
    found = index.get(value)
    if found is None:
        if len(labels) >= MAX_LABELS:
            value = "other"
            found = index.get(value)
            if found is not None:
                return found
        labels.append(value)
        found = index[value] = len(labels) - 1
    return found


def _fill(table: CallTable, calls: list[tuple[Any, ...]], seen: int, p2p: int) -> None:
    """The first MAX_CALLS calls into the table's columns; the rest folded."""
    names: dict[str, int] = {}
    dtypes: dict[str, int] = {}
    folded: dict[tuple[int, int, int], list[Any]] = {}
    dropped = 0
    for g, number, kind, dtype, size, issue, start, end in calls:
        k = _label(table.names, names, kind)
        if len(table.start) < MAX_CALLS:
            table.group.append(g)
            table.number.append(number)
            table.name.append(k)
            table.dtype.append(_label(table.dtypes, dtypes, dtype))
            table.bytes.append(size)
            table.issue.append(issue)
            table.start.append(start)
            table.end.append(end)
            continue
        row = folded.get((g, k, size))
        if row is None:
            if len(folded) >= MAX_FOLDED:
                dropped += 1
                continue
            row = folded[(g, k, size)] = [g, k, size, 0, 0.0]
        row[3] += 1
        row[4] += end - start
    table.rebase()
    table.folded = [[*r[:4], round(r[4], 3)] for r in folded.values()]
    table.total = len(calls) + seen
    table.p2p = p2p
    table.capped = len(calls) > MAX_CALLS or seen > 0
    if seen:
        table.problems.append(f"the trace holds more than {MAX_HELD:,} collective events "
                              f"of a kind: {seen:,} calls counted, not listed")
    if dropped:
        table.problems.append(f"{dropped:,} calls past the first {MAX_CALLS:,} fit no "
                              f"folded row (at most {MAX_FOLDED}): counted only")
    del table.problems[MAX_PROBLEMS:]
