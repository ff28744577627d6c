"""The manifest lines of one capture (:mod:`policy_engine.runtime.manifest`): a ``trace``
line per file or failure, a ``close`` line at the end."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from policy_engine.backends.base import Artifact, Session
from policy_engine.language.schedule import Schedule
from policy_engine.runtime import manifest
from policy_engine.runtime.export import Exporter
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
    thread_waits: int
    stopped_by: str | None
    stem: str
    inner: int
    schedule: Schedule | None
    name: Callable[..., str]
    budget: Budget | None
    exhausted: bool
    reason: str | None
    exporter: Exporter | None
    queued: bool  # an export of this capture was queued: its lines go through the queue
    on_export_failure: Callable[[BaseException], None]
    saved: int
    export_error: str | None
    session: Session
    step_unknown: bool
    phase: str
    recording: bool

    def _name_cycle(self) -> None: ...
    def _close_ranges(self) -> None: ...

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

    def _save(self, status: str) -> None:
        if self.step_unknown:
            self._name_cycle()
        self.phase = "save"
        self._close_ranges()
        self.recording = False
        note = getattr(self.session, "note", None)
        if note is not None:  # backends that label their own traces (torch metadata)
            note({"joined": list(self.joined), "inner_steps": list(self.cycle_steps),
                  "capture": self.id})
        cycle = 0 if self.cycle is None else self.cycle
        self.saved += 1
        later = getattr(self.session, "save_later", None) if self.exporter else None
        if later is not None and self.exporter is not None:
            write = later(self.stem, cycle)  # the backend stops here, on this thread
            fields = self._line_fields()
            self.queued = True
            def job() -> None:
                self._export(write, status, fields)
            budget = self.budget  # limits.bytes: in flight until written (runtime.budget)
            self.exporter.submit(job if budget is None else budget.carry(job), export=True)
            return
        failed = self._record_artifacts(self.session.save(self.stem, cycle), status)
        if failed is not None:  # recorded; the capture fails as a whole
            raise Recorded(failed)

    def _record_artifacts(self, artifacts: list[Artifact], status: str,
                          fields: dict[str, Any] | None = None) -> str | None:
        """A trace line per file a save wrote, or per part that failed (or one when it
        wrote nothing); the first failure, if any."""
        if not artifacts:
            artifacts = [Artifact("", None, failed="the backend wrote no output for this cycle")]
        failed = None
        for artifact in artifacts:
            if artifact.failed is not None:
                failed = failed or artifact.failed
                self._trace(None, "failed", error=artifact.failed, backend=artifact.backend,
                            fields=fields)
            else:
                self._trace(artifact, status, fields=fields)
        return failed

    def _line_fields(self) -> dict[str, Any]:
        """What a trace line says of the cycle under way, as it is now (a background
        export writes its lines later, from this snapshot)."""
        return {"cycle": 0 if self.cycle is None else self.cycle,
                "inner_steps": list(self.cycle_steps), "start": self.cycle_started,
                "steps": self.steps[self.cycle_from:], "joined": list(self.joined)}

    def _emit(self, line: Callable[[], None]) -> None:
        """Write a manifest line now, or after the exports already queued (their lines
        come first), from the export thread."""
        found = self.exporter
        if found is not None and self.queued and not found.on_thread():
            found.submit(line, export=False)
        else:
            line()

    def _trace(self, artifact: Artifact | None, status: str, error: str | None = None,
               backend: str | None = None, fields: dict[str, Any] | None = None) -> None:
        record = dict(self.record)
        record.update({
            "event": "trace", "capture": self.id,
            "path": os.path.relpath(artifact.path, self.output_dir) if artifact else None,
            "bytes": artifact.bytes if artifact else None, "status": status,
            "end": time.time(), **(fields or self._line_fields()),
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
        self._emit(lambda: manifest.append(self.output_dir, record))

    def _close_record(self, status: str, error: str | None = None) -> None:
        record: dict[str, Any] = {
            "event": "close", "capture": self.id, "status": status, "end": time.time(),
            "steps": list(self.steps), "joined": list(self.joined),
        }
        if self.thread_waits:
            record["thread_waits"] = self.thread_waits
        if self.stopped_by is not None:
            record["stopped_by"] = self.stopped_by
        if self.exhausted and self.budget is not None:
            record["limit"] = self.budget.spent_why
        if self.reason:  # it recorded less than its schedule plans (runtime.shortfall)
            record["reason"] = self.reason
        if error:
            record["error"] = error

        def line() -> None:  # after the queued exports: their traces are counted
            final = {**record, "traces": self.traces}
            failed = self.export_error
            if failed is not None and final["status"] == "complete":
                final.update(status="failed", error=failed)  # an export of it failed
            manifest.append(self.output_dir, final)
        self._emit(line)

    def _export(self, write: Callable[[], list[Artifact]], status: str,
                fields: dict[str, Any]) -> None:
        """On the export thread: write what a save left, and its trace lines. A failure is
        recorded here and reported to the owner (``on_export_failure``)."""
        try:
            artifacts = write()
        except Exception as err:
            artifacts = [Artifact("", None, failed=f"{type(err).__name__}: {err}")]
        try:
            failed = self._record_artifacts(artifacts, status, fields)
        except OSError as err:
            failed = f"the manifest could not be written: {err}"
        if failed is not None:
            self.export_error = failed
            self.on_export_failure(Recorded(failed))
