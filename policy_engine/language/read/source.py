"""Reading a policy: a file or a mapping -> a :class:`Document`, the format picked by the
file's extension. Everything downstream (schema, model) sees only dicts, lists and scalars;
the positions let every problem point at the file, line and column it came from.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from policy_engine.errors import Location, PolicyError
from policy_engine.language.read.document import (
    Document,
    PolicyFileError,
    check_root,
    shorten,
    to_plain,
    too_deep,
)
from policy_engine.language.read.json_reader import parse_json
from policy_engine.language.read.yaml_reader import parse_yaml

Format = Literal["yaml", "toml", "json"]
_FORMATS: dict[str, Format] = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
_MAX_BYTES = 16 * 1024 * 1024  # far above any policy
_NOT_REGULAR = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


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
    parse = {"yaml": parse_yaml, "json": parse_json, "toml": _parse_toml}.get(fmt)
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
    plain = to_plain(data, (), 0, lambda _path: Location(origin))
    return Document(check_root(plain, Location(origin)), origin)


def _parse_toml(text: str, origin: str) -> Document:
    from policy_engine.language.read.toml_reader import parse_toml  # tomllib: TOML policies only

    data, values, keys = parse_toml(text, origin)
    doc = Document({}, origin, values, keys)
    return attrs.evolve(doc, data=check_root(to_plain(data, (), 0, doc.locate), Location(origin)))


