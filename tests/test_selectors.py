from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy_engine.language.values.ranks import DIMENSIONS, RankSelector
from policy_engine.language.values.selector import SelectorError
from policy_engine.language.values.steps import StepSet

# ---------------------------------------------------------------- steps


@pytest.mark.parametrize(
    ("value", "members", "text"),
    [
        ("all", None, "all"),
        (["all", 3], None, "all"),
        (5, [5], "5"),
        ([2, 3], [2, 3], "2-3"),
        ("10-12", [10, 11, 12], "10-12"),
        ("3", [3], "3"),
        (" 1, 3 ,5-7", [1, 3, 5, 6, 7], "1,3,5-7"),
        ([100, "100-2100:1000"], [100, 1100, 2100], "100-2100:1000"),
        ("100-2150:1000", [100, 1100, 2100], "100-2100:1000"),
        ("0-10:20", [0], "0"),
        ([7, "5-6", 8, "20-30:10"], [5, 6, 7, 8, 20, 30], "5-8,20-30:10"),
        (["2-20:2", "4-10"], [2, *range(4, 11), 12, 14, 16, 18, 20], "2-20:2,4-10"),
        (["4-8:2", "0-10"], list(range(11)), "0-10"),
        ([], [], "none"),
        ((1, 2), [1, 2], "1-2"),
    ],
)
def test_stepset_parse(value: object, members: list[int] | None, text: str) -> None:
    steps = StepSet.parse(value)
    assert str(steps) == text
    if members is None:
        assert steps.is_all and not steps.is_bounded
        assert steps.count() is None
        assert steps.within(0, 4) == [0, 1, 2, 3, 4]
    else:
        assert steps.is_bounded and not steps.is_all
        assert steps.count() == len(members)
        assert steps.within(0, 10_000) == members
        assert steps.is_empty == (not members)
    assert StepSet.parse(steps.to_json()) == steps
    if text != "none":
        assert StepSet.parse(text) == steps


def test_stepset_to_json_forms() -> None:
    assert StepSet.parse("all").to_json() == ["all"]
    assert StepSet.parse([3, 2, "10-20:5"]).to_json() == ["2-3", "10-20:5"]
    assert StepSet.parse([2, 4, "10-20:5"]).to_json() == [2, 4, "10-20:5"]
    assert StepSet.parse([]).to_json() == []


def test_stepset_equality_and_hash() -> None:
    assert StepSet.parse([1, 2, 3]) == StepSet.parse("1-3") == StepSet.parse("3,1-2")
    assert hash(StepSet.parse([1, 2, 3])) == hash(StepSet.parse("1-3"))
    assert len({StepSet.parse("all"), StepSet.parse(["0-5", "all"])}) == 1


def test_stepset_huge_range_is_not_materialized() -> None:
    steps = StepSet.parse("0-1000000000000:7")
    assert steps.runs == ((0, 999_999_999_999, 7),)  # 999_999_999_999 == 7 * 142_857_142_857
    assert 999_999_999_999 in steps
    assert 999_999_999_998 not in steps
    assert steps.count() == 142_857_142_858
    assert steps.next_after(999_999_999_990) == 999_999_999_992
    assert steps.next_after(999_999_999_999) is None
    assert steps.last() == 999_999_999_999
    assert StepSet.parse("all").last() is None
    lo, hi = 10**11, 10**11 + 20
    assert steps.within(lo, hi) == [n for n in range(lo, hi + 1) if n % 7 == 0]


def test_stepset_largest_numbers() -> None:
    top = 10**18 - 1
    steps = StepSet.parse([f"0-{top}:2", f"1-{top}:2", "000000000000000000005"])
    assert steps.count() == 10**18
    assert steps.run_end(0) == top
    assert steps.last() == top
    assert top in steps


def test_stepset_count_of_many_overlapping_strides() -> None:
    # Plain inclusion-exclusion would visit 2**30 subsets here.
    steps = StepSet.parse([f"{k % 5}-20000:{k}" for k in range(2, 32)])
    assert steps.count() == sum(1 for n in range(20001) if n in steps)
    # Steps divisible by some k in 2..31 are those divisible by a prime <= 31.
    primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31]
    expected = sum(
        (-1) ** (r + 1) * (10**9 // math.prod(c) + 1)
        for r in range(1, len(primes) + 1)
        for c in itertools.combinations(primes, r)
    )
    assert StepSet.parse([f"0-1000000000:{k}" for k in range(2, 32)]).count() == expected


@pytest.mark.parametrize(
    ("value", "first", "after_10", "contains"),
    [
        ("all", 0, 11, {0: True, 10**15: True}),
        ([], None, None, {0: False}),
        ([4, "20-40:10"], 4, 20, {4: True, 5: False, 30: True, 35: False, 40: True, 50: False}),
        ("3-5", 3, None, {2: False, 3: True, 5: True, 6: False}),
    ],
)
def test_stepset_queries(
    value: object, first: int | None, after_10: int | None, contains: dict[int, bool]
) -> None:
    steps = StepSet.parse(value)
    assert steps.first() == first
    assert steps.next_after(10) == after_10
    assert {n: n in steps for n in contains} == contains
    assert "3" not in steps
    assert True not in steps


@pytest.mark.parametrize(
    ("value", "message", "path"),
    [
        ("12-10", "range 12-10 is reversed", ()),
        (["1", "12-10:2"], "range 12-10 is reversed", (1,)),
        ("3-", "malformed step range '3-' (expected N, A-B or A-B:S)", ()),
        ("", "malformed step range '' (expected N, A-B or A-B:S)", ()),
        ("1,,2", "malformed step range '' (expected N, A-B or A-B:S)", ()),
        ([0, "x"], "malformed step range 'x' (expected N, A-B or A-B:S)", (1,)),
        ("0-10:-2", "malformed step range '0-10:-2' (expected N, A-B or A-B:S)", ()),
        ("0-10:0", "stride must be > 0 in '0-10:0'", ()),
        (-1, "step -1 is negative", ()),
        (10**18, f"step {10**18}: too large (steps are below 10**18)", ()),
        (
            ["1", "0-" + "9" * 5000],
            "step 999999999999... (5000 digits): too large (steps are below 10**18)",
            (1,),
        ),
        ("0-10:" + "7" * 19, f"stride {'7' * 19}: too large (strides are below 10**18)", ()),
        ([1, -3], "step -3 is negative", (1,)),
        ("1,-2", "step -2 is negative", ()),
        (
            True,
            "steps must be 'all', a step number, a range string, {every: N, from: A} "
            "or a list of them, got a boolean",
            (),
        ),
        (
            None,
            "steps must be 'all', a step number, a range string, {every: N, from: A} "
            "or a list of them, got null",
            (),
        ),
        ({"a": 1}, "unknown key 'a' (keys: every, from, until)", ("a",)),
        ({"every": 10, "form": 1}, "unknown key 'form' (did you mean 'from'?)", ("form",)),
        ({"from": 5}, "periodic steps need 'every' (as in {every: 100, from: 100})", ()),
        ([1, {"every": 0}], "every must be >= 1, got 0", (1, "every")),
        ({"every": 10, "from": -1}, "from must be >= 0, got -1", ("from",)),
        ({"every": True}, "every must be an integer, got a boolean", ("every",)),
        ({"every": 10, "from": 100, "until": 50}, "until 50 is before from 100", ("until",)),
        ({"every": 100, "until": 50},
         "until 50 is before from (which defaults to every) 100", ("until",)),
        ({"every": 10**18}, f"every {10**18}: too large (steps are below 10**18)", ("every",)),
        (
            [1, False],
            "a step must be a number, a range string like '10-12' or '0-100:10', or "
            "{every: N, from: A}, got a boolean",
            (1,),
        ),
        (
            [[1]],
            "a step must be a number, a range string like '10-12' or '0-100:10', or "
            "{every: N, from: A}, got a list",
            (0,),
        ),
        (
            [2.5],
            "a step must be a number, a range string like '10-12' or '0-100:10', or "
            "{every: N, from: A}, got a number",
            (0,),
        ),
    ],
)
def test_stepset_errors(value: object, message: str, path: tuple[str | int, ...]) -> None:
    with pytest.raises(SelectorError) as info:
        StepSet.parse(value)
    assert info.value.message == message
    assert str(info.value) == message
    assert info.value.path == path
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------- periodic steps


@pytest.mark.parametrize(
    ("value", "runs", "text", "window"),
    [
        ({"every": 100, "from": 100}, ((100, None, 100),), "every 100 from 100",
         [100, 200, 300]),
        ({"every": 100}, ((100, None, 100),), "every 100 from 100", [100, 200, 300]),
        ({"every": 10, "from": 5}, ((5, None, 10),), "every 10 from 5",
         list(range(5, 301, 10))),
        ({"every": 1, "from": 0}, ((0, None, 1),), "all", list(range(301))),
        ({"every": 10, "from": 5, "until": 40}, ((5, 35, 10),), "5-35:10", [5, 15, 25, 35]),
        ({"every": 10, "from": 5, "until": 5}, ((5, 5, 1),), "5", [5]),
        ([2, {"every": 100}], ((2, 2, 1), (100, None, 100)), "2,every 100 from 100",
         [2, 100, 200, 300]),
        ([100, "100-300:100", {"every": 100}], ((100, None, 100),), "every 100 from 100",
         [100, 200, 300]),
        (["0-3", {"every": 1, "from": 4}], ((0, None, 1),), "all", list(range(301))),
        (["0-2", "5-6", {"every": 1, "from": 7}], ((0, 2, 1), (5, None, 1)),
         "0-2,every 1 from 5", [0, 1, 2, *range(5, 301)]),
        ([{"every": 2, "from": 0}, {"every": 4, "from": 2}], ((0, None, 2),),
         "every 2 from 0", list(range(0, 301, 2))),
    ],
)
def test_periodic_steps(value: object, runs: tuple[object, ...], text: str,
                        window: list[int]) -> None:
    steps = StepSet.parse(value)
    assert steps.runs == runs
    assert str(steps) == text
    assert steps.within(0, 300) == window
    assert StepSet.parse(steps.to_json()) == steps
    assert steps.first() == window[0]
    assert steps.next_after(window[0]) == (window[1] if len(window) > 1 else None)
    if runs[-1][1] is None:  # open-ended: nothing counts or lists the whole set
        assert not steps.is_bounded and steps.count() is None and steps.last() is None
        assert steps.run_lengths() is None
        assert window[-1] + 10**15 * runs[-1][2] in steps


def test_periodic_steps_json_and_far_windows() -> None:
    steps = StepSet.parse({"every": 100, "from": 100})
    assert steps.to_json() == [{"every": 100, "from": 100}]
    assert steps.within(10**15, 10**15 + 250) == [10**15, 10**15 + 100, 10**15 + 200]
    assert steps.next_after(10**15) == 10**15 + 100
    assert steps.run_end(200) == 200
    assert steps.every_step_from() is None
    assert StepSet.parse({"every": 1, "from": 7}).every_step_from() == 7
    assert StepSet.parse("all").every_step_from() == 0
    assert StepSet.parse({"every": 1, "from": 7}).run_end(7) is None  # never ends
    assert StepSet.parse([{"every": 100}]) == StepSet.parse({"every": 100, "from": 100})
    assert hash(StepSet.parse([{"every": 100}])) == hash(steps)


_periodic_items = st.builds(
    lambda every, start, until: {"every": every, "from": start,
                                 **({} if until is None else {"until": start + until})},
    st.integers(1, 12), st.integers(0, 60), st.none() | st.integers(0, 60))


def _naive_periodic(items: list[int | str | dict[str, int]], top: int) -> set[int]:
    members = _naive([item for item in items if not isinstance(item, dict)])
    for item in items:
        if isinstance(item, dict):
            members.update(range(item["from"], min(item.get("until", top), top) + 1,
                                 item["every"]))
    return members


_items = st.one_of(
    st.integers(0, 60),
    st.tuples(st.integers(0, 60), st.integers(0, 30)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"),
    st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(1, 12)).map(
        lambda t: f"{t[0]}-{t[0] + t[1]}:{t[2]}"
    ),
)


def _naive(items: list[int | str]) -> set[int]:
    members: set[int] = set()
    for item in items:
        if isinstance(item, int):
            members.add(item)
            continue
        bounds, _, stride = item.partition(":")
        lo, hi = (int(x) for x in bounds.split("-"))
        members.update(range(lo, hi + 1, int(stride or 1)))
    return members


@settings(max_examples=300, deadline=None)
@given(st.lists(_items, max_size=8))
def test_stepset_matches_naive_membership(items: list[int | str]) -> None:
    steps = StepSet.parse(items)
    naive = _naive(items)
    assert {n for n in range(-2, 160) if n in steps} == naive
    assert steps.count() == len(naive)
    assert steps.within(0, 200) == sorted(naive)
    assert steps.within(17, 41) == sorted(n for n in naive if 17 <= n <= 41)
    assert steps.first() == (min(naive) if naive else None)
    assert steps.last() == (max(naive) if naive else None)
    for n in range(0, 130, 7):
        assert steps.next_after(n) == min((m for m in naive if m > n), default=None)
    assert StepSet.parse(steps.to_json()) == steps
    assert StepSet.parse(str(steps) if naive else []) == steps


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_items, _periodic_items), max_size=6))
def test_periodic_steps_match_naive_membership(items: list[int | str | dict[str, int]]) -> None:
    steps = StepSet.parse(items)
    naive = _naive_periodic(items, 400)
    assert {n for n in range(0, 300) if n in steps} == {n for n in naive if n < 300}
    assert steps.within(17, 241) == sorted(n for n in naive if 17 <= n <= 241)
    assert steps.first() == (min(naive) if naive else None)
    for n in range(0, 200, 7):
        assert steps.next_after(n) == min((m for m in naive if m > n), default=None)
    assert StepSet.parse(steps.to_json()) == steps
    for first in sorted(naive)[:5]:
        end = steps.run_end(first)
        if end is not None and end < 300:
            assert end in naive and end + 1 not in naive
            assert all(m in naive for m in range(first, end + 1))


# ---------------------------------------------------------------- ranks

MESH = {"pp": 2, "dp": 2, "tp": 2}


def coords_of(rank: int, mesh: dict[str, int] = MESH) -> dict[str, int]:
    """Coordinates with the last mesh dimension varying fastest."""
    coords: dict[str, int] = {}
    for dim in reversed(list(mesh)):
        coords[dim] = rank % mesh[dim]
        rank //= mesh[dim]
    return coords


def selected(value: object, world: int = 8, sizes: dict[str, int] | None = None) -> list[int]:
    selector = RankSelector.parse(value)
    sizes = MESH if sizes is None else sizes
    return [r for r in range(world) if selector.matches(r, world, coords_of(r), sizes)]


def test_coordinates_helper() -> None:
    assert coords_of(5) == {"pp": 1, "dp": 0, "tp": 1}


@pytest.mark.parametrize(
    ("value", "ranks"),
    [
        ("all", list(range(8))),
        ([0, "all"], list(range(8))),
        (0, [0]),
        (-1, [7]),
        (-8, [0]),
        ("0-3,8,-1", [0, 1, 2, 3, 7]),
        ("-1,-2", [6, 7]),
        (" 2 - 3 ", [2, 3]),
        ([1, "5-6"], [1, 5, 6]),
        ([], []),
        ({"tp": 0, "dp": [0, -1]}, [0, 2, 4, 6]),
        ({"tp": 1}, [1, 3, 5, 7]),
        ({"pp": -1, "tp": "all"}, [4, 5, 6, 7]),
        ({"dp": "0-1", "pp": 0}, [0, 1, 2, 3]),
        ({"pp": "0,-1", "dp": 1, "tp": 0}, [2, 6]),
        ([{"pp": 0, "tp": 0}, -1], [0, 2, 7]),
        ({"tp": []}, []),
        ({"tp": [0, "all"]}, list(range(8))),
        ({"cp": 0}, []),  # no coordinate on cp: matches nothing
    ],
)
def test_rank_selection(value: object, ranks: list[int]) -> None:
    assert selected(value) == ranks


def test_negative_index_needs_a_size() -> None:
    selector = RankSelector.parse({"dp": -1})
    assert selector.matches(2, 8, coords_of(2), MESH)
    assert not selector.matches(2, 8, coords_of(2), {"pp": 2, "tp": 2})
    assert not RankSelector.parse(-9).matches(0, 8, {}, {})


def test_local_rank_and_node() -> None:
    selector = RankSelector.parse({"local_rank": 0, "node": "0-1"})
    assert selector.matches(8, 16, {"local_rank": 0, "node": 1}, {})
    assert not selector.matches(9, 16, {"local_rank": 1, "node": 1}, {})
    assert not selector.matches(8, 16, {"node": 1}, {})
    assert RankSelector.parse({"node": -1}).matches(8, 16, {"node": 1}, {"node": 2})


@pytest.mark.parametrize(
    ("value", "is_all", "nothing", "json", "text"),
    [
        ("all", True, False, "all", "all"),
        ([3, "all"], True, False, [3, "all"], '[3, "all"]'),
        (3, False, False, 3, "3"),
        ([3], False, False, 3, "3"),
        ("0-3, 8,-1", False, False, "0-3,8,-1", "0-3,8,-1"),
        ([], False, True, [], "none"),
        ({"tp": []}, False, True, {"tp": []}, '{"tp": []}'),
        ({"tp": 0, "dp": [0, -1]}, False, False, {"tp": 0, "dp": [0, -1]}, None),
        ({"dp": "0-1,3"}, False, False, {"dp": ["0-1", 3]}, '{"dp": ["0-1", 3]}'),
        ([{"pp": "all"}, "1-2"], False, False, [{"pp": "all"}, "1-2"], None),
    ],
)
def test_rank_selector_forms(
    value: object, is_all: bool, nothing: bool, json: object, text: str | None
) -> None:
    selector = RankSelector.parse(value)
    assert selector.is_all == is_all
    assert selector.selects_nothing == nothing
    assert selector.to_json() == json
    if text is not None:
        assert str(selector) == text
    again = RankSelector.parse(selector.to_json())
    assert again == selector
    assert hash(again) == hash(selector)


_DIMS = ", ".join(DIMENSIONS)
_RANK_KINDS = "'all', a rank number, a range string, a mapping of dimensions or a list of them"


@pytest.mark.parametrize(
    ("value", "message", "path"),
    [
        ({"zz": 0}, f"unknown dimension 'zz' (expected one of {_DIMS})", ("zz",)),
        ({"xp": 0}, "unknown dimension 'xp' (did you mean 'tp'?)", ("xp",)),
        ([0, {"tpp": 0}], "unknown dimension 'tpp' (did you mean 'tp'?)", (1, "tpp")),
        ({"rank": 0}, f"unknown dimension 'rank' (expected one of {_DIMS})", ("rank",)),
        ("3-0", "range 3-0 is reversed", ()),
        ([0, {"dp": [0, "2-1"]}], "range 2-1 is reversed", (1, "dp", 1)),
        ("2--1", "malformed rank range '2--1' (expected N, -N or A-B with A, B >= 0)", ()),
        ("-3--1", "malformed rank range '-3--1' (expected N, -N or A-B with A, B >= 0)", ()),
        ("0-", "malformed rank range '0-' (expected N, -N or A-B with A, B >= 0)", ()),
        ([1, "a"], "malformed rank range 'a' (expected N, -N or A-B with A, B >= 0)", (1,)),
        (
            {"tp": "0,x"},
            "malformed tp range 'x' (expected N, -N or A-B with A, B >= 0)",
            ("tp",),
        ),
        (
            {"tp": True},
            "tp must be 'all', an index, a range string or a list of them, got a boolean",
            ("tp",),
        ),
        (
            {"dp": [0, None]},
            "dp must be 'all', an index, a range string or a list of them, got null",
            ("dp", 1),
        ),
        ({}, "a ranks mapping needs at least one dimension", ()),
        ([0, {}], "a ranks mapping needs at least one dimension", (1,)),
        (True, f"ranks must be {_RANK_KINDS}, got a boolean", ()),
        (1.0, f"ranks must be {_RANK_KINDS}, got a number", ()),
        (None, f"ranks must be {_RANK_KINDS}, got null", ()),
        (
            [0, [1]],
            "a ranks list item must be 'all', a rank, a range string or a mapping, got a list",
            (1,),
        ),
        (
            [False],
            "rank must be 'all', an index, a range string or a list of them, got a boolean",
            (0,),
        ),
        ("0-" + "9" * 19, f"rank {'9' * 19}: too large (ranks are below 10**18)", ()),
        (
            [0, "-" + "1" * 4000],
            "rank -11111111111... (4000 digits): too large (ranks are below 10**18)",
            (1,),
        ),
        ({"tp": [0, 10**18]}, f"tp {10**18}: too large (indices are below 10**18)", ("tp", 1)),
    ],
)
def test_rank_errors(value: object, message: str, path: tuple[str | int, ...]) -> None:
    with pytest.raises(SelectorError) as info:
        RankSelector.parse(value)
    assert info.value.message == message
    assert info.value.path == path


@pytest.mark.parametrize(
    ("value", "world", "sizes", "problems"),
    [
        ("0-3", 4, MESH, []),
        (9, 4, None, [("rank 9 is out of range for world 4", ())]),
        (-5, 4, None, [("rank -5 is out of range for world 4", ())]),
        (-4, 4, None, []),
        ("0-3,8,-1", 4, None, [("rank 8 is out of range for world 4", ())]),
        (["2-5"], 4, None, [("rank 2-5 is out of range for world 4", (0,))]),
        (9, None, None, []),
        ({"tp": 3}, 8, MESH, [("tp 3 is out of range (tp has 2)", ("tp",))]),
        ({"tp": [0, -3]}, 8, MESH, [("tp -3 is out of range (tp has 2)", ("tp", 1))]),
        ({"dp": "0-2"}, 8, MESH, [("dp 0-2 is out of range (dp has 2)", ("dp",))]),
        (
            [0, {"cp": 0, "tp": 5}],
            8,
            MESH,
            [
                ("dimension 'cp' is not in the mesh (mesh: pp, dp, tp)", (1, "cp")),
                ("tp 5 is out of range (tp has 2)", (1, "tp")),
            ],
        ),
        ({"cp": "all"}, 8, {}, [("dimension 'cp' is not in the mesh (mesh: empty)", ("cp",))]),
        ({"cp": 7}, 8, None, []),
        ({"local_rank": 0, "node": 3}, 8, MESH, []),
        (
            {"local_rank": 8},
            8,
            {**MESH, "local_rank": 8},
            [("local_rank 8 is out of range (local_rank has 8)", ("local_rank",))],
        ),
        ("all", 1, MESH, []),
    ],
)
def test_rank_check(
    value: object,
    world: int | None,
    sizes: dict[str, int] | None,
    problems: list[tuple[str, tuple[str | int, ...]]],
) -> None:
    found = RankSelector.parse(value).check(world, sizes)
    assert [(p.message, p.path) for p in found] == problems


def test_module_does_not_import_torch() -> None:
    # A fresh interpreter: importing the selectors (and the package) must not load torch.
    code = (
        "import sys\n"
        "import policy_engine.language.values.steps, policy_engine.language.values.ranks\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
