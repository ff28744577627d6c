"""Stalls in real processes: 4-rank torchrun jobs (gloo, CPU) where one rank stops in step 5
before an all-reduce (tests/dist_scripts/stall_worker.py), and a process alone whose step is
slow or whose records are asked for by hand (tests/stall_scripts/one_process.py).

- a rank that sleeps: four records within the limit and a few polls; analyze says ranks 0-2
  wait in all_reduce (group, call number, the worker's line) and rank 3 never reached it,
  at its ``time.sleep`` line; rank 3's capture of step 5 is saved partial; after the job
  is killed (SIGKILL) every file stays and reads the same;
- a rank that is SIGSTOPped: named as not answering, the other three records written;
- a step that is slow but ends: one record, and "cleared after N s";
- by hand: ``policy-engine trigger DIR --stall`` and ``kill -USR2`` each write a record.

Time bounds are generous: the machine running them may be loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from job_env import child_env, run_cli

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "dist_scripts" / "stall_worker.py"
ONE = Path(__file__).parent / "stall_scripts" / "one_process.py"
AFTER, POLL = 5, 1
JOB_POLICY = f"""\
version: 1
output_dir: profiles
roles:
  trainer:
    enabled: true
    ranks: all
    steps: [5]
    regions: [update_actor]
    torch: {{activities: [cpu]}}
    triggers: {{stall: {{after: {AFTER}}}, poll_seconds: {POLL}}}
"""


def _line(text: str) -> int:
    """The worker's line that holds ``text``."""
    return next(n for n, line in enumerate(WORKER.read_text().splitlines(), 1) if text in line)


def wait_for(what: Callable[[], Any], seconds: float, why: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds:g} s: {why}")


def records(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((out / "stalls").glob("*_rank*.json")):
        if not path.name.endswith(".cleared.json"):
            found.append(json.loads(path.read_text()))
    return found


@contextlib.contextmanager
def job(folder: Path, mode: str, stuck: int, seconds: float,
        steps: int = 8) -> Iterator[subprocess.Popen[str]]:
    """The 4-rank job in ``folder``; every process of it is killed (SIGKILL) at the end."""
    folder.mkdir(exist_ok=True)
    (folder / "policy.yaml").write_text(JOB_POLICY)
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
         str(WORKER), "policy.yaml", str(steps), "5", str(stuck), mode, str(seconds)],
        cwd=folder, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        yield agent
    finally:
        kill_all(folder, agent)


def kill_all(folder: Path, agent: subprocess.Popen[str]) -> None:
    """SIGKILL to the ranks (torchrun starts each in a session of its own) and the agent."""
    for path in folder.glob("pid.*"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(path.read_text()), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(agent.pid, signal.SIGKILL)
    agent.communicate(timeout=60)


def analyze(out: Path) -> dict[str, Any]:
    done = run_cli("analyze", str(out), "--format", "json", cwd=out.parent, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["stalls"]


def test_the_rank_the_others_wait_for_is_named_with_its_line(tmp_path: Path) -> None:
    out = tmp_path / "profiles"
    with job(tmp_path, "sleep", stuck=3, seconds=600):
        found = wait_for(lambda: len(records(out)) == 4 and records(out), 240,
                         "four stall records")
        for r in found:  # each written once the limit passed, within a few polls
            assert r["why"] in ("stall", "asked") and r["step"] == 5
            assert r["why"] == "asked" or AFTER <= r["running"] <= AFTER + 30, r
        # rank 3's capture of step 5, saved partial at the stall
        partial = wait_for(lambda: [p for p in out.glob("trainer/step5/*rank3-of-4*")], 60,
                           "rank 3's partial trace of step 5")
        stalls = analyze(out)
    # killed with SIGKILL: everything written stays, and reads the same
    assert partial[0].is_file() and partial[0].stat().st_size > 0
    assert analyze(out) == stalls
    episode = stalls["episodes"][0]
    assert episode["status"] == "stalled" and episode["not_answering"] == []
    [wait] = episode["collectives"]
    assert (wait["name"], wait["ranks"], wait["group"]) == ("all_reduce", [0, 1, 2], "0")
    assert wait["desc"] == "default_pg" and isinstance(wait["seq"], int)
    [place] = wait["where"]
    assert place["file"].endswith("stall_worker.py")
    assert (place["line"], place["code"]) == (_line("dist.all_reduce(grad)"),
                                              "dist.all_reduce(grad)")
    [late] = wait["not_reached"]
    assert late["rank"] == 3 and late["in"] is None
    assert late["last"]["seq"] == wait["seq"] - 1 and late["last"]["returned"] is True
    assert late["where"]["line"] == _line("time.sleep(seconds)")
    assert late["where"]["code"].startswith("time.sleep(seconds)")
    lines = [json.loads(x) for p in (out / "manifests").glob("*") for x in p.read_text()
             .splitlines()]
    [saved] = [x for x in lines if x.get("event") == "close" and x.get("status") == "partial"]
    assert saved["steps"] == [5] and saved["stopped_by"].startswith("a stall")
    text = run_cli("analyze", str(out), cwd=tmp_path, timeout=300).stdout
    assert text.startswith("== STALL at step 5")
    assert "rank 3 never reached it" in text and "time.sleep(seconds)" in text


def test_a_stopped_rank_is_named_as_not_answering(tmp_path: Path) -> None:
    out = tmp_path / "profiles"
    with job(tmp_path, "stop", stuck=2, seconds=0):
        wait_for(lambda: list((out / "stalls").glob("*_rollcall_*.json")), 240,
                 "the roll call")
        found = records(out)
        stalls = analyze(out)
    assert sorted(r["rank"] for r in found) == [0, 1, 3]
    episode = stalls["episodes"][0]
    assert episode["not_answering"] == [2] and episode["no_record"] == []
    [wait] = episode["collectives"]
    assert wait["ranks"] == [0, 1, 3] and wait["name"] == "all_reduce"
    assert wait["not_reached"] == []  # rank 2 left no record: it is the one not answering
    text = run_cli("analyze", str(out), cwd=tmp_path, timeout=300).stdout
    assert "NOT ANSWERING: rank(s) 2" in text


def _one(tmp_path: Path, mode: str, after: float, **env: str) -> subprocess.Popen[str]:
    (tmp_path / "policy.yaml").write_text(
        "version: 1\noutput_dir: profiles\nroles:\n  trainer:\n    enabled: true\n"
        f"    steps: []\n    triggers: {{stall: {{after: {after}}}, poll_seconds: 0.2}}\n")
    return subprocess.Popen([sys.executable, str(ONE), "policy.yaml", mode], cwd=tmp_path,
                            env={**child_env(), **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_a_slow_step_that_ends_is_one_record_said_cleared(tmp_path: Path) -> None:
    process = _one(tmp_path, "slow", after=1, SLOW="4")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0 and "done" in output, output
    out = tmp_path / "profiles"
    [record] = records(out)
    assert (record["why"], record["step"], record["rank"]) == ("stall", 3, 0)
    [cleared] = [json.loads(p.read_text()) for p in (out / "stalls").glob("*.cleared.json")]
    assert 4 <= cleared["seconds"] < 60
    episode = analyze(out)["episodes"][0]
    assert episode["status"] == "cleared"
    text = run_cli("analyze", str(out), cwd=tmp_path, timeout=300).stdout
    assert text.startswith("== stall (cleared) at step 3")
    assert "a slow step, not a hang: cleared rank 0 after" in text


def until(process: subprocess.Popen[str], line: str) -> None:
    """Read the process's output (its warnings too) up to ``line``."""
    assert process.stdout is not None
    seen = []
    for found in process.stdout:
        seen.append(found)
        if found.strip() == line:
            return
    raise AssertionError(f"no {line!r} in {''.join(seen)}")


def test_records_asked_for_by_hand(tmp_path: Path) -> None:
    process = _one(tmp_path, "hand", after=600)
    out = tmp_path / "profiles"
    try:
        until(process, "waiting 2")
        asked = run_cli("trigger", str(out), "--stall", cwd=tmp_path, timeout=120)
        assert asked.returncode == 0, asked.stderr
        wait_for(lambda: len(records(out)) == 1, 60, "the record the command asked for")
        (tmp_path / "go.2").touch()
        until(process, "waiting 3")
        process.send_signal(signal.SIGUSR2)
        wait_for(lambda: len(records(out)) == 2, 60, "the record SIGUSR2 asked for")
        (tmp_path / "go.3").touch()
        assert process.wait(timeout=120) == 0
    finally:
        process.kill()
        process.communicate()
    first, second = records(out)
    assert (first["why"], first["step"]) == ("hand", 2)
    assert (second["why"], second["step"]) == ("hand", 3)
    assert [e["status"] for e in analyze(out)["episodes"]] == ["asked", "asked"]
