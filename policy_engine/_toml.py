"""TOML: text -> data, plus best-effort positions (TOML parsers keep none).

The position scanner finds table headers and ``key =`` lines, which is where nearly
every value of a policy sits. Values inside inline tables and arrays have no entry
of their own; ``Document.locate`` falls back to their parent's position.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from policy_engine._yaml import PathKey
from policy_engine.errors import Location, PolicyError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

Positions = dict[PathKey, Location]

_ERROR_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")
_KEY_PART = re.compile(r"""[ \t]*(?:([A-Za-z0-9_-]+)|("(?:[^"\\]|\\.)*")|'([^']*)')[ \t]*""")


def parse_toml(text: str, origin: str) -> tuple[dict[str, Any], Positions, Positions]:
    """Parse TOML text; return its data and the positions of values and keys by path."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib (before 3.14) puts the position only in its message: "... (at line 3, column 9)"
        message = str(exc)
        found = _ERROR_AT.search(message)
        if found is None:
            raise PolicyError.single(message, Location(origin)) from None
        if found.group(1):
            where = Location(origin, int(found.group(1)), int(found.group(2)))
        else:
            last_line = text.rsplit("\n", 1)[-1]
            where = Location(origin, text.count("\n") + 1, len(last_line) + 1)
        raise PolicyError.single(message[: found.start()], where) from None
    values, keys = _positions(text, origin)
    return data, values, keys


class _Scan:
    """What carries over from one line to the next: open brackets and an open string."""

    def __init__(self) -> None:
        self.depth = 0
        self.string = ""  # the closing quotes of an open multi-line string

    def busy(self) -> bool:
        return self.depth > 0 or bool(self.string)

    def skip_value(self, line: str, pos: int) -> None:
        while pos < len(line):
            if self.string:  # inside a multi-line string only its closing quotes matter
                end = line.find(self.string, pos)
                if end < 0:
                    return
                pos, self.string = end + 3, ""
                continue
            char = line[pos]
            if char == "#":
                return
            if line.startswith(('"""', "'''"), pos):
                self.string, pos = line[pos : pos + 3], pos + 3
                continue
            if char in "\"'":
                pos += 1
                while pos < len(line) and line[pos] != char:
                    pos += 2 if char == '"' and line[pos] == "\\" else 1
            elif char in "[{":
                self.depth += 1
            elif char in "]}":
                self.depth -= 1
            pos += 1


def _key(line: str, pos: int) -> tuple[list[tuple[str, int]], int]:
    """Read a dotted key at ``pos``: its parts with their 0-based columns, and where it ends."""
    parts: list[tuple[str, int]] = []
    while match := _KEY_PART.match(line, pos):
        bare, basic, literal = match.groups()
        name = bare or literal or ""
        if basic is not None:  # let tomllib undo the escapes
            name = next(iter(tomllib.loads(f"{basic} = 0")))
        text = match.group()
        parts.append((name, match.start() + len(text) - len(text.lstrip())))
        pos = match.end()
        if not line.startswith(".", pos):
            break
        pos += 1
    return parts, pos


def _positions(text: str, origin: str) -> tuple[Positions, Positions]:
    values: Positions = {}
    keys: Positions = {}
    arrays: dict[PathKey, int] = {}  # array-of-tables path -> elements so far
    table: PathKey = ()
    scan = _Scan()
    for number, line in enumerate(text.splitlines(), 1):
        if scan.busy():
            scan.skip_value(line, 0)
            continue
        start = len(line) - len(line.lstrip())
        here = Location(origin, number, start + 1)
        if line.startswith("[", start):
            double = line.startswith("[[", start)
            parts, _ = _key(line, start + (2 if double else 1))
            path: PathKey = ()
            for i, (name, column) in enumerate(parts):
                path = (*path, name)
                keys.setdefault(path, Location(origin, number, column + 1))
                values.setdefault(path, here)
                if path in arrays and not (double and i == len(parts) - 1):
                    path = (*path, arrays[path] - 1)  # a header inside the latest element
            if double:
                arrays[path] = arrays.get(path, 0) + 1
                path = (*path, arrays[path] - 1)
            values[path] = here
            table = path
            continue
        parts, pos = _key(line, start)
        if not parts or not line.startswith("=", pos):
            continue
        path = table
        for name, column in parts:
            path = (*path, name)
            keys.setdefault(path, Location(origin, number, column + 1))
            values.setdefault(path, Location(origin, number, column + 1))
        value_at = len(line) - len(line[pos + 1 :].lstrip())
        values[path] = Location(origin, number, value_at + 1)
        scan.skip_value(line, value_at)
    return values, keys
