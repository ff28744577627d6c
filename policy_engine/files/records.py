"""Manifest records: what each line of a per-process manifest holds, declared once, and the
one place such a line is built.

Five kinds of line (the ``event`` key): ``open`` when a capture opens, ``trace`` per file
a capture wrote (or failed to write), ``close`` when it ends, ``note`` for what happened
to a role that is no capture, and ``summary`` per torch trace, the figures its rank
computed from it after the capture (``runtime.summaries``). :data:`FIELDS` says what each
field must be where present, :data:`REQUIRED` what each kind must have; the reader
(:func:`policy_engine.analysis.manifests.parse_line`) checks lines against them, and the
builders below (:func:`open_line`, :func:`trace_line`, :func:`close_line`,
:func:`note_line`, :func:`summary_line`) take the required fields as arguments (a test
keeps the two equal), so a line cannot be built without them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

EVENTS = ("open", "trace", "close", "note", "summary")
#: Keys of a trace line's ``extra`` that name a file written beside the trace (relative
#: to the output folder, as ``path`` is).
COMPANIONS = ("plot", "memory_timeline")
TRACE_STATUSES = ("complete", "partial", "failed", "oom")
CLOSE_STATUSES = ("complete", "partial", "failed", "interrupted")
#: complete: ``summary`` holds the figures; failed: ``error`` says why there are none;
#: cut: the process ended while the summary was being made.
SUMMARY_STATUSES = ("complete", "failed", "cut")

Record = dict[str, Any]
#: Steps a close line lists, at most. A capture that covered more (merged steps, which
#: follow each other, go on as long as the run when the steps do) gives its first and
#: last step in ``steps`` and how many it covered in ``step_count``.
LISTED_STEPS = 64


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
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
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
    "step_count": (lambda v: _is_int(v) and v >= 0, "a count"),
    "joined": (_list_of(_is_label), "a list of integers or strings"),
    "start": (_is_number, "a number"),
    "end": (_is_number, "a number"),
    "error": (_opt(_is_str), "a string or null"),
    "traces": (lambda v: _is_int(v) and v >= 0, "a count"),
    "thread_waits": (lambda v: _is_int(v) and v >= 0, "a count"),
    "stopped_by": (_opt(_is_str), "a string or null"),
    # What older versions called thread_waits: read, never written, never a missing trace.
    "deferred": (lambda v: _is_int(v) and v >= 0, "a count"),
    "coords": (_opt(lambda v: isinstance(v, dict)), "an object or null"),
    "extra": (_opt(lambda v: isinstance(v, dict)), "an object or null"),
    "trigger": (_is_str, "a string"),
    "request": (_opt(_is_str), "a string or null"),
    "note": (_is_str, "a string"),
    "summary": (_opt(lambda v: isinstance(v, dict)), "an object or null"),
    "kept": (lambda v: isinstance(v, bool), "true or false"),
    "seconds": (lambda v: _is_number(v) and v >= 0, "a number of seconds"),
    "trimmed": (_opt(_is_str), "a string or null"),
}
REQUIRED = {"open": ("capture",), "trace": ("status",), "close": ("capture", "status"),
            "note": ("note",), "summary": ("capture", "path", "status")}
STATUSES = {"open": None, "trace": TRACE_STATUSES, "close": CLOSE_STATUSES, "note": None,
            "summary": SUMMARY_STATUSES}


def _line(event: str, base: Mapping[str, Any], fields: Mapping[str, Any]) -> Record:
    # The kind last: a base taken from another line never changes what this one is.
    return {**base, **fields, "event": event}


def open_line(base: Mapping[str, Any], *, capture: str, **fields: Any) -> Record:
    """The ``open`` line of capture ``capture``: ``base`` (who records: role, rank,
    backend...) and ``fields`` (steps, start, host...)."""
    return _line("open", base, {"capture": capture, **fields})


def trace_line(base: Mapping[str, Any], *, capture: str, status: str,
               **fields: Any) -> Record:
    """A ``trace`` line: one file capture ``capture`` wrote (``path``, ``bytes``), or failed
    to write (``status`` failed, ``error``)."""
    return _line("trace", base, {"capture": capture, "status": status, **fields})


def close_line(*, capture: str, status: str, **fields: Any) -> Record:
    """The ``close`` line of capture ``capture``: how it ended, and how many ``traces`` it
    wrote (the open line said who it was)."""
    return _line("close", {}, {"capture": capture, "status": status, **fields})


def covered_steps(steps: list[int]) -> Record:
    """The close line's ``steps`` for a capture that covered ``steps``: the list, or past
    :data:`LISTED_STEPS` consecutive steps their first and last with ``step_count``, so
    that the line of an endless merged capture stays small."""
    if len(steps) <= LISTED_STEPS or steps[-1] - steps[0] + 1 != len(steps):
        return {"steps": list(steps)}
    return {"steps": [steps[0], steps[-1]], "step_count": len(steps)}


def note_line(base: Mapping[str, Any], *, note: str, **fields: Any) -> Record:
    """A ``note`` line: ``note`` names what happened to a role that is no capture (a
    trigger request accepted or missed, a slow step, a limit reached)."""
    return _line("note", base, {"note": note, **fields})


def summary_line(base: Mapping[str, Any], *, capture: str, path: str | None, status: str,
                 **fields: Any) -> Record:
    """A ``summary`` line: the figures of the trace at ``path`` (as capture ``capture``'s
    trace line names it), or why there are none (``error``); ``kept`` says whether the
    trace file is still there, ``seconds`` how long the summary took."""
    return _line("summary", base, {"capture": capture, "path": path, "status": status,
                                   **fields})
