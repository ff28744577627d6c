"""What the framework callbacks share: one role's profiler driven from a framework's hooks.

A framework calls hooks around a step rather than running the step inside a ``with``
block, so :class:`HookDriver` enters ``prof.training_step(n)`` in the hook that begins an
optimizer step and leaves it in the hook that ends it, or with the exception when the
step fails: the capture is then saved and marked ``partial``, as a ``with`` block would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import attrs

from policy_engine.plan.topology import Topology
from policy_engine.runtime.apply import PolicyArg, Profiler, profile_session
from policy_engine.runtime.role.wrapping import Patches, Wrap


class RunInterrupted(Exception):
    """Why a step left open by an earlier run is closed as ``partial``: that run ended
    without its framework saying so (an exception no hook saw, a retry)."""


def place(rank: int, world: int, *, local_rank: int | None = None, node: int | None = None,
          mesh: Any = None) -> Topology:
    """The topology of this process as the framework reports it: rank and world (and local
    rank and node where given) from the framework; coordinates from its DeviceMesh where
    it has one, else what :meth:`Topology.discover` finds."""
    base = Topology.from_device_mesh(mesh) if mesh is not None else Topology.discover()
    return attrs.evolve(
        base, rank=int(rank), world=int(world),
        local_rank=base.local_rank if local_rank is None else int(local_rank),
        node=base.node if node is None else int(node))


def guarded(fn: Callable[..., Any], on_error: Callable[[BaseException], None]) -> Any:
    """``fn`` calling ``on_error(exc)`` with any exception leaving it, which then
    propagates unchanged (the same object); ``fn`` runs exactly once."""
    @functools.wraps(fn)
    def guard(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as err:
            on_error(err)
            raise
    return guard


class HookDriver:
    """One role's profiler over one run of a framework's loop (a fit, a train() call).

    ``start`` makes the profiler, ``open_step(n)`` / ``close_step()`` bracket outer step
    ``n``, ``inner_step()`` is ``prof.step()``, ``finish(error)`` ends the run. Methods
    replaced on framework objects for the run (regions, guards) are put back at the end.
    """

    def __init__(self, role: str, policy: PolicyArg, topology: Topology | None) -> None:
        self.role = role
        self.policy = policy
        self.topology = topology
        self.prof: Profiler | None = None
        self.live = False  # the run's plan profiles this process: the hooks do something
        self.step: int | None = None  # the outer step open now
        self._block: AbstractContextManager[None] | None = None
        self._replaced = Patches()

    # -- the run --------------------------------------------------------------------
    def start(self, topology: Topology) -> Profiler:
        """A fresh profiler for this run (``topology`` unless the callback was given
        one). A run still open from before ends first, its open step ``partial``."""
        if self.prof is not None or self._replaced:
            self.finish(RunInterrupted("the previous run ended without its end hook"))
        self.prof = profile_session(self.policy, self.role, self.topology or topology)
        self.live = self.prof.plan.enabled
        return self.prof

    def finish(self, error: BaseException | None = None) -> None:
        """End the run: the open step (``partial`` when ``error``), the methods replaced
        for it, then the profiler. Idempotent."""
        prof, self.prof, self.live = self.prof, None, False
        try:
            self.close_step(error)
        finally:
            self._restore()
            if prof is not None:
                if error is None:
                    prof.close()
                else:  # what leaving ``with prof:`` with the exception does
                    prof.__exit__(type(error), error, error.__traceback__)

    # -- steps ----------------------------------------------------------------------
    def open_step(self, n: int) -> None:
        """Enter outer step ``n`` (nothing when it is the step open already, or when this
        process profiles nothing: then the hooks cost an attribute test)."""
        if not self.live:
            return
        if self._block is not None:
            if n == self.step:
                return
            self.close_step()
        if self.prof is None:
            return
        block = self.prof.training_step(n)
        block.__enter__()
        self._block, self.step = block, n

    def inner_step(self) -> None:
        """One inner step ended: ``prof.step()``."""
        if self.live and self.prof is not None:
            self.prof.step()

    def close_step(self, error: BaseException | None = None) -> None:
        """Leave the open outer step, with ``error`` when it failed."""
        block, self._block, self.step = self._block, None, None
        if block is None:
            return
        if error is None:
            block.__exit__(None, None, None)
        else:
            block.__exit__(type(error), error, error.__traceback__)

    # -- methods replaced for the run -----------------------------------------------
    def replace(self, obj: object, name: str, wrap: Wrap) -> None:
        """Set ``obj.name`` (an instance attribute: the class stays untouched) to
        ``wrap(obj.name)`` until the run ends."""
        self._replaced.replace(obj, name, wrap)

    def wrap_regions(self, obj: object, defaults: Iterable[str]) -> list[str]:
        """Make methods of ``obj`` regions for the run: ``defaults`` (the callback's own
        choice) and every enabled region of the plan that ``obj`` has. Returns the names."""
        prof = self.prof
        if prof is None or not prof.plan.enabled:
            return []
        names = list(dict.fromkeys(
            [*defaults, *(r.name for r in prof.plan.regions if r.enabled)]))
        return self._replaced.regions(obj, self.role, names, prof.annotate)

    def _restore(self) -> None:
        self._replaced.restore()
