"""Work counted, not timed: the lines of Python a block runs (``sys.settrace``).

A test of "refused before the expensive part", "bounded" or "linear in n" asserts on this
count, which is the same on every machine however loaded it is, instead of on seconds.
Work done inside C (a regex, ``json.loads``, libyaml) is not counted: where that part is
what could blow up, the test checks that it is never reached instead.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any


class Lines:
    """The number of Python lines run in the ``counted()`` block, in its own thread."""

    def __init__(self) -> None:
        self.count = 0


@contextlib.contextmanager
def counted() -> Iterator[Lines]:
    lines = Lines()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            lines.count += 1
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        yield lines
    finally:
        sys.settrace(previous)
