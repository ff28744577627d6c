"""Collective calls matched across the ranks of one capture window: who arrived last, how
long each rank waited for it, how long the data then took to move, and how fast.

A :class:`Matcher` takes each rank's calls (``add(rank, table)``, the tables
collective_form.read returns from the ranks' summaries: no trace is read) and matches
them by (process group name, number in the group). For each call c of a group of n
ranks that every member listed:

- arrival a_r = the rank's start of the call (the NCCL/HCCL kernel's start on the device,
  the gloo worker's start on the host), plus the rank's clock offset when one is given;
- last arrival L = max_r a_r; the late rank of the call is the one that arrived at L;
- wait_r = L - a_r: how long rank r's call sat waiting for the last one;
- transfer = mean_r(end_r) - L: how long the call ran once everyone was there;
- algbw = bytes / transfer, busbw = algbw x NCCL-tests' factor for the kind and n
  (collective_form.bus_factor), in GB/s (10^9 bytes per second).

Assumptions, each said where it bites: a rank's call cannot make progress before every
member has arrived (true of the ring and tree algorithms of NCCL, gloo and HCCL; a
broadcast's non-root ranks may finish before a late root's peers, which only lengthens
wait); the ends of one call are near-simultaneous, so the mean end stands for each; and
arrivals on different ranks are comparable: within one host they share a clock, across
hosts each rank's offset to rank 0's clock must be given (``offsets``, with an
uncertainty), or the result says none was and the ranks were taken to share one.

The late rank of a window is found by vote, as msprof-analyze's slow-rank recipe votes,
with its own test: a call votes for its last arrival when that rank's lead over the
second-last exceeds ``FLOOR_US`` plus the two ranks' clock uncertainties. If ranks arrived
last at random, rank r's votes would follow a Poisson-binomial law (each call a coin of
probability 1/n_c); the rank with the most votes above that expectation is the late rank
when its one-sided tail probability P(X >= votes) (exact up to ``EXACT_CALLS`` calls, a
normal approximation with continuity correction past it), times the number of ranks
tested (Bonferroni), is below ``ALPHA``. Its cause is then read from the window's
per-rank figures (:class:`RankWork`): an idle device while the others' was busy
(host-bound), else the region or operator whose time grew most over the other ranks'
median, when that growth covers at least half its lateness; with no late rank, the groups
whose transfers are slowest (median busbw, lowest first).

Columns, not objects: per call a few numbers in arrays, per rank three arrays, so that
10,000 ranks of 200 calls take seconds and tens of MB (benchmarks/bench_collectives.py).
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import mul
from typing import Any, Literal, cast

from policy_engine.analysis.collective_form import CallTable, bus_factor
from policy_engine.analysis.matching_form import (
    CallCounts,
    CallRow,
    Cause,
    ClockNote,
    GroupRow,
    LateRank,
    Matching,
    RankCalls,
    Unmatched,
    VoteTest,
)

#: A call votes for its last arrival when it led the second-last by more than this (µs),
#: plus the two ranks' clock uncertainties: timestamps are µs apart at best.
FLOOR_US = 1.0
#: Family-wise error of the late-rank test (Bonferroni over the ranks tested).
ALPHA = 0.01
#: The tail probability is computed exactly up to this many calls.
EXACT_CALLS = 500
#: Lateness that a rank's figures must explain, at least, to be named as its cause.
EXPLAINS = 0.5
#: Calls listed in a window's result, the longest waits first.
WORST_CALLS = 20


@dataclass(frozen=True)
class RankWork:
    """A rank's figures in the same window (from its summary), for the cause:
    ``regions`` and ``ops``: time per region and per operator (µs); ``idle_us``: the
    device's idle time (None on a CPU-only trace)."""

    regions: Mapping[str, float] = field(default_factory=dict)
    ops: Mapping[str, float] = field(default_factory=dict)
    idle_us: float | None = None


class _RankCalls:
    """A rank's figures over its matched calls. Its ``__dict__`` is the rank's JSON object:
    made by one class with its keys in one order, it shares them with every other rank's
    (CPython's key-sharing dictionaries, PEP 412), a third of a plain dict's size: a
    window of 100,000 ranks holds one a rank. ``steps``: the window's steps, for the
    per-step figures."""

    def __init__(self, calls: int, wait_us: float, transfer_us: float, last: int,
                 votes: int, late_us: float | None, steps: int | None) -> None:
        self.calls, self.wait_us, self.transfer_us = calls, wait_us, transfer_us
        self.last, self.votes, self.late_us = last, votes, late_us
        if steps:
            self.wait_per_step_us = round(wait_us / steps, 3)
            self.transfer_per_step_us = round(transfer_us / steps, 3)

class Matcher:
    """One window's calls, rank by rank (``add``), then matched (``result``).

    ``offsets``: per rank, (offset, uncertainty) in µs that bring its clock to rank 0's
    (a time t on rank r is t + offset on rank 0's clock); a rank without one gets 0.
    """

    def __init__(self, offsets: Mapping[int, tuple[float, float]] | None = None) -> None:
        self.offsets = dict(offsets or {})
        self.gids: dict[str | None, int] = {}
        self.g_name: list[str | None] = []
        self.g_size: list[int] = []  # 0: unknown
        self.g_ranks: list[set[int]] = []  # ranks that listed a call of the group
        self.index: dict[int, int] = {}  # gid << 53 | number -> call id
        self.kinds: list[str] = []
        self.kind_ids: dict[str, int] = {}
        # per call
        self.c_gid, self.c_num, self.c_kind = array("q"), array("q"), array("q")
        self.c_bytes, self.c_n, self.c_last_rank = array("q"), array("q"), array("q")
        self.c_bad = bytearray()
        self.c_last, self.c_second, self.c_first = array("d"), array("d"), array("d")
        self.c_last_unc, self.c_second_unc = array("d"), array("d")
        self.c_sum_arr, self.c_sum_end = array("d"), array("d")
        # per rank: where its calls lie in the flat columns below (first, count), and
        # what brings them to rank 0's clock (its table's base plus its offset, less ref);
        # the columns hold every rank's call ids, starts and ends, rank after rank (a few
        # numbers a call, no object a rank: 100,000 ranks stay small)
        self.ranks: dict[int, int] = {}  # rank -> its place in the three columns below
        self.r_first, self.r_count, self.r_shift = array("q"), array("q"), array("d")
        self.r_cid, self.r_start, self.r_end = array("q"), array("d"), array("d")
        self.ref: float | None = None
        self._cached: tuple[int, _CallFigures, Unmatched] | None = None
        self.clocks: set[str] = set()
        self.problems: list[str] = []
        self.folded = 0

    def add(self, rank: int, table: CallTable) -> None:
        """Rank ``rank``'s calls. A rank added twice keeps its first table."""
        if rank in self.ranks:
            self.problems.append(f"rank {rank} was given twice: its second calls ignored")
            return
        offset, unc = self.offsets.get(rank, (0.0, 0.0))
        if self.ref is None:
            self.ref = table.base + offset
        # the table's times -> rank 0's clock, less the first rank's base: sums of times
        # stay small numbers, exact to well under a nanosecond
        shift = table.base + offset - self.ref
        self.clocks.add(table.clock)
        self.folded += sum(row[3] for row in table.folded)
        gmap = [self._gid(g.name, g.size, rank) for g in table.groups]
        kmap = [self._kind(k) for k in table.names]
        index, new_call = self.index, self._new_call
        c_n, c_last, c_second, c_first = self.c_n, self.c_last, self.c_second, self.c_first
        c_last_unc, c_second_unc, c_last_rank = \
            self.c_last_unc, self.c_second_unc, self.c_last_rank
        c_sum_arr, c_sum_end, c_bad = self.c_sum_arr, self.c_sum_end, self.c_bad
        c_kind, c_bytes = self.c_kind, self.c_bytes
        cids = array("q", bytes(8 * len(table)))
        for j, (g, number, k, size, start, end) in enumerate(zip(
                table.group, table.number, table.name, table.bytes, table.start,
                table.end, strict=True)):
            gid, kind = gmap[g], kmap[k]
            key = gid << 53 | number  # numbers are below 2**53
            cid = index.get(key)
            if cid is None:
                cid = new_call(key, gid, number, kind, size)
            elif c_kind[cid] != kind or c_bytes[cid] != size:
                c_bad[cid] = 1
            cids[j] = cid
            a = start + shift
            c_n[cid] += 1
            c_sum_arr[cid] += a
            c_sum_end[cid] += end + shift
            if a > c_last[cid]:
                c_second[cid], c_second_unc[cid] = c_last[cid], c_last_unc[cid]
                c_last[cid], c_last_unc[cid], c_last_rank[cid] = a, unc, rank
            elif a > c_second[cid]:
                c_second[cid], c_second_unc[cid] = a, unc
            if a < c_first[cid]:
                c_first[cid] = a
        self.ranks[rank] = len(self.r_first)
        self.r_first.append(len(self.r_cid))
        self.r_count.append(len(cids))
        self.r_shift.append(shift)
        self.r_cid.extend(cids)
        self.r_start.extend(table.start)
        self.r_end.extend(table.end)

    def _gid(self, name: str | None, size: int | None, rank: int) -> int:
        gid = self.gids.get(name)
        if gid is None:
            gid = self.gids[name] = len(self.g_name)
            self.g_name.append(name)
            self.g_size.append(size or 0)
            self.g_ranks.append(set())
        elif size and self.g_size[gid] and size != self.g_size[gid]:
            self.problems.append(f"group {name!r} has {self.g_size[gid]} ranks on one rank "
                                 f"and {size} on rank {rank}: its calls are not matched")
            self.g_size[gid] = -1
        self.g_ranks[gid].add(rank)
        return gid

    def _kind(self, kind: str) -> int:
        found = self.kind_ids.get(kind)
        if found is None:
            found = self.kind_ids[kind] = len(self.kinds)
            self.kinds.append(kind)
        return found

    def _new_call(self, key: int, gid: int, number: int, kind: int, size: int) -> int:
        cid = len(self.c_gid)
        self.index[key] = cid
        for col, value in ((self.c_gid, gid), (self.c_num, number), (self.c_kind, kind),
                           (self.c_bytes, size), (self.c_n, 0), (self.c_last_rank, -1)):
            col.append(value)
        for dcol in (self.c_last, self.c_second):
            dcol.append(-math.inf)
        self.c_first.append(math.inf)
        for dcol in (self.c_last_unc, self.c_second_unc, self.c_sum_arr, self.c_sum_end):
            dcol.append(0.0)
        self.c_bad.append(0)
        return cid

    # -- the result -------------------------------------------------------------------
    def result(self, work: Mapping[int, RankWork] | None = None,
               steps: int | None = None) -> Matching:
        """The window's matching (JSON-ready): ``work``, each rank's figures for the cause;
        ``steps``, the window's steps, for the per-step figures."""
        calls = self._figures()
        why: Unmatched = self._cached[2] if self._cached is not None else {}
        per_rank, chance = self._ranks(calls, steps)
        late = _vote(per_rank, chance, lambda r: calls.coins(self._of(r)[0]))
        groups = calls.groups()
        if late["rank"] is not None:
            late["cause"] = _cause(late["rank"], self._lateness(late["rank"], calls),
                                   work or {}, self.clock())
        elif groups:
            slowest = groups[0]
            late["cause"] = {"kind": "transfer", "groups": [g["name"] for g in groups],
                             "busbw_gbps": slowest["busbw_gbps"],
                             "text": f"no rank arrived late; the slowest transfers are "
                                     f"group {slowest['name']!r}'s"}
        return {
            "clock": self._clock_text(),
            # why's keys are CallCounts' own (its base, Unmatched)
            "calls": cast(CallCounts, {"matched": calls.matched, "listed": len(self.c_gid),
                                       **why, "folded": self.folded}),
            "ranks": {str(r): per_rank[r] for r in sorted(per_rank)},
            "late": late,
            "groups": groups,
            "slowest_group": groups[0]["name"] if groups else None,
            "worst_calls": calls.worst(),
            "problems": (self.problems + _said(why))[:16],
        }

    def _of(self, rank: int) -> tuple[array[int], array[float], array[float], float]:
        """Rank ``rank``'s call ids, starts and ends, and its shift to rank 0's clock."""
        i = self.ranks[rank]
        first, count, shift = self.r_first[i], self.r_count[i], self.r_shift[i]
        end = first + count
        return (self.r_cid[first:end], self.r_start[first:end], self.r_end[first:end],
                shift)

    def clock(self) -> str:
        return "device" if self.clocks == {"device"} else "host"

    def _clock_text(self) -> ClockNote:
        if not self.offsets:
            return {"offsets": "none", "text": "no clock offsets given: the ranks' clocks "
                    "are taken to be one (true on one host; across hosts arrivals are off "
                    "by the hosts' clock difference)"}
        given = [r for r in self.ranks if r in self.offsets]
        return {"offsets": "given", "ranks": len(given),
                "uncertainty_us": max((self.offsets[r][1] for r in given), default=0.0)}

    def _complete(self) -> tuple[bytearray, Unmatched]:
        """Which calls are matched: every member listed it, alike."""
        ok = bytearray(len(self.c_gid))
        incomplete = inconsistent = unknown = 0
        unknown_bad = any(self.c_bad[c] for c in range(len(self.c_gid))
                          if self.g_name[self.c_gid[c]] is None)
        expected = [s if s > 0 else (len(r) if s == 0 else -1)
                    for s, r in zip(self.g_size, self.g_ranks, strict=True)]
        for c in range(len(self.c_gid)):
            gid = self.c_gid[c]
            if self.g_name[gid] is None and unknown_bad:
                unknown += 1
            elif self.c_bad[c]:
                inconsistent += 1
            elif self.c_n[c] != expected[gid] or expected[gid] < 2:
                incomplete += 1
            else:
                ok[c] = 1
        return ok, {"incomplete": incomplete, "inconsistent": inconsistent,
                    "unknown_group": unknown}

    def _ranks(self, calls: _CallFigures, steps: int | None = None
               ) -> tuple[dict[int, RankCalls], dict[int, float]]:
        """Each rank's wait, transfer, mean lateness and votes over its matched calls, and
        the votes it would get on average were the last arrival left to chance. Sums over a
        rank's calls run as sums of per-call columns picked by its call ids (in C, not
        a Python loop per call); an unmatched call's columns are zero."""
        out: dict[int, RankCalls] = {}
        chance: dict[int, float] = {}
        f = calls
        for rank in self.ranks:
            cids, starts, ends, shift = self._of(rank)
            def pick(col: array[float], cids: array[int] = cids) -> Any:
                return map(col.__getitem__, cids)
            count = sum(pick(f.okf))
            if not count:
                # its __dict__ is the rank's object: its attributes are RankCalls' keys
                out[rank] = cast(RankCalls, _RankCalls(0, 0.0, 0.0, 0, 0, None, steps).__dict__)
                chance[rank] = 0.0
                continue
            if count == len(cids):  # every call matched: plain sums
                arrived, ended = sum(starts), sum(ends)
            else:
                arrived = sum(map(mul, starts, pick(f.okf)))
                ended = sum(map(mul, ends, pick(f.okf)))
            last = sum(pick(f.lz))
            arrived += count * shift
            ended += count * shift
            late = sum(map(mul, starts, pick(f.m1))) + shift * sum(pick(f.m1)) \
                - sum(pick(f.m0))
            out[rank] = cast(RankCalls, _RankCalls(  # as above
                int(count), round(last - arrived, 3) + 0.0, round(ended - last, 3),
                f.last_count.get(rank, 0), f.vote_count.get(rank, 0), round(late / count, 3),
                steps).__dict__)
            chance[rank] = sum(pick(f.pv))
        return out, chance

    def calls(self) -> dict[str, list[Any]]:
        """Every matched call's figures, column by column, in the order first seen:
        group, number, kind, bytes, ranks, last_rank, last_us (the last arrival, on rank
        0's clock), wait_us (its ranks' waits summed), wait_max_us, transfer_us,
        algbw_gbps, busbw_gbps."""
        figures = self._figures()
        out: dict[str, list[Any]] = {}
        for c in range(len(self.c_gid)):
            if figures.ok[c]:
                for key, value in figures.row(c).items():
                    out.setdefault(key, []).append(value)
        return out

    def rank_calls(self, rank: int) -> dict[str, list[Any]]:
        """Rank ``rank``'s matched calls, column by column: group, number, kind, arrival_us
        (on rank 0's clock), wait_us, transfer_us."""
        figures = self._figures()
        cids, starts, ends, shift = self._of(rank)
        out: dict[str, list[Any]] = {k: [] for k in ("group", "number", "kind", "arrival_us",
                                                     "wait_us", "transfer_us")}
        for cid, a, e in zip(cids, starts, ends, strict=True):
            if figures.ok[cid]:
                last = self.c_last[cid]
                for key, value in (("group", self.g_name[self.c_gid[cid]]),
                                   ("number", self.c_num[cid]),
                                   ("kind", self.kinds[self.c_kind[cid]]),
                                   ("arrival_us", round(a + shift + (self.ref or 0.0), 3)),
                                   ("wait_us", round(last - a - shift, 3)),
                                   ("transfer_us", round(e + shift - last, 3))):
                    out[key].append(value)
        return out

    def _figures(self) -> _CallFigures:
        if self._cached is None or self._cached[0] != len(self.ranks):
            ok, why = self._complete()
            self._cached = (len(self.ranks), _CallFigures(self, ok), why)
        return self._cached[1]

    def _lateness(self, rank: int, calls: _CallFigures) -> float:
        """How late ``rank`` was over the window: its arrival less the mean of the
        others', summed per group, the largest group's sum (a rank late to its
        tensor-parallel call is late to the data-parallel one after it for the same
        reason; counting both would count that reason twice)."""
        cids, starts, _, shift = self._of(rank)
        by_group: dict[int, float] = {}
        for cid, a in zip(cids, starts, strict=True):
            if calls.okf[cid]:
                gid = self.c_gid[cid]
                by_group[gid] = by_group.get(gid, 0.0) + (a + shift) * calls.m1[cid] \
                    - calls.m0[cid]
        return max(by_group.values(), default=0.0)


class _CallFigures:
    """The calls' figures, computed once, as columns: matched or not, last arrival, mean
    end, the vote, and the coefficients of each rank's sums (``Matcher._ranks``)."""

    def __init__(self, m: Matcher, ok: bytearray) -> None:
        self.m, self.ok = m, ok
        n = len(m.c_gid)
        self.last = m.c_last
        self.mean_end = array("d", (m.c_sum_end[c] / m.c_n[c] if m.c_n[c] else 0.0
                                    for c in range(n)))
        zeros = array("d", bytes(8 * n))
        # okf: 1.0 for a matched call; lz: its last arrival; m1, m0: a rank's lateness on
        # it is a * m1 - m0 (its arrival less the mean of the others'); pv: the chance
        # that a member is its last arrival, on calls that vote
        self.okf, self.lz, self.m1, self.m0 = (array("d", zeros) for _ in range(4))
        self.pv = array("d", zeros)
        self.votes = array("b", [-1]) * n  # 1: a clear last arrival, 0: not, -1: unmatched
        self.last_count: dict[int, int] = {}
        self.vote_count: dict[int, int] = {}
        self.matched = 0
        for c in range(n):
            if not ok[c]:
                continue
            self.matched += 1
            k = m.c_n[c]
            self.okf[c], self.lz[c] = 1.0, m.c_last[c]
            self.m1[c], self.m0[c] = k / (k - 1), m.c_sum_arr[c] / (k - 1)
            winner = m.c_last_rank[c]
            self.last_count[winner] = self.last_count.get(winner, 0) + 1
            lead = m.c_last[c] - m.c_second[c]
            if lead > FLOOR_US + m.c_last_unc[c] + m.c_second_unc[c]:
                self.votes[c] = 1
                self.vote_count[winner] = self.vote_count.get(winner, 0) + 1
                self.pv[c] = 1.0 / k
            else:
                self.votes[c] = 0

    def coins(self, cids: array[int]) -> list[float]:
        """The chances of the voting calls among ``cids``."""
        return [p for p in map(self.pv.__getitem__, cids) if p > 0]

    def transfer(self, c: int) -> float:
        return max(self.mean_end[c] - self.last[c], 0.0)

    def groups(self) -> list[GroupRow]:
        """Per group: calls, bytes, median algbw and busbw, transfer; lowest busbw first
        (groups without one last)."""
        m = self.m
        stats: dict[int, list[Any]] = {}
        for c in range(len(m.c_gid)):
            if not self.ok[c]:
                continue
            row = stats.setdefault(m.c_gid[c], [0, 0, 0.0, [], []])
            size, t = m.c_bytes[c], self.transfer(c)
            row[0] += 1
            row[1] += size
            row[2] += t
            factor = bus_factor(m.kinds[m.c_kind[c]], m.c_n[c])
            if t > 0 and size > 0:
                algbw = size / t / 1e3  # bytes per µs -> GB/s
                row[3].append(algbw)
                if factor is not None:
                    row[4].append(algbw * factor)
        out: list[GroupRow] = []
        for gid, (count, size, t, algbw, busbw) in stats.items():
            out.append({"name": m.g_name[gid], "size": m.g_size[gid] or None,
                        "calls": count, "bytes": size, "transfer_us": round(t, 3),
                        "algbw_gbps": _median(algbw), "busbw_gbps": _median(busbw)})
        out.sort(key=lambda g: (g["busbw_gbps"] is None, g["busbw_gbps"] or 0.0,
                                str(g["name"])))
        return out

    def row(self, c: int) -> CallRow:
        """Call ``c``'s figures: the sum of its ranks' waits, and the longest."""
        m = self.m
        t, kind, n = self.transfer(c), m.kinds[m.c_kind[c]], m.c_n[c]
        factor = bus_factor(kind, n)
        algbw = m.c_bytes[c] / t / 1e3 if t > 0 and m.c_bytes[c] else None
        return {"group": m.g_name[m.c_gid[c]], "number": m.c_num[c], "kind": kind,
                "bytes": m.c_bytes[c], "ranks": n, "last_rank": m.c_last_rank[c],
                "last_us": round(m.c_last[c] + (m.ref or 0.0), 3),
                "wait_us": round(n * m.c_last[c] - m.c_sum_arr[c], 3),
                "wait_max_us": round(m.c_last[c] - m.c_first[c], 3),
                "transfer_us": round(t, 3), "algbw_gbps": _round(algbw),
                "busbw_gbps": _round(algbw * factor if algbw and factor else None)}

    def worst(self) -> list[CallRow]:
        """The matched calls that kept ranks waiting longest (sum of waits)."""
        m = self.m
        scored = sorted(((m.c_n[c] * m.c_last[c] - m.c_sum_arr[c], c)
                         for c in range(len(m.c_gid)) if self.ok[c]), reverse=True)
        return [self.row(c) for _, c in scored[:WORST_CALLS]]


def _said(why: Unmatched) -> list[str]:
    said = []
    if why.get("unknown_group"):
        said.append(f"{why['unknown_group']} calls of unknown groups differ in order across "
                    "ranks: not matched (a torch capture with torch.distributed up notes "
                    "the groups)")
    if why.get("inconsistent"):
        said.append(f"{why['inconsistent']} calls differ in kind or size across ranks for "
                    "one (group, number): not matched")
    if why.get("incomplete"):
        said.append(f"{why['incomplete']} calls were not listed by every rank of their "
                    "group: not matched")
    return said


def _median(values: Sequence[float]) -> float | None:
    return _round(statistics.median(values)) if values else None


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


# -- the vote -------------------------------------------------------------------------

def _vote(per_rank: Mapping[int, RankCalls], chance: Mapping[int, float],
          coins: Callable[[int], list[float]]) -> LateRank:
    """The late rank: the most votes above chance, kept when its Bonferroni-corrected
    tail probability is below ALPHA (module docstring). ``chance``: per rank the votes
    it would get by chance; ``coins(rank)``: its voting calls' chances."""
    test: VoteTest = {"test": "one-sided Poisson-binomial tail of the votes (each call a coin of "
                    "probability 1/n), Bonferroni over the ranks tested",
            "alpha": ALPHA, "floor_us": FLOOR_US}
    best: tuple[float, int] | None = None
    tested = 0
    for rank, mean in chance.items():
        if mean <= 0:
            continue
        tested += 1
        excess = per_rank[rank]["votes"] - mean
        if excess > 0 and (best is None or excess > best[0]):
            best = (excess, rank)
    if best is None:  # test's keys are LateRank's own (its base, VoteTest), as below
        return cast(LateRank, {"rank": None, **test, "ranks_tested": tested})
    rank = best[1]
    votes, p = per_rank[rank]["votes"], coins(rank)
    tail = tail_probability(p, votes)
    found = tail * tested < ALPHA
    return cast(LateRank, {"rank": rank if found else None, "candidate": rank,
                           "votes": votes, "calls": len(p), "expected": round(sum(p), 3),
                           "p_value": tail, "ranks_tested": tested, **test})


def tail_probability(p: Sequence[float], k: int) -> float:
    """P(X >= k) for X the number of successes of independent coins ``p``."""
    if k <= 0:
        return 1.0
    if len(p) > EXACT_CALLS:
        mean = sum(p)
        sd = math.sqrt(sum(q * (1 - q) for q in p))
        if sd == 0:
            return 1.0 if k <= mean else 0.0
        return 0.5 * math.erfc((k - 0.5 - mean) / (sd * math.sqrt(2)))
    dist = [1.0]
    for q in p:  # the distribution of the count, one coin at a time
        nxt = [0.0] * (len(dist) + 1)
        for j, w in enumerate(dist):
            nxt[j] += w * (1 - q)
            nxt[j + 1] += w * q
        dist = nxt
    return min(1.0, sum(dist[k:]))


# -- the cause --------------------------------------------------------------------------

def _cause(rank: int, late: float, work: Mapping[int, RankWork],
           clock: str) -> Cause:
    """Why ``rank`` arrived ``late`` µs late over the window, from the window's figures:
    an idle device (host-bound), else the region or operator that grew most over the
    other ranks' median; each only when it covers at least EXPLAINS of the lateness."""
    mine = work.get(rank)
    others = [w for r, w in work.items() if r != rank]
    if late <= 0:
        return {"kind": "unknown", "text": "it was not late on average"}
    if mine is not None and others:
        if mine.idle_us is not None and clock == "device":
            idle = [w.idle_us for w in others if w.idle_us is not None]
            extra = mine.idle_us - statistics.median(idle) if idle else 0.0
            if extra >= EXPLAINS * late:
                return {"kind": "host", "idle_extra_us": round(extra, 3),
                        "late_us": round(late, 3),
                        "text": f"rank {rank} was late with an idle device: its host issued "
                                "the work late (host-bound)"}
        for what in _WHAT:
            grew = _grew(_work(mine, what), [_work(w, what) for w in others])
            if grew is not None and grew[1] >= EXPLAINS * late:
                cause: Cause = {"kind": "work"}
                cause[what] = grew[0]
                cause["extra_us"] = round(grew[1], 3)
                cause["late_us"] = round(late, 3)
                cause["text"] = (f"rank {rank} was late because its {what} {grew[0]!r} "
                                 f"took {grew[1]:.0f} µs more than the other ranks' median")
                return cause
    return {"kind": "unknown", "late_us": round(late, 3),
            "text": f"rank {rank} was late; its figures do not show why"}


#: What a cause may name: a region, then an operator.
_WHAT: tuple[Literal["region", "op"], ...] = ("region", "op")


def _work(figures: RankWork, what: str) -> Mapping[str, float]:
    return figures.regions if what == "region" else figures.ops


def _grew(mine: Mapping[str, float], others: list[Mapping[str, float]]) \
        -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for name, t in mine.items():
        median = statistics.median([o.get(name, 0.0) for o in others])
        if best is None or t - median > best[1]:
            best = (name, t - median)
    return best
