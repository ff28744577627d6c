"""The fake ``torch_npu.npu``: as in the real package, ``mstx`` here is the class."""

from . import memory
from .mstx import mstx

__all__ = ["current_stream", "is_available", "memory", "mstx"]


def current_stream() -> None:
    return None


def is_available() -> bool:
    """``torch.npu.is_available()`` (torch_npu registers this module as ``torch.npu``)."""
    from .. import _fake

    return _fake.available
