"""The channel under Ray without torch.distributed: a named actor holding the keys that a
c10d store would (:mod:`policy_engine.runtime.triggers.channel`), with the same operations.

Every listener of the job gets the same actor by name (created by the first one); calls
go from listener threads only, each waiting at most :data:`TIMEOUT` seconds.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ACTOR", "NAMESPACE", "RayKV", "actor_kv"]

ACTOR = "policy_engine_triggers"
NAMESPACE = "policy_engine"
TIMEOUT = 10.0


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

    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=NAMESPACE, log_to_driver=False)
    actor = ray.remote(num_cpus=0)(_Keys).options(
        name=ACTOR, namespace=NAMESPACE, get_if_exists=True).remote()
    return RayKV(actor)
