"""The capture's one transition table: every change of action has a row, and every
operation a row names is one the capture carries out."""

from __future__ import annotations

import itertools

from policy_engine.language.values.schedule import Action
from policy_engine.runtime.capture import driver as capture
from policy_engine.runtime.capture.driver import TABLE, Op, starts_recording


def test_every_change_of_action_has_a_row() -> None:
    pairs = set(itertools.product([None, *Action], Action))
    assert set(TABLE) == pairs


def test_every_operation_named_is_carried_out() -> None:
    named = {op for ops in TABLE.values() for op in ops}
    declared = {v for k, v in vars(Op).items() if k.isupper()}
    assert named == declared
    assert set(capture._OPERATIONS) == declared


def test_a_recording_starts_only_from_outside_a_recording() -> None:
    # One trace per recording: RECORD -> RECORD steps on, SAVE -> RECORD saves and starts.
    assert not starts_recording(Action.RECORD, Action.RECORD)
    assert starts_recording(Action.RECORD_AND_SAVE, Action.RECORD)
    assert starts_recording(None, Action.RECORD)
    assert not starts_recording(Action.WARMUP, Action.WARMUP)
