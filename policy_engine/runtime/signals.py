"""Stop captures when the process ends: at interpreter exit and on SIGTERM; count
SIGUSR2 for the roles whose ``triggers.signal`` listens to it.

Installed the first time a capture opens, never before (a rank that profiles nothing
changes nothing). A SIGTERM handler the user installed is called after ours; the default
action (terminate) is kept by re-raising the signal. A SIGTERM that arrives while a
capture is inside a backend call on the same thread (Python runs handlers between
bytecodes, so in the middle of a save) waits until that call is done.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from types import FrameType

from policy_engine.runtime import export
from policy_engine.runtime.state import STATE, captures


def stop_all(why: str) -> None:
    """End every running capture this thread may end, saving what it recorded (partial)."""
    for capture in captures():
        capture.terminate(why)


def _on_exit() -> None:
    stop_all("the interpreter exited")
    export.flush()  # what the export thread still holds


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    me = threading.get_ident()
    if any(capture.busy == me for capture in captures()):
        STATE.pending_signal = signum  # finish the backend call first (capture.py)
        return
    _terminate(signum, frame)


def _terminate(signum: int, frame: FrameType | None) -> None:
    stop_all("SIGTERM arrived")
    export.flush()
    previous = STATE.previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def deliver_pending() -> None:
    """Run the SIGTERM that waited for a backend call to finish."""
    signum, STATE.pending_signal = STATE.pending_signal, None
    if signum is not None:
        _terminate(signum, None)


def install() -> None:
    """Register the exit hook once per process, and the SIGTERM hook once, from the main
    thread (Python lets only the main thread set signal handlers)."""
    with STATE.lock:
        first = not STATE.hooks_installed
        STATE.hooks_installed = True
        sigterm = not STATE.sigterm_installed and (
            threading.current_thread() is threading.main_thread())
        STATE.sigterm_installed = STATE.sigterm_installed or sigterm
    if first:
        STATE.signal_hook = deliver_pending
        atexit.register(_on_exit)
    if sigterm:
        STATE.previous_sigterm = signal.getsignal(signal.SIGTERM)
        if STATE.previous_sigterm is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, _on_sigterm)


def _on_usr2(signum: int, frame: FrameType | None) -> None:
    STATE.usr2_count += 1  # read at the next training-step boundary (runtime.triggers)
    previous = STATE.previous_usr2
    if callable(previous):
        previous(signum, frame)


def install_usr2() -> str | None:
    """Count SIGUSR2 from now on (a handler installed before ours is still called).
    Returns why it cannot be, or None."""
    if not hasattr(signal, "SIGUSR2"):
        return "this platform has no SIGUSR2"
    with STATE.lock:
        if STATE.usr2_installed:
            return None
        if threading.current_thread() is not threading.main_thread():
            return (f"Python lets only the main thread install signal handlers, and this "
                    f"runs on thread {threading.current_thread().name!r}")
        STATE.usr2_installed = True
        STATE.previous_usr2 = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, _on_usr2)
    return None
