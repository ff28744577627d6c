"""What the driver hands SGLang at launch and per capture (the sglang backend's part that
runs). Its settings live in :mod:`policy_engine.settings.sglang`, the checks of a
whole role in :mod:`policy_engine.language.rules.engine_roles`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.settings.sglang import SETTINGS as SETTINGS

__all__ = ["launch_env", "start_kwargs"]


def start_kwargs(settings: Mapping[str, Any], schedule: Any, folder: str, prefix: str,
                 profile_id: str) -> dict[str, Any]:
    """The ``ProfileReq`` fields of one capture's start request."""
    kwargs: dict[str, Any] = {
        "output_dir": folder, "activities": list(settings["activities"]),
        "with_stack": bool(settings["with_stack"]),
        "record_shapes": bool(settings["record_shapes"]),
        "profile_by_stage": bool(settings["profile_by_stage"]),
        "profile_id": profile_id, "profile_prefix": prefix, "merge_profiles": False,
    }
    if schedule is not None:
        kwargs["num_steps"] = schedule.active
    if settings["profile_stages"] is not None:
        kwargs["profile_stages"] = list(settings["profile_stages"])
    return kwargs


def launch_env(settings: Mapping[str, Any], folder: str) -> dict[str, str]:
    """The environment an SGLang engine needs for the requests to mean what they say."""
    return {"SGLANG_TORCH_PROFILER_DIR": folder,
            "SGLANG_PROFILE_WITH_STACK": "true" if settings["with_stack"] else "false",
            "SGLANG_PROFILE_RECORD_SHAPES": "true" if settings["record_shapes"] else "false"}
