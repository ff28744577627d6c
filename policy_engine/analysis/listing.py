"""Listing a run's captures from its manifests: every trace, the captures that never
closed, files on disk no manifest names, named files that are gone, saves that never
finished and manifest lines that could not be read (``policy-engine traces`` prints it)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any

from policy_engine.analysis.format import size_cell
from policy_engine.analysis.manifests import Scan, file_of, scan_manifests
from policy_engine.analysis.window_roles import label
from policy_engine.errors import printable
from policy_engine.files.layout import (
    MANIFEST_DIR,
    MANIFEST_SUFFIX,
    TRIGGERS_DIR,
    find_leftovers,
    host_name,
    is_temp_name,
    temp_pid,
)
from policy_engine.files.records import COMPANIONS

# Folders written whole by a tool (torch_npu) are one trace, not many files.
_TRACE_DIR_SUFFIXES = ("_ascend_pt",)
_MANIFEST_NAME = re.compile(r"(.+)_pid(\d+)_(\d{14})" + re.escape(MANIFEST_SUFFIX) + "$")
_STATUS_ORDER = ("complete", "partial", "failed", "oom")
_NEVER_CLOSED = "the process ended before the capture closed"
_STILL_OPEN = "the capture is still open"


def _text(s: str) -> str:
    """A name from the file system as printable text (undecodable bytes as escapes)."""
    try:
        return os.fsencode(s).decode("utf-8", "backslashreplace")
    except UnicodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _on_disk(root: str) -> set[str]:
    found: set[str] = set()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel.split(os.sep)[0] == MANIFEST_DIR:
            dirs[:] = []
            continue
        for d in list(dirs):
            if d == TRIGGERS_DIR:  # trigger requests (policy-engine trigger), not traces
                dirs.remove(d)
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


def _interrupted(scan: Scan, root: str, alive: dict[str, bool]) -> list[dict[str, Any]]:
    """Captures whose close record is missing or says interrupted, or short of traces."""
    opens: dict[tuple[str, str], dict[str, Any]] = {}
    closes: dict[tuple[str, str], dict[str, Any]] = {}
    found: dict[tuple[str, str], int] = {}
    for r in scan.records:
        if "capture" not in r:  # a trace line written before captures had ids
            continue
        key: tuple[str, str] = (r["_manifest"], r["capture"])
        if r["event"] == "open":
            opens[key] = r
        elif r["event"] == "close":
            closes[key] = r
        else:
            found[key] = found.get(key, 0) + 1
    rows = []
    for key in sorted(set(opens) | set(closes), key=lambda k: (k[0], k[1])):
        opened, closed = opens.get(key, {}), closes.get(key)
        traces = found.get(key, 0)
        if closed is None:
            status, why = ("running", _STILL_OPEN) if alive[key[0]] else (
                "interrupted", _NEVER_CLOSED)
        elif closed["status"] == "interrupted":
            status, why = "interrupted", closed.get("error") or "interrupted"
        else:
            # The close line comes after the capture's trace lines, background exports
            # included; `thread_waits` (`deferred` in older manifests) counts waits, not files.
            expected = closed.get("traces", 0)
            if traces >= expected:
                continue
            lost = expected - traces
            status, why = "interrupted", (
                f"{lost} of its {expected} trace(s) never reached the manifest")
        row = {k: v for k, v in opened.items() if not k.startswith("_")}
        if closed is not None and "steps" in closed:
            row["steps"] = closed["steps"]
        row.update(event="capture", capture=key[1], status=status, reason=why,
                   traces=traces, manifest=_text(os.path.relpath(key[0], root)))
        rows.append(row)
    return rows


def row_order(r: dict[str, Any]) -> tuple[str, int, float]:
    rank, start = r.get("rank"), r.get("start")
    return (str(r.get("role")), rank if isinstance(rank, int) else -1,
            start if isinstance(start, (int, float)) else 0)


def collect(root: str, scan: Scan | None = None) -> dict[str, Any]:
    """Rows from every manifest under ``root``; captures that never closed; unlisted,
    missing and half-written files; manifest lines that could not be read. ``scan``: the
    manifests, when the caller read them already."""
    scan = scan if scan is not None else scan_manifests(root)
    rows: list[dict[str, Any]] = []
    named: set[str] = set()
    refused: list[dict[str, Any]] = []
    summaries = {(r["_manifest"], r.get("path")): r for r in scan.records
                 if r["event"] == "summary"}
    for r in scan.records:
        if r["event"] != "trace":
            continue
        record = {k: v for k, v in r.items() if not k.startswith("_")}
        summary = summaries.get((r["_manifest"], r.get("path")))
        if summary is not None:  # the rank summarised it: complete, failed or cut
            record["summary"] = summary.get("status")
            if summary.get("kept") is False and summary.get("status") == "complete":
                record["kept"] = False  # removed by policy (keep: summaries), not lost
        if record.get("path"):
            try:  # a path out of DIR is reported, never looked at
                full = file_of(r, record["path"])
            except ValueError as err:
                refused.append({"manifest": _text(r["_file"]), "line": r["_line"],
                                "why": str(err)})
                record["path"] = None
            else:
                rel = os.path.relpath(full, root)
                record["path"] = _text(rel)
                record["exists"] = os.path.exists(full)
                named.add(rel)
        extra = record.get("extra")
        companions = [extra.get(key) for key in COMPANIONS] if isinstance(extra, dict) else []
        for rel_path in companions:
            with contextlib.suppress(ValueError):
                named.add(os.path.relpath(file_of(r, rel_path), root))
        rows.append(record)
    rows.sort(key=row_order)
    alive = {m: _alive(m) for m in {r["_manifest"] for r in scan.records}}
    interrupted = sorted(_interrupted(scan, root, alive), key=row_order)
    # Temporary files of a process still running on this host are saves in progress.
    writers = {w[1] for m, up in alive.items() if up and (w := _writer(m)) is not None}
    leftovers: list[str] = []
    writing: list[str] = []
    for path in find_leftovers(root):
        busy = temp_pid(os.path.basename(path)) in writers
        (writing if busy else leftovers).append(_text(path))
    return {
        "traces": rows,
        "interrupted": interrupted,
        "unlisted": sorted(_text(p) for p in _on_disk(root) - named),
        "missing": sorted(r["path"] for r in rows if r.get("path") and not r.get("exists")
                          and r.get("kept") is not False),
        "leftovers": leftovers,
        "writing": writing,
        "bad_lines": [{"manifest": _text(p.path), "line": p.line, "why": p.why}
                      for p in scan.problems if p.line is not None] + refused,
        "unreadable": [{"path": _text(p.path), "why": p.why}
                       for p in scan.problems if p.line is None],
    }


def steps_cell(record: dict[str, Any]) -> str:
    steps = record.get("steps") or []
    if not steps:
        return "-"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def cell(value: Any) -> str:
    """A value as one line of printable text (no control characters reach the terminal)."""
    return printable(str(value))


def row_cells(r: dict[str, Any]) -> tuple[str, ...]:
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
PATH_NOTES = (("unlisted", "unlisted", "on disk, but no manifest names it"),
               ("missing", "missing", "a manifest names it, but it is not on disk"),
               ("leftovers", "leftover", "an interrupted save; safe to delete"),
               ("writing", "writing", "a save in progress"))


def roles_cell(record: dict[str, Any]) -> str:
    """Who a capture belongs to on its rank: the roles that took part (``colocate``) with
    any that joined it undeclared, else its owner and those that joined."""
    return label(record)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def summary_line(data: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for r in data["traces"]:
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    order = [s for s in _STATUS_ORDER if s in counts] + sorted(set(counts) - {*_STATUS_ORDER})
    parts = [f"{_plural(len(data['traces']), 'trace')} "
             f"({', '.join(f'{counts[s]} {s}' for s in order) or 'none'})"]
    summarised = sum(1 for r in data["traces"] if r.get("summary") == "complete")
    if summarised:
        kept = sum(1 for r in data["traces"] if r.get("kept") is False)
        parts.append(f"{summarised} summarised" + (f" ({kept} kept as summaries only)"
                                                   if kept else ""))
    for status in ("interrupted", "running"):
        n = sum(1 for r in data["interrupted"] if r["status"] == status)
        if n:
            parts.append(f"{_plural(n, 'capture')} {status}")
    return ", ".join(parts)
