"""What the driver hands vLLM at launch and per capture (the vllm backend's part that
runs). Its settings live in :mod:`policy_engine.settings.vllm`, the checks of a
whole role in :mod:`policy_engine.language.rules.engine_roles`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.settings.vllm import ACTIVITIES as ACTIVITIES
from policy_engine.settings.vllm import SETTINGS as SETTINGS

__all__ = ["launch_config", "start_kwargs"]


def launch_config(settings: Mapping[str, Any], schedule: Any, folder: str) -> dict[str, Any]:
    """vLLM's ``ProfilerConfig`` for the role: settings, the folder, the schedule's
    launch part."""
    config: dict[str, Any] = {"profiler": "torch", "torch_profiler_dir": folder}
    for key in ("torch_profiler_with_stack", "torch_profiler_record_shapes",
                "torch_profiler_with_memory", "torch_profiler_with_flops",
                "torch_profiler_use_gzip", "torch_profiler_dump_cuda_time_total",
                "ignore_frontend"):
        config[key] = bool(settings[key])
    if settings["torch_profiler_activities"] is not None:
        config["torch_profiler_activities"] = list(settings["torch_profiler_activities"])
    if schedule is not None:
        config.update(wait_iterations=schedule.wait, warmup_iterations=schedule.warmup,
                      active_iterations=schedule.active)
    return config


def start_kwargs(settings: Mapping[str, Any], schedule: Any, prefix: str) -> dict[str, Any]:
    """What ``start_profile`` gets for one capture."""
    kwargs: dict[str, Any] = {"profile_prefix": prefix}
    if schedule is not None:
        kwargs.update(delay_iterations=schedule.skip_first, max_iterations=schedule.active)
    if settings["profiler_kwargs"]:
        kwargs["profiler_kwargs"] = dict(settings["profiler_kwargs"])
    return kwargs
