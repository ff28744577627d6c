"""The sglang backend at run time: the ``ProfileReq`` of a capture, which files it leaves
(see :mod:`policy_engine.backends.engine.files`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from policy_engine.backends.engine.files import EngineFile, parse_sglang
from policy_engine.backends.engine.kind import EngineBackend, EngineKind
from policy_engine.backends.sglang import checks


def _start(settings: Mapping[str, Any], schedule: Any, folder: str, prefix: str,
           token: str) -> dict[str, Any]:
    return checks.start_kwargs(settings, schedule, folder, prefix, token)


def _parser(prefix: str, token: str) -> Callable[[str], EngineFile | None]:
    return lambda name: parse_sglang(name, prefix, token)


def _expected(settings: Mapping[str, Any], ranks: int, stages: int) -> int:
    activities = settings["activities"]
    per_rank = int("CPU" in activities or "GPU" in activities) + int("MEM" in activities)
    return ranks * max(stages, 1) * per_rank


KIND = EngineKind("sglang", "output_dir", _start, _parser, _expected)


class SglangBackend(EngineBackend):
    name: ClassVar[str] = "sglang"


BACKEND = SglangBackend
