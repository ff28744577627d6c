"""What a role does when its backend fails: the manifest lines of a capture that could not
open, the warning or the ``ProfilingError`` its ``on_error`` asks for, and turning the
role off for good (:class:`~policy_engine.runtime.profiler.RoleProfiler` mixes it in)."""

from __future__ import annotations

import logging
import time
from typing import Any

from policy_engine.errors import ProfilingError
from policy_engine.files.records import close_line, trace_line
from policy_engine.plan.plan import Plan
from policy_engine.runtime import manifest
from policy_engine.runtime.capture import Capture
from policy_engine.runtime.role_parts import Fixed, Loop

log = logging.getLogger("policy_engine")


class RoleFailures:
    """Failure handling of a RoleProfiler."""

    plan: Plan
    _loop: Loop
    _fixed: Fixed

    def _close(self, capture: Capture | None, status: str) -> None: ...
    def _turn_off(self, why: str) -> None: ...

    def _open_failed(self, cid: str, record: dict[str, Any], err: BaseException) -> None:
        now = time.time()
        message = f"{type(err).__name__}: {err}"
        try:  # the folder may be what failed
            manifest.append(self.plan.output_dir, trace_line(
                record, capture=cid, status="failed", path=None, bytes=None, cycle=0,
                inner_steps=[], start=now, end=now, joined=[], error=message))
            manifest.append(self.plan.output_dir, close_line(
                capture=cid, status="failed", end=now, steps=record["steps"], traces=1,
                joined=[], error=message))
        except OSError:
            pass
        self._failure(err, "open")

    def _capture_failed(self, err: BaseException, when: str) -> None:
        """The capture this role owns failed in a backend call (on any thread). The call
        that drove it raises, if its role says so (:meth:`_raise_failure`)."""
        self._loop.own = None
        self._turn_off("failed")
        if self.plan.on_error != "raise":
            log.warning("%s; profiling is off for this role from now on",
                        self._message(err, when))

    def _raise_failure(self, capture: Capture) -> None:
        """After a call of this role drove ``capture`` into a backend failure."""
        if capture.failure is None:
            return
        err, when = capture.failure
        if self.plan.on_error == "raise":
            raise ProfilingError(self._message(err, when)) from err
        if capture.owner != self.plan.role:
            log.warning("%s (in the capture of role %r)", self._message(err, when),
                        capture.owner)

    def _export_failed(self) -> None:
        """A background export of this role failed (recorded in the manifest by the export
        thread): turn off, and raise here, on the training thread, if the role says so."""
        err = self._fixed.late.pop(0)
        self._fixed.late.clear()
        self._close(self._loop.own, "partial")
        self._failure(err, "export")

    def _message(self, err: BaseException, when: str) -> str:
        plan = self.plan
        return (f"policy-engine: {plan.spec.backend_label} profiling of role {plan.role!r} "
                f"on rank {plan.rank} failed at {when}: {type(err).__name__}: {err}")

    def _failure(self, err: BaseException, when: str, raising: bool = True) -> None:
        self._turn_off("failed")
        message = self._message(err, when)
        if self.plan.on_error == "raise" and raising:
            raise ProfilingError(message) from err
        log.warning("%s; profiling is off for this role from now on", message)
