"""How the rollout-engine driver's decisions are carried out, blocking or awaited.

The driver (:class:`policy_engine.integrations.engines.EngineProfiler`) decides once what a
step does, as a generator of :data:`Work`: it yields each thing to do (an :class:`Offload`
or a :class:`Calls`) and is sent back what it gave, or has the exception that came of it
thrown in at that ``yield``. :func:`drive` carries a piece of work out on the calling
thread, with the engine calls on a thread pool; :func:`adrive` does it on the running
event loop, with the calls awaited and blocking work on threads. Nothing else differs
between ``training_step`` and ``atraining_step``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from policy_engine.backends.engine.control import EngineCallError, Target


@attrs.frozen
class Offload:
    """Blocking work that is not an engine call (file system): run in place by
    :func:`drive`, on a thread by :func:`adrive`; what ``fn()`` returns is sent back."""

    fn: Callable[[], Any]


@attrs.frozen
class Calls:
    """One profiler call (``what``) per target, all at once, each bounded by ``timeout``.

    ``calls`` holds each target with its keyword arguments. After each call, ``then(i,
    error)`` runs on a thread of its own (``i``: its place in ``calls``; ``error``: the
    :class:`EngineCallError` it ended with, or None). Sent back: each call's error, in
    the order of ``calls``, once every call and its ``then`` are done; an exception out
    of a ``then`` is thrown in instead."""

    what: str
    calls: Sequence[tuple[Target, Mapping[str, Any] | None]]
    timeout: float
    then: Callable[[int, EngineCallError | None], None] | None = None


#: A piece of the driver's work: yields what to do, is sent what came of it.
Work = Generator["Offload | Calls", Any, None]


def drive(work: Work) -> None:
    """Carry ``work`` out on this thread; engine calls run on a pool, one thread each."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = work.send(reply) if failure is None else work.throw(failure)
        except StopIteration:
            return
        reply, failure = None, None
        try:
            reply = step.fn() if isinstance(step, Offload) else _calls(step)
        except BaseException as err:  # thrown in where it was asked for
            failure = err


async def adrive(work: Work) -> None:
    """Carry ``work`` out on the running event loop: engine calls are awaited on it (an
    ``async def`` engine method runs there), blocking work runs on threads."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = work.send(reply) if failure is None else work.throw(failure)
        except StopIteration:
            return
        reply, failure = None, None
        try:
            reply = await asyncio.to_thread(step.fn) if isinstance(step, Offload) \
                else await _acalls(step)
        except BaseException as err:  # thrown in where it was asked for
            failure = err


def _calls(step: Calls) -> list[EngineCallError | None]:
    # Asked on this thread, not the pool's: whether this thread runs the engine's loop.
    refused = [target.refused_here(step.what) for target, _ in step.calls]

    def one(i: int) -> EngineCallError | None:
        target, kwargs = step.calls[i]
        error = None
        try:
            if refused[i] is not None:
                raise EngineCallError(refused[i])
            target.call(step.what, kwargs, step.timeout)
        except EngineCallError as err:
            error = err
        if step.then is not None:
            step.then(i, error)
        return error
    with ThreadPoolExecutor(max(1, len(step.calls))) as pool:
        futures = [pool.submit(one, i) for i in range(len(step.calls))]
        return [done.result() for done in futures]  # the first failure, in call order


async def _acalls(step: Calls) -> list[EngineCallError | None]:
    async def one(i: int) -> EngineCallError | None:
        target, kwargs = step.calls[i]
        error = None
        try:
            await target.acall(step.what, kwargs, step.timeout)
        except EngineCallError as err:
            error = err
        if step.then is not None:
            await asyncio.to_thread(step.then, i, error)
        return error
    return list(await asyncio.gather(*(one(i) for i in range(len(step.calls)))))
