"""Trigger request files: what ``policy-engine trigger`` writes under
``<output_dir>/triggers/`` and what a listening process reads back.

Anyone who can write into ``output_dir`` can put a file there, so a process reads each one
as hostile. It is looked at without following links (``lstat``, then ``O_NOFOLLOW`` and
``O_NONBLOCK``: a FIFO or a link to ``/dev/zero`` is refused before anything blocks),
must be a regular file of at most :data:`MAX_BYTES`, is checked for nesting depth before
it is parsed, its numbers are bounded (no 5000-digit integers, no ``1e400``, no ``NaN``),
its top level must be an object and every field is type-checked. Whatever is wrong comes
out as :class:`BadRequest`, never as another exception.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import stat
import time
from typing import Any

import attrs

from policy_engine.errors import is_int
from policy_engine.files.layout import TRIGGERS_DIR, host_name
from policy_engine.files.publish import open_temp, write_atomic

__all__ = ["EVERY_ROLE", "MAX_ALSO", "MAX_BYTES", "MAX_COUNT", "MAX_STEP", "MAX_TEXT",
           "REQUESTS_DIR", "REQUEST_SUFFIX", "WHYS", "BadRequest", "Request", "is_request_name",
           "load_bounded", "parse_request", "read_bounded", "read_request", "request_body",
           "write_request"]

#: The folder under an output_dir that holds trigger requests.
REQUESTS_DIR = TRIGGERS_DIR
REQUEST_SUFFIX = ".json"
#: A request is a few fields: anything larger is not one.
MAX_BYTES = 4096
#: Consecutive steps one request may ask for (``--count``), at the command and the reader.
MAX_COUNT = 10_000
#: The largest step number a request may name.
MAX_STEP = 10**12
_MAX_DEPTH = 8  # brackets: a ranks mapping of lists is 3 deep
_MAX_DIGITS = 24  # characters of one JSON number
#: Characters of a request's role, and of a ranks string.
MAX_TEXT = 256
#: Ranks a request may name besides its selector (``also``: the slow rank of a slow step).
MAX_ALSO = 64
#: Why a request was made (the capture's ``trigger``); ``stall`` asks for stall records,
#: not a capture (runtime.triggers.stall_watch), from every role (its ``role`` is ``*``).
WHYS = ("on_demand", "signal", "slow_step", "stall")
#: The role of a request for every role (a stall's).
EVERY_ROLE = "*"
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class BadRequest(ValueError):
    """A file in the requests folder that is not a request. ``final`` False: it may be
    half-written (it does not parse yet), so it is worth reading again later."""

    def __init__(self, message: str, *, final: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.final = final


@attrs.frozen
class Request:
    """A request, checked: ``step`` None is the next step each process starts. ``also``:
    ranks selected besides ``ranks``; ``why``: what asked (``on_demand`` from the command,
    ``signal`` and ``slow_step`` from a process of the job, ``stall`` for stall records);
    ``slow``: the slow step that asked ({rank, step, seconds, median}), with ``ranks`` then
    its reference ranks; ``by``: the rank that asked (a stall's), when a rank did."""

    id: str
    role: str
    ranks: Any  # None, a rank selector string, or its mapping / list form
    step: int | None
    count: int
    also: tuple[int, ...] = ()
    why: str = "on_demand"
    slow: dict[str, Any] | None = None
    by: int | None = None


def is_request_name(name: str) -> bool:
    """Whether a file name in the requests folder is a request (hidden ones are files
    being written)."""
    return name.endswith(REQUEST_SUFFIX) and not name.startswith(".") and \
        len(name) > len(REQUEST_SUFFIX)


# ------------------------------------------------------------------ writing


def request_body(*, role: str, ranks: Any, step: int | None, count: int,
                 **more: Any) -> tuple[dict[str, Any], str]:
    """A new request and its JSON text, as every channel carries it. ``more``: ``also``,
    ``why``, ``slow``. ValueError for values no process would take."""
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"count must be 1 to {MAX_COUNT}, got {count}")
    if step is not None and not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be 0 to {MAX_STEP}, got {step}")
    rid = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(4)}"
    request = {"id": rid, "role": role, "ranks": ranks, "step": step, "count": count,
               "created": time.time(), "host": host_name(), "pid": os.getpid(),
               **{k: v for k, v in more.items() if v not in (None, (), [])}}
    body = json.dumps(request)
    if len(body.encode()) > MAX_BYTES:
        raise ValueError(f"the request would be {len(body.encode())} bytes; processes read "
                         f"at most {MAX_BYTES} (a shorter --role or --ranks)")
    return request, body


def write_request(output_dir: str, *, role: str, ranks: Any, step: int | None,
                  count: int, **more: Any) -> dict[str, Any]:
    """Publish a request under ``output_dir/triggers/`` (created if missing, never through
    a link: :class:`~policy_engine.files.publish.UnsafePathError` when a component is
    one). Written whole under a hidden name, then given its final name, so a process never
    reads half of it. Returns the request; ValueError for values no process would take."""
    request, body = request_body(role=role, ranks=ranks, step=step, count=count, **more)
    rid = request["id"]

    def write(path: str) -> None:
        with open_temp(path, text=True) as f:
            f.write(body)
    write_atomic(output_dir, f"{REQUESTS_DIR}/{rid}", REQUEST_SUFFIX, write)
    return request


# ------------------------------------------------------------------ reading


def read_request(dir_fd: int, name: str) -> Request | None:
    """The request in file ``name`` of the folder ``dir_fd``; None when the file is gone.
    Raises :class:`BadRequest` for anything else that is not a request."""
    data = read_bounded(dir_fd, name)
    return None if data is None else parse_request(name[:-len(REQUEST_SUFFIX)], data)


def read_bounded(dir_fd: int, name: str) -> bytes | None:
    """The bytes of the small file ``name`` in ``dir_fd`` (at most :data:`MAX_BYTES`,
    never through a link, never blocking); None when it is gone; :class:`BadRequest`."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise BadRequest(f"cannot look at it: {err.strerror or err}", final=False) from None
    _check_kind(info)
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise BadRequest("it is a symbolic link (links are not followed)") from None
        raise BadRequest(f"cannot open it: {err.strerror or err}", final=False) from None
    try:
        _check_kind(os.fstat(fd))  # what was opened, not what was looked at
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise BadRequest(f"cannot read it: {err.strerror or err}", final=False) from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        raise BadRequest(f"it is larger than {MAX_BYTES} bytes; a request is a few fields")
    return b"".join(chunks)


def _check_kind(info: os.stat_result) -> None:
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise BadRequest("it is a symbolic link (links are not followed)")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) \
            else "a socket" if stat.S_ISSOCK(mode) else "a device or special file"
        raise BadRequest(f"it is {kind}, not a regular file")
    if info.st_size > MAX_BYTES:
        raise BadRequest(f"it holds {info.st_size} bytes; a request is at most {MAX_BYTES}")


class _NumberError(ValueError):
    pass


def _int(text: str) -> int:
    if len(text) > _MAX_DIGITS:
        raise _NumberError(f"an integer of {len(text)} digits")
    return int(text)


def _float(text: str) -> float:
    value = float(text) if len(text) <= _MAX_DIGITS else math.inf
    if not math.isfinite(value):
        cut = "..." if len(text) > _MAX_DIGITS else ""
        raise _NumberError(f"the number {text[:_MAX_DIGITS]}{cut} is out of range")
    return value


def _constant(text: str) -> Any:
    raise _NumberError(f"{text} is not a JSON number")


def _depth(text: str) -> int:
    """How deep brackets nest in JSON text (strings skipped), without parsing it."""
    depth = deepest = 0
    quoted = escaped = False
    for char in text:
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def load_bounded(data: bytes) -> Any:
    """JSON from untrusted bytes: at most :data:`MAX_BYTES`, brackets at most 8 deep,
    numbers of at most 24 characters (:class:`BadRequest`; ``final`` False when it may
    still be being written)."""
    if len(data) > MAX_BYTES:
        raise BadRequest(f"it is larger than {MAX_BYTES} bytes; a request is a few fields")
    if not data.strip():
        raise BadRequest("it is empty", final=False)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("it is not UTF-8 text", final=False) from None
    if _depth(text) > _MAX_DEPTH:
        raise BadRequest(f"its brackets nest deeper than {_MAX_DEPTH}")
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except _NumberError as err:
        raise BadRequest(str(err)) from None
    except ValueError as err:  # cut short, perhaps: still being written
        raise BadRequest(f"not JSON ({err})", final=False) from None
    return value


def parse_request(rid: str, data: bytes, *, own_id: bool = False) -> Request:
    """A request from a file's bytes, every field checked (:class:`BadRequest`).
    ``own_id``: the request's ``id`` field names it when it is a plain name (a store
    value has no file name), else ``rid`` does."""
    value = load_bounded(data)
    if not isinstance(value, dict):
        raise BadRequest(f"expected a JSON object, got {_kind(value)}")
    named = value.get("id")
    if own_id and isinstance(named, str) and _ID.match(named):
        rid = named
    role = value.get("role")
    if not isinstance(role, str) or not 0 < len(role) <= MAX_TEXT:
        raise BadRequest(f"role: expected a name of 1 to {MAX_TEXT} characters, "
                         f"got {_kind(role)}")
    ranks = value.get("ranks")
    if not _ranks_ok(ranks, 0):
        raise BadRequest("ranks: expected null, a rank selector string of at most "
                         f"{MAX_TEXT} characters, or its mapping or list form")
    step = value.get("step")
    if step is not None and not (is_int(step) and 0 <= step <= MAX_STEP):
        raise BadRequest(f"step: expected null or a step number 0 to {MAX_STEP}, "
                         f"got {_shown(step)}")
    count = value.get("count", 1)
    if not (is_int(count) and 1 <= count <= MAX_COUNT):
        raise BadRequest(f"count: expected 1 to {MAX_COUNT} steps, got {_shown(count)}")
    also = value.get("also") or []
    if not (isinstance(also, list) and len(also) <= MAX_ALSO and
            all(is_int(r) and 0 <= r <= MAX_STEP for r in also)):
        raise BadRequest(f"also: expected a list of at most {MAX_ALSO} rank numbers")
    why = value.get("why", "on_demand")
    if why not in WHYS:
        raise BadRequest(f"why: expected one of {', '.join(WHYS)}, got {_shown(why)}")
    slow = value.get("slow")
    if slow is not None and not (isinstance(slow, dict) and len(slow) <= 8 and all(
            isinstance(k, str) and len(k) <= 32 and (is_int(v) or isinstance(v, float))
            for k, v in slow.items())):
        raise BadRequest("slow: expected an object of a few numbers")
    by = value.get("by")
    if by is not None and not (is_int(by) and 0 <= by <= MAX_STEP):
        raise BadRequest(f"by: expected null or a rank number, got {_shown(by)}")
    return Request(rid, role, ranks, step, count, tuple(also), why, slow, by)



def _ranks_ok(value: object, depth: int) -> bool:
    """A selector's shape (RankSelector.parse checks the rest): strings, ints, and lists
    or string-keyed mappings of them."""
    if value is None:
        return depth == 0
    if isinstance(value, str):
        return len(value) <= MAX_TEXT
    if is_int(value):
        return True
    if depth >= 3:
        return False
    if isinstance(value, list):
        return all(v is not None and _ranks_ok(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and len(k) <= MAX_TEXT and v is not None
                   and _ranks_ok(v, depth + 1) for k, v in value.items())
    return False


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "?")


def _shown(value: object) -> str:
    text = json.dumps(value) if is_int(value) or isinstance(value, (str, float)) else \
        _kind(value)
    return text if len(text) <= 40 else text[:37] + "..."
