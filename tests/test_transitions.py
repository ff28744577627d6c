"""The capture's one transition table: every change of action has a row, each row lists
the capture's own methods (bound, as torch.profiler's action_map does), and every backend
call the capture makes is in some row."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from policy_engine import Topology, profile_session
from policy_engine.language.values.schedule import Action
from policy_engine.runtime.capture.driver import Capture
from policy_engine.testing import recording_backend

#: The capture's methods that call the backend as the schedule moves.
CALLS = {"_prepare", "_start", "_step", "_save_complete", "_save_partial", "_discard"}


@pytest.fixture
def capture(make_policy: Callable[..., dict[str, Any]]) -> Iterator[Capture]:
    """A capture, open: the whole-session capture of a plain loop's first step()."""
    with recording_backend("torch"):
        prof = profile_session(make_policy(schedule={"wait": 1, "warmup": 1, "active": 1}),
                               "actor", Topology())
        prof.step()
        found = prof.slot.capture
        assert isinstance(found, Capture)
        yield found
        prof.close()


def test_every_change_of_action_has_a_row(capture: Capture) -> None:
    pairs = set(itertools.product([None, *Action], Action))
    assert set(capture.transitions) == pairs


def test_every_row_lists_the_captures_own_methods(capture: Capture) -> None:
    listed = [call for calls in capture.transitions.values() for call in calls]
    assert all(call.__self__ is capture for call in listed)  # type: ignore[attr-defined]
    assert {call.__name__ for call in listed} == CALLS


def test_a_recording_starts_only_from_outside_a_recording(capture: Capture) -> None:
    # One trace per recording: RECORD -> RECORD steps on, SAVE -> RECORD saves and starts.
    assert not capture.starts_recording(Action.RECORD, Action.RECORD)
    assert capture.starts_recording(Action.RECORD_AND_SAVE, Action.RECORD)
    assert capture.starts_recording(None, Action.RECORD)
    assert not capture.starts_recording(Action.WARMUP, Action.WARMUP)
