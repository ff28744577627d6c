"""RoleProfiler: what training code holds. One per (role, process).

A rank whose plan is off gets :class:`OffProfiler`, whose methods do nothing and whose
``annotate`` returns the function unchanged. A rank whose plan is on gets
:class:`RoleProfiler`, which opens captures for the plan's steps and regions.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from .. import backends
from ..backends.base import CaptureInfo
from ..errors import ProfilingError
from ..plan import Plan
from . import manifest, signals
from .capture import Capture, slot

log = logging.getLogger("policy_engine")
F = TypeVar("F", bound=Callable[..., Any])


class _Null:
    """A context manager that does nothing, shared by every disabled call."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NULL = _Null()


class OffProfiler:
    """The profiler of a rank that profiles nothing: every method is a no-op."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def training_step(self, n: int) -> _Null:
        return NULL

    def step(self) -> None:
        pass

    def region(self, name: str) -> _Null:
        return NULL

    def annotate(self, name: str | None = None) -> Callable[[F], F]:
        return _identity

    def close(self) -> None:
        pass

    def __enter__(self) -> OffProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _identity(fn: F) -> F:
    return fn


class RoleProfiler:
    """Carries out one role's plan in this process. Thread-safe; see DESIGN.md."""

    def __init__(self, plan: Plan, *, policy_sources: tuple[str, ...] = ()) -> None:
        self.plan = plan
        self._slot = slot(plan.backend)
        self._settings = backends.session_settings(plan.backend, plan)
        self._failed = False
        self._outer: int | None = None
        self._used_steps = False
        self._own: Capture | None = None
        self._session_capture = False
        self._policy_file_hash = manifest.file_hash(policy_sources)
        self._env: dict[str, Any] = {f: os.environ.get(f[4:], "") for f in plan.template.fields()
                     if f.startswith("env:")}

    # -- captures -------------------------------------------------------------------
    def _open(self, label: str | None, region: str | None,
              steps: tuple[int, ...]) -> Capture | None:
        """Open a capture, or join the one running on this backend (None when joined)."""
        plan = self.plan
        if self._failed:
            return None
        with self._slot.lock:
            running = self._slot.capture
            if running is not None:
                if plan.role not in running.joined and running.owner != plan.role:
                    running.joined.append(plan.role)
                return None
            info = CaptureInfo(plan.role, plan.rank, plan.world, plan.coords, region, steps,
                               plan.output_dir, self._settings, plan.plan_hash, plan.on_error)
            record = {
                "role": plan.role, "region": region, "rank": plan.rank, "world": plan.world,
                "coords": dict(plan.coords), "local_rank": plan.local_rank,
                "node": plan.node, "backend": plan.backend, "steps": list(steps),
                "plan_hash": plan.plan_hash, "policy_file": plan.policy_source,
                "policy_hash": plan.policy_hash, "policy_file_hash": self._policy_file_hash,
                "pid": os.getpid(),
            }
            try:
                session = self._slot_backend().open(info)
            except Exception as err:
                self._open_failed(record, err)
                return None
            schedule = plan.schedule
            if region is not None:
                found = plan.region(region)
                schedule = found.schedule if found is not None else schedule
            name = functools.partial(plan.name, step=label, region=region, pid=os.getpid(),
                                     **self._env)
            capture = Capture(slot=self._slot, owner=plan.role, session=session,
                              schedule=schedule, record=record, name=name,
                              output_dir=plan.output_dir, on_failure=self._capture_failed)
            self._slot.capture = capture
            signals.install()
            capture.begin()
            return capture if self._slot.capture is capture else None

    def _slot_backend(self) -> Any:
        if self._slot.backend is None:
            self._slot.backend = backends.create(self.plan.backend)
        return self._slot.backend

    def _close(self, capture: Capture | None, status: str) -> None:
        if capture is None:
            return
        if self._own is capture:
            self._own = None
        try:
            capture.end(status)
        except Exception as err:
            self._failure(err, "stop", raising=status == "complete")

    # -- failures -------------------------------------------------------------------
    def _open_failed(self, record: dict[str, Any], err: BaseException) -> None:
        now = time.time()
        with contextlib.suppress(OSError):  # the folder may be what failed
            manifest.append(self.plan.output_dir, dict(
                record, path=None, bytes=None, cycle=0, inner_steps=[], status="failed",
                start=now, end=now, joined=[], error=f"{type(err).__name__}: {err}"))
        self._failure(err, "open")

    def _capture_failed(self, err: BaseException, when: str) -> None:
        capture = self._slot.capture
        if capture is not None:
            capture.fail(err)
        if self._own is capture:
            self._own = None
        self._failure(err, when)

    def _failure(self, err: BaseException, when: str, raising: bool = True) -> None:
        self._failed = True
        plan = self.plan
        message = (f"policy-engine: {plan.backend} profiling of role {plan.role!r} on rank "
                   f"{plan.rank} failed at {when}: {type(err).__name__}: {err}")
        if plan.on_error == "raise" and raising:
            raise ProfilingError(message) from err
        log.warning("%s; profiling is off for this role from now on", message)

    # -- public API -----------------------------------------------------------------
    def training_step(self, n: int) -> AbstractContextManager[None]:
        """Context manager around outer training step ``n``."""
        return self._training_step(n)

    @contextmanager
    def _training_step(self, n: int) -> Iterator[None]:
        plan = self.plan
        if not self._used_steps:
            self._used_steps = True
            if self._session_capture:
                self._session_capture = False
                self._close(self._own, "complete")
        self._outer = n
        capture = None
        if not self._failed and not plan.discrete and n in plan.steps:
            capture = self._own
            if capture is None or capture.record["steps"][-1] != n - 1 or not plan.merge_steps:
                self._close(capture, "complete")
                capture = self._own = self._open(plan.capture_label(n), None, (n,))
            else:
                capture.record["steps"].append(n)
        elif self._own is not None:
            self._close(self._own, "complete")
        try:
            yield
        except BaseException:
            self._close(self._own, "partial")
            raise
        finally:
            self._outer = None
        if self._own is not None and not (plan.merge_steps and n + 1 in plan.steps):
            self._close(self._own, "complete")

    def step(self) -> None:
        """Advance the schedule of the capture running on this backend by one inner step."""
        capture = self._slot.capture
        if capture is not None:
            capture.step()
        elif not self._used_steps and not self._failed and not self.plan.discrete:
            # A plain loop that never calls training_step(): one capture for the session.
            self._session_capture = True
            self._own = self._open(None, None, ())

    def region(self, name: str) -> AbstractContextManager[None]:
        """Context manager for a named stage: a range, or a capture in discrete mode."""
        return self._region(name)

    @contextmanager
    def _region(self, name: str) -> Iterator[None]:
        if self.plan.discrete:
            capture = self._open_region(name)
            if capture is not None:
                try:
                    yield
                except BaseException:
                    self._close(capture, "partial")
                    raise
                self._close(capture, "complete")
                return
        # Continuous mode, or a discrete region that joined another role's capture:
        # a range inside whatever is recording.
        running = self._slot.capture
        if running is None or not running.recording:
            yield
            return
        rng = running.session.range(name)
        rng.__enter__()
        try:
            yield
        finally:
            rng.__exit__(None, None, None)

    def _open_region(self, name: str) -> Capture | None:
        plan = self.plan
        found = plan.region(name)
        if self._failed or (found is not None and not found.enabled):
            return None
        n = self._outer
        if (n is None and self._used_steps) or (n is not None and n not in plan.steps):
            return None
        capture = self._open(None if n is None else str(n), name, () if n is None else (n,))
        if capture is not None:
            self._own = capture
        return capture  # None: joined another role's capture, or failed

    def annotate(self, name: str | None = None) -> Callable[[F], F]:
        """Decorator: each call of the function is the region ``name`` (default: its name)."""
        def wrap(fn: F) -> F:
            return wrap_region(self, name or fn.__name__, fn)
        return wrap

    def close(self) -> None:
        """Stop whatever this role started. Idempotent."""
        self._close(self._own, "complete")

    def __enter__(self) -> RoleProfiler:
        """``with profile_session(...) as prof:`` starts the whole-session capture here,
        as ``with torch.profiler.profile(...)`` does (unless training_step() is used)."""
        if not self._used_steps and not self.plan.discrete and self._own is None:
            self._session_capture = True
            self._own = self._open(None, None, ())
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._close(self._own, "complete" if exc_type is None else "partial")


def wrap_region(prof: RoleProfiler, name: str, fn: F) -> F:
    """``fn`` as region ``name`` of ``prof``. Continuous mode costs two attribute reads
    when nothing records; the function runs exactly once whatever the backend does."""
    if prof.plan.discrete:
        @functools.wraps(fn)
        def discrete(*args: Any, **kwargs: Any) -> Any:
            with prof.region(name):
                return fn(*args, **kwargs)
        return discrete  # type: ignore[return-value]

    the_slot = prof._slot

    @functools.wraps(fn)
    def ranged(*args: Any, **kwargs: Any) -> Any:
        capture = the_slot.capture
        if capture is None or not capture.recording:
            return fn(*args, **kwargs)
        try:
            rng = capture.session.range(name)
            rng.__enter__()
        except Exception as err:
            log.warning("policy-engine: range %r could not open: %s", name, err)
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            rng.__exit__(None, None, None)
    return ranged  # type: ignore[return-value]
