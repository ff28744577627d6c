"""The per-process manifest: one JSON line per event of a capture.

Each process appends to its own file under ``<output_dir>/manifests/``. Four kinds of
record (the ``event`` key):

- ``open``: written when a capture opens, before the backend is touched, so a capture
  that never closes (SIGKILL, a crash) is still known;
- ``trace``: one per trace file the capture wrote, or failed to write (lines written
  before ``event`` existed have no ``event`` key and are trace lines);
- ``close``: written when the capture ends, with its status and how many traces it wrote;
- ``note``: something about a role in the process that is no capture (``note`` says
  what: a trigger request accepted or missed, a slow step, a limit reached).

A line is written whole or not at all: one ``write`` on an ``O_APPEND`` descriptor, and a
short write is cut back off. Reading never raises on what it reads: each damaged line is
reported with its file and line number, and skipped.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import socket
import stat
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import attrs

from policy_engine.backends.output import folder
from policy_engine.runtime.state import STATE

MANIFEST_DIR = "manifests"
MANIFEST_SUFFIX = ".manifest.jsonl"

EVENTS = ("open", "trace", "close", "note")
#: Keys of a trace line's ``extra`` that name a file written beside the trace (relative
#: to the output folder, as ``path`` is).
COMPANIONS = ("plot", "memory_timeline")
TRACE_STATUSES = ("complete", "partial", "failed", "oom")
CLOSE_STATUSES = ("complete", "partial", "failed", "interrupted")
#: The longest line read; a longer one is reported, not loaded.
MAX_LINE_BYTES = 1 << 20

# Read too: the last byte says whether a torn line needs ending first.
_FILE_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC



def host_name() -> str:
    """The short host name that starts this host's manifest file names."""
    return socket.gethostname().split(".")[0] or "host"


def manifest_path(output_dir: str) -> str:
    """This process's manifest file for ``output_dir``."""
    key = (os.getpid(), output_dir)  # a forked child gets its own file
    with STATE.lock:
        path = STATE.manifests.get(key)
        if path is None:
            name = f"{host_name()}_pid{os.getpid()}_{STATE.started}{MANIFEST_SUFFIX}"
            path = os.path.join(output_dir, MANIFEST_DIR, name)
            STATE.manifests[key] = path
        return path


def _plain(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (they are not JSON) and every
    key a string (so keys sort)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def encode(record: Mapping[str, Any]) -> bytes:
    """One manifest line: JSON, ASCII only (so valid UTF-8 whatever strings it holds)."""
    def dump(data: Any) -> str:
        return json.dumps(data, sort_keys=True, default=str, ensure_ascii=True,
                          allow_nan=False)
    try:
        text = dump(record)
    except (ValueError, TypeError):
        text = dump(_plain(record))
    return (text + "\n").encode("ascii")


def append(output_dir: str, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one line of this process's manifest: the whole line or nothing.

    ``manifests/`` is made without following links, and the file is opened with
    ``O_NOFOLLOW``. A short write is cut back off. Raises OSError when the line could not
    be written (the file then ends as it did before).
    """
    line = encode(record)
    name = os.path.basename(manifest_path(output_dir))
    # STATE.lock is re-entrant: a signal handler may append while the code it interrupted
    # is appending.
    with STATE.lock, folder(output_dir, MANIFEST_DIR) as dir_fd:
        fd = os.open(name, _FILE_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            before = os.fstat(fd).st_size
            if before and os.pread(fd, 1, before - 1) != b"\n":
                line = b"\n" + line  # never glue this line onto a torn one
            try:
                written = os.write(fd, line)
            except BaseException:
                _cut(fd, before)
                raise
            if written != len(line):
                what = "cut off" if _cut(fd, before) else "left in place: it could not be cut"
                raise OSError(errno.EIO, f"short write to {manifest_path(output_dir)}: "
                              f"{written} of {len(line)} bytes (the part written was {what})")
        finally:
            os.close(fd)


def _cut(fd: int, size: int) -> bool:
    """Remove what a failed append left after ``size`` bytes; whether that worked."""
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
    except OSError:
        return False
    return True


def file_hash(paths: tuple[str, ...]) -> str | None:
    """A digest of the policy files a plan came from (None for mapping policies)."""
    if not paths:
        return None
    digest = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as f:
                digest.update(f.read())
        except OSError:
            return None
    return digest.hexdigest()[:16]


# -- reading ---------------------------------------------------------------------------

@attrs.frozen
class Problem:
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
    problems: tuple[Problem, ...]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _opt(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _is_label(v: Any) -> bool:
    return _is_int(v) or isinstance(v, str)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


#: field -> (check, what it must be). A field that is present must pass its check.
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "capture": (_is_str, "a string"),
    "role": (_opt(_is_str), "a string or null"),
    "roles": (_list_of(_is_str), "a list of strings"),
    "region": (_opt(_is_str), "a string or null"),
    "rank": (_opt(_is_int), "an integer or null"),
    "world": (_opt(_is_int), "an integer or null"),
    "cycle": (_opt(_is_int), "an integer or null"),
    "pid": (_opt(lambda v: _is_int(v) and v > 0), "a positive integer or null"),
    "path": (_opt(_is_str), "a string or null"),
    "bytes": (_opt(lambda v: _is_int(v) and 0 <= v < 1 << 63), "a byte count or null"),
    "steps": (_list_of(_is_label), "a list of integers or strings"),
    "inner_steps": (_list_of(_is_label), "a list of integers or strings"),
    "joined": (_list_of(_is_label), "a list of integers or strings"),
    "start": (_is_number, "a number"),
    "end": (_is_number, "a number"),
    "error": (_opt(_is_str), "a string or null"),
    "traces": (lambda v: _is_int(v) and v >= 0, "a count"),
    "deferred": (lambda v: _is_int(v) and v >= 0, "a count"),
    "coords": (_opt(lambda v: isinstance(v, dict)), "an object or null"),
    "extra": (_opt(lambda v: isinstance(v, dict)), "an object or null"),
    "trigger": (_is_str, "a string"),
    "request": (_opt(_is_str), "a string or null"),
    "note": (_is_str, "a string"),
}
_REQUIRED = {"open": ("capture",), "trace": ("status",), "close": ("capture", "status"),
             "note": ("note",)}
_STATUSES = {"open": None, "trace": TRACE_STATUSES, "close": CLOSE_STATUSES, "note": None}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: Any) -> Any:
    """Lone surrogates (from ``\\ud800`` escapes) replaced, so the value prints and encodes;
    numbers too large for a float dropped."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def parse_line(raw: bytes) -> dict[str, Any]:
    """One manifest line as a record (``event`` filled in); ValueError says what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1})") from None
    try:
        record = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except ValueError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object (a {type(record).__name__})")
    event = record.setdefault("event", "trace")
    if event not in EVENTS:
        raise ValueError(f"event: unknown kind {_clean(event)!r} (expected one of "
                         f"{', '.join(EVENTS)})")
    for key in _REQUIRED[event]:
        if key not in record:
            raise ValueError(f"{key}: missing (every {event} record has one)")
    for key, (check, what) in _FIELDS.items():
        if key in record and not check(record[key]):
            raise ValueError(f"{key}: expected {what}, got {_show(record[key])}")
    statuses = _STATUSES[event]
    if statuses is not None and record["status"] not in statuses:
        raise ValueError(f"status: expected one of {', '.join(statuses)}, got "
                         f"{_show(record['status'])}")
    try:
        cleaned: dict[str, Any] = _clean(record)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return cleaned


def _show(value: Any) -> str:
    try:
        text = json.dumps(_clean(value), ensure_ascii=True)
    except (ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


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


def _read_file(path: str, records: list[dict[str, Any]], problems: list[Problem]) -> None:
    try:
        # Not through a link, and never blocking on a FIFO planted under the name.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        problems.append(Problem(path, None, f"cannot read it: {err.strerror or err}"))
        return
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            problems.append(Problem(path, None, "not a regular file"))
            return
        try:
            for number, (raw, ended) in enumerate(_lines(f), 1):
                if raw is None:
                    problems.append(Problem(path, number,
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
                    problems.append(Problem(path, number, why))
                    continue
                record["_manifest"] = path
                record["_line"] = number
                records.append(record)
        except OSError as err:
            problems.append(Problem(path, None, f"read failed: {err.strerror or err}"))


def scan_manifests(output_dir: str) -> Scan:
    """Every record of every manifest under ``output_dir`` (recursively), and every
    problem: never raises on what it finds."""
    records: list[dict[str, Any]] = []
    problems: list[Problem] = []

    def unreadable(err: OSError) -> None:
        problems.append(Problem(str(err.filename or output_dir), None,
                                f"cannot list this folder: {err.strerror or err}"))

    for root, dirs, files in os.walk(output_dir, onerror=unreadable):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(MANIFEST_SUFFIX):
                _read_file(os.path.join(root, name), records, problems)
    return Scan(tuple(records), tuple(problems))


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
