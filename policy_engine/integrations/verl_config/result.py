"""What a conversion is made of: verl's profiler blocks as policy roles, and the result
(the policy, a comment per key, what has no equivalent)."""

from __future__ import annotations

from typing import Any

import attrs

PolicyPath = tuple[str, ...]


@attrs.frozen
class RoleBlock:
    """Where a policy role's settings are in verl's config, and the stages verl marks in it."""

    role: str
    block: str
    regions: tuple[str, ...] = ()
    engine: bool = False
    #: a part of verl's hybrid worker (actor_rollout_ref), colocated with the actor
    hybrid: bool = True


@attrs.define
class Conversion:
    """The policy, the comment of each of its keys (verl's key and why), and what could not
    be carried over (printed on stderr by the command, and in the file as comments)."""

    policy: dict[str, Any]
    comments: dict[PolicyPath, list[str]] = attrs.field(factory=dict)
    unmapped: list[str] = attrs.field(factory=list)

    def say(self, path: PolicyPath, text: str) -> None:
        self.comments.setdefault(path, []).append(text)
