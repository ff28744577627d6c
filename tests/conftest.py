from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from policy_engine.runtime import state

# No property test may pass or fail by the machine's speed: no per-example deadline and no
# "too slow" health check, whatever else the machine is running (a test's own @settings keep
# these unless they set them).
settings.register_profile("any-machine", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("any-machine")


def _policy(output_dir: str, **role: Any) -> dict[str, Any]:
    body = {"enabled": True, "backend": "torch", "torch": {"activities": ["cpu"]}}
    body.update(role)
    return {"version": 1, "prefix": "t", "output_dir": output_dir, "roles": {"actor": body}}


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    """Each test starts with nothing a process holds: no capture, no one-time warning."""
    yield
    state.reset()


@pytest.fixture
def make_policy(tmp_path: Any) -> Callable[..., dict[str, Any]]:
    """A one-role (actor) policy writing under tmp_path/out; keyword args go in the role."""
    def make(**role: Any) -> dict[str, Any]:
        return copy.deepcopy(_policy(str(tmp_path / "out"), **role))
    return make
