"""A validator for the part of JSON Schema (draft 2020-12) that the policy schema uses.

:class:`Validator` is built once per schema. Building refuses any keyword this module does
not implement, so the schema cannot silently grow past what is checked. Two rules differ
from a general validator, on purpose:

- an integer is an int: ``2.0`` is not a rank, a size or a number of steps (the standard
  accepts it; the code after the schema would not);
- the alternatives of a ``oneOf`` or ``anyOf`` take different kinds of value (building
  refuses overlaps), so a value's kind picks the one alternative that speaks for it. A
  value no alternative takes is one error, at the ``oneOf``, naming the kinds it takes.

Every other keyword behaves as jsonschema's: the tests compare the two on generated
documents. Errors come in the order jsonschema finds them (the schema's keyword order).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

Path = tuple[str | int, ...]

#: The keywords checked, and those that only annotate.
# fmt: off
KEYWORDS = frozenset({
    "type", "enum", "const", "properties", "additionalProperties", "propertyNames",
    "required", "items", "minItems", "minProperties", "minLength", "uniqueItems", "minimum",
    "pattern", "oneOf", "anyOf", "$ref",
})
# fmt: on
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "default", "examples"})

#: The kinds a value can be; "number" is a float (an int is "integer").
ALL_KINDS = frozenset({"null", "boolean", "integer", "number", "string", "array", "object"})
_TYPE_KINDS: Mapping[str, frozenset[str]] = {
    **{name: frozenset({name}) for name in ALL_KINDS},
    "number": frozenset({"integer", "number"}),
}


#: Python types and the JSON Schema type each is (``bool`` before ``int``: it is one).
_KIND_OF: tuple[tuple[type, str], ...] = (
    (type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"),
    (str, "string"), (list, "array"), (dict, "object"))


def kind(value: object) -> str:
    """The kind of a plain value, as JSON Schema's types name them."""
    for python, name in _KIND_OF:
        if isinstance(value, python):
            return name
    return type(value).__name__


@attrs.frozen
class Error:
    """One way a value breaks the schema.

    ``keyword`` is the schema keyword it breaks, ``expected`` that keyword's argument
    (for a ``required`` key: the missing key; for a ``oneOf``/``anyOf``: its alternatives
    with references followed), ``schema`` the schema object holding the keyword. ``path``
    is where the value is; a ``key`` error is about a key of the mapping at ``path``
    (``propertyNames``), and ``value`` is then the key itself.
    """

    keyword: str
    path: Path
    value: Any
    expected: Any
    schema: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    key: bool = False


class SchemaError(ValueError):
    """The schema uses what this validator cannot check."""


Check = Callable[[Any, Path, list[Error]], None]


class _Node:
    """One schema object, compiled: its checks in the schema's keyword order."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self.checks: list[Check] = []
        self.kinds: frozenset[str] = ALL_KINDS  # the kinds of value it can accept

    def validate(self, value: Any, path: Path, out: list[Error]) -> None:
        for check in self.checks:
            check(value, path, out)


class Validator:
    """Checks documents against ``schema`` (a root with ``$defs``)."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._defs: Mapping[str, Any] = schema.get("$defs", {})
        self._compiled: dict[int, _Node] = {}
        self._root = self._compile(schema, "#")

    def errors(self, value: Any) -> list[Error]:
        """Every error in ``value``, in the order jsonschema finds them."""
        out: list[Error] = []
        self._root.validate(value, (), out)
        return out

    # ---------------------------------------------------------------- building

    def _resolve(self, ref: str, where: str) -> Mapping[str, Any]:
        name = ref.removeprefix("#/$defs/")
        if not ref.startswith("#/$defs/") or name not in self._defs:
            raise SchemaError(f"{where}: $ref {ref!r} is not one of #/$defs/<name>")
        found: Mapping[str, Any] = self._defs[name]
        return found

    def _compile(self, schema: Any, where: str) -> _Node:
        if not isinstance(schema, Mapping):
            raise SchemaError(f"{where}: a schema must be an object, got {schema!r}")
        known = self._compiled.get(id(schema))
        if known is not None:
            return known
        node = _Node(schema)
        self._compiled[id(schema)] = node  # before the children: a $ref may come back here
        unknown = set(schema) - KEYWORDS - ANNOTATIONS
        if unknown:
            raise SchemaError(
                f"{where}: keywords this validator does not check: {', '.join(sorted(unknown))}"
            )
        for keyword, argument in schema.items():
            if keyword in KEYWORDS:
                node.checks.append(self._check(keyword, argument, schema, node, where))
        if "$defs" in schema:
            for name, sub in schema["$defs"].items():
                self._compile(sub, f"{where}/$defs/{name}")
        return node

    def _check(
        self, keyword: str, arg: Any, schema: Mapping[str, Any], node: _Node, where: str
    ) -> Check:
        at = f"{where}/{keyword}"
        if keyword == "type":
            names = [arg] if isinstance(arg, str) else list(arg)
            if not names or any(name not in _TYPE_KINDS for name in names):
                raise SchemaError(f"{at}: unknown type in {arg!r}")
            kinds = frozenset().union(*(_TYPE_KINDS[name] for name in names))
            node.kinds &= kinds
            return _typed(kinds, arg, schema)
        if keyword in ("enum", "const"):
            allowed = list(arg) if keyword == "enum" else [arg]
            node.kinds &= frozenset().union(*(_TYPE_KINDS[_json_type(v)] for v in allowed))
            return _one_of_values(keyword, allowed, arg, schema)
        if keyword == "$ref":
            target = self._compile(self._resolve(arg, at), arg)
            node.kinds &= target.kinds
            return target.validate
        if keyword in ("oneOf", "anyOf"):
            return self._alternatives(keyword, arg, schema, node, at)
        if keyword == "properties":
            props = {name: self._compile(sub, f"{at}/{name}") for name, sub in arg.items()}
            return _properties(props)
        if keyword == "additionalProperties":
            if isinstance(arg, bool):
                return _no_more_properties(schema) if not arg else _nothing
            return _more_properties(self._compile(arg, at), schema)
        if keyword == "propertyNames":
            return _property_names(self._compile(arg, at))
        if keyword == "items":
            return _items(self._compile(arg, at))
        if keyword == "required":
            return _required(list(arg), schema)
        if keyword in ("minItems", "minProperties", "minLength"):
            return _at_least(keyword, int(arg), schema)
        if keyword == "uniqueItems":
            return _unique(schema) if arg else _nothing
        if keyword == "minimum":
            return _minimum(arg, schema)
        if keyword == "pattern":
            return _pattern(re.compile(arg), arg, schema)
        raise SchemaError(f"{at}: not implemented")  # pragma: no cover - KEYWORDS guards

    def _alternatives(
        self, keyword: str, arg: Any, schema: Mapping[str, Any], node: _Node, at: str
    ) -> Check:
        alternatives = [self._compile(sub, f"{at}/{i}") for i, sub in enumerate(arg)]
        taken: frozenset[str] = frozenset()
        for index, alternative in enumerate(alternatives):
            if alternative.kinds & taken:
                raise SchemaError(
                    f"{at}/{index}: takes {', '.join(sorted(alternative.kinds & taken))} "
                    "like an earlier alternative (a value's kind must pick one)"
                )
            taken |= alternative.kinds
        node.kinds &= taken
        resolved = tuple(self._followed(sub) for sub in arg)

        def check(value: Any, path: Path, out: list[Error]) -> None:
            found = kind(value)
            for alternative in alternatives:
                if found in alternative.kinds:
                    alternative.validate(value, path, out)
                    return
            out.append(Error(keyword, path, value, resolved, schema))

        return check

    def _followed(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """``schema``, or what its ``$ref`` points at when that is all it says."""
        while set(schema) - ANNOTATIONS == {"$ref"}:
            schema = self._resolve(schema["$ref"], "$ref")
        return schema


# -------------------------------------------------------------------- keywords


def _nothing(value: Any, path: Path, out: list[Error]) -> None:
    pass


def _typed(kinds: frozenset[str], arg: Any, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if kind(value) not in kinds:
            out.append(Error("type", path, value, arg, schema))

    return check


def _one_of_values(keyword: str, allowed: list[Any], arg: Any, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if not any(equal(each, value) for each in allowed):
            out.append(Error(keyword, path, value, arg, schema))

    return check


def _properties(props: Mapping[str, _Node]) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, dict):
            for name, node in props.items():
                if name in value:
                    node.validate(value[name], (*path, name), out)

    return check


def _no_more_properties(schema: Mapping[str, Any]) -> Check:
    known = schema.get("properties", {})

    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, dict) and any(name not in known for name in value):
            out.append(Error("additionalProperties", path, value, False, schema))

    return check


def _more_properties(node: _Node, schema: Mapping[str, Any]) -> Check:
    known = schema.get("properties", {})

    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                if name not in known:
                    node.validate(item, (*path, name), out)

    return check


def _property_names(node: _Node) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, dict):
            for name in value:
                found: list[Error] = []
                node.validate(name, path, found)
                out.extend(attrs.evolve(error, key=True) for error in found)

    return check


def _items(node: _Node) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, list):
            for index, item in enumerate(value):
                node.validate(item, (*path, index), out)

    return check


def _required(names: list[str], schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, dict):
            out.extend(
                Error("required", path, value, name, schema) for name in names if name not in value
            )

    return check


_SIZED = {"minItems": list, "minProperties": dict, "minLength": str}


def _at_least(keyword: str, least: int, schema: Mapping[str, Any]) -> Check:
    sized = _SIZED[keyword]

    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, sized) and len(value) < least:
            out.append(Error(keyword, path, value, least, schema))

    return check


def _unique(schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if isinstance(value, list) and not unique(value):
            out.append(Error("uniqueItems", path, value, True, schema))

    return check


def _minimum(least: float, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        if kind(value) in ("integer", "number") and value < least:
            out.append(Error("minimum", path, value, least, schema))

    return check


def _pattern(compiled: re.Pattern[str], arg: str, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: Path, out: list[Error]) -> None:
        # search, as JSON Schema says (and jsonschema does): the pattern anchors itself.
        if isinstance(value, str) and not compiled.search(value):
            out.append(Error("pattern", path, value, arg, schema))

    return check


# -------------------------------------------------------------------- equality, as JSON

_TRUE, _FALSE = object(), object()


def _unbool(value: Any) -> Any:
    """A boolean as a value no number equals (JSON's true is not 1)."""
    return _TRUE if value is True else _FALSE if value is False else value


def _json_type(value: Any) -> str:
    """JSON's type of a value: "number" for ints and floats alike."""
    found = kind(value)
    return "number" if found == "integer" else found


def equal(one: Any, two: Any) -> bool:
    """JSON equality: ``1 == 1.0``, ``true != 1``, lists and mappings item by item."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, Sequence) and isinstance(two, Sequence):
        return len(one) == len(two) and all(equal(a, b) for a, b in zip(one, two, strict=True))
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        return len(one) == len(two) and all(k in two and equal(v, two[k]) for k, v in one.items())
    return bool(_unbool(one) == _unbool(two))


def unique(items: list[Any]) -> bool:
    """Whether no two items are :func:`equal` (sorted when they sort, else pairwise)."""
    try:
        ordered = sorted(_unbool(item) for item in items)
        return not any(equal(a, b) for a, b in itertools.pairwise(ordered))
    except (NotImplementedError, TypeError):
        seen: list[Any] = []
        for item in map(_unbool, items):
            if any(equal(other, item) for other in seen):
                return False
            seen.append(item)
        return True
