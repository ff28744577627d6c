"""The vllm backend's settings (vLLM's own names), and what validate checks of them.

vLLM takes its profiler configuration at launch (``ProfilerConfig``,
``vllm/config/profiler.py``: ``--profiler-config``, ``LLM(profiler_config=...)``): the
folder, what torch.profiler records, and the schedule's wait/warm-up/active iterations.
Per session it takes only ``start_profile(profile_prefix, *, delay_iterations,
max_iterations, profiler_kwargs)``. So the settings below are printed by
``policy-engine engine-args`` for the launch, and the role's schedule maps onto them:
``skip_first`` -> ``delay_iterations`` (per session), ``wait`` / ``warmup`` / ``active`` ->
``wait_iterations`` / ``warmup_iterations`` / ``active_iterations`` (launch) and
``max_iterations = active`` (per session). vLLM's schedule records one cycle, so
``repeat`` must be 1.

Pure Python: validate imports this module, never vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policy_engine.settings.engines import absolute_dir

#: The vLLM release whose sources the driver and its tests were checked against.
CHECKED_VERSION = "0.33.0"
ACTIVITIES = ("CPU", "CUDA", "XPU")


def _flag(default: bool, meaning: str) -> dict[str, Any]:
    return {"type": "boolean", "default": default, "description": meaning}


#: The ``vllm:`` block of a role, as a JSON Schema fragment: every setting with its default.
SETTINGS: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "vLLM's profiler (ProfilerConfig), for a role whose work runs in a vLLM "
                   "engine driven by policy_engine.integrations.engines; launch settings "
                   "come from `policy-engine engine-args`. See docs/engines.md.",
    "properties": {
        "torch_profiler_dir": {
            "type": "string", "default": "",
            "description": "Launch. ProfilerConfig.torch_profiler_dir: where the engine "
                           "writes, an absolute path. Empty: <output_dir>/<role>/.engine. "
                           "The driver moves each capture's files from there into the "
                           "policy's layout.",
        },
        "torch_profiler_activities": {
            "type": ["array", "null"], "default": None, "uniqueItems": True,
            "items": {"enum": list(ACTIVITIES)},
            "description": "Launch. ProfilerConfig.torch_profiler_activities; null: the "
                           "platform's default (CPU and CUDA on GPUs). An empty list is an "
                           "error, never all.",
        },
        "torch_profiler_with_stack": _flag(
            True, "Launch. ProfilerConfig.torch_profiler_with_stack (vLLM's default: true)."),
        "torch_profiler_record_shapes": _flag(
            False, "Launch. ProfilerConfig.torch_profiler_record_shapes."),
        "torch_profiler_with_memory": _flag(
            False, "Launch. ProfilerConfig.torch_profiler_with_memory."),
        "torch_profiler_with_flops": _flag(
            False, "Launch. ProfilerConfig.torch_profiler_with_flops."),
        "torch_profiler_use_gzip": _flag(
            True, "Launch. ProfilerConfig.torch_profiler_use_gzip: .pt.trace.json.gz "
                  "(false: .pt.trace.json)."),
        "torch_profiler_dump_cuda_time_total": _flag(
            False, "Launch. ProfilerConfig.torch_profiler_dump_cuda_time_total: a "
                   "<name>.profiler_out.txt table beside each trace, left in "
                   "torch_profiler_dir (vLLM's default is true; off here)."),
        "ignore_frontend": _flag(
            True, "Launch. ProfilerConfig.ignore_frontend. AsyncLLM's front-end trace "
                  "records the whole session on no engine rank; true here (vLLM: false). "
                  "When false its file goes to <window>/frontend/."),
        "profiler_kwargs": {
            "type": "object", "default": {},
            "description": "Per session. start_profile(profiler_kwargs=...): keyword "
                           "arguments for torch.profiler.profile in each worker.",
        },
        "version": {
            "type": ["string", "null"], "default": None,
            "description": "The vLLM version the job runs, when known: validate warns "
                           "about what versions before the one checked (0.33.0) may lack.",
        },
    },
}


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    """What the schema cannot say about a ``vllm:`` block (merged over its defaults)."""
    problems = absolute_dir(settings, "torch_profiler_dir", "vLLM")
    activities = settings["torch_profiler_activities"]
    if activities is not None and not activities:
        problems.append(("torch_profiler_activities is empty: list at least one of "
                         f"{', '.join(ACTIVITIES)}, or null for the platform's default",
                         ("torch_profiler_activities",)))
    return problems


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    # The engine may run in other processes or behind a URL: nothing to import here.
    return []
