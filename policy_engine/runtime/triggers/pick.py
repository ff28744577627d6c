"""Which channel a listener uses: the job's c10d store, a named Ray actor, or neither
(the ``triggers/`` folder). Looked at from the listener thread, at every poll until one
is found, because ``apply_policy`` often runs before ``init_process_group``. Looking costs
nothing; the connection itself is made by the caller, within a deadline
(:mod:`~policy_engine.runtime.triggers.deadline`).

Nothing is imported here that the job has not imported itself: torch.distributed and Ray
are looked at only when they are already in ``sys.modules``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

from policy_engine.runtime.triggers.channel import KeyValue, connect_store

__all__ = ["pick_channel", "store_address"]


def store_address() -> tuple[str, int] | None:
    """``MASTER_ADDR:MASTER_PORT`` when torch.distributed is initialised (env://)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def pick_channel(choice: str) -> tuple[str, str, Callable[[], KeyValue]] | None:
    """``(kind, where, connect)``, or None while there is none (yet): ``connect()`` opens
    this process's own connection to it (it may block: the caller bounds it)."""
    if choice in ("auto", "store"):
        address = store_address()
        if address is not None:
            return "store", f"{address[0]}:{address[1]}", \
                functools.partial(connect_store, *address)
    if choice in ("auto", "ray"):
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            from policy_engine.runtime.triggers.ray_actor import ACTOR, actor_kv

            return "ray", ACTOR, actor_kv
    return None
