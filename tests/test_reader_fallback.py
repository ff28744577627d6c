"""The trace reader's fence: what it assumes of the stdlib's JSON scanner and of orjson is
checked when chrome_trace is imported, and where a check fails the reader falls back (to
``json.loads`` of the whole text, or to the stdlib's scanner alone) instead of misreading."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from analysis_traces import write_trace

from policy_engine.analysis import chrome_trace
from policy_engine.analysis.chrome_trace import TraceError, TraceReader
from policy_engine.analysis.summary import summarize

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def whole() -> Iterator[None]:
    """The reader as it is where the scanner's checks fail: every trace read whole."""
    before = chrome_trace.SCANNER
    chrome_trace.SCANNER = False
    try:
        yield
    finally:
        chrome_trace.SCANNER = before


def read(path: Path, **limits: Any) -> tuple[Any, ...]:
    """The header, events, meta, count and entries not objects of ``path``, or the error."""
    try:
        with TraceReader(str(path), **limits) as reader:
            head = reader.header()
            events = list(reader.events())
            return head, events, reader.meta, reader.count, reader.not_objects
    except TraceError as err:
        return ("error", type(err).__name__, str(err))


def test_the_checks_hold_for_the_libraries_installed() -> None:
    assert chrome_trace.scanner_fault() is None
    assert chrome_trace.orjson_fault() is None
    assert chrome_trace.SCANNER and chrome_trace.FAST


def test_a_scanner_that_behaves_otherwise_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = chrome_trace._SCAN

    def no_stop(text: str, pos: int) -> tuple[Any, int]:  # no StopIteration at the end
        if pos >= len(text.rstrip()):
            raise json.JSONDecodeError("Expecting value", text, pos)
        return real(text, pos)  # type: ignore[no-any-return]

    monkeypatch.setattr(chrome_trace, "_SCAN", no_stop)
    assert chrome_trace.scanner_fault() == "scan_once raised 'Expecting value' at 0 on ''"

    def other_end(text: str, pos: int) -> tuple[Any, int]:
        value, end = real(text, pos)
        return value, end + 1

    monkeypatch.setattr(chrome_trace, "_SCAN", other_end)
    assert chrome_trace.scanner_fault() == "scan_once does not return (value, end)"
    monkeypatch.setattr(chrome_trace, "_SCAN", chrome_trace._no_scanner)
    assert chrome_trace.scanner_fault() == \
        "scan_once: TypeError: json.JSONDecoder has no scan_once"


def test_an_orjson_without_its_nesting_limit_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that read any depth would let a wrapped run read events deeper than the
    stdlib's scanner allows: the runs are turned off."""
    import orjson

    class Unlimited:
        JSONDecodeError = orjson.JSONDecodeError

        @staticmethod
        def loads(data: bytes) -> Any:
            return json.loads(data)

    monkeypatch.setitem(sys.modules, "orjson", Unlimited)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        assert chrome_trace.orjson_fault() == "orjson reads 1025 levels of nesting"
    finally:
        sys.setrecursionlimit(limit)
    # and one that fails in a way nobody foresaw is a fault too, not an error at import
    monkeypatch.setattr(Unlimited, "loads", staticmethod(lambda data: 1 / 0))
    assert chrome_trace.orjson_fault() == "orjson: ZeroDivisionError: division by zero"


@pytest.mark.parametrize("gz", [False, True])
def test_read_whole_a_trace_gives_what_the_tokenizer_gives(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / ("t.pt.trace.json" + (".gz" if gz else ""))
    write_trace(str(path), 0, 2, steps=3, ops=30, gpu=True)
    normal = read(path)
    assert normal[0] != "error" and normal[3] > 100
    with whole():
        assert read(path) == normal
        assert summarize(str(path)) == summarize_normally(path)


def summarize_normally(path: Path) -> dict[str, Any]:
    before = chrome_trace.SCANNER
    chrome_trace.SCANNER = True
    try:
        return summarize(str(path))
    finally:
        chrome_trace.SCANNER = before


def test_an_array_of_events_and_entries_not_objects(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('[{"ph": "X", "ts": 1}, 3, {"ph": "i", "ts": 2}]')
    with whole():
        head, events, meta, count, not_objects = read(path)
    assert (head, meta, count, not_objects) == ({}, {}, 3, 1)
    assert events == [{"ph": "X", "ts": 1}, {"ph": "i", "ts": 2}]


@pytest.mark.parametrize(("text", "said"), [
    ("", "not a Chrome trace: it is empty"),
    ('{"traceEvents": [{"ts": 1}, {"ts"', "truncated: the file ends inside the trace"),
    ('{"traceEvents": [{"ts": 1}} , {"ts": 2}]}',
     "not valid JSON: Expecting ',' delimiter, at character 26"),
    ('{"traceEvents": [{"ts": NaN}]}', "NaN is not a JSON number in the trace"),
    ('{"traceEvents": [{"ts": 1e400}]}', "the number 1e400 is out of range in the trace"),
    ('{"traceEvents": [{"ts": ' + "7" * 5000 + "}]}",
     "a number has too many digits in the trace"),
    ('{"traceEvents": ' + "[" * 50_000 + "]" * 50_000 + "}",
     "the trace is nested too deeply"),
    ('{"schemaVersion": 1}', "not a Chrome trace: it has no traceEvents array"),
    ('{"traceEvents": {"ts": 1}}', "not valid JSON: traceEvents must be an array"),
    ("42", "not a Chrome trace: it is no JSON object or array"),
])
def test_read_whole_a_bad_trace_says_what_is_wrong(tmp_path: Path, text: str,
                                                  said: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(text)
    with whole():
        assert read(path) == ("error", "TraceError", said)


def test_read_whole_the_bounds_hold(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    events = ", ".join(f'{{"ph": "X", "ts": {i}, "dur": 1}}' for i in range(1000))
    with gzip.open(path, "wt") as f:
        f.write('{"traceEvents": [' + events + "]}")
    with whole():
        assert read(path, max_events=10) == (
            "error", "TooManyEvents", "it holds more than 10 events (the most read of one "
            "trace)")
        assert read(path, max_bytes=1000)[:2] == ("error", "TraceTooLarge")
        assert read(path)[3] == 1000
    big = tmp_path / "meta.json"
    big.write_text('{"traceEvents": [], "deviceProperties": "' + "x" * (17 << 20) + '"}')
    with whole():
        assert read(big) == ("error", "TraceError", "the top-level keys but traceEvents are "
                             "larger than 16 MiB together")


_CHANGED = """
import json, json.scanner, sys
real = json.scanner.make_scanner
def make(context):
    scan = real(context)
    def changed(text, pos):  # a release that says 'no value' otherwise
        try:
            return scan(text, pos)
        except StopIteration as stop:
            raise json.JSONDecodeError("Expecting value", text, stop.value) from None
    return changed
json.scanner.make_scanner = make
from policy_engine.analysis import chrome_trace as c
print(c.scanner_fault())
assert not c.SCANNER and not c.FAST
with c.TraceReader(sys.argv[1]) as r:
    n = sum(1 for _ in r.events())
print(n, r.count, sorted(r.meta))
"""


def test_a_python_whose_scanner_changed_reads_traces_whole(tmp_path: Path) -> None:
    """Across a real import: the check fails, the reader still reads every event."""
    path = tmp_path / "t.pt.trace.json.gz"
    write_trace(str(path), 0, 2, steps=2, ops=20, gpu=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _CHANGED, str(path)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    fault, counts = done.stdout.splitlines()
    assert fault == "scan_once raised 'Expecting value' at 0 on ''"
    with TraceReader(str(path)) as reader:
        n = sum(1 for _ in reader.events())
        assert counts == f"{n} {reader.count} {sorted(reader.meta)}"
