"""The channel under Ray without torch.distributed: a named actor holding the keys that a
c10d store would (:mod:`policy_engine.runtime.triggers.channel`), with the same operations.

Every listener of the job gets the same actor by name (created by the first one); calls
go from listener threads only, each waiting at most :data:`TIMEOUT` seconds.

Any process on the cluster can call the actor, so it holds what a store channel's reader
keeps, no more: a value longer than a request
(:data:`~policy_engine.runtime.triggers.requests.MAX_BYTES`) or a key longer than
:data:`MAX_KEY` characters is refused, not stored, and it holds at most :data:`MAX_KEYS`
keys and :data:`MAX_HELD` bytes of keys and values. Past either cap the oldest answers
make room (they are read only by ``policy-engine trigger --wait``, soon after their
request); when there are none left, the write is refused. A listener's poll reads a key
at most once (a few values of its own writes aside), so it fetches at most what the actor
holds.

Ray removes an actor once its creator holds no handle to it (a handle found by name does
not count), so the process that creates it keeps one until it exits: the actor then lives
as long as that process, not as long as the listener that happened to come first. After
that process is gone a listener may still be handed the dying actor by name for a moment,
so :func:`actor_kv` asks again until it gets one that answers.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from policy_engine.runtime.triggers.channel import PREFIX, Refused
from policy_engine.runtime.triggers.requests import MAX_BYTES

__all__ = ["ACTOR", "MAX_HELD", "MAX_KEY", "MAX_KEYS", "NAMESPACE", "RayKV", "actor_kv"]

ACTOR = "policy_engine_triggers"
NAMESPACE = "policy_engine"
TIMEOUT = 10.0
FIND_PAUSE = 0.2  # seconds between asking for the actor again while a dying one is found
WAIT_PAUSE = 0.001  # seconds between the first two looks for a key waited for
#: Keys the actor holds at most, bytes of keys and values, the longest key, and the keys
#: one read may ask for.
MAX_KEYS = 16_384
MAX_HELD = 16 << 20
MAX_KEY = 256
MAX_READ = 1024
_ANSWERS = f"{PREFIX}answer/"

# a handle to each actor this process reached, kept until the process exits: the one that
# created it where this process did. Ray hands out a handle to an actor that exists (a
# get_if_exists that finds it, ray.get_actor) as a weak one (``_ray_weak_ref``), which
# does not keep the actor alive: were that one kept while the creating call's handle is
# let go (two threads of one process asking at once), Ray would remove the actor.
_held: dict[Any, Any] = {}


def _hold(actor: Any) -> None:
    """Keep ``actor`` (a handle) for the process's life, a strong handle before a weak
    one."""
    key = getattr(actor, "_ray_actor_id", ACTOR)
    held = _held.get(key)
    if held is None or (getattr(held, "_ray_weak_ref", False)
                        and not getattr(actor, "_ray_weak_ref", False)):
        _held[key] = actor


class _Keys:
    """The actor's state: a dict of byte values (what TCPStore keeps), within the caps.
    A write it refuses answers why (a string) instead of raising, so that the caller
    gets one clear error, not Ray's remote traceback."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.held = 0  # bytes of keys and values
        self.answers: deque[str] = deque()  # answer keys, oldest first: made room with

    def usage(self) -> dict[str, int]:
        return {"keys": len(self.values), "bytes": self.held,
                "max_keys": MAX_KEYS, "max_bytes": MAX_HELD}

    def get(self, keys: list[str]) -> list[bytes | None] | str:
        if not isinstance(keys, list) or len(keys) > MAX_READ:
            return f"a read asks for at most {MAX_READ} keys"
        return [self.values.get(k) if isinstance(k, str) else None for k in keys]

    def has(self, key: str) -> bool:
        return isinstance(key, str) and key in self.values

    def set(self, key: str, value: bytes) -> str | None:
        refused = self._room(key, value)
        if refused is None:
            self._put(key, value)
        return refused

    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes | str:
        if not isinstance(key, str) or not isinstance(expected, bytes):
            return "a key is text, an expected value bytes"
        old = self.values.get(key)
        if (old is None and not expected) or old == expected:
            refused = self._room(key, new)
            if refused is not None:
                return refused
            self._put(key, new)
            return new
        return old if old is not None else expected

    def delete(self, key: str) -> None:
        value = self.values.pop(key, None) if isinstance(key, str) else None
        if value is not None:
            self.held -= len(key) + len(value)  # its place in ``answers`` is passed over

    def _room(self, key: str, value: bytes) -> str | None:
        """None when ``value`` may be stored under ``key`` (room made for it), else why
        not."""
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
            return f"a key is text of 1 to {MAX_KEY} characters"
        if not isinstance(value, bytes) or len(value) > MAX_BYTES:
            size = len(value) if isinstance(value, bytes) else type(value).__name__
            return f"a value is at most {MAX_BYTES} bytes, not {size}"
        old = self.values.get(key)
        grows = len(value) - (len(old) if old is not None else -len(key))
        while (self.held + grows > MAX_HELD or
               (old is None and len(self.values) >= MAX_KEYS)) and self._make_room(key):
            pass
        if self.held + grows > MAX_HELD or (old is None and len(self.values) >= MAX_KEYS):
            return (f"the actor holds {len(self.values)} keys and {self.held} bytes, the "
                    f"most it may ({MAX_KEYS} keys, {MAX_HELD} bytes), and no answer is "
                    "left to make room")
        return None

    def _make_room(self, keep: str) -> bool:
        """Drop the oldest answer (not ``keep``); False when there is none."""
        for _ in range(len(self.answers)):
            key = self.answers.popleft()
            if key == keep:
                self.answers.append(key)
                continue
            value = self.values.pop(key, None)
            if value is not None:
                self.held -= len(key) + len(value)
                return True
        return False

    def _put(self, key: str, value: bytes) -> None:
        old = self.values.get(key)
        if old is None:
            self.held += len(key) + len(value)
            if key.startswith(_ANSWERS):
                self.answers.append(key)
        else:
            self.held += len(value) - len(old)
        self.values[key] = value


class RayKV:
    """The named actor as a :class:`~policy_engine.runtime.triggers.channel.KeyValue`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        found = ray.get(getattr(self.actor, method).remote(*args), timeout=TIMEOUT)
        if isinstance(found, str):  # the actor refused it, and says why
            raise Refused(f"the job's Ray actor refused it: {found}")
        return found

    def get(self, key: str) -> bytes | None:
        found: list[bytes | None] = self._call("get", [key])
        return found[0]

    def gets(self, keys: list[str]) -> list[bytes | None]:
        found: list[bytes | None] = self._call("get", keys)
        return found

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, value)

    def has(self, key: str) -> bool:
        return bool(self._call("has", key))

    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes:
        return bytes(self._call("compare_set", key, expected, new))

    def wait(self, key: str, seconds: float) -> bool:
        """Whether ``key`` exists within ``seconds``: asked again after a pause that
        doubles from :data:`WAIT_PAUSE` to 20 times it (an actor call is a round trip of
        its own; the clock keeps its best round)."""
        deadline = time.monotonic() + seconds
        pause = WAIT_PAUSE
        while not self.has(key):
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 20 * WAIT_PAUSE)
        return True

    def delete(self, key: str) -> None:
        self._call("delete", key)

    def usage(self) -> dict[str, int]:
        """How many keys and bytes the actor holds, and its caps."""
        found: dict[str, int] = self._call("usage")
        return found


def actor_kv(address: str | None = None) -> RayKV:
    """The job's channel actor (created by the first caller). ``address``: connect to a
    running Ray cluster first (``policy-engine trigger`` from outside the job)."""
    import ray
    from ray.exceptions import RayActorError

    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=NAMESPACE, log_to_driver=False)
    deadline = time.monotonic() + TIMEOUT
    while True:
        kv = RayKV(ray.remote(num_cpus=0)(_Keys).options(
            name=ACTOR, namespace=NAMESPACE, get_if_exists=True).remote())
        try:
            kv.has("")
            _hold(kv.actor)
            return kv
        except RayActorError:  # its creator let go of it: Ray is removing it and its name
            if time.monotonic() + FIND_PAUSE > deadline:
                raise
            time.sleep(FIND_PAUSE)
