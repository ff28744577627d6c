"""The manifest lifecycle of a capture, the one every capture goes through: a role's
capture (runtime.capture.driver), each engine rank of an engine's window
(integrations._engine_window), and a file a role writes outside any capture
(runtime.role.history, its one ``trace`` line).

:class:`Lines` writes a capture's ``open`` line before anything is recorded (write-ahead:
a process killed from then on leaves a capture that ``traces`` reports as interrupted), a
``trace`` line per file or failure, and its ``close`` line; :meth:`Lines.fail` is both
for a capture that failed before it recorded anything. The lines are built by
:mod:`policy_engine.files.records` and appended by
:mod:`policy_engine.runtime.process.manifest`. A role's background export writes a saved
cycle's lines from the export thread, after the lines already queued. Each torch trace,
once its line is written, goes to its summary worker
(:mod:`policy_engine.runtime.process.summaries`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from policy_engine.backends.base import Artifact
from policy_engine.files.layout import host_name
from policy_engine.files.records import (
    Status,
    close_line,
    covered_steps,
    note_line,
    open_line,
    trace_line,
)
from policy_engine.runtime.process import manifest, summaries
from policy_engine.runtime.process.budget import Budget
from policy_engine.runtime.process.export import Exporter
from policy_engine.runtime.process.state import capture_id


class Recorded(RuntimeError):
    """A part of a combined capture failed to save; its manifest line is written."""


def timestamp() -> str:
    """Now, to the millisecond, as capture names and engine windows spell it."""
    now = time.time()
    return time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"


class Lines:
    """The manifest lines of one capture (its id: ``id``), and its background exports.
    Changed only here; ``traces`` counts the trace lines written (the close line says how
    many).

    ``record`` holds the identity fields every line of the capture carries (role, rank,
    roles, region, steps...). What a trace line says of the cycle it belongs to comes from
    ``snapshot`` (:meth:`follow`): until a capture follows its cycles, a trace line says
    the capture recorded no cycle (cycle 0, no inner step, its start when it opened)."""

    __slots__ = ("budget", "export_error", "exporter", "id", "keep", "on_export_failure",
                 "opened", "output_dir", "queued", "record", "snapshot", "summarise",
                 "traces")

    def __init__(self, record: dict[str, Any], output_dir: str, *,
                 budget: Budget | None = None, exporter: Exporter | None = None,
                 on_export_failure: Callable[[BaseException], None] | None = None,
                 keep: str = "traces", summarise: bool = True,
                 opened: float | None = None) -> None:
        self.record = record  # identity fields of every manifest line of the capture
        self.id = capture_id()
        self.output_dir = output_dir
        self.opened = time.time() if opened is None else opened
        self.snapshot: Callable[[], dict[str, Any]] = self._unrecorded
        self.budget = budget  # limits.bytes: what its files weigh
        # export: background: saves hand their writing to the exporter (runtime.process.export)
        self.exporter = exporter
        self.on_export_failure = on_export_failure
        self.traces = 0  # trace lines written
        self.queued = False  # an export was queued: later lines go through the queue
        self.export_error: str | None = None  # a background export of it failed
        self.keep = keep  # the role's keep: whether a summarised trace stays
        # whether its torch traces go to the summary workers (an engine's are not its
        # process's own captures)
        self.summarise = summarise

    def _unrecorded(self) -> dict[str, Any]:
        return {"cycle": 0, "inner_steps": [], "start": self.opened, "joined": []}

    def follow(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """From now on a trace line says of its cycle what ``snapshot()`` says (the cycle
        under way, as the capture that recorded it sees it)."""
        self.snapshot = snapshot

    # -- open ---------------------------------------------------------------------------
    def open(self, **fields: Any) -> None:
        """The capture opens, before the backend is touched: its ``open`` line, with who
        opens it (``record``), when, on which host and thread, and ``fields``. Raises
        OSError when the line cannot be written."""
        manifest.append(self.output_dir, open_line(
            self.record, capture=self.id, start=self.opened, host=host_name(),
            thread=threading.current_thread().name, **fields))

    def fail(self, error: str, *, steps: Sequence[int]) -> None:
        """The capture failed before it recorded anything (its backend did not open, the
        engine refused or timed out): a failed trace line and its close line. A manifest
        that cannot be written (often the very failure) stops nothing: the caller warns
        of the failure these lines were to record."""
        with contextlib.suppress(OSError):
            self.trace(None, Status.FAILED, error=error)
            self.close(Status.FAILED, error, steps=steps, joined=[])

    # -- trace --------------------------------------------------------------------------
    def report(self, artifact: Artifact, status: Status) -> None:
        """A file the session wrote outside a save (an out-of-memory snapshot), from
        whatever thread the tool called it on."""
        with contextlib.suppress(OSError):
            self.trace(artifact, status)

    def export(self, write: Callable[[], list[Artifact]], status: Status) -> None:
        """Hand what a save left (``write``) to the export thread, with its lines."""
        assert self.exporter is not None
        fields = self.snapshot()
        self.queued = True

        def job() -> None:
            self._export(write, status, fields)
        budget = self.budget  # limits.bytes: in flight until written (runtime.process.budget)
        self.exporter.submit(job if budget is None else budget.carry(job), export=True)

    def record_artifacts(self, artifacts: list[Artifact], status: Status,
                         fields: dict[str, Any] | None = None) -> str | None:
        """A trace line per file a save wrote, or per part that failed (or one when it
        wrote nothing); the first failure, if any."""
        if not artifacts:
            artifacts = [Artifact("", None, failed="the backend wrote no output for this cycle")]
        failed = None
        for artifact in artifacts:
            if artifact.failed is not None:
                failed = failed or artifact.failed
                self.trace(None, Status.FAILED, error=artifact.failed,
                           backend=artifact.backend, fields=fields)
            else:
                self.trace(artifact, status, fields=fields)
        return failed

    def _emit(self, line: Callable[[], None]) -> None:
        """Write a manifest line now, or after the exports already queued (their lines
        come first), from the export thread."""
        found = self.exporter
        if found is not None and self.queued and not found.on_thread():
            found.submit(line, export=False)
        else:
            line()

    def trace(self, artifact: Artifact | None, status: Status, error: str | None = None,
              backend: str | None = None, fields: dict[str, Any] | None = None) -> None:
        """A ``trace`` line: the file ``artifact`` (its path relative to the output
        folder), or none (``error`` says why). Raises OSError when it cannot be written."""
        more: dict[str, Any] = {}
        if artifact is not None and artifact.extra:
            more["extra"] = dict(artifact.extra)
        part = artifact.backend if artifact is not None else backend
        if part is not None:
            more["backend"] = part
        if error:
            more["error"] = error
        record = trace_line(
            self.record, capture=self.id, status=status,
            path=os.path.relpath(artifact.path, self.output_dir) if artifact else None,
            bytes=artifact.bytes if artifact else None, end=time.time(),
            **(fields or self.snapshot()), **more)
        self.traces += 1
        if self.budget is not None and artifact is not None:
            self.budget.wrote(artifact.bytes)
        summarised = artifact is not None and self.summarise and summaries.wanted(
            artifact.path, part, status, artifact.extra)

        def line() -> None:
            manifest.append(self.output_dir, record)
            if summarised:  # once its line is written: a summary names a known trace
                assert artifact is not None
                summaries.order(self.output_dir, record, artifact.path, keep=self.keep,
                                budget=self.budget)
        self._emit(line)

    def note(self, note: str, **fields: Any) -> None:
        """A ``note`` line that names this capture: something that happened to it that is
        no file of its own (an engine's front-end trace, kept beside the window). Raises
        OSError when it cannot be written."""
        manifest.append(self.output_dir, note_line(
            self.record, note=note, capture=self.id, time=time.time(), host=host_name(),
            **fields))

    # -- close --------------------------------------------------------------------------
    def close(self, status: Status, error: str | None = None, *, steps: Sequence[int],
              joined: Sequence[str], waits: int = 0, stopped_by: str | None = None,
              limited: bool = False, reason: str | None = None) -> None:
        """The capture's ``close`` line (after its queued exports' lines). ``limited``:
        the budget ended its schedule; ``reason``: why it recorded less than planned."""
        record: dict[str, Any] = {"end": time.time(), **covered_steps(list(steps)),
                                  "joined": list(joined)}
        if waits:
            record["thread_waits"] = waits
        if stopped_by is not None:
            record["stopped_by"] = stopped_by
        if limited and self.budget is not None:
            record["limit"] = self.budget.spent_why
        if reason:  # it recorded less than its schedule plans (runtime.capture.shortfall)
            record["reason"] = reason
        if error:
            record["error"] = error

        def line() -> None:  # after the queued exports: their traces are counted
            final = {**record, "traces": self.traces}
            ends, failed = status, self.export_error
            if failed is not None and status is Status.COMPLETE:
                ends, final["error"] = Status.FAILED, failed  # an export of it failed
            manifest.append(self.output_dir, close_line(capture=self.id, status=ends, **final))
        self._emit(line)

    def _export(self, write: Callable[[], list[Artifact]], status: Status,
                fields: dict[str, Any]) -> None:
        """On the export thread: write what a save left, and its trace lines. A failure is
        recorded here and reported to the owner (``on_export_failure``)."""
        try:
            artifacts = write()
        except Exception as err:
            artifacts = [Artifact("", None, failed=f"{type(err).__name__}: {err}")]
        try:
            failed = self.record_artifacts(artifacts, status, fields)
        except OSError as err:
            failed = f"the manifest could not be written: {err}"
        if failed is not None:
            self.export_error = failed
            if self.on_export_failure is not None:
                self.on_export_failure(Recorded(failed))
