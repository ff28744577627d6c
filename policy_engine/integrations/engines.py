"""Profile a rollout engine (vLLM, SGLang) by the same policy as the trainer.

    from policy_engine.integrations.engines import apply_engine_policy

    prof = apply_engine_policy(llm, role="rollout")     # LLM, AsyncLLM, sglang Engine, URL
    for step in range(1, steps + 1):
        with prof.training_step(step):                  # starts/stops the engine's profiler
            outputs = llm.generate(prompts)
    # async code (verl's agent loop):  async with prof.atraining_step(step): ...

The role's backend (``vllm`` or ``sglang``) says which engine it is; its ``mesh`` says the
engine's parallelism (``{dp: 4, tp: 2}``: four replicas of two ranks), and its ``ranks``
choose replicas as they choose training ranks. Pass one engine per replica (a list, or
``replica=i``), or one engine that runs all replicas itself. At a profiled step the
driver starts each chosen replica's profiler with a prefix naming role, step, replica and
capture; at the step's end it stops it (bounded by ``timeout``), finds the files the
engine wrote, checks their coordinates against the mesh, moves them into the policy's
per-window layout and records each rank's capture in the manifest. A failure never stops
the loop unless the role says ``on_error: raise``.

``apply_policy`` is this module's former name for :func:`apply_engine_policy` (it shared
its name with :func:`policy_engine.apply_policy`, which takes a worker): it still works,
with a DeprecationWarning.

Why a driver of its own rather than a ``RoleProfiler`` with an engine session: a
RoleProfiler carries out one role on one rank, in the process that rank runs in; it
drives one ``Session`` per capture through the schedule's actions at each ``prof.step()``,
on the capture's own thread and under its backend slot's lock, which a SIGTERM waits for.
An engine role's ranks run in the engine's processes, and its schedule runs there too:

- one window here is a capture of every selected rank of a replica (of all replicas, for
  an engine that runs them all), each rank its own capture in the manifest with its own
  plan, where a Session records one capture of one rank;
- the engine is handed the schedule at its start (``EngineKind.start_kwargs``) and has
  only start and stop: no inner step reaches it from here, so the schedule table that
  drives a Session's prepare, start, step, save and discard has nothing to act on;
- its calls go to every replica at once, each bounded by a timeout counted in minutes
  (a stop at TP=2), and for an ``AsyncLLM`` they are awaited on the engine's own event
  loop (``atraining_step``): a Session's calls are synchronous, on one thread, under a
  lock a SIGTERM would wait behind for as long;
- its files come after the stop, in the engine's folder, named by engine coordinates, and
  are matched to ranks (:mod:`policy_engine.integrations._engine_window`), where a
  Session's save hands back its own capture's files.

The rest of what a RoleProfiler does (ranges for regions, triggers, allocator history,
colocated roles, background exports) acts in the process it profiles, which for an engine
role is the engine's; validate refuses the triggers and second backends an engine role
cannot have (``language/rules/engine_roles.py``). What the two do alike is written once
and shared:
a capture's manifest lifecycle (:class:`policy_engine.runtime.capture.lines.Lines`), the
outer steps a merged capture covers (:class:`policy_engine.runtime.capture.driver.Span`),
the names (``Plan.capture_name``) and what a role that is off hands back
(:data:`policy_engine.runtime.role.off.NULL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import os
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

from policy_engine import backends
from policy_engine import settings as registry
from policy_engine.backends.engine import files
from policy_engine.backends.engine.control import EngineCallError, EngineTimeout, Target
from policy_engine.backends.engine.kind import EngineKind
from policy_engine.errors import ProfilingError
from policy_engine.files.publish import make_tool_folder
from policy_engine.files.records import Status
from policy_engine.integrations._engine_calls import Calls, Offload, Work, adrive, drive
from policy_engine.integrations._engine_launch import check_launch
from policy_engine.integrations._engine_window import Window
from policy_engine.language.rules import engine_layout as layout
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.plan import Plan
from policy_engine.plan.topology import Topology
from policy_engine.runtime.apply import PolicyArg, resolve_policy
from policy_engine.runtime.capture.driver import Span
from policy_engine.runtime.process import manifest
from policy_engine.runtime.process.state import warn_once
from policy_engine.runtime.role.off import NULL

log = logging.getLogger("policy_engine")

#: Seconds a start or stop may take before the capture is recorded failed (vllm #22748:
#: a stop at TP=2 took over 20 minutes).
DEFAULT_TIMEOUT = 300.0
#: Seconds to wait, after a stop returned, for the engine's files to appear whole.
DEFAULT_FILES_TIMEOUT = 60.0


class EngineProfiler:
    """Drives one role's engine replicas at the policy's steps. Use one thread at a time
    (the training loop's), or the async methods from one event loop."""

    def __init__(self, kind: EngineKind, plans: Sequence[Plan], targets: Mapping[int, Target],
                 spanning: bool, mesh: Mapping[str, int] | None, *, timeout: float,
                 files_timeout: float, policy_sources: tuple[str, ...] = (),
                 elsewhere: Mapping[int, str] | None = None) -> None:
        self.kind = kind
        # replica -> the profiler folder its engine was launched with, not the policy's
        self.elsewhere = dict(elsewhere or {})
        self.plans = {p.rank: p for p in plans}
        self.plan = next((p for p in plans if p.enabled), plans[0])
        self.targets = dict(targets)
        self.spanning = spanning
        self.mesh = dict(mesh) if mesh else None
        self.timeout = timeout
        self.files_timeout = files_timeout
        spec = self.plan.spec
        self.settings = spec.settings
        self.folder = kind.folder(self.plan.output_dir, spec.name, self.settings)
        self.stages: list[str | None] = [r.name for r in spec.regions if r.enabled] \
            if spec.discrete else [None]
        self.env = self.plan.env_fields()
        file_hash = manifest.file_hash(policy_sources)
        self._ident = {r: p.identity(file_hash) for r, p in self.plans.items()}
        self._open: list[Window] = []
        self._pairs: list[tuple[Target, Window]] = []
        self._span: Span | None = None  # the outer steps of the windows open or last opened

    # -- which replicas a window covers ------------------------------------------------
    def _selected(self, replica: int | None) -> list[Plan]:
        ranks = range(layout.world_of(self.mesh)) if replica is None \
            else layout.ranks_of(replica, self.mesh)
        return [self.plans[r] for r in ranks if self.plans[r].enabled]

    def _windows(self, span: Span) -> list[tuple[Target, Window]]:
        out = []
        for replica, target in self.targets.items():
            plans = self._selected(None if self.spanning else replica)
            if not plans:
                continue
            token = manifest_token()
            prefix = files.capture_prefix(self.plan.role, span.steps[0], replica, token)
            window = Window(plans, self.stages, span, replica, prefix, token, self._ident)
            out.append((target, window))
        return out

    def _kwargs(self, window: Window) -> dict[str, Any]:
        return self.kind.start_kwargs(self.settings, self.plan.schedule, self.folder,
                                      window.prefix, window.token)

    # -- whether a step opens or ends a window ---------------------------------------------
    def _begins(self, n: int) -> tuple[bool, bool]:
        """At step ``n``: whether the open window ends first (a merged window the loop
        left), and whether ``n`` opens a window (not when a merged one goes on)."""
        span = self._span
        if not self._open or span is None:
            return False, n in self.plan.steps
        if span.goes_on_into(n):  # a merged capture's next step, as a role's capture goes on
            span.add_step(n)
            return False, False
        return True, n in self.plan.steps

    def _ends(self, n: int) -> bool:
        span = self._span
        return bool(self._open) and span is not None and (
            span.last_step is None or n >= span.last_step)

    # -- the steps: decided once (as Work), carried out blocking or awaited -----------
    def _enter(self, n: int) -> Work:
        """Before step ``n``: end the open window if the loop left it, open one if ``n``
        opens one."""
        end, begin = self._begins(n)
        if end:
            yield from self._stop_all(Status.COMPLETE)
        if begin:
            self._span = Span(self.plan.role, [n], self.plan.capture_last(n))
            self._pairs = self._windows(self._span)
            yield from self._start_all(self._pairs)

    def _leave(self, n: int) -> Work:
        """After step ``n``: end the window when ``n`` is its last step."""
        if self._ends(n):
            yield from self._stop_all(Status.COMPLETE)

    def _abandon(self) -> Work:
        """A step failed, or the loop is over: the window still open ends ``partial``."""
        if self._open:
            yield from self._stop_all(Status.PARTIAL)

    @contextlib.contextmanager
    def training_step(self, n: int) -> Iterator[None]:
        """Around rollout step ``n``: the engine records the step when the policy says so."""
        drive(self._enter(n))
        try:
            yield
        except BaseException:
            drive(self._abandon())
            raise
        drive(self._leave(n))

    @contextlib.asynccontextmanager
    async def atraining_step(self, n: int) -> AsyncIterator[None]:
        """:meth:`training_step` for async code: the engine's calls are awaited on this loop
        (an ``AsyncLLM`` needs its own loop), the file work runs on a thread."""
        await adrive(self._enter(n))
        try:
            yield
        except BaseException:
            await adrive(self._abandon())
            raise
        await adrive(self._leave(n))

    def close(self) -> None:
        """Stop a window still open (a loop that ended inside a merged capture)."""
        drive(self._abandon())

    async def aclose(self) -> None:
        """:meth:`close` for async code."""
        await adrive(self._abandon())

    # -- start and stop on every replica --------------------------------------------------
    def _start_one(self, target: Target, window: Window, error: str | None) -> None:
        if error is None:
            self._open.append(window)
            return
        window.fail(error)
        self._failed(f"start_profile: {error}")

    def _folder_refused(self, pairs: Sequence[tuple[Target, Window]],
                        err: OSError) -> None:
        """The engine's profiler folder cannot be made or is refused (a link out of
        output_dir): the windows fail in the manifest, the engine is not started, and
        one warning says why (ProfilingError under ``on_error: raise``)."""
        message = f"the engine's profiler folder cannot be used: {err}"
        for _, window in pairs:
            window.fail(message)
        self._failed(message)

    def _say_elsewhere(self, pairs: Sequence[tuple[Target, Window]]) -> None:
        """At the first start of an engine launched with another profiler folder: one
        warning naming both folders (its windows then fail at once, see :meth:`_stopped`)."""
        for target, window in pairs:
            other = self.elsewhere.get(window.replica)
            if other is not None:
                warn_once(("engine-folder", self.plan.role, other),
                          "policy-engine: role %r: the %s engine %s was launched with the "
                          "profiler folder %s, not the policy's %s: its traces stay there, "
                          "uncollected, and each window of it is recorded failed; restart "
                          "it with what `policy-engine engine-args` prints",
                          self.plan.role, self.kind.name, target.describe(), other,
                          self.folder)

    def _start_all(self, pairs: Sequence[tuple[Target, Window]]) -> Work:
        """Open the windows' manifest lines, make the engine's profiler folder, and start
        every replica's profiler at once; a window whose start failed fails."""
        for window in (w for _, w in pairs):
            window.open_lines()
        try:
            yield Offload(functools.partial(make_tool_folder, self.plan.output_dir,
                                            self.folder))
        except OSError as err:
            self._folder_refused(pairs, err)
            return
        self._say_elsewhere(pairs)
        errors = yield Calls("start_profile", [(t, self._kwargs(w)) for t, w in pairs],
                             self.timeout)
        for (target, window), error in zip(pairs, errors, strict=True):
            self._start_one(target, window, None if error is None else str(error))

    def _stopped(self, window: Window, error: EngineCallError | None, status: Status) -> None:
        """After a stop: collect the window's files. A stop that timed out fails the window
        (the files may come later; they stay where the engine put them). A stop the engine
        refused may still have files behind it (SGLang stops itself after num_steps and
        then refuses the stop): they are collected, and ranks without one fail with it."""
        if isinstance(error, EngineTimeout):
            window.fail(f"stop_profile: {error}")
            self._failed(f"stop_profile: {error}")
            return
        kind = self.kind
        stages = len(self.stages) if self.stages != [None] else 0
        wanted = kind.expected(self.settings, len(window.parts) // len(self.stages), stages)
        other = self.elsewhere.get(window.replica)
        # an engine that writes elsewhere: what is here is all there will be, no waiting
        found = files.wait_for(self.folder, kind.parser(window.prefix, window.token),
                               wanted if error is None else 0,
                               0.0 if other is not None else self.files_timeout)
        missing = f"stop_profile: {error}" if error is not None else (
            None if other is None else f"the engine was launched with the profiler folder "
                                       f"{other}, not the policy's {self.folder}")
        for problem in window.collect(found, self.mesh, self.spanning, self.env, status,
                                      missing):
            warn_once(("engine-file", problem), "policy-engine: %s", problem)
        # an engine writing elsewhere was said at its first start (raised here under raise)
        if window.failed_parts and (other is None or self.plan.on_error == "raise"):
            self._failed(missing or f"{window.failed_parts} of {len(window.parts)} traces "
                                    f"were not found in {self.folder} within "
                                    f"{self.files_timeout:g} s of the stop")

    def _stop_all(self, status: Status) -> Work:
        """Stop every replica with an open window at once, each window's files collected
        as soon as its own stop returns."""
        windows, self._open = self._open, []
        pairs = [(t, w) for t, w in self._pairs if w in windows]

        def then(i: int, error: EngineCallError | None) -> None:
            self._stopped(pairs[i][1], error, status)
        yield Calls("stop_profile", [(t, None) for t, _ in pairs], self.timeout, then)

    def _failed(self, message: str) -> None:
        text = f"policy-engine: role {self.plan.role!r} ({self.kind.name}): {message}"
        if self.plan.on_error == "raise":
            raise ProfilingError(text)
        warn_once(("engine-failed", self.plan.role, message), "%s", text)


class OffEngineProfiler:
    """The profiler of a role that profiles nothing: every method does nothing (a role
    that is off hands back the one context manager that does nothing,
    :data:`~policy_engine.runtime.role.off.NULL`, as a worker's does)."""

    plan: Plan | None = None

    def training_step(self, n: int) -> AbstractContextManager[None]:
        return NULL

    def atraining_step(self, n: int) -> AbstractAsyncContextManager[None]:
        return NULL

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def manifest_token() -> str:
    """A short token for one capture (SGLang's profile id; part of every prefix)."""
    return os.urandom(4).hex()


def _targets(engine: Any, replica: int | None, loop: Any, count: int) -> tuple[dict[int, Target],
                                                                               bool]:
    if isinstance(engine, (list, tuple)):
        if len(engine) != count:
            raise ValueError(f"{len(engine)} engines given but the role's mesh has {count} "
                             "replicas (dp): pass one engine per replica")
        return {i: Target(e, loop=loop) for i, e in enumerate(engine)}, False
    if replica is not None:
        if not 0 <= replica < count:
            raise ValueError(f"replica={replica} but the role's mesh has {count} replicas")
        return {replica: Target(engine, loop=loop)}, False
    return {0: Target(engine, loop=loop)}, count > 1


def apply_engine_policy(engine: Any, role: str = "rollout", policy: PolicyArg = None, *,
                 replica: int | None = None, loop: asyncio.AbstractEventLoop | None = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 files_timeout: float = DEFAULT_FILES_TIMEOUT,
                 ) -> EngineProfiler | OffEngineProfiler:
    """Profile ``engine`` (a vLLM ``LLM``/``AsyncLLM``, an SGLang ``Engine``, a server URL,
    or a list of them, one per replica) as ``role``, whose backend is vllm or sglang.

    ``replica``: the replica (dp coordinate) a single engine serves; without it a single
    engine serves them all. ``loop``: the event loop an ``AsyncLLM`` runs on, for blocking
    calls from another thread. ``timeout`` bounds each start and stop.
    """
    loaded = resolve_policy(policy)
    if loaded is None:
        return OffEngineProfiler()
    spec = loaded.role(role)
    if not spec.enabled:
        return OffEngineProfiler()
    if spec.backend not in registry.ENGINES:
        raise ValueError(f"role {role!r} uses backend {spec.backend}, not an engine "
                         f"({', '.join(sorted(registry.ENGINES))}): profile its worker with "
                         "policy_engine.apply_policy")
    mesh = loaded.mesh_for(role) or None
    world = layout.world_of(mesh)
    plans = [compile_plan(loaded, role, Topology.for_rank(r, world, mesh)) for r in range(world)]
    targets, spanning = _targets(engine, replica, loop, layout.replicas(mesh))
    kind: EngineKind = importlib.import_module(backends.SESSIONS[spec.backend]).KIND
    if not any(p.enabled for p in plans):
        return OffEngineProfiler()
    elsewhere: dict[int, str] = {}
    if spec.backend == "vllm":
        for replica, target in targets.items():
            other = check_launch(target.engine, spec, loaded.output_dir, role)
            if other is not None:
                elsewhere[replica] = other
    return EngineProfiler(kind, plans, targets, spanning, mesh, timeout=timeout,
                          files_timeout=files_timeout, policy_sources=loaded.sources,
                          elsewhere=elsewhere)


def apply_policy(engine: Any, role: str = "rollout", policy: PolicyArg = None, *,
                 replica: int | None = None, loop: asyncio.AbstractEventLoop | None = None,
                 timeout: float = DEFAULT_TIMEOUT,
                 files_timeout: float = DEFAULT_FILES_TIMEOUT,
                 ) -> EngineProfiler | OffEngineProfiler:
    """Deprecated: :func:`apply_engine_policy`, under the name the top-level call for
    workers also has."""
    warnings.warn("policy_engine.integrations.engines.apply_policy is now "
                  "apply_engine_policy (policy_engine.apply_policy is the call for workers)",
                  DeprecationWarning, stacklevel=2)
    return apply_engine_policy(engine, role, policy, replica=replica, loop=loop,
                               timeout=timeout, files_timeout=files_timeout)
