"""One window across its ranks: step times, the straggler, and what the window lacks.

**The straggler.** In a step bound by collectives every rank leaves the collective
together, so a rank's time inside collectives is the time it waited for the last one to
arrive, plus the transfer. The rank the others wait for is the one that waits least while
its compute is the longest, and ``median(wait) - its wait`` is how much later than the
median rank it arrived. It needs
no clock shared between hosts: only durations on each rank's own clock.

A step names a straggler when that lateness is at least :data:`LATE_SHARE` of the median
step time (and :data:`LATE_FLOOR_US`), its compute is the longest, and its compute beyond
the median rank's explains at least :data:`EXPLAINED` of the lateness (a rank that was
merely descheduled arrives late with nothing to show for it). A window names one when the
same rank is the straggler in more than half of its steps with collectives.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

#: A step's straggler arrives at least this share of the median step time after the
#: median rank...
LATE_SHARE = 0.1
#: ...and at least this many microseconds.
LATE_FLOOR_US = 100.0
#: ...and at least this share of its lateness is compute the median rank does not do.
EXPLAINED = 0.5
#: A rank's last step shorter than this share of its median step is the empty one torch
#: opens at the last ``step()`` call and the capture's end closes at once: not a step of
#: the work (``compare`` takes no sample from it either).
TRAILING = 0.1
PARTS = ("compute_us", "comm_us", "overlap_us", "other_us", "idle_us", "span_us")


def spread(values: Iterable[float]) -> dict[str, float] | None:
    """min, median and max; None for no values."""
    found = sorted(values)
    if not found:
        return None
    return {"min": found[0], "median": round(statistics.median(found), 3), "max": found[-1]}


def totals(steps: list[dict[str, Any]]) -> dict[str, float]:
    """A rank's steps summed."""
    out = {"time_us": 0.0, **dict.fromkeys(PARTS, 0.0)}
    for row in steps:
        for key in out:
            out[key] += row.get(key) or 0.0
    return {k: round(v, 3) for k, v in out.items()}


def _step_straggler(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The straggler of one step, given each rank's row for it."""
    waits = {rank: row["comm_us"] for rank, row in rows.items()}
    if len(rows) < 2 or max(waits.values()) <= 0:
        return {"straggler": None, "late_us": None}
    median_wait = statistics.median(waits.values())
    least = min(waits.values())
    first = [rank for rank, w in waits.items() if w == least]
    if len(first) > 1:
        return {"straggler": None, "late_us": 0.0}
    rank = first[0]
    compute = {r: row["compute_us"] for r, row in rows.items()}
    late = round(median_wait - least, 3)
    median_time = statistics.median(row["time_us"] for row in rows.values())
    # Its own work makes it late: a rank descheduled on a busy host arrives late too,
    # but without the compute to show for it.
    extra = compute[rank] - statistics.median(compute.values())
    named = (late >= max(LATE_FLOOR_US, LATE_SHARE * median_time)
             and extra >= EXPLAINED * late and compute[rank] >= max(compute.values()))
    return {"straggler": rank if named else None, "late_us": late}


def without_trailing(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A rank's steps less an empty last one (:data:`TRAILING`); with fewer than three
    there is no median to tell it by, and all are kept."""
    steps = list(steps)
    if len(steps) >= 3:
        rest = statistics.median(row["time_us"] for row in steps[:-1])
        if steps[-1]["time_us"] < TRAILING * rest:
            steps.pop()
    return steps


def _steps(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step: dict[Any, dict[int, dict[str, Any]]] = {}
    for r in ranks:
        for row in without_trailing(r.get("steps") or []):
            by_step.setdefault(row["step"], {})[r["rank"]] = row
    out = []
    for step in sorted(by_step, key=lambda s: (s is None, s if s is not None else 0)):
        rows = by_step[step]
        waits = [row["comm_us"] for row in rows.values()]
        out.append({"step": step, "ranks": len(rows),
                    "time_us": spread(row["time_us"] for row in rows.values()),
                    "comm_us": spread(waits), "collectives": max(waits) > 0,
                    **_step_straggler(rows)})
    return out


def straggler(steps: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The window's straggler: the same rank in more than half of the steps that hold
    collectives, with how late it arrives and how long it and the others wait."""
    bound = [s for s in steps if s["collectives"]]
    named = [s["straggler"] for s in bound if s["straggler"] is not None]
    if not bound or not named:
        return None
    rank = statistics.mode(named)
    mine = [s for s in bound if s["straggler"] == rank]
    if 2 * len(mine) <= len(bound):
        return None
    waits = {r["rank"]: r["total"]["comm_us"] for r in ranks if r.get("total")}
    others = [w for r, w in waits.items() if r != rank]
    return {"rank": rank, "steps": [s["step"] for s in mine], "of_steps": len(bound),
            "late_us": round(statistics.median(s["late_us"] for s in mine), 3),
            "wait_us": waits.get(rank), "others_wait_us": spread(others)}


def _regions(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    times: dict[str, list[float]] = {}
    for r in ranks:
        for name, region in (r.get("regions") or {}).items():
            times.setdefault(name, []).append(region["time_us"])
    order = sorted(times, key=lambda name: -statistics.median(times[name]))[:16]
    return [{"name": name, "ranks": len(times[name]), "time_us": spread(times[name])}
            for name in order]


def _one_per_rank(ranks: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """A rank with several readable traces in the window (two trace lines of one rank, or
    two traces in a folder whose distributedInfo names the same rank) keeps one: a
    complete one rather than a partial one, else the first recorded. The others become
    entries that say which one is used, left out of every figure. Returns each left-out
    entry, with what readiness says of it."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in ranks:
        if isinstance(r["rank"], int) and not r.get("error"):
            by_rank.setdefault(r["rank"], []).append(r)
    out = []
    for rank, found in by_rank.items():
        if len(found) < 2:
            continue
        # complete first, then as recorded (the sort keeps their order)
        used, *rest = sorted(found, key=lambda r: r.get("status") not in (None, "complete"))
        why = "complete before partial, then the first recorded"
        for r in rest:
            path, status = r["path"], r["status"]
            r.clear()
            r.update(rank=rank, path=path, status=status, error=f"another trace of rank "
                     f"{rank} in this window is used instead: {used['path']} ({why})")
            out.append((r, f"rank {rank} has {len(found)} traces in this window: "
                           f"{used['path']} is used ({why}); {path} is left out of every "
                           "figure"))
    return out


def readiness(window: dict[str, Any], ranks: list[dict[str, Any]], expected: set[int],
              twice: Sequence[tuple[dict[str, Any], str]] = ()) -> list[dict[str, Any]]:
    """What the window lacks for which analysis, said plainly. ``twice``: the entries of a
    rank listed twice that are left out (:func:`_one_per_rank`), with what to say."""
    out: list[dict[str, Any]] = []

    def add(code: str, message: str, who: Iterable[Any] = ()) -> None:
        out.append({"code": code, "message": message, "ranks": sorted(
            {r for r in who if isinstance(r, int)})})

    read = [r for r in ranks if not r.get("error")]
    if window.get("not_analysed"):
        return out
    present = {r["rank"] for r in read if isinstance(r["rank"], int)}
    missing = sorted(expected - present)
    if missing:
        add("ranks_missing", f"{len(missing)} rank(s) that record this role have no readable "
            "trace in this window: they are left out of every comparison", missing)
    for said in window.get("said") or ():  # what the manifests' lines of the window showed
        add(said["code"], said["message"], [said["rank"]])
    for r, message in twice:
        add("duplicate_rank", message, [r["rank"]])
    left_out = {id(r) for r, _ in twice}
    for r in ranks:
        if r.get("error") and id(r) not in left_out:
            add("unreadable", f"the trace of rank {r['rank']} cannot be read: {r['error']}",
                [r["rank"]])
    if not read:
        if not ranks and window.get("other"):
            kinds = sorted({str(o.get("backend")) for o in window["other"]})
            add("no_torch_traces", f"no torch trace in this window (only {', '.join(kinds)} "
                "files): nothing to analyse here")
        return out
    if len(read) == 1:
        add("single_rank", "one rank only: nothing to compare it with, no straggler")
    no_steps = [r["rank"] for r in read if not r["facts"]["profiler_steps"]]
    if no_steps:
        add("no_profiler_steps", "no ProfilerStep rows: step time is the whole trace; "
            "per-step comparison and HTA's per-iteration analyses (straggler, critical "
            "path) need them (call prof.step() in the loop)", no_steps)
    if not any(r["facts"]["kernels"] for r in read):
        add("no_kernels", "no GPU kernels (CPU-only traces): time is measured on the CPU, "
            "with no idle GPU gaps; HTA's temporal breakdown and communication/computation "
            "overlap need kernels (its temporal breakdown raises IndexError here)")
    no_info = [r["rank"] for r in read if not r["facts"]["distributed_info"]]
    if no_info:
        add("no_distributed_info", "no distributedInfo: HTA reads each trace's rank from "
            "it and cannot tell these traces apart (on-demand traces often lack it)", no_info)
    missed = sorted({n for r in read for n in r["facts"]["hta_unrecognised"]})
    if missed:
        add("collective_kernels_unrecognised", "collective kernels that HTA does not count "
            f"as communication (it expects ^nccl.*Kernel): {', '.join(missed[:5])}",
            [r["rank"] for r in read if r["facts"]["hta_unrecognised"]])
    silent = [r["rank"] for r in read if r["facts"]["kernels"] and r["facts"]["cpu_comm_ops"]
              and not r["facts"]["comm_kernels"]]
    if silent:
        names = sorted({n for r in read for n in r["facts"]["looks_like_comm"]})
        add("collective_kernels_unrecognised", "collectives run on the CPU but no GPU kernel "
            "is recognised as one (kernels named nccl*, hccl*, rccl*)"
            + (f"; kernels that look like collectives: {', '.join(names[:5])}" if names
               else ""), silent)
    if all(r["facts"]["kernels"] == 0 and r["facts"]["cpu_comm_ops"] == 0 for r in read) \
            and len(read) > 1:
        add("no_collectives", "no collective in any rank's trace: no rank waits for "
            "another, so there is no straggler to name")
    return out


def compare(window: dict[str, Any], ranks: list[dict[str, Any]],
            expected: set[int]) -> dict[str, Any]:
    """The analysis of one window: ``ranks`` are the per-trace summaries with ``rank``
    (a rank listed twice keeps one entry with figures: :func:`_one_per_rank`)."""
    twice = _one_per_rank(ranks)
    for r in ranks:
        if not r.get("error"):
            r["total"] = totals(r["steps"])
    read = [r for r in ranks if not r.get("error")]
    steps = _steps(read)
    return {
        "step_times": steps,
        "regions": _regions(read),
        "breakdown": {key: spread(r["total"][key] for r in read)
                      for key in ("time_us", *PARTS)} if read else None,
        "straggler": straggler(steps, read),
        "readiness": readiness(window, ranks, expected, twice),
    }
