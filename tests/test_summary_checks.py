"""A summary read from a manifest is used only where it is what the reader itself would
write: every figure in range, each step's parts within its span and summing to it, the
counts agreeing. One that is not is refused, and the trace read (or, where the trace is
gone, the rank says why). A rank listed twice in a window, by two trace lines or two
summary lines that differ, is said, with which one is used and why."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from analysis_traces import make_run, write_trace
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.analysis.compare import compare_runs
from policy_engine.analysis.run import analyze
from policy_engine.analysis.summary import problem, summarize
from policy_engine.cli.main import main
from policy_engine.files.layout import MANIFEST_DIR, MANIFEST_SUFFIX
from policy_engine.runtime.process.manifest import encode

WORLD = 4


def _manifest(root: Path, rank: int) -> Path:
    return root / MANIFEST_DIR / f"node0_pid{10_000 + rank}_20261202000000{MANIFEST_SUFFIX}"


def add_summary(root: Path, rank: int, rel: str, summary: Any) -> None:
    """A summary line for rank ``rank``'s trace ``rel``, as its rank appends it."""
    line = {"event": "summary", "capture": f"{10_000 + rank}-1", "path": rel,
            "role": "trainer", "rank": rank, "status": "complete", "summary": summary,
            "kept": True, "seconds": 0.5}
    with open(_manifest(root, rank), "ab") as f:
        f.write(encode(line))


def codes(window: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in window["readiness"]:
        out.setdefault(r["code"], []).append(r["message"])
    return out


@pytest.fixture(scope="module")
def gpu_summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("t") / "g.pt.trace.json"
    write_trace(str(path), 0, 2, steps=4, ops=6, gpu=True)
    return summarize(str(path))


@pytest.fixture(scope="module")
def cpu_summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("t") / "c.pt.trace.json"
    write_trace(str(path), 0, 2, steps=4, ops=6)
    return summarize(str(path))


def _set(summary: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    forged = copy.deepcopy(summary)
    *path, last = where.split(".")
    node: Any = forged
    for key in path:
        node = node[int(key)] if key.isdigit() else node[key]
    node[last] = value
    return forged


@pytest.mark.parametrize(("where", "value", "why"), [
    ("steps.0.time_us", -138000.0, "step 0's time is negative"),
    ("steps.1.idle_us", -1.0, "step 1: a figure is negative"),
    ("steps.0.compute_us", 1e9, "step 0: a part is longer than its span"),
    ("steps.0.span_us", 1.0, "step 0's time is not its span (on the CPU they are one range)"),
    ("steps.2.idle_us", 0.0, "step 2: its parts do not sum to its span"),
    ("steps.0.overlap_us", 400.0, "step 0: its overlap is longer than its compute or its "
                                  "communication"),
    ("steps.0.step", None, "its steps and its count of ProfilerStep rows disagree"),
    ("facts.profiler_steps", 7, "its steps and its count of ProfilerStep rows disagree"),
    ("facts.kernels", 3, "its basis and its kernel counts disagree"),
    ("regions.update_actor.time_us", -5.0, "its regions are not counts and times"),
    ("facts.events", -1, "its facts lack a count"),
])
def test_a_forged_cpu_summary_is_refused(cpu_summary: dict[str, Any], where: str,
                                         value: Any, why: str) -> None:
    assert problem(cpu_summary) is None
    assert problem(_set(cpu_summary, where, value)) == why


@pytest.mark.parametrize(("where", "value", "why"), [
    ("gpu_timeline.idle_us", -3.0, "its gpu_timeline holds a figure below zero"),
    ("gpu_timeline.computation_us", 0.0, "its gpu_timeline does not add up to its total"),
    ("gpu_timeline.total_us", None, "its gpu_timeline lacks total_us"),
    ("steps.0.gpu_timeline.idle_us", 1e9, "step 0: its gpu_timeline does not add up to its "
                                          "total"),
    ("hta.compute_us", "1.0", "its device view: HTA's breakdown is not times"),
    ("facts.comm_kernels", 10 ** 6, "its basis and its kernel counts disagree"),
    ("basis", "cpu", "its basis and its kernel counts disagree"),
])
def test_a_forged_gpu_summary_is_refused(gpu_summary: dict[str, Any], where: str,
                                         value: Any, why: str) -> None:
    assert problem(gpu_summary) is None
    assert problem(_set(gpu_summary, where, value)) == why


_ANY = st.none() | st.booleans() | st.integers() | st.text(max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 2e15), st.lists(st.fixed_dictionaries({
    "ph": st.sampled_from(["X", "X", "i"]) | _ANY,
    "cat": st.sampled_from(["cpu_op", "kernel", "user_annotation", "gpu_memcpy"]),
    "name": st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", "ncclKernel_x",
                             "c10d::allreduce_", "aten::mm", "update"]),
    "ts": st.floats(0, 1e5), "dur": st.floats(0, 1e4)}), max_size=30))
def test_every_summary_the_reader_writes_passes_the_check(
        base: float, events: list[dict[str, Any]]) -> None:
    """Whatever the trace (timestamps near 0 or near today's Unix microseconds), what
    summarize returns is a summary the check accepts."""
    import tempfile

    for e in events:
        e["ts"] += base
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump({"traceEvents": events}, f)
        f.flush()
        summary = summarize(f.name)
    assert "error" in summary or problem(summary) is None


def test_a_forged_summary_is_not_used_and_said(tmp_path: Path) -> None:
    paths = make_run(str(tmp_path), WORLD, steps=6, ops=4)
    genuine = [summarize(str(tmp_path / p)) for p in paths]
    add_summary(tmp_path, 1, paths[1], _set(genuine[1], "steps.0.time_us", -138000.0))
    add_summary(tmp_path, 2, paths[2], _set(genuine[2], "steps.0.compute_us", 1e9))
    add_summary(tmp_path, 3, paths[3], genuine[3])
    os.remove(tmp_path / paths[2])
    os.remove(tmp_path / paths[3])
    (w,) = analyze(str(tmp_path))["windows"]
    ranks = {r["rank"]: r for r in w["ranks"]}
    assert ranks[1]["steps"] == genuine[1]["steps"]  # the trace, read instead
    assert min(row["time_us"] for row in ranks[1]["steps"]) > 0
    assert ranks[2]["error"] == ("its summary cannot be used (step 0: a part is longer than "
                                 "its span), and the trace cannot be read instead: missing: "
                                 "the manifest names it, but it is not on disk")
    assert ranks[3]["steps"] == genuine[3]["steps"]  # the genuine summary: no trace needed
    said = codes(w)
    assert said["summary_refused"] == ["rank 1: its summary cannot be used (step 0's time "
                                       "is negative): the trace is read instead"]
    assert [r["ranks"] for r in w["readiness"] if r["code"] == "unreadable"] == [[2]]


def test_summary_lines_that_differ_are_said(tmp_path: Path) -> None:
    paths = make_run(str(tmp_path), 2, steps=6, ops=4)
    genuine = summarize(str(tmp_path / paths[1]))
    other = _set(genuine, "regions.update_actor.time_us", 1.0)
    add_summary(tmp_path, 1, paths[1], other)
    add_summary(tmp_path, 1, paths[1], genuine)
    add_summary(tmp_path, 1, paths[1], genuine)  # the same line twice is one
    (w,) = analyze(str(tmp_path))["windows"]
    rank = next(r for r in w["ranks"] if r["rank"] == 1)
    assert rank["regions"] == genuine["regions"]  # the trace itself
    assert codes(w)["duplicate_rank"] == ["rank 1: its trace has 2 summary lines that "
                                          "differ: the trace is read instead"]
    os.remove(tmp_path / paths[1])
    (w,) = analyze(str(tmp_path))["windows"]
    rank = next(r for r in w["ranks"] if r["rank"] == 1)
    assert rank["regions"] == other["regions"]  # the first
    assert codes(w)["duplicate_rank"] == [
        "rank 1: its trace has 2 summary lines that differ, and the trace is not there to "
        "read: the first usable one (line 4 of node0_pid10001_20261202000000"
        f"{MANIFEST_SUFFIX}) is used"]


def _trace_line(root: Path, rank: int, rel: str, **fields: Any) -> None:
    line = {"event": "trace", "capture": f"{10_000 + rank}-9", "role": "trainer",
            "roles": ["trainer"], "rank": rank, "world": 2, "steps": [1], "cycle": 0,
            "status": "complete", "path": rel, "start": 50.0, **fields}
    with open(_manifest(root, rank), "ab") as f:
        f.write(encode(line))


@pytest.mark.parametrize("first", ["complete", "partial"])
def test_a_rank_with_two_traces_in_a_window_says_which_is_used(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], first: str) -> None:
    paths = make_run(str(tmp_path), 2, steps=6, ops=4, gz=False)
    if first == "partial":  # the first recorded trace of rank 1 is partial
        manifest = _manifest(tmp_path, 1)
        manifest.write_text(manifest.read_text().replace('"status": "complete", "steps"',
                                                         '"status": "partial", "steps"'))
    again = "trainer/step1/again.pt.trace.json"
    write_trace(str(tmp_path / again), 1, 2, steps=6, ops=4, compute_us=9000.0)
    _trace_line(tmp_path, 1, again)  # no backend: a torch trace by its name
    (w,) = analyze(str(tmp_path))["windows"]
    used, left = (paths[1], again) if first == "complete" else (again, paths[1])
    ones = [r for r in w["ranks"] if r["rank"] == 1]
    assert [r["path"] for r in ones if "error" not in r] == [used]
    why = "complete before partial, then the first recorded"
    assert [r["error"] for r in ones if "error" in r] == [
        f"another trace of rank 1 in this window is used instead: {used} ({why})"]
    assert codes(w)["duplicate_rank"] == [f"rank 1 has 2 traces in this window: {used} is "
                                          f"used ({why}); {left} is left out of every figure"]
    assert "unreadable" not in codes(w)
    assert all(s["ranks"] == 2 for s in w["step_times"])
    (pair,) = compare_runs(str(tmp_path), str(tmp_path)).windows
    assert pair.left_out == ()  # rank 1 takes part, by the trace used
    assert main(["analyze", str(tmp_path)]) == 0
    assert f"readiness: duplicate_rank: rank 1 has 2 traces in this window: {used}" \
        in capsys.readouterr().out


def test_two_traces_of_one_rank_in_a_folder_are_said(tmp_path: Path) -> None:
    for name, rank in (("a", 0), ("b", 1), ("c", 1)):
        write_trace(str(tmp_path / "run" / f"{name}.pt.trace.json"), rank, 2, steps=4)
    (w,) = analyze(str(tmp_path / "run"))["windows"]
    assert [r["rank"] for r in w["ranks"] if "error" not in r] == [0, 1]
    assert codes(w)["duplicate_rank"] == [
        "rank 1 has 2 traces in this window: b.pt.trace.json is used (complete before "
        "partial, then the first recorded); c.pt.trace.json is left out of every figure"]
