"""The memory backend's settings and checks (pure Python: validate imports this module).

The memory backend records the caching allocator's history while a capture records
(``torch.cuda.memory._record_memory_history``, or ``torch_npu.npu.memory``'s on Ascend)
and writes it at each saved cycle as ``<name>.pickle``, the snapshot that
``policy-engine memory-plot`` and PyTorch's memory viewer read.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

#: The ``memory:`` block of a role, as a JSON Schema fragment: every setting with its default.
SETTINGS: Mapping[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "description": "Allocator history (backend memory): CUDA, or Ascend NPU through torch_npu.",
    "properties": {
        "max_entries": {
            "type": "integer", "minimum": 1, "default": 100000,
            "description": "_record_memory_history(max_entries=): the allocator events "
                           "kept; older ones are dropped first.",
            "examples": [100000, 1000000],
        },
        "stacks": {
            "enum": ["python", "all"], "default": "python",
            "description": "_record_memory_history(stacks=): python frames only, or C++ "
                           "frames too (all: much slower to dump).",
        },
        "context": {
            "enum": ["alloc", "state", "all"], "default": "all",
            "description": "_record_memory_history(context=): keep the stack of each "
                           "allocation (alloc), of each live block (state), or both.",
        },
        "history": {
            "enum": ["capture", "always"], "default": "capture",
            "description": "When allocator history is recorded. capture: while a capture "
                           "records (each snapshot holds its cycle's events). always: from "
                           "the first step to the end of the run, bounded by max_entries, "
                           "so that an out-of-memory error anywhere, inside a capture or "
                           "not, writes <name>_oom.pickle named for the step it happened "
                           "in (with on_oom: true); snapshots then hold the last "
                           "max_entries events.",
        },
        "on_oom": {
            "type": "boolean", "default": True,
            "description": "On an out-of-memory error while a capture is open (with "
                           "history: always, at any step), write <name>_oom.pickle "
                           "(manifest status oom).",
        },
        "plot": {
            "type": "boolean", "default": False,
            "description": "Also write <name>.html beside each snapshot: the offline plot "
                           "of `policy-engine memory-plot`.",
        },
        "device": {
            "enum": ["auto", "cuda", "npu"], "default": "auto",
            "description": "Whose allocator: auto takes npu when torch_npu is installed, "
                           "cuda otherwise.",
        },
    },
}


def check_settings(settings: Mapping[str, Any]) -> list[tuple[str, tuple[str | int, ...]]]:
    """Nothing beyond the schema: every value it accepts is meaningful."""
    return []


def _cuda_device() -> str | None:
    """Why this process sees no CUDA device, found without importing torch (validate
    never does): the driver's files and CUDA_VISIBLE_DEVICES. None when it sees one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every CUDA device"
    if not (os.path.exists("/proc/driver/nvidia/version") or glob.glob("/dev/nvidia[0-9]*")):
        return "no NVIDIA driver or device here (/proc/driver/nvidia, /dev/nvidia*)"
    return None


def check_runtime(settings: Mapping[str, Any]) -> list[str]:
    """What stops allocator history here: torch missing, no CUDA (or NPU) device."""
    if importlib.util.find_spec("torch") is None:
        return ["torch is not installed: pip install torch"]
    npu = importlib.util.find_spec("torch_npu") is not None
    device = settings["device"]
    if device == "npu" or (device == "auto" and npu):
        if not npu:
            return ["device npu needs torch_npu, which is not installed"]
        return []  # torch_npu's device check needs CANN: the backend reports it at run time
    missing = _cuda_device()
    if missing is not None:
        return [f"allocator history needs a CUDA device: {missing}"]
    return []
