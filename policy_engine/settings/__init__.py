"""The backend registry: the one list of profiling tools a policy can name, and where each
one's settings are declared.

The policy schema is assembled from this registry (:mod:`policy_engine.language.schema.build`):
its ``backend`` enum is the names and aliases below, and each backend's settings block is
the one its settings module declares, so the file format and the code cannot drift apart.
This package sits below the language and imports nothing of the project above it: the
language asks it about backends, the backends' sessions read their value tables from it.

Each backend's settings module (``policy_engine.settings.<name>``) is pure Python and
holds ``SETTINGS``, the role's block for the backend as a JSON Schema fragment, with a
``default`` and a ``description`` on every setting; ``check_settings(settings) ->
list[(message, sub-path)]``, what the schema cannot express about a block merged over
those defaults; ``check_runtime(settings) -> list[str]``, what stops the backend from
running here (package missing, no device), for ``validate --check-runtime``. The sessions
that record, and the endings of their files, live in :mod:`policy_engine.backends` (its
``REGISTRY``, one entry per name here).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

#: Each backend's settings module, by registry name (imported when first asked for).
BACKENDS: Mapping[str, str] = {
    "torch": "policy_engine.settings.torch",
    "mstx": "policy_engine.settings.mstx",
    "nsight": "policy_engine.settings.nsight",
    "memory": "policy_engine.settings.memory",
    "vllm": "policy_engine.settings.vllm",
    "sglang": "policy_engine.settings.sglang",
}
ALIASES: Mapping[str, str] = {"npu": "mstx", "nsys": "nsight", "torch_memory": "memory"}

#: Backends that record beside another one over the same captures (``[torch, memory]``).
#: The others trace a timeline, and a role has at most one of them.
BESIDE = frozenset({"memory"})

#: Backends whose captures run inside an inference engine's processes, driven by
#: policy_engine.integrations.engines.
ENGINES = frozenset({"vllm", "sglang"})

# Why two timeline tools cannot record one capture.
_APART = {
    frozenset({"torch", "mstx"}): "torch.profiler and torch_npu's profiler drive the same "
                                  "framework profiler, one at a time",
    frozenset({"torch", "nsight"}): "torch.profiler and Nsight Systems both take CUPTI in "
                                    "one process: the torch trace would lose its GPU kernels "
                                    "(nsight already records the CPU and GPU timeline)",
    frozenset({"mstx", "nsight"}): "mstx records Ascend NPUs and nsight CUDA GPUs: no "
                                   "process has both",
}


def _apart(first: str, second: str) -> str:
    found = _APART.get(frozenset({first, second}))
    if found is not None:
        return found
    engine = first if first in ENGINES else second
    return (f"{engine} records inside an inference engine's processes, "
            f"{second if engine == first else first} in the process that runs it")


def canonical(name: str) -> str:
    """The registry name for ``name`` or one of its aliases."""
    name = ALIASES.get(name, name)
    if name not in BACKENDS:
        raise KeyError(name)
    return name


def combination(names: list[str]) -> tuple[tuple[str, ...], list[tuple[str, int]]]:
    """The registry names of a role's ``backend`` list, its timeline tool first, and what
    is wrong with the list: (message, index of the entry at fault)."""
    found: list[str] = []
    problems: list[tuple[str, int]] = []
    for index, name in enumerate(names):
        real = canonical(name)
        if real in found:
            problems.append((f"{name} names backend {real} a second time", index))
            continue
        timeline = [n for n in found if n not in BESIDE]
        if real not in BESIDE and timeline:
            problems.append((f"{timeline[0]} and {real} cannot record the same capture: "
                             f"{_apart(timeline[0], real)}; profile them in "
                             "different roles", index))
            continue
        found.append(real)
    ordered = tuple(sorted(found, key=lambda n: n in BESIDE))
    return ordered, problems


def checks(name: str) -> ModuleType:
    """The settings module of backend ``name`` (pure Python)."""
    return importlib.import_module(BACKENDS[canonical(name)])


def settings_schema(name: str) -> Mapping[str, Any]:
    """Backend ``name``'s settings block, as a JSON Schema fragment with defaults."""
    found: Mapping[str, Any] = checks(name).SETTINGS
    return found


def check_settings(
    name: str, settings: Mapping[str, Any]
) -> list[tuple[str, tuple[str | int, ...]]]:
    """Problems in a backend's settings block (merged over its defaults) that the schema
    cannot see."""
    return list(checks(name).check_settings(settings))


def check_runtime(name: str, settings: Mapping[str, Any]) -> list[str]:
    """What stops backend ``name`` from running in this process (imports no tool)."""
    return list(checks(name).check_runtime(settings))
