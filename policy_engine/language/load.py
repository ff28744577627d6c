"""load_policy: a file, a mapping or a Policy -> a validated, frozen Policy.

One pipeline, for the library and the command line alike::

    read (positions kept) -> overrides (--set, then PROFILE_POLICY_SET)
        -> schema (shape) -> model (values parsed, roles built) -> checks (across values)

Every problem of every stage is reported, each once: a stage skips what an earlier one
refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import attrs

from policy_engine.errors import PolicyError, Problem
from policy_engine.language import model
from policy_engine.language.model import Policy
from policy_engine.language.read.document import Document
from policy_engine.language.read.extends import load_policy_document
from policy_engine.language.read.overrides import (
    Override,
    apply_overrides,
    overrides_from_env,
    parse_override,
)
from policy_engine.language.read.source import document_from_mapping
from policy_engine.language.rules import checks
from policy_engine.language.schema import build as schema

PolicySource = Union[str, "os.PathLike[str]", Mapping[str, Any], Policy]
ENV_FILE = "PROFILE_POLICY"


@attrs.frozen
class Analysis:
    """A document with every problem found in it, and its policy when it has no error."""

    document: Document
    problems: tuple[Problem, ...]
    policy: Policy | None = None

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "warning")


def _overrides(given: Sequence[str | Override], environ: Mapping[str, str]) -> list[Override]:
    """``given`` (``--set`` texts or parsed overrides), then ``PROFILE_POLICY_SET``'s; every
    bad one is reported, not the first."""
    parsed: list[Override] = []
    problems: list[Problem] = []
    for item in given:
        try:
            parsed.append(item if isinstance(item, Override) else parse_override(item))
        except PolicyError as err:
            problems.extend(err.problems)
    try:
        parsed += overrides_from_env(environ)
    except PolicyError as err:
        problems.extend(err.problems)
    if problems:
        raise PolicyError(problems)
    return parsed


def read_source(source: str | os.PathLike[str] | Mapping[str, Any],
                overrides: Sequence[str | Override] = (),
                environ: Mapping[str, str] | None = None) -> Document:
    """The document for ``source`` with ``--set``-style and environment overrides applied.

    A file that cannot be read raises
    :class:`~policy_engine.language.read.document.PolicyFileError`.
    """
    parsed = _overrides(overrides, os.environ if environ is None else environ)
    if isinstance(source, Mapping):
        doc = document_from_mapping(source)
    else:
        doc = load_policy_document(os.fspath(source))
    return apply_overrides(doc, parsed)


def analyze(doc: Document, *, world: int | None = None,
            mesh: Mapping[str, int] | None = None) -> Analysis:
    """Every problem in ``doc``: the schema's, the values', then those across values.
    ``world`` and ``mesh`` (the CLI's ``--world`` and ``--mesh``) are checked against."""
    checked = schema.validate(doc)
    built = model.build(doc, checked.refused)
    problems = reading_order([*checked.problems, *built.problems,
                              *checks.check(doc, built, world=world, mesh=mesh)])
    if any(p.severity == "error" for p in problems):
        return Analysis(doc, problems)
    warnings = tuple(p for p in problems if p.severity == "warning")
    return Analysis(doc, problems, model.build_policy(doc, built, warnings=warnings))


def reading_order(problems: Sequence[Problem]) -> tuple[Problem, ...]:
    """Problems as a reader meets them: those of the whole policy first, then each file
    (in the order they first come up) top to bottom, whatever order the checks that
    found them ran in (the schema, the values, then rules across roles)."""
    files: dict[str, int] = {}
    for p in problems:
        if p.location is not None:
            files.setdefault(p.location.origin, len(files))

    def key(p: Problem) -> tuple[int, int, int]:
        loc = p.location
        if loc is None:
            return (-1, 0, 0)
        return (files[loc.origin], loc.line or 0, loc.column or 0)

    return tuple(sorted(problems, key=key))


def load_policy(source: PolicySource, *, overrides: Sequence[str | Override] = (),
                environ: Mapping[str, str] | None = None, strict: bool = False) -> Policy:
    """Load, validate and freeze a policy.

    ``source`` is a path (YAML, TOML or JSON), a mapping (a dict or an OmegaConf
    DictConfig), or an already loaded Policy (returned as is). ``PROFILE_POLICY_SET`` in
    ``environ`` (default: the process environment) adds overrides after ``overrides``.
    Raises :class:`PolicyError` carrying every problem; with ``strict``, warnings too.
    """
    if isinstance(source, Policy):
        return source
    result = analyze(read_source(source, overrides, environ))
    if result.policy is None or (strict and result.warnings):
        raise PolicyError(result.problems)
    return result.policy
