"""Calling an engine's profiler: an object's ``start_profile`` / ``stop_profile`` (plain or
``async def``), or a server's ``/start_profile`` / ``/stop_profile`` routes, always
bounded by a timeout.

A call runs on a daemon thread of its own, so a stop that hangs (vLLM has been seen to
take over 20 minutes to stop at TP=2) costs the caller the timeout and no more; the
engine stays marked busy until that call returns, and later calls are refused rather
than queued behind it. An ``async def`` method runs on the engine's own event loop
(``loop=``) when it runs on another thread, or awaited directly by the async API; it is
never run from inside that loop by a blocking call, which would deadlock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class EngineCallError(RuntimeError):
    """The engine refused or failed a profiler call."""


class EngineTimeout(EngineCallError):
    """A profiler call did not return within its timeout."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _in_thread(fn: Callable[[], Any], name: str) -> concurrent.futures.Future[Any]:
    """``fn()`` on a daemon thread of its own; its future is done when ``fn`` returns."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as err:  # handed to the caller, who decides
            future.set_exception(err)
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return future


class Target:
    """One replica's engine: an object with the engine's profiler methods, or a URL."""

    def __init__(self, engine: Any, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.engine = engine
        self.loop = loop
        if isinstance(engine, str):
            if not engine.startswith(("http://", "https://")):
                raise TypeError(f"engine {engine!r}: a server is given by its URL "
                                "(http://host:port)")
            self.kind = "url"
        elif callable(getattr(engine, "start_profile", None)) and \
                callable(getattr(engine, "stop_profile", None)):
            self.kind = "async" if inspect.iscoroutinefunction(engine.start_profile) \
                else "object"
        else:
            raise TypeError(f"{type(engine).__name__} has no start_profile/stop_profile: "
                            "pass a vLLM LLM or AsyncLLM, an SGLang Engine, or a server URL")
        # the last call made (a thread's future, or the task of an awaited call)
        self._busy: concurrent.futures.Future[Any] | asyncio.Future[Any] | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return self.engine if self.kind == "url" else type(self.engine).__name__

    # -- what one call does, without the timeout ---------------------------------------
    def _post(self, route: str, body: Mapping[str, Any] | None, timeout: float) -> None:
        data = json.dumps(dict(body)).encode() if body is not None else b""
        request = urllib.request.Request(self.engine.rstrip("/") + route, data=data,
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                answer.read()
        except urllib.error.HTTPError as err:
            text = err.read().decode("utf-8", "replace").strip()[:300]
            why = {404: " (no such route: vLLM serves it only when launched with a profiler "
                        "configured; see `policy-engine engine-args`)",
                   409: " (a profiling session is already active on the server)"}
            raise EngineCallError(f"{route} answered {err.code}{why.get(err.code, '')}: "
                                  f"{text}") from None
        except (urllib.error.URLError, OSError) as err:
            raise EngineCallError(f"{route} failed: {err}") from None

    def _call(self, what: str, kwargs: Mapping[str, Any] | None,
              timeout: float) -> Callable[[], Any]:
        """A function that makes the call on a thread of its own (blocking there)."""
        if self.kind == "url":
            route = f"/{what}"
            return lambda: self._post(route, kwargs, timeout)
        method = getattr(self.engine, what)
        args = dict(kwargs or {})
        if self.kind == "object":
            return lambda: method(**args)
        loop = self.loop
        if loop is not None and loop.is_running():
            return lambda: asyncio.run_coroutine_threadsafe(method(**args), loop).result()
        return lambda: asyncio.run(method(**args))

    def _check(self, what: str) -> None:
        busy = self._busy
        if busy is not None and not busy.done():
            raise EngineCallError(f"{what} not sent: an earlier profiler call to "
                                  f"{self.describe()} has not returned")

    # -- blocking ---------------------------------------------------------------------
    def refused_here(self, what: str) -> str | None:
        """Why a blocking ``what`` cannot be made from this thread (it runs the engine's
        event loop, which the call needs), or None. Callers that hand the call to another
        thread ask here first."""
        running = _running_loop()
        if self.kind == "async" and running is not None and (
                self.loop is None or self.loop is running):
            return (f"{what} was called from inside the engine's event loop, where waiting "
                    "for it would block the loop it needs: use `async with "
                    "prof.atraining_step(n)`")
        inner = getattr(self.engine, "loop", None)
        if self.kind == "object" and inner is not None and inner is running:
            return (f"{what} was called from inside the engine's event loop, which the "
                    "engine's own blocking method runs: call it from another thread")
        return None

    def call(self, what: str, kwargs: Mapping[str, Any] | None, timeout: float) -> None:
        """``what`` (start_profile or stop_profile) with ``kwargs``; raises EngineTimeout
        after ``timeout`` seconds, EngineCallError when the engine refuses."""
        problem = self.refused_here(what)
        if problem is not None:
            raise EngineCallError(problem)
        with self._lock:
            self._check(what)
            future = _in_thread(self._call(what, kwargs, timeout), f"policy-engine-{what}")
            self._busy = future
        with self._reported(what, timeout, concurrent.futures.TimeoutError):
            future.result(timeout)

    @contextlib.contextmanager
    def _reported(self, what: str, timeout: float,
                  timed_out: type[BaseException]) -> Iterator[None]:
        """Any failure of the call ``what`` inside, as EngineTimeout (for ``timed_out``)
        or EngineCallError naming the engine."""
        try:
            yield
        except timed_out:
            raise EngineTimeout(f"{what} on {self.describe()} did not return within "
                                f"{timeout:g} s") from None
        except EngineCallError:
            raise
        except Exception as err:
            raise EngineCallError(f"{what} on {self.describe()} failed: "
                                  f"{type(err).__name__}: {err}") from err

    # -- awaited ----------------------------------------------------------------------
    async def acall(self, what: str, kwargs: Mapping[str, Any] | None,
                    timeout: float) -> None:
        """:meth:`call` for async code: an ``async def`` engine method is awaited on this
        loop; anything else runs on a thread while the loop goes on."""
        with self._reported(what, timeout, asyncio.TimeoutError):
            if self.kind == "async":
                self._check(what)
                task = asyncio.ensure_future(getattr(self.engine, what)(**dict(kwargs or {})))
                self._busy = task
                done, _ = await asyncio.wait({task}, timeout=timeout)
                if not done:
                    # Not awaited: an engine that ignores the cancel must not hold us.
                    task.cancel()
                    raise asyncio.TimeoutError
                task.result()
                return
            with self._lock:
                self._check(what)
                future = _in_thread(self._call(what, kwargs, timeout),
                                    f"policy-engine-{what}")
                self._busy = future
            await asyncio.wait_for(asyncio.wrap_future(future), timeout)
