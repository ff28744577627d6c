"""Safe YAML: text -> plain data, with the position of every value and every key.

PyYAML only *composes* the text into a node graph here; no Python object is ever
constructed from a tag. This module checks that graph (tags, duplicate keys, key
types, nesting, alias expansion, integer sizes) and builds dicts, lists and scalars
itself. The nesting and the number of values are bounded before anything is composed
(:mod:`policy_engine.language.read.yaml_shape`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import attrs
import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from policy_engine.errors import KINDS, Location, PolicyError, Problem, json_path
from policy_engine.language.read.document import (
    INT_LIMIT,
    LONE_SURROGATE,
    MAX_DEPTH,
    MAX_NODES,
    SURROGATE,
    TOO_MANY,
    Document,
    PathKey,
    check_root,
    has_surrogate,
    int_too_large,
    shorten,
    too_deep,
)
from policy_engine.language.read.yaml_shape import check_shape

_INT_TEXT = 100  # an integer written with more significant digits is refused unread

_T = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL = _T + "str", _T + "int", _T + "float", _T + "bool", _T + "null"
_SEQ, _MAP, _MERGE = _T + "seq", _T + "map", _T + "merge"
_SCALAR_KINDS = {
    _STR: KINDS["string"],
    _INT: KINDS["integer"],
    _FLOAT: KINDS["number"],
    _BOOL: KINDS["boolean"],
    _NULL: KINDS["null"],
    _MERGE: KINDS["string"],
}
_NODE_KINDS = {ScalarNode: "a scalar", SequenceNode: KINDS["array"], MappingNode: KINDS["object"]}
_ALLOWED = {ScalarNode: set(_SCALAR_KINDS), SequenceNode: {_SEQ}, MappingNode: {_MAP}}
_CORE = {_STR, _INT, _FLOAT, _BOOL, _NULL, _SEQ, _MAP}

_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
# Implicit timestamps (a plain 2024-01-01) stay strings and a plain `=` is not the
# obscure !!value type: policies hold neither, so those resolvers are left out.
# An explicit !!timestamp then stands out as a tag outside the allowed set.
_UNWANTED = (_T + "timestamp", _T + "value")
_RESOLVERS = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _UNWANTED]
    for first, resolvers in _LOADER.yaml_implicit_resolvers.items()
}
# Only the scalar methods are used; they read node.value and keep no state.
_SAFE = SafeConstructor()
_CONSTRUCT: dict[str, Callable[[ScalarNode], Any]] = {
    _INT: _SAFE.construct_yaml_int,
    _FLOAT: _SAFE.construct_yaml_float,
    _BOOL: _SAFE.construct_yaml_bool,
    _NULL: _SAFE.construct_yaml_null,
}


class YamlValue(NamedTuple):
    """Any YAML value with positions; ``values`` lacks ``()`` when the text held nothing."""

    value: Any
    values: dict[PathKey, Location]
    keys: dict[PathKey, Location]


def parse_yaml(text: str, origin: str) -> Document:
    """Parse a YAML policy (one document, a mapping at the top) safely, keeping positions."""
    parsed = parse_yaml_value(text, origin)
    data = check_root(parsed.value, parsed.values.get((), Location(origin)), () in parsed.values)
    return Document(data, origin, parsed.values, parsed.keys)


def parse_yaml_value(text: str, origin: str) -> YamlValue:
    """Parse one YAML document of any shape with the policy's safety rules."""
    node = _compose(text, origin)
    if node is None:
        return YamlValue(None, {}, {})
    checker = _Checker(origin)
    checker.visit(node, (), 0)
    if checker.problems:
        raise PolicyError(list(dict.fromkeys(checker.problems)))  # shared nodes repeat
    values: dict[PathKey, Location] = {}
    keys: dict[PathKey, Location] = {}
    return YamlValue(_build(node, (), origin, values, keys), values, keys)


def show_tag(tag: str) -> str:
    """Write a tag the way a user types it: ``!!python/object`` rather than its URI."""
    return "!!" + tag[len(_T) :] if tag.startswith(_T) else tag


def _compose(text: str, origin: str) -> Node | None:
    try:
        _refuse_surrogates(text, origin)
        check_shape(text, origin, _LOADER)
        loader = _LOADER(text)  # the pure-Python reader checks characters right here
        loader.yaml_implicit_resolvers = _RESOLVERS  # an instance attribute shadows the class's
        try:
            return loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, text, origin) from None
    except yaml.YAMLError as exc:  # a ReaderError: a character YAML does not allow
        position = getattr(exc, "position", None)
        where = _offset_location(text, position, origin) if isinstance(position, int) else None
        raise PolicyError.single(str(exc).splitlines()[0], where or Location(origin)) from None
    except RecursionError:  # the pure-Python composer recurses once per level
        raise too_deep(Location(origin), ()) from None


def _refuse_surrogates(text: str, origin: str) -> None:
    """Refuse lone surrogates (from undecodable bytes) as the pure-Python reader does;
    the C loader cannot even encode them."""
    found = SURROGATE.search(text)
    if found:
        message = (
            f"unacceptable character #x{ord(found.group()):04x}: special characters are not allowed"
        )
        raise PolicyError.single(message, _offset_location(text, found.start(), origin))


def check_limits(text: str, origin: str) -> None:
    """Refuse YAML or JSON text nested past MAX_DEPTH or holding more than MAX_NODES
    values, with where; anything else is left to the reader that reads it."""
    with contextlib.suppress(yaml.YAMLError, ValueError):  # ValueError: lone surrogates
        check_shape(text, origin, _LOADER)


def _syntax_error(exc: yaml.MarkedYAMLError, text: str, origin: str) -> PolicyError:
    mark = exc.problem_mark or exc.context_mark
    where = Location(origin, mark.line + 1, mark.column + 1) if mark else Location(origin)
    problem = exc.problem or exc.context or "invalid YAML"
    if "maximum nesting depth" in problem:  # libyaml's own limit, far above ours
        return too_deep(where, ())
    if problem == "but found another document":
        return PolicyError.single("a policy file holds one YAML document; found a second", where)
    lines = text.splitlines()
    if mark and mark.line < len(lines) and lines[mark.line][mark.column : mark.column + 1] == "\t":
        return PolicyError.single("tabs cannot indent YAML; use spaces", where)
    if exc.context and exc.context_mark and exc.problem:
        at = f"line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
        problem = f"{problem} ({exc.context} started at {at})"
    return PolicyError.single(problem, where)


def _offset_location(text: str, offset: int, origin: str) -> Location:
    line_start = text.rfind("\n", 0, offset) + 1
    return Location(origin, text.count("\n", 0, offset) + 1, offset - line_start + 1)


def _at(node: Node, origin: str) -> Location:
    mark = node.start_mark
    return Location(origin, mark.line + 1, mark.column + 1) if mark else Location(origin)


def _scalar_at(node: ScalarNode, where: Location) -> Location:
    """``where``, knowing where the scalar's text begins when the source shows it one
    character per column (plain, or quoted without escapes, on one line)."""
    start, end = node.start_mark, node.end_mark
    if start is None or end is None or start.line != end.line:
        return where
    quotes = 2 if node.style in ("'", '"') else 0 if not node.style else -1
    if quotes < 0 or end.column - start.column != len(node.value) + quotes:
        return where
    return attrs.evolve(where, inner=quotes // 2)


class _Checker:
    """One pass over the node graph, visiting each node once even when aliases share it.

    Memoizing the expanded size and height of every node is what makes an alias bomb
    cost its text length, not its expansion; the expansion is never built.
    """

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.problems: list[Problem] = []
        self.measured: dict[Node, tuple[int, int]] = {}  # node -> (expanded size, height)
        self.open: set[Node] = set()  # nodes on the current path: revisiting one is a loop

    def visit(self, node: Node, path: PathKey, depth: int) -> tuple[int, int]:
        known = self.measured.get(node)
        if known is not None:
            if depth + known[1] > MAX_DEPTH:
                raise too_deep(_at(node, self.origin), path)
            return known
        if node in self.open:
            raise self._fatal("an alias refers to a node that contains it", node, path)
        self._check_tag(node, path)
        if isinstance(node, ScalarNode):
            result = (1, 0)
        else:
            if depth >= MAX_DEPTH:
                raise too_deep(_at(node, self.origin), path)
            self.open.add(node)
            size, height = 1, 0
            for child, child_path in self._children(node, path):
                child_size, child_height = self.visit(child, child_path, depth + 1)
                size, height = size + child_size, max(height, child_height)
                if size > MAX_NODES:
                    raise self._fatal(TOO_MANY, node, path)
            self.open.discard(node)
            result = (size, height + 1)
        self.measured[node] = result
        return result

    def _children(self, node: Node, path: PathKey) -> Iterator[tuple[Node, PathKey]]:
        if isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                yield item, (*path, index)
            return
        first: dict[str, ScalarNode] = {}
        for key, value in node.value:
            if not (isinstance(key, ScalarNode) and key.tag in (_STR, _MERGE)):
                self._problem(_key_message(key), key, path)
                continue
            name = key.value
            if name in first:
                line = first[name].start_mark.line + 1
                self._problem(
                    f"duplicate key {shorten(name)!r} (first defined at line {line})",
                    key,
                    (*path, name),
                )
                continue
            first[name] = key
            if key.tag == _MERGE and not _mergeable(value):
                self._problem(
                    "the merge key << takes a mapping or a list of mappings", value, (*path, name)
                )
            yield key, (*path, name)  # counted (keys are values too); scalars recurse no further
            yield value, (*path, name)

    def _check_tag(self, node: Node, path: PathKey) -> None:
        if isinstance(node, ScalarNode) and has_surrogate(node.value):  # from a \u escape
            self._problem(LONE_SURROGATE, node, path)
            return
        allowed = _ALLOWED[type(node)]
        if node.tag in allowed:
            if isinstance(node, ScalarNode) and node.tag in _CONSTRUCT:
                problem = _scalar_problem(node)
                if problem:
                    self._problem(problem, node, path)
        elif node.tag in _CORE:
            self._problem(
                f"tag '{show_tag(node.tag)}' cannot be used on {_NODE_KINDS[type(node)]}",
                node,
                path,
            )
        else:
            self._problem(f"tags are not allowed: '{show_tag(node.tag)}'", node, path)

    def _problem(self, message: str, node: Node, path: PathKey) -> None:
        self.problems.append(Problem(message, json_path(path), _at(node, self.origin)))

    def _fatal(self, message: str, node: Node, path: PathKey) -> PolicyError:
        return PolicyError.single(message, _at(node, self.origin), json_path(path))


def _scalar_problem(node: ScalarNode) -> str | None:
    """What is wrong with a typed scalar's text, if anything; never converts a huge int."""
    if node.tag == _INT:
        digits = _long_int(node.value)
        if digits:
            return int_too_large(digits)
    try:
        value = _CONSTRUCT[node.tag](node)
    except (ValueError, KeyError, IndexError, OverflowError):
        return f"{shorten(node.value)!r} is not a valid {show_tag(node.tag)}"
    if node.tag == _INT and abs(value) >= INT_LIMIT:
        return int_too_large(len(str(abs(value))))
    return None


def _long_int(text: str) -> int:
    """The significant digits of an integer written too long to convert (else 0).

    Past _INT_TEXT digits a number is far beyond INT_LIMIT in any base, and Python
    refuses to convert decimal ones past 4300 digits; base 60 (``1:30``) takes time.
    """
    body = text.lstrip("+-")
    base = body[:2].lower()
    digits = (body[2:] if base in ("0x", "0b") else body).replace("_", "").lstrip("0")
    kind = {"0x": "[0-9a-fA-F]+", "0b": "[01]+"}.get(base, "[0-9:]+")
    if len(digits) <= _INT_TEXT or not re.fullmatch(kind, digits):
        return 0
    return len(digits.replace(":", ""))


def _key_message(key: Node) -> str:
    if isinstance(key, ScalarNode):
        kind = _SCALAR_KINDS.get(key.tag, f"a '{show_tag(key.tag)}' value")
        shown = f"{shorten(key.value)} ({kind})" if key.value else kind
        return f"keys must be strings, got {shown}"
    return f"keys must be strings, got {_NODE_KINDS[type(key)]}"


def _mergeable(node: Node) -> bool:
    if isinstance(node, SequenceNode):
        return all(isinstance(item, MappingNode) for item in node.value)
    return isinstance(node, MappingNode)


def _pairs(node: MappingNode) -> Iterator[tuple[ScalarNode, Node]]:
    """A mapping's effective pairs: merged ones fill in where no explicit key is given.

    As YAML's merge key says, explicit keys win, and among several merged mappings
    the earlier one wins. Merged keys appear where the ``<<`` entry stands.
    """
    explicit = {key.value for key, _ in node.value if key.tag != _MERGE}
    seen: set[str] = set()
    for key, value in node.value:
        if key.tag != _MERGE:
            seen.add(key.value)
            yield key, value
            continue
        for source in value.value if isinstance(value, SequenceNode) else [value]:
            for merged_key, merged_value in _pairs(source):
                if merged_key.value not in explicit and merged_key.value not in seen:
                    seen.add(merged_key.value)
                    yield merged_key, merged_value


def _build(
    node: Node,
    path: PathKey,
    origin: str,
    values: dict[PathKey, Location],
    keys: dict[PathKey, Location],
) -> Any:
    values[path] = _at(node, origin)
    if isinstance(node, ScalarNode):
        values[path] = _scalar_at(node, values[path])
        make = _CONSTRUCT.get(node.tag)
        return make(node) if make else node.value  # str, and a `<<` standing as a value
    if isinstance(node, MappingNode):
        out: dict[str, Any] = {}
        for key, value in _pairs(node):
            child = (*path, key.value)
            keys[child] = _at(key, origin)
            out[key.value] = _build(value, child, origin, values, keys)
        return out
    return [_build(item, (*path, i), origin, values, keys) for i, item in enumerate(node.value)]
