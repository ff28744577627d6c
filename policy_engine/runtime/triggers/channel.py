"""The job's own channel for trigger requests: keys in a key-value store the job already
runs (torch.distributed's c10d ``TCPStore``, or a named Ray actor holding the same keys).

Every listening process of a role claims a *slot* and publishes its progress there,
``{step, time, rate}``, every ``poll_seconds``. A request is resolved to one concrete
step before it is posted (:func:`agreed_step`: far enough ahead of the fastest rank that
every listener, polling at its own phase, still reaches it), then appended to one request
list that every listener reads from where it started. Answers go to one key per request
and slot, which ``policy-engine trigger --wait`` reads.

Keys (all under :data:`PREFIX`)::

    requests                 where the request list ends, a hint (text)
    request/<i>              request i (JSON, as a request file holds)
    step/<i>                 the step agreed for request i when it names none
    role/<role>/progress/<s> slot s: its process's progress (JSON)
    role/<role>/signal       the step the last signal of the role was agreed on
    answer/<id>/<s>          slot s's answer to request <id> (JSON)

Anyone who reaches the store can write any of these, so nothing here trusts a value:
no key is ever advanced with ``add`` (a c10d store fails every later ``add`` on a key
holding a non-integer, and closes the connection); a list element or a slot is claimed
with ``compare_set`` on its own key, which fails harmlessly when the key is taken; how
long a list is comes from the keys that exist (a search over ``check``, a few dozen
round trips whatever a counter says), never from a count someone wrote; values longer
than :data:`~policy_engine.runtime.triggers.requests.MAX_BYTES` are dropped as soon as they are
read, and what is kept is parsed as hostile
(:func:`~policy_engine.runtime.triggers.requests.load_bounded`). Store I/O happens on the listener
thread only (:mod:`policy_engine.runtime.triggers.listener_thread`), never on the training
thread.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, Protocol

from policy_engine.errors import is_int
from policy_engine.runtime.triggers.requests import MAX_BYTES, MAX_STEP, BadRequest, load_bounded

__all__ = ["MAX_LISTENERS", "PREFIX", "JobChannel", "KeyValue", "Refused", "StoreKV",
           "agreed_step", "connect_store", "lead_seconds", "progress_of", "quiet_torch"]

#: Our keys in the job's store: a prefix no PyTorch key uses.
PREFIX = "policy_engine/triggers/v1/"
#: Slots read back at most (a counter bumped by someone else is not a reason to read
#: more keys than a large job has ranks).
MAX_LISTENERS = 1 << 16
#: Indices a search for a list's end goes past its start, at most (2**40).
MAX_SCAN = 1 << 40
#: Keys tried to claim a free one.
CLAIM_TRIES = 64
#: The longest pause (seconds) between two tries of a claim that lost its key to another.
CLAIM_PAUSE = 0.5
#: Keys fetched by one call when reading many (progress reports, answers).
BATCH = 64
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
    if not is_int(step) or not 0 <= step <= MAX_STEP:
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


class Refused(Exception):
    """The channel's store refused a write (the Ray actor: a value too long, or full)."""


class KeyValue(Protocol):
    """What the channel needs of a store: TCPStore's operations, with ``get`` answering
    None for a missing key instead of waiting for it, and ``has`` whether a key exists
    (without fetching its value); ``wait`` (whether a key exists within some seconds) and
    ``delete`` are what the job's clock needs besides (runtime.triggers.clock)."""

    def get(self, key: str) -> bytes | None: ...
    def gets(self, keys: list[str]) -> list[bytes | None]: ...
    def has(self, key: str) -> bool: ...
    def set(self, key: str, value: bytes) -> None: ...
    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes: ...
    def wait(self, key: str, seconds: float) -> bool: ...
    def delete(self, key: str) -> None: ...


class StoreKV:
    """A c10d store (a client connection of our own) as a :class:`KeyValue`."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def has(self, key: str) -> bool:
        return bool(self.store.check([key]))

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

    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes:
        return bytes(self.store.compare_set(key, expected, new))

    def wait(self, key: str, seconds: float) -> bool:
        """Whether ``key`` exists within ``seconds`` (the store tells the moment it is set:
        the job's clock measures its round trips with it)."""
        try:
            self.store.wait([key], timedelta(seconds=seconds))
        except Exception:  # a timeout, or the store went away: the check below tells
            return bool(self.store.check([key]))
        return True

    def delete(self, key: str) -> None:
        self.store.delete_key(key)


def quiet_torch(force: bool = False) -> None:
    """Keep torch's C++ side from printing stack frames and log lines (a store that does
    not answer raises with dozens of them): effective when set before torch is
    imported; a process that imported it already keeps its own settings. ``force``
    overrides what the environment says (a command's own process, which may inherit a
    job's debugging settings); without it a job's settings stand."""
    if "torch" not in sys.modules:
        for name, value in (("TORCH_CPP_LOG_LEVEL", "FATAL"),
                            ("TORCH_SHOW_CPP_STACKTRACES", "0")):
            if force:
                os.environ[name] = value
            else:
                os.environ.setdefault(name, value)


def connect_store(host: str, port: int, timeout: float = 10.0) -> StoreKV:
    """A client connection to the TCPStore at ``host:port`` (torch imported here)."""
    import torch.distributed as dist

    store = dist.TCPStore(  # type: ignore[attr-defined]
        host, port, is_master=False, timeout=timedelta(seconds=timeout),
        wait_for_workers=False)
    return StoreKV(store)


def _small(data: bytes | None) -> bytes | None:
    """A value short enough to be one of ours (a longer one is dropped here, at once)."""
    return data if data is not None and len(data) <= MAX_BYTES else None


def _json(data: bytes | None) -> Any:
    data = _small(data)
    if data is None:
        return None
    try:
        return load_bounded(data)
    except BadRequest:
        return None


def _number(data: bytes | None) -> int | None:
    """A step or index written as text; None for anything else."""
    text = (data or b"").strip()
    if not text or len(text) > 13 or not text.isdigit():
        return None
    value = int(text)
    return value if value <= MAX_STEP else None


class JobChannel:
    """One role's view of the channel's keys (no state beyond the store's)."""

    def __init__(self, kv: KeyValue, role: str) -> None:
        self.kv = kv
        self.role = role

    def _role(self, what: str) -> str:
        return f"{PREFIX}role/{self.role}/{what}"

    def _progress(self, slot: int) -> str:
        return self._role(f"progress/{slot}")

    @staticmethod
    def request_key(index: int) -> str:
        return f"{PREFIX}request/{index}"

    def end(self, key_of: Callable[[int], str], start: int = 0) -> int:
        """The first index from ``start`` whose key is missing, where the keys before it
        run without a gap: a doubling search, then a halving one (about 2 log2(n) checks
        of existence, whatever is stored; past :data:`MAX_SCAN` it stops)."""
        if not self.kv.has(key_of(start)):
            return start
        low, stride = start, 1  # low exists
        while stride <= MAX_SCAN:
            high = low + stride
            if not self.kv.has(key_of(high)):
                break
            low, stride = high, stride * 2
        else:
            return low + 1
        while high - low > 1:  # low exists, high does not
            middle = (low + high) // 2
            if self.kv.has(key_of(middle)):
                low = middle
            else:
                high = middle
        return high

    def _claim(self, key_of: Callable[[int], str], start: int, body: bytes) -> int:
        """The first free index from ``start`` taken for ``body`` (compare-and-set on the
        index's own key: two writers never take the same one). A writer that loses a key
        to another looks for the end again, past every key taken meanwhile, after a
        random pause that doubles with each loss (up to :data:`CLAIM_PAUSE` seconds), so
        that many writers starting together (a large job's ranks) spread out instead of
        racing for the same next key."""
        index = self.end(key_of, start)
        for tries in range(CLAIM_TRIES):
            if self.kv.compare_set(key_of(index), b"", body) == body:
                return index
            time.sleep(random.uniform(0, min(CLAIM_PAUSE, 0.001 * 2 ** tries)))
            index = self.end(key_of, index + 1)
        raise RuntimeError(f"no free key after {key_of(index)} in {CLAIM_TRIES} tries")

    # -- listeners ----------------------------------------------------------------
    def register(self, body: bytes) -> int:
        """A slot of the role for this process, holding ``body`` until its first report
        (something unique to it, so that two processes cannot both claim one)."""
        return self._claim(self._progress, 0, body)

    def publish(self, slot: int, report: dict[str, Any]) -> None:
        self.kv.set(self._progress(slot), json.dumps(report).encode())

    def listeners(self) -> int:
        """Slots taken: the keys that exist, at most :data:`MAX_LISTENERS`."""
        return min(self.end(self._progress), MAX_LISTENERS)

    def _batched(self, keys: list[str]) -> list[Any]:
        found: list[Any] = []
        for at in range(0, len(keys), BATCH):
            found.extend(_json(v) for v in self.kv.gets(keys[at:at + BATCH]))
        return found

    def reports(self) -> list[Any]:
        """Every slot's last progress report (values that do not parse are None)."""
        return self._batched([self._progress(s) for s in range(self.listeners())])

    # -- requests -----------------------------------------------------------------
    def hint(self) -> tuple[int | None, bytes]:
        """Where the request list ends as its writers said (None: missing or not a
        number), with the raw value."""
        raw = _small(self.kv.get(f"{PREFIX}requests")) or b""
        return _number(raw), raw

    def cursor(self) -> int:
        """Where the request list ends now: a listener reads from here on."""
        return self.end(self.request_key, self.hint()[0] or 0)

    def request(self, index: int) -> bytes | None:
        """Request ``index``'s bytes as stored (the reader measures them, then keeps at
        most a request's size); None when the key is missing."""
        return self.kv.get(self.request_key(index))

    def post(self, body: str) -> int:
        """Append a request to the list: the first free index at or past the hint (so
        that listeners who jumped to it see it), then the hint moved past it."""
        hint, raw = self.hint()
        index = self._claim(self.request_key, hint or 0, body.encode())
        if hint is None or index + 1 > hint:  # a bad hint is repaired here
            self.kv.compare_set(f"{PREFIX}requests", raw, str(index + 1).encode())
        return index

    def agree(self, index: int, step: int) -> int | None:
        """The step every listener takes for request ``index`` that names none: the first
        listener's proposal wins (compare-and-set); None when the key holds no step."""
        key = f"{PREFIX}step/{index}"
        return _number(_small(self.kv.compare_set(key, b"", str(step).encode())))

    def claim_signal(self, target: int, at: int) -> bool:
        """Whether this process posts the request for a signal it got at step ``at``
        (agreed on ``target``): not when a signal of the role already agreed on a step
        still ahead (the job was signalled on every rank: one capture)."""
        key = self._role("signal")
        old = self.kv.get(key) or b""
        if len(old) > MAX_BYTES:
            old = b""  # compare_set fails on it: the signal is posted by every rank
        ahead = _number(old.split(b" ")[0]) if old else None
        if ahead is not None and ahead >= at:
            return False
        # unique, so that two ranks agreeing on the same step cannot both win
        new = f"{target} {os.getpid()} {secrets.token_hex(4)}".encode()
        return self.kv.compare_set(key, old, new) == new

    # -- answers ------------------------------------------------------------------
    def answer(self, rid: str, slot: int, answer: dict[str, Any]) -> None:
        if _ID.match(rid):
            self.kv.set(f"{PREFIX}answer/{rid}/{slot}", json.dumps(answer).encode())

    def answers(self, rid: str, listeners: int) -> dict[int, Any]:
        """The answers to request ``rid`` so far, by slot (values that do not parse are
        left out)."""
        if not _ID.match(rid):
            return {}
        keys = [f"{PREFIX}answer/{rid}/{s}" for s in range(min(listeners, MAX_LISTENERS))]
        return {s: a for s, a in enumerate(self._batched(keys)) if isinstance(a, dict)}
