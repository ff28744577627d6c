"""JSON policies: strict JSON (no NaN, no duplicate keys, bounded numbers and nesting),
with positions borrowed from the YAML reader (JSON is YAML) where json keeps none."""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from policy_engine.errors import Location, PolicyError
from policy_engine.language.read import yaml_reader as _yaml
from policy_engine.language.read.document import (
    INT_LIMIT,
    Document,
    check_root,
    int_too_large,
    to_plain,
    too_deep,
)

# JSON's tokens that json reports no position for: numbers and NaN/Infinity (strings
# are matched only to be skipped)
_JSON_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|NaN|-?Infinity|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?'
)


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _Constant(Exception):
    """NaN or Infinity, which JSON does not have (json reads them all the same)."""


def _refuse_constant(name: str) -> Any:
    raise _Constant(name)


class _BigInt(Exception):
    """A JSON integer at or past INT_LIMIT, stopped before Python converts it."""


def _json_int(text: str) -> int:
    if len(text) > 20 or abs(value := int(text)) >= INT_LIMIT:  # 2**63 has 19 digits
        raise _BigInt(text)
    return value


def parse_json(text: str, origin: str) -> Document:
    _yaml.check_limits(text, origin)  # JSON is YAML: stop a huge or deep text before json
    try:
        data = json.loads(
            text,
            object_pairs_hook=_unique_pairs,
            parse_constant=_refuse_constant,
            parse_int=_json_int,
        )
    except json.JSONDecodeError as exc:
        raise PolicyError.single(exc.msg, Location(origin, exc.lineno, exc.colno)) from None
    except _BigInt as exc:
        number = exc.args[0]
        where = _offset_location(text, _json_token_offset(text, number), origin)
        error = PolicyError.single(int_too_large(len(number.lstrip("-"))), where)
        raise _located(error, text, origin) from None
    except _Constant as exc:
        where = _offset_location(text, _json_token_offset(text, exc.args[0]), origin)
        raise PolicyError.single(f"{exc.args[0]} is not valid JSON", where) from None
    except RecursionError:
        raise _located(too_deep(Location(origin), ()), text, origin) from None
    except _DuplicateKey as exc:
        error = PolicyError.single(f"duplicate key {exc.args[0]!r}", Location(origin))
        raise _located(error, text, origin, "duplicate key") from None
    try:
        positions = _yaml.parse_yaml_value(text, origin)
        values, keys = positions.values, positions.keys
    except (PolicyError, ValueError, RecursionError):  # JSON that PyYAML reads differently
        values, keys = {}, {}
    doc = Document({}, origin, values, keys)
    try:
        plain = to_plain(data, (), 0, doc.locate)
    except PolicyError as exc:
        raise (exc if values else _located(exc, text, origin)) from None
    return attrs.evolve(doc, data=check_root(plain, doc.locate(())))


def _located(error: PolicyError, text: str, origin: str, prefix: str = "") -> PolicyError:
    """``error`` as the YAML reader reports it, with positions, when it finds the same.

    json keeps no positions, but JSON is YAML: the YAML reader finds the same problems
    (duplicate keys, nesting, integer sizes) and says where they are.
    """
    try:
        _yaml.parse_yaml_value(text, origin)
    except PolicyError as located:
        wanted = prefix or error.problems[0].message
        same = [p for p in located.problems if p.message.startswith(wanted)]
        if same:
            return PolicyError(same)
    except (ValueError, RecursionError):
        pass
    return error


def _json_token_offset(text: str, token: str) -> int | None:
    """Where ``token`` first stands as a number or a constant (not inside a string)."""
    for found in _JSON_TOKEN.finditer(text):
        if found.group() == token:
            return found.start()
    return None


def _offset_location(text: str, offset: int | None, origin: str) -> Location:
    if offset is None:
        return Location(origin)
    line_start = text.rfind("\n", 0, offset) + 1
    return Location(origin, text.count("\n", 0, offset) + 1, offset - line_start + 1)
