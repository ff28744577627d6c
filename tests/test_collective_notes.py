"""A torch capture notes its collectives' groups, sequence numbers and bytes in its trace
(runtime/capture/collective_notes.py), read from torch's flight recorder when the cycle is
saved: only the calls issued while it recorded, nothing at all outside captures or without
torch.distributed, and never an exception into training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from job_env import child_env

from policy_engine.analysis.chrome_trace import TraceReader
from policy_engine.analysis.collectives import Collectives
from policy_engine.runtime.capture.collective_notes import CollectiveNotes

SCRIPT = """
import sys, torch, torch.distributed as dist
from policy_engine import load_policy, profile_session
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
prof = profile_session(load_policy(sys.argv[1]), "trainer")
x = torch.ones(256)
dist.all_reduce(x)  # before the capture: not its call
with prof.training_step(1):
    dist.all_reduce(x)
    dist.broadcast(x, 0)
    gathered = [torch.zeros(256)]
    dist.all_gather(gathered, x)
    prof.step()
prof.close()
dist.all_reduce(x)  # after it
dist.destroy_process_group()
"""
POLICY = """\
version: 1
output_dir: profiles
roles:
  trainer: {enabled: true, torch: {activities: [cpu]}}
"""


def test_a_torch_capture_notes_its_calls_from_the_flight_recorder(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "job.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "job.py", "policy.yaml", str(tmp_path / "store")],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    [trace] = tmp_path.glob("profiles/**/*.pt.trace.json.gz")
    found = Collectives()
    with TraceReader(str(trace)) as reader:
        for event in reader.events():
            found.event(event)
        meta = reader.meta
    notes = meta["policy_engine"]["collectives"]
    assert notes["from"] == "flight_recorder"
    assert [row[:5] for row in notes["calls"]] == [
        ["0", "default_pg", 2, "gloo:all_reduce", 1024],
        ["0", "default_pg", 3, "gloo:broadcast", 1024],
        ["0", "default_pg", 4, "gloo:all_gather", 1024]]
    record = found.result(meta)
    assert (record["source"], record["numbered"]) == ("gloo", "seq")
    assert record["calls"]["number"] == [2, 3, 4]
    assert [record["names"][i] for i in record["calls"]["name"]] == \
        ["allreduce", "broadcast", "allgather"]
    assert record["groups"] == [{"name": "0", "desc": "default_pg", "size": 1,
                                 "ranks": [[0, 1, 1]]}]
    # each call issued before its worker ran it, inside the capture
    calls = record["calls"]
    assert all(i is not None and i <= s + 100 for i, s in
               zip(calls["issue"], calls["start"], strict=True)), calls
    assert json.dumps(record)  # JSON-ready


def test_nothing_is_noted_outside_a_torch_capture_or_without_distributed() -> None:
    off = CollectiveNotes(False)
    off.start()
    assert off.since is None and off.facts() == {}
    never_started = CollectiveNotes(True)
    assert never_started.facts() == {}
    started = CollectiveNotes(True)
    started.start()
    assert started.since is not None
    assert started.facts() == {}  # torch.distributed is not up in this process
