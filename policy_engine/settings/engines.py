"""What the vllm and sglang settings modules share: version numbers and folder settings
(pure Python: validate runs them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def version_tuple(text: str) -> tuple[int, ...]:
    """``0.5.23`` -> (0, 5, 23); a part that is no number ends the tuple."""
    out = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def absolute_dir(settings: Mapping[str, Any], key: str,
                 engine: str) -> list[tuple[str, tuple[str | int, ...]]]:
    value = settings[key]
    if value and not str(value).startswith("/"):
        return [(f"{key} {value!r} is relative: the {engine} engine resolves it in its own "
                 "working directory, which the driver does not know; give an absolute path "
                 "(or leave it empty: <output_dir>/<role>/.engine)", (key,))]
    return []
