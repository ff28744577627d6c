"""What users do with a run's traces, on a real 2-process torchrun job (gloo): Holistic
Trace Analysis on one step folder of the default layout, `policy-engine merge` of that
window, and `policy-engine report` of the run in a headless browser."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from job_env import child_env, plain_sigterm, run_cli

from policy_engine.analysis.manifests import read_manifests

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "dist_scripts" / "outputs_worker.py"
TIMEOUT = 180
POLICY = """\
version: 1
prefix: e2e
output_dir: profiles
roles:
  trainer:
    enabled: true
    ranks: all
    steps: [2, 3]
    regions: [update_actor]
    torch: {activities: [cpu]}
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("outputs")
    (folder / "policy.yaml").write_text(POLICY)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node=2", str(WORKER), "policy.yaml", "4"],
        cwd=folder, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return folder


def test_the_default_layout_is_a_folder_per_window_with_a_trace_per_rank(run: Path) -> None:
    records = read_manifests(str(run / "profiles"))
    assert sorted((r["steps"], r["rank"]) for r in records) == [
        ([2], 0), ([2], 1), ([3], 0), ([3], 1)]
    for step in (2, 3):
        names = sorted(p.name for p in (run / "profiles" / "trainer" / f"step{step}").iterdir())
        assert [n.split("_pid")[0] for n in names] == ["e2e_rank0-of-2", "e2e_rank1-of-2"]
        for rank, name in enumerate(names):
            with gzip.open(run / "profiles" / "trainer" / f"step{step}" / name) as f:
                trace = json.load(f)
            info = trace["distributedInfo"]  # torch's own: torch.distributed is up
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo")


def test_holistic_trace_analysis_reads_one_step_folder(
        run: Path, caplog: pytest.LogCaptureFixture) -> None:
    hta = pytest.importorskip("hta.trace_analysis")
    with caplog.at_level(logging.WARNING), plain_sigterm():
        analysis = hta.TraceAnalysis(trace_dir=str(run / "profiles" / "trainer" / "step2"))
    assert "same rank" not in caplog.text
    assert sorted(analysis.t.traces) == [0, 1]
    for rank in (0, 1):
        frame = analysis.t.get_trace(rank)
        names = set(analysis.t.symbol_table.get_sym_table()[i] for i in frame["name"])
        assert "update_actor" in names and any(n.startswith("ProfilerStep#") for n in names)
    if all(analysis.t.get_trace(r)["stream"].ne(-1).any() for r in (0, 1)):
        breakdown = analysis.get_temporal_breakdown(visualize=False)
        assert sorted(breakdown["rank"]) == [0, 1]
    # On a CPU-only run there are no GPU kernels: HTA's temporal breakdown measures kernel
    # time only, so it runs where the traces hold CUDA kernels.


def test_merge_joins_both_ranks_of_a_window(run: Path) -> None:
    out = run / "merged.pt.trace.json.gz"
    done = _cli("merge", "profiles", "--role", "trainer", "--step", "2", "-o", str(out),
                cwd=run)
    assert done.returncode == 0, done.stderr
    with gzip.open(out) as f:
        merged = json.load(f)
    labels = {e["args"]["name"]: e["pid"] for e in merged["traceEvents"]
              if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert sorted(labels) == ["rank 0 (trainer)", "rank 1 (trainer)"]
    for pid in labels.values():
        ops = [e for e in merged["traceEvents"] if e.get("pid") == pid and e.get("ph") == "X"]
        assert any(e["name"] == "update_actor" for e in ops)


def test_report_lists_every_capture_in_a_browser(run: Path) -> None:
    out = run / "report.html"
    done = _cli("report", "profiles", "-o", str(out), cwd=run)
    assert done.returncode == 0, done.stderr
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs it with apt)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", out.as_uri()], capture_output=True, text=True,
                         timeout=TIMEOUT).stdout
    for record in read_manifests(str(run / "profiles")):
        assert record["path"] in dom or Path(record["path"]).name in dom

