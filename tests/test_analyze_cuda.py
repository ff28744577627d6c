"""On a CUDA machine: analyze's GPU numbers agree with Holistic Trace Analysis.

One process (world 1, NCCL: one GPU cannot hold two NCCL ranks) profiles a few steps of
matrix products with gaps between them; `analyze --hta` then puts HTA's temporal
breakdown beside ours, and compute and idle time per rank must agree within 5%.
Skipped where torch sees no GPU (CI); run it with `python -m pytest tests/test_analyze_cuda.py`.
"""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytest.importorskip("hta.trace_analysis")

import torch.distributed as dist  # noqa: E402

from policy_engine import Topology, apply_policy  # noqa: E402
from policy_engine.cli.main import main  # noqa: E402


class Worker:
    def __init__(self) -> None:
        self.x = torch.randn(2048, 2048, device="cuda")
        self.prof: Any = None

    def update_actor(self, batches: int) -> None:
        for _ in range(batches):
            y = self.x
            for _ in range(8):
                y = torch.tanh(y @ self.x)
            dist.all_reduce(y)
            torch.cuda.synchronize()
            time.sleep(0.005)  # an idle gap on the GPU
            self.prof.step()


@pytest.fixture
def one_rank_nccl(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_compute_and_idle_agree_with_hta(tmp_path: Path, one_rank_nccl: Any) -> None:
    policy = {"version": 1, "output_dir": str(tmp_path),
              "roles": {"actor": {"enabled": True, "steps": [1], "regions": ["update_actor"],
                                  "torch": {"activities": ["cpu", "cuda"]},
                                  "name": "actor/step<step>/rank<rank>"}}}
    worker = Worker()
    worker.prof = apply_policy(worker, "actor", policy, Topology(rank=0, world=1))
    with worker.prof.training_step(1):
        worker.update_actor(6)
    worker.prof.close()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["analyze", str(tmp_path), "--hta", "--format", "json", "--jobs", "1"]) == 0
    (window,) = json.loads(out.getvalue())["windows"]
    (ours,) = window["ranks"]
    # (NCCL may copy rather than launch a kernel for one rank: comm kernels are optional)
    assert ours["basis"] == "gpu"
    assert window["hta"]["error"] is None, window["hta"]
    (theirs,) = window["hta"]["ranks"]
    device = ours["device"]
    print("ours:", device, "HTA:", theirs)  # the note of what was measured
    assert device["compute_us"] == pytest.approx(theirs["compute_us"], rel=0.05)
    assert device["idle_us"] == pytest.approx(theirs["idle_us"], rel=0.05)
    assert device["kernel_us"] == pytest.approx(theirs["kernel_us"], rel=0.05)
