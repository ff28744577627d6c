"""The RL step end to end on real 4-rank torchrun jobs (gloo, CPU): the actor and its ref
on ranks 0-1, the rollout on ranks 2-3, stages named as verl names them
(tests/dist_scripts/rl_step_worker.py), steps 3 and 4 profiled. Each rank measures its
clock's offset to rank 0's over the job's store; `policy-engine timeline` lays every rank
on one axis from the manifests' summaries. The same job again with rank 3's clock moved 2 s
ahead (the test setting): the timeline is the same within the reported uncertainty, and
without the offsets it would not be."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from job_env import child_env, run_cli

from policy_engine.analysis.manifests import scan_manifests

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "dist_scripts" / "rl_step_worker.py"
GEN_MS = 1000  # the worker's generate
POLICY = """\
version: 1
output_dir: profiles
colocate: [[actor, ref]]
defaults:
  steps: [3, 4]
  torch: {activities: [cpu]}
  keep: summaries
roles:
  actor: {enabled: true, ranks: "0-1", regions: [actor_update]}
  ref: {enabled: true, ranks: "0-1", regions: [ref_compute_log_prob]}
  rollout: {enabled: true, ranks: "2-3", regions: [generate_sequences, sync_weights]}
"""


def run_job(folder: Path, *shift: str) -> Path:
    folder.mkdir()
    (folder / "policy.yaml").write_text(POLICY)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
         str(WORKER), "policy.yaml", "5", *shift], cwd=folder, env=child_env(),
        capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Summaries alone: a trace stays only where its summary did not complete (a loaded
    # machine's rank may exit before its last summary is made: the manifest says "cut")
    out = folder / "profiles"
    unsummarised = {r["path"] for r in scan_manifests(str(out)).records
                    if r["event"] == "summary" and r.get("status") != "complete"}
    left = {p.relative_to(out).as_posix() for p in out.rglob("*.pt.trace.json*")}
    assert left <= unsummarised, (left, unsummarised)
    return out


def timeline(out: Path, *extra: str) -> dict[str, Any]:
    done = run_cli("timeline", str(out), "--format", "json", *extra, cwd=out, timeout=300)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def clock_notes(out: Path) -> dict[int, list[dict[str, Any]]]:
    notes: dict[int, list[dict[str, Any]]] = {}
    for path in (out / "manifests").glob("*.jsonl"):
        for line in map(json.loads, path.read_text().splitlines()):
            if line["event"] == "note" and line["note"] == "clock":
                notes.setdefault(line["rank"], []).append(line)
    return notes


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_job(tmp_path_factory.mktemp("rl") / "plain")


@pytest.fixture(scope="module")
def shifted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_job(tmp_path_factory.mktemp("rl") / "shifted", "3", "2")


def phases(step: dict[str, Any], role: str, name: str) -> list[dict[str, Any]]:
    return [p for r in step["rows"] if r["role"] == role for p in r["phases"]
            if p["name"] == name]


def ranks_of(step: dict[str, Any]) -> set[int]:
    found: set[int] = set()
    for row in step["rows"]:
        for part in row["ranks"].split(","):
            lo, _, hi = part.partition("-")
            found |= set(range(int(lo), int(hi or lo) + 1))
    return found


def union(spans: Iterable[tuple[float, float]]) -> float:
    """How long the spans cover together."""
    total, reach = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        lo = max(lo, reach)
        if hi > lo:
            total, reach = total + hi - lo, hi
    return total


def check_step(step: dict[str, Any]) -> None:
    """What the timeline of one step of the job must say."""
    assert ranks_of(step) == {0, 1, 2, 3}  # every rank on the one axis
    assert {r["role"] for r in step["rows"]} == {"actor+ref", "rollout"}
    generate, update = phases(step, "rollout", "generate_sequences"), \
        phases(step, "actor+ref", "actor_update")
    gen_lo = min(p["start_us"] for p in generate)
    gen_hi = max(p["end_us"] for p in generate)
    tol = 2 * step["uncertainty_us"] + 20_000
    # the rollout generates before the actor updates (on its batch)
    assert all(p["start_us"] >= gen_hi - tol for p in update), (generate, update)
    # the actor ranks wait while the rollout generates, and it is said so: for as long as
    # some rollout rank runs generate_sequences itself (less the collective it ends in,
    # waiting for its peer: a loaded machine's rollout ranks can start a second apart)
    waits = [w for w in step["waits"] if w["role"] == "actor+ref"
             and w["for_role"] == "rollout" and w["phase"] == "generate_sequences"]
    assert waits, step["waits"]
    assert gen_hi - gen_lo >= GEN_MS * 1000 * 0.8
    running = union((p["start_us"] + p["lead_us"], p["end_us"] - p["tail_us"])
                    for p in generate)
    assert running >= GEN_MS * 1000 * 0.8, generate
    for row in (r for r in step["rows"] if r["role"] == "actor+ref"):
        waited = sum(w["wait_us"] for w in waits if w["ranks"] == row["ranks"])
        assert waited == pytest.approx(running, rel=0.2), (waited, running, step["waits"])
    path = [(p["role"], p["phase"]) for p in step["critical_path"]]
    assert path[0] == ("rollout", "generate_sequences"), path
    assert path.index(("actor+ref", "actor_update")) > 0, path


def test_every_rank_measured_its_clock_over_the_store(plain: Path) -> None:
    # the clock's listeners read no request: nothing tells `policy-engine trigger` that
    # someone listens
    assert not (plain / "triggers").exists()
    notes = clock_notes(plain)
    assert sorted(notes) == [0, 1, 2, 3]
    assert [n["why"] for n in notes[0]] == ["reference"]
    for rank in (1, 2, 3):
        good = [n for n in notes[rank] if "offset_us" in n]
        assert {n["why"] for n in good} >= {"start", "capture"}, notes[rank]
        # one host: the offsets are within their uncertainty (and a loaded scheduler's)
        assert all(abs(n["offset_us"]) <= n["uncertainty_us"] + 50_000 for n in good)
        assert all(n["channel"] == "store" and n["reference_rank"] == 0 for n in good)


def test_the_timeline_lays_the_rl_step_on_one_axis(plain: Path) -> None:
    found = timeline(plain)
    assert found["clock"]["basis"] == "measured"
    assert [s["step"] for s in found["steps"]] == [3, 4]
    for step in found["steps"]:
        check_step(step)
        assert step["missing"] == []


def test_a_clock_two_seconds_ahead_is_brought_back(shifted: Path, plain: Path) -> None:
    notes = [n for n in clock_notes(shifted)[3] if "offset_us" in n]
    assert notes and all(n["offset_us"] == pytest.approx(-2e6, abs=n["uncertainty_us"]
                                                         + 50_000) for n in notes)
    corrected, own = timeline(shifted), timeline(shifted, "--own-clocks")
    for step in corrected["steps"]:
        check_step(step)  # the same timeline as the job without a shift
    # the rollout ranks end generate together (an all-reduce between them): with the
    # offsets, at the same time within the uncertainty; on their own clocks, 2 s apart
    for fixed, raw in zip(corrected["steps"], own["steps"], strict=True):
        def ends(step: dict[str, Any]) -> dict[str, float]:
            return {r["ranks"]: p["end_us"] for r in step["rows"] if r["role"] == "rollout"
                    for p in r["phases"] if p["name"] == "generate_sequences"}
        together = ends(fixed)
        assert len(together) == 1 or abs(together["2"] - together["3"]) <= \
            2 * fixed["uncertainty_us"] + 50_000, together
        apart = ends(raw)
        assert apart["3"] - apart["2"] == pytest.approx(2e6, abs=100_000), apart
    plain_path = [[(p["role"], p["phase"]) for p in s["critical_path"]]
                  for s in timeline(plain)["steps"]]
    assert [[(p["role"], p["phase"]) for p in s["critical_path"]]
            for s in corrected["steps"]] == plain_path
