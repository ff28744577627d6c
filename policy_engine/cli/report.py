"""policy-engine report DIR [-o OUT.html]: every capture of a run as one static HTML page.

The captures are those `policy-engine traces DIR` lists (captures that never closed
included). Per role, a grid of ranks by steps coloured by outcome (ranks with the same
outcome at every step share a row), then every capture with its size, plan hash and a
link to its file; captures that need attention come first, with their errors. For torch
traces (.pt.trace.json[.gz]) the operators with the most self time are listed; the file
is read as a stream, and --ops and --max-trace-mb bound the work and the memory. The page
fetches nothing and runs no script, so it opens where the cluster is.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Iterator
from typing import IO, Any

from policy_engine.cli._common import whole_number
from policy_engine.cli.report_page import Capture, Ops, captures, render
from policy_engine.cli.traces import _size, collect
from policy_engine.cli.usage import UsageError

#: Trace events whose self time the page lists (others still nest: a user_annotation
#: range encloses operators but is not one).
OP_CATEGORIES = frozenset({"cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime",
                           "cuda_driver"})
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
_CHUNK = 1 << 20
#: The longest single event read; a longer one makes the trace unreadable here.
_MAX_EVENT = 1 << 20
_EVENTS_KEY = re.compile(r'"traceEvents"\s*:\s*\[')
_NEXT = re.compile(r"[^\s,]")


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("dir", metavar="DIR")
    parser.add_argument("-o", "--output", metavar="OUT", default="report.html",
                        help="the page to write (default: report.html)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--top", type=whole_number, default=10, metavar="K",
                        help="operators listed per trace (default: 10)")
    parser.add_argument("--ops", type=whole_number, default=32, metavar="N",
                        help="torch traces to read operators from, those that need "
                             "attention first (default: 32; 0 reads none)")
    parser.add_argument("--max-trace-mb", type=whole_number, default=256, metavar="MB",
                        help="skip the operators of a trace longer than this, "
                             "uncompressed (default: 256)")
    parser.set_defaults(run=run)


# -- operators by self time ---------------------------------------------------------

class _TooLarge(Exception):
    pass


def _events(stream: IO[str], limit: int) -> Iterator[Any]:
    """The items of the trace's ``traceEvents`` list, one at a time: memory holds a
    chunk and one event, never the trace. _TooLarge past ``limit`` characters;
    ValueError when the text is not a Chrome trace."""
    decoder = json.JSONDecoder()
    buf, pos, read, eof = "", 0, 0, False

    def more() -> None:
        nonlocal buf, pos, read, eof
        chunk = stream.read(_CHUNK)
        read += len(chunk)
        if read > limit:
            raise _TooLarge
        eof = not chunk
        buf, pos = buf[pos:] + chunk, 0

    while (found := _EVENTS_KEY.search(buf)) is None:
        if eof:
            raise ValueError("no traceEvents list")
        buf, pos = buf[-64:], 0  # the key may straddle two chunks
        more()
    pos = found.end()
    while True:
        found = _NEXT.search(buf, pos)
        pos = found.start() if found is not None else len(buf)
        if pos == len(buf):
            if eof:
                raise ValueError("the traceEvents list never ends")
            more()
            continue
        if buf[pos] == "]":
            return
        try:
            value, pos = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError as err:
            if eof:
                raise ValueError(f"not JSON, or cut short: {err.msg}") from None
            if len(buf) - pos > _MAX_EVENT:
                raise ValueError(f"not JSON, or an event over {_MAX_EVENT >> 20} MiB: "
                                 f"{err.msg}") from None
            more()
            continue
        yield value


def self_times(events: Iterator[Any], top: int) -> tuple[tuple[str, str, float, int], ...]:
    """The ``top`` operators by self time: (name, category, self µs, calls). An event's
    self time is its duration less that of the events directly inside it on the same
    (pid, tid), found with a stack over the thread's events in time order."""
    threads: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    kinds: dict[tuple[str, str], int] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        cat = e.get("cat")
        kind = kinds.setdefault((str(e.get("name")), str(cat)), len(kinds)) \
            if cat in OP_CATEGORIES else -1
        try:  # integer nanoseconds: nesting is exact, whatever the float rounding
            start, length = round(ts * 1000), max(round(dur * 1000), 0)
        except (OverflowError, ValueError):
            continue
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


def read_ops(path: str, *, top: int, limit: int) -> Ops:
    """The top operators of the trace at ``path``, or why they could not be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        return Ops(why=f"cannot read it: {err.strerror or err}")
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Ops(why="not a regular file")
        try:
            packed = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            with (gzip.open(raw, "rt", encoding="utf-8", errors="replace") if packed
                  else io.TextIOWrapper(raw, encoding="utf-8", errors="replace")) as text:
                return Ops(rows=self_times(_events(text, limit), top))
        except _TooLarge:
            return Ops(why=f"operators not read: the trace is over {_size(limit)} "
                           "uncompressed (--max-trace-mb)")
        except (ValueError, OSError, EOFError, zlib.error, RecursionError) as err:
            return Ops(why=f"operators not read: {type(err).__name__}: {err}")


def _is_trace(c: Capture) -> bool:
    return bool(c.path and c.exists and c.path.endswith(TRACE_SUFFIXES))


def read_all_ops(entries: list[Capture], root: str, *, count: int, top: int,
                 limit: int) -> tuple[dict[int, Ops], list[str]]:
    """Operators of up to ``count`` torch traces, those needing attention first; and
    notes for the page."""
    traces = [c for c in entries if _is_trace(c)]
    traces.sort(key=lambda c: (c.status == "complete", c.role,
                               -1 if c.rank is None else c.rank, c.column))
    ops = {id(c): read_ops(os.path.join(root, c.path or ""), top=top, limit=limit)
           for c in traces[:count]}
    notes = []
    if len(traces) > count:
        notes.append(f"Operators were read from {count} of the {len(traces)} torch "
                     "traces (those that need attention first); --ops N reads more.")
    skipped = sum(1 for o in ops.values() if o.why)
    if skipped:
        notes.append(f"{skipped} trace(s) could not be read for operators; each says why.")
    return ops, notes


# -- the command --------------------------------------------------------------------

def _write(page: str, out: str, force: bool) -> None:
    """``page`` into ``out``, whole or not at all; an existing ``out`` only with force."""
    fd, temp = tempfile.mkstemp(prefix=".policy-engine-report-", suffix=".tmp",
                                dir=os.path.dirname(os.path.abspath(out)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.chmod(temp, 0o644)
        if force:
            os.replace(temp, out)
            return
        try:
            os.link(temp, out)  # fails, rather than replaces, when out exists
        except FileExistsError:
            raise UsageError(f"{out} exists (--force replaces it)") from None
        except OSError:  # a file system without hard links
            if os.path.lexists(out):
                raise UsageError(f"{out} exists (--force replaces it)") from None
            os.rename(temp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.dir):
        raise UsageError(f"{args.dir} is not a folder")
    out = args.output
    if os.path.isdir(out):
        raise UsageError(f"{out} is a folder: give the page's file name")
    if os.path.lexists(out) and not args.force:
        raise UsageError(f"{out} exists (--force replaces it)")
    data = collect(args.dir)
    entries = captures(data, args.dir, os.path.dirname(os.path.abspath(out)))
    ops, notes = read_all_ops(entries, args.dir, count=args.ops, top=args.top,
                              limit=args.max_trace_mb << 20)
    title = f"Captures under {os.path.abspath(args.dir)}"
    page = render(data, entries, ops, title=title, notes=notes)
    try:
        _write(page, out, args.force)
    except OSError as err:
        raise UsageError(f"{out}: cannot write: {err.strerror or err}") from None
    bad = sum(1 for c in entries if c.troubled)
    print(out + (f" ({bad} capture(s) need attention)" if bad else ""))
    return 0
