"""Background export: the training thread hands saved cycles to the export thread, which
writes them and their manifest lines in order, at most ``in_flight`` at a time; close()
flushes; a failed export is reported on the training thread."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from policy_engine import ProfilingError, Topology, profile_session
from policy_engine.analysis.manifests import scan_manifests
from policy_engine.backends.base import Artifact, CaptureInfo, Session
from policy_engine.runtime.process import export
from policy_engine.runtime.process.state import slot


class SlowSession(Session):
    """A session whose files are written by the call save_later returns, which waits for
    ``gate`` (so a test decides when the export thread may finish)."""

    any_thread = False
    saves_later = True

    def __init__(self, backend: SlowBackend, info: CaptureInfo) -> None:
        self.backend, self.info = backend, info

    def prepare(self) -> None: ...
    def start(self) -> None: ...
    def step(self, inner_step: int) -> None: ...
    def discard(self) -> None: ...
    def close(self) -> None: ...

    def range(self, name: str) -> Any:
        import contextlib
        return contextlib.nullcontext()

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        return self.save_later(stem, cycle)()

    def save_later(self, stem: str, cycle: int) -> Any:
        backend = self.backend
        backend.stopped.append((stem, threading.current_thread().name))

        def write() -> list[Artifact]:
            assert backend.gate.wait(30)
            backend.written.append((stem, threading.current_thread().name))
            if backend.fail:
                raise OSError(28, "No space left on device")
            path = os.path.join(self.info.output_dir, stem + ".slow")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("trace")
            return [Artifact(path, 5)]
        return write


class SlowBackend:
    name = "slow"
    extension = ".slow"

    def __init__(self, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.stopped: list[tuple[str, str]] = []
        self.written: list[tuple[str, str]] = []
        self.fail = fail

    def open(self, info: CaptureInfo) -> SlowSession:
        return SlowSession(self, info)


@pytest.fixture
def slow() -> Any:
    found = slot("torch")
    previous, backend = found.backend, SlowBackend()
    found.backend = backend
    yield backend
    backend.gate.set()
    found.backend = previous


def lines(out: Path) -> list[tuple[str, Any]]:
    return [(r["event"], r.get("steps")) for r in scan_manifests(str(out)).records]


def test_the_step_returns_before_the_trace_is_written(make_policy: Any, tmp_path: Path,
                                                      slow: SlowBackend) -> None:
    out = tmp_path / "out"
    prof = profile_session(make_policy(steps=[1, 2], name="s<step>"), "actor", Topology())
    for n in (1, 2):
        with prof.training_step(n):
            pass
    # Both cycles stopped on this thread; neither is written yet.
    assert [s for s, _ in slow.stopped] == ["s1", "s2"]
    assert {t for _, t in slow.stopped} == {threading.current_thread().name}
    assert slow.written == [] and lines(out) == [("open", [1]), ("open", [2])]
    slow.gate.set()
    prof.close()  # flushes
    assert [t for _, t in slow.written] == ["policy-engine-export"] * 2
    # Each capture's close line comes after its trace line.
    assert lines(out) == [("open", [1]), ("open", [2]), ("trace", [1]), ("close", [1]),
                          ("trace", [2]), ("close", [2])]
    assert (out / "s1.slow").read_text() == "trace"


def test_at_most_in_flight_exports_then_the_training_thread_waits(
        make_policy: Any, slow: SlowBackend, caplog: pytest.LogCaptureFixture) -> None:
    prof = profile_session(make_policy(steps="1-4", name="s<step>",
                                       export={"mode": "background", "in_flight": 2}),
                           "actor", Topology())
    done: list[int] = []

    def train() -> None:
        for n in range(1, 5):
            with prof.training_step(n):
                pass
            done.append(n)

    with caplog.at_level(logging.WARNING, "policy_engine"):
        worker = threading.Thread(target=train)
        worker.start()
        deadline = time.monotonic() + 30
        while len(done) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        assert done == [1, 2]  # step 3's export would be the third in flight: it waits
        slow.gate.set()
        worker.join(30)
    assert done == [1, 2, 3, 4]
    prof.close()
    assert sum("trace exports are already being written" in r.message
               for r in caplog.records) == 1


def test_a_failed_export_raises_at_the_next_step_under_on_error_raise(
        make_policy: Any, tmp_path: Path) -> None:
    found = slot("torch")
    previous, backend = found.backend, SlowBackend(fail=True)
    found.backend = backend
    backend.gate.set()
    try:
        prof = profile_session(make_policy(steps=[1, 3], name="s<step>", on_error="raise"),
                               "actor", Topology())
        with prof.training_step(1):
            pass
        export.flush()
        with pytest.raises(ProfilingError, match=r"failed at export: .*No space left"), \
                prof.training_step(2):
            pass
        with prof.training_step(3):  # off for good: step 3 opens nothing
            pass
        prof.close()
    finally:
        found.backend = previous
    records = scan_manifests(str(tmp_path / "out")).records
    assert [(r["event"], r.get("status")) for r in records] == [
        ("open", None), ("trace", "failed"), ("close", "failed")]
    assert "No space left" in records[1]["error"]


def test_sync_writes_on_the_training_thread(make_policy: Any, slow: SlowBackend) -> None:
    slow.gate.set()
    prof = profile_session(make_policy(steps=[1], name="s<step>", export={"mode": "sync"}),
                           "actor", Topology())
    with prof.training_step(1):
        pass
    assert slow.written == [("s1", threading.current_thread().name)]
    prof.close()


def test_flush_waits_for_every_job() -> None:
    exporter = export.Exporter(in_flight=1)
    seen: list[int] = []
    for n in range(5):
        exporter.submit(lambda n=n: (time.sleep(0.01), seen.append(n)), export=n % 2 == 0)
    assert exporter.flush(timeout=30)
    assert seen == [0, 1, 2, 3, 4] and exporter.pending == 0
