"""Summaries at the edge: the rank that recorded a torch trace appends its summary to the
manifest, made by a worker process (runtime.process.summaries, analysis.summarize_main), one line
per trace, whatever the worker does; the reader takes every summary line as hostile."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from analysis_traces import write_trace

from policy_engine import Topology, profile_session
from policy_engine.analysis import summarize
from policy_engine.analysis.manifests import MAX_LINE_BYTES, parse_line, scan_manifests
from policy_engine.analysis.summary import problem
from policy_engine.files.layout import MANIFEST_SUFFIX
from policy_engine.files.records import summary_line, trace_line
from policy_engine.runtime.process import manifest, summaries

ROOT = Path(__file__).resolve().parent.parent
IDENTITY = {"role": "trainer", "rank": 0, "world": 1, "backend": "torch", "pid": 4242}


def records(out: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(out)).records if r["event"] == event]


def run_loop(policy: dict[str, Any], steps: tuple[int, ...] = (1, 2),
             fail_at: int | None = None) -> None:
    prof = profile_session(policy, "actor", Topology())
    model = torch.nn.Linear(32, 32)
    for n in steps:
        try:
            with prof.training_step(n):
                for _ in range(3):
                    model(torch.randn(4, 32)).sum().backward()
                    prof.step()
                if n == fail_at:
                    raise RuntimeError("a step that fails")
        except RuntimeError:
            pass
    prof.close()
    assert summaries.wait(60)


def hand_over(out: Path, name: str, data: bytes, *, keep: str = "traces") -> dict[str, Any]:
    """A file written as a torch trace and its trace line, handed to the summary worker as
    the runtime hands one over; the trace line."""
    full = out / "trainer" / name
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)
    line = trace_line(IDENTITY, capture="4242-1", status="complete",
                      path=f"trainer/{name}", bytes=len(data), steps=[1], end=time.time())
    manifest.append(str(out), line)
    summaries.order(str(out), line, str(full), keep=keep, budget=None)
    assert summaries.wait(60)
    return line


@pytest.mark.parametrize("mode", ["background", "sync"])
def test_each_torch_trace_gets_its_summary_line(make_policy: Any, tmp_path: Path,
                                                mode: str) -> None:
    out = tmp_path / "out"
    run_loop(make_policy(steps=[1, 2], export={"mode": mode}), fail_at=2)
    scan = scan_manifests(str(out))
    assert scan.problems == ()
    traces = [r for r in scan.records if r["event"] == "trace"]
    found = [r for r in scan.records if r["event"] == "summary"]
    assert sorted(r["status"] for r in traces) == ["complete", "partial"]
    # One summary per trace, naming it as its trace line does, equal to a summary made
    # here from the file.
    assert sorted((r["capture"], r["path"]) for r in found) == \
        sorted((r["capture"], r["path"]) for r in traces)
    for line in found:
        assert line["status"] == "complete" and line["kept"] is True
        assert line["role"] == "actor" and line["rank"] == 0
        assert 0 < line["seconds"] < 60 and "error" not in line
        assert line["summary"] == summarize(str(out / line["path"]))
        assert line["summary"]["basis"] == "cpu" and line["summary"]["steps"]


def test_no_summary_for_what_is_no_torch_trace(make_policy: Any, tmp_path: Path) -> None:
    from policy_engine.testing import recording_backend

    with recording_backend():
        run_loop(make_policy(steps=[1]))
    assert records(tmp_path / "out", "trace") and not records(tmp_path / "out", "summary")


def test_a_corrupt_trace_gives_a_failed_summary_and_stays(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": 1, "dur"')
    line = hand_over(out, "bad.pt.trace.json.gz", data, keep="summaries")
    [trace] = records(out, "trace")
    [found] = records(out, "summary")
    assert {k: v for k, v in trace.items() if not k.startswith("_")} == line
    assert found["status"] == "failed" and found["kept"] is True
    assert "summary" not in found and found["error"]
    assert found["error"] == summarize(str(out / line["path"]))["error"]
    assert (out / line["path"]).read_bytes() == data


def test_a_summary_too_large_is_trimmed_cut_then_refused(tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    out = tmp_path / "out"
    # Sixteen regions with long names: over 64 KiB, trimmed to the top four.
    events = [{"ph": "X", "cat": "user_annotation", "name": f"r{i}" + "x" * 6000, "ts": 10 * i,
               "dur": 100 - i, "pid": 1, "tid": 1} for i in range(16)]
    data = json.dumps({"traceEvents": events}).encode()
    hand_over(out, "long.pt.trace.json", data)
    [found] = records(out, "summary")
    whole = summarize(str(out / "trainer" / "long.pt.trace.json"))
    assert found["status"] == "complete" and "64 KiB" in found["trimmed"]
    assert list(found["summary"]["regions"]) == list(whole["regions"])[:4]
    assert found["summary"]["steps"] == whole["steps"]
    # Steps past what a line may hold even trimmed (here 16 KiB, 200 steps): the worker
    # keeps the first ones that fit and counts the others.
    monkeypatch.setattr(summaries, "MAX_SUMMARY_BYTES", 8 << 10)
    monkeypatch.setattr(summaries, "MAX_KEPT_BYTES", 16 << 10)
    path = out / "trainer" / "many.pt.trace.json"
    write_trace(str(path), 0, 1, steps=200, ops=1, comm=None)
    hand_over(out, path.name, path.read_bytes())
    [cut] = [r for r in records(out, "summary") if r["path"].endswith("many.pt.trace.json")]
    whole = summarize(str(path))
    kept = cut["summary"]["steps"]
    assert (cut["status"], cut["kept"]) == ("complete", True) and 0 < len(kept) < 200
    assert kept == whole["steps"][:len(kept)]
    assert cut["summary"]["facts"]["steps_left_out"] == 200 - len(kept)
    assert f"steps past the first {len(kept)} were left out" in cut["trimmed"]
    assert len(json.dumps(cut["summary"])) <= 16 << 10 and problem(cut["summary"]) is None
    # Four region names of 6,000 characters are more than a 16 KiB line: refused.
    hand_over(out, "long2.pt.trace.json", data)
    [failed] = [r for r in records(out, "summary") if r["path"].endswith("long2.pt.trace.json")]
    assert (failed["status"], failed["kept"]) == ("failed", True)
    assert "over the 16 KiB a manifest line may hold" in failed["error"]


CHILD = textwrap.dedent("""\
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    from analysis_traces import write_trace
    from policy_engine.files.records import trace_line
    from policy_engine.runtime.process import manifest, signals, summaries
    out, how = sys.argv[1], sys.argv[2]
    summaries.EXIT_WAIT = 0.0
    signals.install()  # as the first capture does
    path = os.path.join(out, "big.pt.trace.json")
    size = write_trace(path, 0, 1, steps=200, ops=100)
    line = trace_line({{"role": "trainer", "rank": 0}}, capture="1-1", status="complete",
                      path="big.pt.trace.json", bytes=size)
    manifest.append(out, line)
    summaries.order(out, line, path, keep="summaries", budget=None)
    pool = summaries.pool()
    while True:
        with pool.cond:
            started = [job.proc.pid for job in pool.running if job.proc is not None]
        if started:
            break
        time.sleep(0.001)
    print(started[0], flush=True)
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
""")


@pytest.mark.parametrize("how", ["exit", "sigterm"])
def test_a_summary_under_way_at_exit_is_cut(tmp_path: Path, how: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(ROOT / "tests")))
    done = subprocess.run([sys.executable, str(script), str(out), how], capture_output=True,
                          text=True, timeout=60)
    expected = -signal.SIGTERM if how == "sigterm" else 0
    assert done.returncode == expected, done.stderr
    worker = int(done.stdout.split()[0])
    [found] = records(out, "summary")
    assert found["status"] == "cut" and found["kept"] is True
    assert found["error"].startswith("cut short by exit")
    assert (out / "big.pt.trace.json").exists()  # a cut summary never costs its trace
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
        time.sleep(0.05)  # killed, then reaped by init once its parent is gone
    assert not os.path.exists(f"/proc/{worker}")


def test_the_worker_prints_one_line_and_imports_no_torch(tmp_path: Path) -> None:
    path = tmp_path / "t.pt.trace.json.gz"
    write_trace(str(path), 0, 1, steps=2, ops=4)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", summaries.WORKER,
                           str(path)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0
    assert json.loads(done.stdout) == {"summary": summarize(str(path))}
    assert done.stdout.count("\n") == 1
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()}
    assert "torch" not in imported and "policy_engine.runtime" not in imported
    missing = subprocess.run([sys.executable, "-m", summaries.WORKER, str(tmp_path / "no")],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 0 and "error" in json.loads(missing.stdout)
    usage = subprocess.run([sys.executable, "-m", summaries.WORKER], capture_output=True,
                           text=True, env=env, timeout=60)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    # A worker whose parent is gone (here: never was its parent) stops, printing nothing.
    orphan = subprocess.run([sys.executable, "-m", summaries.WORKER, str(path), "--parent",
                             "1"], capture_output=True, text=True, env=env, timeout=60)
    assert (orphan.returncode, orphan.stdout) == (3, "")


@pytest.mark.parametrize(("line", "why"), [
    (summary_line(IDENTITY, capture="1-1", path="a.pt.trace.json.gz", status="done",
                  kept=True, seconds=1.0), "status: expected one of complete, failed, cut"),
    (summary_line(IDENTITY, capture="1-1", path="a.pt.trace.json.gz", status="complete",
                  summary=[1, 2], kept=True, seconds=1.0), "summary: expected an object"),
    (summary_line(IDENTITY, capture="1-1", path="a.pt.trace.json.gz", status="complete",
                  kept="yes", seconds=1.0), "kept: expected true or false"),
    (summary_line(IDENTITY, capture="1-1", path="a.pt.trace.json.gz", status="complete",
                  kept=True, seconds=-1), "seconds: expected a number of seconds"),
    ({"event": "summary", "capture": "1-1", "status": "complete"},
     r"path: missing \(every summary record has one\)"),
])
def test_a_bad_summary_line_is_refused_by_the_reader(line: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_line(manifest.encode(line).rstrip(b"\n"))


def test_hostile_summary_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "manifests").mkdir(parents=True)
    good = summary_line(IDENTITY, capture="1-1", path="a.pt.trace.json.gz", status="failed",
                        error="no", kept=True, seconds=0.5)
    huge = dict(good, status="complete", summary={"regions": {"x" * MAX_LINE_BYTES: {}}})
    nested = b'{"event": "summary", "capture": "1", "path": "a", "status": "complete", ' \
             b'"summary": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with open(out / "manifests" / f"h_pid1_1{MANIFEST_SUFFIX}", "wb") as f:
        f.write(manifest.encode(huge) + nested + b"\n" + manifest.encode(good))
    scan = scan_manifests(str(out))
    assert [r["status"] for r in scan.records] == ["failed"]
    assert [(p.line, p.why.split(":")[0]) for p in scan.problems] == [
        (1, f"longer than {MAX_LINE_BYTES} bytes"), (2, "not JSON")]
