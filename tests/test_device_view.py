"""The device view against the tools that define its figures, on their own real traces.

TraceLens's ``gpu_timeline`` (six figures) must come out of every TraceLens trace within
1% or 5 µs of the CSV TraceLens wrote for it; HTA 0.5.0 itself, run on HTA's traces, is
the oracle of the HTA figures. Small made-up traces pin down the rules the real ones
cannot show on their own: a kernel counts in the step that launched it, the parts sum to
the window, the order of the events does not matter, and the bounds say so when passed.
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policy_engine.analysis import device_view
from policy_engine.analysis.chrome_trace import TraceReader
from policy_engine.analysis.device_view import DeviceView, GpuTimeline

DATA = Path(__file__).parent / "data" / "external"
TRACELENS = sorted((DATA / "tracelens").rglob("*.json.gz"))
FIGURES = ("computation_us", "exposed_comm_us", "exposed_memcpy_us", "busy_us", "idle_us",
           "total_us")


def _view(path: Path) -> device_view.DeviceResult:
    view = DeviceView()
    with TraceReader(str(path)) as reader:
        for event in reader.events():
            view.event(event)
    return view.result()


def _reference(trace: Path) -> dict[str, float]:
    """TraceLens's own gpu_timeline.csv for ``trace``, in µs."""
    csv_path = trace.with_name(trace.name.replace(".json.gz", ".gpu_timeline.csv"))
    with open(csv_path, newline="") as f:
        return {row["type"].replace("_time", "_us"): float(row["time ms"]) * 1000
                for row in csv.DictReader(f)}


def _close(ours: GpuTimeline | None, theirs: dict[str, float]) -> list[str]:
    assert ours is not None
    return [f"{k}: {ours[k]} vs {theirs[k]:.3f}"  # type: ignore[literal-required]
            for k in FIGURES if abs(ours[k] - theirs[k])  # type: ignore[literal-required]
            > max(0.01 * abs(theirs[k]), 5.0)]


def test_the_tracelens_traces_are_all_here() -> None:
    assert len(TRACELENS) == 7


@pytest.mark.parametrize("trace", TRACELENS, ids=lambda p: p.name.split("__")[0])
def test_gpu_timeline_equals_tracelens(trace: Path) -> None:
    result = _view(trace)
    assert result["error"] is None
    assert _close(result["gpu_timeline"], _reference(trace)) == []
    # the traces with a ProfilerStep record one step: its device view is the trace's
    for step in result["steps"]:
        assert _close(step["gpu_timeline"], _reference(trace)) == []


def test_qwen_step_is_its_gpu_annotation_not_the_kernels_before_it() -> None:
    """The issue's case: 13 ms of kernels that ran before ProfilerStep#6 on the GPU were
    launched before the profiler started: they count in no step, and step 6's device
    window is its gpu_user_annotation band (34.89 ms), not a 49 ms span."""
    trace = DATA / "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    result = _view(trace)
    (step,) = result["steps"]
    assert step["step"] == 6 and step["window"] is not None
    assert step["window"]["source"] == "gpu_annotation"
    figures = step["gpu_timeline"]
    assert figures is not None
    assert figures["total_us"] == pytest.approx(34892.42, abs=0.01)
    assert figures["computation_us"] == pytest.approx(31903.12, abs=0.01)
    assert figures["idle_us"] == pytest.approx(2986.94, abs=0.01)
    assert result["counts"]["device_events"] == 1707
    assert result["counts"]["launched"] == step["device_events"] == 1198


_HTA = """
import json, logging, sys, warnings
warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
breakdown = analysis.get_temporal_breakdown(visualize=False)
overlap = analysis.get_comm_comp_overlap(visualize=False)
print(json.dumps({"breakdown": breakdown.to_dict("records"),
                  "overlap": overlap.to_dict("records")}))
"""


def _hta(folder: Path) -> dict[int, dict[str, Any]]:
    """HTA 0.5.0's answers per rank for the traces in ``folder``, from HTA itself."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-c", _HTA, str(folder)], capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    ranks: dict[int, dict[str, Any]] = {int(r["rank"]): dict(r) for r in out["breakdown"]}
    for row in out["overlap"]:
        ranks[int(row["rank"])]["overlap_pct"] = row["comp_comm_overlap_pctg"]
    return ranks


@pytest.mark.parametrize(("folder", "files"), [
    ("trace_filter", {0: "sampled_rank-0.json.gz", 1: "sampled_rank-1.json.gz"}),
    ("nccl_parser_config", {0: "nccl_data.json.gz"}),
])
def test_hta_figures_equal_hta_itself(folder: str, files: dict[int, str]) -> None:
    pytest.importorskip("hta.trace_analysis")
    theirs = _hta(DATA / "hta" / folder)
    assert sorted(theirs) == sorted(files)
    for rank, name in files.items():
        ours = _view(DATA / "hta" / folder / name)["hta"]
        assert ours is not None
        hta = theirs[rank]
        assert ours["idle_us"] == pytest.approx(hta["idle_time(us)"], abs=1e-3)
        assert ours["compute_us"] == pytest.approx(hta["compute_time(us)"], abs=1e-3)
        assert ours["non_compute_us"] == pytest.approx(hta["non_compute_time(us)"], abs=1e-3)
        assert ours["kernel_us"] == pytest.approx(hta["kernel_time(us)"], abs=1e-3)
        assert ours["overlap_pct"] == pytest.approx(hta["overlap_pct"], abs=1e-9)


def test_hta_leaves_out_the_last_step_and_rounds_fractional_times() -> None:
    """The two rules that make HTA's numbers differ from the same kernels' union: with
    several steps it counts only the kernels launched before the last step starts, and
    it rounds fractional times inward to whole microseconds."""
    result = _view(DATA / "hta/nccl_parser_config/nccl_data.json.gz")
    hta = result["hta"]
    assert hta is not None
    last = result["steps"][-1]
    assert hta["device_events"] == result["counts"]["device_events"] - last["device_events"]
    assert hta["kernel_us"] == int(hta["kernel_us"])  # whole microseconds
    assert sum(s["gpu_timeline"]["computation_us"]  # type: ignore[index]
               for s in result["steps"][:-1]) > hta["compute_us"] + 1000


# -- the rules, on made-up traces -------------------------------------------------------


def _launch(corr: int, ts: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
            "tid": 1, "ts": ts, "dur": 1, "args": {"correlation": corr}}


def _kernel(corr: int, ts: float, dur: float, name: str = "gemm",
            cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": 7}}


def _step(n: int, ts: float, dur: float, cat: str = "user_annotation") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
            "ts": ts, "dur": dur}


def _run(events: list[dict[str, Any]]) -> device_view.DeviceResult:
    return device_view.device_view(events)


def test_a_kernel_counts_in_the_step_that_launched_it() -> None:
    """Step 1's last kernel runs during step 2's host range, step 2's first one after
    step 2 ended on the host: each counts in the step that launched it."""
    events = [_step(1, 0, 100), _step(2, 100, 100),
              _launch(1, 10), _kernel(1, 20, 30), _launch(2, 90), _kernel(2, 150, 40),
              _launch(3, 150), _kernel(3, 250, 10, "ncclDevKernel_AllReduce")]
    result = _run(events)
    one, two = result["steps"]
    assert one["device_events"] == 2 and two["device_events"] == 1
    assert one["window"] == {"start_us": 20, "end_us": 190, "source": "launches"}
    assert one["gpu_timeline"] == {"computation_us": 70, "exposed_comm_us": 0,
                                   "exposed_memcpy_us": 0, "busy_us": 70, "idle_us": 100,
                                   "total_us": 170}
    assert two["gpu_timeline"] is not None
    assert two["gpu_timeline"]["exposed_comm_us"] == 10
    assert result["gpu_timeline"] is not None
    assert result["gpu_timeline"]["total_us"] == 240


def test_the_window_is_the_gpu_annotation_widened_to_hold_its_kernels() -> None:
    annotation = {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1",
                  "pid": 0, "tid": 7, "ts": 15, "dur": 40}
    events = [_step(1, 0, 100), annotation, _launch(1, 10), _kernel(1, 20, 50)]
    (step,) = _run(events)["steps"]
    assert step["window"] == {"start_us": 15, "end_us": 70, "source": "gpu_annotation"}
    assert step["gpu_timeline"] is not None
    assert step["gpu_timeline"]["idle_us"] == 5


def test_kernels_launched_before_the_trace_count_nowhere() -> None:
    events = [_step(1, 100, 100), _kernel(7, 50, 60), _launch(1, 110), _kernel(1, 120, 10)]
    result = _run(events)
    assert result["counts"] == {"device_events": 2, "launched": 1, "in_steps": 1,
                                "launches": 1}
    assert result["gpu_timeline"] is not None
    assert result["gpu_timeline"]["total_us"] == 10


def test_classes_follow_tracelens() -> None:
    """Memsets are computation and nccl-named memsets communication, as in TraceLens;
    a memory copy under communication is not exposed."""
    events = [_launch(1, 0), _kernel(1, 10, 10, "Memset (Device)", "gpu_memset"),
              _launch(2, 0), _kernel(2, 30, 20, "ncclKernel_AllGather"),
              _launch(3, 0), _kernel(3, 40, 20, "Memcpy DtoD", "gpu_memcpy"),
              _launch(4, 0), _kernel(4, 70, 5, "MEMORY_COPY_DEVICE_TO_HOST")]
    figures = _run(events)["gpu_timeline"]
    assert figures == {"computation_us": 10, "exposed_comm_us": 20, "exposed_memcpy_us": 15,
                       "busy_us": 45, "idle_us": 20, "total_us": 65}


_EVENT = st.tuples(st.integers(0, 3), st.integers(0, 500), st.integers(0, 80),
                   st.integers(0, 4))
_NAMES = ("gemm", "ncclDevKernel_Broadcast", "Memcpy HtoD", "Memset (Device)", "cast")
_CATS = ("kernel", "kernel", "gpu_memcpy", "gpu_memset", "kernel")


@given(st.lists(_EVENT, min_size=1, max_size=40), st.randoms())
def test_parts_sum_to_the_window_in_any_order(kernels: list[tuple[int, int, int, int]],
                                              rnd: random.Random) -> None:
    events = [_step(1, 0, 200), _step(2, 200, 200)]
    for corr, (where, ts, dur, kind) in enumerate(kernels):
        events.append(_launch(corr, where * 100 + 1))
        events.append(_kernel(corr, ts, dur, _NAMES[kind], _CATS[kind]))
    result = _run(events)
    rnd.shuffle(events)
    assert _run(events) == result
    rows = [s["gpu_timeline"] for s in result["steps"]] + [result["gpu_timeline"]]
    for f in rows:
        if f is None:
            continue
        parts = f["computation_us"] + f["exposed_comm_us"] + f["exposed_memcpy_us"]
        assert parts + f["idle_us"] == pytest.approx(f["total_us"], abs=1e-6)
        assert parts == pytest.approx(f["busy_us"], abs=1e-6)
    hta = result["hta"]  # None when every kernel was launched in the last step
    if hta is not None:
        assert hta["idle_us"] + hta["compute_us"] + hta["non_compute_us"] == \
            pytest.approx(hta["kernel_us"], abs=1e-6)


def test_past_its_bounds_the_view_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_view, "MAX_DEVICE_EVENTS", 2)
    events = [_launch(i, 0) for i in range(3)] + [_kernel(i, 10 * i, 5) for i in range(3)]
    result = _run(events)
    assert result["gpu_timeline"] is None and result["hta"] is None
    assert result["error"] == "more than 2 device events: the device view is not computed"


def test_malformed_events_are_passed_over() -> None:
    good = [_launch(1, 0), _kernel(1, 10, 5)]
    bad: list[dict[str, Any]] = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": "10", "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": -1},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": float("nan")},
        {"ph": "X", "cat": "kernel", "name": 3, "ts": 10, "dur": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 1,
         "args": {"correlation": "1"}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": True, "dur": 1},
    ]
    assert _run(good + bad)["gpu_timeline"] == _run(good)["gpu_timeline"]
