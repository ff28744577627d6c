"""What ``compare`` answers, as typed records, each declared once: the verdict of the gate
(:class:`Called`, its :class:`GateTest` and what the steps could tell, :class:`Power`), one
pair of windows (:class:`WindowComparison` and its parts) and the two runs
(:class:`RunComparison`).

:mod:`~policy_engine.analysis.compare_gate` and :mod:`~policy_engine.analysis.compare` make
them; the text (:mod:`~policy_engine.analysis.compare_text`), the report's section
(:mod:`~policy_engine.analysis.compare_page`) and ``compare --format json`` read them. The
JSON document (``schemas/compare.schema.json``) is :meth:`RunComparison.to_json`: each
record's fields, in their order, under their names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attr
import attrs

#: What the gate says of two runs' step times (None where no verdict is given).
Verdict = Literal["slower", "faster", "no change", "inconclusive"]
#: The verdicts that call a change.
CALLS: tuple[Verdict, ...] = ("slower", "faster")


def _json(record: Any) -> dict[str, Any]:
    """A record's JSON object: its fields in order, records within made objects, tuples
    arrays."""
    # attr's own asdict: attrs.asdict keeps tuples, which a JSON schema's arrays refuse
    found: dict[str, Any] = attr.asdict(record, recurse=True, retain_collection_types=False)
    return found


# -- the gate --------------------------------------------------------------------------------

@attrs.frozen
class GateTest:
    """The test behind a verdict (``test`` in the comparison's JSON)."""

    name: str  # the rank-sum test's name
    p: float | None  # None: under 3 steps a side
    alpha: float
    min_change: float
    #: the change of the median as a share of the base's (None: from a median of 0)
    change: float | None
    base_steps: int
    new_steps: int
    #: each run's median outside the other's middle half of steps
    apart: bool
    #: how far one run's own windows lie apart (a change no larger is not called)
    drift: float | None
    #: the least change these steps call either way (None: none)
    detectable: float | None = None
    #: about how many steps a side would decide (None: none up to the most tried)
    decide_steps: int | None = None
    #: whether the other windows of its role and region let the change stand (None: not
    #: held to them, the window called no change)
    agree: bool | None = None


@attrs.frozen
class Called:
    """A verdict, why it was given, and its test (verdict and test None: not compared)."""

    verdict: Verdict | None
    why: str
    test: GateTest | None


@attrs.frozen
class WayPower:
    """What the steps could tell one way (slower or faster), as shares of the median."""

    test: float | None  # the least change the rank-sum test calls (None: none reaches alpha)
    apart: float  # the least that puts the medians outside each other's middle half
    least: float  # the least the gate calls (the larger of the two; math.inf: none)


@attrs.frozen
class Power:
    """What the steps could tell either way, and the least change called both ways."""

    slower: WayPower
    faster: WayPower
    detectable: float  # math.inf: none


# -- one pair of windows ----------------------------------------------------------------------

@attrs.frozen
class Side:
    """Which window of a run a pair holds."""

    title: str
    steps: tuple[Any, ...]
    cycle: int | None
    capture: int


@attrs.frozen
class Difference:
    """One way the two runs were recorded differently; ``blocks``: no verdict is given."""

    what: str  # world, mesh, basis, recorded, torch or policy
    base: Any
    new: Any
    blocks: bool
    message: str


@attrs.frozen
class LeftOut:
    """A rank of one run that takes no part in the comparison, and why."""

    run: Literal["base", "new"]
    rank: Any
    why: str


@attrs.frozen
class StepTime:
    """The step time then and now: the median over the steps, the mean over the ranks'
    steps, and the mean's change (what the parts split)."""

    base_median_us: float
    new_median_us: float
    base_mean_us: float
    new_mean_us: float
    change_us: float


@attrs.frozen
class Moved:
    """A region whose time per step changed (None: not seen in that run)."""

    name: str
    base_us: float | None
    new_us: float | None
    change_us: float


@attrs.frozen
class OperatorMoved(Moved):
    """An operator or kernel whose time per step changed, with its category."""

    cat: str


@attrs.frozen
class RankMoved:
    """A rank's mean step then and now."""

    rank: Any
    base_us: float
    new_us: float
    change_us: float


@attrs.frozen
class Then:
    """A rank then and now (the straggler, the late rank), and whether it changed."""

    base: Any
    new: Any
    changed: bool


@attrs.frozen
class Figure:
    """One figure per step then and now (mean over the ranks), and its change."""

    base: float | None
    new: float | None
    change: float | None


@attrs.frozen
class CallsChanged:
    """How the window's collective calls changed."""

    wait_us: Figure  # the wait for the last arrival, per step
    transfer_us: Figure  # the transfer, per step
    late_rank: Then


@attrs.frozen
class WindowComparison:
    """One window of the base run compared with its match in the new run."""

    role: str
    region: str | None
    base: Side
    new: Side
    differences: tuple[Difference, ...]
    left_out: tuple[LeftOut, ...]
    comparable: bool
    step_time: StepTime | None
    #: the change of the mean step by part (compute_us, exposed_comm_us, other_us, idle_us)
    parts: Mapping[str, float] | None
    ranks: tuple[RankMoved, ...]
    regions: tuple[Moved, ...]
    operators: tuple[OperatorMoved, ...]
    straggler: Then
    collectives: CallsChanged | None
    verdict: Verdict | None
    why: str
    test: GateTest | None

    @property
    def called(self) -> Called:
        """The window's verdict, as the gate gave it."""
        return Called(self.verdict, self.why, self.test)

    def to_json(self) -> dict[str, Any]:
        return _json(self)


@attrs.frozen
class RunComparison:
    """Two runs compared: one :class:`WindowComparison` per pair of windows, and the
    windows of either run left unmatched."""

    version: int
    base: str
    new: str
    windows: tuple[WindowComparison, ...]
    #: the titles of the windows of ``base`` and of ``new`` with no match in the other run
    unmatched: Mapping[Literal["base", "new"], tuple[str, ...]]

    def to_json(self) -> dict[str, Any]:
        """The JSON document of the comparison (``schemas/compare.schema.json``)."""
        return {"version": self.version, "base": self.base, "new": self.new,
                "windows": [w.to_json() for w in self.windows],
                "unmatched": {side: list(titles) for side, titles in self.unmatched.items()}}
