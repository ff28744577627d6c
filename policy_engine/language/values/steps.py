"""The policy's ``steps`` value: a set of outer training steps, kept as arithmetic runs.

Periodic steps (``{every: 100, from: 100}``, optional ``until``) are one run whose last
member is None when it has no ``until``: an open-ended set that nothing here expands.

:meth:`StepSet.parse` raises :class:`SelectorError` with a sub-path inside the value;
callers prepend the value's own JSON path and file position. The arithmetic on the runs
(:mod:`policy_engine.language.values.runs`) never expands the set: an answer past a fixed
allowance of work is None ("unknown"), which callers treat as "many".
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

import attrs

from policy_engine.errors import describe, did_you_mean, is_int
from policy_engine.language.values import runs as arithmetic
from policy_engine.language.values.runs import ALL, Run
from policy_engine.language.values.selector import (
    Path,
    SelectorError,
    _bounded_int,
    _number,
)

if TYPE_CHECKING:
    from policy_engine.language.values.schedule import Schedule

__all__ = ["StepSet", "step_per_cycle"]

_STEP_TOKEN = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+)(?:\s*:\s*([0-9]+))?)?")
_NEGATIVE = re.compile(r"-\s*[0-9]+")


def _step_run(token: str, path: Path) -> Run:
    token = token.strip()
    match = _STEP_TOKEN.fullmatch(token)
    if match is None:
        if _NEGATIVE.fullmatch(token):
            raise SelectorError(f"step {token} is negative", path)
        raise SelectorError(f"malformed step range {token!r} (expected N, A-B or A-B:S)", path)
    start = _number(match[1], "step", "steps", path)
    stop = start if match[2] is None else _number(match[2], "step", "steps", path)
    stride = 1 if match[3] is None else _number(match[3], "stride", "strides", path)
    if stop < start:
        raise SelectorError(f"range {start}-{stop} is reversed", path)
    if stride <= 0:
        raise SelectorError(f"stride must be > 0 in {token!r}", path)
    return (start, stop, stride)


#: The keys of the periodic form, in the order messages list them.
PERIODIC_KEYS = ("every", "from", "until")


def _periodic_field(body: dict[object, object], key: str, minimum: int, path: Path) -> int:
    value = body[key]
    if not is_int(value):
        raise SelectorError(f"{key} must be an integer, got {describe(value)}", (*path, key))
    _bounded_int(value, key, "steps", (*path, key))
    if value < minimum:
        raise SelectorError(f"{key} must be >= {minimum}, got {value}", (*path, key))
    return value


def _periodic(body: dict[object, object], path: Path) -> Run:
    """``{every: N, from: A, until: B}``: A, A + N, A + 2N, ... up to B (inclusive) when
    given. ``from`` defaults to ``every`` (N, 2N, ...: torchtitan's profile_freq)."""
    for key in body:
        if key not in PERIODIC_KEYS:
            hint = did_you_mean(str(key), PERIODIC_KEYS) or " (keys: every, from, until)"
            raise SelectorError(f"unknown key {str(key)!r}{hint}", (*path, str(key)))
    if "every" not in body:
        raise SelectorError("periodic steps need 'every' (as in {every: 100, from: 100})",
                            path)
    every = _periodic_field(body, "every", 1, path)
    start = _periodic_field(body, "from", 0, path) if "from" in body else every
    if "until" not in body:
        return (start, None, every)
    until = _periodic_field(body, "until", 0, path)
    if until < start:
        shown = "from" if "from" in body else "from (which defaults to every)"
        raise SelectorError(f"until {until} is before {shown} {start}", (*path, "until"))
    return (start, until, every)


def _step_item(value: object, path: Path, runs: list[Run]) -> None:
    if isinstance(value, dict):
        runs.append(_periodic(value, path))
    elif is_int(value):
        _bounded_int(value, "step", "steps", path)
        if value < 0:
            raise SelectorError(f"step {value} is negative", path)
        runs.append((value, value, 1))
    elif isinstance(value, str):
        if value.strip() == "all":
            runs.append(ALL)
        else:
            runs.extend(_step_run(token, path) for token in value.split(","))
    else:
        raise SelectorError(
            f"a step must be a number, a range string like '10-12' or '0-100:10', or "
            f"{{every: N, from: A}}, got {describe(value)}",
            path,
        )


def _covered(run: Run, endless: list[Run]) -> bool:
    """Whether every member of the bounded ``run`` is a member of an ``endless`` run."""
    start, stop, stride = run
    return any(start >= a and (start - a) % s == 0 and (start == stop or stride % s == 0)
               for a, _, s in endless)


def _normalize(runs: tuple[Run, ...] | list[Run]) -> tuple[Run, ...]:
    """:func:`arithmetic.normalize`, with endless runs (periodic steps): a stride-1 one
    (every step from ``tail`` on) absorbs the runs it covers and the intervals that reach
    it; strided ones drop the runs they cover. Sorted by start."""
    if arithmetic.ALL in runs:
        return (ALL,)
    bounded = arithmetic.normalize([run for run in runs if run[1] is not None])
    found = sorted({run for run in runs if run[1] is None}, key=arithmetic.order)
    if not found:
        return bounded
    tail = min((start for start, _, stride in found if stride == 1), default=None)
    if tail is not None:  # intervals (disjoint after normalize) that reach the tail join it
        for start, stop, stride in sorted(bounded, reverse=True):
            if stride == 1 and stop is not None and start < tail <= stop + 1:
                tail = start
        if tail == 0:
            return (ALL,)
    endless: list[Run] = [] if tail is None else [(tail, None, 1)]
    for run in found:  # by start: a run that covers another comes first
        if run[2] != 1 and (tail is None or run[0] < tail) and not _covered(run, endless):
            endless.append(run)
    kept = [run for run in bounded
            if (tail is None or run[0] < tail) and not _covered(run, endless)]
    return tuple(sorted(kept + endless, key=arithmetic.order))


@attrs.frozen
class StepSet:
    """A set of outer training steps (ints >= 0), kept as arithmetic runs, never expanded.

    Build it with :meth:`parse`. ``runs`` is the canonical tuple of
    ``(start, last, stride)``; ``last`` is None for an endless run: ``all`` is
    ``(0, None, 1)``, ``{every: 100, from: 100}`` is ``(100, None, 100)``.
    """

    runs: tuple[Run, ...] = attrs.field(converter=_normalize)

    @classmethod
    def parse(cls, value: object) -> StepSet:
        """Parse ``all``, an int, ``"10-12"``, ``"100-2100:1000"``, ``"1,3,5-7"``,
        ``{every: 100, from: 100, until: 1000}`` or a list of these."""
        runs: list[Run] = []
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                _step_item(item, (index,), runs)
        elif is_int(value) or isinstance(value, (str, dict)):
            _step_item(value, (), runs)
        else:
            raise SelectorError(
                f"steps must be 'all', a step number, a range string, {{every: N, from: A}} "
                f"or a list of them, got {describe(value)}"
            )
        return cls(runs)

    @property
    def is_all(self) -> bool:
        """Every step."""
        return self.runs == (ALL,)

    @property
    def is_empty(self) -> bool:
        """No step at all (``[]``)."""
        return not self.runs

    @property
    def is_bounded(self) -> bool:
        """Finitely many steps."""
        return all(stop is not None for _, stop, _ in self.runs)

    def every_step_from(self) -> int | None:
        """The step from which every later step is a member (``all``: 0, ``{every: 1,
        from: 5}``: 5); None when the set has no such endless run."""
        return min((start for start, stop, stride in self.runs
                    if stop is None and stride == 1), default=None)

    def __contains__(self, step: object) -> bool:
        if not is_int(step):
            return False
        for start, stop, stride in self.runs:
            if start <= step and (stop is None or step <= stop) and (step - start) % stride == 0:
                return True
        return False

    def count(self) -> int | None:
        """How many steps; None when unbounded, or when counting would need more than a
        fixed allowance of work.

        The count is exact by inclusion-exclusion while that needs at most a few thousand
        distinct terms, else exact from the pattern the runs repeat between two run
        boundaries while those periods fit in a few MiB. None past both (many strided
        runs with large coprime strides over a long span: at least hundreds of thousands
        of steps): callers treat it as "many", as they treat an unbounded set.
        """
        return arithmetic.count(self.runs) if self.is_bounded else None

    def run_end(self, first: int) -> int | None:
        """The last step of the run of consecutive steps ``first``, ``first + 1``, ...

        ``first`` must be a step (ValueError otherwise). None when the run never ends
        (``all``, or strided runs that together cover every step from ``first`` on), and
        when its end lies past what a fixed allowance of work can find: a run made of
        strided runs whose steps interleave, with a common period above 2**24 steps, that
        has no gap within the first ~2**24 steps after ``first``. Stride-1 runs are jumped
        over, and strided runs that together cover every residue of their period (such
        as ``0-1000000:2,1-1000001:2``) are jumped over as one interval.
        """
        if first not in self:
            raise ValueError(f"{first} is not a step of {self}")
        if first + 1 not in self:
            return first
        return arithmetic.run_end(self.runs, first)

    def run_lengths(self) -> dict[int, int] | None:
        """``{length: how many}`` over the maximal runs of consecutive steps (what
        ``merge_steps`` turns into captures). None when unbounded, or when the runs
        interleave in a pattern too long to follow with a fixed allowance of work."""
        if not self.is_bounded:
            return None
        found = arithmetic.run_lengths(self.runs)
        if found is None:
            return None
        counts: Counter[int] = Counter()
        for block, times in found:
            for length in block:
                counts[length] += times
        return dict(counts)

    def first(self) -> int | None:
        """The smallest step, None when empty."""
        return self.runs[0][0] if self.runs else None

    def last(self) -> int | None:
        """The largest step, None when empty or unbounded.

        With :meth:`first` and :meth:`run_end` this tells whether the set is one unbroken
        run (``run_end(first()) == last()``) without expanding it.
        """
        if not self.runs or not self.is_bounded:
            return None
        return max(stop for _, stop, _ in self.runs if stop is not None)

    def next_after(self, step: int) -> int | None:
        """The smallest member greater than ``step``, None when there is none."""
        best: int | None = None
        for start, stop, stride in self.runs:
            candidate = start if step < start else start + ((step - start) // stride + 1) * stride
            if (stop is None or candidate <= stop) and (best is None or candidate < best):
                best = candidate
        return best

    def within(self, lo: int, hi: int) -> list[int]:
        """The members in ``[lo, hi]``, sorted; only that window is expanded."""
        found: set[int] = set()
        for start, stop, stride in self.runs:
            first = start if lo <= start else start - (start - lo) // stride * stride
            last = hi if stop is None else min(stop, hi)
            found.update(range(first, last + 1, stride))
        return sorted(found)

    def to_json(self) -> list[int | str | dict[str, int]]:
        """A compact list that :meth:`parse` reads back: ``["all"]``, ``[2, 3, "10-20:5"]``,
        ``[{"every": 100, "from": 100}]``."""
        return [run[0] if run[0] == run[1]
                else {"every": run[2], "from": run[0]} if run[1] is None and run != ALL
                else arithmetic.run_text(run) for run in self.runs]

    def __str__(self) -> str:
        return ",".join(arithmetic.run_text(run) for run in self.runs) if self.runs else "none"


def step_per_cycle(steps: StepSet, *, merge_steps: bool, schedule: Schedule | None,
                   discrete: bool) -> bool:
    """Whether ``<step>`` names each schedule cycle of a capture by its own outer step.

    True for merged captures (``merge_steps: true``) with a schedule that repeats, or
    whose steps never end: one capture then makes a trace per cycle, and each trace's
    ``<step>`` is the outer step in which its cycle started recording (torchtitan's
    ``iteration_<n>``), not the capture's span (``10-12``) or an open end (``1+``).
    """
    return merge_steps and not discrete and schedule is not None and (
        schedule.repeat != 1 or not steps.is_bounded)
