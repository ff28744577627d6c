"""The Plan: everything one role on one rank will do, decided before training starts."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import attrs

from ._frozen import FrozenDict, thaw
from .naming import LATE_FIELDS, NameTemplate
from .schedule import Schedule
from .selectors import StepSet


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
    bound; ``step``, ``region``, ``cycle``, ``pid``, ``host`` and ``timestamp`` are filled
    in at run time.
    """

    role: str
    rank: int
    world: int
    enabled: bool
    backend: str = "torch"
    local_rank: int = 0
    node: int = 0
    coords: FrozenDict = attrs.field(factory=FrozenDict)
    settings: FrozenDict = attrs.field(factory=FrozenDict)
    steps: StepSet = attrs.field(factory=lambda: StepSet.parse("all"))
    merge_steps: bool = False
    schedule: Schedule | None = None
    regions: tuple[RegionPlan, ...] = ()
    discrete: bool = False
    template: NameTemplate = attrs.field(factory=lambda: NameTemplate.parse("<role>_rank<rank>"))
    output_dir: str = "profiles"
    on_error: str = "warn"
    policy_source: str | None = None
    policy_hash: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "rank": self.rank,
            "world": self.world,
            "enabled": self.enabled,
            "backend": self.backend,
            "local_rank": self.local_rank,
            "node": self.node,
            "coords": thaw(self.coords),
            "settings": thaw(self.settings),
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
        }

    @functools.cached_property
    def plan_hash(self) -> str:
        """A short digest of :meth:`to_json`: equal plans, equal hashes."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def name(self, *, step: str | int | None = None, region: str | None = None,
             cycle: int | None = None, **late: object) -> str:
        """The rendered trace name (without the backend's extension)."""
        values: dict[str, object] = {"step": step, "region": region, "cycle": cycle}
        values.update(late)
        return self.template.render(values)

    def example_name(self, *, step: str | int | None = None, region: str | None = None,
                     cycle: int | None = None) -> str:
        """The name with ``<pid>``, ``<host>`` and ``<timestamp>`` left as placeholders."""
        return self.template.render({"step": step, "region": region, "cycle": cycle},
                                    placeholders=LATE_FIELDS)

    def capture_last(self, first: int) -> int | None:
        """The last outer step of the capture that opens at ``first`` (None: no end)."""
        if not self.merge_steps:
            return first
        if self.steps.is_all:
            return None
        last = first
        while last + 1 in self.steps:
            nxt = self.steps.next_after(last)
            if nxt is None or nxt > last + 1:
                break
            last = nxt
            if last - first > 10_000_000:
                return None
        return last

    def capture_label(self, first: int) -> str:
        """How ``<step>`` renders for the capture opening at ``first``: ``2``, ``2-4``, ``2+``."""
        last = self.capture_last(first)
        if last is None:
            return f"{first}+"  # merged without end: the capture runs until close()
        return str(first) if last == first else f"{first}-{last}"

    def region(self, name: str) -> RegionPlan | None:
        for region in self.regions:
            if region.name == name:
                return region
        return None
