"""What a role records outside its captures: allocator history kept from the first step
(``memory: {history: always}``), and the files it writes when no capture is open.

A backend that offers ``keep(info, keeper)`` (the memory backend) gets a :class:`RoleHistory`
when the role's profiler is made: the keeper names a file for the step under way with the
role's template (``<name>_oom.pickle`` of the step the error happened in) and records it
in the manifest as a capture of one ``trace`` line (no open or close line: nothing was
opened), ``trigger: oom``, through the lifecycle every capture's lines go through
(:class:`~policy_engine.runtime.capture.lines.Lines`). A backend that cannot keep history
here leaves a ``note`` line (``left_out``) and one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from policy_engine.backends.base import Artifact, BackendUnavailable, CaptureInfo
from policy_engine.errors import ProfilingError
from policy_engine.files.layout import host_name
from policy_engine.files.records import Status
from policy_engine.plan.plan import Plan
from policy_engine.runtime.capture.lines import Lines, timestamp

log = logging.getLogger("policy_engine")

#: The ``trigger`` of a manifest line written outside any capture.
OOM = "oom"


class RoleHistory:
    """One role's link to a backend that records for it outside captures."""

    def __init__(self, plan: Plan, identity: Mapping[str, Any],
                 current_step: Callable[[], int | None]) -> None:
        self.plan = plan
        self.identity = dict(identity)
        self.current_step = current_step
        self.closed = False
        self._env = plan.env_fields()

    def name(self) -> tuple[str, int | None] | None:
        if self.closed:
            return None
        step = self.current_step()
        late = self.plan.late_fields(timestamp(), self._env)
        stem = self.plan.capture_name(first=step, region=None, cycle=None, late=late, at=step)
        return stem, step

    def report(self, artifact: Artifact, status: Status, step: int | None) -> None:
        plan = self.plan
        lines = Lines(dict(self.identity, trigger=OOM, roles=list(plan.roles_for(step)),
                           region=None, steps=[] if step is None else [step],
                           host=host_name()), plan.output_dir)
        try:
            lines.trace(artifact, status)
        except OSError as err:
            log.warning("policy-engine: %s written, but not recorded in the manifest: %s",
                        artifact.path, err)


def keep_history(plan: Plan, identity: Mapping[str, Any], settings: Mapping[str, Any],
        backend_of: Callable[[str], Any], current_step: Callable[[], int | None],
        note: Callable[..., None]) -> Callable[[], None] | None:
    """Hand each of the plan's backends that records outside captures a keeper (the
    memory backend, when ``history: always``). Returns what releases them when the role
    closes, or None when no backend keeps anything for it."""
    kept: list[tuple[Any, RoleHistory]] = []
    for name in plan.backends:
        block = settings if name == plan.backend else plan.spec.blocks[name]
        if block.get("history") != "always":
            continue
        keeper = RoleHistory(plan, identity, current_step)
        info = CaptureInfo(plan.role, plan.rank, plan.world, plan.coords, None, (),
                           plan.output_dir, block, plan.plan_hash, plan.on_error)
        try:
            backend = backend_of(name)
            if backend.keep(info, keeper):
                kept.append((backend, keeper))
        except BackendUnavailable as err:
            _left_out(plan, name, str(err), note)
        except Exception as err:  # a tool failing: like any backend failure, on_error decides
            _left_out(plan, name, f"{type(err).__name__}: {err}", note)
    if not kept:
        return None

    def release() -> None:
        for backend, keeper in kept:
            keeper.closed = True
            try:
                backend.release(keeper)
            except Exception as err:  # the role is closing; report and go on
                log.warning("policy-engine: could not turn %s history off: %s: %s",
                            plan.role, type(err).__name__, err)
    return release


def _left_out(plan: Plan, name: str, why: str, note: Callable[..., None]) -> None:
    message = (f"policy-engine: {name} history: always is off for role {plan.role!r} on "
               f"rank {plan.rank}: {why}")
    note("left_out", backend=name, message=f"history: always: {why}")
    if plan.on_error == "raise":
        raise ProfilingError(message)
    log.warning("%s", message)
