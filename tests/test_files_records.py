"""files/records.py: the one place manifest lines are declared and built, and the classes
the reader checks every line with."""

from __future__ import annotations

import inspect
import json

import attrs
import pytest

from policy_engine.analysis.manifests import parse_line
from policy_engine.files import records
from policy_engine.files.records import ABSENT, CloseLine, NoteLine, SummaryLine, TraceLine
from policy_engine.runtime.process.manifest import encode

BASE = {"role": "actor", "rank": 3, "world": 8, "backend": "torch", "pid": 1234}


def test_each_builder_asks_for_what_its_kind_requires() -> None:
    builders = {"open": records.open_line, "trace": records.trace_line,
                "close": records.close_line, "note": records.note_line,
                "summary": records.summary_line}
    assert set(builders) == set(records.EVENTS) == set(records.KINDS)
    for event, build in builders.items():
        keyword_only = {name for name, p in inspect.signature(build).parameters.items()
                        if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert set(records.required(records.KINDS[event])) <= keyword_only, event


def test_each_kind_requires_its_fields() -> None:
    assert {event: records.required(kind) for event, kind in records.KINDS.items()} == {
        "open": ("capture",), "trace": ("status",), "close": ("capture", "status"),
        "note": ("note",), "summary": ("capture", "path", "status")}


def test_every_field_says_what_its_value_must_be_the_same_on_every_kind() -> None:
    line = attrs.fields_dict(records.Line)
    for kind in records.KINDS.values():
        for field in attrs.fields(kind):
            assert field.name == "more" or "check" in field.metadata, (kind, field.name)
            if field.name in line:  # a kind that requires a field requires the same one
                assert field.metadata == line[field.name].metadata, (kind, field.name)


@pytest.mark.parametrize("line", [
    records.open_line(BASE, capture="c1", steps=[5], start=1.5),
    records.trace_line(BASE, capture="c1", status="complete", path="a.pt.trace.json.gz",
                       bytes=10, cycle=0, steps=[5], start=1.5, end=2.5),
    records.close_line(capture="c1", status="partial", end=3.0, traces=1, steps=[5]),
    records.note_line(BASE, note="slow_step", time=4.0),
    records.summary_line({"role": "actor", "rank": 3}, capture="c1", path="a.pt.trace.json.gz",
                         status="complete", summary={"basis": "cpu", "steps": []}, kept=True,
                         seconds=0.25),
    records.summary_line({"role": "actor", "rank": 3}, capture="c1", path="a.pt.trace.json.gz",
                         status="cut", error="cut short by exit", kept=True, seconds=5.0),
])
def test_built_lines_read_back_as_they_were_written(line: dict[str, object]) -> None:
    assert parse_line(encode(line).rstrip(b"\n")) == line


def test_the_kind_cannot_be_changed_by_the_base() -> None:
    line = records.note_line({**BASE, "event": "trace"}, note="left_out")
    assert line["event"] == "note"
    assert parse_line(encode(line).rstrip(b"\n"))["event"] == "note"


def test_a_built_line_with_a_bad_field_is_refused_by_the_reader() -> None:
    line = records.trace_line(BASE, capture="c1", status="lost")
    with pytest.raises(ValueError, match="status: expected one of complete"):
        parse_line(encode(line))


def test_a_line_read_is_its_kind_with_typed_fields() -> None:
    line = records.from_json({"event": "close", "capture": "1", "status": "partial",
                              "end": 2.0, "error": None, "limit": "bytes"})
    assert isinstance(line, CloseLine)
    assert (line.capture, line.status, line.end, line.error) == ("1", "partial", 2.0, None)
    assert line.traces is ABSENT  # left out, which is not a null
    assert line.more == {"limit": "bytes"}
    old = records.from_json({"status": "complete", "path": "t.json"})  # before `event`
    assert isinstance(old, TraceLine) and old.capture is ABSENT
    assert old.to_json() == {"status": "complete", "path": "t.json", "event": "trace"}


def test_building_leaves_out_what_is_not_given_and_keeps_the_other_keys() -> None:
    line = SummaryLine.build(BASE, capture="c1", path=None, status="failed", error="boom")
    assert (line.capture, line.path, line.rank, line.kept) == ("c1", None, 3, ABSENT)
    assert line.more == {"backend": "torch"}
    assert line.to_json() == {**BASE, "capture": "c1", "path": None, "status": "failed",
                              "error": "boom", "event": "summary"}


def test_a_field_is_checked_on_every_kind_that_carries_it() -> None:
    """A note line that names a file names it as a trace line does."""
    with pytest.raises(ValueError, match="bytes: expected a byte count or null, got -1"):
        records.from_json({"event": "note", "note": "engine-frontend", "bytes": -1})
    with pytest.raises(ValueError, match="kept: expected true or false"):
        records.from_json({"status": "complete", "kept": "yes"})
    assert isinstance(records.from_json({"event": "note", "note": "x", "bytes": 3}), NoteLine)


@pytest.mark.parametrize(("record", "why"), [
    ({"event": "crash"}, "event: unknown kind 'crash' (expected one of open, trace, close, "
                         "note, summary)"),
    ({"event": ["open"]}, "event: unknown kind ['open']"),
    ({"event": "summary", "capture": "1", "status": "complete"},
     "path: missing (every summary record has one)"),
    ({"event": "note", "note": 5}, "note: expected a string, got 5"),
    ({"status": "complete", "role": ["x" * 100]}, 'role: expected a string or null, got ["xx'),
    ({"status": "complete", "error": ["\x1b[2J" * 20]},
     'error: expected a string or null, got ["\\u001b[2J\\u001b[2J'),
])
def test_what_is_wrong_is_said_in_one_printable_line(record: dict[str, object],
                                                     why: str) -> None:
    with pytest.raises(ValueError) as info:
        records.from_json(record)
    assert str(info.value).startswith(why) and str(info.value).isprintable()
    assert len(str(info.value)) < 120


def test_a_status_is_a_member_written_as_its_word() -> None:
    # One declaration: the kinds' status checks take their words from the members.
    assert set(records.TRACE_STATUSES) | set(records.CLOSE_STATUSES) == \
        {s.value for s in records.Status}
    assert set(records.SUMMARY_STATUSES) == {s.value for s in records.SummaryStatus}
    line = records.close_line(capture="c1", status=records.Status.PARTIAL, end=1.0, traces=0,
                              steps=[])
    text = encode(line).decode()
    assert '"status": "partial"' in text and "Status" not in text
    back = records.from_json(json.loads(text))
    assert back.status == records.Status.PARTIAL and f"{records.Status.PARTIAL}" == "partial"


# Values a line's field may hold, right and wrong: the rules' shortcuts (types, ranges)
# must say what each field's check says, for every one of them.
_VALUES = [None, True, False, 0, 1, -1, 7, (1 << 63) - 1, 1 << 63, -(1 << 63), -(1 << 63) - 1,
           10 ** 400, 0.0, -0.0, 1.5, -2.5, float("inf"), float("-inf"), float("nan"),
           "", "x", [], [1], [1, "a"], ["a", "b"], [True], [1.5], [None], [[1]], [1 << 63],
           [-(1 << 63)], [{"a": 1}], {}, {"a": 1}, (1,), b"x"]


def test_each_rule_says_what_its_check_says_of_every_value() -> None:
    import enum

    class Number(enum.IntEnum):
        ONE = 1

    for kind in records.KINDS.values():
        for field in attrs.fields(kind):
            rule = field.metadata.get("check")
            if rule is None:
                continue
            for value in [*_VALUES, Number.ONE, [Number.ONE]]:
                assert records._passes(value, rule) == bool(rule[0](value)), (
                    kind.EVENT, field.name, value)
