"""Test doubles users and tests can rely on: a backend that records every call.

    with recording_backend("torch") as rec:
        prof = apply_policy(worker, role="actor", policy=...)
        ...
    assert rec.calls[:2] == [("open", "actor", None), ("start",)]

Like torch.profiler, the recorder insists that every call of a capture comes from the
thread that opened it (``any_thread=False``, the default): a call from another thread is
recorded in ``violations`` and raises, so a test shows what would crash a real run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

from policy_engine.backends.base import Artifact, CaptureInfo, Session
from policy_engine.files.publish import write_atomic
from policy_engine.runtime.process.state import slot


class RecordingSession(Session):
    """One capture of a RecordingBackend: records each required hook's call."""

    def __init__(self, backend: RecordingBackend, info: CaptureInfo) -> None:
        self.backend = backend
        self.info = info
        self.any_thread = backend.any_thread
        self.home = threading.get_ident()

    def _call(self, *call: Any) -> None:
        backend = self.backend
        with backend.lock:
            backend.calls.append(call)
            if not self.any_thread and threading.get_ident() != self.home:
                backend.violations.append((call, threading.current_thread().name))
                raise RuntimeError(f"recording backend: {call[0]} on thread "
                                   f"{threading.current_thread().name!r}, not on the thread "
                                   "that opened the capture")
        if backend.fail_on is not None and call[0] == backend.fail_on:
            raise RuntimeError(f"recording backend told to fail on {backend.fail_on}")

    def prepare(self) -> None:
        self._call("prepare")

    def start(self) -> None:
        self._call("start")

    def step(self, inner_step: int) -> None:
        self._call("step", inner_step)

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        self._call("save", stem, cycle)
        if not self.backend.write_files:
            return [Artifact(os.path.join(self.info.output_dir, stem + ".rec"), 0)]

        def write(path: str) -> None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(stem + "\n")

        path, size = write_atomic(self.info.output_dir, stem, ".rec", write)
        return [Artifact(path, size)]

    def discard(self) -> None:
        self._call("discard")

    @contextmanager
    def _range(self, name: str) -> Iterator[None]:
        self._call("range_start", name)
        try:
            yield
        finally:
            self._call("range_end", name)

    def range(self, name: str) -> AbstractContextManager[None]:
        return self._range(name)

    def close(self) -> None:
        self._call("close")


class RecordingBackend:
    """A backend that writes small ``.rec`` files and records every call in ``calls``.

    ``fail_on`` names a session call ("start", "save", ...) that raises, to test failure
    handling. ``any_thread=True`` lets any thread drive a capture (as Nsight does);
    by default only the opening thread may (as torch.profiler and torch_npu need).
    """

    name: ClassVar[str] = "recording"
    extension: ClassVar[str] = ".rec"
    session: ClassVar[type[Session] | None] = RecordingSession

    def __init__(self, *, write_files: bool = True, fail_on: str | None = None,
                 any_thread: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.infos: list[CaptureInfo] = []
        self.violations: list[tuple[tuple[Any, ...], str]] = []
        self.write_files = write_files
        self.fail_on = fail_on
        self.any_thread = any_thread
        self.lock = threading.Lock()

    def open(self, info: CaptureInfo) -> RecordingSession:
        with self.lock:
            self.infos.append(info)
            self.calls.append(("open", info.role, info.region))
        if self.fail_on == "open":
            raise RuntimeError("recording backend told to fail on open")
        return RecordingSession(self, info)

    def actions(self) -> list[tuple[Any, ...]]:
        """The calls without inner-step markers and ranges: the schedule's transitions."""
        return [c for c in self.calls if c[0] not in ("step", "range_start", "range_end")]


@contextmanager
def recording_backend(name: str = "torch", **options: Any) -> Iterator[RecordingBackend]:
    """Route every capture on backend ``name`` in this process to a RecordingBackend."""
    target = slot(name)
    previous = target.backend
    backend = RecordingBackend(**options)
    target.backend = backend
    try:
        yield backend
    finally:
        running = target.capture
        if running is not None:
            running.terminate("the recording backend was removed")
            if target.capture is running:  # it belongs to a thread that cannot end it here
                target.capture = None
        target.backend = previous
