"""Real multi-process runs: torchrun on one and on two "nodes", and Ray actors.

The processes run tests/dist_scripts/*; each writes a JSON report of what it saw. The
policy's predictions (`policy-engine explain`) are checked against what the job wrote
(`policy-engine traces`).
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from job_env import child_env

from policy_engine.plan.topology import Topology

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "dist_scripts"
TRACE_EXT = ".pt.trace.json.gz"
TIMEOUT = 180  # a hung rank must fail the test, not CI


@attrs.frozen
class Run:
    policy: Path
    profiles: Path
    reports: dict[int, dict[str, Any]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run(commands: Sequence[Sequence[str]], cwd: Path) -> None:
    """Start every command at once (like launchers on separate nodes) and wait for all."""
    procs = [
        subprocess.Popen(
            cmd, cwd=cwd, env=child_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True
        )
        for cmd in commands
    ]
    failures = []
    for cmd, proc in zip(commands, procs, strict=True):
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            failures.append(f"{' '.join(cmd)}: timed out after {TIMEOUT}s\n{out[-4000:]}")
            continue
        if proc.returncode:
            failures.append(f"{' '.join(cmd)}: exit {proc.returncode}\n{out[-4000:]}")
    assert not failures, "\n\n".join(failures)


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _cli(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "policy_engine", *args, "--format", "json"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _reports(folder: Path) -> dict[int, dict[str, Any]]:
    reports = [json.loads(p.read_text()) for p in folder.glob("rank*.json")]
    return {r["rank"]: r for r in reports}


def _traces(profiles: Path) -> list[Path]:
    return sorted(p for p in profiles.rglob("*") if p.name.endswith(TRACE_EXT))


def _names(profiles: Path) -> list[str]:
    """The trace files under ``profiles``, as paths relative to it (the manifest's)."""
    return [p.relative_to(profiles).as_posix() for p in _traces(profiles)]


def _template_regex(name: str) -> re.Pattern[str]:
    """explain's example name with its <pid>/<timestamp> placeholders as wildcards."""
    parts = re.split(r"(<[a-z_:]+>)", name)
    return re.compile(
        "".join("[0-9A-Za-z.=+-]+" if p.startswith("<") else re.escape(p) for p in parts)
        + re.escape(TRACE_EXT)
    )


# --- torchrun, one node, a DeviceMesh ---------------------------------------------------

MESH_POLICY = """\
version: 1
prefix: dist
output_dir: profiles
mesh: {dp: 2, tp: 2}
defaults:
  backend: torch
  steps: [2, 3]
  torch: {activities: [cpu]}
roles:
  actor:
    enabled: true
    ranks: {tp: 0}
    regions: [update_actor]
"""
LINGER = 120  # at most: a profiled rank lingers until the ranks that do not profile are done


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """4 ranks, gloo, DeviceMesh (dp=2, tp=2); profiled ranks linger in their last step
    until the others have finished."""
    root = tmp_path_factory.mktemp("torchrun")
    policy = root / "policy.yaml"
    policy.write_text(MESH_POLICY)
    worker = str(SCRIPTS / "train_worker.py")
    args = [str(policy), "reports", "--mesh", "dp,tp", "--linger", str(LINGER)]
    _run([_torchrun("--standalone", "--nproc-per-node=4", worker, *args)], cwd=root)
    return Run(policy, root / "profiles", _reports(root / "reports"))


def test_only_selected_ranks_write_traces(mesh_run: Run) -> None:
    names = _names(mesh_run.profiles)
    assert len(names) == 4, names
    for rank, coords in ((0, "tp0dp0"), (2, "tp0dp1")):
        for step in (2, 3):
            pattern = rf"actor/step{step}/dist_rank{rank}-of-4_{coords}_pid\d+_\d{{17}}"
            assert sum(bool(re.fullmatch(pattern + re.escape(TRACE_EXT), n)) for n in names) == 1
    assert {r["rank"] for r in mesh_run.reports.values() if r["profiled"]} == {0, 2}


def test_traces_carry_their_place(mesh_run: Run) -> None:
    for path in _traces(mesh_run.profiles):
        with gzip.open(path) as f:
            meta = json.load(f)["policy_engine"]
        rank = meta["rank"]
        assert (meta["role"], meta["world"]) == ("actor", 4)
        assert meta["coords"] == {"dp": rank // 2, "tp": 0}


def test_live_topology_is_what_explain_assumes(mesh_run: Run) -> None:
    assert sorted(mesh_run.reports) == [0, 1, 2, 3]
    for rank, report in mesh_run.reports.items():
        topo = report["topology"]
        assert topo["source"] == "device_mesh"
        assert topo["coords"] == dict(Topology.for_rank(rank, 4, {"dp": 2, "tp": 2}).coords)


def test_traces_cli_shows_exactly_those_captures(mesh_run: Run) -> None:
    listing = _cli("traces", str(mesh_run.profiles))
    assert listing["unlisted"] == [] and listing["missing"] == []
    rows = listing["traces"]
    assert sorted(r["path"] for r in rows) == _names(mesh_run.profiles)
    assert sorted((r["rank"], tuple(r["steps"])) for r in rows) == [
        (0, (2,)), (0, (3,)), (2, (2,)), (2, (3,)),
    ]  # fmt: skip
    assert {r["status"] for r in rows} == {"complete"}
    assert all(r["coords"] == {"dp": r["rank"] // 2, "tp": 0} for r in rows)


def test_explain_predicted_the_run(mesh_run: Run) -> None:
    predicted = _cli(
        "explain", str(mesh_run.policy), "--role", "actor", "--world", "4",
        "--mesh", "dp=2,tp=2", "--steps", "1-3",
    )  # fmt: skip
    rows = _cli("traces", str(mesh_run.profiles))["traces"]
    profiled = {e["rank"]: e for e in predicted["ranks"] if e["profiled"]}
    assert sorted(profiled) == sorted({r["rank"] for r in rows})
    for rank, entry in profiled.items():
        mine = sorted((r for r in rows if r["rank"] == rank), key=lambda r: r["steps"])
        assert [c["steps"] for c in entry["captures"]] == [r["steps"] for r in mine]
        for capture, row in zip(entry["captures"], mine, strict=True):
            assert _template_regex(capture["name"]).fullmatch(row["path"]), (capture, row)
            assert f"_pid{row['pid']}_" in row["path"]
        assert entry["coords"] == mine[0]["coords"]
    for entry in predicted["ranks"]:
        assert entry["profiled"] == mesh_run.reports[entry["rank"]]["profiled"]


def test_no_rank_waits_for_a_profiling_rank(mesh_run: Run) -> None:
    """Ranks 1 and 3 finish while ranks 0 and 2 still sit inside their last capture (which
    they leave only once the others have finished: a rank that waited for them would keep
    them there until LINGER ran out)."""
    reports = mesh_run.reports.values()
    assert all(r["collectives"] == [] for r in reports)
    assert [r["waited_out"] for r in reports if r["profiled"]] == [False, False]
    lingering = min(r["lingered_until"] for r in reports if r["profiled"])
    finished = max(r["finished"] for r in reports if not r["profiled"])
    assert finished < lingering


# --- torchrun, two "nodes" --------------------------------------------------------------

NODES_POLICY = """\
version: 1
prefix: nodes
output_dir: profiles
defaults:
  backend: torch
  steps: [2]
  torch: {activities: [cpu]}
roles:
  actor:
    enabled: true
    ranks: {local_rank: 0}
    name: "<prefix>_<role>_node<node>-local<local_rank>_rank<rank>-of-<world>_pid<pid>"
"""


def test_two_nodes_profile_one_process_each(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(NODES_POLICY)
    rdzv = [
        "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-id=nodes",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--local-addr=127.0.0.1",
    ]  # fmt: skip
    launcher = _torchrun(*rdzv, str(SCRIPTS / "train_worker.py"), str(policy), "reports")
    _run([launcher, launcher], cwd=tmp_path)

    reports = _reports(tmp_path / "reports")
    places = {r: (p["topology"]["node"], p["topology"]["local_rank"]) for r, p in reports.items()}
    assert places == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    names = sorted(re.sub(r"_pid\d+", "_pid", n) for n in _names(tmp_path / "profiles"))
    assert names == [
        "nodes_actor_node0-local0_rank0-of-4_pid" + TRACE_EXT,
        "nodes_actor_node1-local0_rank2-of-4_pid" + TRACE_EXT,
    ]
    predicted = _cli(
        "explain", str(policy), "--role", "actor", "--world", "4", "--local-world", "2"
    )
    assert [e["rank"] for e in predicted["ranks"] if e["profiled"]] == [0, 2]


# --- Ray --------------------------------------------------------------------------------

RAY_POLICY = """\
version: 1
prefix: ray
output_dir: profiles
defaults:
  backend: torch
  steps: [2]
  torch: {activities: [cpu]}
roles:
  actor: {enabled: true, ranks: [0], regions: [update_actor]}
  rollout: {enabled: true, ranks: [-1], regions: [generate_sequences]}
"""


def test_ray_actors_profile_as_their_role_says(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    policy = tmp_path / "policy.yaml"
    policy.write_text(RAY_POLICY)
    report = tmp_path / "report.json"
    _run([[sys.executable, str(SCRIPTS / "ray_driver.py"), str(policy), str(report)]], tmp_path)

    actors = json.loads(report.read_text())
    assert sorted((a["role"], a["rank"], a["profiled"]) for a in actors) == [
        ("actor", 0, True), ("actor", 1, False), ("rollout", 0, False), ("rollout", 1, True),
    ]  # fmt: skip
    names = sorted(re.sub(r"_pid\d+_\d+", "", n) for n in _names(tmp_path / "profiles"))
    assert names == [
        "actor/step2/ray_rank0-of-2" + TRACE_EXT,
        "rollout/step2/ray_rank1-of-2" + TRACE_EXT,
    ]
    listing = _cli("traces", str(tmp_path / "profiles"))
    assert listing["unlisted"] == [] and listing["missing"] == []
    rows = {(r["role"], r["rank"], r["world"], r["status"]) for r in listing["traces"]}
    assert rows == {("actor", 0, 2, "complete"), ("rollout", 1, 2, "complete")}
    pids = {a["pid"] for a in actors if a["profiled"]}
    assert {r["pid"] for r in listing["traces"]} == pids  # each actor wrote its own
