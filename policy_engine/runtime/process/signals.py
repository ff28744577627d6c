"""Stop captures when the process ends: at interpreter exit and on SIGTERM; count
SIGUSR2 for the roles whose ``triggers.signal`` or ``triggers.stall`` listens to it; and
carry a stall's ask to the main thread (:func:`ask_main_thread`): a SIGUSR2 that this
process's listener thread sends it, which saves the captures the main thread runs.

Installed the first time a capture opens, never before (a rank that profiles nothing
changes nothing). A SIGTERM handler the user installed is called after ours; the default
action (terminate) is kept by re-raising the signal.

Python runs a handler between two bytecodes of the main thread, wherever it is. A SIGTERM
that arrives while the main thread is in a critical stretch (holding a slot's or the
process's lock: opening a capture, a transition, a save, a manifest line; see
runtime.process.state) waits until the stretch ends. A capture that another thread is opening,
moving or saving is waited for through its slot's lock. So the handler always finds every
capture either running (and saves what it recorded) or finished. After the captures and
their exports, summaries still being made get a few seconds, then are cut
(runtime.process.summaries).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from types import FrameType

from policy_engine.runtime.process import export, summaries
from policy_engine.runtime.process.state import STATE, in_critical

log = logging.getLogger("policy_engine")

# How long the handler waits for another thread's transition or save, then for the
# export thread. Only a thread stuck on something this thread holds (a logging lock the
# signal interrupted) waits this long; orchestrators send SIGKILL well before.
WAIT_LIMIT = 300.0


def stop_all(why: str) -> None:
    """End every capture this thread may end, saving what it recorded (partial). A
    capture another thread is opening, moving or saving is waited for first."""
    with STATE.lock:
        slots = list(STATE.slots.values())
    for found in slots:
        if not found.lock.acquire(timeout=WAIT_LIMIT):
            log.warning("policy-engine: the %s capture stayed busy on another thread for "
                        "%.0f s; %s without waiting for it", found.name, WAIT_LIMIT, why)
            capture = found.capture
            if capture is not None:  # its close line says what it was stuck in
                capture.abandon(why)
            continue
        try:
            capture = found.capture
            if capture is not None:
                capture.terminate(why)
        finally:
            found.lock.release()


def _flush(why: str) -> None:
    if not export.flush(WAIT_LIMIT):
        log.warning("policy-engine: background exports still running after %.0f s; %s "
                    "without them (their captures show as interrupted)", WAIT_LIMIT, why)


def _on_exit() -> None:
    stop_all("the interpreter exited")
    _flush("the interpreter exits")  # what the export thread still holds
    summaries.finish()  # a few seconds for summaries under way, then they are cut


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if in_critical() or STATE.hooks.terminating:
        STATE.hooks.pending_signal = signum  # delivered as the critical stretch ends (state.py)
        return
    _terminate(signum, frame)


def _terminate(signum: int, frame: FrameType | None) -> None:
    STATE.hooks.terminating = True
    try:
        stop_all("SIGTERM arrived")
        _flush("the process ends")
        summaries.finish()
    finally:
        STATE.hooks.pending_signal = None  # one that came meanwhile is this one
        STATE.hooks.terminating = False
    previous = STATE.hooks.previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def deliver_pending() -> None:
    """Run the SIGTERM (or a stall's ask) that waited for a critical stretch to end."""
    hooks = STATE.hooks
    if hooks.terminating:
        return  # the handler at work delivers it
    stall, hooks.pending_stall = hooks.pending_stall, None
    if stall is not None and hooks.pending_signal is None:
        _save_for_stall(*stall)
    signum, hooks.pending_signal = hooks.pending_signal, None
    if signum is not None:
        _terminate(signum, None)


def install() -> None:
    """Register the exit hook once per process, and the SIGTERM hook once, from the main
    thread (Python lets only the main thread set signal handlers)."""
    with STATE.lock:
        first = not STATE.hooks.exit_installed
        STATE.hooks.exit_installed = True
        sigterm = not STATE.hooks.sigterm_installed and (
            threading.current_thread() is threading.main_thread())
        STATE.hooks.sigterm_installed = STATE.hooks.sigterm_installed or sigterm
    if first:
        STATE.hooks.signal_hook = deliver_pending
        atexit.register(_on_exit)
    if sigterm:
        STATE.hooks.previous_sigterm = signal.getsignal(signal.SIGTERM)
        if STATE.hooks.previous_sigterm is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, _on_sigterm)


def _on_usr2(signum: int, frame: FrameType | None) -> None:
    hooks = STATE.hooks
    asked, hooks.stall_save = hooks.stall_save, None
    if asked is not None:  # sent by this process's listener thread: a stall, not a user
        if in_critical() or hooks.terminating:
            hooks.pending_stall = asked  # delivered as the critical stretch ends (state.py)
        else:
            _save_for_stall(*asked)
        return
    hooks.usr2_count += 1  # read at the next training-step boundary (triggers.step_triggers)
    previous = STATE.hooks.previous_usr2
    if callable(previous):
        previous(signum, frame)


#: A stall's ask is carried out only when the main thread runs it this soon: a thread that
#: takes longer was blocked in a call that has just returned (the stall is clearing), and
#: its capture goes on as planned.
STALL_SAVE_SECONDS = 5.0


def ask_main_thread(why: str) -> str:
    """From another thread (a stall's listener): have the main thread save the captures it
    runs, partial, as soon as it runs Python (a SIGUSR2 to it, which Python handles there,
    between two bytecodes; a thread blocked in C++ runs it when the call returns, and then
    leaves its capture as it is). Returns what was done, for the stall record."""
    hooks = STATE.hooks
    if not hooks.usr2_installed or not hasattr(signal, "pthread_kill") or \
            signal.getsignal(signal.SIGUSR2) is not _on_usr2:
        return "kept open: no SIGUSR2 handler of policy-engine to reach the main thread"
    main = threading.main_thread().ident
    if main is None:
        return "kept open: no main thread"
    hooks.stall_save = (why, time.monotonic())
    try:
        signal.pthread_kill(main, signal.SIGUSR2)
    except (OSError, ValueError) as err:
        hooks.stall_save = None
        return f"kept open: the main thread could not be signalled ({err})"
    return ("saved partial if the main thread runs Python within "
            f"{STALL_SAVE_SECONDS:g} s, else kept open")


def _save_for_stall(why: str, asked: float) -> None:
    """On the main thread: save the captures this thread runs, partial, now."""
    if time.monotonic() - asked > STALL_SAVE_SECONDS:
        return  # it was blocked in C++ and is back: the step goes on with its capture
    with STATE.lock:
        slots = list(STATE.slots.values())
    for found in slots:
        capture = found.capture
        if capture is None:
            continue
        try:
            capture.cut_short(why)
        except Exception as err:  # the training goes on: report and leave it
            log.warning("policy-engine: could not save the %s capture at a stall: %s",
                        found.name, err)


def install_usr2() -> str | None:
    """Count SIGUSR2 from now on (a handler installed before ours is still called).
    Returns why it cannot be, or None."""
    if not hasattr(signal, "SIGUSR2"):
        return "this platform has no SIGUSR2"
    with STATE.lock:
        if STATE.hooks.usr2_installed:
            return None
        if threading.current_thread() is not threading.main_thread():
            return (f"Python lets only the main thread install signal handlers, and this "
                    f"runs on thread {threading.current_thread().name!r}")
        STATE.hooks.usr2_installed = True
        current = signal.getsignal(signal.SIGUSR2)
        if current is not _on_usr2:  # never chain to ourselves (installed once before)
            STATE.hooks.previous_usr2 = current
        signal.signal(signal.SIGUSR2, _on_usr2)
    return None
