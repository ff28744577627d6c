"""The PyTorch profiler backend: torch.profiler captures written as Chrome traces.

The engine owns the schedule, so the profiler object is driven through its transition
methods (prepare_trace / start_trace / stop_trace) instead of its own ``schedule=``;
torch then does nothing on steps where the schedule says NONE.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from ..runtime.files import write_exclusive
from .base import Artifact, BackendUnavailable, CaptureInfo

log = logging.getLogger("policy_engine")

_ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU"}
_FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
_warned_no_device: set[str] = set()


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    if not settings.get("activities"):
        return [("activities is empty: list at least one of cpu, cuda "
                 "(an empty list never means all)", ("activities",))]
    return []


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return ["torch is not installed: pip install torch"]
    return []


def _activities(names: Any) -> list[Any]:
    import torch
    from torch.profiler import ProfilerActivity

    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "xpu": hasattr(torch, "xpu") and torch.xpu.is_available()}
    out = []
    for name in names:
        if available.get(name):
            out.append(getattr(ProfilerActivity, _ACTIVITIES[name]))
        elif name not in _warned_no_device:
            _warned_no_device.add(name)
            log.warning("policy-engine: %s activity dropped: no %s device in this process",
                        name, name.upper())
    if not out:
        raise BackendUnavailable(f"none of the activities {list(names)} can run here")
    return out


class TorchSession:
    """One capture: a torch.profiler profile driven transition by transition."""

    def __init__(self, info: CaptureInfo) -> None:
        try:
            import torch.profiler
        except ImportError as err:
            raise BackendUnavailable(f"torch is not importable ({err}): pip install torch") \
                from err
        settings = info.settings
        self._info = info
        self._gzip = bool(settings.get("gzip", True))
        flags: dict[str, Any] = {flag: bool(settings.get(flag, False)) for flag in _FLAGS}
        self._prof = torch.profiler.profile(
            activities=_activities(settings.get("activities", ["cpu"])), **flags)
        # Carried into every trace so tools can read role and rank without parsing names.
        self._prof.preset_metadata_json("policy_engine", json.dumps(info.metadata()))
        self._record = torch.autograd.profiler.record_function
        fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)
        self._range_cls = fast if fast is not None else self._record
        self._prepared = False
        self._started = False
        self._step_marker: Any = None
        self._facts: dict[str, Any] = {}

    # The interpreter calls these only on schedule transitions.
    def prepare(self) -> None:
        with warnings.catch_warnings():
            # Each cycle after the first re-prepares the profiler; torch warns that events
            # of earlier cycles are cleared, which is exactly what a per-cycle trace wants.
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            self._prof.prepare_trace()
        self._prepared = True

    def start(self) -> None:
        if not self._prepared:
            self.prepare()
        self._prof.start_trace()
        self._started = True

    def step(self, inner_step: int) -> None:
        # Same marker torch.profiler's own step() leaves, so trace viewers show steps.
        self._end_marker()
        marker = self._record(f"ProfilerStep#{inner_step}")
        marker.__enter__()  # type: ignore[no-untyped-call]
        self._step_marker = marker

    def note(self, facts: dict[str, Any]) -> None:
        self._facts = dict(facts)

    def save(self, stem: str, cycle: int) -> list[Artifact]:
        if self._started:
            meta = self._info.metadata()
            meta.update(self._facts, cycle=cycle)
            self._prof.add_metadata_json("policy_engine", json.dumps(meta))
        self._stop()
        ext = ".pt.trace.json.gz" if self._gzip else ".pt.trace.json"
        path = write_exclusive(self._info.output_dir, stem, ext, self._prof.export_chrome_trace)
        return [Artifact(path, os.path.getsize(path))]

    def discard(self) -> None:
        if self._prepared and not self._started:
            # A prepared profiler holds kineto state; start+stop releases it cleanly.
            self._prof.start_trace()
            self._started = True
        self._stop()

    def range(self, name: str) -> AbstractContextManager[object]:
        rng: AbstractContextManager[object] = self._range_cls(name)
        return rng

    def close(self) -> None:
        self._stop()

    def _end_marker(self) -> None:
        marker, self._step_marker = self._step_marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    def _stop(self) -> None:
        self._end_marker()
        if self._started:
            self._started = self._prepared = False
            self._prof.stop_trace()


class TorchBackend:
    name: ClassVar[str] = "torch"
    extension: ClassVar[str] = ".pt.trace.json.gz"

    def open(self, info: CaptureInfo) -> TorchSession:
        return TorchSession(info)


BACKEND = TorchBackend
