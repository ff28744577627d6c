"""The backend registry: the one list of profiling tools a policy can name.

The schema's ``backend`` enum is checked against this registry by the test suite, so the
file format and the code cannot drift apart. Modules are imported only when a backend is
used, so naming one here costs nothing.

Each backend module defines:

* ``BACKEND``: the Backend class (see :mod:`policy_engine.backends.base`);
* ``check_settings(settings) -> list[tuple[str, tuple[str | int, ...]]]``: checks of the
  backend's own settings block that the schema cannot express (message, sub-path);
  pure Python, no heavy imports;
* ``check_runtime(settings) -> list[str]``: what stops the backend from running here
  (package missing, no device), for ``validate --check-runtime``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

BACKENDS: Mapping[str, str] = {
    "torch": "policy_engine.backends.torch",
    "mstx": "policy_engine.backends.mstx",
    "nsight": "policy_engine.backends.nsight",
}
ALIASES: Mapping[str, str] = {"npu": "mstx", "nsys": "nsight"}


def canonical(name: str) -> str:
    """The registry name for ``name`` or one of its aliases."""
    name = ALIASES.get(name, name)
    if name not in BACKENDS:
        raise KeyError(name)
    return name


def module(name: str) -> ModuleType:
    """Import the module that implements backend ``name``."""
    return importlib.import_module(BACKENDS[canonical(name)])


def create(name: str) -> Any:
    """A new Backend object for ``name``."""
    return module(name).BACKEND()


def check_settings(
    name: str, settings: Mapping[str, Any]
) -> list[tuple[str, tuple[str | int, ...]]]:
    """Problems in a backend's settings block that the schema cannot see."""
    mod = module(name)
    checker = getattr(mod, "check_settings", None)
    return list(checker(settings)) if checker else []


def session_settings(name: str, plan: Any) -> Mapping[str, Any]:
    """The settings a backend's captures of ``plan`` get: the role's block, or what the
    backend derives from the whole plan (nsight adds the output name nsys was given)."""
    hook = getattr(module(name), "session_settings", None)
    return hook(plan) if hook is not None else plan.settings  # type: ignore[no-any-return]
