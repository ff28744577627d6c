"""Files that ship inside the wheel, found in a source checkout too."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def read_resource(packaged: str, checkout: str) -> str:
    """``policy_engine/<packaged>`` from the installed wheel, else ``<repo>/<checkout>``."""
    found = resources.files("policy_engine").joinpath(packaged)
    if found.is_file():
        return found.read_text(encoding="utf-8")
    return (_CHECKOUT / checkout).read_text(encoding="utf-8")
