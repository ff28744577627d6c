"""Problems found in a policy, the exceptions that carry them, and the words every message
uses: how a value's kind is named (:func:`describe`), whether it is an integer
(:func:`is_int`), and "did you mean" (:func:`did_you_mean`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, TypeGuard

import attrs

Severity = Literal["error", "warning"]


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every character that cannot be printed as it is (line breaks, control
    characters such as a terminal's escape sequences, lone surrogates) written as its
    escape (``\\n``, ``\\x1b``, ``\\ud800``), so that untrusted text shows as one line and
    moves no cursor. With ``limit``, what is longer is cut to ``limit`` characters, the
    last three ``...``. The one such helper: every message, listing and page uses it."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode()
                       for c in text)
    if limit is not None and len(text) > limit:
        return text[: limit - 3] + "..."
    return text


@attrs.frozen
class Location:
    """Where a value came from: a file position, or an override such as ``--set a.b=1``.

    ``line`` and ``column`` are 1-based; they are None for overrides and for
    documents whose format keeps no positions.
    """

    origin: str
    line: int | None = None
    column: int | None = None
    #: For a scalar written on one line whose characters stand one for one in the source
    #: (no escapes, no folding): how many columns after ``column`` its text begins (1
    #: past a quote, else 0); None where that is not so or not known.
    inner: int | None = attrs.field(default=None, eq=False)

    def at_character(self, offset: int | None) -> Location:
        """The position of the value's character ``offset`` (0-based) where the source
        shows it one for one, else this position."""
        if offset is None or self.inner is None or self.column is None:
            return self
        return Location(self.origin, self.line, self.column + self.inner + offset)

    def render(self) -> str:
        if self.line is None:
            return self.origin
        return f"{self.origin}:{self.line}:{self.column or 1}"


@attrs.frozen
class Problem:
    """One thing wrong (or suspicious) in a policy, with where it is.

    ``message`` is kept printable on one line (see :func:`printable`). ``code`` names a
    kind of problem that code reacts to (None for most); it is not part of the output.
    """

    message: str = attrs.field(converter=printable)
    json_path: str = "$"
    location: Location | None = None
    severity: Severity = "error"
    code: str | None = None

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


#: A JSON Schema type name in message words.
KINDS: Mapping[str, str] = {
    "null": "null",
    "boolean": "a boolean",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
}


def describe(value: object) -> str:
    """Name a plain value's kind for messages: 'a list', 'an integer', ..."""
    if value is None:
        return KINDS["null"]
    kinds = (
        (bool, "boolean"),
        (int, "integer"),
        (float, "number"),
        (str, "string"),
        (Mapping, "object"),
        ((list, tuple), "array"),
    )
    return next((KINDS[name] for kind, name in kinds if isinstance(value, kind)),
                type(value).__name__)


def is_int(value: object) -> TypeGuard[int]:
    """Whether a value read from a file, a policy or a message is an integer: an ``int``
    and not a ``bool`` (Python's ``True`` is an int; ``true`` in a file never means 1).
    The one such check: every reader of parsed values asks it, bounds its own range."""
    return isinstance(value, int) and not isinstance(value, bool)


# Words users reach for that are not close in spelling to the value they mean.
_SYNONYMS = {"gpu": "cuda", "nvidia": "cuda", "ascend": "npu", "pytorch": "torch"}


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` most likely stands for: a synonym (``gpu`` -> ``cuda``), else the
    closest spelling; two- and three-letter words get a looser match (``tq`` -> ``tp``)."""
    options = list(choices)
    synonym = _SYNONYMS.get(word.lower())
    if synonym in options:
        return synonym
    cutoff = 0.6 if len(word) > 3 else 0.5
    close = difflib.get_close_matches(word, options, n=1, cutoff=cutoff)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str],
                 show: Callable[[str], str] = repr) -> str:
    """`` (did you mean 'ranks'?)`` when a choice is close to ``word``, else ``""``.

    ``show`` writes the choice as the user would (``lambda f: f"<{f}>"`` for a name field).
    """
    found = closest(word, choices)
    return f" (did you mean {show(found)}?)" if found is not None else ""


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
