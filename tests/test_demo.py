"""policy-engine demo: a 4-rank torchrun job that names its slow rank, its arguments, and
how it ends (a signal, a rank that dies) with no process of the job left behind.

The one-process demo (``--world 1``) is also run by tests/test_traces.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from job_env import child_env

from policy_engine.cli.main import main

TIMEOUT = 300


def _demo(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "policy_engine", "demo", *args], cwd=cwd,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), those of new sessions included."""
    found, todo = [], [pid]
    while todo:
        for task in _listdir(f"/proc/{todo.pop()}/task"):
            try:
                with open(f"{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _listdir(folder: str) -> list[str]:
    try:
        return [f"{folder}/{t}" for t in os.listdir(folder)]
    except OSError:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _ranks(pid: int) -> list[int]:
    """The job's rank processes below the demo ``pid`` (torchrun's are the same module's
    arguments after torch.distributed.run)."""
    return [k for k in _descendants(pid)
            if b"policy_engine.cli.demo_job" in _cmdline(k)
            and b"torch.distributed.run" not in _cmdline(k)]


def _alive(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still running (a zombie has finished)."""
    left = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    left.append(pid)
        except OSError:
            pass
    return left


def _gone(pids: list[int], seconds: float) -> list[int]:
    """The processes of ``pids`` still running after up to ``seconds``."""
    until = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < until:
        time.sleep(0.2)
    return _alive(pids)


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                                reason="reads the process tree from Linux's /proc")


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(("argv", "said"), [
    (["--world", "1", "--slow-rank", "0"], "--slow-rank needs a job: give --world 2 or more"),
    (["--slow-rank", "4"], "--slow-rank 4 is not a rank of a job of 4 (0-3)"),
    (["--world", "2", "--slow-rank", "-1"], "--slow-rank -1 is not a rank of a job of 2 (0-1)"),
    (["--slow-ms", "-5"], "expected milliseconds from 0 to 60000, got '-5'"),
    (["--slow-ms", "nan"], "expected milliseconds from 0 to 60000, got 'nan'"),
    (["--world", "0"], "expected a positive integer, got '0'"),
    (["--steps", "0"], "expected a positive integer, got '0'"),
])
def test_demo_refuses_bad_arguments_before_it_starts(
        argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--out", str(tmp_path / "out"), *argv]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_demo_refuses_a_folder_that_holds_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second run beside the first would be one run of both to analyze and compare."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    for world in ("4", "1"):
        assert main(["demo", "--out", str(tmp_path / "out"), "--world", world]) == 2
        assert (f"--out {tmp_path / 'out'} already holds files (an earlier run?): the demo "
                f"writes one run per folder" in capsys.readouterr().err)
    assert os.listdir(tmp_path / "out") == ["notes.txt"]
    (tmp_path / "file").write_text("")
    assert main(["demo", "--out", str(tmp_path / "file")]) == 2
    assert "is not a folder" in capsys.readouterr().err


# ---------------------------------------------------------------- the job


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two default demos, one after the other: their folder and what each printed."""
    root = tmp_path_factory.mktemp("demo")
    printed = []
    for out in ("first", "second"):
        began = time.monotonic()
        job = _demo("--out", out, cwd=root)
        stdout, stderr = job.communicate(timeout=TIMEOUT)
        assert job.returncode == 0, stdout[-3000:] + stderr[-3000:]
        print(f"policy-engine demo --out {out}: {time.monotonic() - began:.1f} s")
        printed.append(stdout)
    return root, printed


@pytest.mark.slow
@needs_proc
def test_demo_names_its_slow_rank_and_where_the_step_went(
        two_runs: tuple[Path, list[str]]) -> None:
    root, printed = two_runs
    for out in printed:
        assert "a job of 4 ranks (torchrun, gloo, CPU)" in out
        assert "rank 2 slow (+100 ms before each all-reduce)" in out
        assert "8 traces (8 complete)" in out
        answer = out.split("$ policy-engine analyze ", 1)[1]
        assert answer.count("STRAGGLER: rank 2 in ") == 2  # steps 2 and 3
        assert answer.count("rank   basis  time ms    compute   comm      overlap   idle") == 2
        rows = [line.split() for line in answer.splitlines() if line.endswith("<- straggler")]
        assert [r[0] for r in rows] == ["2", "2"]
        assert "region update_actor:" in answer and "region generate_sequences:" in answer
        assert "The demo made rank 2 slow: analyze names it the straggler in 2 of 2 windows." \
            in answer
    windows = sorted(p.relative_to(root / "first").parent.as_posix()
                     for p in (root / "first").rglob("*.pt.trace.json.gz"))
    assert windows == ["actor+ref+rollout/step2"] * 4 + ["actor+ref+rollout/step3"] * 4


@pytest.mark.slow
@needs_proc
def test_two_demos_are_compared_window_by_window(two_runs: tuple[Path, list[str]]) -> None:
    root, _ = two_runs
    done = subprocess.run([sys.executable, "-m", "policy_engine", "compare", "first",
                           "second", "--format", "json"], cwd=root, env=child_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    windows = json.loads(done.stdout)["windows"]
    assert len(windows) == 2
    for w in windows:
        # Two runs of one job: a change or none where the steps can tell, else inconclusive
        # with the steps that would decide (a loaded machine's spread is wide).
        assert w["comparable"], w
        assert w["verdict"] in ("no change", "slower", "faster", "inconclusive"), w
        if w["verdict"] == "inconclusive":
            assert w["why"].startswith("median step time "), w["why"]
        # Steps enough to test a change, whatever the test found on a loaded machine.
        assert min(w["test"]["base_steps"], w["test"]["new_steps"]) >= 8, w["test"]
        assert (w["straggler"]["base"], w["straggler"]["new"]) == (2, 2)


@pytest.mark.slow
def test_a_demo_that_captures_nothing_says_why(tmp_path: Path) -> None:
    job = _demo("--out", "out", "--steps", "1", "--slow-ms", "0", cwd=tmp_path)
    stdout, stderr = job.communicate(timeout=TIMEOUT)
    assert job.returncode == 0, stderr
    assert "1 training step of 12 mini-batches; no rank slow;" in stdout
    assert ("policy-engine demo: nothing was captured in 1 training step: built-in demo.yaml "
            "profiles none of them (the built-in policies profile steps 2 and 3: give "
            "--steps 3)") in stdout
    assert "Traceback" not in stderr


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130),
                                              (signal.SIGTERM, -signal.SIGTERM),
                                              (signal.SIGKILL, -signal.SIGKILL)])
def test_a_demo_stopped_leaves_no_process_of_its_job(
        signum: int, code: int, tmp_path: Path) -> None:
    """Ctrl-C and SIGTERM stop the job in order; a demo killed outright takes torchrun and
    the ranks with it."""
    job = _demo("--out", "out", "--slow-ms", "3000", cwd=tmp_path)
    try:
        until = time.monotonic() + 120
        while len(_ranks(job.pid)) < 4 and time.monotonic() < until and job.poll() is None:
            time.sleep(0.2)
        below = _descendants(job.pid)
        assert len(_ranks(job.pid)) == 4, job.communicate()
        job.send_signal(signum)
        _, stderr = job.communicate(timeout=TIMEOUT)
        assert job.returncode == code, stderr
        assert _gone(below, 90) == []
        if signum != signal.SIGKILL:
            assert "interrupted: stopping the job" in stderr
            assert "Traceback" not in stderr
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


@pytest.mark.slow
@needs_proc
def test_a_rank_that_dies_is_reported_with_the_jobs_output(tmp_path: Path) -> None:
    job = _demo("--out", "out", "--slow-ms", "3000", cwd=tmp_path)
    try:
        until = time.monotonic() + 120
        while len(_ranks(job.pid)) < 4 and time.monotonic() < until and job.poll() is None:
            time.sleep(0.2)
        ranks = sorted(_ranks(job.pid))
        below = _descendants(job.pid)
        assert len(ranks) == 4, job.communicate()
        os.kill(ranks[1], signal.SIGKILL)
        _, stderr = job.communicate(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 3, stderr
    assert "policy-engine demo: error: the job failed (torchrun exited with 1); its output " \
           "ends:" in stderr
    assert "Root Cause (first observed failure)" in stderr
    assert f"exitcode  : -9 (pid: {ranks[1]})" in stderr
    assert f"(all of it: {tmp_path / 'out' / '.demo-job.log'})" in stderr
    assert _gone(below, 90) == []
