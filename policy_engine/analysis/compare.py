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
  window). ``slower`` or ``faster`` only where all of these hold: a two-sided Mann-Whitney
  rank-sum test over the two runs' steps gives p < :data:`ALPHA`; the medians differ by
  at least :data:`MIN_CHANGE` of the base's; and each run's median lies outside the other
  run's middle half of steps (its interquartile range): a shift the steps' own spread
  covers is not called a change; and, where a run holds several windows of the role and
  region, the change exceeds how far apart that run's own windows lie (:func:`drift`, the
  larger of the two runs'): the machine drifts between windows as it does between runs;
  and every other window of the role and region that the test can judge moved the same
  way (:func:`agree`): a code change shows in every window that runs the code, while a
  machine busy for a while slows the windows it overlaps and not the others.
  Otherwise ``no change`` (within noise). A capture's first
  step carries the profiler's start and the first run of every code path, and a rank's
  last step, when it is far shorter than its others
  (:data:`~policy_engine.analysis.window.TRAILING`), is the empty step torch opens at the
  last ``step()`` call: both are left out of the step times, their parts and the test.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from policy_engine.analysis.answers import WindowAnalysis
from policy_engine.analysis.errors import AnalysisError
from policy_engine.analysis.run import analyze_run
from policy_engine.analysis.text import ms
from policy_engine.errors import printable

VERSION = 1
#: The rank-sum test's significance level. Two runs of one unchanged 4-rank job on a
#: loaded 2-core machine gave p >= 0.015 in 132 of 132 windows (steps vary with the
#: machine between runs, not only within one); a change gave p <= 0.0022 in 12 of 12.
ALPHA = 0.005
#: The least change of the median step time, as a share of the base's, called a change.
MIN_CHANGE = 0.05
#: Rows listed per window: ranks, regions, operators.
TOP = 10
#: Differences that make a verdict meaningless.
BLOCKING = ("world", "mesh", "basis", "recorded")
PARTS = (("compute_us", "compute"), ("exposed_comm_us", "exposed communication"),
         ("other_us", "other device work"), ("idle_us", "idle"))


def _r(value: float) -> float:
    return round(value, 3)


# -- the noise gate -----------------------------------------------------------------------

def rank_sum(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The two-sided p-value of the Mann-Whitney U test of ``a`` against ``b`` (normal
    approximation with tie and continuity corrections); None with fewer than 3 values on
    a side; 1 when every value is the same."""
    n, m = len(a), len(b)
    if n < 3 or m < 3:
        return None
    pooled = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks_a = 0.0
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = (i + j) / 2 + 1  # the mean rank of a run of ties
        count = j - i + 1
        ties += count ** 3 - count
        ranks_a += rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = ranks_a - n * (n + 1) / 2
    mean = n * m / 2
    total = n + m
    var = n * m / 12 * ((total + 1) - ties / (total * (total - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - mean) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The lower and upper quartile (linear between the order statistics)."""
    ordered = sorted(values)

    def at(share: float) -> float:
        k = (len(ordered) - 1) * share
        i = int(k)
        j = min(i + 1, len(ordered) - 1)
        return ordered[i] + (ordered[j] - ordered[i]) * (k - i)

    return at(0.25), at(0.75)


def _apart(base: Sequence[float], new: Sequence[float]) -> bool:
    """Each run's median outside the other's interquartile range, on opposite sides."""
    mb, mn = statistics.median(base), statistics.median(new)
    (b1, b3), (n1, n3) = _quartiles(base), _quartiles(new)
    return (mn > b3 and mb < n1) or (mn < b1 and mb > n3)


def verdict(base: Sequence[float], new: Sequence[float],
            drift: float | None = None) -> dict[str, Any]:
    """slower / faster / no change from the step times of each run, with the test.
    ``drift``: how far apart the medians of one run's own windows lie (the larger of the
    two runs'), as a share; a change no larger is within noise."""
    p = rank_sum(base, new)
    test = {"name": "Mann-Whitney U (two-sided) over steps", "p": None if p is None
            else round(p, 6), "alpha": ALPHA, "min_change": MIN_CHANGE,
            "base_steps": len(base), "new_steps": len(new), "apart": None,
            "drift": None if drift is None else round(drift, 4), "agree": None}
    # The least p these counts can give: every step of one run above every step of the other.
    best = rank_sum(range(len(base)), range(len(base), len(base) + len(new)))
    if p is None or best is None or best >= ALPHA:
        return {"verdict": None, "why": f"too few steps to tell a change from noise "
                f"({len(base)} and {len(new)}: even every step of one run beyond every step "
                f"of the other could not reach p < {ALPHA})", "test": test}
    b, n = statistics.median(base), statistics.median(new)
    # From a median of 0 any change is out of all proportion: the gates on its size pass,
    # and the change is said in milliseconds (a share of nothing has no percentage).
    share = (n - b) / b if b > 0 else 0.0 if n == b else math.copysign(math.inf, n - b)
    change = f"{share:+.1%}" if math.isfinite(share) else \
        f"{ms(b)} -> {ms(n)} ms (from a median step of 0: no percentage)"
    apart = _apart(base, new)
    test["apart"] = apart
    beyond = drift is None or abs(share) > drift
    if p < ALPHA and abs(share) >= MIN_CHANGE and apart and beyond:
        word = "slower" if share > 0 else "faster"
        return {"verdict": word, "why": f"median step time {change} (p = {p:.2g} < "
                f"{ALPHA})", "test": test}
    if p >= ALPHA:
        reason = f"p = {p:.2g} >= {ALPHA}"
    elif abs(share) < MIN_CHANGE:
        reason = f"a change of {change} is under {MIN_CHANGE:.0%}"
    elif not apart:
        reason = (f"a change of {change} lies within the middle half of the steps' own "
                  "spread")
    else:
        reason = (f"a change of {change} is no larger than the {drift:.0%} by which one "
                  "run's own windows differ")
    return {"verdict": "no change", "why": f"within noise ({reason})", "test": test}


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
                              ("torch", "torch version", False),
                              ("policy_hash", "policy", False)):
        b, n = bi.get(key), ni.get(key)
        if b is not None and n is not None and b != n:
            out.append({"what": key, "base": b, "new": n, "blocks": blocks,
                        "message": f"{word} differs" + ("" if blocks else
                                                         " (compared all the same)")})
    return out


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


def agree(pairs: Sequence[dict[str, Any]]) -> None:
    """Hold the verdicts of one role and region's windows to each other: a window called
    ``slower`` or ``faster`` keeps its word only where every other window with a verdict
    says the same word; otherwise it is within noise. Sets ``test.agree`` on each."""
    said = [p for p in pairs if p.get("verdict") is not None and p.get("test")]
    words = {p["verdict"] for p in said}
    for p in said:
        p["test"]["agree"] = len(said) < 2 or len(words) == 1
        if p["verdict"] in ("slower", "faster") and len(words) > 1:
            others = ", ".join(sorted(w for w in words if w != p["verdict"]))
            p["verdict"] = "no change"
            p["why"] = (f"within noise (this window alone is {p['why']}; other windows of "
                        f"{p['role']}{'' if p['region'] is None else '/' + p['region']} say "
                        f"{others}: a change in some windows only is the machine's)")


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
    return [w for w in result.windows if w.not_analysed is None]


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
        for x, y in zip(left, right, strict=False):
            windows.append(pair(x, y, max(known) if known else None))
        only_base += [w.title for w in left[len(right):]]
        only_new += [w.title for w in right[len(left):]]
        agree(windows[len(windows) - min(len(left), len(right)):])
    if not windows:
        raise AnalysisError(f"no window of BASE matches one of NEW by role and region: "
                            f"BASE holds {_titles(a)}; NEW holds {_titles(b)}")
    return {"version": VERSION, "base": os.path.abspath(base), "new": os.path.abspath(new),
            "windows": windows,
            "unmatched": {"base": only_base, "new": only_new}}
