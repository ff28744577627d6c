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
