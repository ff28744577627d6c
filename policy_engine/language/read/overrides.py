"""Overrides: ``dotted.key=VALUE`` settings from ``--set`` or ``PROFILE_POLICY_SET``.

Each is parsed on its own (:func:`parse_override`, :func:`overrides_from_env`) and set on
a loaded :class:`~policy_engine.loader.Document` by :func:`apply_overrides`, its positions
pointing at the override. :mod:`policy_engine.loader` re-exports these names.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from policy_engine.errors import Location, PolicyError, Problem, describe, json_path, printable
from policy_engine.language.read import yaml_reader as _yaml
from policy_engine.language.read.document import MAX_DEPTH, Document, PathKey, shorten, too_deep

__all__ = ["ENV_OVERRIDES", "Override", "apply_overrides", "overrides_from_env", "parse_override"]

ENV_OVERRIDES = "PROFILE_POLICY_SET"


@attrs.frozen
class Override:
    """One ``dotted.key=VALUE`` setting from the CLI or the environment."""

    path: tuple[str, ...]
    value: Any
    location: Location


_OVERRIDE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*")


def parse_override(text: str, origin: str | None = None) -> Override:
    """Parse ``dotted.key=VALUE``; VALUE is YAML read with the policy's safety rules.

    ``origin`` is the label errors show for this override; by default ``--set TEXT``.
    Whatever ``text`` holds, the only error raised is :class:`PolicyError`.
    """
    location = Location(_label(f"--set {text}" if origin is None else origin))
    key, equals, raw = text.partition("=")
    key = key.strip()
    if not equals or not key or not raw.strip():
        raise PolicyError.single(f"override needs KEY=VALUE, got {text!r}", location)
    if not _OVERRIDE_KEY.fullmatch(key):
        raise PolicyError.single(
            f"override key {shorten(key)!r} is not a dotted name such as roles.actor.ranks",
            location,
        )
    path = tuple(key.split("."))
    if path[0] == "extends":
        raise PolicyError.single("extends cannot be set by an override", location, "$.extends")
    if len(path) > MAX_DEPTH:
        raise too_deep(location, path[:MAX_DEPTH])
    try:
        parsed = _yaml.parse_yaml_value(raw, location.origin)
    except PolicyError as exc:  # positions inside VALUE mean little: point at the override
        raise PolicyError(
            [attrs.evolve(p, location=location, json_path=json_path(path)) for p in exc.problems]
        ) from None
    except RecursionError:  # the reader bounds nesting first; this is a last resort
        raise too_deep(location, path) from None
    except (ValueError, OverflowError) as exc:
        message = f"cannot read the value: {shorten(str(exc))}"
        raise PolicyError.single(message, location, json_path(path)) from None
    if () not in parsed.values:  # VALUE held only a comment
        raise PolicyError.single(f"override needs KEY=VALUE, got {text!r}", location)
    if len(path) - 1 + _height(parsed.value) >= MAX_DEPTH:  # the deepest mapping or list
        raise too_deep(location, path)
    return Override(path, parsed.value, location)


def _label(origin: str) -> str:
    """``origin`` fit to start an error line: cut when long, and with what cannot be
    printed as it is (control characters, lone surrogates from undecodable bytes of
    argv or the environment) written as escapes."""
    return printable(origin, limit=200)


def _height(value: Any) -> int:
    """How many levels of mappings and lists ``value`` has (0 for a scalar)."""
    if isinstance(value, dict):
        return 1 + max(map(_height, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_height, value), default=0)
    return 0


def overrides_from_env(environ: Mapping[str, str] | None = None) -> list[Override]:
    """Overrides from ``PROFILE_POLICY_SET`` (``;``-separated; empty items are skipped)."""
    raw = (os.environ if environ is None else environ).get(ENV_OVERRIDES, "")
    overrides: list[Override] = []
    problems: list[Problem] = []
    for index, item in enumerate(raw.split(";"), 1):
        item = item.strip()
        if item:
            try:
                overrides.append(parse_override(item, f"{ENV_OVERRIDES}[{index}]: {item}"))
            except PolicyError as exc:
                problems.extend(exc.problems)
    if problems:
        raise PolicyError(problems)
    return overrides


def apply_overrides(doc: Document, overrides: Iterable[Override]) -> Document:
    """Return ``doc`` with each override set, its positions pointing at the override.

    Missing (or null) intermediate mappings are created; a non-mapping in the way is
    an error. Every error is collected before raising.
    """
    overrides = list(overrides)
    if not overrides:
        return doc
    data = copy.deepcopy(doc.data)
    values, keys = dict(doc.values), dict(doc.keys)
    problems: list[Problem] = []
    for override in overrides:
        path, where = override.path, override.location
        target = data
        for depth, part in enumerate(path[:-1], 1):
            if target.get(part) is None:  # missing, or `ref:` left empty in the file
                keys.setdefault(path[:depth], where)
                values[path[:depth]] = where
                target[part] = {}
            target = target[part]
            if not isinstance(target, dict):
                blocker = f"{'.'.join(path[:depth])} is {describe(target)}, not a mapping"
                message = f"cannot set {'.'.join(path)}: {blocker}"
                problems.append(Problem(message, json_path(path[:depth]), where))
                break
        else:
            replaced = target.get(path[-1])
            target[path[-1]] = copy.deepcopy(override.value)
            for positions in (values, keys):
                for stale in _subpaths(replaced, path):  # what the old value held
                    positions.pop(stale, None)
            for sub in _subpaths(override.value, path):
                values[sub] = where
                if isinstance(sub[-1], str):  # list items have no key
                    keys[sub] = where
    if problems:
        raise PolicyError(problems)
    return attrs.evolve(doc, data=data, values=values, keys=keys)


def _subpaths(value: Any, path: PathKey) -> Iterator[PathKey]:
    """``path`` and the path of every value nested in ``value``."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _subpaths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _subpaths(item, (*path, index))
