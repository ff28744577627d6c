"""Nothing lost without a word: kill -9 and SIGTERM at the worst moments, on real torch.

A child process profiles with torch.profiler; the test kills it mid-capture or in the
middle of writing a trace, then asks ``policy-engine traces`` what the folder holds. A
save in the child holds its whole temporary file and waits, before it publishes it, until
the engine has seen a signal: SIGTERM always lands inside the save, however loaded the
machine, and nothing waits a fixed time.
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from policy_engine.cli.main import main

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

CHILD = """
import sys, time, torch
from policy_engine import Topology, profile_session
from policy_engine.backends import torch as torch_backend
from policy_engine.runtime.process.state import STATE

out, when, mode, shape = sys.argv[1:5]
writer = torch_backend._write_trace

def seen() -> bool:  # the engine's SIGTERM handler has run, or holds the signal for later
    return STATE.hooks.terminating or STATE.hooks.pending_signal is not None

def slow_write(finished, path, *, gz):
    writer(finished, path, gz=gz)  # the temporary file is whole now, not yet published
    print("saving", flush=True)
    deadline = time.monotonic() + 120  # the kill -9 tests never signal
    while not seen() and time.monotonic() < deadline:
        time.sleep(0.01)

torch_backend._write_trace = slow_write
role = {"enabled": True, "steps": [1], "ranks": [3], "name": "<role>_step<step>_c<cycle>",
        "torch": {"activities": ["cpu"]}, "export": {"mode": mode}}
if shape == "cycles":
    role["schedule"] = {"active": 2, "repeat": 2}
policy = {"version": 1, "output_dir": out, "roles": {"actor": role}}
prof = profile_session(policy, "actor", Topology(rank=3, world=4))
with prof.training_step(1):  # "whole": saved as the step ends, in Capture.end()
    for i in range(100000 if shape == "cycles" else 20):
        torch.ones(32, 32) @ torch.ones(32, 32)
        if i == 1 and when == "recording":
            print("recording", flush=True)
            time.sleep(30)
        prof.step()
"""


def start(out: Path, when: str, mode: str = "background",
          shape: str = "cycles") -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(out), when, mode, shape],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.time() + 120
    while True:
        line = proc.stdout.readline()
        if line.strip() in ("recording", "saving"):
            return proc
        assert line and time.time() < deadline, proc.stderr.read() if proc.stderr else ""


def traces(out: Path, capsys: Any) -> tuple[dict[str, Any], str]:
    assert main(["traces", str(out), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["traces", str(out)]) == 0
    return data, capsys.readouterr().out


def test_kill_9_while_recording_is_reported_as_interrupted(tmp_path: Path, capsys: Any) -> None:
    proc = start(tmp_path, "recording")
    proc.kill()
    proc.wait(timeout=60)
    data, text = traces(tmp_path, capsys)
    [lost] = data["interrupted"]
    assert (lost["role"], lost["rank"], lost["steps"], lost["status"]) == (
        "actor", 3, [1], "interrupted")
    assert "actor  -       3     1      -      interrupted" in text
    assert "(the process ended before the capture closed)" in text
    assert "0 traces (none), 1 capture interrupted" in text


def test_kill_9_while_saving_leaves_a_leftover_and_an_interrupted_capture(
        tmp_path: Path, capsys: Any) -> None:
    proc = start(tmp_path, "save")
    proc.kill()
    proc.wait(timeout=60)
    data, text = traces(tmp_path, capsys)
    assert [(c["role"], c["steps"]) for c in data["interrupted"]] == [("actor", [1])]
    [leftover] = data["leftovers"]
    assert leftover.startswith(".policy-engine-") and ".tmp" in leftover
    assert f"leftover: {leftover} (an interrupted save; safe to delete)" in text
    assert not list(tmp_path.glob("actor_*"))  # no empty or half trace under a final name


def test_sigterm_while_saving_finishes_the_trace_then_stops(tmp_path: Path,
                                                           capsys: Any) -> None:
    proc = start(tmp_path, "save", "sync")
    proc.send_signal(signal.SIGTERM)
    # The handler waits for the save in progress to finish, then saves the cycle that
    # had begun (partial) and lets SIGTERM end the process.
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGTERM
    data, _ = traces(tmp_path, capsys)
    assert [(t["path"], t["status"]) for t in data["traces"]] == [
        ("actor_step1_c0.pt.trace.json.gz", "complete"),
        ("actor_step1_c1.pt.trace.json.gz", "partial")]
    assert data["interrupted"] == [] and data["leftovers"] == []
    assert (tmp_path / "actor_step1_c0.pt.trace.json.gz").stat().st_size > 100


def test_sigterm_while_the_export_thread_saves_flushes_it(tmp_path: Path,
                                                          capsys: Any) -> None:
    """Background export: the training thread went on while cycle 0 was being written.
    SIGTERM stops the capture (cycle 1, whatever it reached), waits for the exports, then
    ends the process: both traces are whole, nothing is interrupted or left over."""
    proc = start(tmp_path, "save", "background")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGTERM
    data, _ = traces(tmp_path, capsys)
    rows = [(t["path"], t["status"]) for t in data["traces"]]
    assert rows[0] == ("actor_step1_c0.pt.trace.json.gz", "complete")
    assert rows[1][0] == "actor_step1_c1.pt.trace.json.gz" and rows[1][1] in (
        "complete", "partial")
    assert data["interrupted"] == [] and data["leftovers"] == []
    assert (tmp_path / "actor_step1_c0.pt.trace.json.gz").stat().st_size > 100


@pytest.mark.parametrize("mode", ["sync", "background"])
def test_sigterm_while_the_capture_is_being_stopped_keeps_its_trace(
        tmp_path: Path, capsys: Any, mode: str) -> None:
    """The save that ends a capture (``training_step`` returning) is under way when SIGTERM
    comes: the capture has left its slot, and its trace is still published whole."""
    proc = start(tmp_path, "save", mode, "whole")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGTERM
    data, _ = traces(tmp_path, capsys)
    assert [(t["path"], t["status"]) for t in data["traces"]] == [
        ("actor_step1_c.pt.trace.json.gz", "complete")]  # no schedule: no cycle
    assert data["interrupted"] == [] and data["leftovers"] == []
    with gzip.open(tmp_path / "actor_step1_c.pt.trace.json.gz") as f:
        assert json.load(f)["traceEvents"]
