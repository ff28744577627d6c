"""Manifest records: each kind of line of a per-process manifest as a class, declared once,
which the writer builds lines with and the reader checks lines with.

Five kinds of line (the ``event`` key): ``open`` when a capture opens (:class:`OpenLine`),
``trace`` per file a capture wrote or failed to write (:class:`TraceLine`), ``close`` when
it ends (:class:`CloseLine`), ``note`` for what happened to a role that is no capture
(:class:`NoteLine`: a trigger, a limit, a reading of the job's clock), and ``summary``
per torch trace, the figures its rank computed from it after the capture
(:class:`SummaryLine`, written by ``runtime.process.summaries``).

:class:`Line` declares every field a line may carry, with its type and what its value
must be. A field means one thing on every line, whatever its kind (a note line that names
its capture names it as a trace line does), so it is checked wherever it appears. Each
kind adds what it must carry (its ``capture``, its ``status`` and the statuses it may
take). A field a line leaves out is :data:`ABSENT`, which is not a null: the line is
written without its key. Keys that no field declares (``backend``, ``host``,
``plan_hash``, a note's own figures) travel in :attr:`Line.more` as they were written.

Writing: :meth:`Line.build` takes the fields as code gives them, unchecked (the reader is
the check), and :meth:`Line.to_json` is the mapping
:mod:`policy_engine.runtime.process.manifest` encodes. The builders :func:`open_line`,
:func:`trace_line`, :func:`close_line`, :func:`note_line` and :func:`summary_line` do
both, and take the fields their kind requires as arguments, so that a line cannot be built
without them. Reading: :func:`from_json` makes the line an untrusted JSON object holds,
or raises ValueError naming the field that is wrong and why
(:func:`policy_engine.analysis.manifests.parse_line` reads each line through it).
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import attrs

from policy_engine.errors import is_int, printable

#: Keys of a trace line's ``extra`` that name a file written beside the trace (relative
#: to the output folder, as ``path`` is).
COMPANIONS = ("plot", "memory_timeline")


class Status(str, enum.Enum):
    """How a capture, or one file of it, ended: a member is the word its manifest line says
    (it equals that word, and JSON writes it so)."""

    COMPLETE = "complete"
    PARTIAL = "partial"
    FAILED = "failed"
    #: trace lines only: a file written at an out-of-memory error, outside any capture
    OOM = "oom"
    #: close lines only: the process ended while another thread held the capture
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value


class SummaryStatus(str, enum.Enum):
    """How a trace's summary came out: ``complete`` (``summary`` holds the figures),
    ``failed`` (``error`` says why there are none), ``cut`` (the process ended while the
    summary was being made)."""

    COMPLETE = "complete"
    FAILED = "failed"
    CUT = "cut"

    def __str__(self) -> str:
        return self.value


TRACE_STATUSES = tuple(s.value for s in (Status.COMPLETE, Status.PARTIAL, Status.FAILED,
                                         Status.OOM))
CLOSE_STATUSES = tuple(s.value for s in (Status.COMPLETE, Status.PARTIAL, Status.FAILED,
                                         Status.INTERRUPTED))
SUMMARY_STATUSES = tuple(s.value for s in SummaryStatus)

Record = dict[str, Any]
#: Steps a close or trace line lists, at most. A capture that covered more (merged steps,
#: which follow each other, go on as long as the run when the steps do) gives its first
#: and last step in ``steps`` and how many it covered in ``step_count``.
LISTED_STEPS = 64


class Absent(enum.Enum):
    """The value of a field a line does not carry: no key, which is not a null."""

    ABSENT = "absent"


ABSENT = Absent.ABSENT
Check = Callable[[Any], bool]
_L = TypeVar("_L", bound="Line")
_CHECK = "check"  # a field's metadata: (check, what its value must be)


def _is_int(v: Any) -> bool:
    """An integer of 64 bits: JSON allows thousands of digits, which no field of a line
    has, and which would overflow what a reader does with them (a float, a length)."""
    return is_int(v) and -(1 << 63) <= v < 1 << 63


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _is_count(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_label(v: Any) -> bool:
    return _is_int(v) or isinstance(v, str)


def _is_object(v: Any) -> bool:
    return isinstance(v, dict)


def _opt(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


#: A field's rule: its check, what its value must be (as a message words it), and what
#: says the same as the check without a call (:func:`_passes`): value types that pass as
#: they are, the range an ``int`` passes in, a list's item types and the range its ``int``
#: items pass in, and the least finite ``float`` that passes.
_Rule = tuple[Check, str, frozenset[type], "tuple[int, int] | None",
              "tuple[frozenset[type], tuple[int, int] | None] | None", "float | None"]
_INT64 = (-(1 << 63), 1 << 63)
_COUNTS = (0, 1 << 63)


def _must(check: Check, what: str, types: tuple[type, ...] = (), *,
          ints: tuple[int, int] | None = None,
          items: tuple[tuple[type, ...], tuple[int, int] | None] | None = None,
          floats: float | None = None) -> Mapping[str, _Rule]:
    """A field's metadata: where present its value must pass ``check`` (``what`` says what
    that is, as a message words it). ``types``: the value's type being one of these says
    the same as ``check``; ``ints``: an ``int`` in this range does; ``items``: a list whose
    items are of these types (``int`` items in the range given) does; ``floats``: a finite
    ``float`` not below this does. Read first: a check of 100,000 lines mostly meets these,
    and the check itself decides the rest."""
    listed = None if items is None else (frozenset(items[0]), items[1])
    return {_CHECK: (check, what, frozenset(types), ints, listed, floats)}


def _passes(value: Any, rule: _Rule) -> bool:
    """Whether ``value`` passes ``rule``: what its types and ranges say without a call,
    else its check."""
    kind = type(value)
    if kind in rule[2]:
        return True
    if kind is int:
        ints = rule[3]
        if ints is not None and ints[0] <= value < ints[1]:
            return True
    elif kind is float:
        least = rule[5]
        if least is not None and -math.inf < value < math.inf and value >= least:
            return True
    elif kind is list and rule[4] is not None:
        types, ints = rule[4]
        for item in value:
            if type(item) is int:
                if ints is None or not ints[0] <= item < ints[1]:
                    break
            elif type(item) not in types:
                break
        else:
            return True
    return rule[0](value)


_NONE = type(None)
_STR = _must(_is_str, "a string", (str,))
_OPT_STR = _must(_opt(_is_str), "a string or null", (str, _NONE))
_OPT_INT = _must(_opt(_is_int), "an integer or null", (_NONE,), ints=_INT64)
_LABELS = _must(_list_of(_is_label), "a list of integers or strings",
                items=((str,), _INT64))
_NUMBER = _must(_is_number, "a number", ints=_INT64, floats=-math.inf)
_COUNT = _must(_is_count, "a count", ints=_COUNTS)
_OPT_OBJECT = _must(_opt(_is_object), "an object or null", (dict, _NONE))


def _one_of(statuses: tuple[str, ...]) -> Mapping[str, _Rule]:
    """A kind's ``status``: one of ``statuses``."""
    return _must(lambda v: isinstance(v, str) and v in statuses,
                 f"one of {', '.join(statuses)}")


@attrs.frozen(kw_only=True, slots=False)
class Line:
    """A manifest line: every field a line of any kind may carry, left out
    (:data:`ABSENT`) unless given; only the kinds below are made. Lists and mappings are
    kept as JSON has them."""

    EVENT: ClassVar[str]

    # -- the capture, and the role and rank that recorded it
    capture: str | Absent = attrs.field(default=ABSENT, metadata=_STR)
    role: str | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_STR)
    roles: list[str] | Absent = attrs.field(
        default=ABSENT, metadata=_must(_list_of(_is_str), "a list of strings",
                                       items=((str,), None)))
    region: str | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_STR)
    rank: int | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_INT)
    world: int | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_INT)
    cycle: int | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_INT)
    pid: int | Absent | None = attrs.field(default=ABSENT, metadata=_must(
        _opt(lambda v: _is_int(v) and v > 0), "a positive integer or null", (_NONE,),
        ints=(1, 1 << 63)))
    # -- a file (relative to the output folder) and its size
    path: str | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_STR)
    bytes: int | Absent | None = attrs.field(default=ABSENT, metadata=_must(
        _opt(lambda v: _is_int(v) and 0 <= v < 1 << 63), "a byte count or null", (_NONE,),
        ints=_COUNTS))
    # -- outer steps (a close line past LISTED_STEPS: the first, the last and how many),
    # inner steps, and the roles that joined a colocated capture
    steps: list[int | str] | Absent = attrs.field(default=ABSENT, metadata=_LABELS)
    inner_steps: list[int | str] | Absent = attrs.field(default=ABSENT, metadata=_LABELS)
    step_count: int | Absent = attrs.field(default=ABSENT, metadata=_COUNT)
    joined: list[int | str] | Absent = attrs.field(default=ABSENT, metadata=_LABELS)
    # -- times (Unix seconds), and how a capture ended
    start: float | Absent = attrs.field(default=ABSENT, metadata=_NUMBER)
    end: float | Absent = attrs.field(default=ABSENT, metadata=_NUMBER)
    error: str | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_STR)
    traces: int | Absent = attrs.field(default=ABSENT, metadata=_COUNT)
    thread_waits: int | Absent = attrs.field(default=ABSENT, metadata=_COUNT)
    stopped_by: str | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_STR)
    #: What older versions called thread_waits: read, never written, never a missing trace.
    deferred: int | Absent = attrs.field(default=ABSENT, metadata=_COUNT)
    coords: dict[str, Any] | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_OBJECT)
    extra: dict[str, Any] | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_OBJECT)
    # -- what opened a capture beyond the plan (a trigger, the request that asked), a note
    trigger: str | Absent = attrs.field(default=ABSENT, metadata=_STR)
    request: str | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_STR)
    note: str | Absent = attrs.field(default=ABSENT, metadata=_STR)
    # -- a trace's summary
    summary: dict[str, Any] | Absent | None = attrs.field(default=ABSENT,
                                                          metadata=_OPT_OBJECT)
    kept: bool | Absent = attrs.field(
        default=ABSENT, metadata=_must(lambda v: isinstance(v, bool), "true or false",
                                       (bool,)))
    seconds: float | Absent = attrs.field(default=ABSENT, metadata=_must(
        lambda v: _is_number(v) and v >= 0, "a number of seconds", ints=_COUNTS,
        floats=0.0))
    trimmed: str | Absent | None = attrs.field(default=ABSENT, metadata=_OPT_STR)
    # -- a reading of the job's clock (a ``clock`` note): the offset that brings the
    # process's clock to the reference rank's (``reference_rank``), within
    # ``uncertainty_us``, the best of ``rounds`` round trips; ``measured_at``: when, on the
    # process's own clock (Unix seconds)
    offset_us: float | Absent = attrs.field(default=ABSENT, metadata=_NUMBER)
    uncertainty_us: float | Absent = attrs.field(default=ABSENT, metadata=_must(
        lambda v: _is_number(v) and v >= 0, "a number of microseconds, not negative",
        ints=_COUNTS, floats=0.0))
    reference_rank: int | Absent = attrs.field(default=ABSENT, metadata=_COUNT)
    rounds: int | Absent = attrs.field(default=ABSENT, metadata=_COUNT)
    measured_at: float | Absent = attrs.field(default=ABSENT, metadata=_NUMBER)
    #: The keys no field declares, with their values as written.
    more: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def build(cls: type[_L], base: Mapping[str, Any], /, **fields: Any) -> _L:
        """The line of this kind that ``base`` (who records: role, rank, backend...) and
        ``fields`` make, ``fields`` winning where both name a key, unchecked. An ``event``
        key is left out: the class says the kind."""
        given = {**base, **fields}
        names = _NAMES[cls]
        return cls(**{k: v for k, v in given.items() if k in names},
                   more={k: v for k, v in given.items() if k not in names and k != "event"})

    def to_json(self) -> Record:
        """The line as the JSON object written: the fields it carries, what :attr:`more`
        holds, and ``event`` (last: nothing else says the kind)."""
        out = {name: value for name in _KEYS[type(self)]
               if (value := getattr(self, name)) is not ABSENT}
        return {**out, **self.more, "event": self.EVENT}


# Each kind below declares again, without a default, the fields of Line it must carry.

@attrs.frozen(kw_only=True, slots=False)
class OpenLine(Line):
    """Written when a capture opens, before the backend is touched: who records, the
    steps it opens at, ``start``. A capture that never closes is still known by it."""

    EVENT = "open"
    capture: str = attrs.field(metadata=_STR)


@attrs.frozen(kw_only=True, slots=False)
class TraceLine(Line):
    """One file a capture wrote (``path``, ``bytes``, the ``cycle`` and steps it holds), or
    failed to write (``status`` failed, ``error``). Lines written before ``event`` and
    ``capture`` existed are trace lines too."""

    EVENT = "trace"
    status: str = attrs.field(metadata=_one_of(TRACE_STATUSES))


@attrs.frozen(kw_only=True, slots=False)
class CloseLine(Line):
    """Written when a capture ends: how (``status``, ``error``), the steps it covered and
    how many ``traces`` it wrote (its open line says who it was)."""

    EVENT = "close"
    capture: str = attrs.field(metadata=_STR)
    status: str = attrs.field(metadata=_one_of(CLOSE_STATUSES))


@attrs.frozen(kw_only=True, slots=False)
class NoteLine(Line):
    """Something that happened to a role that is no capture: ``note`` names it (a trigger
    request accepted or missed, a slow step, a limit reached)."""

    EVENT = "note"
    note: str = attrs.field(metadata=_STR)


@attrs.frozen(kw_only=True, slots=False)
class SummaryLine(Line):
    """The figures of the trace at ``path`` (as capture ``capture``'s trace line names it),
    or why there are none (``error``); ``kept`` says whether the trace file is still
    there, ``seconds`` how long the summary took."""

    EVENT = "summary"
    capture: str = attrs.field(metadata=_STR)
    path: str | None = attrs.field(metadata=_OPT_STR)
    status: str = attrs.field(metadata=_one_of(SUMMARY_STATUSES))


#: Each kind's class, by its ``event``.
KINDS: dict[str, type[Line]] = {kind.EVENT: kind for kind in (
    OpenLine, TraceLine, CloseLine, NoteLine, SummaryLine)}
EVENTS = tuple(KINDS)
#: Each class's fields, in order: (name, check, what its value must be, required).
_FIELDS: dict[type[Line], tuple[tuple[str, Check, str, bool], ...]] = {
    kind: tuple((f.name, *f.metadata[_CHECK][:2], f.default is attrs.NOTHING)
                for f in attrs.fields(kind) if _CHECK in f.metadata)
    for kind in KINDS.values()}
_KEYS: dict[type[Line], tuple[str, ...]] = {
    kind: tuple(f[0] for f in fields) for kind, fields in _FIELDS.items()}
_NAMES = {kind: frozenset(keys) for kind, keys in _KEYS.items()}
_CHECKS: dict[type[Line], dict[str, _Rule]] = {
    kind: {f.name: f.metadata[_CHECK] for f in attrs.fields(kind) if _CHECK in f.metadata}
    for kind in KINDS.values()}
#: Each class's fields, every one absent (a line's fields before those it carries are set).
_ABSENT_ALL: dict[type[Line], dict[str, Any]] = {
    kind: {f.name: ABSENT for f in attrs.fields(kind) if f.name != "more"}
    for kind in KINDS.values()}
_REQUIRED: dict[type[Line], tuple[str, ...]] = {
    kind: tuple(f[0] for f in fields if f[3]) for kind, fields in _FIELDS.items()}


def required(kind: type[Line]) -> tuple[str, ...]:
    """The fields every line of ``kind`` carries."""
    return _REQUIRED[kind]


def from_json(record: Mapping[str, Any]) -> Line:
    """The line a parsed JSON object holds, checked: it comes from a file anyone could have
    written. ValueError names the first field that is wrong and says why. A line without
    ``event`` (written before it existed) is a trace line."""
    event = record.get("event", "trace")
    kind = KINDS.get(event) if isinstance(event, str) else None
    if kind is None:
        raise ValueError(f"event: unknown kind {clean_value(event)!r} (expected one of "
                         f"{', '.join(EVENTS)})")
    for name in _REQUIRED[kind]:
        if name not in record:
            raise ValueError(f"{name}: missing (every {event} record has one)")
    checks, given, more = _CHECKS[kind], {}, {}
    for key, value in record.items():  # in the line's order: the first wrong one is named
        found = checks.get(key)
        if found is None:
            if key != "event":
                more[key] = value
        elif type(value) in found[2] or _passes(value, found):
            given[key] = value
        else:
            raise ValueError(f"{key}: expected {found[1]}, got {quoted(value)}")
    return _made(kind, given, more)


def _made(kind: type[_L], given: dict[str, Any], more: dict[str, Any]) -> _L:
    """A line of ``kind`` with the fields ``given`` (checked), the others absent: what
    ``kind(**given, more=more)`` makes, without its call per field (a scan of 100,000
    manifests makes half a million lines)."""
    line = object.__new__(kind)
    fields = line.__dict__
    fields.update(_ABSENT_ALL[kind])
    fields.update(given)
    fields["more"] = more
    return line


def fields_of(record: Mapping[str, Any], kind: type[_L], names: tuple[str, ...]) -> _L:
    """The line of ``kind`` an untrusted JSON object holds, with only the fields ``names``
    (and those its kind requires) read and checked, as :func:`from_json` checks them; the
    others left out. For a reader that needs a few fields of a line now and reads it whole
    later, when it needs the rest (``analyze`` keeps of a summary line its trace and
    status, and reads its figures again by its place)."""
    event = kind.EVENT
    if record.get("event", "trace") != event:
        raise ValueError(f"event: not a {event} line")
    checks, given = _CHECKS[kind], {}
    for key in (*_REQUIRED[kind], *names):
        if key not in record:
            if key in _REQUIRED[kind]:
                raise ValueError(f"{key}: missing (every {event} record has one)")
            continue
        value, found = record[key], checks[key]
        if not (type(value) in found[2] or _passes(value, found)):
            raise ValueError(f"{key}: expected {found[1]}, got {quoted(value)}")
        given[key] = value
    return _made(kind, given, {})


# -- untrusted values, in messages --------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_value(value: Any) -> Any:
    """A parsed JSON value made to print and encode: lone surrogates (from ``\\ud800``
    escapes) replaced, numbers too large for a float dropped. Control characters stay
    (:func:`policy_engine.errors.printable` escapes them where text is shown)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_value(k): clean_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_value(v) for v in value]
    return value


def quoted(value: Any) -> str:
    """A value as a message quotes it: JSON, ASCII only, at most 40 characters."""
    try:
        text = json.dumps(clean_value(value), ensure_ascii=True)
    except (ValueError, TypeError, RecursionError):
        text = type(value).__name__
    return printable(text, limit=40)


# -- the builders --------------------------------------------------------------------------

def open_line(base: Mapping[str, Any], *, capture: str, **fields: Any) -> Record:
    """The ``open`` line of capture ``capture``: ``base`` (who records: role, rank,
    backend...) and ``fields`` (steps, start, host...)."""
    return OpenLine.build(base, capture=capture, **fields).to_json()


def trace_line(base: Mapping[str, Any], *, capture: str, status: str,
               **fields: Any) -> Record:
    """A ``trace`` line: one file capture ``capture`` wrote (``path``, ``bytes``), or failed
    to write (``status`` failed, ``error``)."""
    return TraceLine.build(base, capture=capture, status=status, **fields).to_json()


def close_line(*, capture: str, status: str, **fields: Any) -> Record:
    """The ``close`` line of capture ``capture``: how it ended, and how many ``traces`` it
    wrote (the open line said who it was)."""
    return CloseLine.build({}, capture=capture, status=status, **fields).to_json()


def covered_steps(steps: list[int]) -> Record:
    """The ``steps`` of a close or trace line for a capture (or cycle) that covered
    ``steps``: the list, or past :data:`LISTED_STEPS` consecutive steps their first and
    last with ``step_count``, so that the lines of an endless merged capture stay small."""
    if len(steps) <= LISTED_STEPS or steps[-1] - steps[0] + 1 != len(steps):
        return {"steps": list(steps)}
    return {"steps": [steps[0], steps[-1]], "step_count": len(steps)}


def note_line(base: Mapping[str, Any], *, note: str, **fields: Any) -> Record:
    """A ``note`` line: ``note`` names what happened to a role that is no capture (a
    trigger request accepted or missed, a slow step, a limit reached)."""
    return NoteLine.build(base, note=note, **fields).to_json()


def summary_line(base: Mapping[str, Any], *, capture: str, path: str | None, status: str,
                 **fields: Any) -> Record:
    """A ``summary`` line: the figures of the trace at ``path`` (as capture ``capture``'s
    trace line names it), or why there are none (``error``); ``kept`` says whether the
    trace file is still there, ``seconds`` how long the summary took."""
    return SummaryLine.build(base, capture=capture, path=path, status=status,
                             **fields).to_json()
