"""Trace name templates: ``<prefix>_<role>[_step<step>]_rank<rank>-of-<world>``.

``<field>`` is replaced by a sanitized value; ``[...]`` is an optional group that vanishes
when every field inside it is empty. Literal text may hold ``[0-9A-Za-z._=+-]`` and ``/``
(sub-folders under the output folder).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from policy_engine.errors import did_you_mean

# Name shortening is the output layout's: one rule for every name the engine makes.
from policy_engine.files.layout import shorten
from policy_engine.language.values.mesh import DIMS

FIELDS: tuple[str, ...] = (
    "prefix", "role", "region", "step", "cycle", "rank", "world", "local_rank", "node",
    "host", "pid", "timestamp", "backend", *DIMS,
)
#: Fields only known in the running process; explain shows them as placeholders.
LATE_FIELDS = frozenset({"pid", "host", "timestamp"})
#: What a name becomes when every field in it is empty (a file needs a name).
EMPTY_NAME = "trace"

_LITERAL_OK = re.compile(r"[0-9A-Za-z._=+\-/]")
_SANITIZE = re.compile(r"[^0-9A-Za-z.=+-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateError(ValueError):
    """A malformed name template; ``offset`` is the 0-based character position."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


def sanitize(value: object) -> str:
    """A field value as it appears in names: runs of other characters become ``-``."""
    return _SANITIZE.sub("-", str(value))


@attrs.frozen
class Field:
    name: str


@attrs.frozen
class Group:
    parts: tuple[str | Field, ...]


Part = str | Field | Group


def _field(text: str, offset: int) -> Field:
    if not text:
        raise TemplateError("empty field <>", offset)
    if text.startswith("env:"):
        if not _ENV_NAME.fullmatch(text[4:]):
            raise TemplateError(
                f"bad field <{text}>: expected <env:NAME> with NAME a variable name", offset)
        return Field(text)
    if text not in FIELDS:
        hint = did_you_mean(text, FIELDS, show=lambda field: f"<{field}>") \
            or f" (fields: {', '.join(FIELDS)}, env:NAME)"
        raise TemplateError(f"unknown field <{text}>{hint}", offset)
    return Field(text)


def _parse(text: str) -> tuple[Part, ...]:
    parts: list[Part] = []
    group: list[str | Field] | None = None
    group_start = 0
    literal = ""
    i = 0

    def flush() -> None:
        nonlocal literal
        if literal:
            (group if group is not None else parts).append(literal)
            literal = ""

    while i < len(text):
        ch = text[i]
        if ch == "<":
            end = text.find(">", i)
            if end < 0:
                raise TemplateError("unclosed '<'", i)
            flush()
            (group if group is not None else parts).append(_field(text[i + 1:end], i))
            i = end + 1
            continue
        if ch == ">":
            raise TemplateError("unexpected '>'", i)
        if ch == "[":
            if group is not None:
                raise TemplateError("optional groups cannot nest", i)
            flush()
            group, group_start = [], i
        elif ch == "]":
            if group is None:
                raise TemplateError("unexpected ']'", i)
            flush()
            if not any(isinstance(p, Field) for p in group):
                raise TemplateError("optional group [...] holds no field", group_start)
            parts.append(Group(tuple(group)))
            group = None
        elif _LITERAL_OK.fullmatch(ch):
            literal += ch
        else:
            raise TemplateError(
                f"character {ch!r} is not allowed (use letters, digits, . _ = + - or /)", i)
        i += 1
    if group is not None:
        raise TemplateError("unclosed '['", group_start)
    flush()
    return tuple(parts)


def _check_paths(text: str) -> None:
    if text.startswith("/"):
        raise TemplateError("absolute path: a name is relative to output_dir", 0)
    if text.endswith("/"):
        raise TemplateError("a name cannot end with '/'", len(text) - 1)
    pos = 0
    for comp in text.split("/"):
        if comp == "":
            raise TemplateError("empty path component '//'", pos)
        if comp in (".", ".."):
            raise TemplateError(
                f"{comp!r} cannot be a path component (names stay under output_dir)", pos)
        pos += len(comp) + 1


@attrs.frozen
class NameTemplate:
    """A parsed name template. ``bound`` holds values fixed at compile time."""

    text: str
    parts: tuple[Part, ...]
    bound: tuple[tuple[str, str], ...] = ()
    # Derived once: render() runs per capture (and per rank in explain).
    _fields: frozenset[str] = attrs.field(init=False, eq=False, hash=False, repr=False)

    def __attrs_post_init__(self) -> None:
        out: set[str] = set()
        for part in self.parts:
            inner = part.parts if isinstance(part, Group) else (part,)
            out.update(p.name for p in inner if isinstance(p, Field))
        object.__setattr__(self, "_fields", frozenset(out))

    @classmethod
    def parse(cls, text: str) -> NameTemplate:
        parts = _parse(text)
        _check_paths(text)
        return cls(text, parts)

    def fields(self) -> frozenset[str]:
        return self._fields

    def bind(self, values: Mapping[str, object]) -> NameTemplate:
        """Fix the given fields' values now (sanitized), leaving the rest for render()."""
        merged = dict(self.bound)
        merged.update({k: _value(k, v) for k, v in values.items() if k in self.fields()})
        return attrs.evolve(self, bound=tuple(sorted(merged.items())))

    def render(self, values: Mapping[str, object] | None = None,
               placeholders: frozenset[str] = frozenset()) -> str:
        """The name for ``values`` (unknown fields are empty), path components shortened.

        Fields in ``placeholders`` that have no value render as ``<field>`` (for explain).
        A name left empty is :data:`EMPTY_NAME`.
        """
        known = dict(self.bound)
        fields = self._fields
        for key, value in (values or {}).items():
            if key in fields and key not in known:
                known[key] = _value(key, value)
        for name in placeholders:
            if not known.get(name):
                known[name] = f"<{name}>"
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, Group):
                rendered = [known.get(p.name, "") if isinstance(p, Field) else p
                            for p in part.parts]
                if any(known.get(p.name, "") for p in part.parts if isinstance(p, Field)):
                    out.extend(rendered)
            elif isinstance(part, Field):
                out.append(known.get(part.name, ""))
            else:
                out.append(part)
        comps = [c for c in "".join(out).split("/") if c]
        # A value of only dots would climb out of the output folder.
        name = "/".join(shorten(c if c.strip(".") else c.replace(".", "-")) for c in comps)
        return name or EMPTY_NAME


def _value(key: str, value: object) -> str:
    if value is None or value == "":
        return ""
    if type(value) is int:  # digits and "-" only: nothing to sanitize
        return f"{key}{value}" if key in DIMS else str(value)
    if key in DIMS:
        return f"{key}{sanitize(value)}"
    return sanitize(value)
