"""SIGTERM inside the engine's own work, in this process: the handler waits for the
backend call, the save or the manifest line under way, then saves what is recorded.

The signal is raised from inside a backend call (``signal.raise_signal``), so Python
runs the handler at that very point. The handler that was there before ours is replaced,
for the test, by one that records the signal instead of ending the process; a handler a
framework put over ours earlier in this process is set aside for the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from policy_engine import Topology, profile_session
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.backends.base import Artifact, CaptureInfo, Session
from policy_engine.files.publish import write_atomic
from policy_engine.runtime.process import signals
from policy_engine.runtime.process.state import STATE, slot

pytestmark = pytest.mark.skipif(not hasattr(signal, "raise_signal"), reason="POSIX only")


class SignalSession(Session):
    """Raises SIGTERM in the middle of the call named ``at`` (its ``nth`` time)."""

    any_thread = False

    def __init__(self, backend: SignalBackend, info: CaptureInfo) -> None:
        self.backend, self.info = backend, info

    def _call(self, name: str) -> None:
        backend = self.backend
        backend.calls.append(name)
        if name == backend.at and backend.calls.count(name) == backend.nth:
            signal.raise_signal(signal.SIGTERM)  # the handler runs right here
            backend.calls.append(f"{name} went on")

    def prepare(self) -> None:
        self._call("prepare")

    def start(self) -> None:
        self._call("start")

    def step(self, inner_step: int) -> None:
        self._call("step")

    def discard(self) -> None:
        self._call("discard")

    def close(self) -> None:
        self._call("close")

    def range(self, name: str) -> Any:
        return contextlib.nullcontext()

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        def write(path: str) -> None:
            with open(path, "w", encoding="utf-8") as f:
                f.write("first half\n")
                f.flush()
                self._call("save")
                self.backend.entered.set()
                time.sleep(self.backend.pause)
                f.write("second half\n")

        path, size = write_atomic(self.info.output_dir, stem, ".sig", write)
        return [Artifact(path, size)]


class SignalBackend:
    name = "signal"
    extension = ".sig"

    def __init__(self, at: str, nth: int = 1) -> None:
        self.at, self.nth = at, nth
        self.calls: list[str] = []
        self.entered = threading.Event()  # a save is under way
        self.pause = 0.0  # how long a save takes

    def open(self, info: CaptureInfo) -> SignalSession:
        return SignalSession(self, info)


@pytest.fixture
def caught(monkeypatch: Any) -> Iterator[list[int]]:
    """The engine's SIGTERM handler is installed; what it calls after itself records."""
    got: list[int] = []
    found = slot("torch")
    previous = found.backend
    signals.install()  # from this (the main) thread
    # A framework tested earlier in this process (Lightning, Ray) may have put its own
    # handler over the engine's: put the engine's back for the test, theirs after it.
    current = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signals._on_sigterm)
    monkeypatch.setattr(STATE.hooks, "previous_sigterm", lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, current)
        found.backend = previous


def run(out: Path, backend: SignalBackend, schedule: dict[str, Any] | None) -> None:
    role: dict[str, Any] = {"enabled": True, "steps": [1], "export": {"mode": "sync"},
                            "torch": {"activities": ["cpu"]}}
    if schedule is not None:
        role["schedule"] = schedule
    slot("torch").backend = backend
    prof = profile_session({"version": 1, "output_dir": str(out), "roles": {"actor": role}},
                           "actor", Topology())
    with prof.training_step(1):
        for _ in range(4):
            prof.step()
    prof.close()


def lines(out: Path) -> list[dict[str, Any]]:
    scan = scan_manifests(str(out))
    assert scan.problems == ()
    return [r for r in scan.records if r["event"] in ("trace", "close")]


def test_sigterm_in_the_save_that_ends_a_capture_waits_for_it(
        tmp_path: Path, caught: list[int]) -> None:
    """The capture has left its slot and is being saved: the save finishes, whole."""
    backend = SignalBackend("save")
    run(tmp_path, backend, None)
    assert caught == [signal.SIGTERM]
    assert backend.calls[-3:] == ["save", "save went on", "close"]
    trace, close = lines(tmp_path)
    assert (trace["status"], close["status"], close["traces"]) == ("complete", "complete", 1)
    assert "stopped_by" not in close  # it had ended on its own
    assert (tmp_path / trace["path"]).read_text() == "first half\nsecond half\n"
    assert not [n for n in os.listdir(tmp_path / os.path.dirname(trace["path"]))
                if n.startswith(".policy-engine-")]


@pytest.mark.parametrize(("at", "nth"), [("start", 1), ("step", 1), ("step", 2),
                                         ("prepare", 1)])
def test_sigterm_in_a_transition_then_saves_what_was_recorded(
        tmp_path: Path, caught: list[int], at: str, nth: int) -> None:
    backend = SignalBackend(at, nth)
    run(tmp_path, backend, {"warmup": 1, "active": 3})
    assert caught == [signal.SIGTERM]
    went_on = backend.calls.index(f"{at} went on")
    assert "close" in backend.calls[went_on:]  # the call finished before the capture ended
    *traces, close = lines(tmp_path)
    assert close["event"] == "close" and close["traces"] == len(traces) == 1
    assert (close["status"], close["stopped_by"]) == ("partial", "SIGTERM arrived")
    [trace] = traces
    assert trace["status"] == "partial"
    if at == "prepare":  # stopped in warm-up: nothing was recorded, and it says so
        assert trace["path"] is None and trace["error"]
    else:
        assert (tmp_path / trace["path"]).read_text() == "first half\nsecond half\n"


def test_sigterm_in_a_manifest_line_waits_for_it(tmp_path: Path, caught: list[int],
                                                 monkeypatch: Any) -> None:
    """The open line is being written (the capture is not in its slot yet)."""
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if b'"event": "open"' in data and not caught:
            done = real_write(fd, data[:10])
            signal.raise_signal(signal.SIGTERM)
            return done + real_write(fd, data[10:])
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    run(tmp_path, SignalBackend("never"), {"active": 2})
    assert caught == [signal.SIGTERM]
    records = scan_manifests(str(tmp_path)).records
    assert [r["event"] for r in records] == ["open", "trace", "close"]
    assert records[2]["status"] == "partial" and records[2]["stopped_by"] == "SIGTERM arrived"


def test_sigterm_while_another_thread_saves_waits_for_that_save(
        tmp_path: Path, caught: list[int]) -> None:
    """The capture belongs to a worker thread, which is saving it when SIGTERM reaches
    the main thread: the handler waits for the save, which is published whole."""
    backend = SignalBackend("never")
    backend.pause = 0.5
    worker = threading.Thread(target=run, args=(tmp_path, backend, None))
    worker.start()
    assert backend.entered.wait(30)
    signal.raise_signal(signal.SIGTERM)  # the handler runs now, on this thread
    assert caught == [signal.SIGTERM]
    trace, close = lines(tmp_path)  # written before the handler went on
    assert (trace["status"], close["status"], close["traces"]) == ("complete", "complete", 1)
    assert (tmp_path / trace["path"]).read_text() == "first half\nsecond half\n"
    worker.join(30)
