"""A Conversion as YAML text: each key under the comment that says which verl key it comes
from, and what has no equivalent at the top."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from policy_engine.integrations.verl_config.result import Conversion, PolicyPath

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./+=-]*")
_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}
_WIDTH = 96


def scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _WORDS:
        return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{scalar(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return scalar(value)


def _comment(lines: list[str], indent: str, texts: list[str]) -> None:
    for text in texts:
        for line in textwrap.wrap(
            text, _WIDTH - len(indent) - 2, break_long_words=False, break_on_hyphens=False
        ):
            lines.append(f"{indent}# {line}")


def _block(
    lines: list[str], data: dict[str, Any], path: PolicyPath, conv: Conversion, depth: int
) -> None:
    indent = "  " * depth
    for key, value in data.items():
        here = (*path, key)
        _comment(lines, indent, conv.comments.get(here, []))
        nested = (
            isinstance(value, dict)
            and value
            and (
                depth < 2
                or any(isinstance(v, dict) for v in value.values())
                or any((*here, k) in conv.comments for k in value)
            )
        )
        if not nested and isinstance(value, dict) and value:
            nested = len(f"{indent}{scalar(key)}: {flow(value)}") > _WIDTH
        if nested:
            lines.append(f"{indent}{scalar(key)}:")
            _block(lines, value, here, conv, depth + 1)
        else:
            lines.append(f"{indent}{scalar(key)}: {flow(value)}")


def policy_text(conv: Conversion, source: str) -> str:
    """The policy file ``policy-engine from-verl`` writes for ``conv`` (read from ``source``)."""
    lines = [
        "# A profiling policy written by `policy-engine from-verl` from",
        f"# {source}.",
        "# Each key says which verl key it comes from. Check it with",
        "# `policy-engine validate` and preview each rank with `policy-engine explain`.",
    ]
    if conv.unmapped:
        lines.append("#")
        lines.append("# No equivalent here (left out):")
        for text in conv.unmapped:
            _comment(lines, "", [f"- {text}"])
    _block(lines, conv.policy, (), conv, 0)
    return "\n".join(lines) + "\n"
