"""Shared by the ``steps`` and ``ranks`` parsers: the error they raise and small type helpers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

Path = tuple[str | int, ...]


class SelectorError(ValueError):
    """A malformed ``steps`` or ``ranks`` value; ``path`` locates it inside the value."""

    def __init__(self, message: str, path: Path = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __repr__(self) -> str:
        return f"SelectorError({self.message!r}, path={self.path!r})"


def _kind(value: object) -> str:
    """How an error message names the type of a bad value, in policy-file words."""
    for kind, label in ((bool, "a boolean"), (float, "a fractional number"), (str, "a string")):
        if isinstance(value, kind):
            return label
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, but `steps: true` is a mistake, not step 1.
    return isinstance(value, int) and not isinstance(value, bool)
