"""The job's own channel for trigger requests: keys in a key-value store the job already
runs (torch.distributed's c10d ``TCPStore``, or a named Ray actor holding the same keys).

Every listening process of a role takes a *slot* (a counter), and publishes its progress
there, ``{step, time, rate}``, every ``poll_seconds``. A request is resolved to one
concrete step before it is posted (:func:`agreed_step`: far enough ahead of the fastest
rank that every listener, polling at its own phase, still reaches it), then appended to
one request list that every listener reads from where it started. Answers go to a list
per request, which ``policy-engine trigger --wait`` reads.

Keys (all under :data:`PREFIX`)::

    requests                 counter of posted requests
    request/<i>              request i (JSON, as a request file holds)
    role/<role>/listeners    counter of slots taken
    role/<role>/progress/<s> slot s's progress (JSON)
    role/<role>/signal       the step the last signal of the role was agreed on
    answers/<id>             counter of answers to request <id>
    answer/<id>/<i>          answer i (JSON)

Everything read back is untrusted: values are bounded
(:func:`~policy_engine.runtime.requests.load_bounded`) and checked; a bad one is skipped
or refused, never raised on the training thread (store I/O happens on the listener thread
only, :mod:`policy_engine.runtime.courier`).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Protocol

from policy_engine.runtime.requests import MAX_BYTES, MAX_STEP, BadRequest, load_bounded

__all__ = ["MAX_LISTENERS", "PREFIX", "JobChannel", "KeyValue", "StoreKV", "agreed_step",
           "connect_store", "lead_seconds", "progress_of"]

#: Our keys in the job's store: a prefix no PyTorch key uses.
PREFIX = "policy_engine/triggers/v1/"
#: Slots read back at most (a counter bumped by someone else is not a reason to read
#: more keys than a large job has ranks).
MAX_LISTENERS = 1 << 18
#: Steps added past the estimate of the fastest rank.
MARGIN_STEPS = 2
#: Steps ahead when no rank has reported a rate yet.
UNKNOWN_RATE_STEPS = 16
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def lead_seconds(poll: float) -> float:
    """How long until every listener has seen a request posted now: its listener thread
    polls every ``poll`` seconds, then its training thread notices at a step boundary."""
    return 2.0 * max(poll, 0.05) + 1.0


def stale_seconds(poll: float) -> float:
    """Progress older than this is a process that ended (or hangs): not waited for."""
    return 10.0 * max(poll, 0.05) + 30.0


def progress_of(value: Any) -> tuple[int, float, float] | None:
    """``(step, time, rate)`` from a progress report, None when it is not one."""
    if not isinstance(value, dict):
        return None
    step, when, rate = value.get("step"), value.get("time"), value.get("rate", 0.0)
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for x in (when, rate)):
        return None
    if not 0 <= rate <= 1e6:
        return None
    return step, float(when), float(rate)  # type: ignore[arg-type]


def agreed_step(reports: Iterable[Any], now: float, poll: float) -> int | None:
    """The one step a request made at ``now`` (wall clock) asks every listener for: past
    where the fastest rank will be once every listener has seen it. None: no report."""
    listed = list(reports)
    # each report says its process's poll_seconds: the slowest poller sets the lead
    poll = max([poll] + [float(r["poll"]) for r in listed if isinstance(r, dict) and
                         isinstance(r.get("poll"), (int, float)) and 0 <= r["poll"] <= 3600])
    found = [p for p in map(progress_of, listed) if p is not None
             and now - p[1] <= stale_seconds(poll)]
    if not found:
        return None
    known = max((rate for _, _, rate in found), default=0.0)
    lead = lead_seconds(poll)
    target = 0
    for step, when, rate in found:
        rate = rate or known
        ahead = rate * (max(0.0, now - when) + lead) if rate else UNKNOWN_RATE_STEPS
        target = max(target, step + math.ceil(min(ahead, 1e9)) + MARGIN_STEPS)
    return min(target, MAX_STEP)


class KeyValue(Protocol):
    """What the channel needs of a store: TCPStore's operations, with ``get`` answering
    None for a missing key instead of waiting for it."""

    def get(self, key: str) -> bytes | None: ...
    def gets(self, keys: list[str]) -> list[bytes | None]: ...
    def set(self, key: str, value: bytes) -> None: ...
    def add(self, key: str, amount: int) -> int: ...
    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes: ...


class StoreKV:
    """A c10d store (a client connection of our own) as a :class:`KeyValue`."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get(self, key: str) -> bytes | None:
        if not self.store.check([key]):
            return None  # TCPStore's get would wait for it
        return bytes(self.store.get(key))

    def gets(self, keys: list[str]) -> list[bytes | None]:
        if keys and self.store.check(keys):
            return [bytes(v) for v in self.store.multi_get(keys)]
        return [self.get(k) for k in keys]

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(key, amount))

    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes:
        return bytes(self.store.compare_set(key, expected, new))


def connect_store(host: str, port: int, timeout: float = 10.0) -> StoreKV:
    """A client connection to the TCPStore at ``host:port`` (torch imported here)."""
    import torch.distributed as dist

    store = dist.TCPStore(  # type: ignore[attr-defined]
        host, port, is_master=False, timeout=timedelta(seconds=timeout),
        wait_for_workers=False)
    return StoreKV(store)


def _json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return load_bounded(data)
    except BadRequest:
        return None


class JobChannel:
    """One role's view of the channel's keys (no state beyond the store's)."""

    def __init__(self, kv: KeyValue, role: str) -> None:
        self.kv = kv
        self.role = role

    def _role(self, what: str) -> str:
        return f"{PREFIX}role/{self.role}/{what}"

    # -- listeners ----------------------------------------------------------------
    def register(self) -> int:
        return self.kv.add(self._role("listeners"), 1) - 1

    def publish(self, slot: int, report: dict[str, Any]) -> None:
        self.kv.set(self._role(f"progress/{slot}"), json.dumps(report).encode())

    def listeners(self) -> int:
        return max(0, min(self.kv.add(self._role("listeners"), 0), MAX_LISTENERS))

    def reports(self) -> list[Any]:
        """Every slot's last progress report (values that do not parse are None)."""
        keys = [self._role(f"progress/{s}") for s in range(self.listeners())]
        found: list[Any] = []
        for at in range(0, len(keys), 4096):
            found.extend(_json(v) for v in self.kv.gets(keys[at:at + 4096]))
        return found

    # -- requests -----------------------------------------------------------------
    def cursor(self) -> int:
        """Where the request list ends now: a listener reads from here on."""
        return max(0, self.kv.add(f"{PREFIX}requests", 0))

    def request(self, index: int) -> tuple[str, bytes] | None:
        """Request ``index``'s id and body; None while it is not there yet. A value that
        is too long for a request comes back as too long, for the reader to refuse."""
        data = self.kv.get(f"{PREFIX}request/{index}")
        if data is None:
            return None
        value = _json(data) if len(data) <= MAX_BYTES else None
        rid = value.get("id") if isinstance(value, dict) else None
        name = rid if isinstance(rid, str) and _ID.match(rid) else f"store-request-{index}"
        return name, data

    def post(self, body: str) -> int:
        index = self.kv.add(f"{PREFIX}requests", 1) - 1
        self.kv.set(f"{PREFIX}request/{index}", body.encode())
        return index

    def claim_signal(self, target: int, at: int) -> bool:
        """Whether this process posts the request for a signal it got at step ``at``
        (agreed on ``target``): not when a signal of the role already agreed on a step
        still ahead (the job was signalled on every rank: one capture)."""
        key = self._role("signal")
        old = self.kv.get(key) or b""
        try:
            ahead = int(old.split(b" ")[0]) >= at
        except ValueError:
            ahead = False
        if ahead:
            return False
        # unique, so that two ranks agreeing on the same step cannot both win
        new = f"{target} {os.getpid()} {secrets.token_hex(4)}".encode()
        return self.kv.compare_set(key, old, new) == new

    # -- answers ------------------------------------------------------------------
    def answer(self, rid: str, answer: dict[str, Any]) -> None:
        if not _ID.match(rid):
            return
        index = self.kv.add(f"{PREFIX}answers/{rid}", 1) - 1
        self.kv.set(f"{PREFIX}answer/{rid}/{index}", json.dumps(answer).encode())

    def answers(self, rid: str, since: int = 0) -> list[Any]:
        count = min(self.kv.add(f"{PREFIX}answers/{rid}", 0), MAX_LISTENERS)
        keys = [f"{PREFIX}answer/{rid}/{i}" for i in range(since, count)]
        return [_json(v) for v in self.kv.gets(keys)] if keys else []
