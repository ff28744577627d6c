"""verl's profiler configuration as a policy: what ``policy-engine from-verl`` writes.

    conv = convert_file(".hydra/config.yaml", overrides=["global_profiler.steps=[2,3]"])
    conv.policy      # the policy document (a dict, ready for load_policy)
    conv.unmapped    # what verl asks that a policy cannot express
    policy_text(conv, source)   # the commented YAML

:data:`ROLE_BLOCKS` is the table of verl profiler blocks and the policy roles they become.
Nothing here imports verl or torch; Hydra and OmegaConf only to compose an uncomposed
config (:mod:`.compose`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from policy_engine.integrations.verl_config.compose import compose, uncomposed
from policy_engine.integrations.verl_config.convert import ROLE_BLOCKS, Locator, convert
from policy_engine.integrations.verl_config.emit import policy_text
from policy_engine.integrations.verl_config.overrides import apply as apply_overrides
from policy_engine.integrations.verl_config.result import Conversion, RoleBlock
from policy_engine.integrations.verl_config.tools import BACKENDS

__all__ = [
    "BACKENDS",
    "ROLE_BLOCKS",
    "Conversion",
    "RoleBlock",
    "apply_overrides",
    "convert",
    "convert_file",
    "convert_mapping",
    "policy_text",
]


def convert_mapping(
    config: Mapping[str, Any], overrides: Sequence[str] = (), *, cwd: str | None = None
) -> Conversion:
    """:func:`convert` of a config given as a mapping (a dict, or an OmegaConf DictConfig
    turned into one with ``OmegaConf.to_container(cfg)``), after verl-style ``overrides``."""
    import copy

    data = copy.deepcopy(dict(config))
    where = apply_overrides(data, overrides)
    return convert(data, cwd=cwd, locate=Locator(None, where))


def convert_file(
    path: str | os.PathLike[str], overrides: Sequence[str] = (), *, cwd: str | None = None
) -> Conversion:
    """:func:`convert` of a verl config file (YAML or JSON), after ``overrides``; an
    uncomposed Hydra config (a top-level ``defaults:`` list) is composed by Hydra first
    (:mod:`.compose`). Raises PolicyFileError when the file cannot be read or composed,
    PolicyError when its content is wrong."""
    from policy_engine.language.read.source import read_document

    doc = read_document(path)
    if uncomposed(doc.data):  # verl's own trainer YAML: Hydra composes it first
        data = compose(doc.origin)
        where = apply_overrides(data, overrides)
        return convert(data, cwd=cwd, locate=Locator(None, where, f"{doc.origin} (composed)"))
    data = doc.data
    where = apply_overrides(data, overrides)
    return convert(data, cwd=cwd, locate=Locator(doc.locate, where, doc.origin))
