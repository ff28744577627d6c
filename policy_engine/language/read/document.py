"""A policy document: plain data, where it came from, where each value was written, and
the limits every reader holds it to."""

from __future__ import annotations

import datetime
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import attrs

from policy_engine.errors import Location, PolicyError, describe, json_path

PathKey = tuple[str | int, ...]


MAX_DEPTH = 64
"""Deepest nesting of lists and mappings a policy may have (real ones use about 6)."""


MAX_NODES = 100_000
"""Most values a policy may hold once aliases are expanded (stops alias bombs)."""


INT_LIMIT = 2**63
"""Integers in a policy are below this in absolute value (18 digits are plenty)."""


TOO_MANY = (
    f"the policy holds more than {MAX_NODES} values once aliases are expanded; refusing to build it"
)


LONE_SURROGATE = "a lone surrogate (\\ud800-\\udfff) is not a character; write UTF-8 text"


SURROGATE = re.compile(r"[\ud800-\udfff]")


def check_root(value: object, location: Location, present: bool = True) -> dict[str, Any]:
    """Refuse a policy that is empty or not a mapping; return it typed as a mapping."""
    if not present or value is None or value == {}:
        raise PolicyError.single("the policy is empty", location)
    if not isinstance(value, dict):
        raise PolicyError.single(f"the policy must be a mapping, got {describe(value)}", location)
    return value


def too_deep(location: Location, path: PathKey) -> PolicyError:
    """The error for nesting beyond MAX_DEPTH (shared with the JSON and TOML readers)."""
    message = f"nesting is deeper than {MAX_DEPTH} levels"
    return PolicyError.single(message, location, json_path(path))


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate, which no encoder accepts (nor can print)."""
    return SURROGATE.search(text) is not None


def int_too_large(digits: int) -> str:
    """The message for an integer of ``digits`` digits at or beyond INT_LIMIT."""
    return f"integer too large: {digits} digits (a policy's numbers are below 2**63)"


def shorten(text: str, limit: int = 60) -> str:
    """User text to quote in a message, cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PolicyFileError(PolicyError):
    """The policy file cannot be read at all (missing, a folder, no permission, bad name)."""


@attrs.frozen
class Document:
    """A loaded policy: plain data, where it came from, and where each value was written.

    ``values`` maps the path of a value to its position; ``keys`` maps the same path
    to the position of the mapping key that names it. ``sources`` lists the files
    read to build it, the top file first (``extends`` adds more).
    """

    data: dict[str, Any]
    origin: str
    values: Mapping[PathKey, Location] = attrs.field(factory=dict)
    keys: Mapping[PathKey, Location] = attrs.field(factory=dict)
    sources: tuple[str, ...] = ()

    def locate(self, path: Sequence[str | int], *, key: bool = False) -> Location:
        """Position of the value at ``path`` (of its key with ``key=True``), else of the
        nearest ancestor that has one, else the document's origin."""
        here = tuple(path)
        while True:
            found = (key and self.keys.get(here)) or self.values.get(here)
            if found:
                return found
            if not here:
                return Location(self.origin)
            here = here[:-1]


def to_plain(value: Any, path: PathKey, depth: int, where: Callable[[PathKey], Location]) -> Any:
    """Deep-copy to dict/list/str/int/float/bool/None, refusing anything else.

    The rules of YAML policies hold: nesting up to MAX_DEPTH, at most MAX_NODES values
    (keys count), integers below INT_LIMIT, strings of proper Unicode.
    """
    return _Plain(where).copy(value, path, depth)


@attrs.define
class _Plain:
    where: Callable[[PathKey], Location]
    nodes: int = 0

    def copy(self, value: Any, path: PathKey, depth: int) -> Any:
        self.count(path)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            self.check_text(value, path)
            return value
        if isinstance(value, numbers.Integral):
            number = int(value)
            if abs(number) >= INT_LIMIT:
                self.fail(int_too_large(_digits(number)), path)
            return number
        if isinstance(value, numbers.Real):
            try:
                return float(value)
            except (OverflowError, ValueError):
                self.fail(f"{type(value).__name__} value out of a float's range", path)
        if isinstance(value, (Mapping, Sequence)) and not isinstance(value, (bytes, bytearray)):
            if depth >= MAX_DEPTH:
                raise too_deep(self.where(path), path)
            if isinstance(value, Sequence):
                return [self.copy(item, (*path, i), depth + 1) for i, item in enumerate(value)]
            out: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    plain = isinstance(key, (int, float))
                    shown = f"{shorten(repr(key))} ({describe(key)})" if plain else describe(key)
                    self.fail(f"keys must be strings, got {shown}", path)
                self.check_text(key, path)
                self.count(path)
                out[key] = self.copy(item, (*path, key), depth + 1)
            return out
        if isinstance(value, (datetime.date, datetime.time)):  # TOML's; datetime is a date
            self.fail(
                f"key {json_path(path).removeprefix('$').removeprefix('.')!r} holds a date/time;"
                " policies have none (quote it to make a string)",
                path,
            )
        self.fail(f"{type(value).__name__} values are not allowed in a policy", path)

    def count(self, path: PathKey) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.fail(TOO_MANY, path)

    def check_text(self, text: str, path: PathKey) -> None:
        if has_surrogate(text):
            self.fail(LONE_SURROGATE, path)

    def fail(self, message: str, path: PathKey) -> NoReturn:
        raise PolicyError.single(message, self.where(path), json_path(path))


def _digits(number: int) -> int:
    """How many decimal digits ``number`` has, without writing out a huge one."""
    size = abs(number)
    if size.bit_length() <= 14_000:  # about 4200 digits: within Python's limit for str()
        return len(str(size))
    return int(size.bit_length() * 0.30103) + 1  # log10(2); may be one too many
