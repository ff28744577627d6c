"""policy-engine merge DIR -o OUT: the per-rank torch traces of one capture window as one.

A capture window is what every rank of a role recorded for the same steps and schedule
cycle: one trace per rank, as the manifests under DIR list them. The merged trace has one
process per rank, named ``rank N (role, coords)`` and sorted by rank, with the clocks of
all ranks aligned on each trace's baseTimeNanoseconds. Traces are read and written as
streams, so memory stays small however large they are. Only torch traces
(.pt.trace.json[.gz]) are merged; the other files of the window are listed as skipped.
OUT ending in .gz is gzipped.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gzip
import io
import itertools
import json
import os
import secrets
import sys
from collections.abc import Iterable
from typing import Any

from policy_engine.backends.output import TEMP_PREFIX
from policy_engine.cli._common import whole_number
from policy_engine.cli.chrome_trace import ProcessMap, TraceError, TraceReader
from policy_engine.cli.usage import UsageError
from policy_engine.errors import did_you_mean
from policy_engine.runtime.manifest import scan_manifests

_PROG = "policy-engine merge"
TORCH_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")
EXIT_BAD_DATA = 1  # a trace of the window cannot be read
#: Flow and async ids of the i-th trace move by i << _ID_SHIFT (below 2**53 for 100k ranks).
_ID_SHIFT = 36
_CHUNK = 1 << 20
_ENCODE = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode
# link() errors that mean "this file system has no hard links".
_NO_LINKS = frozenset({errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.ENOTSUP,
                       errno.EOPNOTSUPP})


def add_parser(sub: Any, name: str, help: str) -> None:
    parser = sub.add_parser(name, help=help, description=__doc__)
    parser.add_argument("dir", metavar="DIR")
    parser.add_argument("--role", metavar="R",
                        help="the role (needed when DIR holds traces of more than one)")
    parser.add_argument("--step", type=whole_number, metavar="N",
                        help="a step the window covers (needed when there is more than one)")
    parser.add_argument("--cycle", type=whole_number, metavar="K",
                        help="the schedule cycle, when the step has several")
    parser.add_argument("--region", metavar="NAME", help="the region, for discrete captures")
    parser.add_argument("--capture", type=whole_number, metavar="I",
                        help="the I-th capture (from 1) of the same steps and cycle, when a "
                             "region or a rerun captured them again")
    parser.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="the merged trace (.pt.trace.json, or .gz to compress it)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.set_defaults(run=run)


# -- choosing the window ---------------------------------------------------------------

def _label(record: dict[str, Any]) -> str:
    """The roles a trace belongs to, as ``traces`` shows them (``actor+ref``)."""
    declared = [str(r) for r in record.get("roles") or []]
    joined = [str(r) for r in record.get("joined") or []]
    if declared:
        return "+".join(declared + [r for r in joined if r not in declared])
    return "+".join([str(record.get("role")), *joined])


def _is_torch(record: dict[str, Any]) -> bool:
    path = record.get("path")
    return record.get("backend") == "torch" or (
        isinstance(path, str) and path.endswith(TORCH_SUFFIXES))


def _span(values: Iterable[Any]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    values = list(values)
    ints = sorted({v for v in values if isinstance(v, int)})
    parts = [f"{g[0][1]}-{g[-1][1]}" if len(g) > 1 else str(g[0][1]) for g in (
        list(run) for _, run in itertools.groupby(enumerate(ints), lambda p: p[1] - p[0]))]
    return ", ".join(parts + ["?"] * any(not isinstance(v, int) for v in values)) or "-"


def _records(root: str) -> list[dict[str, Any]]:
    """Every trace line under ``root`` with its ``_file`` (absolute) and ``_key``."""
    scan = scan_manifests(root)
    for problem in scan.problems:
        where = f"{problem.path}:{problem.line}" if problem.line else problem.path
        print(f"{_PROG}: warning: manifest {where}: {problem.why}", file=sys.stderr)
    if not scan.records:
        raise UsageError(f"no manifests under {root} (a policy-engine output folder has "
                         "manifests/*.manifest.jsonl)")
    rows = []
    for r in scan.records:
        if r["event"] != "trace":
            continue
        record = dict(r)
        path = record.get("path")
        base = os.path.dirname(os.path.dirname(r["_manifest"]))
        record["_file"] = os.path.normpath(os.path.join(base, path)) if path else None
        record["_label"] = _label(record)
        rows.append(record)
    if not rows:
        raise UsageError(f"the manifests under {root} record no traces")
    rows.sort(key=lambda r: (r["start"] if isinstance(r.get("start"), (int, float)) else 0))
    nth: dict[tuple[Any, ...], int] = {}
    for r in rows:  # the i-th capture of the same steps and cycle, per rank and backend
        steps = tuple(r.get("steps") or ())
        key = (r["_label"], r.get("region"), steps, r.get("cycle"))
        who = (*key, r.get("rank"), repr(r.get("backend")), _is_torch(r))
        nth[who] = nth.get(who, 0) + 1
        r["_key"] = (*key, nth[who])
    return rows


def _describe(key: tuple[Any, ...], labels: int) -> str:
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


def _listing(windows: dict[tuple[Any, ...], list[dict[str, Any]]]) -> str:
    """One line per window, oldest first."""
    labels = len({k[0] for k in windows})
    return "".join(f"\n  {_describe(k, labels)}: ranks {_span(r.get('rank') for r in rows)}"
                   for k, rows in windows.items())


def choose(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The trace lines (every backend) of the one window the arguments name."""
    labels = sorted({r["_label"] for r in rows})
    if args.role is not None:
        labels = [x for x in labels if args.role == x or args.role in x.split("+")]
        if not labels:
            every = sorted({r["_label"] for r in rows})
            raise UsageError(f"no role {args.role!r} under {args.dir}: it holds "
                             f"{', '.join(every)}{did_you_mean(args.role, every)}")
    elif len(labels) > 1:
        raise UsageError(f"{args.dir} holds traces of {len(labels)} roles "
                         f"({', '.join(labels)}): choose one with --role")
    rows = [r for r in rows if r["_label"] in labels]
    torch = [r for r in rows if _is_torch(r)]
    if not torch:
        kinds = sorted({str(r.get("backend")) for r in rows})
        raise UsageError(f"{'/'.join(labels)} has no torch traces under {args.dir} (only "
                         f"{', '.join(kinds)}); merge joins torch traces")
    windows: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in torch:
        windows.setdefault(r["_key"], []).append(r)
    wanted = {k: v for k, v in windows.items()
              if (args.step is None or args.step in k[2] or str(args.step) in map(str, k[2]))
              and (args.region is None or k[1] == args.region)
              and (args.cycle is None or k[3] == args.cycle)
              and (args.capture is None or k[4] == args.capture)}
    if not wanted:
        raise UsageError(f"no capture window of {'/'.join(labels)} with torch traces matches "
                         f"--step/--cycle/--region/--capture; there are:{_listing(windows)}")
    if len(wanted) > 1:
        raise UsageError(f"{len(wanted)} capture windows of {'/'.join(labels)} match: choose "
                         f"one with --step (or --cycle, --region, --capture):"
                         f"{_listing(wanted)}")
    (key,) = wanted
    return [r for r in rows if r["_key"] == key]


# -- the merged file -------------------------------------------------------------------

class TraceWriter:
    """A Chrome trace written event by event (gzipped when ``out`` ends with .gz) under a
    hidden temporary name beside ``out`` (a leftover to ``policy-engine traces``), named in
    ``finish`` by a hard link that never replaces a file, unless ``force``. Leaving the
    ``with`` block without ``finish`` removes it."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.count = 0
        gz = out.endswith(".gz")
        name = f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(16)}.tmp.json{'.gz' if gz else ''}"
        self._temp = os.path.join(os.path.dirname(os.path.abspath(out)), name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._file = os.fdopen(os.open(self._temp, flags, 0o644), "wb")
        self._stream: io.BufferedIOBase = self._file
        if gz:
            self._stream = gzip.GzipFile(filename="", fileobj=self._file, mode="wb",
                                         compresslevel=6, mtime=0)
        self._parts: list[str] = ['{"displayTimeUnit":"ms","traceEvents":[\n']
        self._size = 0
        self._done = False

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            with contextlib.suppress(OSError):
                self._stream.close()
                self._file.close()
            with contextlib.suppress(OSError):
                os.unlink(self._temp)

    def event(self, event: dict[str, Any]) -> None:
        text = _ENCODE(event)
        self._parts.append(",\n" + text if self.count else text)
        self.count += 1
        self._size += len(text)
        if self._size >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        self._stream.write("".join(self._parts).encode("ascii"))
        self._parts.clear()
        self._size = 0

    def finish(self, tail: dict[str, Any], force: bool) -> None:
        """End the events, add the top-level keys of ``tail`` after them (viewers that
        stop at a key they do not know have read every event by then), and publish.
        FileExistsError when ``out`` exists and not ``force``."""
        self._parts.append("\n]")
        self._parts.extend(f",{_ENCODE(key)}:{_ENCODE(value)}" for key, value in tail.items())
        self._parts.append("}\n")
        self._flush()
        if self._stream is not self._file:
            self._stream.close()  # the gzip trailer; the file stays open
        self._file.flush()
        with contextlib.suppress(OSError):  # not every file system syncs
            os.fsync(self._file.fileno())
        self._file.close()
        if force:
            os.replace(self._temp, self.out)
        else:
            try:
                os.link(self._temp, self.out)  # never replaces a file
            except OSError as err:
                if err.errno not in _NO_LINKS:
                    raise
                if os.path.lexists(self.out):
                    raise FileExistsError(errno.EEXIST, "File exists", self.out) from None
                os.rename(self._temp, self.out)
        self._done = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)


# -- merging ---------------------------------------------------------------------------

def _name(record: dict[str, Any]) -> str:
    coords = record.get("coords") or {}
    where = " ".join(f"{k}={v}" for k, v in coords.items())
    rank = record.get("rank")
    return f"rank {'?' if rank is None else rank} ({record['_label']}{', ' if where else ''}" \
           f"{where})"


def _skip_reason(record: dict[str, Any]) -> str | None:
    """Why a trace line of the window is not merged, or None."""
    if not _is_torch(record):
        return f"backend {record.get('backend')}: not a torch trace"
    if record.get("status") == "failed" or record["_file"] is None:
        return f"failed, no file: {record.get('error') or 'no reason recorded'}"
    if not str(record["_file"]).endswith(TORCH_SUFFIXES):
        return "not a .pt.trace.json[.gz] file"
    if not os.path.exists(record["_file"]):
        return "missing: the manifest names it, but it is not on disk"
    return None


def _base_time(record: dict[str, Any], root: str) -> int | None:
    """The trace's baseTimeNanoseconds (read from its head, or the whole file if it comes
    after the events); None when the trace has none."""
    with TraceReader(record["_file"]) as reader:
        meta = reader.header()
        if "baseTimeNanoseconds" not in meta:
            for _ in reader.events():
                pass
            meta = reader.meta
    base = meta.get("baseTimeNanoseconds")
    if isinstance(base, int) and not isinstance(base, bool):
        return base
    print(f"{_PROG}: note: {os.path.relpath(record['_file'], root)} has no "
          "baseTimeNanoseconds: its timestamps are taken as Unix microseconds", file=sys.stderr)
    return None


def _pids(records: list[dict[str, Any]]) -> list[int]:
    """A process id per trace: rank + 1 (Perfetto keeps pid 0 for the idle process)."""
    known = [r["rank"] for r in records if isinstance(r.get("rank"), int)]
    spare = itertools.count(max(known, default=-1) + 2)
    return [r["rank"] + 1 if isinstance(r.get("rank"), int) else next(spare) for r in records]


def merge(records: list[dict[str, Any]], root: str, out: str, force: bool) -> int:
    """Write the traces of ``records`` (one window, sorted by rank) as one; the number of
    events written. TraceError (with the file in front) for a trace that cannot be read."""
    bases = []
    for r in records:
        try:
            bases.append(_base_time(r, root) or 0)
        except TraceError as err:
            raise TraceError(f"{os.path.relpath(r['_file'], root)}: {err}") from None
    ref = min(bases)
    pids = _pids(records)
    tids = itertools.count(1000 * (max(pids) // 1000 + 1))
    with TraceWriter(out) as writer:
        for index, (r, base, pid) in enumerate(zip(records, bases, pids, strict=True)):
            rel = os.path.relpath(r["_file"], root)
            delta = base - ref  # nanoseconds; microseconds in the trace
            shift = delta // 1000 if delta % 1000 == 0 else delta / 1000
            proc = ProcessMap(pid, shift=shift, id_base=index << _ID_SHIFT, tids=tids,
                              main=r.get("pid"))
            try:
                with TraceReader(r["_file"]) as reader:
                    for event in reader.events():
                        if proc.event(event) is not None:
                            writer.event(event)
            except TraceError as err:
                raise TraceError(f"{rel}: {err}") from None
            if reader.not_objects:
                print(f"{_PROG}: note: {rel}: {reader.not_objects} entries of traceEvents "
                      "are not objects; left out", file=sys.stderr)
            args = {"rank": r.get("rank"), "role": r["_label"], "coords": r.get("coords"),
                    "trace": rel, "status": r.get("status"), "metadata": reader.meta}
            labels = [str(reader.meta.get("host_name") or ""), r.get("status") or ""]
            rank = r.get("rank")
            for event in proc.metadata(_name(r), rank if isinstance(rank, int) else pid, args,
                                       ", ".join(x for x in labels if x not in ("", "complete"))):
                writer.event(event)
        first = records[0]
        writer.finish({"schemaVersion": 1, "baseTimeNanoseconds": ref, "policy_engine_merge": {
            "role": first["_label"], "region": first.get("region"),
            "steps": first.get("steps"), "cycle": first.get("cycle"),
            "ranks": [r.get("rank") for r in records],
            "traces": [os.path.relpath(r["_file"], root) for r in records]}}, force)
        return writer.count


def run(args: argparse.Namespace) -> int:
    root, out = args.dir, args.output
    if not os.path.isdir(root):
        raise UsageError(f"{root} is not a folder")
    if os.path.isdir(out):
        raise UsageError(f"{out} is a folder: give the merged trace's file name")
    if os.path.lexists(out) and not args.force:
        raise UsageError(f"{out} exists (--force replaces it)")
    window = choose(_records(root), args)
    merged = []
    for r in sorted(window, key=lambda r: (not isinstance(r.get("rank"), int),
                                           r.get("rank") or 0)):
        why = _skip_reason(r)
        if why is None:
            merged.append(r)
        else:
            shown = os.path.relpath(r["_file"], root) if r["_file"] else "(no file)"
            print(f"{_PROG}: skipped {shown} (rank {r.get('rank')}): {why}", file=sys.stderr)
    what = _describe(window[0]["_key"], 2)
    target = os.path.realpath(out)
    if any(r["_file"] and os.path.realpath(r["_file"]) == target for r in merged):
        raise UsageError(f"{out} is one of the traces to merge: choose another file")
    if not merged:
        print(f"{_PROG}: error: no torch trace of {what} can be read", file=sys.stderr)
        return EXIT_BAD_DATA
    try:
        events = merge(merged, root, out, args.force)
    except TraceError as err:
        print(f"{_PROG}: error: {err}", file=sys.stderr)
        return EXIT_BAD_DATA
    except FileExistsError:
        raise UsageError(f"{out} exists (--force replaces it)") from None
    except OSError as err:
        raise UsageError(f"{out}: cannot write: {err.strerror or err}") from None
    print(f"{out}: {what}, ranks {_span(r.get('rank') for r in merged)} "
          f"({len(merged)} traces, {events} events)")
    return 0
