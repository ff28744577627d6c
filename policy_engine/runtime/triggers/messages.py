"""What the listener thread and the training thread hand each other, through two deques.

The listener thread (:mod:`policy_engine.runtime.triggers.listener_thread`) puts into the
inbox what it read on the channel: :class:`Arrived` (a request, checked) or
:class:`NotARequest` (something that is not one). The training thread
(:mod:`policy_engine.runtime.triggers.step_triggers`) puts into the outbox what only the
listener thread may send: :class:`Answer` (a request's answer, for ``policy-engine
trigger --wait``) and :class:`Post` (a request of the whole job: a signal, a slow step).
"""

from __future__ import annotations

from typing import Any

import attrs

from policy_engine.runtime.triggers.requests import Request

__all__ = ["Answer", "Arrived", "NotARequest", "Post"]


@attrs.frozen
class Arrived:
    """A request read and checked on the listener thread, for the training thread to
    accept or pass over; ``where`` names its source in warnings (a file's path, or a store
    key and the store's address)."""

    request: Request
    where: str


@attrs.frozen
class NotARequest:
    """Something on the channel that is not a request: ``rid`` names it in the note (a
    file's name without ``.json``, or ``store-request-<index>``), ``why`` says what is
    wrong with it, ``where`` names its source in the warning."""

    rid: str
    why: str
    where: str


@attrs.frozen
class Answer:
    """This process's answer to request ``rid`` (the fields of its note, with the rank,
    the pid and the host), written to the job's channel."""

    rid: str
    fields: dict[str, Any]


@attrs.frozen
class Post:
    """A request of this process for the role across the job, posted at one agreed step:
    ``why`` is ``signal`` or ``slow_step``; ``ranks`` the selector asked (None: every rank
    of the role) and ``also`` ranks asked besides it; ``slow`` the slow step that asked
    (``{rank, step, seconds, median}``)."""

    why: str
    ranks: Any = None
    also: tuple[int, ...] = ()
    slow: dict[str, Any] | None = None
