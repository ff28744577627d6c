"""The manifest of a real training process: something not a file swapped in under its name
mid-run stops nothing, and a long run's manifest rotates into files a reader takes whole."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from policy_engine.analysis import summarize
from policy_engine.files import layout

ROOT = Path(__file__).resolve().parent.parent

LOOP = textwrap.dedent("""\
    import os, sys
    import torch
    from policy_engine import Topology, profile_session
    from policy_engine.runtime.process import manifest, summaries
    out, inner, swap, rotate = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    if rotate:
        manifest.ROTATE_LINES = rotate
    policy = {"version": 1, "prefix": "t", "output_dir": out, "roles": {"actor": {
        "enabled": True, "backend": "torch", "torch": {"activities": ["cpu"]},
        "steps": sys.argv[5]}}}
    prof = profile_session(policy, "actor", Topology())
    x = torch.randn(8, 8)
    for n in range(1, int(sys.argv[6]) + 1):
        with prof.training_step(n):
            for _ in range(inner if n == 5 else 2):
                (x @ x).sum()
                prof.step()
        if n == 3 and swap == "fifo":  # what a hostile neighbour in output_dir can do
            path = manifest.manifest_path(out)
            os.mkfifo(path + ".new")
            os.rename(path + ".new", path)
            summaries.wait(60)
        print("step", n, flush=True)
    prof.close()
    print("closed", flush=True)
""")


def run_loop(tmp_path: Path, *, inner: int, swap: str = "", rotate: int = 0,
             steps: str = "1,2,5,6", last: int = 7) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(script), str(tmp_path / "out"), str(inner),
                           swap, str(rotate), steps, str(last)], capture_output=True,
                          text=True, env=env, timeout=300)  # liveness, not speed


@pytest.mark.slow
@pytest.mark.parametrize("inner", [2, 600], ids=["short lines", "a summary line over 64 KiB"])
def test_a_fifo_swapped_in_for_the_manifest_stops_nothing(tmp_path: Path, inner: int) -> None:
    """After step 3 the manifest is a FIFO nobody reads: the captures of steps 5 and 6 are
    still made (600 ProfilerSteps in step 5: its summary line is over a pipe's 64 KiB),
    every line for the FIFO is dropped with one warning, and the process exits."""
    done = run_loop(tmp_path, inner=inner, swap="fifo")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2:] == ["closed", ""]
    manifests = tmp_path / "out" / "manifests"
    [name] = os.listdir(manifests)
    assert stat.S_ISFIFO(os.lstat(manifests / name).st_mode)
    warned = [line for line in done.stderr.splitlines() if "not a regular file" in line]
    assert warned == [f"policy-engine: the manifest {manifests / name} is a FIFO, not a "
                      "regular file: lines meant for it are not written (training goes on; "
                      "said once)"]
    traces = sorted((tmp_path / "out").rglob("*.pt.trace.json.gz"))
    assert len(traces) == 4  # steps 1, 2, 5 and 6, each its capture
    longest = max(len(json.dumps(summarize(str(t)))) for t in traces)
    assert longest > 64 << 10 if inner > 100 else longest < 4 << 10


@pytest.mark.slow
def test_a_long_run_rotates_its_manifest(tmp_path: Path) -> None:
    """A training process whose manifest takes 12 lines a file: ten captures (open, trace,
    close and summary lines) fill four files, numbered as the layout says, no line lost,
    split or out of its file's limit."""
    done = run_loop(tmp_path, inner=2, rotate=12, steps="all", last=10)
    assert done.returncode == 0, done.stderr
    names = os.listdir(tmp_path / "out" / "manifests")
    parts = sorted(layout.manifest_part(n) or ("", 0) for n in names)
    stem = parts[0][0]
    assert parts == [(stem, k) for k in range(1, 5)]
    assert sorted(names) == sorted(layout.manifest_name(stem, k) for k in range(1, 5))
    lines = []
    for _, k in parts:
        data = (tmp_path / "out" / "manifests" / layout.manifest_name(stem, k)).read_bytes()
        assert data.endswith(b"\n") and data.count(b"\n") == (12 if k < 4 else 4)
        lines += [json.loads(line) for line in data.splitlines()]
    captures = {r["capture"] for r in lines}
    assert len(captures) == 10
    assert sorted((r["capture"], r["event"]) for r in lines) == sorted(
        (c, e) for c in captures for e in ("open", "trace", "close", "summary"))
