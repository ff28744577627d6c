"""verl's profiler driven by a policy, with no change to verl's code.

    pip install -e '.[verl]'    # in a checkout of policy-engine (not on PyPI)
    PROFILE_POLICY=profile_policy.yaml python -m verl.trainer.main_ppo ...

``import verl`` loads every ``verl.plugins`` entry point, in the driver and in each Ray
worker; this package is one. Importing it does nothing unless ``PROFILE_POLICY`` is set.
Then, as soon as verl imports ``verl.utils.profiler.profile`` (or at once, when it already
has), every ``DistProfiler`` verl builds is driven by the policy: the worker's name picks
the policy role (:mod:`.roles`), ``start_profile``/``stop_profile`` are training-step
windows, stages are regions, mini-batch steps are inner steps (:mod:`.driver`); a vLLM
rollout server's engine is driven by the engine driver under the policy's rollout role
(:mod:`.rollout`). Without ``PROFILE_POLICY`` verl profiles as it always has. See
docs/verl.md.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: policy_engine.language.load.ENV_FILE, spelled out: importing the language here would
#: cost every verl process a third of a second, policy or not (a test keeps them equal).
ENV_FILE = "PROFILE_POLICY"
#: The verl module whose DistProfiler the plugin patches.
PROFILE_MODULE = "verl.utils.profiler.profile"
#: verl's rollout servers (one Ray actor per replica), patched by ``rollout.py``.
VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
SGLANG_SERVER = "verl.workers.rollout.sglang_rollout.async_sglang_server"
_LOCK = threading.Lock()


class _PatchingLoader(importlib.abc.Loader):
    """A module's own loader, then ``after(module)`` once the module has run."""

    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, is_package ...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``name`` as the other finders do, and patches it once it has run."""

    def __init__(self, name: str, after: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.after = after

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.after)
                return spec
        return None


#: verl module -> (our module, its function) that patches it once it has run. Imported
#: only when verl imports the module: a process without a rollout server never loads the
#: engine driver.
PATCHES = {
    PROFILE_MODULE: ("patch", "patch_profile_module"),
    VLLM_SERVER: ("rollout", "patch_vllm_server"),
    SGLANG_SERVER: ("rollout", "patch_sglang_server"),
}


def _patcher(module: str, function: str) -> Callable[[ModuleType], None]:
    def patch(target: ModuleType) -> None:
        ours = importlib.import_module(f"{__name__}.{module}")
        getattr(ours, function)(target)
    return patch


def install() -> bool:
    """Hand verl's profiler to the policy in this process (idempotent). False when
    ``PROFILE_POLICY`` is unset: then nothing changes."""
    if not os.environ.get(ENV_FILE):
        return False
    with _LOCK:
        waiting = {f.name for f in sys.meta_path if isinstance(f, _Finder)}
        for name, (module, function) in PATCHES.items():
            patch = _patcher(module, function)
            loaded = sys.modules.get(name)
            if loaded is not None:
                patch(loaded)
            elif name not in waiting:
                sys.meta_path.insert(0, _Finder(name, patch))
    return True


install()
