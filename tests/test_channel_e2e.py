"""Aligned captures on real 4-rank torchrun jobs (gloo, CPU): `policy-engine trigger --steps
next` gives every rank the same step, through the job's store and through the folder, for
every one of 20 requests (2 jobs side by side, 10 requests each, made at random moments
of the listener threads' polls); a slow rank and its
reference rank capture the same later step.

Every job listens with two roles: ``trainer`` on the job's store, each rank writing to a
folder of its own (node-local disks: the command reads the answers on the store), and
``probe`` on the ``triggers/`` folder of one shared output folder. The two jobs run at once.
"""

from __future__ import annotations

import json
import random
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from job_env import child_env

from policy_engine.analysis.manifests import scan_manifests
from policy_engine.runtime.triggers.channel import JobChannel, connect_store
from policy_engine.runtime.triggers.folder import read_progress

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "dist_scripts" / "channel_worker.py"
JOBS = 2
REQUESTS = 10  # per job, one after the other
TIMEOUT = 120

TRAINER = """version: 1
output_dir: node{rank}
roles:
  trainer:
    enabled: true
    ranks: all
    steps: []
    torch: {activities: [cpu]}
    triggers: {on_demand: true, poll_seconds: 0.25, channel: store}
"""
PROBE = """version: 1
output_dir: shared
roles:
  probe:
    enabled: true
    ranks: all
    steps: []
    torch: {activities: [cpu]}
    triggers: {on_demand: true, poll_seconds: 0.25, channel: folder}
"""
SLOW = """version: 1
output_dir: slow
roles:
  trainer:
    enabled: true
    ranks: all
    steps: []
    torch: {activities: [cpu]}
    triggers:
      poll_seconds: 0.25
      slow_step: {factor: 5, after: 8, max: 1, scope: job, reference: "0"}
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """A 4-rank torchrun job in ``folder``, stopped by a file."""

    def __init__(self, folder: Path, seed: int, policies: list[str],
                 naps: dict[str, float] | None = None) -> None:
        folder.mkdir(parents=True)
        self.folder = folder
        self.port = _port()
        self.output = ""
        self.stopped = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
             "--nproc-per-node=4", "--master-addr=127.0.0.1", f"--master-port={self.port}",
             str(WORKER), str(seed), json.dumps(naps or {}), *policies],
            cwd=folder, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)

    def until(self, check: Any, what: str, seconds: float = TIMEOUT) -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"{what}: not within {seconds} s\n{self.output[-4000:]}")

    def cli(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "policy_engine", "trigger", *args],
                                cwd=self.folder, env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        (self.folder / "stop").touch()
        try:
            self.output = self.proc.communicate(timeout=TIMEOUT)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output = self.proc.communicate()[0]


def _listening(job: Job) -> bool:
    """All 4 ranks listen on both channels and have reported progress."""
    on_folder = sum(1 for r in read_progress(str(job.folder / "shared"), "probe")
                    if isinstance(r, dict))
    if on_folder < 4:
        return False  # the store is not asked before: it may not serve yet
    try:
        store = JobChannel(connect_store("127.0.0.1", job.port, timeout=2), "trainer")
        on_store = sum(1 for r in store.reports() if isinstance(r, dict))
    except Exception:
        return False
    return on_store == 4


def _answers(folder: Path, role: str, rid: str) -> list[dict[str, Any]]:
    return [r for r in scan_manifests(str(folder)).records
            if r["event"] == "note" and r.get("note") == "trigger" and r.get("role") == role
            and r.get("request") == rid]


def _request_id(said: str) -> str:
    found = re.search(r"^request (\S+):", said, re.MULTILINE)
    assert found, said
    return found.group(1)


def one_request(job: Job) -> tuple[list[int], list[int]]:
    """The steps the 4 ranks accepted for one "next": through the store, through the
    folder."""
    # the command on "node 0": it finds the store in node0/triggers/channel
    store = job.cli("node0", "--role", "trainer", "--steps", "next", "--wait", "60")
    folder = job.cli("shared", "--role", "probe", "--steps", "next")
    said_folder = folder.communicate(timeout=TIMEOUT)[0]
    assert folder.returncode == 0, said_folder
    rid = _request_id(said_folder)
    probes = job.until(lambda: len(_answers(job.folder / "shared", "probe", rid)) == 4 and
                       _answers(job.folder / "shared", "probe", rid), "4 answers in the folder")
    said_store = store.communicate(timeout=TIMEOUT)[0]
    assert store.returncode == 0, said_store + job.output[-3000:]
    said = re.findall(r"rank (\d) \(pid \d+\): accepted: captures step (\d+)", said_store)
    assert sorted(int(r) for r, _ in said) == [0, 1, 2, 3], said_store
    # each rank's own folder holds its answer
    for rank, step in said:
        [note] = _answers(job.folder / f"node{rank}", "trainer", _request_id(said_store))
        assert note["first"] == int(step)
    assert {p["status"] for p in probes} == {"accepted"}
    return [int(s) for _, s in said], [p["first"] for p in probes]


def one_job(root: Path, seed: int) -> list[tuple[list[int], list[int]]]:
    """Each request's steps, as :func:`one_request` gives them."""
    job = Job(root / f"job{seed}", seed, ["trainer{rank}.yaml", "probe.yaml"])
    for rank in range(4):
        (job.folder / f"trainer{rank}.yaml").write_text(TRAINER.replace("{rank}", str(rank)))
    (job.folder / "probe.yaml").write_text(PROBE)
    try:
        job.until(lambda: _listening(job), "4 ranks listening")
        chance = random.Random(seed)
        rounds = []
        for _ in range(REQUESTS):
            time.sleep(chance.uniform(0, 0.25))  # at a random phase of the polls
            rounds.append(one_request(job))
        return rounds
    finally:
        job.stop()


def test_next_is_one_step_on_every_rank_for_every_request(tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:
        results = [r for job in pool.map(lambda seed: one_job(tmp_path, seed), range(JOBS))
                   for r in job]
    assert len(results) == JOBS * REQUESTS
    aligned_store = sum(1 for steps, _ in results if len(set(steps)) == 1)
    aligned_folder = sum(1 for _, steps in results if len(set(steps)) == 1)
    assert (aligned_store, aligned_folder) == (len(results), len(results)), results


def test_a_slow_rank_and_its_reference_capture_the_same_later_step(tmp_path: Path) -> None:
    job = Job(tmp_path / "slow", 7, ["slow.yaml"], naps={"2:30": 1.0})
    (job.folder / "slow.yaml").write_text(SLOW)
    out = job.folder / "slow"
    job.until(lambda: len([r for r in scan_manifests(str(out)).records
                           if r["event"] == "close"]) == 2, "2 captures closed")
    job.stop()
    records = scan_manifests(str(out)).records
    opened = sorted((r["rank"], r["steps"], r["trigger"]) for r in records
                    if r["event"] == "open")
    assert [(rank, trigger) for rank, _, trigger in opened] == [(0, "slow_step"),
                                                                (2, "slow_step")]
    assert opened[0][1] == opened[1][1] and opened[0][1][0] > 31
    notes = {r["rank"]: r for r in records if r["event"] == "note" and r["note"] == "trigger"}
    assert sorted(notes) == [0, 2]
    assert notes[0]["slow"]["rank"] == 2 and notes[0]["slow"]["step"] == 30
    assert notes[0]["slow"]["seconds"] >= 1.0 and notes[0]["reference"] == "0"
