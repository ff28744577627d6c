"""The channel under Ray without torch.distributed: a named actor holding the keys that a
c10d store would (:mod:`policy_engine.runtime.triggers.channel`), with the same operations.

Every listener of the job gets the same actor by name (created by the first one); calls
go from listener threads only, each waiting at most :data:`TIMEOUT` seconds.

Ray removes an actor once its creator holds no handle to it (a handle found by name does
not count), so the process that creates it keeps one until it exits: the actor then lives
as long as that process, not as long as the listener that happened to come first. After
that process is gone a listener may still be handed the dying actor by name for a moment,
so :func:`actor_kv` asks again until it gets one that answers.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ACTOR", "NAMESPACE", "RayKV", "actor_kv"]

ACTOR = "policy_engine_triggers"
NAMESPACE = "policy_engine"
TIMEOUT = 10.0
FIND_PAUSE = 0.2  # seconds between asking for the actor again while a dying one is found

# the first handle this process got to each actor it reached (the creating one among them),
# kept until the process exits
_held: dict[Any, Any] = {}


class _Keys:
    """The actor's state: a dict of byte values (what TCPStore keeps)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, keys: list[str]) -> list[bytes | None]:
        return [self.values.get(k) for k in keys]

    def has(self, key: str) -> bool:
        return key in self.values

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def compare_set(self, key: str, expected: bytes, new: bytes) -> bytes:
        old = self.values.get(key)
        if (old is None and not expected) or old == expected:
            self.values[key] = new
            return new
        return old if old is not None else expected


class RayKV:
    """The named actor as a :class:`~policy_engine.runtime.triggers.channel.KeyValue`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.actor, method).remote(*args), timeout=TIMEOUT)

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
            # (by the actor's id where Ray's handle shows it, else the first handle kept)
            _held.setdefault(getattr(kv.actor, "_actor_id", ACTOR), kv.actor)
            return kv
        except RayActorError:  # its creator let go of it: Ray is removing it and its name
            if time.monotonic() + FIND_PAUSE > deadline:
                raise
            time.sleep(FIND_PAUSE)
