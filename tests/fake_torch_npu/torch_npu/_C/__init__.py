"""The fake of torch_npu's compiled ``_C``: the out-of-memory hook (and ``_profiler``).

The real one is in the wheel's libtorch_npu.so (2.5.1 and 2.13.0): torch_npu calls the
observer with (device, bytes asked, device allocated, device free) when an allocation
fails. ``torch_npu._fake.out_of_memory`` plays that failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: the observers attached, in order (the real hook has no way to detach one)
observers: list[Callable[[int, int, int, int], Any]] = []


def _npu_attach_out_of_memory_observer(observer: Callable[[int, int, int, int], Any]) -> None:
    from .._fake import record

    record("memory.attach_oom", observer)
    observers.append(observer)
