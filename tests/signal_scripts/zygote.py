"""A fork server for the SIGTERM property test (tests/test_sigterm.py).

Started once; imports policy_engine (and torch with ``--torch``) once, then for each
command line on stdin (JSON: ``run``, ``mode``, ``delay``) forks a child that profiles a
short training loop into ``<run>/out``. When the child says it is ready, this process
waits ``delay`` seconds, sends it SIGTERM, reaps it, and answers one JSON line:
``{"status": <wait status>, "signalled": <monotonic time>}``.

Without ``--torch`` the child drives :class:`PaceBackend`: a backend whose every call
takes a little time and whose saves write real files through ``write_atomic``, so that a
random delay lands in starts, steps, stops, saves and background exports alike. It logs
each call's begin and end (monotonic times) to ``<run>/phases``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from policy_engine import Topology, profile_session
from policy_engine.backends.base import Artifact, CaptureInfo, Session
from policy_engine.files.publish import write_atomic
from policy_engine.runtime.process.state import slot

USE_TORCH = "--torch" in sys.argv
torch: Any = importlib.import_module("torch") if USE_TORCH else None  # once, before forks

TRAILER = b"END\n"
CHUNK = b"x" * 4095 + b"\n"


class PaceSession(Session):
    any_thread = False
    saves_later = True

    def __init__(self, backend: PaceBackend, info: CaptureInfo) -> None:
        self.backend, self.info = backend, info

    @contextlib.contextmanager
    def _op(self, name: str, seconds: float) -> Iterator[None]:
        self.backend.log(name, "b")
        time.sleep(seconds)
        yield
        self.backend.log(name, "e")

    def prepare(self) -> None:
        with self._op("prepare", 0.001):
            pass

    def start(self) -> None:
        with self._op("start", 0.003):
            pass

    def step(self, inner_step: int) -> None:
        with self._op("step", 0.0005):
            pass

    def discard(self) -> None:
        with self._op("discard", 0.001):
            pass

    def close(self) -> None:
        with self._op("close", 0.001):
            pass

    def range(self, name: str) -> Any:
        return contextlib.nullcontext()

    def _write(self, stem: str, phase: str) -> list[Artifact]:
        def write(path: str) -> None:
            with open(path, "wb") as f:
                for _ in range(12):  # 48 KiB, a little at a time
                    f.write(CHUNK)
                    f.flush()
                    time.sleep(0.001)
                f.write(TRAILER)

        self.backend.log(phase, "b")
        path, size = write_atomic(self.info.output_dir, stem, ".pace", write)
        self.backend.log(phase, "e")
        return [Artifact(path, size)]

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        with self._op("stop", 0.002):
            pass
        return self._write(stem, "save")

    def save_later(self, stem: str, cycle: int) -> Callable[[], list[Artifact]]:
        with self._op("stop", 0.002):
            pass
        return lambda: self._write(stem, "export")


class PaceBackend:
    name = "pace"
    extension = ".pace"

    def __init__(self, phases: str) -> None:
        self.fd = os.open(phases, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(self, phase: str, edge: str) -> None:
        os.write(self.fd, f"{phase} {edge} {time.monotonic():.6f}\n".encode())

    def open(self, info: CaptureInfo) -> PaceSession:
        self.log("open", "b")
        time.sleep(0.001)
        self.log("open", "e")
        return PaceSession(self, info)


def child(run: str, mode: str, ready: int) -> None:
    out = os.path.join(run, "out")
    policy = {"version": 1, "output_dir": out,
              "roles": {"actor": {"enabled": True, "steps": [1, 3],
                                  "schedule": {"warmup": 1, "active": 2, "repeat": 2},
                                  "torch": {"activities": ["cpu"]},
                                  "export": {"mode": mode}}}}
    if not USE_TORCH:
        slot("torch").backend = PaceBackend(os.path.join(run, "phases"))
    prof = profile_session(policy, "actor", Topology(rank=0, world=1))
    os.write(ready, b"r")
    for n in range(1, 5):
        with prof.training_step(n):
            for _ in range(8):
                if USE_TORCH:
                    torch.ones(64, 64) @ torch.ones(64, 64)
                else:
                    time.sleep(0.001)
                prof.step()
    prof.close()


def serve() -> None:
    for line in sys.stdin:
        command = json.loads(line)
        run, mode, delay = command["run"], command["mode"], float(command["delay"])
        os.makedirs(run, exist_ok=True)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            code = 0
            try:
                err = os.open(os.path.join(run, "stderr"), os.O_WRONLY | os.O_CREAT, 0o644)
                os.dup2(err, 2)
                child(run, mode, write)
            except BaseException as exc:  # report it; the parent checks the status
                print(f"child failed: {exc!r}", file=sys.stderr, flush=True)
                code = 3
            os._exit(code)
        os.close(write)
        os.read(read, 1)  # ready (or the child ended without saying so)
        os.close(read)
        status = _wait(pid, delay)  # a child that ends sooner is not waited for longer
        signalled = time.monotonic()
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": status, "signalled": signalled}), flush=True)


def _wait(pid: int, seconds: float) -> int | None:
    """The child's wait status if it ends within ``seconds``, else None (still running)."""
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(left, 0.002))


if __name__ == "__main__":
    serve()
