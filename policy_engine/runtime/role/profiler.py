"""RoleProfiler: what training code holds. One per (role, process).

A rank whose plan is off gets :class:`~policy_engine.runtime.role.off.OffProfiler`, whose
methods do nothing. A rank whose plan is on gets :class:`RoleProfiler`, which opens
captures for the plan's steps and regions, and is one state machine (``_state``)::

    NEW ──step()──────────────────▶ SESSION      one capture for the whole session
    NEW ──with prof:──────────────▶ PROVISIONAL  that capture, until the first step()
    PROVISIONAL ──step()──────────▶ SESSION      the capture is kept
    PROVISIONAL ──training_step(n)▶ STEPS        the capture is dropped
    NEW, SESSION ──training_step(n)▶ STEPS       (SESSION: its capture completes)
    any ──close(), or a failure under on_error: warn──▶ OFF   every method does nothing

What every capture of the role opens with (its manifest identity, the backend's
settings, limits, triggers and exporter) is set once in ``__init__``; where the training
loop is (the outer step, the capture this role runs, what triggered this step) changes as
it goes. A backend failure writes the lines of a capture that could not open, warns or
raises as ``on_error`` asks, and turns the role OFF.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from importlib import metadata
from typing import Any, TypeVar

from policy_engine import backends
from policy_engine.backends.base import Backend, CaptureInfo
from policy_engine.backends.combined import Combined
from policy_engine.errors import ProfilingError
from policy_engine.files.layout import host_name
from policy_engine.files.records import Status, note_line
from policy_engine.plan.plan import Plan
from policy_engine.runtime.capture.driver import Capture
from policy_engine.runtime.capture.lines import Lines
from policy_engine.runtime.process import export, manifest, signals
from policy_engine.runtime.process.budget import Budget
from policy_engine.runtime.process.state import Slot, slot, warn_once
from policy_engine.runtime.role import history
from policy_engine.runtime.role.off import NULL, as_step
from policy_engine.runtime.role.wrapping import (
    _DiscreteBlock,
    _RegionBlock,
    regions_on,
    wrap_region,
)
from policy_engine.runtime.triggers import clock
from policy_engine.runtime.triggers.listener_thread import ListenerThread
from policy_engine.runtime.triggers.step_triggers import PLAN, StepTriggers, Why

log = logging.getLogger("policy_engine")
F = TypeVar("F", bound=Callable[..., Any])



class State(enum.Enum):
    """The states of a RoleProfiler (the module docstring draws them)."""

    NEW = "new"
    PROVISIONAL = "provisional"
    SESSION = "session"
    STEPS = "steps"
    OFF = "off"


# Module names for the members: the quiet path of step() reads one global, as a constant.
NEW, PROVISIONAL, SESSION, STEPS, OFF = (State.NEW, State.PROVISIONAL, State.SESSION,
                                         State.STEPS, State.OFF)

#: The torch profiler's settings that change what a trace holds (compare withholds its
#: verdict where two runs differ in them).
_RECORDED = ("activities", "record_shapes", "profile_memory", "with_stack", "with_flops",
             "with_modules")


def recording(plan: Plan) -> dict[str, Any]:
    """How a torch capture of ``plan`` records: the torch version (``torch``) and the
    settings that change what the trace holds (``recorded``); nothing for other backends."""
    if "torch" not in plan.backends:
        return {}
    settings = plan.settings
    recorded = {k: (sorted(settings[k]) if k == "activities" else settings[k])
                for k in _RECORDED if k in settings}
    found = sys.modules.get("torch")
    version = getattr(found, "__version__", None)
    if version is None:
        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            version = None
    return {"recorded": recorded, **({"torch": str(version)} if version else {})}


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


def _process_backend(name: str) -> Backend:
    """This process's Backend object for ``name`` (kept in its slot; tests may install
    their own there)."""
    found = slot(name)
    if found.backend is None:
        found.backend = backends.create(name)
    return found.backend


class RoleProfiler:
    """Carries out one role's plan in this process. Safe from any thread (docs/runtime.md)."""

    def __init__(self, plan: Plan, *, policy_sources: tuple[str, ...] = ()) -> None:
        self.plan = plan
        self.slot: Slot[Capture] = slot(plan.backend)
        spec = plan.spec
        # -- what every capture of the role opens with (set once) --
        self._settings = backends.session_settings(plan.backend, plan)
        self._env = plan.env_fields()
        self._identity = {**plan.identity(manifest.file_hash(policy_sources)),
                          **recording(plan)}
        limits = spec.limits
        self._budget = Budget(limits, self._note, plan.role) if (
            limits.captures is not None or limits.bytes is not None) else None
        self._listener = StepTriggers(plan, spec.triggers, self._note, self._position) \
            if spec.triggers.listens else None
        # the listener thread when it watches for stalls: told where each step ends
        self._watch = self._listener.thread if self._listener is not None and \
            spec.triggers.stall is not None else None
        # the job's clock, where no listener of the triggers keeps it (runtime.triggers.clock)
        self._clock = ListenerThread(plan, spec.triggers, job=True, requests=False,
                                     note=self._note) if clock.wanted(plan, spec.triggers) \
            else None
        self._exporter = export.exporter(spec.export_in_flight) \
            if spec.export == "background" else None
        self._late: list[BaseException] = []  # background exports that failed
        self._combined: Combined | None = None  # several backends: made on first open
        # -- where the training loop is (changes as it goes) --
        self._state = NEW
        self._closed = False  # close() was called: a second one does nothing
        self._outer: int | None = None  # the outer step under way
        self._own: Capture | None = None  # the capture this role opened and runs
        self._captured = False  # the step under way is inside a capture
        self._why: Why | None = None  # what triggered this step beyond the plan
        # history kept outside captures (``history: always``), released when OFF
        self._release: Callable[[], None] | None = history.keep_history(
            plan, self._identity, self._settings, _process_backend, lambda: self._outer,
            self._note)
        if spec.triggers.signal or spec.triggers.stall is not None:
            problem = signals.install_usr2()
            if problem is not None:
                which = "signal" if spec.triggers.signal else "stall"
                warn_once(("usr2", plan.role), "policy-engine: role %r: triggers.%s is "
                          "on but SIGUSR2 cannot be listened to: %s", plan.role, which,
                          problem)

    def _note(self, kind: str, **fields: Any) -> None:
        """A ``note`` line in the manifest: a trigger, a slow step, a limit reached."""
        keys = ("role", "rank", "world", "pid", "plan_hash")
        with contextlib.suppress(OSError):
            manifest.append(self.plan.output_dir, note_line(
                {k: self._identity[k] for k in keys}, note=kind,
                time=time.time(), host=host_name(), **fields))

    def _position(self) -> dict[str, Any]:
        """Where the role is, for a stall record: its regions open, the inner step and
        the capture under way. Called on the listener thread while the training thread may
        be stuck: it reads, and takes no lock."""
        capture = self.slot.capture
        if capture is None:
            watch = self._watch
            frame = sys._current_frames().get(watch.trainer) if watch is not None else None
            return {"region": regions_on(frame), "inner_step": None, "capture": None}
        home = capture.home
        return {"region": list(capture.regions.stack)[:16],
                "inner_step": next(copy.copy(capture.cursor.ticks)) - 1,
                "capture": {"id": capture.lines.id, "backend": self.slot.name,
                            "owner": capture.span.owner, "steps": list(capture.span.steps[-64:]),
                            "thread": home.name,
                            "main": home.ident == threading.main_thread().ident}}

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
            if self._budget is not None and not self._budget.room():
                return None
            steps = [] if first is None else [first]
            record = dict(self._identity, roles=list(plan.roles_for(first)),
                          region=region, steps=steps, trigger=PLAN if why is None else why.trigger)
            if why is not None and why.request is not None:
                record["request"] = why.request
            last = (None if first is None else plan.capture_last(first)) if why is None \
                else why.last
            lines = Lines(record, plan.output_dir, budget=self._budget,
                          exporter=self._exporter, on_export_failure=self._late.append,
                          keep=plan.spec.keep)
            signals.install()  # before the open line: a SIGTERM from here on ends it
            try:
                lines.open()  # write-ahead: from here on, a killed process leaves it known
                clock.capture_opened()  # the job's clock is measured again, off this thread
                info = CaptureInfo(plan.role, plan.rank, plan.world, plan.coords, region,
                                   tuple(steps), plan.output_dir, self._settings,
                                   plan.plan_hash, plan.on_error)
                session = self._backend().open(info)
            except Exception as err:
                lines.fail(f"{type(err).__name__}: {err}", steps=steps)
                self._failure(err, "open")
                return None
            schedule = plan.schedule
            if region is not None:
                found = plan.region(region)
                schedule = found.schedule if found is not None else schedule
            env = self._env

            def name(*, cycle: int | None, timestamp: str, at: int | None = None) -> str:
                late = plan.late_fields(timestamp, env)
                return plan.capture_name(first=first, region=region, cycle=cycle, late=late,
                                         at=at, last=None if why is None else last)
            capture = Capture(slot=self.slot, session=session, schedule=schedule,
                              owner=plan.role, lines=lines, name=name, last_step=last,
                              on_failure=self._capture_failed,
                              step_per_cycle=first is not None and plan.step_per_cycle,
                              budget=self._budget)
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
        if role in declared and running.span.owner in declared:
            return
        mode = " (a discrete role: it gets no capture of its own here)" if region else ""
        warn_once(("colocate", frozenset((running.span.owner, role))),
                  "policy-engine: roles %r and %r share this process and its %s capture, "
                  "but the policy does not say so%s: add `colocate: [[%s, %s]]` so that "
                  "validate checks them and explain names their traces",
                  running.span.owner, role, self.slot.name, mode, running.span.owner, role)

    def _backend(self) -> Backend | Combined:
        if len(self.plan.backends) == 1:
            return _process_backend(self.plan.backend)
        if self._combined is None:
            blocks = self.plan.spec.blocks
            self._combined = Combined(
                [(name, _process_backend(name)) for name in self.plan.backends],
                {name: self._settings if name == self.plan.backend else blocks[name]
                 for name in self.plan.backends}, note=self._note)
        return self._combined

    def _close(self, capture: Capture | None, status: Status) -> None:
        if capture is None:
            return
        if self._own is capture:
            self._own = None
        try:
            capture.end(status)
        except Exception as err:
            self._failure(err, "stop", raising=status is Status.COMPLETE)

    def _turn_off(self) -> None:
        """To OFF: from now on every method does nothing (the stall watch sees no more
        steps: the one under way is not a stall)."""
        self._state = OFF
        if self._watch is not None:
            self._watch.done = self._watch.step
        if self._release is not None:  # history kept outside captures ends with the role
            self._release = self._release()

    # -- training steps ---------------------------------------------------------------
    def training_step(self, n: int) -> AbstractContextManager[None]:
        """Context manager around outer training step ``n`` (an int or integer-like)."""
        if n.__class__ is not int:
            n = as_step(n)
        if self._state is OFF:
            return NULL
        return _StepBlock(self, n)

    def _enter_step(self, n: int) -> None:
        with self.slot.lock:
            self._enter_step_locked(n)

    def _enter_step_locked(self, n: int) -> None:
        if self._late:
            self._export_failed()
        plan = self.plan
        own = self._own
        if own is not None and own.outcome.ended:
            own = self._own = None  # saved from outside (a stall): the plan goes on
        if own is not None and own.home.pending:
            own.catch_up()
        state = self._state
        if state is PROVISIONAL:
            if own is not None:
                self._drop_session(own, n)
            own = None
        elif state is SESSION:
            self._close(own, Status.COMPLETE)  # the code switched to training steps
            own = None
        if self._state is not OFF:  # dropping the session capture may have failed
            self._state = STEPS
        self._outer = n
        listener = self._listener
        planned = n in plan.steps
        why = None
        if listener is not None and self._state is not OFF:
            why = listener.at_step(n, self._captured)
            if planned:
                why = None  # the plan captures it anyway
            self._why = why
        if plan.discrete or self._state is OFF or (why is None and not planned):
            self._captured = False
            if own is not None:
                self._close(own, Status.COMPLETE)
            return
        self._captured = True
        if own is not None:
            if own.span.goes_on_into(n):
                own.add_step(n)  # a merged capture goes on
                return
            self._close(own, Status.COMPLETE)
        self._own = self._open(n, None, why)

    def _exit_step(self, n: int, *, failed: bool) -> None:
        with self.slot.lock:
            self._exit_step_locked(n, failed=failed)

    def _exit_step_locked(self, n: int, *, failed: bool) -> None:
        self._outer = None
        watch = self._watch
        if watch is not None:  # the stall watch: this step ended (and when, after a stall)
            watch.done = n
            if watch.stalled:
                watch.ended = time.perf_counter()
        own = self._own
        if own is None:
            return
        if failed:
            self._close(own, Status.PARTIAL)
        elif own.span.last_step is None or n < own.span.last_step:
            if own.home.pending:
                own.catch_up()  # a merged capture goes on into the next step
        else:
            self._close(own, Status.COMPLETE)

    # -- inner steps ----------------------------------------------------------------
    def step(self) -> None:
        """Advance the schedule of the capture running on this backend by one inner step."""
        state = self._state
        if state is OFF:
            return
        if state is PROVISIONAL:
            self._keep_session()
            return
        capture = self.slot.capture
        if capture is not None:
            cursor = capture.cursor
            n = next(cursor.ticks)  # the quiet path of a step: a count and a comparison
            if n >= cursor.quiet_until and capture.advance(n):
                self._raise_failure(capture)
        elif state is NEW and not self.plan.discrete:
            # A plain loop that never calls training_step(): one capture for the session.
            with self.slot.lock:
                if self._state is NEW:
                    self._state = SESSION
                    self._own = self._open(None, None)

    # -- regions --------------------------------------------------------------------
    def region(self, name: str) -> AbstractContextManager[None]:
        """Context manager for a named stage: a range, or a capture in discrete mode."""
        if self._state is OFF:
            return NULL
        if self.plan.discrete:
            return _DiscreteBlock(self, name)
        return _RegionBlock(self, name)

    def open_region(self, name: str) -> Capture | None:
        """A discrete region's call starts: its own capture (None: joined another role's
        capture, or nothing to capture, or failed)."""
        plan = self.plan
        found = plan.region(name)
        if self._state is OFF or (found is not None and not found.enabled):
            return None
        n = self._outer
        why = None
        if n is not None and n not in plan.steps:
            if self._why is None:
                return None
            why = self._why._replace(last=n)  # a step a trigger captures
        elif n is None and self._state is STEPS:
            return None
        self._captured = True
        capture = self._open(n, name, why)
        if capture is not None:
            self._own = capture
        return capture  # None: joined another role's capture, or failed

    def close_region(self, capture: Capture, status: Status) -> None:
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
        if self._closed:
            return
        own = failed = self._own
        if self._state is PROVISIONAL and own is not None and own.cursor.action is None:
            # A `with` block that never stepped keeps its capture, as torch records from
            # enter to exit; one whose begin waited for a first step begins now.
            self._state = SESSION
            own = None if own.begin() else own
        self._closed = True
        self._turn_off()
        if self._listener is not None:
            self._listener.close()  # its listener thread, when it has one
        if self._clock is not None:
            self._clock.close()
        self._close(own, Status.COMPLETE)
        export.flush()
        if self._late:
            self._export_failed()
        if own is None and failed is not None:
            self._raise_failure(failed)  # the late begin failed (raises if the role says)

    def __enter__(self) -> RoleProfiler:
        """``with profile_session(...) as prof:`` starts the whole-session capture here,
        as ``with torch.profiler.profile(...)`` does.

        Until the block's first ``step()`` it is provisional: a ``training_step(n)`` before
        any ``step()`` drops it (no trace; its close line says why), so a loop of training
        steps inside the block writes its per-step captures only, as ``explain`` lists.
        On a backend whose ranges outlive a discard (``Registered.lasting_ranges``: a
        dropped capture would leave an nsys report behind) it begins recording at that
        first ``step()``, once it is kept.
        """
        if self._state is NEW and not self.plan.discrete:
            lasting = any(backends.lasting_ranges(name) for name in self.plan.backends)
            own = self._open(None, None, begin=not lasting)
            if self._state is not OFF:  # the open may have failed
                self._own = own
                self._state = SESSION if own is None else PROVISIONAL
        return self

    def _keep_session(self) -> None:
        """``step()`` while PROVISIONAL: the block is a plain loop, so the capture is kept
        (and begins, where its begin waited for the first step); then this step."""
        self._state = SESSION
        kept = self._own
        if kept is not None and kept.cursor.action is None and kept.begin():
            self._raise_failure(kept)
            return
        self.step()

    def _drop_session(self, capture: Capture, n: int) -> None:
        if self._own is capture:
            self._own = None
        if capture.cycle.recording and self._budget is not None:
            self._budget.give_back()  # its cycle is dropped: limits count it not
        try:
            capture.drop(f"the `with` block's loop called training_step({n}) before any "
                         "prof.step(): per-step captures replace the whole-session capture")
        except Exception as err:
            self._failure(err, "stop", raising=False)

    def __exit__(self, exc_type: object, *rest: object) -> None:
        own = self._own
        if exc_type is not None:
            self._close(own, Status.PARTIAL)
        self.close()

    def _capture_failed(self, err: BaseException, when: str) -> None:
        """The capture this role owns failed in a backend call (on any thread). The call
        that drove it raises, if its role says so (:meth:`_raise_failure`)."""
        self._own = None
        self._turn_off()
        if self.plan.on_error != "raise":
            log.warning("%s; profiling is off for this role from now on",
                        self._message(err, when))

    def _raise_failure(self, capture: Capture) -> None:
        """After a call of this role drove ``capture`` into a backend failure."""
        if capture.outcome.failure is None:
            return
        err, when = capture.outcome.failure
        if self.plan.on_error == "raise":
            raise ProfilingError(self._message(err, when)) from err
        if capture.span.owner != self.plan.role:
            log.warning("%s (in the capture of role %r)", self._message(err, when),
                        capture.span.owner)

    def _export_failed(self) -> None:
        """A background export of this role failed (recorded in the manifest by the export
        thread): turn off, and raise here, on the training thread, if the role says so."""
        err = self._late.pop(0)
        self._late.clear()
        self._close(self._own, Status.PARTIAL)
        self._failure(err, "export")

    def _message(self, err: BaseException, when: str) -> str:
        plan = self.plan
        return (f"policy-engine: {plan.spec.backend_label} profiling of role {plan.role!r} "
                f"on rank {plan.rank} failed at {when}: {type(err).__name__}: {err}")

    def _failure(self, err: BaseException, when: str, raising: bool = True) -> None:
        self._turn_off()
        message = self._message(err, when)
        if self.plan.on_error == "raise" and raising:
            raise ProfilingError(message) from err
        log.warning("%s; profiling is off for this role from now on", message)
