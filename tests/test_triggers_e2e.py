"""Triggers on real torch, in child processes: a capture asked for by `policy-engine
trigger`, by SIGUSR2, by a slow step, and a budget that stops captures.

The child trains a small model one step at a time. It prints ``at <n>`` inside step n
and, at the steps named in its argv, waits for a line on stdin before going on: the test
acts (writes a request, sends a signal) while the child is known to be inside that step,
and the child's listener thread has read what the test wrote before the next step starts.
"""

from __future__ import annotations

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

from policy_engine.analysis.manifests import scan_manifests

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

CHILD = """
import json, sys, time, torch
from policy_engine import Topology, apply_policy, load_policy

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
policy, steps, pause, naps = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), \\
    json.loads(sys.argv[4])
prof = apply_policy(model, role="trainer", policy=load_policy(policy),
                    topology=Topology(rank=0, world=1))
for step in range(1, steps + 1):
    with prof.training_step(step):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(naps.get(str(step), naps["default"]))
        if step in pause:
            print(f"at {step}", flush=True)
            sys.stdin.readline()
            if prof._listener is not None and prof._listener.thread is not None:
                prof._listener.thread.poll_now()  # what the test wrote is read by now
prof.close()
print("done", flush=True)
"""

TIMEOUT = 120


def policy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\noutput_dir: out\nroles:\n  trainer:\n    enabled: true\n"
                    "    torch: {activities: [cpu]}\n"
                    '    name: "<role>_step<step>"\n' + textwrap.indent(body, "    "))
    return path


class Child:
    def __init__(self, tmp_path: Path, body: str, steps: int, pause: list[int],
                 naps: dict[str, float] | None = None) -> None:
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        self.out = tmp_path / "out"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(policy(tmp_path, body)), str(steps),
             json.dumps(pause), json.dumps({"default": 0.01, **(naps or {})})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_for(self, step: int) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == f"at {step}", (line, self.proc.stderr and self.proc.stderr.read())

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        _, err = self.proc.communicate(timeout=TIMEOUT)
        self.err = err
        assert self.proc.returncode == 0, err

    def records(self, event: str) -> list[dict[str, Any]]:
        return [r for r in scan_manifests(str(self.out)).records if r["event"] == event]

    def captures(self) -> list[tuple[list[int], str]]:
        return [(r["steps"], r["trigger"]) for r in self.records("open")]

    def traces(self) -> list[str]:
        return sorted(os.path.basename(r["path"]) for r in self.records("trace")
                      if r["status"] == "complete")


def cli(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_engine", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_trigger_command_captures_the_steps_asked_for(tmp_path: Path) -> None:
    child = Child(tmp_path, "steps: []\ntriggers: {on_demand: true, poll_seconds: 0}\n",
                  steps=14, pause=[5])
    child.wait_for(5)
    asked = cli("trigger", str(child.out), "--role", "trainer")  # next: step 6
    assert asked.returncode == 0, asked.stderr
    waiting = subprocess.Popen(
        [sys.executable, "-m", "policy_engine", "trigger", str(child.out), "--role",
         "trainer", "--steps", "10", "--count", "2", "--wait", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The second request must be on disk before the child goes on: the command prints its
    # id only after the rename.
    assert waiting.stdout is not None and waiting.stdout.readline().startswith("request ")
    child.go()
    child.finish()
    report, err = waiting.communicate(timeout=TIMEOUT)
    assert waiting.returncode == 0, err
    assert child.captures() == [([6], "on_demand"), ([10], "on_demand"), ([11], "on_demand")]
    assert child.traces() == [f"trainer_step{n}.pt.trace.json.gz" for n in (10, 11, 6)]
    assert "rank 0" in report and "accepted" in report and "trainer_step11" in report
    requests = {r["request"] for r in child.records("open")}
    assert len(requests) == 2


def test_sigusr2_captures_the_next_step(tmp_path: Path) -> None:
    child = Child(tmp_path, "steps: [2]\ntriggers: {signal: true}\n", steps=8, pause=[4])
    child.wait_for(4)
    child.proc.send_signal(signal.SIGUSR2)
    child.go()
    child.finish()
    assert child.captures() == [([2], "plan"), ([5], "signal")]
    assert child.traces() == ["trainer_step2.pt.trace.json.gz", "trainer_step5.pt.trace.json.gz"]


def test_a_slow_step_captures_the_step_after_it(tmp_path: Path) -> None:
    child = Child(tmp_path, "steps: []\ntriggers: {slow_step: {factor: 4, after: 5}}\n",
                  steps=20, pause=[], naps={"default": 0.05, "12": 1.0})
    child.finish()
    assert child.captures() == [([13], "slow_step")]
    [note] = child.records("note")
    assert note["note"] == "slow_step" and note["step"] == 12 and note["seconds"] >= 1.0


def test_a_budget_of_three_stops_at_three(tmp_path: Path) -> None:
    child = Child(tmp_path, "steps: {every: 2}\nlimits: {captures: 3}\n", steps=20, pause=[])
    child.finish()
    assert child.traces() == [f"trainer_step{n}.pt.trace.json.gz" for n in (2, 4, 6)]
    [note] = child.records("note")
    assert note["note"] == "limit" and "limits.captures: 3" in note["message"]
    listed = cli("traces", str(child.out))
    assert listed.returncode == 0 and listed.stdout.count("complete") >= 3


def test_wait_ends_when_the_plan_captures_the_step_asked_for(tmp_path: Path) -> None:
    child = Child(tmp_path, "steps: [8]\ntriggers: {on_demand: true, poll_seconds: 0}\n",
                  steps=12, pause=[3])
    child.wait_for(3)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "policy_engine", "trigger", str(child.out), "--role",
         "trainer", "--steps", "8", "--wait", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiting.stdout is not None and waiting.stdout.readline().startswith("request ")
    child.go()
    child.finish()
    report, err = waiting.communicate(timeout=TIMEOUT)
    assert waiting.returncode == 0, (report, err)
    assert child.captures() == [([8], "plan")]
    assert "accepted: captures step 8" in report and "trainer_step8" in report


def test_hostile_request_files_neither_crash_nor_stall_training(tmp_path: Path) -> None:
    from policy_engine.runtime.triggers.requests import write_request

    child = Child(tmp_path, "steps: []\ntriggers: {on_demand: true, poll_seconds: 0}\n",
                  steps=10, pause=[3])
    child.wait_for(3)
    folder = child.out / "triggers"
    os.mkfifo(folder / "fifo.json")
    (folder / "zero.json").symlink_to("/dev/zero")
    (folder / "array.json").write_text("[]")
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "nan.json").write_text('{"role": "trainer", "count": NaN}')
    (folder / "cut.json").write_text('{"role": "trai')  # half-written: read again later
    write_request(str(child.out), role="trainer", ranks=None, step=None, count=1)
    began = time.monotonic()
    child.go()
    child.finish()
    assert time.monotonic() - began < TIMEOUT / 2
    assert child.captures() == [([4], "on_demand")]  # the good request still works
    refused = sorted(r["request"] for r in child.records("note") if r["status"] == "refused")
    assert refused == ["array", "deep", "fifo", "nan", "zero"]
    for name in refused:  # one warning each, never one per poll
        assert child.err.count(f"ignoring trigger request {folder / name}.json") == 1
    assert "cut.json" not in child.err and "Traceback" not in child.err


def test_an_absurd_count_is_refused_at_the_command(tmp_path: Path) -> None:
    (tmp_path / "out" / "triggers").mkdir(parents=True)
    asked = cli("trigger", str(tmp_path / "out"), "--role", "trainer", "--count",
                "1000000000")
    assert asked.returncode == 2 and "at most 10000 steps per request" in asked.stderr
    assert os.listdir(tmp_path / "out" / "triggers") == []
