"""policy-engine traces: manifests of every process merged, strays and gaps flagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, profile_session
from policy_engine.cli.main import main
from policy_engine.testing import recording_backend


def profile(out: Path, rank: int, steps: list[int]) -> None:
    policy = {"version": 1, "output_dir": str(out),
              "roles": {"actor": {"enabled": True, "ranks": "all", "steps": steps}}}
    prof = profile_session(policy, "actor", Topology(rank=rank, world=2))
    for n in range(max(steps) + 1):
        with prof.training_step(n):
            prof.step()


@pytest.fixture
def out(tmp_path: Path) -> Path:
    with recording_backend("torch"):
        profile(tmp_path / "out", 0, [1, 2])
        profile(tmp_path / "out", 1, [2])
    return tmp_path / "out"


def run_json(out: Path, capsys: Any) -> dict[str, Any]:
    assert main(["traces", str(out), "--format", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_rows_from_every_manifest(out: Path, capsys: Any) -> None:
    data = run_json(out, capsys)
    assert [(r["role"], r["rank"], r["steps"], r["status"]) for r in data["traces"]] == [
        ("actor", 0, [1], "complete"), ("actor", 0, [2], "complete"),
        ("actor", 1, [2], "complete")]
    assert all(r["exists"] for r in data["traces"])
    assert data["unlisted"] == [] and data["missing"] == []


def test_strays_and_missing_files_are_flagged(out: Path, capsys: Any) -> None:
    first = sorted(p for p in out.iterdir() if p.suffix == ".rec")[0]
    first.unlink()
    (out / "someone_else.pt.trace.json").write_text("{}")
    (out / "sub").mkdir()
    (out / "sub" / "stray.nsys-rep").write_text("")
    data = run_json(out, capsys)
    assert data["missing"] == [first.name]
    assert data["unlisted"] == ["someone_else.pt.trace.json", os.path.join("sub", "stray.nsys-rep")]
    assert main(["traces", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"missing: {first.name} (a manifest names it, but it is not on disk)" in text
    assert "unlisted: someone_else.pt.trace.json (on disk, but no manifest names it)" in text
    assert "3 captures (3 complete)" in text


def test_not_a_folder_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    assert main(["traces", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_torn_manifest_lines_are_skipped(out: Path, capsys: Any) -> None:
    manifest = next((out / "manifests").iterdir())
    with open(manifest, "a") as f:
        f.write('{"role": "actor", "rank": 0, "pa')  # a crash mid-write
    assert len(run_json(out, capsys)["traces"]) == 3


@pytest.mark.slow
def test_demo_runs_and_lists_its_traces(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "policy_engine", "demo", "--out",
                           str(tmp_path / "demo")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "rollout+actor+ref" in done.stdout and "2 captures (2 complete)" in done.stdout
    traces = sorted((tmp_path / "demo").glob("*.pt.trace.json.gz"))
    assert [t.name.split("_")[2] for t in traces] == ["step2", "step3"]
    assert "ui.perfetto.dev" in done.stdout
