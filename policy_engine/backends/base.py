"""The contract between the runtime interpreter and a profiling tool.

The interpreter owns the schedule. It calls a backend only on transitions:

    NONE -> WARMUP            session.prepare()
    NONE/WARMUP -> RECORD     session.start()      (start() after no prepare() is allowed)
    each inner step recorded  session.step(n)
    end of a cycle            session.save(stem, cycle) -> artifacts written
                              (or session.save_later(stem, cycle), when saves_later)
    capture ends in WARMUP    session.discard()
    capture over              session.close()

:class:`Session` lists every hook a session has, in one place: the required ones above
(and ``range``), and the optional ones with the default that does nothing (``any_thread``,
``saves_later``, ``set_reporter``, ``set_stem``, ``note``, ``save_later``). Every session
subclasses it, and the runtime calls each hook directly.

A ``Backend`` object lives once per process per backend name (the runtime's arbiter
keeps it); ``open`` makes one ``Session`` per capture. Backend modules must import
nothing heavy at module level: the CLI imports them to validate settings and must never
import torch.
"""

from __future__ import annotations

import abc
import functools
import math
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

import attrs

from policy_engine.files.records import Status

#: Tests only: seconds this process's clock is moved by, so that a test job shows what a
#: host whose clock is off does to the figures: its traces' timestamps (the torch
#: session's ``baseTimeNanoseconds``) and its readings of the job's clock
#: (runtime.triggers.clock) move together, as a host's clock would move them.
TEST_CLOCK_SHIFT = "POLICY_ENGINE_TEST_CLOCK_SHIFT"


def clock_shift_ns() -> int:
    """:data:`TEST_CLOCK_SHIFT` in nanoseconds (0 when unset or not a finite number of
    at most a day)."""
    text = os.environ.get(TEST_CLOCK_SHIFT)
    if not text:
        return 0
    try:
        seconds = float(text)
    except ValueError:
        return 0
    return int(seconds * 1e9) if math.isfinite(seconds) and abs(seconds) <= 86400 else 0


class BackendUnavailable(RuntimeError):
    """The tool cannot run here (package missing, no device). Reported once, then off."""


@attrs.frozen
class CaptureInfo:
    """What a backend needs to know about one capture."""

    role: str
    rank: int
    world: int
    coords: Mapping[str, int]
    region: str | None
    steps: tuple[int, ...]
    output_dir: str
    settings: Mapping[str, Any]
    plan_hash: str
    on_error: str

    def metadata(self) -> dict[str, Any]:
        """Labels a backend writes into its own trace metadata where it can."""
        return {
            "role": self.role,
            "region": self.region,
            "rank": self.rank,
            "world": self.world,
            "coords": dict(self.coords),
            "steps": list(self.steps),
            "plan_hash": self.plan_hash,
        }


@attrs.frozen
class Artifact:
    """One output a session wrote (or that an external tool will write, for nsight)."""

    path: str
    bytes: int | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    #: the part that wrote it, when several backends record one capture
    backend: str | None = None
    #: why the part wrote nothing (path empty): the capture's other files still count
    failed: str | None = None


class Session(abc.ABC):
    """One capture on one backend: every hook the runtime calls, in one place.

    The abstract methods are required. The rest are optional: a session overrides what its
    tool needs, and the defaults here do nothing, so the runtime calls every hook on every
    session without asking first.
    """

    #: Whether any thread may drive the capture. False (torch.profiler, torch_npu): the
    #: runtime keeps every call on the thread that opened it and defers the others' steps.
    #: True: the tool's state is process-wide (NVTX ranges, allocator history).
    any_thread: bool = False
    #: Whether :meth:`save_later` leaves work that another thread may do: when True and the
    #: role exports in the background, the runtime stops the tool with ``save_later`` on the
    #: capture's thread and hands the call it returns to the export thread; when False it
    #: calls :meth:`save` there and then.
    saves_later: ClassVar[bool] = False

    # -- required: the transitions ------------------------------------------------------
    @abc.abstractmethod
    def prepare(self) -> None:
        """Warm the tool up (NONE -> WARMUP); nothing is recorded yet."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start recording (-> RECORD), with or without a prepare() before."""

    @abc.abstractmethod
    def step(self, inner_step: int) -> None:
        """Recorded inner step ``inner_step`` begins."""

    @abc.abstractmethod
    def save(self, stem: str, cycle: int) -> list[Artifact]:
        """End the cycle and write its files, named ``stem`` plus the backend's endings;
        what was written (a failed part as an Artifact with ``failed`` set)."""

    @abc.abstractmethod
    def discard(self) -> None:
        """Drop a warm-up or a recording without writing anything."""

    @abc.abstractmethod
    def range(self, name: str) -> AbstractContextManager[object]:
        """The range that marks region ``name`` in the recording, while it records."""

    @abc.abstractmethod
    def close(self) -> None:
        """The capture is over: release the tool (after a save or a discard, or after a
        failure, when it may be anywhere)."""

    # -- optional: defaults that do nothing ---------------------------------------------
    def set_reporter(self, report: Callable[[Artifact, Status], None],
                     name: Callable[[], str]) -> None:
        """Called once, when the capture is made, for a session that writes files outside
        the transitions (the memory backend's out-of-memory snapshot): ``report(artifact,
        status)`` records such a file in the manifest, ``name()`` gives the name of the
        cycle under way. The default ignores them."""
        return None

    def set_stem(self, stem: str) -> None:
        """The name of the coming cycle, before its prepare() (or start() without
        warm-up), and again once its first recorded step fixes it, for tools that name
        their output when they start (torch_npu's folder). The default ignores it."""
        return None

    def note(self, facts: dict[str, Any]) -> None:
        """Facts learnt during the cycle, before each save: ``roles``, ``capture``,
        ``joined`` and the recorded ``inner_steps``, and for a torch capture with
        torch.distributed up its ``collectives`` (runtime/capture/collective_notes.py), for
        backends that label their own traces (torch metadata). The default ignores them."""
        return None

    def save_later(self, stem: str, cycle: int) -> Callable[[], list[Artifact]]:
        """End the cycle now, on the capture's thread, and return what writes its files,
        which any thread may call (see ``saves_later``). The default saves now and returns
        what :meth:`save` wrote."""
        return functools.partial(list, self.save(stem, cycle))


class Backend(Protocol):
    """A profiling tool: torch.profiler, torch_npu's profiler, Nsight Systems, ..."""

    name: ClassVar[str]
    #: what the backend appends to a rendered name ("" when the tool names files itself)
    extension: ClassVar[str]
    #: the Session class ``open`` makes (None: the backend opens no capture in this process)
    session: ClassVar[type[Session] | None]

    def open(self, info: CaptureInfo) -> Session: ...
