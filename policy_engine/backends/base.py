"""The contract between the runtime interpreter and a profiling tool.

The interpreter owns the schedule. It calls a backend only on transitions:

    NONE -> WARMUP            session.prepare()
    NONE/WARMUP -> RECORD     session.start()      (start() after no prepare() is allowed)
    each inner step recorded  session.step(n)
    end of a cycle            session.save(stem, cycle) -> artifacts written
    capture ends in WARMUP    session.discard()
    capture over              session.close()

Before each cycle's prepare() (or start() when there is no warm-up) the interpreter calls
``session.set_stem(stem)`` when the session has it, for tools that name their output
when they start rather than when they save (torch_npu). Before each save() it calls
``session.note(facts)`` when the session has it, with facts learnt during the cycle
(``joined`` roles, recorded ``inner_steps``), for backends that label their own traces.

A ``Backend`` object lives once per process per backend name (the runtime's arbiter
keeps it); ``open`` makes one ``Session`` per capture. Backend modules must import
nothing heavy at module level: the CLI imports them to validate settings and must never
import torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

import attrs


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


class Session(Protocol):
    """One capture on one backend."""

    def prepare(self) -> None: ...

    def start(self) -> None: ...

    def step(self, inner_step: int) -> None: ...

    def save(self, stem: str, cycle: int) -> list[Artifact]: ...

    def discard(self) -> None: ...

    def range(self, name: str) -> AbstractContextManager[object]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """A profiling tool: torch.profiler, torch_npu's profiler, Nsight Systems, ..."""

    name: ClassVar[str]
    #: what the backend appends to a rendered name ("" when the tool names files itself)
    extension: ClassVar[str]

    def open(self, info: CaptureInfo) -> Session: ...
