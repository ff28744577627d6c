"""The trace reader's two ways of reading events give the same: runs of whole events parsed
at once by orjson, and the stdlib's scanner one event at a time (``chrome_trace.FAST``).

Same events (compared by ``repr``: 1 and 1.0, 0.0 and -0.0 differ), ``meta``, counts, bytes
read, the position at each event and the error, message included, whatever the file: torch-
shaped traces, gzipped or not, text that looks like event boundaries inside strings, numbers
and strings orjson reads otherwise than the stdlib (or refuses), deep nesting, truncation,
every chunk boundary, white space anywhere JSON allows it.
"""

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
from analysis_traces import make_run, trace_events, write_trace
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.analysis import chrome_trace
from policy_engine.analysis.chrome_trace import TraceError, TraceReader

pytestmark = pytest.mark.skipif(not chrome_trace.FAST, reason="no orjson 3.9.15 or later")

EVENT = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.5,
         "dur": 2, "args": {"External id": 3, "Input Dims": [[2, 3], []]}}


@contextlib.contextmanager
def patched(**values: Any) -> Iterator[None]:
    """chrome_trace's module settings changed for a while (hypothesis tests cannot take
    pytest's function-scoped monkeypatch)."""
    before = {name: getattr(chrome_trace, name) for name in values}
    for name, value in values.items():
        setattr(chrome_trace, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(chrome_trace, name, value)


def outcome(path: Path | str, fast: bool, *, positions: bool = True, header: bool = True,
            **limits: Any) -> tuple[Any, ...]:
    """Everything the reader hands out or says about ``path``, read one way: the header,
    events, the position at each, meta, count, entries not objects, bytes read, the final
    position and the error (type and message)."""
    events: list[Any] = []
    where: list[int] = []
    head = error = None
    with patched(FAST=fast):
        try:
            reader = TraceReader(str(path), **limits)
        except TraceError as err:
            return ("open", type(err).__name__, str(err))
        with reader:
            try:
                if header:
                    head = reader.header()
                for event in reader.events():
                    events.append(event)
                    if positions:
                        where.append(reader.position)
            except TraceError as err:
                error = (type(err).__name__, str(err))
            return (head, events, where, reader.meta, reader.count, reader.not_objects,
                    reader.bytes_read, reader.position, error)


class Runs:
    """How many entries the fast path took in runs (to show it is not bypassed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[int] = []
        take = chrome_trace.TraceReader._run

        def spy(reader: TraceReader) -> list[Any]:
            run = take(reader)
            self.runs.append(len(run))
            return run

        monkeypatch.setattr(chrome_trace.TraceReader, "_run", spy)

    @property
    def entries(self) -> int:
        return sum(self.runs)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Runs:
    return Runs(monkeypatch)


def same(path: Path | str, **kw: Any) -> tuple[Any, ...]:
    """Both ways agree on ``path`` (by ``repr``: types and signs count); what they say."""
    fast = outcome(path, True, **kw)
    assert repr(fast) == repr(outcome(path, False, **kw))
    return fast


def trace_text(events: list[Any], *, head: dict[str, Any] | None = None,
               separators: tuple[str, str] = (", ", ": "),
               indent: int | str | None = None) -> str:
    return json.dumps({**(head or {"schemaVersion": 1}), "traceEvents": events},
                      separators=separators, indent=indent)


def write(path: Path, text: str | bytes) -> Path:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


# -- torch-shaped traces -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["t.pt.trace.json", "t.pt.trace.json.gz"])
@pytest.mark.parametrize("gpu", [True, False])
def test_gpu_and_cpu_traces_read_the_same_and_mostly_in_runs(
        tmp_path: Path, runs: Runs, name: str, gpu: bool) -> None:
    path = tmp_path / name
    write_trace(str(path), 1, 4, steps=3, ops=400, gpu=gpu, slow=1, extra_us=2000.0)
    said = same(path)
    assert said[1] == trace_events(1, 4, steps=3, ops=400, gpu=gpu, slow=1, extra_us=2000.0)
    assert said[3]["baseTimeNanoseconds"] == 1790000000000000000 and said[-1] is None
    runs.runs.clear()
    same(path, positions=False)  # the position not asked for while reading
    assert runs.entries >= 0.9 * len(said[1])  # all but the events at each chunk's end


def test_summaries_and_operators_are_the_same(tmp_path: Path) -> None:
    from policy_engine.analysis.ops import read_ops
    from policy_engine.analysis.summary import summarize

    path = tmp_path / "t.pt.trace.json.gz"
    write_trace(str(path), 1, 4, steps=3, ops=200, gpu=True, slow=1, extra_us=2000.0)
    with patched(FAST=True):
        fast = (summarize(str(path)), read_ops(str(path), top=10, limit=1 << 30))
    with patched(FAST=False):
        assert (summarize(str(path)), read_ops(str(path), top=10, limit=1 << 30)) == fast
    assert "error" not in fast[0] and fast[1].rows


def test_a_run_of_traces_reads_the_same_in_small_chunks(tmp_path: Path) -> None:
    files = [tmp_path / "gz" / rel for rel in make_run(str(tmp_path / "gz"), 2, windows=2,
                                                       ops=30, gpu=True)]
    files += [tmp_path / "plain" / rel for rel in make_run(str(tmp_path / "plain"), 2,
                                                          gz=False, ops=30, gpu=True)]
    for chunk, run in ((1 << 20, 1 << 20), (4096, 4096), (333, 1000), (50, 50)):
        with patched(_CHUNK=chunk, _RUN=run):
            for path in files:
                assert same(path)[-1] is None


def test_position_matches_at_every_event_and_after_a_break(tmp_path: Path, runs: Runs) -> None:
    path = write(tmp_path / "t.json", trace_text([EVENT] * 50, indent=2))
    same(path)
    assert runs.entries > 0

    def stopped(fast: bool) -> tuple[Any, ...]:
        with patched(FAST=fast), TraceReader(str(path)) as reader:
            taken = [e for _, e in zip(range(7), reader.events(), strict=False)]
            at = (reader.count, reader.position)
            rest = list(reader.events())  # a fresh iterator goes on where the last stopped
            return at, taken + rest, reader.position, reader.count

    assert stopped(True) == stopped(False)
    assert stopped(True)[0][0] == 7 and len(stopped(True)[1]) == 50


# -- text orjson might split, read or refuse otherwise ---------------------------------------

TRICKY_STRINGS = [
    "}", "},", "},{", "}, {", "},\n{", "]", "],", "]}", "\"},{\"", "\\", "\\\"},{",
    "naïve ✓ €", "日本語", "😀", "\u2028\u2029", "\x7f", "\x00\x1f", "{\"a\": 1}, {",
    "9" * 30, "1e400",
]


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_strings_that_look_like_boundaries_read_the_same(tmp_path: Path, runs: Runs,
                                                          ensure_ascii: bool) -> None:
    events = [dict(EVENT, name=s, args={s: [s, {"k": s}], "x": s}) for s in TRICKY_STRINGS]
    events += [{"name": s} for s in TRICKY_STRINGS]  # a boundary-like string last
    for sep in ((",", ":"), (", ", ": "), (",\n", ": ")):
        text = json.dumps({"traceEvents": events}, ensure_ascii=ensure_ascii, separators=sep)
        for run in (1 << 20, 1500, 200):  # "9" * 30 sends its run to the stdlib's scanner
            with patched(_RUN=run):
                same(write(tmp_path / "t.json", text))
                same(write(tmp_path / "t.json.gz", text))
    assert runs.entries > len(events)


@pytest.mark.parametrize("literal", [
    "1e400", "-1e400", "1.7976931348623159e308", "1.7976931348623157e308", "NaN", "Infinity",
    "-Infinity", str(2 ** 64), str(2 ** 64 - 1), str(-2 ** 63), str(-2 ** 63 - 1), str(2 ** 70),
    "9" * 5000, "-" + "9" * 5000, "1" + "0" * 18, "12345678901234567890.5", "1e-400", "-0",
    "-0.0", "0.1", "1E5", "2.5e-3", "4.9e-324", '"\\ud800"', '"\\udc00\\ud800"', '"\\ud83d\\ude00"',
    '"\\u0000"', '"a\\/b"', "01", "1.", "-", "[1,]", "tru", "nul",
])
@pytest.mark.parametrize("where", ["first", "middle", "last", "meta"])
def test_values_orjson_reads_otherwise_read_as_the_stdlib_does(
        tmp_path: Path, literal: str, where: str) -> None:
    """Big integers (a float from orjson), infinities and NaN (refused there, refused with
    their place here), lone surrogates (refused by orjson, kept by the stdlib)."""
    plain = json.dumps(EVENT)
    odd = f'{{"ph": "X", "args": {{"v": [1, {{"w": {literal}}}]}}, "ts": {literal}}}'
    body = {"first": [odd, plain, plain], "middle": [plain, odd, plain],
            "last": [plain, plain, odd], "meta": [plain] * 3}[where]
    meta = f', "deviceProperties": [{{"x": {literal}}}]' if where == "meta" else ""
    text = '{"traceEvents": [' + ", ".join(body * 3) + "]" + meta + "}"
    said = same(write(tmp_path / "t.json", text))
    if literal == str(2 ** 70) and where != "meta":
        big = [e["ts"] for e in said[1] if e.get("ph") == "X" and "dur" not in e]
        assert big == [2 ** 70] * 3 and all(type(n) is int for n in big)


def test_duplicate_keys_and_entries_that_are_not_objects(tmp_path: Path, runs: Runs) -> None:
    text = ('{"traceEvents": [{"a": 1, "b": 2, "a": 3}, 3, "x", null, [1, {"a": 1}], true, '
            '{"a": {"b": 1, "b": 2}}, {}, [], {"z": 1}, 2.5, {"y": 1}], "k": {"k": 1, "k": 2}}')
    said = same(write(tmp_path / "t.json", text))
    assert said[1][0] == {"a": 3, "b": 2} and said[5] == 7 and runs.entries > 0


@pytest.mark.parametrize("depth", [1, 2, 63, 64, 65, 66, 200, 900, 950, 990, 1000, 1023,
                                   1024, 1025, 1100, 5000])
def test_deep_nesting_reads_or_fails_the_same(tmp_path: Path, runs: Runs, depth: int) -> None:
    """orjson reads events at most 64 levels deep; deeper ones meet the stdlib's limit (the
    interpreter's recursion limit, from wherever it is called)."""
    deep = '{"a": ' + "[" * (depth - 1) + "0" + "]" * (depth - 1) + "}"
    event = json.dumps(EVENT)
    text = f'{{"traceEvents": [{event}, {deep}, {deep}, {event}]}}'
    said = same(write(tmp_path / "t.json", text))
    assert runs.entries == (3 if depth <= 64 else 0)  # the run: all but the last event
    if depth <= 200:
        assert said[-1] is None and said[4] == 4
    if depth > 1024:
        assert "nested too deeply" in said[-1][1]


def test_white_space_anywhere_json_allows_it(tmp_path: Path, runs: Runs) -> None:
    for item, key in ((",", ":"), (" , ", " : "), ("\r\n,\t", "\n:\r"), (",\n\n   ", ": "),
                      ("  ,", ":")):
        text = trace_text([EVENT, {"a": {}}, EVENT] * 5, separators=(item, key))
        same(write(tmp_path / "t.json", " \n\t" + text + "\r\n "))
        same(write(tmp_path / "t.json", text.replace("[", "[ \n").replace("]", " \n]")))
    same(write(tmp_path / "t.json", trace_text([EVENT] * 5, indent="\t")))
    assert runs.entries > 0


def test_a_trailing_comma_and_a_bare_array(tmp_path: Path) -> None:
    for text in ('{"traceEvents": [%s, %s, ]}', "[%s, %s]", "[%s, %s, ]", "[%s,%s]  ",
                 '{"traceEvents": [%s,%s],}', '{"traceEvents": [%s, , %s]}',
                 '{"traceEvents": [%s %s]}', "[%s, %s]]"):
        same(write(tmp_path / "t.json", text % (json.dumps(EVENT), json.dumps(EVENT))))


# -- bounds, truncation and chunk boundaries --------------------------------------------------

def small_trace() -> str:
    events = [EVENT, {"name": "},{\"x\"", "args": {"n": 2 ** 64}}, {"ph": "i", "s": "g"},
              {"name": "€😀", "ts": 1e-7, "v": [None, True, {}]}, 7, EVENT]
    return trace_text(events, head={"schemaVersion": 1, "deviceProperties": [{"id": 0}]},
                      separators=(",", ":"))


def test_every_chunk_boundary_of_a_small_trace(tmp_path: Path, runs: Runs) -> None:
    text = small_trace()
    for name in ("t.json", "t.json.gz"):
        path = write(tmp_path / name, text)
        for chunk in range(1, len(text) + 2):
            with patched(_CHUNK=chunk):
                same(path)
    assert runs.entries > 0


def test_every_truncation_of_a_small_trace(tmp_path: Path) -> None:
    text = small_trace().encode()
    for end in range(len(text) + 1):
        for chunk in (3, 1 << 20):
            with patched(_CHUNK=chunk):
                same(write(tmp_path / "t.json", text[:end]))
    packed = gzip.compress(text, mtime=0)
    for end in range(0, len(packed), 7):  # a gzip cut short
        same(write(tmp_path / "t.bin", packed[:end]))


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    text = small_trace().encode()
    for at in (1, text.index(b"aten"), len(text) // 2, len(text) - 3):
        same(write(tmp_path / "t.json", text[:at] + b"\xff\xfe" + text[at:]))
        same(write(tmp_path / "t.json", text[:at] + "\ud800".encode("utf-8", "surrogatepass")
                   + text[at:]))


def test_the_bounds_stop_both_at_the_same_place(tmp_path: Path, runs: Runs) -> None:
    events = trace_events(0, 2, steps=2, ops=100, gpu=True)
    path = write(tmp_path / "t.json", trace_text(events))
    size = path.stat().st_size
    for limits in ({"max_events": 1}, {"max_events": 10}, {"max_events": len(events) - 1},
                   {"max_events": len(events)}, {"max_bytes": size - 1},
                   {"max_bytes": size // 3}, {"max_bytes": size}):
        for chunk in (1 << 20, 1000):
            with patched(_CHUNK=chunk):
                same(path, **limits)
    assert runs.entries > 0
    gz = write(tmp_path / "t.json.gz", trace_text(events * 20))
    with patched(RATIO_FLOOR=1000, _CHUNK=20000):
        assert same(gz, max_ratio=5)[-1][0] == "GzipBomb"
        same(gz, max_ratio=100)


def test_one_event_larger_than_the_limit_and_the_meta_limit(tmp_path: Path) -> None:
    events = [EVENT] * 30 + [dict(EVENT, name="x" * 3000)] + [EVENT] * 30
    path = write(tmp_path / "t.json", trace_text(events))
    with patched(MAX_VALUE=1000, _CHUNK=100):
        assert "larger than 1000 B" in same(path)[-1][1]
    with patched(MAX_VALUE=1000, _CHUNK=1 << 20):
        assert "larger than 1000 B" in same(path)[-1][1]
    with patched(MAX_META=100):
        big = write(tmp_path / "m.json", trace_text([EVENT] * 9, head={"k": "v" * 200}))
        assert "larger than 100 B together" in same(big)[-1][1]


# -- randomly generated traces --------------------------------------------------------------

RAW = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", str(2 ** 64), str(-2 ** 63 - 1),
       "9" * 400, "1.7976931348623159e308", '"\\ud800"', '"\\udfff"', "-0", "1E+2"]
text_values = st.text(alphabet=st.sampled_from(list('{}[],:"\\ \n\t/aé€😀\x00\x1f')) |
                      st.characters(), max_size=12)
leaves = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | text_values
          | st.floats(allow_nan=False, allow_infinity=False)
          | st.integers(0, len(RAW) - 1).map(lambda i: f"\x01RAW{i}\x01"))
values = st.recursive(leaves, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(text_values, kids, max_size=4), max_leaves=12)
entries = st.dictionaries(text_values, values, max_size=6) | values
space = st.text(alphabet=" \t\n\r", max_size=2)


@st.composite
def traces(draw: st.DrawFn) -> str:
    events = draw(st.lists(entries, max_size=25))
    item = draw(space) + "," + draw(space)
    key = draw(space) + ":" + draw(space)
    text = json.dumps({"traceEvents": events, "k": draw(values)},
                      ensure_ascii=draw(st.booleans()), separators=(item, key))
    for i, raw in enumerate(RAW):  # numbers and strings json.dumps would never write
        text = text.replace(json.dumps(f"\x01RAW{i}\x01"), raw)
    return text


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fast")


@settings(max_examples=400)
@given(text=traces(), chunk=st.sampled_from([1, 2, 5, 17, 64, 300, 1 << 20]),
       run=st.sampled_from([40, 500, 1 << 20]), cut=st.none() | st.integers(0, 5000),
       gz=st.booleans())
def test_random_traces_read_the_same(scratch: Path, text: str, chunk: int, run: int,
                                     cut: int | None, gz: bool) -> None:
    data = text.encode("utf-8", "surrogatepass")[:cut]
    path = write(scratch / ("t.json.gz" if gz else "t.json"), data)
    with patched(_CHUNK=chunk, _RUN=run):
        same(path)
        same(path, positions=False, header=False)


@settings(max_examples=300)
@given(number=st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2 ** 66), 2 ** 66),
       form=st.sampled_from(["{}", "{:e}", "{:.17g}", "{:.3f}", "{:E}"]))
def test_random_numbers_read_the_same(scratch: Path, number: float, form: str) -> None:
    literal = form.format(number) if isinstance(number, float) or form == "{}" else str(number)
    event = f'{{"ts": {literal}, "args": {{"v": [{literal}]}}}}'
    path = write(scratch / "n.json", '{"traceEvents": [' + ", ".join([event] * 3) + "]}")
    same(path)


# -- without orjson -----------------------------------------------------------------------

def test_without_orjson_the_stdlib_reads_everything(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json.gz"
    write_trace(str(path), 0, 2, steps=2, ops=20, gpu=True)
    assert same(path)[-1] is None
    code = ("import sys; sys.modules['orjson'] = None\n"
            "from policy_engine.analysis import chrome_trace as c\n"
            "assert not c.FAST\n"
            "r = c.TraceReader(sys.argv[1]); n = sum(1 for _ in r.events())\n"
            "print(n, r.count, r.bytes_read, r.position)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [str(Path(__file__).resolve().parent.parent),
                               os.environ.get("PYTHONPATH", "")])))
    with TraceReader(str(path)) as reader:
        n = sum(1 for _ in reader.events())
        assert done.stdout.split() == [str(n), str(reader.count), str(reader.bytes_read),
                                       str(reader.position)]
