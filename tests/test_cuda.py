"""On a CUDA machine: regions are user annotations with their band on the GPU timeline.

Skipped where torch sees no GPU (CI); run it on one with `python -m pytest tests/test_cuda.py`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from policy_engine import Topology, apply_policy  # noqa: E402


class Worker:
    def __init__(self) -> None:
        self.x = torch.randn(1024, 1024, device="cuda")
        self.prof: Any = None

    def update_actor(self, batches: int) -> None:
        for _ in range(batches):
            (self.x @ self.x).sum().item()
            self.prof.step()


def test_regions_show_on_the_gpu_timeline(tmp_path: Path) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1], "regions": ["update_actor"],
                                  "schedule": {"wait": 1, "warmup": 1, "active": 2,
                                               "repeat": 1},
                                  "name": "<role>_c<cycle>"}}}
    worker = Worker()
    worker.prof = apply_policy(worker, "actor", policy, Topology())
    with worker.prof.training_step(1):
        worker.update_actor(6)  # recording starts inside the region
    worker.prof.close()
    events = json.loads(gzip.decompress((tmp_path / "actor_c0.pt.trace.json.gz")
                                        .read_bytes()))["traceEvents"]
    cats = {e.get("cat") for e in events if e.get("name") == "update_actor"}
    assert {"user_annotation", "gpu_user_annotation"} <= cats
    assert any(e.get("cat") == "kernel" for e in events)


def test_history_always_dumps_an_oom_between_planned_steps(tmp_path: Path) -> None:
    """memory: {history: always}: an out-of-memory error in a step no capture covers (plain
    torch.empty past the free memory) writes <name>_oom.pickle with the history so far."""
    import pickle

    from policy_engine import profile_session
    from policy_engine.analysis.manifests import read_manifests

    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "backend": "memory", "steps": [2],
                                  "name": "<role>_step<step>",
                                  "memory": {"history": "always", "max_entries": 10000}}}}
    prof = profile_session(policy, "actor", Topology())
    kept = []
    for n in range(4):
        with prof.training_step(n):
            kept.append(torch.ones(1 << 20, device="cuda"))
            if n == 1:
                free, _ = torch.cuda.mem_get_info()
                with pytest.raises(torch.cuda.OutOfMemoryError):
                    torch.empty(free + (1 << 30), dtype=torch.uint8, device="cuda")
            prof.step()
    prof.close()
    rows = {r["path"]: r for r in read_manifests(str(tmp_path))}
    assert set(rows) == {"actor_step1_oom.pickle", "actor_step2.pickle"}
    oom = rows["actor_step1_oom.pickle"]
    assert (oom["status"], oom["steps"], oom["trigger"]) == ("oom", [1], "oom")
    assert oom["extra"]["history"] is True and oom["extra"]["bytes_asked"] > free
    with open(tmp_path / "actor_step1_oom.pickle", "rb") as f:
        snapshot = pickle.load(f)
    events = [e for trace in snapshot["device_traces"] for e in trace]
    # the allocations of steps 0 and 1, recorded although no capture was open
    assert sum(e["action"] == "alloc" and e["size"] == 4 << 20 for e in events) >= 2
    assert any(e["action"] == "oom" for e in events)
