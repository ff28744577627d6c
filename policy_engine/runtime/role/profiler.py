"""RoleProfiler: what training code holds. One per (role, process).

A rank whose plan is off gets :class:`OffProfiler`, whose methods do nothing and whose
``annotate`` returns the function unchanged. A rank whose plan is on gets
:class:`RoleProfiler`, which opens captures for the plan's steps and regions.

A RoleProfiler is driven one of two ways, decided by the first call: training steps
(``training_step(n)``) or a plain loop (``step()`` or ``with prof:`` first: one capture for
the whole session). A backend failure under ``on_error: warn``, or ``close()``, turns it
off for good: its methods are then replaced by ones that do nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from policy_engine import backends
from policy_engine.backends.base import CaptureInfo
from policy_engine.backends.combined import Combined
from policy_engine.files.records import note_line, open_line
from policy_engine.plan.plan import Plan
from policy_engine.runtime import export, manifest, signals
from policy_engine.runtime.capture import Capture
from policy_engine.runtime.failures import RoleFailures
from policy_engine.runtime.off import _off_region, _off_step, _off_training_step, as_step
from policy_engine.runtime.role_parts import NEW, SESSION, STEPS, Fixed, Loop, Why
from policy_engine.runtime.state import Slot, capture_id, slot, warn_once
from policy_engine.runtime.triggers import PLAN
from policy_engine.runtime.wrapping import _DiscreteBlock, _RegionBlock, wrap_region

log = logging.getLogger("policy_engine")
F = TypeVar("F", bound=Callable[..., Any])
_get_ident = threading.get_ident


class _StepBlock:
    """``with prof.training_step(n):``."""

    __slots__ = ("n", "prof")

    def __init__(self, prof: RoleProfiler, n: int) -> None:
        self.prof = prof
        self.n = n

    def __enter__(self) -> None:
        self.prof._enter_step(self.n)

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.prof._exit_step(self.n, failed=exc_type is not None)


def _process_backend(name: str) -> Any:
    """This process's Backend object for ``name`` (kept in its slot; tests may install
    their own there)."""
    found = slot(name)
    if found.backend is None:
        found.backend = backends.create(name)
    return found.backend


#: Backends whose capture ranges outlive a discard: nsys writes a report for every range
#: it saw, so a provisional whole-session capture dropped later would leave one behind
#: (and shift the numbers of the reports after it).
LASTING_RANGES = frozenset({"nsight"})


class RoleProfiler(RoleFailures):
    """Carries out one role's plan in this process. Safe from any thread (docs/runtime.md)."""

    def __init__(self, plan: Plan, *, policy_sources: tuple[str, ...] = ()) -> None:
        self.plan = plan
        self.slot: Slot[Capture] = slot(plan.backend)
        self._loop = Loop()
        loop = self._loop
        self._fixed = Fixed(plan, backends.session_settings(plan.backend, plan),
                            policy_sources, self._note)
        self._fixed.keep_history(plan, _process_backend, lambda: loop.outer, self._note)
        spec = plan.spec
        if spec.triggers.signal:
            problem = signals.install_usr2()
            if problem is not None:
                warn_once(("usr2", plan.role), "policy-engine: role %r: triggers.signal is "
                          "on but SIGUSR2 cannot be listened to: %s", plan.role, problem)

    def _note(self, kind: str, **fields: Any) -> None:
        """A ``note`` line in the manifest: a trigger, a slow step, a limit reached."""
        keys = ("role", "rank", "world", "pid", "plan_hash")
        with contextlib.suppress(OSError):
            manifest.append(self.plan.output_dir, note_line(
                {k: self._fixed.identity[k] for k in keys}, note=kind,
                time=time.time(), host=manifest.host_name(), **fields))

    # -- opening and closing captures ----------------------------------------------
    def _open(self, first: int | None, region: str | None,
              why: Why | None = None, begin: bool = True) -> Capture | None:
        """Open a capture, or join the one running on this backend (None when joined or
        when the role's limits are spent). ``why``: what triggered it beyond the plan;
        ``begin`` False leaves inner step 0's action to the caller (``Capture.begin``)."""
        plan = self.plan
        with self.slot.lock:
            running = self.slot.capture
            if running is not None:
                self._join(running, region)
                return None
            if self._fixed.budget is not None and not self._fixed.budget.room():
                return None
            cid = capture_id()
            steps = [] if first is None else [first]
            record = dict(self._fixed.identity, roles=list(plan.roles_for(first)),
                          region=region, steps=steps, trigger=PLAN if why is None else why[0])
            if why is not None and why[1] is not None:
                record["request"] = why[1]
            last = (None if first is None else plan.capture_last(first)) if why is None \
                else why[2]
            signals.install()  # before the open line: a SIGTERM from here on ends it
            try:
                # Write-ahead: a process killed from here on leaves a capture that
                # `traces` reports as interrupted.
                manifest.append(plan.output_dir, open_line(
                    record, capture=cid, start=time.time(), host=manifest.host_name(),
                    thread=threading.current_thread().name))
                info = CaptureInfo(plan.role, plan.rank, plan.world, plan.coords, region,
                                   tuple(steps), plan.output_dir, self._fixed.settings,
                                   plan.plan_hash, plan.on_error)
                session = self._backend().open(info)
            except Exception as err:
                self._open_failed(cid, record, err)
                return None
            schedule = plan.schedule
            if region is not None:
                found = plan.region(region)
                schedule = found.schedule if found is not None else schedule
            env = self._fixed.env

            def name(*, cycle: int | None, timestamp: str, at: int | None = None) -> str:
                late = {"pid": os.getpid(), "timestamp": timestamp, **env}
                return plan.capture_name(first=first, region=region, cycle=cycle, late=late,
                                         at=at, last=None if why is None else last)
            capture = Capture(slot=self.slot, session=session, schedule=schedule,
                              owner=plan.role, capture_id=cid, record=record, name=name,
                              output_dir=plan.output_dir,
                              last_step=last, on_failure=self._capture_failed,
                              step_per_cycle=first is not None and plan.step_per_cycle,
                              budget=self._fixed.budget, exporter=self._fixed.exporter,
                              on_export_failure=self._fixed.late.append,
                              keep=plan.spec.keep)
            self.slot.hold(capture)
            if begin and capture.begin():
                self._raise_failure(capture)
                return None
            return capture

    def _join(self, running: Capture, region: str | None) -> None:
        role = self.plan.role
        if not running.span.join(role):
            return
        declared = dict(self.plan.colocated)
        if role in declared and running.owner in declared:
            return
        mode = " (a discrete role: it gets no capture of its own here)" if region else ""
        warn_once(("colocate", frozenset((running.owner, role))),
                  "policy-engine: roles %r and %r share this process and its %s capture, "
                  "but the policy does not say so%s: add `colocate: [[%s, %s]]` so that "
                  "validate checks them and explain names their traces",
                  running.owner, role, self.slot.name, mode, running.owner, role)

    def _backend(self) -> Any:
        if len(self.plan.backends) == 1:
            return _process_backend(self.plan.backend)
        if self._fixed.combined is None:
            blocks = self.plan.spec.blocks
            self._fixed.combined = Combined(
                [(name, _process_backend(name)) for name in self.plan.backends],
                {name: self._fixed.settings if name == self.plan.backend else blocks[name]
                 for name in self.plan.backends}, note=self._note)
        return self._fixed.combined

    def _close(self, capture: Capture | None, status: str) -> None:
        if capture is None:
            return
        if self._loop.own is capture:
            self._loop.own = None
        try:
            capture.end(status)
        except Exception as err:
            self._failure(err, "stop", raising=status == "complete")

    def _turn_off(self, why: str) -> None:
        """From now on every method does nothing (instance attributes shadow the class's)."""
        self._loop.off = why
        self._fixed.let_go()  # history kept outside captures ends with the role
        self.step = _off_step  # type: ignore[method-assign]
        self.training_step = _off_training_step  # type: ignore[method-assign]
        self.region = _off_region  # type: ignore[method-assign]

    # -- training steps ---------------------------------------------------------------
    def training_step(self, n: int) -> AbstractContextManager[None]:
        """Context manager around outer training step ``n`` (an int or integer-like)."""
        return _StepBlock(self, n if n.__class__ is int else as_step(n))

    def _enter_step(self, n: int) -> None:
        with self.slot.lock:
            self._enter_step_locked(n)

    def _enter_step_locked(self, n: int) -> None:
        if self._fixed.late:
            self._export_failed()
        plan = self.plan
        own = self._loop.own
        if own is not None and own.home.pending:
            own.catch_up()
        if self._loop.mode is not STEPS:
            if self._loop.mode is SESSION:
                if own is not None and own is self._loop.provisional:
                    self._drop_session(own, n)
                else:
                    self._close(own, "complete")  # the code switched to training steps
                own = None
            self._loop.mode = STEPS
        self._loop.outer = n
        listener = self._fixed.listener
        planned = n in plan.steps
        why = None
        if listener is not None and not self._loop.off:
            why = listener.at_step(n, self._loop.captured)
            if planned:
                why = None  # the plan captures it anyway
            self._loop.why = why
        if plan.discrete or self._loop.off or (why is None and not planned):
            self._loop.captured = False
            if own is not None:
                self._close(own, "complete")
            return
        self._loop.captured = True
        if own is not None:
            if own.span.goes_on_into(n):
                own.add_step(n)  # a merged capture goes on
                return
            self._close(own, "complete")
        self._loop.own = self._open(n, None, why)

    def _exit_step(self, n: int, *, failed: bool) -> None:
        with self.slot.lock:
            self._exit_step_locked(n, failed=failed)

    def _exit_step_locked(self, n: int, *, failed: bool) -> None:
        self._loop.outer = None
        own = self._loop.own
        if own is None:
            return
        if failed:
            self._close(own, "partial")
        elif own.span.last_step is None or n < own.span.last_step:
            if own.home.pending:
                own.catch_up()  # a merged capture goes on into the next step
        else:
            self._close(own, "complete")

    # -- inner steps ----------------------------------------------------------------
    def step(self) -> None:
        """Advance the schedule of the capture running on this backend by one inner step."""
        capture = self.slot.capture
        if capture is not None:
            cursor = capture.cursor
            n = next(cursor.ticks)  # the quiet path of a step: a count and a comparison
            if n >= cursor.quiet_until and capture.advance(n):
                self._raise_failure(capture)
        elif self._loop.mode is NEW and not self.plan.discrete:
            # A plain loop that never calls training_step(): one capture for the session.
            with self.slot.lock:
                if self._loop.mode is NEW:
                    self._loop.mode = SESSION
                    self._loop.own = self._open(None, None)

    # -- regions --------------------------------------------------------------------
    def region(self, name: str) -> AbstractContextManager[None]:
        """Context manager for a named stage: a range, or a capture in discrete mode."""
        if self.plan.discrete:
            return _DiscreteBlock(self, name)
        return _RegionBlock(self, name)

    def open_region(self, name: str) -> Capture | None:
        """A discrete region's call starts: its own capture (None: joined another role's
        capture, or nothing to capture, or failed)."""
        plan = self.plan
        found = plan.region(name)
        if self._loop.off or (found is not None and not found.enabled):
            return None
        n = self._loop.outer
        why = None
        if n is not None and n not in plan.steps:
            if self._loop.why is None:
                return None
            why = (self._loop.why[0], self._loop.why[1], n)  # a step a trigger captures
        elif n is None and self._loop.mode is STEPS:
            return None
        self._loop.captured = True
        capture = self._open(n, name, why)
        if capture is not None:
            self._loop.own = capture
        return capture  # None: joined another role's capture, or failed

    def close_region(self, capture: Capture, status: str) -> None:
        """A discrete region's call ended: its capture ends (``partial`` on an exception)."""
        self._close(capture, status)

    def annotate(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator: each call of the function is the region ``name`` (default: its name)."""
        def wrap(fn: F) -> F:
            return wrap_region(self, name or fn.__name__, fn)
        return wrap

    # -- the end --------------------------------------------------------------------
    def close(self) -> None:
        """Stop whatever this role opened; the profiler does nothing from then on.
        Idempotent."""
        if self._loop.off == "closed":
            return
        own = self._loop.own
        self._turn_off("closed")
        if self._fixed.listener is not None:
            self._fixed.listener.close()  # its listener thread, when it has one
        self._close(own, "complete")
        export.flush()
        if self._fixed.late:
            self._export_failed()

    def __enter__(self) -> RoleProfiler:
        """``with profile_session(...) as prof:`` starts the whole-session capture here,
        as ``with torch.profiler.profile(...)`` does.

        Until the block's first ``step()`` it is provisional: a ``training_step(n)`` before
        any ``step()`` drops it (no trace; its close line says why), so a loop of training
        steps inside the block writes its per-step captures only, as ``explain`` lists.
        On a backend whose ranges outlive a discard (:data:`LASTING_RANGES`) it begins
        recording at that first ``step()``, once it is kept.
        """
        if self._loop.mode is NEW and not self._loop.off and not self.plan.discrete:
            self._loop.mode = SESSION
            lasting = not LASTING_RANGES.isdisjoint(self.plan.backends)
            self._loop.own = self._open(None, None, begin=not lasting)
            if self._loop.own is not None:
                self._loop.provisional = self._loop.own
                self.step = self._first_step  # type: ignore[method-assign]
        return self

    def _first_step(self) -> None:
        """``step()`` while the session capture is provisional: the block is a plain loop,
        so the capture is kept (and begins, where its begin waited for this); later calls
        go straight to :meth:`step`."""
        kept = self._loop.provisional
        self._keep_session()
        waited = kept is not None and kept.cursor.action is None and kept is self._loop.own
        if waited and kept is not None and kept.begin():
            self._raise_failure(kept)
            return
        self.step()

    def _keep_session(self) -> None:
        self._loop.provisional = None
        if self.__dict__.get("step") == self._first_step:  # not when turned off since
            del self.step

    def _drop_session(self, capture: Capture, n: int) -> None:
        self._keep_session()
        if self._loop.own is capture:
            self._loop.own = None
        if capture.cycle.recording and self._fixed.budget is not None:
            self._fixed.budget.give_back()  # its cycle is dropped: limits count it not
        try:
            capture.drop(f"the `with` block's loop called training_step({n}) before any "
                         "prof.step(): per-step captures replace the whole-session capture")
        except Exception as err:
            self._failure(err, "stop", raising=False)

    def __exit__(self, exc_type: object, *rest: object) -> None:
        own = self._loop.own
        if exc_type is not None:
            self._close(own, "partial")
        self.close()


