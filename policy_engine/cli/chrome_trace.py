"""Chrome trace JSON (torch's ``.pt.trace.json[.gz]``), read as a stream and rewritten.

:class:`TraceReader` hands out the events of ``traceEvents`` one at a time: it holds one
chunk of the file and one event, never the whole trace, and keeps every other top-level
key in ``meta``. :class:`ProcessMap` rewrites the events of one input as one process of
a merged trace.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from typing import Any

_CHUNK = 1 << 20
#: The largest single value (one event, or one other top-level key) read.
MAX_VALUE = 64 << 20
_WS = re.compile(r"[ \t\n\r]*")
_GZIP_MAGIC = b"\x1f\x8b"
# NaN and Infinity are not JSON, though Python reads them: they become null.
_DECODER = json.JSONDecoder(parse_constant=lambda _name: None)
_EVENTS = object()  # marks where the traceEvents array begins
# A decode error this close to the end of what is read may be the data running out.
_NEAR_END = 10


class TraceError(Exception):
    """A trace that cannot be read: the message says what is wrong, and where."""


class TraceReader:
    """The top-level keys and the events of one Chrome trace file, read as a stream.

    The file may be gzipped (recognised by its first bytes, whatever its name). Call
    ``header()`` for the keys before ``traceEvents`` (torch writes ``baseTimeNanoseconds``
    there), then iterate ``events()``; afterwards ``meta`` holds every top-level key but
    ``traceEvents``. A trace that is only an array of events is accepted too. Raises
    TraceError for anything that is not a whole trace.
    """

    def __init__(self, path: str) -> None:
        self.meta: dict[str, Any] = {}
        self.count = 0  # entries of traceEvents read
        self.not_objects = 0  # entries that are not objects (left out)
        self._buf = ""
        self._pos = 0
        self._offset = 0  # characters dropped before _buf
        self._eof = False
        self._saw_events = False
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        try:  # never blocking on a FIFO planted under the name
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise TraceError(f"cannot open it: {err.strerror or err}") from None
        self._file = os.fdopen(fd, "rb")
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TraceError("not a regular file")
            gzipped = self._file.read(2) == _GZIP_MAGIC
            self._file.seek(0)
        except BaseException:
            self._file.close()
            raise
        self._stream: io.BufferedIOBase = self._file
        if gzipped:
            self._stream = gzip.GzipFile(fileobj=self._file, mode="rb")
        self._walk = self._document()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stream.close()
        self._file.close()

    def header(self) -> dict[str, Any]:
        """The top-level keys that come before ``traceEvents``."""
        for item in self._walk:
            if item is _EVENTS:
                break
        return dict(self.meta)

    def events(self) -> Iterator[dict[str, Any]]:
        """Every object of ``traceEvents``, in order."""
        for item in self._walk:
            if item is not _EVENTS:
                yield item

    # -- the tokenizer -----------------------------------------------------------------

    def _document(self) -> Iterator[Any]:
        first = self._peek()
        if first == "[":
            self._pos += 1
            self._saw_events = True
            yield _EVENTS
            yield from self._array()
        elif first == "{":
            self._pos += 1
            yield from self._object()
        else:
            raise TraceError("not a Chrome trace: " + (
                "it is empty" if not first else f"it starts with {first!r}, not '{{' or '['"))
        if self._peek():
            raise TraceError(f"not valid JSON: more data after the trace, at {self._where()}")
        if not self._saw_events:
            raise TraceError("not a Chrome trace: it has no traceEvents array")

    def _object(self) -> Iterator[Any]:
        if self._peek() == "}":
            self._pos += 1
            return
        while True:
            if self._peek() != '"':
                raise self._unexpected("a key in double quotes", "the trace object")
            key = self._value("a top-level key")
            if self._peek() != ":":
                raise self._unexpected(f"':' after {key!r}", "the trace object")
            self._pos += 1
            if key == "traceEvents":
                if self._peek() != "[":
                    raise self._unexpected("'[': traceEvents must be an array", "traceEvents")
                self._pos += 1
                self._saw_events = True
                yield _EVENTS
                yield from self._array()
            else:
                self._peek()
                self.meta[key] = self._value(f"the value of {key!r}")
            found = self._peek()
            if found == "}":
                self._pos += 1
                return
            if found != ",":
                raise self._unexpected("',' or '}'", "the trace object")
            self._pos += 1

    def _array(self) -> Iterator[dict[str, Any]]:
        while True:
            found = self._peek()
            if found == "]":  # the end (a trailing comma is forgiven, as viewers do)
                self._pos += 1
                return
            if not found:
                raise self._unexpected("an event", "traceEvents")
            item = self._value(f"event {self.count + 1} of traceEvents")
            self.count += 1
            if isinstance(item, dict):
                yield item
            else:
                self.not_objects += 1
            found = self._peek()
            if found == ",":
                self._pos += 1
            elif found != "]":
                raise self._unexpected("',' or ']'", "traceEvents")

    def _where(self) -> str:
        return f"character {self._offset + self._pos}"

    def _unexpected(self, wanted: str, inside: str) -> TraceError:
        found = self._peek()
        if not found:
            return TraceError(f"truncated: the file ends inside {inside} "
                              f"(after {self.count} events)")
        return TraceError(f"not valid JSON: expected {wanted} at {self._where()}, "
                          f"found {found!r}")

    def _peek(self) -> str:
        """The next character that is not white space ('' at the end), not consumed."""
        while True:
            match = _WS.match(self._buf, self._pos)
            self._pos = match.end() if match else self._pos
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if self._eof:
                return ""
            self._more(_CHUNK)

    def _value(self, what: str) -> Any:
        """The JSON value at the current position (after ``_peek``)."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as err:
                rest = self._buf[err.pos:].rstrip()
                if self._eof and (err.msg.startswith("Unterminated") or (
                        len(rest) < _NEAR_END and not any(c in rest for c in '{}[],:"'))):
                    raise TraceError(f"truncated: the file ends inside {what}") from None
                if self._eof or not (err.msg.startswith("Unterminated")
                                     or err.pos >= len(self._buf) - _NEAR_END):
                    raise TraceError(f"not valid JSON: {err.msg} in {what}, at character "
                                     f"{self._offset + err.pos}") from None
                if len(self._buf) - self._pos > MAX_VALUE:
                    raise TraceError(f"{what} is larger than {MAX_VALUE >> 20} MiB "
                                     f"(at {self._where()})") from None
                self._more(max(_CHUNK, len(self._buf) - self._pos))  # grows geometrically
                continue
            except RecursionError:
                raise TraceError(f"{what} is nested too deeply") from None
            if end < len(self._buf) or self._eof:  # a number may go on in the next chunk
                self._pos = end
                return value
            self._more(_CHUNK)

    def _more(self, size: int) -> None:
        """Read about ``size`` more bytes, dropping what was consumed."""
        if self._pos:
            self._offset += self._pos
            self._buf = self._buf[self._pos:]
            self._pos = 0
        try:
            data = self._stream.read(size)
        except EOFError:
            raise TraceError("truncated: the gzip data ends early") from None
        except (OSError, zlib.error) as err:
            raise TraceError(f"cannot read it: {err}") from None
        try:
            self._buf += self._utf8.decode(data, final=not data)
        except UnicodeDecodeError as err:
            raise TraceError(f"not UTF-8 text: byte {err.object[err.start]:#04x} near "
                             f"character {self._offset + len(self._buf)}") from None
        self._eof = not data


#: Phases whose ``id`` ties events together (flows, async slices, objects).
_ID_PHASES = frozenset("stfbenSTpFNOD")
_PROCESS_META = {"process_name": "name", "process_labels": "labels",
                 "process_sort_index": "sort_index"}
_THREAD_META = {"thread_name": "name", "thread_sort_index": "sort_index"}


def _key(value: Any) -> Any:
    """A pid or tid as a dictionary key (JSON lets them be anything)."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return json.dumps(value, sort_keys=True)


def _number(value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return float("inf")


def _named(value: Any, kind: str, ident: Any) -> str:
    """A process's or thread's name: its own, else its id (torch uses names as ids)."""
    if isinstance(value, str) and value:
        return value
    if isinstance(ident, str) or ident is None:
        return ident or ""
    return f"{kind} {ident}"


class ProcessMap:
    """The events of one input trace as the one process ``pid`` of a merged trace.

    - each (pid, tid) of the input becomes a thread whose id comes from ``tids``, shared
      by every input, so no two threads of the merged trace share an id (Perfetto names
      threads by tid alone);
    - ``ts`` moves by ``shift`` microseconds;
    - ids that pair events (flows, async slices) move by ``id_base``, so pairs never
      cross inputs; global instants become instants of this process;
    - the input's process and thread names are held back: ``metadata()`` writes them,
      the threads of the main process (``main``, else the first pid seen) under their
      own names, the others after their process's name (``GPU 0 stream 7``).
    """

    def __init__(self, pid: int, *, shift: float, id_base: int, tids: Iterator[int],
                 main: Any = None) -> None:
        self.pid = pid
        self._shift = shift
        self._id_base = id_base
        self._tids = tids
        self._main = main
        self._threads: dict[tuple[Any, Any], int] = {}
        self._procs: dict[Any, dict[str, Any]] = {}
        self._names: dict[int, dict[str, Any]] = {}

    def event(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """``event`` rewritten in place, or None for a name held back."""
        pid = _key(event.get("pid"))
        if self._main is None and pid is not None:
            self._main = pid
        ph = event.get("ph")
        ph = ph if isinstance(ph, str) else None
        if ph == "M":
            name, args = event.get("name"), event.get("args")
            args = args if isinstance(args, dict) else {}
            if isinstance(name, str) and name in _PROCESS_META:
                self._procs.setdefault(pid, {})[name] = args.get(_PROCESS_META[name])
                return None
            if isinstance(name, str) and name in _THREAD_META:
                tid = self._tid(pid, event.get("tid"))
                self._names.setdefault(tid, {})[name] = args.get(_THREAD_META[name])
                return None
        event["pid"] = self.pid
        event["tid"] = self._tid(pid, event.get("tid"))
        ts = event.get("ts")
        if self._shift and isinstance(ts, (int, float)) and not isinstance(ts, bool):
            event["ts"] = ts + self._shift
        if self._id_base:
            if ph in _ID_PHASES and "id" in event:
                event["id"] = self._id(event["id"])
            if "bind_id" in event:
                event["bind_id"] = self._id(event["bind_id"])
            id2 = event.get("id2")
            if isinstance(id2, dict) and "global" in id2:
                id2["global"] = self._id(id2["global"])
        if ph in ("i", "I", "R") and event.get("s") == "g":
            event["s"] = "p"
        return event

    def _tid(self, pid: Any, tid: Any) -> int:
        key = (pid, _key(tid))
        new = self._threads.get(key)
        if new is None:
            new = self._threads[key] = next(self._tids)
        return new

    def _id(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return value + self._id_base
        if isinstance(value, str):
            try:  # Perfetto reads string ids as hexadecimal
                number = int(value, 16)
            except ValueError:
                return f"{value}@{self._id_base:x}"
            return f"0x{number + self._id_base:x}" if number >= 0 else value
        return value

    def metadata(self, name: str, sort_index: int, args: dict[str, Any],
                 labels: str = "") -> list[dict[str, Any]]:
        """The process's name, labels and place, and a name and place for each thread."""
        pid = self.pid
        out: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name, **args}},
            {"ph": "M", "name": "process_sort_index", "pid": pid,
             "args": {"sort_index": sort_index}}]
        if labels:
            out.append({"ph": "M", "name": "process_labels", "pid": pid,
                        "args": {"labels": labels}})
        seen = {p: n for n, p in enumerate(dict.fromkeys(p for p, _ in self._threads))}

        def place(item: tuple[tuple[Any, Any], int]) -> tuple[Any, ...]:
            (opid, _otid), tid = item
            proc = self._procs.get(opid, {})
            return (opid != self._main, _number(proc.get("process_sort_index")), seen[opid],
                    _number(self._names.get(tid, {}).get("thread_sort_index")), tid)

        for index, ((opid, otid), tid) in enumerate(sorted(self._threads.items(), key=place)):
            thread = _named(self._names.get(tid, {}).get("thread_name"), "thread", otid)
            if opid != self._main:
                process = _named(self._procs.get(opid, {}).get("process_name"), "process", opid)
                thread = f"{process} {thread}".strip()
            thread = thread or "untitled"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": thread}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": index}})
        return out
