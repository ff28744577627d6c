"""``python -m pytest -n 2`` hands each file's tests to one worker, as .ci/run's runs need
(tests/conftest.py), and the conftest changes nothing where pytest-xdist is not installed
(scripts/test_floors.sh runs tests in such a venv)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import _group
from job_env import child_env

ROOT = Path(__file__).resolve().parent.parent
FILES = ["tests/test_yaml.py", "tests/test_naming.py"]


def _pytest(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _workers(out: str) -> dict[str, set[str]]:
    """Each file's workers, from the verbose lines ``[gw0] [ 1%] PASSED tests/x.py::t``."""
    found: dict[str, set[str]] = {}
    for worker, path in re.findall(r"^\[(gw\d+)\] .*?PASSED (tests/[\w.]+\.py)::", out, re.M):
        found.setdefault(path, set()).add(worker)
    return found


@pytest.mark.slow  # pytest in a subprocess, with two workers
def test_n_alone_hands_out_whole_files() -> None:
    pytest.importorskip("xdist")
    out = _pytest("-n", "2", *FILES)
    assert "scheduling tests via FileGroupScheduling" in out
    workers = _workers(out)
    assert sorted(workers) == sorted(FILES)
    assert all(len(names) == 1 for names in workers.values()), workers


@pytest.mark.slow
def test_a_mode_given_on_the_command_line_stays() -> None:
    pytest.importorskip("xdist")
    assert "scheduling tests via LoadScheduling" in _pytest("-n", "2", "--dist", "load",
                                                            FILES[1])


@pytest.mark.slow
def test_without_xdist_the_run_is_as_before() -> None:
    out = _pytest("-p", "no:xdist", FILES[1])
    assert re.search(r"^=+ \d+ passed", out, re.M), out[-2000:]


def test_files_that_share_a_job_share_a_group() -> None:
    assert _group("tests/test_analyze_e2e.py::test_a[x::y]") == "straggler_jobs"
    assert _group("tests/test_compare_e2e.py::test_b") == "straggler_jobs"
    assert _group("tests/test_distributed.py::test_c") == _group("tests/test_channel_ray.py::d")
    assert _group("tests/test_yaml.py::test_e[a@b]") == "tests/test_yaml.py"
