"""A 4-rank torchrun job (gloo, CPU) with one slow rank, each rank writing under a folder
of its own (as on node-local disks): analysed from the manifests alone, its traces
deleted, it gives the same answers (straggler, step times, breakdown, readiness) as
``analyze --from-traces`` on a copy that kept them. The job is compare_jobs.JOBS["slow"],
shared with test_compare_e2e and test_analyze_e2e; this test works on copies of it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from compare_jobs import SLOW, StragglerJobs
from job_env import run_cli

from policy_engine.analysis import scan

pytestmark = pytest.mark.slow

TIMEOUT = 300
WINDOWS = 2


def _analyze(folder: Path, *flags: str) -> dict[str, Any]:
    done = run_cli("analyze", str(folder), "--format", "json", "--jobs", "2", *flags,
                   cwd=folder.parent, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    del result["root"]  # the folders differ; nothing else may
    return result


def _rounded(value: Any) -> Any:
    """``value`` with every float to 1 ns (the summaries and the traces are summed the
    same way, but a float written and read back may differ in its last digit)."""
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@pytest.fixture(scope="module")
def job(straggler_jobs: StragglerJobs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("nodes")
    shutil.copytree(straggler_jobs["slow"], folder / "run")
    run = folder / "run"
    assert sorted(p.name for p in run.iterdir()) == ["node0", "node1", "node2", "node3"]
    found = scan(str(run))
    assert len(found.windows) == WINDOWS and found.problems == ()
    for w in found.windows:  # every rank summarised its own trace
        assert w.ranks == w.summarised == (0, 1, 2, 3)
    summaries = [r for r in found.records if r["event"] == "summary"]
    assert len(summaries) == 4 * WINDOWS
    assert {r["status"] for r in summaries} == {"complete"}
    shutil.copytree(run, folder / "kept")
    traces = list(run.rglob("*.pt.trace.json*"))
    assert len(traces) == 4 * WINDOWS
    for path in traces:  # what stays on the nodes' disks: the manifests only
        path.unlink()
    return run


def test_a_run_on_node_local_disks_is_analysed_from_its_manifests(job: Path) -> None:
    kept = job.parent / "kept"
    alone = _analyze(job)
    read = _analyze(kept, "--from-traces")
    assert _rounded(alone) == _rounded(read)
    assert [w["straggler"]["rank"] if w["straggler"] else None for w in alone["windows"]] \
        == [SLOW] * WINDOWS
    for w in alone["windows"]:
        assert [r["rank"] for r in w["ranks"]] == [0, 1, 2, 3]
        assert all(not r.get("error") for r in w["ranks"])
        assert w["breakdown"]["compute_us"]["max"] > 0


def test_from_traces_without_the_traces_says_they_are_missing(job: Path) -> None:
    result = _analyze(job, "--from-traces")
    for w in result["windows"]:
        assert {r["error"].split(":")[0] for r in w["ranks"]} == {"missing"}
