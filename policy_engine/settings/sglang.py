"""The sglang backend's settings (SGLang's own names), and what validate checks of them.

SGLang takes its profiler settings per request: ``Engine.start_profile(**kwargs)`` and the
server's ``/start_profile`` build a ``ProfileReq`` (``srt/managers/io_struct.py``;
``ProfileReqInput`` in older releases). Only defaults come from the launch environment:
``SGLANG_TORCH_PROFILER_DIR`` (the folder when a request names none, else ``/tmp``),
``SGLANG_PROFILE_WITH_STACK`` and ``SGLANG_PROFILE_RECORD_SHAPES`` (either set to false
turns the feature off whatever a request asks), which ``policy-engine engine-args``
prints. ``start_step`` counts the engine's forward passes since it started, which the
driver cannot see, so a schedule maps only as ``{active: N}`` -> ``num_steps: N``.

Pure Python: validate imports this module, never SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.settings.engines import absolute_dir

CHECKED_VERSION = "0.5.23"
ACTIVITIES = ("CPU", "GPU", "MEM")
#: The stages SGLang profiles apart with profile_by_stage (lower case, as regions name them).
STAGES = ("extend", "decode")


def _flag(default: bool, meaning: str) -> dict[str, Any]:
    return {"type": "boolean", "default": default, "description": meaning}


#: The ``sglang:`` block of a role, as a JSON Schema fragment: every setting with its default.
SETTINGS: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "SGLang's profiler (ProfileReq), for a role whose work runs in an "
                   "SGLang engine driven by policy_engine.integrations.engines. See "
                   "docs/engines.md.",
    "properties": {
        "output_dir": {
            "type": "string", "default": "",
            "description": "Per request. ProfileReq.output_dir: where the engine writes, an "
                           "absolute path. Empty: <output_dir>/<role>/.engine. The driver "
                           "moves each capture's files from there into the policy's layout.",
        },
        "activities": {
            "type": "array", "uniqueItems": True, "default": ["CPU", "GPU"],
            "items": {"enum": list(ACTIVITIES)},
            "description": "Per request. ProfileReq.activities: CPU and GPU record a torch "
                           "trace, MEM a CUDA memory snapshot per rank (<name>.pickle). RPD "
                           "and CUDA_PROFILER are not driven (their files carry no prefix, "
                           "or there is none). An empty list is an error, never all.",
        },
        "with_stack": _flag(True, "Per request. ProfileReq.with_stack (SGLang's default: "
                                  "true)."),
        "record_shapes": _flag(False, "Per request. ProfileReq.record_shapes (SGLang's "
                                      "default: true; off here, as for torch)."),
        "profile_by_stage": _flag(
            False, "Per request. ProfileReq.profile_by_stage: a trace per stage and rank. "
                   "Needs discrete: true with regions [extend, decode] (the stages: each "
                   "is named by <region>) and schedule {active: N, repeat: 1} (N forward "
                   "passes each)."),
        "profile_stages": {
            "type": ["array", "null"], "default": None, "uniqueItems": True,
            "items": {"type": "string", "minLength": 1},
            "description": "Per request. ProfileReq.profile_stages (with profile_by_stage; "
                           "read by SGLang's SGLANG_PROFILE_V2 profiler).",
        },
        "merge_profiles": _flag(
            False, "Per request. ProfileReq.merge_profiles. Must stay false: the per-rank "
                   "files are the layout; `policy-engine merge` joins a window."),
        "version": {
            "type": ["string", "null"], "default": None,
            "description": "The SGLang version the job runs, when known: validate warns "
                           "about what versions before the one checked (0.5.23) may lack.",
        },
    },
}


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    """What the schema cannot say about an ``sglang:`` block (merged over its defaults)."""
    problems = absolute_dir(settings, "output_dir", "SGLang")
    if not settings["activities"]:
        problems.append(("activities is empty: list at least one of "
                         f"{', '.join(ACTIVITIES)} (an empty list never means all)",
                         ("activities",)))
    if settings["merge_profiles"]:
        problems.append(("merge_profiles: true writes one merged file on one rank in place "
                         "of the per-rank traces the layout keeps; join a window afterwards "
                         "with `policy-engine merge`", ("merge_profiles",)))
    if settings["profile_stages"] is not None and not settings["profile_by_stage"]:
        problems.append(("profile_stages needs profile_by_stage: true", ("profile_stages",)))
    return problems


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    # The engine may run in other processes or behind a URL: nothing to import here.
    return []
