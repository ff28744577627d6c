from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.language.values.schedule import Action, Schedule, ScheduleError

torch_profiler = pytest.importorskip("torch.profiler")


def torch_schedule(s: Schedule):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        # torch warns when warmup == 0; that is a legal schedule here.
        warnings.simplefilter("ignore", UserWarning)
        return torch_profiler.schedule(**s.to_json())


def schedules(min_repeat: int = 0) -> st.SearchStrategy[Schedule]:
    """Random schedules over the field ranges torch's own tests use."""
    return st.builds(Schedule, skip_first=st.integers(0, 6), skip_first_wait=st.integers(0, 1),
                     wait=st.integers(0, 5), warmup=st.integers(0, 5),
                     active=st.integers(1, 5), repeat=st.integers(min_repeat, 4))


@settings(max_examples=400, deadline=None)
@given(ours=schedules())
def test_action_matches_torch(ours: Schedule) -> None:
    theirs = torch_schedule(ours)
    for step in range(201):
        assert ours.action(step).name == theirs(step).name, step


@pytest.mark.parametrize(
    "fields",
    [
        {"wait": 3, "warmup": 2, "active": 4, "repeat": 3, "skip_first": 5},
        {"wait": 7, "warmup": 0, "active": 1, "repeat": 2, "skip_first": 1, "skip_first_wait": 1},
        {"wait": 0, "warmup": 1, "active": 3, "repeat": 0},
    ],
)
def test_action_matches_torch_at_large_steps(fields: dict[str, int]) -> None:
    ours = Schedule.from_mapping(fields)
    theirs = torch_schedule(ours)
    for step in [*range(10_000, 10_050), 10**9, 10**9 + 1, 10**12 + 7]:
        assert ours.action(step).name == theirs(step).name


def test_action_names_equal_torch_enum() -> None:
    assert [a.name for a in Action] == [
        a.name for a in torch_profiler.ProfilerAction if a.name != "DEVICE_STOPPED"
    ]


N, W, R, S = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (Schedule(), (S, S, S, S)),
        (Schedule(wait=1, warmup=1, active=2, repeat=1), (N, W, R, S, N, N)),
        (Schedule(skip_first=2, warmup=1, active=1, repeat=2), (N, N, W, S, W, S, N, N)),
        (
            Schedule(skip_first=1, skip_first_wait=1, wait=2, warmup=1, active=1, repeat=2),
            (N, W, S, N, N, W, S, N),
        ),
    ],
)
def test_actions_table(schedule: Schedule, expected: tuple[Action, ...]) -> None:
    assert schedule.actions(len(expected)) == expected


@pytest.mark.parametrize(
    ("schedule", "cycles_by_step", "cycles", "steps_needed"),
    [
        (Schedule(), [0, 1, 2, 3], None, None),
        (Schedule(active=2, repeat=2), [0, 0, 1, 1, None, None], 2, 4),
        (
            Schedule(skip_first=2, wait=1, warmup=1, active=1, repeat=2),
            [None, None, 0, 0, 0, 1, 1, 1, None],
            2,
            8,
        ),
        # skip_first_wait shortens only the first cycle.
        (
            Schedule(skip_first=1, skip_first_wait=1, wait=2, warmup=1, active=1, repeat=2),
            [None, 0, 0, 1, 1, 1, 1, None],
            2,
            7,
        ),
        (Schedule(wait=3, active=1, repeat=0), [0, 0, 0, 0, 1, 1, 1, 1, 2], None, None),
    ],
)
def test_cycle_table(
    schedule: Schedule,
    cycles_by_step: list[int | None],
    cycles: int | None,
    steps_needed: int | None,
) -> None:
    assert [schedule.cycle(step) for step in range(len(cycles_by_step))] == cycles_by_step
    assert schedule.cycles == cycles
    assert schedule.steps_needed == steps_needed


@settings(max_examples=200, deadline=None)
@given(s=schedules(min_repeat=1))
def test_steps_needed_ends_on_the_last_save(s: Schedule) -> None:
    assert s.steps_needed is not None
    actions = s.actions(s.steps_needed + 50)
    assert actions[s.steps_needed - 1] is Action.RECORD_AND_SAVE
    assert set(actions[s.steps_needed :]) == {Action.NONE}
    assert actions.count(Action.RECORD_AND_SAVE) == s.cycles
    # Each save belongs to a distinct cycle, numbered from 0.
    saves = [s.cycle(i) for i, a in enumerate(actions) if a is Action.RECORD_AND_SAVE]
    assert saves == list(range(s.repeat))


@settings(max_examples=200, deadline=None)
@given(s=schedules())
def test_record_start_is_each_cycles_first_recorded_step(s: Schedule) -> None:
    horizon = s.skip_first + 6 * s.period
    actions = s.actions(horizon)
    firsts: dict[int, int] = {}
    for i, action in enumerate(actions):
        cycle = s.cycle(i)
        if action in (Action.RECORD, Action.RECORD_AND_SAVE) and cycle is not None:
            firsts.setdefault(cycle, i)
    assert firsts == {c: s.record_start(c) for c in firsts}
    assert len(firsts) == s.recorded_cycles(horizon)
    with pytest.raises(ValueError):
        s.record_start(-1)


def test_from_mapping_and_to_json_round_trip() -> None:
    s = Schedule.from_mapping({"wait": 1, "warmup": 1, "active": 2, "skip_first_wait": True})
    assert s == Schedule(wait=1, warmup=1, active=2, skip_first_wait=1)
    assert s.to_json() == {
        "skip_first": 0,
        "skip_first_wait": 1,
        "wait": 1,
        "warmup": 1,
        "active": 2,
        "repeat": 0,
    }
    assert Schedule.from_mapping(s.to_json()) == s
    assert hash(s) == hash(Schedule.from_mapping(s.to_json()))
    assert s.period == 4


@pytest.mark.parametrize(
    ("mapping", "message", "path"),
    [
        ({"active": 0}, "schedule field 'active' must be >= 1, got 0", ("active",)),
        ({"wait": -1}, "schedule field 'wait' must be >= 0, got -1", ("wait",)),
        ({"repeat": True}, "schedule field 'repeat' must be an integer, got a boolean",
         ("repeat",)),
        ({"warmup": 1.5}, "schedule field 'warmup' must be an integer, got a number",
         ("warmup",)),
    ],
)
def test_invalid_fields(mapping: dict[str, object], message: str, path: tuple[str, ...]) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.from_mapping(mapping)
    assert info.value.message == message
    assert str(info.value) == message
    assert info.value.path == path


def test_negative_step_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        Schedule().action(-1)
    with pytest.raises(ValueError, match="non-negative"):
        Schedule(skip_first=3).cycle(-1)


def test_module_does_not_import_torch() -> None:
    # Load the file alone, not through the package, so only this module is judged.
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('m', {path!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['m'] = module\n"
        "spec.loader.exec_module(module)\n"
        "assert 'torch' not in sys.modules\n"
    ).format(path=str(Path(__file__).parents[1] / "policy_engine" / "language" / "values"
                 / "schedule.py"))
    subprocess.run([sys.executable, "-c", code], check=True)
