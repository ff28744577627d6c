"""A stand-in for torch_npu in tests: no CANN, no device, every call recorded.

It has the real package's names and keyword signatures for what the engine uses (checked
against the real wheel by tests/test_torch_npu_contract.py), and behaves like it where the
engine depends on it: the process-wide output path set by ``tensorboard_trace_handler``,
the ``{worker}_{pid}_{timestamp}_ascend_pt`` folder, and the schedule transitions of
``profile``. ``torch_npu._fake`` holds the call log and switches the version surface.
"""

from . import _fake, npu, profiler
from .version import __version__

__all__ = ["__version__", "_fake", "npu", "profiler"]
