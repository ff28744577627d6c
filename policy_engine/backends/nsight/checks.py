"""What the schema cannot say about an ``nsight:`` block, and what stops it here.

Pure Python: validate imports this module, never nvtx or torch.
"""

from __future__ import annotations

import glob
import importlib.util
from collections.abc import Mapping
from typing import Any

from policy_engine.backends.nsight.launch import options_problems

NO_CUDA = "capture cuda_profiler_api needs a CUDA device; use capture: nvtx (or auto) without one"


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    return options_problems(settings)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # imported already, without a spec
        return True


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    """What stops captures here; imports nothing (the CLI never imports torch)."""
    problems = []
    capture = settings.get("capture", "auto")
    if (capture != "cuda_profiler_api" or settings.get("ranges", True)) and not _installed("nvtx"):
        problems.append("nvtx is not installed: pip install nvtx")
    if capture == "cuda_profiler_api":
        if not _installed("torch"):
            problems.append("capture cuda_profiler_api needs torch: pip install torch")
        elif not glob.glob("/dev/nvidia[0-9]*"):
            problems.append(NO_CUDA)
    return problems
