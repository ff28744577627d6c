"""Problems found in a policy, and the exceptions that carry them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Literal

import attrs

Severity = Literal["error", "warning"]


@attrs.frozen
class Location:
    """Where a value came from: a file position, or an override such as ``--set a.b=1``.

    ``line`` and ``column`` are 1-based; they are None for overrides and for
    documents whose format keeps no positions.
    """

    origin: str
    line: int | None = None
    column: int | None = None

    def render(self) -> str:
        if self.line is None:
            return self.origin
        return f"{self.origin}:{self.line}:{self.column or 1}"


@attrs.frozen
class Problem:
    """One thing wrong (or suspicious) in a policy, with where it is."""

    message: str
    json_path: str = "$"
    location: Location | None = None
    severity: Severity = "error"

    def render(self) -> str:
        where = self.location.render() if self.location else "<policy>"
        return f"{where}: {self.severity}: {self.message} (at {self.json_path})"

    def to_json(self) -> dict[str, object]:
        loc = self.location
        return {
            "file": loc.origin if loc else None,
            "line": loc.line if loc else None,
            "column": loc.column if loc else None,
            "json_path": self.json_path,
            "severity": self.severity,
            "message": self.message,
        }


def json_path(parts: Iterable[str | int]) -> str:
    """Render a path of keys and indices as ``$.roles.actor.ranks[0]``."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def describe(value: object) -> str:
    """Name a plain value's kind for messages: 'a list', 'an integer', ..."""
    if value is None:
        return "null"
    kinds = (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (dict, "a mapping"),
        (list, "a list"),
    )
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'ranks'?)`` when a choice is close to ``word``, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class PolicyError(Exception):
    """A policy the user wrote is wrong. Carries every problem found, not just the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__(self._summary())

    def _summary(self) -> str:
        errors = [p for p in self.problems if p.severity == "error"] or list(self.problems)
        return "\n".join(p.render() for p in errors)

    @classmethod
    def single(
        cls, message: str, location: Location | None = None, path: str = "$"
    ) -> PolicyError:
        return cls([Problem(message, path, location)])


class ProfilingError(RuntimeError):
    """A backend failed at run time under ``on_error: raise``."""
