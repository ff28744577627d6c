"""Whether the schema file a policy points editors at is there.

Editors find the schema through a line of the policy: ``# yaml-language-server:
$schema=PATH`` (YAML), ``#:schema PATH`` (TOML), or a ``$schema`` key (any format). The
engine itself ignores them, but a policy copied out of its folder keeps a relative path
that no longer resolves, and the editor then checks nothing without a word. validate
says so, as a warning, with the command that writes the file there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from policy_engine.errors import Location, Problem, json_path
from policy_engine.language.read.document import Document
from policy_engine.language.schema.build import SCHEMA_NAME

#: ``# yaml-language-server: $schema=PATH`` and Taplo's ``#:schema PATH`` (TOML).
_LINE = re.compile(r"^\s*#\s*(?:yaml-language-server:\s*\$schema=|:schema\s+)(\S+)")
#: How much of a policy is searched for that line (editors read it near the top).
_HEAD_BYTES = 64 << 10


def _lines(source: str) -> Iterator[tuple[int, int, str]]:
    """(line, column, path) of each schema line at the head of ``source``."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        head = os.read(fd, _HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return
    finally:
        os.close(fd)
    for number, text in enumerate(head.splitlines(), 1):
        found = _LINE.match(text)
        if found:
            yield number, found.start(1) + 1, found.group(1)


def _local(target: str) -> bool:
    """Whether ``target`` names a file here (not a URL an editor fetches)."""
    return "://" not in target and not target.startswith(("urn:", "data:"))


def _missing(target: str, source: str) -> str | None:
    """The path ``target`` resolves to from ``source``'s folder, when no file is there."""
    if target.startswith("file://"):
        target = target[len("file://"):]
    elif not _local(target):
        return None
    full = os.path.normpath(os.path.join(os.path.dirname(source), os.path.expanduser(target)))
    return None if os.path.isfile(full) else full


def _problem(target: str, full: str, where: Location, path: str = "$") -> Problem:
    if os.path.isdir(os.path.dirname(full) or "."):
        fix = f"write it there with `policy-engine schema > {full}`"
    else:
        beside = os.path.join(os.path.dirname(where.origin), SCHEMA_NAME)
        fix = (f"write one beside the policy with `policy-engine schema > {beside}` and "
               f"point $schema at ./{SCHEMA_NAME} (as `policy-engine init` does)")
    return Problem(f"$schema {target} names no file (looked for {full}): editors cannot "
                   f"check this policy as you type; {fix}", path, where, "warning")


def schema_problems(doc: Document) -> list[Problem]:
    """A warning for each schema reference in ``doc``'s files that names a missing file."""
    problems: list[Problem] = []
    for source in doc.sources:
        for line, column, target in _lines(source):
            full = _missing(target, source)
            if full is not None:
                problems.append(_problem(target, full, Location(source, line, column)))
    key = doc.data.get("$schema")
    if isinstance(key, str) and doc.sources:
        where = doc.locate(("$schema",))
        source = where.origin if where.origin in doc.sources else doc.sources[0]
        full = _missing(key, source)
        if full is not None:
            problems.append(_problem(key, full, where, json_path(("$schema",))))
    return problems
