"""Policy documents: a file, a mapping or an override turned into plain data plus positions.

Everything downstream (schema, compiler) sees only dicts, lists and scalars; the
positions let every problem point at the file, line and column it came from.
"""

from __future__ import annotations

import datetime
import json
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from policy_engine import _yaml
from policy_engine._toml import parse_toml
from policy_engine._yaml import PathKey, check_root, describe, parse_yaml, too_deep
from policy_engine.errors import Location, PolicyError, json_path

# Overrides live in policy_engine.overrides; the names imported "as" themselves are
# re-exported so that imports from this module keep working.
from policy_engine.overrides import ENV_OVERRIDES as ENV_OVERRIDES
from policy_engine.overrides import Override as Override
from policy_engine.overrides import _subpaths
from policy_engine.overrides import apply_overrides as apply_overrides
from policy_engine.overrides import overrides_from_env as overrides_from_env
from policy_engine.overrides import parse_override as parse_override

Format = Literal["yaml", "toml", "json"]
_FORMATS: dict[str, Format] = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
_MAX_BYTES = 16 * 1024 * 1024  # far above any policy; stops /dev/zero and friends


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
    """Read a policy file as UTF-8 text (BOM stripped), refusing binary and bad encodings."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as stream:
            raw = stream.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise PolicyFileError.single(
            f"cannot read {name}: {exc.strerror or exc}", Location(name)
        ) from None
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
    """Parse policy text in the given format; ``origin`` labels positions and errors."""
    text = text.removeprefix("\ufeff")
    if fmt == "yaml":
        return parse_yaml(text, origin)
    if not text.strip():
        raise PolicyError.single("the policy is empty", Location(origin))
    if fmt == "json":
        return _parse_json(text, origin)
    if fmt == "toml":
        return _parse_toml(text, origin)
    raise ValueError(f"unknown policy format {fmt!r}")


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


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_json(text: str, origin: str) -> Document:
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise PolicyError.single(exc.msg, Location(origin, exc.lineno, exc.colno)) from None
    except ValueError as exc:  # NaN / Infinity
        raise PolicyError.single(str(exc), Location(origin)) from None
    except RecursionError:
        raise too_deep(Location(origin), ()) from None
    except _DuplicateKey as exc:
        # json keeps no positions; the YAML composer reads JSON and reports where.
        try:
            _yaml.parse_yaml_value(text, origin)
        except PolicyError as located:
            duplicates = [p for p in located.problems if p.message.startswith("duplicate key")]
            if duplicates:
                raise PolicyError(duplicates) from None
        raise PolicyError.single(f"duplicate key {exc.args[0]!r}", Location(origin)) from None
    try:
        positions = _yaml.parse_yaml_value(text, origin)
        values, keys = positions.values, positions.keys
    except (PolicyError, ValueError, RecursionError):  # JSON that PyYAML reads differently
        values, keys = {}, {}
    doc = Document({}, origin, values, keys)
    plain = _plain(data, (), 0, doc.locate)
    return attrs.evolve(doc, data=check_root(plain, doc.locate(())))


def _parse_toml(text: str, origin: str) -> Document:
    data, values, keys = parse_toml(text, origin)
    doc = Document({}, origin, values, keys)
    return attrs.evolve(doc, data=check_root(_plain(data, (), 0, doc.locate), Location(origin)))


def _plain(value: Any, path: PathKey, depth: int, where: Callable[[PathKey], Location]) -> Any:
    """Deep-copy to dict/list/str/int/float/bool/None, refusing anything else."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (Mapping, Sequence)) and not isinstance(value, (bytes, bytearray)):
        if depth >= _yaml.MAX_DEPTH:
            raise too_deep(where(path), path)
        if isinstance(value, Sequence):
            return [_plain(item, (*path, i), depth + 1, where) for i, item in enumerate(value)]
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                plain = isinstance(key, (int, float))
                shown = f"{key!r} ({describe(key)})" if plain else describe(key)
                raise PolicyError.single(
                    f"keys must be strings, got {shown}", where(path), json_path(path)
                )
            out[key] = _plain(item, (*path, key), depth + 1, where)
        return out
    if isinstance(value, (datetime.date, datetime.time)):  # TOML's; datetime is a date
        raise PolicyError.single(
            f"key {json_path(path).removeprefix('$').removeprefix('.')!r} holds a date/time;"
            " policies have none (quote it to make a string)",
            where(path),
            json_path(path),
        )
    raise PolicyError.single(
        f"{type(value).__name__} values are not allowed in a policy", where(path), json_path(path)
    )


def load_policy_document(
    path: str | os.PathLike[str], overrides: Iterable[Override] = ()
) -> Document:
    """Read a policy file, resolve its ``extends`` chain, then apply ``overrides``."""
    return apply_overrides(_load_extended(os.fspath(path), ()), overrides)


def _load_extended(name: str, chain: tuple[tuple[str, str], ...]) -> Document:
    doc = read_document(name)
    if "extends" not in doc.data:
        return doc
    chain = (*chain, (os.path.realpath(name), name))
    merged: Document | None = None
    sources = [name]
    for target, at in _extends_targets(doc):
        base_name = os.path.normpath(os.path.join(os.path.dirname(name), target))
        real = os.path.realpath(base_name)
        seen = [real_name for real_name, _ in chain]
        if real in seen:
            names = [shown for _, shown in chain[seen.index(real) :]]
            raise PolicyError.single(
                "extends cycle: " + " -> ".join([*names, base_name]), doc.locate(at), json_path(at)
            )
        try:
            base = _load_extended(base_name, chain)
        except PolicyFileError as exc:  # the includer's mistake: point at its extends
            message = exc.problems[0].message
            raise PolicyError.single(message, doc.locate(at), json_path(at)) from None
        sources.extend(base.sources)
        merged = base if merged is None else _merge_documents(merged, base)
    own = attrs.evolve(doc, data={k: v for k, v in doc.data.items() if k != "extends"})
    result = own if merged is None else _merge_documents(merged, own)
    return attrs.evolve(result, origin=name, sources=tuple(dict.fromkeys(sources)))


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
