"""The repository's own text: no file carries the markers a merge leaves behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
MARKERS = ("<<<<<<< ", ">>>>>>> ")


def test_no_file_holds_a_merge_conflict() -> None:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    found = []
    for name in filter(None, listed.decode("utf-8", "replace").split("\0")):
        path = ROOT / name
        if path.suffix in (".gz", ".pickle", ".png") or not path.is_file():
            continue
        text = path.read_bytes()
        if b"\0" in text[:1024]:
            continue  # binary
        for number, line in enumerate(text.decode("utf-8", "replace").splitlines(), 1):
            if line.startswith(MARKERS) or (line == "=======" and name.endswith(".py")):
                found.append(f"{name}:{number}: {line[:40]}")
    assert found == []
