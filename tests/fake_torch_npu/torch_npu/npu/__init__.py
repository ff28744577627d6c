"""The fake ``torch_npu.npu``: as in the real package, ``mstx`` here is the class."""

from .mstx import mstx

__all__ = ["current_stream", "mstx"]


def current_stream() -> None:
    return None
