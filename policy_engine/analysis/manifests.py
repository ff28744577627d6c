"""Reading the per-process manifests (``runtime.process.manifest`` writes them): one JSON line per
event of a capture.

Each process appends to its own file under ``<output_dir>/manifests/``, and starts a new
one (``<name>.2.manifest.jsonl``, ``.3``...) before the current one passes what a reader
reads of one file; the files of one process are read as one manifest, in order
(:func:`process_of`). Each line is a record of one kind (the ``event`` key), declared with
its fields in :mod:`policy_engine.files.records` and checked here through those classes
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

Two ways to read. :func:`read_lines` hands out the lines one at a time, each with where it
lies, so that a reader holds only what it keeps (``analyze`` keeps a summary's place, not
the summary, and reads it again when it needs it: :func:`load_summary`); its memory does
not grow with what the files hold. :func:`scan_manifests` keeps every record, as a dict,
up to :data:`MAX_RECORDS`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import IO, Any, TypedDict, cast

import attrs

from policy_engine.files.layout import MANIFEST_SUFFIX
from policy_engine.files.records import (
    ABSENT,
    Line,
    SummaryLine,
    clean_value,
    fields_of,
    from_json,
    quoted,
)

try:  # orjson reads a line several times faster; the standard library reads what it cannot
    import orjson
except ImportError:  # pragma: no cover - the package depends on it; the reader still works
    orjson = None  # type: ignore[assignment]

#: The longest line read; a longer one is reported, not loaded.
MAX_LINE_BYTES = 1 << 20
#: The most lines, and bytes, read of one manifest file (a process starts a new file well
#: before either: ``runtime.process.manifest``); the rest of a longer one is reported, not
#: read.
MAX_MANIFEST_LINES = 20_000
MAX_MANIFEST_BYTES = 16 << 20
#: The most records :func:`scan_manifests` holds from all the files together, and the most
#: bytes any reading of a folder reads: a reader's memory and time stay bounded whatever the
#: files hold (the rest is reported, not read). :func:`read_lines` holds no record itself.
MAX_RECORDS = 200_000
MAX_SCAN_BYTES = 16 << 30

# -- the records ---------------------------------------------------------------------------

class _Event(TypedDict):
    event: str  # the line's kind (``trace`` for old lines, which had no ``event``)


class LineRecord(_Event, total=False):
    """A manifest line as a dict: what ``Line.to_json`` makes of a checked line
    (:mod:`policy_engine.files.records`). Its keys are the fields of ``records.Line``, with
    the types its checks give them, and the keys of its ``more`` that readers look at
    (unchecked: ``Any``)."""

    capture: str
    role: str | None
    roles: list[str]
    region: str | None
    rank: int | None
    world: int | None
    cycle: int | None
    pid: int | None
    path: str | None
    bytes: int | None
    steps: list[int | str]
    inner_steps: list[int | str]
    step_count: int
    joined: list[int | str]
    start: float
    end: float
    error: str | None
    traces: int
    thread_waits: int
    stopped_by: str | None
    deferred: int
    coords: Any  # an object or null: the rank's coordinates in the mesh, by dimension
    extra: Any  # an object or null: the companions' files (``records.COMPANIONS``)
    trigger: str
    request: str | None
    note: str
    summary: Any  # an object or null: a summary line's figures (``summary.problem`` checks)
    kept: bool
    seconds: float
    trimmed: str | None
    offset_us: float
    uncertainty_us: float
    reference_rank: int
    rounds: int
    measured_at: float
    # a trace, close or summary line's is checked; a note's (a trigger request's) is not
    status: Any
    # not declared by ``records.Line``: kept in its ``more``, as written
    backend: Any
    host: Any
    policy_hash: Any
    policy_content_hash: Any
    policy_file: Any
    plan_hash: Any
    torch: Any
    recorded: Any
    limit: Any  # a close line's: the limit that ended the capture
    message: Any  # a limit note's
    at: Any  # a missed trigger request's step
    step: Any  # a slow step note's
    median: Any  # a slow step note's: the median step, in seconds
    captures: Any  # a slow step note's, or a trigger's: the steps it asked to capture
    first: Any  # an accepted trigger request's first step
    last: Any  # an accepted trigger request's last step


class _Where(TypedDict):
    _manifest: str  # its process's manifest: the first file's path (:func:`process_of`)


class ManifestRecord(LineRecord, _Where, total=False):
    """A manifest line as :func:`record_of` hands it on (and :func:`scan_manifests` holds
    it): its :class:`LineRecord`, with where it lies."""

    # the file the line is in, and its line number there (1-based): every record
    # scan_manifests holds has them, read_manifests' trace records have not
    _file: str
    _line: int


def line_record(line: Line) -> LineRecord:
    """A checked line as its dict (``line.to_json()``)."""
    # to_json gives the line's fields (the keys and types LineRecord declares after
    # records.Line), its ``more`` and ``event``; it is typed as an open dict in records.py
    return cast(LineRecord, line.to_json())


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

    Each record carries ``event`` (``trace`` for old lines), ``_manifest`` (its process's
    manifest: the first file's path, for every file of the process), ``_file`` (the file
    the line is in) and ``_line`` (1-based, in that file).
    """

    records: tuple[ManifestRecord, ...]
    problems: tuple[ManifestProblem, ...]


@attrs.frozen
class Place:
    """Where a line lies: its file, its line number (1-based), and its bytes."""

    file: str
    line: int
    offset: int
    length: int


@attrs.frozen
class Found:
    """One line read: its record (checked), its process's manifest (:func:`process_of`)
    and where it lies."""

    line: Line
    manifest: str
    place: Place


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


#: What in a line's text can make a value :func:`clean_value` must change: a surrogate
#: escape, or a number that may not fit a float (an exponent, or hundreds of digits). A
#: line without any is taken as parsed (the common case: a scan of 10,000 summaries).
_UNCLEAN = re.compile(r"\\u[dD][89a-fA-F]|[0-9.][eE][+-]?[0-9]|[0-9.]{300}")
# A run of 19 digits or more: an integer orjson would read as a float (the standard
# library keeps it an integer, and a check may refuse it as too large).
_DIGITS, _LONG = bytes.maketrans(b"123456789", b"000000000"), b"0" * 19


def _loads(raw: bytes) -> Any:
    """A line's JSON value: orjson's where it reads it exactly as the standard library
    would (it refuses NaN, infinities and lone surrogates, which the slow path then reads
    and reports or cleans); None when the slow path must read it."""
    if orjson is None or _LONG in raw.translate(_DIGITS):
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _parse(raw: bytes) -> tuple[Line, bool]:
    """A line's record, and whether its values may need :func:`clean_value`."""
    parsed = _loads(raw)
    fast = parsed is not None
    if not fast:
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
    return from_json(parsed), not fast and _UNCLEAN.search(raw.decode("utf-8")) is not None


def parse_line(raw: bytes) -> LineRecord:
    """One manifest line as a record (``event`` filled in), read through its kind's class
    (:func:`policy_engine.files.records.from_json`); ValueError says what is wrong."""
    line, unclean = _parse(raw)
    record = line_record(line)
    if not unclean:
        return record
    try:
        cleaned: LineRecord = clean_value(record)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return cleaned


#: What a reader may take of a summary line before it needs its figures: the trace it is
#: of and its status (fields_of; the rest is checked when the line is read again).
SUMMARY_HEAD = ("path", "status", "kept")


def _summary_head(raw: bytes) -> Line | None:
    """A summary line's head (:data:`SUMMARY_HEAD`), read without checking its figures;
    None when the line is not one orjson reads as such (the full reading decides)."""
    if b'"event": "summary"' not in raw:
        return None
    parsed = _loads(raw)
    if not isinstance(parsed, dict) or parsed.get("event") != "summary":
        return None
    try:
        return fields_of(parsed, SummaryLine, SUMMARY_HEAD)
    except ValueError:
        return None  # read whole: the full reading says what is wrong


def parse_record(raw: bytes, *, heads: bool = False) -> Line:
    """One manifest line as its kind's checked record (values cleaned as
    :func:`parse_line` cleans them); ValueError says what is wrong. ``heads``: of a
    summary line only its :data:`SUMMARY_HEAD`."""
    if heads:
        head = _summary_head(raw)
        if head is not None:
            return head
    line, unclean = _parse(raw)
    if not unclean:
        return line
    try:
        return from_json(clean_value(line.to_json()))
    except RecursionError:
        raise ValueError("nested too deeply") from None


#: A trace line's first-and-last steps are read as the list of every step up to this many
#: (a million steps merged into one trace); past it they stay as written. Each step listed
#: counts :data:`STEP_BYTES` towards the bytes a scan reads, as if the line had listed it.
LISTED_MOST = 1 << 20
STEP_BYTES = 8


def _listed(line: Line) -> tuple[Line, int]:
    """A trace line whose steps are given as the first, the last and ``step_count``, with
    them listed (the readers of trace lines take lists), and how many were listed; other
    lines as they are."""
    if line.EVENT != "trace" or not isinstance(line.step_count, int):
        return line, 0
    steps = closed_steps({"steps": line.steps, "step_count": line.step_count})
    if not isinstance(steps, range) or len(steps) > LISTED_MOST:
        return line, 0
    return attrs.evolve(line, steps=list(steps), step_count=ABSENT), len(steps)


def closed_steps(record: Mapping[str, Any]) -> Sequence[int]:
    """The outer steps a ``close`` line says its capture covered: its ``steps``, or with
    ``step_count`` (a long merged capture) the range from the first to the last, never
    expanded into a list."""
    steps = [s for s in record.get("steps") or () if isinstance(s, int)]
    count = record.get("step_count")
    if isinstance(count, int) and len(steps) == 2 and steps[1] - steps[0] + 1 == count:
        return range(steps[0], steps[1] + 1)
    return steps


def _lines(f: IO[bytes]) -> Iterator[tuple[bytes | None, bool, int]]:
    """(line without its newline, whether it ended with one, its offset); None for a line
    too long."""
    offset = f.tell()
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of it
                raw = f.readline(MAX_LINE_BYTES)
            yield None, bool(raw), offset
            offset = f.tell()
            continue
        ended = raw.endswith(b"\n")
        yield (raw[:-1] if ended else raw), ended, offset
        offset += len(raw)


#: ``<name>.<k>.manifest.jsonl``: the k-th file of the process whose first file is
#: ``<name>.manifest.jsonl`` (k from 2).
_ROTATED = re.compile(r"^(.+)\.([1-9][0-9]{0,8})" + re.escape(MANIFEST_SUFFIX) + "$")


def process_of(path: str) -> tuple[str, int]:
    """The manifest of the process that wrote the file at ``path`` (its first file's path,
    which names every file of the process), and which of its files this is (1, 2...)."""
    folder, name = os.path.split(path)
    match = _ROTATED.match(name)
    if match is None:
        return path, 1
    return os.path.join(folder, match.group(1) + MANIFEST_SUFFIX), int(match.group(2))


def manifest_files(output_dir: str, problems: list[ManifestProblem]) -> list[tuple[str, str]]:
    """(file, its process's manifest) for every manifest file under ``output_dir``
    (recursively), each process's files together and in the order it wrote them."""
    found: list[tuple[str, int, str]] = []

    def unreadable(err: OSError) -> None:
        problems.append(ManifestProblem(str(err.filename or output_dir), None,
                                        f"cannot list this folder: {err.strerror or err}"))

    for root, dirs, files in os.walk(output_dir, onerror=unreadable):
        dirs.sort()
        for name in files:
            if name.endswith(MANIFEST_SUFFIX):
                path = os.path.join(root, name)
                process, k = process_of(path)
                found.append((process, k, path))
    found.sort()
    return [(path, process) for process, _k, path in found]


def read_lines(output_dir: str, problems: list[ManifestProblem], *,
               wanted: Callable[[bytes], bool] | None = None,
               heads: bool = False) -> Generator[Found, None, None]:
    """Every line of every manifest under ``output_dir``, checked, one at a time (each
    process's files in order); what cannot be read goes to ``problems``, never raised.
    ``wanted``: lines (raw bytes) for which it is false are skipped unparsed; ``heads``:
    of each summary line only its head (:data:`SUMMARY_HEAD`), its figures neither
    checked nor kept (a reader that reads them again, by the line's place)."""
    _real.cache_clear()  # folders resolved by file_of: as they are now
    left = MAX_SCAN_BYTES
    for path, process in manifest_files(output_dir, problems):
        used = yield from _read_file(path, process, problems, left, wanted, heads)
        left -= used
        if left <= 0:
            break


def _read_file(path: str, process: str, problems: list[ManifestProblem], left: int,
               wanted: Callable[[bytes], bool] | None,
               heads: bool = False) -> Generator[Found, None, int]:
    """The records of one manifest file; returns the bytes read (``left`` at most)."""
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
        listed = 0  # bytes the steps listed again would have taken (_listed)
        try:
            for number, (raw, ended, offset) in enumerate(_lines(f), 1):
                stop = _stop(number, f.tell() + listed, left)
                if stop:
                    problems.append(ManifestProblem(path, number, stop))
                    break
                if raw is None:
                    problems.append(ManifestProblem(path, number,
                                                    f"longer than {MAX_LINE_BYTES} bytes"))
                    continue
                if not raw.strip() or (wanted is not None and not wanted(raw)):
                    continue
                try:
                    line, count = _listed(parse_record(raw, heads=heads))
                except ValueError as err:
                    why = str(err)
                    if not ended:
                        why = f"half a line at the end of the file (no newline): {why}"
                    problems.append(ManifestProblem(path, number, why))
                    continue
                listed += count * STEP_BYTES
                yield Found(line, process, Place(path, number, offset, len(raw)))
        except OSError as err:
            problems.append(ManifestProblem(path, None, f"read failed: {err.strerror or err}"))
        return f.tell() + listed


def _stop(line: int, read: int, left: int) -> str | None:
    """Why reading a manifest file stops before ``line`` (``read`` bytes into it), or
    None."""
    if line > MAX_MANIFEST_LINES:
        return (f"more than {MAX_MANIFEST_LINES} lines: this line and the rest are not "
                "read")
    if read > MAX_MANIFEST_BYTES:
        return (f"more than {MAX_MANIFEST_BYTES >> 20} MiB: this line and the rest are "
                "not read")
    if read > left:
        return (f"the manifests hold more than {MAX_SCAN_BYTES >> 20} MiB together: this "
                "line and the rest are not read")
    return None


def record_of(found: Found) -> ManifestRecord:
    """A line read, as the dict :func:`scan_manifests` holds."""
    # to_json's dict (line_record says why it is one), where it lies added below
    record = cast(ManifestRecord, found.line.to_json())
    record["_manifest"] = found.manifest
    record["_file"] = found.place.file
    record["_line"] = found.place.line
    return record


def scan_manifests(output_dir: str) -> Scan:
    """Every record of every manifest under ``output_dir`` (recursively), and every
    problem: never raises on what it finds. At most :data:`MAX_RECORDS` records are held;
    the rest are reported."""
    records: list[ManifestRecord] = []
    problems: list[ManifestProblem] = []
    for found in read_lines(output_dir, problems):
        if len(records) >= MAX_RECORDS:
            problems.append(ManifestProblem(
                found.place.file, found.place.line, f"the manifests hold more than "
                f"{MAX_RECORDS} records together: this line and the rest are not read"))
            break
        records.append(record_of(found))
    return Scan(tuple(records), tuple(problems))


def read_line(place: Place) -> bytes:
    """The bytes of the line at ``place``, read again (a reader that kept only its place);
    ValueError says why they cannot be."""
    try:
        fd = os.open(place.file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise ValueError(f"cannot read it again: {err.strerror or err}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file any more")
        return os.pread(fd, place.length, place.offset)
    except OSError as err:
        raise ValueError(f"cannot read it again: {err.strerror or err}") from None
    finally:
        os.close(fd)


def load_summary(place: Place) -> SummaryLine:
    """The summary line at ``place``, read again (a reader that kept only its place);
    ValueError says why it cannot be (the file changed since, or the line is not one)."""
    line = parse_record(read_line(place))
    if not isinstance(line, SummaryLine):
        raise ValueError("the file changed since it was read: no summary line there")
    return line


def file_of(record: ManifestRecord, rel: Any) -> str:
    """The file a record names by ``rel`` (its ``path``, or a companion's), relative to
    its output folder (the folder above its manifest's ``manifests/``). A manifest is
    untrusted, so ValueError, saying why, for a name that is absolute or climbs out of
    that folder, or reaches outside it through a link: a reader never follows it."""
    return path_in(str(record["_manifest"]), rel)


def path_in(manifest: str, rel: Any) -> str:
    """:func:`file_of` for a record of the manifest ``manifest``."""
    base = os.path.dirname(os.path.dirname(manifest))
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise ValueError(f"{quoted(rel)} is not a file name")
    if os.path.isabs(rel):
        raise ValueError(f"path {_shown(rel)} is absolute: a manifest names files inside "
                         "its output folder; not followed")
    norm = os.path.normpath(rel)
    if norm == os.pardir or norm.startswith(os.pardir + os.sep):
        raise ValueError(f"path {_shown(rel)} leaves the output folder; not followed")
    full = os.path.join(base, norm)
    real_base = _real(base)
    # The folders are resolved once each (a run has few); the file itself only if a link.
    real = _real(os.path.dirname(full))
    if os.path.islink(full):
        real = os.path.realpath(full)
    if real != real_base and not real.startswith(real_base.rstrip(os.sep) + os.sep):
        raise ValueError(f"path {_shown(rel)} reaches outside the output folder through "
                         "a symbolic link; not followed")
    return full


def _shown(rel: str) -> str:
    """A file name a manifest gives, as a message quotes it (cleaned, cut at 200)."""
    return json.dumps(clean_value(rel) if len(rel) <= 200 else clean_value(rel[:197]) + "...")


@functools.lru_cache(maxsize=4096)
def _real(folder: str) -> str:
    return os.path.realpath(folder)


def read_manifests(output_dir: str) -> list[ManifestRecord]:
    """The trace records of every manifest under ``output_dir``, each with ``_manifest``
    (its process's manifest); damaged lines and open/close records are left out (see
    scan_manifests)."""
    out = []
    for record in scan_manifests(output_dir).records:
        if record["event"] == "trace":
            record = record.copy()
            del record["_line"], record["_file"]
            out.append(record)
    return out
