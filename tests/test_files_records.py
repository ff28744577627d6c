"""files/records.py: the one place manifest lines are built, checked against the one
declaration the reader uses."""

from __future__ import annotations

import inspect

import pytest

from policy_engine.analysis.manifests import parse_line
from policy_engine.files import records
from policy_engine.runtime.manifest import encode

BASE = {"role": "actor", "rank": 3, "world": 8, "backend": "torch", "pid": 1234}


def test_each_builder_asks_for_what_its_kind_requires() -> None:
    builders = {"open": records.open_line, "trace": records.trace_line,
                "close": records.close_line, "note": records.note_line,
                "summary": records.summary_line}
    assert set(builders) == set(records.EVENTS)
    for event, build in builders.items():
        keyword_only = {name for name, p in inspect.signature(build).parameters.items()
                        if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert set(records.REQUIRED[event]) <= keyword_only, event


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
