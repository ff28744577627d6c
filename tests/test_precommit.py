"""The pre-commit hook (``.pre-commit-hooks.yaml``), run for real by ``pre-commit try-repo``.

pre-commit installs the hook from a git repository at a commit, so the test commits the
files the package builds from into a temporary repository (the working tree as it is,
committed or not), and runs the hook in a second repository holding policies. pre-commit
builds a virtualenv and pip-installs the package there: this needs the package index
(pyyaml, attrs, hatchling) or local wheels.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
#: What ``pip install .`` needs from the checkout (pyproject's build includes).
PACKAGE_FILES = ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml", "policy_engine",
                 "schemas", "policies")
GOOD = "version: 1\nroles:\n  actor: {enabled: true, steps: [2]}\n"
BAD = "version: 1\nroles:\n  actor: {enabled: true, rnaks: 0}\n"


def git(cwd: Path, *argv: str) -> None:
    subprocess.run(["git", "-c", "user.name=policy-engine tests",
                    "-c", "user.email=tests@policy-engine.invalid", "-c", "commit.gpgsign=false",
                    *argv], cwd=cwd, check=True, capture_output=True)


def try_repo(hook_repo: Path, project: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROFILE_POLICY", "PROFILE_POLICY_SET")}
    env["PRE_COMMIT_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo),
         "policy-engine-validate", "--all-files", "--verbose", "--color", "never"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_the_hook_file_declares_the_validate_hook() -> None:
    [hook] = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert (hook["id"], hook["entry"], hook["language"]) == (
        "policy-engine-validate", "policy-engine validate", "python")


@pytest.mark.slow
def test_hook_passes_a_good_policy_and_fails_a_bad_one(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    hook_repo = tmp_path / "hook"
    hook_repo.mkdir()
    for name in PACKAGE_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, hook_repo / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, hook_repo / name)
    git(hook_repo, "init", "-q")
    git(hook_repo, "add", "-A")
    git(hook_repo, "commit", "-q", "-m", "policy-engine")

    project = tmp_path / "project"
    (project / "exp").mkdir(parents=True)
    git(project, "init", "-q")
    (project / "exp" / "profile_policy.yaml").write_text(GOOD)
    # Not a policy: the schema file `policy-engine init` writes beside one is left out.
    (project / "exp" / "profile_policy.schema.json").write_text("{}\n")
    (project / "train.yaml").write_text("lr: 0.1\n")  # not a policy either
    git(project, "add", "-A")
    home = tmp_path / "pre-commit-home"

    passed = try_repo(hook_repo, project, home)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "exp/profile_policy.yaml: valid" in passed.stdout
    assert "schema.json" not in passed.stdout and "train.yaml" not in passed.stdout

    (project / "profile_policy_ci.toml").write_text(
        "version = 1\n[roles.actor]\nenabled = true\nrnaks = 0\n")
    (project / "exp" / "profile_policy_prod.yml").write_text(BAD)
    git(project, "add", "-A")
    failed = try_repo(hook_repo, project, home)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    lines = failed.stdout.splitlines()
    assert ("exp/profile_policy_prod.yml:3:26: error: unknown key 'rnaks' (did you mean "
            "'ranks'?) (at $.roles.actor.rnaks)") in lines
    assert ("profile_policy_ci.toml:4:1: error: unknown key 'rnaks' (did you mean 'ranks'?) "
            "(at $.roles.actor.rnaks)") in lines
    assert "exp/profile_policy.yaml: valid" in lines
