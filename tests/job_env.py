"""What the multi-process tests hand the processes they start: this checkout on the
path, one thread per process, and none of the launcher variables of whoever runs the
tests (torchrun, Slurm, Open MPI, the engine's own), which would mislead the launchers
under test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT")
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "TORCHELASTIC_", "PROFILE_POLICY")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER and not k.startswith(_LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def run_cli(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``policy-engine ARGS`` in ``cwd``, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "policy_engine", *args], cwd=cwd,
                          env=child_env(), capture_output=True, text=True, timeout=timeout)


@contextlib.contextmanager
def plain_sigterm() -> Iterator[None]:
    """SIGTERM at its default and unblocked for what is forked inside: Holistic Trace
    Analysis parses in a fork pool that ``Pool.terminate()`` ends with SIGTERM, and a
    worker that inherited this process's handler (the engine's, from an earlier test in
    the same process) or mask could outlive it, leaving the pool's join waiting forever."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        signal.signal(signal.SIGTERM, previous)
