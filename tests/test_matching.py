"""Calls matched across ranks (analysis/matching.py) from the ranks' records alone: wait,
transfer and bandwidth by their definitions, the vote and its test, clock offsets and their
uncertainty, calls that cannot be matched, and the cause."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from policy_engine.analysis.collective_form import CallTable, rank_runs, read
from policy_engine.analysis.matching import ALPHA, Matcher, RankWork, tail_probability


def table(calls: list[tuple[Any, ...]], *, groups: dict[str | None, list[int]] | None = None,
          clock: str = "host", base: float = 1e9) -> CallTable:
    """A rank's table: ``calls`` are (group, number, kind, bytes, start, end[, issue]) with
    times in µs; ``groups``: name -> ranks (default one group "0" of ranks 0-3)."""
    groups = groups if groups is not None else {"0": [0, 1, 2, 3]}
    names = sorted({c[2] for c in calls})
    gnames = list(groups)
    record = {
        "source": "nccl", "clock": clock, "numbered": "seq", "base_us": base,
        "groups": [{"name": g, "desc": "", "size": len(r) or None,
                    "ranks": rank_runs(r) if r else None} for g, r in groups.items()],
        "names": names, "dtypes": ["Float"],
        "calls": {"group": [gnames.index(c[0]) for c in calls],
                  "number": [c[1] for c in calls], "name": [names.index(c[2]) for c in calls],
                  "dtype": [0] * len(calls), "bytes": [c[3] for c in calls],
                  "issue": [c[6] if len(c) > 6 else None for c in calls],
                  "start": [c[4] for c in calls], "end": [c[5] for c in calls]},
        "folded": [], "total": len(calls), "p2p": 0, "capped": False, "problems": []}
    return read(record)


def job(arrivals: list[list[float]], *, late_by: float = 0.0, ends: float = 50.0,
        size: int = 1 << 20, kind: str = "allreduce", **kw: Any) -> Matcher:
    """A matcher over ranks whose call i arrives at 1000 i + arrivals[rank][i] and ends at
    1000 i + ends."""
    m = Matcher(**kw)
    for rank, times in enumerate(arrivals):
        m.add(rank, table([("0", i + 1, kind, size, 1000.0 * i + t, 1000.0 * i + ends)
                           for i, t in enumerate(times)],
                          groups={"0": list(range(len(arrivals)))}))
    return m


def test_wait_and_transfer_are_their_definitions() -> None:
    m = Matcher()
    starts, ends = [0.0, 10.0, 30.0], [40.0, 41.0, 42.0]
    for rank in range(3):
        m.add(rank, table([("0", 7, "allreduce", 3_000_000, starts[rank], ends[rank])],
                          groups={"0": [0, 1, 2]}))
    out = m.result(steps=2)
    # last arrival 30: waits 30, 20, 0; the mean end 41: transfer 11
    assert [out["ranks"][str(r)]["wait_us"] for r in range(3)] == [30.0, 20.0, 0.0]
    assert [out["ranks"][str(r)]["transfer_us"] for r in range(3)] == [10.0, 11.0, 12.0]
    assert out["ranks"]["0"]["wait_per_step_us"] == 15.0
    calls = m.calls()
    assert calls["wait_us"] == [50.0] and calls["wait_max_us"] == [30.0]
    assert calls["transfer_us"] == [11.0] and calls["last_rank"] == [2]
    assert calls["last_us"] == [1e9 + 30.0]
    # 3 MB in 11 µs: algbw = 3e6 / 11e-6 / 1e9 GB/s; busbw x 2(n-1)/n
    assert calls["algbw_gbps"][0] == pytest.approx(3e6 / 11e-6 / 1e9)
    assert calls["busbw_gbps"][0] == pytest.approx(3e6 / 11e-6 / 1e9 * 4 / 3)
    mine = m.rank_calls(1)
    assert mine == {"group": ["0"], "number": [7], "kind": ["allreduce"],
                    "arrival_us": [1e9 + 10.0], "wait_us": [20.0], "transfer_us": [11.0]}


def test_the_late_rank_wins_the_vote_and_the_test() -> None:
    rng = random.Random(1)
    arrivals = [[rng.uniform(0, 5) + (200.0 if r == 2 else 0.0) for _ in range(20)]
                for r in range(4)]
    out = job(arrivals).result()
    late = out["late"]
    assert late["rank"] == 2 and late["votes"] == 20 and late["expected"] == 5.0
    assert late["p_value"] * late["ranks_tested"] < ALPHA
    assert late["p_value"] == pytest.approx(0.25 ** 20)
    assert out["ranks"]["2"]["wait_us"] == 0.0 and out["ranks"]["2"]["last"] == 20
    assert out["ranks"]["2"]["late_us"] == pytest.approx(200.0, abs=5)
    for r in (0, 1, 3):
        assert out["ranks"][str(r)]["wait_us"] == pytest.approx(20 * 200.0, rel=0.05)


def test_no_late_rank_when_the_last_arrival_is_chance() -> None:
    rng = random.Random(7)
    arrivals = [[rng.uniform(0, 100) for _ in range(40)] for _ in range(4)]
    out = job(arrivals).result()
    assert out["late"]["rank"] is None
    assert out["late"]["cause"]["kind"] == "transfer"
    assert out["late"]["cause"]["groups"] == ["0"]


def test_clock_offsets_move_arrivals_to_rank_0s_clock() -> None:
    """Rank 1's clock runs 500 µs ahead: uncorrected, it looks late; with its offset,
    rank 3, truly 50 µs late, is."""
    arrivals = [[0.0] * 12, [500.0] * 12, [0.0] * 12, [50.0] * 12]
    plain = job(arrivals).result()
    assert plain["late"]["rank"] == 1 and plain["clock"]["offsets"] == "none"
    corrected = job(arrivals, offsets={1: (-500.0, 2.0)}).result()
    assert corrected["late"]["rank"] == 3
    assert corrected["clock"] == {"offsets": "given", "ranks": 1, "uncertainty_us": 2.0}
    assert corrected["ranks"]["0"]["wait_us"] == pytest.approx(12 * 50.0)


def test_leads_within_the_clocks_uncertainty_do_not_vote() -> None:
    arrivals = [[0.0] * 12, [0.0] * 12, [30.0] * 12, [0.0] * 12]
    sure = job(arrivals).result()
    assert sure["late"]["rank"] == 2
    unsure = job(arrivals, offsets={r: (0.0, 20.0) for r in range(4)}).result()
    assert unsure["late"]["rank"] is None and unsure["ranks"]["2"]["votes"] == 0
    assert unsure["ranks"]["2"]["last"] == 12  # still last, not clearly


def test_calls_not_listed_by_every_member_or_differing_are_not_matched() -> None:
    m = Matcher()
    m.add(0, table([("0", 1, "allreduce", 8, 0.0, 9.0), ("0", 2, "allreduce", 8, 20.0, 29.0),
                    ("0", 3, "allreduce", 8, 40.0, 49.0)], groups={"0": [0, 1]}))
    m.add(1, table([("0", 1, "allreduce", 8, 1.0, 9.0), ("0", 3, "allreduce", 16, 41.0, 49.0)],
                   groups={"0": [0, 1]}))
    out = m.result()
    assert out["calls"]["matched"] == 1
    assert (out["calls"]["incomplete"], out["calls"]["inconsistent"]) == (1, 1)
    assert any("differ in kind or size" in p for p in out["problems"])
    assert any("not listed by every rank" in p for p in out["problems"])


def test_unknown_groups_are_matched_only_when_their_order_agrees() -> None:
    def unknown(kinds: list[str]) -> CallTable:
        return table([(None, i + 1, k, 0, 10.0 * i, 10.0 * i + 5) for i, k in enumerate(kinds)],
                     groups={None: []})
    agree = Matcher()
    agree.add(0, unknown(["allreduce", "broadcast"]))
    agree.add(1, unknown(["allreduce", "broadcast"]))
    assert agree.result()["calls"]["matched"] == 2
    differ = Matcher()
    differ.add(0, unknown(["allreduce", "broadcast"]))
    differ.add(1, unknown(["broadcast", "allreduce"]))
    out = differ.result()
    assert out["calls"]["matched"] == 0 and out["calls"]["unknown_group"] == 2
    assert any("unknown groups differ in order" in p for p in out["problems"])


def test_calls_are_matched_within_their_own_group_and_bandwidth_given_per_group() -> None:
    """A 2x2 mesh: tp pairs (0, 1) and (2, 3), dp pairs (0, 2) and (1, 3), every pair
    numbering its calls from 1; the (2, 3) pair moves its bytes slowest."""
    m = Matcher()
    for rank in range(4):
        tp, dp = f"tp{rank // 2}", f"dp{rank % 2}"
        slow = 4.0 if rank >= 2 else 1.0
        calls = []
        for i in range(5):
            calls.append((tp, i + 1, "allreduce", 1 << 20, 1000.0 * i, 1000.0 * i + 100 * slow))
            calls.append((dp, i + 1, "allgather", 1 << 20, 1000.0 * i + 500, 1000.0 * i + 600))
        m.add(rank, table(calls, groups={tp: [r for r in range(4) if r // 2 == rank // 2],
                                         dp: [r for r in range(4) if r % 2 == rank % 2]}))
    out = m.result()
    assert out["calls"]["matched"] == 20 and out["calls"]["incomplete"] == 0
    assert out["groups"][0]["name"] == "tp1" == out["slowest_group"]
    by_name = {g["name"]: g for g in out["groups"]}
    assert by_name["tp1"]["busbw_gbps"] == pytest.approx(by_name["tp0"]["busbw_gbps"] / 4)
    # an all-gather of a pair: busbw = algbw x (n-1)/n = algbw / 2
    assert by_name["dp0"]["busbw_gbps"] == pytest.approx(by_name["dp0"]["algbw_gbps"] / 2)
    calls = m.calls()
    assert set(zip(calls["group"], calls["ranks"], strict=True)) == \
        {("tp0", 2), ("tp1", 2), ("dp0", 2), ("dp1", 2)}


def test_the_cause_work_grew() -> None:
    arrivals = [[0.0] * 10, [0.0] * 10, [300.0] * 10, [0.0] * 10]
    work = {r: RankWork(regions={"forward": 1000.0 + (3000.0 if r == 2 else 0.0),
                                 "optimizer": 500.0}) for r in range(4)}
    cause = job(arrivals).result(work=work)["late"]["cause"]
    assert cause["kind"] == "work" and cause["region"] == "forward"
    assert cause["extra_us"] == 3000.0 and cause["late_us"] == pytest.approx(3000.0)


def test_the_cause_an_operator_when_no_region_explains() -> None:
    arrivals = [[0.0] * 10, [0.0] * 10, [300.0] * 10, [0.0] * 10]
    work = {r: RankWork(regions={"step": 100.0}, ops={"aten::mm": 900.0 + 3000 * (r == 2)})
            for r in range(4)}
    cause = job(arrivals).result(work=work)["late"]["cause"]
    assert (cause["kind"], cause["op"]) == ("work", "aten::mm")


def test_the_cause_host_bound_late_with_an_idle_device() -> None:
    arrivals = [[0.0] * 10, [0.0] * 10, [300.0] * 10, [0.0] * 10]
    work = {r: RankWork(regions={"forward": 1000.0}, idle_us=100.0 + 2900.0 * (r == 2))
            for r in range(4)}
    m = Matcher()
    for rank, times in enumerate(arrivals):
        m.add(rank, table([("0", i + 1, "allreduce", 64, 1000.0 * i + t, 1000.0 * i + 400)
                           for i, t in enumerate(times)], clock="device"))
    cause = m.result(work=work)["late"]["cause"]
    assert cause["kind"] == "host" and cause["idle_extra_us"] == 2900.0


def test_the_cause_unknown_when_the_figures_do_not_show_it() -> None:
    arrivals = [[0.0] * 10, [0.0] * 10, [300.0] * 10, [0.0] * 10]
    work = {r: RankWork(regions={"forward": 1000.0}) for r in range(4)}
    assert job(arrivals).result(work=work)["late"]["cause"]["kind"] == "unknown"


def test_lateness_counts_each_group_once() -> None:
    """Rank 2, 300 µs late to its tp call, is as late to the dp call after it: the
    lateness its work must explain is 300 µs a step, not 600."""
    m = Matcher()
    for rank in range(4):
        tp, dp = f"tp{rank // 2}", f"dp{rank % 2}"
        calls = []
        for i in range(10):
            t = 1000.0 * i + (300.0 if rank == 2 else 0.0)
            calls.append((tp, i + 1, "allreduce", 64, t, t + 10))
            calls.append((dp, i + 1, "allreduce", 64, t + 20, t + 30))
        m.add(rank, table(calls, groups={tp: [r for r in range(4) if r // 2 == rank // 2],
                                         dp: [r for r in range(4) if r % 2 == rank % 2]}))
    work = {r: RankWork(regions={"work": 100.0 + 3000.0 * (r == 2)}) for r in range(4)}
    late = m.result(work=work)["late"]
    assert late["rank"] == 2
    assert late["cause"]["late_us"] == pytest.approx(3000.0)


def test_a_rank_given_twice_and_groups_whose_sizes_differ_are_said() -> None:
    m = Matcher()
    m.add(0, table([("0", 1, "allreduce", 8, 0.0, 1.0)], groups={"0": [0, 1]}))
    m.add(0, table([("0", 1, "allreduce", 8, 0.0, 1.0)], groups={"0": [0, 1]}))
    m.add(1, table([("0", 1, "allreduce", 8, 0.0, 1.0)], groups={"0": [0, 1, 2]}))
    out = m.result()
    assert out["calls"]["matched"] == 0
    assert any("given twice" in p for p in out["problems"])
    assert any("has 2 ranks on one rank and 3 on rank 1" in p for p in out["problems"])


def test_the_tail_is_exact_and_its_approximation_close() -> None:
    p = [0.25] * 20
    exact = sum(math.comb(20, j) * 0.25 ** j * 0.75 ** (20 - j) for j in range(9, 21))
    assert tail_probability(p, 9) == pytest.approx(exact, rel=1e-9)
    mixed = [0.5, 0.25, 0.25, 0.5]  # two pairs and two groups of four
    brute = 0.0
    for outcome in range(16):
        bits = [(outcome >> i) & 1 for i in range(4)]
        if sum(bits) >= 3:
            brute += math.prod(q if b else 1 - q for q, b in zip(mixed, bits, strict=True))
    assert tail_probability(mixed, 3) == pytest.approx(brute)
    many = [0.5] * 2000  # past EXACT_CALLS: the normal approximation
    assert tail_probability(many, 1050) == pytest.approx(0.0132, abs=0.002)
