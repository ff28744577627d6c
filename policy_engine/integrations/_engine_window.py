"""One capture window of an engine: the manifest lines of every engine rank it covers, and
the files the engine wrote, matched to those ranks and moved into the layout.

Each selected engine rank (and, with SGLang's ``profile_by_stage``, each stage) is one
capture in the manifest, with the same fields a training rank's capture has, written
through the same lifecycle (:class:`~policy_engine.runtime.capture.lines.Lines`: open,
trace, close), so ``traces``, ``merge`` and ``report`` read actor and rollout ranks of a
step alike. A manifest that cannot be written stops no window: the engine's files are
still moved into the layout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from policy_engine.backends.base import Artifact
from policy_engine.backends.engine.files import EngineFile, publish
from policy_engine.files.records import Status, covered_steps
from policy_engine.language.rules.engine_layout import rank_at
from policy_engine.plan.plan import Plan
from policy_engine.runtime.capture.driver import Span
from policy_engine.runtime.capture.lines import Lines, timestamp

log = logging.getLogger("policy_engine")

class Part:
    """One engine rank (one stage) of a window: a capture in the manifest."""

    def __init__(self, plan: Plan, stage: str | None, ident: dict[str, Any],
                 opened: float, span: Span) -> None:
        self.plan = plan
        self.stage = stage
        self.span = span
        # the engine's traces are its own processes' captures: no summary worker here
        self.lines = Lines(dict(ident, roles=[plan.role], region=stage, trigger="plan"),
                           plan.output_dir, summarise=False, opened=opened)
        self.lines.follow(self._cycle)

    def _cycle(self) -> dict[str, Any]:
        """What a trace line says of its cycle: the engine records one, the window's steps
        (its schedule runs inside the engine)."""
        return {"cycle": 0, "inner_steps": [], "start": self.lines.opened,
                **covered_steps(self.span.steps), "joined": []}

    def trace(self, status: Status, path: str | None = None, size: int | None = None,
              error: str | None = None, extra: Mapping[str, Any] | None = None) -> None:
        found = None if path is None else Artifact(path, size, dict(extra or {}))
        with contextlib.suppress(OSError):
            self.lines.trace(found, status, error=error)

    def close(self, status: Status, error: str | None = None) -> None:
        with contextlib.suppress(OSError):
            self.lines.close(status, error, steps=self.span.steps, joined=[])


class Window:
    """The parts of one replica in one capture window (one start/stop of its engine);
    ``span``: the outer steps it covers, shared by the replicas' windows of that step."""

    def __init__(self, plans: Sequence[Plan], stages: Sequence[str | None], span: Span,
                 replica: int, prefix: str, token: str,
                 ident: dict[int, dict[str, Any]]) -> None:
        self.span = span
        self.first = span.steps[0]
        self.token = token  # SGLang's profile id; part of the prefix
        self.replica = replica
        self.prefix = prefix
        self.started = time.time()
        self.stamp = timestamp()
        self.parts = [Part(plan, stage, ident[plan.rank], self.started, span)
                      for plan in plans for stage in stages]
        self.failed_parts = 0

    def open_lines(self) -> None:
        for part in self.parts:
            with contextlib.suppress(OSError):
                part.lines.open(steps=list(self.span.steps), engine_prefix=self.prefix)

    def stem(self, part: Part, env: Mapping[str, str]) -> str:
        plan = part.plan
        cycle = None if plan.schedule is None else 0
        late = plan.late_fields(self.stamp, env)  # as the runtime names
        return plan.capture_name(first=self.first, region=part.stage, cycle=cycle, late=late)

    def fail(self, error: str) -> None:
        """Every part failed (the engine refused, or timed out): a failed trace and close."""
        for part in self.parts:
            part.lines.fail(error, steps=self.span.steps)

    def collect(self, files: Sequence[EngineFile], mesh: Mapping[str, int] | None,
                spanning: bool, env: Mapping[str, str], status: Status,
                missing: str | None = None) -> list[str]:
        """Match the engine's files to the window's parts, move them into the layout and
        write the trace and close lines; what could not be matched, for the caller to say."""
        by_key = {(part.plan.rank, part.stage): part for part in self.parts}
        problems: list[str] = []
        done: set[tuple[int, str | None]] = set()
        for found in files:
            if found.kind == "frontend":
                self._frontend(found, env)
                continue
            coords = _policy_coords(found.coords, mesh, self.replica, spanning)
            rank = None if coords is None else rank_at(coords, mesh)
            part = by_key.get((rank, found.stage)) if rank is not None else None
            if part is None:
                problems.append(f"{os.path.basename(found.path)}: engine coordinates "
                                f"{_show(found.coords)} are no selected rank of replica "
                                f"dp={self.replica} in the policy's mesh; left in place")
                continue
            try:
                path, size = publish(found.path, part.plan.output_dir, self.stem(part, env),
                                     found.extension)
            except OSError as err:
                part.trace(Status.FAILED, error=f"moving {found.path}: {err}")
                continue
            extra = {"engine": dict(found.coords), "engine_file": os.path.basename(found.path),
                     "engine_prefix": self.prefix, "kind": found.kind}
            part.trace(status, path, size, extra=extra)
            if found.kind == "trace":
                done.add((part.plan.rank, part.stage))
        for key, part in by_key.items():
            if key not in done:
                self.failed_parts += 1
                part.trace(Status.FAILED, error=missing or (
                    f"the engine wrote no trace for coordinates {_show(part.plan.coords)} "
                    f"(prefix {self.prefix})"))
        for part in self.parts:
            part.close(status if (part.plan.rank, part.stage) in done else Status.FAILED)
        return problems

    def _frontend(self, found: EngineFile, env: Mapping[str, str]) -> None:
        """vLLM AsyncLLM's front-end trace: no rank's; beside the window, in frontend/."""
        part = self.parts[0]
        folder, base = os.path.split(self.stem(part, env))
        stem = os.path.join(folder, "frontend", f"dp{self.replica}-{base}")
        try:
            path, size = publish(found.path, part.plan.output_dir, stem, found.extension)
        except OSError as err:
            log.warning("policy-engine: could not move %s: %s", found.path, err)
            return
        with contextlib.suppress(OSError):
            part.lines.note("engine-frontend", bytes=size,
                            path=os.path.relpath(path, part.plan.output_dir))


def _show(coords: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in coords.items()) or "(none)"


def _policy_coords(engine: Mapping[str, int], mesh: Mapping[str, int] | None, replica: int,
                   spanning: bool) -> dict[str, int] | None:
    """The policy coordinates of an engine file: its dp is the replica's (an engine per
    replica names itself dp0), tp and pp as named, ep only where the mesh has ep (vLLM
    names an EP rank even for dense models)."""
    mesh = mesh or {}
    dp = engine.get("dp", 0)
    if spanning:
        replica = dp
    elif dp != 0:
        return None
    coords = {"tp": engine.get("tp", 0), "pp": engine.get("pp", 0)}
    if "dp" in mesh:
        coords["dp"] = replica
    elif replica:
        return None
    if "ep" in mesh:
        coords["ep"] = engine.get("ep", 0)
    return coords
