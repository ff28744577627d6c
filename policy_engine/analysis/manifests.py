"""Reading the per-process manifests (``runtime.process.manifest`` writes them): one JSON line per
event of a capture.

Each process appends to its own file under ``<output_dir>/manifests/``. Each line is a
record of one kind (the ``event`` key), declared with its fields in
:mod:`policy_engine.files.records` and checked here through those classes
(:func:`parse_line`):

- ``open``: written when a capture opens, before the backend is touched, so a capture
  that never closes (SIGKILL, a crash) is still known;
- ``trace``: one per trace file the capture wrote, or failed to write (lines written
  before ``event`` existed have no ``event`` key and are trace lines); past 64
  consecutive steps it gives the first and last and ``step_count`` as a close line does,
  and is read with its steps listed (up to :data:`LISTED_MOST`);
- ``close``: written when the capture ends, with its status and how many traces it wrote;
  a capture of more than 64 consecutive steps gives its first and last step and
  ``step_count`` (:func:`closed_steps` reads both forms);
- ``note``: something about a role in the process that is no capture (``note`` says
  what: a trigger request accepted or missed, a slow step, a limit reached);
- ``summary``: a torch trace's figures, computed by its rank after the capture.

A line is written whole or not at all: one ``write`` on an ``O_APPEND`` descriptor, and a
short write is cut back off. Reading never raises on what it reads: each damaged line is
reported with its file and line number, and skipped.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

import attrs

from policy_engine.files.layout import MANIFEST_SUFFIX
from policy_engine.files.records import clean_value, from_json, quoted

#: The longest line read; a longer one is reported, not loaded.
MAX_LINE_BYTES = 1 << 20
#: The most lines, and bytes, read of one manifest, and records held from all of them: a
#: reader's memory stays bounded whatever the files hold (the rest is reported, not read).
MAX_MANIFEST_LINES = 20_000
MAX_MANIFEST_BYTES = 16 << 20
MAX_RECORDS = 200_000
MAX_SCAN_BYTES = 256 << 20

# -- reading ---------------------------------------------------------------------------

@attrs.frozen
class ManifestProblem:
    """Something in a manifest that could not be read: ``line`` is None for a whole file
    (or folder) that could not be read."""

    path: str
    line: int | None
    why: str


@attrs.frozen
class Scan:
    """Every record of every manifest under a folder, and every problem met.

    Each record carries ``event`` (``trace`` for old lines), ``_manifest`` (its file) and
    ``_line`` (1-based).
    """

    records: tuple[dict[str, Any], ...]
    problems: tuple[ManifestProblem, ...]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


#: What in a line's text can make a value :func:`clean_value` must change: a surrogate
#: escape, or a number that may not fit a float (an exponent, or hundreds of digits). A
#: line without any is taken as parsed (the common case: a scan of 10,000 summaries).
_UNCLEAN = re.compile(r"\\u[dD][89a-fA-F]|[0-9.][eE][+-]?[0-9]|[0-9.]{300}")


def parse_line(raw: bytes) -> dict[str, Any]:
    """One manifest line as a record (``event`` filled in), read through its kind's class
    (:func:`policy_engine.files.records.from_json`); ValueError says what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1})") from None
    try:
        parsed = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except ValueError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"not a JSON object (a {type(parsed).__name__})")
    record = from_json(parsed).to_json()
    if _UNCLEAN.search(text) is None:
        return record
    try:
        cleaned: dict[str, Any] = clean_value(record)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return cleaned


#: A trace line's first-and-last steps are read as the list of every step up to this many
#: (a million steps merged into one trace); past it they stay as written. Each step listed
#: counts :data:`STEP_BYTES` towards the bytes a scan reads, as if the line had listed it.
LISTED_MOST = 1 << 20
STEP_BYTES = 8


def _list_steps(record: dict[str, Any]) -> int:
    """A trace line's steps given as the first, the last and ``step_count``, listed (the
    readers of trace lines take lists); how many steps were listed."""
    if record["event"] != "trace" or "step_count" not in record:
        return 0
    steps = closed_steps(record)
    if not isinstance(steps, range) or len(steps) > LISTED_MOST:
        return 0
    record["steps"] = list(steps)
    del record["step_count"]
    return len(steps)


def closed_steps(record: Mapping[str, Any]) -> Sequence[int]:
    """The outer steps a ``close`` line says its capture covered: its ``steps``, or with
    ``step_count`` (a long merged capture) the range from the first to the last, never
    expanded into a list."""
    steps = [s for s in record.get("steps") or () if isinstance(s, int)]
    count = record.get("step_count")
    if isinstance(count, int) and len(steps) == 2 and steps[1] - steps[0] + 1 == count:
        return range(steps[0], steps[1] + 1)
    return steps


def _lines(f: IO[bytes]) -> Iterator[tuple[bytes | None, bool]]:
    """(line without its newline, whether it ended with one); None for a line too long."""
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of it
                raw = f.readline(MAX_LINE_BYTES)
            yield None, bool(raw)
            continue
        ended = raw.endswith(b"\n")
        yield (raw[:-1] if ended else raw), ended


def _read_file(path: str, records: list[dict[str, Any]], problems: list[ManifestProblem],
               room: int, left: int) -> int:
    """The records of one manifest into ``records``, at most ``room`` of them and
    ``left`` bytes; the bytes read."""
    try:
        # Not through a link, and never blocking on a FIFO planted under the name.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        problems.append(ManifestProblem(path, None, f"cannot read it: {err.strerror or err}"))
        return 0
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            problems.append(ManifestProblem(path, None, "not a regular file"))
            return 0
        listed = 0  # bytes the steps listed again would have taken (_list_steps)
        try:
            for number, (raw, ended) in enumerate(_lines(f), 1):
                stop = _stop(number, f.tell() + listed, room, left)
                if stop:
                    problems.append(ManifestProblem(path, number, stop))
                    break
                if raw is None:
                    problems.append(ManifestProblem(path, number,
                                            f"longer than {MAX_LINE_BYTES} bytes"))
                    continue
                if not raw.strip():
                    continue
                try:
                    record = parse_line(raw)
                except ValueError as err:
                    why = str(err)
                    if not ended:
                        why = f"half a line at the end of the file (no newline): {why}"
                    problems.append(ManifestProblem(path, number, why))
                    continue
                listed += _list_steps(record) * STEP_BYTES
                record["_manifest"] = path
                record["_line"] = number
                records.append(record)
                room -= 1
        except OSError as err:
            problems.append(ManifestProblem(path, None, f"read failed: {err.strerror or err}"))
        return f.tell() + listed


def scan_manifests(output_dir: str) -> Scan:
    """Every record of every manifest under ``output_dir`` (recursively), and every
    problem: never raises on what it finds."""
    records: list[dict[str, Any]] = []
    problems: list[ManifestProblem] = []
    _real.cache_clear()  # folders resolved by file_of: as they are now

    def unreadable(err: OSError) -> None:
        problems.append(ManifestProblem(str(err.filename or output_dir), None,
                                f"cannot list this folder: {err.strerror or err}"))

    used = 0
    for root, dirs, files in os.walk(output_dir, onerror=unreadable):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(MANIFEST_SUFFIX):
                used += _read_file(os.path.join(root, name), records, problems,
                                   MAX_RECORDS - len(records), MAX_SCAN_BYTES - used)
    return Scan(tuple(records), tuple(problems))


def _stop(line: int, read: int, room: int, left: int) -> str | None:
    """Why reading a manifest stops before ``line`` (``read`` bytes into it), or None."""
    if line > MAX_MANIFEST_LINES:
        return (f"more than {MAX_MANIFEST_LINES} lines: this line and the rest are not "
                "read")
    if read > MAX_MANIFEST_BYTES:
        return (f"more than {MAX_MANIFEST_BYTES >> 20} MiB: this line and the rest are "
                "not read")
    if room <= 0:
        return (f"the manifests hold more than {MAX_RECORDS} records together: this line "
                "and the rest are not read")
    if read > left:
        return (f"the manifests hold more than {MAX_SCAN_BYTES >> 20} MiB together: this "
                "line and the rest are not read")
    return None


def file_of(record: Mapping[str, Any], rel: Any) -> str:
    """The file a record names by ``rel`` (its ``path``, or a companion's), relative to
    its output folder (the folder above its manifest's ``manifests/``). A manifest is
    untrusted, so ValueError, saying why, for a name that is absolute or climbs out of
    that folder, or reaches outside it through a link: a reader never follows it."""
    base = os.path.dirname(os.path.dirname(str(record["_manifest"])))
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise ValueError(f"{quoted(rel)} is not a file name")
    shown = json.dumps(clean_value(rel) if len(rel) <= 200 else clean_value(rel[:197]) + "...")
    if os.path.isabs(rel):
        raise ValueError(f"path {shown} is absolute: a manifest names files inside "
                         "its output folder; not followed")
    norm = os.path.normpath(rel)
    if norm == os.pardir or norm.startswith(os.pardir + os.sep):
        raise ValueError(f"path {shown} leaves the output folder; not followed")
    full = os.path.join(base, norm)
    real_base = _real(base)
    # The folders are resolved once each (a run has few); the file itself only if a link.
    real = _real(os.path.dirname(full))
    if os.path.islink(full):
        real = os.path.realpath(full)
    if real != real_base and not real.startswith(real_base.rstrip(os.sep) + os.sep):
        raise ValueError(f"path {shown} reaches outside the output folder through "
                         "a symbolic link; not followed")
    return full


@functools.lru_cache(maxsize=4096)
def _real(folder: str) -> str:
    return os.path.realpath(folder)


def read_manifests(output_dir: str) -> list[dict[str, Any]]:
    """The trace records of every manifest under ``output_dir``, each with ``_manifest``
    (its file); damaged lines and open/close records are left out (see scan_manifests)."""
    out = []
    for record in scan_manifests(output_dir).records:
        if record["event"] == "trace":
            record = dict(record)
            del record["_line"]
            out.append(record)
    return out
