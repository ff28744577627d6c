"""load_policy: a file, a mapping or a Policy -> a validated, frozen Policy."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import attrs

from policy_engine.errors import PolicyError, Problem
from policy_engine.language import checks, schema
from policy_engine.language.document import Document
from policy_engine.language.extends import load_policy_document
from policy_engine.language.model import Policy, build_policy
from policy_engine.language.overrides import (
    Override,
    apply_overrides,
    overrides_from_env,
    parse_override,
)
from policy_engine.language.read import document_from_mapping

PolicySource = Union[str, "os.PathLike[str]", Mapping[str, Any], Policy]
ENV_FILE = "PROFILE_POLICY"


@attrs.frozen
class Analysis:
    """A document with every problem found in it."""

    document: Document
    problems: tuple[Problem, ...]

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "warning")


def read_source(source: str | os.PathLike[str] | Mapping[str, Any],
                overrides: Sequence[str | Override] = (),
                environ: Mapping[str, str] | None = None) -> Document:
    """The document for ``source`` with ``--set``-style and environment overrides applied."""
    if isinstance(source, Mapping):
        doc = document_from_mapping(source)
    else:
        doc = load_policy_document(os.fspath(source))
    parsed = [o if isinstance(o, Override) else parse_override(o, f"--set {o}")
              for o in overrides]
    parsed += overrides_from_env(os.environ if environ is None else environ)
    return apply_overrides(doc, parsed) if parsed else doc


def analyze(doc: Document, *, world: int | None = None,
            mesh: Mapping[str, int] | None = None) -> Analysis:
    """Schema problems first, then the semantic checks."""
    problems = schema.validate(doc)
    structure_ok = not any(p.severity == "error" for p in problems)
    problems += checks.check_document(doc, world=world, mesh=mesh, structure_ok=structure_ok)
    return Analysis(doc, tuple(problems))


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
    doc = read_source(source, overrides, environ)
    result = analyze(doc)
    if result.errors or (strict and result.warnings):
        raise PolicyError(result.problems)
    return build_policy(doc.data, source=None if isinstance(source, Mapping) else doc.origin,
                        sources=doc.sources, warnings=result.warnings)
