"""The fake ``torch_npu.npu.memory``: allocator history on/off, recorded, and snapshots.

Signatures are the real ones (tests/test_memory_npu.py compares them with the wheel):
``_record_memory_history(enabled="all", *args, **kwargs)`` hands everything past
``enabled`` to ``_record_memory_history_impl``, whose values are checked with the messages
of torch_npu's C++ (``_npu_record_memory_history``). 2.5.1 has no
``augment_with_fx_traces`` on ``_snapshot``/``_dump_snapshot``.
"""

from __future__ import annotations

import copy
import pickle
import sys
from typing import Any

from .._fake import record

#: What ``_snapshot()`` returns; only the two keys torch_npu's C++ snapshot has (its
#: libtorch_npu.so has no "allocator_settings" or "external_annotations", unlike CUDA's).
SNAPSHOT: dict[str, Any] = {"segments": [], "device_traces": [[]]}

_ENABLED = (None, "state", "all")
_CONTEXT = (None, "state", "alloc", "all")
_STACKS = ("python", "all")

#: The recording state, as the allocator holds it: None when off.
history: dict[str, Any] | None = None


def _reset() -> None:
    global history
    history = None


def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
    return _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
) -> None:
    global history
    if enabled not in _ENABLED:
        raise RuntimeError("expected state to be 'state', 'all', or None")
    if context not in _CONTEXT:
        raise RuntimeError("expected context to be 'state', 'alloc', 'all', or None")
    if stacks not in _STACKS:
        raise RuntimeError("expected stacks to be 'python', or 'all'")
    record("memory.record_history", enabled, context, stacks, max_entries)
    history = (
        None
        if enabled is None
        else {"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries}
    )


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    record("memory.snapshot", device)
    return copy.deepcopy(SNAPSHOT)


def _dump_snapshot(
    filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False
) -> None:
    record("memory.dump_snapshot", filename)
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


# torch_npu 2.5.1's surface: no augment_with_fx_traces.
def _snapshot_251(device: Any = None) -> dict[str, Any]:
    return _snapshot_213(device)


def _dump_snapshot_251(filename: str = "dump_snapshot.pickle") -> None:
    _dump_snapshot_213(filename)


_snapshot_213, _dump_snapshot_213 = _snapshot, _dump_snapshot


def _use_version(old: bool) -> None:
    """Called by ``_fake.use_version``: the 2.5.1 or the 2.13.0 signatures."""
    global _snapshot, _dump_snapshot
    _snapshot = _snapshot_251 if old else _snapshot_213
    _dump_snapshot = _dump_snapshot_251 if old else _dump_snapshot_213
