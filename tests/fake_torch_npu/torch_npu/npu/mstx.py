"""The fake ``torch_npu.npu.mstx``: host-side ranges and marks, recorded with their ids."""

from __future__ import annotations

import itertools
from typing import Any

from .._fake import record

__all__ = ["mstx"]

_ids = itertools.count(1)


def _mark(message: str, stream: Any = None, domain: str = "default") -> None:
    record("mstx.mark", message, stream, domain)


def _range_start(message: str, stream: Any = None, domain: str = "default") -> int:
    if not message or not isinstance(message, str) or not domain:
        return 0  # like the real one: a refused range gets id 0, no exception
    range_id = next(_ids)
    record("mstx.range_start", message, stream, domain, range_id)
    return range_id


def _range_end(range_id: int, domain: str = "default") -> None:
    record("mstx.range_end", range_id, domain)


# torch_npu 2.5.1's surface: no stream on mark, no domain anywhere.
def _mark_251(message: str = "") -> None:
    record("mstx.mark", message, None, None)


def _range_start_251(message: str, stream: Any = None) -> int:
    if not message or not isinstance(message, str):
        return 0
    range_id = next(_ids)
    record("mstx.range_start", message, stream, None, range_id)
    return range_id


def _range_end_251(range_id: int) -> None:
    record("mstx.range_end", range_id, None)


class mstx:  # lower-case, as in torch_npu
    mark = staticmethod(_mark)
    range_start = staticmethod(_range_start)
    range_end = staticmethod(_range_end)

    @staticmethod
    def range_push(message: str, stream: Any = None, domain: str = "default") -> int:
        record("mstx.range_push", message, domain)
        return 0

    @staticmethod
    def range_pop(domain: str = "default") -> int:
        record("mstx.range_pop", domain)
        return 0
