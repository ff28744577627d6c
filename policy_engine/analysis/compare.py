"""Two runs compared, window by window and rank by rank: what a change did to step time.

Windows are matched by role and region and, within those, by order (the n-th window of
each run), or by the steps the caller names. For each pair:

- **comparability first**: the world size, the mesh the ranks' coordinates show, the basis
  (GPU kernels or CPU operators) and what the torch profiler was told to record
  (activities, shapes, stacks, memory) must agree, or no verdict is given and each
  difference says why; a different policy or torch version is said but does not
  block (comparing them is often the point).
- **the change in step time**: the median step time of each run over every (rank, step),
  and the change of the mean split into compute, exposed communication (not hidden under
  compute), other device work and idle, which sum to it (each step's parts sum to its
  span: :func:`policy_engine.analysis.summary._breakdown`).
- **where it moved**: regions and operators (or kernels) whose time per step changed most,
  matched by name: each name's time over the whole capture (a summary holds its total,
  not its steps) divided by the capture's steps, so the first step counts there; the
  straggler then and now.
- **a verdict with a noise gate**: the sample is the step, not the (rank, step): ranks
  that meet in collectives finish each step together, so the ranks' times of one step are
  one observation, counted once (the median over the ranks of the n-th step of the
  window). :func:`~policy_engine.analysis.compare_gate.verdict` says ``slower`` or
  ``faster`` where a rank-sum test, the medians' distance and the drift between one run's
  own windows (:func:`drift`, the larger of the two runs') let a change through; ``no
  change`` only where these steps could have called a change of
  :data:`~policy_engine.analysis.compare_gate.MIN_CHANGE` either way and did not; else
  ``inconclusive``, with the change measured, p, the steps used and about how many steps
  a side would decide. The windows of a role and region are then held to each other
  (:func:`agree`): a code change shows in every window that runs the code, while a machine
  busy for a while slows the windows it overlaps and not the others. A capture's first
  step carries the profiler's start and the first run of every code path, and a rank's
  last step, when it is far shorter than its others
  (:data:`~policy_engine.analysis.window.TRAILING`), is the empty step torch opens at the
  last ``step()`` call: both are left out of the step times, their parts and the test.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from policy_engine.analysis.answers import WindowAnalysis
from policy_engine.analysis.compare_gate import told_apart, verdict
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.run import analyze_run
from policy_engine.errors import printable

#: 2: ``inconclusive``, and the test's ``change``, ``detectable`` and ``decide_steps``.
VERSION = 2
#: Rows listed per window: ranks, regions, operators.
TOP = 10
#: Differences that make a verdict meaningless.
BLOCKING = ("world", "mesh", "basis", "recorded")
PARTS = (("compute_us", "compute"), ("exposed_comm_us", "exposed communication"),
         ("other_us", "other device work"), ("idle_us", "idle"))


def _r(value: float) -> float:
    return round(value, 3)


# -- one pair of windows ------------------------------------------------------------------

def _compared(window: WindowAnalysis) -> Any:
    """What the window's figures gathered for the comparison (``detail``)."""
    assert window.figures is not None and window.figures.compared is not None
    return window.figures.compared


def _left_out(window: WindowAnalysis, run: str) -> list[dict[str, Any]]:
    """The ranks of ``window`` that take no part in the comparison, and why: a trace that
    cannot be read or holds no step, or a rank that records the role and has no trace
    here (the window's ``ranks_missing``)."""
    assert window.figures is not None
    figures = window.figures
    out = [{"run": run, "rank": rank, "why": why}
           for why, ranks in figures.unreadable.items() for rank in ranks]
    out += [{"run": run, "rank": rank, "why": "its trace holds no step"}
            for rank in _compared(window).no_steps]
    said = {x["rank"] for x in out} | set(figures.ranks)
    failed = {d["rank"]: d["why"] for d in window.dropped
              if d.get("backend") in (None, "torch")}
    for warning in window.readiness:
        if warning["code"] == "ranks_missing":
            out += [{"run": run, "rank": rank, "why": f"no trace: {failed[rank]}"
                     if rank in failed else "no trace in this window (the rank records this "
                     "role in others)"} for rank in warning["ranks"] if rank not in said]
    out.sort(key=lambda x: (not isinstance(x["rank"], int), x["rank"] or 0))
    return out


def _samples(window: WindowAnalysis) -> list[float]:
    """One time per step of the window: the median over the ranks of their n-th step."""
    return list(_compared(window).samples())


def _moved(base: dict[tuple[str, str], float], new: dict[tuple[str, str], float],
           kind: str) -> list[dict[str, Any]]:
    rows = []
    for key in base.keys() | new.keys():
        b, n = base.get(key), new.get(key)
        row: dict[str, Any] = {"name": key[0], "base_us": None if b is None else _r(b),
               "new_us": None if n is None else _r(n), "change_us": _r((n or 0.0) - (b or 0.0))}
        if kind == "ops":
            row["cat"] = key[1]
        rows.append(row)
    rows.sort(key=lambda row: (-abs(row["change_us"]), row["name"]))
    return rows[:TOP]


def _differences(base: WindowAnalysis, new: WindowAnalysis) -> list[dict[str, Any]]:
    out = []

    def say(what: str, b: Any, n: Any, message: str) -> None:
        if b != n:
            out.append({"what": what, "base": b, "new": n, "blocks": what in BLOCKING,
                        "message": message})

    say("world", base.world, new.world,
        f"world size {base.world} -> {new.world}: the ranks do different work")
    bi, ni = base.identity or {}, new.identity or {}
    say("mesh", bi.get("mesh") or None, ni.get("mesh") or None,
        f"mesh {bi.get('mesh')} -> {ni.get('mesh')} (from the ranks' coordinates)")
    basis = [sorted(_compared(w).basis) for w in (base, new)]
    say("basis", basis[0], basis[1], f"measured on {'/'.join(basis[0]) or 'nothing'} -> "
        f"{'/'.join(basis[1]) or 'nothing'}: GPU kernels and CPU operators are not the "
        "same time")
    for key, word, blocks in (("recorded", "what the profiler recorded", True),
                              ("torch", "torch version", False)):
        b, n = bi.get(key), ni.get(key)
        if b is not None and n is not None and b != n:
            out.append({"what": key, "base": b, "new": n, "blocks": blocks,
                        "message": f"{word} differs" + ("" if blocks else
                                                         " (compared all the same)")})
    out += _policy(bi, ni)
    return out


def _policy(bi: Mapping[str, Any], ni: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The policies, by their digest less ``output_dir`` (one policy run into two folders
    is one policy); by the whole digest where a run's manifests hold only that (written
    before the other existed), and then the message says a folder alone would differ."""
    b, n = bi.get("policy_content_hash"), ni.get("policy_content_hash")
    older = [side for side, h in (("base", b), ("new", n)) if h is None]
    if older:
        b, n = bi.get("policy_hash"), ni.get("policy_hash")
    if b is None or n is None or b == n:
        return []
    why = "" if not older else (
        f"; the {' and '.join(older)} run's manifests hold only the policy's whole digest, "
        "output_dir included: runs into two folders differ by it alone")
    return [{"what": "policy", "base": b, "new": n, "blocks": False,
             "message": f"policy differs (compared all the same{why})"}]


def _straggler(window: WindowAnalysis) -> int | None:
    s = window.straggler
    return s.get("rank") if isinstance(s, dict) else None


def drift(windows: Sequence[WindowAnalysis]) -> float | None:
    """How far apart the median steps of one run's windows (of one role and region) lie:
    (largest - smallest) / smallest; None with fewer than two windows to tell."""
    medians = [statistics.median(s) for w in windows if (s := _samples(w))]
    if len(medians) < 2 or min(medians) <= 0:
        return None
    return (max(medians) - min(medians)) / min(medians)


def agree(pairs: Sequence[dict[str, Any]],
          steps: Sequence[tuple[Sequence[float], Sequence[float]] | None]) -> None:
    """Hold the verdicts of one role and region's windows to each other: a code change
    shows in every window that runs the code, while a machine busy for a while slows the
    windows it overlaps and not the others. A window called ``slower`` or ``faster`` by a
    change ``c`` becomes ``inconclusive`` where the steps of another window (``steps``: each
    pair's base and new step times, None where it has none to compare) tell their own change
    apart from ``c`` (:func:`~policy_engine.analysis.compare_gate.told_apart`). A window
    whose steps cannot rule ``c`` out does not vote: an undecided window never turns a clear
    one, and nothing turns one into ``no change``. Sets ``test.agree`` on each window called
    slower or faster."""
    calls = [i for i, p in enumerate(pairs) if p.get("verdict") in ("slower", "faster")
             and p.get("test") and p["test"]["change"] is not None]
    if not calls:
        return
    told = [None if s is None or pairs[i].get("verdict") is None else told_apart(*s)
            for i, s in enumerate(steps)]
    for i in calls:
        p = pairs[i]
        c = p["test"]["change"]
        against = [j for j, t in enumerate(told)
                   if j != i and t is not None and (c > t[0] if c > 0 else c < t[1])]
        p["test"]["agree"] = not against
        if not against:
            continue
        group = p["role"] + ("" if p["region"] is None else "/" + p["region"])
        others = ", ".join(f"{_title(pairs[j])} ({_change(pairs[j])})" for j in against)
        p["why"] = (f"{p['why'].removesuffix(')')}; in this window only: the steps of "
                    f"{others} of {group} tell their change apart from this one: a machine "
                    "busy during some windows, or a change in some steps only; a change of "
                    "the code shows in every window that runs it)")
        p["verdict"] = "inconclusive"


def _title(p: dict[str, Any]) -> str:
    return str(p["base"]["title"]) if isinstance(p.get("base"), dict) else "?"


def _change(p: dict[str, Any]) -> str:
    change = (p.get("test") or {}).get("change")
    return "no share" if change is None else f"{change:+.1%}"


def _per_step(window: WindowAnalysis, key: str) -> float | None:
    """The mean over the window's ranks of their ``key`` (wait or transfer) per step in
    its matched collective calls; None where none matched."""
    found = window.collectives or {}
    if "means" in found:  # kept by _side in place of every rank's
        mean: float | None = found["means"].get(key)
        return mean
    values = [r[key] for r in found.get("ranks", {}).values() if key in r]
    return statistics.fmean(values) if values else None


def _light(window: WindowAnalysis) -> WindowAnalysis:
    """``window`` as the comparison reads it: its figures' comparison data, and of its
    collective calls their means and the late rank, in place of every rank's (two runs of
    100,000 ranks are held at once)."""
    if window.figures is not None:
        window.figures.lighten()
    calls = window.collectives
    if calls is None:
        return window
    means = {key: _per_step(window, key) for key in ("wait_per_step_us",
                                                      "transfer_per_step_us")}
    return attrs.evolve(window, collectives={"means": means, "late": calls.get("late")})


def _calls(base: WindowAnalysis, new: WindowAnalysis) -> dict[str, Any] | None:
    """How the window's collective calls changed: the ranks' wait for the last arrival and
    the transfer, per step (their mean over the ranks), and the late rank then and now;
    None where neither run matched a call."""
    if not (base.collectives or new.collectives):
        return None
    out: dict[str, Any] = {}
    for key, name in (("wait_per_step_us", "wait_us"),
                      ("transfer_per_step_us", "transfer_us")):
        b, n = _per_step(base, key), _per_step(new, key)
        out[name] = {"base": None if b is None else _r(b), "new": None if n is None
                     else _r(n), "change": None if b is None or n is None else _r(n - b)}
    late = [((w.collectives or {}).get("late") or {}).get("rank") for w in (base, new)]
    out["late_rank"] = {"base": late[0], "new": late[1], "changed": late[0] != late[1]}
    return out


def pair(base: WindowAnalysis, new: WindowAnalysis,
         spread: float | None = None) -> dict[str, Any]:
    """The comparison of one window of the base run with one of the new run (windows as
    :func:`~policy_engine.analysis.run.analyze_run` returns them, with ``detail``)."""
    cb, cn = _compared(base), _compared(new)
    differences = _differences(base, new)
    sb, sn = cb.samples(), cn.samples()
    mb, mn = cb.means(), cn.means()
    out: dict[str, Any] = {
        "role": base.role, "region": base.region,
        "base": {"title": base.title, "steps": list(base.steps), "cycle": base.cycle,
                 "capture": base.capture},
        "new": {"title": new.title, "steps": list(new.steps), "cycle": new.cycle,
                "capture": new.capture},
        "differences": differences,
        "left_out": _left_out(base, "base") + _left_out(new, "new"),
        "comparable": not any(d["blocks"] for d in differences) and bool(cb.ranks
                                                                         and cn.ranks),
        "step_time": None, "parts": None, "ranks": [], "regions": [], "operators": [],
        "straggler": {"base": _straggler(base), "new": _straggler(new),
                      "changed": _straggler(base) != _straggler(new)},
        "collectives": _calls(base, new),
    }
    if not (cb.ranks and cn.ranks):
        side = "base" if not cb.ranks else "new"
        out.update(verdict=None, why=f"the {side} run has no readable step in this window",
                   test=None)
        return out
    out["step_time"] = {"base_median_us": _r(statistics.median(sb)),
                        "new_median_us": _r(statistics.median(sn)),
                        "base_mean_us": _r(mb["span_us"]), "new_mean_us": _r(mn["span_us"]),
                        "change_us": _r(mn["span_us"] - mb["span_us"])}
    out["parts"] = {key: _r(mn[key] - mb[key]) for key, _ in PARTS}
    ranks = []
    for rank, b in cb.rank_means.items():
        n = cn.rank_means.get(rank)
        if n is not None:
            ranks.append({"rank": rank, "base_us": _r(b), "new_us": _r(n),
                          "change_us": _r(n - b)})
    ranks.sort(key=lambda row: (-abs(row["change_us"]), str(row["rank"])))
    out["ranks"] = ranks[:TOP]
    out["regions"] = _moved(cb.per_step(cb.regions), cn.per_step(cn.regions), "regions")
    out["operators"] = _moved(cb.per_step(cb.ops), cn.per_step(cn.ops), "ops")
    if out["comparable"]:
        out.update(verdict(sb, sn, spread))
    else:
        out.update(verdict=None, test=None, why="not compared: " + "; ".join(
            d["message"] for d in differences if d["blocks"]))
    return out


# -- two runs -------------------------------------------------------------------------------

def _side(path: str, which: str, role: str | None, step: int | None, jobs: int,
          from_traces: bool) -> list[WindowAnalysis]:
    try:
        result = analyze_run(path, role=role, step=step, jobs=jobs, from_traces=from_traces,
                             detail=True)
    except AnalysisError as err:
        raise AnalysisError(f"{which}: {err}") from None
    result.close()  # the ranks themselves are not read again: their figures are gathered
    return [_light(w) for w in result.windows if w.not_analysed is None]


def _titles(windows: list[WindowAnalysis]) -> str:
    """The windows' titles for a message, each printable (they hold the manifests' names)."""
    return ", ".join(sorted({printable(w.title) for w in windows}))


def compare_runs(base: str, new: str, *, role: str | None = None,
                 steps: tuple[int, int] | None = None, jobs: int = 1,
                 from_traces: bool = False) -> dict[str, Any]:
    """Every window of ``base`` matched in ``new`` (by role, region and order; with
    ``steps``, the windows covering the base's step and the new run's), compared.
    AnalysisError, naming the run, when either has nothing to compare."""
    a = _side(base, "BASE", role, steps[0] if steps else None, jobs, from_traces)
    b = _side(new, "NEW", role, steps[1] if steps else None, jobs, from_traces)
    groups: dict[tuple[Any, Any], list[list[WindowAnalysis]]] = {}
    for index, side in enumerate((a, b)):
        for w in side:
            groups.setdefault((w.role, w.region), [[], []])[index].append(w)
    windows, only_base, only_new = [], [], []
    for (_role, _region), (left, right) in groups.items():
        known = [d for d in (drift(left), drift(right)) if d is not None]
        group = [pair(x, y, max(known) if known else None)
                 for x, y in zip(left, right, strict=False)]
        agree(group, [(_samples(x), _samples(y)) if _samples(x) and _samples(y) else None
                      for x, y in zip(left, right, strict=False)])
        windows += group
        only_base += [w.title for w in left[len(right):]]
        only_new += [w.title for w in right[len(left):]]
    if not windows:
        raise AnalysisError(f"no window of BASE matches one of NEW by role and region: "
                            f"BASE holds {_titles(a)}; NEW holds {_titles(b)}")
    return {"version": VERSION, "base": os.path.abspath(base), "new": os.path.abspath(new),
            "windows": windows,
            "unmatched": {"base": only_base, "new": only_new}}
