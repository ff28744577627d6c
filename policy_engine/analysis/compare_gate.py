"""The verdict of one pair of windows, from the step times of each run: ``slower`` or
``faster`` where the noise gate lets a change through, ``no change`` where the steps could
have shown a change of :data:`MIN_CHANGE` and did not, ``inconclusive`` where they could
not (too few steps, too wide a spread, windows of one run too far apart).

**The gate.** ``slower`` or ``faster`` only where all of these hold: a two-sided
Mann-Whitney rank-sum test over the two runs' steps gives p < :data:`ALPHA`; the medians
differ by at least :data:`MIN_CHANGE` of the base's; each run's median lies outside the
other run's middle half of steps (:func:`apart`); and the change exceeds the drift between
one run's own windows, where it has several.

**The power of the gate** (:func:`power`), found by shifting the observed steps: the new
run's steps are scaled to the base's median, then moved by a change ``s`` (each step
times ``1 + s``, or ``1 - s`` for a speed-up), and the gate is asked whether it would
call that. Its p-value and the medians' places only grow with ``s``, so the least ``s``
it calls is found by bisection (the test); the middle halves give theirs in closed form.
The least change either way is :func:`power`'s ``detectable``: the spread and the counts
the runs really had, no model of the noise. ``no change`` only where ``detectable`` is at
most :data:`MIN_CHANGE` (and the runs' drift under it), and never for a change of
:data:`LARGE` or more.

**The steps that would decide** (:func:`steps_to_decide`), the same way: ``k`` steps a
side drawn like the observed ones (each run's quantiles at ``(i + 0.5) / k``), shifted by
the change measured (at least :data:`MIN_CHANGE`), and the least ``k`` at which the gate
calls it with p under :data:`DECIDE_P` rather than :data:`ALPHA`. Typical steps reach the
p a new pair of runs reaches half the time; asking them for z_(1-ALPHA/2) + z_POWER (the
rank-sum test's normal approximation of a :data:`POWER` chance) makes the count one at
which most pairs of runs decide: in simulation (log-normal steps spreading 5-30%, changes
of 10-60%) the whole gate called the change in 3 pairs of 4 or more at that count, and in
about 1 of 3 or fewer at half of it. An estimate, not a promise. No count narrows the
middle halves or the drift between windows: where those hold the change back, more steps
would not decide, and the verdict says so.

**What a window rules out** (:func:`told_apart`), for holding the windows of a role to
each other: the changes the gate, given the new run's steps divided by ``1 + c``, calls
the other way. A window undecided about 5% may still say its runs did not move by 150%.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import attrs

from policy_engine.analysis.comparison import Called, GateTest, Power, Verdict, WayPower
from policy_engine.analysis.text import ms

#: The rank-sum test's significance level. Two runs of one unchanged 4-rank job on a
#: loaded 2-core machine gave p >= 0.015 in 132 of 132 windows (steps vary with the
#: machine between runs, not only within one); a change gave p <= 0.0022 in 12 of 12.
ALPHA = 0.005
#: The least change of the median step time, as a share of the base's, called a change,
#: and the change ``no change`` promises the steps could have shown.
MIN_CHANGE = 0.05
#: A change of the median this large is never ``no change``, whatever the test says.
LARGE = 0.5
#: The power :func:`steps_to_decide` asks of the test (by its normal approximation: the
#: typical steps must lie z_(1-ALPHA/2) + z_POWER standard deviations out).
POWER = 0.9
#: The p the typical steps must reach for :data:`POWER`.
DECIDE_P = math.erfc((statistics.NormalDist().inv_cdf(1 - ALPHA / 2)
                      + statistics.NormalDist().inv_cdf(POWER)) / math.sqrt(2))
#: The most steps a side :func:`steps_to_decide` looks at.
MOST_STEPS = 10_000
#: Halvings of the bisection for the least change the gate calls.
HALVINGS = 40
TEST = "Mann-Whitney U (two-sided) over steps"


# -- the test ---------------------------------------------------------------------------

def _u(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """The two-sided p of the Mann-Whitney U test of ``a`` against ``b`` (normal
    approximation with tie and continuity corrections) and U less its mean (above 0:
    ``a`` tends larger); None with fewer than 3 values on a side."""
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
        return 1.0, 0.0
    z = (abs(u - mean) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))), u - mean


def reachable(n: int, m: int) -> bool:
    """Whether ``n`` and ``m`` steps can reach p < ALPHA at all: every step of one run
    beyond every step of the other, no two alike. Ties among the steps make the test's
    variance smaller and can take it below ALPHA with fewer, but steps that are all alike
    are not evidence of anything."""
    if n < 3 or m < 3:
        return False
    z = (n * m / 2 - 0.5) / math.sqrt(n * m * (n + m + 1) / 12)
    return math.erfc(z / math.sqrt(2)) < ALPHA


def rank_sum(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The two-sided p-value of the Mann-Whitney U test of ``a`` against ``b`` (normal
    approximation with tie and continuity corrections); None with fewer than 3 values on
    a side; 1 when every value is the same."""
    found = _u(a, b)
    return None if found is None else found[0]


def _quantile(ordered: Sequence[float], share: float) -> float:
    """The ``share`` quantile of sorted values (linear between the order statistics)."""
    k = (len(ordered) - 1) * share
    i = int(k)
    j = min(i + 1, len(ordered) - 1)
    return ordered[i] + (ordered[j] - ordered[i]) * (k - i)


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return _quantile(ordered, 0.25), _quantile(ordered, 0.75)


def apart(base: Sequence[float], new: Sequence[float]) -> bool:
    """Each run's median outside the other's interquartile range, on opposite sides."""
    mb, mn = statistics.median(base), statistics.median(new)
    (b1, b3), (n1, n3) = _quartiles(base), _quartiles(new)
    return (mn > b3 and mb < n1) or (mn < b1 and mb > n3)


def _calls(base: Sequence[float], new: Sequence[float], up: bool,
           alpha: float = ALPHA) -> bool:
    """Whether the test (at ``alpha``) and the middle halves call ``new`` slower (``up``)
    or faster."""
    return _test_calls(base, new, up, alpha) and apart(base, new)


def _test_calls(base: Sequence[float], new: Sequence[float], up: bool,
                alpha: float = ALPHA) -> bool:
    """Whether the test alone calls ``new`` slower (``up``) or faster."""
    if not reachable(len(base), len(new)):
        return False
    found = _u(base, new)
    return found is not None and found[0] < alpha and (found[1] < 0) == up


# -- its power ------------------------------------------------------------------------------

def _scaled(base: Sequence[float], new: Sequence[float]) -> list[float]:
    """The new run's steps scaled to the base's median: its spread at the base's size."""
    b, n = statistics.median(base), statistics.median(new)
    return [x * b / n for x in new] if n > 0 else [b + x for x in new]


def _least(test: Callable[[float], bool], up: bool, bound: float) -> float | None:
    """The least change ``s`` (0 <= s) that ``test(factor)`` calls, the factor being
    ``1 + s`` (``up``) or ``1 - s``; ``bound`` a factor far enough out to call it, if
    anything is. None when even that is not called. Bisection on the logarithm of the
    factor: the test only turns from no to yes as the shift grows."""
    if not test(bound):
        return None
    if test(1.0):
        return 0.0
    lo, hi = 0.0, math.log(bound)
    for _ in range(HALVINGS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if test(math.exp(mid)) else (mid, hi)
    factor = math.exp(hi)
    return factor - 1 if up else 1 - factor


def _bound(base: Sequence[float], new: Sequence[float], up: bool) -> float:
    """A factor that moves every step of ``new`` beyond every base step, and its median
    more than MIN_CHANGE beyond the base's, where one can."""
    mb, mn = statistics.median(base), statistics.median(new)
    if mn <= 0:
        return 1e6 if up else 1e-6
    if up:
        low = min(new)
        return max(max(base) / low, mb * (1 + MIN_CHANGE) / mn) * 1.001 if low > 0 else 1e6
    high, floor = max(new), min(base)
    return min(floor / high, mb * (1 - MIN_CHANGE) / mn) * 0.999 if floor > 0 and high > 0 \
        else 1e-6


def _apart_at(base: Sequence[float], scaled: Sequence[float], up: bool) -> float:
    """The least change that puts each median outside the other's middle half (the
    scaled steps share the base's median): in closed form, math.inf where none can."""
    b = statistics.median(base)
    (b1, b3), (s1, s3) = _quartiles(base), _quartiles(scaled)
    if up:
        return max(b3 / b, b / s1 if s1 > 0 else math.inf) - 1
    share = 1 - min(b1 / b, b / s3 if s3 > 0 else 0.0)
    return share if share < 1 else math.inf


def _test_at(base: Sequence[float], scaled: Sequence[float], up: bool) -> float | None:
    """The least change the rank-sum test alone calls (None: no shift reaches ALPHA)."""
    return _least(lambda f: _test_calls(base, [x * f for x in scaled], up), up,
                  _bound(base, scaled, up))


def power(base: Sequence[float], new: Sequence[float]) -> Power:
    """What these steps could tell: for each way (``slower``, ``faster``) the least change
    the rank-sum test calls (``test``; None: no change reaches p < ALPHA with these counts)
    and the least that puts the medians apart (``apart``), and ``detectable``, the least
    change the gate calls either way (math.inf: none). The base's median must be above 0."""
    scaled = _scaled(base, new)
    ways = []
    for up in (True, False):
        test, spread = _test_at(base, scaled, up), _apart_at(base, scaled, up)
        ways.append(WayPower(test=test, apart=spread,
                             least=math.inf if test is None else max(test, spread)))
    return Power(slower=ways[0], faster=ways[1], detectable=max(0.0, *(w.least for w in ways)))


def told_apart(base: Sequence[float], new: Sequence[float]) -> tuple[float, float]:
    """The changes of the median these steps tell apart from their own: any above the
    first or below the second (shares; math.inf and -math.inf where none). A change ``c``
    is told apart where the gate, given the new run's steps divided by ``1 + c``, calls
    them the other way: these runs did not move by ``c``. A window that says nothing of a
    5% change may still rule out one of 150%."""
    if statistics.median(base) <= 0 or statistics.median(new) <= 0:
        return math.inf, -math.inf

    def moved(way: Verdict) -> Callable[[float], bool]:
        return lambda f: called(base, [x * f for x in new]) == way

    s = _least(moved("faster"), False, _bound(base, new, False))
    above = math.inf if s is None or s >= 1 else 1 / (1 - s) - 1
    s = _least(moved("slower"), True, _bound(base, new, True))
    return above, -math.inf if s is None else 1 / (1 + s) - 1


def _typical(values: Sequence[float], k: int) -> list[float]:
    """``k`` values spread like ``values``: their quantiles at (i + 0.5) / k."""
    ordered = sorted(values)
    return [_quantile(ordered, (i + 0.5) / k) for i in range(k)]


def steps_to_decide(base: Sequence[float], new: Sequence[float], change: float,
                    up: bool) -> int | None:
    """About how many steps a side, drawn like these, would let the gate call a change
    of ``change`` (a share) slower (``up``) or faster with :data:`POWER`; None when no
    count up to :data:`MOST_STEPS` would (the middle halves, which no count narrows, or
    the test)."""
    scaled = _scaled(base, new)
    factor = 1 + change if up else 1 - change
    if factor <= 0 or _apart_at(base, scaled, up) >= change:
        return None

    def decides(k: int) -> bool:
        return _calls(_typical(base, k), [x * factor for x in _typical(scaled, k)], up,
                      DECIDE_P)

    if not decides(MOST_STEPS):
        return None
    lo = max(len(base), len(new), 2)  # the count that did not decide
    if lo >= MOST_STEPS:
        return None
    hi = lo + 1
    while not decides(hi):
        lo, hi = hi, min(hi * 2, MOST_STEPS)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid, hi)
    return hi


# -- the verdict ------------------------------------------------------------------------

def _pct(share: float) -> str:
    return f"{share:.1%}" if math.isfinite(share) else "none"


def _p(p: float | None) -> str:
    return "none (under 3 steps a side)" if p is None else f"{p:.2g}"


def _share(base: Sequence[float], new: Sequence[float]) -> float:
    """The change of the median as a share of the base's. From a median of 0 any change is
    out of all proportion (infinite: the gates on its size pass), and none is 0."""
    b, n = statistics.median(base), statistics.median(new)
    return (n - b) / b if b > 0 else 0.0 if n == b else math.copysign(math.inf, n - b)


def called(base: Sequence[float], new: Sequence[float],
           drift: float | None = None) -> Verdict | None:
    """``slower`` or ``faster`` where the gate lets the change through, else None."""
    share = _share(base, new)
    p = rank_sum(base, new)
    if not reachable(len(base), len(new)) or p is None or p >= ALPHA \
            or abs(share) < MIN_CHANGE or not apart(base, new) \
            or (drift is not None and abs(share) <= drift):
        return None
    return "slower" if share > 0 else "faster"


def verdict(base: Sequence[float], new: Sequence[float],
            drift: float | None = None) -> Called:
    """slower / faster / no change / inconclusive from the step times of each run (at
    least one a side), with the test and its power. ``drift``: how far apart the medians
    of one run's own windows lie (the larger of the two runs'), as a share; a change no
    larger is not called."""
    p = rank_sum(base, new)
    b, n = statistics.median(base), statistics.median(new)
    share = _share(base, new)
    # A share of nothing has no percentage: the change is said in milliseconds.
    change = f"{share:+.1%}" if math.isfinite(share) else \
        f"{ms(b)} -> {ms(n)} ms (from a median step of 0: no percentage)"
    steps = f"{len(base)} and {len(new)} steps"
    test = GateTest(
        name=TEST, p=None if p is None else round(p, 6), alpha=ALPHA, min_change=MIN_CHANGE,
        change=round(share, 6) if math.isfinite(share) else None, base_steps=len(base),
        new_steps=len(new), apart=apart(base, new),
        drift=None if drift is None else round(drift, 4))
    word = called(base, new, drift)
    if word is not None:
        assert p is not None
        return Called(word, f"median step time {change} (p = {p:.2g} < {ALPHA}, {steps})",
                      test)
    if b <= 0:
        return _from_zero(base, new, change, p, steps, test)
    seen = power(base, new)
    detectable = seen.detectable
    test = attrs.evolve(test, detectable=round(detectable, 4) if math.isfinite(detectable)
                        else None)
    held = drift is not None and drift >= MIN_CHANGE
    if detectable <= MIN_CHANGE and not held and abs(share) < LARGE:
        if p is not None and p >= ALPHA:
            reason = f"p = {p:.2g} >= {ALPHA}"
        else:
            reason = f"a change of {change} is under {MIN_CHANGE:.0%}"
        return Called("no change", f"within noise ({reason}, {steps}, which could have "
                      f"called a change of {_pct(max(detectable, 0.0))} either way)", test)
    return _inconclusive(base, new, share, change, p, steps, drift, seen, test)


def _from_zero(base: Sequence[float], new: Sequence[float], change: str, p: float | None,
               steps: str, test: GateTest) -> Called:
    """A base whose median step is 0: no share of it can be told. Steps that are all the
    same, in both runs and enough of them, show no change; anything else is open."""
    if len(set(base) | set(new)) == 1 and reachable(len(base), len(new)):
        return Called("no change", f"every step of both runs took the same time ({steps})",
                      attrs.evolve(test, detectable=0.0))
    return Called("inconclusive", f"median step time {change} (p = {_p(p)}, {steps}; from "
                  "a median step of 0 no share of a change can be told)", test)


def _inconclusive(base: Sequence[float], new: Sequence[float], share: float, change: str,
                  p: float | None, steps: str, drift: float | None, seen: Power,
                  test: GateTest) -> Called:
    """Why the steps cannot tell, and about how many a side would."""
    # The way the runs moved, where they moved enough to matter; else both ways (a claim
    # of no change needs both).
    ways = [seen.slower if share > 0 else seen.faster] if abs(share) >= MIN_CHANGE \
        else [seen.slower, seen.faster]
    target = max(abs(share), MIN_CHANGE)
    least = max(w.least for w in ways)
    spread = max(w.apart for w in ways)
    why = []
    if reachable(len(base), len(new)) and p is not None and p < ALPHA \
            and abs(share) >= MIN_CHANGE and test.apart:
        why.append(f"p < {ALPHA} and the medians apart, but the change is no larger than "
                   f"the {_pct(drift or 0.0)} by which one run's own windows differ")
    else:
        if not reachable(len(base), len(new)):
            why.append(f"too few steps: even every step of one run beyond every step of "
                       f"the other could not reach p < {ALPHA}")
        elif any(w.test is None for w in ways):
            why.append(f"no change of these steps, however large, reaches p < {ALPHA}")
        elif least > MIN_CHANGE:
            why.append(f"the least change these steps could call is {_pct(least)} ("
                       + ("each run's median must lie outside the other's middle half"
                          if spread >= least else "the steps' spread for their count") + ")")
        if drift is not None and drift >= MIN_CHANGE:
            why.append(f"one run's own windows differ by {_pct(drift)}: a change no larger "
                       "is not called")
    if not why:  # the gate would call it, were it not this large a change
        why.append(f"a change of {LARGE:.0%} or more is never called no change")
    if drift is not None and drift >= target:
        decide = None
        more = "more steps would not decide"
    else:
        counts = [steps_to_decide(base, new, target, w is seen.slower) for w in ways]
        decide = None if None in counts else max(c for c in counts if c is not None)
        if decide is not None:
            more = f"about {decide} steps a side would decide"
        elif spread >= target:
            more = (f"more steps would not decide: a change of {_pct(target)} leaves each "
                    "run's median inside the other's middle half of steps")
        else:
            more = f"more than {MOST_STEPS} steps a side would be needed"
    return Called("inconclusive", f"median step time {change} (p = {_p(p)}, {steps}; "
                  + "; ".join(why) + f"; {more})", attrs.evolve(test, decide_steps=decide))
