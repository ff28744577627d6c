"""The memory backend's captures: allocator history on while a cycle records, one
snapshot per saved cycle, and a snapshot when the process runs out of memory.

The history is one per process, so one capture records it at a time (colocated roles
share that capture; validate refuses roles that would record it apart). torch offers no
way to detach an out-of-memory observer, so the backend attaches one per process, the
first time a capture asks for it, and routes it to the capture open at the time.

With ``history: always`` the runtime hands the backend a :class:`Keeper` when the role's
profiler is made (:meth:`MemoryBackend.keep`): history is on from then until the role
closes, captures dump it without turning it off, and an out-of-memory error while no
capture is open is written under the name the keeper gives for the step under way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

from policy_engine.backends.base import Artifact, BackendUnavailable, CaptureInfo, Session
from policy_engine.backends.files import OOM, SNAPSHOT
from policy_engine.backends.memory.device import MemoryApi, detect
from policy_engine.files.publish import open_temp, write_atomic
from policy_engine.files.records import Status

log = logging.getLogger("policy_engine")

#: What a capture passes for reporting an artifact it did not save itself: (artifact, status).
Report = Callable[[Artifact, Status], None]
#: Out-of-memory snapshots written outside captures, at most, per process: one per outer
#: step, and no more than this (a run that catches the error and goes on each step would
#: otherwise fill the disk with snapshots of up to ``max_entries`` events each).
MAX_KEPT_DUMPS = 16


class Keeper(Protocol):
    """What the runtime gives a backend that records for a role outside its captures."""

    def name(self) -> tuple[str, int | None] | None:
        """The name (no extension) of a file written now, for the role's step under way,
        and that step (None outside ``training_step``); None once the role closed."""

    def report(self, artifact: Artifact, status: Status, step: int | None) -> None:
        """Record a file written outside any capture in the manifest."""


class MemorySession(Session):
    """Allocator history for one capture."""

    any_thread = True  # the history is process-wide: any thread may turn it on and off

    def __init__(self, backend: MemoryBackend, info: CaptureInfo, api: MemoryApi) -> None:
        self._backend = backend
        self._info = info
        self._api = api
        self._settings = info.settings
        self._on = False
        self._stem = ""
        self._report: Report | None = None
        self._name: Callable[[], str] | None = None
        self.oom_dumps = 0

    # Hooks the interpreter calls (runtime/capture/driver.py).
    def set_stem(self, stem: str) -> None:
        self._stem = stem

    def set_reporter(self, report: Report, name: Callable[[], str]) -> None:
        self._report = report
        self._name = name

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        owner = self._backend.recording
        if owner is not None and owner is not self:
            raise RuntimeError(
                f"allocator history is already recorded by the capture of role "
                f"{owner._info.role!r}: a process has one history")
        if self._backend.keeper is None:  # else it is on already, and stays on
            settings = self._settings
            self._api.start(max_entries=int(settings["max_entries"]),
                            stacks=settings["stacks"], context=settings["context"])
        self._on = True
        self._backend.recording = self

    def step(self, inner_step: int) -> None:
        pass

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        if not self._on:
            return []
        try:
            path, size = write_atomic(self._info.output_dir, stem, SNAPSHOT, self._api.dump)
        finally:
            self._stop()
        return [Artifact(path, size, self._extra(path))]

    def _extra(self, path: str) -> dict[str, Any]:
        extra: dict[str, Any] = {"device": self._api.device}
        if self._settings["plot"]:
            try:
                extra["plot"] = self._plot(path)
            except Exception as err:  # the snapshot is what matters; say why no plot
                extra["plot_error"] = f"{type(err).__name__}: {err}"
                log.warning("policy-engine: no plot for %s: %s", path, err)
        return extra

    def _plot(self, snapshot: str) -> str:
        from policy_engine.backends.memory import plot

        summary = plot.summarize(plot.load_snapshot(snapshot))
        page = plot.render_html(summary, title=snapshot.rsplit("/", 1)[-1])
        stem = snapshot[len(self._info.output_dir):].lstrip("/")[: -len(".pickle")]

        def write(temp: str) -> None:
            with open_temp(temp, text=True) as f:
                f.write(page)
        path = write_atomic(self._info.output_dir, stem, ".html", write)[0]
        return os.path.relpath(path, self._info.output_dir)

    def discard(self) -> None:
        self._stop()

    def range(self, name: str) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def close(self) -> None:
        try:
            self._stop()
        finally:
            if self._backend.current is self:
                self._backend.current = None

    def _stop(self) -> None:
        if self._on:
            self._on = False
            if self._backend.recording is self:
                self._backend.recording = None
            if self._backend.keeper is None:  # history: always keeps it on
                self._api.stop()

    # -- out of memory -------------------------------------------------------------
    def out_of_memory(self, device: int, asked: int, limit: int, free: int) -> None:
        """The allocator ran out of memory while this capture was open: dump the history
        (whatever this process recorded) as ``<name>_oom.pickle``, once per capture (code
        that catches out-of-memory errors and retries would otherwise fill the disk)."""
        if self.oom_dumps:
            log.warning("policy-engine: out of memory again on %s:%d (asked %d bytes); this "
                        "capture has its out-of-memory snapshot already", self._api.device,
                        device, asked)
            return
        stem = self._stem or (self._name() if self._name is not None else "memory")
        path, size = write_atomic(self._info.output_dir, stem + OOM, SNAPSHOT,
                                  self._api.dump)
        self.oom_dumps += 1
        extra = {"device": self._api.device, "device_index": device, "bytes_asked": asked,
                 "device_limit": limit, "device_free": free,
                 "history": self._on or self._backend.keeper is not None}
        log.warning("policy-engine: out of memory on %s:%d (asked %d bytes, device limit %d, "
                    "%d free): allocator history written to %s", self._api.device, device,
                    asked, limit, free, path)
        if self._report is not None:
            self._report(Artifact(path, size, extra, backend="memory"), Status.OOM)


class MemoryBackend:
    """Once per process: the device's allocator calls, and who holds the history."""

    name: ClassVar[str] = "memory"
    extension: ClassVar[str] = ".pickle"
    session: ClassVar[type[Session]] = MemorySession

    def __init__(self, api: MemoryApi | None = None) -> None:
        self._api = api  # tests pass a stand-in; by default the device's, when first used
        self.recording: MemorySession | None = None  # history is on for this capture
        self.current: MemorySession | None = None  # the capture open now (OOM dumps)
        self.observer_attached = False
        self._lock = threading.Lock()
        # history: always: the role that keeps history on, its settings, and the steps
        # whose out-of-memory snapshot (outside a capture) is written
        self.keeper: Keeper | None = None
        self._kept: CaptureInfo | None = None
        self._kept_steps: set[int | None] = set()

    def open(self, info: CaptureInfo) -> MemorySession:
        api = self._api if self._api is not None else detect(info.settings["device"])
        why = api.unavailable()
        if why is not None:
            raise BackendUnavailable(f"allocator history cannot be recorded: {why}")
        self._api = api
        session = MemorySession(self, info, api)
        self.current = session
        if info.settings["on_oom"]:
            self._attach(api)
        return session

    def _attach(self, api: MemoryApi) -> None:
        with self._lock:
            if self.observer_attached:
                return
            self.observer_attached = True  # tried once per process, whatever the outcome
        try:
            attached = api.attach_oom(self._out_of_memory)
        except Exception as err:  # e.g. an allocator backend without observers
            log.warning("policy-engine: no out-of-memory callback on %s (%s: %s): no "
                        "_oom.pickle dumps", api.device, type(err).__name__, err)
            return
        if not attached:
            log.warning("policy-engine: this torch cannot call back on out-of-memory "
                        "errors (%s): no _oom.pickle dumps", api.device)

    def _out_of_memory(self, device: int, asked: int, limit: int, free: int) -> None:
        """Called by the allocator (any thread) when it fails; never raises into it."""
        session = self.current
        try:
            if session is not None:
                if session._settings["on_oom"]:
                    session.out_of_memory(device, asked, limit, free)
            elif self.keeper is not None:
                self._kept_out_of_memory(self.keeper, device, asked, limit, free)
        except Exception as err:
            log.warning("policy-engine: could not write the out-of-memory snapshot: %s: %s",
                        type(err).__name__, err)

    # -- history: always -----------------------------------------------------------
    def keep(self, info: CaptureInfo, keeper: Keeper) -> bool:
        """Turn history on for good for the role ``info`` describes (``history: always``):
        until :meth:`release`, captures dump it without turning it off, and an
        out-of-memory error outside any capture is written through ``keeper``. False
        when another role keeps it already (a process has one history). Raises
        BackendUnavailable when this process cannot record history."""
        api = self._api if self._api is not None else detect(info.settings["device"])
        why = api.unavailable()
        if why is not None:
            raise BackendUnavailable(f"allocator history cannot be recorded: {why}")
        self._api = api
        with self._lock:
            if self.keeper is not None:
                return False
            self.keeper, self._kept = keeper, info
        settings = info.settings
        try:
            if self.recording is None:  # a capture recording has it on already
                api.start(max_entries=int(settings["max_entries"]), stacks=settings["stacks"],
                          context=settings["context"])
        except Exception:
            self.keeper = self._kept = None
            raise
        if settings["on_oom"]:
            self._attach(api)
        return True

    def release(self, keeper: Keeper) -> None:
        """The role that keeps history closed: history off, unless a capture records."""
        if self.keeper is not keeper:
            return
        self.keeper = self._kept = None
        if self.recording is None and self._api is not None:
            self._api.stop()

    def _kept_out_of_memory(self, keeper: Keeper, device: int, asked: int, limit: int,
                            free: int) -> None:
        info = self._kept
        named = keeper.name()
        if info is None or named is None or not info.settings["on_oom"]:
            return
        stem, step = named
        with self._lock:
            again = step in self._kept_steps or len(self._kept_steps) >= MAX_KEPT_DUMPS
            if not again:
                self._kept_steps.add(step)
        if again:
            log.warning("policy-engine: out of memory again on %s:%d (asked %d bytes); no "
                        "snapshot: one is written per step, %d per process at most",
                        self._api.device if self._api else "?", device, asked, MAX_KEPT_DUMPS)
            return
        api = self._api
        assert api is not None  # keep() set it
        path, size = write_atomic(info.output_dir, stem + OOM, SNAPSHOT, api.dump)
        extra = {"device": api.device, "device_index": device, "bytes_asked": asked,
                 "device_limit": limit, "device_free": free, "history": True}
        log.warning("policy-engine: out of memory on %s:%d (asked %d bytes, device limit %d, "
                    "%d free) outside a capture: allocator history written to %s",
                    api.device, device, asked, limit, free, path)
        keeper.report(Artifact(path, size, extra, backend="memory"), Status.OOM, step)


BACKEND = MemoryBackend
