"""A capture's collective calls, noted where its trace cannot name them.

Under gloo (torch 2.13) a trace shows each collective as ``c10d::<op>_`` on the calling
thread and ``gloo:<op>`` on a worker thread, with no process group, no sequence number
and (without ``record_shapes``) no sizes, so its calls cannot be matched across ranks.
torch's flight recorder already keeps, for every process group of every backend, a ring
of the last calls (``TORCH_FR_BUFFER_SIZE``, 2,000 by default): group name and
description, the group's sequence number, the operation, input and output sizes and
dtypes, and the wall-clock time it was issued. When a torch capture's cycle is saved,
:meth:`CollectiveNotes.facts` reads that ring once and keeps the calls issued since the
cycle started recording, as rows ``[group, description, seq, op, bytes, dtype, issued
ns]`` in the trace's ``policy_engine`` metadata (``collectives``), where
analysis/collectives.py pairs them with the worker events.

Cost: nothing outside captures (torch records the ring whether or not anyone reads it);
at each save of a capture in a process whose torch.distributed is up, one dump of the
ring without stack traces (about 20 ms for 2,000 entries) on the thread that saves. It
never raises: a failure is a note (``error``) in the metadata, and the trace is saved as
it would have been.
"""

from __future__ import annotations

import logging
import math
import pickle
import sys
import time
from typing import Any

from policy_engine.analysis.collective_form import dtype_bytes

log = logging.getLogger("policy_engine")

#: Calls noted per cycle at most; past it, the count left out is noted.
MAX_NOTES = 20_000


class CollectiveNotes:
    """The notes of one capture: where its recording started, and what torch's flight
    recorder holds of the calls since. ``enabled``: the capture writes a torch trace."""

    __slots__ = ("enabled", "since")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.since: int | None = None

    def start(self) -> None:
        """A cycle starts recording: calls issued from now on are its own."""
        if self.enabled:
            self.since = time.time_ns()

    def facts(self) -> dict[str, Any]:
        """``{"collectives": notes}`` for the session's facts, or ``{}`` when there is
        nothing to note (not a torch capture, torch.distributed not up)."""
        since = self.since
        if since is None:
            return {}
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return {}
            return {"collectives": _read(since)}
        except Exception as err:  # never fails the save: the trace says why
            log.debug("collective notes failed: %r", err)
            return {"collectives": {"error": f"{type(err).__name__}: {err}"[:200]}}


def _read(since: int) -> dict[str, Any]:
    from torch._C import _distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        return {"error": "this torch has no flight recorder (_dump_fr_trace)"}
    # collectives, no stack traces, every entry: torch's own bytes, in this process
    data = pickle.loads(dump(True, False, False))
    entries = data.get("entries", []) if isinstance(data, dict) else []
    rows: list[list[Any]] = []
    left_out = 0
    for e in entries:
        created = e.get("time_created_ns")
        if not isinstance(created, int) or created < since or e.get("is_p2p"):
            continue
        if len(rows) >= MAX_NOTES:
            left_out += 1
            continue
        group = e.get("process_group") or ("", "")
        dtypes = list(e.get("input_dtypes") or ()) + list(e.get("output_dtypes") or ())
        rows.append([str(group[0]), str(group[1]), e.get("collective_seq_id"),
                     str(e.get("profiling_name", "")), _bytes(e),
                     str(dtypes[0]) if dtypes else "", created])
    notes: dict[str, Any] = {"from": "flight_recorder", "since_ns": since, "calls": rows}
    if left_out:
        notes["left_out"] = left_out
    first = min((e.get("time_created_ns", 0) for e in entries), default=None)
    if first is not None and first > since and entries:
        notes["turned_over"] = ("the flight recorder's ring (TORCH_FR_BUFFER_SIZE) turned "
                                "over during the capture: its first calls are not noted")
    elif not entries:
        notes["empty"] = "the flight recorder holds no calls (TORCH_FR_BUFFER_SIZE=0?)"
    return notes


def _bytes(entry: dict[str, Any]) -> int:
    """The larger of the call's input and output bytes."""
    def side(sizes: Any, dtypes: Any) -> int:
        total = 0
        for shape, dtype in zip(sizes or (), dtypes or (), strict=False):
            total += math.prod(int(d) for d in shape) * (dtype_bytes(str(dtype)) or 0)
        return total
    return max(side(entry.get("input_sizes"), entry.get("input_dtypes")),
               side(entry.get("output_sizes"), entry.get("output_dtypes")))
