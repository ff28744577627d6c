"""One window, one name: the flagship verl policy run on 2 and 3 real processes writes
every rank's trace of a step into one folder, `merge --role actor --step 2` joins them,
and Holistic Trace Analysis maps every rank of that folder.

policies/verl_ppo.yaml colocates rollout, actor and ref; the actor and ref profile the
first and last rank, the rollout rank 0 only. So rank 0's capture holds three roles and
the last rank's two, yet both are named after the whole group; on 3 processes the rank
between them writes nothing (a larger world adds more such ranks, and only time).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from job_env import plain_sigterm

from policy_engine import Topology, compile_plan, load_policy
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.analysis.run import analyze
from policy_engine.analysis.window_roles import families, holds, label, participants
from policy_engine.cli.main import main
from policy_engine.runtime.process.manifest import append

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "policies" / "verl_ppo.yaml"
WORKER = ROOT / "tests" / "dist_scripts" / "verl_window_worker.py"
WINDOW = "actor+ref+rollout"


def run_job(out: Path, world: int) -> None:
    """``world`` processes of the verl stand-in, two training steps each (step 2 profiled)."""
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), str(POLICY), str(out), "2"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for rank, proc in enumerate(procs):
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"rank {rank}:\n{output}"


def predicted(world: int, rank: int) -> re.Pattern[str]:
    """The trace name explain predicts for ``rank`` at step 2, late fields as patterns."""
    plan = compile_plan(load_policy(str(POLICY)), "actor", Topology.for_rank(rank, world))
    name = plan.capture_name(first=2, region=None, cycle=None)
    parts = re.split(r"(<pid>|<timestamp>)", name)
    return re.compile("".join(r"\d+" if p in ("<pid>", "<timestamp>") else re.escape(p)
                              for p in parts) + r"\.pt\.trace\.json(\.gz)?")


def trace_metadata(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    return data


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_the_flagship_policy_writes_one_window_per_step(tmp_path: Path, world: int) -> None:
    out = tmp_path / "ppo"
    run_job(out, world)
    last = world - 1
    traces = sorted(out.rglob("*.pt.trace.json*"))
    # One folder for the step, holding the trace of every rank that profiles it.
    assert {t.parent.relative_to(out).as_posix() for t in traces} == {f"{WINDOW}/step2"}
    assert len(traces) == 2
    for rank in (0, last):  # the names explain predicts, on every rank
        pattern = predicted(world, rank)
        assert [t for t in traces if pattern.fullmatch(t.relative_to(out).as_posix())], \
            (pattern.pattern, traces)

    # The manifest says which roles took part on each rank; the name does not change.
    lines = [r for r in scan_manifests(str(out)).records if r["event"] in ("open", "trace")]
    taking_part = {(r["event"], r["rank"]): r["roles"] for r in lines}
    assert taking_part == {("open", 0): ["actor", "ref", "rollout"],
                           ("trace", 0): ["actor", "ref", "rollout"],
                           ("open", last): ["actor", "ref"],
                           ("trace", last): ["actor", "ref"]}
    # ... and so does each trace's own metadata, beside its role and rank.
    for trace in traces:
        data = trace_metadata(trace)
        meta = data["policy_engine"]
        assert meta["roles"] == (["actor", "ref", "rollout"] if meta["rank"] == 0
                                 else ["actor", "ref"])
        assert data["distributedInfo"]["rank"] == meta["rank"]

    # merge --role actor --step 2 joins the whole window.
    merged = tmp_path / "merged.pt.trace.json"
    assert main(["merge", str(out), "--role", "actor", "--step", "2", "-o", str(merged)]) == 0
    joined = json.loads(merged.read_text())
    assert joined["policy_engine_merge"]["ranks"] == [0, last]
    assert joined["policy_engine_merge"]["role"] == WINDOW
    names = sorted({e["args"]["name"] for e in joined["traceEvents"]
                    if e.get("ph") == "M" and e.get("name") == "process_name"
                    and str(e["args"].get("name", "")).startswith("rank ")})
    assert names == [f"rank 0 ({WINDOW})", f"rank {last} (actor+ref)"]

    # Holistic Trace Analysis, on the step folder, maps every rank.
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    with plain_sigterm():
        analysis = trace_analysis.TraceAnalysis(trace_dir=str(out / WINDOW / "step2"))
    assert analysis.t.get_ranks() == [0, last]


def line(**fields: Any) -> dict[str, Any]:
    return {"event": "trace", **fields}


def test_participants_and_families_of_manifest_lines() -> None:
    rank0 = line(role="rollout", roles=["actor", "ref", "rollout"], joined=["actor", "ref"])
    rank1 = line(role="actor", roles=["actor", "ref"], joined=["ref"])
    undeclared = line(role="critic", joined=["reward"])
    old = line(role="actor+ref")  # a manifest written before `roles`
    damaged = line(role="x", roles="actor")  # not a list: ignored, `role` decides
    assert participants(rank0) == ("actor", "ref", "rollout")
    assert label(rank1) == "actor+ref" and label(undeclared) == "critic+reward"
    assert participants(old) == ("actor", "ref") and participants(damaged) == ("x",)
    assert holds(rank1, "actor") and holds(old, "ref") and holds(rank0, "actor+rollout")
    assert not holds(rank1, "rollout") and not holds(undeclared, "actor")
    found = families([rank1, undeclared, rank0, old])
    assert found == {"actor+ref": WINDOW, WINDOW: WINDOW, "critic+reward": "critic+reward"}
    assert families([line(role="actor", roles=["actor"]),
                     line(role="actor", roles=["actor", "ref"])]) == {"actor": "actor+ref",
                                                                      "actor+ref": "actor+ref"}


def write_window(out: Path, lines: list[dict[str, Any]]) -> None:
    """Tiny torch-shaped traces and the manifest lines that name them, one per rank."""
    for index, fields in enumerate(lines):
        rank = fields["rank"]
        path = out / f"w/step{fields['steps'][0]}/t_rank{rank}_{index}.pt.trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "schemaVersion": 1, "baseTimeNanoseconds": 1_790_857_026_000_000_000,
            "distributedInfo": {"rank": rank, "world_size": 8},
            "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7,
                             "tid": 7, "ts": 10.0 + rank, "dur": 5.0}]}))
        append(str(out), {"event": "trace", "capture": f"c{index}", "joined": [],
                          "region": None, "world": 8, "pid": 7, "backend": "torch",
                          "cycle": None, "inner_steps": [0], "bytes": 1,
                          "status": "complete", "start": 100.0 + index,
                          "end": 101.0 + index, "path": str(path.relative_to(out)),
                          **fields})


@pytest.mark.parametrize("old", [False, True])
def test_merge_and_analyze_take_role_as_every_window_holding_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: bool) -> None:
    """Rank 0 holds actor, ref and rollout, rank 7 actor and ref; step 4 is the rollout's
    alone. ``old``: manifests from before ``roles``, whose ``role`` says them all."""
    def who(roles: list[str]) -> dict[str, Any]:
        return {"role": "+".join(roles)} if old else {"role": roles[0], "roles": roles}

    write_window(tmp_path, [
        {"rank": 0, "steps": [2], **who(["actor", "ref", "rollout"])},
        {"rank": 7, "steps": [2], **who(["actor", "ref"])},
        {"rank": 0, "steps": [4], **who(["rollout"])}])
    merged = tmp_path / "m.pt.trace.json"
    assert main(["merge", str(tmp_path), "--role", "actor", "-o", str(merged)]) == 0
    assert json.loads(merged.read_text())["policy_engine_merge"]["ranks"] == [0, 7]
    # Without --role the folder holds one role family, two windows: --step picks one.
    assert main(["merge", str(tmp_path), "-o", str(merged), "--force"]) == 2
    assert "2 capture windows of actor+ref+rollout match" in capsys.readouterr().err
    assert main(["merge", str(tmp_path), "--role", "rollout", "--step", "4", "-o",
                 str(merged), "--force"]) == 0
    assert main(["merge", str(tmp_path), "--role", "critic", "-o", str(tmp_path / "n.json")]) \
        == 2
    assert "it holds actor+ref+rollout" in capsys.readouterr().err

    found = analyze(str(tmp_path), role="actor")
    assert [(w["role"], w["steps"], [r["rank"] for r in w["ranks"]])
            for w in found["windows"]] == [(WINDOW, [2], [0, 7])]
    rollout = analyze(str(tmp_path), role="rollout")["windows"]
    assert [w["steps"] for w in rollout] == [[2], [4]]
    # Rank 7 never runs the rollout: the rollout's own window does not miss it.
    assert not [r for w in rollout for r in w["readiness"] if r["code"] == "ranks_missing"]
    # The report has one section for the window, not one per set of roles taking part.
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "-o", str(page)]) == 0
    sections = re.findall(r"<section><h2>([^<]*)</h2>", page.read_text())
    assert sections == [WINDOW]


def test_a_window_misses_a_rank_of_a_role_it_holds(tmp_path: Path) -> None:
    """Rank 0 (the only rollout rank) wrote step 2 but not step 3: the step-3 window,
    which holds only the actor and ref on rank 7, still misses rank 0, an actor rank."""
    write_window(tmp_path, [
        {"rank": 0, "steps": [2], "role": "rollout", "roles": ["actor", "ref", "rollout"]},
        {"rank": 7, "steps": [2], "role": "actor", "roles": ["actor", "ref"]},
        {"rank": 7, "steps": [3], "role": "actor", "roles": ["actor", "ref"]}])
    found = analyze(str(tmp_path), role="actor")["windows"]
    assert [w["role"] for w in found] == [WINDOW, WINDOW]
    missing = [[r["ranks"] for r in w["readiness"] if r["code"] == "ranks_missing"]
               for w in found]
    assert missing == [[], [[0]]]
