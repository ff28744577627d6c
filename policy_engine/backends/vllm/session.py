"""The vllm backend at run time: what ``start_profile`` gets, which files a capture
leaves (see :mod:`policy_engine.backends.engine.files`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from policy_engine.backends.engine.files import EngineFile, parse_vllm
from policy_engine.backends.engine.kind import EngineBackend, EngineKind
from policy_engine.backends.vllm import checks


def _start(settings: Mapping[str, Any], schedule: Any, folder: str, prefix: str,
           token: str) -> dict[str, Any]:
    # The folder is fixed at launch (engine-args); the prefix tells captures apart.
    return checks.start_kwargs(settings, schedule, prefix)


def _parser(prefix: str, token: str) -> Callable[[str], EngineFile | None]:
    return lambda name: parse_vllm(name, prefix)


def _expected(settings: Mapping[str, Any], ranks: int, stages: int) -> int:
    return ranks  # the front end's file, when there is one, is not waited for


KIND = EngineKind("vllm", "torch_profiler_dir", _start, _parser, _expected)


class VllmBackend(EngineBackend):
    name: ClassVar[str] = "vllm"


BACKEND = VllmBackend
