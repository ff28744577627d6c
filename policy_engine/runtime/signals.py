"""Stop captures when the process ends: at interpreter exit and on SIGTERM.

Installed the first time a capture opens, never before (a rank that profiles nothing
changes nothing). A SIGTERM handler the user installed is called after ours; the default
action (terminate) is kept by re-raising the signal.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

log = logging.getLogger("policy_engine")
_installed = False
_previous: Any = signal.SIG_DFL
_lock = threading.Lock()


def stop_all(status: str) -> None:
    """End every running capture, saving what it recorded, marked ``status``."""
    from .capture import active_captures

    for capture in active_captures():
        try:
            capture.end(status)
        except Exception as err:  # the process is ending; report and go on
            log.warning("policy-engine: could not stop a %s capture: %s", capture.owner, err)


def _on_exit() -> None:
    stop_all("partial")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    stop_all("partial")
    previous = _previous
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install() -> None:
    """Register the exit and SIGTERM hooks once per process (SIGTERM: main thread only)."""
    global _installed, _previous
    with _lock:
        if _installed:
            return
        _installed = True
        atexit.register(_on_exit)
        if threading.current_thread() is threading.main_thread():
            _previous = signal.getsignal(signal.SIGTERM)
            if _previous is not signal.SIG_IGN:
                signal.signal(signal.SIGTERM, _on_sigterm)
