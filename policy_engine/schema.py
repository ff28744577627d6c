"""The JSON Schema: the one source of truth for the policy file's structure.

The schema file ships inside the wheel (``policy_engine/_schema``); in a source checkout it
is read from the repository's ``schemas/`` folder. This module turns jsonschema's errors
into :class:`~policy_engine.errors.Problem` objects that point at the offending key or
value, ranked by jsonschema's own relevance, with "did you mean" for unknown keys.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ._resources import read_resource
from .errors import Problem, did_you_mean, json_path

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

    from .loader import Document

SCHEMA_NAME = "profile_policy.schema.json"


def schema_text() -> str:
    """The schema file's text, from the installed package or the source checkout."""
    return read_resource(f"_schema/{SCHEMA_NAME}", f"schemas/{SCHEMA_NAME}")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema())


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping"}.get(type(value), type(value).__name__)


def _leaf(error: ValidationError) -> ValidationError:
    """For oneOf/anyOf, the branch error most likely to be what the user meant."""
    from jsonschema.exceptions import best_match

    if error.validator in ("oneOf", "anyOf") and error.context:
        # Prefer the branch whose type matched: its complaint is about the content.
        typed = [e for e in error.context if e.validator != "type"]
        pick = best_match(typed or error.context)
        if pick is not None:
            return _leaf(pick)
    return error


def _problems(error: ValidationError, doc: Document) -> Iterator[Problem]:
    error = _leaf(error)
    path: Sequence[str | int] = list(error.absolute_path)
    value = error.instance
    validator = error.validator
    if validator == "additionalProperties" and isinstance(value, dict):
        known = list(error.schema.get("properties", {}))
        patterns = error.schema.get("patternProperties", {})
        for key in value:
            if key in known or patterns:
                continue
            where = [*path, key]
            yield Problem(f"unknown key {key!r}{did_you_mean(key, known)}",
                          json_path(where), doc.locate(where, key=True))
        return
    if validator == "propertyNames":
        bad = [k for k in value if isinstance(value, dict)]
        sub = error.context[0] if error.context else None
        name = sub.instance if sub is not None else (bad[0] if bad else "?")
        where = [*path, name]
        choices = error.schema.get("propertyNames", {}).get("enum")
        if choices:
            msg = (f"unknown name {name!r}{did_you_mean(str(name), choices)}; "
                   f"expected one of {', '.join(choices)}")
        else:
            msg = f"bad name {name!r}: {sub.message if sub else error.message}"
        yield Problem(msg, json_path(where), doc.locate(where, key=True))
        return
    if validator == "enum":
        choices = [str(c) for c in error.validator_value]
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        msg = f"{value!r} is not one of {', '.join(choices)}{hint}"
    elif validator == "const":
        msg = f"{value!r} is not supported: expected {error.validator_value!r}"
    elif validator == "type":
        expected = error.validator_value
        names = expected if isinstance(expected, list) else [expected]
        pretty = " or ".join("list" if n == "array" else "mapping" if n == "object" else n
                             for n in names)
        msg = f"expected {pretty}, got {_type_name(value)} {value!r}"
    elif validator == "required":
        msg = error.message
    else:
        msg = error.message
    yield Problem(msg, json_path(path), doc.locate(path))


def validate(doc: Document) -> list[Problem]:
    """Every schema problem in ``doc``, most relevant first."""
    from jsonschema.exceptions import STRONG_MATCHES, WEAK_MATCHES

    def rank(error: ValidationError) -> tuple[int, bool, bool, int, int]:
        # jsonschema's relevance (deeper first, weak keywords last, strong first), then
        # file order; paths mix str and int, so they are not compared directly.
        loc = doc.locate(list(error.absolute_path))
        return (-len(error.absolute_path), error.validator in WEAK_MATCHES,
                error.validator not in STRONG_MATCHES, loc.line or 0, loc.column or 0)

    errors = sorted(_validator().iter_errors(doc.data), key=rank)
    out: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for error in errors:
        for problem in _problems(error, doc):
            key = (problem.json_path, problem.message)
            if key not in seen:
                seen.add(key)
                out.append(problem)
    return out


def backend_names() -> list[str]:
    """The ``backend`` enum as the schema states it (checked against the registry)."""
    names: list[str] = schema()["$defs"]["role"]["properties"]["backend"]["enum"]
    return names
