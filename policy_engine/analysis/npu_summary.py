"""An Ascend capture summed up as a torch trace is (:func:`summarize_npu`): the summary
``analyze``, ``compare`` and the straggler read, with basis ``npu``.

torch_npu writes a capture as a ``*_ascend_pt`` folder; once analysed it holds
``ASCEND_PROFILER_OUTPUT/trace_view.json`` (:mod:`~policy_engine.analysis.ascend` reads it
and says where it looks). From it:

- **the step view**, per host ``ProfilerStep#N``: its wall time on the host, and what the
  NPU did within it: computing (Ascend Hardware tasks other than memory copies),
  communication (HCCL's operators), both at once, memory copies and idle;
- **the device view**: TraceLens's ``gpu_timeline`` per step (over the tasks the step
  launched) and for the capture, computed as for a GPU; and msprof's own figures
  (``ascend``: computing, communication, communication not overlapped and free, ours from
  the tasks, and torch_npu's Overlap Analysis lanes read back beside them);
- its collective calls (HCCL's), and the rank from ``profiler_info_<rank>.json``.

Regions (mstx ranges) are not read from ``trace_view.json``: its rows do not say which
host ranges are the policy's (the summary says so, ``regions_left_out``: 0, no regions).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from policy_engine.analysis.ascend import AscendView, find_trace_view
from policy_engine.analysis.chrome_trace import TraceError, TraceReader
from policy_engine.analysis.collectives import Collectives
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.intervals import bounds, breakdown, union

#: torch_npu's file beside ``ASCEND_PROFILER_OUTPUT`` that names the capture's rank.
_INFO = re.compile(r"^profiler_info_(\d{1,9})\.json$")
_INFO_BYTES = 1 << 20
#: A trace_view.json inflating past this many times its size is no trace (as summary's).
MAX_RATIO = 100


def _round(value: float) -> float:
    return round(value, 3)


def _rank_of(folder: str) -> int | None:
    """The rank of the capture in ``folder``, from torch_npu's ``profiler_info_<rank>.json``
    (its name; the file's ``rank_id`` where the name has none)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        found = _INFO.match(name)
        if found:
            return int(found.group(1))
    if "profiler_info.json" in names:
        try:
            with open(os.path.join(folder, "profiler_info.json"), "rb") as f:
                info = json.loads(f.read(_INFO_BYTES))
        except (OSError, ValueError):
            return None
        rank = info.get("rank_id") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) and rank >= 0 else None
    return None


def summarize_npu(path: str, *, max_bytes: int | None = None) -> dict[str, Any]:
    """The summary of the Ascend capture at ``path`` (a ``*_ascend_pt`` folder or its
    ``trace_view.json``); ``{"error": ...}`` when it cannot be read (or holds more than
    ``max_bytes`` of text)."""
    try:
        found = find_trace_view(path)
    except AnalysisError as err:
        return {"error": str(err)}
    view, calls = AscendView(), Collectives()
    try:
        size = os.path.getsize(found)
        with TraceReader(found, max_bytes=max_bytes, max_ratio=MAX_RATIO) as reader:
            for event in reader.events():
                view.event(event)
                calls.event(event)
            meta, count = reader.meta, reader.count
    except TraceError as err:
        return {"error": f"{found}: {err}"}
    except OSError as err:
        return {"error": f"cannot read {found}: {err.strerror or err}"}
    result = view.result()
    if result["error"] is not None or view.merged is None:
        return {"error": str(result["error"])}
    comp, comm, mem = view.merged
    device = {row["step"]: row["gpu_timeline"] for row in result["steps"]}
    steps = [{"step": number, "time_us": _round(end - start),
              **breakdown(comp, comm, mem, start, end), "gpu_timeline": device.get(number)}
             for number, start, end in view.host_steps]
    whole = bounds(union(comp, comm, mem))
    if not steps and whole is not None:  # no ProfilerStep: the capture is one step
        steps = [{"step": None, "time_us": _round(whole[1] - whole[0]),
                  **breakdown(comp, comm, mem, *whole),
                  "gpu_timeline": result["gpu_timeline"]}]
    folder = os.path.dirname(os.path.dirname(found))
    rank = _rank_of(folder)
    return {
        "bytes": size,
        "basis": "npu",
        "steps": steps,
        "gpu_timeline": result["gpu_timeline"],
        "hta": None,
        "device_error": None,
        "ascend": {"overlap": result["overlap"], "lanes": result["lanes"]},
        "collectives": calls.result(meta),
        "regions": {},
        "ops": {"top": [], "left_out": 0},
        "facts": {
            "events": count,
            "profiler_steps": len(view.host_steps),
            "kernels": result["device_events"],
            "comm_kernels": 0,
            "cpu_comm_ops": 0,
            "distributed_info": None if rank is None else {
                "rank": rank, "world_size": None, "backend": "hccl"},
            "hta_unrecognised": [],
            "looks_like_comm": [],
            "regions_left_out": 0,
        },
    }
