"""Test doubles users and tests can rely on: a backend that records every call.

    with recording_backend("torch") as rec:
        prof = apply_policy(worker, role="actor", policy=...)
        ...
    assert rec.calls[:2] == [("open", "actor", None), ("start",)]
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

from .backends.base import Artifact, CaptureInfo
from .runtime.capture import slot


class RecordingSession:
    def __init__(self, backend: RecordingBackend, info: CaptureInfo) -> None:
        self.backend = backend
        self.info = info

    def _call(self, *call: Any) -> None:
        self.backend.calls.append(call)
        fail = self.backend.fail_on
        if fail is not None and call[0] == fail:
            raise RuntimeError(f"recording backend told to fail on {fail}")

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
        from .runtime.files import write_exclusive

        def write(path: str) -> None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(stem + "\n")

        path = write_exclusive(self.info.output_dir, stem, ".rec", write)
        return [Artifact(path, os.path.getsize(path))]

    def discard(self) -> None:
        self._call("discard")

    @contextmanager
    def _range(self, name: str) -> Iterator[None]:
        self._call("range_start", name)
        try:
            yield
        finally:
            self.backend.calls.append(("range_end", name))

    def range(self, name: str) -> AbstractContextManager[None]:
        return self._range(name)

    def close(self) -> None:
        self._call("close")


class RecordingBackend:
    """A backend that writes small ``.rec`` files and records every call in ``calls``.

    ``fail_on`` names a session call ("start", "save", ...) that raises, to test
    failure handling.
    """

    name: ClassVar[str] = "recording"
    extension: ClassVar[str] = ".rec"

    def __init__(self, *, write_files: bool = True, fail_on: str | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.infos: list[CaptureInfo] = []
        self.write_files = write_files
        self.fail_on = fail_on

    def open(self, info: CaptureInfo) -> RecordingSession:
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
        if target.capture is not None:
            target.capture.end("partial")
        target.backend = previous
