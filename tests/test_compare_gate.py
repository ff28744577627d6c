"""compare's verdict on step times: the rank-sum test, the gate, its power (``no change``
only where the steps could have shown a change of MIN_CHANGE; ``inconclusive`` with why
and the steps a side that would decide where they could not; never ``no change`` for a
change of 50% or more), and the windows of a role held to each other (``agree``: an
undecided window does not vote)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from policy_engine.analysis.compare import agree
from policy_engine.analysis.compare_gate import (
    ALPHA,
    DECIDE_P,
    MIN_CHANGE,
    called,
    power,
    rank_sum,
    steps_to_decide,
    verdict,
)
from policy_engine.analysis.comparison import Called


def _steps(n: int, median: float, spread: float) -> list[float]:
    """``n`` steps spread like log-normal ones: quantiles at (i + 0.5) / n, in an order
    that is not sorted (the test must not lean on it)."""
    norm = statistics.NormalDist()
    out = [median * math.exp(spread * norm.inv_cdf((i + 0.5) / n)) for i in range(n)]
    return out[::2] + out[1::2]


def test_the_rank_sum_test_gives_the_textbook_p_values() -> None:
    # scipy.stats.mannwhitneyu(method="asymptotic") on the same samples: 0.0273034...
    assert rank_sum([1, 1, 2, 2, 3, 3, 3, 4], [2, 3, 3, 4, 4, 5, 5, 5]) \
        == pytest.approx(0.027303402992194, rel=1e-9)
    assert rank_sum([5.0] * 6, [5.0] * 6) == 1.0
    assert rank_sum([1, 2], [3, 4, 5]) is None


def test_the_gate_calls_a_change_that_is_large_significant_and_apart() -> None:
    assert verdict([10.0] * 7, [20.0] * 7).verdict == "slower"
    clear = verdict(_steps(7, 30.0, 0.05), _steps(7, 56.0, 0.05))
    assert clear.verdict == "slower"
    assert clear.why == "median step time +86.7% (p = 0.0022 < 0.005, 7 and 7 steps)"
    assert clear.test.change == pytest.approx(0.8667, abs=1e-4)
    # every step apart, but one run's own windows lie 50% apart: the machine, not a change
    lifted = [13.0 + i / 10 for i in range(9)]
    drifted = verdict([10.0 + i / 10 for i in range(9)], lifted, drift=0.5)
    assert drifted.verdict == "inconclusive" and drifted.test.drift == 0.5
    assert "no larger than the 50.0% by which one run's own windows differ" in drifted.why
    assert drifted.why.endswith("; more steps would not decide)")
    assert verdict([10.0 + i / 10 for i in range(9)], lifted, drift=0.1).verdict \
        == "slower"


def test_no_change_only_where_the_steps_could_have_shown_a_change_of_five_percent() -> None:
    """Steps that vary by a per cent or two show a 5% change: none is no change. Steps
    that vary by a quarter could not have shown one: inconclusive, never no change."""
    tight = verdict(_steps(12, 30.0, 0.01), _steps(12, 30.3, 0.01))
    assert tight.verdict == "no change"
    assert tight.test.detectable <= MIN_CHANGE
    assert tight.why.startswith("within noise (p = ")
    assert tight.why.endswith(f"12 and 12 steps, which could have called a change of "
                                 f"{tight.test.detectable:.1%} either way)")
    # small but significant over many steps: still no change, under 5%
    small = verdict([100.0 + i / 100 for i in range(40)], [102.0 + i / 100 for i in range(40)])
    assert small.verdict == "no change" and "under 5%" in small.why
    loose = verdict(_steps(7, 30.0, 0.25), _steps(7, 30.6, 0.25))
    assert loose.verdict == "inconclusive"
    assert loose.test.detectable > MIN_CHANGE
    assert loose.why.startswith("median step time +2.0% (p = ")
    # a quarter's spread puts the middle halves 17% either side of the median: no count of
    # steps brings a 5% change outside them
    assert loose.test.decide_steps is None
    assert loose.why.endswith("more steps would not decide: a change of 5.0% leaves each "
                                 "run's median inside the other's middle half of steps)")
    # the same steps twice, 7 a side but hardly varying: no change, with the power to say it
    assert verdict(_steps(7, 30.0, 0.002), _steps(7, 30.0, 0.002)).verdict == "no change"


def test_an_undecided_change_says_how_many_steps_would_decide() -> None:
    """+15% over 7 steps that vary by 8%: p falls short; about how many steps a side
    would decide is said, and with that many such steps the gate does call it."""
    base, new = _steps(7, 30.0, 0.08), _steps(7, 34.5, 0.08)
    said = verdict(base, new)
    t = said.test
    assert said.verdict == "inconclusive" and t.p >= ALPHA
    k = t.decide_steps
    assert k is not None and 7 < k < 40
    assert said.why == (
        f"median step time +15.0% (p = {t.p:.2g}, 7 and 7 steps; the least change these "
        f"steps could call is {power(base, new).slower.least:.1%} (the steps' spread "
        f"for their count); about {k} steps a side would decide)")
    assert called(_steps(k, 30.0, 0.08), _steps(k, 34.5, 0.08)) == "slower"
    # too few steps for the test at all: it says so, and the count that would decide
    few = verdict([10.0, 10.4, 9.8, 10.1, 10.2, 9.9], [20.0, 20.5, 19.7, 20.2, 20.1, 19.9])
    # 12 steps a side apart reach the p asked of a count that decides (DECIDE_P); 11 do not
    assert few.verdict == "inconclusive" and few.test.decide_steps == 12
    assert (rank_sum(range(12), range(12, 24)) or 1) < DECIDE_P \
        <= (rank_sum(range(11), range(11, 22)) or 0)
    assert "too few steps: even every step of one run beyond every step of the other could " \
           "not reach p < 0.005" in few.why


def test_the_count_that_would_decide_decides_most_pairs_of_such_runs() -> None:
    """By simulation: runs of log-normal steps with the spread and change estimated from;
    at the count said the gate calls the change in most pairs, at half of it in few."""
    rng = random.Random(7)
    for spread, change in ((0.08, 0.10), (0.15, 0.20), (0.30, 0.60)):
        k = steps_to_decide(_steps(7, 30.0, spread), _steps(7, 30.0 * (1 + change), spread),
                            change, up=True)
        assert k is not None

        def share(n: int, spread: float = spread, change: float = change) -> float:
            pairs = [([30.0 * math.exp(rng.gauss(0, spread)) for _ in range(n)],
                      [30.0 * (1 + change) * math.exp(rng.gauss(0, spread))
                       for _ in range(n)]) for _ in range(200)]
            return sum(called(b, n) == "slower" for b, n in pairs) / len(pairs)

        assert share(k) >= 0.6, (spread, change, k)
        assert share(k // 2) <= 0.45, (spread, change, k)


def test_a_change_of_half_or_more_is_never_no_change() -> None:
    """+89% where a stray step of the base slower than the changed ones keeps p above
    0.005: inconclusive, with the change and p, never no change."""
    said = verdict([25.0, 27.0, 30.0, 26.0, 28.0, 24.0, 60.0],
                   [50.0, 52.0, 48.0, 55.0, 53.0, 51.0, 49.0])
    assert said.test.p >= ALPHA and said.test.change >= 0.5
    assert said.verdict == "inconclusive"
    assert said.why == ("median step time +88.9% (p = 0.03, 7 and 7 steps; the least change "
                           "these steps could call is 126.7% (the steps' spread for their "
                           "count); about 16 steps a side would decide)")
    for drift in (0.9, 2.0):  # and where one run's own windows are further apart
        assert verdict([10.0 + i / 10 for i in range(9)], [16.0 + i / 10 for i in range(9)],
                       drift=drift).verdict == "inconclusive"


def test_from_a_median_step_of_zero() -> None:
    assert verdict([0.0] * 9, [0.0] * 9).verdict == "no change"
    up = verdict([0.0] * 9, [5000.0 + i * 100 for i in range(9)])
    assert up.verdict == "slower" and up.test.change is None
    assert up.why.startswith("median step time 0.000 -> 5.4 ms (from a median step of 0: "
                                "no percentage) (p = ")
    mixed = verdict([0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0], [0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 5.0])
    assert mixed.verdict == "inconclusive" and "no share of a change" in mixed.why


def _window(title: str, base: list[float], new: list[float]) -> tuple[str, Called]:
    return title, verdict(base, new)


def test_an_undecided_window_does_not_vote() -> None:
    """Two windows of a +87% change, the second's p held above 0.005 by one stray base
    step: the first stays slower, the second says it cannot tell."""
    steps = [([24.0, 25.0, 27.0, 26.0, 28.0, 25.5, 26.5], [48.0, 50.0, 49.0, 51.0, 47.0, 52.0,
                                                         49.5]),
             ([25.0, 27.0, 30.0, 26.0, 28.0, 24.0, 60.0], [50.0, 52.0, 48.0, 55.0, 53.0, 51.0,
                                                         49.0])]
    first, second = agree("trainer", [_window(f"step {i}", *s) for i, s in enumerate(steps, 1)],
                          steps)
    assert [first.verdict, second.verdict] == ["slower", "inconclusive"]
    assert first.test is not None and second.test is not None
    assert (first.test.agree, second.test.agree) == (True, None)
    # a window with no steps to compare (another world size, say) does not vote either
    alone, other = agree("trainer", [_window("step 1", *steps[0]),
                                     ("step 2", Called(None, "not compared", None))],
                         [steps[0], None])
    assert alone.test is not None and (alone.verdict, alone.test.agree) == ("slower", True)
    assert other == Called(None, "not compared", None)


def test_windows_that_tell_each_others_change_apart_are_inconclusive() -> None:
    """A machine busy for a while slows the windows it overlaps; a code change shows in
    every window that runs the code. A window +87% slower beside one whose steps rule
    that out (no change, or undecided about 5% but sure it is not 87%) cannot say which
    it is: inconclusive, never no change."""
    busy = (_steps(7, 26.0, 0.03), _steps(7, 48.6, 0.03))
    quiet = (_steps(12, 26.0, 0.01), _steps(12, 26.1, 0.01))
    loose = (_steps(7, 26.0, 0.15), _steps(7, 26.5, 0.15))
    for other, word in ((quiet, "no change"), (loose, "inconclusive")):
        windows = [_window("trainer, step 1", *busy), _window("trainer, step 2", *other)]
        assert [c.verdict for _, c in windows] == ["slower", word]
        lone = agree("trainer", windows, [busy, other])
        assert [c.verdict for c in lone] == ["inconclusive", word]
        assert lone[0].test is not None and lone[0].test.agree is False
        assert lone[1].test is not None and lone[1].test.change is not None
        change = f"{lone[1].test.change:+.1%}"
        assert lone[0].why == (
            "median step time +86.9% (p = 0.0022 < 0.005, 7 and 7 steps; in this window "
            f"only: the steps of trainer, step 2 ({change}) of trainer tell their change apart "
            "from this one: a machine busy during some windows, or a change in some steps "
            "only; a change of the code shows in every window that runs it)")
    slow, fast = (_steps(9, 26.0, 0.02), _steps(9, 33.0, 0.02)), \
        (_steps(9, 26.0, 0.02), _steps(9, 20.0, 0.02))
    torn = agree("trainer/gen", [_window("a", *slow), _window("b", *fast)], [slow, fast])
    assert [c.verdict for c in torn] == ["inconclusive", "inconclusive"]
    assert "the steps of b (-23.1%) of trainer/gen tell their change apart" in torn[0].why
    # windows that moved alike hold each other up
    alike = agree("trainer", [_window("a", *slow),
                              _window("b", _steps(9, 26.0, 0.02), _steps(9, 32.0, 0.02))],
                  [slow, (_steps(9, 26.0, 0.02), _steps(9, 32.0, 0.02))])
    assert [(c.verdict, c.test and c.test.agree) for c in alike] == [("slower", True)] * 2
