"""The Plan: everything one role on one rank will do, decided before training starts.

A plan is the role's settings (its :class:`~policy_engine.language.model.RoleSpec`) placed
on one process: whether this rank profiles, its coordinates, the name template with
everything known at compile time bound, and the roles it shares captures with. Every
trace name, at run time and in ``explain``, comes from :meth:`Plan.capture_name`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from policy_engine.language.values.frozen import FrozenDict, thaw
from policy_engine.language.values.naming import LATE_FIELDS, NameTemplate
from policy_engine.language.values.schedule import Schedule
from policy_engine.language.values.steps import StepSet, step_per_cycle

if TYPE_CHECKING:  # a type only: a plan never builds a spec
    from policy_engine.language.model import RoleSpec


@attrs.frozen
class RegionPlan:
    """A region to wrap; ``schedule`` is the one its discrete captures follow."""

    name: str
    enabled: bool = True
    schedule: Schedule | None = None


@attrs.frozen
class Plan:
    """The fully resolved decision for one role on one rank. Frozen, hashable, JSON-able.

    ``template`` is the name template with every field known at compile time already
    bound, ``role`` included (a colocated capture is named after its whole window:
    ``language.colocation.window_roles``, the same on every rank and step); ``step``,
    ``region``, ``cycle``, ``pid``, ``host`` and ``timestamp`` are filled in at run time.
    """

    spec: RoleSpec
    rank: int
    world: int
    enabled: bool
    template: NameTemplate
    local_rank: int = 0
    node: int = 0
    coords: FrozenDict = attrs.field(factory=FrozenDict)
    regions: tuple[RegionPlan, ...] = ()
    output_dir: str = ""  # from the policy; a plan that is off writes nothing
    policy_source: str | None = None
    policy_hash: str = ""
    policy_content_hash: str = ""  # the policy's digest less output_dir
    #: Declared colocation: the roles that share this rank's captures on this backend
    #: (``colocate:``), in policy order, each with its steps; this plan's role included.
    #: Empty when the policy declares no group for the role.
    colocated: tuple[tuple[str, StepSet], ...] = ()

    @classmethod
    def off(cls, spec: RoleSpec, rank: int, world: int, *, local_rank: int = 0,
            node: int = 0, policy_source: str | None = None, policy_hash: str = "",
            policy_content_hash: str = "") -> Plan:
        """The plan of a role that profiles nothing on this process."""
        return cls(spec, rank, world, False, spec.template, local_rank=local_rank, node=node,
                   policy_source=policy_source, policy_hash=policy_hash,
                   policy_content_hash=policy_content_hash)

    # The role's settings, as the runtime reads them.
    @property
    def role(self) -> str:
        return self.spec.name

    @property
    def backend(self) -> str:
        return self.spec.backend

    @property
    def backends(self) -> tuple[str, ...]:
        return self.spec.backends or (self.spec.backend,)

    @property
    def steps(self) -> StepSet:
        return self.spec.steps

    @property
    def merge_steps(self) -> bool:
        return self.spec.merge_steps

    @property
    def schedule(self) -> Schedule | None:
        return self.spec.schedule

    @property
    def discrete(self) -> bool:
        return self.spec.discrete

    @property
    def settings(self) -> FrozenDict:
        return self.spec.settings

    @property
    def on_error(self) -> str:
        return self.spec.on_error

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "rank": self.rank,
            "world": self.world,
            "enabled": self.enabled,
            "backend": self.backend,
            "backends": list(self.backends),
            "local_rank": self.local_rank,
            "node": self.node,
            "coords": thaw(self.coords),
            "settings": thaw(self.settings),
            "blocks": thaw(self.spec.blocks),
            "steps": self.steps.to_json(),
            "merge_steps": self.merge_steps,
            "schedule": self.schedule.to_json() if self.schedule else None,
            "regions": [{"name": r.name, "enabled": r.enabled,
                         "schedule": r.schedule.to_json() if r.schedule else None}
                        for r in self.regions],
            "discrete": self.discrete,
            "name": self.template.text,
            "output_dir": self.output_dir,
            "on_error": self.on_error,
            "policy_source": self.policy_source,
            "policy_hash": self.policy_hash,
            "colocated": [[role, steps.to_json()] for role, steps in self.colocated],
            "triggers": self.spec.triggers.to_json(),
            "limits": self.spec.limits.to_json(),
            "export": {"mode": self.spec.export, "in_flight": self.spec.export_in_flight},
            "keep": self.spec.keep,
        }

    def identity(self, policy_file_hash: str | None) -> dict[str, Any]:
        """The fields every manifest line of this rank's role carries, in this process
        (``policy_file_hash``: the digest of the policy files, read once by the caller)."""
        return {"role": self.role, "rank": self.rank, "world": self.world,
                "coords": dict(self.coords), "local_rank": self.local_rank,
                "node": self.node, "backend": self.spec.backend_label,
                "plan_hash": self.plan_hash, "policy_file": self.policy_source,
                "policy_hash": self.policy_hash, "policy_file_hash": policy_file_hash,
                "policy_content_hash": self.policy_content_hash,
                "pid": os.getpid()}

    def env_fields(self) -> dict[str, str]:
        """The ``env:NAME`` fields the template uses, from this process's environment now
        (read once when a role starts: a name does not change as the environment does)."""
        return {f: os.environ.get(f[4:], "") for f in self.template.fields()
                if f.startswith("env:")}

    def late_fields(self, timestamp: str, env: Mapping[str, str]) -> dict[str, object]:
        """What only the running process knows when it names a file: its pid, the
        ``timestamp`` of the cycle and the ``env`` fields (:meth:`env_fields`)."""
        return {"pid": os.getpid(), "timestamp": timestamp, **env}

    @functools.cached_property
    def plan_hash(self) -> str:
        """A short digest of :meth:`to_json`: equal plans, equal hashes."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def capture_last(self, first: int) -> int | None:
        """The last outer step of the capture that opens at ``first`` (None: no end)."""
        if not self.merge_steps or first + 1 not in self.steps:
            return first
        # From the runs, not step by step. None also when the end lies past what
        # StepSet.run_end can find with its allowance of work (see there).
        return self.steps.run_end(first + 1)

    @property
    def step_per_cycle(self) -> bool:
        """Whether ``<step>`` renders, for each trace of a capture, the outer step its
        schedule cycle started recording in (merged captures with a repeating schedule or
        endless steps: :func:`~policy_engine.language.values.steps.step_per_cycle`)."""
        return step_per_cycle(self.steps, merge_steps=self.merge_steps,
                              schedule=self.schedule, discrete=self.discrete)

    def capture_label(self, first: int, last: int | None = None) -> str:
        """How ``<step>`` renders for the capture opening at ``first``: ``2``, ``2-4``, ``2+``
        (``last``: the last step of a capture a trigger opened, which the plan cannot know)."""
        last = self.capture_last(first) if last is None else last
        if last is None:
            return f"{first}+"  # merged without end: the capture runs until close()
        return str(first) if last == first else f"{first}-{last}"

    def region(self, name: str) -> RegionPlan | None:
        for region in self.regions:
            if region.name == name:
                return region
        return None

    def roles_for(self, first: int | None) -> tuple[str, ...]:
        """The roles that take part in a capture opening at outer step ``first`` on this
        rank (None: a capture of the whole session), as the manifest's ``roles`` records
        them: every declared colocated role that selects this rank and profiles that step,
        whichever of them opens it; this plan's role alone when none is declared. The
        name does not follow them: it names the whole window (see :class:`Plan`)."""
        if not self.colocated:
            return (self.role,)
        found = tuple(role for role, steps in self.colocated
                      if first is None or first in steps)
        return found or (self.role,)  # a step that a trigger, not the plan, captures

    def capture_name(self, *, first: int | None, region: str | None, cycle: int | None,
                     late: Mapping[str, object] | None = None, at: int | None = None,
                     last: int | None = None) -> str:
        """The name (without the backend's extension) of the cycle ``cycle`` of the capture
        that opens at outer step ``first`` (None: whole session) for ``region`` (discrete).

        ``at``: the outer step the cycle started recording in, which ``<step>`` renders
        instead of the capture's span when :attr:`step_per_cycle` (the runtime knows it
        when that cycle's first recorded inner step ends; explain computes it).

        ``last``: the last step of a capture a trigger opened (beyond the plan's steps).

        ``late`` holds what only the running process knows (``pid``, ``timestamp``,
        ``host``, ``env:NAME``); without it those render as placeholders (explain). The
        runtime names every file through this method, so explain's names are the run's.
        """
        values: dict[str, object] = {
            "role": self.role,  # a compiled plan has bound it (the window's roles)
            "step": None if first is None else self.capture_label(first, last) if at is None
            else at,
            "region": region, "cycle": cycle,
        }
        template = self.template
        if late:
            values.update(late)
            return template.render(values)
        unknown = LATE_FIELDS | {f for f in template.fields() if f.startswith("env:")}
        return template.render(values, placeholders=frozenset(unknown))
