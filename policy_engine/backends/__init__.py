"""The backend registry: the one list of profiling tools a policy can name.

The policy schema is assembled from this registry (:mod:`policy_engine.language.schema`):
its ``backend`` enum is the names and aliases below, and each backend's settings block is
the one its ``checks`` module declares, so the file format and the code cannot drift
apart. Adding a backend is one entry here and its two modules. Modules are imported only
when a backend is used (or the schema is assembled), so naming one here costs nothing.

Each backend names two modules:

* its ``checks`` module, pure Python (validate imports it, never the tool):
  ``SETTINGS``, the role's block for the backend as a JSON Schema fragment, with a
  ``default`` and a ``description`` on every setting; ``check_settings(settings) ->
  list[(message, sub-path)]``, what the schema cannot express about a block merged over
  those defaults; ``check_runtime(settings) -> list[str]``, what stops the backend from
  running here (package missing, no device), for ``validate --check-runtime``;
  optionally ``check_role(spec, mesh) -> list[(message, role key, severity)]``, what the
  tool cannot do of a role as a whole (the engines: schedule, ranks, mesh);
* its ``session`` module, imported when a capture opens: ``BACKEND``, the Backend class
  (see :mod:`policy_engine.backends.base`), and optionally ``session_settings(plan)``.
  Settings arrive merged over the defaults: sessions read them without fallbacks.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import attrs


@attrs.frozen
class Entry:
    """Where a backend's parts live."""

    checks: str
    session: str


BACKENDS: Mapping[str, Entry] = {
    "torch": Entry("policy_engine.backends.torch", "policy_engine.backends.torch"),
    "mstx": Entry("policy_engine.backends.mstx.checks", "policy_engine.backends.mstx.session"),
    "nsight": Entry("policy_engine.backends.nsight.checks",
                    "policy_engine.backends.nsight.session"),
    "memory": Entry("policy_engine.backends.memory.checks",
                    "policy_engine.backends.memory.session"),
    "vllm": Entry("policy_engine.backends.vllm.checks", "policy_engine.backends.vllm.session"),
    "sglang": Entry("policy_engine.backends.sglang.checks",
                    "policy_engine.backends.sglang.session"),
}
ALIASES: Mapping[str, str] = {"npu": "mstx", "nsys": "nsight", "torch_memory": "memory"}

#: Backends that record beside another one over the same captures (``[torch, memory]``).
#: The others trace a timeline, and a role has at most one of them.
BESIDE = frozenset({"memory"})

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


#: Backends whose captures run inside an inference engine's processes, driven by
#: policy_engine.integrations.engines.
ENGINES = frozenset({"vllm", "sglang"})


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
    """The module with backend ``name``'s checks (pure Python)."""
    return importlib.import_module(BACKENDS[canonical(name)].checks)


def create(name: str) -> Any:
    """A new Backend object for ``name`` (imports its session module)."""
    return importlib.import_module(BACKENDS[canonical(name)].session).BACKEND()


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


def check_role(name: str, spec: Any,
               mesh: Mapping[str, int] | None) -> list[tuple[str, str, str]]:
    """What backend ``name`` cannot do of an enabled role as a whole (its schedule, ranks,
    mesh): (message, the role key at fault, severity). Backends without ``check_role``
    can do all of it."""
    hook = getattr(checks(name), "check_role", None)
    return [] if hook is None else list(hook(spec, mesh))


def check_runtime(name: str, settings: Mapping[str, Any]) -> list[str]:
    """What stops backend ``name`` from running in this process (imports no tool)."""
    return list(checks(name).check_runtime(settings))


def session_settings(name: str, plan: Any) -> Mapping[str, Any]:
    """The settings a backend's captures of ``plan`` get: the role's block, or what the
    backend derives from the whole plan (nsight adds the output name nsys was given)."""
    module = importlib.import_module(BACKENDS[canonical(name)].session)
    hook = getattr(module, "session_settings", None)
    return hook(plan) if hook is not None else plan.settings  # type: ignore[no-any-return]
