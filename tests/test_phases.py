"""One rank's phases (analysis/phases.py): the regions a real torch capture marks, named in
its metadata and listed in its summary on its own clock; the collectives a phase begins
or ends with; depth; bounds; and a summary's phases read back from a manifest as hostile."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from timeline_runs import phase, trace_doc

from policy_engine import Topology, apply_policy
from policy_engine.analysis import phases as phases_mod
from policy_engine.analysis.chrome_trace import TraceReader
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.analysis.summary import problem, summarize


def write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


class Worker:
    def generate_sequences(self) -> None:
        time.sleep(0.05)

    def actor_update(self) -> None:
        with torch_record("forward"):  # the model's own annotation: no phase
            time.sleep(0.02)


def torch_record(name: str) -> Any:
    import torch

    return torch.autograd.profiler.record_function(name)


def test_a_real_capture_names_its_regions_and_its_summary_lists_them(
        make_policy: Any, tmp_path: Path) -> None:
    policy = make_policy(steps=[1], regions=["generate_sequences", "actor_update"])
    prof = apply_policy(worker := Worker(), "actor", policy, Topology())
    before = time.time_ns() // 1000
    with prof.training_step(1):
        worker.generate_sequences()
        worker.actor_update()
        worker.actor_update()
    prof.close()
    after = time.time_ns() // 1000
    (line,) = [r for r in scan_manifests(str(tmp_path / "out")).records
               if r["event"] == "trace"]
    path = str(tmp_path / "out" / line["path"])
    with TraceReader(path) as reader:
        for _ in reader.events():
            pass
    assert reader.meta["policy_engine"]["region_ranges"] == ["generate_sequences",
                                                            "actor_update"]
    found = summarize(path)["phases"]
    assert found["named_by"] == "policy" and found["left_out"] == 0
    names = [found["names"][r[0]] for r in found["rows"]]
    assert names == ["generate_sequences", "actor_update", "actor_update"]  # no "forward"
    first = found["rows"][0]
    assert first[2] - first[1] == pytest.approx(50_000, rel=0.5)
    # on the rank's own clock: Unix microseconds, within the capture
    assert before <= found["origin_us"] + first[1] <= after
    assert problem(summarize(path)) is None


def test_collectives_at_a_phases_edges_are_its_lead_and_tail(tmp_path: Path) -> None:
    doc = trace_doc(0, 1, [phase("sync_weights", 10, 110, lead=80),
                           phase("actor_update", 110, 210, tail=30)], (0.0, 220.0))
    found = summarize(write(tmp_path / "t.json", doc))["phases"]
    rows = {found["names"][r[0]]: r for r in found["rows"]}
    assert rows["sync_weights"][4:] == [pytest.approx(80_000), 0.0]
    assert rows["actor_update"][4:] == [0.0, pytest.approx(30_000)]


def test_phases_inside_phases_have_a_depth(tmp_path: Path) -> None:
    doc = trace_doc(0, 1, [phase("step", 0, 100), phase("generate", 10, 50)], (0.0, 100.0))
    found = summarize(write(tmp_path / "t.json", doc))["phases"]
    assert [(found["names"][r[0]], r[3]) for r in found["rows"]] == [("step", 0),
                                                                    ("generate", 1)]


def test_the_origin_is_the_traces_base_time_plus_its_first_timestamp(tmp_path: Path) -> None:
    doc = trace_doc(0, 1, [phase("a", 5, 6)], (0.0, 10.0), skew_ms=2000.0)
    found = summarize(write(tmp_path / "t.json", doc))["phases"]
    assert found["origin_us"] == (doc["baseTimeNanoseconds"] // 1000) + 5_000_000
    assert found["span"] == [0.0, 10_000.0] and found["rows"][0][1:3] == [5000.0, 6000.0]


def test_phases_past_the_bound_are_counted(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases_mod, "MAX_ROWS", 3)
    doc = trace_doc(0, 1, [phase(f"p{i}", i, i + 0.5) for i in range(10)], (0.0, 10.0))
    found = summarize(write(tmp_path / "t.json", doc))["phases"]
    assert len(found["rows"]) == 3 and found["left_out"] == 7


GOOD = {"origin_us": 10, "span": [0.0, 10.0], "names": ["a"], "rows": [[0, 1.0, 2.0, 0, 0.5,
                                                                         0.0]],
        "named_by": "policy", "left_out": 0}


@pytest.mark.parametrize(("change", "why"), [
    ({"origin_us": 1.5}, "its phases have no origin in whole microseconds"),
    ({"span": [5.0, 1.0]}, "its phases' span is not [first, last]"),
    ({"names": [3]}, "its phases' names are not a list of names"),
    ({"rows": {"a": 1}}, "its phases are not a list of rows"),
    ({"rows": [[1, 1.0, 2.0, 0, 0.0, 0.0]]}, "phase 0 names no listed name"),
    ({"rows": [[0, 3.0, 2.0, 0, 0.0, 0.0]]}, "phase 0 ends before it starts"),
    ({"rows": [[0, 1.0, 20.0, 0, 0.0, 0.0]]}, "phase 0 lies outside the trace's span"),
    ({"rows": [[0, 1.0, 2.0, 0, 5.0, 0.0]]},
     "phase 0 has a depth, lead or tail that is no time within it"),
    ({"rows": [[0, 1.0, 2.0]]}, "phase 0 is not [name, start, end, depth, lead, tail]"),
    ({"named_by": "guess"}, "its phases do not say how they were named, or what was left out"),
])
def test_a_summarys_phases_read_back_are_checked(change: dict[str, Any], why: str) -> None:
    assert phases_mod.problem({**GOOD, **change}) == why
    assert phases_mod.problem(GOOD) is None and phases_mod.problem(None) is None


_ANY = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) \
    | st.text(max_size=3) | st.lists(st.integers(), max_size=2)


@given(st.lists(st.fixed_dictionaries({
    "ph": st.sampled_from(["X", "M"]) | _ANY,
    "cat": st.sampled_from(["cpu_op", "user_annotation", "gpu_user_annotation"]) | _ANY,
    "name": st.sampled_from(["update", "gloo:all_reduce", "c10d::broadcast_",
                             "ProfilerStep#2"]) | _ANY,
    "tid": st.integers(0, 2) | _ANY,
    "ts": st.floats(0, 1e4) | _ANY, "dur": st.floats(0, 1e3) | _ANY}), max_size=25),
    st.sampled_from([None, ["update"], [], "x"]))
def test_any_events_give_phases_their_check_accepts(events: list[dict[str, Any]],
                                                     marked: Any) -> None:
    found = phases_mod.Phases()
    for e in events:
        found.event(e)
    meta = {} if marked is None else {"policy_engine": {"region_ranges": marked}}
    record = json.loads(json.dumps(found.result({**meta, "baseTimeNanoseconds": 10 ** 18})))
    assert phases_mod.problem(record) is None
