"""The JSON Schema: the one source of truth for the policy file's structure.

The schema file ships inside the wheel (``policy_engine/_schema``); in a source checkout it
is read from the repository's ``schemas/`` folder. This module turns jsonschema's errors
into :class:`~policy_engine.errors.Problem` objects that point at the offending key or
value, with "did you mean" for unknown keys. A failed ``oneOf``/``anyOf`` is reported as
the errors of the alternative the value's type picks, never as "not valid under any of
the given schemas".
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any

from policy_engine._resources import read_resource
from policy_engine.errors import Problem, did_you_mean, json_path
from policy_engine.language.document import Document

# jsonschema's ValidationError. Its stubs type most attributes as "X | Unset", which every
# error that iter_errors yields has set; Any spares a cast at each use.
ValidationError = Any

SCHEMA_NAME = "profile_policy.schema.json"

_KINDS = {"integer": "an integer", "number": "a number", "string": "a string",
          "boolean": "a boolean", "array": "a list", "object": "a mapping", "null": "null"}
# What a name pattern of the schema asks for, in words.
_PATTERNS = {
    "^[A-Za-z][A-Za-z0-9_.+-]*$": "use a letter, then letters, digits, _ . + or -",
    "^[A-Za-z_][A-Za-z0-9_]*$": "use letters, digits and _, not starting with a digit",
}
# Why a required key matters, shown when it is missing.
_REQUIRED_HINTS = {
    "version": "add version: 1",
    "active": "the steps recorded in each cycle, >= 1",
}
# Words users reach for that are not close in spelling to the value they mean.
_SYNONYMS = {"gpu": "cuda", "nvidia": "cuda", "ascend": "npu", "pytorch": "torch"}
_MAX_LISTED = 8  # list the known keys after "unknown key" when there are this few


def schema_text() -> str:
    """The schema file's text, from the installed package or the source checkout."""
    return read_resource(f"_schema/{SCHEMA_NAME}", f"schemas/{SCHEMA_NAME}")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_text())
    return loaded


@functools.lru_cache(maxsize=1)
def _validator_class() -> Any:
    """Draft 2020-12, except that an integer is an int: ``2.0`` is not a rank count or a
    number of steps (the standard accepts it; the code after the schema would not)."""
    from jsonschema import Draft202012Validator, validators

    def is_integer(_checker: Any, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
    return validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator, type_checker=checker)


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    return _validator_class()(schema())


@functools.cache
def _part_validator(keys: tuple[str, ...]) -> Any:
    part: Any = schema()
    for key in keys:
        part = part[key]
    return _validator_class()({"allOf": [part], "$defs": schema()["$defs"]})


def fits(value: Any, *keys: str) -> bool:
    """Whether ``value`` is valid under the part of the schema at ``keys``, such as
    ``("$defs", "ranks")`` or ``("properties", "mesh")``.

    The semantic checks use it to skip values the schema already reports, so one
    mistake is reported once.
    """
    return bool(_part_validator(keys).is_valid(value))


# ------------------------------------------------------------------ wording


def _kind(value: Any) -> str:
    """The kind of a plain value, with its article: 'a list', 'an integer'."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "an integer"
    return _KINDS[_json_type(value)]


def _show(value: Any) -> str:
    """A value as a message quotes it: strings in quotes, the rest as JSON, short."""
    if isinstance(value, str):
        return repr(value)
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _got(value: Any) -> str:
    return "got null" if value is None else f"got {_kind(value)} {_show(value)}"


def _or(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


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


def _suggest(word: str, choices: Sequence[str]) -> str:
    """``did_you_mean``, more forgiving for two- and three-letter words (``tq`` -> ``tp``)."""
    if _SYNONYMS.get(word.lower()) in choices:
        return f" (did you mean {_SYNONYMS[word.lower()]!r}?)"
    hint = did_you_mean(word, choices)
    if hint or len(word) > 3:
        return hint
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _expected_kinds(errors: Sequence[ValidationError]) -> list[str]:
    """The kinds of value a failed alternative takes, read from its own top-level errors."""
    out: list[str] = []
    for error in errors:
        if error.relative_path:
            continue
        if error.validator == "type":
            names = error.validator_value
            out += [_KINDS.get(n, n) for n in ([names] if isinstance(names, str) else names)]
        elif error.validator == "enum":
            out += [_show(v) for v in error.validator_value]
        elif error.validator == "const":
            out.append(_show(error.validator_value))
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------ oneOf / anyOf


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    for kind, name in ((str, "string"), (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    return "null"


def _misfits(error: ValidationError) -> bool:
    """Whether an alternative's error says the value is of the wrong kind altogether."""
    if error.relative_path:
        return False
    if error.validator == "type":
        return True
    if error.validator in ("enum", "const"):
        allowed = error.validator_value if error.validator == "enum" else [error.validator_value]
        return _json_type(error.instance) not in {_json_type(v) for v in allowed}
    return False


def _branches(error: ValidationError) -> dict[int, list[ValidationError]]:
    out: dict[int, list[ValidationError]] = {}
    for sub in error.context or ():
        out.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
    return out


def _expand(error: ValidationError) -> list[ValidationError]:
    """The errors to report for ``error``: a failed oneOf/anyOf becomes the errors of the
    alternative that fits the value's kind (or stays, to be reported as a kind mismatch)."""
    if error.validator not in ("oneOf", "anyOf") or not error.context:
        return [error]
    from jsonschema.exceptions import best_match

    branches = _branches(error)
    fitting = {i: errs for i, errs in branches.items() if not any(map(_misfits, errs))}
    if not fitting:
        return [error]
    if len(fitting) > 1:
        best = best_match(e for errs in fitting.values() for e in errs)
        assert best is not None
        while best.parent is not None and best.parent is not error:
            best = best.parent
        fitting = {int(best.relative_schema_path[0]): fitting[int(best.relative_schema_path[0])]}
    [chosen] = fitting.values()
    return [leaf for sub in chosen for leaf in _expand(sub)]


# ------------------------------------------------------------------ messages


def _problems(error: ValidationError, doc: Document) -> Iterator[Problem]:
    path: list[str | int] = list(error.absolute_path)
    value = error.instance
    validator = error.validator
    label = _label(path)
    if list(error.schema_path)[-2:-1] == ["propertyNames"]:
        # jsonschema reports a bad key at its mapping; point at the key itself.
        yield _key_problem(error, [*path, value], doc)
        return
    if validator == "additionalProperties" and isinstance(value, dict):
        known = list(error.schema.get("properties", {}))
        for key in value:
            if key in known:
                continue
            hint = _suggest(key, known)
            if not hint and 0 < len(known) <= _MAX_LISTED:
                hint = f" (expected one of {', '.join(known)})"
            where = [*path, key]
            yield Problem(f"unknown key {key!r}{hint}", json_path(where),
                          doc.locate(where, key=True))
        return
    if validator in ("oneOf", "anyOf"):
        kinds = _expected_kinds(error.context or [])
        if not error.context:  # oneOf, more than one alternative matched
            msg = f"{label} {_show(value)} matches more than one allowed form"
        else:
            msg = (f"{label} must be {_or(kinds)}, {_got(value)}" if kinds
                   else f"{label} {_show(value)} matches none of the allowed forms")
    elif validator == "enum":
        choices = [str(c) for c in error.validator_value]
        hint = _suggest(value, choices) if isinstance(value, str) else ""
        msg = f"{label} must be one of {', '.join(choices)}, got {_show(value)}{hint}"
    elif validator == "const":
        msg = f"{label} must be {_show(error.validator_value)}, got {_show(value)}"
    elif validator == "type":
        names = error.validator_value
        kinds = [_KINDS.get(n, n) for n in ([names] if isinstance(names, str) else names)]
        msg = f"{label} must be {_or(kinds)}, {_got(value)}"
    elif validator == "required":
        missing = [k for k in error.validator_value if k not in value]
        key = missing[0] if missing else "?"
        hint = f" ({_REQUIRED_HINTS[key]})" if key in _REQUIRED_HINTS else ""
        msg = f"missing required key {key!r}{hint}"
    elif validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=",
                "exclusiveMaximum": "<"}[validator]
        msg = f"{label} must be {sign} {error.validator_value}, got {_show(value)}"
    elif validator in ("minLength", "minItems", "minProperties") and error.validator_value == 1:
        msg = f"{label} must not be empty"
    elif validator == "uniqueItems" and isinstance(value, list):
        dup = next((v for i, v in enumerate(value) if v in value[:i]), None)
        msg = f"{label} lists {_show(dup)} more than once"
    elif validator == "pattern":
        want = _PATTERNS.get(error.validator_value, f"expected text matching "
                             f"{error.validator_value}")
        noun = "region name" if [p for p in path if isinstance(p, str)][-1:] == ["regions"] \
            else label
        msg = f"bad {noun} {_show(value)}: {want}"
    else:
        msg = error.message
    yield Problem(msg, json_path(path), doc.locate(path))


def _key_problem(error: ValidationError, where: list[str | int], doc: Document) -> Problem:
    name = str(where[-1])
    parent = where[-2] if len(where) > 1 else None
    noun = {"roles": "role name", "regions": "region name", "mesh": "mesh dimension"}.get(
        str(parent), "key")
    if error.validator == "enum":
        choices = [str(c) for c in error.validator_value]
        hint = _suggest(name, choices) or f" (expected one of {', '.join(choices)})"
        msg = f"unknown {noun} {name!r}{hint}"
    elif error.validator == "pattern":
        want = _PATTERNS.get(error.validator_value, f"expected text matching "
                             f"{error.validator_value}")
        msg = f"bad {noun} {name!r}: {want}"
    else:
        msg = f"bad {noun} {name!r}: {error.message}"
    return Problem(msg, json_path(where), doc.locate(where, key=True))


def validate(doc: Document) -> list[Problem]:
    """Every schema problem in ``doc``, ranked: shallow (structural) problems first, then
    strong keywords before weak ones, then file order."""
    from jsonschema.exceptions import STRONG_MATCHES, WEAK_MATCHES

    order = {path: index for index, path in enumerate(_paths(doc.data, ()))}

    def rank(error: ValidationError) -> tuple[int, bool, bool, int, int, int]:
        path = tuple(error.absolute_path)
        loc = doc.locate(path)
        return (len(path), error.validator in WEAK_MATCHES, error.validator not in STRONG_MATCHES,
                loc.line or 0, loc.column or 0, order.get(path, 0))

    leaves = [leaf for error in _validator().iter_errors(doc.data) for leaf in _expand(error)]
    out: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for error in sorted(leaves, key=rank):
        for problem in _problems(error, doc):
            key = (problem.json_path, problem.message)
            if key not in seen:
                seen.add(key)
                out.append(problem)
    return out


def _paths(value: Any, path: tuple[str | int, ...]) -> Iterator[tuple[str | int, ...]]:
    """Every path in ``value``, in document order (what ranks problems without positions)."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, (*path, key))


def backend_names() -> list[str]:
    """The ``backend`` enum as the schema states it (checked against the registry)."""
    names: list[str] = schema()["$defs"]["role"]["properties"]["backend"]["enum"]
    return names
