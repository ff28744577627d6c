"""policy-engine analyze on generated runs: step times, the straggler, where the time goes
on CPU- and GPU-shaped traces, readiness warnings, why each capture exists, and the JSON
shape against schemas/analysis.schema.json."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from analysis_traces import NCCL, TRANSFER_US, make_run, make_summarised_run, write_trace
from hypothesis import given
from hypothesis import strategies as st
from job_env import plain_sigterm

from policy_engine.analysis.intervals import Spans, intersect, length, union
from policy_engine.analysis.run import analyze
from policy_engine.cli.main import main
from policy_engine.runtime.process.manifest import encode

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" /
                     "analysis.schema.json").read_text())


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["analyze", *args])
    return code, out.getvalue(), err.getvalue()


def codes(window: dict[str, Any]) -> dict[str, list[int]]:
    return {r["code"]: r["ranks"] for r in window["readiness"]}


def test_cpu_straggler_is_named_with_how_late_it_arrives(tmp_path: Path) -> None:
    make_run(str(tmp_path), 4, windows=2, slow=2, extra_us=3000.0)
    code, out, _ = cli(str(tmp_path), "--format", "json", "--jobs", "1")
    assert code == 0
    result = json.loads(out)
    jsonschema.validate(result, SCHEMA)
    assert [w["title"] for w in result["windows"]] == ["trainer, step 1, cycle 0",
                                                       "trainer, step 2, cycle 0"]
    for w in result["windows"]:
        s = w["straggler"]
        assert s["rank"] == 2 and s["steps"] == [0, 1, 2] and s["of_steps"] == 3
        assert s["late_us"] == pytest.approx(3000.0, abs=1)
        # the others wait longer in all-reduce: 3 ms more per step
        assert s["others_wait_us"]["min"] - s["wait_us"] == pytest.approx(9000.0, abs=5)
        by_rank = {r["rank"]: r for r in w["ranks"]}
        assert by_rank[2]["total"]["compute_us"] > by_rank[0]["total"]["compute_us"]
        assert [row["straggler"] for row in w["step_times"]] == [2, 2, 2]
        assert by_rank[0]["basis"] == "cpu" and by_rank[0]["gpu_timeline"] is None
        assert list(codes(w)) == ["no_kernels"]


def test_balanced_ranks_name_no_straggler(tmp_path: Path) -> None:
    make_run(str(tmp_path), 4, windows=1)
    (w,) = analyze(str(tmp_path))["windows"]
    assert w["straggler"] is None
    assert all(row["straggler"] is None for row in w["step_times"])
    assert w["step_times"][0]["time_us"]["min"] == w["step_times"][0]["time_us"]["max"]


def test_a_rank_late_without_the_compute_to_show_for_it_is_not_named(tmp_path: Path) -> None:
    # Rank 1 arrives late in every step, but its operators took no longer: it was
    # descheduled (idle), not slow at its work.
    make_run(str(tmp_path), 4, windows=1, slow=1, extra_us=3000.0, idle=True)
    (w,) = analyze(str(tmp_path))["windows"]
    assert [row["late_us"] for row in w["step_times"]] == [pytest.approx(3000.0, abs=1)] * 3
    assert w["straggler"] is None


def test_gpu_shaped_traces_measure_kernels(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2, windows=1, gpu=True, slow=1, extra_us=2000.0, ops=40)
    (w,) = analyze(str(tmp_path), jobs=2)["windows"]
    ranks = {r["rank"]: r for r in w["ranks"]}
    assert w["straggler"]["rank"] == 1
    for r in ranks.values():
        assert r["basis"] == "gpu"
        for row in r["steps"]:
            parts = row["compute_us"] + row["comm_us"] - row["overlap_us"] + row["other_us"] \
                + row["idle_us"]
            assert parts == pytest.approx(row["span_us"], abs=0.01)
        device = r["gpu_timeline"]  # the device view: TraceLens's six figures
        assert device["exposed_comm_us"] > 0
        assert device["computation_us"] + device["exposed_comm_us"] + \
            device["exposed_memcpy_us"] + device["idle_us"] == pytest.approx(
                device["total_us"], abs=0.01)
        assert r["hta"]["overlap_us"] == 0 and r["hta"]["comm_us"] > 0
    # rank 0 waits 2 ms longer in the NCCL kernel each step, plus the transfer both pay
    # (exposed: no compute runs beside it); HTA leaves the last of the 3 steps out
    exposed = {rank: r["gpu_timeline"]["exposed_comm_us"] for rank, r in ranks.items()}
    assert exposed[0] - exposed[1] == pytest.approx(3 * 2000.0, abs=1)
    assert exposed[1] == pytest.approx(3 * (TRANSFER_US - 10), abs=1)
    assert ranks[0]["hta"]["comm_us"] - ranks[1]["hta"]["comm_us"] == pytest.approx(
        2 * 2000.0, abs=1)
    assert w["gpu_timeline"]["total_us"]["max"] > 0
    assert all(row["gpu_timeline"] for row in w["step_times"])
    assert "no_kernels" not in codes(w)
    jsonschema.validate(analyze(str(tmp_path)), SCHEMA)


def test_cpu_only_traces_warn_before_hta_is_tried(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2)
    (w,) = analyze(str(tmp_path))["windows"]
    warning = next(r for r in w["readiness"] if r["code"] == "no_kernels")
    assert "IndexError" in warning["message"]


def test_traces_without_profiler_steps_are_one_step_each(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2, profiler_steps=False)
    (w,) = analyze(str(tmp_path))["windows"]
    assert codes(w)["no_profiler_steps"] == [0, 1]
    assert [row["step"] for row in w["step_times"]] == [None]
    assert w["ranks"][0]["facts"]["profiler_steps"] == 0


def test_a_window_missing_a_rank_says_which(tmp_path: Path) -> None:
    make_run(str(tmp_path), 4, windows=2, missing={2: [3]})
    first, second = analyze(str(tmp_path))["windows"]
    assert "ranks_missing" not in codes(first)
    assert codes(second)["ranks_missing"] == [3]
    assert [r["rank"] for r in second["ranks"]] == [0, 1, 2]


def test_traces_without_distributed_info(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2, distributed_info=False)
    (w,) = analyze(str(tmp_path))["windows"]
    assert codes(w)["no_distributed_info"] == [0, 1]


@pytest.mark.parametrize(("kernel", "says"), [
    ("hcclAllReduce_f32", "hcclAllReduce_f32"),
    ("cross_device_reduce_1stage<float>", "look like collectives"),
])
def test_collective_kernels_hta_does_not_recognise(tmp_path: Path, kernel: str,
                                                   says: str) -> None:
    make_run(str(tmp_path), 2, gpu=True, comm_kernel=kernel)
    (w,) = analyze(str(tmp_path))["windows"]
    warning = next(r for r in w["readiness"] if r["code"] == "collective_kernels_unrecognised")
    assert says in warning["message"] and warning["ranks"] == [0, 1]


def test_nccl_kernels_need_no_warning(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2, gpu=True, comm_kernel=NCCL)
    (w,) = analyze(str(tmp_path))["windows"]
    assert codes(w) == {}


def test_an_unreadable_trace_is_reported_not_raised(tmp_path: Path) -> None:
    (first, _second) = make_run(str(tmp_path), 2)
    (tmp_path / first).write_bytes(b'{"traceEvents": [{"ph": "X", ')
    code, out, _ = cli(str(tmp_path), "--format", "json")
    assert code == 0
    (w,) = json.loads(out)["windows"]
    assert "truncated" in w["ranks"][0]["error"]
    assert set(codes(w)) >= {"unreadable", "single_rank"}
    jsonschema.validate(json.loads(out), SCHEMA)


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p.unlink(), "missing: the manifest names it, but it is not on disk"),
    (lambda p: (p.unlink(), os.mkfifo(p)), "not a regular file (a folder, a FIFO or a device"),
    (lambda p: (p.unlink(), p.mkdir()), "not a regular file (a folder, a FIFO or a device"),
])
def test_a_trace_that_is_gone_or_no_file_says_which(tmp_path: Path, make: Any,
                                                    says: str) -> None:
    (first, _second) = make_run(str(tmp_path), 2)
    make(tmp_path / first)
    (w,) = analyze(str(tmp_path))["windows"]
    (warning,) = [r for r in w["readiness"] if r["code"] == "unreadable"]
    assert says in warning["message"] and warning["ranks"] == [0]


def test_why_each_capture_exists(tmp_path: Path) -> None:
    make_run(str(tmp_path / "a"), 2, trigger="on_demand", request="r-20261202-1")
    (w,) = analyze(str(tmp_path / "a"))["windows"]
    assert w["why"] == {"trigger": "on_demand", "request": "r-20261202-1"}
    slow = {"note": "slow_step", "step": 0, "seconds": 2.5, "median": 0.5, "captures": [1],
            "rank": 1}
    limit = {"note": "limit", "message": "limits.captures: 1 captures recorded: no new "
             "capture begins", "rank": 0}
    make_run(str(tmp_path / "b"), 2, trigger="slow_step", notes=[slow, limit])
    code, out, _ = cli(str(tmp_path / "b"))
    assert code == 0
    assert "a slow step: rank 1 took 2.5 s at step 0 (median 0.5 s)" in out
    assert "limits.captures: 1 captures recorded" in out


def test_choosing_windows(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2, windows=3)
    code, out, _ = cli(str(tmp_path), "--step", "2")
    assert code == 0 and "== trainer, step 2" in out and "step 1," not in out
    code, _, err = cli(str(tmp_path), "--role", "trainr")
    assert code == 2 and "no role 'trainr'" in err and "trainer" in err
    code, _, err = cli(str(tmp_path), "--step", "9")
    assert code == 2 and "the steps captured are 1-3" in err
    code, _, err = cli(str(tmp_path / "nowhere"))
    assert code == 2 and "not a folder" in err


def test_jobs_do_not_change_the_answer(tmp_path: Path) -> None:
    make_run(str(tmp_path), 6, windows=2, slow=4, extra_us=2500.0)
    assert analyze(str(tmp_path), jobs=1) == analyze(str(tmp_path), jobs=3)


def test_a_folder_without_manifests_is_read_as_torch_writes_it(tmp_path: Path) -> None:
    for rank in range(3):
        write_trace(str(tmp_path / "run" / f"worker{rank}.pt.trace.json"), rank, 3,
                    slow=0, extra_us=4000.0)
    (w,) = analyze(str(tmp_path))["windows"]
    assert w["why"] is None and w["straggler"]["rank"] == 0
    assert sorted(r["rank"] for r in w["ranks"]) == [0, 1, 2] and w["world"] == 3


def test_text_names_the_straggler(tmp_path: Path) -> None:
    make_run(str(tmp_path), 4, slow=3, extra_us=3000.0)
    code, out, _ = cli(str(tmp_path))
    assert code == 0
    assert "STRAGGLER: rank 3 in 3 of 3 steps: arrives 3.0 ms after the median rank" in out
    assert "<- straggler" in out and "captured because of the policy's plan" in out


def test_text_lists_profiler_steps_without_the_trailing_empty_one(tmp_path: Path) -> None:
    # ProfilerStep#0-2 are the work; #3 is the 0.1 ms stretch torch opens at the last
    # step() call, which the step table leaves out (the rank's totals still count it).
    make_run(str(tmp_path), 2, trailing=True)
    (w,) = analyze(str(tmp_path))["windows"]
    assert [row["step"] for row in w["step_times"]] == [0, 1, 2]
    assert [row["step"] for row in w["ranks"][0]["steps"]] == [0, 1, 2, 3]
    code, out, _ = cli(str(tmp_path))
    assert code == 0
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if "min / median / max" in line)
    assert lines[at].split()[:2] == ["profiler", "step"]
    assert [line.split()[0] for line in lines[at + 1:at + 5]] == ["0", "1", "2", "rank"]


def test_a_short_last_step_of_a_short_capture_is_kept(tmp_path: Path) -> None:
    # With two steps there is no median of the others to call the last one empty by.
    make_run(str(tmp_path), 2, steps=1, trailing=True)
    (w,) = analyze(str(tmp_path))["windows"]
    assert [row["step"] for row in w["step_times"]] == [0, 1]


def test_gpu_shaped_traces_agree_with_hta(tmp_path: Path) -> None:
    # Generated kernels, not a GPU run (tests/test_analyze_cuda.py is that): whole
    # microseconds, since HTA rounds each kernel down to one.
    pytest.importorskip("hta.trace_analysis")
    make_run(str(tmp_path), 2, gpu=True, ops=30, compute_us=6000.0, slow=1, extra_us=3000.0,
             trailing=True, gz=False)
    with plain_sigterm():  # HTA's fork pool, in this process
        code, out, _ = cli(str(tmp_path), "--hta", "--format", "json")
    assert code == 0
    (w,) = json.loads(out)["windows"]
    jsonschema.validate(json.loads(out), SCHEMA)
    assert w["hta"]["error"] is None
    theirs = {row["rank"]: row for row in w["hta"]["ranks"]}
    for r in w["ranks"]:
        ours, hta = r["hta"], theirs[r["rank"]]  # our HTA figures, and HTA's own
        assert ours["compute_us"] == pytest.approx(hta["compute_us"], abs=0.01)
        assert ours["idle_us"] == pytest.approx(hta["idle_us"], abs=0.01)
        assert ours["non_compute_us"] == pytest.approx(hta["non_compute_us"], abs=0.01)
        assert ours["kernel_us"] == pytest.approx(hta["kernel_us"], abs=0.01)
        assert hta["overlap_pct"] == 0 and ours["overlap_pct"] == 0


def test_hta_flag_without_kernels_says_why(tmp_path: Path) -> None:
    pytest.importorskip("hta.trace_analysis")
    make_run(str(tmp_path), 2)
    code, out, _ = cli(str(tmp_path), "--hta", "--format", "json")
    assert code == 0
    (w,) = json.loads(out)["windows"]
    assert w["hta"]["error"] == "not run: the window holds no GPU kernels"


def test_many_ranks_keep_the_text_short(tmp_path: Path) -> None:
    make_run(str(tmp_path), 40, ops=4, slow=7, extra_us=3000.0)
    code, out, _ = cli(str(tmp_path), "--jobs", "2")
    assert code == 0 and "(5 of 40 ranks with the most compute)" in out
    assert len(out.splitlines()) < 40 and "STRAGGLER: rank 7" in out


# -- intervals -----------------------------------------------------------------------

_pairs = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 50)), max_size=40)


def _covered(pairs: list[tuple[int, int]], lo: int = 0, hi: int = 10**6) -> set[int]:
    return {t for s, d in pairs for t in range(max(s, lo), min(s + d, hi))}


@given(_pairs, _pairs, st.integers(0, 250), st.integers(0, 250))
def test_intervals_count_time_once(a: list[tuple[int, int]], b: list[tuple[int, int]],
                                   lo: int, hi: int) -> None:
    def merged(pairs: list[tuple[int, int]]) -> Any:
        spans = Spans()
        for s, d in pairs:
            spans.add(float(s), float(s + d))
        return spans.merged()
    ma, mb = merged(a), merged(b)
    assert length(ma) == len(_covered(a))
    assert length(ma, lo, hi) == len(_covered(a, lo, hi))
    assert length(union(ma, mb)) == len(_covered(a) | _covered(b))
    assert length(intersect(ma, mb)) == len(_covered(a) & _covered(b))



def test_analyze_never_imports_torch(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2)
    script = ("import sys, contextlib, io\nfrom policy_engine.cli.main import main\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n"
              f"    assert main(['analyze', {str(tmp_path)!r}, '--jobs', '1']) == 0\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_window_of_other_backends_says_there_is_nothing_to_analyse(tmp_path: Path) -> None:
    record = {"event": "trace", "capture": "1-1", "role": "rollout", "roles": ["rollout"],
              "rank": 0, "world": 1, "steps": [3], "cycle": 0, "status": "complete",
              "backend": "nsight", "path": "rollout/step3/r.nsys-rep", "start": 1.0}
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "h_pid1_20261202000000.manifest.jsonl").write_bytes(
        encode(record))
    result = analyze(str(tmp_path))
    jsonschema.validate(result, SCHEMA)
    (w,) = result["windows"]
    assert codes(w) == {"no_torch_traces": []} and "nsight" in w["readiness"][0]["message"]


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


_ANY = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) \
    | st.text(max_size=4) | st.lists(st.integers(), max_size=2)


@given(st.lists(st.fixed_dictionaries({
    "ph": st.sampled_from(["X", "M", "i"]) | _ANY,
    "cat": st.sampled_from(["cpu_op", "kernel", "user_annotation", "gpu_memcpy"]) | _ANY,
    "name": st.sampled_from(["ProfilerStep#1", "ncclKernel_x", "c10d::allreduce_", "aten::mm",
                             "update"]) | _ANY,
    "ts": st.floats(0, 1e6) | _ANY, "dur": st.floats(0, 1e4) | _ANY}), max_size=30))
def test_any_events_give_a_summary_never_an_exception(events: list[dict[str, Any]]) -> None:
    import tempfile

    from policy_engine.analysis.summary import summarize
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump({"traceEvents": events}, f)
        f.flush()
        summary = summarize(f.name)
    assert "error" in summary or summary["facts"]["events"] == len(events)
    json.dumps(summary, allow_nan=False)  # no NaN or infinity reaches the output


def test_a_trace_named_outside_the_folder_is_not_read(tmp_path: Path) -> None:
    write_trace(str(tmp_path / "elsewhere" / "secret.pt.trace.json"), 0, 1)
    record = {"event": "trace", "capture": "1-1", "role": "trainer", "rank": 0, "world": 1,
              "steps": [1], "cycle": 0, "status": "complete", "backend": "torch",
              "path": "../../elsewhere/secret.pt.trace.json", "start": 1.0}
    (tmp_path / "run" / "manifests").mkdir(parents=True)
    (tmp_path / "run" / "manifests" / "h_pid1_20261202000000.manifest.jsonl").write_bytes(
        encode(record))
    (w,) = analyze(str(tmp_path / "run"))["windows"]
    assert w["ranks"][0]["error"] == "outside the folder analysed: not read"


def test_a_rank_captured_for_another_reason_is_said(tmp_path: Path) -> None:
    make_run(str(tmp_path), 2, ranks=[0])
    make_run(str(tmp_path), 2, ranks=[1], trigger="on_demand", request="r-7")
    code, out, _ = cli(str(tmp_path))
    assert code == 0
    assert "captured because of the policy's plan (rank 1: on demand (request r-7))" in out


def _faulty(real: Any, how: str) -> Any:
    """``summarize`` with a fault of the reader on rank 1's trace (no trace is known to
    trip one: the faults are made here): an exception, or the process ending at once."""
    def summarize(path: str, **options: Any) -> dict[str, Any]:
        if "rank1-" in os.path.basename(path):
            if how == "raises":
                raise KeyError("\x1b[2Jsomething the reader did not expect")
            os._exit(9)
        return real(path, **options)  # type: ignore[no-any-return]
    return summarize


@pytest.mark.parametrize(("how", "jobs"), [("raises", 1), ("raises", 2), ("dies", 2)])
def test_a_fault_reading_one_trace_makes_only_its_rank_unreadable(
        tmp_path: Path, monkeypatch: Any, how: str, jobs: int) -> None:
    import multiprocessing

    from policy_engine.analysis import run

    if jobs > 1 and multiprocessing.get_start_method() != "fork":
        pytest.skip("the fault is patched in here, and reaches workers by fork only")
    make_run(str(tmp_path), 4, steps=4, ops=4)
    monkeypatch.setattr(run, "summarize", _faulty(run.summarize, how))
    (w,) = analyze(str(tmp_path), jobs=jobs)["windows"]
    errors = {r["rank"]: r.get("error") for r in w["ranks"]}
    assert [rank for rank, error in errors.items() if error] == [1]
    assert errors[1] == ("reading it failed unexpectedly: KeyError: '\\x1b[2Jsomething the "
                         "reader did not expect'" if how == "raises" else
                         "the process reading it ended abruptly (BrokenProcessPool: A "
                         "process in the process pool was terminated abruptly while the "
                         "future was running or pending.)")
    assert codes(w)["unreadable"] == [1]


def test_gpu_shaped_collectives_are_matched_across_ranks(tmp_path: Path) -> None:
    """NCCL kernels carrying their call (as torch writes them): each all-reduce matched
    across the ranks by (group, number); the slow rank arrives last at every call and
    waits nothing; the others wait its extra time; the group's bus bandwidth is NCCL-tests'
    (allreduce: 2(n-1)/n times bytes over the transfer)."""
    make_run(str(tmp_path), 4, windows=1, gpu=True, slow=1, extra_us=2000.0, ops=40)
    code, out, _ = cli(str(tmp_path), "--format", "json")
    assert code == 0
    result = json.loads(out)
    jsonschema.validate(result, SCHEMA)
    (w,) = result["windows"]
    calls = w["collectives"]
    assert calls["calls"]["matched"] == 3 and calls["calls"]["incomplete"] == 0
    ranks = calls["ranks"]
    assert ranks["1"]["last"] == 3 and ranks["1"]["wait_us"] == pytest.approx(0, abs=1)
    for rank in ("0", "2", "3"):
        assert ranks[rank]["wait_per_step_us"] == pytest.approx(2000.0, abs=5)
    (group,) = calls["groups"]
    table = calls["calls"]["table"]
    transfer = table["transfer_us"][0]
    expected = (1 << 20) * 4 / transfer / 1e3 * 2 * 3 / 4  # bytes/µs -> GB/s, x 2(n-1)/n
    assert group["busbw_gbps"] == pytest.approx(expected, rel=1e-3)
    assert all(r["collectives"]["listed"] == 3 for r in w["ranks"])  # a digest per rank
    code, text, _ = cli(str(tmp_path))
    assert "collectives: 3 of 3 calls matched" in text and "bus bandwidth" in text


def test_forged_collectives_stay_bounded_and_are_said(tmp_path: Path) -> None:
    """A summary listing more calls than any summary does has its calls refused by their
    count alone (the window says why; the rank's other figures stand); one of a million
    calls is a manifest line too long to read: reported, never loaded."""
    make_summarised_run(str(tmp_path), 4, steps=3, ops=20, gpu=True)
    manifests = sorted((tmp_path / "manifests").iterdir())
    lines = manifests[0].read_text().splitlines()
    forged = []
    for line in lines:
        record = json.loads(line)
        if record["event"] == "summary":
            calls = record["summary"]["collectives"]["calls"]
            for key in calls:
                calls[key] = calls[key][:1] * 5000
        forged.append(json.dumps(record))
    manifests[0].write_text("\n".join(forged) + "\n")
    lines = manifests[1].read_text().splitlines()
    forged = []
    for line in lines:
        record = json.loads(line)
        if record["event"] == "summary":
            record["summary"]["collectives"]["calls"]["start"] = [0.0] * 1_000_000
        forged.append(json.dumps(record))
    manifests[1].write_text("\n".join(forged) + "\n")
    (w,) = analyze(str(tmp_path))["windows"]
    said = {r["code"]: r for r in w["readiness"]}
    assert "lists 5,000 calls" in said["collectives_unreadable"]["message"]
    assert said["collectives_unreadable"]["ranks"] == [0]
    assert "missing" in said["unreadable"]["message"]  # rank 1: its line was not read
    assert said["unreadable"]["ranks"] == [1]
    assert 0 in [r["rank"] for r in w["ranks"] if "steps" in r]  # its figures stand
    result = analyze(str(tmp_path))
    assert any("longer than" in p for p in result["problems"])
    # ranks 2 and 3 listed the calls of a group of 4: none is matched, and that is said
    assert w["collectives"]["calls"]["matched"] == 0
    assert w["collectives"]["calls"]["incomplete"] == 3
    assert any("not listed by every rank" in p for p in w["collectives"]["problems"])
