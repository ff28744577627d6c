"""Several backends recording the same captures (``backend: [torch, memory]``).

A :class:`Combined` session drives each part's session through the same transitions, so
one capture yields one file per part and cycle, told apart by their extensions, and one
manifest line each (every :class:`Artifact` names the part that wrote it). Parts start in
the policy's order, timeline tool first, and stop in reverse, so the allocator history
covers what the trace covers and not its export.

A part that cannot run in this process (no CUDA for memory) is left out at open, with a
warning naming role, rank and reason and a manifest ``note`` line (``left_out``, naming
the part and why), when the role says ``on_error: warn``; the other parts go on. Under
``on_error: raise``, or when no part is left, the open fails.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import attrs

from policy_engine.backends.base import Artifact, BackendUnavailable, CaptureInfo, Session
from policy_engine.files.records import Status

log = logging.getLogger("policy_engine")


class CombinedSession(Session):
    """The sessions of one capture's parts, called in turn."""

    #: every save goes through save_later, which stops each part now (last first) and
    #: leaves what the parts that save later still have to write
    saves_later = True

    def __init__(self, parts: list[tuple[str, Session]]) -> None:
        self.parts = parts
        self.names = tuple(name for name, _ in parts)
        self.any_thread = all(s.any_thread for _, s in parts)

    def _each(self, call: Callable[[Session], object], *, reverse: bool = False) -> None:
        """``call`` on every part; the first error is raised after every part was called
        (a part left running would hold its tool)."""
        first: BaseException | None = None
        for _, session in (reversed(self.parts) if reverse else self.parts):
            try:
                call(session)
            except Exception as err:
                first = first or err
        if first is not None:
            raise first

    def set_stem(self, stem: str) -> None:
        self._each(lambda s: s.set_stem(stem))

    def note(self, facts: dict[str, Any]) -> None:
        self._each(lambda s: s.note(facts))

    def set_reporter(self, report: Callable[[Artifact, Status], None],
                     name: Callable[[], str]) -> None:
        self._each(lambda s: s.set_reporter(report, name))

    def prepare(self) -> None:
        self._each(lambda s: s.prepare())

    def start(self) -> None:
        started: list[Session] = []
        try:
            for _, session in self.parts:
                session.start()
                started.append(session)
        except Exception:
            for session in reversed(started):  # leave no part recording
                try:
                    session.discard()
                except Exception as err:
                    log.debug("discard after a failed start: %r", err)
            raise

    def step(self, inner_step: int) -> None:
        self._each(lambda s: s.step(inner_step))

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        """Every part's files, timeline tool first. A part that fails gives a failed
        artifact (path empty, the error in ``failed``): the others' files still count."""
        return self.save_later(stem, cycle)()

    def save_later(self, stem: str, cycle: int) -> Callable[[], list[Artifact]]:
        """Stop every part now (last first); what is left to write, in the parts' order,
        is the returned call: a part that writes only later does so there, the others
        have written already."""
        writes: list[tuple[str, Callable[[], list[Artifact]]]] = []
        for name, session in reversed(self.parts):
            try:  # a part that does not save later has written here (Session.save_later)
                write = session.save_later(stem, cycle)
            except Exception as err:
                write = functools.partial(list, [Artifact(
                    "", None, failed=f"{type(err).__name__}: {err}")])
            writes.insert(0, (name, write))

        def write_all() -> list[Artifact]:
            out: list[Artifact] = []
            for name, write in writes:
                try:
                    found = write()
                except Exception as err:
                    found = [Artifact("", None, failed=f"{type(err).__name__}: {err}")]
                out += [attrs.evolve(a, backend=a.backend or name) for a in found]
            return out
        return write_all

    def discard(self) -> None:
        self._each(lambda s: s.discard(), reverse=True)

    def range(self, name: str) -> AbstractContextManager[object]:
        return _Ranges([session.range(name) for _, session in self.parts])

    def close(self) -> None:
        self._each(lambda s: s.close(), reverse=True)


class _Ranges:
    """Each part's range of one region, opened and closed together."""

    def __init__(self, ranges: list[AbstractContextManager[object]]) -> None:
        self._ranges = ranges
        self._stack = ExitStack()

    def __enter__(self) -> _Ranges:
        with ExitStack() as stack:
            for rng in self._ranges:
                stack.enter_context(rng)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


class Combined:
    """A Backend made of the per-process backend objects of each part; one per role and
    process (a part left out is reported once)."""

    name = "combined"
    extension = ""
    session = CombinedSession

    def __init__(self, parts: list[tuple[str, Any]], settings: Mapping[str, Mapping[str, Any]],
                 note: Callable[..., None] | None = None) -> None:
        self.parts = parts
        self.settings = settings
        self._left_out: set[str] = set()  # parts already reported
        # writes a manifest note line (the runtime's; backends never write the manifest)
        self._note = note

    def open(self, info: CaptureInfo) -> CombinedSession:
        opened: list[tuple[str, Session]] = []
        try:
            for name, backend in self.parts:
                part_info = attrs.evolve(info, settings=self.settings[name])
                try:
                    opened.append((name, backend.open(part_info)))
                except BackendUnavailable as err:
                    if info.on_error == "raise" or name == self.parts[0][0]:
                        raise
                    if name in self._left_out:
                        continue
                    self._left_out.add(name)
                    log.warning("policy-engine: %s is left out of the captures of role %r on "
                                "rank %d: %s", name, info.role, info.rank, err)
                    if self._note is not None:
                        try:
                            self._note("left_out", backend=name, message=str(err))
                        except Exception as failed:  # the warning above says it already
                            log.debug("left_out note: %r", failed)
        except Exception:
            for _, session in opened:
                try:
                    session.close()
                except Exception as err:
                    log.debug("close after a failed open: %r", err)
            raise
        return CombinedSession(opened)
