"""Operators by self time, read from torch traces under a budget (the report's tables)."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

from policy_engine.analysis.chrome_trace import TraceError, TraceReader, TraceTooLarge
from policy_engine.analysis.format import size_cell
from policy_engine.analysis.report_page import Ops, PageEntry
from policy_engine.analysis.window_roles import TORCH_SUFFIXES
from policy_engine.files.records import Status

#: Trace events whose self time the page lists (others still nest: a user_annotation
#: range encloses operators but is not one).
OP_CATEGORIES = frozenset({"cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime",
                           "cuda_driver"})
#: The most timed events whose self times one trace's table is computed from (memory
#: grows with them: about 150 bytes each).
MAX_OP_EVENTS = 1_000_000
#: A gzipped trace whose text grows past this many times its compressed size is left
#: unread (torch traces inflate 10 to 20 times; a gzip bomb, hundreds).
MAX_RATIO = 100
_HUGE = 1e18  # microseconds: 30,000 years; beyond it a timestamp is garbage (as summary's)


# -- operators by self time ---------------------------------------------------------

class _TooMany(Exception):
    pass


def self_times(events: Iterator[Any], top: int, *, max_events: int = MAX_OP_EVENTS
               ) -> tuple[tuple[str, str, float, int], ...]:
    """The ``top`` operators by self time: (name, category, self µs, calls). An event's
    self time is its duration less that of the events directly inside it on the same
    (pid, tid), found with a stack over the thread's events in time order. _TooMany past
    ``max_events`` timed events."""
    threads: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    kinds: dict[tuple[str, str], int] = {}
    held = 0
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) \
                or not (-_HUGE < ts < _HUGE and -_HUGE < dur < _HUGE):
            continue  # no time: an integer of hundreds of digits would overflow the sums
        cat = e.get("cat")
        kind = kinds.setdefault((str(e.get("name")), str(cat)), len(kinds)) \
            if cat in OP_CATEGORIES else -1
        try:  # integer nanoseconds: nesting is exact, whatever the float rounding
            start, length = round(ts * 1000), max(round(dur * 1000), 0)
        except (OverflowError, ValueError):
            continue
        held += 1
        if held > max_events:
            raise _TooMany
        thread = (str(e.get("pid")), str(e.get("tid")))
        threads.setdefault(thread, []).append((start, -length, kind))
    totals = [0] * len(kinds)
    calls = [0] * len(kinds)
    for evs in threads.values():
        evs.sort()
        stack: list[list[int]] = []  # [end, kind, self]

        def finish(item: list[int]) -> None:
            if item[1] >= 0:
                totals[item[1]] += max(item[2], 0)
                calls[item[1]] += 1
        for start, neg, kind in evs:
            end = start - neg
            while stack and stack[-1][0] <= start:  # ended before this one began
                finish(stack.pop())
            if stack and end <= stack[-1][0]:
                stack[-1][2] += neg  # a child: its time is not its parent's own
            stack.append([end, kind, -neg])
        for item in stack:
            finish(item)
    names = {i: k for k, i in kinds.items()}
    best = sorted(range(len(kinds)), key=lambda i: (-totals[i], names[i]))[:top]
    return tuple((names[i][0], names[i][1], totals[i] / 1000, calls[i]) for i in best)


def _declared_size(path: str) -> int | None:
    """The size a gzip file says it inflates to (its last four bytes: exact for a file of
    one member under 4 GiB), or None for a file that is not gzip. Read before inflating,
    so a gzip bomb is refused at once; one that lies is still stopped by the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # the reader says why
    try:
        size = os.fstat(fd).st_size
        if size < 18 or os.pread(fd, 2, 0) != b"\x1f\x8b":
            return None
        declared = int(struct.unpack("<I", os.pread(fd, 4, size - 4))[0])
    except OSError:
        return None
    finally:
        os.close(fd)
    # deflate inflates at most ~1032 times: more is the trailer of a cut or damaged file
    return declared if declared <= 1032 * size else None


def read_ops(path: str, *, top: int, limit: int, budget: int | None = None,
             used: list[int] | None = None) -> Ops:
    """The top operators of the trace at ``path``, or why they could not be read: at
    most ``limit`` bytes of text (--max-trace-mb), and ``budget`` (what is left of
    --max-total-mb; the bytes read are added to ``used``)."""
    declared = _declared_size(path)
    if declared is not None and declared > limit:
        return Ops(why=f"operators not read: its gzip trailer says it inflates to "
                       f"{size_cell(declared)}, over {size_cell(limit)} (--max-trace-mb)")
    cap = limit if budget is None else min(limit, budget)
    reader = None
    try:
        with TraceReader(path, max_bytes=cap, max_ratio=MAX_RATIO) as reader:
            return Ops(rows=self_times(reader.events(), top))
    except TraceTooLarge:
        if cap < limit:
            return Ops(why="operators not read: the traces read before it used up "
                           "--max-total-mb")
        return Ops(why=f"operators not read: the trace is over {size_cell(limit)} "
                       "uncompressed (--max-trace-mb)")
    except _TooMany:
        return Ops(why=f"operators not read: more than {MAX_OP_EVENTS:,} timed events")
    except TraceError as err:
        return Ops(why=f"operators not read: {err}")
    finally:
        if used is not None and reader is not None:
            used.append(reader.bytes_read)


def _is_trace(c: PageEntry) -> bool:
    return bool(c.path and c.exists and c.path.endswith(TORCH_SUFFIXES))


def read_all_ops(entries: list[PageEntry], root: str, *, count: int, top: int,
                 limit: int, total: int) -> tuple[dict[int, Ops], list[str]]:
    """Operators of up to ``count`` torch traces, those needing attention first, reading
    at most ``limit`` bytes of text of each and ``total`` of all; and notes for the
    page."""
    traces = [c for c in entries if _is_trace(c)]
    traces.sort(key=lambda c: (c.status == Status.COMPLETE, c.role,
                               -1 if c.rank is None else c.rank, c.column))
    used: list[int] = []
    ops = {id(c): read_ops(os.path.join(root, c.path or ""), top=top, limit=limit,
                           budget=total - sum(used), used=used)
           for c in traces[:count]}
    notes = []
    if len(traces) > count:
        notes.append(f"Operators were read from {count} of the {len(traces)} torch "
                     "traces (those that need attention first); --ops N reads more.")
    skipped = sum(1 for o in ops.values() if o.why)
    if skipped:
        notes.append(f"{skipped} trace(s) could not be read for operators; each says why.")
    return ops, notes
