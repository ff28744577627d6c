"""runtime/triggers/ray_actor.py keeps, for the process's life, a handle that keeps the job's
channel actor alive: the creating call's (strong) handle, never only a weak one that Ray
hands to a caller who found the actor there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from policy_engine.runtime.triggers import ray_actor


class Handle:
    """What of Ray's ActorHandle the keeping reads: the actor's id and whether it is weak."""

    def __init__(self, actor_id: str, weak: bool) -> None:
        self._ray_actor_id = actor_id
        self._ray_weak_ref = weak


@pytest.fixture(autouse=True)
def empty() -> Iterator[None]:
    saved = dict(ray_actor._held)
    ray_actor._held.clear()
    yield
    ray_actor._held.clear()
    ray_actor._held.update(saved)


def test_the_creating_handle_is_kept_when_a_weak_one_came_first() -> None:
    """Two threads of one process ask at once: one finds the actor (weak), the other
    created it (strong) and its caller lets go of it; the strong one must be what stays."""
    found, created = Handle("a", weak=True), Handle("a", weak=False)
    ray_actor._hold(found)
    ray_actor._hold(created)
    assert ray_actor._held["a"] is created


def test_a_strong_handle_kept_is_not_replaced() -> None:
    created, found = Handle("a", weak=False), Handle("a", weak=True)
    ray_actor._hold(created)
    ray_actor._hold(found)
    ray_actor._hold(Handle("a", weak=False))
    assert ray_actor._held["a"] is created


def test_each_actor_keeps_its_own_handle() -> None:
    a, b = Handle("a", weak=True), Handle("b", weak=False)
    ray_actor._hold(a)
    ray_actor._hold(b)
    assert ray_actor._held == {"a": a, "b": b}
