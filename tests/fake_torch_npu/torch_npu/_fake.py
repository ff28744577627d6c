"""The fake's call log and version switch."""

from __future__ import annotations

from typing import Any

#: every call into the fake, as (name, details...) tuples, in order
CALLS: list[tuple[Any, ...]] = []
#: what ``torch_npu.npu.is_available()`` answers
available = True


def record(name: str, *details: Any) -> None:
    CALLS.append((name, *details))


def names() -> list[str]:
    return [call[0] for call in CALLS]


def calls(name: str) -> list[tuple[Any, ...]]:
    return [call for call in CALLS if call[0] == name]


def reset() -> None:
    global available
    from . import _C
    from .npu import memory
    from .profiler import profiler

    CALLS.clear()
    profiler._reset_state()
    memory._reset()
    _C.observers.clear()
    available = True


def out_of_memory(device: int, asked: int, allocated: int, free: int) -> None:
    """An allocation fails: the attached observers are called, as torch_npu's C++ does."""
    from . import _C

    record("out_of_memory", device, asked, allocated, free)
    for observer in list(_C.observers):
        observer(device, asked, allocated, free)


def use_version(version: str) -> None:
    """Give the fake the API surface of ``version``: "2.13.0" (default) or "2.5.1".

    2.5.1 has no ``mstx=`` (only ``msprof_tx=``), no mstx domain filters, no
    ``domain`` argument on ``mstx.range_start``/``range_end`` and no
    ``augment_with_fx_traces`` on ``npu.memory._snapshot``/``_dump_snapshot``.
    """
    import importlib

    import torch_npu

    from . import version as version_module
    from .npu import memory
    from .profiler import experimental_config, profiler

    # `from .npu import mstx` would give the class: torch_npu.npu rebinds the name to it
    mstx_module = importlib.import_module("torch_npu.npu.mstx")

    old = version.startswith("2.5.")
    config = (
        experimental_config._ExperimentalConfig251
        if old
        else experimental_config._ExperimentalConfig213
    )
    experimental_config._ExperimentalConfig = config
    profiler._ExperimentalConfig = config
    torch_npu.profiler._ExperimentalConfig = config
    cls = mstx_module.mstx
    for name in ("mark", "range_start", "range_end"):
        setattr(cls, name, staticmethod(getattr(mstx_module, f"_{name}{'_251' if old else ''}")))
    memory._use_version(old)
    torch_npu.__version__ = version_module.__version__ = version


def warn(message: str) -> None:
    """What torch_npu prints with print_warn_msg (and then carries on)."""
    record("warning", message)
