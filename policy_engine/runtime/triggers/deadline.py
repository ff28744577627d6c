"""Calls to the job's channel with a deadline.

torch's TCPStore client waits in C++ for a server that stops answering without closing its
connections (a process stopped by SIGSTOP, a hung node): on torch 2.13 ``check``, ``get``,
``multi_get``, ``compare_set`` and the client's own constructor wait for ever, whatever the
client's ``timeout`` (it bounds the wait for a key, not for the server), and ``set`` returns
at once only until the socket's buffer is full. No timeout or signal of ours reaches into
such a call. So every call runs on a thread of its own (:class:`CallThread`), which the
caller waits for at most a deadline: a call past it is given up on, its thread is left
blocked (a daemon thread, never joined), and the client is not used again.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from policy_engine.runtime.triggers.channel import KeyValue

__all__ = ["CALL_SECONDS", "CONNECT_SECONDS", "BoundedKV", "CallThread", "abandoned"]

#: Seconds to reach the channel (resolve, connect, the store's handshake, Ray's actor).
CONNECT_SECONDS = 12.0
#: Seconds each call after that may take: a store that does not answer within them is
#: given up on (a healthy one answers in milliseconds, even to a thousand clients).
CALL_SECONDS = 10.0

_T = TypeVar("_T")
# the threads of calls given up on, still blocked (in C++, most likely)
_ABANDONED: list[threading.Thread] = []


class _Call:
    __slots__ = ("args", "done", "error", "fn", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


def _serve(calls: queue.SimpleQueue[_Call | None]) -> None:
    """The call thread: the calls in turn, until None (it holds no reference to its
    :class:`CallThread`, whose collection sends that None)."""
    while True:
        call = calls.get()
        if call is None:
            return
        try:
            call.value = call.fn(*call.args)
        except BaseException as err:  # handed to the caller, on its thread
            call.error = err
        call.done.set()
        del call


class CallThread:
    """A thread that makes one client's calls, one at a time, each waited for at most
    ``seconds``. Once a call is past its deadline the thread is given up on (it stays
    blocked in that call) and every later call fails at once: the client behind it is not
    to be trusted any more. Calls come from one thread at a time (the listener thread, or
    the command's main thread)."""

    def __init__(self, seconds: float = CALL_SECONDS,
                 name: str = "policy-engine-store-call") -> None:
        self.seconds = seconds
        self.name = name
        self.hung: str | None = None  # the call given up on, when one was
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # a CallThread dropped without close() still ends its thread
        weakref.finalize(self, self._calls.put, None)

    def call(self, fn: Callable[..., _T], *args: Any, seconds: float | None = None) -> _T:
        """``fn(*args)`` on the call thread; TimeoutError when it takes longer than
        ``seconds`` (default: the thread's own), or when an earlier call did."""
        if self.hung is not None:
            raise TimeoutError(f"an earlier call ({self.hung}) has had no answer")
        if self._thread is None:
            self._thread = threading.Thread(target=_serve, args=(self._calls,),
                                            name=self.name, daemon=True)
            self._thread.start()
        limit = self.seconds if seconds is None else seconds
        pending = _Call(fn, args)
        self._calls.put(pending)
        if not pending.done.wait(limit):
            self.hung = getattr(fn, "__name__", "a call")
            _ABANDONED.append(self._thread)
            self._calls.put(None)  # the thread ends if that call ever returns
            raise TimeoutError(f"no answer within {limit:g} s")
        if pending.error is not None:
            raise pending.error
        value: _T = pending.value
        return value

    def close(self) -> None:
        """The thread ends after the call under way, if any (never, if that one hangs)."""
        self._calls.put(None)

    def join(self, seconds: float) -> None:
        """Wait at most ``seconds`` for the thread to end (after :meth:`close`)."""
        if self._thread is not None and seconds > 0:
            self._thread.join(seconds)


def abandoned() -> bool:
    """Whether a call was given up on and its thread is still blocked: a process that
    ends then should leave with ``os._exit`` (torch's client torn down by the interpreter's
    exit, under that thread, may abort the process)."""
    return any(t.is_alive() for t in _ABANDONED)


class BoundedKV:
    """A :class:`~policy_engine.runtime.triggers.channel.KeyValue` whose every call is made
    on ``calls``, within its deadline."""

    def __init__(self, kv: KeyValue, calls: CallThread) -> None:
        self.kv, self.calls = kv, calls

    def get(self, key: str) -> bytes | None:
        return self.calls.call(self.kv.get, key)

    def gets(self, keys: list[str]) -> list[bytes | None]:
        return self.calls.call(self.kv.gets, keys)

    def has(self, key: str) -> bool:
        return self.calls.call(self.kv.has, key)

    def set(self, key: str, value: bytes) -> None:
        self.calls.call(self.kv.set, key, value)

    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes:
        return self.calls.call(self.kv.compare_set, key, expected, new)

    def wait(self, key: str, seconds: float) -> bool:
        """The store's own wait for ``key``, given its ``seconds`` beyond the deadline."""
        found: bool = self.calls.call(self.kv.wait, key, seconds,
                                      seconds=self.calls.seconds + seconds)
        return found

    def delete(self, key: str) -> None:
        self.calls.call(self.kv.delete, key)
