"""Chrome trace JSON (torch's ``.pt.trace.json[.gz]``), read as a stream.

:class:`TraceReader` is the one reader of ``traceEvents`` (``report`` and ``merge`` use
it): it hands out the events one at a time, holding one chunk of the file and one event,
never the whole trace, and keeps every other top-level key in ``meta``. A trace is
untrusted input, so everything it can make the reader hold or do is bounded: the bytes
read (a small gzip can inflate to gigabytes), the size of one event and of the other
top-level keys, the nesting, and the numbers (NaN, infinities and integers of thousands
of digits are refused, with their position, rather than carried on).

What the reader assumes of the libraries it reads with, each checked when this module is
imported (:func:`scanner_fault`, :func:`orjson_fault`), where a failed check turns the
part that leans on it off rather than letting it misread:

- the stdlib's ``json`` scanner (``JSONDecoder.scan_once``, which ``raw_decode`` calls)
  returns ``(value, end)``, raises ``StopIteration`` with the position where no value
  begins, ``JSONDecodeError`` with ``msg`` and ``pos`` (``Unterminated ...`` for a string
  cut off), ``RecursionError`` for deep nesting, and calls ``parse_constant`` and
  ``parse_float``. Without it (:data:`SCANNER` false) a trace is read whole, within the
  same byte bounds, by ``json.loads`` (a public API): slower, holding the trace in memory,
  its errors said less precisely.
- orjson refuses more than 1,024 levels of nesting and reads 1,024, so a run of events
  wrapped in 960 arrays leaves each event 64 levels; it reads an integer of 19 digits or
  more as a float (such runs go to the stdlib's scanner). Without that (:data:`FAST`
  false) the stdlib's scanner reads every event.
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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict

_CHUNK = 1 << 20
#: The largest single event read (in characters); a larger one makes the trace unreadable.
MAX_VALUE = 8 << 20
#: The most the top-level keys other than ``traceEvents`` may hold together (characters).
MAX_META = 16 << 20
_WS = re.compile(r"[ \t\n\r]*")
_GZIP_MAGIC = b"\x1f\x8b"
_EVENTS = object()  # marks where the traceEvents array begins
_NEAR_END = 10  # a decode error this close to the end of what is read may be data running out


class TraceEvent(TypedDict, total=False):
    """One event of a trace's ``traceEvents``, as :class:`TraceReader` hands it out."""

    # The keys the analysis reads; any may be absent, and every value is untrusted (any
    # JSON value): each is checked where it is used.

    name: Any
    ph: Any  # the phase: "X" a complete event, "M" metadata, "s"/"f" a flow, "i" an instant...
    cat: Any
    ts: Any  # start, µs on the trace's clock
    dur: Any  # µs (complete events)
    pid: Any
    tid: Any
    id: Any  # ties flows, async slices and objects together (with ``ph``)
    bind_id: Any  # the flow a complete event binds
    id2: Any  # an id scoped {"local": ...} or {"global": ...}
    s: Any  # an instant's scope: "g" global, "p" process, "t" thread
    args: Any


#: An entry of ``traceEvents``: any JSON value; the objects are the events.
_Entry = TraceEvent | list[Any] | str | int | float | None


class _BadNumber(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _BadNumber(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if value - value != 0:  # inf - inf is nan
        raise _BadNumber(f"the number {text[:24]} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_float)


def _no_scanner(text: str, pos: int) -> tuple[Any, int]:
    raise TypeError("json.JSONDecoder has no scan_once")


_SCAN: Callable[[str, int], tuple[Any, int]] = getattr(_DECODER, "scan_once", _no_scanner)
_SPACE = " \t\n\r"
#: orjson's nesting limit, which the runs' wrapping is cut to.
_ORJSON_DEPTH = 1024


def scanner_fault() -> str | None:
    """What the stdlib's scanner does otherwise than the reader assumes (the module's
    text), or None when it behaves so."""
    probes: list[tuple[str, str]] = [("", "stop"), ('{"a": ', "stop"), ('"abc', "cut"),
                                     ("[1, 2", "decode"), ("NaN", "number"),
                                     ("[" * 100_000, "deep")]
    try:
        if _SCAN('{"a": [1, 2.5]} ', 0) != ({"a": [1, 2.5]}, 15):
            return "scan_once does not return (value, end)"
        for text, wanted in probes:
            try:
                _SCAN(text, 0)
            except StopIteration as stop:
                if wanted != "stop" or stop.value != len(text):
                    return f"scan_once raised StopIteration({stop.value}) on {text[:8]!r}"
                continue
            except json.JSONDecodeError as err:
                if wanted not in ("cut", "decode") or err.pos > len(text) or (
                        wanted == "cut" and not err.msg.startswith("Unterminated")):
                    return f"scan_once raised {err.msg!r} at {err.pos} on {text[:8]!r}"
                continue
            except _BadNumber:
                if wanted != "number":
                    return f"scan_once refused a number in {text[:8]!r}"
                continue
            except RecursionError:
                if wanted != "deep":
                    return f"scan_once ran out of stack on {text[:8]!r}"
                continue
            return f"scan_once read {text[:8]!r}"
    except Exception as err:  # any other behaviour is a fault to report
        return f"scan_once: {type(err).__name__}: {err}"
    return None


def orjson_fault() -> str | None:
    """What orjson (when installed) does otherwise than the runs assume, or None."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - a dependency; without it the stdlib reads all
        return "orjson is not installed"
    deep = _ORJSON_DEPTH
    try:
        try:
            if _depth(orjson.loads(b"[" * deep + b"]" * deep)) != deep:
                return f"orjson misreads {deep} levels of nesting"
        except orjson.JSONDecodeError:
            return f"orjson refuses {deep} levels of nesting"
        try:
            orjson.loads(b"[" * (deep + 1) + b"]" * (deep + 1))
            return f"orjson reads {deep + 1} levels of nesting"
        except orjson.JSONDecodeError:
            pass
        if not isinstance(orjson.loads(b"1234567890123456789012"), float):
            return "orjson reads an integer of 22 digits as no float"
        if orjson.loads(b'[{"a": 1.5, "b": [2, "x"]}]') != [{"a": 1.5, "b": [2, "x"]}]:
            return "orjson misreads a plain event"
    except Exception as err:  # any other behaviour is a fault to report
        return f"orjson: {type(err).__name__}: {err}"
    return None


def _depth(value: Any) -> int:
    """How deep lists that each hold one list (the innermost empty) go; -1: other."""
    depth = 0
    while isinstance(value, list):
        depth += 1
        if not value:
            return depth
        if len(value) != 1:
            return -1
        value = value[0]
    return -1


#: The stdlib's scanner behaves as the tokenizer assumes; else traces are read whole.
SCANNER = scanner_fault() is None
#: orjson reads runs of events (False: the stdlib's scanner, one by one).
FAST = SCANNER and orjson_fault() is None
if FAST:
    import orjson
# A run: at most _RUN characters (held as ~6 times as much in objects) up to a '},' before a
# '{' (_CUT), in _WRAP arrays that leave an event 64 of orjson's 1024 levels (the stdlib's
# scanner reads deeper ones), with no integer of 19 digits or more (orjson: a float).
_RUN, _WRAP = 1 << 20, _ORJSON_DEPTH - 64
_DIGITS, _LONG = bytes.maketrans(b"123456789", b"000000000"), b"0" * 19
_CUT, _NEXT = re.compile(r"\},[ \t\n\r]*\{"), re.compile(r"[ \t\n\r]*,?[ \t\n\r]*")


class TraceError(Exception):
    """A trace that cannot be read: the message says what is wrong, and where."""


class TraceTooLarge(TraceError):
    """More than the reader's ``max_bytes`` of (uncompressed) text."""
    def __init__(self, limit: int, gzipped: bool) -> None:
        super().__init__(f"{'it inflates to' if gzipped else 'it is'} more than "
                         f"{_bytes(limit)} of text (the most read of one trace)")
        self.limit, self.gzipped = limit, gzipped


class TooManyEvents(TraceError):
    """More than the reader's ``max_events`` entries in ``traceEvents``."""
    def __init__(self, limit: int) -> None:
        super().__init__(f"it holds more than {limit:,} events (the most read of one trace)")
        self.limit = limit


class GzipBomb(TraceError):
    """A gzip that inflates out of all proportion to its size (``max_ratio``)."""
    def __init__(self, ratio: int) -> None:
        super().__init__(f"it inflates to more than {ratio} times its size on disk "
                         "(a gzip bomb?)")
        self.ratio = ratio


RATIO_FLOOR = 1 << 20  #: inflated text below which the ratio is not checked
_RAW_READ = 8 << 10  # compressed bytes read at a time: the ratio is known this finely


class _Counted(io.RawIOBase):
    """The compressed file as gzip reads it, a block at a time, counting the bytes."""
    def __init__(self, raw: io.BufferedReader) -> None:
        self.raw, self.consumed = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(min(len(buffer), _RAW_READ))
        buffer[:len(data)] = data
        self.consumed += len(data)
        return len(data)


def declared_size(path: str) -> int | None:
    """The size a gzip file says it inflates to (its last four bytes: exact for a file of
    one member under 4 GiB), or None for a file that is not gzip or whose trailer cannot
    be true. Read before inflating, so that a gzip bomb is refused at once; one that lies
    is still stopped by the reader's ``max_ratio``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # the reader says why
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size < 18 or \
                os.pread(fd, 2, 0) != _GZIP_MAGIC:
            return None
        declared = int.from_bytes(os.pread(fd, 4, info.st_size - 4), "little")
    except OSError:
        return None
    finally:
        os.close(fd)
    # deflate inflates at most ~1032 times: more is the trailer of a cut or damaged file
    return declared if declared <= 1032 * info.st_size else None


def _bytes(n: int) -> str:
    return f"{n} B" if n < 1 << 20 else f"{n / (1 << 20):.0f} MiB"


class TraceReader:
    """The top-level keys and the events of one Chrome trace file, read as a stream.

    The file may be gzipped (recognised by its first bytes, whatever its name). Call
    ``header()`` for the keys before ``traceEvents`` (torch writes ``baseTimeNanoseconds``
    there), then iterate ``events()``; afterwards ``meta`` holds every top-level key but
    ``traceEvents``. A trace that is only an array of events is accepted too. Raises
    TraceError for anything that is not a whole trace, TraceTooLarge past ``max_bytes`` of
    text (after inflating), GzipBomb when the text grows past ``max_ratio`` times the
    compressed bytes read (torch traces inflate 10 to 20 times), TooManyEvents past
    ``max_events`` entries of ``traceEvents``. Only a regular file is read, not a link."""

    def __init__(self, path: str, *, max_bytes: int | None = None,
                 max_ratio: int | None = None, max_events: int | None = None) -> None:
        self.meta: dict[str, Any] = {}
        self.max_events = max_events
        self.count = self.not_objects = 0  # entries of traceEvents read; not objects (left out)
        self._buf, self._pos = "", 0
        self._offset = self._read = 0  # characters dropped before _buf; bytes of text read
        self._eof = self._saw_events = False
        self._max_bytes, self._max_ratio, self._meta_left = max_bytes, max_ratio, MAX_META
        self._slow = 0  # where a run may begin again: the stdlib's scanner reads up to there
        self._mark: tuple[int, int] | None = None  # in a run: entries read, and their end
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        try:  # never blocking on a FIFO planted under the name
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise TraceError(f"cannot open it: {err.strerror or err}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise TraceError("not a regular file")
        self._file = os.fdopen(fd, "rb")
        try:
            self.gzipped = self._file.read(2) == _GZIP_MAGIC
            self._file.seek(0)
        except BaseException:
            self._file.close()
            raise
        self._counted = _Counted(self._file)
        self._stream: io.BufferedIOBase = gzip.GzipFile(
            fileobj=self._counted, mode="rb") if self.gzipped else self._file
        self._walk = self._document() if SCANNER else self._whole()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stream.close()
        self._file.close()

    @property
    def bytes_read(self) -> int:
        """Bytes of text read so far (after inflating)."""
        return self._read

    @property
    def position(self) -> int:
        """The character the reader has reached."""
        while SCANNER and self._mark and self._mark[0] < self.count:  # in a run
            pos = _NEXT.match(self._buf, self._mark[1]).end()  # type: ignore[union-attr]
            self._mark = self._mark[0] + 1, _SCAN(self._buf, pos)[1]
        return self._offset + (self._mark[1] if self._mark else self._pos)

    def header(self) -> dict[str, Any]:
        """The top-level keys that come before ``traceEvents``."""
        for item in self._walk:
            if item is _EVENTS:
                break
        return dict(self.meta)

    def events(self) -> Iterator[TraceEvent]:
        """Every object of ``traceEvents``, in order."""
        for item in self._walk:
            if item is not _EVENTS:
                yield item

    def _entries(self, items: Iterable[_Entry]) -> Iterator[TraceEvent]:
        """Entries of traceEvents, counted (past ``max_events``: TooManyEvents); those
        that are no object are counted in ``not_objects`` and left out."""
        for item in items:
            self.count += 1
            if self.max_events is not None and self.count > self.max_events:
                raise TooManyEvents(self.max_events)
            if isinstance(item, dict):
                yield item
            else:
                self.not_objects += 1

    # -- without the tokenizer ---------------------------------------------------------

    def _whole(self) -> Iterator[Any]:
        """The trace read whole (within the same byte bounds) by ``json.loads``, where the
        stdlib's scanner does not behave as the tokenizer assumes (:data:`SCANNER`)."""
        while not self._eof:
            self._more(_CHUNK)
        text, self._pos = self._buf, len(self._buf)
        if not text.strip():
            raise TraceError("not a Chrome trace: it is empty")
        try:
            doc = json.loads(text, parse_constant=_constant, parse_float=_float)
        except json.JSONDecodeError as err:
            if err.pos >= len(text.rstrip()) - _NEAR_END:
                raise TraceError("truncated: the file ends inside the trace") from None
            raise TraceError(f"not valid JSON: {err.msg}, at character {err.pos}") from None
        except RecursionError:
            raise TraceError("the trace is nested too deeply") from None
        except ValueError as err:  # a number: NaN, 1e400, thousands of digits
            why = "a number has too many digits" if "digits" in str(err) else str(err)
            raise TraceError(f"{why} in the trace") from None
        self._buf = ""
        after: dict[str, Any] = {}  # the top-level keys after traceEvents
        if isinstance(doc, dict):
            keys = list(doc)  # in the document's order
            events = doc.pop("traceEvents", None)
            if events is None:
                raise TraceError("not a Chrome trace: it has no traceEvents array")
            if not isinstance(events, list):
                raise TraceError("not valid JSON: traceEvents must be an array")
            if len(json.dumps(doc)) > MAX_META:
                raise TraceError("the top-level keys but traceEvents are larger than "
                                 f"{_bytes(MAX_META)} together")
            cut = keys.index("traceEvents")
            self.meta.update((key, doc[key]) for key in keys[:cut])
            after.update((key, doc[key]) for key in keys[cut + 1:])
        elif isinstance(doc, list):
            events = doc
        else:
            raise TraceError("not a Chrome trace: it is no JSON object or array")
        self._saw_events = True
        yield _EVENTS
        yield from self._entries(events)
        self.meta.update(after)

    # -- the tokenizer -----------------------------------------------------------------

    def _document(self) -> Iterator[Any]:
        first = self._peek()
        if first == "[":
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
            key = self._value("a top-level key", self._meta_left)
            self._meta_left -= len(key)
            if self._peek() != ":":
                raise self._unexpected(f"':' after {key!r}", "the trace object")
            self._pos += 1
            if key == "traceEvents":
                if self._peek() != "[":
                    raise self._unexpected("'[': traceEvents must be an array", "traceEvents")
                yield from self._array()
            else:
                self._peek()
                start = self._offset + self._pos
                self.meta[key] = self._value(f"the top-level key {key!r}", self._meta_left,
                                             "the top-level keys but traceEvents are "
                                             f"larger than {_bytes(MAX_META)} together")
                self._meta_left -= self._offset + self._pos - start
            found = self._peek()
            if found == "}":
                self._pos += 1
                return
            if found != ",":
                raise self._unexpected("',' or '}'", "the trace object")
            self._pos += 1

    def _array(self) -> Iterator[Any]:
        self._pos += 1  # past the '['
        self._saw_events = True
        yield _EVENTS
        while True:
            found = self._peek()
            if found == "]":  # the end (a trailing comma is forgiven, as viewers do)
                self._pos += 1
                return
            if not found:
                raise self._unexpected("an event", "traceEvents")
            run = self._run() if FAST and self._offset + self._pos >= self._slow else None
            yield from self._entries(run or (self._value(None, MAX_VALUE),))
            self._mark = None
            buf, pos = self._buf, self._pos
            if pos < len(buf) and buf[pos] == ",":  # the usual case, without a regex
                self._pos = pos + 1
                continue
            found = self._peek()
            if found == ",":
                self._pos += 1
            elif found != "]":
                raise self._unexpected("',' or ']'", "traceEvents")

    def _run(self) -> list[Any]:
        """The entries up to the last ``},{`` within _RUN, read by orjson ([]: it may differ)."""
        buf, pos = self._buf, self._pos
        cut = buf.rfind("},", pos, pos + min(_RUN, MAX_VALUE))
        while cut >= pos and not _CUT.match(buf, cut):
            cut = buf.rfind("},", pos, cut)
        self._slow = self._offset + (cut + 1 if cut >= pos else len(buf))
        text = buf[pos:cut + 1].encode()
        if cut < pos or _LONG in text.translate(_DIGITS):
            return []
        try:
            run = orjson.loads(b"[" * _WRAP + text + b"]" * _WRAP)
        except orjson.JSONDecodeError:  # NaN, 1e400, "\ud800", too deep, '},{' in a string...
            return []
        for _ in range(_WRAP - 1):
            run = run[0]
        self._mark, self._pos = (self.count, pos), cut + 1
        return run  # type: ignore[no-any-return]

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
        buf, pos = self._buf, self._pos
        if pos < len(buf) and buf[pos] not in _SPACE:
            return buf[pos]
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if self._eof:
                return ""
            self._more(_CHUNK)

    def _value(self, what: str | None, limit: int, too_large: str = "") -> Any:
        """The JSON value at the current position (after ``_peek``), of at most ``limit``
        characters. ``what`` it is, for errors (None: the next event)."""
        while True:
            try:  # the decoder's own step, without raw_decode's wrapping
                value, end = _SCAN(self._buf, self._pos)
            except (StopIteration, ValueError, RecursionError) as caught:  # _BadNumber too
                what = what or f"event {self.count + 1} of traceEvents"
                err = json.JSONDecodeError("Expecting value", self._buf, caught.value) \
                    if isinstance(caught, StopIteration) else caught
                if isinstance(err, RecursionError):
                    raise TraceError(f"{what} is nested too deeply, at {self._where()}") from None
                if not isinstance(err, json.JSONDecodeError):  # a number (thousands of digits)
                    why = "a number has too many digits" if "digits" in str(err) else str(err)
                    raise TraceError(f"{why} in {what}, at or after {self._where()}") from None
                rest = self._buf[err.pos:].rstrip()
                if self._eof and (err.msg.startswith("Unterminated") or (
                        len(rest) < _NEAR_END and not any(c in rest for c in '{}[],:"'))):
                    raise TraceError(f"truncated: the file ends inside {what}") from None
                if self._eof or not (err.msg.startswith("Unterminated")
                                     or err.pos >= len(self._buf) - _NEAR_END):
                    raise TraceError(f"not valid JSON: {err.msg} in {what}, at character "
                                     f"{self._offset + err.pos}") from None
                if len(self._buf) - self._pos > limit:
                    raise TraceError((too_large or f"{what} is larger than {_bytes(limit)}")
                                     + f" (at {self._where()})") from None
                self._more(max(_CHUNK, len(self._buf) - self._pos))  # grows geometrically
                continue
            if end < len(self._buf) or self._eof:  # a number may go on in the next chunk
                if end - self._pos > limit:
                    what = what or f"event {self.count + 1} of traceEvents"
                    raise TraceError((too_large or f"{what} is larger than {_bytes(limit)}")
                                     + f" (at {self._where()})")
                self._pos = end
                return value
            self._more(_CHUNK)

    def _more(self, size: int) -> None:
        """Read about ``size`` more bytes, dropping what was consumed."""
        self._offset, self._buf, self._pos = self._offset + self._pos, self._buf[self._pos:], 0
        try:
            data = self._stream.read(size)
        except EOFError:
            raise TraceError("truncated: the gzip data ends early") from None
        except (OSError, zlib.error) as err:
            raise TraceError(f"cannot read it: {err}") from None
        self._read += len(data)
        if self._max_bytes is not None and self._read > self._max_bytes:
            raise TraceTooLarge(self._max_bytes, self.gzipped)
        if (self._max_ratio and self.gzipped and self._read > RATIO_FLOOR
                and self._read > self._max_ratio * self._counted.consumed):
            raise GzipBomb(self._max_ratio)
        try:
            self._buf += self._utf8.decode(data, final=not data)
        except UnicodeDecodeError as err:
            raise TraceError(f"not UTF-8 text: byte {err.object[err.start]:#04x} near "
                             f"character {self._offset + len(self._buf)}") from None
        self._eof = not data
