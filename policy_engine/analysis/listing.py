"""Listing a run's captures from its manifests: every trace, the captures that never
closed, files on disk no manifest names, named files that are gone, saves that never
finished and manifest lines that could not be read (``policy-engine traces`` prints it)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Literal, TypedDict, cast

import attrs

from policy_engine.analysis.format import size_cell
from policy_engine.analysis.manifests import (
    Found,
    LineRecord,
    ManifestProblem,
    Place,
    parse_record,
    path_in,
    read_line,
    read_lines,
)
from policy_engine.analysis.window_roles import label
from policy_engine.errors import printable
from policy_engine.files.layout import (
    MANIFEST_DIR,
    MANIFEST_SUFFIX,
    STALLS_DIR,
    TRIGGERS_DIR,
    find_leftovers,
    host_name,
    is_temp_name,
    temp_pid,
)
from policy_engine.files.records import (
    ABSENT,
    COMPANIONS,
    CloseLine,
    Line,
    Status,
    SummaryLine,
    SummaryStatus,
)

# Folders written whole by a tool (torch_npu) are one trace, not many files.
_TRACE_DIR_SUFFIXES = ("_ascend_pt",)
_MANIFEST_NAME = re.compile(r"(.+)_pid(\d+)_(\d{14})" + re.escape(MANIFEST_SUFFIX) + "$")
_STATUS_ORDER = ("complete", "partial", "failed", "oom")
_NEVER_CLOSED = "the process ended before the capture closed"
_STILL_OPEN = "the capture is still open"


def _text(s: str) -> str:
    """A name from the file system as printable text (undecodable bytes as escapes)."""
    try:
        text = os.fsencode(s).decode("utf-8", "backslashreplace")
    except UnicodeError:
        text = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s if text == s else text  # the same string, held once


def _on_disk(root: str) -> set[str]:
    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] == MANIFEST_DIR:
            dirs[:] = []
            continue
        for d in list(dirs):
            if d == TRIGGERS_DIR or (rel == "." and d == STALLS_DIR):
                dirs.remove(d)  # trigger requests and stall records, not traces
            elif d.endswith(_TRACE_DIR_SUFFIXES):
                found.add(os.path.normpath(os.path.join(rel, d)))
                dirs.remove(d)
        found.update(os.path.normpath(os.path.join(rel, f)) for f in files
                     if not f.startswith(".") and not is_temp_name(f)
                     and not (os.path.basename(folder) == MANIFEST_DIR
                              and f.endswith(MANIFEST_SUFFIX)))
    return found


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (Unix time), where /proc tells."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _writer(manifest: str) -> tuple[str, int, str] | None:
    """Host, pid and start stamp of the process that writes ``manifest`` (from its name)."""
    match = _MANIFEST_NAME.match(os.path.basename(manifest))
    return (match.group(1), int(match.group(2)), match.group(3)) if match else None


def _alive(manifest: str) -> bool:
    """Whether the process that writes ``manifest`` runs on this host now."""
    writer = _writer(manifest)
    if writer is None or writer[0] != host_name() or writer[1] <= 0:
        return False
    _host, pid, stamp = writer
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # someone else's process, but alive
    except (OSError, OverflowError):
        return False
    started = _process_start(pid)
    try:
        began = time.mktime(time.strptime(stamp, "%Y%m%d%H%M%S"))
    except (ValueError, OverflowError):
        return True
    # A process that started after its manifest was begun is another one with the same pid.
    return started is None or started <= began + 2


class ListedRow(LineRecord, total=False):
    """A row of the listing (:class:`Listing`): a trace line, its ``path`` relative to the
    folder listed, or a capture that never closed (``event``: ``capture``), its open line's
    keys with ``reason`` and ``manifest``. A trace's ``summary`` is its summary line's
    status, and ``kept`` false where the summary is all that was kept."""

    exists: bool  # a trace's: whether its file is on disk
    reason: str  # a capture's: why it is listed (never closed, still open, lost traces)
    manifest: str  # a capture's: its process's manifest, relative to the folder listed


class BadLine(TypedDict):
    """A manifest line that could not be read, or names a file outside its folder."""

    manifest: str
    line: int
    why: str


class Unreadable(TypedDict):
    """A manifest file (or folder) that could not be read."""

    path: str
    why: str


class Captures(TypedDict):
    """Every capture a run's manifests list, and the files around them: what
    :func:`collect` returns (``policy-engine traces --format json`` prints it)."""

    traces: list[ListedRow | PageRow]  # PageRow: a slim listing's (the report's page)
    interrupted: list[ListedRow]  # captures that never closed, or lost traces
    unlisted: list[str]  # files on disk no manifest names
    missing: list[str]  # files a manifest names that are not on disk
    leftovers: list[str]  # interrupted saves
    writing: list[str]  # saves in progress
    bad_lines: list[BadLine]
    unreadable: list[Unreadable]


#: The keys of a trace line the report's page reads (``collect(..., slim=True)`` keeps only
#: these: a page of 100,000 ranks' captures holds a few hundred bytes per capture).
PAGE_KEYS = ("event", "role", "roles", "joined", "rank", "steps", "region", "cycle",
             "status", "bytes", "plan_hash", "policy_file", "policy_hash", "start", "path",
             "error", "trigger", "capture")


#: Of :data:`PAGE_KEYS`, the values each capture has its own of (not worth sharing).
_OWN_KEYS = ("path", "start", "capture", "rank", "bytes")
_SHARED_KEYS = tuple(k for k in PAGE_KEYS if k not in (*_OWN_KEYS, "event"))


class PageRow:
    """A trace line as the report's page reads it (:data:`PAGE_KEYS`, and what the listing
    adds: ``exists``, ``summary``, ``kept``), one slot a key: a tenth of a dict's size,
    read as a dict is (``get``, ``[key]``)."""

    __slots__ = (*PAGE_KEYS, "exists", "summary", "kept")
    KEYS = __slots__
    _KEYSET = frozenset(__slots__)

    def __init__(self, line: Line, share: Any) -> None:
        declared = _declared(type(line))
        more = line.more
        self.event = line.EVENT
        for key in _SHARED_KEYS:
            value = getattr(line, key) if key in declared else more.get(key)
            setattr(self, key, None if value is ABSENT else share(value))
        for key in _OWN_KEYS:
            value = getattr(line, key) if key in declared else more.get(key)
            setattr(self, key, None if value is ABSENT else value)
        self.exists = self.summary = self.kept = None

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None) if key in self._KEYSET else None
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._KEYSET and getattr(self, key) is not None


_DECLARED: dict[str, frozenset[str]] = {}


def _declared(kind: type[Line]) -> frozenset[str]:
    """The fields a kind of line declares (the others are in its ``more``)."""
    found = _DECLARED.get(kind.EVENT)
    if found is None:
        found = _DECLARED[kind.EVENT] = frozenset(f.name for f in attrs.fields(kind))
    return found


class _Shared:
    """Values seen before, handed out again (the same role, status and hashes on every
    rank's line are held once)."""

    def __init__(self) -> None:
        self.seen: dict[Any, Any] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, list):
            try:
                value = tuple(value)
            except TypeError:  # pragma: no cover - a list is always iterable
                return value
        try:
            return self.seen.setdefault(value, value)
        except TypeError:  # an object, or a list holding one: not shared
            return value


class Listing:
    """A run's captures, gathered a manifest line at a time (:meth:`add`), then
    :meth:`finish`: what :func:`collect` returns. ``slim``: each trace's row holds only
    :data:`PAGE_KEYS` (the report's page), its repeated values shared. A process's lines
    come together (its files, in order): its summary lines and its captures' open and
    close lines are joined to its trace lines when its last line is read, and let go."""

    def __init__(self, root: str, *, slim: bool = False) -> None:
        self.root = root
        self.slim = slim
        self.share = _Shared()
        self.rows: list[ListedRow | PageRow] = []
        self.named: set[str] = set()
        self.refused: list[BadLine] = []
        self.manifests: set[str] = set()
        self.interrupted: list[ListedRow] = []
        self.problems: list[ManifestProblem] = []
        self.folders: dict[str, str] = {}
        # the process being read: where its rows begin, its summary lines (by path) and
        # the trace each of its rows names; where each open line lies (read again only for
        # a capture that never closed), each close line's words, and how many trace lines
        # each capture has
        self.process: str | None = None
        self.first = 0
        self.summaries: dict[Any, tuple[Any, Any]] = {}
        self.row_keys: list[Any] = []
        self.opens: dict[str, Place] = {}
        self.closes: dict[str, tuple[Any, Any, Any, Any]] = {}
        self.counted: dict[str, int] = {}

    def add(self, found: Found) -> None:
        line, manifest = found.line, found.manifest
        if manifest != self.process:
            self.end_process()
            self.process, self.first = manifest, len(self.rows)
            self.manifests.add(manifest)
        event = line.EVENT
        capture = line.capture if isinstance(line.capture, str) else None
        if event == "trace":
            self._trace(line, manifest, found.place)
            if capture is not None:
                self.counted[capture] = self.counted.get(capture, 0) + 1
        elif isinstance(line, SummaryLine):
            self.summaries[line.path] = (self.share(line.status),
                                         line.kept if line.kept is not ABSENT else None)
        elif event == "open" and capture is not None:
            self.opens[capture] = found.place
        elif isinstance(line, CloseLine) and capture is not None:
            error, traces, steps = line.error, line.traces, line.steps
            self.closes[capture] = (self.share(line.status), None if error is ABSENT else error,
                                    0 if traces is ABSENT else traces,
                                    None if steps is ABSENT else steps)

    def end_process(self) -> None:
        """The process whose lines were read is done: its rows get its summaries, and
        its captures that never closed (or lost traces) are listed."""
        if self.process is None:
            return
        for record, key in zip(self.rows[self.first:], self.row_keys, strict=True):
            summary = self.summaries.get(key)
            if summary is not None:  # the rank summarised it: complete, failed or cut
                record["summary"] = summary[0]
                if summary[1] is False and summary[0] == SummaryStatus.COMPLETE:
                    record["kept"] = False  # removed by policy (keep: summaries), not lost
        self.interrupted += self._interrupted(self.process, _alive(self.process)
                                              if self.opens or self.closes else False)
        self.summaries, self.row_keys = {}, []
        self.opens, self.closes, self.counted = {}, {}, {}

    def _trace(self, line: Line, manifest: str, place: Place) -> None:
        extra = line.extra
        companions = [extra.get(key) for key in COMPANIONS] if isinstance(extra, dict) else []
        for companion in companions:
            with contextlib.suppress(ValueError):
                self.named.add(os.path.relpath(path_in(manifest, companion), self.root))
        # not slim: the line's dict (manifests.line_record says why it is one), with the
        # listing's keys set below
        record: ListedRow | PageRow = PageRow(line, self.share) if self.slim \
            else cast(ListedRow, line.to_json())
        rel = record.get("path")
        if rel:
            try:  # a path out of DIR is reported, never looked at
                full = path_in(manifest, rel)
            except ValueError as err:
                self.refused.append({"manifest": _text(place.file), "line": place.line,
                                     "why": str(err)})
                record["path"] = None
            else:
                rel_path = os.path.normpath(os.path.join(self._folder(manifest), rel))
                if rel_path == rel:
                    rel_path = rel  # the line's own string, held once
                record["path"] = _text(rel_path)
                record["exists"] = os.path.exists(full)
                self.named.add(rel_path)
        self.rows.append(record)
        self.row_keys.append(rel)

    def _folder(self, manifest: str) -> str:
        """The output folder of ``manifest``, relative to the folder listed."""
        folder = os.path.dirname(manifest)  # a run's processes share a few folders
        found = self.folders.get(folder)
        if found is None:
            found = self.folders[folder] = os.path.relpath(os.path.dirname(folder), self.root)
        return found

    def _interrupted(self, manifest: str, alive: bool) -> list[ListedRow]:
        """The process's captures whose close record is missing or says interrupted, or
        short of traces."""
        rows = []
        for key in sorted(set(self.opens) | set(self.closes)):
            closed = self.closes.get(key)
            traces = self.counted.get(key, 0)
            if closed is None:
                status, why = ("running", _STILL_OPEN) if alive else (
                    "interrupted", _NEVER_CLOSED)
            elif closed[0] == Status.INTERRUPTED:
                status, why = "interrupted", closed[1] or "interrupted"
            else:
                # The close line comes after the capture's trace lines, background exports
                # included; `thread_waits` (`deferred` in older manifests) counts waits,
                # not files.
                expected = closed[2] if isinstance(closed[2], int) else 0
                if traces >= expected:
                    continue
                lost = expected - traces
                status, why = "interrupted", (
                    f"{lost} of its {expected} trace(s) never reached the manifest")
            row = self._opened(key)
            if closed is not None and closed[3] is not None:
                row["steps"] = closed[3]
            row["event"], row["capture"], row["status"] = "capture", key, status
            row["reason"], row["traces"] = why, traces
            row["manifest"] = _text(os.path.relpath(manifest, self.root))
            rows.append(row)
        return rows

    def _opened(self, key: str) -> ListedRow:
        """A capture's open line, read again (an empty row where it cannot be)."""
        place = self.opens.get(key)
        if place is None:
            return _begun({})
        try:
            record = parse_record(read_line(place)).to_json()
        except ValueError:
            return _begun({})
        return _begun({k: v for k, v in record.items() if k in PAGE_KEYS} if self.slim
                      else record)

    def finish(self) -> Captures:
        """What :func:`collect` returns."""
        root = self.root
        self.end_process()
        self.process = None
        rows = self.rows
        rows.sort(key=row_order)
        interrupted = sorted(self.interrupted, key=row_order)
        # Temporary files of a process still running on this host are saves in progress.
        leftover = find_leftovers(root)
        alive = {m: _alive(m) for m in self.manifests} if leftover else {}
        writers = {w[1] for m, up in alive.items() if up and (w := _writer(m)) is not None}
        leftovers: list[str] = []
        writing: list[str] = []
        for path in leftover:
            busy = temp_pid(os.path.basename(path)) in writers
            (writing if busy else leftovers).append(_text(path))
        problems = self.problems
        bad: list[BadLine] = [{"manifest": _text(p.path), "line": p.line, "why": p.why}
                              for p in problems if p.line is not None]
        return {
            "traces": rows,
            "interrupted": interrupted,
            "unlisted": sorted(_text(p) for p in _on_disk(root) - self.named),
            "missing": sorted(named for r in rows if (named := r.get("path"))
                              and not r.get("exists") and r.get("kept") is not False),
            "leftovers": leftovers,
            "writing": writing,
            "bad_lines": bad + self.refused,
            "unreadable": [{"path": _text(p.path), "why": p.why}
                           for p in problems if p.line is None],
        }


def _begun(row: Mapping[str, Any]) -> ListedRow:
    """A capture's row as :meth:`Listing._opened` begins it: its open line's keys (those
    of a page, or none where it cannot be read again)."""
    # Listing._interrupted sets its ``event`` and the keys a capture's row adds
    return cast(ListedRow, row)


def row_order(r: ListedRow | PageRow) -> tuple[str, int, float]:
    rank, start = r.get("rank"), r.get("start")
    return (str(r.get("role")), rank if isinstance(rank, int) else -1,
            start if isinstance(start, (int, float)) else 0)


def collect(root: str, *, slim: bool = False) -> Captures:
    """Rows from every manifest under ``root``; captures that never closed; unlisted,
    missing and half-written files; manifest lines that could not be read. ``slim``:
    each row holds only what the report's page reads (:data:`PAGE_KEYS`)."""
    listing = Listing(root, slim=slim)
    for found in read_lines(root, listing.problems, heads=True):
        listing.add(found)
    return listing.finish()


def steps_cell(record: ListedRow | PageRow) -> str:
    steps = record.get("steps") or []
    if not steps:
        return "-"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def cell(value: Any) -> str:
    """A value as one line of printable text (no control characters reach the terminal)."""
    return printable(str(value))


def row_cells(r: ListedRow | PageRow) -> tuple[str, ...]:
    if r.get("event") == "capture":
        path = f"({r['reason']})"
    else:
        path = r.get("path") or f"({r.get('error') or 'no file'})"
        if r.get("kept") is False and not r.get("exists"):
            path += " (summary only: not kept)"
    cycle = r.get("cycle")
    steps = steps_cell(r)
    trigger = r.get("trigger")
    if trigger and trigger != "plan":  # a capture beyond the plan says why it happened
        steps += f" ({trigger})"
    return tuple(cell(c) for c in (
        roles_cell(r),
        r.get("region") or "-", r.get("rank"), steps, "-" if cycle is None else cycle,
        r.get("status"), size_cell(r.get("bytes")), path))


#: The files a listing names besides its traces: (key in the data, word, why).
PATH_NOTES: tuple[tuple[Literal["unlisted", "missing", "leftovers", "writing"], str, str],
                  ...] = (("unlisted", "unlisted", "on disk, but no manifest names it"),
               ("missing", "missing", "a manifest names it, but it is not on disk"),
               ("leftovers", "leftover", "an interrupted save; safe to delete"),
               ("writing", "writing", "a save in progress"))


def roles_cell(record: ListedRow | PageRow) -> str:
    """Who a capture belongs to on its rank: the roles that took part (``colocate``) with
    any that joined it undeclared, else its owner and those that joined."""
    return label(record)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_line(data: Captures) -> str:
    counts: dict[str, int] = {}
    for r in data["traces"]:
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    order = [s for s in _STATUS_ORDER if s in counts] + sorted(set(counts) - {*_STATUS_ORDER})
    parts = [f"{_plural(len(data['traces']), 'trace')} "
             f"({', '.join(f'{counts[s]} {s}' for s in order) or 'none'})"]
    summarised = sum(1 for r in data["traces"] if r.get("summary") == SummaryStatus.COMPLETE)
    if summarised:
        kept = sum(1 for r in data["traces"] if r.get("kept") is False)
        parts.append(f"{summarised} summarised" + (f" ({kept} kept as summaries only)"
                                                   if kept else ""))
    for status in ("interrupted", "running"):
        n = sum(1 for r in data["interrupted"] if r["status"] == status)
        if n:
            parts.append(f"{_plural(n, 'capture')} {status}")
    return ", ".join(parts)
