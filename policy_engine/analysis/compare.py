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
from typing import Any, Literal

import attrs

from policy_engine.analysis.answers import WindowAnalysis
from policy_engine.analysis.compare_gate import told_apart, verdict
from policy_engine.analysis.comparison import (
    CALLS,
    Called,
    CallsChanged,
    Difference,
    Figure,
    LeftOut,
    Moved,
    OperatorMoved,
    RankMoved,
    RunComparison,
    Side,
    StepTime,
    Then,
    WindowComparison,
)
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


def _left_out(window: WindowAnalysis, run: Literal["base", "new"]) -> list[LeftOut]:
    """The ranks of ``window`` that take no part in the comparison, and why: a trace that
    cannot be read or holds no step, or a rank that records the role and has no trace
    here (the window's ``ranks_missing``)."""
    assert window.figures is not None
    figures = window.figures
    out = [LeftOut(run, rank, why) for why, ranks in figures.unreadable.items()
           for rank in ranks]
    out += [LeftOut(run, rank, "its trace holds no step") for rank in _compared(window).no_steps]
    said = {x.rank for x in out} | set(figures.ranks)
    failed = {d["rank"]: d["why"] for d in window.dropped
              if d.get("backend") in (None, "torch")}
    for warning in window.readiness:
        if warning["code"] == "ranks_missing":
            out += [LeftOut(run, rank, f"no trace: {failed[rank]}" if rank in failed
                            else "no trace in this window (the rank records this role in "
                            "others)") for rank in warning["ranks"] if rank not in said]
    out.sort(key=lambda x: (not isinstance(x.rank, int), x.rank or 0))
    return out


def _samples(window: WindowAnalysis) -> list[float]:
    """One time per step of the window: the median over the ranks of their n-th step."""
    return list(_compared(window).samples())


def _moved(base: dict[tuple[str, str], float], new: dict[tuple[str, str], float]
           ) -> list[tuple[tuple[str, str], float | None, float | None, float]]:
    """The names (with their category) whose time per step moved most: each one's time
    then and now (None: not seen in that run) and the change, the largest first."""
    rows = []
    for key in base.keys() | new.keys():
        b, n = base.get(key), new.get(key)
        rows.append((key, None if b is None else _r(b), None if n is None else _r(n),
                     _r((n or 0.0) - (b or 0.0))))
    rows.sort(key=lambda row: (-abs(row[3]), row[0][0]))
    return rows[:TOP]


def _differences(base: WindowAnalysis, new: WindowAnalysis) -> list[Difference]:
    out = []

    def say(what: str, b: Any, n: Any, message: str) -> None:
        if b != n:
            out.append(Difference(what, b, n, what in BLOCKING, message))

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
            out.append(Difference(key, b, n, blocks, f"{word} differs"
                                  + ("" if blocks else " (compared all the same)")))
    out += _policy(bi, ni)
    return out


def _policy(bi: Mapping[str, Any], ni: Mapping[str, Any]) -> list[Difference]:
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
    return [Difference("policy", b, n, False, f"policy differs (compared all the same{why})")]


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


def agree(group: str, windows: Sequence[tuple[str, Called]],
          steps: Sequence[tuple[Sequence[float], Sequence[float]] | None]) -> list[Called]:
    """Hold the verdicts of one role and region's windows (``group``; ``windows``: each
    one's title and verdict) to each other: a code change shows in every window that runs
    the code, while a machine busy for a while slows the windows it overlaps and not the
    others. A window called ``slower`` or ``faster`` by a change ``c`` becomes
    ``inconclusive`` where the steps of another window (``steps``: each window's base and
    new step times, None where it has none to compare) tell their own change apart from
    ``c`` (:func:`~policy_engine.analysis.compare_gate.told_apart`). A window whose steps
    cannot rule ``c`` out does not vote: an undecided window never turns a clear one, and
    nothing turns one into ``no change``. The verdicts, each called slower or faster with
    its test's ``agree`` said."""
    said = [c for _title, c in windows]
    calls = [i for i, c in enumerate(said) if c.verdict in CALLS and c.test is not None
             and c.test.change is not None]
    if not calls:
        return said
    told = [None if s is None or said[i].verdict is None else told_apart(*s)
            for i, s in enumerate(steps)]
    out = list(said)
    for i in calls:
        c = said[i]
        assert c.test is not None and c.test.change is not None
        change = c.test.change
        against = [j for j, t in enumerate(told)
                   if j != i and t is not None and (change > t[0] if change > 0
                                                    else change < t[1])]
        test = attrs.evolve(c.test, agree=not against)
        if not against:
            out[i] = attrs.evolve(c, test=test)
            continue
        others = ", ".join(f"{windows[j][0]} ({_change(said[j])})" for j in against)
        out[i] = Called("inconclusive", f"{c.why.removesuffix(')')}; in this window only: "
                        f"the steps of {others} of {group} tell their change apart from "
                        "this one: a machine busy during some windows, or a change in some "
                        "steps only; a change of the code shows in every window that runs "
                        "it)", test)
    return out


def _change(c: Called) -> str:
    change = None if c.test is None else c.test.change
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


def _calls(base: WindowAnalysis, new: WindowAnalysis) -> CallsChanged | None:
    """How the window's collective calls changed: the ranks' wait for the last arrival and
    the transfer, per step (their mean over the ranks), and the late rank then and now;
    None where neither run matched a call."""
    if not (base.collectives or new.collectives):
        return None

    def figure(key: str) -> Figure:
        b, n = _per_step(base, key), _per_step(new, key)
        return Figure(None if b is None else _r(b), None if n is None else _r(n),
                      None if b is None or n is None else _r(n - b))

    late = [((w.collectives or {}).get("late") or {}).get("rank") for w in (base, new)]
    return CallsChanged(wait_us=figure("wait_per_step_us"),
                        transfer_us=figure("transfer_per_step_us"),
                        late_rank=Then(late[0], late[1], late[0] != late[1]))


def _side_of(w: WindowAnalysis) -> Side:
    return Side(w.title, tuple(w.steps), w.cycle, w.capture)


def pair(base: WindowAnalysis, new: WindowAnalysis,
         spread: float | None = None) -> WindowComparison:
    """The comparison of one window of the base run with one of the new run (windows as
    :func:`~policy_engine.analysis.run.analyze_run` returns them, with ``detail``)."""
    cb, cn = _compared(base), _compared(new)
    differences = tuple(_differences(base, new))
    both = bool(cb.ranks and cn.ranks)
    comparable = not any(d.blocks for d in differences) and both
    step_time, parts, ranks = None, None, []
    regions: tuple[Moved, ...] = ()
    operators: tuple[OperatorMoved, ...] = ()
    if not both:
        said = Called(None, f"the {'base' if not cb.ranks else 'new'} run has no readable "
                      "step in this window", None)
    else:
        sb, sn = cb.samples(), cn.samples()
        mb, mn = cb.means(), cn.means()
        step_time = StepTime(_r(statistics.median(sb)), _r(statistics.median(sn)),
                             _r(mb["span_us"]), _r(mn["span_us"]),
                             _r(mn["span_us"] - mb["span_us"]))
        parts = {key: _r(mn[key] - mb[key]) for key, _ in PARTS}
        for rank, b in cb.rank_means.items():
            n = cn.rank_means.get(rank)
            if n is not None:
                ranks.append(RankMoved(rank, _r(b), _r(n), _r(n - b)))
        ranks.sort(key=lambda row: (-abs(row.change_us), str(row.rank)))
        regions = tuple(Moved(key[0], b, n, c) for key, b, n, c
                        in _moved(cb.per_step(cb.regions), cn.per_step(cn.regions)))
        operators = tuple(OperatorMoved(key[0], b, n, c, cat=key[1]) for key, b, n, c
                          in _moved(cb.per_step(cb.ops), cn.per_step(cn.ops)))
        blocking = "; ".join(d.message for d in differences if d.blocks)
        said = verdict(sb, sn, spread) if comparable else \
            Called(None, f"not compared: {blocking}", None)
    return WindowComparison(
        role=base.role, region=base.region, base=_side_of(base), new=_side_of(new),
        differences=differences,
        left_out=(*_left_out(base, "base"), *_left_out(new, "new")), comparable=comparable,
        step_time=step_time, parts=parts, ranks=tuple(ranks[:TOP]), regions=regions,
        operators=operators,
        straggler=Then(_straggler(base), _straggler(new), _straggler(base) != _straggler(new)),
        collectives=_calls(base, new), verdict=said.verdict, why=said.why, test=said.test)


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
                 from_traces: bool = False) -> RunComparison:
    """Every window of ``base`` matched in ``new`` (by role, region and order; with
    ``steps``, the windows covering the base's step and the new run's), compared.
    AnalysisError, naming the run, when either has nothing to compare."""
    a = _side(base, "BASE", role, steps[0] if steps else None, jobs, from_traces)
    b = _side(new, "NEW", role, steps[1] if steps else None, jobs, from_traces)
    groups: dict[tuple[Any, Any], list[list[WindowAnalysis]]] = {}
    for index, side in enumerate((a, b)):
        for w in side:
            groups.setdefault((w.role, w.region), [[], []])[index].append(w)
    windows: list[WindowComparison] = []
    only_base, only_new = [], []
    for (role_of, region), (left, right) in groups.items():
        known = [d for d in (drift(left), drift(right)) if d is not None]
        group = [pair(x, y, max(known) if known else None)
                 for x, y in zip(left, right, strict=False)]
        said = agree(role_of + ("" if region is None else "/" + region),
                     [(p.base.title, p.called) for p in group],
                     [(_samples(x), _samples(y)) if _samples(x) and _samples(y) else None
                      for x, y in zip(left, right, strict=False)])
        windows += [attrs.evolve(p, verdict=c.verdict, why=c.why, test=c.test)
                    for p, c in zip(group, said, strict=True)]
        only_base += [w.title for w in left[len(right):]]
        only_new += [w.title for w in right[len(left):]]
    if not windows:
        raise AnalysisError(f"no window of BASE matches one of NEW by role and region: "
                            f"BASE holds {_titles(a)}; NEW holds {_titles(b)}")
    return RunComparison(version=VERSION, base=os.path.abspath(base),
                         new=os.path.abspath(new), windows=tuple(windows),
                         unmatched={"base": tuple(only_base), "new": tuple(only_new)})
