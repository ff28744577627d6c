"""What the driver needs to know of one engine (vllm, sglang): its start request, the
files one capture leaves, and where they land. Each engine's ``session`` module makes one.

The runtime's ``apply_policy(worker, ...)`` cannot profile an engine's processes from the
worker: the ``Backend`` here refuses to open, with a message that names the driver.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs

from policy_engine.backends.base import BackendUnavailable, CaptureInfo, Session
from policy_engine.backends.engine.files import EngineFile

#: Where an engine writes when the policy names no folder: under the role's own folder,
#: a hidden name that no window of the layout uses.
STAGING = ".engine"


def staging_folder(output_dir: str, role: str, configured: str) -> str:
    """The absolute folder the engine writes into."""
    if configured:
        return configured
    return os.path.join(os.path.abspath(output_dir), role, STAGING)


@attrs.frozen
class EngineKind:
    """One engine's profiler, as the driver calls it."""

    name: str
    #: the settings key of the engine's folder (torch_profiler_dir, output_dir)
    folder_key: str
    #: (settings, schedule, folder, prefix, token) -> start_profile's keyword arguments
    start_kwargs: Callable[[Mapping[str, Any], Any, str, str, str], dict[str, Any]]
    #: (prefix, token) -> the parser of one capture's file names
    parser: Callable[[str, str], Callable[[str], EngineFile | None]]
    #: (settings, ranks, stages) -> how many files a capture of ``ranks`` ranks leaves
    expected: Callable[[Mapping[str, Any], int, int], int]

    def folder(self, output_dir: str, role: str, settings: Mapping[str, Any]) -> str:
        return staging_folder(output_dir, role, str(settings[self.folder_key]))


class EngineBackend:
    """The registry's Backend for an engine: refuses captures from a worker process."""

    name: ClassVar[str] = "engine"
    extension: ClassVar[str] = ".pt.trace.json.gz"
    #: no Session: the engine's own processes record, driven by the engine driver
    session: ClassVar[type[Session] | None] = None

    def open(self, info: CaptureInfo) -> Any:
        raise BackendUnavailable(
            f"role {info.role!r} profiles inside a {self.name} engine, whose processes this "
            "worker cannot reach: pass the engine (or its server URL) to "
            "policy_engine.integrations.engines.apply_engine_policy(engine, role=...)")
