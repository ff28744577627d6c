"""Real torch.profiler captures on the CPU, checked against the manifest and explain."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from policy_engine import Topology, apply_policy, load_policy
from policy_engine.analysis.manifests import read_manifests
from policy_engine.plan.predict import explain


class Worker:
    def __init__(self) -> None:
        self.model = torch.nn.Linear(16, 16)

    def compute_log_prob(self) -> torch.Tensor:
        return self.model(torch.randn(8, 16)).sum()


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    return data


def write_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent("""\
        version: 1
        prefix: t
        output_dir: out
        mesh: {dp: 2, tp: 2}
        roles:
          actor:
            enabled: true
            ranks: {tp: 0}
            steps: [1, 3]
            schedule: {wait: 1, warmup: 1, active: 2, repeat: 2}
            regions: [compute_log_prob]
            name: "<prefix>_<role>_step<step>_c<cycle>_rank<rank>-of-<world>_<tp><dp>_<pid>"
            torch: {activities: [cpu, cuda], record_shapes: true}
        """))
    return path


def test_traces_match_schedule_manifest_and_explain(tmp_path: Path, caplog: Any) -> None:
    policy = load_policy(write_policy(tmp_path))
    worker = Worker()
    prof = apply_policy(worker, "actor", policy, Topology(rank=2, world=4))
    for n in range(4):
        with prof.training_step(n):
            for _ in range(9):
                worker.compute_log_prob()
                prof.step()
    prof.close()
    out = tmp_path / "out"
    rows = sorted(read_manifests(str(out)), key=lambda r: r["start"])
    # Two profiled steps x two cycles; cycle c records inner steps 2+4c and 3+4c.
    assert [(r["steps"], r["cycle"], r["inner_steps"]) for r in rows] == [
        ([1], 0, [2, 3]), ([1], 1, [6, 7]), ([3], 0, [2, 3]), ([3], 1, [6, 7])]
    assert all(r["status"] == "complete" and r["coords"] == {"dp": 1, "tp": 0} for r in rows)
    files = sorted(p.name for p in out.glob("*.pt.trace.json.gz"))
    assert files == sorted(os.path.basename(r["path"]) for r in rows)
    for row in rows:
        path = out / row["path"]
        assert row["bytes"] == path.stat().st_size
        trace = load_trace(path)
        meta = json.loads(trace["policy_engine"]) if isinstance(trace["policy_engine"], str) \
            else trace["policy_engine"]
        assert meta["role"] == "actor" and meta["rank"] == 2 and meta["cycle"] == row["cycle"]
        assert meta["coords"] == {"dp": 1, "tp": 0} and meta["plan_hash"] == row["plan_hash"]
        assert meta["inner_steps"] == row["inner_steps"] and meta["joined"] == []
        names = {e.get("name") for e in trace["traceEvents"]}
        steps = sorted(int(n.split("#")[1]) for n in names if str(n).startswith("ProfilerStep#"))
        assert steps == row["inner_steps"]
        assert "compute_log_prob" in names
        assert "aten::addmm" in names or "aten::linear" in names
    # cuda was asked for but there is no GPU: dropped with one warning.
    assert sum("cuda activity dropped" in r.getMessage() for r in caplog.records) <= 1

    predicted = explain(policy, "actor", world=4, lo=0, hi=3, inner=9)["ranks"][2]
    assert predicted["profiled"] and predicted["steps"] == [1, 3]
    assert [a for a in predicted["actions"]] == [
        "NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"] * 2 + ["NONE"]
    for capture in predicted["captures"]:
        pattern = re.escape(capture["name"]).replace(re.escape("<pid>"), r"\d+")
        pattern = pattern.replace("c0", "c[01]")
        matched = [r for r in rows if re.fullmatch(pattern, r["path"].split(".")[0])]
        assert [r["steps"] for r in matched] == [capture["steps"]] * 2


class Enclosing:
    """The starter policy's shape: a region whose method runs the inner steps itself."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(16, 16)
        self.prof: Any = None

    def update_actor(self, batches: int) -> None:
        for _ in range(batches):
            self.model(torch.randn(8, 16)).sum().backward()
            self.prof.step()


def test_regions_are_user_annotations_in_every_recorded_cycle(tmp_path: Path) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1], "regions": ["update_actor"],
                                  "schedule": {"wait": 1, "warmup": 1, "active": 2,
                                               "repeat": 2},
                                  "name": "<role>_c<cycle>", "torch": {"activities": ["cpu"]}}}}
    worker = Enclosing()
    worker.prof = apply_policy(worker, "actor", policy, Topology())
    with worker.prof.training_step(1):
        worker.update_actor(8)  # entered in the wait phase; recording starts inside it
    worker.prof.close()
    for cycle in (0, 1):
        events = load_trace(tmp_path / f"actor_c{cycle}.pt.trace.json.gz")["traceEvents"]
        [region] = [e for e in events if e.get("name") == "update_actor"]
        assert region["cat"] == "user_annotation"
        marks = [e for e in events if str(e.get("name")).startswith("ProfilerStep#")]
        assert region["ts"] <= min(m["ts"] for m in marks)  # opened when recording began
        assert all(m["cat"] == "user_annotation" for m in marks)


def test_explain_agrees_on_which_ranks_profile(tmp_path: Path) -> None:
    policy = load_policy(write_policy(tmp_path))
    predicted = [r["profiled"] for r in explain(policy, "actor", world=4)["ranks"]]
    actual = []
    for rank in range(4):
        prof = apply_policy(Worker(), "actor", policy, Topology(rank=rank, world=4))
        prof.close()  # (its listener thread, the job's clock, ends with it)
        actual.append(prof.plan.enabled)
    assert predicted == actual == [True, False, True, False]


SIGTERM_SCRIPT = """
import sys, time, torch
from policy_engine import Topology, profile_session
policy = {"version": 1, "output_dir": sys.argv[1],
          "roles": {"actor": {"enabled": True, "steps": [0],
                              "torch": {"activities": ["cpu"]}}}}
prof = profile_session(policy, "actor", Topology())
with prof.training_step(0):
    for i in range(100000):
        torch.ones(64, 64) @ torch.ones(64, 64)
        prof.step()
        if i == 3:
            print("capturing", flush=True)
        time.sleep(0.01)
"""


@pytest.mark.parametrize("user_handler", [False, True])
def test_sigterm_mid_capture_flushes_partial(tmp_path: Path, user_handler: bool) -> None:
    script = SIGTERM_SCRIPT
    if user_handler:
        script = ("import signal, sys\n"
                  "signal.signal(signal.SIGTERM, lambda *a: (print('user handler', flush=True),"
                  " sys.exit(7)))\n") + script
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.time() + 60
    while "capturing" not in proc.stdout.readline():
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if \
            proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    rows = read_manifests(str(tmp_path / "out"))
    assert len(rows) == 1 and rows[0]["status"] == "partial"
    trace = tmp_path / "out" / rows[0]["path"]
    assert trace.stat().st_size == rows[0]["bytes"] > 0
    assert "ProfilerStep#3" in {e.get("name") for e in load_trace(trace)["traceEvents"]}
    if user_handler:
        assert "user handler" in stdout and proc.returncode == 7
    else:
        assert proc.returncode == -signal.SIGTERM
