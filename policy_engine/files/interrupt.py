"""Signals that end a process at once, made to unwind it instead while a file is being
written, so that its temporary file is removed (:func:`~policy_engine.files.publish.publish`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

__all__ = ["stopped_cleanly"]


class _Stopped(BaseException):
    """A signal whose default is to end the process came while :func:`publish` wrote."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stopped_cleanly() -> Iterator[None]:
    """On the main thread, SIGTERM and SIGINT left to their default (the process ends at
    once, running no ``finally``) raise instead while the block runs, so that it removes
    its temporary file; the signal is then delivered again with its default, and the
    process ends as it would have. Handlers of the program's own are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [s for s in (signal.SIGTERM, signal.SIGINT)
             if signal.getsignal(s) == signal.SIG_DFL]

    def stop(signum: int, frame: object) -> None:
        raise _Stopped(signum)
    for signum in taken:
        signal.signal(signum, stop)
    try:
        yield
    except _Stopped as stopped:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), stopped.signum)
        raise  # the signal ends the process before this line runs
    finally:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)
