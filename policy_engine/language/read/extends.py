"""``extends``: a policy built on other policy files, merged deep (maps merge, the rest
replaces), each value keeping the position of the file it came from."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import attrs

from policy_engine.errors import Location, PolicyError, describe, json_path
from policy_engine.language.read.document import Document, PathKey, PolicyFileError
from policy_engine.language.read.overrides import Override, _subpaths, apply_overrides
from policy_engine.language.read.source import read_document

MAX_EXTENDS_DEPTH = 64
"""Longest chain of files a policy may build on (the policy, its base, its base's base...)."""


MAX_EXTENDS_FILES = 128
"""Most files one policy may read, counting a base each time some file names it."""


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
