"""Work that grows with the policy's text, never with a number written in it.

Each closed form is checked against the plain walk it replaces, on values small enough to
walk; then each input that used to hang (or crash) is run at its full size.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import policy_engine.language.rules.clash as clash
import policy_engine.language.values.runs as runs_module
from policy_engine.cli.main import main
from policy_engine.language.load import analyze, load_policy
from policy_engine.language.read.source import document_from_mapping
from policy_engine.language.values.mesh import DIMS, coords_from_mesh, mesh_size
from policy_engine.language.values.naming import NameTemplate
from policy_engine.language.values.ranks import RankSelector
from policy_engine.language.values.schedule import Action, Schedule
from policy_engine.language.values.selector import SelectorError
from policy_engine.language.values.steps import StepSet
from policy_engine.plan.captures import count_ranges, cycle_ranges
from policy_engine.plan.compile import compile_plan
from policy_engine.plan.plan import Plan
from policy_engine.plan.topology import Topology

RECORDING = (Action.RECORD, Action.RECORD_AND_SAVE)

# ---------------------------------------------------------------- the schedule

schedules = st.builds(
    Schedule, skip_first=st.integers(0, 6), skip_first_wait=st.integers(0, 1),
    wait=st.integers(0, 5), warmup=st.integers(0, 5), active=st.integers(1, 5),
    repeat=st.integers(0, 3))


def walk_next_change(schedule: Schedule, step: int) -> int | None:
    action = schedule.action(step)
    if action in RECORDING:
        return step + 1
    # Past skip_first plus two periods every action of an endless schedule came back.
    for later in range(step + 1, step + schedule.skip_first + 2 * schedule.period + 2):
        if schedule.action(later) is not action:
            return later
    return None


@settings(max_examples=400, deadline=None)
@given(schedules)
def test_next_change_agrees_with_a_walk(schedule: Schedule) -> None:
    for step in range(80):
        assert schedule.next_change(step) == walk_next_change(schedule, step), step


@settings(max_examples=300, deadline=None)
@given(schedules)
def test_recorded_cycles_agrees_with_a_walk(schedule: Schedule) -> None:
    for n in range(70):
        walked = len({schedule.cycle(s) for s in range(n) if schedule.action(s) in RECORDING})
        assert schedule.recorded_cycles(n) == walked, n
        assert cycle_ranges(schedule, n) == walked


@pytest.mark.parametrize("wait", [10_000_000, 1_000_000_000, 10**15])
def test_next_change_jumps_over_a_long_wait(wait: int) -> None:
    schedule = Schedule(wait=wait, warmup=1, active=2, repeat=1)
    assert schedule.next_change(0) == wait  # the warm-up
    assert schedule.next_change(wait) == wait + 1
    assert schedule.next_change(wait + 2) == wait + 3
    assert schedule.next_change(wait + 3) is None  # after the only cycle: never again
    assert schedule.recorded_cycles(10**18) == 1
    assert Schedule(wait=wait, active=1).next_change(wait + 1) == 2 * wait + 1


# ---------------------------------------------------------------- steps

# Long strided runs with small strides, so that patterns repeat many times in a stretch.
_items = st.one_of(
    st.integers(0, 300),
    st.tuples(st.integers(0, 300), st.integers(0, 60)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"),
    st.tuples(st.integers(0, 300), st.integers(0, 1500), st.integers(1, 7)).map(
        lambda t: f"{t[0]}-{t[0] + t[1]}:{t[2]}"),
)


def members(items: list[int | str]) -> set[int]:
    found: set[int] = set()
    for item in items:
        if isinstance(item, int):
            found.add(item)
            continue
        bounds, _, stride = item.partition(":")
        lo, hi = (int(x) for x in bounds.split("-"))
        found.update(range(lo, hi + 1, int(stride or 1)))
    return found


def walked_runs(found: set[int]) -> list[tuple[int, int]]:
    runs: list[list[int]] = []
    for n in sorted(found):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [(a, b) for a, b in runs]


@pytest.mark.parametrize("counting", ["inclusion-exclusion", "patterns"])
@settings(max_examples=200, deadline=None)
@given(items=st.lists(_items, max_size=7))
def test_count_run_end_and_run_lengths_agree_with_a_walk(
        counting: str, items: list[int | str]) -> None:
    steps = StepSet.parse(items)
    found = members(items)
    runs = walked_runs(found)
    with pytest.MonkeyPatch.context() as patch:
        if counting == "patterns":  # no terms allowed: count from the runs' patterns
            patch.setattr(runs_module, "_MAX_TERMS", 0)
        assert steps.count() == len(found)
    blocks = runs_module.run_lengths(steps.runs) if steps.runs else []
    assert blocks is not None
    assert [n for block, times in blocks for _ in range(times) for n in block] == [
        b - a + 1 for a, b in runs]  # the runs, in order
    assert steps.run_lengths() == dict(Counter(b - a + 1 for a, b in runs))
    for a, b in runs:
        assert steps.run_end(a) == b
        assert steps.run_end((a + b) // 2) == b
    assert steps.last() == max(found, default=None)


def test_run_end_of_a_non_member_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 is not a step of 0-10:2"):
        StepSet.parse("0-10:2").run_end(3)


def test_run_end_jumps_over_runs_that_cover_every_residue() -> None:
    assert StepSet.parse("0-1000000:2,1-1000001:2").run_end(0) == 1_000_001
    assert StepSet.parse(["0-999999999999999999:3", "1-999999999999999998:3",
                          "2-999999999999999999:3"]).run_end(5) == 999_999_999_999_999_999
    assert StepSet.parse("all").run_end(10**17) is None
    assert StepSet.parse("0-99999999999999999").run_end(3) == 99_999_999_999_999_999


def test_unknown_answers_past_the_allowance(monkeypatch: pytest.MonkeyPatch) -> None:
    # Interleaved strided runs whose pattern is longer than the allowance.
    monkeypatch.setattr(runs_module, "_CELLS", 1000)
    monkeypatch.setattr(runs_module, "_MAX_TERMS", 0)
    steps = StepSet.parse("0-100000:97,1-100000:89,2-100000:83")
    assert steps.count() is None
    assert steps.run_lengths() is None
    assert steps.run_end(0) == 2  # a gap within reach is still found
    covering = StepSet.parse("0-100000:2,1-100001:2")
    assert covering.run_end(0) == 100_001  # a whole period marks cheaply


def plan_of(**role: Any) -> Plan:
    """The plan of a one-role policy (``role`` holds the role's settings) on rank 0 of 1."""
    policy = load_policy({"version": 1, "roles": {"a": {"enabled": True, **role}}})
    return compile_plan(policy, "a", Topology())


def test_merged_capture_labels_come_from_the_runs() -> None:
    plan = plan_of(merge_steps=True, steps=["0-100000000", "200000000-300000000:2",
                                            "200000001-300000001:2"])
    assert plan.capture_label(0) == "0-100000000"
    assert plan.capture_label(5) == "5-100000000"
    assert plan.capture_label(200_000_000) == "200000000-300000001"
    assert plan.capture_label(100_000_000) == "100000000"
    every = plan_of(merge_steps=True, steps="all")
    assert every.capture_label(7) == "7+"


# ---------------------------------------------------------------- the measured cases

PRIMES = [p for p in range(2, 100) if all(p % q for q in range(2, p))]


def test_many_coprime_strides_count_exactly() -> None:
    text = ",".join(f"0-1000000:{p}" for p in PRIMES)
    marked = bytearray(1_000_001)
    for p in PRIMES:
        marked[::p] = b"\x01" * len(range(0, 1_000_001, p))
    steps = StepSet.parse(text)
    assert steps.count() == marked.count(1)
    assert steps.run_end(0) == 0


def test_coprime_strides_over_a_huge_span_are_many_not_a_hang() -> None:
    steps = StepSet.parse(",".join(f"0-100000000000000:{p}" for p in PRIMES))
    assert steps.count() is None  # unknown: callers read it as "many"
    assert steps.run_lengths() is None
    assert steps.run_end(2) == 100  # 101 is the first prime past 97


def test_run_lengths_of_huge_sets() -> None:
    assert StepSet.parse("0-999999999999:7").run_lengths() == {1: 142_857_142_858}
    assert StepSet.parse("0-999999999999").run_lengths() == {1_000_000_000_000: 1}
    # Adjacent members of two strides: pairs (7k, 7k+1) and lone multiples of 7 ...
    steps = StepSet.parse(["0-6999999:7", "1-7000000:14"])
    assert steps.run_lengths() == {2: 500_000, 1: 500_000}
    plan = plan_of(backend="nsight", merge_steps=True, steps="0-999999999999:7",
                   schedule={"wait": 1, "active": 1, "repeat": 1})
    assert count_ranges(plan, inner_steps=3).total == 142_857_142_858
    merged = plan_of(backend="nsight", merge_steps=True, steps="0-999999999999",
                     schedule={"wait": 1, "active": 1}, name="<role>_<step>_<cycle>")
    assert count_ranges(merged, inner_steps=10**6).total == 500_000_000_000_000_000


@pytest.mark.parametrize("value", [
    "0-" + "9" * 5000, "1-10:" + "9" * 30, "9" * 19, ["0-3", "00012345678901234567890"],
])
def test_long_numbers_in_steps_are_refused_before_reading(value: object) -> None:
    with pytest.raises(SelectorError, match=r"too large \((steps|strides) are below 10\*\*18\)"):
        StepSet.parse(value)


@pytest.mark.parametrize("value", [
    "0-" + "9" * 5000, "-" + "9" * 5000, {"tp": "0-" + "1" * 19}, 10**18, [{"dp": -10**19}],
])
def test_long_numbers_in_ranks_are_refused_before_reading(value: object) -> None:
    with pytest.raises(SelectorError, match=r"too large \((ranks|indices) are below 10\*\*18\)"):
        RankSelector.parse(value)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def test_thousands_of_digits_are_a_policy_error_not_a_crash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digits = "9" * 5000
    path = write(tmp_path, "version: 1\nroles:\n  actor:\n    enabled: true\n"
                 f"    ranks: \"0-{digits}\"\n    steps: \"1-{digits}\"\n")
    assert main(["validate", path]) == 1
    out = capsys.readouterr().out
    assert "rank 999999999999... (5000 digits): too large (ranks are below 10**18)" in out
    assert "step 999999999999... (5000 digits): too large (steps are below 10**18)" in out


@pytest.mark.parametrize("extra", [[], ["--world", "99999999999"]])
def test_a_huge_mesh_validates_without_walking_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    path = write(tmp_path, "version: 1\nmesh: {tp: 99999999999}\nroles:\n  actor:\n"
                 "    enabled: true\n    ranks: all\n    steps: [5]\n"
                 "    name: \"<role>_<tp>_step<step>\"\n")
    assert main(["validate", path, *extra]) == 0
    assert capsys.readouterr().out.strip().endswith("valid")


def test_a_huge_mesh_reports_the_first_clash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "version: 1\nmesh: {pp: 99999999999, dp: 3, tp: 99999999999}\n"
                 "roles:\n  actor:\n    enabled: true\n    ranks: [{dp: -1}, \"17-18\"]\n"
                 "    steps: [5]\n    name: \"<role>_<tp><pp>_step<step>\"\n")
    assert main(["validate", path]) == 1
    out = capsys.readouterr().out
    # dp=-1 and dp=0 of (pp 0, tp 17) and (pp 0, tp 18): ranks 17 and 2*99999999999 + 17.
    assert f"cannot tell apart ranks 17 and {2 * 99999999999 + 17} of role 'actor'" in out


# ---------------------------------------------------------------- name uniqueness


def _axis(size: int) -> st.SearchStrategy[Any]:
    index = st.integers(-size - 1, size)
    span = st.tuples(st.integers(0, size), st.integers(0, size)).map(
        lambda t: f"{t[0]}-{t[0] + t[1]}")
    token = st.one_of(index.map(str), span)
    return st.one_of(st.just("all"), index, st.lists(token, min_size=1, max_size=3).map(
        ",".join), st.lists(st.one_of(index, span), max_size=3))


@st.composite
def layouts(draw: st.DrawFn) -> tuple[dict[str, int], int, Any, str]:
    mesh: dict[str, int] = {}
    if draw(st.booleans()):
        for dim in draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=3, unique=True)):
            mesh[dim] = draw(st.integers(1, 4))
    world = mesh_size(mesh) if mesh else draw(st.integers(1, 24))
    clauses: list[Any] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["rank", "all", "mapping"]))
        if kind == "rank":
            clauses.append(draw(_axis(world)))
        elif kind == "all":
            clauses.append("all")
        else:
            keys = draw(st.lists(st.sampled_from([*DIMS, "local_rank", "node"]),
                                 min_size=1, max_size=3, unique=True))
            clauses.append({key: draw(_axis(mesh.get(key, world))) for key in keys})
    fields = draw(st.lists(st.sampled_from([*DIMS, "local_rank", "node", "pid"]),
                           max_size=4, unique=True))
    name = "<role>_step<step>" + "".join(f"_<{field}>" for field in fields)
    return mesh, world, clauses if len(clauses) > 1 else clauses[0], name


def walked_clash(ranks: RankSelector, fields: frozenset[str], world: int,
                 mesh: dict[str, int]) -> tuple[int, int] | None:
    """The rank-by-rank walk validate did before."""
    shown = [dim for dim in DIMS if dim in fields]
    sizes = Topology.for_rank(0, world, mesh or None).selector_sizes()
    seen: dict[tuple[int | None, ...], int] = {}
    for rank in range(world):
        coords = coords_from_mesh(rank, mesh) if mesh else {}
        if not ranks.matches(rank, world, {**coords, "local_rank": rank, "node": 0}, sizes):
            continue
        key = tuple(coords.get(dim) for dim in shown)
        if key in seen:
            return seen[key], rank
        seen[key] = rank
    return None


@pytest.mark.parametrize("proving", ["boxes", "listed", "too complex"])
@settings(max_examples=300, deadline=None)
@given(layout=layouts())
def test_name_clashes_agree_with_the_rank_by_rank_walk(
        proving: str, layout: tuple[dict[str, int], int, Any, str]) -> None:
    """Boxes compared pairwise, the ranks listed (no boxes allowed), or neither."""
    mesh, world, ranks, name = layout
    try:
        selector = RankSelector.parse(ranks)
    except SelectorError:
        return
    if selector.selects_nothing:
        return  # validate warns about that instead
    data: dict[str, Any] = {"version": 1, "roles": {"actor": {
        "enabled": True, "ranks": ranks, "steps": [5], "name": name}}}
    if mesh:
        data["mesh"] = mesh
    with pytest.MonkeyPatch.context() as patch:
        if proving != "boxes":
            patch.setattr(clash, "MAX_BOXES", 0)
        if proving == "too complex":
            patch.setattr(clash, "MAX_LISTED", 0)
        problems = analyze(document_from_mapping(data), world=world).problems
    messages = [p.message for p in problems]
    about_ranks = [m for m in messages if "tell apart ranks" in m or "ranks of" in m]
    fields = NameTemplate.parse(name).fields()
    if "rank" in fields or {"node", "local_rank"} <= fields:
        assert about_ranks == []
        return
    pair = walked_clash(selector, fields, world, mesh)
    if proving == "too complex":
        assert len(about_ranks) == (1 if selector.boxes(world, mesh or None) else 0)
        return
    expected = [] if pair is None else [
        f"the name cannot tell apart ranks {pair[0]} and {pair[1]} of role 'actor'; add <rank>"]
    assert about_ranks == expected


def test_boxes_cover_exactly_the_selected_ranks() -> None:
    mesh = {"pp": 3, "dp": 2, "tp": 4}
    world = mesh_size(mesh)
    sizes = Topology.for_rank(0, world, mesh).selector_sizes()
    for value in ["5-19", [{"tp": "1-2", "local_rank": "3-20"}, "-1"], {"dp": -1, "pp": [0, 2]}]:
        selector = RankSelector.parse(value)
        boxes = selector.boxes(world, mesh)
        listed: list[int] = []
        for box in boxes:
            axes = [[i for lo, hi in ivs for i in range(lo, hi + 1)] for ivs in box]
            listed += [(pp * 2 + dp) * 4 + tp for pp, dp, tp in itertools.product(*axes)]
        walked = [r for r in range(world) if selector.matches(
            r, world, {**coords_from_mesh(r, mesh), "local_rank": r, "node": 0}, sizes)]
        assert sorted(set(listed)) == walked
    # A plain range takes at most two boxes per dimension, whatever the sizes.
    huge = {"pp": 10**5, "dp": 10**5, "tp": 10**5}
    assert len(RankSelector.parse("12345-999999999876543").boxes(mesh_size(huge), huge)) <= 5
    assert math.prod(huge.values()) == 10**15
