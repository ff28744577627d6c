"""TOML: text -> data, plus best-effort positions (TOML parsers keep none).

The position scanner finds table headers and ``key =`` lines, which is where nearly
every value of a policy sits. Values inside inline tables and arrays have no entry
of their own; ``Document.locate`` falls back to their parent's position.

The scanner runs before tomllib and refuses what tomllib handles badly: keys and
brackets nested past ``MAX_DEPTH`` (tomllib recurses once per bracket, and its work
grows with the square of a dotted key's length), more than ``MAX_NODES`` keys and
values (it is slow), and integers of 2**63 or more (Python will not even convert
one of more than 4300 digits).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from policy_engine.errors import Location, PolicyError, json_path
from policy_engine.language.read.document import (
    INT_LIMIT,
    MAX_DEPTH,
    MAX_NODES,
    TOO_MANY,
    PathKey,
    int_too_large,
    shorten,
    too_deep,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

Positions = dict[PathKey, Location]

_ERROR_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")
_KEY_PART = re.compile(r"""[ \t]*(?:([A-Za-z0-9_-]+)|("(?:[^"\\]|\\.)*")|'([^']*)')[ \t]*""")
_BLANK = re.compile(r"[ \t]*")
_PLAIN = re.compile(r"[^\"'#\[\]{},= \t]+")  # a bare value or a stray token: skipped whole
_INTEGER = re.compile(r"[+-]?(?:0x[0-9A-Fa-f_]+|0o[0-7_]+|0b[01_]+|[0-9_]+)(?![0-9A-Za-z_.:+-])")
_BASES = {"0x": 16, "0o": 8, "0b": 2}
_LONGEST_INT = 100  # significant digits converted to check the value; more is too large


def parse_toml(text: str, origin: str) -> tuple[dict[str, Any], Positions, Positions]:
    """Parse TOML text; return its data and the positions of values and keys by path."""
    values, keys = _positions(text, origin)  # raises first on what tomllib handles badly
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
    except RecursionError:  # the scanner bounds brackets; this is the last line of defence
        raise too_deep(Location(origin), ()) from None
    except ValueError as exc:  # an integer Python will not convert, which the scanner missed
        raise PolicyError.single(shorten(str(exc)), Location(origin)) from None
    return data, values, keys


class _Scan:
    """What carries over from one line to the next: open brackets and an open string.

    Each open bracket keeps the depth of the collection it opened (the root table is
    at depth 0), so that nesting is refused where it passes MAX_DEPTH.
    """

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.number = 0  # the line being read
        self.string = ""  # the closing quotes of an open multi-line string
        self.brackets: list[tuple[str, int]] = []
        self.path: PathKey = ()  # the key whose value is being read, for messages
        self.depth = 0  # the depth a value starting now has
        self.expect = ""  # "value", "key" (in an inline table) or "" (neither)
        self.nodes = 0  # keys and values so far

    def count(self, nodes: int, column: int) -> None:
        """Count keys and values; refuse more than MAX_NODES (tomllib is slow with many)."""
        self.nodes += nodes
        if self.nodes > MAX_NODES:
            raise PolicyError.single(TOO_MANY, self.at(column), json_path(self.path))

    def busy(self) -> bool:
        return bool(self.brackets) or bool(self.string)

    def at(self, column: int) -> Location:
        return Location(self.origin, self.number, column + 1)

    def value(self, line: str, pos: int, path: PathKey) -> None:
        """Read the value that starts at ``pos`` (after ``key =``) and what follows it."""
        self.path, self.depth, self.expect = path, len(path), "value"
        self.skip_value(line, pos)

    def skip_value(self, line: str, pos: int) -> None:
        while pos < len(line):
            if self.string:  # inside a multi-line string only its closing quotes matter
                end = line.find(self.string, pos)
                if end < 0:
                    return
                pos, self.string = end + 3, ""
                continue
            pos = _end(_BLANK, line, pos)
            if pos >= len(line) or line[pos] == "#":
                return
            char, expect = line[pos], self.expect
            self.expect = ""
            if expect == "key" and char not in "},":
                parts, pos = _key(line, pos)
                if not parts:  # not a key: tomllib says what is wrong
                    pos += 1
                    continue
                _check_key(parts, self.depth, self.path, self)
                self.count(len(parts), pos)
                self.depth += len(parts)
                continue
            if expect == "value":
                self.count(1, pos)
                self._check_number(line, pos)
            if line.startswith(('"""', "'''"), pos):
                self.string, pos = line[pos : pos + 3], pos + 3
                continue
            pos += 1
            if char in "\"'":
                while pos < len(line) and line[pos] != char:
                    pos += 2 if char == '"' and line[pos] == "\\" else 1
                pos += 1
            elif char in "[{":
                if self.depth >= MAX_DEPTH:
                    raise too_deep(self.at(pos - 1), self.path)
                self.brackets.append((char, self.depth))
                self._entry(char)
            elif char in "]}":
                if self.brackets:
                    self.depth = self.brackets.pop()[1]
            elif char == ",":
                if self.brackets:
                    self.depth = self.brackets[-1][1]
                    self._entry(self.brackets[-1][0])
            elif char == "=":
                self.expect = "value"
            else:
                pos = _end(_PLAIN, line, pos)

    def _entry(self, bracket: str) -> None:
        """Get ready for the next entry of the array or inline table that ``bracket`` opened."""
        if bracket == "[":
            self.depth, self.expect = self.depth + 1, "value"
        else:  # an inline table: a key comes first, and its parts add levels
            self.expect = "key"

    def _check_number(self, line: str, pos: int) -> None:
        found = _INTEGER.match(line, pos)
        if not found:
            return
        text = found.group().replace("_", "").lstrip("+-")
        base = _BASES.get(text[:2].lower(), 10)
        digits = (text[2:] if base != 10 else text).lstrip("0")
        if len(digits) > _LONGEST_INT:  # far past the limit in any base: not even converted
            size = len(digits)
        elif digits and (value := int(digits, base)) >= INT_LIMIT:
            size = len(str(value))
        else:
            return
        raise PolicyError.single(int_too_large(size), self.at(pos), json_path(self.path))


def _end(pattern: re.Pattern[str], line: str, pos: int) -> int:
    """Where a run of ``pattern`` that starts at ``pos`` ends."""
    found = pattern.match(line, pos)
    return found.end() if found else pos


def _check_key(parts: list[tuple[str, int]], depth: int, path: PathKey, scan: _Scan) -> None:
    """Refuse a dotted key whose tables would nest past MAX_DEPTH.

    ``depth`` is the depth of the table the key is in: a key of n parts opens n - 1
    tables below it, the last part names the value.
    """
    for i in range(1, len(parts)):
        if depth + i >= MAX_DEPTH:
            name_path = (*path, *(name for name, _ in parts[:i]))
            raise too_deep(scan.at(parts[i - 1][1]), name_path)


def _key(line: str, pos: int) -> tuple[list[tuple[str, int]], int]:
    """Read a dotted key at ``pos``: its parts with their 0-based columns, and where it ends.

    Reading stops a part past MAX_DEPTH: a longer key is refused anyway.
    """
    parts: list[tuple[str, int]] = []
    while len(parts) <= MAX_DEPTH and (match := _KEY_PART.match(line, pos)):
        bare, basic, literal = match.groups()
        name = bare or literal or ""
        if basic is not None:  # let tomllib undo the escapes
            try:
                name = next(iter(tomllib.loads(f"{basic} = 0")))
            except tomllib.TOMLDecodeError:  # a bad escape: tomllib reports it later
                name = basic[1:-1]
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
    scan = _Scan(origin)
    for number, line in enumerate(text.splitlines(), 1):
        scan.number = number
        if scan.busy():
            scan.skip_value(line, 0)
            continue
        start = len(line) - len(line.lstrip())
        here = Location(origin, number, start + 1)
        if () not in values and line[start:] and not line.startswith("#", start):
            values[()] = here  # the root table: where the text starts
        if line.startswith("[", start):
            double = line.startswith("[[", start)
            parts, _ = _key(line, start + (2 if double else 1))
            scan.count(len(parts), start)
            path: PathKey = ()
            for i, (name, column) in enumerate(parts):
                path = (*path, name)
                keys.setdefault(path, Location(origin, number, column + 1))
                values.setdefault(path, here)
                if path in arrays and not (double and i == len(parts) - 1):
                    path = (*path, arrays[path] - 1)  # a header inside the latest element
                if len(path) >= MAX_DEPTH:  # the table's depth
                    raise too_deep(Location(origin, number, column + 1), path)
            if double:
                arrays[path] = arrays.get(path, 0) + 1
                path = (*path, arrays[path] - 1)
                if len(path) >= MAX_DEPTH:
                    raise too_deep(here, path)
            values[path] = here
            table = path
            continue
        parts, pos = _key(line, start)
        _check_key(parts, len(table), table, scan)
        scan.count(len(parts), start)
        if not parts or not line.startswith("=", pos):
            continue
        path = table
        for name, column in parts:
            path = (*path, name)
            keys.setdefault(path, Location(origin, number, column + 1))
            values.setdefault(path, Location(origin, number, column + 1))
        value_at = len(line) - len(line[pos + 1 :].lstrip())
        values[path] = Location(origin, number, value_at + 1)
        scan.value(line, value_at, path)
    return values, keys
