"""The torch backend's settings: the ``torch:`` block of a role and its validate-time
checks (pure Python: validate imports this module, never torch), and the tables the
session turns the settings into torch.profiler's arguments with."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

#: Policy activity -> torch.profiler.ProfilerActivity member.
ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU"}
#: Settings passed to torch.profiler.profile() as they are.
FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")
_TIMELINE_NEEDS = ("profile_memory", "record_shapes", "with_stack")


def _flag(meaning: str) -> dict[str, Any]:
    return {"type": "boolean", "default": False, "description": meaning}


#: The ``torch:`` block of a role, as a JSON Schema fragment: every setting with its default.
SETTINGS: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "torch.profiler settings.",
    "properties": {
        "activities": {
            "type": "array",
            "uniqueItems": True,
            "items": {"enum": list(ACTIVITIES)},
            "default": ["cpu", "cuda"],
            "description": "torch.profiler.ProfilerActivity values. One that cannot run in "
                           "the process (no GPU) is dropped with one warning; an empty list "
                           "is an error, never all.",
        },
        "record_shapes": _flag("torch.profiler.profile(record_shapes=)."),
        "profile_memory": _flag("torch.profiler.profile(profile_memory=)."),
        "with_stack": _flag("torch.profiler.profile(with_stack=)."),
        "with_flops": _flag("torch.profiler.profile(with_flops=)."),
        "with_modules": _flag("torch.profiler.profile(with_modules=)."),
        "memory_timeline": _flag(
            "Also write prof.export_memory_timeline() beside each trace: <name>.memory.html "
            "(torch draws it with matplotlib, on CUDA), else the plot's points as "
            "<name>.memory.json.gz. Needs profile_memory, record_shapes and with_stack."),
        "gzip": {"type": "boolean", "default": True,
                 "description": "Write .pt.trace.json.gz; false writes .pt.trace.json."},
    },
}


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    """What the schema cannot say about a ``torch:`` block (merged over its defaults)."""
    if not settings["activities"]:
        return [("activities is empty: list at least one of cpu, cuda "
                 "(an empty list never means all)", ("activities",))]
    missing = [flag for flag in _TIMELINE_NEEDS if not settings[flag]]
    if settings["memory_timeline"] and missing:
        return [(f"memory_timeline needs {', '.join(missing)}: true as well (torch builds the "
                 "timeline from the memory events, shapes and stacks they record)",
                 ("memory_timeline",))]
    return []


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    if importlib.util.find_spec("torch") is None:
        return ["torch is not installed: pip install torch"]
    if settings["memory_timeline"] and importlib.util.find_spec("matplotlib") is None:
        return ["memory_timeline draws its HTML page with matplotlib, which is not installed "
                "(pip install matplotlib); without it the timeline's points are written as "
                "<name>.memory.json.gz"]
    return []
