"""Joining the per-rank torch traces of one capture window into one trace, as a stream
(``policy-engine merge``, in ``cli/merge.py``, says what the user sees).

:func:`records` reads the manifests' trace lines with their window keys
(``window_roles.window_keys``); :func:`choose` picks the one window asked for
(AnalysisError when none or several match); :func:`merge` writes it: one process per
rank, sorted, clocks aligned on each trace's baseTimeNanoseconds, flow and async ids
moved apart, every input read under the readers' bounds (``merge_io.Bounds``), the output
published whole (``files.publish``). Each rank's clock is brought to rank 0's by the
offset it measured over the job's channel (its ``clock`` notes: analysis/clocks.py), so
that ranks on hosts whose clocks disagree line up; a rank without one keeps its own.
"""

from __future__ import annotations

import gzip
import itertools
import os
import sys
from collections.abc import Iterable, Mapping
from typing import IO, Any, cast

from policy_engine.analysis.chrome_trace import TraceError, TraceReader
from policy_engine.analysis.clocks import Clocks, Offset
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.format import rank_spans
from policy_engine.analysis.manifests import LineRecord, file_of, scan_manifests
from policy_engine.analysis.merge_io import MAX_EVENTS, MAX_TRACE_MB, Bounds, EventWriter
from policy_engine.analysis.trace_process import ProcessMap
from policy_engine.analysis.window_roles import (
    TORCH_SUFFIXES,
    holds,
    is_torch,
    label,
    window_keys,
)
from policy_engine.errors import did_you_mean, is_int, printable
from policy_engine.files.publish import publish
from policy_engine.files.records import Status, from_json

_PROG = "policy-engine merge"
#: Flow and async ids of the i-th trace move by i << _ID_SHIFT (below 2**53 for 100k ranks).
_ID_SHIFT = 36


class MergeRecord(LineRecord, total=False):
    """A trace line as :func:`records` hands it on: the manifest's line (a copy of what
    ``manifests.record_of`` made), where it lies, and what merging it needs. Every key
    below is set by :func:`records`."""

    _manifest: str  # its process's manifest
    _line: int  # its line number in ``_file``'s manifest file, 1-based
    _file: str | None  # the trace it names, inside the folder (None: it names none)
    _label: str  # the roles that took part on its rank (window_roles.label)
    _clock: Offset | None  # its rank's measured clock offset, where there is one
    _window: str  # its window's family of roles (the first of ``_key``)
    _key: tuple[Any, ...]  # its window (window_roles.window_keys)


# -- choosing the window ---------------------------------------------------------------

def span(values: Iterable[Any]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    return rank_spans(values, sep=", ", empty="-")


def say(text: str) -> None:
    """One line on stderr, printable: it holds names from the manifests and traces."""
    print(printable(text), file=sys.stderr)


def _warn(where: str, why: str) -> None:
    say(f"{_PROG}: warning: manifest {where}: {why}")


def records(root: str) -> tuple[list[MergeRecord], set[str]]:
    """Every trace line under ``root`` with its ``_file`` and ``_key``; and every file
    the merged trace must never replace (the manifests, and every file they name)."""
    scan = scan_manifests(root)
    for problem in scan.problems:
        _warn(f"{problem.path}:{problem.line}" if problem.line else problem.path, problem.why)
    if not scan.records:
        raise AnalysisError(f"no manifests under {root} (a policy-engine output folder has "
                         "manifests/*.manifest.jsonl)")
    inputs = {r["_manifest"] for r in scan.records} | {p.path for p in scan.problems}
    clocks = Clocks()
    for r in scan.records:
        if r["event"] == "note" and r.get("note") == "clock":
            clocks.add(from_json({k: v for k, v in r.items() if not k.startswith("_")}))
    rows = []
    for r in scan.records:
        if r["event"] != "trace":
            continue
        # a copy of the line: merge's keys are all set below, before it is handed on
        record = cast(MergeRecord, r.copy())
        record["_file"] = None
        if record.get("path"):
            try:  # never read outside DIR
                record["_file"] = file = file_of(r, record["path"])
            except ValueError as err:
                _warn(f"{r['_manifest']}:{r['_line']}", str(err))
                continue
            inputs.add(file)
        record["_label"] = label(record)  # the roles that took part on its rank
        start = record.get("start")
        record["_clock"] = clocks.offset(record.get("rank"), start if isinstance(
            start, (int, float)) and not isinstance(start, bool) else None)
        rows.append(record)
    if not rows:
        raise AnalysisError(f"the manifests under {root} record no traces")
    rows.sort(key=lambda r: (r["start"] if isinstance(r.get("start"), (int, float)) else 0))
    for row, key in zip(rows, window_keys(rows), strict=True):
        row["_window"], row["_key"] = key[0], key  # one window across ranks (window_roles)
    return rows, inputs


def describe(key: tuple[Any, ...], labels: int) -> str:
    label, region, steps, cycle, nth = key
    parts = [label] if labels > 1 else []
    if region is not None:
        parts.append(f"region {region}")
    parts.append("whole session" if not steps else
                 f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}")
    if cycle is not None:
        parts.append(f"cycle {cycle}")
    if nth > 1:
        parts.append(f"capture {nth}")
    return ", ".join(parts)


def _listing(windows: dict[tuple[Any, ...], list[MergeRecord]]) -> str:
    """One line per window, oldest first."""
    labels = len({k[0] for k in windows})
    return "".join(f"\n  {printable(describe(k, labels))}: ranks "
                   f"{span(r.get('rank') for r in rows)}" for k, rows in windows.items())


def _names(names: list[str]) -> str:
    return ", ".join(map(printable, names))


def choose(rows: list[MergeRecord], root: str, *, role: str | None = None,
           step: int | None = None, cycle: int | None = None, region: str | None = None,
           capture: int | None = None) -> list[MergeRecord]:
    """The trace lines (every backend) of the one window under ``root`` that ``role``,
    ``step``, ``cycle``, ``region`` and ``capture`` name; AnalysisError when none or
    several do."""
    labels = sorted({r["_window"] for r in rows})
    if role is not None:
        # Every window that holds the role, on every rank where it took part.
        every = labels
        rows = [r for r in rows if role == r["_window"] or holds(r, role)]
        labels = sorted({r["_window"] for r in rows})
        if not labels:
            raise AnalysisError(f"no role {role!r} under {root}: it holds "
                             f"{_names(every)}{did_you_mean(role, every)}")
    elif len(labels) > 1:
        raise AnalysisError(f"{root} holds traces of {len(labels)} roles "
                         f"({_names(labels)}): choose one with --role")
    torch = [r for r in rows if is_torch(r)]
    shown = printable("/".join(labels))
    if not torch:
        kinds = sorted({str(r.get("backend")) for r in rows})
        raise AnalysisError(f"{shown} has no torch traces under {root} (only "
                         f"{_names(kinds)}); merge joins torch traces")
    windows: dict[tuple[Any, ...], list[MergeRecord]] = {}
    for r in torch:
        windows.setdefault(r["_key"], []).append(r)
    wanted = {k: v for k, v in windows.items()
              if (step is None or step in k[2] or str(step) in map(str, k[2]))
              and (region is None or k[1] == region)
              and (cycle is None or k[3] == cycle)
              and (capture is None or k[4] == capture)}
    if not wanted:
        raise AnalysisError(f"no capture window of {shown} with torch traces matches "
                         f"--step/--cycle/--region/--capture; there are:{_listing(windows)}")
    if len(wanted) > 1:
        raise AnalysisError(f"{len(wanted)} capture windows of {shown} match: choose "
                         f"one with --step (or --cycle, --region, --capture):"
                         f"{_listing(wanted)}")
    (key,) = wanted
    return [r for r in rows if r["_key"] == key]


# -- the merged file -------------------------------------------------------------------

# -- merging ---------------------------------------------------------------------------

def _name(record: MergeRecord) -> str:
    coords = record.get("coords") or {}
    where = " ".join(f"{k}={v}" for k, v in coords.items())
    rank = record.get("rank")
    return f"rank {'?' if rank is None else rank} ({record['_label']}{', ' if where else ''}" \
           f"{where})"


def skip_reason(record: MergeRecord) -> str | None:
    """Why a trace line of the window is not merged, or None."""
    if not is_torch(record):
        return f"backend {record.get('backend')}: not a torch trace"
    if record.get("status") == Status.FAILED or record["_file"] is None:
        return f"failed, no file: {record.get('error') or 'no reason recorded'}"
    if not str(record["_file"]).endswith(TORCH_SUFFIXES):
        return "not a .pt.trace.json[.gz] file"
    if not os.path.exists(record["_file"]):
        return "missing: the manifest names it, but it is not on disk"
    return None


def _file(record: MergeRecord) -> str:
    """The trace file of a record being merged (one :func:`skip_reason` passes)."""
    # only records skip_reason passes are merged, and it passes none without a file
    return cast(str, record["_file"])


def _base_time(record: MergeRecord, root: str, bounds: Bounds) -> int | None:
    """The trace's baseTimeNanoseconds (read from its head, or the whole file if it comes
    after the events); None when the trace has none."""
    with bounds.open(_file(record)) as reader:
        meta = reader.header()
        if "baseTimeNanoseconds" not in meta:  # so the events are read twice: bound both
            _feed(reader, ProcessMap(0, shift=0, id_base=0, tids=itertools.count()), None)
            meta = reader.meta
    base = meta.get("baseTimeNanoseconds")
    rel = os.path.relpath(_file(record), root)
    if is_int(base) and 0 <= base < 1 << 63:
        return base
    if "baseTimeNanoseconds" in meta:  # thousands of digits would overflow every shift
        say(f"{_PROG}: note: {rel}: its baseTimeNanoseconds is no time in nanoseconds (a "
            "whole number from 0 to 2**63): its timestamps are taken as Unix microseconds")
    else:
        say(f"{_PROG}: note: {rel} has no baseTimeNanoseconds: its timestamps are taken "
            "as Unix microseconds")
    return None


def _pids(records: list[MergeRecord]) -> list[int]:
    """A process id per trace: rank + 1 (Perfetto keeps pid 0 for the idle process)."""
    known = [rank for r in records if isinstance(rank := r.get("rank"), int)]
    spare = itertools.count(max(known, default=-1) + 2)
    return [rank + 1 if isinstance(rank := r.get("rank"), int) else next(spare)
            for r in records]


def _feed(reader: TraceReader, proc: ProcessMap, writer: EventWriter | None) -> None:
    """The events of ``reader`` through ``proc`` into ``writer`` (if any)."""
    for event in reader.events():
        try:
            kept = proc.event(event)
        except TraceError as err:
            raise TraceError(f"{err}, at event {reader.count} of traceEvents (before "
                             f"character {reader.position})") from None
        if kept is not None and writer is not None:
            writer.event(kept)


def _copy(r: MergeRecord, rel: str, proc: ProcessMap, writer: EventWriter,
          bounds: Bounds) -> Mapping[str, Any]:
    """The events of one trace into ``writer``; the trace's other top-level keys."""
    with bounds.open(_file(r)) as reader:
        _feed(reader, proc, writer)
    if reader.not_objects:
        say(f"{_PROG}: note: {rel}: {reader.not_objects} entries of traceEvents are not "
            "objects; left out")
    return reader.meta


def clock_said(records: list[MergeRecord], own_clocks: bool = False) -> str:
    """How the merged trace's ranks are laid on one clock, in words."""
    if own_clocks:
        return "each rank on its own clock (its measured offset not applied)"
    measured = [clock for r in records if (clock := r.get("_clock")) is not None]
    if not measured:
        return ("no rank measured its clock offset (no job channel): the traces are "
                "aligned on their own timestamps, as their hosts' clocks say")
    worst = max(clock.uncertainty_us for clock in measured)
    missing = span(r.get("rank") for r in records if r.get("_clock") is None)
    return (f"each rank's clock brought to rank 0's by its measured offset (uncertainty "
            f"up to {worst / 1000:.3f} ms)" + ("" if missing == "-" else
                                                f"; ranks {missing} measured none"))


def merge(records: list[MergeRecord], root: str, out: str, force: bool,
          bounds: Bounds | None = None, own_clocks: bool = False) -> int:
    """Write the traces of ``records`` (one window, sorted by rank) as one; the number of
    events written. TraceError (with the file in front) for a trace that cannot be read
    or is past ``bounds`` (the defaults of --max-trace-mb and --max-events when None);
    FileExistsError when ``out`` exists and not ``force``. Each rank's measured clock
    offset moves its events, unless ``own_clocks``."""
    bounds = bounds or Bounds(MAX_TRACE_MB << 20, MAX_EVENTS)
    bases = []
    for r in records:
        try:
            base = _base_time(r, root, bounds) or 0
        except TraceError as err:
            raise TraceError(f"{os.path.relpath(_file(r), root)}: {err}") from None
        reading = None if own_clocks else r.get("_clock")
        bases.append(base + (round(reading.offset_us * 1000) if reading is not None else 0))
    ref = min(bases)
    pids = _pids(records)
    tids = itertools.count(1000 * (max(pids) // 1000 + 1))
    written = 0

    def write(f: IO[bytes]) -> None:
        nonlocal written
        stream: IO[bytes] = f
        if out.endswith(".gz"):
            stream = gzip.GzipFile(  # type: ignore[assignment]  # a binary file all the same
                filename="", fileobj=f, mode="wb", compresslevel=6, mtime=0)
        writer = EventWriter(stream)
        for index, (r, base, pid) in enumerate(zip(records, bases, pids, strict=True)):
            rel = os.path.relpath(_file(r), root)
            delta = base - ref  # nanoseconds; microseconds in the trace
            shift = delta // 1000 if delta % 1000 == 0 else delta / 1000
            proc = ProcessMap(pid, shift=shift, id_base=index << _ID_SHIFT, tids=tids,
                              main=r.get("pid"))
            try:
                meta = _copy(r, rel, proc, writer, bounds)
            except TraceError as err:
                raise TraceError(f"{rel}: {err}") from None
            args = {"rank": r.get("rank"), "role": r["_label"], "coords": r.get("coords"),
                    "trace": rel, "status": r.get("status"), "metadata": meta}
            labels = [str(meta.get("host_name") or ""), r.get("status") or ""]
            rank = r.get("rank")
            said = ", ".join(x for x in labels if x not in ("", Status.COMPLETE))
            for event in proc.metadata(_name(r), rank if isinstance(rank, int) else pid, args,
                                       said):
                writer.event(event)
        first = records[0]
        writer.finish({"schemaVersion": 1, "baseTimeNanoseconds": ref, "policy_engine_merge": {
            "role": first["_window"], "region": first.get("region"),
            "steps": first.get("steps"), "cycle": first.get("cycle"),
            "ranks": [r.get("rank") for r in records],
            "traces": [os.path.relpath(_file(r), root) for r in records],
            "clock": clock_said(records, own_clocks)}})
        if stream is not f:
            stream.close()  # the gzip trailer; publish closes the file
        written = writer.count

    publish(out, write, force=force)
    return written


def refuse_inputs(out: str, window: list[MergeRecord], inputs: set[str]) -> None:
    """AnalysisError when ``out`` is (or is a link to, or another name of) a file of the
    window, a manifest, or a file a manifest names: inputs are never replaced."""
    try:
        target = os.stat(out)
    except OSError:
        return  # nothing there (or nothing readable) to replace

    def same(path: str | None) -> bool:
        try:
            return bool(path) and os.path.samestat(os.stat(str(path)), target)
        except OSError:
            return False

    if any(same(r["_file"]) for r in window):
        raise AnalysisError(f"{out} is one of the traces to merge: choose another file")
    if any(same(p) for p in inputs):
        raise AnalysisError(f"{out} is a manifest or a file the manifests under the folder "
                         "name: choose another file")
