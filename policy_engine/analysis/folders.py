"""A folder of traces that no manifest describes: other tools' captures, copied in by hand.

Each folder holding traces is one window. A file is a trace by what it holds, not by its
name: any ``*.json`` or ``*.json.gz`` whose first bytes open a Chrome trace (an object
whose first keys include ``traceEvents`` or a torch trace's own, or an array of events);
one whose first bytes are something else is passed over, with a note saying so. torch_npu's
``*_ascend_pt`` folders are one trace each. So HTA's ``rank-0.json.gz``, TraceLens's
``<model>__<pid>.json.gz`` and torch's ``*.pt.trace.json.gz`` are all read.

A trace's rank comes from its ``distributedInfo`` once it is read; else from its name
(``rank-3``, ``rank3``, ``_rank3_``: :func:`rank_in_name`); else from its place among the
window's traces. Each rank says which (``rank_from``).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable
from typing import TypeVar

from policy_engine.analysis.window_roles import TORCH_SUFFIXES
from policy_engine.files.layout import MANIFEST_DIR, TRIGGERS_DIR

_E = TypeVar("_E")  # a window's trace entry (windows.Entry)

#: The endings of a file that may be a trace; whether it is one, its first bytes say.
TRACE_ENDINGS = (".json", ".json.gz")
#: A folder torch_npu writes per capture (one trace).
ASCEND_ENDING = "_ascend_pt"
#: Bytes of text looked at to tell a trace from another JSON file.
SNIFF_BYTES = 64 << 10
_GZIP = b"\x1f\x8b"
#: Keys a Chrome trace, or torch's, starts with (torch writes traceEvents after them).
_TRACE_KEYS = re.compile(rb'"(traceEvents|schemaVersion|deviceProperties|distributedInfo|'
                         rb'displayTimeUnit|baseTimeNanoseconds|systemTraceEvents)"\s*:')
_EVENT = re.compile(rb'^\[\s*(\]|\{\s*"(ph|name|ts|pid|tid|cat|args|dur)"\s*:)')
_RANK = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d{1,9})(?![0-9])", re.IGNORECASE)


def rank_in_name(name: str) -> int | None:
    """The rank a file's name gives (``rank-3``, ``rank3``, ``x_rank3_y``), or None."""
    found = _RANK.search(name)
    return int(found.group(1)) if found else None


def _head(path: str) -> bytes | None:
    """The first :data:`SNIFF_BYTES` of text of the file at ``path`` (inflated if it is
    gzip), without following a link or blocking on a FIFO; None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not os.path.isfile(path):
                return None
            raw = f.read(SNIFF_BYTES)
            if raw[:2] == _GZIP:
                try:
                    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, SNIFF_BYTES)
                except zlib.error:
                    return b""
            return raw
    except (OSError, gzip.BadGzipFile):
        return None


def not_a_trace(path: str) -> str | None:
    """Why the file at ``path`` is not a Chrome trace by its first bytes, or None when it
    may be one (its reading then says whether it is whole)."""
    head = _head(path)
    if head is None:
        return "it cannot be read"
    text = head.lstrip()
    if text[:1] == b"[":
        return None if _EVENT.match(text) else "a JSON array, but not of trace events"
    if text[:1] != b"{":
        return "its first bytes are not JSON" if text else "it is empty"
    if _TRACE_KEYS.search(text) or len(head) >= SNIFF_BYTES:
        return None  # a trace's keys, or too much to tell from its start: read it
    return "a JSON object with no traceEvents"


def from_folders(root: str, entry: Callable[[int | None, str, str], _E]
                 ) -> tuple[list[tuple[str, list[_E]]], list[str]]:
    """The windows of a folder without manifests (each folder holding traces is one), each
    as its name and its traces, and notes on the files passed over. ``entry`` makes a
    window's trace entry from (rank, path relative to ``root``, full path)."""
    windows: list[tuple[str, list[_E]]] = []
    notes: list[str] = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if d not in (MANIFEST_DIR, TRIGGERS_DIR)
                         and not d.endswith(ASCEND_ENDING))
        found = sorted(f for f in os.listdir(folder) if f.endswith(ASCEND_ENDING)
                       and os.path.isdir(os.path.join(folder, f))) if rel != os.pardir else []
        for name in sorted(files):
            if not name.endswith(TRACE_ENDINGS):
                continue
            full = os.path.join(folder, name)
            why = None if name.endswith(TORCH_SUFFIXES) and os.path.isfile(full) \
                else not_a_trace(full)
            if why is None:
                found.append(name)
            else:
                notes.append(f"{os.path.normpath(os.path.join(rel, name))}: not read as a "
                             f"trace ({why})")
        if not found:
            continue
        found.sort()
        windows.append((
            rel if rel != "." else os.path.basename(os.path.abspath(root)),
            [entry(rank_in_name(n), os.path.normpath(os.path.join(rel, n)),
                   os.path.join(folder, n)) for n in found]))
    return windows, notes
