"""The wheel carries what the command line needs: `pip install .`, then run from elsewhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_installed_wheel_validates_examples_from_another_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the installed wheel, not a checkout a PYTHONPATH names, is what is run
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "__pycache__", "*.egg-info", ".pytest_cache", ".mypy_cache",
        ".ruff_cache", ".hypothesis", "build", "dist"))
    done = subprocess.run([python, "-m", "pip", "install", "-q", str(src)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "No matching distribution" in done.stderr:
        pytest.skip(f"build dependencies cannot be installed here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    shutil.rmtree(src)
    cli = env / "bin" / "policy-engine"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    policies = sorted((ROOT / "policies").glob("*.yaml"))
    run = subprocess.run([cli, "validate", *map(str, policies)], cwd=elsewhere,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    schema = subprocess.run([cli, "schema"], cwd=elsewhere, capture_output=True, text=True,
                            timeout=60)
    assert schema.returncode == 0
    assert json.loads(schema.stdout)["$schema"].endswith("draft/2020-12/schema")
    # The copy the wheel ships for editors is the schema the engine assembles.
    shipped = subprocess.run([python, "-c", "import importlib.resources as r; print(r.files("
                              "'policy_engine').joinpath('_schema/profile_policy.schema.json')"
                              ".read_text(), end='')"], cwd=elsewhere, capture_output=True,
                             text=True, timeout=60)
    assert shipped.stdout == schema.stdout, shipped.stderr[-2000:]
    # So is the shape of `analyze --format json`, documented beside it.
    analysis = subprocess.run([python, "-c", "import importlib.resources as r; print(r.files("
                               "'policy_engine').joinpath('_schema/analysis.schema.json')"
                               ".read_text(), end='')"], cwd=elsewhere, capture_output=True,
                              text=True, timeout=60)
    assert analysis.stdout == (ROOT / "schemas" / "analysis.schema.json").read_text()
    comparison = subprocess.run([python, "-c", "import importlib.resources as r; print(r.files("
                                 "'policy_engine').joinpath('_schema/compare.schema.json')"
                                 ".read_text(), end='')"], cwd=elsewhere, capture_output=True,
                                text=True, timeout=60)
    assert comparison.stdout == (ROOT / "schemas" / "compare.schema.json").read_text()
    # The starter policy validates too, and torch was never needed.
    assert subprocess.run([cli, "init"], cwd=elsewhere, timeout=60).returncode == 0
    assert subprocess.run([cli, "validate", "profile_policy.yaml"], cwd=elsewhere,
                          timeout=60).returncode == 0
    probe = subprocess.run([python, "-c", "import importlib.util as u; "
                            "print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "True"
