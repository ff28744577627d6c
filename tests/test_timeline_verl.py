"""The step timeline of a colocated verl job through the plugin: verl's hybrid engine (the
actor, its rollout and its ref in one worker process) built from verl's own DistProfiler
and stage decorators (tests/verl_scripts/hybrid_step_worker.py), two torchrun ranks (gloo),
steps 3 and 4 profiled. Its stages are the plugin's regions, and the timeline gives them
in sequence with their shares of the step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from job_env import child_env, run_cli

pytest.importorskip("verl.utils.profiler", reason="verl is not installed (scripts/install_verl.sh)")

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "verl_scripts" / "hybrid_step_worker.py"
STAGES = ["generate_sequences", "actor_compute_log_prob", "ref_compute_log_prob",
          "actor_update"]
#: each stage's time in the worker (ms)
TIMES = [400, 100, 100, 200]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hybrid")
    policy = {"version": 1, "output_dir": str(root / "out"),
              "colocate": [["actor", "rollout", "ref"]],
              "defaults": {"steps": [3, 4], "ranks": "all",
                           "torch": {"activities": ["cpu"]}},
              "roles": {role: {"enabled": True} for role in ("actor", "rollout", "ref")}}
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    env = {**child_env(), "PROFILE_POLICY": str(root / "policy.yaml")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(WORKER), "5", "3,4"], cwd=root, env=env, capture_output=True, text=True,
        timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = run_cli("timeline", str(root / "out"), "--format", "json", cwd=root,
                    timeout=300)
    assert found.returncode == 0, found.stderr
    text = run_cli("timeline", str(root / "out"), cwd=root, timeout=300)
    return {"timeline": json.loads(found.stdout), "text": text.stdout}


def test_the_hybrid_workers_stages_are_its_phases_in_sequence(hybrid: dict[str, Any]) -> None:
    timeline = hybrid["timeline"]
    assert [s["step"] for s in timeline["steps"]] == [3, 4]
    assert timeline["clock"]["basis"] == "measured"
    for step in timeline["steps"]:
        ranks: set[str] = set()
        for row in step["rows"]:
            assert set(row["role"].split("+")) == {"actor", "rollout", "ref"}
            assert row["colocated"]
            assert [p["name"] for p in row["phases"]] == STAGES
            ends = [p["end_us"] for p in row["phases"]]
            assert ends == sorted(ends)  # in sequence
            lengths = [p["end_us"] - p["start_us"] for p in row["phases"]]
            # each stage as long as the worker made it, relative to the others (the update
            # also waits for the other rank in its all-reduce: it may take more)
            assert lengths[0] / lengths[1] == pytest.approx(TIMES[0] / TIMES[1], rel=0.25)
            assert lengths[2] / lengths[1] == pytest.approx(1.0, rel=0.25)
            assert lengths[3] >= 0.8 * TIMES[3] * 1000
            # the shares of the step's span, and together they fill what the row recorded
            assert [p["share"] for p in row["phases"]] == [
                pytest.approx(n / step["span_us"], abs=1e-3) for n in lengths]
            assert row["busy_us"] + row["wait_us"] + row["idle_us"] == pytest.approx(
                row["span"][1] - row["span"][0], abs=1)
            assert sum(lengths) > 0.9 * (row["span"][1] - row["span"][0])
            ranks.add(row["ranks"])
        assert ranks in ({"0-1"}, {"0", "1"})
        assert [p["phase"] for p in step["critical_path"]][-1] == "actor_update"
    label = timeline["steps"][0]["rows"][0]["role"]
    assert f"{label} ranks 0-1: generate_sequences" in hybrid["text"] or \
        f"{label} rank 0: generate_sequences" in hybrid["text"]
