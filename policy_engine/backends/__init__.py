"""The backends' sessions: what records a capture for each backend the registry names.

The names the language knows, their aliases and which backends share a capture live
below the language in :mod:`policy_engine.settings` (``BACKENDS``, each name's settings
module); this package holds the parts that run while training does. :data:`REGISTRY`
gives each of those names one :class:`Registered` entry: its settings module, the module
of its session and the endings of the files it writes. A session module, imported when
a capture opens, holds ``BACKEND``, the Backend class (see
:mod:`policy_engine.backends.base`; its ``session`` is the :class:`Session
<policy_engine.backends.base.Session>` subclass it opens), and optionally
``session_settings(plan)``. Settings arrive merged over the defaults: sessions read them
without fallbacks. Session modules are named here by string and imported only when a
backend is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import attrs

from policy_engine.backends.files import ASCEND, SNAPSHOT, TORCH_GZIP, TORCH_PLAIN
from policy_engine.settings import BACKENDS, canonical

__all__ = ["REGISTRY", "SESSIONS", "Registered", "create", "lasting_ranges",
           "session_settings"]


@attrs.frozen
class Registered:
    """One backend: where its settings are declared, what records it, what it writes."""

    #: the registry name (:data:`policy_engine.settings.BACKENDS`)
    name: str
    #: the module holding ``BACKEND`` and, optionally, ``session_settings(plan)``
    session: str
    #: how the names of the files it writes end (a folder's ending ends with ``/``);
    #: :func:`policy_engine.backends.files.name_files` gives the whole names
    endings: tuple[str, ...]
    #: whether a capture's ranges outlive a discard: nsys writes a report for every range
    #: it saw, so a capture that may be dropped (the provisional whole-session capture of
    #: ``with prof:``) begins on such a backend only once it is kept
    lasting_ranges: bool = False

    @property
    def settings(self) -> str:
        """The settings module: ``SETTINGS``, ``check_settings``, ``check_runtime``."""
        return BACKENDS[self.name]

    def backend_class(self) -> Any:
        """The Backend class (imports the session module)."""
        return importlib.import_module(self.session).BACKEND

    def module(self) -> ModuleType:
        """The session module."""
        return importlib.import_module(self.session)


_ENGINE_TRACES = (TORCH_GZIP, TORCH_PLAIN)

#: Every backend, by registry name: one entry each (a test holds it equal to BACKENDS).
REGISTRY: Mapping[str, Registered] = {entry.name: entry for entry in (
    Registered("torch", "policy_engine.backends.torch", (TORCH_GZIP, TORCH_PLAIN)),
    Registered("mstx", "policy_engine.backends.mstx.session", (ASCEND + "/",)),
    Registered("nsight", "policy_engine.backends.nsight.session", (".nsys-rep",),
               lasting_ranges=True),
    Registered("memory", "policy_engine.backends.memory.session", (SNAPSHOT,)),
    Registered("vllm", "policy_engine.backends.vllm.session", _ENGINE_TRACES),
    Registered("sglang", "policy_engine.backends.sglang.session", (*_ENGINE_TRACES, SNAPSHOT)),
)}

#: Each backend's session module, by registry name.
SESSIONS: Mapping[str, str] = {name: entry.session for name, entry in REGISTRY.items()}


def lasting_ranges(name: str) -> bool:
    """Whether the captures of backend ``name`` leave ranges a discard cannot take back
    (:attr:`Registered.lasting_ranges`)."""
    return REGISTRY[canonical(name)].lasting_ranges


def create(name: str) -> Any:
    """A new Backend object for ``name`` (imports its session module)."""
    return REGISTRY[canonical(name)].backend_class()()


def session_settings(name: str, plan: Any) -> Mapping[str, Any]:
    """The settings a backend's captures of ``plan`` get: the role's block, or what the
    backend derives from the whole plan (nsight adds the output name nsys was given)."""
    module = REGISTRY[canonical(name)].module()
    hook = getattr(module, "session_settings", None)
    return hook(plan) if hook is not None else plan.settings  # type: ignore[no-any-return]
