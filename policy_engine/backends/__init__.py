"""The backends' sessions: what records a capture for each backend the registry names.

The registry itself (names, aliases, which backends share a capture, each one's settings
and value tables) lives below the language in :mod:`policy_engine.settings`; this package
holds the parts that run while training does. Each backend's ``session`` module, imported
when a capture opens, holds ``BACKEND``, the Backend class (see
:mod:`policy_engine.backends.base`), and optionally ``session_settings(plan)``. Settings
arrive merged over the defaults: sessions read them without fallbacks. Session modules
are named here by string and imported only when a backend is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from policy_engine.settings import canonical

__all__ = ["SESSIONS", "create", "session_settings"]

#: Each backend's session module, by registry name.
SESSIONS: Mapping[str, str] = {
    "torch": "policy_engine.backends.torch",
    "mstx": "policy_engine.backends.mstx.session",
    "nsight": "policy_engine.backends.nsight.session",
    "memory": "policy_engine.backends.memory.session",
    "vllm": "policy_engine.backends.vllm.session",
    "sglang": "policy_engine.backends.sglang.session",
}


def create(name: str) -> Any:
    """A new Backend object for ``name`` (imports its session module)."""
    return importlib.import_module(SESSIONS[canonical(name)]).BACKEND()


def session_settings(name: str, plan: Any) -> Mapping[str, Any]:
    """The settings a backend's captures of ``plan`` get: the role's block, or what the
    backend derives from the whole plan (nsight adds the output name nsys was given)."""
    module = importlib.import_module(SESSIONS[canonical(name)])
    hook = getattr(module, "session_settings", None)
    return hook(plan) if hook is not None else plan.settings  # type: ignore[no-any-return]
