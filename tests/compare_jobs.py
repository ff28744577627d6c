"""Real 4-rank torchrun jobs (gloo, CPU) for the comparison and analysis tests and the
benchmark: the straggler worker's job, unchanged or changed (extra matrix multiplications
in its update_actor region on every rank, a slow rank, another world size, other
activities).

The tests share them: ``StragglerJobs`` (the ``straggler_jobs`` fixture of conftest.py)
runs each job of ``JOBS`` once per session, when a test first asks for it, so that
test_compare_e2e, test_analyze_e2e and test_summaries_e2e start eight jobs between them,
not eleven. The tests only read what a job wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
#: The slow rank, and how much longer it computes before every all-reduce: well above
#: what a loaded machine's scheduling adds to a step, so that it is named every time.
SLOW, EXTRA_MS = 2, 250
EXTRA_MM = 300  # more 256x256 matrix multiplications per update_actor, on every rank
#: A smaller change: about 60% more time per step on a loaded 2-core machine (the step
#: takes some 30 ms there, and each 256x256 product about 1.3 ms), recorded in 8 steps a
#: window, as few as the rank-sum test can decide on (7 compared, the first left out).
SOME_MM, FEW_STEPS = 14, 8
#: The shared jobs: base and again are the same job twice; slow writes each rank's files
#: under a folder of its own (run/node<rank>), as ranks on separate hosts would. The jobs
#: of a group run one after the other when any of them is first asked for, so that the
#: changed jobs and the base they are compared with ran close together, under the same
#: load.
TOGETHER = (("base", "again", "mm", "slow"), ("few", "some"))
JOBS: dict[str, dict[str, Any]] = {
    "base": {},
    "again": {},
    "mm": {"extra_mm": EXTRA_MM},
    "slow": {"slow": SLOW, "extra_ms": EXTRA_MS, "nodes": True},
    "two": {"world": 2},
    "shapes": {"activities": "cpu, cuda", "shapes": True},
    "few": {"inner": FEW_STEPS},
    "some": {"inner": FEW_STEPS, "extra_mm": SOME_MM},
}


def run_job(folder: Path, *, windows: int = 2, world: int = 4, slow: int = -1,
            extra_ms: float = 0.0, extra_mm: int = 0, activities: str = "cpu",
            shapes: bool = False, inner: int = 12, nodes: bool = False) -> Path:
    """One job under ``folder`` (``inner`` steps per window on every rank: the samples
    of compare's test); its output folder (``run``, holding node0... with ``nodes``)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = POLICY.format(activities=activities, shapes=str(shapes).lower())
    (folder / "policy.yaml").write_text(text)
    env = dict(child_env(), EXTRA_MM=str(extra_mm), INNER_STEPS=str(inner))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={world}", str(WORKER), "policy.yaml", str(windows), str(slow),
         str(extra_ms), *(["run/node{rank}"] if nodes else [])], cwd=folder, env=env,
        capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-4000:] + done.stderr[-4000:])
    return folder / ("run" if nodes else "profiles")


class StragglerJobs:
    """The jobs of ``JOBS`` under ``root``, each run the first time it is asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, Path | RuntimeError] = {}

    def __getitem__(self, name: str) -> Path:
        group = next((g for g in TOGETHER if name in g), (name,))
        for job in group:
            if job not in self.done:
                try:
                    self.done[job] = run_job(self.root / job, **JOBS[job])
                except RuntimeError as err:  # each test that needs it fails; none runs it again
                    self.done[job] = err
        found = self.done[name]
        if isinstance(found, RuntimeError):
            raise RuntimeError(f"the {name} job failed") from found
        return found


def compare(base: Path, new: Path) -> dict[str, Any]:
    """``policy-engine compare --format json`` of two output folders, as a user runs it."""
    import json

    done = subprocess.run([sys.executable, "-m", "policy_engine", "compare", str(base),
                           str(new), "--format", "json", "--jobs", "2"], env=child_env(),
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=os.getcwd())
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-4000:])
    result: dict[str, Any] = json.loads(done.stdout)
    return result
