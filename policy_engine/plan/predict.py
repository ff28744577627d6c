"""What a policy will do on every rank of a role: the data behind ``policy-engine explain``.

A simulated world of 65,536 ranks holds few kinds of profiled rank. Ranks whose plans
differ only in their place (rank, local rank, node, coordinates:
:func:`~policy_engine.plan.compile.place_key`) open the same captures and write the same
traces, under names that differ only in those fields. Each such :class:`RankGroup` is
compiled and predicted once for its first rank, and once more with the place fields of
its name template bound to markers; the entry of any rank of the group is that JSON with
the rank's own values in place of the markers. A marker is longer than any value it
stands for, so a name that some rank's value would make too long (cut, with a hash) is
cut with the marker in it as well; the first rank's entry, filled in so, must equal the
one its plan gives, and where it does not, each rank of the group is compiled and
predicted on its own.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import attrs

from policy_engine.language.model import Policy
from policy_engine.language.values.schedule import Action, Schedule
from policy_engine.plan.captures import cycle_step, opened, traces
from policy_engine.plan.compile import compile_plan, place_key
from policy_engine.plan.placement import Place, places
from policy_engine.plan.plan import Plan

#: Given a plan, what lists the files of one of its traces (by name and position among
#: the process's traces): ``[{"path": ..., "backend": ..., "when": ...}]``.
Files = Callable[[Plan], Callable[[str, int], list[dict[str, Any]]]]


def actions(schedule: Schedule | None, n: int) -> list[str]:
    """Action names for inner steps 0..n-1; no schedule records the whole capture."""
    if schedule is None:
        return [Action.RECORD.name] * n
    return [a.name for a in schedule.actions(n)]


def default_inner_steps(plan: Plan) -> int:
    """Inner steps whose actions explain shows: enough to run the schedule through."""
    needed = [r.schedule.steps_needed for r in plan.regions if r.schedule] if plan.discrete \
        else []
    needed.append(plan.schedule.steps_needed if plan.schedule else None)
    known = [n for n in needed if n is not None]
    return min(max([10, *known]), 200)


def default_step_calls(plan: Plan) -> int:
    """The ``prof.step()`` calls per outer step (per region call, in discrete mode) that
    explain's traces assume when ``--inner-steps`` is not given.

    One when the plan names each cycle of a merged capture by its own step
    (:attr:`Plan.step_per_cycle`: a repeating schedule or endless steps): its schedule
    counts training steps, as torchtitan's ``profile_freq`` does and as the framework
    callbacks do without gradient accumulation. Otherwise the schedule counts steps
    within each capture (mini-batches), and explain assumes enough of them to run it
    through (:func:`default_inner_steps`).
    """
    return 1 if plan.step_per_cycle else default_inner_steps(plan)


def _first_cycle_step(plan: Plan, first: int, steps: Sequence[int], inner: int) -> int | None:
    """``<step>`` of the first cycle of a merged capture opening at ``first`` that names
    each cycle by its own step (None otherwise: the capture's span), as the run names it
    if the loop goes on past the window (``steps``, the capture's steps in it)."""
    if not plan.step_per_cycle or plan.schedule is None:
        return None
    if inner <= 0:
        return cycle_step(plan.schedule, 0, steps, inner)  # the capture's end names it
    index = plan.schedule.record_start(0) // inner  # a merged capture's steps follow
    last = plan.capture_last(first)                 # each other
    return first + (index if last is None else min(index, last - first))


def rank_entry(plan: Plan, lo: int, hi: int, inner: int | None = None,
               region_calls: int = 1, files: Files | None = None) -> dict[str, Any]:
    """What ``explain`` says of one rank: the plan's place, and when it profiles, its
    steps, schedule actions, captures and every trace file (names as the run writes them,
    with ``<pid>``, ``<timestamp>``, ``<host>`` and ``<env:...>`` left as placeholders).

    ``inner``: ``prof.step()`` calls per outer step (None: :func:`default_step_calls`;
    the actions shown cover at least :func:`default_inner_steps`). ``files``: what names
    each trace's files with the backends' extensions (the CLI passes
    :func:`policy_engine.cli.explain.plan_files`; the plan layer knows no backend)."""
    entry: dict[str, Any] = {
        "rank": plan.rank,
        "profiled": plan.enabled,
        "coords": dict(plan.coords),
        "local_rank": plan.local_rank,
        "node": plan.node,
    }
    if not plan.enabled:
        return entry
    shown = default_inner_steps(plan) if inner is None else inner
    inner = default_step_calls(plan) if inner is None else inner
    regions = [r for r in plan.regions if r.enabled] if plan.discrete else [None]
    captures = [
        {"steps": list(steps), "region": region.name if region else None,
         "name": plan.capture_name(
             first=first, region=region.name if region else None,
             cycle=None if (region.schedule if region else plan.schedule) is None else 0,
             at=_first_cycle_step(plan, first, steps, inner))}
        for first, steps in opened(plan, lo, hi) for region in regions
    ]
    listed = traces(plan, lo, hi, inner=inner, region_calls=region_calls)
    name_files = None if files is None else files(plan)
    entry.update({
        "backend": plan.backend,
        "backends": list(plan.backends),
        "steps": plan.steps.within(lo, hi),
        "inner_steps": inner,
        "actions": actions(plan.schedule, shown),
        "name": captures[0]["name"] if captures else plan.capture_name(
            first=None, region=None, cycle=None),
        "captures": captures,
        "traces": [t.to_json() if name_files is None
                   else dict(t.to_json(), files=name_files(t.name, t.index)) for t in listed],
    })
    if plan.discrete:
        entry["regions"] = {r.name: actions(r.schedule, shown) for r in plan.regions
                            if r.enabled}
    if plan.spec.triggers.any:
        entry["triggers"] = plan.spec.triggers.to_json()
    limits = plan.spec.limits
    if limits.captures is not None or limits.bytes is not None:
        entry["limits"] = limits.to_json()
    if plan.spec.keep != "traces":  # its torch traces are removed once summarised
        entry["keep"] = plan.spec.keep
    return entry


def explain(policy: Policy, role: str, *, world: int, lo: int = 0, hi: int = 20,
            inner: int | None = None, local_world: int | None = None, region_calls: int = 1,
            files: Files | None = None) -> dict[str, Any]:
    """Per rank: profiled or not, coordinates, backend, steps, actions, traces. Each rank
    is placed in the mesh of ``role`` (:meth:`Policy.mesh_for`; for another mesh, pass
    ``policy.with_mesh(mesh)``, as the CLI's ``--mesh`` does)."""
    return {"role": role, "world": world,
            "ranks": [entry.data() for entry in entries(
                policy, role, world=world, lo=lo, hi=hi, inner=inner, local_world=local_world,
                region_calls=region_calls, files=files)]}


def entries(policy: Policy, role: str, *, world: int, lo: int, hi: int, inner: int | None,
            local_world: int | None, region_calls: int = 1,
            files: Files | None = None) -> Iterator[Entry]:
    """An :class:`Entry` for every rank, in rank order: each rank placed by the code the
    runtime runs (:func:`~policy_engine.plan.placement.places`) and each group of ranks
    compiled by it (:func:`~policy_engine.plan.compile.compile_plan`), once."""
    groups: dict[tuple[object, ...], RankGroup] = {}
    key_of = place_key(policy, role)
    for place in places(policy, role, world, local_world):
        if place.topology is None:
            yield Entry(place, None)
            continue
        key = key_of(place.topology)
        group = groups.get(key)
        if group is None:
            group = groups[key] = RankGroup(policy, role, place,
                                            (lo, hi, inner, region_calls, files))
        yield Entry(place, group)


#: Marker ``i`` in a name (plain letters and digits, which names and file names keep), and
#: standing for a number of the entry (a string to the encoder: its quotes go with it).
_NAME_MARK = "PEPLACE{}{}X"
_NUMBER_MARK = "PENUMBER{}{}X"
_MARKS = re.compile(r'"PENUMBER(\d)x+X"|PEPLACE(\d)x+X')
_encode = json.JSONEncoder().encode


def _values(place: Place) -> tuple[int, ...]:
    """A rank's place, in the order of the markers: rank, local rank, node, coordinates."""
    return (place.rank, place.local_rank, place.node, *place.coords.values())


class _Form(NamedTuple):
    """A text with markers as a ``%`` format, and what picks the values it takes, in its
    order, from :func:`_values` (a tuple, or the one value)."""

    text: str
    pick: Callable[[tuple[int, ...]], Any]

    @classmethod
    def of(cls, marked: str) -> _Form:
        order: list[int] = []

        def slot(match: re.Match[str]) -> str:
            order.append(int(match.group(1) or match.group(2)))
            return "%d"
        text = _MARKS.sub(slot, marked.replace("%", "%%"))
        return cls(text, operator.itemgetter(*order) if order else lambda values: ())

    def fill(self, values: tuple[int, ...]) -> str:
        filled: str = self.text % self.pick(values)
        return filled


class RankGroup:
    """Profiled ranks of a role whose plans differ only in their place: what explain
    predicts for them, computed for the first (``place``). ``entry`` is its
    :func:`rank_entry`: every key but the place's (``rank``, ``coords``, ``local_rank``,
    ``node``) and the names (``name``, and in ``captures`` and ``traces``) holds for
    every rank of the group. ``args``: ``lo``, ``hi``, ``inner``, ``region_calls`` and
    ``files``, as :func:`rank_entry` takes them."""

    def __init__(self, policy: Policy, role: str, place: Place, args: tuple[Any, ...]) -> None:
        self.policy, self.role, self.args = policy, role, args
        plan = compile_plan(policy, role, place.topology)
        self.entry = rank_entry(plan, *args)
        #: the forms of a rank's JSON and name; None when filling them in would not give
        #: what compiling the rank gives
        self._json: _Form | None = None
        self._name: _Form | None = None
        if plan.enabled and tuple(place.coords) == tuple(plan.coords):
            self._forms(plan, place)

    def _forms(self, plan: Plan, place: Place) -> None:
        fields = ["rank", "local_rank", "node", *plan.coords]
        width = "x" * (len(str(plan.world)) + 1)  # longer than any value it stands for
        marked = attrs.evolve(plan, template=plan.template.bind(
            {f: _NAME_MARK.format(i, width) for i, f in enumerate(fields)}))
        entry = rank_entry(marked, *self.args)
        numbers = [_NUMBER_MARK.format(i, width) for i in range(len(fields))]
        entry.update(rank=numbers[0], local_rank=numbers[1], node=numbers[2],
                     coords=dict(zip(plan.coords, numbers[3:], strict=True)))
        text, name = _Form.of(_encode(entry)), _Form.of(entry["name"])
        values = _values(place)
        if text.fill(values) == _encode(self.entry) and name.fill(values) == self.entry["name"]:
            self._json, self._name = text, name

    @property
    def filled(self) -> bool:
        """Whether each rank's entry is the group's with its place filled in (else each
        rank is compiled and predicted on its own)."""
        return self._json is not None

    def _compiled(self, place: Place) -> dict[str, Any]:
        return rank_entry(compile_plan(self.policy, self.role, place.topology), *self.args)

    def json(self, place: Place) -> str:
        """The JSON of the entry of the rank at ``place`` (as ``json.dumps`` writes it)."""
        if self._json is None:
            return _encode(self._compiled(place))
        return self._json.fill(_values(place))

    def data(self, place: Place) -> dict[str, Any]:
        """The entry of the rank at ``place``: :func:`rank_entry` of its plan."""
        if self._json is None:
            return self._compiled(place)
        found: dict[str, Any] = json.loads(self.json(place))
        return found

    def name(self, place: Place) -> str:
        """The entry's ``name`` for the rank at ``place``."""
        if self._name is None:
            return str(self._compiled(place)["name"])
        return self._name.fill(_values(place))


class Entry(NamedTuple):
    """One rank as explain shows it: its place, and its :class:`RankGroup` (None: the role
    does not profile there)."""

    place: Place
    group: RankGroup | None

    @property
    def profiled(self) -> bool:
        return self.group is not None

    def data(self) -> dict[str, Any]:
        """What explain says of the rank (:func:`rank_entry` of its plan, or its place
        alone where it is not profiled)."""
        if self.group is not None:
            return self.group.data(self.place)
        place = self.place
        return {"rank": place.rank, "profiled": False, "coords": place.coords,
                "local_rank": place.local_rank, "node": place.node}
