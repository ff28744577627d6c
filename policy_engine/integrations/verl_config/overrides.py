"""verl's command-line overrides (Hydra's syntax) applied to a config read as plain data.

``a.b.c=VALUE`` replaces a key that must exist, ``+a.b=VALUE`` adds one that must not,
``++a.b=VALUE`` sets it either way, ``~a.b`` removes it. VALUE is read as YAML with the
policy reader's safety rules (``[1,2]``, ``True``, ``null``, ``'quoted'``); what YAML does
not read is kept as the text Hydra would take it for (``$HOME/profile_data``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from policy_engine.errors import Location, PolicyError, json_path
from policy_engine.language.read import yaml_reader

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-@]*(?:\.[A-Za-z_0-9][A-Za-z0-9_\-@]*)*")


def parse_value(text: str) -> Any:
    """A Hydra override's value as data."""
    if not text.strip():
        return ""
    try:
        parsed = yaml_reader.parse_yaml_value(text, "--set")
    except (PolicyError, ValueError, RecursionError):
        return text
    return parsed.value if () in parsed.values else text


def apply(config: dict[str, Any], overrides: Iterable[str]) -> dict[tuple[str, ...], Location]:
    """Apply ``overrides`` to ``config`` in order (in place); the locations of the keys
    they set, for errors about those values. Raises PolicyError naming the override."""
    where: dict[tuple[str, ...], Location] = {}
    for text in overrides:
        location = Location(f"--set {text}")
        mode, key, value = _parse(text, location)
        path = tuple(key.split("."))
        parent = _parent(config, path, create=mode in ("+", "++"), text=text, location=location)
        last = path[-1]
        exists = last in parent
        if mode == "~":
            if not exists:
                raise PolicyError.single(
                    f"cannot remove {key}: it is not in the config", location, json_path(path)
                )
            del parent[last]
            continue
        if mode == "" and not exists:
            raise PolicyError.single(
                f"{key} is not in the config (to add it, write +{key}={value})",
                location,
                json_path(path),
            )
        if mode == "+" and exists:
            raise PolicyError.single(
                f"{key} is already in the config (to replace it, write {key}={value} or "
                f"++{key}={value})",
                location,
                json_path(path),
            )
        parent[last] = parse_value(value)
        where[path] = location
    return where


def _parse(text: str, location: Location) -> tuple[str, str, str]:
    mode = "++" if text.startswith("++") else text[:1] if text[:1] in "+~" else ""
    body = text[len(mode) :]
    key, equals, value = body.partition("=")
    key = key.strip()
    if mode != "~" and not equals:
        raise PolicyError.single(f"override needs KEY=VALUE, got {text!r}", location)
    if not _KEY.fullmatch(key):
        raise PolicyError.single(
            f"override key {key!r} is not a dotted name such as global_profiler.steps", location
        )
    return mode, key, value


def _parent(
    config: dict[str, Any], path: tuple[str, ...], *, create: bool, text: str, location: Location
) -> dict[str, Any]:
    node: Any = config
    for depth, key in enumerate(path[:-1]):
        if not isinstance(node, dict):
            break
        if key not in node:
            if not create:
                raise PolicyError.single(
                    f"{'.'.join(path[: depth + 1])} is not in the config (to add "
                    f"{'.'.join(path)}, write +{text})",
                    location,
                    json_path(path[: depth + 1]),
                )
            node[key] = {}
        node = node[key]
        if not isinstance(node, dict):
            raise PolicyError.single(
                f"cannot set {'.'.join(path)}: {'.'.join(path[: depth + 1])} is not a mapping",
                location,
                json_path(path[: depth + 1]),
            )
    return node  # type: ignore[no-any-return]
