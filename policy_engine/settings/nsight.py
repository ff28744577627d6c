"""The nsight backend's settings (and the NVTX range names a launch and a process share),
what the schema cannot say about them, and what stops the backend here.

Pure Python: validate imports this module, never nvtx or torch.
"""

from __future__ import annotations

import glob
import importlib.util
import re
from collections.abc import Mapping
from typing import Any

#: The NVTX range the engine opens around every capture, and its domain. Fixed, so that
#: ``--nvtx-capture=NAME@DOMAIN`` never depends on the policy; region names are method
#: names (no dots), so they cannot collide with it.
CAPTURE_RANGE = "policy_engine.capture"
CAPTURE_DOMAIN = "policy_engine"
_SHORT = {
    "t": "trace",
    "c": "capture-range",
    "p": "nvtx-capture",
    "o": "output",
    "f": "force-overwrite",
}
#: nsys options the engine sets itself, and what to change instead.
_RESERVED = {
    "capture-range": "set nsight.capture instead",
    "capture-range-end": "set nsight.capture_range_end instead",
    "nvtx-capture": "the engine names its capture range itself",
    "output": "the policy's name template sets it",
    "force-overwrite": "traces are never overwritten",
}


def long_option(key: str) -> str:
    """The long nsys option a settings key names (``t`` -> ``trace``)."""
    key = key.replace("_", "-")
    return _SHORT.get(key, key)


def option_text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def options_problems(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    """What is wrong in an ``nsight`` block (merged over its defaults) beyond the schema,
    which checked each option's name and value: (message, sub-path)."""
    problems: list[tuple[str, tuple[str | int, ...]]] = []
    options: Mapping[str, Any] = settings["options"]
    seen: dict[str, str] = {}
    for key, value in options.items():
        where: tuple[str | int, ...] = ("options", key)
        name = long_option(key)
        if name in _RESERVED:
            problems.append((f"option {key!r} is set by the engine: {_RESERVED[name]}", where))
        elif name in seen:
            # Options merge over the defaults' {trace: ...}, so `t:` meets `trace:` there.
            hint = " (the defaults set it as 'trace')" if name == "trace" else ""
            problems.append(
                (
                    f"options {seen[name]!r} and {key!r} both set nsys --{name}: keep one{hint}",
                    where,
                )
            )
        # Ray joins the options with spaces into a shell command line.
        if re.search(r"\s", option_text(value)):
            problems.append((f"option {key!r}: value {value!r} must not contain spaces", where))
        seen[name] = key
    trace = next((option_text(v) for k, v in options.items() if long_option(k) == "trace"), "")
    traced = set(trace.split(","))
    if settings["capture"] != "cuda_profiler_api" and "nvtx" not in traced:
        problems.append(
            (f"capture by NVTX range needs 'nvtx' in options.trace (got {trace!r})", ("options",))
        )
    elif settings["ranges"] and "nvtx" not in traced:
        problems.append(
            (
                f"ranges: true needs 'nvtx' in options.trace (got {trace!r}); or set ranges: false",
                ("ranges",),
            )
        )
    return problems


NO_CUDA = "capture cuda_profiler_api needs a CUDA device; use capture: nvtx (or auto) without one"

#: The ``nsight:`` block of a role, as a JSON Schema fragment: every setting with its default.
SETTINGS: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": (
        "Nsight Systems settings. The process runs under `nsys profile` with the "
        "arguments `policy-engine nsys-args` prints; see docs/nsight.md."
    ),
    "properties": {
        "ranges": {
            "type": "boolean",
            "default": True,
            "description": (
                "Regions and inner steps are NVTX ranges (in `domain`) while a "
                "capture records. Needs 'nvtx' in options.trace."
            ),
        },
        "capture": {
            "enum": ["auto", "cuda_profiler_api", "nvtx"],
            "default": "auto",
            "description": (
                "How a capture starts and stops nsys: nvtx (an NVTX range "
                "policy_engine.capture in domain policy_engine, for "
                "--capture-range=nvtx; works without a GPU), cuda_profiler_api "
                "(cudaProfilerStart/Stop, for --capture-range=cudaProfilerApi; "
                "needs CUDA), auto (the NVTX range always, cudaProfilerStart too "
                "when CUDA is available; launched as nvtx)."
            ),
        },
        "capture_range_end": {
            "enum": ["auto", "stop", "stop-shutdown", "repeat", "repeat-shutdown"],
            "default": "auto",
            "description": (
                "nsys --capture-range-end. auto: repeat-shutdown:N with N the "
                "capture ranges a profiled process opens, computed from the plan "
                "(repeat when the plan cannot say); repeat and repeat-shutdown get "
                "the same N. Shutdown modes add --kill none so training goes on."
            ),
        },
        "domain": {
            "type": "string",
            "minLength": 1,
            "default": CAPTURE_DOMAIN,  # the capture range's own domain
            "description": "NVTX domain of region and inner-step ranges.",
        },
        "options": {
            "type": "object",
            "default": {"trace": "cuda,nvtx"},
            "description": (
                "Other nsys profile options, by their long (or one-letter) name "
                "without dashes: {trace: 'cuda,nvtx,osrt', cuda-memory-usage: "
                "true}. The engine sets capture-range, capture-range-end, "
                "nvtx-capture and output itself."
            ),
            "propertyNames": {"pattern": "^[A-Za-z][A-Za-z0-9_-]*$"},
            "additionalProperties": {"type": ["string", "integer", "boolean"]},
        },
    },
}


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    """What the schema cannot say about an ``nsight:`` block (merged over its defaults)."""
    return options_problems(settings)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # imported already, without a spec
        return True


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    """What stops captures here; imports nothing (the CLI never imports torch)."""
    problems = []
    capture = settings["capture"]
    if (capture != "cuda_profiler_api" or settings["ranges"]) and not _installed("nvtx"):
        problems.append("nvtx is not installed: pip install nvtx")
    if capture == "cuda_profiler_api":
        if not _installed("torch"):
            problems.append("capture cuda_profiler_api needs torch: pip install torch")
        elif not glob.glob("/dev/nvidia[0-9]*"):
            problems.append(NO_CUDA)
    return problems
