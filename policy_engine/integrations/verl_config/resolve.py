"""OmegaConf interpolations in a verl config read as plain data, without OmegaConf.

A composed verl config (Hydra's ``.hydra/config.yaml``, ``OmegaConf.to_yaml`` of a composed
trainer config) keeps its interpolations unresolved: every role's ``profiler.tool`` is
``${oc.select:global_profiler.tool,null}``. The converter resolves the ones it reads, with
OmegaConf's rules: ``${a.b}`` (absolute), ``${.x}`` / ``${..x}`` (relative to the node's
parent), ``${oc.select:key,default}`` (the default only when the key is missing; a null
value stays null), ``${oc.env:NAME,default}``, nested in defaults and inside strings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from policy_engine.language.read import yaml_reader

Path = tuple[str, ...]
_MISSING = object()
_MAX_HOPS = 64  # interpolations that lead to interpolations, before a cycle is assumed


class InterpolationError(ValueError):
    """An interpolation the converter cannot resolve; ``path`` is the key that holds it."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


def lookup(root: Mapping[str, Any], path: Path) -> Any:
    """The raw value at ``path`` (no interpolation resolved), or ``_MISSING``."""
    node: Any = root
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


class Resolver:
    """Reads values of one config, resolving interpolations on the way."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def get(self, dotted: str, default: Any = None) -> Any:
        """The resolved value at ``dotted`` (containers resolved all the way down), or
        ``default`` when it is not in the config."""
        path = tuple(dotted.split(".")) if dotted else ()
        value = self._at(path, 0)
        return default if value is _MISSING else value

    def has(self, dotted: str) -> bool:
        return lookup(self.root, tuple(dotted.split("."))) is not _MISSING

    def _at(self, path: Path, hops: int) -> Any:
        node: Any = self.root
        for depth, key in enumerate(path):
            if isinstance(node, str) and "${" in node:
                node = self._string(node, path[:depth], hops)
            if not isinstance(node, Mapping) or key not in node:
                return _MISSING
            node = node[key]
        return self._value(node, path, hops)

    def _value(self, value: Any, path: Path, hops: int) -> Any:
        if isinstance(value, str) and "${" in value:
            return self._value(self._string(value, path, hops), path, hops + 1)
        if isinstance(value, Mapping):
            return {k: self._value(v, (*path, str(k)), hops) for k, v in value.items()}
        if isinstance(value, list):
            return [self._value(v, (*path, str(i)), hops) for i, v in enumerate(value)]
        return value

    def _string(self, text: str, path: Path, hops: int) -> Any:
        if hops > _MAX_HOPS:
            raise InterpolationError(path, f"interpolation loop at {'.'.join(path)}: {text}")
        pieces = _split(text, path)
        if len(pieces) == 1 and not isinstance(pieces[0], str):
            return self._expression(pieces[0][0], path, hops)
        out = []
        for piece in pieces:
            value = piece if isinstance(piece, str) else self._expression(piece[0], path, hops)
            out.append("None" if value is None else str(value))
        return "".join(out)

    def _expression(self, body: str, path: Path, hops: int) -> Any:
        body = body.strip()
        name, colon, rest = body.partition(":")
        if colon and _is_resolver(name):
            args = _arguments(rest, path)
            if name == "oc.select":
                return self._select(args, path, hops)
            if name == "oc.env":
                value = os.environ.get(args[0].strip()) if args else None
                if value is None and len(args) > 1:
                    return self._literal(args[1], path, hops)
                return value
            raise InterpolationError(
                path,
                f"{'.'.join(path)}: cannot resolve ${{{body}}}: the "
                f"resolver {name!r} is not one the converter knows "
                "(oc.select, oc.env); give the value itself with --set",
            )
        value = self._key(body, path, hops)
        if value is _MISSING:
            raise InterpolationError(
                path, f"{'.'.join(path)}: ${{{body}}} names a key that is not in the config"
            )
        return value

    def _select(self, args: list[str], path: Path, hops: int) -> Any:
        if not args:
            raise InterpolationError(path, f"{'.'.join(path)}: oc.select needs a key")
        value = self._key(args[0].strip(), path, hops)
        if value is not _MISSING:
            return value
        return self._literal(args[1], path, hops) if len(args) > 1 else None

    def _key(self, key: str, path: Path, hops: int) -> Any:
        if key.startswith("."):
            level = len(key) - len(key.lstrip("."))
            base = path[: max(len(path) - level, 0)]
            target = (*base, *[k for k in key[level:].split(".") if k])
        else:
            target = tuple(key.split("."))
        return self._at(target, hops + 1)

    def _literal(self, text: str, path: Path, hops: int) -> Any:
        text = text.strip()
        if "${" in text:
            return self._string(text, path, hops + 1)
        if not text:
            return ""
        try:
            return yaml_reader.parse_yaml_value(text, "default").value
        except Exception:  # OmegaConf's grammar takes what YAML does not: keep the text
            return text


def _is_resolver(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def _split(text: str, path: Path) -> list[Any]:
    """``text`` cut into literal strings and ``(expression,)`` tuples, braces matched."""
    pieces: list[Any] = []
    i = 0
    while i < len(text):
        start = text.find("${", i)
        if start < 0:
            pieces.append(text[i:])
            break
        if start > i:
            pieces.append(text[i:start])
        depth, j = 0, start
        while j < len(text):
            if text.startswith("${", j):
                depth += 1
                j += 2
                continue
            if text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        if depth:
            raise InterpolationError(path, f"{'.'.join(path)}: unbalanced braces in {text!r}")
        pieces.append((text[start + 2 : j],))
        i = j + 1
    return pieces


def _arguments(text: str, path: Path) -> list[str]:
    """Comma-separated resolver arguments; commas inside ``${}``, brackets or quotes stay."""
    args: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(current))
            current = []
            continue
        current.append(ch)
    args.append("".join(current))
    return args
