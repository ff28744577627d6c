"""One verl ``DistProfiler`` driven by the policy.

verl's trainer calls ``start_profile(profile_step=N)`` and ``stop_profile()`` on each
worker group around a profiled step; :class:`VerlDriver` makes that ``training_step(N)``
of every policy role the worker holds (the hybrid worker's actor and its colocated ref
share one window). A stage (``@DistProfiler.annotate(role=...)``) is the region of the
role it belongs to; each mini-batch's ``DistProfiler.step()`` is ``prof.step()`` while a
window is open. An inner ``TrainingWorker`` profiler (:class:`Forward`) hands its steps
and stages to the outer worker of its process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from policy_engine.integrations.verl import roles as verl_roles
from policy_engine.integrations.verl import switch
from policy_engine.runtime.apply import Profiler
from policy_engine.runtime.role.profiler import RoleProfiler

log = logging.getLogger("policy_engine")
Stage = Callable[..., Any]


class _Running(threading.local):
    """The outer drivers whose stages run on this thread, innermost last."""

    def __init__(self) -> None:
        self.stack: list[VerlDriver] = []


_RUNNING = _Running()
#: The outer drivers of this process, oldest first (an inner profiler's candidates).
_OUTER: list[weakref.ref[VerlDriver]] = []
_OUTER_LOCK = threading.Lock()


def outer_driver() -> VerlDriver | None:
    """The outer driver an inner profiler belongs to now: the one whose stage runs on this
    thread, else the newest with a window open, else the newest."""
    if _RUNNING.stack:
        return _RUNNING.stack[-1]
    with _OUTER_LOCK:
        live = [d for d in (ref() for ref in _OUTER) if d is not None]
    for driver in reversed(live):
        if driver.window is not None:
            return driver
    return live[-1] if live else None


class _StageRange:
    """A discrete stage's own capture, with the stage as a range in it too, as verl marks
    it (``record_function(stage)`` inside the stage's trace)."""

    def __init__(self, prof: RoleProfiler, stage: str) -> None:
        self.block = prof.region(stage)
        self.prof = prof
        self.stage = stage
        self.entry: Any = None
        self.capture: Any = None

    def __enter__(self) -> None:
        self.block.__enter__()
        capture = self.prof.slot.capture
        if capture is not None and capture.span.owner == self.prof.plan.role:
            self.capture, self.entry = capture, capture.regions.region_enter(self.stage)

    def __exit__(self, *exc: Any) -> None:
        if self.entry is not None:
            self.capture.regions.region_exit(self.entry)
        self.block.__exit__(*exc)


class VerlDriver:
    """The profilers of one verl worker: ``main`` first, then the colocated roles (none:
    the worker profiles nothing, its role runs in a rollout engine, or the plugin is off).

    ``who`` names the worker in the line a failure says; ``raise_errors`` (the role's
    ``on_error: raise``) lets a failure propagate to verl instead of turning the plugin
    off in the process (:mod:`.switch`)."""

    def __init__(self, worker: str, main: str, profilers: Mapping[str, Profiler], *,
                 who: str = "", raise_errors: bool = False) -> None:
        self.worker = worker
        self.main = main
        self.profilers = dict(profilers)
        self.who = who or f"verl worker {worker!r}"
        self.raise_errors = raise_errors
        self.window: int | None = None  # the step whose window is open
        self._blocks: list[AbstractContextManager[None]] = []
        self._starts = 0
        with _OUTER_LOCK:
            _OUTER[:] = [ref for ref in _OUTER if ref() is not None]
            _OUTER.append(weakref.ref(self))

    @contextlib.contextmanager
    def _guarded(self, what: str, may_raise: bool = True) -> Iterator[None]:
        """Run a profiling call: a failure propagates under ``on_error: raise`` (unless
        ``may_raise`` is false: a stage's own exception is leaving), else it turns the
        plugin off in this process and ends every window it holds."""
        try:
            yield
        except Exception as err:
            if self.raise_errors and may_raise:
                raise
            switch.turn_off(self.who, f"{what} failed: {switch.failure(err)}")
            close_all(err)

    # -- windows ------------------------------------------------------------------------
    def start(self, **kwargs: Any) -> None:
        """``start_profile(profile_step=N)``: enter ``training_step(N)`` for every role
        (a window still open ends first). Without a step, start calls count from 1."""
        if not switch.is_off():
            with self._guarded("start_profile"):
                self._start(kwargs)

    def _start(self, kwargs: Mapping[str, Any]) -> None:
        self._starts += 1
        step = kwargs.get("profile_step", kwargs.get("global_step"))
        try:
            n = self._starts if step is None else int(step)
        except (TypeError, ValueError):
            raise ValueError(f"the step verl passed, {step!r}, is no step number") from None
        if self.window is not None:
            self._stop()
        self.window = n
        for prof in self.profilers.values():
            block = prof.training_step(n)
            block.__enter__()
            self._blocks.append(block)

    def stop(self, error: BaseException | None = None) -> None:
        """``stop_profile()``: leave the open window (``partial`` with ``error``)."""
        if not switch.is_off():
            with self._guarded("stop_profile", may_raise=error is None):
                self._stop(error)

    def _stop(self, error: BaseException | None = None) -> None:
        blocks, self._blocks, self.window = self._blocks, [], None
        for block in reversed(blocks):  # the colocated roles leave before the opener
            if error is None:
                block.__exit__(None, None, None)
            else:
                block.__exit__(type(error), error, error.__traceback__)

    def step(self) -> None:
        """A mini-batch ended: an inner step of the window's captures."""
        if self.window is not None and not switch.is_off():
            prof = self.profilers.get(self.main)
            if isinstance(prof, RoleProfiler):
                with self._guarded("the mini-batch step"):
                    prof.step()

    # -- stages -------------------------------------------------------------------------
    def _region(self, stage: str) -> AbstractContextManager[None] | None:
        """The region block of ``stage``, or None when it is no region of its role.

        Its role: the worker's own when that lists the stage among its regions (verl's
        hybrid worker profiles every stage under the actor's block), else the colocated
        role its label names (``ref_compute_log_prob``: ref). A role that lists regions
        takes those enabled; one that lists none, every stage (in continuous mode, where
        a stage is a range of the window)."""
        if self.window is None:
            return None
        prof = self.profilers.get(self.main)
        if not isinstance(prof, RoleProfiler) or prof.plan.region(stage) is None:
            # Not the worker's role's own region: the colocated role the label names.
            prof = self.profilers.get(verl_roles.stage_role(stage, self.profilers, self.main))
        if not isinstance(prof, RoleProfiler):
            return None
        plan = prof.plan
        found = plan.region(stage)
        if found is None:
            if plan.regions or plan.discrete:
                return None
        elif not found.enabled:
            return None
        return _StageRange(prof, stage) if plan.discrete else prof.region(stage)

    def run_stage(self, stage: str, fn: Stage, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any]) -> Any:
        """Run ``fn`` once as stage ``stage``. An exception leaving it ends the window
        with the capture saved ``partial``, then propagates unchanged."""
        if switch.is_off():
            return fn(*args, **kwargs)
        block = None
        with self._guarded(f"stage {stage!r}"):
            found = self._region(stage)
            if found is not None:
                found.__enter__()
                block = found
        _RUNNING.stack.append(self)
        try:
            result = fn(*args, **kwargs)
        except BaseException as err:
            _RUNNING.stack.pop()
            with self._guarded(f"stage {stage!r}", may_raise=False):
                if block is not None:
                    block.__exit__(type(err), err, err.__traceback__)
                if self not in _RUNNING.stack:  # the outermost stage ends the window
                    self._stop(err)
            raise
        _RUNNING.stack.pop()
        if block is not None and not switch.is_off():
            with self._guarded(f"stage {stage!r}"):
                block.__exit__(None, None, None)
        return result

    def close(self, error: BaseException | None = None) -> None:
        """End an open window (``partial`` with ``error``) and every profiler (process
        end, tests, the plugin turning off)."""
        self._stop(error)
        for prof in self.profilers.values():
            prof.close()


def close_all(error: BaseException) -> None:
    """The plugin turned off: end every window of this process as ``partial``, each
    driver whatever another one raises (nothing may reach training from here)."""
    with _OUTER_LOCK:
        live = [d for d in (ref() for ref in _OUTER) if d is not None]
    for driver in live:
        try:
            driver.close(error)
        except Exception as err:
            log.warning("policy-engine: %s: its windows could not be closed (%s: %s)",
                        driver.who, type(err).__name__, err)


class Forward:
    """An inner ``TrainingWorker`` profiler: its mini-batch steps and stages belong to the
    outer worker of its process; ``start``/``stop`` come to the outer worker instead."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.window = None

    def start(self, **kwargs: Any) -> None:
        """Not called by verl's trainer on an inner worker; nothing to do."""

    def stop(self, error: BaseException | None = None) -> None:
        """See :meth:`start`."""

    def step(self) -> None:
        driver = outer_driver()
        if driver is not None:
            driver.step()

    def run_stage(self, stage: str, fn: Stage, args: tuple[Any, ...],
                  kwargs: Mapping[str, Any]) -> Any:
        driver = outer_driver()
        if driver is None:
            return fn(*args, **kwargs)
        return driver.run_stage(stage, fn, args, kwargs)

    def close(self) -> None:
        """Nothing of its own to close."""
