"""Policy documents: a file, a mapping or an override turned into plain data plus positions.

Everything downstream (schema, compiler) sees only dicts, lists and scalars; the
positions let every problem point at the file, line and column it came from.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import numbers
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NoReturn

import attrs

from policy_engine.errors import Location, PolicyError, json_path
from policy_engine.language import yaml_reader as _yaml

# Overrides live in policy_engine.overrides; the names imported "as" themselves are
# re-exported so that imports from this module keep working.
from policy_engine.language.overrides import ENV_OVERRIDES as ENV_OVERRIDES
from policy_engine.language.overrides import Override as Override
from policy_engine.language.overrides import _subpaths
from policy_engine.language.overrides import apply_overrides as apply_overrides
from policy_engine.language.overrides import overrides_from_env as overrides_from_env
from policy_engine.language.overrides import parse_override as parse_override
from policy_engine.language.toml_reader import parse_toml
from policy_engine.language.yaml_reader import (
    INT_LIMIT,
    LONE_SURROGATE,
    TOO_MANY,
    PathKey,
    check_root,
    describe,
    has_surrogate,
    int_too_large,
    parse_yaml,
    shorten,
    too_deep,
)

Format = Literal["yaml", "toml", "json"]
_FORMATS: dict[str, Format] = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
_MAX_BYTES = 16 * 1024 * 1024  # far above any policy
MAX_EXTENDS_DEPTH = 64
"""Longest chain of files a policy may build on (the policy, its base, its base's base...)."""
MAX_EXTENDS_FILES = 128
"""Most files one policy may read, counting a base each time some file names it."""
_NOT_REGULAR = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
# JSON's tokens that json reports no position for: numbers and NaN/Infinity (strings
# are matched only to be skipped)
_JSON_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|NaN|-?Infinity|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?'
)


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


def read_text(path: str | os.PathLike[str]) -> str:
    """Read a policy file as UTF-8 text (BOM stripped), refusing binary and bad encodings.

    Only regular files are read: a named pipe, a device or a socket is refused without
    waiting on it (see :func:`_read_regular`).
    """
    name = os.fspath(path)
    try:
        raw = _read_regular(name)
    except OSError as exc:
        raise PolicyFileError.single(
            f"cannot read {name}: {exc.strerror or exc}", Location(name)
        ) from None
    except ValueError as exc:  # a NUL character in the name, or a lone surrogate
        raise PolicyFileError.single(f"cannot read {name!r}: {exc}", Location(name)) from None
    if len(raw) > _MAX_BYTES:
        raise PolicyError.single(
            f"file is larger than {_MAX_BYTES >> 20} MiB, not a policy", Location(name)
        )
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise PolicyError.single("UTF-16 file; save the policy as UTF-8", Location(name))
    if b"\0" in raw:
        raise PolicyError.single("binary file, not a policy", Location(name))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        column = len(raw[line_start : exc.start].decode("utf-8")) + 1
        where = Location(name, raw.count(b"\n", 0, exc.start) + 1, column)
        raise PolicyError.single(f"invalid UTF-8 (byte 0x{raw[exc.start]:02x})", where) from None
    return text.removeprefix("\ufeff")


def _read_regular(name: str) -> bytes:
    """The first bytes of a regular file, never blocking on what is not one.

    ``stat`` refuses a pipe or a device before it is opened (opening some devices acts
    on them); the descriptor is opened non-blocking and checked again, in case the
    name was swapped in between.
    """
    with contextlib.suppress(OSError):  # opening says why, in the same words as for any file
        _require_regular(os.stat(name), name)
    with open(name, "rb", opener=_open_nonblocking) as stream:
        _require_regular(os.fstat(stream.fileno()), name)
        return stream.read(_MAX_BYTES + 1)


def _open_nonblocking(name: str, flags: int) -> int:
    return os.open(name, flags | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))


def _require_regular(status: os.stat_result, name: str) -> None:
    if stat.S_ISDIR(status.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    if not stat.S_ISREG(status.st_mode):
        kind = _NOT_REGULAR.get(stat.S_IFMT(status.st_mode), "not a file")
        raise PolicyFileError.single(f"not a regular file: {name} ({kind})", Location(name))


def read_document(path: str | os.PathLike[str]) -> Document:
    """Read and parse one policy file, the format picked by its extension."""
    name = os.fspath(path)
    fmt = _FORMATS.get(os.path.splitext(name)[1].lower())
    if fmt is None:
        ext = os.path.splitext(name)[1] or "(none)"
        raise PolicyFileError.single(
            f"unsupported extension {ext} (use .yaml, .yml, .toml or .json)", Location(name)
        )
    return attrs.evolve(parse_document(read_text(name), name, fmt), sources=(name,))


def parse_document(text: str, origin: str, fmt: Format) -> Document:
    """Parse policy text in the given format; ``origin`` labels positions and errors.

    Whatever the text holds, the only error raised is :class:`PolicyError`.
    """
    parse = {"yaml": parse_yaml, "json": _parse_json, "toml": _parse_toml}.get(fmt)
    if parse is None:
        raise ValueError(f"unknown policy format {fmt!r}")
    text = text.removeprefix("\ufeff")
    if fmt != "yaml" and not text.strip():
        raise PolicyError.single("the policy is empty", Location(origin))
    try:
        return parse(text, origin)
    except RecursionError:  # every reader bounds nesting first; this is a last resort
        raise too_deep(Location(origin), ()) from None
    except (ValueError, OverflowError) as exc:  # UnicodeError is a ValueError
        message = f"cannot read the policy: {shorten(str(exc))}"
        raise PolicyError.single(message, Location(origin)) from None


def document_from_mapping(data: Mapping[str, Any], origin: str = "<mapping>") -> Document:
    """Wrap a policy given as a Python mapping (a dict, an OmegaConf DictConfig, ...)."""
    plain = _plain(data, (), 0, lambda _path: Location(origin))
    return Document(check_root(plain, Location(origin)), origin)


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


def _parse_json(text: str, origin: str) -> Document:
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
        plain = _plain(data, (), 0, doc.locate)
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


def _parse_toml(text: str, origin: str) -> Document:
    data, values, keys = parse_toml(text, origin)
    doc = Document({}, origin, values, keys)
    return attrs.evolve(doc, data=check_root(_plain(data, (), 0, doc.locate), Location(origin)))


def _plain(value: Any, path: PathKey, depth: int, where: Callable[[PathKey], Location]) -> Any:
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
            if depth >= _yaml.MAX_DEPTH:
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
        if self.nodes > _yaml.MAX_NODES:
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


def load_policy_document(
    path: str | os.PathLike[str], overrides: Iterable[Override] = ()
) -> Document:
    """Read a policy file, resolve its ``extends`` chain, then apply ``overrides``.

    A chain holds at most MAX_EXTENDS_DEPTH files and the whole policy at most
    MAX_EXTENDS_FILES; the ``extends`` value that would pass either is the error.
    """
    return apply_overrides(_load_extended(os.fspath(path), (), _Count()), overrides)


@attrs.define
class _Count:
    """Files read so far for one policy, shared by every level of its ``extends``."""

    files: int = 0


def _load_extended(name: str, chain: tuple[tuple[str, str], ...], read: _Count) -> Document:
    """``name`` merged over its bases; ``chain``: the files that include it, outermost first."""
    doc = read_document(name)
    read.files += 1
    if "extends" not in doc.data:
        return doc
    chain = (*chain, (_real(name), name))
    merged: Document | None = None
    sources = [name]
    for target, at in _extends_targets(doc):
        base_name = os.path.normpath(os.path.join(os.path.dirname(name), target))
        real = _real(base_name)
        seen = [real_name for real_name, _ in chain]
        if real in seen:
            names = [shown for _, shown in chain[seen.index(real) :]]
            raise PolicyError.single(
                "extends cycle: " + " -> ".join([*names, base_name]), doc.locate(at), json_path(at)
            )
        problem = _extends_limit(chain, base_name, read.files)
        if problem:
            raise PolicyError.single(problem, doc.locate(at), json_path(at))
        try:
            base = _load_extended(base_name, chain, read)
        except PolicyFileError as exc:  # the includer's mistake: point at its extends
            message = exc.problems[0].message
            raise PolicyError.single(message, doc.locate(at), json_path(at)) from None
        sources.extend(base.sources)
        merged = base if merged is None else _merge_documents(merged, base)
    own = attrs.evolve(doc, data={k: v for k, v in doc.data.items() if k != "extends"})
    result = own if merged is None else _merge_documents(merged, own)
    return attrs.evolve(result, origin=name, sources=tuple(dict.fromkeys(sources)))


def _real(name: str) -> str:
    """The file's real path for finding cycles; a name the system refuses stays as it is
    (reading it says why)."""
    try:
        return os.path.realpath(name)
    except (OSError, ValueError):
        return os.path.abspath(name)


def _extends_limit(chain: tuple[tuple[str, str], ...], base_name: str, read: int) -> str | None:
    if len(chain) >= MAX_EXTENDS_DEPTH:
        names = [*(shown for _, shown in chain), base_name]
        shown = " -> ".join([*names[:2], "...", *names[-2:]])
        return f"extends chain is longer than {MAX_EXTENDS_DEPTH} files: {shown}"
    if read >= MAX_EXTENDS_FILES:
        return f"extends reads more than {MAX_EXTENDS_FILES} files in all"
    return None


def _extends_targets(doc: Document) -> list[tuple[str, PathKey]]:
    value = doc.data["extends"]
    if isinstance(value, str) and value:
        return [(value, ("extends",))]
    if isinstance(value, list) and all(isinstance(item, str) and item for item in value):
        return [(item, ("extends", i)) for i, item in enumerate(value)]
    raise PolicyError.single(
        f"extends must be a file name or a list of file names, got {describe(value)}",
        doc.locate(("extends",)),
        "$.extends",
    )


def _merge_documents(base: Document, top: Document) -> Document:
    """Deep-merge ``top`` over ``base``: maps merge, everything else replaces."""
    values: dict[PathKey, Location] = {}
    keys: dict[PathKey, Location] = {}

    def take(doc: Document, path: PathKey, value: Any) -> Any:
        # Each value keeps the positions of the file it came from.
        for sub in _subpaths(value, path):
            if sub in doc.values:
                values[sub] = doc.values[sub]
            if sub in doc.keys:
                keys[sub] = doc.keys[sub]
        return value

    def merge(old: Any, new: Any, path: PathKey) -> Any:
        if not (isinstance(old, dict) and isinstance(new, dict)):
            return take(top, path, new)
        take(top, path, None)  # the mapping itself is where the including file has it
        out = {
            k: merge(v, new[k], (*path, k)) if k in new else take(base, (*path, k), v)
            for k, v in old.items()
        }
        out.update((k, take(top, (*path, k), v)) for k, v in new.items() if k not in old)
        return out

    return attrs.evolve(top, data=merge(base.data, top.data, ()), values=values, keys=keys)
