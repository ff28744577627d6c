"""Rules on the roles a policy names, as a whole: whether any is enabled, and whether a
name looks like a misspelling of a role the integrations ask for.

Both are warnings: a policy that profiles nothing is valid (a switch turned off), and a
role may be named anything the training code passes. But ``roles: {actr: ...}`` is a
policy that validates and then profiles nothing under verl, whose workers ask for
``actor``: validate says so before the job starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.language.model import Built

Path = tuple[str, ...]

#: The policy roles verl's workers are profiled as (policy_engine.integrations.verl.roles,
#: whose table a test keeps equal to this; the language cannot import it).
VERL_ROLES = ("actor", "rollout", "ref", "critic")
#: Codes of the warnings below.
NOTHING_ENABLED = "no-role-enabled"
MISSPELT_ROLE = "misspelt-role"


def _one_edit(a: str, b: str) -> bool:
    """Whether ``a`` becomes ``b`` by one letter added, dropped or changed, or two
    neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def misspelt(name: str, named: Mapping[str, Any]) -> str | None:
    """The verl role ``name`` looks like a misspelling of, among those the policy does not
    name itself: a word of letters one typing slip away (``actr``, ``reff``, ``Actor``);
    None for anything else (``r``, ``critic2``, ``rollout_vllm``, ``reward``)."""
    if len(name) < 3 or not name.isalpha():
        return None
    lower = name.lower()
    return next((role for role in VERL_ROLES if role not in named and name != role
                 and (lower == role or _one_edit(lower, role))), None)


def check(data: Mapping[str, Any], built: Built, erred: bool) -> list[tuple[str, Path, str]]:
    """(message, path, code) of each warning. Whether any role is enabled is said of a
    policy without errors (``erred``: the checks found one) only: in one refused in part,
    ``enabled`` may be among what was refused, and the errors come first anyway."""
    roles = data.get("roles")
    named: Mapping[str, Any] = roles if isinstance(roles, Mapping) else {}
    found: list[tuple[str, Path, str]] = []
    for name in named:
        close = misspelt(str(name), named)
        if close is not None:
            found.append((f"role {name!r} looks like a misspelling of {close!r} (did you "
                          f"mean {close!r}?), a role verl's workers are profiled as: a "
                          f"process asking for role {close!r} does not get this one",
                          ("roles", str(name)), MISSPELT_ROLE))
    unnamed = built.unnamed
    whole = unnamed is not None and not erred and not built.refused.paths \
        and not any(p.severity == "error" for p in built.problems) \
        and not built.partial and set(built.roles) == set(named)
    if whole and unnamed is not None and not unnamed.enabled \
            and not any(spec.enabled for spec in built.roles.values()):
        defaults = data.get("defaults")
        where: Path = ("roles",) if named else ("defaults", "enabled") \
            if isinstance(defaults, Mapping) and "enabled" in defaults else ()
        found.append(("no role is enabled: the policy profiles nothing (set enabled: true "
                      "on a role under roles, or in defaults)", where, NOTHING_ENABLED))
    return found
