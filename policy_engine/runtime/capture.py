"""One capture: a backend session driven through the schedule's actions.

The schedule decides the action at every inner step; the backend is called only when the
action changes (see :mod:`policy_engine.backends.base`). Between changes ``step()`` is an
increment and a comparison: ``quiet_until`` is the next inner step that needs any work.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..backends.base import Artifact, Session
from ..schedule import Action, Schedule
from . import manifest

NONE, WARMUP, RECORD, SAVE = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE
_NEVER = 1 << 62


class Slot:
    """The one capture a backend may run in this process, shared by colocated roles."""

    __slots__ = ("backend", "capture", "lock", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.capture: Capture | None = None
        self.backend: Any = None  # created on first use; tests may install their own
        self.lock = threading.RLock()


_slots: dict[str, Slot] = {}
_slots_lock = threading.Lock()


def slot(name: str) -> Slot:
    with _slots_lock:
        found = _slots.get(name)
        if found is None:
            found = _slots[name] = Slot(name)
        return found


def active_captures() -> list[Capture]:
    with _slots_lock:
        return [s.capture for s in _slots.values() if s.capture is not None]


def _timestamp() -> str:
    now = time.time()
    return time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"


class Capture:
    """A capture in progress. Created and ended by its owner, advanced by anyone's step()."""

    def __init__(self, *, slot: Slot, owner: str, session: Session, schedule: Schedule | None,
                 record: dict[str, Any], name: Callable[..., str], output_dir: str,
                 on_failure: Callable[[BaseException, str], None]) -> None:
        self.slot = slot
        self.owner = owner
        self.session = session
        self.schedule = schedule
        self.record = record  # manifest fields fixed for the capture
        self.name = name
        self.output_dir = output_dir
        self.on_failure = on_failure
        self.joined: list[str] = []
        self.inner = 0  # the last inner step acted on (under the slot's lock)
        self._ticks = itertools.count(1)
        self.quiet_until = 0
        self.action: Action | None = None
        self.recording = False
        self.cycle = 0
        self.cycle_steps: list[int] = []
        self.cycle_started = time.time()
        self.cycle_stamp = _timestamp()
        self.stem = ""
        self.saved = 0
        self.phase = "start"  # the backend call under way, for failure messages

    # -- the schedule ---------------------------------------------------------------
    def _action_at(self, step: int) -> Action:
        return RECORD if self.schedule is None else self.schedule.action(step)

    def _next_change(self) -> int:
        """The first inner step after this one whose action needs a backend call."""
        if self.action in (RECORD, SAVE) or self.schedule is None:
            return self.inner + 1
        sched = self.schedule
        limit = sched.steps_needed
        if limit is not None and self.inner >= limit:
            return _NEVER
        step = self.inner + 1
        bound = step + sched.period + sched.skip_first + 1
        while step < bound and sched.action(step) is self.action:
            step += 1
        return step

    def begin(self) -> None:
        self._move(self._action_at(0))

    def step(self) -> None:
        # next() on a count is atomic, so steps from several threads are never lost; the
        # quiet path touches nothing else. ``inner`` catches up under the lock.
        n = next(self._ticks)
        if n < self.quiet_until:
            return
        with self.slot.lock:
            if self.slot.capture is self and n > self.inner:
                self.inner = n
                self._move(self._action_at(n))

    def _move(self, new: Action) -> None:
        try:
            self._transit(self.action, new)
        except Exception as err:  # a backend failure: the owner decides (warn or raise)
            self.on_failure(err, self.phase)
            return
        self.action = new
        self.quiet_until = self._next_change()

    def _transit(self, old: Action | None, new: Action) -> None:
        session = self.session
        if old is SAVE or (old is RECORD and new in (NONE, WARMUP)):
            self.phase = "save"
            self._save(complete=old is SAVE)
        if old is WARMUP and new is NONE:
            self.phase = "discard"
            session.discard()  # cannot happen with a valid schedule; never leak a warm-up
        elif new is WARMUP and old is not WARMUP:
            self.phase = "prepare"
            self._begin_cycle()
            session.prepare()
        elif new in (RECORD, SAVE):
            if not self.recording:
                self.phase = "start"
                if old is not WARMUP:
                    self._begin_cycle()
                session.start()
                self.recording = True
                self.cycle_steps = []
            self.phase = "step"
            session.step(self.inner)
            self.cycle_steps.append(self.inner)

    def _begin_cycle(self) -> None:
        """A cycle starts (warm-up or recording): fix its start time and name."""
        self.cycle_started = time.time()
        self.cycle_stamp = _timestamp()
        cycle = self.cycle if self.schedule is not None else None
        self.stem = self.name(cycle=cycle, timestamp=self.cycle_stamp)
        set_stem = getattr(self.session, "set_stem", None)
        if set_stem is not None:  # backends that name outputs at start (torch_npu)
            set_stem(self.stem)

    def _save(self, *, complete: bool, status: str | None = None) -> None:
        self.recording = False
        cycle = self.cycle
        stem = self.stem
        start = self.cycle_started
        note = getattr(self.session, "note", None)
        if note is not None:  # backends that label their own traces (torch metadata)
            note({"joined": list(self.joined), "inner_steps": list(self.cycle_steps)})
        artifacts = self.session.save(stem, cycle)
        self.cycle += 1
        self.saved += len(artifacts)
        for artifact in artifacts:
            self._log(artifact, cycle, status or ("complete" if complete else "partial"), start)

    def _log(self, artifact: Artifact | None, cycle: int, status: str, start: float,
             error: str | None = None) -> None:
        record = dict(self.record)
        record.update({
            "path": os.path.relpath(artifact.path, self.output_dir) if artifact else None,
            "bytes": artifact.bytes if artifact else None,
            "cycle": cycle,
            "inner_steps": list(self.cycle_steps),
            "status": status,
            "start": start,
            "end": time.time(),
            "joined": list(self.joined),
        })
        if artifact is not None and artifact.extra:
            record["extra"] = dict(artifact.extra)
        if error:
            record["error"] = error
        manifest.append(self.output_dir, record)

    def end(self, status: str = "complete") -> None:
        """Stop the capture: save a cycle that is recording, discard a warm-up.

        Every capture leaves a manifest line: one that never reached a recorded step says
        so (status partial, no file); one whose save fails is recorded as failed.
        """
        with self.slot.lock:
            if self.slot.capture is self:
                self.slot.capture = None
            try:
                if self.recording:
                    cut_short = self.schedule is not None and self.action is not SAVE
                    self.phase = "save"
                    self._save(complete=not cut_short,
                               status="partial" if status != "complete" or cut_short else None)
                else:
                    if self.action is WARMUP:
                        self.phase = "discard"
                        self.session.discard()
                    if not self.saved:
                        self._log(None, self.cycle, "partial", self.cycle_started,
                                  error="the capture ended before its schedule recorded a step")
            except Exception as err:
                self._log(None, self.cycle, "failed", self.cycle_started,
                          error=f"{type(err).__name__}: {err}")
                raise
            finally:
                self.phase = "close"
                self.session.close()

    def fail(self, error: BaseException) -> None:
        """Record a failed capture and release the backend as far as it lets us."""
        with self.slot.lock:
            if self.slot.capture is self:
                self.slot.capture = None
        for call in (self.session.discard, self.session.close):
            # Already failing: the first error is the one reported.
            with contextlib.suppress(Exception):
                call()
        with contextlib.suppress(OSError):
            self._log(None, self.cycle, "failed", self.cycle_started,
                      error=f"{type(error).__name__}: {error}")
