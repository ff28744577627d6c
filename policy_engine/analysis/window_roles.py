"""Which roles a trace line belongs to, and which lines of the ranks make one window.

Colocated roles share a capture, named after their whole ``colocate`` group on every rank;
which of them took part is the manifest's ``roles``, and it may differ from rank to rank
(verl's rollout profiles rank 0 only: ``[actor, ref, rollout]`` there, ``[actor, ref]``
on the other ranks). So ``merge``, ``report`` and ``analyze`` key a window on its
*family*: the roles of every line that shares a role with it, which is the group as the
traces' names show it. ``--role R`` selects the lines whose roles hold R.

Manifests written before ``roles`` existed name a shared capture's roles in ``role``
(``actor+ref``); those are split at ``+``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any, Protocol


class Record(Protocol):
    """A trace line as these functions read it: a dict (a TypedDict too), or anything
    with its ``get`` of one key."""

    def get(self, key: str, /) -> Any: ...


def _names(value: Any) -> list[str]:
    """A manifest's list of role names (anything else, from a damaged line: none)."""
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def participants(record: Record) -> tuple[str, ...]:
    """The roles that took part in the capture of ``record`` on its rank: those recorded
    (``roles``) and any that joined it undeclared, in that order."""
    found = (record.get("role"), record.get("roles"), record.get("joined"))
    if type(found[0]) in _KEYED and type(found[1]) in _KEYED and type(found[2]) in _KEYED:
        return _participants(found)  # the same few on every rank's line, held as tuples
    return _participants.__wrapped__(found)


# What a record's role, roles and joined are to be kept by: text and tuples (shared by the
# readers); a list (a record as JSON has it) is read each time.
_KEYED = frozenset((str, tuple, type(None)))


@functools.lru_cache(maxsize=1024)
def _participants(found: tuple[Any, Any, Any]) -> tuple[str, ...]:
    role, roles, joined = found
    declared = _names(roles)
    if not declared:
        declared = str(role).split("+")
    return tuple(dict.fromkeys(declared + _names(joined)))


def label(record: Record) -> str:
    """``actor+ref``: :func:`participants` as ``traces`` shows them."""
    return "+".join(participants(record))


def holds(record: Record, role: str) -> bool:
    """Whether the capture of ``record`` holds ``role`` (``a+b``: both of them)."""
    found = participants(record)
    return all(part in found for part in role.split("+"))


def families(records: Iterable[Record]) -> dict[str, str]:
    """For each :func:`label` among ``records``, its window family's label: the labels
    that share a role, joined (a role lives in one process group, so they are one group).
    Its roles come in the order of the longest label that holds them, then the others'."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    labels: dict[str, tuple[str, ...]] = {}
    for record in records:
        found = participants(record)
        labels.setdefault("+".join(found), found)
    for found in labels.values():
        for name in found:
            parent.setdefault(name, name)
        for name in found[1:]:
            parent[root(name)] = root(found[0])
    members: dict[str, list[str]] = {}
    for text in sorted(labels, key=lambda t: (-len(labels[t]), t)):
        order = members.setdefault(root(labels[text][0]), [])
        order.extend(name for name in labels[text] if name not in order)
    return {text: "+".join(members[root(found[0])]) for text, found in labels.items()}


#: The file endings of a torch trace.
TORCH_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


#: The ending of torch_npu's folder of one capture (the mstx backend's trace).
ASCEND_SUFFIX = "_ascend_pt"


def is_analysed(record: Record) -> bool:
    """Whether ``analyze`` reads the file a trace line names: a torch trace, or an Ascend
    capture (torch_npu's folder)."""
    path = record.get("path")
    return is_torch(record) or (isinstance(path, str) and path.endswith(ASCEND_SUFFIX))


def is_torch(record: Record) -> bool:
    """Whether a trace line names a torch trace (its backend, or its file's ending)."""
    path = record.get("path")
    return record.get("backend") == "torch" or (
        isinstance(path, str) and path.endswith(TORCH_SUFFIXES))


def window_keys(records: Sequence[Record]) -> list[tuple[Any, ...]]:
    """The window of each trace line of ``records`` (oldest first), as ``merge`` and
    ``analyze`` both key it: (family, region, outer steps, cycle, n), n counting the
    captures of the same steps and cycle on the same rank and backend (a region or a rerun
    that captured them again)."""
    family = families(records)
    nth: dict[tuple[Any, ...], int] = {}
    keys = []
    for r in records:
        key = (family[label(r)], r.get("region"), tuple(r.get("steps") or ()), r.get("cycle"))
        who = (*key, r.get("rank"), repr(r.get("backend")), is_torch(r))
        nth[who] = nth.get(who, 0) + 1
        keys.append((*key, nth[who]))
    return keys
