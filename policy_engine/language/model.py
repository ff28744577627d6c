"""The validated policy as frozen objects.

A role's settings are the built-in defaults, then the policy's ``defaults``, then
``roles.<role>``, deep-merged (maps merge, lists replace). Building assumes the document
passed the schema and the checks in :mod:`policy_engine.checks`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import attrs

from policy_engine import backends
from policy_engine.errors import Problem
from policy_engine.language.frozen import FrozenDict, deep_merge, freeze, thaw
from policy_engine.language.naming import DEFAULT_TEMPLATE, NameTemplate
from policy_engine.language.ranks import RankSelector
from policy_engine.language.schedule import Schedule
from policy_engine.language.steps import StepSet

#: What a role gets for every setting the policy leaves out.
BUILTIN_DEFAULTS: Mapping[str, Any] = {
    "enabled": False,
    "backend": "torch",
    "ranks": [0],
    "steps": "all",
    "merge_steps": False,
    "schedule": None,
    "discrete": False,
    "regions": [],
    "name": DEFAULT_TEMPLATE,
    "on_error": "warn",
    "torch": {"activities": ["cpu", "cuda"], "record_shapes": False, "profile_memory": False,
              "with_stack": False, "with_flops": False, "with_modules": False, "gzip": True},
    "mstx": {"level": "level1", "activities": ["cpu", "npu"], "record_shapes": False,
             "profile_memory": False, "with_stack": False, "with_modules": False,
             "analysis": False, "export_type": "text", "ranges": True},
    "nsight": {"ranges": True, "capture": "auto", "capture_range_end": "auto",
               "options": {"trace": "cuda,nvtx"}},
}
DEFAULT_PREFIX = "trace"
DEFAULT_OUTPUT_DIR = "profiles"


@attrs.frozen
class RegionSpec:
    """A named stage of a worker. ``schedule`` applies when ``own_schedule`` is true."""

    name: str
    enabled: bool = True
    own_schedule: bool = False
    schedule: Schedule | None = None


@attrs.frozen
class RoleSpec:
    """One role's merged settings."""

    name: str
    enabled: bool
    backend: str
    ranks: RankSelector
    steps: StepSet
    merge_steps: bool
    schedule: Schedule | None
    discrete: bool
    regions: tuple[RegionSpec, ...]
    template: NameTemplate
    on_error: str
    settings: FrozenDict


@attrs.frozen
class Policy:
    """A loaded, validated policy: what ``load_policy`` returns."""

    version: int
    prefix: str
    output_dir: str
    mesh: FrozenDict
    roles: FrozenDict
    defaults: Mapping[str, Any] = attrs.field(converter=freeze)
    source: str | None = None
    sources: tuple[str, ...] = ()
    policy_hash: str = ""
    warnings: tuple[Problem, ...] = ()
    #: ``colocate:``: groups of roles that share a process, each in policy order.
    colocate: tuple[tuple[str, ...], ...] = ()

    def role(self, name: str) -> RoleSpec:
        """The merged settings of ``name``; a role the policy does not name gets defaults."""
        spec: RoleSpec | None = self.roles.get(name)
        return spec if spec is not None else build_role(name, thaw(self.defaults))

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(self.roles)

    def group(self, name: str) -> tuple[str, ...]:
        """The colocation group ``name`` belongs to (policy order), or ``()``."""
        return next((group for group in self.colocate if name in group), ())


def _schedule(raw: Mapping[str, Any] | None) -> Schedule | None:
    return None if raw is None else Schedule.from_mapping(raw)


def _regions(raw: Any) -> tuple[RegionSpec, ...]:
    if isinstance(raw, list):
        return tuple(RegionSpec(name) for name in raw)
    out = []
    for name, body in (raw or {}).items():
        body = body or {}
        out.append(RegionSpec(name, bool(body.get("enabled", True)), "schedule" in body,
                              _schedule(body.get("schedule"))))
    return tuple(out)


def build_role(name: str, merged_defaults: Mapping[str, Any],
               role: Mapping[str, Any] | None = None) -> RoleSpec:
    raw = deep_merge(deep_merge(BUILTIN_DEFAULTS, merged_defaults), role or {})
    backend = backends.canonical(raw["backend"])
    return RoleSpec(
        name=name,
        enabled=bool(raw["enabled"]),
        backend=backend,
        ranks=RankSelector.parse(raw["ranks"]),
        steps=StepSet.parse(raw["steps"]),
        merge_steps=bool(raw["merge_steps"]),
        schedule=_schedule(raw["schedule"]),
        discrete=bool(raw["discrete"]),
        regions=_regions(raw["regions"]),
        template=NameTemplate.parse(raw["name"]),
        on_error=raw["on_error"],
        settings=FrozenDict(raw[backend]),
    )


def _policy_order(groups: Any, roles: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """Each group's roles in the order ``roles:`` lists them, unlisted ones after."""
    order = {name: i for i, name in enumerate(roles)}
    return tuple(tuple(sorted(group, key=lambda r: (order.get(r, len(order)), group.index(r))))
                 for group in groups or ())


def policy_hash(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_policy(data: Mapping[str, Any], *, source: str | None = None,
                 sources: tuple[str, ...] = (),
                 warnings: tuple[Problem, ...] = ()) -> Policy:
    """The frozen Policy for a checked document."""
    defaults = data.get("defaults") or {}
    roles = {name: build_role(name, defaults, body or {})
             for name, body in (data.get("roles") or {}).items()}
    base = os.path.dirname(os.path.abspath(source)) if source else os.getcwd()
    output_dir = os.path.join(base, os.path.expanduser(data.get("output_dir",
                                                                DEFAULT_OUTPUT_DIR)))
    return Policy(
        version=int(data["version"]),
        prefix=str(data.get("prefix", DEFAULT_PREFIX)),
        output_dir=os.path.normpath(output_dir),
        mesh=FrozenDict(data.get("mesh") or {}),
        roles=FrozenDict(roles),
        defaults=defaults,
        source=source,
        sources=sources,
        policy_hash=policy_hash(data),
        warnings=warnings,
        colocate=_policy_order(data.get("colocate"), data.get("roles") or {}),
    )
