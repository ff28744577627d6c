"""Which policy role profiles a verl worker, and which role each of its stages belongs to.

verl names each ``DistProfiler`` after the worker that builds it (``save_file_prefix``):
the hybrid ``ActorRolloutRefWorker`` passes its role string, the inner ``TrainingWorker``
its model type. :data:`WORKERS` maps those names to a policy role and the roles that
share the worker's process; docs/verl.md prints the same table.

The table gives way, in this order, to ``PROFILE_POLICY_VERL_ROLES`` (``"critic=value,
language_model=trainer"``: a verl name to a policy role) and to a role the policy names
after the verl worker itself (``roles: {actor_rollout_ref: ...}``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping

import attrs

#: The environment variable that maps verl worker names to policy roles.
ENV_ROLES = "PROFILE_POLICY_VERL_ROLES"

#: verl worker name -> (the policy role, the roles colocated in its process).
WORKERS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "actor_rollout_ref": ("actor", ("ref", "rollout")),
    "actor_rollout": ("actor", ("rollout",)),
    "actor": ("actor", ()),
    "rollout": ("rollout", ()),
    "ref": ("ref", ()),
    "critic": ("critic", ()),
    "value_model": ("critic", ()),
    "language_model": ("actor", ()),
}

#: Inner profilers (the actor's or ref's ``TrainingWorker``, named by its model type): inside
#: an outer worker of the same process their steps and stages belong to that worker's role.
#: ``value_model`` is not one: verl's critic is a ``TrainingWorker`` of its own.
INNER = frozenset({"language_model"})

#: The role of a profiler verl builds without a name (a rollout replica's).
UNNAMED = "rollout"

_PAIR = re.compile(r"^\s*([A-Za-z][\w.+-]*)\s*=\s*([A-Za-z][\w.+-]*)\s*$")


@attrs.frozen
class Assignment:
    """A verl worker's policy roles: ``role`` drives it, ``colocated`` share its windows."""

    worker: str
    role: str
    colocated: tuple[str, ...] = ()
    how: str = "the table"


def env_mapping(text: str | None = None) -> dict[str, str]:
    """``PROFILE_POLICY_VERL_ROLES`` read as ``{verl name: policy role}``.

    Raises ValueError naming the item that is not ``NAME=ROLE``."""
    text = os.environ.get(ENV_ROLES, "") if text is None else text
    found: dict[str, str] = {}
    for i, item in enumerate(text.split(","), 1):
        if not item.strip():
            continue
        match = _PAIR.match(item)
        if match is None:
            raise ValueError(f"{ENV_ROLES} item {i} {item.strip()!r} is not VERL_NAME=ROLE "
                             "(for example language_model=trainer)")
        found[match.group(1)] = match.group(2)
    return found


def assign(worker: str | None, policy_roles: Collection[str],
           mapping: Mapping[str, str] | None = None) -> Assignment:
    """The policy roles of verl worker ``worker`` (None: a profiler built without a name)
    under a policy that names ``policy_roles``."""
    name = worker or UNNAMED
    mapping = env_mapping() if mapping is None else mapping
    if name in mapping:
        return Assignment(name, mapping[name], how=ENV_ROLES)
    if name in policy_roles:
        return Assignment(name, name, how="the policy's role of that name")
    role, colocated = WORKERS.get(name, (name, ()))
    return Assignment(name, role, tuple(r for r in colocated if r in policy_roles),
                      how="the table" if name in WORKERS else "its own name")


def stage_role(stage: str, roles: Collection[str], main: str) -> str:
    """The role a stage label belongs to: the role its first word names
    (``ref_compute_log_prob`` -> ``ref``) when that role shares the worker, else ``main``."""
    head = stage.partition("_")[0]
    return head if head in roles else main
