"""An Ascend capture's device view: torch_npu's trace_view.json against its own Overlap
Analysis lanes (a real capture), and the rules on small made-up ones (communication on
the HCCL process, steps by the flows from the host, exact string timestamps, finding the
file inside an ``*_ascend_pt`` folder)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from policy_engine.analysis.ascend import AscendView, find_trace_view, read_ascend
from policy_engine.analysis.errors import AnalysisError

TRACE = Path(__file__).parent / "data" / "external" / "ascend" / "trace_view.json"
LANES = ("computing_us", "communication_us", "communication_not_overlapped_us", "free_us")


def _within(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= 0.01 * abs(theirs) + 1e-6


def test_the_real_capture_equals_its_overlap_analysis() -> None:
    result = read_ascend(str(TRACE))
    assert result["error"] is None
    ours, lanes = result["overlap"], result["lanes"]
    assert ours is not None and lanes is not None
    assert lanes["computing_us"] == pytest.approx(1788.25, abs=0.01)  # the file's own
    assert lanes["free_us"] == pytest.approx(9481.667, abs=0.01)
    assert [k for k in LANES  # type: ignore[literal-required]
            if not _within(ours[k], lanes[k])] == []  # type: ignore[literal-required]
    # its one step holds every task: the same figures, and the same lanes
    (step,) = result["steps"]
    assert step["step"] == 1 and step["device_events"] == result["device_events"] == 276
    assert step["overlap"] == ours and step["lanes"] == lanes
    figures = result["gpu_timeline"]
    assert figures is not None
    assert figures["computation_us"] == ours["computing_us"]
    assert figures["exposed_memcpy_us"] == pytest.approx(2.19, abs=0.01)  # MEMCPY_ASYNC
    assert figures["total_us"] == pytest.approx(11269.917, abs=0.001)


def test_the_file_is_found_in_its_ascend_pt_folder(tmp_path: Path) -> None:
    capture = tmp_path / "actor_rank0-of-1_123_20250101120000000_ascend_pt"
    (capture / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    shutil.copy(TRACE, capture / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    found = str(capture / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    assert find_trace_view(str(capture)) == found
    assert find_trace_view(str(capture / "ASCEND_PROFILER_OUTPUT")) == found
    assert find_trace_view(found) == found
    assert read_ascend(str(capture)) == read_ascend(str(TRACE))


@pytest.mark.parametrize(("inside", "says"), [
    (["PROF_000001_20250101120000000_ABC/"], "the capture was not analysed: run "
     "torch_npu.profiler.profiler.analyse() on the folder (or record with analysis: true)"),
    (["ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_0.db"], "ASCEND_PROFILER_OUTPUT holds "
     "only the database export (export_type db); the figures are read from trace_view.json "
     "(export_type text)"),
    ([], "it is not a torch_npu *_ascend_pt folder"),
])
def test_a_folder_without_it_says_why(tmp_path: Path, inside: list[str], says: str) -> None:
    for name in inside:
        (tmp_path / name.rstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_text("")
    with pytest.raises(AnalysisError) as caught:
        find_trace_view(str(tmp_path))
    assert str(caught.value) == \
        f"{tmp_path}: no ASCEND_PROFILER_OUTPUT/trace_view.json in it; {says}"
    with pytest.raises(AnalysisError, match="no such file or folder"):
        find_trace_view(str(tmp_path / "gone"))


def test_an_unreadable_file_gives_its_error(tmp_path: Path) -> None:
    cut = tmp_path / "trace_view.json"
    cut.write_text(TRACE.read_text()[:5000])
    result = read_ascend(str(cut))
    assert result["overlap"] is None
    assert result["error"] == f"{cut}: truncated: the file ends inside event 28 of traceEvents"


# -- made-up captures --------------------------------------------------------------------

_META = [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "Python"}},
    {"ph": "M", "name": "process_name", "pid": 800, "tid": 0,
     "args": {"name": "Ascend Hardware"}},
    {"ph": "M", "name": "process_name", "pid": 900, "tid": 0, "args": {"name": "HCCL"}},
    {"ph": "M", "name": "thread_name", "pid": 900, "tid": 1,
     "args": {"name": "Group hccl_world_group Communication"}},
    {"ph": "M", "name": "thread_name", "pid": 900, "tid": 2, "args": {"name": "Plane 0"}},
]


def _task(ts: str, dur: float, name: str = "MatMul", pid: int = 800, tid: int = 3
          ) -> dict[str, Any]:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"Task Type": "AI_CORE"}}


def _launched(host: str, ts: str, flow: int) -> list[dict[str, Any]]:
    return [{"ph": "s", "cat": "async_npu", "name": "torch_to_npu", "id": flow, "pid": 1,
             "tid": 1, "ts": host},
            {"ph": "f", "cat": "async_npu", "name": "torch_to_npu", "id": flow, "pid": 800,
             "tid": 3, "ts": ts, "bp": "e"}]


def _step(n: int, ts: str, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
            "ts": ts, "dur": dur}


def _run(events: list[dict[str, Any]]) -> Any:
    view = AscendView()
    for e in events:
        view.event(e)
    return view.result()


def test_communication_is_the_hccl_operators_lanes() -> None:
    """HCCL's operator lane counts, its task lanes (the same time again) do not; a
    collective half under a compute task is half exposed."""
    events = [*_META, _task("1000000000000100.000", 40),
              _task("1000000000000120.000", 40, "hcom_allReduce__1", 900, 1),
              _task("1000000000000125.000", 30, "Notify_Wait", 900, 2),
              _task("1000000000000170.000", 10, "MEMCPY_ASYNC")]
    result = _run(events)
    assert result["overlap"] == {"computing_us": 40, "communication_us": 40,
                                 "communication_not_overlapped_us": 20, "free_us": 0}
    assert result["gpu_timeline"] == {"computation_us": 40, "exposed_comm_us": 20,
                                      "exposed_memcpy_us": 10, "busy_us": 70,
                                      "idle_us": 10, "total_us": 80}


def test_string_timestamps_are_read_to_the_nanosecond() -> None:
    """Sixteen-digit microseconds: as floats, 0.001 µs apart would be 0.25 µs apart."""
    events = [*_META, _task("1704161511422904.204", 0.001),
              _task("1704161511422904.206", 0.001)]
    result = _run(events)
    assert result["overlap"]["computing_us"] == 0.002
    assert result["overlap"]["free_us"] == 0.001


def test_tasks_count_in_the_step_that_launched_them() -> None:
    """A task launched in step 1 that runs during step 2 is step 1's; one no flow
    reaches (a copy CANN issued) goes to the step whose device window holds it."""
    events = [*_META, _step(1, "1000.000", 100), _step(2, "1100.000", 100),
              *_launched("1050.000", "1080.000", 1), _task("1080.000", 10),
              *_launched("1090.000", "1150.000", 2), _task("1150.000", 10),
              *_launched("1120.000", "1250.000", 3), _task("1250.000", 10),
              _task("1100.000", 5, "MEMCPY_ASYNC")]
    one, two = _run(events)["steps"]
    assert (one["device_events"], two["device_events"]) == (3, 1)
    assert one["window"]["start_us"] == 1080 and one["window"]["end_us"] == 1160
    assert one["overlap"]["computing_us"] == 20 and one["overlap"]["free_us"] == 60
    assert two["gpu_timeline"]["total_us"] == 10


def test_lanes_are_read_back_per_step() -> None:
    lanes = [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0,
              "args": {"name": "Overlap Analysis"}},
             {"ph": "X", "name": "Computing", "pid": 7, "tid": 0, "ts": "1080.000",
              "dur": 10},
             {"ph": "X", "name": "Free", "pid": 7, "tid": 3, "ts": "1090.000", "dur": 60}]
    events = [*_META, *lanes, _step(1, "1000.000", 100),
              *_launched("1050.000", "1080.000", 1), _task("1080.000", 10),
              *_launched("1060.000", "1150.000", 2), _task("1150.000", 10)]
    result = _run(events)
    assert result["lanes"] == {"computing_us": 10, "communication_us": 0,
                               "communication_not_overlapped_us": 0, "free_us": 60}
    assert result["steps"][0]["lanes"] == result["lanes"]


def test_json_ready() -> None:
    assert json.loads(json.dumps(read_ascend(str(TRACE)))) == read_ascend(str(TRACE))


def test_hostile_rows_are_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys that are not numbers or strings, timestamps that are not numbers, negative
    durations: passed over, never raised on; flows past their bound say so."""
    good = [*_META, _task("1000.000", 10)]
    bad: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": [800], "args": {"name": "HCCL"}},
        {"ph": "X", "name": "MatMul", "pid": {"a": 1}, "tid": [3], "ts": "1000", "dur": 5},
        {"ph": "X", "name": "MatMul", "pid": 800, "tid": 3, "ts": "10e3", "dur": 5},
        {"ph": "X", "name": "MatMul", "pid": 800, "tid": 3, "ts": "1000", "dur": "-5"},
        {"ph": "X", "name": "MatMul", "pid": 800, "tid": 3, "ts": 1e300, "dur": 5},
        {"ph": "s", "cat": "async_npu", "id": [1], "pid": 1, "tid": 1, "ts": "1000"},
    ]
    assert _run(good + bad)["overlap"] == _run(good)["overlap"]
    monkeypatch.setattr("policy_engine.analysis.ascend.MAX_FLOWS", 1)
    result = _run([*good, *_launched("990.000", "1000.000", 1)])
    assert result["error"] == "more than 1 flows from the host: not computed"
