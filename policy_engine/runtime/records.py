"""The manifest lines of one capture (:mod:`policy_engine.runtime.manifest`): a ``trace``
line per file or failure, a ``close`` line at the end."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from policy_engine.backends.base import Artifact
from policy_engine.language.schedule import Schedule
from policy_engine.runtime import manifest
from policy_engine.runtime.triggers import Budget


class Recorded(RuntimeError):
    """A part of a combined capture failed to save; its manifest line is written."""


def timestamp() -> str:
    now = time.time()
    return time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"


class CaptureRecords:
    """What :class:`~policy_engine.runtime.capture.Capture` writes to the manifest."""

    record: dict[str, Any]
    id: str
    output_dir: str
    cycle: int | None
    cycle_steps: list[int]
    cycle_started: float
    steps: list[int]
    cycle_from: int  # a trace line lists steps[cycle_from:] (a merged cycle's own steps)
    joined: list[str]
    traces: int
    deferred: int
    stem: str
    inner: int
    schedule: Schedule | None
    name: Callable[..., str]
    budget: Budget | None
    exhausted: bool

    def _report(self, artifact: Artifact, status: str) -> None:
        """A file the session wrote outside a save (an out-of-memory snapshot), from
        whatever thread the tool called it on."""
        with contextlib.suppress(OSError):
            self._trace(artifact, status)

    def _current_name(self) -> str:
        """The name of the cycle under way, or of the one the capture is at."""
        if self.stem:
            return self.stem
        cycle = self.schedule.cycle(self.inner) if self.schedule is not None else None
        return self.name(cycle=cycle, timestamp=timestamp())

    def _trace(self, artifact: Artifact | None, status: str, error: str | None = None,
               backend: str | None = None) -> None:
        record = dict(self.record)
        record.update({
            "event": "trace", "capture": self.id,
            "path": os.path.relpath(artifact.path, self.output_dir) if artifact else None,
            "bytes": artifact.bytes if artifact else None,
            "cycle": 0 if self.cycle is None else self.cycle,
            "inner_steps": list(self.cycle_steps), "status": status,
            "start": self.cycle_started, "end": time.time(),
            "steps": self.steps[self.cycle_from:], "joined": list(self.joined),
        })
        if artifact is not None and artifact.extra:
            record["extra"] = dict(artifact.extra)
        part = artifact.backend if artifact is not None else backend
        if part is not None:
            record["backend"] = part
        if error:
            record["error"] = error
        self.traces += 1
        if self.budget is not None and artifact is not None:
            self.budget.wrote(artifact.bytes)
        manifest.append(self.output_dir, record)

    def _close_record(self, status: str, error: str | None = None) -> None:
        record: dict[str, Any] = {
            "event": "close", "capture": self.id, "status": status, "end": time.time(),
            "steps": list(self.steps), "traces": self.traces, "joined": list(self.joined),
        }
        if self.deferred:
            record["deferred"] = self.deferred
        if self.exhausted and self.budget is not None:
            record["limit"] = self.budget.spent_why
        if error:
            record["error"] = error
        manifest.append(self.output_dir, record)
