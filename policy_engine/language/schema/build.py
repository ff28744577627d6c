"""The JSON Schema: the one source of truth for the policy file's structure and defaults.

The schema is assembled from :mod:`~policy_engine.language.schema.base` (the top-level
keys and a role's keys) and the backend registry (each backend's settings block, and the
``backend`` enum). ``policy-engine schema`` prints it; ``schemas/`` holds a copy for
editors, which a test keeps equal. :func:`defaults` reads every default from it.

:func:`validate` checks a document with :mod:`~policy_engine.language.schema.validator` and
turns each error into a :class:`~policy_engine.errors.Problem` that points at the
offending key or value, with "did you mean" for unknown keys and names. A failed
``oneOf``/``anyOf`` speaks through the alternative the value's kind picks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from policy_engine import settings as registry
from policy_engine.errors import KINDS, Problem, describe, did_you_mean, json_path
from policy_engine.language.read.document import Document
from policy_engine.language.schema.base import base_schema
from policy_engine.language.schema.validator import Error, Path, Validator, equal
from policy_engine.language.values.frozen import FrozenDict
from policy_engine.language.values.triggers import AFTER_PATTERN, BYTES_PATTERN

SCHEMA_NAME = "profile_policy.schema.json"

# What a name pattern of the schema asks for, in words.
_PATTERNS = {
    "^[A-Za-z][A-Za-z0-9_.+-]*$": "use a letter, then letters, digits, _ . + or -",
    "^[A-Za-z_][A-Za-z0-9_]*$": "use letters, digits and _, not starting with a digit",
    BYTES_PATTERN: "expected a size such as 2GiB, 500MB or a number of bytes",
    AFTER_PATTERN: "expected seconds, or a multiple of the median step such as '10x'",
}
# Why a required key matters, shown when it is missing.
_REQUIRED_HINTS = {
    "version": "add version: 1",
    "active": "the steps recorded in each cycle, >= 1",
    "every": "periodic steps: {every: 100, from: 100}",
}
_MAX_LISTED = 8  # list the known keys after "unknown key" when there are this few
_LEAST = {"minItems": "items", "minProperties": "keys", "minLength": "characters"}
_WEAK = ("oneOf", "anyOf")  # ranked after other problems at the same depth


# ------------------------------------------------------------------ the schema


@functools.cache
def schema() -> dict[str, Any]:
    """The full schema: the base, with each registered backend's settings block."""
    assembled = base_schema()
    defs = assembled["$defs"]
    role = defs.pop("role")  # kept last, after the blocks it refers to
    names = [*registry.BACKENDS, *registry.ALIASES]
    one, several = role["properties"]["backend"]["oneOf"]
    one["enum"] = several["items"]["enum"] = names
    for name in registry.BACKENDS:
        defs[name] = registry.settings_schema(name)
        role["properties"][name] = {"$ref": f"#/$defs/{name}"}
    defs["role"] = role
    return assembled


def schema_text() -> str:
    """The schema as ``policy-engine schema`` prints it (and ``schemas/`` holds it)."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


@functools.cache
def _validator() -> Validator:
    return Validator(schema())


@functools.cache
def defaults(definition: str | None = None) -> FrozenDict:
    """What the schema says a policy holds where it is silent: every ``default`` of the
    keys of ``$defs/<definition>`` (of the policy itself when None). A key that refers to
    a definition of its own (a role's ``torch`` block) gets that definition's defaults."""
    root = schema()
    return FrozenDict(_defaults(root["$defs"][definition] if definition else root, root))


def _defaults(node: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, sub in node.get("properties", {}).items():
        if "default" in sub:
            out[key] = sub["default"]
        elif "$ref" in sub:
            nested = _defaults(root["$defs"][sub["$ref"].removeprefix("#/$defs/")], root)
            if nested:
                out[key] = nested
    return out


# ------------------------------------------------------------------ checking


@attrs.frozen
class Refused:
    """The paths of the values that were refused (an unknown or badly named key: its own
    path). A value that holds one is not sound: nothing is built from it."""

    paths: frozenset[Path] = frozenset()
    _holders: frozenset[Path] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        holders = {path[:i] for path in self.paths for i in range(len(path) + 1)}
        object.__setattr__(self, "_holders", frozenset(holders))

    def sound(self, path: Path) -> bool:
        """Whether nothing at ``path`` or inside it was refused."""
        return path not in self._holders

    def adding(self, paths: Iterable[Path]) -> Refused:
        """These refusals and ``paths``."""
        return Refused(self.paths | frozenset(paths))


@attrs.frozen
class Checked:
    """The schema's problems in a document, and what it refused."""

    problems: tuple[Problem, ...]
    refused: Refused


def validate(doc: Document) -> Checked:
    """Every schema problem in ``doc``, ranked: shallow (structural) problems first, then
    ``oneOf``/``anyOf`` mismatches after other problems at the same depth, then file
    order."""
    errors = _validator().errors(doc.data)
    if not errors:
        return Checked((), Refused())
    order = {path: index for index, path in enumerate(_walk(doc.data))}

    def rank(error: Error) -> tuple[int, bool, int, int, int]:
        loc = doc.locate(error.path)
        return (len(error.path), error.keyword in _WEAK, loc.line or 0, loc.column or 0,
                order.get(error.path, 0))

    out: list[Problem] = []
    refused: set[Path] = set()
    seen: set[tuple[str, str]] = set()
    for error in sorted(errors, key=rank):
        for where, problem in _problems(error, doc):
            refused.add(where)
            if (problem.json_path, problem.message) not in seen:
                seen.add((problem.json_path, problem.message))
                out.append(problem)
    return Checked(tuple(out), Refused(frozenset(refused)))


def _walk(value: Any, path: Path = ()) -> Iterator[Path]:
    """Every path in ``value``, in document order (what ranks problems without positions)."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*path, index))


# ------------------------------------------------------------------ wording


def _duplicate(items: list[Any]) -> Any:
    """The first item equal to an earlier one, as JSON compares them."""
    return next((item for index, item in enumerate(items)
                 if any(equal(item, other) for other in items[:index])), None)


def _show(value: Any) -> str:
    """A value as a message quotes it: strings in quotes, the rest as JSON, short."""
    if isinstance(value, str):
        return repr(value)
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _got(value: Any) -> str:
    return "got null" if value is None else f"got {describe(value)} {_show(value)}"


def _or(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def _type_words(names: str | Sequence[str]) -> list[str]:
    return [KINDS.get(n, n) for n in ([names] if isinstance(names, str) else names)]


def _label(path: Sequence[str | int]) -> str:
    """How a message names the value at ``path``: ``ranks``, ``regions[0]``, ``role 'x'``."""
    parts = list(path)
    index = ""
    while parts and isinstance(parts[-1], int):
        index = f"[{parts.pop()}]{index}"
    if not parts:
        return f"item{index}" if index else "the policy"
    last = str(parts[-1])
    parent = parts[-2] if len(parts) > 1 else None
    if parent == "roles" and len(parts) == 2:
        return f"role {last!r}{index}"
    if parent == "regions" and len(parts) > 2:
        return f"region {last!r}{index}"
    return f"{last}{index}"


def _expected_kinds(alternatives: Sequence[Mapping[str, Any]]) -> list[str]:
    """The kinds of value the alternatives of a ``oneOf``/``anyOf`` take, in words."""
    out: list[str] = []
    for alternative in alternatives:
        for keyword, argument in alternative.items():
            if keyword == "type":
                out += _type_words(argument)
            elif keyword == "enum":
                out += [_show(v) for v in argument]
            elif keyword == "const":
                out.append(_show(argument))
    return list(dict.fromkeys(out))


def _want(pattern: str) -> str:
    return _PATTERNS.get(pattern, f"expected text matching {pattern}")


def _problems(error: Error, doc: Document) -> Iterator[tuple[Path, Problem]]:
    """The problems ``error`` stands for, each with the path of the value it refuses."""
    path, value, keyword = error.path, error.value, error.keyword
    if error.key:
        where = (*path, value)
        yield where, _key_problem(error, where, doc)
        return
    if keyword == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        for key in value:
            if key in known:
                continue
            hint = did_you_mean(key, known)
            if not hint and 0 < len(known) <= _MAX_LISTED:
                hint = f" (expected one of {', '.join(known)})"
            where = (*path, key)
            yield where, Problem(f"unknown key {key!r}{hint}", json_path(where),
                                 doc.locate(where, key=True))
        return
    label = _label(path)
    if keyword in _WEAK:
        msg = f"{label} must be {_or(_expected_kinds(error.expected))}, {_got(value)}"
    elif keyword == "enum":
        choices = [str(c) for c in error.expected]
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        msg = f"{label} must be one of {', '.join(choices)}, got {_show(value)}{hint}"
    elif keyword == "const":
        msg = f"{label} must be {_show(error.expected)}, got {_show(value)}"
    elif keyword == "type":
        msg = f"{label} must be {_or(_type_words(error.expected))}, {_got(value)}"
    elif keyword == "required":
        key = error.expected
        hint = f" ({_REQUIRED_HINTS[key]})" if key in _REQUIRED_HINTS else ""
        msg = f"missing required key {key!r}{hint}"
    elif keyword == "minimum":
        msg = f"{label} must be >= {error.expected}, got {_show(value)}"
    elif keyword in _LEAST:
        msg = (f"{label} must not be empty" if error.expected == 1 else
               f"{label} must have at least {error.expected} {_LEAST[keyword]}, "
               f"got {len(value)}")
    elif keyword == "uniqueItems":
        msg = f"{label} lists {_show(_duplicate(value))} more than once"
    else:  # pattern
        noun = "region name" if [p for p in path if isinstance(p, str)][-1:] == ["regions"] \
            else label
        msg = f"bad {noun} {_show(value)}: {_want(error.expected)}"
    yield path, Problem(msg, json_path(path), doc.locate(path))


def _key_problem(error: Error, where: Path, doc: Document) -> Problem:
    name = str(where[-1])
    parent = where[-2] if len(where) > 1 else None
    noun = {"roles": "role name", "regions": "region name", "mesh": "mesh dimension"}.get(
        str(parent), "key")
    if error.keyword == "enum":
        choices = [str(c) for c in error.expected]
        hint = did_you_mean(name, choices) or f" (expected one of {', '.join(choices)})"
        msg = f"unknown {noun} {name!r}{hint}"
    elif error.keyword == "pattern":
        msg = f"bad {noun} {name!r}: {_want(error.expected)}"
    else:
        msg = f"bad {noun} {name!r}: it breaks the schema's {error.keyword}"
    return Problem(msg, json_path(where), doc.locate(where, key=True))
