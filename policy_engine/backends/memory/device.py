"""The allocator-history calls of one device family, behind one small interface.

torch records a caching allocator's history per device family: ``torch.cuda.memory`` for
CUDA, ``torch_npu.npu.memory`` for Ascend NPUs. :class:`MemoryApi` is what the memory
backend needs of either; :func:`detect` picks the one this process can use. Nothing here
imports torch at module level (validate imports the backend's checks, never torch).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pickle
import sys
from collections.abc import Callable
from typing import Any, Protocol

from policy_engine.files.publish import open_temp

#: An out-of-memory observer: (device, bytes asked, the device's limit, device free). The
#: limit is the device's total memory, or the allowed maximum when a memory fraction is set
#: (torch's CUDACachingAllocator and torch_npu's call it so).
OomObserver = Callable[[int, int, int, int], None]


class MemoryApi(Protocol):
    """What the memory backend calls on a device family's allocator."""

    #: "cuda" or "npu": the family, for messages and the manifest
    device: str

    def unavailable(self) -> str | None:
        """Why history cannot be recorded in this process (no device, a torch without
        the calls), or None when it can."""

    def start(self, *, max_entries: int, stacks: str, context: str) -> None:
        """Turn history recording on with these settings."""

    def dump(self, path: str) -> None:
        """Write the history recorded so far as a snapshot pickle at ``path``."""

    def stop(self) -> None:
        """Turn history recording off (and let the allocator drop it)."""

    def attach_oom(self, observer: OomObserver) -> bool:
        """Call ``observer`` when the allocator runs out of memory; False when this
        torch cannot (there is no way to detach one: attach once per process)."""


class CudaMemory:
    """``torch.cuda.memory`` and ``torch._C._cuda_attach_out_of_memory_observer``."""

    device = "cuda"

    def __init__(self, memory: Any = None, attach: Any = None) -> None:
        # Tests pass stand-ins; by default torch's own, looked up when first used.
        self._memory = memory
        self._attach = attach

    def _module(self) -> Any:
        if self._memory is None:
            import torch.cuda.memory

            self._memory = torch.cuda.memory
        return self._memory

    def unavailable(self) -> str | None:
        try:
            memory = self._module()
        except ImportError as err:
            return f"torch is not importable ({err})"
        if not hasattr(memory, "_record_memory_history"):
            return "this torch has no torch.cuda.memory._record_memory_history"
        import torch

        if self._attach is None and not torch.cuda.is_available():
            return "no CUDA device in this process (torch.cuda.is_available() is False)"
        return None

    def start(self, *, max_entries: int, stacks: str, context: str) -> None:
        self._module()._record_memory_history(
            enabled="all", context=context, stacks=stacks, max_entries=max_entries)

    def dump(self, path: str) -> None:
        self._module()._dump_snapshot(path)

    def stop(self) -> None:
        self._module()._record_memory_history(enabled=None)

    def attach_oom(self, observer: OomObserver) -> bool:
        attach = self._attach
        if attach is None:
            import torch

            attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
            if attach is None:
                return False
        attach(observer)
        return True


#: What :class:`NpuMemory` calls in ``torch_npu.npu.memory``: function -> keywords passed.
#: (tests/test_memory_npu.py checks each against the real wheel's sources.)
NPU_USES: dict[str, tuple[str, ...]] = {
    "_record_memory_history": ("enabled", "context", "stacks", "max_entries"),
    "_snapshot": (),
}
#: The OOM hook in ``torch_npu._C`` (compiled: in the wheel's libtorch_npu.so, no .py).
NPU_ATTACH = "_npu_attach_out_of_memory_observer"


class NpuMemory:
    """``torch_npu.npu.memory`` (``torch.npu.memory`` once torch_npu is imported) and
    ``torch_npu._C._npu_attach_out_of_memory_observer``.

    :meth:`dump` pickles ``_snapshot()`` itself rather than calling ``_dump_snapshot``:
    torch_npu's ``_dump_snapshot`` also starts and stops the NPU profiler over the dump's
    folder (always up to 2.5.x; 2.13 when ``_npu_saveDevMemUsageInfo`` fails), which would
    cut short a profile running in the same process, and up to 2.5.x it creates the file
    write-only for its owner (mode 0o200, no O_TRUNC).
    """

    device = "npu"

    def __init__(
        self,
        memory: Any = None,
        attach: Any = None,
        available: Callable[[], bool] | None = None,
        version: str | None = None,
    ) -> None:
        # Tests pass stand-ins; by default torch_npu's own, looked up when first used.
        self._memory = memory
        self._attach = attach
        self._available = available
        self._version = version

    def _module(self) -> Any:
        if self._memory is None:
            self._memory = importlib.import_module("torch_npu.npu.memory")
        return self._memory

    def version(self) -> str:
        """The installed torch_npu's version, for messages ("unknown" if unreadable)."""
        if self._version is None:
            try:
                self._version = str(importlib.import_module("torch_npu").__version__)
            except Exception:  # torch_npu raises more than ImportError without CANN
                self._version = "unknown"
        return self._version

    def lacks(self) -> list[str]:
        """What of :data:`NPU_USES` the installed torch_npu.npu.memory does not have."""
        memory, out = self._module(), []
        for name, keywords in NPU_USES.items():
            fn = getattr(memory, name, None)
            if fn is None:
                out.append(f"torch_npu.npu.memory.{name}")
                continue
            taken = _keywords(fn)
            # torch_npu's _record_memory_history(enabled, *args, **kwargs) hands the rest on
            impl = getattr(memory, f"{name}_impl", None)
            if taken is None and impl is not None:
                passed_on = _keywords(impl)
                taken = None if passed_on is None else passed_on | {"enabled"}
            out.extend(
                f"the {kw}= keyword of torch_npu.npu.memory.{name}"
                for kw in keywords
                if taken is not None and kw not in taken
            )
        return out

    def unavailable(self) -> str | None:
        try:
            self._module()
        except Exception as err:  # without CANN, importing torch_npu fails in many ways
            return f"torch_npu is not importable ({type(err).__name__}: {err})"
        missing = self.lacks()
        if missing:
            return (
                f"torch_npu {self.version()} cannot record allocator history: it has no "
                + ", no ".join(missing)
            )
        available = self._available
        try:
            if available is None:  # torch_npu registers torch_npu.npu as torch.npu
                available = importlib.import_module("torch_npu.npu").is_available
            found = available()
        except Exception as err:  # a driver or CANN problem
            return f"torch.npu.is_available() failed ({type(err).__name__}: {err})"
        if not found:
            return "no Ascend NPU in this process (torch.npu.is_available() is False)"
        return None

    def start(self, *, max_entries: int, stacks: str, context: str) -> None:
        self._module()._record_memory_history(
            enabled="all", context=context, stacks=stacks, max_entries=max_entries
        )

    def dump(self, path: str) -> None:
        snapshot = self._module()._snapshot()
        with open_temp(path) as f:
            pickle.dump(snapshot, f)

    def stop(self) -> None:
        self._module()._record_memory_history(enabled=None)

    def attach_oom(self, observer: OomObserver) -> bool:
        attach = self._attach
        if attach is None:
            try:
                attach = getattr(importlib.import_module("torch_npu._C"), NPU_ATTACH, None)
            except Exception:
                return False
            if attach is None:
                return False
        attach(observer)
        return True


def _keywords(fn: Any) -> set[str] | None:
    """The keywords ``fn`` takes by name; None when it also takes any (``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a text signature
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def detect(prefer: str = "auto") -> MemoryApi:
    """The allocator API to use: ``prefer`` "cuda" or "npu", or "auto": the NPU one when
    torch_npu is installed (found, not imported: NpuMemory imports it when first used)."""
    if prefer == "cuda":
        return CudaMemory()
    if prefer == "npu":
        return NpuMemory()
    if prefer != "auto":
        raise ValueError(f"unknown memory device {prefer!r}: expected 'auto', 'cuda' or 'npu'")
    if "torch_npu" in sys.modules:  # imported already (or blocked: None)
        found = sys.modules["torch_npu"] is not None
    else:  # a top-level find_spec imports nothing
        found = importlib.util.find_spec("torch_npu") is not None
    return NpuMemory() if found else CudaMemory()
