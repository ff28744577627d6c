"""Real 4-rank torchrun jobs (gloo, CPU) for the comparison tests and benchmark: the
straggler worker's job, unchanged or changed (extra matrix multiplications in its
update_actor region on every rank, a slow rank, another world size, other activities)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from job_env import child_env

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "dist_scripts" / "straggler_worker.py"
TIMEOUT = 300
POLICY = """\
version: 1
prefix: cmp
output_dir: profiles
roles:
  trainer:
    enabled: true
    ranks: all
    steps: all
    regions: [update_actor]
    torch: {{activities: [{activities}], record_shapes: {shapes}}}
"""


def run_job(folder: Path, *, windows: int = 2, world: int = 4, slow: int = -1,
            extra_ms: float = 0.0, extra_mm: int = 0, activities: str = "cpu",
            shapes: bool = False, inner: int = 8) -> Path:
    """One job under ``folder`` (``inner`` steps per window on every rank: the samples
    of compare's test); its output folder."""
    folder.mkdir(parents=True, exist_ok=True)
    text = POLICY.format(activities=activities, shapes=str(shapes).lower())
    (folder / "policy.yaml").write_text(text)
    env = dict(child_env(), EXTRA_MM=str(extra_mm), INNER_STEPS=str(inner))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(WORKER), "policy.yaml", str(windows), str(slow),
         str(extra_ms)], cwd=folder, env=env, capture_output=True, text=True,
        timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-4000:] + done.stderr[-4000:])
    return folder / "profiles"


def compare(base: Path, new: Path) -> dict:
    """``policy-engine compare --format json`` of two output folders, as a user runs it."""
    import json

    done = subprocess.run([sys.executable, "-m", "policy_engine", "compare", str(base),
                           str(new), "--format", "json", "--jobs", "2"], env=child_env(),
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=os.getcwd())
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-4000:])
    return json.loads(done.stdout)
